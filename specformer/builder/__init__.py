"""From a validated ModelSpec to a torch module: :func:`build_model` and :func:`init_weights`."""

from specformer.builder.build import BuildError, build_model, init_weights

__all__ = ["build_model", "init_weights", "BuildError"]
