"""From a validated ModelSpec to a torch module: :func:`build_model` and :func:`init_weights`."""

from typing import Any

from specformer.builder.build import BuildError, build_model, init_weights

__all__ = ["build_model", "init_weights", "BuildError", "SpecModule"]


def __getattr__(name: str) -> Any:
    # the LightningModule imports lightning, which building a model does not need
    if name == "SpecModule":
        from specformer.builder.lightning import SpecModule

        return SpecModule
    raise AttributeError(f"module 'specformer.builder' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazily imported names too, for tab completion
    return sorted({*globals(), *__all__})
