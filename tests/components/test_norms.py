"""RMSNorm (specformer.components.norms): torch's values and gradients from the CPU float32
kernels, only the input and the per-row scale kept, and torch's own path everywhere else."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn import functional as F

from specformer.components import norms
from specformer.components.norms import RMSNorm


def _norm(dim: int, eps: float | None = 1e-6) -> RMSNorm:
    torch.manual_seed(0)
    norm = RMSNorm(dim, eps=eps)
    with torch.no_grad():
        norm.weight.normal_()
    return norm


@pytest.fixture
def calls(monkeypatch) -> list[tuple[int, ...]]:
    """The shapes the CPU kernels normalised."""
    seen: list[tuple[int, ...]] = []
    real = norms._RMSNormFunction.apply
    monkeypatch.setattr(norms._RMSNormFunction, "apply", lambda x, w, eps: seen.append(tuple(x.shape)) or real(x, w, eps))
    return seen


@pytest.mark.parametrize("shape", [(7, 48), (2, 5, 48)])
@pytest.mark.parametrize("eps", [1e-6, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # float64: training.precision 64
def test_values_and_gradients_are_torchs(calls, shape, eps, dtype) -> None:
    norm = _norm(48, eps).to(dtype)
    x = (torch.randn(*shape, dtype=dtype) * 3 + 1).requires_grad_()
    g = torch.randn(*shape, dtype=dtype)
    y = norm(x)
    dx, dw = torch.autograd.grad(y, (x, norm.weight), g)
    ref = F.rms_norm(x, (48,), norm.weight, eps)
    ref_dx, ref_dw = torch.autograd.grad(ref, (x, norm.weight), g)
    assert calls == [shape]
    assert y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(y, ref, rtol=tol, atol=tol)
    torch.testing.assert_close(dx, ref_dx, rtol=tol, atol=tol)
    torch.testing.assert_close(dw, ref_dw, rtol=tol, atol=tol)


def test_gradients_pass_gradcheck_in_float64_arithmetic() -> None:
    # the backward's formula, checked against finite differences
    torch.manual_seed(0)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: norms._RMSNormFunction.apply(a, b, 1e-5), (x, w))


def test_gradients_of_gradients_are_torchs(calls) -> None:
    # double backward (a gradient penalty, a Hessian-vector product) differentiates the
    # backward pass: torch's own graph of it, as nn.RMSNorm gives
    norm = _norm(24)
    x = torch.randn(5, 24, requires_grad=True)

    def penalty(forward) -> list[torch.Tensor]:
        (dx,) = torch.autograd.grad(forward(x).pow(3).sum(), (x,), create_graph=True)
        return list(torch.autograd.grad(dx.square().sum(), (x, norm.weight)))

    got = penalty(norm)
    assert calls == [(5, 24)]
    want = penalty(lambda x: F.rms_norm(x, (24,), norm.weight, 1e-6))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    x64, w64 = x.detach().double().requires_grad_(), norm.weight.detach().double().requires_grad_()
    assert torch.autograd.gradgradcheck(lambda a, b: norms._RMSNormFunction.apply(a, b, 1e-5), (x64, w64))


def test_under_bfloat16_autocast_a_float32_input_stays_float32(calls) -> None:
    norm = _norm(32)
    x = torch.randn(3, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
        ref = F.rms_norm(x, (32,), norm.weight, 1e-6)
    assert calls and y.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(y, ref)


def test_a_frozen_weight_or_input_gets_no_gradient(calls) -> None:
    norm = _norm(16)
    norm.weight.requires_grad_(False)
    x = torch.randn(5, 16, requires_grad=True)
    (dx,) = torch.autograd.grad(norm(x).square().sum(), (x,))
    ref = torch.autograd.grad(F.rms_norm(x, (16,), norm.weight, 1e-6).square().sum(), (x,))[0]
    torch.testing.assert_close(dx, ref)
    norm.weight.requires_grad_(True)
    y = norm(torch.randn(5, 16))  # an input that needs no gradient: the weight's alone
    (dw,) = torch.autograd.grad(y.sum(), (norm.weight,))
    assert dw.shape == (16,) and dw.abs().sum() > 0


def test_keeps_only_the_input_and_the_row_scale() -> None:
    # torch's composite RMSNorm also keeps the normalised rows: N x D floats more
    norm = _norm(64)
    x = torch.randn(2, 32, 64, requires_grad=True)
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() != norm.weight.untyped_storage().data_ptr():
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        norm(x)
    assert sorted(kept.values()) == [2 * 32 * 4, 2 * 32 * 64 * 4]


@pytest.mark.parametrize(("x_dtype", "w_dtype"), [
    (torch.bfloat16, torch.float32),  # qk-norm under bfloat16 autocast
    (torch.bfloat16, torch.bfloat16),  # training.precision bf16-true
    (torch.float16, torch.float32),
    (torch.float32, torch.bfloat16),
])
def test_half_precision_rows_give_torchs_values_dtype_and_gradients(calls, x_dtype, w_dtype) -> None:
    norm = _norm(64).to(w_dtype)
    torch.manual_seed(1)
    x = torch.randn(6, 64).to(x_dtype).requires_grad_()
    g = torch.randn(6, 64).to(x_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's own path warns it cannot run fused here
        y = norm(x)
    dx, dw = torch.autograd.grad(y, (x, norm.weight), g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = F.rms_norm(x, (64,), norm.weight, 1e-6)
    ref_dx, ref_dw = torch.autograd.grad(ref, (x, norm.weight), g)
    assert calls == [(6, 64)]
    assert (y.dtype, dx.dtype, dw.dtype) == (ref.dtype, ref_dx.dtype, ref_dw.dtype)
    # torch's float32 arithmetic (the mean square summed in another order), rounded once to
    # the output's dtype: nearly every half-precision output is the same number
    if y.dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    else:
        assert (y == ref).float().mean() > 0.95
    scale = ref_dx.float().abs().max()
    assert (dx.float() - ref_dx.float()).abs().max() <= 2e-2 * scale
    assert (dw.float() - ref_dw.float()).abs().max() <= 2e-2 * ref_dw.float().abs().max()


def test_inference_and_transforms_take_torchs_path(calls) -> None:
    norm = _norm(32)
    x = torch.randn(4, 32)
    with torch.no_grad():
        norm(x)
    norm.weight.requires_grad_(False)
    norm(x)
    norm.weight.requires_grad_(True)
    assert calls == []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's own path warns it cannot run fused here
        norm(x.bfloat16())
    assert calls == [(4, 32)]
    calls.clear()
    grads = torch.func.grad(lambda w: torch.func.functional_call(norm, {"weight": w}, (x,)).sum())(norm.weight)
    assert calls == [] and grads.shape == (32,)


def test_a_built_model_trains_through_the_cpu_kernels(calls, tiny) -> None:
    from specformer.builder import build_model

    model = build_model(tiny(stack={"norm": {"type": "rmsnorm"}})).train()
    ids = torch.randint(0, 61, (2, 12))
    out = model(ids[:, :-1], labels=ids[:, 1:])
    out.loss.backward()
    # each layer's two norms and the final norm
    assert len(calls) == 2 * 2 + 1
    assert all(p.grad is not None for n, p in model.named_parameters() if "norm" in n)


@pytest.mark.parametrize("grad", [True, False], ids=["cpu-kernel", "torch-path"])
def test_an_offset_adds_to_the_weight_and_starts_the_gain_at_one(calls, grad) -> None:
    # Gemma's RMSNorm: x / rms(x) * (1 + weight), its weight starting at 0
    norm = RMSNorm(48, eps=1e-6, offset=1.0)
    assert torch.equal(norm.weight, torch.zeros(48))
    with torch.no_grad():
        norm.weight.normal_()
    reference = torch.nn.RMSNorm(48, eps=1e-6)
    with torch.no_grad():
        reference.weight.copy_(norm.weight + 1.0)
    x = torch.randn(3, 5, 48, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        y, expected = norm(x), reference(x)
    torch.testing.assert_close(y, expected, atol=1e-6, rtol=0)
    assert bool(calls) == grad  # the training path keeps the CPU kernels
    if grad:
        g = torch.randn_like(y)
        dx, dw = torch.autograd.grad(y, (x, norm.weight), g)
        rx, rw = torch.autograd.grad(expected, (x, reference.weight), g)
        torch.testing.assert_close(dx, rx, atol=1e-6, rtol=0)
        torch.testing.assert_close(dw, rw, atol=1e-5, rtol=0)


def test_a_spec_offset_builds_a_norm_whose_weights_start_at_zero() -> None:
    from specformer import build_model, load_spec

    model = build_model(load_spec("llama-nano", ["decoder.norm.offset=1"]))
    gains = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert gains and all(m.offset == 1.0 and not m.weight.any() for m in gains)
    assert all(m.offset == 0.0 and torch.equal(m.weight, torch.ones_like(m.weight))
               for m in build_model(load_spec("llama-nano")).modules() if isinstance(m, RMSNorm))
