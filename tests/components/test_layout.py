"""Decoding layout: the wide weights lie column by column, and nothing the model computes changes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from specformer.builder import build_model
from specformer.components import lay_out_for_decoding, restore_layout
from specformer.components.layout import decoding_weights
from specformer.specs.schema import ModelSpec
from specformer.training.generate import beam_search, generate, generate_seq2seq

Tiny = Callable[..., ModelSpec]

CASES = {
    "gpt-tied": ("decoder", {"positional": {"type": "learned"}}),
    "llama-untied": ("decoder", {"embedding": {"tie_output": False}, "stack": {
        "ffn": {"type": "glu", "activation": "silu", "d_ff": 96}, "norm": {"type": "rmsnorm"}}}),
    "t5": ("encoder-decoder", {"positional": {"type": "t5"}}),
}


def _build(tiny: Tiny, case: str) -> tuple[ModelSpec, torch.nn.Module]:
    kind, changes = CASES[case]
    spec = tiny(kind, **changes)
    return spec, build_model(spec).eval()


@pytest.mark.parametrize("case", list(CASES))
def test_wide_weights_lie_column_by_column_and_narrow_ones_stay(tiny: Tiny, case: str) -> None:
    _, model = _build(tiny, case)
    before = {name: (p.shape, p.data_ptr()) for name, p in model.named_parameters()}
    wide = {id(w) for w in decoding_weights(model)}
    moved = lay_out_for_decoding(model)
    assert moved == sum(w.numel() * 4 for w in decoding_weights(model)) > 0
    for name, p in model.named_parameters():
        assert p.shape == before[name][0], name
        if id(p) in wide:
            assert p.dim() == 2 and p.shape[0] >= p.shape[1], name
            assert p.t().is_contiguous() and not p.is_contiguous(), name
        else:  # untouched: the same memory
            assert p.data_ptr() == before[name][1], name
    # every FFN's down projection (longer than wide) stays as it was
    downs = [p for name, p in model.named_parameters() if name.endswith("ffn.down_proj.weight")]
    assert downs and all(p.is_contiguous() for p in downs)
    assert lay_out_for_decoding(model) == 0  # already laid out
    assert restore_layout(model) == moved
    assert all(p.is_contiguous() for p in model.parameters())


def test_the_vocabulary_projection_is_laid_out_once_tied_or_not(tiny: Tiny) -> None:
    _, tied = _build(tiny, "gpt-tied")
    _, untied = _build(tiny, "llama-untied")
    lay_out_for_decoding(tied)
    lay_out_for_decoding(untied)
    assert tied.embed.tokens.weight.t().is_contiguous()  # the head's product reads the embedding matrix
    assert untied.head.proj.weight.t().is_contiguous()
    assert untied.embed.tokens.weight.is_contiguous()  # an untied embedding is only looked up: it stays


@pytest.mark.parametrize("case", ["gpt-tied", "llama-untied"])
def test_decoder_outputs_and_generation_do_not_change(tiny: Tiny, case: str) -> None:
    spec, model = _build(tiny, case)
    ids = torch.randint(0, spec.vocab_size, (2, 9))
    with torch.no_grad():
        logits = model(ids).logits
        out = model(ids[:, :5], use_cache=True)
        step = model(ids[:, 5:6], cache=out.cache).logits
    greedy = generate(model, ids[:1], max_new_tokens=12, temperature=0)
    beams = beam_search(model, ids[:1], num_beams=3, max_new_tokens=6, eos_id=None)
    lay_out_for_decoding(model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, logits, rtol=1e-5, atol=1e-5)
        out = model(ids[:, :5], use_cache=True)
        torch.testing.assert_close(model(ids[:, 5:6], cache=out.cache).logits, step, rtol=1e-5, atol=1e-5)
    assert torch.equal(generate(model, ids[:1], max_new_tokens=12, temperature=0), greedy)
    assert torch.equal(beam_search(model, ids[:1], num_beams=3, max_new_tokens=6, eos_id=None), beams)


def test_encoder_decoder_outputs_and_generation_do_not_change(tiny: Tiny) -> None:
    spec, model = _build(tiny, "t5")
    src = torch.randint(0, spec.vocab_size, (2, 7))
    tgt = torch.randint(0, spec.vocab_size, (2, 5))
    with torch.no_grad():
        logits = model(src, decoder_input_ids=tgt).logits
    greedy = generate_seq2seq(model, src, start_id=0, eos_id=None, max_new_tokens=8)
    lay_out_for_decoding(model)
    with torch.no_grad():
        torch.testing.assert_close(model(src, decoder_input_ids=tgt).logits, logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(generate_seq2seq(model, src, start_id=0, eos_id=None, max_new_tokens=8), greedy)


def test_state_dict_is_unchanged_and_training_resumes_after_restoring(tiny: Tiny) -> None:
    spec, model = _build(tiny, "llama-untied")
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    lay_out_for_decoding(model)
    state = model.state_dict()
    assert state.keys() == reference.keys()
    assert all(torch.equal(state[k], reference[k]) for k in reference)
    restore_layout(model)
    model.train()
    ids = torch.randint(0, spec.vocab_size, (2, 9))
    loss = model(ids[:, :-1], labels=ids[:, 1:]).loss
    loss.backward()
    assert all(p.grad is None or p.grad.is_contiguous() for p in model.parameters())


def test_only_float32_weights_on_the_cpu_move(tiny: Tiny) -> None:
    _, model = _build(tiny, "gpt-tied")
    model.to(torch.bfloat16)
    assert decoding_weights(model) == []
    assert lay_out_for_decoding(model) == 0
