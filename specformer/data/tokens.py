"""Tokenise once, then memory-map: a corpus becomes two flat token arrays on disk.

Each document is followed by the end-of-text id (and framed by a ``tokenizer.json``'s
template, as the model it came with read text), so packing is slicing. Arrays are
``uint16`` when the vocabulary fits, else ``uint32``; they are written to a
temporary file, synced and renamed, and ``meta.json`` is written last, so an entry
exists only when complete; a reader checks each array's size against ``meta.json``
and makes a damaged entry again. An entry is made under a lock: a second process
tokenising the same corpus at the same time waits and reads the first one's entry.
Training then never waits on tokenisation: a batch is a slice of a memory-mapped file.

(source, target) pairs are cached the same way (:func:`pair_token_ids`): each split's ids
one pair after another, and their lengths.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from specformer.data import progress
from specformer.data.cache import (
    atomic_file,
    atomic_write_text,
    cache_write_error,
    content_hash,
    made_once,
    remove_temporaries,
    resolve_cache_dir,
)
from specformer.data.chat import ChatTemplate, NotAPrefixError
from specformer.data.conversations import ConversationCorpus
from specformer.data.corpus import Corpus, DataError
from specformer.data.datasets import PairDataset
from specformer.data.pairs import PairCorpus
from specformer.data.tokenizers import Tokenizer

__all__ = ["TokenArrays", "PairIds", "token_arrays", "pair_token_ids", "conversation_token_ids", "tokenize_to_array", "write_token_stream",
           "unigram_cross_entropy"]

T = TypeVar("T")

# the text encoded at once: enough documents for the tokenizers library's threads to share, few
# enough that its encodings (tens of bytes a token, ~10 times the text) stay small beside the
# corpus; longer documents go one a thread
CHUNK_CHARS = 4_000_000


def usable_cores() -> int:
    """The CPU cores this process may run on: a container's or ``taskset``'s share where the
    system says (Linux), else the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _threads() -> int:
    """The threads the tokenizers library encodes a batch with (one a usable core)."""
    return usable_cores()


@dataclass
class TokenArrays:
    """Memory-mapped train and validation token streams; ``cached``: read from the cache
    rather than tokenised now."""

    train: np.ndarray
    val: np.ndarray
    path: Path
    cached: bool = False


# a document longer than this is encoded in pieces of about this many characters, cut where
# the ids are those of the whole (nanoGPT's one-file input.txt: encoded at once, its encoding
# took ~165 times the text's size, and a bar that waits for it shows nothing until the end)
PIECE_CHARS = 1_000_000
# characters each side of a cut encoded with and without it: a cut is taken where they agree
CUT_WINDOW = 256
# candidate cuts tried, after a line end, then before a space, before a piece is left whole
CUT_TRIES = 16


def token_chunks(
    texts: Sequence[str], tokenizer: Tokenizer, dtype: np.dtype, eot_id: int
) -> Iterator[tuple[np.ndarray, int]]:
    """``texts`` as one stream, a chunk of documents (about :data:`CHUNK_CHARS` characters) at a
    time: (the chunk's ids, its characters). Each document is in the tokenizer's template (a
    ``tokenizer.json``'s ``<s>`` before it, ``[CLS]`` … ``[SEP]`` around it; nothing for
    specformer's own tokenizers), then ``eot_id``, unless the template already ends the
    document with it (BERT's ``[SEP]``). A document longer than :data:`PIECE_CHARS` is
    encoded in pieces (see :func:`_pieces`), with the same ids as encoded whole."""
    before, after = tokenizer.template()
    head = np.array(before, dtype=dtype)
    tail = np.array(after if after and after[-1] == eot_id else [*after, eot_id], dtype=dtype)
    for batch in _batches(_pieces(texts, tokenizer), CHUNK_CHARS, _threads()):
        parts: list[np.ndarray] = []
        for ids, (_, first, last) in zip(tokenizer.encode_arrays([p for p, _, _ in batch], dtype), batch, strict=True):
            if first and head.size:
                parts.append(head)
            parts.append(ids)
            if last:
                parts.append(tail)
        yield np.concatenate(parts), sum(len(p) for p, _, _ in batch)


