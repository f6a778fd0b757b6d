"""Positional schemes against their definitions, and causality for every scheme."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from specformer.builder import build_model
from specformer.components.positional import (
    Rotary,
    SinusoidalPositional,
    alibi_slopes,
    apply_rotary,
    rope_frequencies,
    sinusoidal_table,
    t5_relative_buckets,
)
from specformer.registry import REGISTRY
from specformer.specs.schema import ModelSpec, RopeSpec, SinusoidalSpec, T5BiasSpec

Tiny = Callable[..., ModelSpec]


def test_sinusoids_in_halves_are_the_interleaved_ones_regrouped() -> None:
    # tensor2tensor's and Marian's layout: the same sines, then the same cosines
    from specformer.components.positional import sinusoidal_table

    inter, halves = sinusoidal_table(50, 16), sinusoidal_table(50, 16, layout="halves")
    assert torch.equal(halves[:, :8], inter[:, 0::2]) and torch.equal(halves[:, 8:], inter[:, 1::2])
    pos, j = torch.arange(50.0)[:, None], torch.arange(8.0)
    torch.testing.assert_close(halves[:, 8:], torch.cos(pos / 10000 ** (2 * j / 16)))  # Marian's formula

def test_sinusoidal_table_equals_the_formula() -> None:
    d, n, base = 12, 50, 10000.0
    table = sinusoidal_table(n, d, base)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / base ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_module_adds_the_table_and_caches_it() -> None:
    pos = SinusoidalPositional(SinusoidalSpec(), d_model=8, max_seq_len=16)
    x = torch.zeros(1, 4, 8)
    ids = torch.tensor([[3, 4, 5, 6]])
    out = pos.embed(x, ids, 7)
    assert torch.allclose(out[0], sinusoidal_table(16, 8)[3:7])
    assert len(pos._tables) == 1
    pos.embed(x, ids, 7)
    assert len(pos._tables) == 1
    long = pos.embed(torch.zeros(1, 1, 8), torch.tensor([[40]]), 41)  # grows past max_seq_len
    assert torch.allclose(long[0, 0], sinusoidal_table(41, 8)[40])


# ALiBi paper (Press et al. 2022), section 3 and its reference code: 8 heads give
# 1/2, 1/4, ..., 1/256; for 12 heads, the 8-head slopes followed by every other
# slope of the 16-head sequence (2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
ALIBI_8 = [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
ALIBI_12 = ALIBI_8 + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]


@pytest.mark.parametrize(("heads", "expected"), [(8, ALIBI_8), (12, ALIBI_12)])
def test_alibi_slopes_equal_the_paper(heads: int, expected: list[float]) -> None:
    assert alibi_slopes(heads) == pytest.approx(expected, rel=1e-12)


def _reference_t5_bucket(rel: int, *, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucketing written from the paper's description / Mesh TensorFlow's
    ``_relative_position_bucket``: n = query - key; exact buckets for small |n|,
    logarithmic up to max_distance, a separate half for keys after the query."""
    n = -rel
    ret = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return ret + min(val, num_buckets - 1)


DISTANCES = [-300, -128, -127, -100, -64, -33, -32, -20, -16, -15, -12, -9, -8, -7, -3, -1, 0,
             1, 2, 7, 8, 9, 11, 15, 16, 17, 31, 32, 50, 64, 65, 127, 128, 129, 500]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (32, 64), (16, 40)])
