"""Decoding layout: the wide weights lie column by column, and nothing the model computes changes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from specformer.builder import build_model
from specformer.components import lay_out_for_decoding, restore_layout
from specformer.components.layout import DecodingLinear, decoding_weights
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


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the names of the ATen operations run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def two_threads():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("layout", ["rows", "columns"])
@pytest.mark.parametrize("bias", [True, False])
def test_a_one_row_product_is_split_over_the_threads_with_the_same_result(two_threads, layout: str, bias: bool) -> None:
    from specformer.components.layout import decode_linear

    weight = torch.randn(384, 96)
    if layout == "columns":
        weight = weight.t().contiguous().t()
    b = torch.randn(384) if bias else None
    x = torch.randn(1, 1, 96)
    with torch.no_grad(), _Ops() as ops:
        y = decode_linear(x, weight, b)
    assert [n for n in ops.names if "mm" in n] == ["baddbmm.default" if bias else "bmm.default"]  # 2 blocks, one product
    assert y.shape == (1, 1, 384)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, weight, b), rtol=1e-6, atol=1e-5)
    # a few rows (8 tokens of a batch, as a decoding step of 8 sequences): split the same way
    few = torch.randn(4, 2, 96)
    with torch.no_grad(), _Ops() as ops:
        y = decode_linear(few, weight, b)
    assert [n for n in ops.names if "mm" in n] == ["baddbmm.default" if bias else "bmm.default"]
    torch.testing.assert_close(y, torch.nn.functional.linear(few, weight, b), rtol=1e-6, atol=1e-5)
    # more rows (a prompt), autograd, or one thread: the plain product
    for args, grad in (((torch.randn(9, 1, 96), weight, b), False), ((x, weight, b), True)):
        with torch.set_grad_enabled(grad), _Ops() as ops:
            decode_linear(*args)
        assert not any(n.startswith(("bmm", "baddbmm")) for n in ops.names)
    torch.set_num_threads(1)
    with torch.no_grad(), _Ops() as ops:
        decode_linear(x, weight, b)
    assert not any(n.startswith(("bmm", "baddbmm")) for n in ops.names)


def test_a_model_laid_out_splits_its_one_row_steps_and_restoring_undoes_it(tiny: Tiny, two_threads) -> None:
    stack = {"ffn": {"type": "glu", "activation": "silu", "d_ff": 256}, "norm": {"type": "rmsnorm"}}
    # every product's blocks of at least MIN_BLOCK features
    spec = tiny("decoder", embedding={"tie_output": False}, stack=stack, d_model=128, vocab_size=256)
    model = build_model(spec).eval()
    ids = torch.randint(0, spec.vocab_size, (1, 6))

    def batched_products() -> int:
        with torch.no_grad():
            out = model(ids, use_cache=True)
            with _Ops() as ops:
                model(ids[:, -1:], cache=out.cache)
        return sum(n.startswith(("bmm", "baddbmm")) for n in ops.names)

    plain = batched_products()  # attention's own (SDPA decomposes on some builds)
    lay_out_for_decoding(model)
    # every projection of the step (qkv, o, ffn up/down per layer, the head) is a batched product
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules()) - 1  # the head's proj is read by the head
    assert batched_products() == plain + linears + 1
    restore_layout(model)
    assert batched_products() == plain
    assert all(type(m) is not DecodingLinear for m in model.modules()) and not model.head.decoding


def test_a_model_laid_out_still_pickles_and_copies(tiny: Tiny, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import copy

    spec, model = _build(tiny, "llama-untied")
    lay_out_for_decoding(model)
    ids = torch.randint(0, spec.vocab_size, (1, 5))
    path = tmp_path / "model.pt"
    torch.save(model, path)
    for other in (torch.load(path, weights_only=False), copy.deepcopy(model)):
        assert any(type(m) is DecodingLinear for m in other.modules())
        with torch.no_grad():
            torch.testing.assert_close(other(ids).logits, model(ids).logits)


def test_for_several_rows_the_products_split_and_the_weights_stay(tiny: Tiny) -> None:
    spec, model = _build(tiny, "llama-untied")
    before = {name: p.data_ptr() for name, p in model.named_parameters()}
    ids = torch.randint(0, spec.vocab_size, (8, 6))
    with torch.no_grad():
        out = model(ids[:, :5], use_cache=True)
        step = model(ids[:, 5:], cache=out.cache).logits
    assert lay_out_for_decoding(model, rows=8) == 0  # nothing copied
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == before
    assert any(type(m) is DecodingLinear for m in model.modules()) and model.head.decoding
    with torch.no_grad():
        out = model(ids[:, :5], use_cache=True)
        torch.testing.assert_close(model(ids[:, 5:], cache=out.cache).logits, step, rtol=1e-5, atol=1e-5)


def test_laying_out_for_more_rows_puts_the_wide_weights_back_row_by_row(tiny: Tiny) -> None:
    spec, model = _build(tiny, "llama-untied")
    ids = torch.randint(0, spec.vocab_size, (8, 6))
    with torch.no_grad():
        out = model(ids[:, :5], use_cache=True)
        step = model(ids[:, 5:], cache=out.cache).logits
    moved = lay_out_for_decoding(model, rows=1)
    assert moved > 0 and not all(p.is_contiguous() for p in model.parameters())
    # the same model, now for beams of 8: what the first call laid out lies as PyTorch makes it
    assert lay_out_for_decoding(model, rows=8) == moved
    assert all(p.is_contiguous() for p in model.parameters())
    assert lay_out_for_decoding(model, rows=8) == 0
    with torch.no_grad():
        out = model(ids[:, :5], use_cache=True)
        torch.testing.assert_close(model(ids[:, 5:], cache=out.cache).logits, step, rtol=1e-5, atol=1e-5)
