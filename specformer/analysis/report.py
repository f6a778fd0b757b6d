"""One spec's numbers in one object: parameters, FLOPs, KV cache and training memory.

:meth:`SpecReport.to_dict` is the JSON that ``specformer show --format json`` prints;
its keys are stable and documented in ``docs/analysis.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specformer.analysis.flops import Count, FlopCounts, flops_per_token
from specformer.analysis.memory import (
    MemoryEstimate,
    cross_kv_cache_bytes_per_source_token,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    memory_estimate,
    precision,
)
from specformer.analysis.params import ParamCounts, as_spec, count_parameters, plugin_components

__all__ = ["PositionTableWarning", "SpecReport", "analyze", "architecture_rows", "past_position_table"]


class PositionTableWarning(UserWarning):
    """A length past a spec's learned position table: the model cannot run there, and the
    numbers computed at it are what it would cost."""


def past_position_table(spec: Any, seq_len: int | None) -> int | None:
    """The rows of ``spec``'s learned position table when ``seq_len`` runs past them, else
    None (no learned table, or a length within it: the other schemes extend)."""
    pos = spec.positional
    if seq_len is None or pos.type != "learned":
        return None
    rows = (pos.max_positions - pos.offset) if pos.max_positions is not None else spec.max_seq_len
    return rows if seq_len > rows else None


@dataclass(frozen=True)
class SpecReport:
    """Everything ``show`` prints about one spec."""

    spec: Any
    params: ParamCounts
    flops: FlopCounts
    kv_cache_bytes_per_token: int
    kv_cache_bytes: int  # at memory.seq_len × memory.batch, sliding windows capped
    cross_kv_cache_bytes_per_source_token: int
    kv_dtype: str
    memory: MemoryEstimate
    # decoder attention built from a plugin's type, left out of the three KV-cache figures
    kv_cache_not_counted: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        # one line: the dataclass repr would write out the whole spec
        missing = {**self.flops.not_counted, **self.kv_cache_not_counted, **self.memory.not_counted}
        # figures that leave a plugin's part out say so: they are lower bounds
        left_out = f", not counted: {', '.join(missing)}" if missing else ""
        return (f"SpecReport({self.spec.name!r}, params={self.params.total:,}, "
                f"forward_flops_per_token={self.flops.forward:,}, "
                f"kv_cache_bytes_per_token={self.kv_cache_bytes_per_token:,}, "
                f"training_memory_bytes={self.memory.total:,}{left_out})")

    def to_markdown(self) -> str:
        """The tables ``specformer show --format markdown`` prints."""
        from specformer.cli.analysis_cmds import report_markdown

        return report_markdown(self)

    def _repr_markdown_(self) -> str:  # how Jupyter displays it
        return self.to_markdown()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "kind": self.spec.kind,
            "architecture": architecture_rows(self.spec),
            "params": self.params.to_dict(),
            "flops_per_token": self.flops.to_dict(),
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "kv_cache_bytes": self.kv_cache_bytes,
            "cross_kv_cache_bytes_per_source_token": self.cross_kv_cache_bytes_per_source_token,
            "kv_cache_dtype": self.kv_dtype,
            "kv_cache_not_counted": dict(self.kv_cache_not_counted),
            "memory": self.memory.to_dict(),
        }


def analyze(
    spec: Any, *, batch: int = 1, seq_len: int | None = None, dtype: str = "bf16-mixed", count: Count = "needed"
) -> SpecReport:
    """Parameters, FLOPs/token, KV cache/token and training memory of ``spec``.

    ``dtype`` is the training precision (``fp32``, ``bf16-mixed``, ``16-mixed``,
    ``bf16-true``, ``16-true``; ``bf16`` and ``16`` are the mixed ones, as in Lightning);
    the KV cache is counted in its activation dtype. ``count`` is :func:`flops_per_token`'s:
    ``"needed"`` attention scores (the keys each query's mask allows) or ``"executed"``
    (every query against every key, as a dense kernel computes).

    A spec with a type registered by a plugin gets its parameters counted from the model
    built on the meta device; the FLOPs, KV cache and memory its module alone knows are left
    out and the parts named in ``flops.not_counted``, ``kv_cache_not_counted`` and
    ``memory.not_counted``.

    A ``seq_len`` past the spec's learned position table warns
    (:class:`PositionTableWarning`): that model cannot run at that length.
    """
    spec = as_spec(spec)
    p = precision(dtype)
    memory = memory_estimate(spec, batch=batch, seq_len=seq_len, dtype=p.name)
    rows = past_position_table(spec, memory.seq_len)
    if rows is not None:
        import warnings

        warnings.warn(f"seq_len {memory.seq_len:,} is past {spec.name}'s learned position table ({rows:,} "
                      "positions): the model cannot run at that length; the numbers are what it would cost",
                      PositionTableWarning, stacklevel=2)
    kv_dtype = {8: "fp64", 4: "fp32"}.get(p.activation, "bf16" if "bf16" in p.name else "fp16")
    kv_plugins = {k: v for k, v in plugin_components(spec).items()
                  if k in ("decoder.attention", "decoder.cross_attention")}
    return SpecReport(
        spec=spec,
        params=count_parameters(spec),
        flops=flops_per_token(spec, seq_len, count=count),
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(spec, kv_dtype, skip_plugins=True),
        kv_cache_bytes=kv_cache_bytes(spec, seq_len=memory.seq_len, batch=memory.batch, dtype=kv_dtype,
                                      skip_plugins=True),
        cross_kv_cache_bytes_per_source_token=cross_kv_cache_bytes_per_source_token(spec, kv_dtype,
                                                                                    skip_plugins=True),
        kv_dtype=kv_dtype,
        memory=memory,
        kv_cache_not_counted=kv_plugins,
    )


def _positional(spec: Any, attention: Any = None) -> str:
    """The positional scheme as a layer with ``attention`` sees it: a windowed layer of a
    rope with ``local_base`` rotates with that base, unscaled (Gemma 3's local layers)."""
    pos = spec.positional
    if pos.type == "learned":
        return f"learned ({pos.rows(spec.max_seq_len)} rows)"
    if pos.type == "rope":
        frac = "" if pos.fraction == 1.0 else f", {pos.fraction:g} of head_dim"
        dims = sorted({stack.attention.head_dim for _, stack in spec.stacks() if stack.attention.head_dim})
        if frac and len(dims) == 1:  # the features rotated: int(head_dim × fraction), as transformers counts them
            frac += f": {int(dims[0] * pos.fraction)} of {dims[0]}"
        if pos.local_base is not None and getattr(attention, "sliding_window", None) is not None:
            return f"rope (local base {pos.local_base:g}{frac})"
        scaling = ""
        if pos.scaling is not None:
            scaling = f", {pos.scaling.type} x{pos.scaling.factor:g}"
            original = getattr(pos.scaling, "original_max_position_embeddings", None)
            scaling += f" of {original}" if original is not None else ""
        return f"rope (base {pos.base:g}{frac}{scaling})"
    if pos.type == "t5":
        return f"t5 ({pos.num_buckets} buckets, max distance {pos.max_distance})"
    return pos.type


def architecture_rows(spec: Any) -> list[dict[str, Any]]:
    """One row per stack (and per distinct layer group of a heterogeneous stack)."""
    rows: list[dict[str, Any]] = []
    for role, stack in spec.stacks():
        groups: list[tuple[list[int], Any]] = []
        for i in range(stack.n_layers):
            layer = stack.layer(i)
            if groups and groups[-1][1] == layer:
                groups[-1][0].append(i)
            else:
                groups.append(([i], layer))
        for indices, layer in groups:
            att, ffn, norm = layer.attention, layer.ffn, layer.norm
            span = f"{indices[0]}" if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"
            label = role if len(groups) == 1 else f"{role}[{span}]"
            attention = f"{att.n_heads}/{att.n_kv_heads}"
            extras = []
            if att.type != "mha":
                extras.append(f"attention {att.type}")
            if att.sliding_window is not None:
                extras.append(f"window {att.sliding_window}")
            if getattr(att, "qk_norm", "none") != "none":
                extras.append(f"qk-{att.qk_norm}")
            cross = layer.cross_attention
            if cross is not None and role == "decoder" and spec.kind == "encoder-decoder":
                # its heads, where they are not the self-attention's (a cross-attention ablation)
                sizes = "" if (cross.n_heads, cross.n_kv_heads) == (att.n_heads, att.n_kv_heads) \
                    else f" {cross.n_heads}/{cross.n_kv_heads}"
                if cross.head_dim != att.head_dim:
                    sizes += f" head_dim {cross.head_dim}"
                extras.append(f"cross-attn{sizes}")
            if layer.residual.type == "parallel":
                extras.append("parallel, one norm" if layer.residual.shared_norm else "parallel")
            rows.append(
                {
                    "stack": label,
                    "layers": len(indices),
                    "d_model": spec.d_model,
                    "heads": att.n_heads,
                    "kv_heads": att.n_kv_heads,
                    "head_dim": att.head_dim,
                    "heads_text": attention,
                    "d_ff": getattr(ffn, "d_ff", None),  # a plugin's FFN may size itself otherwise
                    "ffn": " ".join(str(x) for x in (ffn.type, getattr(ffn, "activation", None)) if x),
                    "norm": f"{norm.type} ({norm.placement}{'' if getattr(norm, 'weight', True) else ', no gain'})",
                    "positional": _positional(spec, att),
                    "extras": ", ".join(extras),
                }
            )
    return rows
