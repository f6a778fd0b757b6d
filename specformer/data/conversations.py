"""Multi-turn conversations from the user's files, for supervised fine-tuning of a decoder.

A JSON-lines file (``.jsonl``, ``.ndjson``, compressed or not) holds one conversation per
line: an object whose ``messages_field`` (``messages``, as TRL's conversational datasets) is
a list of turns, each ``{"role": ..., "content": ...}``. Other keys of a turn (``name``,
``tool_calls``) are kept for the chat template. Without ``val_paths``, a conversation is held
out when a hash of its first non-system turn falls below ``val_fraction``, so a question asked
twice is never both trained on and scored.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specformer.data.cache import content_hash
from specformer.data.corpus import (
    Corpus,
    DataError,
    _is_json_lines,
    _plain_text,
    is_scoring_only,
    numbered_lines,
    read_texts,
    split_by_path,
)
from specformer.data.pairs import json_object
from specformer.specs.training import ConversationsDataSpec

__all__ = ["ConversationCorpus", "conversation_corpus", "read_turns"]

Messages = list[dict[str, Any]]


@dataclass
class ConversationCorpus:
    """Train and held-out conversations (each a list of turns), where each was read
    (``train_where``, ``val_where``: 'training.data.paths: data/chats.jsonl:12'), and a hash of
    the files and settings."""

    train: list[Messages]
    val: list[Messages]
    fingerprint: str
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    train_where: list[str] = field(default_factory=list)
    val_where: list[str] = field(default_factory=list)

    def text_corpus(self) -> Corpus:
        """The training turns' texts as documents: what a BPE would be trained on."""
        texts = [turn["content"] for messages in self.train for turn in messages if turn["content"].strip()]
        return Corpus(name="conversations", train=texts, val=[], fingerprint=self.fingerprint)


def conversation_corpus(spec: ConversationsDataSpec) -> ConversationCorpus:
    """The conversations of ``spec.paths`` (and ``spec.val_paths``), split into train and validation."""
    settings = spec.model_dump(exclude={"paths", "val_paths"})
    digests: list[bytes] = []
    if is_scoring_only() and spec.val_paths is not None:
        train, where, names = [], [], []  # eval --data: the conversations to score are val_paths' alone
    else:
        train, where, names = _read(spec, spec.paths, "training.data.paths", digests)
    files = list(names)
    notes: list[str] = []
    if spec.val_paths is not None:
        digests.append(b"\nval_paths")  # a file moved from paths to val_paths changes the split
        val, val_where, val_names = _read(spec, spec.val_paths, "training.data.val_paths", digests)
        files += val_names
    else:
        if len(train) < 2:
            raise DataError(
                f"training.data.paths: found {len(train)} conversation in {', '.join(names)}; at least 2 are "
                "needed to hold one out for validation (or give the held-out ones in training.data.val_paths)"
            )
        # split the distinct openings, so that every conversation that opens alike lands on one side
        keys = [_opening(messages) for messages in train]
        distinct = list(dict.fromkeys(keys))
        if len(distinct) < 2:
            raise DataError(
                f"training.data.paths: every conversation in {', '.join(names)} opens with the same turn; holding "
                "one out would score an opening also trained on (give the held-out ones in training.data.val_paths)"
            )
        _, val_idx = split_by_path(distinct, spec.val_fraction)
        held_out = {distinct[i] for i in val_idx}
        val = [m for m, k in zip(train, keys, strict=True) if k in held_out]
        val_where = [w for w, k in zip(where, keys, strict=True) if k in held_out]
        train, where = (
            [m for m, k in zip(train, keys, strict=True) if k not in held_out],
            [w for w, k in zip(where, keys, strict=True) if k not in held_out],
        )
    fingerprint = content_hash("conversations", settings, chunks=digests)
    return ConversationCorpus(train=train, val=val, fingerprint=fingerprint, files=files, notes=notes,
                              train_where=where, val_where=val_where)


def _opening(messages: Messages) -> str:
    """What decides a conversation's split: its first turn that is not a system prompt."""
    first = next((turn for turn in messages if turn["role"] != "system"), messages[0])
    return f"{first['role']}\n{first['content']}"


def _read(
    spec: ConversationsDataSpec, patterns: tuple[str, ...], setting: str, digests: list[bytes]
) -> tuple[list[Messages], list[str], list[str]]:
    """The conversations of every file ``patterns`` find, in order, where each was read, and
    the files' keys."""
    conversations: list[Messages] = []
    where: list[str] = []
    keys = []
    for key, path, text in read_texts(patterns, setting, digests):
        found = list(_numbered_conversations(path, text, spec, setting))
        if not found:
            raise DataError(f"{setting}: {path} holds no conversations (it is empty, or only blank lines)")
        where += [w for w, _ in found]
        conversations += [m for _, m in found]
        keys.append(key)
    return conversations, where, keys


def _numbered_conversations(
    path: Path, text: str, spec: ConversationsDataSpec, setting: str
) -> Iterator[tuple[str, Messages]]:
    """(where, turns) of each non-blank line of a ``.jsonl``/``.ndjson`` file; anything else is
    an error naming the file, the line and the setting."""
    name = spec.messages_field
    if not _is_json_lines(path):
        raise DataError(
            f"{setting}: {path} is not JSON lines (.jsonl, .ndjson): conversations are read from those "
            "(compressed or not), one object per line with its turns under training.data.messages_field"
        )
    for number, line in numbered_lines(text):
        where = f"{setting}: {path}:{number}"
        if not line.strip():
            continue
        record = json_object(line, where, f" with a {name!r} field")
        if name not in record:
            has = ", ".join(map(repr, list(record)[:8])) or "no fields"
            raise DataError(f"{where}: no {name!r} field (training.data.messages_field); this line has {has}")
        turns = record[name]
        if not isinstance(turns, list) or not turns:
            kind = "an empty list" if turns == [] else "null" if turns is None else f"a JSON {type(turns).__name__}"
            raise DataError(
                f"{where}: {name!r} is {kind}; it holds the conversation's turns, a list of "
                '{"role": ..., "content": ...} objects'
            )
        messages = read_turns(turns, where)
        if not any(turn["role"] == "assistant" for turn in messages):
            roles = ", ".join(dict.fromkeys(turn["role"] for turn in messages))
            raise DataError(
                f"{where}: no assistant turn (its roles: {roles}), so nothing would be trained on; the loss is on "
                "the turns whose role is 'assistant'"
            )
        yield where, messages


def read_turns(turns: list[Any], where: str) -> Messages:
    """``turns`` checked to be ``{"role": str, "content": str, ...}`` objects, their contents
    with plain line ends; anything else is a :class:`DataError` naming ``where`` and the turn."""
    messages: Messages = []
    for i, turn in enumerate(turns):
        at = f"{where}: turn {i + 1}"
        if not isinstance(turn, dict):
            raise DataError(f'{at} is a JSON {type(turn).__name__}, not a {{"role": ..., "content": ...}} object')
        for key in ("role", "content"):
            if not isinstance(turn.get(key), str):
                value = turn.get(key)
                kind = "missing" if key not in turn else "null" if value is None else f"a JSON {type(value).__name__}"
                raise DataError(f"{at}: its {key!r} is {kind}, not a string")
        messages.append({**turn, "content": _plain_text(turn["content"])[0]})
    return messages
