"""The ``specformer`` command: typer + rich, thin — it parses, calls library code, prints.

Each area registers its commands on :data:`app` from its own module, imported here.
torch is imported inside commands that need it, so ``validate``, ``schema`` and
``list`` start fast.
"""

from __future__ import annotations

from specformer.cli.app import app, console, err_console

# imported for their side effect: registering commands on `app`
from specformer.cli import spec_cmds  # noqa: E402,F401  isort: skip
from specformer.cli import analysis_cmds  # noqa: E402,F401  isort: skip
from specformer.cli import train_cmds  # noqa: E402,F401  isort: skip
from specformer.cli import interop_cmds  # noqa: E402,F401  isort: skip

__all__ = ["app", "main", "console", "err_console"]


def main() -> None:
    from specformer.registry import PluginError

    try:
        app()
    except PluginError as exc:  # an installed plugin breaks every command: say which, not a traceback
        import os

        if os.environ.get("SPECFORMER_DEBUG"):
            raise
        from specformer.cli.app import print_error

        print_error(str(exc), "set SPECFORMER_DEBUG=1 to see the full traceback")
        raise SystemExit(1) from None
