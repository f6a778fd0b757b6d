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
    moved = lay_out_for_decoding(model, measure=False)
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
    assert lay_out_for_decoding(model, measure=False) == 0  # already laid out
    assert restore_layout(model) == moved
    assert all(p.is_contiguous() for p in model.parameters())


def test_the_vocabulary_projection_is_laid_out_once_tied_or_not(tiny: Tiny) -> None:
    _, tied = _build(tiny, "gpt-tied")
    _, untied = _build(tiny, "llama-untied")
    lay_out_for_decoding(tied, measure=False)
    lay_out_for_decoding(untied, measure=False)
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
    lay_out_for_decoding(model, measure=False)
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
    lay_out_for_decoding(model, measure=False)
    with torch.no_grad():
        torch.testing.assert_close(model(src, decoder_input_ids=tgt).logits, logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(generate_seq2seq(model, src, start_id=0, eos_id=None, max_new_tokens=8), greedy)


def test_state_dict_is_unchanged_and_training_resumes_after_restoring(tiny: Tiny) -> None:
    spec, model = _build(tiny, "llama-untied")
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    lay_out_for_decoding(model, measure=False)
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
    assert lay_out_for_decoding(model, measure=False) == 0


@pytest.fixture
def two_threads():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("layout", ["rows", "columns"])
@pytest.mark.parametrize("bias", [True, False])
def test_a_one_row_product_is_split_over_the_threads_with_the_same_result(two_threads, layout: str, bias: bool, recorded_ops) -> None:
    from specformer.components.layout import decode_linear

    weight = torch.randn(384, 96)
    if layout == "columns":
        weight = weight.t().contiguous().t()
    b = torch.randn(384) if bias else None
    x = torch.randn(1, 1, 96)
    with torch.no_grad(), recorded_ops() as ops:
        y = decode_linear(x, weight, b)
    assert [n for n in ops.names if "mm" in n] == ["baddbmm.default" if bias else "bmm.default"]  # 2 blocks, one product
    assert y.shape == (1, 1, 384)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, weight, b), rtol=1e-6, atol=1e-5)
    # a few rows (8 tokens of a batch, as a decoding step of 8 sequences): split the same way
    few = torch.randn(4, 2, 96)
    with torch.no_grad(), recorded_ops() as ops:
        y = decode_linear(few, weight, b)
    assert [n for n in ops.names if "mm" in n] == ["baddbmm.default" if bias else "bmm.default"]
    torch.testing.assert_close(y, torch.nn.functional.linear(few, weight, b), rtol=1e-6, atol=1e-5)
    # more rows (a prompt), autograd, or one thread: the plain product
    for args, grad in (((torch.randn(9, 1, 96), weight, b), False), ((x, weight, b), True)):
        with torch.set_grad_enabled(grad), recorded_ops() as ops:
            decode_linear(*args)
        assert not any(n.startswith(("bmm", "baddbmm")) for n in ops.names)
    torch.set_num_threads(1)
    with torch.no_grad(), recorded_ops() as ops:
        decode_linear(x, weight, b)
    assert not any(n.startswith(("bmm", "baddbmm")) for n in ops.names)


def test_a_model_laid_out_splits_its_one_row_steps_and_restoring_undoes_it(tiny: Tiny, two_threads, recorded_ops) -> None:
    stack = {"ffn": {"type": "glu", "activation": "silu", "d_ff": 256}, "norm": {"type": "rmsnorm"}}
    # every product's blocks of at least MIN_BLOCK features
    spec = tiny("decoder", embedding={"tie_output": False}, stack=stack, d_model=128, vocab_size=256)
    model = build_model(spec).eval()
    ids = torch.randint(0, spec.vocab_size, (1, 6))

    def batched_products() -> int:
        with torch.no_grad():
            out = model(ids, use_cache=True)
            with recorded_ops() as ops:
                model(ids[:, -1:], cache=out.cache)
        return sum(n.startswith(("bmm", "baddbmm")) for n in ops.names)

    plain = batched_products()  # attention's own (SDPA decomposes on some builds)
    lay_out_for_decoding(model, measure=False)
    # every projection of the step (qkv, o, ffn up/down per layer, the head) is a batched product
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules()) - 1  # the head's proj is read by the head
    assert batched_products() == plain + linears + 1
    restore_layout(model)
    assert batched_products() == plain
    assert all(type(m) is not DecodingLinear for m in model.modules()) and not model.head.decoding


