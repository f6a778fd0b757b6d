"""FLOPs per token against Kaplan et al. 2020, attention bookkeeping, KV cache and memory."""

from __future__ import annotations

import math
import time

import pytest
import torch

from specformer import load_spec
from specformer.analysis import (
    count_parameters,
    cross_kv_cache_bytes_per_source_token,
    dtype_bytes,
    flops_per_token,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    mean_attended_keys,
    memory_estimate,
    precision,
)
from specformer.analysis.memory import activation_bytes

LLAMA2_70B = {
    "extends": "llama2-7b",
    "name": "llama2-70b",
    "d_model": 8192,
    "decoder": {"n_layers": 80, "attention": {"n_heads": 64, "n_kv_heads": 8}, "ffn": {"d_ff": 28672}},
}


def _kaplan(spec, seq_len: int) -> float:
    """C_forward = 2 N + 2 n_layer n_ctx d_attn (Kaplan et al. 2020, table 1)."""
    att = spec.decoder.attention
    n = count_parameters(spec).non_embedding
    return 2 * n + 2 * spec.decoder.n_layers * seq_len * att.n_heads * att.head_dim


@pytest.mark.parametrize("name", ["gpt2-small", "gpt2-medium", "gpt2-xl", "llama2-7b"])
@pytest.mark.parametrize("seq_len", [128, 1024, 4096])
def test_dense_decoder_matches_kaplan(name: str, seq_len: int) -> None:
    spec = load_spec(name)
    flops = flops_per_token(spec, seq_len)
    # Kaplan's C_forward leaves out the de-embedding (output head)
    assert math.isclose(flops.non_embedding_forward, _kaplan(spec, seq_len), rel_tol=0.01)


def test_llama2_70b_published_total_and_kaplan() -> None:
    spec = load_spec(LLAMA2_70B)
    assert count_parameters(spec).total == 68_976_648_192  # Llama-2-70b-hf
    assert math.isclose(flops_per_token(spec, 4096).non_embedding_forward, _kaplan(spec, 4096), rel_tol=0.01)


def test_training_is_three_forwards_and_parts_add_up() -> None:
    f = flops_per_token(load_spec("t5-small"), 256)
    assert f.training == 3 * f.forward
    assert abs(sum(f.components.values()) - f.forward) <= len(f.components)


def test_a_masked_lm_head_trains_on_its_labelled_tokens_only() -> None:
    # BERT base at 512 tokens: the encoder runs on every token, MLMHead.loss runs the
    # head (768 × 768 transform, 768 × 30522 vocabulary product) on the 15% labelled
    encoder = 12 * (2 * 4 * 768 * 768 + 4 * 768 * 512 + 2 * 2 * 768 * 3072)
    head = 2 * (768 * 768 + 768 * 30522)
    f = flops_per_token("bert-base", 512)
    assert f.forward == encoder + head
    assert f.training == round(3 * (encoder + 0.15 * head)) == 587_858_688
    # mask_prob is the objective's
    assert flops_per_token(load_spec("bert-base", ["training.objective.mask_prob=0.3"]), 512).training == round(
        3 * (encoder + 0.3 * head))
    # an MLM head under the causal objective is trained on every token
    causal = load_spec("gpt-nano", ["head={type: mlm}"])
    assert flops_per_token(causal).training == 3 * flops_per_token(causal).forward


def _brute_keys(seq_len: int, causal: bool, window: int | None) -> float:
    total = 0
    for i in range(seq_len):
        for j in range(seq_len):
            if causal and j > i:
                continue
            if window is not None and abs(i - j) >= window:
                continue
            total += 1
    return total / seq_len


@pytest.mark.parametrize("seq_len", [1, 7, 32])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 1, 4, 6, 7, 16, 31, 100])
def test_mean_attended_keys_equals_mask_count(seq_len: int, causal: bool, window: int | None) -> None:
    assert mean_attended_keys(seq_len, causal=causal, window=window) == pytest.approx(
        _brute_keys(seq_len, causal, window)
    )


def test_a_bidirectional_window_is_counted_without_a_pass_over_the_tokens() -> None:
    # an encoder with a local window at 100M tokens: show and diff stay instant
    start = time.perf_counter()
    keys = mean_attended_keys(10**8, causal=False, window=128)
    assert time.perf_counter() - start < 1
    assert keys == pytest.approx((10**8 * 255 - 128 * 127) / 10**8)


