"""Float32 products through oneDNN (specformer.components.products): the same values and
gradients as torch's own, taken only where they qualify, and in every linear layer."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from specformer.builder import build_model
from specformer.components import products
from specformer.components.products import Linear, add_mm_nt_, linear, mm_nt

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture
def onednn(monkeypatch) -> list[tuple[int, ...]]:
    """oneDNN on, whatever this machine measures; the shapes of the inputs it multiplied."""
    monkeypatch.setattr(products, "ONEDNN", True)
    calls: list[tuple[int, ...]] = []
    real = products._pointwise
    monkeypatch.setattr(products, "_pointwise", lambda x, w, b=None: calls.append(tuple(x.shape)) or real(x, w, b))
    return calls


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.parametrize("shape", [(64, 24), (3, 40, 24)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("transposed", [False, True])
def test_linear_gives_f_linear_values_and_gradients(onednn, shape, bias: bool, transposed: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(*shape[:-1], 24).requires_grad_()
    if transposed:  # a non-contiguous input, as a transposed activation is
        x = torch.randn(24, *shape[:-1]).movedim(0, -1).requires_grad_()
    w = torch.randn(16, 24, requires_grad=True)
    b = torch.randn(16, requires_grad=True) if bias else None
    g = torch.randn(*shape[:-1], 16)
    out = linear(x, w, b)
    grads = torch.autograd.grad(out, [t for t in (x, w, b) if t is not None], g)
    want = F.linear(x, w, b)
    want_grads = torch.autograd.grad(want, [t for t in (x, w, b) if t is not None], g)
    assert onednn  # the oneDNN product ran
    assert _close(out, want)
    for got, ref in zip(grads, want_grads, strict=True):
        assert _close(got, ref)


@pytest.mark.parametrize("layout", ["a row slice of a wider matrix", "every other row"])
def test_a_weight_whose_rows_are_apart_stays_with_torch(onednn, layout: str) -> None:
    # oneDNN reads such a weight through a reference path, ~1,000x as slow: F.linear's product
    x = torch.randn(64, 24, requires_grad=True)
    w = (torch.randn(16, 40)[:, :24] if layout == "a row slice of a wider matrix" else torch.randn(32, 24)[::2])
    w.requires_grad_()
    assert not w.is_contiguous() and w.stride(0) != 1
    out = linear(x, w)
    out.sum().backward()
    assert not onednn and _close(out, F.linear(x, w)) and mm_nt(x, w) is not None and not onednn
    column_major = torch.randn(24, 16).t()  # read at speed: taken
    assert _close(linear(x, column_major), F.linear(x, column_major)) and onednn


def test_an_input_of_scattered_rows_and_columns_is_read_at_speed_for_the_weight_gradient(monkeypatch, onednn) -> None:
    # the weight's gradient multiplies by the input transposed, as the product's right factor;
    # one whose rows and columns are both apart is made contiguous first
    seen: list[bool] = []
    real = products._pointwise
    monkeypatch.setattr(products, "_pointwise",
                        lambda a, w, b=None: seen.append(products._dense_weight(w)) or real(a, w, b))
    x = torch.randn(128, 96)[::2, ::2].requires_grad_()  # (64, 48), strides (192, 2)
    w = torch.randn(16, 48, requires_grad=True)
    g = torch.randn(64, 16)
    grads = torch.autograd.grad(linear(x, w), (x, w), g)
    want = torch.autograd.grad(F.linear(x, w), (x, w), g)
    assert len(seen) == 3 and all(seen)  # forward, the input's gradient, the weight's
    assert all(_close(a, b) for a, b in zip(grads, want, strict=True))


def test_the_gradient_of_a_sum_is_taken_too(onednn) -> None:
    # out.sum().backward() hands the product an expanded (stride 0) gradient
    x = torch.randn(40, 8, requires_grad=True)
    w = torch.randn(5, 8, requires_grad=True)
    linear(x, w).sum().backward()
    assert _close(x.grad, w.sum(0).expand(40, 8)) and _close(w.grad, x.sum(0).expand(5, 8))


def test_only_float32_products_of_enough_rows_outside_autocast_take_onednn(onednn) -> None:
    w = torch.randn(16, 24)

    def takes(x: torch.Tensor, weight: torch.Tensor = w) -> bool:
        onednn.clear()
        linear(x, weight)
        return bool(onednn)

    assert takes(torch.randn(products.MIN_ROWS, 24))
    assert takes(torch.randn(2, products.MIN_ROWS // 2, 24))
    assert not takes(torch.randn(products.MIN_ROWS - 1, 24))  # decoding's few rows
    assert not takes(torch.randn(64, 24, dtype=torch.float64), w.double())
    assert not takes(torch.randn(64, 24).bfloat16(), w.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's own bf16 products
        assert not takes(torch.randn(64, 24))
    products.ONEDNN = False
    assert not takes(torch.randn(64, 24))


def test_the_loss_products_give_the_same_sums(onednn) -> None:
    a, b, c = torch.randn(64, 24), torch.randn(40, 24), torch.randn(64, 40)
    bias = torch.randn(40)
    assert _close(mm_nt(a, b, bias), a @ b.t() + bias)
    assert _close(add_mm_nt_(c.clone(), a, b), c + a @ b.t())
    assert len(onednn) == 2


def test_every_linear_layer_and_the_head_take_onednn_in_a_training_step(onednn, monkeypatch, loss_and_grads) -> None:
    from specformer.specs.loader import load_spec

    spec = load_spec("gpt-nano", overrides=["d_model=64", "decoder.n_layers=2", "vocab_size=300",
                                            "embedding.tie_output=false"])
    model = build_model(spec)
    assert all(type(m) is Linear for m in model.modules() if isinstance(m, nn.Linear))
    ids = torch.randint(0, 300, (2, 65))
    loss, grads = loss_and_grads(model, ids)
    products_run = len(onednn)
    monkeypatch.setattr(products, "ONEDNN", False)
    want_loss, want_grads = loss_and_grads(model, ids)
    # per layer: qkv, o, up, down, forward and two backward each; the head's in the loss
    assert products_run >= 2 * 4 * 3 + 3
    assert torch.allclose(loss, want_loss, rtol=1e-5)
    for got, want in zip(grads, want_grads, strict=True):
        assert torch.allclose(got, want, rtol=1e-3, atol=1e-5 * want.abs().max().item())


def test_a_measurement_compares_the_fastest_timings_so_a_busy_machine_does_not_flip_it(monkeypatch) -> None:
    # the baseline (a bfloat16 product) is twice as fast as the candidate (its float32 form), but
    # other work on the machine stretched two of its three timings: compared by medians, the
    # candidate would look faster by the margin and the slow path would be taken
    now = [0.0]
    seconds = {"candidate": [3.0] * 4, "baseline": [1.5, 10.0, 10.0, 1.5]}  # the set-up run first

    def timed(name: str):  # each call advances a fake clock by its time
        def run() -> None:
            now[0] += seconds[name].pop(0)
        return run

    monkeypatch.setattr(products.time, "perf_counter", lambda: now[0])
    assert products.measured_faster(timed("candidate"), timed("baseline"), margin=0.5, rounds=3) is False
    seconds.update(candidate=[3.0] * 4, baseline=[10.0] * 4)  # slower every time: then it is slower
    assert products.measured_faster(timed("candidate"), timed("baseline"), margin=0.5, rounds=3) is True


def test_the_measurement_decides_once_and_a_setting_overrides_it(monkeypatch) -> None:
    products._measured.cache_clear()
    monkeypatch.setattr(products, "ONEDNN", None)
    first = products.onednn_is_faster()
    assert isinstance(first, bool) and products.onednn_is_faster() is first
    assert products._measured.cache_info().misses == 1
    for setting in (True, False):
        monkeypatch.setattr(products, "ONEDNN", setting)
        assert products.onednn_is_faster() is setting


@pytest.mark.parametrize(("small", "larger"), [(True, True), (True, False), (False, True)])
def test_onednn_is_taken_only_where_faster_at_a_small_and_a_larger_product(monkeypatch, small, larger) -> None:
    # a near tie at the small product (an AMD Zen 3) must not send a prompt's products to a slower library
    faster = {products.PROBE_SHAPE: small, products.PROBE_SHAPE_LARGER: larger}
    timed: list[tuple[int, int, int]] = []

    def faster_at(shape: tuple[int, int, int], *, calls: int, rounds: int = 5) -> bool:
        timed.append(shape)
        return faster[shape]

    monkeypatch.setattr(products, "_onednn_faster_at", faster_at)
    monkeypatch.setattr(products, "ONEDNN", None)
    products._measured.cache_clear()
    try:
        assert products.onednn_is_faster() is (small and larger)
    finally:
        products._measured.cache_clear()
    assert timed == ([products.PROBE_SHAPE, products.PROBE_SHAPE_LARGER] if small else [products.PROBE_SHAPE])


def test_a_flop_counter_counts_the_products_as_torch_s_own(onednn) -> None:
    # FlopCounterMode has no formula for oneDNN's product: under it, the products stay mm
    from torch.utils.flop_counter import FlopCounterMode

    x, w = torch.randn(64, 24, requires_grad=True), torch.randn(16, 24, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        linear(x, w).sum().backward()
    assert counter.get_total_flops() == 3 * 2 * 64 * 24 * 16
    assert not onednn


def test_the_measurement_runs_outside_the_mode_of_the_first_product(monkeypatch, recorded_ops) -> None:
    # a dispatch mode around the first product (a recorder, a counter) never sees the timing runs
    products._measured.cache_clear()
    monkeypatch.setattr(products, "ONEDNN", None)
    with recorded_ops() as seen:
        products.onednn_is_faster()
    assert seen.names == []


def test_a_measurement_runs_outside_the_callers_modes_autocast_and_saved_tensor_hooks(recorded_ops) -> None:
    # a memory count or activation offloading around the first call never sees the timing's tensors
    seen: dict[str, object] = {}

    @products.measurement
    def probe() -> bool:
        x = torch.randn(8, 8, requires_grad=True)
        seen["autocast"] = torch.is_autocast_enabled("cpu")
        (x * x).sum().backward()
        return True

    packed: list[torch.Tensor] = []
    with (recorded_ops() as ops, torch.autocast("cpu", dtype=torch.bfloat16),
          torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t)):
        assert probe() is True
        y = torch.randn(4, requires_grad=True)
        (y * y).sum()
    assert ops.names[0] == "randn.default" and "mul.Tensor" in ops.names  # the caller's own work is recorded ...
    assert len(packed) == 2 and all(t.shape == (4,) for t in packed)  # ... and its saved tensors
    assert seen == {"autocast": False}


def test_a_weight_laid_out_column_by_column_gives_the_same_product(onednn) -> None:
    # lay_out_for_decoding stores wide weights column-major; a prefill of many rows reads them so
    w = torch.randn(48, 24).t().contiguous().t()
    assert not w.is_contiguous()
    x = torch.randn(2, 40, 24)
    assert _close(linear(x, w), F.linear(x, w)) and onednn


def test_torch_func_grad_runs_the_plain_kernels_and_gives_autograd_s_gradients(monkeypatch, tiny, loss_and_grads) -> None:
    # the faster kernels' custom autograd functions take no part in torch.func transforms; under
    # one the plain torch path runs (products, attention, the chunked loss), and the gradients
    # are autograd's
    from specformer.components import attention

    monkeypatch.setattr(products, "ONEDNN", True)
    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_PRODUCT_ROWS", 64)
    model = build_model(tiny(positional={"type": "rope"}, max_seq_len=160))
    ids = torch.randint(0, 61, (2, 141))
    want_loss, want = loss_and_grads(model, ids)
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(model, params, (ids[:, :-1],), {"labels": ids[:, 1:]}).loss

    assert not products.in_functorch_transform()
    got = torch.func.grad(loss)(params)
    assert torch.allclose(loss(params), want_loss, atol=1e-5)
    for (name, _), grad in zip(model.named_parameters(), want, strict=True):
        assert torch.allclose(got[name], grad, rtol=1e-4, atol=1e-6), name
