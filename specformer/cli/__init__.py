"""The ``specformer`` command: typer + rich, thin — it parses, calls library code, prints.

Each area registers its commands on :data:`app` from its own module, imported here.
torch is imported inside commands that need it, so ``validate``, ``schema`` and
``list`` start fast.
"""

from __future__ import annotations

import errno
import os
import sys
from contextlib import suppress
from typing import NoReturn

from typer.core import TyperCommand

from specformer.cli.app import Command, app, console, err_console, stdout_gone

# imported for their side effect: registering commands on `app`
from specformer.cli import spec_cmds  # noqa: E402,F401  isort: skip
from specformer.cli import analysis_cmds  # noqa: E402,F401  isort: skip
from specformer.cli import train_cmds  # noqa: E402,F401  isort: skip
from specformer.cli import interop_cmds  # noqa: E402,F401  isort: skip

__all__ = ["app", "main", "console", "err_console"]

for _info in app.registered_commands:  # each command expands a path's ~ (Command.invoke)
    if _info.cls in (None, TyperCommand):
        _info.cls = Command


def main() -> None:
    from specformer.registry import PluginError

    _degrade_unencodable_output()
    try:
        try:
            app()
        finally:  # what is still buffered is written here, where a reader that is gone can be told
            _flush_stdout()
    except PluginError as exc:  # an installed plugin breaks every command: say which, not a traceback
        if os.environ.get("SPECFORMER_DEBUG"):
            raise
        from specformer.cli.app import print_error

        print_error(str(exc), "set SPECFORMER_DEBUG=1 to see the full traceback")
        raise SystemExit(1) from None
    except OSError as exc:
        if stdout_gone(exc):
            _reader_gone()
        if not _output_error(exc):
            raise
        _output_failed(exc)


def _degrade_unencodable_output() -> None:
    """A terminal or ``PYTHONIOENCODING`` whose encoding is not UTF-8 (``ascii``, ``latin-1``,
    a Windows code page) shows what it cannot encode (the output's "—", "×", "≥") as ``\\u2014``
    instead of failing with ``UnicodeEncodeError``; rich draws its tables' boxes in ASCII there."""
    import codecs

    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            utf = codecs.lookup(encoding).name.startswith("utf")
        except LookupError:
            utf = False
        if not utf and getattr(stream, "errors", "strict") in ("strict", None) and hasattr(stream, "reconfigure"):
            with suppress(OSError, ValueError):
                stream.reconfigure(errors="backslashreplace")


def _flush_stdout() -> None:
    """Writes what is left of the standard output (``print``'s and rich's buffers), so that a
    reader that is gone (``| head``) raises here, in :func:`main`, not as Python exits."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        if stdout_gone(exc):
            _reader_gone()
        raise
    except ValueError:  # closed
        pass


def _reader_gone() -> NoReturn:
    """The reader of the standard output has stopped reading (``specformer show ... | head -1``):
    end quietly, as a well-behaved command does (Python's "Note on SIGPIPE"): no error, no
    traceback, status 1. The standard output points at ``os.devnull`` so that what is still
    buffered is not written again, and fails again, when Python exits."""
    with suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(1) from None


# what a write to a full disk, a quota or a failing device raises; the commands' own files
# are named in their errors (exc.filename), standard output has no name
_WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


def _output_error(exc: OSError) -> bool:
    """Whether ``exc`` is a failed write of the standard output (``specformer schema > file``
    on a full disk), not of a file a command names."""
    return exc.filename is None and exc.errno in _WRITE_ERRORS and not os.environ.get("SPECFORMER_DEBUG")


def _output_failed(exc: OSError) -> NoReturn:
    """Say in one line that the output is incomplete, instead of a traceback."""
    from specformer.cli.app import print_error

    try:  # what is still buffered for stdout would fail again when Python exits
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    print_error(f"cannot write the output ({exc.strerror or exc}): what was written of it is incomplete",
                "a full disk under a redirected output (> FILE)? free space there, or write elsewhere")
    raise SystemExit(1) from None