def test_t5_buckets_equal_the_reference(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    rel = torch.tensor(DISTANCES)
    got = t5_relative_buckets(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    ).tolist()
    want = [
        _reference_t5_bucket(r, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
        for r in DISTANCES
    ]
    assert got == want


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("past", "t"), [(0, 40), (0, 1), (17, 1), (9, 6), (150, 3), (299, 2)])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(16, 40), (32, 128), (4, 3), (9, 5)])
def test_t5_bias_and_its_gradient_equal_the_pairwise_definition(
    causal: bool, past: int, t: int, num_buckets: int, max_distance: int
) -> None:
    # bias[h, i, j] = weight[bucket(k_j - q_i), h] for every query/key pair, and the
    # weight's gradient is the sum of the bias gradient over the pairs of each bucket
    torch.manual_seed(0)
    spec = T5BiasSpec(num_buckets=num_buckets, max_distance=max_distance)
    mod = REGISTRY.build("positional", spec, n_heads=3, causal=causal)
    mod.init_parameters(1.0)
    q_index, k_index = torch.arange(past, past + t), torch.arange(past + t)
    bias = mod.bias(q_index, k_index, dtype=torch.float64)
    assert bias.shape == (1, 3, t, past + t)
    buckets = t5_relative_buckets(k_index[None, :] - q_index[:, None], bidirectional=not causal,
                                  num_buckets=num_buckets, max_distance=max_distance)  # (T, Tk)
    assert 0 <= int(buckets.min()) and int(buckets.max()) < num_buckets
    want = mod.weight.double()[buckets].permute(2, 0, 1)
    assert torch.equal(bias[0], want)
    grad = torch.randn(1, 3, t, past + t, dtype=torch.float64)
    (got,) = torch.autograd.grad(bias, mod.weight, grad)
    expected = torch.zeros(num_buckets, 3, dtype=torch.float64).index_add_(
        0, buckets.reshape(-1), grad[0].permute(1, 2, 0).reshape(-1, 3))
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_t5_bias_follows_a_growing_decoding_and_windowed_keys(causal: bool) -> None:
    # one module through calls whose reach grows (a decoding, past the max distance), shrinks
    # and starts its keys late (a sliding window's k_start): each equals the definition
    spec = T5BiasSpec(num_buckets=8, max_distance=12)
    mod = REGISTRY.build("positional", spec, n_heads=2, causal=causal)
    mod.init_parameters(1.0)
    calls = [(past, 1, 0) for past in range(0, 60, 7)] + [(0, 5, 0), (3, 4, 0), (40, 3, 30), (100, 1, 90),
                                                          (250, 2, 0), (10, 1, 0)]
    for past, t, k_start in calls:
        q_index, k_index = torch.arange(past, past + t), torch.arange(k_start, past + t)
        with torch.no_grad():
            bias = mod.bias(q_index, k_index, dtype=torch.float64)
        buckets = t5_relative_buckets(k_index[None, :] - q_index[:, None], bidirectional=not causal,
                                      num_buckets=8, max_distance=12)  # (T, Tk)
        assert torch.equal(bias[0], mod.weight.detach().double()[buckets].permute(2, 0, 1)), (past, t, k_start)


def test_t5_bias_made_in_inference_mode_still_trains() -> None:
    # a validation loop (Lightning's, in inference mode) before a training step: the tables
    # it fills must not make the step's bias an inference tensor, which autograd cannot save
    spec = T5BiasSpec(num_buckets=8, max_distance=12)
    mod = REGISTRY.build("positional", spec, n_heads=2, causal=True)
    mod.init_parameters(1.0)
    with torch.inference_mode():
        mod.bias(torch.arange(3, 4), torch.arange(4), dtype=torch.float32)
        mod.bias(torch.arange(40), torch.arange(40), dtype=torch.float32)
    bias = mod.bias(torch.arange(5), torch.arange(5), dtype=torch.float32)
    (grad,) = torch.autograd.grad(bias.square().sum(), mod.weight)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize(("num_buckets", "max_distance", "field"), [(32, 16, "max_distance"), (32, 8, "max_distance"),
                                                                 (2, 16, "num_buckets")])
def test_t5_bias_settings_without_a_logarithmic_range_are_refused(num_buckets: int, max_distance: int,
                                                                  field: str) -> None:
    # below num_buckets // 2 the buckets went negative (an index error deep in the model)
    # or divided by log(1) = 0
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        T5BiasSpec(num_buckets=num_buckets, max_distance=max_distance)
    error = info.value.errors()[0]
    assert (error.get("ctx") or {}).get("field", error["loc"][-1] if error["loc"] else None) == field
    assert "allowed: 17 or more" in str(info.value) if field == "max_distance" else "4" in error["msg"]


def test_t5_bias_is_shared_by_the_layers_of_a_stack(tiny: Tiny) -> None:
    spec = tiny("encoder-decoder", positional={"type": "t5", "num_buckets": 8, "max_distance": 16})
    model = build_model(spec)
    assert model.encoder.rel_bias.bidirectional and not model.decoder.rel_bias.bidirectional
    names = [n for n, _ in model.named_parameters() if "rel_bias" in n]
    assert names == ["encoder.rel_bias.weight", "decoder.rel_bias.weight"]


