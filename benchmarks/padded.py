"""Training on padded batches of changing length: forward + cross-entropy + backward + AdamW
step over a cycle of batches whose rows are between a quarter of the shape's sequence length
and all of it, each batch padded to its longest row, as (source, target) pairs and SFT data
are; tokens/s of real tokens, specformer against transformers, alternating in one process.

With ``--compile`` specformer also runs compiled as ``training.compile`` runs it: the
positional tables warmed, the lengths marked dynamic from the first batch (one graph for
every length), the causal stack's right-padded mask left out (``call_compiled``). The decoder
shapes train as a causal LM with an attention mask (SFT), the encoder shape as a masked LM on
padded texts (15% of the real tokens labelled), the encoder-decoder shape as sequence to
sequence (its tokens counted on the target side, as ``benchmarks.train`` counts them). Every
library steps through the same batches, with weights copied.

    python -m benchmarks.padded [--quick] [--compile] [--shapes t5-style ...] [--out padded.json]
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.common import (
    Adapter,
    Shape,
    alternate,
    at_least,
    available_libraries,
    base_parser,
    build_adapters,
    logits_loss,
    machine_info,
    make_optimizer,
    median,
    print_table,
    select_shapes,
    setup,
    training_step,
    write_json,
)
from benchmarks.train import compiled_adapter
from specformer.builder.lightning import call_compiled
from specformer.training.objectives import CausalLM, MaskedLM, Seq2Seq

__all__ = ["main", "padded_batches", "real_tokens"]

_LIBRARIES = ("specformer", "transformers")
_COMPILED = "specformer+compile"


def padded_batches(shape: Shape, dev: torch.device, count: int, *, seed: int = 0) -> list[dict[str, Tensor]]:
    """``count`` batches of ``shape.batch`` rows, each row between T/4 and T tokens long
    (T: the shape's sequence length), padded on the right to the batch's longest: the
    keyword arguments of specformer's forward (``labels`` -100 on padding; an encoder's on all
    but 15% of the real tokens, as a masked LM's)."""
    g = torch.Generator().manual_seed(seed)
    vocab, b, t = shape.spec["vocab_size"], shape.batch, shape.seq_len

    def padded() -> tuple[Tensor, Tensor]:
        lengths = torch.randint(max(1, t // 4), t + 1, (b,), generator=g)
        width = int(lengths.max())
        mask = (torch.arange(width) < lengths[:, None]).long()  # (B, width): 1 = real token
        return torch.randint(3, vocab, (b, width), generator=g) * mask, mask

    batches = []
    for _ in range(count):
        ids, mask = padded()
        if shape.kind == "encoder-decoder":
            dec, dec_mask = padded()
            batch = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec,
                     "decoder_attention_mask": dec_mask,
                     "labels": torch.randint(3, vocab, dec.shape, generator=g).masked_fill(dec_mask == 0, -100)}
        else:
            unlabelled = mask == 0
            if shape.kind == "encoder":
                unlabelled |= torch.rand(ids.shape, generator=g) >= 0.15
            batch = {"input_ids": ids, "attention_mask": mask,
                     "labels": torch.randint(3, vocab, ids.shape, generator=g).masked_fill(unlabelled, -100)}
        batches.append({k: v.to(dev) for k, v in batch.items()})
    return batches


def real_tokens(batches: Sequence[dict[str, Tensor]]) -> int:
    """The unpadded tokens of the batches: the targets' of an encoder-decoder, else the inputs'."""
    key = "decoder_attention_mask" if "decoder_attention_mask" in batches[0] else "attention_mask"
    return int(sum(int(b[key].sum()) for b in batches))


def _specformer_loss(model: Callable[..., Any], *, kind: str, compiled: bool
                     ) -> Callable[[dict[str, Tensor]], Tensor]:
    # compiled: as SpecModule.forward calls it under training.compile (one graph for every
    # length; a right-padded mask of the causal stack left out in training)
    masks = {"encoder-decoder": Seq2Seq, "encoder": MaskedLM}.get(kind, CausalLM).causal_masks

    def loss(batch: dict[str, Tensor]) -> Tensor:
        if compiled:
            return call_compiled(model, (), batch, padded=True, training=model.training, causal_masks=masks).loss
        return model(**batch).loss

    return loss


def _hf_loss(hf: nn.Module) -> Callable[[dict[str, Tensor]], Tensor]:
    # transformers' logits, then the float32 cross-entropy its loss functions compute (as
    # benchmarks.train); the labels are aligned with the inputs already
    def loss(batch: dict[str, Tensor]) -> Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return logits_loss(hf(**inputs, use_cache=False).logits, batch["labels"])

    return loss


def _cycle(adapter: Adapter, batches: Sequence[dict[str, Tensor]], *, bf16: bool, dev: torch.device
           ) -> Callable[[], float]:
    """One pass over the batches, a training step each (``adapter.loss`` reads a padded
    batch); returns the seconds of the steps."""
    opt = make_optimizer(adapter.model, dev)
    steps = [training_step(adapter, batch, opt, bf16=bf16, dev=dev) for batch in batches]
    return lambda: sum(step() for step in steps)


def _same_loss(adapters: Sequence[Adapter], batch: dict[str, Tensor]) -> float:
    """The largest difference of the libraries' float32 losses on one padded batch (the
    weights are copied, so it is rounding alone: the padding is masked alike)."""
    with torch.no_grad():
        values = [float(a.loss(batch)) for a in adapters]
    return max(values) - min(values)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = base_parser(__doc__)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                   help="fp32; bf16 (float32 weights, bfloat16 autocast)")
    p.add_argument("--batches", type=at_least(1), default=None, help="batches in the cycle (default: 6; --quick: 3)")
    p.add_argument("--warmup", type=at_least(0), default=None, help="untimed passes over the cycle (default: 1)")
    p.add_argument("--repeat", type=at_least(1), default=None, help="timed passes, alternating libraries (default: 5)")
    p.add_argument("--compile", action="store_true",
                   help="also time specformer compiled as training.compile runs it (compile time excluded)")
    args = p.parse_args(argv)
    dev = setup(args)
    if args.libraries and set(args.libraries) - set(_LIBRARIES):
        p.error(f"--libraries: the padded benchmark runs {' and '.join(_LIBRARIES)} (x-transformers has no padded "
                f"batches with a mask of its own), not {', '.join(sorted(set(args.libraries) - set(_LIBRARIES)))}")
    libraries = [lib for lib in available_libraries(args.libraries) if lib in _LIBRARIES]
    shapes = select_shapes(args.shapes, args.quick)
    count = args.batches or (3 if args.quick else 6)
    warmup = args.warmup if args.warmup is not None else 1
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        batches = padded_batches(shape, dev, count)
        tokens = real_tokens(batches)
        # each library's adapter, its loss reading a padded batch
        adapters = [replace(a, loss=_specformer_loss(a.model, kind=shape.kind, compiled=False) if a.library == "specformer"
                            else _hf_loss(a.model)) for a in build_adapters(shape, dev, libraries)]
        difference = _same_loss(adapters, batches[0])
        if args.compile:  # the tables warmed, the same module and weights (benchmarks.train's row)
            traced = compiled_adapter(adapters[0], shape.kind, dev)
            adapters.append(replace(traced, loss=_specformer_loss(traced.model, kind=shape.kind, compiled=True)))
        for precision in args.precisions:
            bf16 = precision == "bf16"
            runs = {a.library: _cycle(a, batches, bf16=bf16, dev=dev) for a in adapters}
            times = alternate(runs, warmup=warmup, repeat=repeat)
            ours = median(times["specformer"])
            compiled = median(times[_COMPILED]) if _COMPILED in times else None
            for name, seconds in times.items():
                t = median(seconds)
                peer = not name.startswith("specformer")
                rows.append({
                    "shape": shape.name, "precision": precision, "library": name, "batches": count,
                    "batch": shape.batch, "seq_len": shape.seq_len,
                    "widths": [int(b["labels"].shape[1]) for b in batches], "tokens": tokens,
                    "cycle_ms": 1e3 * t, "times_s": seconds, "tokens_per_s": tokens / t,
                    "speedup_of_specformer": t / ours if peer else None,
                    "speedup_of_compiled": t / compiled if peer and compiled else None,
                    "loss_max_diff_fp32": difference if name == "transformers" else None,
                })
            del runs
            gc.collect()
        del adapters
        gc.collect()
    payload = {"benchmark": "padded", "machine": machine_info(dev), "libraries": libraries,
               "settings": {"optimizer": "torch.optim.AdamW(fused=True), same for every library",
                            "batches": ("rows of T/4 to T tokens (uniform), padded on the right to the "
                                        "batch's longest; labels -100 on padding (the encoder's on all but "
                                        "15% of the real tokens); the same batches for every library"),
                            "loss": ("mean cross-entropy over the real tokens: specformer's "
                                     "model(labels=...) path, transformers' logits then F.cross_entropy "
                                     "in float32"),
                            "compile": args.compile, "quick": args.quick},
               "results": rows}
    compiled_column = ["compiled ×"] if args.compile else []
    print_table(
        f"Training on padded batches of changing length (forward + backward + AdamW) on {dev}",
        ["shape", "precision", "library", "widths", "cycle ms", "tokens/s", "specformer ×", *compiled_column],
        [[r["shape"], r["precision"], r["library"], f"{min(r['widths'])}-{max(r['widths'])}", r["cycle_ms"],
          r["tokens_per_s"], r["speedup_of_specformer"], *([r["speedup_of_compiled"]] if args.compile else [])]
         for r in rows],
    )
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