def _pieces(texts: Sequence[str], tokenizer: Tokenizer) -> Iterator[tuple[str, bool, bool]]:
    """(piece, first of its document, last of it) for each document of ``texts``: a document
    longer than :data:`PIECE_CHARS` in pieces of about that length. A piece ends after a line
    end (or before a space) where the text around the cut encodes to the same ids cut as whole,
    :data:`CUT_WINDOW` characters each side: so a pre-tokenizer that splits there (GPT-2's
    byte-level BPE, WordPiece, bytes) gives the ids of the whole, and one that does not (a
    SentencePiece ``▁`` prepended to every input) finds no cut and encodes the document whole."""
    for text in texts:
        start = 0
        while len(text) - start > PIECE_CHARS + PIECE_CHARS // 2:
            cut = _cut(text, start + PIECE_CHARS, tokenizer)
            if cut is None:
                break
            yield text[start:cut], start == 0, False
            start = cut
        yield text[start:] if start else text, start == 0, True


def _cut(text: str, at: int, tokenizer: Tokenizer) -> int | None:
    """A place at or after ``at`` where ``text`` may be cut (see :func:`_pieces`), or None."""
    end = min(len(text) - 1, at + PIECE_CHARS // 2)

    def candidates(mark: str, offset: int) -> Iterator[int]:
        i = at
        while (i := text.find(mark, i, end)) != -1:
            # the characters on either side of the mark are no whitespace: a run is never cut
            if not text[i - 1].isspace() and not text[i + 1].isspace():
                yield i + offset
            i += 1

    tried = 0
    for mark, offset in (("\n", 1), (" ", 0)):
        for cut in candidates(mark, offset):
            left, right = text[max(0, cut - CUT_WINDOW):cut], text[cut:cut + CUT_WINDOW]
            if tokenizer.encode(left + right, specials=False) == (
                    tokenizer.encode(left, specials=False) + tokenizer.encode(right, specials=False)):
                return cut
            tried += 1
            if tried % CUT_TRIES == 0:
                break
    return None


def _batches(pieces: Iterable[tuple[str, bool, bool]], limit: int, at_least: int = 1) -> Iterator[list[tuple[str, bool, bool]]]:
    """``pieces`` (see :func:`_pieces`) in consecutive batches of at most ``limit`` characters,
    or of ``at_least`` pieces where those are longer (one for each thread to encode)."""
    batch: list[tuple[str, bool, bool]] = []
    size = 0
    for piece in pieces:
        if len(batch) >= at_least and size + len(piece[0]) > limit:
            yield batch
            batch, size = [], 0
        batch.append(piece)
        size += len(piece[0])
    if batch:
        yield batch


def tokenize_to_array(texts: Sequence[str], tokenizer: Tokenizer, dtype: np.dtype, eot_id: int) -> np.ndarray:
    """``texts`` as one stream of ids (see :func:`token_chunks`), in memory."""
    chunks = [ids for ids, _ in token_chunks(texts, tokenizer, dtype, eot_id)]
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)


def write_token_stream(
    path: Path, texts: Sequence[str], tokenizer: Tokenizer, dtype: np.dtype, eot_id: int,
    advance: Callable[[int], None] | None = None,
) -> int:
    """Write ``texts`` as one stream of ids (see :func:`token_chunks`) to ``path``, a chunk at a
    time: only one chunk's ids are in memory, never the whole stream. ``advance(characters)``
    is called after each chunk. Returns the number of ids written."""
    n = 0
    # synced and renamed before meta.json says the entry is complete; an error or an interrupt
    # (Ctrl-C) leaves no file behind
    with atomic_file(path) as f:
        for ids, chars in token_chunks(texts, tokenizer, dtype, eot_id):
            f.write(memoryview(ids).cast("B"))
            n += ids.size
            if advance is not None:
                advance(chars)
    return n


def _write_array(path: Path, array: np.ndarray) -> None:
    # synced and renamed before meta.json says the entry is complete; a failed write leaves no
    # temporary file (and file.write, unlike ndarray.tofile, says why it failed)
    with atomic_file(path) as f:
        f.write(memoryview(np.ascontiguousarray(array)).cast("B"))


