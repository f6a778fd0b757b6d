"""Tokenizers: byte-level, byte-pair encoding trained on the corpus, any ``tokenizer.json``,
and the synthetic tasks' symbol vocabulary.

Every tokenizer has the same small interface (:class:`Tokenizer`) and a plain-data
``state()`` that a checkpoint stores and :func:`tokenizer_from_state` rebuilds, so a
checkpoint can decode its own outputs with no file beside it.

BPE (Sennrich et al. 2016, byte-level as in GPT-2) starts from the 256 bytes and
repeatedly merges the most frequent adjacent pair of symbols into a new symbol
until the vocabulary is full; docs/training.md walks through it. Training uses the
``tokenizers`` library and is cached by a hash of the corpus and the settings.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specformer.data import progress
from specformer.data.cache import (
    atomic_write_text,
    cache_write_error,
    content_hash,
    made_once,
    remove_temporaries,
    resolve_cache_dir,
)
from specformer.data.corpus import Corpus, DataError, lfs_pointer, relative_note
from specformer.specs.training import (
    BYTE_VOCAB_SIZE,
    TASK_SPECIALS,
    TASK_SYMBOLS,
    BPETokenizerSpec,
    ByteTokenizerSpec,
    FileTokenizerSpec,
    TaskTokenizerSpec,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "Tokenizer",
    "decoder_start_id",
    "forced_ids",
    "ByteTokenizer",
    "TaskTokenizer",
    "HFTokenizer",
    "bpe_tokenizer",
    "file_tokenizer",
    "tokenizer_from_state",
    "EOT",
    "PAD",
    "MASK",
]

EOT, PAD, MASK = "<|endoftext|>", "<pad>", "<mask>"
# the tokens a tokenizer.json's end-of-text (the separator between documents) is found as, in this order
EOT_NAMES = (EOT, "</s>", "<eos>", "[SEP]", "<|end_of_text|>")


class Tokenizer(ABC):
    """Text to ids and back, with the special ids training needs.

    ``eot_id`` separates packed documents; ``pad_id`` fills batches; ``mask_id`` is
    BERT's [MASK]; ``bos_id`` starts a decoder; ``eos_id`` ends a generated sequence.
    """

    vocab_size: int
    eot_id: int | None = None
    pad_id: int | None = None
    mask_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None

    def __repr__(self) -> str:
        # what a notebook wants to see of it: its size and special ids
        ids = [f"{name}_id={getattr(self, f'{name}_id')}" for name in ("bos", "eos", "eot", "pad", "mask")
               if getattr(self, f"{name}_id", None) is not None]
        extra = ", chat_template" if getattr(self, "chat_template", None) is not None else ""
        return f"{type(self).__name__}(vocab_size={self.vocab_size}{''.join(', ' + i for i in ids)}{extra})"

    @abstractmethod
    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        """``text``'s ids. With ``specials`` (a prompt) the strings of special tokens, such as
        ``<|endoftext|>`` or ``<mask>``, become their ids; without (training data) they are
        text like any other, so a corpus that quotes one does not split documents or hide
        tokens from the masked-LM objective."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """Plain data (str, int, lists, dicts) that :func:`tokenizer_from_state` rebuilds from."""

    def encode_batch(self, texts: Sequence[str], *, specials: bool = True) -> list[list[int]]:
        return [self.encode(t, specials=specials) for t in texts]

    def encode_arrays(self, texts: Sequence[str], dtype: Any) -> list[np.ndarray]:
        """The ids of each of ``texts`` read as training data (special-token strings are text),
        as arrays of ``dtype``: what the token cache is written from."""
        import numpy as np

        return [np.asarray(ids, dtype=dtype) for ids in self.encode_batch(texts, specials=False)]

    def token_id(self, token: str) -> int | None:
        """The id of the one token written ``token`` (``<pad>``, ``</s>``), or None when the
        string is not a single token of this tokenizer."""
        ids = self.encode(token, specials=True)
        return ids[0] if len(ids) == 1 else None

    def template(self) -> tuple[list[int], list[int]]:
        """The ids this tokenizer's own template puts before and after one text (a
        ``tokenizer.json``'s post-processor: Llama's ``<s>``, BERT's ``[CLS]`` … ``[SEP]``),
        which ``transformers``' ``tokenizer(text)`` adds by default. None for specformer's
        own tokenizers: their documents are separated by ``<|endoftext|>`` instead."""
        return [], []

    def with_template(self, ids: Sequence[int]) -> list[int]:
        """``ids`` of one text (a prompt) framed by :meth:`template`, as the model saw text."""
        before, after = self.template()
        return [*before, *(int(i) for i in ids), *after]

    @property
    def special_ids(self) -> set[int]:
        """The ids the masked-LM objective never masks: the named ones and the template's."""
        named = {i for i in (self.eot_id, self.pad_id, self.mask_id, self.bos_id, self.eos_id) if i is not None}
        before, after = self.template()
        return named | set(before) | set(after)

    def fingerprint(self) -> str:
        return content_hash(self.state())


