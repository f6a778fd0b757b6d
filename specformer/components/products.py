"""Float32 matrix products on the CPU through oneDNN, where it is the faster library.

torch computes a float32 ``mm`` on the CPU with MKL's sgemm. On AMD processors MKL runs it
at about half the speed of oneDNN, the library torch itself uses for bfloat16 products: on a
2-core AMD EPYC (Zen 5), a (512 x 768) by (768 x 2048) product ran at 203 GFLOP/s through
``mm`` against 459 through oneDNN, and the two products of its backward pass at 203 against
373 (``benchmarks/RESULTS.md``). A float32 training step is mostly such products.

So the linear layers of a specformer model (:class:`Linear`, an ``nn.Linear`` with the same
parameters and state-dict names) and the chunked loss's products go through oneDNN's
``mkldnn::_linear_pointwise``, forward and backward, where a measurement taken once per
process (:func:`onednn_is_faster`) finds it at least ``1 / ONEDNN_MARGIN`` times as fast as
``mm`` on this machine, at a small layer's product and a larger one's; elsewhere (MKL on Intel
processors is as fast, and on an AMD Zen 3 they tie) nothing changes. Only
float32 products of at least ``MIN_ROWS`` rows with a weight stored row after row or column
after column, outside autocast and ``torch.func`` transforms: the one-row products of
decoding keep their own layout (:mod:`specformer.components.layout`). ``torch.compile``
keeps them: the product is one operation of the compiled graph (``specformer::onednn_linear``)
and the measurement is taken, not traced, when tracing first reaches it.
Both libraries compute in float32 (no reduced-precision internals); the sums may be taken
in another order, so results differ at float32 rounding.

``specformer.components.products.ONEDNN = False`` (or ``True``) decides without measuring.

**bfloat16 autocast on a CPU without bfloat16 products.** Processors with AVX-512 BF16 or AMX
multiply bfloat16 matrices at twice float32's speed or more; others (AVX2 alone: AMD Zen 2 and
3, many Intel desktops and laptops) take a fallback in torch that is far slower than float32:
on a 2-core AMD EPYC (Zen 3, AVX2) a (512 x 512) by (512 x 1408) ``F.linear`` ran at 16
GFLOP/s in bfloat16 against 115 in float32, and ``bmm`` at 1.9 against 55. There, under
bfloat16 autocast, specformer's linear layers, loss and attention compute their products in
float32 on the bfloat16-rounded factors (what a bfloat16 kernel multiplies, summed in float32
as its kernels sum) and round the result to bfloat16: autocast's dtypes (and, in the linear
layers, its saved tensors), at float32's speed; attention keeps its queries, keys and values
in float32. A measurement taken once per process (:func:`bf16_in_float32`)
decides; ``BF16_IN_FLOAT32 = False`` (or ``True``) decides without measuring. Under
``torch.compile`` these products are operations autocast leaves alone
(``specformer::product_in_float32``, ``specformer::float32_matmul``): autocast switched off
inside a compiled region does not reach the compiled backward pass.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = [
    "Linear", "linear", "mm_nt", "add_mm_nt_", "measurement", "measured_faster", "onednn_is_faster",
    "in_functorch_transform", "ONEDNN", "MIN_ROWS", "bf16_in_float32", "bf16_products_in_float32",
    "rounded_to_bf16", "product_in_float32", "float32_matmul", "BF16_IN_FLOAT32",
]

#: None: measure once (:func:`onednn_is_faster`); True or False: decided.
ONEDNN: bool | None = None
#: products of fewer rows stay with torch's own kernels
MIN_ROWS = 32
#: oneDNN is taken when its time is at most this fraction of ``mm``'s
ONEDNN_MARGIN = 0.85
#: the product the measurement times: (rows, in, out), a small transformer layer's
PROBE_SHAPE = (256, 512, 1536)
#: and, where oneDNN is the faster there, a larger one: oneDNN is taken where it is faster at
#: both. On an AMD Zen 5 it is twice as fast at both; on a Zen 3 the two libraries tie (oneDNN
#: 0.9-1.1x as fast), so one timing alone now and then chose oneDNN, which is slower there at
#: the products of a prompt or a larger layer (2,048 rows: 114 against 125 GFLOP/s)
PROBE_SHAPE_LARGER = (512, 768, 2048)
#: None: measure once (:func:`bf16_products_in_float32`); True or False: decided.
BF16_IN_FLOAT32: bool | None = None
#: bfloat16 products go to float32 where float32's (with the casts) take at most this fraction
#: of bfloat16's time: only where bfloat16 has no kernels of its own, not for a near tie
BF16_MARGIN = 0.5


def _pointwise(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` by oneDNN; ``x`` (..., K), ``weight`` (N, K), any strides.
    Traced by ``torch.compile`` as one opaque operation (:func:`_compiled_pointwise`)."""
    if torch.compiler.is_compiling():
        return _compiled_pointwise(x, weight, bias)
    return _onednn_linear(x, weight, bias)