def test_causal_attention_is_about_half_of_executed() -> None:
    spec = load_spec("gpt2-small")
    needed = flops_per_token(spec, 1024).components["decoder.attention.scores"]
    executed = flops_per_token(spec, 1024, count="executed").components["decoder.attention.scores"]
    assert needed / executed == pytest.approx(1025 / 2048)
    # an encoder attends every key: nothing to save
    bert = load_spec("bert-base")
    assert flops_per_token(bert, 512).forward == flops_per_token(bert, 512, count="executed").forward


def test_gqa_changes_only_kv_projections() -> None:
    mha = flops_per_token(load_spec("llama2-7b"), 2048).components
    gqa = flops_per_token(load_spec("llama2-7b", overrides=["decoder.attention.n_kv_heads=8"]), 2048).components
    assert gqa["decoder.attention.scores"] == mha["decoder.attention.scores"]
    assert mha["decoder.attention.proj"] - gqa["decoder.attention.proj"] == 32 * 2 * 4096 * 2 * (32 - 8) * 128
    assert gqa["decoder.ffn"] == mha["decoder.ffn"]


def test_sliding_window_caps_attention_cost() -> None:
    base = load_spec("llama2-7b")
    windowed = load_spec("llama2-7b", overrides=["decoder.attention.sliding_window=512"])
    full = flops_per_token(base, 4096).components["decoder.attention.scores"]
    capped = flops_per_token(windowed, 4096).components["decoder.attention.scores"]
    keys = (512 * 513 / 2 + (4096 - 512) * 512) / 4096
    assert capped == round(32 * 4 * 4096 * keys)
    assert capped < full
    # a window wider than the sequence changes nothing
    wide = load_spec("llama2-7b", overrides=["decoder.attention.sliding_window=8192"])
    assert flops_per_token(wide, 4096).forward == flops_per_token(base, 4096).forward


def test_gated_ffn_costs_three_matrices() -> None:
    mlp = load_spec("gpt-nano", overrides=["decoder.ffn={type: mlp, d_ff: 384}"])
    glu = load_spec("gpt-nano", overrides=["decoder.ffn={type: glu, d_ff: 384}"])
    assert flops_per_token(glu, 64).components["decoder.ffn"] == 1.5 * flops_per_token(mlp, 64).components["decoder.ffn"]


def test_encoder_decoder_counts_cross_attention() -> None:
    spec = load_spec("t5-small")
    c = flops_per_token(spec, 512).components
    d, h = 512, 8 * 64
    assert c["decoder.cross_attention.proj"] == 6 * 2 * (d * h * 2 + d * 2 * h)
    assert c["decoder.cross_attention.scores"] == 6 * 4 * h * 512  # every source token
    assert c["encoder.attention.scores"] == 6 * 4 * h * 512
    assert c["decoder.attention.scores"] == 6 * 4 * h * 513 / 2


# --------------------------------------------------------------------------- KV cache


def test_kv_cache_published_sizes() -> None:
    # Llama 2 7B: 2 (k, v) × 32 layers × 4096 × 2 bytes = 0.5 MiB per token
    assert kv_cache_bytes_per_token(load_spec("llama2-7b"), "bf16") == 512 * 1024
    # Llama 2 70B with GQA (8 kv heads): 2 × 80 × 8 × 128 × 2 bytes = 320 KiB
    assert kv_cache_bytes_per_token(load_spec(LLAMA2_70B), "fp16") == 320 * 1024
    assert kv_cache_bytes_per_token(load_spec("llama2-7b"), "fp32") == 1024 * 1024
    assert kv_cache_bytes_per_token(load_spec("llama2-7b"), "fp8") == 256 * 1024


