"""The analytic counts against the model itself: meta builds (exact) and FlopCounterMode (5%)."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specformer import load_spec, preset_names
from specformer.analysis import count_parameters, flops_per_token, parameter_shapes

torch = pytest.importorskip("torch")
try:
    from specformer.builder import build_model
except ImportError as exc:  # pragma: no cover - only while the builder is missing
    pytest.skip(f"specformer.builder.build_model is not importable: {exc}", allow_module_level=True)


def _check_exact(spec) -> None:
    model = build_model(spec, device="meta")
    built = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    analytic = parameter_shapes(spec)
    assert built == analytic, {
        "only built": sorted(set(built) - set(analytic))[:5],
        "only analytic": sorted(set(analytic) - set(built))[:5],
        "shapes": [(k, built[k], analytic[k]) for k in built if k in analytic and built[k] != analytic[k]][:5],
    }
    assert count_parameters(spec).total == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", preset_names())
def test_presets_equal_meta_build(name: str) -> None:
    _check_exact(load_spec(name))


# --------------------------------------------------------------------------- generated specs


def _attention(draw, d_model: int, *, rope: bool) -> dict:
    head_dim = draw(st.sampled_from([None, 4, 8]))
    if head_dim is None:
        n_heads = draw(st.sampled_from([h for h in (1, 2, 4) if d_model % h == 0 and (d_model // h) % 2 == 0]))
    else:
        n_heads = draw(st.sampled_from([1, 2, 4]))
    n_kv = draw(st.sampled_from([h for h in (1, 2, 4) if n_heads % h == 0]))
    att = {"n_heads": n_heads, "n_kv_heads": n_kv, "bias": draw(st.booleans()),
           "qk_norm": draw(st.sampled_from(["none", "layernorm", "rmsnorm"]))}
    if att["qk_norm"] != "none":
        att["qk_norm_scope"] = draw(st.sampled_from(["head", "all"]))
    if head_dim is not None:
        att["head_dim"] = head_dim
    if draw(st.booleans()):
        att["sliding_window"] = draw(st.integers(1, 8))
    if draw(st.booleans()):
        att["softcap"] = draw(st.sampled_from([1.0, 50.0]))  # scores written out, as eager does
    return att


@st.composite
def valid_specs(draw) -> dict:
    kind = draw(st.sampled_from(["encoder", "decoder", "encoder-decoder"]))
    d_model = draw(st.sampled_from([8, 16, 24]))
    max_seq_len = draw(st.integers(4, 16))
    pos_type = draw(st.sampled_from(["sinusoidal", "learned", "rope", "alibi", "t5", "none"]))
    positional: dict = {"type": pos_type}
    if pos_type == "learned":
        positional["offset"] = draw(st.integers(0, 2))
        if draw(st.booleans()):
            positional["max_positions"] = max_seq_len + positional["offset"] + draw(st.integers(0, 3))
    if pos_type == "t5":
        positional["num_buckets"] = draw(st.integers(4, 8))
        # the logarithmic buckets need room beyond the exact ones (num_buckets // 2)
        positional["max_distance"] = draw(st.integers(positional["num_buckets"] // 2 + 1, 16))
    spec: dict = {
        "name": "generated",
        "kind": kind,
        "vocab_size": draw(st.integers(44, 64)),  # the default synthetic task needs 44 tokens
        "d_model": d_model,
        "max_seq_len": max_seq_len,
        "positional": positional,
    }
    placement = draw(st.sampled_from(["pre", "post", "sandwich", "output"]))
    for role in {"encoder": ["encoder"], "decoder": ["decoder"], "encoder-decoder": ["encoder", "decoder"]}[kind]:
        n_layers = draw(st.integers(1, 3))
        ffn_type = draw(st.sampled_from(["mlp", "glu"]))
        ffn = {"type": ffn_type, "bias": draw(st.booleans())}
        if draw(st.booleans()):
            ffn["d_ff"] = draw(st.integers(4, 40))
        norm_type = draw(st.sampled_from(["layernorm", "rmsnorm"]))
        norm: dict = {"type": norm_type, "placement": placement}
        if norm_type == "layernorm":
            norm["bias"] = draw(st.booleans())
            norm["weight"] = norm["bias"] or draw(st.booleans())  # no gain: no bias either (OLMo's)
        if draw(st.booleans()):
            norm["final"] = draw(st.booleans())
        stack: dict = {
            "n_layers": n_layers,
            "attention": _attention(draw, d_model, rope=pos_type == "rope"),
            "ffn": ffn,
            "norm": norm,
            # the builder defines parallel residuals (GPT-NeoX) for pre-norm only
            "residual": {"type": draw(st.sampled_from(["sequential", "parallel"])) if placement == "pre"
                         else "sequential"},
        }
        if stack["residual"]["type"] == "parallel":  # one norm for every sublayer (GPT-J, Phi), or one each
            stack["residual"]["shared_norm"] = draw(st.booleans())
        if role == "decoder" and kind == "encoder-decoder" and draw(st.booleans()):
            stack["cross_attention"] = _attention(draw, d_model, rope=False)
            stack["cross_attention"].pop("sliding_window", None)
        if n_layers > 1 and draw(st.booleans()):
            stack["overrides"] = [{"layers": [n_layers - 1], "ffn": {"d_ff": draw(st.integers(4, 40))}}]
        spec[role] = stack
    embedding: dict = {"tie_output": draw(st.booleans()), "scale": draw(st.booleans())}
    if kind == "encoder-decoder":
        embedding["share_encoder_decoder"] = draw(st.booleans())
    if draw(st.booleans()):
        embedding["segment_vocab_size"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        embedding["norm"] = {"type": draw(st.sampled_from(["layernorm", "rmsnorm"]))}
    spec["embedding"] = embedding
    head = draw(st.sampled_from([None, "lm", "mlm", "classification"]))
    if head == "lm":
        spec["head"] = {"type": "lm", "bias": draw(st.booleans())}
        if draw(st.booleans()):
            spec["head"]["softcap"] = draw(st.sampled_from([2.0, 30.0]))
    elif head == "mlm":
        spec["head"] = {"type": "mlm", "bias": draw(st.booleans())}
    elif head == "classification":
        spec["head"] = {"type": "classification", "pooler": draw(st.booleans()), "n_classes": draw(st.integers(2, 5))}
    return spec


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs())
def test_generated_specs_equal_meta_build(data: dict) -> None:
    _check_exact(load_spec(data))


# --------------------------------------------------------------------------- measured FLOPs


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("gpt-nano", []),
        ("gpt-nano", ["decoder.attention.n_kv_heads=2", "decoder.ffn={type: glu, d_ff: 256}",
                      "positional={type: rope}", "embedding.tie_output=false"]),
        ("gpt-nano", ["decoder.attention.backend=eager", "decoder.attention.sliding_window=16"]),
        ("bert-nano", []),
        ("t5-nano", []),
    ],
    ids=["gpt-nano", "gpt-nano-gqa-glu-rope", "gpt-nano-eager-window", "bert-nano", "t5-nano"],
)
def test_flops_match_flop_counter(name: str, overrides: list[str]) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    spec = load_spec(name, overrides=overrides)
    seq_len = 64
    torch.manual_seed(0)
    model = build_model(spec).eval()
    ids = torch.randint(0, spec.vocab_size, (2, seq_len))
    counter = FlopCounterMode(display=False)
    # FlopCounterMode has no formula for the fused CPU attention kernel; the math
    # backend runs the same attention as visible matrix products
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        if spec.kind == "encoder-decoder":
            model(ids, decoder_input_ids=ids)
        else:
            model(ids)
    measured = counter.get_total_flops() / (2 * seq_len)
    analytic = flops_per_token(spec, seq_len, count="executed").forward
    assert math.isclose(measured, analytic, rel_tol=0.05), (measured, analytic, counter.get_flop_counts())


_FROZEN = [
    ("gpt-nano", [], '[embed.*, "decoder.layers.[0-1].*"]'),
    ("gpt-nano", ["decoder.attention.n_kv_heads=2", "decoder.ffn={type: glu, d_ff: 256}", "positional={type: rope}",
                  "embedding.tie_output=false", "decoder.attention.qk_norm=rmsnorm"],
     '[embed.*, decoder.layers.0.*, "decoder.layers.1.attn_norm.*", "*.up_proj.*"]'),
    ("gpt-nano", ["decoder.norm.placement=post"], '[embed.*, "decoder.layers.0.*"]'),
    ("gpt-nano", ["decoder.residual.type=parallel"], '[embed.*, "decoder.layers.0.*"]'),
    ("gpt-nano", ["decoder.residual={type: parallel, shared_norm: true}"], '[embed.*, "decoder.layers.0.*"]'),
    ("gpt-nano", ["decoder.norm.placement=sandwich", "decoder.attention.softcap=50"], '[embed.*, "decoder.layers.0.*"]'),
    ("t5-nano", ["encoder.norm.placement=output", "decoder.norm.placement=output"], '[embed.*, "encoder.*"]'),
    ("t5-nano", ["decoder.residual={type: parallel, shared_norm: true}"], '[embed.*, "encoder.*"]'),
    ("gpt-nano", ["decoder.attention.backend=eager", "decoder.attention.sliding_window=16"], '["*.weight"]'),
    ("gpt-nano", ["embedding.tie_output=false"], '[embed.*, "decoder.*"]'),
    ("bert-nano", [], '[embed.*, "encoder.layers.[0-1].*"]'),
    ("bert-nano", ["head={type: classification, n_classes: 3}"], '[embed.*, "encoder.layers.[0-2].*"]'),
    ("t5-nano", [], '[embed.*, "encoder.*"]'),
    # the encoder and the cross-attention's keys and values frozen: only Q needs a gradient
    ("t5-nano", ["embedding.share_encoder_decoder=false", "decoder.cross_attention.qk_norm=layernorm"],
     '[embed.*, "encoder.*", "*.kv_proj.*"]'),
    ("gpt-nano", ["decoder.ffn={type: glu, activation: relu, d_ff: 256}"], '[embed.*, "decoder.layers.0.*", "*.up_proj.*"]'),
    ("gpt-nano", ["decoder.ffn={type: glu, activation: relu, d_ff: 256}"], '[embed.*, "decoder.layers.0.*", "*.gate_proj.*"]'),
]
_FROZEN_IDS = ["gpt-nano", "gpt-nano-gqa-glu-qk-norm", "gpt-nano-post-norm", "gpt-nano-parallel",
               "gpt-nano-parallel-one-norm", "t5-nano-parallel-one-norm-cross", "gpt-nano-sandwich-softcap",
               "t5-nano-output-norms",
               "gpt-nano-eager-window-biases-train", "gpt-nano-untied-head-trains", "bert-nano",
               "bert-nano-classifier", "t5-nano", "t5-nano-cross-q-only", "gpt-nano-reglu-up-frozen",
               "gpt-nano-reglu-gate-frozen"]


def _labels(spec, ids):
    if spec.head.type == "classification":
        return torch.randint(0, spec.head.n_classes, (ids.shape[0],))
    labels = ids.clone()
    if spec.head.type == "mlm":
        labels[torch.rand(ids.shape) >= spec.training.objective.mask_prob] = -100
    return labels


@pytest.mark.parametrize(("name", "overrides", "freeze"), _FROZEN, ids=_FROZEN_IDS)
def test_training_flops_of_a_frozen_model_are_the_products_autograd_runs(
        name: str, overrides: list[str], freeze: str) -> None:
    # every matrix product of a training forward (the loss as training computes it, labels=)
    # and its backward, with the frozen parameters' requires_grad off, as a run sets it
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils._python_dispatch import TorchDispatchMode

    from specformer.training.optim import apply_freeze

    aten = torch.ops.aten
    products = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
    onednn_linear = torch.ops.mkldnn._linear_pointwise.default if torch.backends.mkldnn.is_available() else None

    class Products(TorchDispatchMode):
        flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in products:
                a, b = [x for x in args if isinstance(x, torch.Tensor)][-2:]  # addmm: the bias first
                self.flops += 2 * a.numel() * b.shape[-1]
            elif func is onednn_linear:  # float32 products through oneDNN: x (..., K), weight (N, K)
                self.flops += 2 * args[0].numel() * args[1].shape[0]
            return func(*args, **(kwargs or {}))

    def measure(spec) -> tuple[float, float]:
        torch.manual_seed(0)
        model = build_model(spec).train()
        apply_freeze(model, spec.training.optimizer)
        ids = torch.randint(0, spec.vocab_size, (2, 64))
        labels = _labels(spec, ids)
        counter = Products()
        # the math kernel runs attention as visible products, each gradient only where needed
        with sdpa_kernel(SDPBackend.MATH), counter:
            extra = {"decoder_input_ids": ids} if spec.kind == "encoder-decoder" else {}
            model(ids, labels=labels, **extra).loss.backward()
        return counter.flops / ids.numel(), float((labels != -100).float().mean())

    plain = load_spec(name, overrides=overrides)
    spec = load_spec(name, overrides=[*overrides, f"training.optimizer.freeze={freeze}"])
    measured, labelled = measure(spec)
    analytic = flops_per_token(spec, 64, count="executed").training
    unfrozen, _ = measure(plain)
    assert measured < 0.9 * unfrozen
    if spec.head.type == "mlm":  # mask_prob of the tokens labelled on average, here a draw of them
        assert math.isclose(measured, analytic, rel_tol=0.05), (measured, analytic, labelled)
    else:
        assert analytic == measured, (analytic, measured)
        assert flops_per_token(plain, 64, count="executed").training == unfrozen


# --------------------------------------------------------------------------- measured activations


def _saved_activation_bytes(spec, batch: int, seq_len: int, *, checkpointing: bool = False,
                            autocast: bool = False, freeze: bool = False, kept: int = 0,
                            dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the distinct tensors autograd saves in a training forward (weights excluded),
    with the loss computed as training computes it (``labels=``; a masked-LM head on its
    labelled positions, ``mask_prob`` of them). With ``checkpointing``, what the
    checkpointed layers save (for their recomputation only) is not seen. With ``freeze``, the
    parameters the spec's ``training.optimizer.freeze`` matches do not require grad.
    specformer's CPU training attention keeps none of its probabilities here
    (``MATMUL_KEPT_BYTES = 0``): the estimate leaves those out (a CPU path's, at most that
    many bytes a layer; :func:`test_cpu_attention_keeps_at_most_its_budget_beyond_the_estimate`)."""
    torch.manual_seed(0)
    model = build_model(spec).train().to(dtype)  # float64: training.precision 64
    if freeze:
        from specformer.training.optim import apply_freeze

        apply_freeze(model, spec.training.optimizer)
    if checkpointing:
        model.gradient_checkpointing_enable()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    # autocast's low-precision copies of the weights are the estimate's weight_casts
    casts = [p.detach().to(torch.bfloat16) for p in model.parameters()] if autocast else []

    def is_cast(t) -> bool:  # a weight's copy, or its transpose (a product's right factor)
        views = (t, t.mT) if t.dim() == 2 else (t,)
        return t.dtype == torch.bfloat16 and any(c.shape == v.shape and torch.equal(c, v) for c in casts for v in views)

    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights and not is_cast(t):
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, spec.vocab_size, (batch, seq_len))
    labels = _labels(spec, ids)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), _kept_bytes(kept):
        if spec.kind == "encoder-decoder":
            model(ids, decoder_input_ids=ids, labels=labels)
        else:
            model(ids, labels=labels)
    return sum(saved.values())