def _entry(folder: Path, what: str, load: Callable[[dict], T], make: Callable[[], dict]) -> tuple[T, bool]:
    """The cache entry ``folder``: ``load(meta)`` of its ``meta.json``, and whether it was there
    already. An entry that is missing or damaged (``meta.json`` unreadable, or ``load`` finding
    a file of another size than meta records, or ids that do not fit) is made again: ``make()``
    writes its files through :func:`atomic_file` and returns the meta, which is written last,
    so an entry exists only when complete. It is made under the entry's lock: a process that
    waited reads what the holder made; temporary files a killed process left there (SIGKILL,
    the OOM killer) are removed, they would fill the disk with hidden, never-read copies."""
    meta_path, made = folder / "meta.json", []

    def read() -> tuple[T] | None:
        try:
            return (load(json.loads(meta_path.read_text())),) if meta_path.is_file() else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def build(alone: bool) -> tuple[T]:
        if alone:
            remove_temporaries(folder)
        meta_path.unlink(missing_ok=True)  # damaged (a crash, a full disk): made again
        meta = make()
        atomic_write_text(meta_path, json.dumps(meta, indent=1))
        made.append(True)
        return (load(meta),)

    try:
        (found,) = made_once(folder / ".lock", read, build, what=what)
    except OSError as exc:
        raise DataError(cache_write_error(what, folder, exc)) from None
    return found, not made


def _array(folder: Path, name: str, dtype: str | np.dtype, n: int, *, mapped: bool = True) -> np.ndarray:
    """The ``n`` items of ``folder/name``, memory-mapped (or read); a file of another size is
    a ValueError: the entry is damaged."""
    path, dtype = folder / name, np.dtype(dtype)
    if path.stat().st_size != n * dtype.itemsize:
        raise ValueError(f"{path}: not {n} items")
    if not n:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if mapped else np.fromfile(path, dtype=dtype)


def _key_parts(tokenizer: Tokenizer) -> tuple[str, ...]:
    """What besides the text decides the ids: the tokenizer and the library that encodes (another
    tokenizers or specformer release may split the same text differently)."""
    import tokenizers

    from specformer import __version__

    return tokenizer.fingerprint(), tokenizers.__version__, __version__


def token_arrays(corpus: Corpus, tokenizer: Tokenizer, cache_dir: str | Path | None = None) -> TokenArrays:
    """The corpus tokenised, from the cache when it is there."""
    if tokenizer.eot_id is None:
        raise DataError("the tokenizer has no end-of-text token to separate documents")
    # documents in a template are another stream (specformer's own tokenizers have none: their key is as it was)
    framed = ["template", *tokenizer.template()] if any(tokenizer.template()) else []
    key = content_hash("tokens", "literal-specials", corpus.fingerprint, *_key_parts(tokenizer), *framed)
    folder = resolve_cache_dir(cache_dir) / "tokens" / key
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)

    def make() -> dict:
        counts = {}
        for split, texts in (("train", corpus.train), ("val", corpus.val)):
            what = f"tokenising the {'training' if split == 'train' else 'validation'} text"
            with progress.step(what, sum(map(len, texts))) as advance:
                counts[split] = write_token_stream(folder / f"{split}.bin", texts, tokenizer, dtype, tokenizer.eot_id,
                                                   advance)
        # the tokenizers library warns when a process forks after using its thread pool
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        return {"dtype": dtype.name, "corpus": corpus.name, "n_tokens": counts, "vocab_size": tokenizer.vocab_size}

    def load(meta: dict) -> dict[str, np.ndarray]:
        return {split: _array(folder, f"{split}.bin", meta["dtype"], int(meta["n_tokens"][split]))
                for split in ("train", "val")}

    arrays, cached = _entry(folder, "the token cache", load, make)
    return TokenArrays(train=arrays["train"], val=arrays["val"], path=folder, cached=cached)


def _pair_split(folder: Path, meta: dict, split: str, vocab_size: int, *, end_token: bool = True) -> PairDataset:
    """One split of a pair cache: its ids and their (source, target) lengths, checked to agree
    with each other and with the vocabulary (a cache entry that does not is remade)."""
    n = int(meta["n_tokens"][split])
    ids = _array(folder, f"{split}.bin", meta["dtype"], n)
    lengths = _array(folder, f"{split}.lengths.bin", np.uint32, 2 * int(meta["n_pairs"][split]), mapped=False)
    if int(lengths.sum(dtype=np.int64)) != n or (n and int(ids.max()) >= vocab_size):
        raise ValueError(f"{folder}: the {split} ids do not fit their lengths or the vocabulary")
    return PairDataset(ids=ids, lengths=lengths, end_token=end_token)


