"""Text corpora: the Python standard library's own source, local files, or Hugging Face
``datasets``; each split deterministically into train and validation.

A file goes to validation when a hash of its relative path falls below
``val_fraction``, so the split is the same on every machine and does not move
when a file is added or removed elsewhere. A corpus of a single document (one
``input.txt``) is split inside it instead: its last ``val_fraction`` of lines is
held out.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specformer.data import progress
from specformer.data.cache import content_hash
from specformer.specs.errors import bom_encoding
from specformer.specs.training import FilesDataSpec, HFDataSpec, StdlibDataSpec

__all__ = ["Corpus", "DataError", "stdlib_corpus", "files_corpus", "hf_corpus", "split_by_path", "lfs_pointer"]

MIN_STDLIB_FILES = 50


class DataError(ValueError):
    """Data could not be prepared; the message says what was found and what to do."""


@dataclass
class Corpus:
    """Documents of the train and validation splits, and a hash of their content."""

    name: str
    train: list[str]
    val: list[str]
    fingerprint: str
    train_ids: list[str] = field(default_factory=list)
    val_ids: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # files left out as not UTF-8 text
    skipped_at: dict[str, str] = field(default_factory=dict)  # of those, where: "line 3, column 7, byte 0xe9"
    # tables and JSON found in a folder that hold no documents (a package.json, a CSV of numbers): "key (why)"
    not_documents: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # files left out as unreadable: "key (reason)"
    notes: list[str] = field(default_factory=list)  # what else was left out, for the run's data line
    split_by_lines: bool = False  # one document, split into its first and last lines

    @property
    def documents(self) -> str:
        """How many documents, and how they were split, in words."""
        if self.split_by_lines:
            return "1 document (its last lines held out)"
        n = len(self.train) + len(self.val)
        return f"{n} document{'s' if n != 1 else ''} ({len(self.val)} held out)"

    @property
    def n_bytes(self) -> int:
        """Characters of text (the size in bytes for ASCII text)."""
        return sum(len(t) for t in self.train) + sum(len(t) for t in self.val)


def _unit(key: str) -> float:
    """A stable number in [0, 1) from a string."""
    return int.from_bytes(hashlib.sha1(_key_bytes(key)).digest()[:8], "big") / 2**64


def _key_bytes(key: str) -> bytes:
    """A key as bytes, file names that are not UTF-8 included (Python reads their odd
    bytes as surrogates, which plain ``encode()`` refuses)."""
    return key.encode("utf-8", "surrogateescape")


def split_by_path(keys: list[str], val_fraction: float) -> tuple[list[int], list[int]]:
    """Indices of ``keys`` in train and in validation, chosen by a hash of each key.

    Both splits get at least one item when there are two or more.
    """
    scores = [_unit(k) for k in keys]
    val = [i for i, s in enumerate(scores) if s < val_fraction]
    train = [i for i, s in enumerate(scores) if s >= val_fraction]
    if len(keys) >= 2 and not val:
        best = min(range(len(keys)), key=scores.__getitem__)
        val, train = [best], [i for i in train if i != best]
    if len(keys) >= 2 and not train:
        best = max(range(len(keys)), key=scores.__getitem__)
        train, val = [best], [i for i in val if i != best]
    return train, val


def _cap(items: list[tuple[str, Path]], max_mb: float | None) -> list[tuple[str, Path]]:
    """A hash-chosen subset of at most ``max_mb`` MB (all of it when no cap)."""
    if max_mb is None:
        return items
    budget = int(max_mb * 1e6)
    chosen, total = [], 0
    for key, path in sorted(items, key=lambda kp: _unit("cap:" + kp[0])):
        size = path.stat().st_size
        if total + size > budget and chosen:
            continue
        chosen.append((key, path))
        total += size
    return sorted(chosen)


def _size(item: tuple[str, Path]) -> int:
    """The size of a (key, path) item's file in bytes (0 when it cannot be read: said later)."""
    try:
        return item[1].stat().st_size
    except OSError:
        return 0