def _onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@torch.library.custom_op("specformer::onednn_linear", mutates_args=(),
                         schema="(Tensor x, Tensor weight, Tensor? bias) -> Tensor")  # not read from the annotations
def _compiled_pointwise(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """oneDNN's product as ``torch.compile`` sees it: inductor lowers ``mkldnn::_linear_pointwise``
    only for weights it has packed itself (inference with freezing), so a compiled training
    step calls the product as it is, and fuses the elementwise work around it."""
    return _onednn_linear(x, weight, bias)


@_compiled_pointwise.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def measurement(measure: Callable[[], bool]) -> Callable[[], bool]:
    """A once-per-process measurement (``functools.cache``, so ``cache_clear`` measures again),
    run outside any dispatch mode its first caller is under (a FLOP counter, a recorder),
    outside autocast, and outside the caller's saved-tensor hooks (activation offloading, a
    memory count): the measurement's own tensors are kept as they are. ``torch.compile`` runs
    it (or reads its result) when tracing first reaches it, and keeps the answer as a constant
    of the graph (``torch.compiler.assume_constant_result``): the timing is not traced."""

    @functools.cache
    @functools.wraps(measure)
    def measured() -> bool:
        from torch.utils._python_dispatch import _disable_current_modes

        with (_disable_current_modes(), torch.autocast("cpu", enabled=False),
              torch.autograd.graph.saved_tensors_hooks(_same, _same)):
            return measure()

    @functools.wraps(measure)
    def decided() -> bool:
        return measured()

    decided.cache_clear, decided.cache_info = measured.cache_clear, measured.cache_info  # type: ignore[attr-defined]
    return torch.compiler.assume_constant_result(decided)


def _same(t: Tensor) -> Tensor:
    return t


def measured_faster(candidate: Callable[[], object], baseline: Callable[[], object], *, margin: float,
                    rounds: int = 5, calls: int = 1) -> bool:
    """Whether ``candidate`` takes at most ``margin`` of ``baseline``'s time on this machine:
    each run once to set up, then ``rounds`` alternating timings of ``calls`` calls each, the
    fastest of each compared. Other work on the machine (a second training process, a test
    suite) only ever adds time: on 2 busy cores a median of three timings of a bfloat16
    product now and then read it 2x slower than its float32 form, which is 2x slower, and
    the whole run took the slow path."""
    runs = {"candidate": candidate, "baseline": baseline}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm-up: the kernels' first calls set up
        run()
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(calls):
                run()
            times[name].append(time.perf_counter() - start)
    best = {name: min(t) for name, t in times.items()}
    return best["candidate"] <= margin * best["baseline"]


@measurement
def _measured() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return _onednn_faster_at(PROBE_SHAPE, calls=3) and _onednn_faster_at(PROBE_SHAPE_LARGER, calls=1, rounds=3)
    except (RuntimeError, AttributeError):  # a torch built without the op
        return False


def _onednn_faster_at(shape: tuple[int, int, int], *, calls: int, rounds: int = 5) -> bool:
    """Whether oneDNN's product of (rows, in, out) ``shape`` is right and takes at most
    ``ONEDNN_MARGIN`` of ``mm``'s time here."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    with torch.no_grad():
        if not torch.allclose(_pointwise(x, w), x @ w.t(), rtol=1e-4, atol=1e-3):
            return False
        return measured_faster(lambda: _pointwise(x, w), lambda: torch.mm(x, w.t()),
                               margin=ONEDNN_MARGIN, calls=calls, rounds=rounds)


@measurement
def _measured_bf16() -> bool:
    m, k, n = PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    with torch.no_grad():
        return measured_faster(lambda: _product_in_float32(xb, wb, None, True),
                               lambda: F.linear(xb, wb), margin=BF16_MARGIN, rounds=3)


def bf16_products_in_float32() -> bool:
    """Whether this CPU's bfloat16 products are slower than float32 ones on the same
    (rounded) factors, so that bfloat16 autocast's products run in float32 here:
    :data:`BF16_IN_FLOAT32` if set, else measured once per process."""
    return BF16_IN_FLOAT32 if BF16_IN_FLOAT32 is not None else _measured_bf16()


def bf16_in_float32(*factors: Tensor) -> bool:
    """Whether products of ``factors`` (on the CPU, under bfloat16 autocast or all bfloat16
    themselves) are computed in float32 here (:func:`bf16_products_in_float32`); not inside
    ``torch.func`` transforms, whose rules are torch's own kernels'."""
    x = factors[0]
    if torch.is_autocast_enabled("cpu"):
        if torch.get_autocast_dtype("cpu") != torch.bfloat16:
            return False
    elif x.dtype != torch.bfloat16 or any(f.dtype != torch.bfloat16 for f in factors):  # x first: no generator
        return False
    return x.device.type == "cpu" and not in_functorch_transform() and bf16_products_in_float32()


def rounded_to_bf16(x: Tensor) -> Tensor:
    """``x`` rounded to bfloat16 and held in float32: a bfloat16 kernel's factor, for a
    float32 product."""
    return x.to(torch.bfloat16).float()


def onednn_is_faster() -> bool:
    """Whether float32 products go through oneDNN here: :data:`ONEDNN` if set, else measured
    once per process (:func:`_onednn_faster_at` at ``PROBE_SHAPE``, then at ``PROBE_SHAPE_LARGER``)."""
    return ONEDNN if ONEDNN is not None else _measured()


_functorch_active: Callable[[], bool] | None = getattr(torch._C, "_are_functorch_transforms_active", None)


def in_functorch_transform() -> bool:
    """Whether a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``, ...) is running: the
    custom autograd functions of the faster kernels (products, attention, the chunked loss)
    do not take part in those, so the plain torch path runs instead."""
    return bool(_functorch_active()) if _functorch_active is not None else False


def _dense_weight(weight: Tensor) -> bool:
    """A 2-D weight oneDNN reads at speed: rows one after another (contiguous) or columns
    (column-major, at any distance). Rows further apart than their length (a slice of a wider
    matrix, every other row) take a reference path in oneDNN about 1,000 times as slow."""
    return weight.dim() == 2 and (weight.is_contiguous() or weight.stride(0) == 1)


def _takes_onednn(x: Tensor, weight: Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and _dense_weight(weight)
        and x.dim() >= 2
        and x.numel() >= MIN_ROWS * x.shape[-1] > 0
        and not torch.is_autocast_enabled("cpu")
        and not in_functorch_transform()
        and not _counting_flops()
        and onednn_is_faster()
    )


def _counting_flops() -> bool:
    """Whether a ``torch.utils.flop_counter.FlopCounterMode`` is active: it has no formula for
    oneDNN's product, so the products it counts stay torch's own. (``torch.compile`` traces
    under no such mode: the dispatch stack is not read while tracing.)"""
    counter = sys.modules.get("torch.utils.flop_counter")
    if counter is None or torch.compiler.is_compiling() or not torch._C._len_torch_dispatch_stack():
        return False
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    modes = tuple(getattr(counter, name) for name in ("FlopCounterMode", "_FlopCounterMode") if hasattr(counter, name))
    return any(isinstance(mode, modes) for mode in _get_current_dispatch_mode_stack())


class _OneDNNLinear(torch.autograd.Function):
    """``F.linear`` with oneDNN's products, forward and backward; keeps what ``F.linear`` keeps
    (``x`` where the weight trains, ``weight`` where the input needs a gradient)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        # as F.linear: the input only for the weight's gradient, the weight only for the input's
        ctx.save_for_backward(x if weight.requires_grad else None, weight if x.requires_grad else None)
        ctx.has_bias = bias is not None
        return _pointwise(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()  # an expanded gradient (of a sum) has stride 0
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _pointwise(grad, weight.t())  # (..., N) (N, K) -> (..., K)
        rows = grad.reshape(-1, grad.shape[-1])  # (M, N)
        if ctx.needs_input_grad[1]:
            inputs_t = x.reshape(-1, x.shape[-1]).t()  # (K, M): the product's right factor
            if not _dense_weight(inputs_t):  # an input of scattered rows and columns
                inputs_t = inputs_t.contiguous()
            grad_w = _pointwise(rows.t(), inputs_t)  # (N, M) (M, K) -> (N, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = rows.sum(0)
        return grad_x, grad_w, grad_b


class _Bf16InFloat32Linear(torch.autograd.Function):
    """``F.linear`` under bfloat16 autocast, its products in float32 on the bfloat16-rounded
    factors (:func:`bf16_in_float32`): the output in bfloat16, as autocast's; keeps what
    autocast's ``F.linear`` keeps (the bfloat16 input and weight). The weight's gradient is
    summed straight into float32, the dtype autocast would cast it back to. Switches autocast
    off only inside its products (:func:`product_in_float32`): ``torch.compile`` traces the
    rest as it is."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        xb, wb = x.to(torch.bfloat16), weight.to(torch.bfloat16)
        ctx.save_for_backward(xb if weight.requires_grad else None, wb if x.requires_grad else None)
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        return _bf16_linear_in_float32(xb, wb, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        xb, wb = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        rows = grad.reshape(-1, grad.shape[-1]).float()  # (M, N), converted once for both products
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:  # rounded to bfloat16 as autocast's product gives it
            grad_x = product_in_float32(rows, wb.t()).to(x_dtype).reshape(*grad.shape[:-1], -1)
        if ctx.needs_input_grad[1]:
            grad_w = product_in_float32(rows.t(), xb.reshape(-1, xb.shape[-1]).t(), bf16_out=False).to(w_dtype)
        if b_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = rows.sum(0).to(b_dtype)
        return grad_x, grad_w, grad_b


def _bf16_linear_in_float32(xb: Tensor, wb: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear`` of bfloat16 ``xb`` and ``wb`` (and a bias, rounded to bfloat16 as autocast
    casts it) computed in float32, the result in bfloat16."""
    return product_in_float32(xb.reshape(-1, xb.shape[-1]), wb, bias).reshape(*xb.shape[:-1], wb.shape[0])


def _product_in_float32(a: Tensor, b: Tensor, bias: Tensor | None, bf16_out: bool) -> Tensor:
    with torch.autocast("cpu", enabled=False):
        out = mm_nt(a.float(), b.float(), rounded_to_bf16(bias) if bias is not None else None)
    return out.to(torch.bfloat16) if bf16_out else out


@torch.library.custom_op("specformer::product_in_float32", mutates_args=(),
                         schema="(Tensor a, Tensor b, Tensor? bias, bool bf16_out) -> Tensor")
def _compiled_product_in_float32(a: Tensor, b: Tensor, bias: Tensor | None, bf16_out: bool) -> Tensor:
    """:func:`product_in_float32` as ``torch.compile`` sees it: one opaque operation, which
    autocast leaves alone. Traced as plain operations, autocast switched off inside a compiled
    region does not reach the backward pass (its products would run in bfloat16 there), and
    inductor drops a round trip through bfloat16 (the rounding of the factors)."""
    return _product_in_float32(a, b, bias, bf16_out)


@_compiled_product_in_float32.register_fake
def _(a: Tensor, b: Tensor, bias: Tensor | None, bf16_out: bool) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16 if bf16_out else torch.float32)