def _decoder_splits(
    folder: Path, meta: dict, vocab_size: int
) -> tuple[dict[str, PairDataset], dict[str, int], dict[str, int]]:
    """The splits of a decoder's cache entry (sft's pairs, or conversations), the count of
    those cut, and of those left out of each split."""
    out = {split: _pair_split(folder, meta, split, vocab_size, end_token=False) for split in ("train", "val")}
    cut = {"source": 0, "target": int(meta["cut"]["target"])}
    return out, cut, {split: int(meta["left_out"][split]) for split in ("train", "val")}


@dataclass
class PairIds:
    """Tokenised (source, target) pairs: sources cut to fit and framed by the tokenizer's
    template, targets cut to fit; how many of each were cut; the cache entry, and whether
    it was read from the cache rather than made."""

    train: PairDataset
    val: PairDataset
    cut: dict[str, int]
    path: Path
    cached: bool
    room: int  # the longest source and target, in tokens, before they are framed
    target_room: int
    # (prompt, response) pairs of a decoder: those whose prompt alone fills seq_len, left out
    left_out: dict[str, int] | None = None


_PAIRS_PER_CHUNK = 16384


def pair_token_ids(
    corpus: PairCorpus,
    tokenizer: Tokenizer,
    seq_len: int,
    cache_dir: str | Path | None = None,
    *,
    decoder: bool = False,
    chat: ChatTemplate | None = None,
    system: str | None = None,
) -> PairIds:
    """The pairs of ``corpus`` tokenised, from the cache when it is there. A source is cut to
    ``seq_len`` tokens with the template around it, a target to ``seq_len - 1`` (the decoder
    reads the start token before it); a target is framed by the template too, less a closing
    end token, which the collator adds. An entry holds, for each split, the ids of every source
    and target one after another (``<split>.bin``) and their lengths (``<split>.lengths.bin``);
    its key is the pairs' fingerprint (the files' contents and the ``training.data`` settings,
    which decide the split), the tokenizer, its template and ``seq_len``. A ``seq_len`` too
    short for a framed source or target is a :class:`DataError`.

    With ``decoder`` (supervised fine-tuning of a decoder) a pair is a prompt (the source
    after the template's opening tokens, Llama's ``<s>``, as ``generate`` frames a prompt)
    and a response (the target, then the tokenizer's end-of-text token), which the decoder
    reads as one sequence of at most ``seq_len + 1`` tokens (its last token is only
    predicted): a longer response is cut to fit, losing its end token, and a pair whose
    prompt alone is longer than ``seq_len`` tokens, which leaves no response token to
    predict, is left out. ``cut["target"]`` counts the responses cut, ``left_out`` the pairs
    left out of each split.

    With ``chat`` as well (``training.objective.chat_template``), a pair is rendered through
    that chat template (:class:`~specformer.data.chat.ChatTemplate`): the prompt is the user
    turn with the generation prompt, the response the rest of the rendering of both turns
    (the template's own end of turn included, no end token added), after a ``system`` turn when
    one is given (``training.objective.system``). A pair whose prompt
    rendering is not the start of its full rendering in token ids is a
    :class:`~specformer.data.chat.NotAPrefixError` naming its file and line."""
    if decoder:
        return _prompt_response_ids(corpus, tokenizer, seq_len, cache_dir, chat, system)
    before, after = tokenizer.template()
    closing = after[:-1] if after and after[-1] == tokenizer.eos_id else after
    room = seq_len - len(before) - len(after)
    target_room = seq_len - 1 - len(before) - len(closing)
    if room < 1 or target_room < 1:
        raise DataError(f"training.seq_len={seq_len} leaves no room for a source and a target; raise it")
    key = content_hash("pair-tokens", corpus.fingerprint, *_key_parts(tokenizer), before, after, seq_len)
    folder = resolve_cache_dir(cache_dir) / "tokens" / key
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)

    def make() -> dict:
        counts: dict[str, dict[str, int]] = {"tokens": {}, "pairs": {}}
        cut = {"source": 0, "target": 0}

        def lay(src: list[int], tgt: list[int]) -> tuple[list[int], list[int]]:
            cut["source"] += len(src) > room
            cut["target"] += len(tgt) > target_room
            return tokenizer.with_template(src[:room]), [*before, *tgt[:target_room], *closing]

        for split, pairs in (("train", corpus.train), ("val", corpus.val)):
            counts["tokens"][split], counts["pairs"][split] = _write_pairs(folder, split, pairs, tokenizer, dtype, lay)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        return {"dtype": dtype.name, "n_tokens": counts["tokens"], "n_pairs": counts["pairs"], "cut": cut,
                "vocab_size": tokenizer.vocab_size}

    def load(meta: dict) -> tuple[dict[str, PairDataset], dict[str, int]]:
        out = {split: _pair_split(folder, meta, split, tokenizer.vocab_size) for split in ("train", "val")}
        return out, {"source": int(meta["cut"]["source"]), "target": int(meta["cut"]["target"])}

    (pairs, cut), cached = _entry(folder, "the token cache", load, make)
    return PairIds(train=pairs["train"], val=pairs["val"], cut=cut, path=folder, cached=cached, room=room,
                   target_room=target_room)