def decoder_start_id(tokenizer: Tokenizer, objective: Any) -> int | None:
    """The id an encoder-decoder's decoder starts from: ``objective.decoder_start``'s token
    (T5's ``<pad>``, BART's ``</s>``), else the tokenizer's start token."""
    token = getattr(objective, "decoder_start", None)
    return tokenizer.bos_id if token is None else tokenizer.token_id(token)


def forced_ids(tokenizer: Tokenizer, objective: Any) -> tuple[int | None, int | None]:
    """The ids of ``objective.forced_start`` and ``objective.forced_end`` (BART's ``<s>`` and
    ``</s>``: the tokens generation puts first, and last at the length limit), None where
    the objective names none or the tokenizer has no such token."""
    start, end = getattr(objective, "forced_start", None), getattr(objective, "forced_end", None)
    return (None if start is None else tokenizer.token_id(start), None if end is None else tokenizer.token_id(end))


# a prompt's special-token strings, kept by the split as pieces of their own
_SPECIAL_STRINGS = re.compile(f"({'|'.join(map(re.escape, (EOT, PAD, MASK)))})")


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes 0-255, then <|endoftext|> (256), <pad> (257) and <mask> (258).
    <|endoftext|> also starts and ends an encoder-decoder's output, as GPT-2's is its
    bos and eos."""

    def __init__(self, spec: ByteTokenizerSpec | None = None, **_: Any) -> None:
        self.vocab_size = BYTE_VOCAB_SIZE
        self.eot_id, self.pad_id, self.mask_id = 256, 257, 258
        self._special_text = {self.eot_id: EOT.encode(), self.pad_id: PAD.encode(), self.mask_id: MASK.encode()}
        self.bos_id = self.eos_id = self.eot_id

    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        if not specials:
            return list(text.encode("utf-8"))
        # a prompt names the special tokens by their strings, as it does with a BPE
        specials_ids = {EOT: self.eot_id, PAD: self.pad_id, MASK: self.mask_id}
        ids: list[int] = []
        for piece in _SPECIAL_STRINGS.split(text):
            special = specials_ids.get(piece)
            ids.extend([special] if special is not None else piece.encode("utf-8"))
        return ids

    def encode_arrays(self, texts: Sequence[str], dtype: Any) -> list[np.ndarray]:
        # the UTF-8 bytes are the ids: no Python list of ints (tens of bytes a character)
        import numpy as np

        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(dtype) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        out = bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                out.append(i)
            elif i in self._special_text:
                out.extend(self._special_text[i])  # as a trained BPE and the exported tokenizer decode it
        return out.decode("utf-8", errors="replace")

    def state(self) -> dict[str, Any]:
        return {"type": "byte"}


_TASK_SPECIAL_STRINGS = re.compile(f"({'|'.join(map(re.escape, TASK_SPECIALS))})")


class TaskTokenizer(Tokenizer):
    """One token per symbol of the synthetic tasks, after <pad>, <s>, </s>, <unk>, <mask>."""

    def __init__(self, spec: TaskTokenizerSpec | None = None, **_: Any) -> None:
        self.tokens = list(TASK_SPECIALS) + list(TASK_SYMBOLS)
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.vocab_size = len(self.tokens)
        self.pad_id, self.bos_id, self.eos_id, self.unk_id, self.mask_id = range(5)
        self.eot_id = self.eos_id

    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        if not specials:
            return [self.index.get(ch, self.unk_id) for ch in text]  # one symbol per character
        # a prompt names the special tokens by their strings, as the exported tokenizer reads them
        ids: list[int] = []
        for piece in _TASK_SPECIAL_STRINGS.split(text):
            special = self.index.get(piece) if piece in TASK_SPECIALS else None
            ids.extend([special] if special is not None else (self.index.get(ch, self.unk_id) for ch in piece))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.tokens[int(i)] for i in ids if int(i) >= len(TASK_SPECIALS) and int(i) < self.vocab_size)

    def token_id(self, token: str) -> int | None:
        return self.index.get(token)

    def state(self) -> dict[str, Any]:
        return {"type": "task"}


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (trained BPE or a ``tokenizer.json``), and the chat template
    (:class:`~specformer.data.chat.ChatTemplate`) kept with it: the one beside its
    ``tokenizer.json``, which :meth:`state` keeps too, so a checkpoint renders a conversation
    with no folder beside it."""

    def __init__(self, tokenizer: Any, *, chat_template: Any = None) -> None:
        self.tok = tokenizer
        self.chat_template = chat_template
        # ids it can give: its largest + 1, not its count of tokens, which is less where its ids
        # leave gaps (a token of id 400 among 7 needs 401 rows of an embedding)
        ids = tokenizer.get_vocab(with_added_tokens=True).values()
        self.vocab_size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)

        def find(*names: str) -> int | None:
            for name in names:
                i = tokenizer.token_to_id(name)
                if i is not None:
                    return i
            return None

        self.eot_id = find(*EOT_NAMES)
        self.pad_id = find(PAD, "[PAD]", "<|padding|>")
        self.mask_id = find(MASK, "[MASK]")
        # GPT-2's <|endoftext|> is its bos as well (and a trained BPE's, which has no other)
        self.bos_id = find("<s>", "[CLS]", "<bos>", "<|begin_of_text|>", EOT)
        self.eos_id = self.eot_id

    def template(self) -> tuple[list[int], list[int]]:
        if not hasattr(self, "_template"):
            self._template = _post_processor_template(self.tok)
        return list(self._template[0]), list(self._template[1])

    @classmethod
    def from_str(cls, text: str, *, chat_template: Any = None) -> HFTokenizer:
        from tokenizers import Tokenizer as _Tok

        return cls(_Tok.from_str(text), chat_template=chat_template)

    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        with _literal_specials(self.tok, not specials):
            return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], *, specials: bool = True) -> list[list[int]]:
        fast = getattr(self.tok, "encode_batch_fast", None) or self.tok.encode_batch
        with _literal_specials(self.tok, not specials):
            return [e.ids for e in fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"type": "hf", "json": self.tok.to_str()}
        if self.chat_template is not None:
            state["chat_template"] = self.chat_template.state()
        return state

    def fingerprint(self) -> str:
        # the ids alone: a chat template changes no text's ids (a chat rendering's cache key names it)
        return content_hash({"type": "hf", "json": self.tok.to_str()})


