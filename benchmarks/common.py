"""Shared pieces of the benchmarks: the shapes, the same model in each library, timing, output.

Every benchmark builds one architecture in specformer and in each peer:

* ``transformers``: the Hugging Face model produced by :func:`specformer.interop.hf.to_hf`
  from the specformer model, so the weights are copied and both compute the same logits
  (``check_same_logits`` verifies it; the smoke tests call it). Its attention is SDPA.
* ``x-transformers``: ``TransformerWrapper`` with the closest settings (decoders and
  encoders only). Its layers differ in small ways named in :data:`XT_NOTES`; weights are
  its own initialisation (dense matrix products cost the same whatever the values), and the
  parameter counts are reported so the sizes can be compared.

Runs alternate between the libraries after warm-up, in one process, rotating the order
each round, and the medians are reported with the ratio peer time / specformer time
(``speedup_of_specformer``: above 1, specformer is faster).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from specformer.builder import build_model
from specformer.specs.schema import ModelSpec
from specformer.training import allocator as _allocator

__all__ = [
    "LIBRARIES",
    "Shape",
    "SHAPES",
    "QUICK_SHAPES",
    "select_shapes",
    "Batch",
    "Adapter",
    "make_batch",
    "logits_loss",
    "MLM_FRACTION",
    "build_adapters",
    "check_same_logits",
    "available_libraries",
    "device",
    "sync",
    "alternate",
    "median",
    "machine_info",
    "write_json",
    "print_table",
    "base_parser",
    "make_optimizer",
    "peak_memory_bytes",
    "XT_NOTES",
    "setup",
    "quiet",
    "training_step",
    "build_single",
    "current_rss_bytes",
]

LIBRARIES = ("specformer", "transformers", "x-transformers")

XT_NOTES = (
    "x-transformers has no attention biases (GPT-2/BERT-style rows), a bias-less LayerNorm, "
    "its GLU input projection always has a bias, its absolute positions are scaled by "
    "d_model^-0.5, and its encoder has no BERT embedding norm, token types or MLM transform."
)


# --------------------------------------------------------------------------- shapes


def _stack(n_layers: int, heads: int, *, ffn: dict[str, Any], norm: dict[str, Any], bias: bool,
           kv_heads: int | None = None, head_dim: int | None = None,
           scale: float | None = None) -> dict[str, Any]:
    attention: dict[str, Any] = {"n_heads": heads, "bias": bias, "dropout": 0.0}
    if kv_heads is not None:
        attention["n_kv_heads"] = kv_heads
    if head_dim is not None:
        attention["head_dim"] = head_dim
    if scale is not None:
        attention["scale"] = scale
    return {
        "n_layers": n_layers,
        "attention": attention,
        "ffn": {**ffn, "dropout": 0.0},
        "norm": norm,
        "residual": {"type": "sequential", "dropout": 0.0},
    }


def gpt2_style(d: int, layers: int, heads: int, vocab: int, seq: int) -> dict[str, Any]:
    """GPT-2: learned positions, pre-norm LayerNorm, biases, GELU (tanh) MLP, tied output."""
    return {
        "name": f"gpt2-style-d{d}", "kind": "decoder", "vocab_size": vocab, "d_model": d,
        "max_seq_len": seq, "positional": {"type": "learned"},
        "decoder": _stack(layers, heads, bias=True, ffn={"type": "mlp", "activation": "gelu_tanh", "bias": True},
                          norm={"type": "layernorm", "placement": "pre", "eps": 1e-5}),
        "embedding": {"tie_output": True, "dropout": 0.0},
        "head": {"type": "lm"},
    }


def bert_style(d: int, layers: int, heads: int, vocab: int, seq: int) -> dict[str, Any]:
    """BERT: learned positions, token types, embedding LayerNorm, post-norm, GELU MLP, MLM head."""
    return {
        "name": f"bert-style-d{d}", "kind": "encoder", "vocab_size": vocab, "d_model": d,
        "max_seq_len": seq, "positional": {"type": "learned"},
        "encoder": _stack(layers, heads, bias=True, ffn={"type": "mlp", "activation": "gelu", "bias": True},
                          norm={"type": "layernorm", "placement": "post", "eps": 1e-12}),
        "embedding": {"tie_output": True, "dropout": 0.0, "segment_vocab_size": 2,
                      "norm": {"type": "layernorm", "eps": 1e-12}},
        "head": {"type": "mlm", "activation": "gelu", "eps": 1e-12, "bias": True},
    }


def t5_style(d: int, layers: int, heads: int, vocab: int, seq: int) -> dict[str, Any]:
    """T5 v1.0: relative position bias, RMSNorm pre-norm, no biases, ReLU MLP, shared tied embeddings."""
    stack = _stack(layers, heads, bias=False, head_dim=d // heads, scale=1.0,
                   ffn={"type": "mlp", "activation": "relu", "bias": False, "d_ff": 4 * d},
                   norm={"type": "rmsnorm", "placement": "pre", "eps": 1e-6})
    return {
        "name": f"t5-style-d{d}", "kind": "encoder-decoder", "vocab_size": vocab, "d_model": d,
        "max_seq_len": seq, "positional": {"type": "t5", "num_buckets": 32, "max_distance": 128},
        "encoder": stack, "decoder": stack,
        "embedding": {"tie_output": True, "share_encoder_decoder": True, "dropout": 0.0},
        "head": {"type": "lm", "bias": False, "scale_input": True},
    }


def llama_style(d: int, layers: int, heads: int, kv_heads: int, d_ff: int, vocab: int, seq: int) -> dict[str, Any]:
    """Llama: RoPE, RMSNorm pre-norm, SwiGLU, grouped-query attention, no biases, untied output."""
    return {
        "name": f"llama-style-d{d}", "kind": "decoder", "vocab_size": vocab, "d_model": d,
        "max_seq_len": seq, "positional": {"type": "rope", "base": 10000.0},
        "decoder": _stack(layers, heads, bias=False, kv_heads=kv_heads,
                          ffn={"type": "glu", "activation": "silu", "d_ff": d_ff, "bias": False},
                          norm={"type": "rmsnorm", "placement": "pre", "eps": 1e-5}),
        "embedding": {"tie_output": False, "dropout": 0.0},
        "head": {"type": "lm", "bias": False},
    }


@dataclass(frozen=True)
class Shape:
    """One architecture at one size, with the batch a training step and a prefill use."""

    name: str
    spec: dict[str, Any]
    batch: int
    seq_len: int
    larger: bool = False

    @property
    def kind(self) -> str:
        return self.spec["kind"]

    @property
    def tokens(self) -> int:
        """Tokens per step: batch x seq_len (an encoder-decoder has seq_len source and
        seq_len target tokens per row; its tokens are counted on the target side, as the
        analysis module's FLOPs per token are)."""
        return self.batch * self.seq_len

    def model_spec(self) -> ModelSpec:
        return ModelSpec.model_validate(self.spec)


V = 8192
SHAPES: tuple[Shape, ...] = (
    Shape("gpt2-style", gpt2_style(256, 4, 4, V, 256), batch=4, seq_len=256),
    Shape("bert-style", bert_style(256, 4, 4, V, 256), batch=4, seq_len=256),
    Shape("t5-style", t5_style(256, 4, 4, V, 256), batch=2, seq_len=256),
    Shape("llama-style", llama_style(512, 4, 8, 2, 1408, V, 256), batch=2, seq_len=256),
    Shape("llama-larger", llama_style(768, 6, 12, 4, 2048, V, 512), batch=1, seq_len=512, larger=True),
)

_QV = 256
QUICK_SHAPES: tuple[Shape, ...] = (
    Shape("gpt2-style", gpt2_style(32, 2, 4, _QV, 32), batch=2, seq_len=32),
    Shape("bert-style", bert_style(32, 2, 4, _QV, 32), batch=2, seq_len=32),
    Shape("t5-style", t5_style(32, 2, 4, _QV, 32), batch=2, seq_len=32),
    Shape("llama-style", llama_style(32, 2, 4, 2, 64, _QV, 32), batch=2, seq_len=32),
    Shape("llama-larger", llama_style(64, 2, 4, 2, 128, _QV, 32), batch=2, seq_len=32, larger=True),
)


def select_shapes(names: Sequence[str] | None, quick: bool) -> list[Shape]:
    pool = QUICK_SHAPES if quick else SHAPES
    if not names:
        return list(pool)
    known = {s.name: s for s in pool}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown shape {', '.join(unknown)}; choose from {', '.join(known)}")
    return [known[n] for n in names]


# --------------------------------------------------------------------------- device and timing


def device() -> torch.device:
    """CUDA when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def alternate(
    runs: dict[str, Callable[[], float]], *, warmup: int, repeat: int
) -> dict[str, list[float]]:
    """Run each callable ``warmup`` times, then ``repeat`` rounds, alternating between them
    and rotating the order every round. Each callable returns the seconds it measured."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeat):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(runs[name]())
    return times


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _proc_status_bytes(key: str) -> int | None:
    """A ``kB`` field of Linux ``/proc/self/status`` (``VmHWM``, ``VmRSS``) in bytes, or None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_memory_bytes() -> int:
    """The process's peak resident set size (Linux VmHWM, else ru_maxrss), in bytes."""
    peak = _proc_status_bytes("VmHWM")
    if peak is not None:
        return peak
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def current_rss_bytes() -> int:
    """The process's resident set size now, in bytes (0 where /proc is missing)."""
    return _proc_status_bytes("VmRSS") or 0


# --------------------------------------------------------------------------- models


MLM_FRACTION = 0.15


@dataclass
class Batch:
    """Token ids for one step: ``input_ids`` (B, T) (the source of an encoder-decoder),
    ``decoder_input_ids`` (B, T) for encoder-decoders, ``labels`` (B, T): every position
    for decoders and encoder-decoders; for encoders, as BERT's masked-LM, 15% of the
    positions and -100 (no label) elsewhere."""

    input_ids: Tensor
    labels: Tensor
    decoder_input_ids: Tensor | None = None


def make_batch(shape: Shape, dev: torch.device, *, batch: int | None = None, seq_len: int | None = None,
               seed: int = 0) -> Batch:
    b = batch or shape.batch
    t = seq_len or shape.seq_len
    g = torch.Generator().manual_seed(seed)
    vocab = shape.spec["vocab_size"]
    ids = torch.randint(3, vocab, (b, t), generator=g).to(dev)
    labels = torch.randint(3, vocab, (b, t), generator=g)
    if shape.kind == "encoder":
        labels[torch.rand(b, t, generator=g) >= MLM_FRACTION] = -100
    labels = labels.to(dev)
    dec = torch.randint(3, vocab, (b, t), generator=g).to(dev) if shape.kind == "encoder-decoder" else None
    return Batch(ids, labels, dec)


@dataclass
class Adapter:
    """One library's model behind the calls the benchmarks make.

    ``logits(batch)`` is the forward (B, T, V); ``loss(batch)`` the training forward
    to the mean cross-entropy against ``batch.labels``, as the library trains: for
    specformer its ``labels=`` path (the head's chunked loss, no (B, T, V) logits), for the
    peers their logits, then ``F.cross_entropy`` in float32 (what transformers' own loss
    functions do); ``prefill(batch)`` the
    inference pass over a whole prompt (filling the KV cache where there is one);
    ``decode(prompt, n)`` greedy-decodes ``n`` tokens with the library's KV cache and
    returns the seconds the ``n`` steps took (the prompt's prefill not included);
    ``generate(prompt, n)`` greedy-generates ``n`` tokens through the library's own
    generation function, as its users call it (prompt pass included, in the grad mode that
    function sets), and returns (seconds, the new tokens (B, n)).
    """

    library: str
    model: nn.Module
    logits: Callable[[Batch], Tensor]
    prefill: Callable[[Batch], Any]
    decode: Callable[[Batch, int], float] | None = None
    notes: str = ""
    loss: Callable[[Batch], Tensor] = None  # type: ignore[assignment]
    generate: Callable[[Batch, int], tuple[float, Tensor]] | None = None
    params: int = field(init=False)

    def __post_init__(self) -> None:
        self.params = sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())
        if self.loss is None:
            self.loss = lambda b: logits_loss(self.logits(b), b.labels)


