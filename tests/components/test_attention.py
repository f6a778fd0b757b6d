"""Attention against independent references: torch's MultiheadAttention, GQA as MHA
with repeated key/value heads, SDPA against the eager backend, masks and qk-norm."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from specformer.builder import build_model
from specformer.components.attention import Attention, eager_attention, repeat_kv
from specformer.components.positional import apply_rotary
from specformer.specs.schema import AttentionSpec, ModelSpec

Tiny = Callable[..., ModelSpec]
D = 32


def _attention(**fields: object) -> Attention:
    spec = AttentionSpec(**{"n_heads": 4, "head_dim": 8, "n_kv_heads": 4, **fields})
    attn = Attention(spec, d_model=D)
    for p in attn.parameters():
        nn.init.normal_(p, std=0.2)
    return attn.eval()


def test_mha_equals_torch_multihead_attention() -> None:
    attn = _attention()
    ref = nn.MultiheadAttention(D, 4, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(attn.qkv_proj.weight)  # rows q, k, v: the same layout
        ref.in_proj_bias.copy_(attn.qkv_proj.bias)
        ref.out_proj.weight.copy_(attn.o_proj.weight)
        ref.out_proj.bias.copy_(attn.o_proj.bias)
    x = torch.randn(2, 7, D)
    causal = torch.ones(7, 7, dtype=torch.bool).triu(1)  # torch: True = masked
    want, _ = ref(x, x, x, attn_mask=causal, need_weights=False)
    got, _ = attn(x, is_causal=True)
    assert torch.allclose(got, want, atol=1e-5)


def _as_mha(gqa: Attention) -> Attention:
    """An MHA module computing what ``gqa`` computes: each kv head repeated for its group."""
    h, hkv, dh = gqa.n_heads, gqa.n_kv_heads, gqa.head_dim
    mha = _attention(n_heads=h, n_kv_heads=h, head_dim=dh)
    q_w, k_w, v_w = gqa.qkv_proj.weight.split([h * dh, hkv * dh, hkv * dh])
    q_b, k_b, v_b = gqa.qkv_proj.bias.split([h * dh, hkv * dh, hkv * dh])

    def repeat(t: torch.Tensor) -> torch.Tensor:
        return t.view(hkv, dh, *t.shape[1:]).repeat_interleave(h // hkv, dim=0).reshape(h * dh, *t.shape[1:])

    with torch.no_grad():
        mha.qkv_proj.weight.copy_(torch.cat([q_w, repeat(k_w), repeat(v_w)]))
        mha.qkv_proj.bias.copy_(torch.cat([q_b, repeat(k_b), repeat(v_b)]))
        mha.o_proj.load_state_dict(gqa.o_proj.state_dict())
    return mha


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_gqa_equals_mha_with_repeated_kv_heads(n_kv_heads: int, backend: str) -> None:
    gqa = _attention(n_kv_heads=n_kv_heads, backend=backend)
    mha = _as_mha(gqa)
    x = torch.randn(2, 6, D)
    a, _ = gqa(x, is_causal=True)
    b, _ = mha(x, is_causal=True)
    assert torch.allclose(a, b, atol=1e-5)


def test_mqa_shapes_and_parameter_count() -> None:
    attn = _attention(n_heads=8, n_kv_heads=1, head_dim=4)
    assert attn.qkv_proj.weight.shape == ((8 + 2) * 4, D)
    n = sum(p.numel() for p in attn.parameters())
    assert n == D * (8 + 2) * 4 + (8 + 2) * 4 + (8 * 4) * D + D
    out, weights = attn(torch.randn(3, 5, D), need_weights=True)
    assert out.shape == (3, 5, D)
    assert weights.shape == (3, 8, 5, 5)


@pytest.mark.parametrize("positional", ["rope", "alibi", "t5", "learned", "none"])
@pytest.mark.parametrize("kind", ["decoder", "encoder", "encoder-decoder"])
@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_equals_eager(tiny: Tiny, positional: str, kind: str, masked: bool) -> None:
    sdpa_spec = tiny(kind, positional={"type": positional}, stack={"attention": {"backend": "sdpa"}})
    eager_spec = tiny(kind, positional={"type": positional}, stack={"attention": {"backend": "eager"}})
    sdpa = build_model(sdpa_spec).eval()
    eager = build_model(eager_spec).eval()
    eager.load_state_dict(sdpa.state_dict())
    ids = torch.randint(0, 61, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    if masked:
        mask[0, 6:] = 0
        mask[1, :2] = 0
    kwargs = {"attention_mask": mask} if masked else {}
    if kind == "encoder-decoder":
        kwargs = {"decoder_input_ids": ids[:, :7], **kwargs}
        if masked:
            kwargs["decoder_attention_mask"] = mask[:, :7]
    with torch.no_grad():
        a = sdpa(ids, **kwargs).logits
        b = eager(ids, **kwargs).logits
    assert torch.allclose(a, b, atol=1e-5)


def test_eager_attention_computes_in_float64_when_given_float64(tiny: Tiny) -> None:
    # the softmax runs in at least float32, never below the input's precision
    q, k, v = (3 * torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    exact = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, -1) @ v
    out, weights = eager_attention(q, k, v, mask=None, is_causal=False, scale=8**-0.5, dropout=0.0)
    assert out.dtype == weights.dtype == torch.float64
    torch.testing.assert_close(out, exact, rtol=0, atol=1e-12)
    sdpa = build_model(tiny(stack={"attention": {"backend": "sdpa"}}), dtype=torch.float64).eval()
    eager = build_model(tiny(stack={"attention": {"backend": "eager"}}), dtype=torch.float64).eval()
    with torch.no_grad():
        for p in sdpa.parameters():
            p.mul_(8)  # large scores: float32 scores would differ by ~1e-5
        eager.load_state_dict(sdpa.state_dict())
        ids = torch.randint(0, 61, (2, 9))
        a = sdpa(ids).logits
        torch.testing.assert_close(eager(ids).logits, a, rtol=0, atol=1e-10)
        torch.testing.assert_close(sdpa(ids, output_attentions=True).logits, a, rtol=0, atol=1e-10)


def test_output_attentions_returns_rows_that_sum_to_one_and_respect_causality(tiny: Tiny) -> None:
    model = build_model(tiny()).eval()
    out = model(torch.randint(0, 61, (2, 6)), output_attentions=True)
    assert len(out.attentions) == 2
    w = out.attentions[0]
    assert w.shape == (2, 4, 6, 6)
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 6), atol=1e-6)
    assert w.triu(1).abs().max().item() == 0.0


def test_padding_mask_gives_padded_keys_zero_weight(tiny: Tiny) -> None:
    model = build_model(tiny("encoder")).eval()
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    out = model(torch.randint(0, 61, (1, 5)), attention_mask=mask, output_attentions=True)
    for w in out.attentions:
        assert w[..., :3, 3:].abs().max().item() == 0.0  # real queries ignore padded keys
        assert torch.isfinite(w).all()  # padded queries keep themselves: no empty row


@pytest.mark.parametrize("qk_norm", ["layernorm", "rmsnorm"])
def test_qk_norm_normalises_queries_and_keys_per_head(qk_norm: str) -> None:
    attn = _attention(qk_norm=qk_norm)
    seen = {}
    attn.q_norm.register_forward_hook(lambda m, i, o: seen.__setitem__("q", o))
    attn.k_norm.register_forward_hook(lambda m, i, o: seen.__setitem__("k", o))
    with torch.no_grad():
        attn.q_norm.weight.fill_(1.0)
        attn.k_norm.weight.fill_(1.0)
        for norm in (attn.q_norm, attn.k_norm):
            if getattr(norm, "bias", None) is not None:
                norm.bias.zero_()
    attn(torch.randn(2, 5, D) * 10)
    # the norms see (B, T, heads, Dh) and normalise each head's Dh features
    assert seen["q"].shape == (2, 5, 4, 8) and seen["k"].shape == (2, 5, 4, 8)
    rms = seen["q"].pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)
    state = attn.state_dict()
    assert "q_norm.weight" in state and "k_norm.weight" in state


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_qk_norm_over_all_heads_normalises_the_whole_projection(cross: bool) -> None:
    # OLMo 2: one norm over every head's features together, before the split into heads
    spec = AttentionSpec(n_heads=4, head_dim=8, n_kv_heads=2, qk_norm="rmsnorm", qk_norm_scope="all")
    attn = Attention(spec, d_model=D, cross=cross).eval()
    assert attn.q_norm.weight.shape == (4 * 8,) and attn.k_norm.weight.shape == (2 * 8,)
    seen = {}
    attn.q_norm.register_forward_hook(lambda m, i, o: seen.__setitem__("q", (i[0], o)))
    attn.k_norm.register_forward_hook(lambda m, i, o: seen.__setitem__("k", (i[0], o)))
    x = torch.randn(2, 5, D) * 10
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
        out, _ = attn(x, context=x if cross else None)
    q_proj = attn.q_proj if cross else attn.qkv_proj
    q_in = q_proj(x)[..., : 4 * 8]
    torch.testing.assert_close(seen["q"][0], q_in)  # the whole (B, T, H Dh) projection
    expected = q_in * torch.rsqrt(q_in.pow(2).mean(-1, keepdim=True) + 1e-6) * attn.q_norm.weight
    torch.testing.assert_close(seen["q"][1], expected, atol=1e-5, rtol=1e-5)
    assert seen["k"][0].shape == (2, 5, 2 * 8)
    # unit gains on both sides: only the scope differs, and it changes the output
    per_head = Attention(AttentionSpec(n_heads=4, head_dim=8, n_kv_heads=2, qk_norm="rmsnorm"), d_model=D,
                         cross=cross).eval()
    per_head.load_state_dict({k: v for k, v in attn.state_dict().items() if "_norm" not in k}, strict=False)
    with torch.no_grad():
        attn.q_norm.weight.fill_(1.0)
        whole, _ = attn(x, context=x if cross else None)
        assert not torch.allclose(per_head(x, context=x if cross else None)[0], whole, atol=1e-3)


def test_qk_norm_eps_is_the_norms_and_needs_a_qk_norm() -> None:
    x = torch.randn(2, 5, D) * 1e-3  # small features: the eps decides the scale
    outs = []
    for eps in (1e-6, 1e-2):
        attn = Attention(AttentionSpec(n_heads=4, head_dim=8, n_kv_heads=4, qk_norm="rmsnorm", qk_norm_eps=eps),
                         d_model=D).eval()
        torch.manual_seed(0)
        for p in attn.parameters():
            nn.init.normal_(p, std=0.2)
        seen = {}
        attn.q_norm.register_forward_hook(lambda m, i, o, seen=seen: seen.__setitem__("q", (i[0], o)))
        attn(x)
        q_in, q_out = seen["q"]
        expected = q_in * torch.rsqrt(q_in.pow(2).mean(-1, keepdim=True) + eps) * attn.q_norm.weight
        torch.testing.assert_close(q_out, expected, atol=1e-5, rtol=1e-4)
        outs.append(q_out)
    assert not torch.allclose(outs[0], outs[1], atol=1e-3)
    with pytest.raises(ValueError, match="qk_norm_eps needs a qk_norm"):
        AttentionSpec(qk_norm_eps=1e-5)


def test_cross_attention_reads_keys_from_the_context() -> None:
    spec = AttentionSpec(n_heads=4, head_dim=8, n_kv_heads=2)
    attn = Attention(spec, d_model=D, cross=True).eval()
    assert attn.kv_proj.weight.shape == (2 * 2 * 8, D)
    x, ctx = torch.randn(2, 3, D), torch.randn(2, 11, D)
    out, weights = attn(x, context=ctx, need_weights=True)
    assert out.shape == (2, 3, D) and weights.shape == (2, 4, 3, 11)
    out2, _ = attn(x, context=ctx + 1.0)
    assert not torch.allclose(out, out2)


def test_standalone_specs_without_derived_sizes_are_refused_readably() -> None:
    from specformer.components.ffn import MLP
    from specformer.specs.schema import MLPSpec

    with pytest.raises(ValueError, match="needs head_dim and n_kv_heads"):
        Attention(AttentionSpec(n_heads=4), d_model=D)
    with pytest.raises(ValueError, match="needs d_ff"):
        MLP(MLPSpec(), d_model=D)


def test_an_all_ones_mask_keeps_the_unmaterialised_causal_path(tiny: Tiny) -> None:
    model = build_model(tiny(positional={"type": "rope"})).eval()
    seen: list[tuple[object, bool]] = []
    model.decoder.layers[0].self_attn.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append((kwargs["mask"], kwargs["is_causal"])), with_kwargs=True
    )
    ids = torch.randint(0, 61, (2, 6))
    with torch.no_grad():
        a = model(ids, attention_mask=torch.ones(2, 6, dtype=torch.long)).logits
        mask = torch.ones(2, 6, dtype=torch.long)
        mask[0, 4:] = 0
        model(ids, attention_mask=mask)
    assert seen[0] == (None, True)
    assert seen[1][0] is not None and seen[1][0].shape == (2, 1, 6, 6) and seen[1][1] is False
    assert torch.allclose(a, model(ids).logits)


@pytest.mark.parametrize("n_kv_heads,scale", [(4, 1.0), (2, 0.3)])
def test_a_trained_bias_gets_the_gradients_of_torch_sdpa(n_kv_heads: int, scale: float) -> None:
    # a bias that requires grad (T5's table) takes specformer's own math path; torch's
    # SDPA (its math kernel) is the reference for the output and every gradient
    from torch.nn import functional as F

    from specformer.components.attention import repeat_kv, sdpa_attention

    torch.manual_seed(0)
    q = torch.randn(2, 4, 6, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, n_kv_heads, 9, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, n_kv_heads, 9, 8, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(1, 4, 6, 9, dtype=torch.float64, requires_grad=True)
    allowed = torch.rand(2, 1, 6, 9) > 0.3
    allowed[..., 0] = True
    masked = torch.where(allowed, bias, torch.finfo(torch.float64).min)  # as LayerInputs builds it
    g = torch.randn(2, 4, 6, 8, dtype=torch.float64)
    out, _ = sdpa_attention(q, k, v, mask=masked, is_causal=False, scale=scale, dropout=0.0)
    grads = torch.autograd.grad(out, (q, k, v, bias), g, retain_graph=True)
    groups = 4 // n_kv_heads
    ref = F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), attn_mask=masked, scale=scale)
    ref_grads = torch.autograd.grad(ref, (q, k, v, bias), g)
    assert torch.allclose(out, ref, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        assert torch.allclose(got, want, atol=1e-10)
    assert bias.requires_grad and grads[3].abs().sum() > 0  # the table learns


def _bf16_case(b: int, h: int, hkv: int, t: int, s: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, 16, dtype=torch.float64, generator=gen)
    k = torch.randn(b, hkv, s, 16, dtype=torch.float64, generator=gen)
    v = torch.randn(b, hkv, s, 16, dtype=torch.float64, generator=gen)
    g = torch.randn(b, h, t, 16, dtype=torch.float64, generator=gen)
    return q, k, v, g


def _out_and_grads(fn: Callable, q, k, v, g, dtype: torch.dtype) -> list[torch.Tensor]:
    leaves = [x.to(dtype).detach().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(g.to(dtype))
    return [x.double() for x in (out, *(leaf.grad for leaf in leaves))]


@pytest.mark.parametrize(
    "b,h,hkv,t,s,causal,block",
    [(2, 4, 2, 200, 200, True, 128), (1, 6, 6, 128, 128, True, 128), (1, 4, 1, 300, 300, True, 128),
     (2, 4, 1, 50, 77, False, 128), (2, 4, 2, 200, 200, True, 256), (2, 4, 1, 200, 77, False, 256)],
)
def test_cpu_matmul_attention_is_torch_sdpa_to_bf16_precision(b, h, hkv, t, s, causal, block) -> None:
    # blocks of 128 query rows (200 and 300 rows end on a partial block), or the whole call as
    # one block (128 rows, 50, and 200 in a block of 256), GQA groups of 1, 2 and 4, causal and
    # bidirectional: output and every gradient against float64 SDPA, as close as torch's own
    # bf16 kernel gets (its error is the yardstick)
    from torch.nn import functional as F

    from specformer.components.attention import cpu_matmul_attention

    q, k, v, g = _bf16_case(b, h, hkv, t, s)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3, enable_gqa=True)

    want = _out_and_grads(sdpa, q, k, v, g, torch.float64)
    torch_bf16 = _out_and_grads(sdpa, q, k, v, g, torch.bfloat16)
    ours = _out_and_grads(lambda q, k, v: cpu_matmul_attention(q, k, v, is_causal=causal, scale=0.3, block=block),
                          q, k, v, g, torch.bfloat16)
    for got, theirs, ref in zip(ours, torch_bf16, want, strict=True):
        err, torch_err = ((got - ref).norm() / ref.norm()).item(), ((theirs - ref).norm() / ref.norm()).item()
        assert err < max(2 * torch_err, 2e-3), (err, torch_err)
        assert err < 0.02


def test_bf16_calls_not_causal_of_up_to_256_query_rows_are_one_block() -> None:
    from specformer.components.attention import MATMUL_BLOCK_SCORES, _bf16_block_rows

    assert _bf16_block_rows(4, 4, 256, 256, is_causal=False) == 256  # bert-style: one block
    assert _bf16_block_rows(4, 4, 77, 300, is_causal=False) == 256  # cross-attention: 77 queries, 300 keys
    assert _bf16_block_rows(8, 12, 200, 200, is_causal=False) == 256  # 3.8 M scores: within the bound
    assert _bf16_block_rows(2, 8, 256, 256, is_causal=True) == 128  # causal: blocks that skip the masked scores
    assert _bf16_block_rows(1, 12, 512, 512, is_causal=False) == 128  # longer: blocks of 128 rows
    # within the bound on a block's scores
    assert _bf16_block_rows(64, 16, 256, 256, is_causal=False) == MATMUL_BLOCK_SCORES // (64 * 16 * 256)


def test_cpu_matmul_attention_is_causal() -> None:
    # a change to the keys and values at a position moves no earlier query's output
    from specformer.components.attention import cpu_matmul_attention

    q, k, v, _ = _bf16_case(1, 4, 2, 260, 260)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    base = cpu_matmul_attention(q, k, v, is_causal=True, scale=0.25)
    for pos in (0, 127, 128, 200, 259):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, pos] += 3.0
        v2[:, :, pos] -= 3.0
        moved = cpu_matmul_attention(q, k2, v2, is_causal=True, scale=0.25)
        assert torch.equal(moved[:, :, :pos], base[:, :, :pos])
        assert not torch.equal(moved[:, :, pos], base[:, :, pos])


def test_matmul_attention_builds_its_causal_block_masks_once_per_shape(monkeypatch) -> None:
    # a block's mask covers its G heads' rows (each head's rows in turn); every call of a
    # shape shares one set, and past MATMUL_MASK_CACHE_BYTES they are built per block: the
    # same numbers either way
    from specformer.components import attention

    q, k, v, g = _bf16_case(2, 4, 2, 300, 300)

    def run() -> list[torch.Tensor]:
        return _out_and_grads(lambda q, k, v: attention.cpu_matmul_attention(q, k, v, is_causal=True, scale=0.3),
                              q, k, v, g, torch.bfloat16)

    attention._cached_block_masks.cache_clear()
    cached = run()
    run()
    info = attention._cached_block_masks.cache_info()
    assert (info.currsize, info.misses) == (1, 1) and info.hits >= 5
    masks = attention._cached_block_masks(300, 128, 2, torch.bfloat16, torch.device("cpu"))
    assert [tuple(m.shape) for m in masks] == [(256, 128), (256, 256), (88, 300)]
    for i, mask in enumerate(masks):
        position = torch.arange(i * 128, min(300, i * 128 + 128)).repeat(2)[:, None]
        hidden = torch.arange(mask.shape[1])[None, :] > position
        assert torch.equal(mask == float("-inf"), hidden) and torch.all(mask[~hidden] == 0)
    # a last block of one row has no future key: no mask
    assert attention._causal_block_mask(257, 128, 2, 2, torch.bfloat16, torch.device("cpu")) is None

    monkeypatch.setattr(attention, "MATMUL_MASK_CACHE_BYTES", 0)
    attention._cached_block_masks.cache_clear()
    built = run()
    assert attention._cached_block_masks.cache_info().currsize == 0
    for a, b in zip(cached, built, strict=True):
        assert torch.equal(a, b)


def test_sdpa_backend_takes_the_matmul_path_only_for_bf16_training_on_the_cpu(monkeypatch) -> None:
    from specformer.components import attention

    monkeypatch.setattr(attention, "MATMUL_ATTENTION", True)  # whatever this machine measures

    taken: list[bool] = []
    real = attention.cpu_matmul_attention
    monkeypatch.setattr(attention, "cpu_matmul_attention",
                        lambda *a, **kw: taken.append(True) or real(*a, **kw))

    def run(dtype=torch.float32, *, grad=True, autocast=False, mask=None, dropout=0.0, t=8, s=8,
            causal=True) -> bool:
        taken.clear()
        q = torch.randn(1, 4, t, 8, dtype=dtype, requires_grad=grad)
        k = torch.randn(1, 2, s, 8, dtype=dtype, requires_grad=grad)
        v = torch.randn(1, 2, s, 8, dtype=dtype, requires_grad=grad)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out, _ = attention.sdpa_attention(q, k, v, mask=mask, is_causal=causal, scale=0.3, dropout=dropout)
        assert out.shape == (1, 4, t, 8)
        assert out.dtype == (torch.bfloat16 if autocast else dtype)
        return bool(taken)

    assert run(torch.bfloat16)
    assert run(autocast=True)
    assert run(autocast=True, causal=False, t=3, s=8)
    assert not run()  # float32: torch's fused kernel is as fast
    assert not run(torch.bfloat16, grad=False)  # inference
    assert not run(torch.bfloat16, mask=torch.ones(1, 1, 8, 8, dtype=torch.bool))
    keys = torch.ones(1, 1, 1, 8, dtype=torch.bool)  # padded keys alone: the products add them to their scores
    assert run(torch.bfloat16, mask=keys, causal=False)
    assert run(torch.bfloat16, mask=keys.float(), causal=False, t=3)  # cross-attention's
    assert not run(torch.bfloat16, mask=keys)  # ... not with the causal mask
    assert not run(torch.bfloat16, dropout=0.1)
    assert not run(torch.bfloat16, t=3, s=8)  # causal with a cache offset: SDPA's alignment
    monkeypatch.setattr(attention, "MATMUL_BLOCK_SCORES", 4 * 8 * 8 - 1)
    assert not run(torch.bfloat16)  # a block of all 8 rows would pass the bound on a block's scores
    monkeypatch.setattr(attention, "MATMUL_MIN_ROWS", 4)
    assert run(torch.bfloat16)  # blocks of 7 rows do not
    monkeypatch.setattr(attention, "MATMUL_ATTENTION", False)
    assert not run(torch.bfloat16)  # where the fused kernel measured as fast


def test_a_bf16_autocast_training_step_matches_the_fused_kernel(tiny: Tiny, monkeypatch, loss_and_grads) -> None:
    # the whole model, forward and backward, with the matmul path and with torch's kernel
    from specformer.components import attention

    monkeypatch.setattr(attention, "MATMUL_ATTENTION", True)

    model = build_model(tiny(positional={"type": "rope"}, max_seq_len=320))
    ids = torch.randint(0, 61, (2, 301))
    loss, grads = loss_and_grads(model, ids, bf16=True)
    monkeypatch.setattr(attention, "MATMUL_BLOCK_SCORES", 0)
    ref_loss, ref_grads = loss_and_grads(model, ids, bf16=True)
    assert abs(loss - ref_loss) < 2e-3 * ref_loss
    for got, want in zip(grads, ref_grads, strict=True):
        assert ((got - want).norm() / want.norm()) < 0.05


def _kept_and_grads(monkeypatch, dtype: torch.dtype, budget: int, block: int | None):
    """What one causal call keeps for its backward pass (numel of each tensor) with
    MATMUL_KEPT_BYTES = budget, and the output and gradients."""
    from specformer.components import attention

    monkeypatch.setattr(attention, "MATMUL_KEPT_BYTES", budget)
    q, k, v, g = _bf16_case(2, 4, 2, 300, 300)
    q, k, v = (x.to(dtype).requires_grad_() for x in (q, k, v))
    saved: list[torch.Tensor] = []
    kwargs = {} if block is None else {"block": block}
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = attention.cpu_matmul_attention(q, k, v, is_causal=True, scale=0.25, **kwargs)
    out.backward(g.to(dtype))
    return [t.numel() for t in saved], [out, q.grad, k.grad, v.grad]


@pytest.mark.parametrize(("dtype", "block"), [(torch.bfloat16, None), (torch.float32, 128)])
def test_matmul_attention_keeps_the_first_blocks_probabilities_within_its_budget(monkeypatch, dtype, block) -> None:
    # the backward pass uses the probabilities the forward pass kept, and computes the others
    # again: the same numbers either way, and never more kept than MATMUL_KEPT_BYTES
    qkv = 2 * 4 * 300 * 16 + 2 * (2 * 2 * 300 * 16)
    size = dtype.itemsize
    bf16 = dtype == torch.bfloat16
    # a causal block of 128 rows sees 128, 256 then 300 keys; bf16 takes all batch rows and
    # heads at once, float32 one batch row and key/value head (2 query heads) at a time
    blocks = [2 * 4 * 128 * 128, 2 * 4 * 128 * 256, 2 * 4 * 44 * 300] if bf16 else \
        [2 * 128 * 128, 2 * 128 * 256, 2 * 44 * 300] * 4
    none, recomputed = _kept_and_grads(monkeypatch, dtype, 0, block)
    assert sum(none) == qkv  # Q, K and V alone, as the fused kernel keeps
    everything, kept = _kept_and_grads(monkeypatch, dtype, 1 << 30, block)
    assert sum(everything) == qkv + sum(blocks)
    some, partly = _kept_and_grads(monkeypatch, dtype, (blocks[0] + blocks[1]) * size + 1, block)
    assert sum(some) == qkv + blocks[0] + blocks[1]
    for a, b, c in zip(recomputed, kept, partly, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
        assert a.abs().sum() > 0


def test_the_attention_measurement_decides_once_outside_any_mode(monkeypatch, recorded_ops) -> None:
    from specformer.components import attention

    attention._measured_matmul_attention.cache_clear()
    monkeypatch.setattr(attention, "MATMUL_ATTENTION", None)
    with recorded_ops() as seen, torch.no_grad():
        first = attention.matmul_attention_is_faster()
    assert isinstance(first, bool) and seen.names == []
    assert attention.matmul_attention_is_faster() is first
    assert attention._measured_matmul_attention.cache_info().misses == 1
    for setting in (True, False):
        monkeypatch.setattr(attention, "MATMUL_ATTENTION", setting)
        assert attention.matmul_attention_is_faster() is setting


# ------------------------------------------------------------ float32 attention as products


@pytest.mark.parametrize(
    "b,h,hkv,t,s,causal,block",
    [(2, 4, 2, 200, 200, True, 64), (1, 6, 6, 128, 128, True, 128), (1, 4, 1, 300, 300, True, 128),
     (2, 4, 1, 50, 77, False, 16), (1, 8, 2, 70, 70, False, 32)],
)
def test_float32_matmul_attention_is_sdpa_in_float64_to_float32_rounding(b, h, hkv, t, s, causal, block) -> None:
    # partial last blocks (200 / 64, 300 / 128, 50 / 16), GQA groups of 1, 2, 4 and 6,
    # causal and bidirectional, more keys than queries: output and every gradient
    from torch.nn import functional as F

    from specformer.components.attention import cpu_matmul_attention

    q, k, v, g = _bf16_case(b, h, hkv, t, s)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3, enable_gqa=True)

    want = _out_and_grads(sdpa, q, k, v, g, torch.float64)
    ours = _out_and_grads(lambda q, k, v: cpu_matmul_attention(q, k, v, is_causal=causal, scale=0.3, block=block),
                          q, k, v, g, torch.float32)
    for got, ref in zip(ours, want, strict=True):
        assert ((got - ref).norm() / ref.norm()).item() < 1e-5


def test_float32_matmul_attention_takes_the_projections_layout() -> None:
    # queries as the fused projection gives them ((B, T, H, Dh) memory); the output comes back
    # in that layout, so merging the heads for the output projection copies nothing
    from specformer.components.attention import cpu_matmul_attention

    q, k, v, g = _bf16_case(2, 4, 2, 40, 40)
    q = q.float().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    k, v = k.float().requires_grad_(), v.float().requires_grad_()
    out = cpu_matmul_attention(q, k, v, is_causal=True, scale=0.25, block=16)
    assert out.transpose(1, 2).is_contiguous()
    out.backward(g.float())
    ref = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    ref_out = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True, scale=0.25, enable_gqa=True)
    ref_out.backward(g.float())
    assert torch.allclose(out, ref_out, atol=1e-5)
    for got, want in zip((q, k, v), ref, strict=True):
        assert torch.allclose(got.grad, want.grad, atol=1e-5)


def test_float32_matmul_attention_is_causal() -> None:
    from specformer.components.attention import cpu_matmul_attention

    q, k, v, _ = _bf16_case(1, 4, 2, 100, 100)
    q, k, v = q.float(), k.float(), v.float()
    base = cpu_matmul_attention(q, k, v, is_causal=True, scale=0.25, block=32)
    for pos in (0, 31, 32, 70, 99):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, pos] += 3.0
        v2[:, :, pos] -= 3.0
        moved = cpu_matmul_attention(q, k2, v2, is_causal=True, scale=0.25, block=32)
        assert torch.equal(moved[:, :, :pos], base[:, :, :pos])
        assert not torch.equal(moved[:, :, pos], base[:, :, pos])


def test_sdpa_backend_takes_the_float32_path_for_large_enough_products(monkeypatch) -> None:
    from specformer.components import attention

    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", True)  # whatever this machine measures
    monkeypatch.setattr(attention, "MATMUL_ATTENTION", False)
    blocks: list[int] = []
    real = attention.cpu_matmul_attention
    monkeypatch.setattr(attention, "cpu_matmul_attention",
                        lambda *a, **kw: blocks.append(kw["block"]) or real(*a, **kw))

    def block(h=8, hkv=2, t=256, *, grad=True, autocast=False, mask=None, causal=True, dtype=torch.float32) -> int:
        blocks.clear()
        q = torch.randn(1, h, t, 8, dtype=dtype, requires_grad=grad)
        k, v = (torch.randn(1, hkv, t, 8, dtype=dtype, requires_grad=grad) for _ in range(2))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out, _ = attention.sdpa_attention(q, k, v, mask=mask, is_causal=causal, scale=0.3, dropout=0.0)
        assert out.shape == (1, h, t, 8) and out.dtype == (torch.bfloat16 if autocast else dtype)
        return blocks[0] if blocks else 0

    assert block() == 128  # 4 heads a key/value head x 128 rows: products of 512 rows
    assert block(h=6, t=512) == 192  # 3 heads: blocks grow to 192 rows (a multiple of 64)
    assert block(h=4, hkv=4, t=512) == 512  # MHA: one head, 512 rows a block
    assert block(h=4, hkv=4, t=256) == 0  # MHA at 256: products too small, the fused kernel
    assert block(causal=False) == 128
    assert block(grad=False) == 0  # inference
    assert block(mask=torch.ones(1, 1, 256, 256, dtype=torch.bool)) == 0
    assert block(autocast=True) == 0  # bf16 autocast: the bf16 path's choice (off here)
    assert block(dtype=torch.float64) == 0
    monkeypatch.setattr(attention, "MATMUL_BLOCK_SCORES", 4 * 128 * 256 - 1)
    assert block() == 0  # a block's scores past the bound
    monkeypatch.setattr(attention, "MATMUL_BLOCK_SCORES", 1 << 22)
    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", False)
    assert block() == 0  # where the fused kernel measured as fast


def test_a_float32_training_step_matches_the_fused_kernel(tiny: Tiny, monkeypatch, loss_and_grads) -> None:
    from specformer.components import attention

    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_PRODUCT_ROWS", 64)
    model = build_model(tiny(positional={"type": "rope"}, max_seq_len=320))
    ids = torch.randint(0, 61, (2, 301))
    used: list[int] = []
    real = attention.cpu_matmul_attention
    monkeypatch.setattr(attention, "cpu_matmul_attention", lambda *a, **kw: used.append(1) or real(*a, **kw))
    loss, grads = loss_and_grads(model, ids)
    assert used
    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", False)
    used.clear()
    ref_loss, ref_grads = loss_and_grads(model, ids)
    assert not used
    assert abs(loss - ref_loss) < 1e-5 * ref_loss
    for got, want in zip(grads, ref_grads, strict=True):
        assert ((got - want).norm() / want.norm()) < 1e-4


def test_the_float32_attention_measurement_decides_once_and_only_with_onednn(monkeypatch, recorded_ops) -> None:
    from specformer.components import attention, products

    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", None)
    attention._measured_float32_attention.cache_clear()
    monkeypatch.setattr(products, "ONEDNN", False)  # MKL's products: no measurement, the fused kernel
    timed: list[int] = []
    real = attention._faster_than_fused
    monkeypatch.setattr(attention, "_faster_than_fused", lambda *a: timed.append(1) or real(*a))
    assert attention.float32_attention_is_faster() is False and not timed
    attention._measured_float32_attention.cache_clear()
    monkeypatch.setattr(products, "ONEDNN", True)
    with recorded_ops() as seen, torch.no_grad():
        first = attention.float32_attention_is_faster()
    assert isinstance(first, bool) and seen.names == [] and timed == [1]
    assert attention.float32_attention_is_faster() is first and timed == [1]
    attention._measured_float32_attention.cache_clear()


def test_soft_capped_scores_are_cap_tanh_of_the_scaled_scores_before_the_mask(tiny: Tiny) -> None:
    model = build_model(tiny(stack={"attention": {"softcap": 0.5}})).eval()
    attn = model.decoder.layers[0].self_attn
    assert attn.backend == "eager"  # capped scores have no fused kernel: every call writes them out
    seen: dict[str, torch.Tensor] = {}
    attn.qkv_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("qkv", o))
    rope = {}
    model.decoder.layers[0].self_attn.register_forward_pre_hook(
        lambda m, a, kw: rope.__setitem__("rope", kw["rope"]), with_kwargs=True)
    out = model(torch.randint(0, 61, (1, 6)), output_attentions=True)
    h, hkv, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q, k, _ = seen["qkv"].view(1, 6, h + 2 * hkv, dh).split((h, hkv, hkv), dim=2)
    q, k = apply_rotary(q, *rope["rope"]), apply_rotary(k, *rope["rope"])
    q, k = q.transpose(1, 2), repeat_kv(k.transpose(1, 2), h // hkv)
    scores = 0.5 * torch.tanh(q @ k.transpose(-2, -1) * attn.scale / 0.5)
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(out.attentions[0], scores.softmax(-1), atol=1e-6, rtol=0)
    # a cap of 0.5 keeps every score within it: the weights of a row stay within e^1 of each other
    w = out.attentions[0][0, :, -1]
    assert (w.max(-1).values / w.min(-1).values).max() <= math.e + 1e-4