def _read_files(
    name: str,
    items: list[tuple[str, Path]],
    val_fraction: float,
    settings: dict,
    *,
    report: bool = True,
    text_field: str | None = None,
    val_from: int | None = None,
    walked: frozenset[Path] | set[Path] = frozenset(),
) -> Corpus:
    """Read ``items`` (key, path) as UTF-8 text and split them; files that are not UTF-8
    text are left out (listed in ``skipped`` when ``report``) and empty ones dropped. With
    ``text_field``, a JSON-lines file (``.jsonl``, ``.ndjson``) gives one document per line,
    its ``text_field``, keyed ``file.jsonl:LINE``, and a table (``.csv``, ``.tsv``, ``.json``)
    one per row (:func:`_table_rows`). With ``val_from``, the items from that index on are
    the validation split, the ones before it training; without, ``val_fraction`` splits. A
    table or ``.json`` file in ``walked`` (found in a folder, not named) that holds no documents
    (no ``text_field``, not JSON: a project's package.json) is left out and listed in
    ``not_documents``, where a file named, and a JSON-lines file anywhere, is an error."""
    texts: list[str] = []
    keys: list[str] = []
    digests: list[bytes] = []
    held_out: list[bool] = []  # each document's split, with val_from
    skipped: list[str] = []
    skipped_at: dict[str, str] = {}
    not_documents: list[str] = []
    unreadable: list[str] = []  # "key (reason)": a dangling symbolic link, a file without read permission
    # of those, the UTF-16 and UTF-32 files (a byte-order mark says so), which can be saved as UTF-8
    encoded: dict[str, list[str]] = {"UTF-16": [], "UTF-32": []}
    with progress.step(f"reading {len(items):,} file{'s' if len(items) != 1 else ''}", sum(map(_size, items))) as advance:
        for index, (key, path) in enumerate(items):
            val = val_from is not None and index >= val_from
            mark = b"\nvalidation" if val else b""  # a file moved between the splits: other cached tokens
            try:
                raw = path.read_bytes()
                advance(len(raw))
                data = _decompressed(path, raw)
                text = data.decode("utf-8")
            except OSError as exc:
                if report:
                    dangling = path.is_symlink() and not path.exists()
                    reason = f"a symbolic link to {os.readlink(path)}, which does not exist" if dangling else (
                        exc.strerror or str(exc))
                    unreadable.append(f"{key} ({reason})")
                continue
            except UnicodeDecodeError as exc:
                if report:  # (a few stdlib test files are deliberately not UTF-8)
                    skipped.append(key)
                    skipped_at[key] = _where_not_utf8(exc, path.name)
                    if encoding := bom_encoding(bytes(exc.object[:4])):
                        encoded[encoding].append(key)
                continue
            if "\x00" in text and (nul := nul_problem(data)):  # valid UTF-8, yet not text: never trained on
                if report:
                    why, line, column = nul
                    skipped.append(key)
                    skipped_at[key] = why if why.startswith("UTF-16") else f"line {line}, column {column}, {why}"
                continue
            kind = _table_kind(path)
            if text_field is not None and (_is_json_lines(path) or kind is not None):
                rows = _table_rows(path, text, text_field, kind) if kind else _json_lines(path, text, text_field)
                if kind is not None and path in walked:  # a folder's package.json or CSV of numbers: left out
                    try:
                        rows = list(rows)
                    except DataError as exc:
                        why = re.sub(r"^training\.data\.\w+: ", "", str(exc))  # the file's place says which
                        not_documents.append(f"{key} ({why})")
                        continue
                for line, document in rows:
                    texts.append(document)
                    keys.append(f"{key}:{line}")
                    held_out.append(val)
                    digests.append(_key_bytes(f"{key}:{line}:{text_field}") + hashlib.sha1(document.encode()).digest()
                                   + mark)
                continue
            text, changed = _plain_text(text)
            if not text.strip():
                continue
            texts.append(text)
            keys.append(key)
            held_out.append(val)
            # a file the reading changes is marked: its cached tokens (of an older reading) differ
            digests.append(_key_bytes(key) + hashlib.sha1(raw).digest() + (b"\nplain-text" if changed else b"") + mark)
    notes = [_encoded_note(encoding, found) for encoding, found in encoded.items() if found]
    # a single document is split by lines, not by file: its cached tokens differ
    lines = val_from is None and len(texts) == 1
    fingerprint = content_hash(name, {**settings, "split": "lines"} if lines else settings, chunks=digests)
    if lines:
        train_text, val_text = _split_document(texts[0], val_fraction)
        return Corpus(name=name, train=[train_text] if train_text.strip() else [],
                      val=[val_text] if val_text.strip() else [], fingerprint=fingerprint,
                      train_ids=[f"{keys[0]} (first lines)"], val_ids=[f"{keys[0]} (last lines)"], skipped=skipped,
                      skipped_at=skipped_at, not_documents=not_documents, unreadable=unreadable, split_by_lines=True, notes=notes)
    if val_from is None:
        train_idx, val_idx = split_by_path(keys, val_fraction)
    else:
        train_idx = [i for i, val in enumerate(held_out) if not val]
        val_idx = [i for i, val in enumerate(held_out) if val]
    return Corpus(
        name=name,
        train=[texts[i] for i in train_idx],
        val=[texts[i] for i in val_idx],
        fingerprint=fingerprint,
        train_ids=[keys[i] for i in train_idx],
        val_ids=[keys[i] for i in val_idx],
        skipped=skipped,
        skipped_at=skipped_at,
        not_documents=not_documents,
        unreadable=unreadable,
        notes=notes,
    )


def _encoded_note(encoding: str, keys: list[str]) -> str:
    """The note on files left out as UTF-16 or UTF-32 text (``encoding``, as a byte-order mark
    says), with the fix: 'notes.txt is UTF-16 text (what Windows Notepad saves as 'Unicode'):
    save it as UTF-8 to train on it'."""
    one = len(keys) == 1
    what = " (what Windows Notepad saves as 'Unicode')" if encoding == "UTF-16" else ""
    return (f"{_names(keys)} {'is' if one else 'are'} {encoding} text{what}: save {'it' if one else 'them'} as UTF-8 "
            f"to train on {'it' if one else 'them'}")


