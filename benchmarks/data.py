"""Tokenising a text corpus into the token cache: specformer's ``token_arrays`` (a fresh
cache each time: encoding, framing each document, writing and syncing the arrays) against
the floor, the ``tokenizers`` library's own batch encoding of the same texts (ids only,
nothing written), alternated round by round; and a run that reads the cache.

    python -m benchmarks.data [--quick] [--paths DIR ...] [--tokenizer tokenizer.json] [--out data.json]
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import at_least, base_parser, machine_info, median, print_table, write_json

__all__ = ["main", "floor_encode"]


def floor_encode(tok: Any, texts: Sequence[str], batch: int = 256) -> int:
    """The tokenizers library encoding ``texts`` ``batch`` documents a call, as its own
    ``encode_batch_fast`` does (threads over the documents): the tokens, kept as ids. A
    special token's string in the text is text, as specformer reads training data."""
    fast = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    before, tok.encode_special_tokens = tok.encode_special_tokens, True
    n = 0
    try:
        for start in range(0, len(texts), batch):
            n += sum(len(e.ids) for e in fast(list(texts[start : start + batch]), add_special_tokens=False))
    finally:
        tok.encode_special_tokens = before
    return n


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = base_parser(__doc__, models=False)
    p.add_argument("--paths", nargs="*", default=None,
                   help="text files, folders or globs (default: the Python standard library's source)")
    p.add_argument("--tokenizer", default=None,
                   help="a tokenizer.json (default: a byte-level BPE of 8,192 tokens trained on the corpus)")
    p.add_argument("--max-mb", type=float, default=None, help="at most this many MB of the files (default 20; quick 2)")
    p.add_argument("--repeat", type=at_least(1), default=None, help="rounds (default 3; quick 1)")
    args = p.parse_args(argv)
    import torch

    from specformer.data.corpus import files_corpus, stdlib_corpus
    from specformer.data.tokenizers import bpe_tokenizer, file_tokenizer
    from specformer.data.tokens import token_arrays
    from specformer.specs.training import (
        BPETokenizerSpec,
        FilesDataSpec,
        FileTokenizerSpec,
        StdlibDataSpec,
    )

    max_mb = args.max_mb or (2.0 if args.quick else 20.0)
    repeat = args.repeat or (1 if args.quick else 3)
    corpus = (files_corpus(FilesDataSpec(paths=tuple(args.paths), max_mb=max_mb)) if args.paths
              else stdlib_corpus(StdlibDataSpec(max_mb=max_mb)))
    work = Path(tempfile.mkdtemp(prefix="specformer-bench-data-"))
    try:
        if args.tokenizer:
            tok = file_tokenizer(FileTokenizerSpec(path=args.tokenizer))
        else:
            tok = bpe_tokenizer(BPETokenizerSpec(vocab_size=1024 if args.quick else 8192), corpus=corpus,
                                cache_dir=work / "bpe")
        texts = [*corpus.train, *corpus.val]
        chars = sum(map(len, texts))
        times: dict[str, list[float]] = {"specformer": [], "floor": []}
        tokens: dict[str, int] = {}
        # round -1 is an untimed warm-up of each side (the first encode of a process is slower:
        # its thread pool and the pages of the text are cold), as the other benchmarks' alternate()
        for round_ in range(-1, repeat):
            for name in (("specformer", "floor") if round_ % 2 == 0 else ("floor", "specformer")):
                cache = work / f"cache-{round_}"
                start = time.perf_counter()
                if name == "specformer":
                    arrays = token_arrays(corpus, tok, cache)
                    tokens[name] = len(arrays.train) + len(arrays.val)
                else:
                    tokens[name] = floor_encode(tok.tok, texts)
                if round_ >= 0:
                    times[name].append(time.perf_counter() - start)
        start = time.perf_counter()
        again = token_arrays(corpus, tok, work / "cache-0")
        cached_s = time.perf_counter() - start
        assert again.cached
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sf, floor = median(times["specformer"]), median(times["floor"])
    rows = [
        {"what": "floor: tokenizers encode_batch_fast", "seconds": floor, "times_s": times["floor"],
         "mb_per_s": chars / 1e6 / floor, "tokens": tokens["floor"]},
        {"what": "specformer token_arrays (written, synced)", "seconds": sf, "times_s": times["specformer"],
         "mb_per_s": chars / 1e6 / sf, "tokens": tokens["specformer"], "of_floor": floor / sf},
        {"what": "specformer token_arrays, from the cache", "seconds": cached_s, "mb_per_s": None,
         "tokens": tokens["specformer"]},
    ]
    payload = {"benchmark": "data", "machine": machine_info(torch.device("cpu")),
               "settings": {"paths": args.paths or "stdlib", "max_mb": max_mb, "repeat": repeat,
                            "tokenizer": args.tokenizer or "bpe", "vocab_size": tok.vocab_size,
                            "characters": chars, "documents": len(texts)},
               "results": rows}
    print_table(
        f"tokenising {chars / 1e6:.1f} MB of text ({len(texts):,} documents, vocabulary {tok.vocab_size:,}); "
        f"median of {repeat}",
        ["what", "seconds", "MB/s", "tokens", "of floor"],
        [[r["what"], r["seconds"], r["mb_per_s"], r["tokens"], r.get("of_floor")] for r in rows],
    )
    print(f"specformer tokenises at {floor / sf:.2f} of the floor's speed (floor time / specformer time)")
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
