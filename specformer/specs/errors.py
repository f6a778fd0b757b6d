"""Errors for people: every problem in a spec, with file, line, column, field and a hint."""

from __future__ import annotations

import codecs
import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Position", "SpecProblem", "SpecError", "bom_encoding", "did_you_mean"]


@dataclass(frozen=True)
class Position:
    """Where a value came from: a file (or ``--set``) and a 1-based line and column."""

    source: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if self.line is None:
            return self.source
        if self.column is None:
            return f"{self.source}:{self.line}"
        return f"{self.source}:{self.line}:{self.column}"


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a spec."""

    message: str
    path: str = ""
    position: Position | None = None
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.position}: " if self.position else ""
        field = f"{self.path}: " if self.path else ""
        hint = f"\n    {self.hint}" if self.hint else ""
        return f"{where}{field}{self.message}{hint}"


class SpecError(ValueError):
    """A spec could not be loaded; ``problems`` lists every problem found, in file order."""

    def __init__(self, problems: Sequence[SpecProblem]):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in the spec"
        super().__init__(head + ":\n" + "\n".join(f"  {p}" for p in self.problems))


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """The closest of ``choices`` to a misspelt ``word``, if any is close."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    if word.lower() in lowered:  # only the case differs (`Decoder`)
        return lowered[word.lower()]
    # a word that begins exactly one choice means that one (`bert-n` -> `bert-nano`),
    # whatever the edit distance says; the start of several is left to it
    prefixed = [c for c in choices if c.startswith(word) and c != word] if len(word) >= 3 else []
    if len(prefixed) == 1:
        return prefixed[0]
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return match[0] if match else None


# byte-order marks of the text encodings other than UTF-8 that a file is saved in by mistake,
# UTF-32's first: UTF-32-LE's (ff fe 00 00) starts with UTF-16-LE's (ff fe)
_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
         (codecs.BOM_UTF16_BE, "UTF-16"))


def bom_encoding(head: bytes) -> str | None:
    """The encoding a byte-order mark at the start of ``head`` (a file's first bytes) names:
    'UTF-16' (what Windows Notepad saves as "Unicode" and PowerShell's ``>`` writes),
    'UTF-32', or None (no such mark; a UTF-8 one is UTF-8 text)."""
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return encoding
    return None