@contextlib.contextmanager
def _kept_bytes(budget: int):
    from specformer.components import attention

    before = attention.MATMUL_KEPT_BYTES
    attention.MATMUL_KEPT_BYTES = budget
    try:
        yield
    finally:
        attention.MATMUL_KEPT_BYTES = before


@pytest.mark.parametrize("autocast", [False, True])
def test_cpu_attention_keeps_at_most_its_budget_beyond_the_estimate(monkeypatch, autocast: bool) -> None:
    # what the estimate leaves out: each layer's kept probabilities, at most MATMUL_KEPT_BYTES
    from specformer.components import attention

    monkeypatch.setattr(attention, "MATMUL_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_PRODUCT_ROWS", 16)
    spec = load_spec("gpt-nano", overrides=["decoder.attention.n_kv_heads=2", "positional={type: rope}"])
    without = _saved_activation_bytes(spec, 2, 256, autocast=autocast)
    budget = 1 << 18
    extra = _saved_activation_bytes(spec, 2, 256, autocast=autocast, kept=budget) - without
    assert 0 < extra <= spec.decoder.n_layers * budget
    # with room for all of them: the causal blocks' probabilities, in the dtype attention runs in
    heads, size = spec.decoder.attention.n_heads, 2 if autocast else 4
    block = attention.MATMUL_BLOCK if autocast else attention._float32_block_rows(2, 256, 256)
    probabilities = sum(heads * (min(256, start + block) - start) * min(256, start + block)
                        for start in range(0, 256, block))
    everything = _saved_activation_bytes(spec, 2, 256, autocast=autocast, kept=1 << 30) - without
    assert everything == spec.decoder.n_layers * 2 * probabilities * size


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("gpt-nano", []),
        ("gpt-nano", ["decoder.attention.backend=eager"]),
        ("gpt-nano", ["decoder.ffn={type: glu}", "decoder.attention.n_kv_heads=2", "positional={type: rope}"]),
        ("bert-nano", []),
        ("t5-nano", []),
        ("gpt-nano", ["vocab_size=8192", "embedding.tie_output=false"]),
        # relu's backward reads its output, the tensor the next product keeps anyway
        ("gpt-nano", ["decoder.ffn={type: mlp, activation: relu}", "decoder.norm.type=rmsnorm"]),
        ("gpt-nano", ["decoder.ffn={type: glu, activation: relu}"]),
        # Gemma 2's: a norm on each sublayer's output, capped scores (written out) and logits
        ("gpt-nano", ["decoder.norm.placement=sandwich", "decoder.attention.softcap=50", "head.softcap=30"]),
        # OLMo 2's: a norm on each sublayer's output alone (with cross-attention: t5-nano's), and
        # query and key norms over the whole projection
        ("t5-nano", ["encoder.norm.placement=output", "decoder.norm.placement=output"]),
        ("gpt-nano", ["positional={type: rope}", "decoder.norm={type: rmsnorm, placement: output}",
                      "decoder.attention.qk_norm=rmsnorm", "decoder.attention.qk_norm_scope=all"]),
        # attention dropout takes sdpa to torch's math kernel, which keeps the probabilities
        ("gpt-nano", ["decoder.attention.dropout=0.1"]),
        ("t5-nano", ["decoder.cross_attention.dropout=0.1"]),
    ],
    ids=["gpt-nano", "gpt-nano-eager", "gpt-nano-glu-gqa-rope", "bert-nano", "t5-nano", "gpt-nano-large-vocab",
         "gpt-nano-relu-rmsnorm", "gpt-nano-reglu", "gpt-nano-sandwich-softcaps", "t5-nano-output-norms",
         "gpt-nano-olmo2", "gpt-nano-attention-dropout", "t5-nano-cross-attention-dropout"],
)
@pytest.mark.parametrize("dtype", ["fp32", "bf16-mixed", "fp64"])
def test_activation_estimate_matches_saved_tensors(monkeypatch, name: str, overrides: list[str], dtype: str) -> None:
    # bf16-mixed: the residual stream (norm inputs) stays float32 under autocast, and an
    # eager softmax keeps its float32 output beside the bfloat16 copy A V multiplies by
    from specformer.analysis import activation_bytes
    from specformer.components import products

    monkeypatch.setattr(products, "BF16_IN_FLOAT32", False)  # bfloat16 products, as on a GPU
    spec = load_spec(name, overrides=overrides)
    measured = _saved_activation_bytes(spec, 2, 64, autocast=dtype == "bf16-mixed",
                                       dtype=torch.float64 if dtype == "fp64" else torch.float32)
    estimate = activation_bytes(spec, batch=2, seq_len=64, dtype=dtype, cpu=True)
    assert math.isclose(estimate, measured, rel_tol=0.15), (estimate, measured)


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16-mixed"])
def test_attention_dropout_on_a_cpu_keeps_what_torchs_math_kernel_keeps(monkeypatch, dtype: str, gqa: bool) -> None:
    # attention dropout takes a CPU to torch's math kernel, which keeps 3 T x T tensors a layer
    # (a GPU's fused kernels drop without keeping the probabilities: there, the estimate stays)
    from specformer.analysis import activation_bytes
    from specformer.components import products

    monkeypatch.setattr(products, "BF16_IN_FLOAT32", False)
    base = ["positional={type: rope}", "decoder.ffn={type: glu}"] + (["decoder.attention.n_kv_heads=2"] if gqa else [])
    plain, dropped = (load_spec("gpt-nano", overrides=base + extra) for extra in ([], ["decoder.attention.dropout=0.1"]))
    measured = [_saved_activation_bytes(spec, 2, 64, autocast=dtype == "bf16-mixed") for spec in (plain, dropped)]
    estimate = [activation_bytes(spec, batch=2, seq_len=64, dtype=dtype, cpu=True) for spec in (plain, dropped)]
    assert measured[1] > 1.2 * measured[0]
    assert math.isclose(estimate[1], measured[1], rel_tol=0.05), (estimate, measured)
    assert activation_bytes(dropped, batch=2, seq_len=64, dtype=dtype) == estimate[0]