def test_kv_cache_at_a_length_caps_sliding_window_layers() -> None:
    llama = load_spec("llama2-7b")
    assert kv_cache_bytes(llama, seq_len=4096, batch=2) == 2 * 4096 * 512 * 1024  # 4 GiB
    # Mistral-style window 512: every layer's rolling buffer holds the 511 positions a later query
    # sees and 128 of room to append, 639 in all
    windowed = load_spec("llama2-7b", overrides=["decoder.attention.sliding_window=512"])
    assert kv_cache_bytes(windowed, seq_len=4096, batch=2) == 2 * 639 * 512 * 1024
    assert kv_cache_bytes(windowed, seq_len=600) == 600 * 512 * 1024  # shorter than the buffer
    # window on half the layers: 16 layers × 4096 + 16 layers × 639 positions, 16 KiB each
    half = load_spec("llama2-7b", overrides=["decoder.overrides=[{layers: '0-15', attention: {sliding_window: 512}}]"])
    assert kv_cache_bytes(half, seq_len=4096) == 16 * 16 * 1024 * (4096 + 639)
    assert kv_cache_bytes(load_spec("bert-base"), seq_len=512) == 0


def test_kv_cache_encoder_and_cross() -> None:
    assert kv_cache_bytes_per_token(load_spec("bert-base")) == 0
    t5 = load_spec("t5-small")
    assert kv_cache_bytes_per_token(t5, "bf16") == 6 * 2 * 512 * 2
    assert cross_kv_cache_bytes_per_source_token(t5, "bf16") == 6 * 2 * 512 * 2
    assert cross_kv_cache_bytes_per_source_token(load_spec("gpt2-small")) == 0


def test_unknown_dtype_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown precision 'fp12'.*bf16-mixed"):
        precision("fp12")
    # a cache's dtype may also be fp8 or int8, and the error says so
    for call in (lambda: dtype_bytes("int4"), lambda: kv_cache_bytes_per_token("gpt-nano", dtype="int4")):
        with pytest.raises(ValueError, match=r"unknown dtype 'int4'; allowed: fp32, bf16, fp16, fp8, .*int8"):
            call()
    assert dtype_bytes("int8") == 1 and dtype_bytes("FP16") == 2
    assert precision("bfloat16").name == "bf16-true"
    assert precision("32-true").name == "fp32"


def test_a_torch_dtype_is_a_precision_and_a_cache_dtype() -> None:
    # build_model(dtype=torch.bfloat16) builds every weight in it: the pure setting
    assert [precision(d).name for d in (torch.float32, torch.float64, torch.bfloat16, torch.float16)] == [
        "fp32", "fp64", "bf16-true", "16-true"]
    assert memory_estimate("gpt-nano", dtype=torch.bfloat16) == memory_estimate("gpt-nano", dtype="bf16-true")
    assert [kv_cache_bytes_per_token("gpt-nano", dtype=d) for d in (torch.float32, torch.bfloat16, torch.int8)] == [
        4 * 2 * 4 * 128, 2 * 2 * 4 * 128, 2 * 4 * 128]
    with pytest.raises(TypeError, match="a dtype must be a name such as 'fp32'.*or a torch.dtype, not int"):
        kv_cache_bytes_per_token("gpt-nano", dtype=2)


def test_precision_names_mean_what_training_precision_means() -> None:
    from specformer.specs.training import TrainingSpec

    for name in ("bf16", "16", "bf16-mixed", "16-mixed", "bf16-true", "32", "fp32"):
        trained = TrainingSpec.model_validate({"precision": name}).precision
        assert precision(name).name == precision(trained).name, name
    assert precision("bf16").weight_cast == 2 and precision("bf16-true").weight == 2


def test_token_and_sequence_counts_are_whole_numbers() -> None:
    # 2.5 tokens would give fractional FLOPs and bytes; 1024.0 and True are not counts either
    calls = [
        lambda n: flops_per_token("gpt-nano", seq_len=n),
        lambda n: memory_estimate("gpt-nano", seq_len=n),
        lambda n: memory_estimate("gpt-nano", batch=n),
        lambda n: kv_cache_bytes("gpt-nano", seq_len=n),
        lambda n: kv_cache_bytes("gpt-nano", seq_len=8, batch=n),
        lambda n: activation_bytes("gpt-nano", batch=n, seq_len=8),
    ]
    for call in calls:
        for bad in (2.5, 1024.0, True, "8"):
            with pytest.raises(TypeError, match=r"(seq_len|batch) must be an integer, got "):
                call(bad)
    with pytest.raises(ValueError, match="seq_len must be positive, got 0"):
        flops_per_token("gpt-nano", seq_len=0)
    assert kv_cache_bytes("gpt-nano", seq_len=0) == 0
    assert flops_per_token("gpt-nano", seq_len=128) == flops_per_token(load_spec("gpt-nano"), seq_len=128)