def test_a_model_laid_out_still_pickles_and_copies(tiny: Tiny, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import copy

    spec, model = _build(tiny, "llama-untied")
    lay_out_for_decoding(model, measure=False)
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
    assert lay_out_for_decoding(model, rows=8, measure=False) == 0  # nothing copied
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
    moved = lay_out_for_decoding(model, rows=1, measure=False)
    assert moved > 0 and not all(p.is_contiguous() for p in model.parameters())
    # the same model, now for beams of 8: what the first call laid out lies as PyTorch makes it
    assert lay_out_for_decoding(model, rows=8, measure=False) == moved
    assert all(p.is_contiguous() for p in model.parameters())
    assert lay_out_for_decoding(model, rows=8, measure=False) == 0
    with torch.no_grad():
        out = model(ids[:, :5], use_cache=True)
        torch.testing.assert_close(model(ids[:, 5:], cache=out.cache).logits, step, rtol=1e-5, atol=1e-5)


def test_the_choice_takes_what_measured_faster_by_the_margin() -> None:
    from specformer.components.layout import MEASURE_MARGIN, choose_layout

    # two layers' (8, 4) and (4, 8) projections, then a tied (16, 4) head
    q1, q2, down1, down2, head = torch.empty(8, 4), torch.empty(8, 4), torch.empty(4, 8), torch.empty(4, 8), torch.empty(16, 4)
    weights = [q1, down1, q2, down2, head]
    wide = {id(q1), id(q2), id(head)}
    # (whole, split) per product, row by row and column by column; a shape's products are chosen for together
    rowwise = ([10.0, 10.0, 10.0, 10.0, 20.0], [4.0, 9.9, 8.0, 9.8, 30.0])
    colwise = ([3.0, 10.0, 3.0, 10.0, 25.0], [5.0, 9.9, 5.0, 9.8, 15.0])
    layout, split = choose_layout(weights, rowwise, colwise, wide)
    # q: column by column whole 6 beats row by row split 12; down: a split at 19.7 of 20 is within the margin;
    # head: column by column split 15 beats 20
    assert layout == {id(q1): True, id(q2): True, id(down1): False, id(down2): False, id(head): True}
    assert split == [False, False, False, False, True]
    # one product alone faster split does not split its shape: 4 + 12 against 10 + 10
    rowwise = ([10.0, 10.0, 10.0, 10.0, 20.0], [4.0, MEASURE_MARGIN * 10.0, 12.0, MEASURE_MARGIN * 10.0, 30.0])
    layout, split = choose_layout(weights, rowwise, None, wide)  # more rows: no layout measured
    assert not any(layout.values())
    assert split == [True, True, True, True, False]  # q: 16 of 20; down: exactly the margin


def test_the_measured_layout_is_applied_product_by_product(tiny: Tiny, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import specformer.components.layout as layout

    spec, model = _build(tiny, "llama-untied")
    ids = torch.randint(0, spec.vocab_size, (1, 9))
    with torch.no_grad():
        step = model(ids[:, -1:], cache=model(ids[:, :-1], use_cache=True).cache).logits
    head = model.head.proj.weight
    calls = []

    def fake(products, rows):  # type: ignore[no-untyped-def]
        # measured twice: row by row, then (one row) with every wide weight column by column
        column = head.t().is_contiguous() and not head.is_contiguous()
        calls.append((rows, column))
        n = len(products)
        whole = [1.0] * n
        first = products[0][1].shape  # only the products of the first one's shape split faster
        split = [0.5 if w.shape == first else 1.0 for _, w, _ in products]
        if column:  # and only the head reads faster column by column
            whole = [0.5 if w is head else 2.0 for _, w, _ in products]
        return whole, split

    monkeypatch.setattr(layout, "_measure", fake)
    moved = lay_out_for_decoding(model)
    assert calls == [(1, False), (1, True)]
    assert moved == head.numel() * 4
    assert head.t().is_contiguous() and not head.is_contiguous()
    assert all(p.is_contiguous() for p in model.parameters() if p is not head)
    linears = [m for m in model.decoder.modules() if isinstance(m, torch.nn.Linear)]
    assert all(type(m) is DecodingLinear for m in linears)
    assert [m.split for m in linears] == [m.weight.shape == linears[0].weight.shape for m in linears]
    assert 1 < sum(m.split for m in linears) < len(linears)  # one projection of every layer
    assert model.head.decoding is False
    with torch.no_grad():
        out = model(ids[:, :-1], use_cache=True)
        torch.testing.assert_close(model(ids[:, -1:], cache=out.cache).logits, step, rtol=1e-5, atol=1e-5)
    calls.clear()
    assert lay_out_for_decoding(model, rows=4) == moved  # more rows: measured row by row only
    assert calls == [(4, False)] and all(p.is_contiguous() for p in model.parameters())


def test_a_large_model_is_timed_on_a_sample_and_each_shape_takes_its_choice(tiny: Tiny, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a 7B decoder in float32 timed product by product would take minutes; past MEASURE_BYTES
    # the first products are timed, and one of each shape that comes later (the head's)
    import specformer.components.layout as layout

    spec = tiny("decoder", embedding={"tie_output": False}, decoder={"n_layers": 4}, stack={
        "ffn": {"type": "glu", "activation": "silu", "d_ff": 96}, "norm": {"type": "rmsnorm"}})
    model = build_model(spec).eval()
    products = layout._products(model)
    layer = [p for p in products if ".layers.0." in _name(model, p[0])]
    size = sum(w.numel() * w.element_size() for _, w, _ in layer)
    monkeypatch.setattr(layout, "MEASURE_BYTES", size)  # one layer's worth
    timed: list[list[torch.Tensor]] = []
    column_then: list[list[bool]] = []
    head = model.head.proj.weight

    def fake(sample, rows):  # type: ignore[no-untyped-def]
        timed.append([w for _, w, _ in sample])
        column_then.append([not p.is_contiguous() for p in model.parameters()])
        first = sample[0][1].shape  # the first shape splits faster, the head reads faster column by column
        split = [0.5 if w.shape == first else 1.0 for _, w, _ in sample]
        whole = [0.5 if (w is head and len(timed) == 2) else 1.0 for _, w, _ in sample]
        return whole, split

    monkeypatch.setattr(layout, "_measure", fake)
    lay_out_for_decoding(model)
    assert len(timed) == 2 and [id(w) for w in timed[0]] == [id(w) for w in timed[1]]
    assert [id(w) for w in timed[0]] == [id(w) for _, w, _ in layer] + [id(head)]
    # the column-by-column pass copied only the timed wide weights
    sampled = {id(w) for w in timed[0]}
    moved = [p for p, c in zip(model.parameters(), column_then[1], strict=True) if c]
    assert moved and all(id(p) in sampled for p in moved)
    # every product takes its shape's choice, timed or not
    linears = [m for m in model.decoder.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 4 * len(layer)
    assert [m.split for m in linears] == [m.weight.shape == layer[0][1].shape for m in linears]
    assert head.t().is_contiguous() and not head.is_contiguous()
    assert all(p.is_contiguous() for p in model.parameters() if p is not head)


def _name(model: torch.nn.Module, module: torch.nn.Module) -> str:
    return next(f".{n}." for n, m in model.named_modules() if m is module)


@pytest.mark.parametrize("rows", [1, 4])
def test_a_measured_layout_splits_what_it_chose_and_changes_no_output(tiny: Tiny, two_threads, rows: int, recorded_ops) -> None:
    stack = {"ffn": {"type": "glu", "activation": "silu", "d_ff": 256}, "norm": {"type": "rmsnorm"}}
    spec = tiny("decoder", embedding={"tie_output": False}, stack=stack, d_model=128, vocab_size=256)
    model = build_model(spec).eval()
    ids = torch.randint(0, spec.vocab_size, (rows, 6))

    def step() -> tuple[torch.Tensor, int]:
        with torch.no_grad():
            out = model(ids[:, :-1], use_cache=True)
            with recorded_ops() as ops:
                logits = model(ids[:, -1:], cache=out.cache).logits
        return logits, sum(n.startswith(("bmm", "baddbmm")) for n in ops.names)

    logits, plain = step()
    lay_out_for_decoding(model, rows=rows)  # whatever this machine measured faster
    chosen = [m.split for m in model.modules() if type(m) is DecodingLinear and m is not model.head.proj]
    assert len(chosen) == sum(isinstance(m, torch.nn.Linear) for m in model.decoder.modules()) >= 8
    laid_out, batched = step()
    torch.testing.assert_close(laid_out, logits, rtol=1e-5, atol=1e-5)
    assert batched == plain + sum(chosen) + model.head.decoding
    assert all(p.is_contiguous() or (rows == 1 and p.t().is_contiguous()) for p in model.parameters())


def test_restoring_gives_each_linear_layer_its_own_class_back(tiny: Tiny) -> None:
    # specformer's layers stay specformer's Linear (its float32 products through oneDNN where
    # faster); a plain nn.Linear, as a plugin's, becomes a plain one again
    from specformer.components.products import Linear

    model = build_model(tiny("decoder")).eval()
    layer = model.decoder.layers[0]
    layer.ffn.down_proj.__class__ = torch.nn.Linear
    before = {name: type(m) for name, m in model.named_modules()}
    assert Linear in before.values()
    lay_out_for_decoding(model, measure=False)
    assert type(layer.ffn.down_proj) is DecodingLinear
    restore_layout(model)
    assert {name: type(m) for name, m in model.named_modules()} == before
    assert not any(hasattr(m, "plain_class") for m in model.modules())
