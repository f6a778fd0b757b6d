"""Texts with a class label each, from the user's tables, for sequence classification.

A ``.csv`` or ``.tsv`` file has a header row naming its columns; a ``.json`` file holds an
array of objects or JSON lines, as a ``.jsonl``/``.ndjson`` file does. Either may be
compressed (``.gz``, ``.bz2``, ``.xz``). Without ``val_paths``, a row is held out when a
hash of its text falls below ``val_fraction``: the same split on every machine, and a text
that occurs twice is never both trained on and scored.

Labels are class ids or names (:func:`label_ids`): ids when every label is an integer (a
JSON number, or digits in a CSV cell), names otherwise, numbered in the head's own
``labels`` order when it names its classes, else in sorted order.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specformer.data.cache import content_hash
from specformer.data.corpus import (
    Corpus,
    DataError,
    _is_json_lines,
    _plain_text,
    _table_kind,
    csv_fields_up_to,
    is_scoring_only,
    json_problem,
    numbered_lines,
    read_texts,
    reader_rows,
    split_by_path,
    table_reader,
    tsv_quote_error,
)
from specformer.specs.training import LabelledDataSpec

__all__ = ["LabelledCorpus", "labelled_corpus", "label_ids", "Columns", "is_table", "table_records", "row_values",
           "TextTable", "read_text_table"]

Label = int | str


@dataclass
class LabelledCorpus:
    """Train and held-out (text, label) rows as read (a label an int or a name), and a hash
    of the files and settings."""

    train: list[tuple[str, Label]]
    val: list[tuple[str, Label]]
    fingerprint: str
    files: list[str] = field(default_factory=list)

    def text_corpus(self) -> Corpus:
        """The training texts as documents: what a BPE is trained on."""
        return Corpus(name="labelled", train=[text for text, _ in self.train], val=[], fingerprint=self.fingerprint)


def labelled_corpus(spec: LabelledDataSpec) -> LabelledCorpus:
    """The rows of ``spec.paths`` (and ``spec.val_paths``), split into train and validation."""
    settings = spec.model_dump(exclude={"paths", "val_paths"})
    digests: list[bytes] = []
    if is_scoring_only() and spec.val_paths is not None:
        train, files = [], []  # eval --data: the rows to score are val_paths' alone, none trained on
    else:
        train, files = _read(spec, spec.paths, "training.data.paths", digests)
    if spec.val_paths is not None:
        digests.append(b"\nval_paths")
        val, val_files = _read(spec, spec.val_paths, "training.data.val_paths", digests)
        files += val_files
    else:
        texts = list(dict.fromkeys(text for text, _ in train))
        if len(texts) < 2:
            raise DataError(
                f"training.data.paths: {', '.join(files)} hold{'s' if len(files) == 1 else ''} {len(texts)} "
                "distinct text; at least 2 are needed to hold one out for validation (or give the held-out "
                "rows in training.data.val_paths)"
            )
        _, val_idx = split_by_path(texts, spec.val_fraction)
        held_out = {texts[i] for i in val_idx}
        train, val = [r for r in train if r[0] not in held_out], [r for r in train if r[0] in held_out]
    return LabelledCorpus(train=train, val=val, fingerprint=content_hash("labelled", settings, chunks=digests),
                          files=files)


def label_ids(
    labels: Sequence[Label], n_classes: int, names: Sequence[str] | None, *, setting: str = "training.data.paths"
) -> tuple[list[int], tuple[str, ...] | None]:
    """Class ids of ``labels`` for a head of ``n_classes`` classes, and the class names they
    were numbered by (None for integer labels). ``names`` (the head's ``labels``) fixes the
    order of names; without it they are numbered in sorted order, and there must be exactly
    ``n_classes`` of them. Integer labels are class ids, unless ``names`` spells each of them
    (star ratings 1-5 under ``head.labels: ["1", "2", "3", "4", "5"]``): then they are names."""
    ints = all(isinstance(x, int) for x in labels)
    if ints and names is not None and labels and {str(x) for x in labels} <= set(names):
        labels, ints = [str(x) for x in labels], False
    if ints:
        bad = sorted({x for x in labels if not 0 <= x < n_classes})  # type: ignore[operator]
        if bad:
            low, high = min(labels), max(labels)  # type: ignore[type-var]
            fix = ("set head.n_classes to the number of classes" if not (low >= 1 and high == n_classes) else  # type: ignore[operator]
                   f"class ids count from 0; to keep the data's numbers as they are, name the classes: "
                   f"head.labels: [{', '.join(repr(str(i)) for i in range(1, n_classes + 1))}] (or subtract 1 from "
                   "each label)")
            raise DataError(
                f"{setting}: label {bad[0]} is not a class id of the classification head, which has "
                f"n_classes={n_classes} (ids 0-{n_classes - 1}); the data's labels run {low}-{high}: {fix}"
            )
        return [int(x) for x in labels], None
    text = [str(x) for x in labels]
    if names is None:
        found = sorted(set(text))
        if len(found) != n_classes:
            shown = ", ".join(map(repr, found[:10])) + (", ..." if len(found) > 10 else "")
            raise DataError(
                f"{setting}: the data has {len(found)} label names ({shown}) and the classification head has "
                f"n_classes={n_classes}: set head.n_classes={len(found)}"
            )
        names = found
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(text) - set(index))
    if unknown:
        raise DataError(
            f"{setting}: label {unknown[0]!r} is not one of the classification head's labels "
            f"({', '.join(map(repr, names))}, head.labels)"
        )
    return [index[x] for x in text], tuple(names)


def _read(
    spec: LabelledDataSpec, patterns: tuple[str, ...], setting: str, digests: list[bytes]
) -> tuple[list[tuple[str, Label]], list[str]]:
    rows: list[tuple[str, Label]] = []
    keys = []
    columns = Columns(text=spec.text_field, label=spec.label_field)
    for key, path, text in read_texts(patterns, setting, digests):
        if _table_kind(path) is None and not _is_json_lines(path):
            raise DataError(f"{setting}: {path} is not a table: labelled texts are read from .csv, .tsv, .json, "
                            ".jsonl and .ndjson files (compressed or not)")
        _, records = table_records(path, text, setting, columns)
        found = [row_values(record, where, columns) for where, record in records]
        if not found:
            raise DataError(f"{setting}: {path} holds no rows (it is empty, or only a header)")
        rows += found  # type: ignore[arg-type]  # every row has a label: columns.label is set
        keys.append(key)
    return rows, keys


@dataclass(frozen=True)
class Columns:
    """The columns (or JSON fields) a table's rows are read by, and the setting that names
    each, for the errors: a training spec's fields, or a command's options."""

    text: str
    label: str | None
    text_setting: str = "training.data.text_field"
    label_setting: str = "training.data.label_field"

    def named(self) -> list[tuple[str, str]]:
        """(column, the setting that names it) of the columns every row must have."""
        pairs = [(self.text, self.text_setting)]
        return pairs if self.label is None else [*pairs, (self.label, self.label_setting)]


def is_table(path: Path) -> bool:
    """Whether ``path`` is a file of rows: ``.csv``, ``.tsv``, ``.json``, ``.jsonl`` or
    ``.ndjson``, compressed or not."""
    return _table_kind(path) is not None or _is_json_lines(path)


def table_records(
    path: Path, text: str, setting: str, columns: Columns
) -> tuple[list[str] | None, Iterator[tuple[str, object]]]:
    """The header of a table's rows (a CSV's or TSV's columns; None for JSON, whose records
    name their own fields) and each row as (where, record): where is "``setting``: path:line"
    (or ": item n" in a JSON array), for errors; a record is a dict of the row's columns as
    read, or whatever a JSON line holds (:func:`row_values` checks it). A CSV header without
    one of ``columns`` is an error naming the columns it has."""
    kind = _table_kind(path)
    if kind in ("csv", "tsv"):
        reader = table_reader(text, kind)
        try:
            header = list(reader.fieldnames or [])
        except csv.Error as exc:
            raise (tsv_quote_error(f"{setting}: {path}", 1, exc) if kind == "tsv"
                   else DataError(f"{setting}: {path}:1: the header row cannot be read ({exc})")) from None
        for name, what in columns.named():
            if name not in header:
                raise DataError(f"{setting}: {path}:1: no {name!r} column ({what}); the header row "
                                f"has {', '.join(map(repr, header[:8])) or 'no columns'}")
        return header, iter(_csv_rows(reader, f"{setting}: {path}", len(text), kind))
    if kind == "json" and text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{setting}: {path}:{exc.lineno}: not JSON ({json_problem(exc)})") from None
        return None, ((f"{setting}: {path}: item {number}", record) for number, record in enumerate(records, start=1))
    return None, _json_lines(path, text, setting)


def _csv_rows(reader: csv.DictReader, where: str, size: int, kind: str) -> list[tuple[str, object]]:
    """(where, row) of every row of ``reader``, whose whole text is ``size`` characters: a
    field as long as the text is read (the csv module refuses one past 128 KiB, a long
    document's text), and a row it cannot read is an error naming its line, as is a ``.tsv``
    row a stray quote ran on into the next ones (:func:`check_tsv_row`)."""
    with csv_fields_up_to(size):
        return [(f"{where}:{last}", CsvRow(row)) for _, last, row in reader_rows(reader, kind, where)]


class CsvRow(dict):
    """A row of a CSV or TSV file: a cell it lacks is None (csv's ``DictReader`` fills a
    short row so), not a JSON null."""


def _json_lines(path: Path, text: str, setting: str) -> Iterator[tuple[str, object]]:
    for number, line in numbered_lines(text):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{setting}: {path}:{number}: not a JSON object ({json_problem(exc)}); a "
                            ".jsonl file holds one JSON object per line") from None
        yield f"{setting}: {path}:{number}", record


def row_values(record: object, where: str, columns: Columns, *, blank_label: bool = False) -> tuple[str, Label | None]:
    """(text, label) of a row (label None without a label column, or with ``blank_label`` where
    the row's label is empty or null); anything else is an error naming the row (``where``)
    and the setting of the column at fault."""
    if not isinstance(record, dict):
        fields = " and ".join(repr(name) for name, _ in columns.named())
        raise DataError(f"{where}: a JSON {type(record).__name__}, not an object with {fields} "
                        f"field{'s' if columns.label is not None else ''}")
    for name, what in columns.named():
        if name not in record and not (blank_label and name == columns.label):  # no label: as a null one
            has = ", ".join(map(repr, list(record)[:8])) or "no fields"
            raise DataError(f"{where}: no {name!r} field ({what}); this row has {has}")
        if isinstance(record, CsvRow) and record.get(name, "") is None and not (blank_label and name == columns.label):
            # a CSV row shorter than its header (csv's DictReader fills the rest with None)
            cells = len([v for v in record.values() if v is not None])
            raise DataError(f"{where}: the row ends before its {name!r} column ({what}): {cells} of the header's "
                            f"{len(record)} columns")
    text = record[columns.text]
    if not isinstance(text, str):
        raise DataError(f"{where}: the text ({columns.text!r}) is {_kind(text)}, not a string")
    text, _ = _plain_text(text)
    if not text.strip():
        raise DataError(f"{where}: the text ({columns.text!r}) is empty; every row needs a text to classify")
    if columns.label is None:
        return text, None
    label = record.get(columns.label)
    if blank_label and (label is None or (isinstance(label, str) and not label.strip())):
        return text, None
    if isinstance(label, str):
        label = label.strip()
        if label.isdigit():
            label = int(label)
        elif not label:
            raise DataError(f"{where}: the label ({columns.label!r}) is empty")
    elif isinstance(label, bool) or not isinstance(label, int):
        raise DataError(f"{where}: the label ({columns.label!r}) is {_kind(label)}: a label is a class id "
                        "(an integer) or a name (a string)")
    return text, label


def _kind(value: object) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


@dataclass
class TextTable:
    """The rows of one table of texts to classify: its columns in order (a CSV's header, or
    the JSON fields in the order they first occur), each row as read, and each row's text
    and label (labels None without a label column; a label None where a row has none)."""

    columns: list[str]
    records: list[dict[str, object]]
    texts: list[str]
    labels: list[Label | None] | None


def read_text_table(path: Path, text: str, setting: str, columns: Columns, *, optional_label: bool = False,
                    blank_labels: bool = False) -> TextTable:
    """The rows of a table file's ``text`` (:func:`table_records`) read by ``columns``. With
    ``optional_label``, a table without ``columns.label`` (a CSV header without it, or a JSON
    row that has it) is read without labels instead of being an error; with ``blank_labels``, a
    row whose label is empty, null or (a JSON row) missing has the label None."""
    if optional_label and columns.label is not None:
        header, records = table_records(path, text, setting, Columns(columns.text, None, columns.text_setting))
        rows = list(records)
        has_label = (columns.label in header if header is not None
                     else any(isinstance(r, dict) and columns.label in r for _, r in rows))
        if not has_label:
            columns = Columns(columns.text, None, columns.text_setting, columns.label_setting)
    else:
        header, records = table_records(path, text, setting, columns)
        rows = list(records)
    values = [row_values(record, where, columns, blank_label=blank_labels) for where, record in rows]
    if not values:
        raise DataError(f"{setting}: {path} holds no rows (it is empty, or only a header)")
    order = list(header) if header is not None else list(dict.fromkeys(k for _, r in rows for k in r))  # type: ignore[union-attr]
    records_ = [{k: v for k, v in r.items() if k is not None} for _, r in rows]  # type: ignore[union-attr]
    return TextTable(columns=order, records=records_, texts=[t for t, _ in values],
                     labels=[label for _, label in values] if columns.label is not None else None)  # type: ignore[misc]
