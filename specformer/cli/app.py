"""The typer application object and the shared rich consoles."""

from __future__ import annotations

import typer
from rich.console import Console

__all__ = ["app", "console", "err_console"]

app = typer.Typer(
    name="specformer",
    help=(
        "Describe a Transformer in YAML; validate, build, train, analyse and diff it.\n\n"
        "A SPEC argument is a preset name (see `specformer list`) or a path to a YAML file."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
console = Console()
err_console = Console(stderr=True)