def _write_pairs(
    folder: Path,
    split: str,
    pairs: Sequence[tuple[str, str]],
    tokenizer: Tokenizer,
    dtype: np.dtype,
    lay: Callable[[list[int], list[int]], tuple[list[int], list[int]] | None],
    encode: Callable[[Sequence[tuple[str, str]]], list[tuple[list[int], list[int]]]] | None = None,
    size: Callable[[Any], int] = lambda pair: len(pair[0]) + len(pair[1]),
    noun: str = "pairs",
) -> tuple[int, int]:
    """Write ``split``'s pairs as ``{split}.bin`` (each pair's two runs of ids, as ``lay``
    makes them from the source's and the target's; None leaves the pair out) and
    ``{split}.lengths.bin`` (the two runs' lengths); (tokens written, pairs kept). ``encode``
    gives a chunk's (source ids, target ids); by default each side is encoded alone. ``size``
    is an item's share of the progress bar (its characters).

    A chunk at a time: the tokenizer's encodings and Python lists of ids take ~50 times the
    arrays' memory, which for millions of pairs would not fit."""
    ids: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    kept = 0
    what = f"tokenising the {'training' if split == 'train' else 'validation'} {noun}"
    with progress.step(what, sum(map(size, pairs))) as advance:
        for first in range(0, len(pairs), _PAIRS_PER_CHUNK):
            chunk = pairs[first : first + _PAIRS_PER_CHUNK]
            kept += _lay_chunk(chunk, tokenizer, dtype, lay, ids, lengths, encode)
            advance(sum(map(size, chunk)))
    joined = np.concatenate(ids) if ids else np.zeros(0, dtype=dtype)
    _write_array(folder / f"{split}.bin", joined)
    _write_array(folder / f"{split}.lengths.bin", np.concatenate(lengths) if lengths else np.zeros(0, np.uint32))
    return len(joined), kept


def _lay_chunk(
    chunk: Sequence[tuple[str, str]],
    tokenizer: Tokenizer,
    dtype: np.dtype,
    lay: Callable[[list[int], list[int]], tuple[list[int], list[int]] | None],
    ids: list[np.ndarray],
    lengths: list[np.ndarray],
    encode: Callable[[Sequence[tuple[str, str]]], list[tuple[list[int], list[int]]]] | None = None,
) -> int:
    """Encode ``chunk``'s pairs (with ``encode`` if given, else each side on its own),
    append their laid-out ids and lengths to ``ids`` and ``lengths``; how many pairs were
    kept."""
    kept = 0
    if encode is None:
        sources = tokenizer.encode_batch([s for s, _ in chunk], specials=False)
        targets = tokenizer.encode_batch([g for _, g in chunk], specials=False)
        encoded = list(zip(sources, targets, strict=True))
    else:
        encoded = encode(chunk)
    flat: list[int] = []
    sizes: list[int] = []
    for src, tgt in encoded:
        laid = lay(src, tgt)
        if laid is None:
            continue
        flat += laid[0]
        flat += laid[1]
        sizes += (len(laid[0]), len(laid[1]))
        kept += 1
    ids.append(np.asarray(flat, dtype=dtype))
    lengths.append(np.asarray(sizes, dtype=np.uint32))
    return kept