@pytest.mark.parametrize(("name", "overrides", "freeze"), _FROZEN, ids=_FROZEN_IDS)
def test_activation_estimate_of_a_frozen_model_matches_saved_tensors(
        name: str, overrides: list[str], freeze: str) -> None:
    from specformer.analysis import activation_bytes

    plain = load_spec(name, overrides=overrides)
    spec = load_spec(name, overrides=[*overrides, f"training.optimizer.freeze={freeze}"])
    measured = _saved_activation_bytes(spec, 2, 64, freeze=True)
    estimate = activation_bytes(spec, batch=2, seq_len=64, dtype="fp32")
    assert math.isclose(estimate, measured, rel_tol=0.15), (estimate, measured)
    assert estimate < activation_bytes(plain, batch=2, seq_len=64, dtype="fp32")


@pytest.mark.parametrize("name", ["gpt-nano", "bert-nano"])
def test_activation_checkpointing_keeps_the_layers_inputs_and_one_layer(name: str) -> None:
    # measured: what a checkpointed forward saves outside its layers, and (from the forward
    # without it) what each layer saves; each layer then keeps its input, (B, T, D) float32
    from specformer.analysis import activation_bytes

    spec = load_spec(name, overrides=["training.activation_checkpointing=true"])
    full = _saved_activation_bytes(spec, 2, 64)
    outside = _saved_activation_bytes(spec, 2, 64, checkpointing=True)
    n_layers = sum(stack.n_layers for _, stack in spec.stacks())
    per_layer = (full - outside) / n_layers
    assert per_layer > 2 * 64 * spec.d_model * 4  # a layer keeps far more than its input
    measured = outside + n_layers * 2 * 64 * spec.d_model * 4 + per_layer
    estimate = activation_bytes(spec, batch=2, seq_len=64, dtype="fp32")
    assert math.isclose(estimate, measured, rel_tol=0.15), (estimate, measured)
    plain = activation_bytes(spec.model_copy(update={"training": {**spec.training.model_dump(),
                                                                   "activation_checkpointing": False}}),
                             batch=2, seq_len=64, dtype="fp32")
    assert estimate < 0.6 * plain


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("gpt-nano", []),
        ("gpt-nano", ["embedding.tie_output=false", "head.bias=true"]),
        ("gpt-nano", ["decoder.attention.qk_norm=layernorm", "head={type: mlm}", "embedding.norm={type: rmsnorm}"]),
        ("bert-nano", ["head={type: classification, n_classes: 3}"]),
        ("t5-nano", ["embedding.share_encoder_decoder=false"]),
        ("t5-nano", ["embedding.share_encoder_decoder=false", "embedding.tie_output=false"]),
    ],
)
def test_autocast_copies_the_parameters_the_estimate_counts(name: str, overrides: list[str]) -> None:
    # every parameter that a bf16 autocast forward casts, seen as the copies it makes
    from torch.utils._python_dispatch import TorchDispatchMode

    from specformer.analysis.memory import autocast_copied_parameters

    spec = load_spec(name, overrides=overrides)
    model = build_model(spec).train()
    by_storage = {p.untyped_storage().data_ptr(): p for p in model.parameters()}
    copied: dict[int, int] = {}

    class Casts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and out.dtype == torch.bfloat16:
                source = by_storage.get(args[0].untyped_storage().data_ptr())
                if source is not None:
                    copied[id(source)] = source.numel()
            return out

    ids = torch.randint(0, spec.vocab_size, (2, 16))
    labels = torch.randint(0, spec.head.n_classes, (2,)) if spec.head.type == "classification" else ids.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16), Casts():
        if spec.kind == "encoder-decoder":
            model(ids, decoder_input_ids=ids, labels=labels)
        else:
            model(ids, labels=labels)
    assert sum(copied.values()) == autocast_copied_parameters(spec) < count_parameters(spec).total


