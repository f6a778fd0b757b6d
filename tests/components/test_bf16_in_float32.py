"""bfloat16 autocast on a CPU without bfloat16 products: linear layers, the loss and attention
compute in float32 on the bfloat16-rounded factors (specformer.components.products), with
autocast's output dtypes, and values and gradients that equal a float64 computation on the
same rounded factors."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from specformer.builder import build_model
from specformer.components import products
from specformer.components.attention import eager_attention, sdpa_attention
from specformer.components.loss import linear_cross_entropy
from specformer.components.products import Linear, bf16_in_float32

BF16 = torch.bfloat16


@pytest.fixture
def in_float32(monkeypatch) -> None:
    monkeypatch.setattr(products, "BF16_IN_FLOAT32", True)


def _r(t: torch.Tensor) -> torch.Tensor:
    """t rounded to bfloat16, in float64 for the reference."""
    return t.detach().to(BF16).double()


def _autocast():
    return torch.autocast("cpu", dtype=BF16)


def test_the_path_is_taken_for_bf16_autocast_and_bf16_tensors_only(in_float32, monkeypatch) -> None:
    x32, xb = torch.ones(2, 2), torch.ones(2, 2, dtype=BF16)
    assert not bf16_in_float32(x32, x32)  # float32, no autocast
    assert bf16_in_float32(xb, xb)  # bfloat16 tensors (bf16-true)
    assert not bf16_in_float32(xb, x32)  # mixed, no autocast: torch's own rules
    with _autocast():
        assert bf16_in_float32(x32, x32)
    with torch.autocast("cpu", dtype=torch.float16):
        assert not bf16_in_float32(x32, x32)
    assert not bf16_in_float32(torch.ones(2, 2, dtype=BF16, device="meta"), xb)
    monkeypatch.setattr(products, "BF16_IN_FLOAT32", False)
    with _autocast():
        assert not bf16_in_float32(x32, x32)


def test_the_measurement_decides_where_unset(monkeypatch) -> None:
    monkeypatch.setattr(products, "BF16_IN_FLOAT32", None)
    products._measured_bf16.cache_clear()
    answer = products.bf16_products_in_float32()
    assert isinstance(answer, bool)
    assert products.bf16_products_in_float32() is answer  # measured once
    with _autocast():
        assert bf16_in_float32(torch.ones(1)) is answer


@pytest.mark.parametrize("bias", [True, False])
def test_a_linear_layer_gives_the_float64_product_of_the_rounded_factors(in_float32, bias) -> None:
    torch.manual_seed(0)
    layer = Linear(48, 40, bias=bias)
    x = torch.randn(3, 37, 48, requires_grad=True)
    with _autocast():
        y = layer(x)
    assert y.dtype == BF16
    want = F.linear(_r(x), _r(layer.weight), _r(layer.bias) if bias else None)
    torch.testing.assert_close(y.double(), want.to(BF16).double(), rtol=0, atol=0.01 * want.abs().max().item())
    g = torch.randn_like(y)
    y.backward(g)
    gd = g.double()
    assert x.grad.dtype == layer.weight.grad.dtype == torch.float32
    want_x = gd @ _r(layer.weight)
    torch.testing.assert_close(x.grad.double(), want_x, rtol=0.01, atol=0.01 * want_x.abs().max().item())
    # the weight's gradient is summed in float32 and never rounded to bfloat16
    want_w = gd.reshape(-1, 40).t() @ _r(x).reshape(-1, 48)
    torch.testing.assert_close(layer.weight.grad.double(), want_w, rtol=1e-5, atol=1e-5 * want_w.abs().max().item())
    if bias:
        torch.testing.assert_close(layer.bias.grad.double(), gd.reshape(-1, 40).sum(0), rtol=1e-5, atol=1e-4)


def test_a_linear_layer_agrees_with_torch_s_bf16_kernel(monkeypatch) -> None:
    torch.manual_seed(0)
    layer = Linear(64, 32)
    x = torch.randn(2, 40, 64, requires_grad=True)
    grads = []
    for setting in (True, False):
        monkeypatch.setattr(products, "BF16_IN_FLOAT32", setting)
        x.grad = None
        layer.zero_grad()
        with _autocast():
            y = layer(x)
        y.float().square().sum().backward()
        grads.append((y.float(), x.grad.clone(), layer.weight.grad.clone()))
    for ours, torch_s in zip(*grads, strict=True):
        torch.testing.assert_close(ours, torch_s, rtol=0.02, atol=0.02 * torch_s.abs().max().item())


@pytest.mark.parametrize("rows", [1, 4])
def test_a_decoding_step_s_few_rows_take_the_path_too(in_float32, recorded_ops, rows) -> None:
    """A step of decoding under autocast (a few rows, no gradient): the float32 product of the
    rounded factors, not torch's bfloat16 kernel."""
    torch.manual_seed(0)
    layer = Linear(48, 40)
    x = torch.randn(1, rows, 48)
    with torch.no_grad(), _autocast(), recorded_ops() as seen:
        y = layer(x)
    assert y.dtype == BF16
    products_run = [dtypes for name, dtypes in zip(seen.names, seen.dtypes, strict=True)
                    if name.split(".")[0] in ("mm", "addmm", "linear", "bmm", "baddbmm")]
    assert products_run and all(BF16 not in dtypes for dtypes in products_run)
    want = F.linear(_r(x), _r(layer.weight), _r(layer.bias))
    torch.testing.assert_close(y.double(), want.to(BF16).double(), rtol=0, atol=0.01 * want.abs().max().item())


