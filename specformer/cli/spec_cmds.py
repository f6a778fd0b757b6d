"""``specformer list``, ``validate`` and ``schema``: the spec language on the command line.

None of these import torch, so they start fast.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

from specformer.cli.app import app, console, err_console, natural_width, print_error, reader_gone
from specformer.specs.errors import SpecError

__all__ = ["load_all_or_exit", "load_or_exit", "print_problems", "SetOption"]

SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="FIELD=VALUE",
        help="Override a field: `--set decoder.n_layers=4 --set positional.type=rope`. "
        "The value is parsed as YAML and checked like the file. Repeatable.",
        show_default=False,
    ),
]


def print_problems(error: SpecError, source: str | None = None) -> None:
    """Print every problem of a spec, one per entry, to stderr; ``source`` names the spec
    (a command given several)."""
    n = len(error.problems)
    which = f" {escape(source)}" if source is not None else ""
    err_console.print(f"[bold red]error:[/] {n} problem{'s' if n != 1 else ''} in the spec{which}", highlight=False)
    for problem in error.problems:
        where = f"[bold]{escape(str(problem.position))}[/]: " if problem.position else ""
        field = f"[cyan]{escape(str(problem.path))}[/]: " if problem.path else ""
        err_console.print(f"  {where}{field}{escape(problem.message)}", highlight=False, soft_wrap=True)
        if problem.hint:
            err_console.print(f"      [dim]{escape(problem.hint)}[/]", highlight=False, soft_wrap=True)


def load_or_exit(source: str, overrides: list[str] | None = None):
    """``load_spec`` for commands: on a bad spec, print the problems and exit with status 1."""
    return load_all_or_exit([(source, overrides)])[0]


def load_all_or_exit(sources: list[tuple[Any, list[str] | None]]) -> list:
    """``load_spec`` of each (source, overrides): when any is bad, print the problems of every
    bad one (not only the first's) and exit with status 1."""
    from specformer.specs.loader import load_spec

    loaded, failed = [], False
    for source, overrides in sources:
        try:
            loaded.append(load_spec(source, overrides or []))
        except SpecError as exc:
            print_problems(exc, source if len(sources) > 1 else None)
            failed = True
    if failed:
        raise typer.Exit(1)
    return loaded


@app.command("list")
def list_presets() -> None:
    """List the shipped presets: kind, size, positional scheme, norm, FFN and parameters.

    Use a name from this table wherever a SPEC is expected, or `extends:` it in your
    own YAML file and change a few fields.
    """
    from specformer.analysis import count_parameters
    from specformer.specs.loader import load_spec, preset_names

    columns = ("name", "kind", "layers", "d_model", "heads", "positional", "norm", "ffn", "params")
    rows = []
    for name in preset_names():
        spec = load_spec(name)
        stacks = list(spec.stacks())
        _, first = stacks[0]
        att = first.attention
        heads = str(att.n_heads) if att.n_kv_heads == att.n_heads else f"{att.n_heads}/{att.n_kv_heads}kv"
        ffn = first.ffn
        ffn_text = f"{ffn.type} {ffn.activation}" if hasattr(ffn, "activation") else ffn.type
        layers = "+".join(str(s.n_layers) for _, s in stacks)
        rows.append((name, spec.kind, layers, str(spec.d_model), heads, spec.positional.type,
                     f"{first.norm.type} ({first.norm.placement})", ffn_text, _human(count_parameters(spec).total)))
    if not console.is_terminal:
        # piped or redirected: a wide table rather than one cut to 80 columns
        Console(width=160, soft_wrap=False).print(_presets_table(columns, rows))
        return
    # a terminal too narrow for every column loses the descriptive ones, rightmost first,
    # then the sizes and the kind, rather than cutting every cell to "enco…" and a size to
    # "1.5…", or folding them ("encode" over "r") or leaving a column of no width: the name and
    # the parameters stay
    shown, left_out = list(columns), []
    for column in ("ffn", "norm", "positional", "heads", "d_model", "layers", "kind"):
        if natural_width(_presets_table(shown, rows)) <= console.width:
            break
        shown.remove(column)
        left_out.insert(0, column)
    console.print(_presets_table(shown, rows))
    if left_out:
        console.print(f"[dim]{', '.join(left_out)} left out to fit {console.width} columns; "
                      "`specformer list | cat` prints them all[/]", highlight=False)


def _presets_table(columns: list[str] | tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    """The presets table with ``columns`` of ``rows`` (whose cells follow ``list``'s columns)."""
    all_columns = ("name", "kind", "layers", "d_model", "heads", "positional", "norm", "ffn", "params")
    keep = [all_columns.index(c) for c in columns]
    table = Table(title="specformer presets", header_style="bold")
    for column in columns:
        # names and sizes are what the user reads and types next: never shortened
        table.add_column(column, justify="right" if column in ("layers", "d_model", "heads", "params") else "left",
                         no_wrap=column in ("name", "params"), overflow="fold")
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size * 0.9995:  # what rounds to 1000 of the unit below is 1 of this one: 1B, not 1e+03M
            return f"{n / size:.3g}{unit}"
    return str(n)


@app.command()
def validate(
    spec: Annotated[str, typer.Argument(metavar="SPEC", help="A preset name, a path to a YAML spec, or a run folder (its spec.yaml).")],
    set_: SetOption = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing when the spec is valid.")] = False,
    output_format: Annotated[
        str, typer.Option("--format", "-f", metavar="[yaml|json]", help="How to print the resolved spec: yaml or json.")
    ] = "yaml",
) -> None:
    """Check a spec and print it fully resolved (extends, overrides and defaults applied).

    Every problem is reported at once, each with its file:line:column, the field
    path and the allowed values; the exit status is 1 if there is any.

    Examples:

    ```
    specformer validate gpt2-small
    specformer validate my.yaml --set decoder.n_layers=4 \\
        --set positional.type=rope
    ```
    """
    if output_format not in ("yaml", "json"):
        print_error(f"--format must be yaml or json, got {output_format!r}")
        raise typer.Exit(2)
    resolved = load_or_exit(spec, set_)
    if quiet:
        return
    from specformer.specs.training import training_problems

    for problem in training_problems(resolved):  # valid, and it builds: train alone refuses it
        print_error(f"{problem.path}: {problem.message}", label="[dim]note: specformer train refuses this spec:[/]")
    for problem in resolved.settings_without_effect():
        print_error(f"{problem.path}: {problem.message}", problem.hint, label="[dim]note:[/]")
    if output_format == "json":
        console.print_json(json.dumps(resolved.to_dict()))
    elif console.is_terminal:
        # soft wrap: a value longer than the terminal (a data path) is wrapped by the
        # terminal, never cut, so the YAML can be copied back whole
        console.print(Syntax(resolved.to_yaml(), "yaml", theme="ansi_dark", background_color="default"),
                      soft_wrap=True)
    else:
        typer.echo(resolved.to_yaml(), nl=False)


@app.command()
def schema(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write it to this file instead of printing it: the file is replaced "
                     "whole, or kept as it was when the write fails (a shell's > FILE empties it first); "
                     "missing folders on its path are made, as import-hf's and export-hf's -o make theirs. - prints it, as no "
                     "-o does."),
    ] = None,
) -> None:
    """Print the JSON Schema of a spec file, for editors.

    Save it and point yaml-language-server at it with a first line in your spec:

    ```
    specformer schema -o specformer.schema.json
    # yaml-language-server: $schema=specformer.schema.json
    ```
    """
    from specformer.specs.jsonschema import spec_json_schema

    text = json.dumps(spec_json_schema(), indent=2) + "\n"
    if output is None or str(output) == "-":  # -o -: the standard output, as no -o (not a file named -)
        typer.echo(text, nl=False)
        return
    from specformer.data.cache import atomic_write_text, is_stream

    existing = next((folder for folder in output.parents if folder.exists()), Path("."))
    if output.is_dir() or not existing.is_dir():
        what = "is a folder; give the name of the file to write" if output.is_dir() else f"{existing} is a file, not a folder"
        print_error(f"--output {output}: {what}")
        raise typer.Exit(1)
    stream = is_stream(output)  # -o /dev/stdout, a pipe: written as it is
    real = output if stream else os.path.realpath(output)  # a symbolic link stays one: the file it points to is replaced
    try:
        atomic_write_text(real, text)
    except OSError as exc:
        if reader_gone(exc, output):
            raise typer.Exit(0) from None
        kept = "; the file from before is as it was" if output.is_file() else ""
        print_error(f"--output {output}: cannot write ({exc.strerror or exc}); nothing was written{kept}")
        raise typer.Exit(1) from None
    if not stream:  # -o /dev/stdout: the schema alone
        console.print(f"wrote {escape(str(output))}", highlight=False, soft_wrap=True)