def logits_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy in float32 over the labelled positions (-100: none)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def _timer(dev: torch.device) -> Callable[[], float]:
    sync(dev)
    return time.perf_counter


@contextmanager
def _decoding_layout(model: nn.Module, rows: int) -> Iterator[None]:
    """The model laid out for decoding ``rows`` rows at a time, as ``specformer generate`` lays
    it out once after loading a checkpoint (:mod:`specformer.components.layout`); restored after,
    so that the training and prefill runs read it as training does. Neither is timed."""
    from specformer.components.layout import lay_out_for_decoding, restore_layout

    lay_out_for_decoding(model, rows=rows)
    try:
        yield
    finally:
        restore_layout(model)


def _specformer_adapter(model: nn.Module, kind: str, dev: torch.device) -> Adapter:
    if kind == "encoder-decoder":
        def logits(b: Batch) -> Tensor:
            return model(b.input_ids, decoder_input_ids=b.decoder_input_ids).logits

        def prefill(b: Batch) -> Any:
            return model(b.input_ids, decoder_input_ids=b.decoder_input_ids, use_cache=True)

        def decode(b: Batch, n: int) -> float:
            with _decoding_layout(model, b.input_ids.shape[0]):
                enc = model.encode(b.input_ids)
                step = b.decoder_input_ids[:, :1]
                out = model(decoder_input_ids=step, encoder_hidden_states=enc, use_cache=True)
                start = _timer(dev)()
                for _ in range(n):
                    step = out.logits[:, -1].argmax(-1, keepdim=True)
                    out = model(decoder_input_ids=step, encoder_hidden_states=enc, cache=out.cache)
                sync(dev)
                return time.perf_counter() - start

        def loss(b: Batch) -> Tensor:
            return model(b.input_ids, decoder_input_ids=b.decoder_input_ids, labels=b.labels).loss

        def generate(b: Batch, n: int) -> tuple[float, Tensor]:
            from specformer.training.generate import generate_seq2seq

            with _decoding_layout(model, b.input_ids.shape[0]):
                start = _timer(dev)()
                out = generate_seq2seq(model, b.input_ids, start_id=int(b.decoder_input_ids[0, 0]), eos_id=None,
                                       max_new_tokens=n)  # (B, n), greedy
                sync(dev)
                return time.perf_counter() - start, out

        return Adapter("specformer", model, logits, prefill, decode, loss=loss, generate=generate)
    if kind == "encoder":
        def enc_logits(b: Batch) -> Tensor:
            return model(b.input_ids).logits

        def enc_loss(b: Batch) -> Tensor:
            return model(b.input_ids, labels=b.labels).loss

        return Adapter("specformer", model, enc_logits, enc_logits, None, loss=enc_loss)

    def dec_loss(b: Batch) -> Tensor:
        return model(b.input_ids, labels=b.labels).loss

    def dec_logits(b: Batch) -> Tensor:
        return model(b.input_ids).logits

    def dec_prefill(b: Batch) -> Any:
        return model(b.input_ids, use_cache=True)

    def dec_decode(b: Batch, n: int) -> float:
        with _decoding_layout(model, b.input_ids.shape[0]):
            out = model(b.input_ids, use_cache=True)
            start = _timer(dev)()
            for _ in range(n):
                step = out.logits[:, -1].argmax(-1, keepdim=True)
                out = model(step, cache=out.cache)
            sync(dev)
            return time.perf_counter() - start

    def dec_generate(b: Batch, n: int) -> tuple[float, Tensor]:
        from specformer.training.generate import generate

        with _decoding_layout(model, b.input_ids.shape[0]):
            start = _timer(dev)()
            out = generate(model, b.input_ids, max_new_tokens=n, temperature=0.0)
            sync(dev)
            return time.perf_counter() - start, out[:, b.input_ids.shape[1]:]

    return Adapter("specformer", model, dec_logits, dec_prefill, dec_decode, loss=dec_loss, generate=dec_generate)


