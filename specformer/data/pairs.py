"""(source, target) text pairs from the user's files, for sequence-to-sequence training.

A JSON-lines file (``.jsonl``, ``.ndjson``) holds one object per line with a source and
a target field; a ``.tsv`` file holds one pair per line, source and target separated by
a tab (a first line that names the two fields is a header). Either may be compressed
(``.gz``, ``.bz2``, ``.xz``). Without ``val_paths``, a pair is held out when a hash of
its source text falls below ``val_fraction``: the split is the same on every machine,
and a source that occurs twice is never both trained on and scored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from specformer.data.cache import content_hash
from specformer.data.corpus import (
    Corpus,
    DataError,
    _is_json_lines,
    _plain_text,
    is_scoring_only,
    json_problem,
    numbered_lines,
    read_texts,
    split_by_path,
)
from specformer.specs.training import PairsDataSpec

__all__ = ["PairCorpus", "pair_corpus"]


@dataclass
class PairCorpus:
    """Train and held-out (source, target) pairs, and a hash of the files and settings."""

    train: list[tuple[str, str]]
    val: list[tuple[str, str]]
    fingerprint: str
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    spec: PairsDataSpec | None = None  # where the pairs were read from, for :meth:`locate`

    def text_corpus(self) -> Corpus:
        """Both sides of the training pairs as documents: what a BPE is trained on."""
        texts = [text for pair in self.train for text in pair if text.strip()]
        return Corpus(name="pairs", train=texts, val=[], fingerprint=self.fingerprint)

    def locate(self, pair: tuple[str, str]) -> str:
        """Where ``pair`` was read: 'training.data.paths: data/qa.jsonl:12' (the first line that
        holds it; the files are read again, so only an error should ask)."""
        if self.spec is not None:
            for setting, patterns in (("training.data.paths", self.spec.paths),
                                      ("training.data.val_paths", self.spec.val_paths or ())):
                for _, path, text in read_texts(patterns, setting, []):
                    for where, source, target in _numbered_pairs(path, text, self.spec, setting):
                        if (source, target) == pair:
                            return where
        return "training.data.paths"


def pair_corpus(spec: PairsDataSpec) -> PairCorpus:
    """The pairs of ``spec.paths`` (and ``spec.val_paths``), split into train and validation."""
    settings = spec.model_dump(exclude={"paths", "val_paths"})
    digests: list[bytes] = []
    notes: list[str] = []
    if is_scoring_only() and spec.val_paths is not None:
        train, names = [], []  # eval --data: the pairs to score are val_paths' alone, none trained on
    else:
        train, names = _read(spec, spec.paths, "training.data.paths", digests, notes)
    files = list(names)
    if spec.val_paths is not None:
        digests.append(b"\nval_paths")  # a file moved from paths to val_paths changes the split
        val, val_names = _read(spec, spec.val_paths, "training.data.val_paths", digests, notes)
        files += val_names
        seen = {src for src, _ in train}
        if shared := sum(src in seen for src, _ in val):
            verb = "has" if shared == 1 else "have"
            notes.append(
                f"{shared} of the {len(val)} pairs of training.data.val_paths {verb} a source that is "
                "also in training.data.paths (their loss and exact match are not held out)"
            )
    else:
        if len(train) < 2:
            raise DataError(
                f"training.data.paths: found {len(train)} pair in {', '.join(names)}; at least 2 are needed "
                "to hold one out for validation (or give the held-out pairs in training.data.val_paths)"
            )
        # split the distinct sources, so that a source's every pair lands on one side (the
        # at-least-one-each rule of split_by_path would otherwise move one copy alone)
        sources = list(dict.fromkeys(src for src, _ in train))
        if len(sources) < 2:
            raise DataError(
                f"training.data.paths: every pair in {', '.join(names)} has the same source; holding "
                "one out would score a source also trained on (give the held-out pairs in "
                "training.data.val_paths)"
            )
        _, val_idx = split_by_path(sources, spec.val_fraction)
        held_out = {sources[i] for i in val_idx}
        train, val = (
            [p for p in train if p[0] not in held_out],
            [p for p in train if p[0] in held_out],
        )
    fingerprint = content_hash("pairs", settings, chunks=digests)
    return PairCorpus(train=train, val=val, fingerprint=fingerprint, files=files, notes=notes, spec=spec)


def _read(
    spec: PairsDataSpec, patterns: tuple[str, ...], setting: str, digests: list[bytes], notes: list[str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """The pairs of every file ``patterns`` find, in order, and the files' keys; a ``.tsv`` file
    whose first line looks like a header of other names than the fields' gets a note."""
    pairs: list[tuple[str, str]] = []
    keys = []
    for key, path, text in read_texts(patterns, setting, digests):
        found = list(_pairs(path, text, spec, setting))
        if not found:
            raise DataError(f"{setting}: {path} holds no pairs (it is empty, or only blank lines)")
        first = next(numbered_lines(text))[1].split("\t")
        if _is_tsv(path) and found[0] == tuple(first) and all(_HEADER_NAME.fullmatch(c) for c in first):
            notes.append(
                f"the first line of {path} ({first[0]!r}, {first[1]!r}) is read as a pair: a header line is "
                f"skipped when it names training.data.source_field and target_field ({spec.source_field!r}, "
                f"{spec.target_field!r}): if it is one, set them to its names"
            )
        pairs += found
        keys.append(key)
    return pairs, keys


