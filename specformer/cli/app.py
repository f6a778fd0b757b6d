"""The typer application object and the shared rich consoles."""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from specformer.cli.help import install as _fit_help

__all__ = ["app", "console", "err_console", "print_error", "set_hint", "stops_cleanly", "loading", "check_output_file",
           "stdout_gone", "Command",
           "OnceCommand"]

# the parameters, in every command, that name a file or folder to read or write
PATH_PARAMETERS = frozenset({"checkpoint", "source", "output", "weights", "spec_source", "resume", "init_from",
                             "training", "file", "messages"})


def expand_home(params: dict[str, Any]) -> None:
    """A path written ``~/...`` that reaches the command as it is (``--output=~/hf``, which
    the shell does not expand after ``=``, a quoted path, one from a CI file or a Makefile)
    names a place in the home folder, as it does in a spec's paths and ``training.out_dir``:
    ``export-hf CKPT --output=~/hf`` made a folder named ``~`` in the working directory, and
    ``eval '~/runs/...'`` found no checkpoint."""
    for name in PATH_PARAMETERS & params.keys():
        value = params[name]
        if isinstance(value, (str, Path)) and str(value).startswith("~"):
            params[name] = type(value)(os.path.expanduser(value))


class Command(TyperCommand):
    """Every command: paths written with ``~`` are expanded (:func:`expand_home`)."""

    def invoke(self, ctx: Any) -> Any:
        expand_home(ctx.params)
        return super().invoke(ctx)


class OnceCommand(Command):
    """A command whose options of text to read (``--prompt``, ``--system``, ``--file``, ``--messages``) are
    refused when given twice: a second ``--prompt`` would otherwise replace the first without
    a word (click keeps the last), where the user meant both."""

    once: dict[str, str] = {
        "prompt": "one --prompt is read; run the command once per prompt (--num-samples N samples N texts from one)",
        "system": "one --system prompt is read",
        "file": "one --file is read; run the command once per file",
        "messages": "one --messages conversation is read; run the command once per conversation",
    }

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
        except Exception:  # click's own parse, below, reports it
            return super().parse_args(ctx, args)
        names = [getattr(p, "name", None) for p in order]
        for name, why in self.once.items():
            if names.count(name) > 1:
                option = next(p for p in order if getattr(p, "name", None) == name)
                flag = max(option.opts, key=len)
                ctx.fail(f"{flag} is given {names.count(name)} times: {why}")
        return super().parse_args(ctx, args)


class _Group(TyperGroup):
    """The command group; an unknown option that names a spec's field (nanoGPT's
    ``--batch_size=32``, ``--n_layer=4``) is answered with the ``--set`` that sets it, and
    the extra arguments of a ``--set`` value the shell split (``{type: files, ...}`` unquoted)
    with how to quote it, and a prompt given to ``generate`` as an argument with ``--prompt``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        self._args = list(args)  # the command line, for the hint below
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            # click's, or the copy typer ships (typer >= 0.20): the same class by name
            args = getattr(self, "_args", [])
            command = getattr(getattr(exc, "ctx", None), "command", None)
            takes_set = any("--set" in getattr(p, "opts", ()) for p in getattr(command, "params", ()))
            if type(exc).__name__ == "NoSuchOption" and takes_set and (hint := set_hint(exc.option_name, args)):
                exc.message = f"{exc.format_message().rstrip('.')}. {hint}"  # the command's own near options first
                exc.possibilities = None
            elif (type(exc).__name__ == "UsageError" and takes_set and "--set" in args
                  and str(getattr(exc, "message", "")).startswith("Got unexpected extra argument")):
                exc.message += (". A --set value with spaces, commas or braces is quoted whole, or the shell splits "
                                "it: --set 'training.data={type: files, paths: [input.txt]}'")
            elif (type(exc).__name__ == "UsageError" and getattr(command, "name", None) == "generate"
                  and not {"--prompt", "-p"} & {a.partition("=")[0] for a in args}
                  and str(getattr(exc, "message", "")).startswith("Got unexpected extra argument")):
                # fill-mask and classify take their text as an argument; generate's prompt is an option
                exc.message += ". The prompt is given with --prompt (-p): specformer generate CHECKPOINT --prompt 'TEXT'"
            raise


def set_hint(option: str, args: list[str]) -> str:
    """'A spec's fields are set with --set: --set training.batch_size=32' for an option
    named after a field (or another tool's name for one), with the value given to it;
    '' for any other option."""
    from specformer.specs.loader import FIELD_HINTS, OTHER_MEANING, field_path, set_arguments

    name = option.lstrip("-").replace("-", "_").lower()
    found = field_path(option)
    if found is None or name in OTHER_MEANING:
        where = FIELD_HINTS.get(name, ("", ""))[1]
        return f"A spec's fields are set with --set; {where}" if where else ""
    value = "..."
    for i, arg in enumerate(args):
        if arg.startswith(f"{option}="):
            value = arg.partition("=")[2]
            break
        if arg == option and i + 1 < len(args) and not args[i + 1].startswith("-"):
            value = args[i + 1]
            break
    return f"A spec's fields are set with --set: {set_arguments(name, found[0], value)}"


app = typer.Typer(
    cls=_Group,
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
_fit_help()
console = Console()
err_console = Console(stderr=True)


def natural_width(renderable: Any, out: Console = console) -> int:
    """The width ``renderable`` (a table) takes on ``out`` with no line to fit in."""
    return out.measure(renderable, options=out.options.update(max_width=10_000)).maximum


def _show_version(value: bool) -> None:
    if not value:
        return
    import platform
    from importlib import metadata

    from specformer import __version__

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    # what a bug report needs, read without importing torch (seconds)
    found = ", ".join(f"{name} {version(name)}" for name in ("torch", "lightning", "pydantic", "tokenizers",
                                                             "transformers"))
    console.print(f"specformer {__version__} (Python {platform.python_version()}; {found})", highlight=False,
                  soft_wrap=True)
    raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", "-V", callback=_show_version, is_eager=True,
                                 help="Print specformer's version and those of the libraries it runs on, and exit."),
) -> None:
    """The options of ``specformer`` itself, before a command: ``--version``."""


def reader_gone(exc: OSError, path: Any) -> bool:
    """Whether writing ``path`` failed because it is a pipe whose reader has stopped reading
    (``-o /dev/stdout | head``): a command ends quietly there, as one printing to a closed
    standard output does, not with an error saying that nothing was written."""
    from specformer.data.cache import is_stream

    return exc.errno == errno.EPIPE and is_stream(path)


def stdout_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is a write to the standard output whose reader has stopped reading
    (``specformer show gpt2-small | head -1``): a broken pipe, with no file named, while the
    standard output is a pipe with no reader left (the pipe of a data-loading worker, say,
    is not). :func:`specformer.cli.main` ends quietly there."""
    if not isinstance(exc, OSError) or exc.errno != errno.EPIPE or exc.filename is not None:
        return False
    try:
        import select

        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else 1
        poll = select.poll()
        poll.register(fd, 0)  # POLLERR and POLLHUP are reported whatever is asked
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows): a broken pipe is taken to be stdout's
        return True


