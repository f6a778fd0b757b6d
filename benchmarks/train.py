"""Training-step throughput: forward + cross-entropy + backward + AdamW step, tokens/s, in
float32 and in bfloat16 autocast (and, with ``--precisions bf16-true``, with bfloat16
weights), specformer against transformers and x-transformers.

The same script measures plain matrix-multiply throughput at exactly the matrix shapes
the specformer step runs (recorded from one step, then run as plain calls in turn with the
libraries' steps) and reports the fraction of it the step reaches: model FLOPs (``specformer.analysis.flops_per_token(...).training``) per
second of step time, over the matmul FLOP/s. The model FLOPs are those the library
executes: on the encoder shape (masked LM, 15% of positions labelled) specformer's head
runs on the labelled positions only, the peers' on every position.

    python -m benchmarks.train [--quick] [--shapes llama-style ...] [--out train.json]
"""

from __future__ import annotations

import gc
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import (
    Adapter,
    _specformer_adapter,
    alternate,
    at_least,
    available_libraries,
    base_parser,
    build_adapters,
    check_same_logits,
    machine_info,
    make_batch,
    make_optimizer,
    median,
    print_table,
    setup,
    sync,
    training_step,
    write_json,
)
from specformer.analysis import flops_per_token
from specformer.components.positional import warm_tables

__all__ = ["main", "record_matmuls", "matmul_set", "matmul_throughput", "compiled_adapter", "executed_flops"]

aten = torch.ops.aten
_MATMULS = {aten.mm.default: "mm", aten.addmm.default: "addmm", aten.addmm_.default: "addmm_",
            aten.bmm.default: "bmm", aten.baddbmm.default: "baddbmm"}
# specformer's float32 products where oneDNN is faster than mm (specformer.components.products)
_LINEAR_POINTWISE = torch.ops.mkldnn._linear_pointwise.default if torch.backends.mkldnn.is_available() else None
if _LINEAR_POINTWISE is not None:
    _MATMULS[_LINEAR_POINTWISE] = "linear_pointwise"

# the key of the step's products, timed in turn with the libraries' steps
_MATMUL_ROW = "(matmul)"

# the weights' dtype of each --precisions choice
PRECISIONS = {"fp32": torch.float32, "bf16": torch.float32, "bf16-true": torch.bfloat16}

# (op, ((shape, stride), ...), dtype)
Signature = tuple[str, tuple[tuple[tuple[int, ...], tuple[int, ...]], ...], torch.dtype]


class _Recorder(TorchDispatchMode):
    """Counts every matrix product (mm, addmm, addmm_, bmm, baddbmm, oneDNN's linear) by shape, layout and dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[Signature] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = _MATMULS.get(func)
        if name is not None:
            tensors = tuple((tuple(a.shape), tuple(a.stride())) for a in args if isinstance(a, torch.Tensor))
            dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor))
            self.calls[(name, tensors, dtype)] += 1
        return func(*args, **(kwargs or {}))


def record_matmuls(adapter: Adapter, batch: Any, *, bf16: bool, dev: torch.device) -> Counter[Signature]:
    """The matrix products of one forward + backward of ``adapter`` (optimizer excluded)."""
    opt = None
    with _Recorder() as rec:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = adapter.loss(batch)
        loss.backward()
    adapter.model.zero_grad(set_to_none=True)
    del opt
    return rec.calls


def _flops(sig: Signature) -> int:
    name, tensors, _ = sig
    if name == "linear_pointwise":  # x (..., K) by weight (N, K)
        x, w = tensors[0][0], tensors[1][0]
        return 2 * (math.prod(x) // x[-1]) * x[-1] * w[0]
    a, b = tensors[-2][0], tensors[-1][0]  # the two factors (addmm/baddbmm: input first)
    if name in ("mm", "addmm", "addmm_"):
        return 2 * a[0] * a[1] * b[1]
    return 2 * a[0] * a[1] * a[2] * b[2]


def _tensor(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    return torch.empty_strided(shape, stride, dtype=dtype, device=dev).normal_()


def matmul_set(calls: Counter[Signature], dev: torch.device) -> tuple[Callable[[], float], int]:
    """The step's matrix products as plain calls: a callable that runs each distinct product
    once untimed, then as many times as the step does, back to back, and returns the seconds
    the timed calls took; and the set's FLOPs. :func:`main` times it in turn with the steps
    (:func:`benchmarks.common.alternate`), so a change in the machine's speed during a run
    moves the step times and this reference alike, as it moves the libraries' times."""
    ops = {"mm": torch.mm, "addmm": torch.addmm, "addmm_": torch.Tensor.addmm_, "bmm": torch.bmm, "baddbmm": torch.baddbmm,
           "linear_pointwise": lambda x, w, b=None: _LINEAR_POINTWISE(x, w, b, "none", [], "")}
    prepared = [(ops[name], [_tensor(s, st, dtype, dev) for s, st in tensors], count)
                for (name, tensors, dtype), count in calls.items()]
    flops = sum(count * _flops(sig) for sig, count in calls.items())

    def run() -> float:
        seconds = 0.0
        for op, args, count in prepared:
            op(*args)  # untimed: its operands in cache and its threads awake, the product's own speed
            sync(dev)
            start = time.perf_counter()
            for _ in range(count):
                op(*args)
            sync(dev)
            seconds += time.perf_counter() - start
        return seconds

    return run, flops


