"""Data preparation says what it does while it works: reading, training a BPE, tokenising."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rich.console import Console

from specformer.data import progress
from specformer.data.corpus import files_corpus
from specformer.data.tokenizers import bpe_tokenizer
from specformer.data.tokens import token_arrays
from specformer.specs.training import BPETokenizerSpec, FilesDataSpec


def _corpus(root: Path) -> object:
    root.mkdir()
    for i in range(6):
        (root / f"doc{i}.txt").write_text(f"document {i}: the model reads the next token.\n" * (50 + 10 * i))
    return files_corpus(FilesDataSpec(paths=(str(root),), val_fraction=0.3))


def test_each_step_of_preparation_says_what_it_does_and_how_far_it_is(tmp_path: Path) -> None:
    steps: list[list] = []

    @contextmanager
    def record(description: str, total: int | None) -> Iterator[progress.Advance]:
        done = [description, total, 0]
        steps.append(done)
        yield lambda n: done.__setitem__(2, done[2] + n)

    with progress.reporting(record):
        corpus = _corpus(tmp_path / "data")
        tok = bpe_tokenizer(BPETokenizerSpec(vocab_size=300), corpus=corpus, cache_dir=tmp_path / "cache")
        token_arrays(corpus, tok, tmp_path / "cache")
    size = sum(p.stat().st_size for p in (tmp_path / "data").iterdir())
    train_chars, val_chars = sum(map(len, corpus.train)), sum(map(len, corpus.val))
    assert steps == [
        ["reading 6 files", size, size],
        [f"training the BPE tokenizer (vocab_size 300) on {train_chars / 1e6:.1f} MB of text", None, 0],
        ["tokenising the training text", train_chars, train_chars],
        ["tokenising the validation text", val_chars, val_chars],
    ]
    # read from the cache: nothing to say but the reading
    steps.clear()
    with progress.reporting(record):
        token_arrays(corpus, bpe_tokenizer(BPETokenizerSpec(vocab_size=300), corpus=corpus, cache_dir=tmp_path / "cache"),
                     tmp_path / "cache")
    assert steps == []


def test_a_long_step_leaves_a_line_with_its_rate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    monkeypatch.setattr(progress, "LINE_AFTER_S", 0.0)
    with progress.reporting(progress.rich_reporter(console)):
        _corpus(tmp_path / "data")
    size = sum(p.stat().st_size for p in (tmp_path / "data").iterdir())
    (line,) = out.getvalue().splitlines()
    assert line.startswith(f"reading 6 files: {size / 1e6:.1f} MB in ") and line.endswith(" MB/s)")
    # a short one leaves nothing (its bar showed while it ran)
    out.seek(0)
    out.truncate()
    monkeypatch.setattr(progress, "LINE_AFTER_S", 60.0)
    with progress.reporting(progress.rich_reporter(console)):
        _corpus(tmp_path / "again")
    assert out.getvalue() == ""
    # --no-progress: no bar on a terminal, and the line all the same (a log's only word on the step)
    terminal = io.StringIO()
    monkeypatch.setattr(progress, "LINE_AFTER_S", 0.0)
    shown = Console(file=terminal, force_terminal=True, width=200)
    with progress.reporting(progress.rich_reporter(shown, bars=False)):
        _corpus(tmp_path / "third")
    (line,) = terminal.getvalue().splitlines()
    assert line.startswith("reading 6 files: ") and "\x1b[?25l" not in terminal.getvalue()  # no live display
    assert progress.done_line("tokenising the training text", 94_400_000, 63.0) == (
        "tokenising the training text: 94.4 MB in 1m 3s (1.50 MB/s)")
    assert progress.done_line("training the BPE tokenizer", None, 5.04) == "training the BPE tokenizer: 5.0s"
    # a line longer than the console (a lock's path in it) is one line, not cut in the path
    narrow = io.StringIO()
    long = "waiting for another process preparing the token cache (it holds /" + "x" * 90 + "/.lock)"
    with progress.reporting(progress.rich_reporter(Console(file=narrow, force_terminal=False, width=80))):
        with progress.step(long):
            pass  # a step that does nothing: the line is what is checked
    lines = narrow.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{long}: "), lines


def test_tokenising_pairs_says_how_far_it_is(tmp_path: Path) -> None:
    from specformer.data.pairs import PairCorpus
    from specformer.data.tokenizers import ByteTokenizer
    from specformer.data.tokens import pair_token_ids

    pairs = [(f"source {i}", f"target number {i}") for i in range(40)]
    corpus = PairCorpus(train=pairs[:30], val=pairs[30:], fingerprint="pairs-progress")
    steps: list[list] = []

    @contextmanager
    def record(description: str, total: int | None) -> Iterator[progress.Advance]:
        done = [description, total, 0]
        steps.append(done)
        yield lambda n: done.__setitem__(2, done[2] + n)

    def chars(part: list[tuple[str, str]]) -> int:
        return sum(len(s) + len(t) for s, t in part)

    with progress.reporting(record):
        pair_token_ids(corpus, ByteTokenizer(), 64, tmp_path)
        pair_token_ids(corpus, ByteTokenizer(), 64, tmp_path / "decoder", decoder=True)
    expected = [["tokenising the training pairs", chars(pairs[:30]), chars(pairs[:30])],
                ["tokenising the validation pairs", chars(pairs[30:]), chars(pairs[30:])]]
    assert steps == expected * 2
