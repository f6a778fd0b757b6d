"""The typer application object and the shared rich consoles."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["app", "console", "err_console", "print_error"]

app = typer.Typer(
    name="specformer",
    help=(
        "Describe a Transformer in YAML; validate, build, train, analyse and diff it.\n\n"
        "A SPEC argument is a preset name (see `specformer list`), a path to a YAML file, or - for standard input."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
console = Console()
err_console = Console(stderr=True)


def print_error(message: str, hint: str = "", *, label: str = "[bold red]error:[/]") -> None:
    """``error: message`` (and a dim hint) on stderr, the text shown exactly as written:
    square brackets in a user's value or path are not read as rich markup."""
    err_console.print(f"{label} {escape(message)}", highlight=False, soft_wrap=True)
    if hint:
        err_console.print(f"  [dim]{escape(hint)}[/]", highlight=False, soft_wrap=True)