def product_in_float32(a: Tensor, b: Tensor, bias: Tensor | None = None, *, bf16_out: bool = True) -> Tensor:
    """``a @ b.T (+ bias)`` of (M, K) ``a`` and (N, K) ``b``, bfloat16 or float32 holding
    bfloat16 values (any strides), computed in float32 with autocast off, outside autograd:
    what a bfloat16 kernel computes, at float32's speed where bfloat16 has no kernels of its
    own (:func:`bf16_in_float32`). The bias is rounded to bfloat16, as autocast casts it; the
    result is rounded to bfloat16 unless ``bf16_out`` is False."""
    if torch.compiler.is_compiling():
        return _compiled_product_in_float32(a, b, bias, bf16_out)
    return _product_in_float32(a, b, bias, bf16_out)


@torch.library.custom_op("specformer::float32_matmul", mutates_args=())
def _compiled_float32_matmul(a: Tensor, b: Tensor) -> Tensor:
    with torch.autocast("cpu", enabled=False):
        return torch.matmul(a, b)


@_compiled_float32_matmul.register_fake
def _(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty((*a.shape[:-1], b.shape[-1]))


def _float32_matmul_setup(ctx, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:  # type: ignore[no-untyped-def]
    ctx.save_for_backward(*inputs)


def _float32_matmul_grad(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:  # type: ignore[no-untyped-def]
    a, b = ctx.saved_tensors
    grad_a = _compiled_float32_matmul(grad, b.transpose(-2, -1)) if ctx.needs_input_grad[0] else None
    grad_b = _compiled_float32_matmul(a.transpose(-2, -1), grad) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


_compiled_float32_matmul.register_autograd(_float32_matmul_grad, setup_context=_float32_matmul_setup)


def float32_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``torch.matmul`` of float32 (..., M, K) ``a`` and (..., K, N) ``b`` (the same batch
    shape) inside a region where autocast is switched off, its backward pass too: while
    ``torch.compile`` traces, one operation with its own gradient (autocast switched off inside
    a compiled region does not reach the backward pass, whose products would run in bfloat16
    there); otherwise ``torch.matmul`` itself."""
    if torch.compiler.is_compiling() and a.shape[:-2] == b.shape[:-2]:
        return _compiled_float32_matmul(a, b)
    return torch.matmul(a, b)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, through oneDNN where :func:`onednn_is_faster` and the
    product qualifies (float32 on the CPU, at least ``MIN_ROWS`` rows, no autocast); under
    bfloat16 autocast on a CPU without bfloat16 products, in float32 (:func:`bf16_in_float32`)."""
    if x.dtype == torch.float32 and x.dim() and not torch.is_autocast_enabled("cpu") and x.numel() < MIN_ROWS * x.shape[-1]:
        # a few float32 rows outside CPU autocast (a decoding step): neither path below applies,
        # and their checks would cost more than a small product
        return F.linear(x, weight, bias)
    if x.dim() >= 2 and x.is_floating_point() and bf16_in_float32(x, weight):
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            return _Bf16InFloat32Linear.apply(x, weight, bias)
        return _bf16_linear_in_float32(x.to(torch.bfloat16), weight.to(torch.bfloat16), bias)
    if not _takes_onednn(x, weight):
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _OneDNNLinear.apply(x, weight, bias)
    return _pointwise(x, weight, bias)


def mm_nt(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """``a @ b.T (+ bias)`` for (M, K) ``a`` and (N, K) ``b``, outside autograd: through oneDNN
    as :func:`linear` chooses."""
    return _pointwise(a, b, bias) if _takes_onednn(a, b) else F.linear(a, b, bias)


def add_mm_nt_(out: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``out += a @ b.T`` in place, outside autograd: through oneDNN as :func:`linear`
    chooses, else summed inside torch's product (``addmm_``)."""
    return out.add_(_pointwise(a, b)) if _takes_onednn(a, b) else out.addmm_(a, b.t())


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, initialisation and state-dict names) whose product is
    :func:`linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
