"""``torch.compile`` (``training.compile``) keeps specformer's own CPU kernels: the float32
products through oneDNN and the training attention as products run inside the compiled
graph, in one graph, with the values of the eager model."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from specformer.builder import build_model
from specformer.components import attention, products
from specformer.components.positional import warm_tables

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")

FUSED_ATTENTION = ("aten._scaled_dot_product_flash_attention_for_cpu.default",
                   "aten._scaled_dot_product_flash_attention_for_cpu_backward.default")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _recording_backend() -> tuple[Callable, set[str]]:
    """AOTAutograd with no compiler (as ``aot_eager``), recording every operation of the
    forward and backward graphs."""
    targets: set[str] = set()

    def record(gm: torch.fx.GraphModule, _inputs: object) -> Callable:
        targets.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=record, bw_compiler=record), targets


def _model(tiny):  # noqa: ANN001, ANN202
    return build_model(tiny(positional={"type": "rope"}, max_seq_len=320,
                            stack={"ffn": {"type": "glu", "activation": "silu", "d_ff": 64},
                                   "norm": {"type": "rmsnorm"}}))


def _compiled_loss_and_grads(model: torch.nn.Module, ids: torch.Tensor, loss_and_grads, *, bf16: bool = False):  # noqa: ANN001, ANN202
    backend, targets = _recording_backend()
    compiled = torch.compile(model, backend=backend, fullgraph=True)  # fullgraph: no graph break
    loss, grads = loss_and_grads(compiled, ids, bf16=bf16)
    return loss, grads, targets


def test_a_compiled_float32_step_keeps_the_onednn_products_and_the_attention_products(
        tiny, monkeypatch, loss_and_grads) -> None:  # noqa: ANN001
    monkeypatch.setattr(products, "ONEDNN", True)
    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_PRODUCT_ROWS", 64)
    model = _model(tiny)
    ids = torch.randint(0, 61, (2, 257))
    loss, grads, targets = _compiled_loss_and_grads(model, ids, loss_and_grads)
    assert "specformer.onednn_linear.default" in targets
    assert not targets & set(FUSED_ATTENTION)
    assert "aten.mm.default" not in targets  # every product of the linear layers is oneDNN's
    want_loss, want_grads = loss_and_grads(model, ids)
    assert abs(loss - want_loss) < 1e-5 * want_loss
    for got, want in zip(grads, want_grads, strict=True):
        assert ((got - want).norm() / want.norm()) < 1e-4


def test_a_compiled_bf16_autocast_step_keeps_the_attention_products(tiny, monkeypatch, loss_and_grads) -> None:  # noqa: ANN001
    monkeypatch.setattr(attention, "MATMUL_ATTENTION", True)
    model = _model(tiny)
    ids = torch.randint(0, 61, (2, 257))
    loss, grads, targets = _compiled_loss_and_grads(model, ids, loss_and_grads, bf16=True)
    assert "aten.softmax.int" in targets or "aten._softmax.default" in targets
    assert not targets & set(FUSED_ATTENTION)
    want_loss, want_grads = loss_and_grads(model, ids, bf16=True)
    assert abs(loss - want_loss) < 2e-3 * want_loss
    for got, want in zip(grads, want_grads, strict=True):
        assert ((got - want).norm() / want.norm()) < 0.05


def test_the_fused_kernel_stays_where_the_measurement_says_so(tiny, monkeypatch, loss_and_grads) -> None:  # noqa: ANN001
    monkeypatch.setattr(attention, "MATMUL_ATTENTION", False)
    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", False)
    monkeypatch.setattr(products, "ONEDNN", False)
    _, _, targets = _compiled_loss_and_grads(_model(tiny), torch.randint(0, 61, (2, 257)), loss_and_grads)
    assert set(FUSED_ATTENTION) <= targets
    assert "specformer.onednn_linear.default" not in targets


def test_a_measurement_is_taken_once_while_tracing_and_not_traced(tiny, monkeypatch, loss_and_grads) -> None:  # noqa: ANN001
    # the first trace reaches the measurements (no eager call before): they run, once, and
    # their answers are constants of the graph; fullgraph=True fails on any graph break
    for name in ("MATMUL_ATTENTION", "FLOAT32_ATTENTION"):
        monkeypatch.setattr(attention, name, None)
    monkeypatch.setattr(products, "ONEDNN", None)
    measured = (products._measured, attention._measured_float32_attention)
    for measure in measured:
        measure.cache_clear()
    _compiled_loss_and_grads(_model(tiny), torch.randint(0, 61, (2, 257)), loss_and_grads)
    assert [measure.cache_info().misses for measure in measured] == [1, 1]


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("positional", ["rope", "sinusoidal", "t5", "alibi"])
def test_a_compiled_model_compiles_once_for_every_training_step(tiny, positional: str, warm: bool,  # noqa: ANN001
                                                                loss_and_grads) -> None:  # noqa: ANN001
    # the position tables (T5's buckets) are read, never filled, while traced: a compiled
    # forward that filled their cache failed its own guard on it at the next step and compiled
    # the model again; warmed first, they are read as they are
    from torch._dynamo.utils import counters

    model = build_model(tiny(positional={"type": positional}))
    if warm:
        warm_tables(model, torch.device("cpu"), torch.float32)
    compiled = torch.compile(model, backend="aot_eager")
    ids = torch.randint(0, 61, (2, 17))
    counters.clear()
    for _ in range(3):
        loss, grads = loss_and_grads(compiled, ids)
    assert counters["stats"]["unique_graphs"] == 1
    want_loss, want_grads = loss_and_grads(model, ids)
    assert abs(loss - want_loss) < 1e-5 * want_loss
    for got, want in zip(grads, want_grads, strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("positional", ["rope", "sinusoidal"])
def test_warmed_position_tables_are_constants_of_the_compiled_graph(tiny, positional: str, loss_and_grads) -> None:  # noqa: ANN001
    # without them, the graph computes the table at every call (inductor then computes a
    # rotary table's cos and sin inside every layer's rotation); warmed, it reads them, with
    # the same values
    ids = torch.randint(0, 61, (2, 17))
    results = []
    for warm in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = build_model(tiny(positional={"type": positional}))
        if warm:
            warm_tables(model, torch.device("cpu"), torch.float32)
        loss, grads, targets = _compiled_loss_and_grads(model, ids, loss_and_grads)
        assert ({"aten.cos.default", "aten.sin.default"} <= targets) != warm, targets
        results.append((loss, grads))
    (cold_loss, cold_grads), (warm_loss, warm_grads) = results
    assert float(warm_loss) == pytest.approx(float(cold_loss), rel=1e-6)
    for got, want in zip(warm_grads, cold_grads, strict=True):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("ffn", [{"type": "mlp", "activation": "relu"}, {"type": "glu", "activation": "relu"}])
def test_a_compiled_relu_leaves_no_boolean_mask_for_the_backward_pass(tiny, ffn, loss_and_grads) -> None:  # noqa: ANN001
    # inductor stores a comparison's boolean result element by element on the CPU, and its
    # partitioner kept ReLU's x <= 0 for the backward pass; specformer's ReLU takes its
    # gradient from sign(output) while traced, and the gradients stay autograd's
    torch.manual_seed(0)
    model = build_model(tiny(stack={"ffn": ffn}))
    ids = torch.randint(0, 61, (2, 17))
    loss, grads, targets = _compiled_loss_and_grads(model, ids, loss_and_grads)
    assert "aten.sign.default" in targets
    assert not targets & {"aten.threshold_backward.default", "aten.le.Scalar", "aten.le.Tensor"}
    want_loss, want_grads = loss_and_grads(model, ids)
    assert abs(loss - want_loss) < 1e-5 * want_loss
    for got, want in zip(grads, want_grads, strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def test_relu_is_torch_s_outside_compilation() -> None:
    from torch.nn import functional as F

    from specformer.components.ffn import ACTIVATIONS, _CompiledReLU

    x = torch.randn(64, dtype=torch.float64, requires_grad=True)
    y = ACTIVATIONS["relu"](x)
    assert y.grad_fn.name() == F.relu(x).grad_fn.name()  # eager: torch's own ReLU and backward
    # the traced form's gradient is threshold_backward's on finite inputs, zero included
    z = torch.tensor([-1.0, -0.0, 0.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    (got,) = torch.autograd.grad(_CompiledReLU.apply(z).sum(), z)
    (want,) = torch.autograd.grad(F.relu(z).sum(), z)
    assert torch.equal(got, want)
    assert torch.autograd.gradcheck(_CompiledReLU.apply, (x,))


def test_a_compiled_chunked_loss_sums_its_weight_gradients_chunk_by_chunk(monkeypatch) -> None:
    # eager bf16 writes a few chunks' logits into slices of one buffer; traced, each write
    # into a slice copied the whole buffer (slice_scatter), so the traced loss sums the
    # chunks' weight-gradient products instead, with the same values
    from specformer.components import loss as loss_module

    monkeypatch.setattr(loss_module, "_CHUNK_ELEMENTS", 64 * 96)  # 64 rows a chunk: 3 chunks
    torch.manual_seed(0)
    x = torch.randn(192, 64, requires_grad=True)
    w = (torch.randn(96, 64) * 0.1).requires_grad_()
    y = torch.randint(0, 96, (192,))

    def step(fn):  # noqa: ANN001, ANN202
        with torch.autocast("cpu", dtype=torch.bfloat16):
            value = fn(x, w, None, y)
        gx, gw = torch.autograd.grad(value, (x, w))
        return value.detach(), gx, gw

    scattered: list[tuple[int, ...]] = []

    def record(gm: torch.fx.GraphModule, _inputs: object) -> Callable:
        scattered.extend(tuple(node.meta["val"].shape) for node in gm.graph.nodes
                         if node.op == "call_function" and str(node.target) == "aten.slice_scatter.default")
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=record, bw_compiler=record)
    got = step(torch.compile(loss_module.linear_cross_entropy, backend=backend, fullgraph=True))
    want = step(loss_module.linear_cross_entropy)
    assert (192, 96) not in scattered  # no (N, V) buffer written a chunk at a time
    assert scattered  # (the input's gradient, (N, D), still is: recorded at all)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-2, atol=1e-4)


def _padded_batch(kind: str, source: int, target: int) -> dict[str, torch.Tensor]:
    """A batch of two rows, the second padded on the right: ``source`` and ``target`` long."""
    ids = torch.randint(5, 61, (2, source))
    mask = torch.ones(2, source, dtype=torch.long)
    mask[1, source // 2:] = 0
    if kind != "encoder-decoder":
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
    dec = torch.randint(5, 61, (2, target))
    dec_mask = torch.ones(2, target, dtype=torch.long)
    dec_mask[1, target // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec,
            "decoder_attention_mask": dec_mask, "labels": dec.masked_fill(dec_mask == 0, -100)}


@pytest.mark.parametrize(("kind", "positional"), [
    ("encoder-decoder", "t5"), ("encoder-decoder", "rope"), ("decoder", "t5"), ("decoder", "alibi"),
    ("decoder", "sinusoidal"), ("decoder", "learned"), ("encoder", "rope"),
])
def test_a_compiled_model_follows_batches_of_every_length_in_one_dynamic_graph(kind: str, positional: str, tiny) -> None:  # noqa: ANN001
    # padded batches (sequence-to-sequence pairs, SFT, classification) change length from
    # batch to batch: after the first length, torch.compile traces one graph with the lengths
    # symbolic; the model must not make them constants again (T5's Toeplitz bias as an
    # unfold, the loss's loop over range(n)), or every new length is a new graph, and past
    # dynamo's recompile limit (8) the model runs uncompiled
    from torch._dynamo.utils import counters

    model = build_model(tiny(kind, positional={"type": positional}))
    warm_tables(model, torch.device("cpu"), torch.float32)
    compiled = torch.compile(model, backend="aot_eager")
    counters.clear()
    # two rows of 16 or more: every product stays on one side of the oneDNN threshold (MIN_ROWS)
    for source, target in [(16, 17), (19, 21), (25, 16), (17, 30), (40, 23)]:
        batch = _padded_batch(kind, source, target)
        got = compiled(**batch).loss
        got_grads = torch.autograd.grad(got, list(model.parameters()), allow_unused=True)
        want = model(**batch).loss
        want_grads = torch.autograd.grad(want, list(model.parameters()), allow_unused=True)
        assert float(got) == pytest.approx(float(want), rel=1e-5)
        for g, w in zip(got_grads, want_grads, strict=True):
            assert (g is None) == (w is None)
            if g is not None:
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 2  # the first length's, then the dynamic one


def test_t5_bias_traced_equals_its_eager_toeplitz_layout(tiny) -> None:  # noqa: ANN001
    from specformer.components.positional import T5RelativeBias

    bias = next(m for m in build_model(tiny("encoder-decoder", positional={"type": "t5"})).modules()
                if isinstance(m, T5RelativeBias) and not m.bidirectional)
    traced = torch.compile(bias.bias, backend="aot_eager", fullgraph=True, dynamic=True)
    for t, tk, past in [(5, 5, 0), (3, 11, 8), (17, 17, 0), (1, 40, 39)]:
        q, k = torch.arange(past, past + t), torch.arange(tk)
        upstream = torch.randn(1, bias.n_heads, t, tk)
        got = traced(q, k, dtype=torch.float32)
        (got_grad,) = torch.autograd.grad(got, bias.weight, upstream)
        want = bias.bias(q, k, dtype=torch.float32)
        (want_grad,) = torch.autograd.grad(want, bias.weight, upstream)
        assert torch.equal(got, want)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)


def test_a_compiled_bf16_model_with_the_attention_products_follows_every_length(tiny, monkeypatch) -> None:  # noqa: ANN001
    from torch._dynamo.utils import counters

    monkeypatch.setattr(attention, "MATMUL_ATTENTION", True)
    model = build_model(tiny(stack={"ffn": {"type": "glu", "activation": "silu", "d_ff": 64},
                                    "norm": {"type": "rmsnorm"}}))
    warm_tables(model, torch.device("cpu"), torch.float32)
    compiled = torch.compile(model, backend="aot_eager")
    counters.clear()
    for length in (16, 23, 40, 19):
        batch = _padded_batch("decoder", length, 0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = compiled(**batch).loss
            want = model(**batch).loss
        assert float(got) == pytest.approx(float(want), rel=1e-2)
    assert counters["stats"]["unique_graphs"] == 2


def _right_padded(length: int) -> dict[str, torch.Tensor]:
    """Two rows of ``length``, the second padded on the right from ``length // 3`` on."""
    ids = torch.randint(5, 61, (2, length))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length // 3:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


