"""The chunked linear cross-entropy equals the plain logits -> cross-entropy path, in value
and gradients, and the models' ``labels=`` loss equals cross-entropy of their logits."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.nn import functional as F

import specformer.components.loss as loss_module
from specformer.builder import build_model
from specformer.components.loss import linear_cross_entropy
from specformer.components.outputs import LogitsNotComputedError
from specformer.specs.schema import ModelSpec

Tiny = Callable[..., ModelSpec]


def _plain(x, w, b, y, smoothing=0.0, softcap=None):
    logits = F.linear(x, w, b)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, y, ignore_index=-100, label_smoothing=smoothing)


def _inputs(n=37, d=16, v=53, bias=True, ignore=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, d, generator=g, dtype=torch.float64).mul_(0.3).requires_grad_()
    b = torch.randn(v, generator=g, dtype=torch.float64).requires_grad_() if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    y[torch.rand(n, generator=g) < ignore] = -100
    return x, w, b, y


def _grads(fn, x, w, b, y, **kw):
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    out = fn(x, w, b, y, **kw)
    (out * 2.5).backward()  # a non-unit upstream gradient must scale every gradient
    return out.detach(), [t.grad.clone() for t in (x, w, b) if t is not None]


@pytest.mark.parametrize("chunk_elements", [53, 5 * 53, 1 << 22])  # one row per chunk, 5 rows, one chunk
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("softcap", [None, 0.7])  # a cap that binds: |logits| reach several units
def test_equals_plain_cross_entropy_and_gradients(monkeypatch, chunk_elements, smoothing, bias, softcap) -> None:
    monkeypatch.setattr(loss_module, "_CHUNK_ELEMENTS", chunk_elements)
    monkeypatch.setattr(loss_module, "_chunk_rows", lambda n, v, d: max(1, min(n, chunk_elements // v)))
    x, w, b, y = _inputs(bias=bias)
    want, want_grads = _grads(_plain, x, w, b, y, smoothing=smoothing, softcap=softcap)
    got, got_grads = _grads(linear_cross_entropy, x, w, b, y, label_smoothing=smoothing, softcap=softcap)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, e in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
def test_a_target_far_below_the_others_keeps_its_exact_loss(bias) -> None:
    # float32 on the CPU takes the loss from the target's probability, which underflows
    # (exp(-300) is 0 in float32) for rows 3 and 5: their losses come from the logits
    x, w, b, y = _inputs(n=9, bias=bias, ignore=0.0)
    x, w, b = (t.detach().float() if t is not None else None for t in (x, w, b))
    x[3] = w[y[3]] * -150.0
    x[5] = w[y[5]] * -60.0
    for t in (x, w, b):
        if t is not None:
            t.requires_grad_()
    with torch.no_grad():
        per_row = F.cross_entropy(F.linear(x, w, b), y, reduction="none")
    assert per_row[3] > 100 and per_row[5] > 100 and per_row.isfinite().all()
    want, want_grads = _grads(_plain, x, w, b, y)
    got, got_grads = _grads(linear_cross_entropy, x, w, b, y)
    assert torch.isfinite(got)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, e in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_chunk_rows_never_fewer_than_d_model() -> None:
    assert loss_module._chunk_rows(100_000, 50_257, 768) == 768  # 16 MiB would be 83 rows
    assert loss_module._chunk_rows(100_000, 1_000, 64) == 4194
    assert loss_module._chunk_rows(10, 1_000, 64) == 10


def test_no_grad_value_and_all_ignored_is_nan_as_torch() -> None:
    x, w, b, y = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(x, w, b, y), _plain(x, w, b, y))
    y_none = torch.full_like(y, -100)
    assert torch.isnan(_plain(x, w, b, y_none))
    assert torch.isnan(linear_cross_entropy(x, w, b, y_none))
    with torch.no_grad():
        assert torch.isnan(linear_cross_entropy(x, w, b, y_none))


def test_frozen_weight_gets_no_gradient() -> None:
    x, w, b, y = _inputs()
    w.requires_grad_(False)
    linear_cross_entropy(x, w, b, y).backward()
    assert w.grad is None and x.grad is not None and b.grad is not None


@pytest.mark.parametrize("rows_per_chunk", [300, 7])  # one chunk (kept gradients), 43 chunks (summed)
@pytest.mark.parametrize("softcap", [None, 0.5])
def test_bf16_autocast_matches_the_autocast_plain_path(monkeypatch, rows_per_chunk, softcap) -> None:
    monkeypatch.setattr(loss_module, "_chunk_rows", lambda n, v, d: min(n, rows_per_chunk))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 64, generator=g, requires_grad=True)
    w = (torch.randn(1000, 64, generator=g) * 0.05).requires_grad_()
    y = torch.randint(0, 1000, (300,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(x, w).float()
        want = F.cross_entropy(logits if softcap is None else softcap * torch.tanh(logits / softcap), y)
    want.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_cross_entropy(x, w, None, y, softcap=softcap)
    got.backward()
    assert got.dtype == torch.float32 and x.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    # both round the logits and the products to bf16 alike
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(x.grad, gx, rtol=2e-2, atol=2e-5)
    torch.testing.assert_close(w.grad, gw, rtol=2e-2, atol=2e-5)


@pytest.mark.parametrize(
    ("kind", "head"),
    [
        ("decoder", {"type": "lm"}),
        ("decoder", {"type": "lm", "bias": True}),
        ("encoder", {"type": "mlm"}),
        ("encoder-decoder", {"type": "lm", "scale_input": True}),
    ],
)
@pytest.mark.parametrize("tie", [True, False])
def test_model_labels_loss_equals_cross_entropy_of_its_logits(tiny: Tiny, kind, head, tie) -> None:
    torch.manual_seed(0)
    model = build_model(tiny(kind, head=head, embedding={"tie_output": tie})).double()
    ids = torch.randint(0, 61, (3, 9))
    labels = torch.randint(0, 61, (3, 9))
    labels[:, ::3] = -100
    kwargs = {"decoder_input_ids": torch.randint(0, 61, (3, 9))} if kind == "encoder-decoder" else {}

    logits = model(ids, **kwargs).logits
    want = F.cross_entropy(logits.reshape(-1, 61), labels.reshape(-1), ignore_index=-100, label_smoothing=0.1)
    want.backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    out = model(ids, labels=labels, label_smoothing=0.1, **kwargs)
    # never held: reading them says so, and how to get them (the head on the hidden states)
    with pytest.raises(LogitsNotComputedError, match=r"^logits were not computed: given labels, .*model.head\(out.hidden_states\)$"):
        _ = out.logits
    assert getattr(out, "logits", None) is None and "logits=<not computed: labels were given>" in repr(out)
    torch.testing.assert_close(model.head(out.hidden_states), logits)
    out.loss.backward()
    torch.testing.assert_close(out.loss, want, rtol=1e-10, atol=1e-12)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want_grads[name], rtol=1e-8, atol=1e-10, msg=name)


def test_mlm_head_computes_only_labelled_positions(tiny: Tiny) -> None:
    model = build_model(tiny("encoder", head={"type": "mlm"}))
    rows: list[int] = []
    model.head.transform.dense.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    labels = torch.full((2, 10), -100)
    labels[0, 3] = 5
    labels[1, 7] = 9
    model(torch.randint(0, 61, (2, 10)), labels=labels)
    assert rows == [2]


def test_classification_head_falls_back_to_its_logits(tiny: Tiny) -> None:
    model = build_model(tiny("encoder", head={"type": "classification", "n_classes": 3}))
    ids, labels = torch.randint(0, 61, (4, 6)), torch.tensor([0, 2, 1, 2])
    out = model(ids, labels=labels)
    assert out.logits.shape == (4, 3)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))


def test_mismatched_labels_are_a_clear_error(tiny: Tiny) -> None:
    model = build_model(tiny())
    ids = torch.randint(0, 61, (2, 8))
    with pytest.raises(ValueError, match=r"labels must have the shape of the positions, \(2, 8\), got \(2, 9\)"):
        model(ids, labels=torch.randint(0, 61, (2, 9)))
    x, w, b, y = _inputs()
    with pytest.raises(ValueError, match="expected x"):
        linear_cross_entropy(x, w, b, y[:-1])


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("label", [-1, -101, 61])
def test_labels_outside_the_vocabulary_are_a_clear_error(tiny: Tiny, grad: bool, label: int) -> None:
    # a label below 0 (other than -100) or >= V must not be scored as some class
    model = build_model(tiny())
    ids, labels = torch.randint(0, 61, (2, 8)), torch.randint(0, 61, (2, 8))
    labels[1, 3] = label
    with torch.set_grad_enabled(grad), pytest.raises(ValueError, match=rf"\[0, 61\) or -100 .*found {label}"):
        model(ids, labels=labels)


def test_labels_that_are_the_input_ids_themselves_are_refused_with_the_shift_to_make(tiny: Tiny) -> None:
    # Hugging Face's labels=input_ids, unshifted here, would train the model to copy its input
    model = build_model(tiny())
    ids = torch.randint(0, 61, (2, 8))
    with pytest.raises(ValueError, match=r"labels are input_ids itself.*model\(ids\[:, :-1\], labels=ids\[:, 1:\]\)"):
        model(ids, labels=ids)
    assert torch.isfinite(model(ids[:, :-1], labels=ids[:, 1:]).loss)
    assert torch.isfinite(model(ids, labels=ids.clone()).loss)  # equal values are the caller's choice
    t5 = build_model(tiny(kind="encoder-decoder"))
    with pytest.raises(ValueError, match=r"labels are decoder_input_ids itself.*decoder_input_ids=tgt\[:, :-1\]"):
        t5(ids, decoder_input_ids=ids, labels=ids)
    assert torch.isfinite(t5(ids, decoder_input_ids=ids[:, :-1], labels=ids[:, 1:]).loss)
    compiled = torch.compile(model, backend="eager")  # traced: the identity is seen, the storage is not
    with pytest.raises(ValueError, match=r"labels are input_ids itself"):
        compiled(ids, labels=ids)


def test_float_labels_are_a_clear_error(tiny: Tiny) -> None:
    model = build_model(tiny())
    ids = torch.randint(0, 61, (2, 8))
    with pytest.raises(TypeError, match="labels must be integer class indices.*torch.float32"):
        model(ids, labels=torch.randint(0, 61, (2, 8)).float())


def test_int32_labels_are_accepted(tiny: Tiny) -> None:
    model = build_model(tiny())
    ids, labels = torch.randint(0, 61, (2, 8)), torch.randint(0, 61, (2, 8))
    torch.testing.assert_close(model(ids, labels=labels.int()).loss, model(ids, labels=labels).loss)


def test_second_derivative_is_refused_not_silently_partial() -> None:
    # the saved gradients are constants: a second derivative through them would miss terms
    x, w, b, y = _inputs()
    s = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(s * linear_cross_entropy(x, w, b, y), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gx.sum().backward()


def test_classification_labels_are_checked_like_token_labels(tiny: Tiny) -> None:
    # the logits fallback gets the vocabulary heads' checks: any integer dtype, -100 ignored
    model = build_model(tiny("encoder", head={"type": "classification", "n_classes": 3})).eval()
    ids, labels = torch.randint(0, 61, (4, 6)), torch.tensor([0, 2, -100, 1])
    out = model(ids, labels=labels)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    for dtype in (torch.int32, torch.uint8):
        torch.testing.assert_close(model(ids[:2], labels=labels[:2].to(dtype)).loss, model(ids[:2], labels=labels[:2]).loss)
    for bad in (3, 5, -1):
        with pytest.raises(ValueError, match=rf"^labels must be class indices in \[0, 3\) or -100 \(no label\); found {bad}$"):
            model(ids, labels=torch.tensor([0, bad, 1, 2]))
    with pytest.raises(TypeError, match=r"^labels must be integer class indices \(or -100: no label\), got torch.float32$"):
        model(ids, labels=labels.float())
    with pytest.raises(ValueError, match=r"^labels must be \(batch,\) = \(4,\), one class index per sequence of the "
                       r"head's logits \(4, 3\); got shape \(4, 6\)$"):
        model(ids, labels=torch.zeros(4, 6, dtype=torch.long))


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("smoothing", [1.5, -0.1, float("nan")])
@pytest.mark.parametrize("head", [{"type": "lm"}, {"type": "mlm"}, {"type": "classification"}])
def test_label_smoothing_outside_0_1_is_a_clear_error(tiny: Tiny, grad: bool, smoothing: float, head: dict) -> None:
    # torch refuses only > 1, and only without gradients: a training step would go on with it
    model = build_model(tiny("encoder", head=head))
    ids = torch.randint(0, 61, (2, 8))
    labels = ids if head["type"] != "classification" else torch.tensor([0, 1])
    with torch.set_grad_enabled(grad), pytest.raises(ValueError, match=r"^label_smoothing must be in \[0, 1\]"):
        model(ids, labels=labels, label_smoothing=smoothing)
    x, w, b, y = _inputs()
    with torch.set_grad_enabled(grad), pytest.raises(ValueError, match=r"^label_smoothing must be in \[0, 1\]"):
        linear_cross_entropy(x, w, b, y, label_smoothing=smoothing)
    for fine in (0.0, 1.0):
        assert torch.isfinite(model(ids, labels=labels, label_smoothing=fine).loss)


def test_the_loss_traces_into_one_graph_under_torch_compile(tiny: Tiny) -> None:
    # training.compile traces the training step; the label check reads its result on the
    # host, a graph break, so it is skipped while tracing, as the models' id checks are
    model = build_model(tiny())
    ids, labels = torch.randint(0, 61, (2, 8)), torch.randint(0, 61, (2, 8))
    labels[0, :3] = -100
    want = model(ids, labels=labels).loss
    got = torch.compile(model, fullgraph=True, backend="eager")(ids, labels=labels).loss
    torch.testing.assert_close(got, want)
    x, w, b, y = _inputs()
    got = torch.compile(linear_cross_entropy, fullgraph=True, backend="eager")(x, w, b, y)
    torch.testing.assert_close(got, linear_cross_entropy(x, w, b, y))