_JSON_LINES = (".jsonl", ".ndjson")


def _is_json_lines(path: Path) -> bool:
    """A ``.jsonl`` or ``.ndjson`` file, compressed or not (``train.jsonl.gz``)."""
    name = path.name.lower()
    for suffix in _COMPRESSED:
        name = name.removesuffix(suffix)
    return name.endswith(_JSON_LINES)


def _table_kind(path: Path) -> str | None:
    """``csv``, ``tsv`` or ``json`` for a file of rows of that kind (compressed or not), else None."""
    name = path.name.lower()
    for suffix in _COMPRESSED:
        name = name.removesuffix(suffix)
    return next((kind for kind in ("csv", "tsv", "json") if name.endswith("." + kind)), None)


def _missing_field(where: str, field: str, has: list[str], texts: list[str], *, noun: str = "field",
                   holder: str) -> DataError:
    """No ``field`` in a record (``holder``: "this line", "the header row"): the error names
    what it has, and a text field to read instead."""
    shown = ", ".join(map(repr, has[:8])) or f"no {noun}s"
    hint = (f": to read its {texts[0]!r}, set training.data.text_field={texts[0]}"
            f"{f' (or another of its text {noun}s)' if len(texts) > 1 else ''}") if texts else ""
    return DataError(f"{where}: no {field!r} {noun} (training.data.text_field); {holder} has {shown}{hint}")


@contextmanager
def csv_fields_up_to(size: int) -> Iterator[None]:
    """The csv module reads fields of up to ``size`` characters (a table's whole text) while
    the block runs: it refuses one past 128 KiB by default, which a long document's text is.
    The limit is the module's own, restored after."""
    import csv

    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, size))
    try:
        yield
    finally:
        csv.field_size_limit(limit)


_TSV_QUOTES = ("in a .tsv file a quote that opens a field must be closed at the field's end, and one inside the text "
               "written twice (\"\"), as csv.writer and pandas' to_csv(sep='\\t') write them (or save the rows as "
               "JSON lines)")


def table_reader(text: str, kind: str) -> Any:
    """A ``csv.DictReader`` of a ``.csv`` or ``.tsv`` table's text. A ``.tsv`` file is read
    strictly: a field that starts with a quote is read as quoted (the csv module's and
    pandas' rule), and text after its closing quote (``"Great," she said``, a text that
    opens with a quotation) is an error (:func:`tsv_quote_error`), not the quotes dropped."""
    import csv
    import io

    tsv = kind == "tsv"
    return csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if tsv else ",", strict=tsv)


def tsv_quote_error(where: str, line: int, exc: Exception) -> DataError:
    """The error of a ``.tsv`` row the csv module cannot read strictly: a stray quote."""
    return DataError(f"{where}:{line}: a field that starts with '\"' is read as quoted text up to the next '\"', "
                     f"and this one cannot be read so ({str(exc).replace(chr(9), chr(92) + 't')}); {_TSV_QUOTES}")


def check_tsv_row(row: dict[Any, Any], kind: str, first: int, last: int, where: str) -> None:
    """Refuse a ``.tsv`` row whose field holds both a tab and a line end: a quote that is only
    the text's own (an unclosed quotation) runs on through tabs and line ends to the next
    quote, reading the rows after it as one row's text. ``first`` and ``last`` are the lines
    the row was read from."""
    if kind != "tsv" or last == first:
        return
    values = [v for key, value in row.items() for v in (value if key is None else [value]) if isinstance(v, str)]
    if any("\t" in value and _LINE_END.search(value) for value in values):  # \n, \r\n or a lone \r
        raise DataError(f"{where}:{first}: a field that starts with '\"' is read as quoted text up to the next '\"', "
                        f"and this one runs on to line {last}, reading lines {first}-{last} as one row; {_TSV_QUOTES}")


def reader_rows(reader: Any, kind: str, where: str) -> Iterator[tuple[int, int, dict[Any, Any]]]:
    """(first line, last line, row) of each row of a :func:`table_reader`: a row the csv
    module cannot read, or a ``.tsv`` row a stray quote ran on (:func:`check_tsv_row`), is
    an error naming the line the row starts at."""
    import csv

    last = reader.line_num
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise (tsv_quote_error(where, last + 1, exc) if kind == "tsv"
                   else DataError(f"{where}:{last + 1}: this row cannot be read ({exc})")) from None
        first, last = last + 1, reader.line_num
        check_tsv_row(row, kind, first, last, where)
        if None in row:  # more fields than the header names: a text's own comma (or tab), unquoted
            columns = reader.fieldnames or []
            n = len(columns) + len(row[None])
            name, example = ("tab", "") if kind == "tsv" else ("comma", ' ("a, b")')
            raise DataError(
                f"{where}:{first}: {n} {name}-separated fields, and the header row names {len(columns)} "
                f"({', '.join(map(repr, columns[:8]))}): a text with a {name} in it is quoted{example}, as "
                "csv.writer and pandas' to_csv write it; the extra fields would be lost and the columns after "
                "them misread"
            )
        yield first, last, row