@pytest.mark.parametrize("fraction", [1.0, 0.5, 0.25])
def test_rope_scores_depend_only_on_relative_position(fraction: float) -> None:
    head_dim = 16
    rope = Rotary(RopeSpec(fraction=fraction), max_seq_len=64, head_dim=head_dim)
    q = torch.randn(1, 1, 1, head_dim)
    k = torch.randn(1, 1, 1, head_dim)

    def score(m: int, n: int) -> float:
        cos_m, sin_m = rope.rotation(torch.tensor([[m]]), 64, dtype=torch.float32)
        cos_n, sin_n = rope.rotation(torch.tensor([[n]]), 64, dtype=torch.float32)
        return (apply_rotary(q, cos_m, sin_m) * apply_rotary(k, cos_n, sin_n)).sum().item()

    for m, n in [(3, 7), (10, 2), (0, 0)]:
        for shift in (1, 5, 40):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-4)
    assert score(3, 9) != pytest.approx(score(3, 7), abs=1e-3)  # but it does depend on n - m


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rope_rotates_each_feature_pair_by_its_angle(fraction: float) -> None:
    # RoFormer in the rotate-half convention: feature i pairs with i + R/2, and at
    # position p the pair turns by p * base^(-2i/R): (a, b) -> (a cos - b sin, b cos + a sin)
    head_dim, base = 16, 10000.0
    rot = int(head_dim * fraction)
    rope = Rotary(RopeSpec(fraction=fraction, base=base), max_seq_len=8, head_dim=head_dim)
    positions = [0, 3, 11]  # 11 is past max_seq_len
    x = torch.randn(2, len(positions), 3, head_dim, dtype=torch.float64)  # (B, T, heads, Dh)
    cos, sin = rope.rotation(torch.tensor([positions]), 12, dtype=torch.float64)
    y = apply_rotary(x, cos, sin)
    for t, p in enumerate(positions):
        for i in range(rot // 2):
            angle = p * base ** (-2 * i / rot)
            a, b = x[:, t, :, i], x[:, t, :, i + rot // 2]
            torch.testing.assert_close(y[:, t, :, i], a * math.cos(angle) - b * math.sin(angle), atol=1e-6, rtol=0)
            torch.testing.assert_close(y[:, t, :, i + rot // 2], b * math.cos(angle) + a * math.sin(angle),
                                       atol=1e-6, rtol=0)
    assert torch.equal(y[..., rot:], x[..., rot:])


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_a_rope_model_reads_only_relative_positions_far_past_max_seq_len(tiny: Tiny, fraction: float) -> None:
    # RoPE is a model's only positional information: the same tokens at positions 5000 on
    # (max_seq_len 64) give the logits they give at 0 on, in one forward and decoded with a cache
    spec = tiny(positional={"type": "rope", "fraction": fraction}, stack={"attention": {"sliding_window": 4}})
    model = build_model(spec).eval()
    ids = torch.randint(0, spec.vocab_size, (2, 12))
    far = torch.arange(5000, 5012)[None]
    with torch.no_grad():
        near_logits = model(ids).logits
        far_logits = model(ids, position_ids=far).logits
        out = model(ids[:, :5], position_ids=far[:, :5], use_cache=True)
        steps = [out.logits]
        for t in range(5, 12):
            steps.append(model(ids[:, t : t + 1], position_ids=far[:, t : t + 1], cache=out.cache).logits)
        # a gap of one position in the offsets does show (by 5e-4 in this small random model)
        shifted = model(ids, position_ids=torch.cat([far[:, :6], far[:, 6:] + 1], dim=1)).logits
    torch.testing.assert_close(far_logits, near_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(steps, dim=1), near_logits, atol=1e-5, rtol=0)
    assert (shifted[:, 6:] - near_logits[:, 6:]).abs().max() > 1e-4


def test_rope_table_doubles_when_decoding_past_max_seq_len() -> None:
    # one position at a time, as decoding asks: the table is rebuilt O(log n) times
    rope = Rotary(RopeSpec(), max_seq_len=8, head_dim=8)
    sizes, table = [], None
    for n in range(1, 200):
        rope.rotation(torch.tensor([[n - 1]]), n, dtype=torch.float32)
        current = rope._tables[(torch.device("cpu"), torch.float32)][0]
        if current is not table:
            sizes.append(current.shape[0])
        table = current
    assert sizes == [8, 16, 32, 64, 128, 256]


def test_partial_rope_leaves_the_rest_untouched() -> None:
    rope = Rotary(RopeSpec(fraction=0.25), max_seq_len=8, head_dim=16)
    x = torch.randn(1, 3, 2, 16)  # (B, T, heads, Dh)
    cos, sin = rope.rotation(torch.tensor([[1, 2, 3]]), 8, dtype=torch.float32)
    y = apply_rotary(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:])
    assert not torch.allclose(y[..., :4], x[..., :4])
    # rotation preserves the norm of each rotated pair
    assert torch.allclose(y[..., :4].norm(dim=-1), x[..., :4].norm(dim=-1), atol=1e-6)


def test_rope_tables_are_cached_per_device_and_dtype() -> None:
    rope = Rotary(RopeSpec(), max_seq_len=8, head_dim=8)
    ids = torch.arange(4)[None]
    a = rope.rotation(ids, 4, dtype=torch.float32)
    table = rope._tables[(ids.device, torch.float32)][0]
    b = rope.rotation(ids, 4, dtype=torch.float32)
    assert rope._tables[(ids.device, torch.float32)][0] is table  # reused, not recomputed
    rope.rotation(ids, 4, dtype=torch.bfloat16)
    assert len(rope._tables) == 2
    assert torch.equal(a[0], b[0])
    rope.rotation(torch.tensor([[20]]), 21, dtype=torch.float32)  # past max_seq_len: the table grows
    assert rope._tables[(ids.device, torch.float32)][0].shape[0] >= 21


@pytest.mark.parametrize("positional", REGISTRY.names("positional"))
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_causal_decoder_does_not_see_the_future(tiny: Tiny, positional: str, backend: str) -> None:
    spec = tiny(positional={"type": positional}, stack={"attention": {"backend": backend}})
    model = build_model(spec).eval()
    ids = torch.randint(0, spec.vocab_size, (2, 12))
    changed = ids.clone()
    t = 6
    changed[:, t + 1 :] = torch.randint(0, spec.vocab_size, (2, 12 - t - 1))
    with torch.no_grad():
        a = model(ids).logits
        b = model(changed).logits
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-6)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :], atol=1e-4)


