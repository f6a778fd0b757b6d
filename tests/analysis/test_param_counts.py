"""Analytic parameter counts: published totals, tying, and the breakdown adds up."""

from __future__ import annotations

import math

import pytest

from specformer import load_spec, preset_names
from specformer.analysis import count_parameters

# Published totals of the reference implementations (HF transformers model classes:
# GPT2LMHeadModel, BertForMaskedLM, T5ForConditionalGeneration, LlamaForCausalLM,
# MistralForCausalLM, RobertaForMaskedLM, BartForConditionalGeneration without its
# final_logits_bias buffer, Qwen2ForCausalLM, Qwen3ForCausalLM).
PUBLISHED = {
    "gpt2-small": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "bert-base": 109_514_298,
    "bert-large": 335_174_458,
    "t5-small": 60_506_624,
    "t5-base": 222_903_552,
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "llama3.1-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "roberta-base": 124_697_433,
    "bart-base": 139_420_416,
    "qwen2.5-0.5b": 494_032_768,  # the model card's 0.49B
    "qwen3-0.6b": 596_049_920,  # the model card's 0.6B, 0.44B of it not embeddings
    "phi-2": 2_779_683_840,  # the model card's 2.7B
    "gemma-2-2b": 2_614_341_888,  # the model card's 2.6B
    "gemma-3-1b": 999_885_952,  # the model card's 1B
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_totals(name: str) -> None:
    assert count_parameters(load_spec(name)).total == PUBLISHED[name]


@pytest.mark.parametrize("name", preset_names())
def test_breakdown_adds_up(name: str) -> None:
    counts = count_parameters(load_spec(name))
    assert sum(counts.components.values()) == counts.total
    assert sum(math.prod(shape) for shape in counts.shapes.values()) == counts.total
    assert counts.embedding + counts.non_embedding == counts.total
    assert 0 < counts.non_embedding < counts.total
    for role, layers in counts.per_layer.items():
        for part in ("attention", "cross_attention", "ffn"):
            assert sum(layer[part] for layer in layers) == counts.components.get(f"{role}.{part}", 0)
        final = sum(math.prod(s) for n, s in counts.shapes.items() if n.startswith(f"{role}.final_norm."))
        assert sum(layer["norms"] for layer in layers) + final == counts.components[f"{role}.norms"]


def test_untying_adds_exactly_one_vocab_matrix() -> None:
    tied = count_parameters(load_spec("gpt2-small"))
    untied = count_parameters(load_spec("gpt2-small", overrides=["embedding.tie_output=false"]))
    assert untied.total - tied.total == 50257 * 768
    # the untied output projection is a vocabulary table: non-embedding is unchanged
    assert untied.non_embedding == tied.non_embedding


def test_gqa_shrinks_only_kv_projections() -> None:
    mha = count_parameters(load_spec("llama2-7b"))
    gqa = count_parameters(load_spec("llama2-7b", overrides=["decoder.attention.n_kv_heads=8"]))
    # k and v each lose (32 - 8) heads of 128 rows of width 4096, in each of 32 layers
    assert mha.total - gqa.total == 32 * 2 * (32 - 8) * 128 * 4096
    assert mha.components["decoder.ffn"] == gqa.components["decoder.ffn"]


def test_separate_encoder_decoder_embeddings() -> None:
    shared = count_parameters(load_spec("t5-small"))
    separate = count_parameters(load_spec("t5-small", overrides=["embedding.share_encoder_decoder=false"]))
    assert separate.total - shared.total == 32128 * 512
    assert separate.components["decoder_embedding"] == 32128 * 512


def test_analysis_functions_take_what_build_model_takes() -> None:
    # a preset name, a dict or a ModelSpec alike; other objects and negative sizes are errors
    from specformer import load_spec
    from specformer.analysis import count_parameters, diff_specs, flops_per_token
    from specformer.analysis.memory import kv_cache_bytes, kv_cache_bytes_per_token, memory_estimate

    spec = load_spec("gpt-nano")
    data = spec.to_dict()
    for fn in (count_parameters, kv_cache_bytes_per_token):
        assert fn("gpt-nano") == fn(data) == fn(spec)
    assert flops_per_token("gpt-nano").forward == flops_per_token(spec).forward
    assert memory_estimate("gpt-nano").total == memory_estimate(spec).total
    changed = diff_specs("gpt-nano", {**data, "decoder": {**data["decoder"], "n_layers": 2}}, reports=False)
    assert [c.path for c in changed.changes] == ["decoder.n_layers"]
    with pytest.raises(TypeError, match="expected a spec"):
        count_parameters(42)
    with pytest.raises(ValueError, match="seq_len must be >= 0, got -1"):
        kv_cache_bytes(spec, seq_len=-1)