def _table_rows(path: Path, text: str, text_field: str, kind: str) -> Iterator[tuple[int, str]]:
    """(row, text) of each document of a table: a ``.csv`` or ``.tsv`` file with a header
    row naming its columns (``text_field`` is read, rows numbered by their line), or a
    ``.json`` file holding an array of objects (numbered from 1) or JSON lines, as
    ``datasets``' json loader reads both. Empty texts are dropped."""
    import json

    where = f"training.data.paths: {path}"
    text = text.removeprefix("\ufeff")
    if kind == "json":
        if not text.lstrip().startswith("["):
            yield from _json_lines(path, text, text_field)
            return
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}:{exc.lineno}: not JSON ({json_problem(exc)})") from None
        for number, record in enumerate(records, start=1):
            if not isinstance(record, dict):
                raise DataError(f"{where}: item {number} is a JSON {type(record).__name__}, not an object with "
                                f"its text under training.data.text_field ({text_field!r})")
            value = _record_text(record, text_field, f"{where}: item {number}", holder="this item")
            if value.strip():
                yield number, value
        return
    with csv_fields_up_to(len(text)):
        yield from _csv_documents(path, text, text_field, kind)


def _csv_documents(path: Path, text: str, text_field: str, kind: str) -> Iterator[tuple[int, str]]:
    import csv

    where = f"training.data.paths: {path}"
    reader = table_reader(text, kind)
    columns = list(reader.fieldnames or [])
    if text_field not in columns:
        # every column is text: the one with the longest values in the first rows is offered first
        try:
            first = [row for _, row in zip(range(50), reader, strict=False)]
        except csv.Error:  # a row a stray quote spoils: the header's error is what is said
            first = []
        longest = sorted(columns, key=lambda c: -sum(len(row.get(c) or "") for row in first))
        raise _missing_field(f"{where}:1", text_field, columns, longest, noun="column", holder="the header row")
    for _, last, row in reader_rows(reader, kind, where):
        value = row.get(text_field)
        if value is None:
            raise DataError(f"{where}:{last}: the row ends before its {text_field!r} column "
                            f"(training.data.text_field): {len([v for v in row.values() if v is not None])} of "
                            f"the header's {len(columns)} columns")
        value, _ = _plain_text(value)
        if value.strip():
            yield last, value


_LINE_END = re.compile(r"\r\n?|\n")


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a JSON-lines text, its lines ended as Python's ``open()`` ends
    them: ``\n``, Windows' ``\r\n`` or an old Mac's lone ``\r``, none of which a JSON string
    holds as it is (it writes ``\\n``, ``\\r``). Not ``splitlines()``: a JSON string may hold
    U+2028 and the other characters it breaks at."""
    return enumerate(_LINE_END.split(text), start=1)


def _json_lines(path: Path, text: str, text_field: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each document of a JSON-lines file: every non-blank line is a
    JSON object whose ``text_field`` is a string (an empty one is dropped, as an empty file
    is). Anything else is an error naming the file, the line and the setting."""
    import json

    where = f"training.data.paths: {path}"
    for number, line in numbered_lines(text.removeprefix("\ufeff")):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}:{number}: not a JSON object ({json_problem(exc)}); a .jsonl "
                            "file holds one JSON object per line") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}:{number}: a JSON {type(record).__name__}, not an object; a .jsonl file holds "
                            f"one object per line, its text under training.data.text_field ({text_field!r})")
        value = _record_text(record, text_field, f"{where}:{number}", holder="this line")
        if value.strip():
            yield number, value


def _record_text(record: dict[str, Any], text_field: str, place: str, *, holder: str) -> str:
    """The ``text_field`` string of a JSON object, in plain text; a missing field or one that
    is not a string is an error at ``place`` (``holder`` names the object in it)."""
    if text_field not in record:
        raise _missing_field(place, text_field, list(record),
                             [key for key, value in record.items() if isinstance(value, str)], holder=holder)
    value = record[text_field]
    if not isinstance(value, str):
        kind = "null" if value is None else f"a JSON {type(value).__name__}"
        raise DataError(f"{place}: {text_field!r} (training.data.text_field) is {kind}, not a string")
    return _plain_text(value)[0]


# compressed files are read as the text inside them (standard-library codecs only)
_COMPRESSED = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}


def _decompressed(path: Path, raw: bytes) -> bytes:
    """The bytes of a file, decompressed when its name ends in ``.gz``, ``.bz2`` or ``.xz``;
    a damaged archive is an error naming the file (not a file silently left out)."""
    codec = _COMPRESSED.get(path.suffix.lower())
    if codec is None:
        return raw
    import importlib

    try:
        return importlib.import_module(codec).decompress(raw)
    except Exception as exc:  # BadGzipFile, zlib.error, LZMAError, EOFError of a truncated stream, ...
        detail = str(exc) or type(exc).__name__
        raise DataError(f"training.data.paths: {path} is not a readable {codec} file ({detail})") from None