def _hf_adapter(hf: nn.Module, kind: str, dev: torch.device) -> Adapter:
    impl = getattr(hf.config, "_attn_implementation", "?")
    notes = f"attn_implementation={impl}"
    if kind == "encoder-decoder":
        def logits(b: Batch) -> Tensor:
            return hf(input_ids=b.input_ids, decoder_input_ids=b.decoder_input_ids, use_cache=False).logits

        def prefill(b: Batch) -> Any:
            return hf(input_ids=b.input_ids, decoder_input_ids=b.decoder_input_ids, use_cache=True)

        def decode(b: Batch, n: int) -> float:
            enc = hf.get_encoder()(input_ids=b.input_ids)
            step = b.decoder_input_ids[:, :1]
            out = hf(encoder_outputs=enc, decoder_input_ids=step, use_cache=True)
            start = _timer(dev)()
            for _ in range(n):
                step = out.logits[:, -1].argmax(-1, keepdim=True)
                out = hf(encoder_outputs=enc, decoder_input_ids=step, past_key_values=out.past_key_values,
                         use_cache=True)
            sync(dev)
            return time.perf_counter() - start

        def generate(b: Batch, n: int) -> tuple[float, Tensor]:
            start = _timer(dev)()
            out = hf.generate(input_ids=b.input_ids, attention_mask=torch.ones_like(b.input_ids),
                              decoder_start_token_id=int(b.decoder_input_ids[0, 0]), **_hf_greedy(n))
            sync(dev)
            return time.perf_counter() - start, out[:, 1:]  # after the start token

        return Adapter("transformers", hf, logits, prefill, decode, notes, generate=generate)
    if kind == "encoder":
        def enc_logits(b: Batch) -> Tensor:
            return hf(input_ids=b.input_ids).logits

        return Adapter("transformers", hf, enc_logits, enc_logits, None, notes)

    def dec_logits(b: Batch) -> Tensor:
        return hf(input_ids=b.input_ids, use_cache=False).logits

    def dec_prefill(b: Batch) -> Any:
        return hf(input_ids=b.input_ids, use_cache=True)

    def dec_decode(b: Batch, n: int) -> float:
        out = hf(input_ids=b.input_ids, use_cache=True)
        start = _timer(dev)()
        for _ in range(n):
            step = out.logits[:, -1].argmax(-1, keepdim=True)
            out = hf(input_ids=step, past_key_values=out.past_key_values, use_cache=True)
        sync(dev)
        return time.perf_counter() - start

    def dec_generate(b: Batch, n: int) -> tuple[float, Tensor]:
        start = _timer(dev)()
        out = hf.generate(input_ids=b.input_ids, attention_mask=torch.ones_like(b.input_ids), **_hf_greedy(n))
        sync(dev)
        return time.perf_counter() - start, out[:, b.input_ids.shape[1]:]

    return Adapter("transformers", hf, dec_logits, dec_prefill, dec_decode, notes, generate=dec_generate)