def matmul_throughput(calls: Counter[Signature], dev: torch.device, *, repeat: int = 3) -> dict[str, float]:
    """FLOP/s of the step's products timed on their own (:func:`matmul_set`: one warm-up
    pass, then the median of ``repeat``)."""
    run, flops = matmul_set(calls, dev)
    run()
    seconds = median([run() for _ in range(repeat)])
    return {"flops": flops, "seconds": seconds, "flops_per_s": flops / seconds}


def executed_flops(spec: Any, shape: Any, batch: Any) -> float:
    """Training FLOPs of specformer's step: the analysis module's count, with a masked-LM
    head counted on the labelled positions only (it skips the rest)."""
    f = flops_per_token(spec, seq_len=shape.seq_len)
    total = 3 * f.forward * shape.tokens  # forward + 2 backward products, the head on every position
    if spec.head.type == "mlm":
        labelled = int((batch.labels != -100).sum())
        total -= 3 * f.components["head"] * (shape.tokens - labelled)
    return total


def compiled_adapter(ours: Adapter, kind: str, dev: torch.device, mode: str | None = None) -> Adapter:
    """``torch.compile`` of specformer's model (the same parameters), as a separate row; the
    warm-up steps absorb the compilation. ``mode``: torch.compile's (``max-autotune-no-cudagraphs``
    also times inductor's own matrix-product kernels against the library's)."""
    # the positional tables cached before the first trace, as training.compile does
    dtype = next(p.dtype for p in ours.model.parameters() if p.is_floating_point())
    warm_tables(ours.model, dev, dtype)
    compiled = _specformer_adapter(torch.compile(ours.model, mode=mode), kind, dev)
    compiled.library = "specformer+compile" + (f"({mode})" if mode else "")
    compiled.notes = "torch.compile (inductor" + (f", mode={mode}" if mode else "") + "), same module and weights"
    return compiled


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = base_parser(__doc__)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=list(PRECISIONS),
                   help="fp32; bf16 (float32 weights, bfloat16 autocast); bf16-true (bfloat16 weights "
                        "and AdamW state, no autocast, as training.precision: bf16-true)")
    p.add_argument("--warmup", type=at_least(0), default=None)
    p.add_argument("--repeat", type=at_least(1), default=None)
    p.add_argument("--compile", action="store_true",
                   help="also time torch.compile(specformer model) as its own row (compile time excluded); "
                        "a 'compiled ×' column gives it against each peer")
    p.add_argument("--compile-modes", nargs="*", default=[None], metavar="MODE",
                   help="with --compile: torch.compile modes, one row each (default: its default mode; "
                        "e.g. default max-autotune-no-cudagraphs)")
    args = p.parse_args(argv)
    if args.compile_modes != [None] and not args.compile:
        p.error("--compile-modes names the modes of --compile: give --compile with it")
    dev = setup(args)
    from benchmarks.common import select_shapes

    shapes = select_shapes(args.shapes, args.quick)
    libraries = available_libraries(args.libraries)
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        adapters = build_adapters(shape, dev, libraries)
        if args.compile:
            for mode in args.compile_modes:
                adapters.append(compiled_adapter(adapters[0], shape.kind, dev, None if mode == "default" else mode))
        check = check_same_logits(adapters, make_batch(shape, dev, batch=1, seq_len=min(64, shape.seq_len)))
        batch = make_batch(shape, dev)
        spec = shape.model_spec()
        # the peers run a masked-LM head on every position (flops_per_token's training count
        # has it on mask_prob of them, as specformer runs it)
        model_flops = 3 * flops_per_token(spec, seq_len=shape.seq_len).forward * shape.tokens
        ours_flops = executed_flops(spec, shape, batch)
        warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
        repeat = args.repeat if args.repeat is not None else (1 if args.quick else (3 if shape.larger else 5))
        for precision in args.precisions:
            bf16 = precision == "bf16"
            for a in adapters:  # bf16-true: every library's weights in bfloat16 (back to float32 after)
                a.model.to(PRECISIONS[precision])
            matmuls, mm_flops = matmul_set(record_matmuls(adapters[0], batch, bf16=bf16, dev=dev), dev)
            runs = {_MATMUL_ROW: matmuls}
            for a in adapters:
                opt = make_optimizer(a.model, dev)
                runs[a.library] = training_step(a, batch, opt, bf16=bf16, dev=dev)
            times = alternate(runs, warmup=warmup, repeat=repeat)
            del runs, matmuls
            gc.collect()
            mm = {"flops_per_s": mm_flops / median(times.pop(_MATMUL_ROW))}
            ours = median(times["specformer"])
            # the first compiled row, against each peer: what training.compile gives over it
            compiled = next((median(times[a.library]) for a in adapters if a.library.startswith("specformer+")), None)
            for a in adapters:
                t = median(times[a.library])
                peer = not a.library.startswith("specformer")
                achieved = (model_flops if peer else ours_flops) / t
                rows.append({
                    "shape": shape.name, "precision": precision, "library": a.library, "params": a.params,
                    "batch": shape.batch, "seq_len": shape.seq_len, "tokens": shape.tokens,
                    "step_ms": 1e3 * t, "times_s": times[a.library], "tokens_per_s": shape.tokens / t,
                    "speedup_of_specformer": t / ours if peer else None,
                    "speedup_of_compiled": t / compiled if peer and compiled else None,
                    "model_tflops_per_s": achieved / 1e12,
                    "matmul_tflops_per_s": mm["flops_per_s"] / 1e12,
                    "fraction_of_matmul": achieved / mm["flops_per_s"],
                    "logits_max_diff_vs_specformer": check if a.library == "transformers" else None,
                    "notes": a.notes,
                })
        del adapters
        gc.collect()
    payload = {"benchmark": "train", "machine": machine_info(dev), "libraries": libraries,
               "settings": {"optimizer": "torch.optim.AdamW(fused=True), same for every library",
                            "loss": ("mean cross-entropy over the labelled positions (all; 15% for the encoder, "
                                     "as BERT's MLM): specformer's model(labels=...) path, the peers' "
                                     "logits then F.cross_entropy in float32"),
                            "model_flops": ("3 x specformer.analysis.flops_per_token(spec, seq_len).forward x "
                                            "tokens; specformer's MLM head counted on the labelled "
                                            "positions only"),
                            "quick": args.quick},
               "results": rows}
    compiled_column = ["compiled ×"] if args.compile else []
    print_table(
        f"Training step (forward + backward + AdamW) on {dev}",
        ["shape", "precision", "library", "params", "step ms", "tokens/s", "specformer ×", *compiled_column,
         "model TFLOP/s", "of matmul"],
        [[r["shape"], r["precision"], r["library"], r["params"], r["step_ms"], r["tokens_per_s"],
          r["speedup_of_specformer"], *([r["speedup_of_compiled"]] if args.compile else []),
          r["model_tflops_per_s"], f"{100 * r['fraction_of_matmul']:.0f}%"]
         for r in rows],
    )
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
