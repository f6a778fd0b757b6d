"""Inference throughput: prefill tokens/s (a whole batch of prompts, filling the KV cache
where there is one) and greedy KV-cache decoding tokens/s at batch 1 and batch 8,
specformer against transformers and x-transformers (eval mode, no grad).

Decoding loops are written the same way for every library: one prompt pass, then one
token per call through the library's own cache; only the decoding steps are timed.

    python -m benchmarks.inference [--quick] [--shapes ...] [--out inference.json]
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks.common import (
    Adapter,
    alternate,
    available_libraries,
    base_parser,
    build_adapters,
    check_same_logits,
    machine_info,
    make_batch,
    median,
    print_table,
    select_shapes,
    setup,
    sync,
    write_json,
)

__all__ = ["main"]


def _timed_prefill(a: Adapter, batch: Any, dev: torch.device, bf16: bool):  # type: ignore[no-untyped-def]
    import time

    def run() -> float:
        sync(dev)
        start = time.perf_counter()
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            a.prefill(batch)
        sync(dev)
        return time.perf_counter() - start

    return run


def _timed_decode(a: Adapter, batch: Any, n: int, dev: torch.device, bf16: bool):  # type: ignore[no-untyped-def]
    def run() -> float:
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            return a.decode(batch, n)

    return run


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--precisions", nargs="*", default=["fp32"], choices=["fp32", "bf16"])
    p.add_argument("--prompt", type=int, default=None, help="prompt length for decoding (default 64; quick 8)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens decoded per run (default 64; quick 4)")
    p.add_argument("--decode-batches", nargs="*", type=int, default=[1, 8])
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--repeat", type=int, default=None)
    args = p.parse_args(argv)
    dev = setup(args)
    shapes = select_shapes(args.shapes, args.quick)
    libraries = available_libraries(args.libraries)
    prompt = args.prompt or (8 if args.quick else 64)
    new = args.new_tokens or (4 if args.quick else 64)
    warmup = args.warmup if args.warmup is not None else 1
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        adapters = build_adapters(shape, dev, libraries)
        for a in adapters:
            a.model.eval()
        check = check_same_logits(adapters, make_batch(shape, dev, batch=1, seq_len=min(64, shape.seq_len)))
        for precision in args.precisions:
            bf16 = precision == "bf16"
            batch = make_batch(shape, dev)
            times = alternate({a.library: _timed_prefill(a, batch, dev, bf16) for a in adapters},
                              warmup=warmup, repeat=repeat)
            rows += _rows(shape.name, precision, "prefill", shape.batch, shape.tokens, adapters, times, check)
            decoders = [a for a in adapters if a.decode is not None]
            if not decoders:
                continue
            # learned position tables end at max_seq_len: stay inside them
            n = min(new, shape.spec["max_seq_len"] - prompt)
            if n < 1:
                raise SystemExit(f"{shape.name}: a prompt of {prompt} leaves no room below max_seq_len")
            for b in args.decode_batches:
                prompt_batch = make_batch(shape, dev, batch=b, seq_len=prompt, seed=1)
                times = alternate({a.library: _timed_decode(a, prompt_batch, n, dev, bf16) for a in decoders},
                                  warmup=warmup, repeat=repeat)
                rows += _rows(shape.name, precision, f"decode b{b}", b, b * n, decoders, times, check)
        del adapters
        gc.collect()
    payload = {"benchmark": "inference", "machine": machine_info(dev), "libraries": libraries,
               "settings": {"prompt": prompt, "new_tokens": new, "quick": args.quick,
                            "decode": "greedy, one token per call through the library's KV cache; "
                                      "the prompt pass is not timed"},
               "results": rows}
    print_table(
        f"Inference on {dev} (prompt {prompt}, {new} new tokens per decode run)",
        ["shape", "task", "precision", "library", "batch", "ms", "tokens/s", "specformer ×"],
        [[r["shape"], r["task"], r["precision"], r["library"], r["batch"], r["ms"], r["tokens_per_s"],
          r["speedup_of_specformer"]] for r in rows],
    )
    write_json(args.out, payload)
    return payload


def _rows(shape: str, precision: str, task: str, batch: int, tokens: int, adapters: Sequence[Adapter],
          times: dict[str, list[float]], check: float) -> list[dict[str, Any]]:
    ours = median(times["specformer"])
    out = []
    for a in adapters:
        t = median(times[a.library])
        out.append({"shape": shape, "task": task, "precision": precision, "library": a.library,
                    "batch": batch, "tokens": tokens, "ms": 1e3 * t, "times_s": times[a.library],
                    "tokens_per_s": tokens / t,
                    "speedup_of_specformer": t / ours if a.library != "specformer" else None,
                    "logits_max_diff_vs_specformer": check if a.library == "transformers" else None,
                    "notes": a.notes})
    return out


if __name__ == "__main__":
    main()