def _post_processor_template(tok: Any) -> tuple[list[int], list[int]]:
    """The ids ``tok``'s post-processor adds before and after one text, read off a probe's
    encoding with and without them (TemplateProcessing, BertProcessing and RobertaProcessing
    frame the text; ByteLevel, GPT-2's, adds nothing). A post-processor that changes the
    text's own ids, which none of those does, is left out rather than guessed at."""
    if getattr(tok, "post_processor", None) is None:
        return [], []
    added = {token.content for token in tok.get_added_tokens_decoder().values()}
    # "a", else the vocabulary's own first tokens: a word-level vocabulary without an unknown
    # token cannot encode "a" (its model raises), and needs nothing of the text but one token
    first = sorted(((i, t) for t, i in tok.get_vocab(with_added_tokens=False).items() if t not in added))[:16]
    for probe in ["a", *(t for _, t in first)]:
        try:
            with _literal_specials(tok, False):
                plain = tok.encode(probe, add_special_tokens=False).ids
                framed = tok.encode(probe, add_special_tokens=True).ids
        except Exception:  # tokenizers raises its own errors as Exception
            continue
        n = len(plain)
        if not n:
            continue
        for start in range(len(framed) - n + 1):
            if framed[start : start + n] == plain:
                return framed[:start], framed[start + n :]
        return [], []
    return [], []