def _hf_greedy(n: int) -> dict[str, Any]:
    """``generate()`` settings for exactly ``n`` greedy new tokens with the KV cache: no end
    token to stop at, no sampling, no beams."""
    return {"max_new_tokens": n, "do_sample": False, "num_beams": 1, "use_cache": True,
            "eos_token_id": None, "pad_token_id": 0}


def _xt_model(spec: ModelSpec) -> nn.Module | None:
    """The closest x-transformers model to ``spec``, or None (encoder-decoders)."""
    from x_transformers import Decoder, Encoder, TransformerWrapper

    if spec.kind == "encoder-decoder":
        return None
    stack = spec.decoder if spec.kind == "decoder" else spec.encoder
    att, ffn, norm = stack.attention, stack.ffn, stack.norm
    kwargs: dict[str, Any] = {
        "dim": spec.d_model,
        "depth": stack.n_layers,
        "heads": att.n_heads,
        "attn_dim_head": att.head_dim,
        "attn_flash": True,
        "ff_mult": ffn.d_ff / spec.d_model,
        "ff_no_bias": not ffn.bias,
        "pre_norm": norm.placement == "pre",
        "use_rmsnorm": norm.type == "rmsnorm",
    }
    if att.n_kv_heads != att.n_heads:
        kwargs["attn_kv_heads"] = att.n_kv_heads
    if ffn.type == "glu":
        kwargs["ff_glu"] = True
        kwargs["ff_swish"] = ffn.activation == "silu"
    rope = spec.positional.type == "rope"
    if rope:
        kwargs["rotary_pos_emb"] = True
        kwargs["rotary_emb_dim"] = att.head_dim
    layers = Decoder(**kwargs) if spec.kind == "decoder" else Encoder(**kwargs)
    return TransformerWrapper(
        num_tokens=spec.vocab_size,
        max_seq_len=spec.max_seq_len,
        attn_layers=layers,
        use_abs_pos_emb=spec.positional.type == "learned",
        tie_embedding=spec.embedding.tie_output,
        emb_dropout=0.0,
    )