def _plain_text(text: str) -> tuple[str, bool]:
    """``text`` with plain line ends and no byte-order mark, and whether that changed it:
    Windows (``\\r\\n``) and old Mac (``\\r``) line ends become ``\\n``, as Python's ``open()``
    reads them, and a leading UTF-8 byte-order mark (which Windows editors write) is dropped,
    as the ``utf-8-sig`` codec does. Otherwise a corpus with files of both kinds would teach
    two line ends, and a BOM would open a document with an invisible token."""
    plain = text.removeprefix("\ufeff")
    if "\r" in plain:
        plain = plain.replace("\r\n", "\n").replace("\r", "\n")
    return plain, plain != text


def _split_document(text: str, val_fraction: float) -> tuple[str, str]:
    """(train, validation) of one document: its last ``val_fraction`` of lines (at least
    one line) held out; a single line is cut at that fraction of its characters."""
    lines = text.splitlines(keepends=True)
    if len(lines) >= 2:
        n_val = min(len(lines) - 1, max(1, round(len(lines) * val_fraction)))
        return "".join(lines[:-n_val]), "".join(lines[-n_val:])
    cut = min(len(text) - 1, max(1, round(len(text) * (1 - val_fraction))))
    return text[:cut], text[cut:]


def stdlib_corpus(spec: StdlibDataSpec) -> Corpus:
    """The ``.py`` files of the running interpreter's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    items: list[tuple[str, Path]] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        parts = set(rel.parts[:-1])
        if parts & {"site-packages", "dist-packages", "__pycache__"}:
            continue
        if not spec.include_tests and parts & {"test", "tests", "idle_test"}:
            continue
        items.append((rel.as_posix(), path))
    if len(items) < MIN_STDLIB_FILES:
        raise DataError(
            f"found only {len(items)} standard-library source files under {root}; this Python "
            "ships without them. Train on your own files instead: "
            "--set 'training.data={type: files, paths: [\"docs/**/*.md\"]}'"
        )
    items = _cap(items, spec.max_mb)
    return _read_files("stdlib", items, spec.val_fraction, spec.model_dump(), report=False)


_SCORING_ONLY: ContextVar[bool] = ContextVar("specformer_scoring_only", default=False)


@contextmanager
def scoring_only() -> Iterator[None]:
    """Within the block a corpus is read to be scored, not trained on (``eval --data``): a
    ``files`` corpus reads its ``val_paths`` alone, as the validation split, and has no
    training split (the model's tokenizer is given, so none is trained on it)."""
    token = _SCORING_ONLY.set(True)
    try:
        yield
    finally:
        _SCORING_ONLY.reset(token)


def is_scoring_only() -> bool:
    """Whether the data is read to be scored alone (:func:`scoring_only`)."""
    return _SCORING_ONLY.get()


def files_corpus(spec: FilesDataSpec) -> Corpus:
    """Local files, directories (all files below, hidden ones excepted) or globs.

    A file's key (what the split hashes, and what validation lists) is its path relative
    to the fixed part of the pattern that found it (``data/**/*.txt`` -> below ``data``;
    a directory -> below it; a file -> its name), so it does not change when other
    paths are added."""
    walked: set[Path] = set()
    found = _expand_paths(spec.paths, "training.data.paths", walked)
    held: list[tuple[str, Path]] = []
    if spec.val_paths is not None:  # validation files given: left out of paths, read whole
        held = _expand_paths(spec.val_paths, "training.data.val_paths", walked)
        resolved = {path.resolve() for _, path in held}
        given, found = found, [(key, path) for key, path in found if path.resolve() not in resolved]
        if is_scoring_only():
            found = []  # the files to score are val_paths' alone
        elif not found:
            raise DataError(f"training.data.paths: every file it finds ({_names([key for key, _ in given])}) is in "
                            "training.data.val_paths, which validation reads: nothing is left to train on")
    keyed = _cap(found, spec.max_mb)
    # (text_field is in each JSON-lines document's digest: other files keep the key they had)
    corpus = _read_files("files", keyed + held, spec.val_fraction,
                         spec.model_dump(exclude={"paths", "val_paths", "text_field"}),
                         text_field=spec.text_field, val_from=len(keyed) if spec.val_paths is not None else None,
                         walked=walked)
    if spec.max_mb is not None and (size := sum(path.stat().st_size for _, path in keyed)) > spec.max_mb * 1e6:
        # the cap keeps or leaves out whole files, and keeps at least one: said, not silent
        corpus.notes.append(f"training.data.max_mb={spec.max_mb:g} is below the {_mb(size)} MB of "
                            f"{_names([key for key, _ in keyed])}, read whole (the cap keeps or leaves out whole files)")
    if not corpus.train and not (is_scoring_only() and spec.val_paths is not None):
        read = {i.removesuffix(" (last lines)") for i in corpus.val_ids} if spec.val_paths is None else set()
        raise DataError("training.data.paths: no text to train on in the given files; "
                        + _no_text(corpus, [key for key, _ in keyed], read))
    if spec.val_paths is not None and not corpus.val:  # not a validation split of no tokens, or a cache's other one
        raise DataError("training.data.val_paths: no text to validate on in the given files; "
                        + _no_text(corpus, [key for key, _ in held], set()))
    return corpus


def _no_text(corpus: Corpus, keys: list[str], read: set[str]) -> str:
    """Why the files ``keys`` gave no text (``read``: those that gave some, to the other split):
    empty, not UTF-8 text (with where each stops being it), cannot be read, ..."""
    ours = set(keys)
    skipped = [key for key in corpus.skipped if key in ours]
    unreadable = [entry for entry in corpus.unreadable if entry.rsplit(" (", 1)[0] in ours]
    not_documents = [entry for entry in corpus.not_documents if entry.split(" (", 1)[0] in ours]
    bad = {entry.rsplit(" (", 1)[0] for entry in unreadable} | {entry.split(" (", 1)[0] for entry in not_documents}
    empty = [key for key in keys if key not in skipped and key not in bad and key not in read]
    found = [f"empty (or only whitespace): {_names(empty)}"] if empty else []
    if skipped:  # where each stops being text (a UTF-16 or UTF-32 file's note below says what it is)
        where = {key: at for key in skipped if (at := corpus.skipped_at.get(key, "UTF-16")) not in ("UTF-16", "UTF-32")}
        found.append("left out as not UTF-8 text: " + _names([f"{key} ({where[key]})" if key in where else key
                                                             for key in skipped]))
        if where:  # what is read, and the usual fix
            latin1 = any(", byte 0x" in at for at in where.values())
            found[-1] += (" (files are read as UTF-8 text, .gz, .bz2 and .xz ones decompressed"
                          f"{': save a Latin-1 file as UTF-8 with `iconv -f latin1 -t utf-8`' if latin1 else ''})")
    found += [f"cannot be read: {_names(unreadable)}"] if unreadable else []
    found += [f"found in a folder, with no documents: {'; '.join(not_documents)}"] if not_documents else []
    encoded = {corpus.skipped_at.get(key) for key in skipped} & {"UTF-16", "UTF-32"}
    found += [note for note in corpus.notes if any(f" {encoding} text" in note for encoding in sorted(encoded))]
    found += [f"{_names(sorted(read))} has text only in its last lines, which validation holds out"] if read else []
    return "; ".join(found)


def _mb(size: int) -> str:
    """``size`` bytes in MB as a person writes it: 0.005, 2.5, 150, 1,235 (never 1.5e+02)."""
    return f"{size / 1e6:,.0f}" if size >= 10e6 else f"{size / 1e6:.2g}"


def read_texts(patterns: tuple[str, ...], setting: str, digests: list[bytes]) -> Iterator[tuple[str, Path, str]]:
    """(key, path, text) of every file ``patterns`` find, in order, decompressed and decoded
    as UTF-8 (a byte-order mark dropped); each file's key and content hash go to ``digests``.
    A file that cannot be read, or is not UTF-8, is an error naming it and ``setting``."""
    for key, path in _expand_paths(patterns, setting):
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise DataError(f"{setting}: cannot read {path} ({exc.strerror or exc})") from None
        data = _decompressed(path, raw)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{setting}: {not_utf8(path, exc)}") from None
        if "\x00" in text and (nul := nul_problem(data)):
            why, line, column = nul
            at = "" if why.startswith("UTF-16") else f":{line}:{column}"
            raise DataError(f"{setting}: {path}{at}: not text, {why}; save the file as UTF-8 text")
        digests.append(_key_bytes(key) + hashlib.sha1(raw).digest())
        yield key, path, text.removeprefix("\ufeff")


def _utf8_stop(exc: UnicodeDecodeError) -> tuple[int, int, int, str | None]:
    """Where a text stops being UTF-8, as an editor counts it: (line, column, the byte there,
    the encoding a byte-order mark that opens it names, 'UTF-16' or 'UTF-32', or None)."""
    data = bytes(exc.object)
    line, column = _line_column(data, exc.start)
    return line, column, data[exc.start], bom_encoding(data)


def _line_column(data: bytes, at: int) -> tuple[int, int]:
    """The line and column of the byte at ``at``, its lines ended as :func:`numbered_lines`
    ends them (``\\n``, ``\\r\\n`` or a lone ``\\r``), as an editor counts them."""
    line = data.count(b"\n", 0, at) + data.count(b"\r", 0, at) - data.count(b"\r\n", 0, at) + 1
    return line, at - max(data.rfind(b"\n", 0, at), data.rfind(b"\r", 0, at))


def _where_not_utf8(exc: UnicodeDecodeError, name: str = "") -> str:
    """Where a text stops being UTF-8: 'line 3, column 7, byte 0xe9' (UTF-16 or UTF-32, a
    byte-order mark says: that encoding; a compressed file or an image given as text: what it
    is, 'gzip-compressed data (...)')."""
    line, column, byte, encoding = _utf8_stop(exc)
    kind = _binary_kind(bytes(exc.object[:8]), name)
    return encoding or kind or f"line {line}, column {column}, byte 0x{byte:02x}"


# what the opening bytes of a file often given as text by mistake say it is
_MAGIC = (
    (b"\x1f\x8b", "gzip-compressed data: name it {name}.gz to have it read decompressed"),
    (b"BZh", "bzip2-compressed data: name it {name}.bz2 to have it read decompressed"),
    (b"\xfd7zXZ\x00", "xz-compressed data: name it {name}.xz to have it read decompressed"),
    (b"PK\x03\x04", "a zip archive: unpack it, its files are read, a .zip is not"),
    (b"\x89PNG", "a PNG image, not text"),
    (b"\xff\xd8\xff", "a JPEG image, not text"),
    (b"GIF8", "a GIF image, not text"),
    (b"%PDF-", "a PDF document, not text: extract its text first"),
)


def _binary_kind(head: bytes, name: str) -> str | None:
    """What a file that is not UTF-8 text is, from its first bytes ('gzip-compressed data
    (name it notes.txt.gz ...)'), or None."""
    for magic, what in _MAGIC:
        if head.startswith(magic) and (magic != b"BZh" or head[4:8] == b"1AY&"):
            return what.format(name=name or "the file")
    return None


def nul_problem(data: bytes) -> tuple[str, int, int] | None:
    """Why ``data``, valid UTF-8, is still not text: a NUL byte, which no text file holds
    (``git`` and ``grep`` take a file with one for binary). (why, line, column of the first
    NUL): ASCII text saved as UTF-16 without a byte-order mark (every other byte NUL) says
    so; None when it holds no NUL."""
    at = data.find(b"\x00")
    if at < 0:
        return None
    head = data[:4096]
    even, odd = head[0::2].count(0), head[1::2].count(0)
    line, column = _line_column(data, at)
    if max(even, odd) >= len(head) // 8 and min(even, odd) * 8 <= max(even, odd):
        return "UTF-16 without a byte-order mark: every other byte is NUL", line, column
    return "a NUL byte: binary data, not text", line, column


def json_problem(exc: Any) -> str:
    """What is wrong with a line of JSON, and at which column: 'Expecting value at column 8'
    ('Unterminated string starting at column 10', the message already ending in 'at')."""
    return f"{exc.msg}{'' if exc.msg.endswith(' at') else ' at'} column {exc.colno}"


def not_utf8(path: Path, exc: UnicodeDecodeError) -> str:
    """Where a file stops being UTF-8, as an editor counts it: 'data/qa.jsonl:6:4: not UTF-8 text
    (byte 0xe9)', with the usual cause and its fix."""
    line, column, byte, encoding = _utf8_stop(exc)
    if not encoding and (kind := _binary_kind(bytes(exc.object[:8]), Path(path).name)):
        return f"{path}: not UTF-8 text: {kind}"
    notepad = ", what Windows Notepad saves as 'Unicode'" if encoding == "UTF-16" else ""
    how = (f" ({encoding}: a byte-order mark opens it{notepad})" if encoding
           else " (from Latin-1, `iconv -f latin1 -t utf-8`)")
    return f"{path}:{line}:{column}: not UTF-8 text (byte 0x{byte:02x}): save the file as UTF-8{how}"


def _expand_paths(patterns: tuple[str, ...], setting: str, walked: set[Path] | None = None) -> list[tuple[str, Path]]:
    """(key, path) of every file that ``patterns`` (files, directories, globs) find, sorted
    by key; a pattern that finds nothing is an error naming ``setting``. The files found
    below a directory go to ``walked`` as well."""
    items: dict[str, tuple[str, Path]] = {}
    missing = []
    for pattern in patterns:
        expanded = str(Path(pattern).expanduser())
        literal = Path(expanded).exists()  # `notes [v2]` is that folder, not a character class
        matches = [Path(expanded)] if literal else [Path(p) for p in glob.glob(expanded, recursive=True)]
        if not matches:
            missing.append(pattern)
        base = _fixed_part(expanded, literal=literal)
        for match in matches:
            if match.is_dir():
                files = _files_below(match)
                if walked is not None:
                    walked.update(files)
            else:
                files = [match]
            for f in files:
                key = (f.relative_to(base) if base is not None and f.is_relative_to(base) else Path(f.name)).as_posix()
                items.setdefault(f.resolve().as_posix(), (key, f))
    if missing:
        raise DataError(f"{setting}: nothing matches {', '.join(map(repr, missing))}{relative_note(missing, setting)}")
    if not items:  # every pattern found only folders, with no (visible) file below them
        folders = ", ".join(map(repr, patterns))
        raise DataError(f"{setting}: no files found: {folders} {'finds' if len(patterns) == 1 else 'find'} only "
                        "folders with no files in them (hidden ones, whose names start with '.', are left out)")
    return sorted(items.values())


def relative_note(paths: list[str], setting: str) -> str:
    """What a relative data path is relative to, for a message about paths not found: the
    working directory, not the folder of the spec that names them (a run resumed from
    another folder meets this too), and the two ways out."""
    if all(Path(p).expanduser().is_absolute() for p in paths):
        return ""
    return (f" (a relative path is read from the working directory, {Path.cwd()}, not from the spec's folder: "
            f"run from the folder it is relative to, or give it whole with --set {setting}=...)")


_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def lfs_pointer(path: str | os.PathLike[str]) -> str:
    """When ``path`` is a Git LFS pointer (the few lines of text that stand for a large file
    in a repository cloned without Git LFS, as Hugging Face model repositories often are),
    the message that says so and how to get the file; else ""."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_LFS_POINTER))
    except OSError:
        return ""
    if head != _LFS_POINTER:
        return ""
    return (f"{path} is a Git LFS pointer, not the file itself (the repository was cloned without Git LFS): "
            "fetch the file with `git lfs pull` in that repository, or download it with `hf download`")


def _files_below(folder: Path) -> list[Path]:
    """The files below ``folder``, hidden ones excepted, following symbolic links to
    folders as a ``**`` glob does (each real folder once: a link cycle ends)."""
    seen: set[str] = set()
    found = []
    for root, dirs, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(Path(root) / n for n in names if not n.startswith(".") and (Path(root) / n).is_file())
    return sorted(found)


def _fixed_part(pattern: str, *, literal: bool = False) -> Path | None:
    """The directory a pattern's keys are relative to: a directory itself, a file's
    folder, or a glob's leading parts without wildcards."""
    path = Path(pattern)
    if literal or not glob.has_magic(pattern):
        return path if path.is_dir() else path.parent
    fixed = []
    for part in path.parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def _hidden(rel: Path) -> bool:
    """A dot-file or anything below a dot-directory (.git, .venv, .cache)."""
    return any(part.startswith(".") for part in rel.parts)


def _names(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _hub_hint(exc: Exception, datasets: Any) -> str:
    """What to do when the Hugging Face Hub could not be reached (``datasets`` raises a
    ConnectionError, after minutes of retries without network), or "" for other errors."""
    if not isinstance(exc, ConnectionError):
        return ""
    offline = getattr(datasets.config, "HF_HUB_OFFLINE", False) or any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )
    local = "or give the dataset's local folder as training.data.name, or its text files with type: files"
    if offline:
        return (f"; it is not in the local Hugging Face cache, and HF_HUB_OFFLINE keeps it from being "
                f"downloaded: download it on a machine with network (the same cache), {local}")
    return (f"; without network, a dataset downloaded before is read from the local cache with "
            f"HF_HUB_OFFLINE=1 (which also skips the retries), {local}")


def hf_corpus(spec: HFDataSpec) -> Corpus:
    """A text dataset from the Hugging Face hub (or its local cache)."""
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError:
        raise DataError(
            "training.data.type 'hf' needs the `datasets` package: pip install datasets "
            "(or use type: stdlib or type: files)"
        ) from None

    notes: list[str] = []

    def load(split: str) -> list[str]:
        try:
            ds = datasets.load_dataset(spec.name, spec.config, split=split)
        except Exception as exc:  # datasets raises many kinds; say which dataset failed
            raise DataError(
                f"could not load dataset {spec.name!r} split {split!r}: {exc}{_hub_hint(exc, datasets)}"
            ) from None
        if spec.text_field not in ds.column_names:
            raise DataError(
                f"dataset {spec.name!r} has no column {spec.text_field!r}; columns: {', '.join(ds.column_names)}"
            )
        values = ds[spec.text_field]
        wrong = next(((i, v) for i, v in enumerate(values) if v is not None and not isinstance(v, str)), None)
        if wrong is not None:
            raise DataError(
                f"dataset {spec.name!r} split {split!r}: column {spec.text_field!r} (training.data.text_field) holds "
                f"{type(wrong[1]).__name__} values, not text (row {wrong[0] + 1}); columns: {', '.join(ds.column_names)}"
            )
        # a row without the field (a JSON line that lacks it) is null: dropped, and said
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            notes.append(f"{len(missing)} {split} row{'s' if len(missing) != 1 else ''} without {spec.text_field!r} "
                         f"(training.data.text_field) left out, the first row {missing[0] + 1}")
        texts = [t for t in values if isinstance(t, str) and t.strip()]
        return texts[: spec.max_documents] if spec.max_documents else texts

    train, val = load(spec.train_split), load(spec.val_split)
    # the number of training documents marks where the split falls: a document moved from
    # one split to the other gives another key
    fingerprint = content_hash("hf", spec.model_dump(), len(train), chunks=(t.encode() for t in train + val))
    return Corpus(name=f"hf:{spec.name}", train=train, val=val, fingerprint=fingerprint, notes=notes)