def print_error(message: str, hint: str = "", *, label: str = "[bold red]error:[/]") -> None:
    """``error: message`` (and a dim hint) on stderr, the text shown exactly as written:
    square brackets in a user's value or path are not read as rich markup."""
    err_console.print(f"{label} {escape(message)}", highlight=False, soft_wrap=True)
    if hint:
        err_console.print(f"  [dim]{escape(hint)}[/]", highlight=False, soft_wrap=True)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C's ``KeyboardInterrupt`` is (with its ``signum``)."""

    signum = signal.SIGTERM


@contextmanager
def stops_cleanly(when: str) -> Iterator[None]:
    """Ctrl-C (SIGINT) or SIGTERM (``kill``, ``timeout``, ``docker stop``) during the block
    stops the command with one line, ``interrupted <when>`` or ``stopped by SIGTERM <when>``,
    and the shell's status for the signal (130, 143). SIGTERM is raised where the program is,
    as Ctrl-C is, so a file being written is removed on the way out instead of the process
    dying silently and leaving it behind."""
    main = threading.current_thread() is threading.main_thread()

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, handler) if main else None
    try:
        yield
    except KeyboardInterrupt as exc:
        signum = int(getattr(exc, "signum", signal.SIGINT))
        said = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        print_error(f"{said} {when}")
        raise typer.Exit(128 + signum) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextmanager
def loading(when: str = "while starting; nothing was written") -> Iterator[None]:
    """The imports of torch and Lightning (seconds): Ctrl-C or SIGTERM there is held until they
    end, then stops the command as :func:`stops_cleanly` does (``interrupted <when>``, 130 or
    143). Raised in the middle of an import, the signal's exception went through torch's C++
    code (which aborts the process with a C++ stack, status 134) or left numpy half-imported
    (an ``AttributeError`` from the next import instead of the interruption). A signal that
    the process ignores (a background job's SIGINT) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        held.append(signum)

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    if held:
        said = "interrupted" if held[0] == signal.SIGINT else f"stopped by {signal.Signals(held[0]).name}"
        print_error(f"{said} {when}")
        raise typer.Exit(128 + held[0])


def check_output_file(path: Path, option: str) -> None:
    """Fail before any work if ``path`` cannot be a file we write: it is a folder, or a
    part of its folder path is a file, or that folder is not writable."""

    def fail(message: str) -> typer.Exit:
        print_error(message)
        return typer.Exit(1)

    if path.is_dir():
        raise fail(f"{option} {path}: is a folder; give the name of the file to write")
    from specformer.data.cache import is_stream

    if is_stream(path):  # /dev/null, a pipe: written as it is
        if not os.access(path, os.W_OK):
            raise fail(f"{option} {path}: is not writable")
        return
    existing = next((p for p in path.parents if p.exists()), Path("."))
    if not existing.is_dir():
        raise fail(f"{option} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise fail(f"{option} {path}: the folder {existing} is not writable")