def _prompt_response_ids(
    corpus: PairCorpus, tokenizer: Tokenizer, seq_len: int, cache_dir: str | Path | None,
    chat: ChatTemplate | None = None, system: str | None = None,
) -> PairIds:
    """:func:`pair_token_ids` for a decoder: (prompt, response + end token) of each pair, or
    the two parts of its rendering through ``chat``."""
    eot = tokenizer.eot_id
    encode = None
    if chat is not None:
        # the template frames both turns and ends the assistant's: no opening or end token of our own
        before, eot, parts = [], None, (chat.template, sorted(chat.special_tokens.items()), system)

        def encode(chunk: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
            out = []
            for pair, ids in zip(chunk, chat.pair_ids(tokenizer, chunk, system=system), strict=True):
                if isinstance(ids, int):
                    raise NotAPrefixError(
                        f"{corpus.locate(pair)}: the chat template's rendering of the prompt (a user turn and the "
                        f"generation prompt) is not the start of its rendering with the response, in token ids "
                        f"(they differ at token {ids}), so the loss cannot be put on the response alone; the "
                        f"template ({chat.source}) renders the user turn differently when an assistant turn "
                        "follows, or the tokenizer merges the last prompt token with the first of the response"
                    )
                out.append(ids)
            return out
    else:
        if eot is None:
            raise DataError("the tokenizer has no end-of-text token to end each response with")
        before, _ = tokenizer.template()
        parts = ()
    if len(before) + 1 > seq_len:
        raise DataError(f"training.seq_len={seq_len} leaves no room for a prompt and a response; raise it")
    key = content_hash("prompt-response-tokens", corpus.fingerprint, *_key_parts(tokenizer), before, eot, seq_len,
                       *(("chat", *parts) if chat is not None else ()))
    folder = resolve_cache_dir(cache_dir) / "tokens" / key
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)

    def make() -> dict:
        counts: dict[str, dict[str, int]] = {"tokens": {}, "pairs": {}, "left_out": {}}
        cut = 0

        def lay(src: list[int], tgt: list[int]) -> tuple[list[int], list[int]] | None:
            nonlocal cut
            prompt, response = [*before, *src], [*tgt, eot] if eot is not None else list(tgt)
            room = seq_len + 1 - len(prompt)  # the decoder reads all but the last token
            if room < 1:
                return None
            cut += len(response) > room
            return prompt, response[:room]

        for split, pairs in (("train", corpus.train), ("val", corpus.val)):
            n_tokens, kept = _write_pairs(folder, split, pairs, tokenizer, dtype, lay, encode)
            counts["tokens"][split], counts["pairs"][split], counts["left_out"][split] = n_tokens, kept, len(pairs) - kept
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        return {"dtype": dtype.name, "n_tokens": counts["tokens"], "n_pairs": counts["pairs"],
                "left_out": counts["left_out"], "cut": {"source": 0, "target": cut}, "vocab_size": tokenizer.vocab_size}

    def load(meta: dict) -> tuple[dict[str, PairDataset], dict[str, int], dict[str, int]]:
        return _decoder_splits(folder, meta, tokenizer.vocab_size)

    (pairs, cut, left_out), cached = _entry(folder, "the token cache", load, make)
    return PairIds(train=pairs["train"], val=pairs["val"], cut=cut, path=folder, cached=cached,
                   room=seq_len - len(before), target_room=seq_len, left_out=left_out)


