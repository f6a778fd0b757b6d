"""Inference throughput: prefill tokens/s (a whole batch of prompts, filling the KV cache
where there is one) and greedy KV-cache decoding tokens/s at batch 1 and batch 8,
specformer against transformers and x-transformers (eval mode, no grad).

Decoding loops are written the same way for every library: one prompt pass, then one
token per call through the library's own cache; only the decoding steps are timed. The
``generate b1`` rows time what a user calls instead, each library's own generation function
(specformer's ``generate`` / ``generate_seq2seq``, ``transformers``' ``generate()``, greedy,
exactly the same number of new tokens), prompt pass included, each in the grad mode it sets
itself (specformer's inference mode, ``transformers``' ``no_grad``); ``same tokens`` says
whether the tokens equal specformer's.

Decoding at a small batch is bound by memory, not arithmetic: each step reads every
weight of the decoder and its head, and the KV cache, once. So each decoding row also
reports the machine's floor for that work, measured in the same run: the bytes one
step reads (recorded from specformer's decoding: every operation's tensor inputs, and of
a lookup table such as the embedding only the rows it returns) and the time ``torch.sum``
takes to read as many bytes, re-read every time as decoding re-reads its weights.
``of floor`` is that floor over the library's time: 100% would be decoding at the
speed of reading the weights.

    python -m benchmarks.inference [--quick] [--shapes ...] [--out inference.json]
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from benchmarks.common import (
    Adapter,
    alternate,
    at_least,
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

__all__ = ["main", "decode_bytes", "timed_read"]

_FLOOR = "read the same bytes"


class _BytesRead(TorchDispatchMode):
    """Sums the bytes of every tensor an operation reads: its tensor inputs (a view counts
    the elements it spans); for a lookup (embedding, indexing) the rows it returns rather
    than its whole table; for a copy its source only; nothing for operations that read no
    data (views, ``empty``-likes, fills)."""

    _LOOKUPS = {torch.ops.aten.embedding.default, torch.ops.aten.index.Tensor,
                torch.ops.aten.index_select.default, torch.ops.aten.gather.default}

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__
        if func in self._LOOKUPS:
            inputs: Any = out
        elif func.is_view or name.startswith(("_unsafe_view", "empty", "new_empty", "resize_", "fill_")):
            inputs = ()
        else:
            inputs = args[1:] if name.startswith("copy_") else (*args, *kwargs.values())
        self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))
        return out


def decode_bytes(a: Adapter, batch: Any, n: int, *, bf16: bool, dev: torch.device) -> float:
    """Bytes one decoding step of ``a`` reads, averaged over ``n`` steps after ``batch``'s
    prompt: the bytes read by ``a.decode(batch, n)`` less those of ``a.decode(batch, 0)``
    (the same prompt pass, no step)."""
    totals = []
    for steps in (0, n):
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16), _BytesRead() as rec:
            a.decode(batch, steps)
        totals.append(rec.bytes)
    return (totals[1] - totals[0]) / n


def timed_read(nbytes: float, n: int, dev: torch.device) -> Callable[[], float]:
    """A callable timing ``n`` reads of ``nbytes`` of float32 by ``torch.sum``, the same
    buffer each time (as decoding re-reads its weights every step); returns seconds."""
    buf = torch.ones(max(1, int(nbytes) // 4), device=dev)

    def run() -> float:
        sync(dev)
        start = time.perf_counter()
        for _ in range(n):
            buf.sum()
        sync(dev)
        return time.perf_counter() - start

    return run


def _timed_prefill(a: Adapter, batch: Any, dev: torch.device, bf16: bool):  # type: ignore[no-untyped-def]
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


def _timed_generate(a: Adapter, batch: Any, n: int, dev: torch.device, bf16: bool,
                    tokens: dict[str, Any]):  # type: ignore[no-untyped-def]
    def run() -> float:
        # no grad mode set here: each library's generation function sets its own
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            seconds, out = a.generate(batch, n)
        tokens[a.library] = out
        return seconds

    return run


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = base_parser(__doc__)
    p.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    p.add_argument("--prompt", type=at_least(1), default=None, help="prompt length for decoding (default 64; quick 8)")
    p.add_argument("--new-tokens", type=at_least(1), default=None, help="tokens decoded per run (default 64; quick 4)")
    p.add_argument("--decode-batches", nargs="+", type=at_least(1), default=[1, 8])
    p.add_argument("--no-generate", dest="generate", action="store_false",
                   help="skip the 'generate b1' rows: each library's own generation function "
                        "(specformer's generate, transformers' generate()), prompt pass included")
    p.add_argument("--warmup", type=at_least(0), default=None)
    p.add_argument("--repeat", type=at_least(1), default=None)
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
                raise SystemExit(f"{shape.name}: a prompt of {prompt} tokens leaves no room for a new one below its "
                                 f"max_seq_len of {shape.spec['max_seq_len']}: give a shorter --prompt")
            if n < new and precision == args.precisions[0]:
                print(f"note: {shape.name}: {n} new tokens a decode run, not {new}: its prompt of {prompt} and "
                      f"max_seq_len of {shape.spec['max_seq_len']} leave room for {n}", file=sys.stderr)
            for b in args.decode_batches:
                prompt_batch = make_batch(shape, dev, batch=b, seq_len=prompt, seed=1)
                step_bytes = decode_bytes(decoders[0], prompt_batch, n, bf16=bf16, dev=dev)
                runs = {a.library: _timed_decode(a, prompt_batch, n, dev, bf16) for a in decoders}
                # the floor is timed in the same rounds, so load hits it as it hits the libraries
                times = alternate({**runs, _FLOOR: timed_read(step_bytes, n, dev)}, warmup=warmup, repeat=repeat)
                floor = median(times.pop(_FLOOR))
                rows += [{**row, "new_tokens": n} for row in _rows(
                    shape.name, precision, f"decode b{b}", b, b * n, decoders, times, check, floor=(step_bytes, floor))]
            generators = [a for a in adapters if a.generate is not None]
            if args.generate and len(generators) > 1:
                prompt_batch = make_batch(shape, dev, batch=1, seq_len=prompt, seed=1)
                tokens: dict[str, Any] = {}
                runs = {a.library: _timed_generate(a, prompt_batch, n, dev, bf16, tokens) for a in generators}
                times = alternate(runs, warmup=warmup, repeat=repeat)
                same = {lib: bool(torch.equal(out.cpu(), tokens["specformer"].cpu())) for lib, out in tokens.items()}
                rows += [{**row, "same_tokens_as_specformer": same[row["library"]], "new_tokens": n}
                         for row in _rows(shape.name, precision, "generate b1", 1, n, generators, times, check)]
        del adapters
        gc.collect()
    payload = {"benchmark": "inference", "machine": machine_info(dev), "libraries": libraries,
               "settings": {"prompt": prompt, "new_tokens": new, "quick": args.quick, "warmup": warmup,
                            "repeat": repeat, "precisions": args.precisions, "decode_batches": args.decode_batches,
                            "decode": "greedy, one token per call through the library's KV cache; "
                                      "the prompt pass is not timed"},
               "results": rows}
    print_table(
        f"Inference on {dev} (prompt {prompt}, {new} new tokens per decode run where max_seq_len leaves room; "
        f"medians of {repeat} round{'s' if repeat != 1 else ''})",
        ["shape", "task", "precision", "library", "batch", "ms", "tokens/s", "specformer ×", "MB/step",
         "floor ms", "of floor", "same tokens"],
        [[r["shape"], r["task"], r["precision"], r["library"], r["batch"], r["ms"], r["tokens_per_s"],
          r["speedup_of_specformer"], _mb(r["bytes_per_step"]), r["floor_ms"],
          None if r["fraction_of_floor"] is None else f"{100 * r['fraction_of_floor']:.0f}%",
          _same(r.get("same_tokens_as_specformer"))] for r in rows],
    )
    write_json(args.out, payload)
    return payload


def _same(same: bool | None) -> str | None:
    return None if same is None else ("yes" if same else "no")


def _mb(nbytes: float | None) -> str | None:
    return None if nbytes is None else f"{nbytes / 1e6:.1f}"


def _rows(shape: str, precision: str, task: str, batch: int, tokens: int, adapters: Sequence[Adapter],
          times: dict[str, list[float]], check: float,
          floor: tuple[float, float] | None = None) -> list[dict[str, Any]]:
    """One row per library; ``floor`` is (bytes one decoding step reads, seconds to read
    them for the whole run) on decoding rows."""
    ours = median(times["specformer"])
    out = []
    for a in adapters:
        t = median(times[a.library])
        out.append({"shape": shape, "task": task, "precision": precision, "library": a.library,
                    "batch": batch, "tokens": tokens, "ms": 1e3 * t, "times_s": times[a.library],
                    "tokens_per_s": tokens / t,
                    "speedup_of_specformer": t / ours if a.library != "specformer" else None,
                    "bytes_per_step": floor[0] if floor else None,
                    "floor_ms": 1e3 * floor[1] if floor else None,
                    "fraction_of_floor": floor[1] / t if floor else None,
                    "logits_max_diff_vs_specformer": check if a.library == "transformers" else None,
                    "notes": a.notes})
    return out


if __name__ == "__main__":
    main()