def _pairs(path: Path, text: str, spec: PairsDataSpec, setting: str) -> Iterator[tuple[str, str]]:
    """(source, target) of each non-blank line of a ``.jsonl``/``.ndjson`` or ``.tsv`` file;
    anything else is an error naming the file, the line and the setting."""
    for _, source, target in _numbered_pairs(path, text, spec, setting):
        yield source, target


def _numbered_pairs(path: Path, text: str, spec: PairsDataSpec, setting: str) -> Iterator[tuple[str, str, str]]:
    """:func:`_pairs`, each with where it is: 'training.data.paths: data/qa.jsonl:12'."""
    src_f, tgt_f = spec.source_field, spec.target_field
    fields = f"training.data.source_field ({src_f!r}) and training.data.target_field ({tgt_f!r})"
    tsv = _is_tsv(path)
    if not tsv and not _is_json_lines(path):
        raise DataError(
            f"{setting}: {path} is neither JSON lines (.jsonl, .ndjson) nor tab-separated (.tsv): "
            "pairs are read from those (compressed or not)"
        )
    text = text.removeprefix("\ufeff")
    # lines end as open() ends them: \n, \r\n or an old Mac's lone \r (not at a form feed or
    # U+2028, a text's own, where str.splitlines() would break)
    for number, line in numbered_lines(text):
        where = f"{setting}: {path}:{number}"
        if not line.strip():
            continue
        if tsv:
            columns = line.split("\t")
            if len(columns) != 2:
                raise DataError(
                    f"{where}: {len(columns)} tab-separated column{'s' if len(columns) != 1 else ''}; "
                    "a .tsv file of pairs holds two on each line, source then target"
                )
            if number == 1 and (columns[0].strip(), columns[1].strip()) == (src_f, tgt_f):
                continue  # a header naming the fields
            source, target = columns
        else:
            record = json_object(line, where, f"; a .jsonl file of pairs holds one object per line, with {fields}")
            values = []
            for name, setting_name in ((src_f, "source_field"), (tgt_f, "target_field")):
                if name not in record:
                    has = ", ".join(map(repr, list(record)[:8])) or "no fields"
                    raise DataError(
                        f"{where}: no {name!r} field (training.data.{setting_name}); this line has {has}"
                    )
                value = record[name]
                if not isinstance(value, str):
                    kind = "null" if value is None else f"a JSON {type(value).__name__}"
                    raise DataError(
                        f"{where}: {name!r} (training.data.{setting_name}) is {kind}, not a string"
                    )
                values.append(value)
            source, target = values
        source, _ = _plain_text(source)
        target, _ = _plain_text(target)
        if not source.strip():
            raise DataError(f"{where}: the source is empty; every pair needs an input to read")
        yield where, source, target


# a first line of a .tsv file of two such names is likely a header: `question<TAB>answer`, `de<TAB>en`
_HEADER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def json_object(line: str, where: str, holds: str) -> dict:
    """The JSON object on ``line`` of a ``.jsonl`` file; anything else is a :class:`DataError`
    naming ``where`` (the setting, file and line), ``holds`` (what such an object holds) after
    'not an object'."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{where}: not a JSON object ({json_problem(exc)}); a .jsonl file holds one JSON object per line"
        ) from None
    if not isinstance(record, dict):
        raise DataError(f"{where}: a JSON {type(record).__name__}, not an object{holds}")
    return record


def _is_tsv(path: Path) -> bool:
    name = path.name.lower()
    for suffix in (".gz", ".bz2", ".xz"):
        name = name.removesuffix(suffix)
    return name.endswith(".tsv")
