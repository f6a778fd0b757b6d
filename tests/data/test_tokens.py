"""The token cache of a text corpus: written a chunk at a time, never half-written, and made
again exactly when the text or the tokenizer changes."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specformer.data import tokens
from specformer.data.corpus import files_corpus
from specformer.data.tokenizers import ByteTokenizer, bpe_tokenizer
from specformer.data.tokens import token_arrays, unigram_cross_entropy
from specformer.specs.training import BPETokenizerSpec, FilesDataSpec

WORDS = "the model reads a stream of tokens and predicts the next one from those before it".split()


def _write_corpus(root: Path, sizes: Sequence[int], seed: int = 0) -> Path:
    """Files of about ``sizes`` characters of words, one file a size, below ``root``."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i, size in enumerate(sizes):
        words, n = [], 0
        while n < size:
            word = WORDS[int(rng.integers(len(WORDS)))]
            words.append(word + ("\n" if rng.random() < 0.1 else " "))
            n += len(words[-1])
        (root / f"doc{i:03d}.txt").write_text("".join(words) + "naïve café\n", encoding="utf-8")
    return root


def _corpus(root: Path) -> Any:
    return files_corpus(FilesDataSpec(paths=(str(root),), val_fraction=0.2))


class Recording(ByteTokenizer):
    """The byte tokenizer, noting the characters of each batch it encodes."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []

    def encode_arrays(self, texts: Sequence[str], dtype: Any) -> list[np.ndarray]:
        self.batches.append([len(t) for t in texts])
        return super().encode_arrays(texts, dtype)


def test_the_token_stream_is_encoded_a_chunk_of_text_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a batch of many documents holds the tokenizer's encodings of all of them at once: memory
    # that grows with the corpus. Batches are cut by characters, a long document encoded alone
    monkeypatch.setattr(tokens, "CHUNK_CHARS", 5_000)
    monkeypatch.setattr(tokens, "_threads", lambda: 2)
    corpus = _corpus(_write_corpus(tmp_path / "data", [1_500] * 30 + [12_000] * 3))
    tok = Recording()
    arrays = token_arrays(corpus, tok, tmp_path / "cache")
    assert len(tok.batches) > 10
    # longer documents go two at a time, one for each of the tokenizers library's two threads
    assert all(sum(batch) <= 5_000 or len(batch) <= 2 for batch in tok.batches)
    assert any(len(batch) == 2 and min(batch) > 5_000 for batch in tok.batches)
    assert sorted(n for batch in tok.batches for n in batch) == sorted(map(len, corpus.train + corpus.val))
    # the same stream as each document's bytes then the end-of-text id, in order
    for split, texts in (("train", corpus.train), ("val", corpus.val)):
        expected = [i for t in texts for i in [*t.encode("utf-8"), tok.eot_id]]
        assert getattr(arrays, split).tolist() == expected


def test_the_byte_tokenizer_encodes_training_text_as_its_utf8_bytes() -> None:
    tok = ByteTokenizer()
    texts = ["naïve café — ✓", "", "a literal <|endoftext|> is text here"]
    arrays = tok.encode_arrays(texts, np.uint16)
    assert [a.dtype for a in arrays] == [np.dtype(np.uint16)] * 3
    assert [a.tolist() for a in arrays] == [tok.encode(t, specials=False) for t in texts]
    assert tok.eot_id not in arrays[2].tolist()


def test_the_token_cache_is_written_without_holding_the_whole_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4 MB of text: its stream is 8 MB of uint16 ids, and Python lists of its ids ~100 MB;
    # a chunk at a time, a few chunks' worth is all that is held
    monkeypatch.setattr(tokens, "CHUNK_CHARS", 200_000)
    corpus = _corpus(_write_corpus(tmp_path / "data", [100_000] * 40))
    tracemalloc.start()
    try:
        arrays = token_arrays(corpus, ByteTokenizer(), tmp_path / "cache")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(arrays.train) + len(arrays.val) > 4_000_000
    assert peak < 2_000_000, f"{peak / 1e6:.1f} MB held while tokenising 4 MB of text"


def test_the_unigram_baseline_reads_the_token_cache_a_slice_at_a_time(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "ids.bin"
    (rng.random(4_000_000) ** 3 * 1000).astype(np.uint16).tofile(path)  # skewed: below a uniform guess
    ids = np.memmap(path, dtype=np.uint16, mode="r")
    train, val = ids[:3_000_000], ids[3_000_000:]
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=1000) + 1.0
    expected = -np.log(counts / counts.sum())[np.asarray(val, dtype=np.int64)].mean()
    tracemalloc.start()
    try:
        found = unigram_cross_entropy(train, val, 1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == pytest.approx(expected, rel=1e-12)
    # an int64 copy of the train ids alone would be 24 MB
    assert peak < 20_000_000, f"{peak / 1e6:.1f} MB held"


def test_an_interrupted_tokenisation_leaves_no_entry_a_later_run_trusts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokens, "CHUNK_CHARS", 5_000)
    corpus = _corpus(_write_corpus(tmp_path / "data", [1_500] * 30))

    class Interrupted(ByteTokenizer):
        calls = 0

        def encode_arrays(self, texts: Sequence[str], dtype: Any) -> list[np.ndarray]:
            Interrupted.calls += 1
            if Interrupted.calls == 3:  # Ctrl-C with two chunks of train.bin written
                raise KeyboardInterrupt
            return super().encode_arrays(texts, dtype)

    with pytest.raises(KeyboardInterrupt):
        token_arrays(corpus, Interrupted(), tmp_path / "cache")
    (entry,) = (tmp_path / "cache" / "tokens").iterdir()
    assert sorted(p.name for p in entry.iterdir()) == [".lock"]  # no meta.json, no partial or temporary file
    again = token_arrays(corpus, ByteTokenizer(), tmp_path / "cache")
    assert not again.cached and again.path == entry
    assert again.train.tolist() == [i for t in corpus.train for i in [*t.encode("utf-8"), 256]]


def test_the_token_cache_is_reused_until_a_file_or_the_tokenizer_changes(tmp_path: Path) -> None:
    root = _write_corpus(tmp_path / "data", [2_000] * 12)
    cache = tmp_path / "cache"

    def run(vocab_size: int = 300) -> tuple[Any, Any]:
        corpus = _corpus(root)
        tok = bpe_tokenizer(BPETokenizerSpec(vocab_size=vocab_size), corpus=corpus, cache_dir=cache)
        return tok, token_arrays(corpus, tok, cache)

    _, first = run()
    assert not first.cached
    # touching nothing, or only a file's time stamp, reads the cache
    _, again = run()
    assert again.cached and again.path == first.path
    os.utime(root / "doc003.txt", (1e9, 1e9))
    _, touched = run()
    assert touched.cached and touched.path == first.path
    # one file edited: another entry, made now, with the new text in it
    edited = root / "doc005.txt"
    edited.write_text(edited.read_text() + "a line added at the end\n")
    new_tok, changed = run()
    assert not changed.cached and changed.path != first.path
    assert len(list((cache / "tokenizers").glob("bpe-*.json"))) == 2  # the BPE is trained on the new text too
    ids = np.concatenate([changed.train, changed.val]).tolist()
    assert new_tok.decode(ids).count("a line added at the end") == 1
    # another tokenizer setting: another tokenizer and another entry
    other_tok, other = run(vocab_size=320)
    assert other_tok.vocab_size != new_tok.vocab_size
    assert not other.cached and other.path not in (first.path, changed.path)
    assert len(list((cache / "tokens").iterdir())) == 3
    assert len(list((cache / "tokenizers").glob("bpe-*.json"))) == 3


def test_a_tokenizer_shows_its_size_and_special_ids() -> None:
    from tokenizers import Tokenizer, models

    from specformer.data.tokenizers import HFTokenizer
    from specformer.training.generate import encode_prompt

    assert repr(ByteTokenizer()) == "ByteTokenizer(vocab_size=259, bos_id=256, eos_id=256, eot_id=256, pad_id=257, mask_id=258)"
    bpe = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, " b": 2, "<|endoftext|>": 3}, merges=[]))
    bpe.add_special_tokens(["<|endoftext|>"])
    assert repr(HFTokenizer(bpe)) == "HFTokenizer(vocab_size=4, bos_id=3, eos_id=3, eot_id=3)"
    # a prompt's token healing shows the text its first tokens spell, not an object address
    healed = encode_prompt(HFTokenizer(bpe), "a ")
    assert "object at 0x" not in repr(healed) and "tokens spelling ' '" in repr(healed)