def test_bf16_tensors_outside_autocast_keep_their_dtype(in_float32) -> None:
    layer = Linear(16, 8).to(BF16)
    x = torch.randn(4, 16, dtype=BF16, requires_grad=True)
    y = layer(x)
    y.float().sum().backward()
    assert y.dtype == x.grad.dtype == layer.weight.grad.dtype == layer.bias.grad.dtype == BF16
    torch.testing.assert_close(y.double(), F.linear(_r(x), _r(layer.weight), _r(layer.bias)).to(BF16).double())


def test_the_loss_is_float32_cross_entropy_of_the_rounded_factors(in_float32) -> None:
    torch.manual_seed(0)
    x = torch.randn(70, 24, requires_grad=True)
    w = torch.randn(50, 24, requires_grad=True)
    labels = torch.randint(0, 50, (70,))
    labels[::7] = -100
    with _autocast():
        loss = linear_cross_entropy(x, w, None, labels)
    loss.backward()
    xr, wr = _r(x).requires_grad_(), _r(w).requires_grad_()
    want = F.cross_entropy(xr @ wr.t(), labels, ignore_index=-100)
    want.backward()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), wr.grad, rtol=1e-5, atol=1e-6)
    with torch.no_grad(), _autocast():  # evaluation: the same value
        torch.testing.assert_close(linear_cross_entropy(x, w, None, labels).double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", [sdpa_attention, eager_attention])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_is_float32_attention_of_the_rounded_inputs(in_float32, backend, causal) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 24, 16, dtype=BF16, requires_grad=True)
    k = torch.randn(2, 2, 24, 16, dtype=BF16, requires_grad=True)
    v = torch.randn(2, 2, 24, 16, dtype=BF16, requires_grad=True)
    with _autocast():
        out, _ = backend(q, k, v, mask=None, is_causal=causal, scale=0.25, dropout=0.0)
    assert out.dtype == BF16
    out.float().square().sum().backward()
    refs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(refs[0], refs[1], refs[2], is_causal=causal, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(out.double(), want.to(BF16).double(), rtol=0, atol=0.02)
    want.to(BF16).double().square().sum().backward()
    for got, ref in zip((q, k, v), refs, strict=True):
        assert got.grad.dtype == BF16
        torch.testing.assert_close(got.grad.double(), ref.grad, rtol=0.02, atol=0.02 * ref.grad.abs().max().item())


def test_a_causal_model_trains_under_autocast_with_torch_s_gradients(monkeypatch, tiny) -> None:
    """A whole decoder under bf16 autocast: no position reads a later one, and loss and
    gradients agree with torch's bfloat16 kernels within bfloat16's rounding."""
    spec = tiny("decoder")
    torch.manual_seed(0)
    model = build_model(spec)
    ids = torch.randint(0, 61, (2, 20))
    results = []
    for setting in (True, False):
        monkeypatch.setattr(products, "BF16_IN_FLOAT32", setting)
        model.zero_grad(set_to_none=True)
        with _autocast():
            loss = model(ids[:, :-1], labels=ids[:, 1:]).loss
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (ours, ours_g), (native, native_g) = results
    torch.testing.assert_close(ours, native, rtol=0.01, atol=0.01)
    for a, b in zip(ours_g, native_g, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0.1, atol=0.05 * b.abs().max().item() + 1e-4)
    monkeypatch.setattr(products, "BF16_IN_FLOAT32", True)
    with torch.no_grad(), _autocast():
        changed = ids.clone()
        changed[:, 10:] = (changed[:, 10:] + 1) % 61
        a, b = model(ids).logits, model(changed).logits
    assert torch.equal(a[:, :10], b[:, :10])  # the causal mask holds
    assert not torch.equal(a[:, 10:], b[:, 10:])


def _dtype_recording_backend() -> tuple[object, list[tuple[str, tuple[torch.dtype, ...]]]]:
    """AOTAutograd with no compiler (as ``aot_eager``), recording each operation of the forward
    and backward graphs with the dtypes of its tensor arguments."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def record(gm: torch.fx.GraphModule, _inputs: object):  # noqa: ANN202
        for node in gm.graph.nodes:
            if node.op == "call_function":
                vals = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
                seen.append((str(node.target), tuple(v.dtype for v in vals if isinstance(v, torch.Tensor))))
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=record, bw_compiler=record), seen


# torch's products, and oneDNN's float32 one where a measurement found it faster than MKL's
_TORCH_PRODUCTS = ("aten.mm", "aten.bmm", "aten.addmm", "aten.baddbmm", "aten._scaled_dot_product",
                   "specformer.onednn_linear")


@pytest.mark.parametrize("model", ["rope-sdpa", "rope-eager", "t5-bias"])
def test_a_compiled_step_runs_every_product_in_float32_forward_and_backward(in_float32, tiny, loss_and_grads,
                                                                           model: str) -> None:
    """Autocast switched off inside a compiled region does not reach its backward pass: there
    every product would run in bfloat16 again. The products are operations autocast leaves
    alone, and the step equals the eager one."""
    stack = {"attention": {"backend": "eager"}} if model == "rope-eager" else {}
    positional = {"type": "t5", "num_buckets": 8, "max_distance": 16} if model == "t5-bias" else {"type": "rope"}
    built = build_model(tiny("decoder", stack=stack, positional=positional))
    ids = torch.randint(0, 61, (2, 33))
    torch._dynamo.reset()
    backend, seen = _dtype_recording_backend()
    loss, grads = loss_and_grads(torch.compile(built, backend=backend, fullgraph=True), ids, bf16=True)
    torch._dynamo.reset()
    torch_products = [(name, dtypes) for name, dtypes in seen if name.startswith(_TORCH_PRODUCTS)]
    assert torch_products  # attention's and the loss's, in float32
    assert all(BF16 not in dtypes for _, dtypes in torch_products), torch_products
    assert ("specformer.product_in_float32.default", (BF16, BF16, torch.float32)) in seen  # a projection's forward
    if model != "rope-sdpa":
        assert any(name == "specformer.float32_matmul.default" for name, _ in seen)
    want_loss, want_grads = loss_and_grads(built, ids, bf16=True)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3 * want.abs().max().item() + 1e-7)


def test_a_compiled_linear_layer_sums_its_weight_gradient_in_float32(in_float32) -> None:
    """Compiled by inductor: the weight's gradient is the float32 sum over the rounded factors
    (torch's bfloat16 product would round it to bfloat16, a relative error near 4e-3)."""
    torch.manual_seed(0)
    layer = Linear(48, 40)
    x = torch.randn(3, 37, 48)
    torch._dynamo.reset()
    with _autocast():
        y = torch.compile(layer, fullgraph=True)(x)
    assert y.dtype == BF16
    g = torch.randn_like(y)
    y.backward(g)
    torch._dynamo.reset()
    want_w = g.double().reshape(-1, 40).t() @ _r(x).reshape(-1, 48)
    torch.testing.assert_close(layer.weight.grad.double(), want_w, rtol=1e-5, atol=1e-5 * want_w.abs().max().item())
    want = F.linear(_r(x), _r(layer.weight), _r(layer.bias)).to(BF16).double()
    torch.testing.assert_close(y.double(), want, rtol=0, atol=0.01 * want.abs().max().item())
