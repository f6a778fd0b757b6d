"""Residual wiring checked with forward hooks: post-norm LN(x + F(x)), pre-norm
x + F(LN(x)) with a final norm, parallel x + attn(n1(x)) + ffn(n2(x))."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from specformer.builder import build_model
from specformer.components import (
    OutputNormBlock,
    ParallelBlock,
    PostNormBlock,
    PreNormBlock,
    SandwichBlock,
)
from specformer.specs.schema import ModelSpec

Tiny = Callable[..., ModelSpec]


def _record(block: nn.Module) -> dict[str, tuple[Any, Any]]:
    seen: dict[str, tuple[Any, Any]] = {}
    for name in ("attn_norm", "self_attn", "ffn_norm", "ffn"):
        if getattr(block, name) is None:  # a parallel block's one norm: attn_norm alone
            continue
        getattr(block, name).register_forward_hook(
            lambda m, args, out, name=name: seen.__setitem__(name, (args[0], out))
        )
    block.register_forward_hook(lambda m, args, out: seen.__setitem__("block", (args[0], out[0])))
    return seen


def _run(model: nn.Module) -> None:
    with torch.no_grad():
        model(torch.randint(0, 61, (2, 7)))


def test_post_norm_is_layernorm_of_x_plus_sublayer(tiny: Tiny) -> None:
    model = build_model(tiny(stack={"norm": {"placement": "post"}})).eval()
    block = model.decoder.layers[1]
    assert isinstance(block, PostNormBlock)
    assert model.decoder.final_norm is None  # post-norm: no final norm by default
    seen = _record(block)
    _run(model)
    x = seen["block"][0]
    attn_out = seen["self_attn"][1][0]
    assert torch.equal(seen["self_attn"][0], x)  # the sublayer reads x itself
    assert torch.allclose(seen["attn_norm"][0], x + attn_out, atol=1e-6)  # LN(x + F(x))
    h = seen["attn_norm"][1]
    assert torch.equal(seen["ffn"][0], h)
    assert torch.allclose(seen["ffn_norm"][0], h + seen["ffn"][1], atol=1e-6)
    assert torch.equal(seen["block"][1], seen["ffn_norm"][1])  # the block ends in the norm


def test_pre_norm_is_x_plus_sublayer_of_layernorm_with_a_final_norm(tiny: Tiny) -> None:
    model = build_model(tiny(stack={"norm": {"placement": "pre"}})).eval()
    block = model.decoder.layers[1]
    assert isinstance(block, PreNormBlock)
    seen = _record(block)
    final: dict[str, Any] = {}
    model.decoder.final_norm.register_forward_hook(lambda m, a, o: final.update(inp=a[0], out=o))
    _run(model)
    x = seen["block"][0]
    assert torch.equal(seen["attn_norm"][0], x)
    assert torch.equal(seen["self_attn"][0], seen["attn_norm"][1])  # F(LN(x))
    h = x + seen["self_attn"][1][0]
    assert torch.allclose(seen["ffn_norm"][0], h, atol=1e-6)
    assert torch.equal(seen["ffn"][0], seen["ffn_norm"][1])
    assert torch.allclose(seen["block"][1], h + seen["ffn"][1], atol=1e-6)
    assert torch.equal(final["inp"], seen["block"][1])  # final norm after the last layer


def test_final_norm_output_is_the_hidden_state(tiny: Tiny) -> None:
    model = build_model(tiny()).eval()
    final: dict[str, Any] = {}
    model.decoder.final_norm.register_forward_hook(lambda m, a, o: final.update(out=o))
    out = model(torch.randint(0, 61, (1, 4)))
    assert torch.equal(out.hidden_states, final["out"])


def test_parallel_residual_is_neox_style(tiny: Tiny) -> None:
    model = build_model(tiny(stack={"residual": {"type": "parallel"}})).eval()
    block = model.decoder.layers[0]
    assert isinstance(block, ParallelBlock)
    seen = _record(block)
    _run(model)
    x = seen["block"][0]
    assert torch.equal(seen["attn_norm"][0], x) and torch.equal(seen["ffn_norm"][0], x)
    assert torch.equal(seen["ffn"][0], seen["ffn_norm"][1])
    expected = x + seen["self_attn"][1][0] + seen["ffn"][1]
    assert torch.allclose(seen["block"][1], expected, atol=1e-6)


def test_sandwich_norms_normalise_each_sublayer_output_before_the_sum(tiny: Tiny) -> None:
    model = build_model(tiny(stack={"norm": {"placement": "sandwich"}})).eval()
    block = model.decoder.layers[0]
    assert isinstance(block, SandwichBlock) and model.decoder.final_norm is not None  # final on by default
    seen = _record(block)
    for name in ("attn_post_norm", "ffn_post_norm"):
        getattr(block, name).register_forward_hook(lambda m, a, o, name=name: seen.__setitem__(name, (a[0], o)))
    _run(model)
    x = seen["block"][0]
    assert torch.equal(seen["attn_norm"][0], x)
    assert torch.equal(seen["attn_post_norm"][0], seen["self_attn"][1][0])  # norm'(attn(norm(x)))
    h = x + seen["attn_post_norm"][1]
    assert torch.allclose(seen["ffn_norm"][0], h, atol=1e-6)
    assert torch.equal(seen["ffn_post_norm"][0], seen["ffn"][1])
    assert torch.allclose(seen["block"][1], h + seen["ffn_post_norm"][1], atol=1e-6)


def test_output_norms_normalise_each_sublayer_output_and_never_the_stream(tiny: Tiny) -> None:
    model = build_model(tiny(stack={"norm": {"placement": "output"}})).eval()
    block = model.decoder.layers[0]
    assert isinstance(block, OutputNormBlock) and model.decoder.final_norm is not None  # final on by default
    seen = _record(block)
    _run(model)
    x = seen["block"][0]
    assert torch.equal(seen["self_attn"][0], x)  # the sublayer reads the stream itself
    assert torch.equal(seen["attn_norm"][0], seen["self_attn"][1][0])  # x + norm(attn(x))
    h = x + seen["attn_norm"][1]
    assert torch.allclose(seen["ffn"][0], h, atol=1e-6)
    assert torch.equal(seen["ffn_norm"][0], seen["ffn"][1])
    assert torch.allclose(seen["block"][1], h + seen["ffn_norm"][1], atol=1e-6)


def test_parallel_residual_with_one_norm_is_gptj_style(tiny: Tiny) -> None:
    model = build_model(tiny(stack={"residual": {"type": "parallel", "shared_norm": True}})).eval()
    block = model.decoder.layers[0]
    assert isinstance(block, ParallelBlock) and block.ffn_norm is None
    assert not any(".ffn_norm." in name for name in model.state_dict())
    seen = _record(block)
    _run(model)
    x, h = seen["block"][0], seen["attn_norm"][1]
    assert torch.equal(seen["attn_norm"][0], x)
    assert torch.equal(seen["self_attn"][0], h) and torch.equal(seen["ffn"][0], h)  # one norm feeds both
    expected = x + seen["self_attn"][1][0] + seen["ffn"][1]
    assert torch.allclose(seen["block"][1], expected, atol=1e-6)
    # the norm's gain takes the gradient of both branches
    ids = torch.randint(0, 61, (2, 5))
    gain = block.attn_norm.weight
    (both,) = torch.autograd.grad(model(ids).logits.sum(), gain)
    assert torch.isfinite(both).all() and both.abs().sum() > 0
    with torch.no_grad():  # silencing the FFN changes that gradient: it flowed through both branches
        for p in block.ffn.down_proj.parameters():
            p.zero_()
    (attention_only,) = torch.autograd.grad(model(ids).logits.sum(), gain)
    assert attention_only.abs().sum() > 0 and not torch.allclose(attention_only, both)


@pytest.mark.parametrize(
    "changes",
    [
        {"stack": {"residual": {"dropout": 0.5}}},
        {"stack": {"ffn": {"dropout": 0.5}}},
        {"stack": {"ffn": {"type": "glu", "activation": "silu", "dropout": 0.5}}},
        {"embedding": {"dropout": 0.5}},
    ],
    ids=["residual", "mlp", "glu", "embedding"],
)
def test_dropout_is_active_only_in_training(tiny: Tiny, changes: dict[str, Any]) -> None:
    # dropout modules are skipped where they would do nothing (eval, p = 0): they must
    # still act in training with p > 0
    model = build_model(tiny(**changes))
    ids = torch.randint(0, 61, (2, 7))
    model.eval()
    assert torch.equal(model(ids).logits, model(ids).logits)
    model.train()
    assert not torch.allclose(model(ids).logits, model(ids).logits)


def test_final_dropout_follows_the_final_norm_in_training_only(tiny: Tiny) -> None:
    # T5 drops out the stack output after its final norm; every other dropout is 0 here
    model = build_model(tiny("encoder-decoder", stack={"final_dropout": 0.5}))
    final: dict[str, Any] = {}
    model.encoder.final_norm.register_forward_hook(lambda m, a, o: final.update(out=o))
    ids = torch.randint(0, 61, (2, 7))
    model.eval()
    assert torch.equal(model.encode(ids), final["out"])
    model.train()
    encoded = model.encode(ids)
    dropped = encoded == 0
    assert 0.3 < dropped.float().mean().item() < 0.7
    assert torch.allclose(encoded[~dropped], 2 * final["out"][~dropped])  # inverted dropout scaling


def test_overrides_build_the_right_module_per_layer(tiny: Tiny) -> None:
    spec = tiny(
        stack={
            "n_layers": 4,
            "overrides": [
                {"layers": "0-1", "attention": {"sliding_window": 3}},
                {"layers": [3], "ffn": {"type": "glu", "d_ff": 48}, "attention": {"n_kv_heads": 1}},
            ],
        }
    )
    model = build_model(spec)
    layers = model.decoder.layers
    assert [layer.self_attn.sliding_window for layer in layers] == [3, 3, None, None]
    assert [type(layer.ffn).__name__ for layer in layers] == ["MLP", "MLP", "MLP", "GLU"]
    assert layers[3].ffn.gate_proj.weight.shape == (48, 32)
    assert [layer.self_attn.n_kv_heads for layer in layers] == [2, 2, 2, 1]
    out = model(torch.randint(0, 61, (1, 9)))
    assert out.logits.shape == (1, 9, 61)


class _MeanAttention(nn.Module):
    """An attention written to the documented call only: no ``sliding_window`` attribute."""

    def __init__(self, spec: Any, *, d_model: int, cross: bool, layer_idx: int) -> None:
        super().__init__()
        self.v_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, **_: Any) -> tuple[torch.Tensor, None]:
        v = self.v_proj(x)  # (B, T, D)
        return v.cumsum(1) / torch.arange(1, x.shape[1] + 1).view(1, -1, 1), None


def test_an_attention_without_a_sliding_window_attribute_runs(tiny: Tiny, monkeypatch) -> None:
    from specformer.registry import REGISTRY, Entry

    entry = REGISTRY.get("attention", "mha")
    monkeypatch.setitem(REGISTRY._families["attention"], "mha", Entry("attention", "mha", entry.spec, _MeanAttention))
    model = build_model(tiny(positional={"type": "learned"}))
    ids = torch.randint(0, 61, (2, 5))
    out = model(ids[:, :-1], labels=ids[:, 1:])
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert model.decoder.layers[0].self_attn.v_proj.weight.grad is not None