@pytest.mark.parametrize("positional", REGISTRY.names("positional"))
def test_causal_decoder_of_encoder_decoder_does_not_see_the_future(tiny: Tiny, positional: str) -> None:
    spec = tiny("encoder-decoder", positional={"type": positional})
    model = build_model(spec).eval()
    src = torch.randint(0, spec.vocab_size, (2, 9))
    tgt = torch.randint(0, spec.vocab_size, (2, 10))
    changed = tgt.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % spec.vocab_size
    with torch.no_grad():
        a = model(src, decoder_input_ids=tgt).logits
        b = model(src, decoder_input_ids=changed).logits
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-6)
    assert not torch.allclose(a[:, 5:], b[:, 5:], atol=1e-4)


def test_sliding_window_limits_what_a_query_sees(tiny: Tiny) -> None:
    spec = tiny(stack={"attention": {"sliding_window": 3}, "n_layers": 1})
    model = build_model(spec).eval()
    ids = torch.randint(0, spec.vocab_size, (1, 10))
    changed = ids.clone()
    changed[0, 2] = (changed[0, 2] + 1) % spec.vocab_size  # one layer: position 2 reaches 2..4 only
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    same = torch.isclose(a, b, atol=1e-6).all(dim=-1)[0].tolist()
    assert same == [True, True, False, False, False, True, True, True, True, True]


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_a_sliding_window_attends_exactly_the_keys_its_description_names(tiny: Tiny, kind: str) -> None:
    # window 3: a decoder's query i sees keys i - 3 < j <= i, an encoder's |i - j| < 3; the
    # left-padded row's first two keys are seen by no real query
    spec = tiny(kind, stack={"attention": {"sliding_window": 3}, "n_layers": 1})
    model = build_model(spec).eval()
    ids = torch.randint(0, spec.vocab_size, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :2] = 0
    with torch.no_grad():
        weights = model(ids, attention_mask=mask, output_attentions=True).attentions[0]  # (B, H, T, T)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    near = (i - j < 3) & (j <= i) if kind == "decoder" else (i - j).abs() < 3
    assert torch.equal(weights[0] > 0, near.expand(4, 9, 9))
    assert torch.equal(weights[1, :, 2:] > 0, (near & (j >= 2)).expand(4, 9, 9)[:, 2:])