# --------------------------------------------------------------------------- training memory


def test_memory_states_follow_precision() -> None:
    spec = load_spec("gpt2-small")
    n = count_parameters(spec).total
    fp32 = memory_estimate(spec, batch=2, seq_len=128, dtype="fp32")
    assert (fp32.weights, fp32.gradients, fp32.optimizer, fp32.weight_casts) == (4 * n, 4 * n, 8 * n, 0)
    mixed = memory_estimate(spec, batch=2, seq_len=128, dtype="bf16-mixed")
    # autocast copies the weights of matrix products: all but the 1024 × 768 position
    # table and the 25 layer norms' 2 × 768 (the tied token table is the head's weight)
    copied = n - 1024 * 768 - 25 * 2 * 768
    assert (mixed.weights, mixed.gradients, mixed.optimizer, mixed.weight_casts) == (4 * n, 4 * n, 8 * n, 2 * copied)
    true_bf16 = memory_estimate(spec, batch=2, seq_len=128, dtype="bf16-true")
    assert true_bf16.weights == 2 * n and true_bf16.optimizer == 4 * n
    assert mixed.total == mixed.weights + mixed.gradients + mixed.optimizer + mixed.weight_casts + mixed.activations


def test_autocast_copies_leave_out_tables_that_are_only_looked_up() -> None:
    # Llama 2 7B: its untied input table (32000 × 4096) is looked up, never multiplied,
    # and its 65 RMSNorms (4096 each) run in fp32: 6,607,077,376 weights are copied
    llama = memory_estimate("llama2-7b", dtype="bf16-mixed")
    assert llama.weight_casts == 2 * (6_738_415_616 - 32000 * 4096 - 65 * 4096) == 2 * 6_607_077_376
    assert memory_estimate("llama2-7b", dtype="bf16-true").weight_casts == 0


def test_activations_scale_with_batch_and_sequence() -> None:
    spec = load_spec("gpt2-small")
    # the head's weight gradient (V x D, fp32 under bf16-mixed), kept by the fused loss,
    # is one per step; everything else is per token
    fixed = spec.vocab_size * spec.d_model * 4
    a1 = memory_estimate(spec, batch=1, seq_len=256).activations - fixed
    assert memory_estimate(spec, batch=4, seq_len=256).activations - fixed == pytest.approx(4 * a1, rel=1e-9)
    # sdpa keeps no T × T scores: linear in T; eager keeps the probabilities: superlinear
    assert memory_estimate(spec, batch=1, seq_len=512).activations - fixed == pytest.approx(2 * a1, rel=1e-9)
    eager = load_spec("gpt2-small", overrides=["decoder.attention.backend=eager"])
    e1 = memory_estimate(eager, batch=1, seq_len=256).activations - fixed
    assert memory_estimate(eager, batch=1, seq_len=512).activations - fixed > 2 * e1


def test_activations_close_to_korthikanti() -> None:
    # Korthikanti et al. 2022, eq. 1: s·b·h·(34 + 5·a·s/h) bytes per layer, 16-bit, with
    # dropout everywhere and an eager softmax; our accounting also keeps the attention
    # output once more, so compare the transformer layers within 10%.
    spec = load_spec("gpt2-small", overrides=["decoder.attention.backend=eager"])
    s, b, h, a, n_layers = 1024, 1, 768, 12, 12
    korthikanti = n_layers * s * b * h * (34 + 5 * a * s / h)
    ours = memory_estimate(spec, batch=b, seq_len=s, dtype="bf16-true").activations
    # final norm input; the fused loss's gradients of the head input (s·b·h) and weight (V·h)
    head = s * b * h * 2 + s * b * h * 2 + 50257 * h * 2
    # specformer's eager softmax runs in float32 and keeps its output at 4 bytes, not 2
    softmax = n_layers * 2 * a * s * s * b
    assert math.isclose(ours - head, korthikanti + softmax, rel_tol=0.10)