def _xt_adapter(net: nn.Module, kind: str, dev: torch.device) -> Adapter:
    def logits(b: Batch) -> Tensor:
        return net(b.input_ids)

    if kind == "encoder":
        return Adapter("x-transformers", net, logits, logits, None, XT_NOTES)

    def prefill(b: Batch) -> Any:
        return net(b.input_ids, return_intermediates=True)

    def decode(b: Batch, n: int) -> float:
        # as x-transformers' own AutoregressiveWrapper.generate: the whole sequence goes in,
        # the cache holds the past, only the new position is computed
        seq = b.input_ids
        out, cache = net(seq, return_intermediates=True)
        start = _timer(dev)()
        for _ in range(n):
            step = out[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, step], dim=1)
            out, cache = net(seq, return_intermediates=True, cache=cache)
        sync(dev)
        return time.perf_counter() - start

    return Adapter("x-transformers", net, logits, prefill, decode, XT_NOTES)


def available_libraries(requested: Sequence[str] | None = None) -> list[str]:
    """The requested libraries (default: all) that are installed; specformer first."""
    import importlib.util

    wanted = list(requested) if requested else list(LIBRARIES)
    modules = {"specformer": "specformer", "transformers": "transformers", "x-transformers": "x_transformers"}
    out = []
    for lib in wanted:
        if lib not in modules:
            raise SystemExit(f"unknown library {lib!r}; choose from {', '.join(LIBRARIES)}")
        if importlib.util.find_spec(modules[lib]) is not None:
            out.append(lib)
    if "specformer" not in out:
        out.insert(0, "specformer")
    # specformer first, the peers in their usual order, whatever order they were asked in:
    # every ratio is computed against specformer's row, which must come first
    return sorted(dict.fromkeys(out), key=LIBRARIES.index)