def conversation_token_ids(
    corpus: ConversationCorpus, tokenizer: Tokenizer, seq_len: int, cache_dir: str | Path | None,
    chat: ChatTemplate, system: str | None = None,
) -> PairIds:
    """The conversations of ``corpus`` rendered through ``chat`` and tokenised, from the cache
    when it is there: each as two runs of the same length, its ids and a mask that is 1 on
    the tokens of its assistant turns (:meth:`~specformer.data.chat.ChatTemplate.conversation_ids`,
    after a ``system`` turn when one is given and the conversation has none). The decoder reads
    at most ``seq_len + 1`` tokens (the last is only predicted): a longer conversation is cut
    (``cut["target"]`` counts them), and one with no assistant token left among its predicted
    tokens is left out (``left_out``). A conversation whose rendering up to a turn is not the
    start of its whole rendering in token ids is a :class:`~specformer.data.chat.NotAPrefixError`
    naming its file and line."""
    parts = (chat.template, sorted(chat.special_tokens.items()), system)
    key = content_hash("conversation-tokens", corpus.fingerprint, *_key_parts(tokenizer), seq_len, *parts)
    folder = resolve_cache_dir(cache_dir) / "tokens" / key
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)
    where = {"train": corpus.train_where, "val": corpus.val_where}

    def make() -> dict:
        counts: dict[str, dict[str, int]] = {"tokens": {}, "pairs": {}, "left_out": {}}
        cut = 0

        def lay(ids: list[int], mask: list[int]) -> tuple[list[int], list[int]] | None:
            nonlocal cut
            if not any(mask[1 : seq_len + 1]):  # the first token is never predicted
                return None
            cut += len(ids) > seq_len + 1
            return ids[: seq_len + 1], mask[: seq_len + 1]

        def encoder(places: Iterator[str]) -> Callable[[Sequence[Any]], list[tuple[list[int], list[int]]]]:
            def encode(chunk: Sequence[Any]) -> list[tuple[list[int], list[int]]]:
                out = []
                for found in chat.conversations_ids(tokenizer, chunk, system=system):
                    place = next(places, "training.data")
                    if isinstance(found[0], int):
                        token, turn = found
                        raise NotAPrefixError(
                            f"{place}: the chat template's rendering of the turns before turn {turn + 1} (an "
                            f"assistant turn) is not the start of the whole conversation's rendering, in token ids "
                            f"(they differ at token {token}), so the loss cannot be put on the assistant turns "
                            f"alone; the template ({chat.source}) renders a turn differently when more follow, or "
                            "the tokenizer merges tokens across the turns' boundary"
                        )
                    out.append(found)
                return out

            return encode

        for split, conversations in (("train", corpus.train), ("val", corpus.val)):
            encode = encoder(iter(where[split]))
            n_tokens, kept = _write_pairs(folder, split, conversations, tokenizer, dtype, lay, encode,
                                          size=lambda messages: sum(len(t["content"]) for t in messages), noun="conversations")
            counts["tokens"][split], counts["pairs"][split] = n_tokens, kept
            counts["left_out"][split] = len(conversations) - kept
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        return {"dtype": dtype.name, "n_tokens": counts["tokens"], "n_pairs": counts["pairs"],
                "left_out": counts["left_out"], "cut": {"source": 0, "target": cut}, "vocab_size": tokenizer.vocab_size}

    def load(meta: dict) -> tuple[dict[str, PairDataset], dict[str, int], dict[str, int]]:
        return _decoder_splits(folder, meta, tokenizer.vocab_size)

    (conversations, cut, left_out), cached = _entry(folder, "the token cache", load, make)
    return PairIds(train=conversations["train"], val=conversations["val"], cut=cut, path=folder, cached=cached,
                   room=seq_len, target_room=seq_len, left_out=left_out)


def unigram_cross_entropy(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of ``val`` under the add-one-smoothed unigram distribution
    of ``train``: the loss of a model that ignores context, which training must beat. At most
    ln ``vocab_size``, a uniform guess's, the better context-free model where the validation
    tokens are ones training rarely has (another language held out scored 10.1 at ln 512 = 6.24,
    and an untrained model "beat" it).

    Counted a slice at a time: the arrays are memory maps of the token cache, and a whole
    int64 copy of one would take 4 to 8 times the cache's size in memory."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(train), _UNIGRAM_SLICE):
        counts += np.bincount(train[start : start + _UNIGRAM_SLICE], minlength=vocab_size)[:vocab_size]
    logp = np.log((counts + 1.0) / (counts.sum() + vocab_size))
    total = 0.0
    for start in range(0, len(val), _UNIGRAM_SLICE):
        total += float(logp[val[start : start + _UNIGRAM_SLICE]].sum())
    return min(-total / len(val), math.log(vocab_size)) if len(val) else float("nan")


_UNIGRAM_SLICE = 1 << 20
