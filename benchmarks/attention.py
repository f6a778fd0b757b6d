"""Attention alone, forward and backward as a training step runs it: specformer's ``sdpa``
backend (which chooses its own path on a CPU: torch's fused kernel, or the same attention in
matrix products where a measurement found that faster) against torch's
``scaled_dot_product_attention``, which transformers calls, on the same tensors, alternating.
Each shape's self-attention (causal for decoders, bidirectional for the encoder; the
t5-style shape's trained position bias has no fused kernel and is left out), in float32 and
in bfloat16, queries, keys and values laid out as a fused projection gives them.

    python -m benchmarks.attention [--quick] [--shapes llama-larger ...] [--precisions fp32 bf16]
        [--dims 1,32,8,1024,128 ...] [--out attention.json]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn import functional as F

from benchmarks.common import (
    _timer,
    alternate,
    at_least,
    base_parser,
    machine_info,
    median,
    print_table,
    select_shapes,
    setup,
    sync,
    write_json,
)

__all__ = ["main", "attention_inputs"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def attention_inputs(batch: int, heads: int, kv_heads: int, seq_len: int, head_dim: int, dtype: torch.dtype,
                     dev: torch.device, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q (B, H, T, Dh), k and v (B, Hkv, T, Dh) requiring grad, and an output gradient, each a
    (B, T, heads, Dh) tensor seen as (B, heads, T, Dh): the layout of a fused projection's
    output split into heads."""
    gen = torch.Generator().manual_seed(seed)

    def heads_of(n: int, grad: bool) -> torch.Tensor:
        x = torch.randn(batch, seq_len, n, head_dim, generator=gen).to(dev, dtype).transpose(1, 2)
        return x.requires_grad_() if grad else x

    return heads_of(heads, True), heads_of(kv_heads, True), heads_of(kv_heads, True), heads_of(heads, False)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float
            ) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    """specformer's ``sdpa`` backend and torch's SDPA on the same tensors."""
    from specformer.components.attention import sdpa_attention

    def ours() -> torch.Tensor:
        return sdpa_attention(q, k, v, mask=None, is_causal=causal, scale=scale, dropout=0.0)[0]

    def fused() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                              enable_gqa=k.shape[1] < q.shape[1])

    return ours, fused


def _timed(attend: Callable[[], torch.Tensor], inputs: tuple[torch.Tensor, ...], grad: torch.Tensor,
           dev: torch.device) -> Callable[[], float]:
    """A callable timing forward + backward (the inputs' gradients) of ``attend``; seconds."""

    def run() -> float:
        start = _timer(dev)()  # after the device's queued work
        torch.autograd.grad(attend(), inputs, grad)
        sync(dev)
        return time.perf_counter() - start

    return run


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = base_parser(__doc__)
    p.add_argument("--precisions", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    p.add_argument("--warmup", type=at_least(0), default=None)
    p.add_argument("--repeat", type=at_least(1), default=None)
    p.add_argument("--dims", nargs="*", default=[], metavar="B,H,HKV,T,DH",
                   help="also these causal attentions (batch, heads, key/value heads, length, head size), "
                        "e.g. 1,32,8,1024,128")
    args = p.parse_args(argv)
    if args.libraries:
        p.error("--libraries: the attention benchmark times specformer's attention against torch's "
                "scaled_dot_product_attention, no library's model")
    dev = setup(args)
    from specformer.components import attention

    cases: list[tuple[str, tuple[int, ...], bool]] = []  # (name, (B, H, Hkv, T, Dh), causal)
    for shape in select_shapes(args.shapes, args.quick):
        spec = shape.model_spec()
        if spec.positional.type == "t5":
            continue
        att = (spec.decoder if spec.kind == "decoder" else spec.encoder).attention
        cases.append((shape.name, (shape.batch, att.n_heads, att.n_kv_heads, shape.seq_len, att.head_dim),
                      spec.kind == "decoder"))
    for text in args.dims:
        try:
            dims = tuple(int(n) for n in text.split(","))
        except ValueError:
            dims = ()
        if len(dims) != 5 or min(dims) < 1 or dims[1] % dims[2]:
            raise SystemExit(f"--dims {text}: give B,H,HKV,T,DH, five whole numbers above 0, with HKV dividing H")
        cases.append(("dims", dims, True))
    rows: list[dict[str, Any]] = []
    for name, dims, causal in cases:
        scale = dims[4] ** -0.5
        for precision in args.precisions:
            q, k, v, grad = attention_inputs(*dims, DTYPES[precision], dev)
            ours, fused = _attend(q, k, v, causal=causal, scale=scale)
            with torch.no_grad():
                diff = (ours() - fused()).abs().max().item()
            block = attention._matmul_block_rows(q, k, v, is_causal=causal)
            warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
            repeat = args.repeat if args.repeat is not None else (1 if args.quick else 15)
            runs = {"specformer": _timed(ours, (q, k, v), grad, dev), "torch": _timed(fused, (q, k, v), grad, dev)}
            times = alternate(runs, warmup=warmup, repeat=repeat)
            t_ours, t_torch = median(times["specformer"]), median(times["torch"])
            rows.append({
                "shape": name, "precision": precision, "batch": dims[0], "heads": dims[1],
                "kv_heads": dims[2], "seq_len": dims[3], "head_dim": dims[4], "causal": causal,
                "specformer_path": f"products, blocks of {min(block, dims[3])} rows" if block else "fused kernel",
                "specformer_ms": 1e3 * t_ours, "torch_ms": 1e3 * t_torch, "speedup_of_specformer": t_torch / t_ours,
                "times_s": times, "output_max_diff": diff,
            })
    payload = {"benchmark": "attention", "machine": machine_info(dev),
               "settings": {"what": "forward + backward of one layer's self-attention (torch.autograd.grad)",
                            "peer": "torch.nn.functional.scaled_dot_product_attention (enable_gqa)",
                            "quick": args.quick},
               "results": rows}
    print_table(
        f"Attention, forward + backward, on {dev}",
        ["shape", "precision", "B, H / Hkv, T, Dh", "specformer path", "specformer ms", "torch SDPA ms", "specformer ×"],
        [[r["shape"], r["precision"], f"{r['batch']}, {r['heads']} / {r['kv_heads']}, {r['seq_len']}, {r['head_dim']}",
          r["specformer_path"], r["specformer_ms"], r["torch_ms"], r["speedup_of_specformer"]] for r in rows],
    )
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