def build_adapters(shape: Shape, dev: torch.device, libraries: Sequence[str], *, seed: int = 0) -> list[Adapter]:
    """The shape's model in each library (specformer first), in float32, train mode."""
    spec = shape.model_spec()
    torch.manual_seed(seed)
    model = build_model(spec, device=dev)
    adapters = [_specformer_adapter(model, spec.kind, dev)]
    if "transformers" in libraries:
        from specformer.interop.hf import to_hf

        hf = to_hf(model, spec).to(dev)
        adapters.append(_hf_adapter(hf, spec.kind, dev))
    if "x-transformers" in libraries:
        torch.manual_seed(seed)
        net = _xt_model(spec)
        if net is not None:
            adapters.append(_xt_adapter(net.to(dev), spec.kind, dev))
    for a in adapters:
        a.model.train()
    return adapters


def build_single(shape: Shape, dev: torch.device, library: str, *, seed: int = 0) -> Adapter | None:
    """Only one library's model (the memory benchmark measures each alone). For
    ``transformers`` the model comes from its config with its own initialisation, so that
    nothing of specformer is allocated in that process."""
    spec = shape.model_spec()
    torch.manual_seed(seed)
    if library == "specformer":
        return _specformer_adapter(build_model(spec, device=dev).train(), spec.kind, dev)
    if library == "transformers":
        import transformers

        from specformer.interop.hf import hf_auto_class
        from specformer.interop.hf_config import hf_config_from_spec

        config = transformers.AutoConfig.for_model(**hf_config_from_spec(spec))
        hf = hf_auto_class(spec).from_config(config).to(dev)
        return _hf_adapter(hf.train(), spec.kind, dev)
    net = _xt_model(spec)
    return None if net is None else _xt_adapter(net.to(dev).train(), spec.kind, dev)


def check_same_logits(adapters: Sequence[Adapter], batch: Batch, atol: float = 1e-4) -> float:
    """Largest |difference| between specformer's and transformers' logits on ``batch`` (eval
    mode, no grad); raises if above ``atol``. Proves the two models compute the same function."""
    by = {a.library: a for a in adapters}
    if "transformers" not in by:
        return 0.0
    ours, theirs = by["specformer"], by["transformers"]
    modes = [(a.model, a.model.training) for a in (ours, theirs)]
    try:
        for m, _ in modes:
            m.eval()
        with torch.no_grad():
            diff = (ours.logits(batch).float() - theirs.logits(batch).float()).abs().max().item()
    finally:
        for m, mode in modes:
            m.train(mode)
    if diff > atol:
        raise AssertionError(f"specformer and transformers disagree: max |logits difference| {diff:.2e} > {atol}")
    return diff


# --------------------------------------------------------------------------- the training step