@pytest.mark.parametrize("bf16", [True, False])
def test_compiled_training_on_right_padded_batches_keeps_the_attention_products_in_one_graph(
        tiny, monkeypatch, bf16: bool) -> None:  # noqa: ANN001
    # SFT batches padded on the right, their length changing at every step: call_compiled (as
    # SpecModule under training.compile) traces the lengths as symbols from the first step and
    # leaves the causal stack's mask out, as the eager model does itself; attention then runs
    # the products path as one opaque operation (its loop over blocks would make the length a
    # constant again), with the masked eager model's loss and gradients. Before, such a mask
    # kept torch's masked fused kernel in the compiled step (slower than the eager one in bf16)
    from torch._dynamo.utils import counters

    from specformer.builder.lightning import call_compiled

    monkeypatch.setattr(attention, "MATMUL_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_PRODUCT_ROWS", 32)
    monkeypatch.setattr(attention, "MATMUL_BLOCK", 8)  # several blocks a call
    monkeypatch.setattr(attention, "MATMUL_MIN_ROWS", 8)
    monkeypatch.setattr(attention, "MATMUL_KEPT_BYTES", 4 << 10)  # the first blocks' probabilities kept
    model = _model(tiny)
    warm_tables(model, torch.device("cpu"), torch.float32)
    backend, targets = _recording_backend()
    compiled = torch.compile(model, backend=backend)
    counters.clear()
    for length in (37, 52, 44, 61):
        batch = _right_padded(length)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            got = call_compiled(compiled, (), batch, padded=True, training=True, causal_masks=("attention_mask",)).loss
            got_grads = torch.autograd.grad(got, list(model.parameters()))
            want = model(**batch).loss  # eager, the mask given
            want_grads = torch.autograd.grad(want, list(model.parameters()))
        assert float(got) == pytest.approx(float(want), rel=1e-2 if bf16 else 1e-5)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=5e-2 if bf16 else 1e-4, atol=2e-3 if bf16 else 1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    assert {"specformer.products_attention.default", "specformer.products_attention_backward.default"} <= targets, targets
    assert not {t for t in targets if "scaled_dot_product" in t}, targets


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("is_causal", "padded"), [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("kept_bytes", [0, 3 << 10, 1 << 20])
def test_the_opaque_attention_operation_is_the_traced_one(monkeypatch, dtype, is_causal: bool, padded: bool,  # noqa: ANN001
                                                         kept_bytes: int) -> None:
    # specformer::products_attention (what a trace with symbolic lengths calls) gives the
    # autograd functions' output and gradients bit for bit, whichever of its blocks'
    # probabilities fit the buffer it keeps them in; opcheck: its fake shapes and strides, its
    # autograd registration and its traces agree with what it computes
    monkeypatch.setattr(attention, "MATMUL_KEPT_BYTES", kept_bytes)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 27, 16, generator=gen).to(dtype).requires_grad_() for h in (4, 2, 2))
    padding = None
    if padded:  # the second row's last 10 keys
        padding = torch.zeros(2, 27, dtype=dtype)
        padding[1, 17:] = torch.finfo(dtype).min
    block = 8
    function = attention._MatmulAttention if dtype == torch.bfloat16 else attention._Float32Attention
    want = function.apply(q, k, v, padding, is_causal, 0.25, block)
    got, _ = attention._products_attention(q, k, v, padding, is_causal, 0.25, block)
    upstream = torch.randn(want.shape, generator=gen).to(dtype)
    assert got.stride() == want.stride()
    assert torch.equal(got, want)
    for g, w in zip(torch.autograd.grad(got, (q, k, v), upstream), torch.autograd.grad(want, (q, k, v), upstream),
                    strict=True):
        assert torch.equal(g, w)
    torch.library.opcheck(attention._products_attention, (q, k, v, padding, is_causal, 0.25, block))


@pytest.mark.parametrize("scaling", [
    {"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16},
    {"type": "longrope", "factor": 2.0, "original_max_position_embeddings": 16,
     "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [2.0, 3.0, 4.0, 5.0]},
])
def test_rope_scaled_by_the_length_compiles_to_one_graph_with_the_eager_values(tiny, scaling) -> None:  # noqa: ANN001
    # reading max(position_ids) + 1 back to choose the frequencies broke the graph at every forward
    model = build_model(tiny(positional={"type": "rope", "scaling": scaling}, max_seq_len=64, d_model=32,
                             stack={"attention": {"n_heads": 4}}))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)
    for length in (12, 40):  # within the original context, past it
        ids = torch.randint(0, 61, (2, length))
        want = model(ids).logits
        got = compiled(ids).logits
        assert (got - want).abs().max() < 1e-5, length
    # padded on the left, the row's own length decides (here within the context)
    ids, mask = torch.randint(0, 61, (1, 40)), torch.zeros(1, 40, dtype=torch.long)
    mask[:, -14:] = 1
    want = model(ids, attention_mask=mask).logits[:, -14:]
    got = compiled(ids, attention_mask=mask).logits[:, -14:]
    assert (got - want).abs().max() < 1e-5