def test_activation_estimate_counts_the_probabilities_of_t5s_trained_bias() -> None:
    # T5's trained bias has no fused kernel: each self-attention keeps (B, H, T, T)
    # probabilities, which dominate at longer sequences
    from specformer.analysis import activation_bytes

    spec = load_spec("t5-nano")
    measured = _saved_activation_bytes(spec, 2, 256)
    estimate = activation_bytes(spec, batch=2, seq_len=256, dtype="fp32")
    assert math.isclose(estimate, measured, rel_tol=0.15), (estimate, measured)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("n_layers", [2, 4])
@pytest.mark.parametrize(("positional", "window", "per_token"), [("alibi", None, 4), ("rope", 64, 1)])
def test_activation_estimate_counts_the_mask_the_layers_share(
    backend: str, n_layers: int, positional: str, window: int | None, per_token: int
) -> None:
    # ALiBi's (H, T, T) bias and a sliding window's (T, T) mask are made once per stack, in the
    # dtype attention computes in, and every sdpa layer keeps that one tensor for the backward
    # pass: H T^2 elements (4 MiB at T = 512 with 4 heads in fp32), however many layers; eager
    # adds it to the scores and keeps nothing of it
    from specformer.analysis import activation_bytes

    def measure(overrides: list[str]) -> tuple[int, int]:
        spec = load_spec("gpt-nano", overrides=[*overrides, f"decoder.n_layers={n_layers}",
                                                f"decoder.attention.backend={backend}"])
        return _saved_activation_bytes(spec, 1, 512), activation_bytes(spec, batch=1, seq_len=512, dtype="fp32")

    changed = [f"positional={{type: {positional}}}"]
    if window is not None:
        changed.append(f"decoder.attention.sliding_window={window}")
    # against the same model without the window, or without positions (no mask either way)
    base = [f"positional={{type: {positional}}}"] if window is not None else ["positional={type: none}"]
    (measured, estimate), (base_measured, base_estimate) = measure(changed), measure(base)
    mask = per_token * 512 * 512 * 4 if backend == "sdpa" else 0
    assert estimate - base_estimate == mask
    # eager keeps a causal mask of T^2 bools per layer of its own where there is no other mask
    slack = (n_layers if backend == "eager" else 1) * 512 * 512
    assert abs(measured - base_measured - mask) <= slack, (measured - base_measured, mask)


