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
import io
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
    read_texts,
    split_by_path,
)
from specformer.specs.training import LabelledDataSpec

__all__ = ["LabelledCorpus", "labelled_corpus", "label_ids"]

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
    ``n_classes`` of them."""
    if all(isinstance(x, int) for x in labels):
        bad = sorted({x for x in labels if not 0 <= x < n_classes})  # type: ignore[operator]
        if bad:
            raise DataError(
                f"{setting}: label {bad[0]} is not a class id of the classification head, which has "
                f"n_classes={n_classes} (ids 0-{n_classes - 1}); the data's labels run "
                f"{min(labels)}-{max(labels)}: set head.n_classes to the number of classes"  # type: ignore[type-var]
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
    for key, path, text in read_texts(patterns, setting, digests):
        found = list(_rows(path, text, spec, setting))
        if not found:
            raise DataError(f"{setting}: {path} holds no rows (it is empty, or only a header)")
        rows += found
        keys.append(key)
    return rows, keys


def _rows(path: Path, text: str, spec: LabelledDataSpec, setting: str) -> Iterator[tuple[str, Label]]:
    """(text, label) of each row; anything else is an error naming the file, the row and the setting."""
    kind = _table_kind(path)
    if kind in ("csv", "tsv"):
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if kind == "tsv" else ",")
        columns = list(reader.fieldnames or [])
        for name, what in ((spec.text_field, "text_field"), (spec.label_field, "label_field")):
            if name not in columns:
                raise DataError(f"{setting}: {path}:1: no {name!r} column (training.data.{what}); the header row "
                                f"has {', '.join(map(repr, columns[:8])) or 'no columns'}")
        for row in reader:
            yield _row(row, f"{setting}: {path}:{reader.line_num}", spec)
        return
    if kind == "json" and text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{setting}: {path}:{exc.lineno}: not JSON ({exc.msg} at column {exc.colno})") from None
        for number, record in enumerate(records, start=1):
            yield _row(record, f"{setting}: {path}: item {number}", spec)
        return
    if kind is None and not _is_json_lines(path):
        raise DataError(f"{setting}: {path} is not a table: labelled texts are read from .csv, .tsv, .json, "
                        ".jsonl and .ndjson files (compressed or not)")
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{setting}: {path}:{number}: not a JSON object ({exc.msg} at column {exc.colno}); a "
                            ".jsonl file holds one JSON object per line") from None
        yield _row(record, f"{setting}: {path}:{number}", spec)


def _row(record: object, where: str, spec: LabelledDataSpec) -> tuple[str, Label]:
    if not isinstance(record, dict):
        raise DataError(f"{where}: a JSON {type(record).__name__}, not an object with {spec.text_field!r} and "
                        f"{spec.label_field!r} fields")
    values = []
    for name, what in ((spec.text_field, "text_field"), (spec.label_field, "label_field")):
        if name not in record:
            has = ", ".join(map(repr, list(record)[:8])) or "no fields"
            raise DataError(f"{where}: no {name!r} field (training.data.{what}); this row has {has}")
        values.append(record[name])
    text, label = values
    if not isinstance(text, str):
        raise DataError(f"{where}: the text ({spec.text_field!r}) is {_kind(text)}, not a string")
    text, _ = _plain_text(text)
    if not text.strip():
        raise DataError(f"{where}: the text ({spec.text_field!r}) is empty; every row needs a text to classify")
    if isinstance(label, str):
        label = label.strip()
        if label.isdigit():
            label = int(label)
        elif not label:
            raise DataError(f"{where}: the label ({spec.label_field!r}) is empty")
    elif isinstance(label, bool) or not isinstance(label, int):
        raise DataError(f"{where}: the label ({spec.label_field!r}) is {_kind(label)}: a label is a class id "
                        "(an integer) or a name (a string)")
    return text, label


def _kind(value: object) -> str:
    return "null" if value is None else f"a {type(value).__name__}"