def make_optimizer(model: nn.Module, dev: torch.device) -> torch.optim.Optimizer:
    """The same AdamW for every library: torch's fused implementation (one kernel for all
    parameters) on CPU and CUDA."""
    params = list({id(p): p for p in model.parameters()}.values())
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True)


def training_step(adapter: Adapter, batch: Batch, opt: torch.optim.Optimizer, *, bf16: bool,
                  dev: torch.device) -> Callable[[], float]:
    """A callable running forward + cross-entropy (``adapter.loss``) + backward + AdamW step;
    returns seconds."""

    def run() -> float:
        start = _timer(dev)()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = adapter.loss(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(dev)
        return time.perf_counter() - start

    return run


# --------------------------------------------------------------------------- output


def machine_info(dev: torch.device) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(dev),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "specformer": _specformer_version(),
        "malloc": "keep" if _allocator._applied else "glibc's own thresholds",
        "argv": list(sys.argv),  # how the process was started: with the settings, how to run it again
    }
    if dev.type == "cpu":  # specformer's float32 products through oneDNN (measured faster than mm here)
        from specformer.components.products import onednn_is_faster

        info["specformer_fp32_products"] = "oneDNN" if onednn_is_faster() else "torch.mm"
        # training attention: plain products where measured faster than torch's fused kernel
        from specformer.components.attention import (
            float32_attention_is_faster,
            matmul_attention_is_faster,
        )

        info["specformer_training_attention"] = {
            "bf16": "products" if matmul_attention_is_faster() else "fused kernel",
            "fp32": "products (GQA, >= 512-row blocks)" if float32_attention_is_faster() else "fused kernel",
        }
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    for mod in ("transformers", "x_transformers"):
        try:
            from importlib.metadata import version

            info[mod.replace("_", "-")] = version(mod.replace("_", "-"))
        except Exception:
            info[mod.replace("_", "-")] = None
    return info


def _specformer_version() -> str:
    """specformer's version, and its commit where it runs from a git checkout."""
    from specformer import __version__

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__} ({commit})" if commit else __version__


def write_json(path: str | Path | None, payload: dict[str, Any]) -> None:
    if path is None:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    # written whole or not at all: a full disk or a killed run leaves the file from before
    from specformer.data.cache import atomic_write_text

    atomic_write_text(p, json.dumps(payload, indent=2) + "\n")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*(_fmt(v) for v in row))
    Console(width=max(120, len(columns) * 14)).print(table)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``low`` (a repeat of 0 had no median, a
    warm-up of -3 timed a cold run, a --decode-batches 0 decoded the default batch)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    parse.__name__ = f"a whole number of at least {low}"
    return parse


def base_parser(doc: str, *, models: bool = True) -> argparse.ArgumentParser:
    """The options every benchmark takes; the description is the first paragraph of ``doc``
    (a script's docstring), whole: its first line alone may end mid-sentence. ``models``:
    the options of the benchmarks that run models (shapes, libraries, threads)."""
    p = argparse.ArgumentParser(description=" ".join(doc.split("\n\n")[0].split()))
    p.add_argument("--quick", action="store_true", help="tiny shapes and 1-2 iterations (smoke test)")
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
    if models:
        p.add_argument("--shapes", nargs="*", default=None, help="shape names (default: all)")
        p.add_argument("--libraries", nargs="*", default=None, help=f"subset of {', '.join(LIBRARIES)}")
        p.add_argument("--threads", type=at_least(1), default=None, help="torch.set_num_threads (default: torch's)")
        p.add_argument("--malloc", choices=["keep", "glibc"], default="keep",
                       help="keep: freed memory kept for the next step (glibc's thresholds raised, for every "
                            "library in the process), as specformer train runs; glibc: glibc's own thresholds")
    return p


def quiet() -> None:
    """Silence the peers' config and training-advice warnings (they do not change the work)."""
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass
    try:
        from loguru import logger

        logger.disable("x_transformers")
    except ImportError:
        pass


def apply_malloc(args: argparse.Namespace) -> None:
    """``--malloc keep``: freed memory kept for the next step, as ``specformer train`` keeps it."""
    if getattr(args, "malloc", "glibc") == "keep":
        _allocator.keep_freed_memory()


def setup(args: argparse.Namespace) -> torch.device:
    if args.threads:
        torch.set_num_threads(args.threads)
    apply_malloc(args)
    quiet()
    return device()