def test_under_autocast_the_layers_share_one_low_precision_copy_of_alibis_bias() -> None:
    # the bias is made in fp32 and autocast casts what sdpa takes to bf16: once per stack, not
    # once per layer (each layer kept its own cast for the backward pass)
    def kept(n_layers: int) -> int:
        def measure(positional: str) -> int:
            spec = load_spec("gpt-nano", overrides=[f"positional={{type: {positional}}}", f"decoder.n_layers={n_layers}"])
            return _saved_activation_bytes(spec, 1, 512, autocast=True)

        return measure("alibi") - measure("none")

    bias = 4 * 512 * 512 * 2  # (H, T, T) in bf16
    assert abs(kept(2) - bias) <= 512 * 512 and abs(kept(4) - bias) <= 512 * 512, (kept(2), kept(4), bias)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-mixed"])
@pytest.mark.parametrize("frozen", [True, False], ids=["head-alone", "all"])
@pytest.mark.parametrize(("pooling", "pooler", "dropout"),
                         [("first", True, 0.0), ("first", False, 0.0), ("first", False, 0.1), ("first", True, 0.1),
                          ("mean", True, 0.0), ("mean", False, 0.1)])
def test_activation_estimate_of_a_classifier_head(pooling: str, pooler: bool, dropout: float, frozen: bool,
                                                  autocast: bool) -> None:
    """The first token's vector is a view of the final hidden states: the product that keeps
    it for its weight gradient keeps all T of them, which is most of what a classifier with a
    frozen body saves. Mean pooling makes a new (B, D) tensor, and so does autocast's copy."""
    from specformer.analysis import activation_bytes

    head = f"head={{type: classification, n_classes: 3, pooling: {pooling}, pooler: {str(pooler).lower()}, " \
           f"dropout: {dropout}}}"
    freeze = ['training.optimizer.freeze=[embed.*, "encoder.*"]'] if frozen else []
    spec = load_spec("bert-nano", overrides=[head, *freeze])
    measured = _saved_activation_bytes(spec, 2, 64, freeze=frozen, autocast=autocast)
    estimate = activation_bytes(spec, batch=2, seq_len=64, dtype="bf16-mixed" if autocast else "fp32")
    assert math.isclose(estimate, measured, rel_tol=0.15), (estimate, measured)