@contextmanager
def _literal_specials(tok: Any, literal: bool) -> Iterator[None]:
    """Within the block, ``tok`` encodes special-token strings as plain text (the
    ``tokenizers`` switch ``encode_special_tokens``)."""
    before = tok.encode_special_tokens
    tok.encode_special_tokens = literal
    try:
        yield
    finally:
        tok.encode_special_tokens = before


def bpe_tokenizer(spec: BPETokenizerSpec, *, corpus: Corpus, cache_dir: str | Path | None = None) -> HFTokenizer:
    """A byte-level BPE trained on (at most ``train_mb`` of) the corpus' train split, cached."""
    import tokenizers

    if spec.vocab_size is None:
        raise DataError("training.tokenizer.vocab_size is not set")
    texts, total = _training_texts(corpus.train, int(spec.train_mb * 1e6))
    key = content_hash("bpe", "literal-specials", "train_mb-cut", corpus.fingerprint, spec.model_dump(),
                       tokenizers.__version__)
    root = resolve_cache_dir(cache_dir)
    path, lock = root / "tokenizers" / f"bpe-{key}.json", root / "locks" / f"bpe-{key}.lock"

    def make(alone: bool) -> HFTokenizer:
        if alone:  # what a write killed midway left (SIGKILL, the OOM killer): hidden, never read again
            remove_temporaries(path.parent, path.name)
        with progress.step(f"training the BPE tokenizer (vocab_size {spec.vocab_size:,}) on {total / 1e6:.1f} MB of text"):
            return _train_bpe(spec, texts, path)

    try:
        return made_once(lock, lambda: _cached_bpe(path), make, what="the trained tokenizer")
    except OSError as exc:
        raise DataError(cache_write_error("the trained tokenizer", path, exc)) from None


def _training_texts(documents: Iterable[str], budget: int) -> tuple[list[str], int]:
    """The documents a BPE is trained on, at most ``budget`` characters in all: whole ones while
    they fit, then the one that crosses the budget cut at its last line end before it (at the
    budget itself when it has none there), so that one large file is not trained on whole."""
    texts: list[str] = []
    total = 0
    for text in documents:
        if total >= budget:
            break
        if total + len(text) > budget:
            room = budget - total
            text = text[: text.rfind("\n", 0, room) + 1 or room]
            texts.append(text)
            return texts, total + len(text)
        texts.append(text)
        total += len(text)
    return texts, total


def _cached_bpe(path: Path) -> HFTokenizer | None:
    """The BPE cached at ``path``, or None (an unreadable entry is removed: trained again)."""
    from tokenizers import Tokenizer as _Tok

    if path.is_file():
        try:
            return HFTokenizer(_Tok.from_file(str(path)))
        except Exception:
            path.unlink(missing_ok=True)
    return None


