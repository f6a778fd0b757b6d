"""Tokenise once, then memory-map: a corpus becomes two flat token arrays on disk.

Each document is followed by the end-of-text id (and framed by a ``tokenizer.json``'s
template, as the model it came with read text), so packing is slicing. Arrays are
``uint16`` when the vocabulary fits, else ``uint32``; they are written to a
temporary file, synced and renamed, and ``meta.json`` is written last, so an entry
exists only when complete; a reader checks each array's size against ``meta.json``
and makes a damaged entry again. An entry is made under a lock: a second process
tokenising the same corpus at the same time waits and reads the first one's entry.
Training then never waits on tokenisation: a batch is a slice of a memory-mapped file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specformer.data.cache import (
    atomic_file,
    atomic_write_text,
    cache_write_error,
    content_hash,
    made_once,
    remove_temporaries,
    resolve_cache_dir,
)
from specformer.data.corpus import Corpus, DataError
from specformer.data.tokenizers import Tokenizer

__all__ = ["TokenArrays", "token_arrays", "tokenize_to_array", "unigram_cross_entropy"]

CHUNK_DOCS = 256


@dataclass
class TokenArrays:
    """Memory-mapped train and validation token streams."""

    train: np.ndarray
    val: np.ndarray
    path: Path


def tokenize_to_array(texts: list[str], tokenizer: Tokenizer, dtype: np.dtype, eot_id: int) -> np.ndarray:
    """``texts`` as one stream: each document in the tokenizer's template (a ``tokenizer.json``'s
    ``<s>`` before it, ``[CLS]`` … ``[SEP]`` around it; nothing for specformer's own tokenizers),
    then ``eot_id``, unless the template already ends the document with it (BERT's ``[SEP]``)."""
    before, after = tokenizer.template()
    head = np.array(before, dtype=dtype)
    tail = np.array(after if after and after[-1] == eot_id else [*after, eot_id], dtype=dtype)
    parts: list[np.ndarray] = []
    for start in range(0, len(texts), CHUNK_DOCS):
        for ids in tokenizer.encode_batch(texts[start : start + CHUNK_DOCS], specials=False):
            if head.size:
                parts.append(head)
            parts.append(np.asarray(ids, dtype=dtype))
            parts.append(tail)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _write_array(path: Path, array: np.ndarray) -> None:
    # synced and renamed before meta.json says the entry is complete; a failed write leaves no
    # temporary file (and file.write, unlike ndarray.tofile, says why it failed)
    with atomic_file(path) as f:
        f.write(memoryview(np.ascontiguousarray(array)).cast("B"))


def _complete(folder: Path) -> dict | None:
    """The entry's meta.json when the entry is whole (meta readable, each array of the
    size it records), else None: a damaged entry is made again, never read."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split in ("train", "val"):
            if (folder / f"{split}.bin").stat().st_size != int(meta["n_tokens"][split]) * itemsize:
                return None
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _make_entry(folder: Path, corpus: Corpus, tokenizer: Tokenizer, dtype: np.dtype, *, sweep: bool) -> dict:
    """Tokenise ``corpus`` into the entry ``folder`` and return its meta.json. With ``sweep``
    (the entry's lock is held) temporary files found there are a killed process' (SIGKILL,
    the OOM killer): removed, they would fill the disk with hidden, never-read copies."""
    if sweep:
        remove_temporaries(folder)
    (folder / "meta.json").unlink(missing_ok=True)  # damaged (a crash, a full disk): tokenise again
    counts = {}
    for split, texts in (("train", corpus.train), ("val", corpus.val)):
        array = tokenize_to_array(texts, tokenizer, dtype, tokenizer.eot_id)
        _write_array(folder / f"{split}.bin", array)
        counts[split] = int(array.size)
    meta = {"dtype": dtype.name, "corpus": corpus.name, "n_tokens": counts, "vocab_size": tokenizer.vocab_size}
    atomic_write_text(folder / "meta.json", json.dumps(meta, indent=1))
    # the tokenizers library warns when a process forks after using its thread pool
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return meta


def token_arrays(corpus: Corpus, tokenizer: Tokenizer, cache_dir: str | Path | None = None) -> TokenArrays:
    """The corpus tokenised, from the cache when it is there."""
    if tokenizer.eot_id is None:
        raise DataError("the tokenizer has no end-of-text token to separate documents")
    # the library that encodes is part of the key: another tokenizers (or specformer)
    # release may split the same text differently
    import tokenizers

    from specformer import __version__

    # documents in a template are another stream (specformer's own tokenizers have none: their key is as it was)
    framed = ["template", *tokenizer.template()] if any(tokenizer.template()) else []
    key = content_hash("tokens", "literal-specials", corpus.fingerprint, tokenizer.fingerprint(), tokenizers.__version__,
                       __version__, *framed)
    folder = resolve_cache_dir(cache_dir) / "tokens" / key
    meta_path = folder / "meta.json"
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)
    try:
        meta = made_once(folder / ".lock", lambda: _complete(folder) if meta_path.is_file() else None,
                         lambda alone: _make_entry(folder, corpus, tokenizer, dtype, sweep=alone))
    except OSError as exc:
        raise DataError(cache_write_error("the token cache", folder, exc)) from None
    arrays = {}
    for split in ("train", "val"):
        n = meta["n_tokens"][split]
        arrays[split] = (
            np.memmap(folder / f"{split}.bin", dtype=np.dtype(meta["dtype"]), mode="r", shape=(n,))
            if n
            else np.zeros(0, dtype=meta["dtype"])
        )
    return TokenArrays(train=arrays["train"], val=arrays["val"], path=folder)


def unigram_cross_entropy(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of ``val`` under the add-one-smoothed unigram distribution
    of ``train``: the loss of a model that ignores context, which training must beat."""
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[np.asarray(val, dtype=np.int64)].mean())