def test_nanogpts_parameter_count_and_mfu_flops_are_ours_less_the_position_table() -> None:
    # nanoGPT prints total less the position table, and counts 6N + 12·L·H·Dh·T a training token
    from specformer.analysis import count_parameters, flops_per_token

    n = count_parameters("gpt2-small").total - 1024 * 768
    assert n == 123_653_376  # "number of parameters: 123.65M"
    nanogpt = 6 * n + 12 * 12 * 1024 * 768
    executed = flops_per_token("gpt2-small", seq_len=1024, count="executed").training
    assert (nanogpt, executed) == (855_166_464, 854_438_400)
    # the difference is 6 FLOPs for each bias and norm weight, which only nanoGPT counts
    # per layer: ln_1 (2·D), qkv bias (3·D), o bias (D), ln_2 (2·D), up bias (4·D), down bias (D); then ln_f
    biases_and_norms = 12 * (2 + 3 + 1 + 2 + 4 + 1) * 768 + 2 * 768
    assert nanogpt - executed == 6 * biases_and_norms
    assert count_parameters("gpt-nano").total - 256 * 128 == 858_880


def test_frozen_layers_need_no_backward_products() -> None:
    # gpt-nano: D 128, 4 layers of 4 heads of 32, MLP 512, vocabulary 512, tied head; at T 64
    # a layer's products per token are qkv 2·D·3D, o 2·D·D, FFN 2·2·D·F, and 4·D per attended
    # key, (T + 1) / 2 of them under the causal mask; the head 2·D·V
    d, f, v, t = 128, 512, 512, 64
    qkv, o, ffn, scores = 2 * d * 3 * d, 2 * d * d, 2 * 2 * d * f, 4 * d * (t + 1) / 2
    layer = qkv + o + ffn + scores
    head = 2 * d * v
    forward = 4 * layer + head
    plain = flops_per_token("gpt-nano", t)
    assert plain.forward == round(forward) and plain.training == round(3 * forward)
    assert plain.trained_parameters is None and "trained_parameters" not in plain.to_dict()
    # the embeddings (and with them the tied head's weight) and layers 0-1 frozen: the two
    # lower layers run forward only, the two upper ones both backward products of each
    # forward product, the head only the gradient of its input (its weight is the table)
    frozen = flops_per_token(load_spec("gpt-nano", [
        'training.optimizer.freeze=[embed.*, "decoder.layers.[0-1].*"]']), t)
    assert frozen.forward == plain.forward
    assert frozen.training == round(forward + 2 * 2 * layer + head)
    assert (frozen.trained_parameters, frozen.parameters) == (396_800, 891_648)
    assert frozen.to_dict()["trained_parameters"] == 396_800
    # layer 2's attention norm frozen as well: nothing below its qkv projection trains, so
    # that projection skips the gradient of its input (its weight's gradient is still needed)
    no_input = flops_per_token(load_spec("gpt-nano", [
        'training.optimizer.freeze=[embed.*, "decoder.layers.[0-1].*", decoder.layers.2.attn_norm.*]']), t)
    assert no_input.training == round(forward + 2 * 2 * layer + head - qkv)
    # only the top layer's FFN down projection trains: its weight gradient, and nothing else
    top = flops_per_token(load_spec("gpt-nano", [
        'training.optimizer.freeze=[embed.*, "decoder.layers.[0-2].*", "decoder.layers.3.self_attn.*", '
        '"decoder.layers.3.*norm.*", "decoder.layers.3.ffn.up_proj.*", "decoder.final_norm.*"]']), t)
    # the head's input depends on the trained down projection: its input gradient runs too
    assert top.training == round(forward + ffn / 2 + head)
    # lr_scale alone freezes nothing
    scaled = flops_per_token(load_spec("gpt-nano", ["training.optimizer.lr_scale=[{pattern: 'embed.*', factor: 0.1}]"]), t)
    assert scaled == plain


def test_frozen_layers_keep_no_activations() -> None:
    plain = load_spec("gpt-nano")
    frozen = load_spec("gpt-nano", ['training.optimizer.freeze=[embed.*, "decoder.layers.[0-1].*"]'])
    a, b = (activation_bytes(s, batch=2, seq_len=64, dtype="fp32") for s in (plain, frozen))
    # the two lower layers keep nothing; the head keeps no weight gradient (the table is frozen)
    top = load_spec("gpt-nano", ["decoder.n_layers=2"])
    assert b == activation_bytes(top, batch=2, seq_len=64, dtype="fp32") - 4 * 512 * 128 < a
    assert memory_estimate(frozen, batch=2, seq_len=64, dtype="fp32").activations == b