def _train_bpe(spec: BPETokenizerSpec, texts: list[str], path: Path) -> HFTokenizer:
    """A byte-level BPE trained on ``texts``, written to ``path``."""
    from tokenizers import Tokenizer as _Tok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = _Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=spec.min_frequency,
        special_tokens=[EOT, PAD, MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with _literal_specials(tok, True):  # learn the merges from the text as encode() will read it
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    atomic_write_text(path, tok.to_str())
    return HFTokenizer(tok)


def file_tokenizer(spec: FileTokenizerSpec, **_: Any) -> HFTokenizer:
    """A tokenizer saved by Hugging Face ``tokenizers`` / ``transformers`` (tokenizer.json),
    with the chat template beside it, if any (:func:`~specformer.data.chat.find_chat_template`)."""
    from tokenizers import Tokenizer as _Tok

    path = Path(spec.path).expanduser()
    if path.is_dir():
        folder, path = path, path / "tokenizer.json"
        if not path.is_file():
            slow = sorted(p.name for p in folder.iterdir() if p.name in _SLOW_TOKENIZER_FILES)
            has = (f"; the folder holds a slow tokenizer's {', '.join(slow)}: "
                   "AutoTokenizer.from_pretrained(folder).save_pretrained(folder) writes its tokenizer.json") if slow else ""
            raise DataError(f"training.tokenizer.path: the folder {folder} has no tokenizer.json{has}")
    if not path.is_file():
        raise DataError(f"training.tokenizer.path: no tokenizer.json at {path}{relative_note([spec.path], 'training.tokenizer.path')}")
    try:
        tok = _Tok.from_file(str(path))
    except Exception as exc:
        raise DataError(f"training.tokenizer.path: {lfs_pointer(path) or _not_a_tokenizer(path, exc)}") from None
    from specformer.data.chat import find_chat_template

    return HFTokenizer(tok, chat_template=find_chat_template(path))


# what a slow (Python) tokenizer of transformers saves in place of a tokenizer.json
_SLOW_TOKENIZER_FILES = ("vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
                         "sentencepiece.bpe.model")


def _not_a_tokenizer(path: Path, exc: Exception) -> str:
    """Why ``path`` is no tokenizer.json, in the terms of what it is: not JSON, or JSON of
    another kind (a tokenizer_config.json, a vocab.json), or a tokenizer.json the installed
    ``tokenizers`` cannot read (its own words)."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        why = error.strerror if isinstance(error, OSError) else "not UTF-8 text" if isinstance(
            error, UnicodeDecodeError) else f"not JSON: {error}"
        return f"{path} is not a tokenizer.json ({why})"
    made = ("a tokenizer.json is what tokenizers' Tokenizer.save and transformers' save_pretrained write: "
            "AutoTokenizer.from_pretrained(folder).save_pretrained(out) makes one from a slow tokenizer's files")
    if not isinstance(data, dict):
        return f"{path} is not a tokenizer.json: it holds a JSON {type(data).__name__}, not an object; {made}"
    if "model" not in data:
        keys = ", ".join(map(repr, list(data)[:6])) or "no keys"
        kind = ("a tokenizer_config.json (the tokenizer's settings; its tokenizer.json is the file beside it)"
                if "tokenizer_class" in data or "added_tokens_decoder" in data
                else "a vocabulary (token -> id), as a slow tokenizer's vocab.json" if data and all(
                    isinstance(v, int) for v in list(data.values())[:100]) else "JSON without a 'model'")
        return f"{path} is not a tokenizer.json: it is {kind} ({keys}); {made}"
    return f"{path} is not a tokenizer.json this tokenizers can read ({exc})"


def tokenizer_from_state(state: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.state`."""
    kind = state.get("type")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "task":
        return TaskTokenizer()
    if kind == "hf" and isinstance(state.get("json"), str):
        from specformer.data.chat import ChatTemplate

        return HFTokenizer.from_str(state["json"], chat_template=ChatTemplate.from_state(state.get("chat_template")))
    raise DataError(f"unknown tokenizer state {json.dumps({k: v for k, v in state.items() if k != 'json'})}")