def test_learned_offset_reads_shifted_rows(tiny: Tiny) -> None:
    spec = tiny(positional={"type": "learned", "offset": 2, "max_positions": 66})
    model = build_model(spec)
    assert model.embed.positions.weight.shape == (66, 32)
    x = torch.zeros(1, 3, 32)
    out = model.embed.positions.embed(x, torch.arange(3)[None], 3)
    assert torch.equal(out[0], model.embed.positions.weight[2:5])


def test_learned_table_overflow_is_a_readable_error(tiny: Tiny) -> None:
    model = build_model(tiny(positional={"type": "learned"}, max_seq_len=8))
    with pytest.raises(ValueError, match="past the learned position table, which has 8 positions"):
        model(torch.randint(0, 61, (1, 9)))


# rope scalings as Hugging Face configs write them (rope_parameters), several factors each
_SCALINGS = [
    {"rope_type": "linear", "factor": 1.0},
    {"rope_type": "linear", "factor": 2.5},
    {"rope_type": "linear", "factor": 16.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 0.5, "high_freq_factor": 3.0,
     "original_max_position_embeddings": 512},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707},
    {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "truncate": False},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048, "attention_factor": 1.5,
     "beta_fast": 16, "beta_slow": 2},
    {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 2048},
]


@pytest.mark.reference
@pytest.mark.parametrize("rot_dim", [128, 64, 24])
@pytest.mark.parametrize("params", _SCALINGS, ids=lambda p: f"{p['rope_type']}-{p['factor']:g}")
def test_scaled_rope_frequencies_are_transformers(params: dict, rot_dim: int) -> None:
    # the inverse frequencies and the cos/sin factor of transformers' ROPE_INIT_FUNCTIONS, to the bit
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    base = 500000.0
    config = transformers.LlamaConfig(
        hidden_size=2 * rot_dim, num_attention_heads=2, max_position_embeddings=131072,
        rope_parameters={"rope_theta": base, **params},
    )
    theirs, their_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, torch.device("cpu"))
    scaling = {("type" if k == "rope_type" else k): v for k, v in params.items()}
    ours, our_factor = rope_frequencies(rot_dim, base, RopeSpec(base=base, scaling=scaling).scaling)
    assert ours.dtype == torch.float32 and ours.shape == (rot_dim // 2,)
    assert torch.equal(ours, theirs)
    assert our_factor == their_factor


def test_scaled_rope_frequencies_follow_their_definitions() -> None:
    rot, base = 64, 10000.0
    plain, one = rope_frequencies(rot, base)
    assert one == 1.0
    torch.testing.assert_close(plain, torch.tensor([base ** (-2 * i / rot) for i in range(rot // 2)]))
    linear, _ = rope_frequencies(rot, base, RopeSpec(scaling={"type": "linear", "factor": 4.0}).scaling)
    torch.testing.assert_close(linear, plain / 4)
    # Llama 3.1: wavelengths under 8192 / 4 kept, over 8192 / 1 divided by 8, blended between
    llama3, _ = rope_frequencies(rot, base, RopeSpec(scaling={"type": "llama3"}).scaling)
    wavelength = 2 * math.pi / plain
    short, long = wavelength < 2048, wavelength > 8192
    assert short.sum() == 21 and long.sum() == 7  # and 4 between
    assert torch.equal(llama3[short], plain[short])
    torch.testing.assert_close(llama3[long], plain[long] / 8)
    between = ~short & ~long
    assert ((llama3[between] < plain[between]) & (llama3[between] > plain[between] / 8)).all()
    # YaRN: the fastest kept, the slowest interpolated, cos/sin scaled by 0.1 ln(4) + 1
    yarn, factor = rope_frequencies(
        rot, base, RopeSpec(scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}).scaling
    )
    assert factor == pytest.approx(0.1 * math.log(4) + 1)
    assert torch.equal(yarn[:4], plain[:4])
    torch.testing.assert_close(yarn[-4:], plain[-4:] / 4)


@pytest.mark.reference
@pytest.mark.parametrize(("factor", "original"), [(1.0, 16), (2.0, 2048), (2.5, 4000), (8.0, 8192)])
@pytest.mark.parametrize("rot_dim", [128, 64, 24, 4])
def test_dynamic_ntk_frequencies_are_transformers(factor: float, original: int, rot_dim: int) -> None:
    # at initialisation (no length), within the original context, and at lengths past it, as
    # transformers' decoding gives them (max(position_ids) + 1, an int64 tensor): to the bit
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    base = 500000.0
    config = transformers.LlamaConfig(
        hidden_size=2 * rot_dim, num_attention_heads=2, max_position_embeddings=original,
        rope_parameters={"rope_theta": base, "rope_type": "dynamic", "factor": factor},
    )
    scaling = RopeSpec(base=base, scaling={"type": "dynamic", "factor": factor,
                                           "original_max_position_embeddings": original}).scaling
    plain, _ = rope_frequencies(rot_dim, base)
    for seq_len in (None, original // 2, original, original + 1, 3 * original + 7, 100003):
        length = None if seq_len is None else torch.tensor(seq_len)
        theirs, their_factor = ROPE_INIT_FUNCTIONS["dynamic"](config, torch.device("cpu"), seq_len=length)
        ours, our_factor = rope_frequencies(rot_dim, base, scaling, seq_len=seq_len)
        assert torch.equal(ours, theirs), seq_len
        assert our_factor == their_factor == 1.0
        if seq_len is not None and seq_len > original:  # the base grew: every frequency but the first slower
            assert ours[0] == plain[0] and (ours[1:] < plain[1:]).all()
        else:
            torch.testing.assert_close(ours, plain, atol=0, rtol=1e-6)


@pytest.mark.reference
@pytest.mark.parametrize(("factor", "original", "max_positions"), [(None, 4096, 131072), (8.0, 2048, 4096),
                                                                   (None, 16, 16), (1.0, 512, 4096)])
@pytest.mark.parametrize("rot_dim", [96, 64, 24])
def test_longrope_frequencies_are_transformers(
    factor: float | None, original: int, max_positions: int, rot_dim: int
) -> None:
    # the short factors within the original context, the long ones past it, and the attention
    # factor (from max_position_embeddings / original_max_position_embeddings when no factor is given)
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    g = torch.Generator().manual_seed(rot_dim)
    short = (1 + torch.rand(rot_dim // 2, generator=g)).tolist()
    long = (1 + 10 * torch.rand(rot_dim // 2, generator=g)).tolist()
    params = {"rope_theta": 10000.0, "rope_type": "longrope", "short_factor": short, "long_factor": long,
              "original_max_position_embeddings": original, **({"factor": factor} if factor else {})}
    config = transformers.LlamaConfig(hidden_size=2 * rot_dim, num_attention_heads=2,
                                      max_position_embeddings=max_positions, rope_parameters=params)
    scaling = RopeSpec(scaling={"type": "longrope", "short_factor": short, "long_factor": long,
                                "original_max_position_embeddings": original,
                                "factor": factor or max_positions / original}).scaling
    plain, _ = rope_frequencies(rot_dim, 10000.0)
    for seq_len, factors in [(None, short), (original, short), (original + 1, long), (10 * original, long)]:
        theirs, their_factor = ROPE_INIT_FUNCTIONS["longrope"](config, torch.device("cpu"), seq_len=seq_len)
        ours, our_factor = rope_frequencies(rot_dim, 10000.0, scaling, seq_len=seq_len)
        assert torch.equal(ours, theirs) and our_factor == their_factor
        torch.testing.assert_close(ours, plain / torch.tensor(factors), atol=0, rtol=1e-6)
    ratio = factor or max_positions / original
    assert our_factor == (1.0 if ratio == 1 else math.sqrt(1 + math.log(ratio) / math.log(original)))


def test_dynamic_ntk_rotates_with_the_frequencies_of_the_forwards_last_position() -> None:
    # within the original context the table's; past it, base (factor n / L - (factor - 1))^(R/(R-2))
    # for n = the largest position + 1, at every position of the forward
    spec = RopeSpec(base=100.0, scaling={"type": "dynamic", "factor": 3.0, "original_max_position_embeddings": 8})
    rope = Rotary(spec, max_seq_len=8, head_dim=8)
    plain = Rotary(RopeSpec(base=100.0), max_seq_len=8, head_dim=8)

    def angle(cos: torch.Tensor, sin: torch.Tensor, i: int) -> float:
        return math.atan2(sin[0, -1, 0, 4 + i].item(), cos[0, -1, 0, i].item())

    for positions, n in [(torch.arange(8)[None], 8), (torch.arange(12)[None], 12), (torch.tensor([[19]]), 20),
                         (torch.tensor([[3, 4], [0, 9]]), 14)]:
        cos, sin = rope.rotation(positions, n, dtype=torch.float32)
        assert cos.shape == (positions.shape[0], positions.shape[1], 1, 8)
        seq_len = int(positions.max()) + 1  # not n: padding can leave the positions lower
        grown = 100.0 * (3.0 * seq_len / 8 - 2.0) ** (8 / 6) if seq_len > 8 else 100.0
        last = positions[0, -1].item()
        for i in range(4):
            expected = math.remainder(last * grown ** (-2 * i / 8), 2 * math.pi)
            assert angle(cos, sin, i) == pytest.approx(expected, abs=1e-4)
        if seq_len <= 8:
            assert torch.equal(cos, plain.rotation(positions, n, dtype=torch.float32)[0])
    assert "scaling=dynamic x3" in repr(rope)


def test_yarn_attention_factor_scales_the_rotation() -> None:
    # |cos|^2 + |sin|^2 is the factor squared: queries and keys are each scaled by it
    spec = RopeSpec(scaling={"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 32})
    rope = Rotary(spec, max_seq_len=64, head_dim=16)
    cos, sin = rope.rotation(torch.arange(64)[None], 64, dtype=torch.float32)
    scale = 0.1 * math.log(16) + 1
    torch.testing.assert_close(cos**2 + sin**2, torch.full_like(cos, scale**2))
    assert "scaling=yarn x16" in repr(rope)


@pytest.mark.parametrize(
    ("scaling", "field", "words"),
    [
        ({"type": "linear", "factor": 0.5}, "factor", "greater than or equal to 1"),
        ({"type": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 4.0}, "high_freq_factor", "must exceed"),
        ({"type": "yarn", "factor": 4.0}, "original_max_position_embeddings", "Field required"),
        ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 1.0},
         "beta_fast", "must exceed beta_slow=1"),
        ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": 0.0},
         "attention_factor", "greater than 0"),
        ({"type": "dynamic", "factor": 2.0}, "original_max_position_embeddings", "Field required"),
        ({"type": "dynamic", "factor": 0.5, "original_max_position_embeddings": 64}, "factor",
         "greater than or equal to 1"),
        ({"type": "longrope", "factor": 2.0, "original_max_position_embeddings": 64, "long_factor": [1.0]},
         "short_factor", "Field required"),
        ({"type": "longrope", "factor": 2.0, "original_max_position_embeddings": 64, "long_factor": [1.0],
          "short_factor": [0.0]}, "short_factor", "greater than 0"),
        ({"type": "ntk", "factor": 2.0}, "scaling", "'linear', 'llama3', 'yarn', 'dynamic', 'longrope'"),
    ],
)
def test_rope_scaling_fields_are_validated(scaling: dict, field: str, words: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        RopeSpec(scaling=scaling)
    text = str(info.value)
    assert field in text and words in text


def test_a_rope_spec_without_scaling_is_unchanged() -> None:
    assert RopeSpec().scaling is None
    assert "scaling" not in RopeSpec().model_dump(exclude_defaults=True)
    rope = Rotary(RopeSpec(base=500.0), max_seq_len=8, head_dim=8)
    cos, _ = rope.rotation(torch.tensor([[5]]), 8, dtype=torch.float32)
    assert cos[0, 0, 0, 1].item() == pytest.approx(math.cos(5 * 500.0 ** (-2 / 8)), abs=1e-6)
