"""build_model: every preset on meta, published parameter counts, init, devices and dtypes."""

from __future__ import annotations

import math

import pytest
import torch

from specformer import SpecError, build_model, load_spec, preset_names
from specformer.builder import BuildError, init_weights
from specformer.components import DecoderModel, EncoderDecoderModel, EncoderModel
from specformer.components.positional import Positional

# Published parameter counts (Hugging Face reference models: GPT2LMHeadModel with tied
# embeddings, BertForMaskedLM, T5ForConditionalGeneration, LlamaForCausalLM, MistralForCausalLM).
PUBLISHED = {
    "gpt2-small": 124_439_808,
    "bert-base": 109_514_298,
    "t5-small": 60_506_624,
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "phi-2": 2_779_683_840,  # PhiForCausalLM: one norm per parallel block, biased LM head
}
# "Attention Is All You Need", Table 3: base 65M, big 213M parameters.
PAPER = {"transformer-base": 65e6, "transformer-big": 213e6}


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_builds_on_meta(name: str) -> None:
    spec = load_spec(name)
    model = build_model(spec, device="meta")
    params = list(model.parameters())
    assert params and all(p.is_meta for p in params)
    expected = {"decoder": DecoderModel, "encoder": EncoderModel, "encoder-decoder": EncoderDecoderModel}
    assert isinstance(model, expected[spec.kind])
    assert model.spec == spec


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts(name: str) -> None:
    model = build_model(load_spec(name), device="meta")
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PAPER))
def test_transformer_paper_counts_within_5_percent(name: str) -> None:
    n = build_model(load_spec(name), device="meta").num_parameters()
    assert abs(n - PAPER[name]) / PAPER[name] < 0.05, n


def test_meta_build_of_llama2_7b_allocates_nothing() -> None:
    # nothing is materialised or initialised on the meta device (its speed: docs/components.md)
    model = build_model(load_spec("llama2-7b"), device="meta")
    assert all(p.is_meta for p in model.parameters()) and all(b.is_meta for b in model.buffers())
    assert model.num_parameters() == 6_738_415_616


def test_tied_head_shares_the_embedding_and_stays_tied() -> None:
    model = build_model(load_spec("gpt-nano"))
    assert model.head.proj is None
    assert not any(k.startswith("head.") for k in model.state_dict())
    with torch.no_grad():
        model.embed.tokens.weight[3].fill_(1.0)
    h = torch.zeros(1, 1, model.spec.d_model)
    h[..., 0] = 2.0
    assert model.head(h)[0, 0, 3].item() == pytest.approx(2.0)


def test_untied_head_has_its_own_projection() -> None:
    spec = load_spec("gpt-nano", overrides=["embedding.tie_output=false"])
    model = build_model(spec)
    assert model.head.proj.weight.shape == (spec.vocab_size, spec.d_model)
    assert model.head.proj.weight.data_ptr() != model.embed.tokens.weight.data_ptr()


def test_state_dict_names_follow_the_documented_format() -> None:
    keys = set(build_model(load_spec("llama2-7b"), device="meta").state_dict())
    for key in [
        "embed.tokens.weight",
        "decoder.layers.0.attn_norm.weight",
        "decoder.layers.0.self_attn.qkv_proj.weight",
        "decoder.layers.0.self_attn.o_proj.weight",
        "decoder.layers.0.ffn_norm.weight",
        "decoder.layers.0.ffn.gate_proj.weight",
        "decoder.layers.0.ffn.up_proj.weight",
        "decoder.layers.0.ffn.down_proj.weight",
        "decoder.final_norm.weight",
        "head.proj.weight",
    ]:
        assert key in keys, key
    qkv = build_model(load_spec("llama2-7b"), device="meta").decoder.layers[0].self_attn.qkv_proj
    assert qkv.weight.shape == (3 * 4096, 4096)
    t5 = set(build_model(load_spec("t5-small"), device="meta").state_dict())
    for key in [
        "encoder.rel_bias.weight",
        "decoder.rel_bias.weight",
        "decoder.layers.0.cross_norm.weight",
        "decoder.layers.0.cross_attn.q_proj.weight",
        "decoder.layers.0.cross_attn.kv_proj.weight",
        "decoder.layers.0.cross_attn.o_proj.weight",
        "encoder.final_norm.weight",
    ]:
        assert key in t5, key
    assert "encoder.layers.1.rel_bias.weight" not in t5  # one table per stack
    bert = set(build_model(load_spec("bert-base"), device="meta").state_dict())
    for key in [
        "embed.positions.weight",
        "embed.segments.weight",
        "embed.norm.weight",
        "head.transform.dense.weight",
        "head.transform.norm.weight",
        "head.bias",
    ]:
        assert key in bert, key


def test_init_follows_the_spec() -> None:
    torch.manual_seed(0)
    spec = load_spec(
        "gpt-nano",
        overrides=["decoder.n_layers=8", "d_model=256", "init.std=0.05", "init.scaled_residual=true"],
    )
    model = build_model(spec)
    layer = model.decoder.layers[0]
    assert layer.self_attn.qkv_proj.weight.std().item() == pytest.approx(0.05, rel=0.05)
    assert layer.self_attn.qkv_proj.bias.abs().max().item() == 0.0
    scaled = 0.05 / math.sqrt(2 * 8)
    assert layer.self_attn.o_proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert layer.ffn.down_proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert model.embed.tokens.weight.std().item() == pytest.approx(0.05, rel=0.05)
    assert torch.equal(layer.attn_norm.weight, torch.ones_like(layer.attn_norm.weight))
    unscaled = build_model(spec.model_copy(update={"init": spec.init.model_copy(update={"scaled_residual": False})}))
    o = unscaled.decoder.layers[0].self_attn.o_proj.weight
    assert o.std().item() == pytest.approx(0.05, rel=0.05)


@pytest.mark.parametrize("scale", [None, 1.0])
def test_t5_init_gives_t5s_stds_and_tied_logits_of_std_one(scale: float | None) -> None:
    # T5's init (Hugging Face's T5PreTrainedModel._init_weights): N(0, 1) embeddings,
    # fan-in stds elsewhere, q·k's 1/sqrt(head_dim) in the queries' init. With one std
    # of 0.02 for all, a tied, input-scaled head starts at logits of std 0.02.
    torch.manual_seed(0)
    sets = ["vocab_size=512", "init={scheme: t5}"]
    if scale is not None:
        sets += [f"{r}.scale={scale}" for r in ("encoder.attention", "decoder.attention", "decoder.cross_attention")]
    spec = load_spec("t5-nano", sets)
    assert spec.init.scaled_residual is False  # T5 has no such rule
    model = build_model(spec)
    d, hd, d_ff = 128, 32, 512
    att = model.encoder.layers[0].self_attn
    q_std = (d * hd) ** -0.5 / att.scale
    assert q_std == pytest.approx(d**-0.5 if scale is None else (d * hd) ** -0.5)
    expected = {
        "embed.tokens.weight": 1.0,
        "encoder.rel_bias.weight": d**-0.5,
        "encoder.layers.0.self_attn.o_proj.weight": d**-0.5,
        "encoder.layers.0.ffn.up_proj.weight": d**-0.5,
        "encoder.layers.0.ffn.down_proj.weight": d_ff**-0.5,
        "decoder.layers.1.cross_attn.q_proj.weight": q_std,
        "decoder.layers.1.cross_attn.kv_proj.weight": d**-0.5,
    }
    params = dict(model.named_parameters())
    for name, std in expected.items():
        assert params[name].std().item() == pytest.approx(std, rel=0.1), name
    qkv = att.qkv_proj.weight
    assert qkv[: 4 * hd].std().item() == pytest.approx(q_std, rel=0.1)
    assert qkv[4 * hd :].std().item() == pytest.approx(d**-0.5, rel=0.1)
    assert model.head.tied
    ids = torch.randint(0, 512, (4, 16))
    with torch.no_grad():
        logits = model(ids, decoder_input_ids=ids).logits
    assert logits.std().item() == pytest.approx(1.0, rel=0.2)
    normal = build_model(load_spec("t5-nano", ["vocab_size=512", "init={scheme: normal}"]))
    with torch.no_grad():
        assert normal(ids, decoder_input_ids=ids).logits.std().item() < 0.05


def test_t5_init_of_an_untied_head_and_its_refusals() -> None:
    torch.manual_seed(0)
    model = build_model(load_spec("t5-nano", ["init={scheme: t5}", "embedding.tie_output=false"]))
    assert model.head.proj.weight.std().item() == pytest.approx(1.0, rel=0.1)  # T5's lm_head
    with pytest.raises(SpecError, match="scaled_residual"):
        load_spec("t5-nano", ["init={scheme: t5, scaled_residual: true}"])
    with pytest.raises(SpecError, match="init.scheme"):
        load_spec("t5-nano", ["init.scheme=xavier"])


def test_init_is_seeded_and_skipped_on_meta() -> None:
    spec = load_spec("gpt-nano")
    torch.manual_seed(1)
    a = build_model(spec)
    torch.manual_seed(1)
    b = build_model(spec)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    meta = build_model(spec, device="meta")
    init_weights(meta)  # nothing to do, and no error
    assert all(p.is_meta for p in meta.parameters())


def test_dtype_and_device() -> None:
    model = build_model("gpt-nano", dtype="bfloat16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    out = model(torch.randint(0, 512, (1, 5)))
    assert out.logits.dtype == torch.bfloat16
    assert torch.isfinite(out.logits.float()).all()
    with pytest.raises(BuildError, match="not a floating-point dtype"):
        build_model("gpt-nano", dtype="int8")
    # the short names of --dtype and training.precision, and torch's own objects
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), (torch.float64, torch.float64)):
        assert {p.dtype for p in build_model("gpt-nano", dtype=name, device="meta").parameters()} == {dtype}
    with pytest.raises(BuildError, match="torch.int8 is not a floating-point dtype"):
        build_model("gpt-nano", dtype=torch.int8)


def test_parallel_post_norm_is_refused_with_a_clear_message() -> None:
    # refused by the schema already, so no model is ever half-built from it
    from specformer import SpecError

    with pytest.raises(SpecError, match="parallel residual .* needs norm placement pre"):
        load_spec("gpt-nano", overrides=["decoder.residual.type=parallel", "decoder.norm.placement=post"])


class _ScaleNorm(torch.nn.Module):
    """A component written the usual PyTorch way: its constructor sets its values, and it
    has no init hook (no ``reset_parameters``, no ``init_parameters``)."""

    def __init__(self, spec, *, dim: int) -> None:
        super().__init__()
        self.gain = torch.nn.Parameter(torch.full((dim,), 2.0))
        self.register_buffer("shift", torch.arange(dim, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gain * torch.nn.functional.normalize(x, dim=-1) + self.shift


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_component_without_init_hook_keeps_its_constructor_values(monkeypatch, dtype) -> None:
    from specformer.registry import REGISTRY, Entry

    entry = REGISTRY.get("norm", "rmsnorm")
    monkeypatch.setitem(REGISTRY._families["norm"], "rmsnorm", Entry("norm", "rmsnorm", entry.spec, _ScaleNorm))
    spec = load_spec("gpt-nano", overrides=["decoder.n_layers=2", "decoder.norm.type=rmsnorm"])
    torch.manual_seed(0)
    model = build_model(spec, dtype=dtype)
    norms = [m for m in model.modules() if isinstance(m, _ScaleNorm)]
    assert len(norms) == 5  # two per layer and the final norm
    for norm in norms:
        assert torch.equal(norm.gain, torch.full((128,), 2.0, dtype=dtype or torch.float32))
        assert torch.equal(norm.shift, torch.arange(128).to(dtype or torch.float32))
    # the rest is initialised as usual, and seeded
    torch.manual_seed(0)
    again = build_model(spec, dtype=dtype)
    for (name, p), q in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert model.decoder.layers[0].self_attn.o_proj.weight.std().item() == pytest.approx(0.02 / 2, rel=0.2)
    assert build_model(spec, device="meta").decoder.final_norm.gain.is_meta


class _BareAttention(torch.nn.Module):
    """An attention that returns its output alone, not (output, weights)."""

    def __init__(self, spec, *, d_model: int, cross: bool, layer_idx: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model)

    def forward(self, x, **kwargs):
        return self.proj(x)


class _NarrowFFN(torch.nn.Module):
    """An FFN that forgets to project back to d_model (one feature: it broadcasts)."""

    def __init__(self, spec, *, d_model: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(d_model, 1)

    def forward(self, x):
        return self.up(x)


class _WrongNorm(torch.nn.Module):
    def __init__(self, spec, d_model: int) -> None:  # the builder passes dim=
        super().__init__()


def _swap(monkeypatch, family: str, name: str, target) -> None:
    from specformer.registry import REGISTRY, Entry

    entry = REGISTRY.get(family, name)
    monkeypatch.setitem(REGISTRY._families[family], name, Entry(family, name, entry.spec, target, source="tests"))


def test_a_component_of_ones_own_that_returns_the_wrong_shape_is_named(monkeypatch) -> None:
    # both broadcast into the residual stream of a batch of two without an error otherwise
    ids = torch.randint(0, 512, (2, 6))
    _swap(monkeypatch, "attention", "mha", _BareAttention)
    model = build_model(load_spec("gpt-nano", overrides=["decoder.n_layers=1"]))
    with pytest.raises(ValueError, match=r"the self-attention _BareAttention returned a tensor of shape \(2, 6, 128\) "
                                         r"for an input of shape \(2, 6, 128\): an attention module returns "
                                         r"\(output, weights\)"):
        model(ids)
    monkeypatch.undo()
    _swap(monkeypatch, "ffn", "mlp", _NarrowFFN)
    model = build_model(load_spec("gpt-nano", overrides=["decoder.n_layers=1"]))
    with pytest.raises(ValueError, match=r"the ffn _NarrowFFN returned a tensor of shape \(2, 6, 1\) for an input "
                                         r"of shape \(2, 6, 128\): an ffn module maps \(B, T, D\) to \(B, T, D\)"):
        model(ids)


class _OldForward(torch.nn.Module):
    def __init__(self, spec, *, d_model, cross, layer_idx) -> None:
        super().__init__()

    def forward(self, x, mask=None):  # no is_causal, rope, cache, need_weights
        return x, None


def test_an_attention_whose_forward_cannot_take_the_blocks_call_is_named_at_build(monkeypatch) -> None:
    _swap(monkeypatch, "attention", "mha", _OldForward)
    with pytest.raises(TypeError, match=r"the self-attention _OldForward's forward\(x, mask=None\) cannot be called "
                                        r"as the block calls it, forward\(x, mask=..., is_causal=..., rope=..., "
                                        r"cache=..., need_weights=...\): got an unexpected keyword argument 'is_causal'"):
        build_model(load_spec("gpt-nano", overrides=["decoder.n_layers=1"]), device="meta")


class _MaskedFFN(torch.nn.Module):
    def __init__(self, spec, *, d_model) -> None:
        super().__init__()

    def forward(self, x, mask):  # the block calls ffn(x)
        return x


class _NormOfRows(torch.nn.Module):
    """A norm that returns each row's norm, (B, T, 1), not the normalised rows."""

    def __init__(self, spec, *, dim) -> None:
        super().__init__()

    def forward(self, x):
        return x.norm(dim=-1, keepdim=True)


class _KeywordNorm(torch.nn.Module):
    def __init__(self, spec, *, dim) -> None:
        super().__init__()

    def forward(self, x, *, scale):  # the model calls norm(x)
        return x * scale


class _HiddenOnlyHead(torch.nn.Module):
    def __init__(self, spec, *, d_model, vocab_size, embedding) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d_model, vocab_size)

    def forward(self, hidden):  # the model calls head(hidden, attention_mask)
        return self.proj(hidden)


def test_an_ffn_norm_or_head_whose_forward_cannot_take_the_models_call_is_named_at_build(monkeypatch) -> None:
    # each was a bare TypeError from inside torch at the first forward (after `train` prepared its data)
    spec = load_spec("gpt-nano", overrides=["decoder.n_layers=1"])
    _swap(monkeypatch, "ffn", "mlp", _MaskedFFN)
    with pytest.raises(TypeError, match=r"the ffn _MaskedFFN's forward\(x, mask\) cannot be called as the block "
                                        r"calls it, forward\(x\): missing a required argument: 'mask'"):
        build_model(spec, device="meta")
    monkeypatch.undo()
    _swap(monkeypatch, "norm", "layernorm", _KeywordNorm)
    with pytest.raises(TypeError, match=r"the norm _KeywordNorm's forward\(x, \*, scale\) cannot be called as the "
                                        r"model calls it, forward\(x\): missing a required argument: 'scale'"):
        build_model(spec, device="meta")
    monkeypatch.undo()
    _swap(monkeypatch, "head", "lm", _HiddenOnlyHead)
    with pytest.raises(TypeError, match=r"the head _HiddenOnlyHead's forward\(hidden\) cannot be called as the model "
                                        r"calls it, forward\(hidden, attention_mask\): too many positional arguments"):
        build_model(spec, device="meta")


def test_a_norm_of_ones_own_that_returns_the_wrong_shape_is_named(monkeypatch) -> None:
    # with output norms and no final norm, its (B, T, 1) broadcast into the residual stream without an error
    _swap(monkeypatch, "norm", "layernorm", _NormOfRows)
    spec = load_spec("gpt-nano", overrides=["decoder.n_layers=1", "decoder.norm.placement=output",
                                            "decoder.norm.final=false"])
    model = build_model(spec)
    with pytest.raises(ValueError, match=r"the norm _NormOfRows returned a tensor of shape \(2, 6, 1\) for an input "
                                         r"of shape \(2, 6, 128\): a norm module maps \(\.\.\., D\) to the shape it is "
                                         r"given"):
        model(torch.randint(0, 512, (2, 6)))
    monkeypatch.undo()
    # specformer's own norms carry no check
    model = build_model(spec)
    assert not any(m._forward_hooks for m in model.modules())


class _NarrowHead(torch.nn.Module):
    """A head whose logits are one column short of its spec's width."""

    def __init__(self, spec, *, d_model, vocab_size, embedding) -> None:
        super().__init__()
        width = spec.n_classes if hasattr(spec, "n_classes") else vocab_size
        self.proj = torch.nn.Linear(d_model, width - 1)

    def forward(self, hidden, attention_mask=None):
        return self.proj(hidden)


def test_a_head_of_ones_own_whose_logits_have_the_wrong_width_is_named(monkeypatch) -> None:
    # (2, 6, 511) logits trained while the labels stayed below 511, then failed in the loss's
    # cross-entropy ("labels must be class indices in [0, 511)"), and generate sampled from them silently
    ids = torch.randint(0, 512, (2, 6))
    _swap(monkeypatch, "head", "lm", _NarrowHead)
    model = build_model(load_spec("gpt-nano", overrides=["decoder.n_layers=1"]))
    with pytest.raises(ValueError, match=r"the head _NarrowHead \(head type 'lm'\) returned logits of shape \(2, 6, 511\) "
                                         r"for hidden states of shape \(2, 6, 128\); expected \(2, 6, 512\): a head "
                                         r"returns logits \(B, T, vocab_size\), vocab_size = 512"):
        model(ids)
    with pytest.raises(ValueError, match=r"returned logits of shape \(2, 5, 511\).*expected \(2, 5, 512\)"):
        model(ids[:, :-1], labels=ids[:, 1:].clone())
    monkeypatch.undo()
    # a spec with n_classes: that many logits per sequence (or per position)
    _swap(monkeypatch, "head", "classification", _NarrowHead)
    spec = load_spec("bert-nano", overrides=["encoder.n_layers=1", "head={type: classification, n_classes: 3}"])
    with pytest.raises(ValueError, match=r"the head _NarrowHead \(head type 'classification'\) returned logits of shape "
                                         r"\(2, 6, 2\) for hidden states of shape \(2, 6, 128\); expected \(2, 3\) or "
                                         r"\(2, 6, 3\): a head returns logits \(B, n_classes\) or \(B, T, n_classes\), "
                                         r"n_classes = 3"):
        build_model(spec)(ids)
    monkeypatch.undo()
    # specformer's own heads carry no check
    for name in ("gpt-nano", "bert-nano"):
        assert not any(m._forward_hooks for m in build_model(name, device="meta").modules())


class _BadPositions(Positional):
    """A positional scheme of one's own whose hooks return the wrong shapes (``mode``)."""

    scope = "stack"
    mode = "heads"

    def __init__(self, spec, *, d_model, max_seq_len, n_heads, head_dim, causal) -> None:
        super().__init__()
        self.n_heads = n_heads

    def bias(self, q_index, k_index, *, dtype):
        if self.mode == "heads":  # one head too many
            return torch.zeros(1, self.n_heads + 1, len(q_index), len(k_index), dtype=dtype)
        return None

    def rotation(self, position_ids, n_positions, *, dtype):
        if self.mode == "odd":  # an odd rotated size: rotate-half pairs nothing
            table = torch.ones(1, position_ids.shape[-1], 1, 7, dtype=dtype)
            return table, table
        return None

    def embed(self, x, position_ids, n_positions):
        return x[..., :5]


def test_a_positional_module_of_ones_own_whose_hooks_return_the_wrong_shapes_is_named(monkeypatch) -> None:
    # the wrong head count failed inside attention ("size of tensor a (4) must match ... (5)"), which
    # named no module; an odd rotated size ran, pairing features rotate-half never pairs
    ids = torch.randint(0, 512, (2, 6))
    _swap(monkeypatch, "positional", "learned", _BadPositions)
    spec = load_spec("gpt-nano", overrides=["decoder.n_layers=1"])
    monkeypatch.setattr(_BadPositions, "mode", "heads")
    with pytest.raises(ValueError, match=r"the positional module _BadPositions's bias\(q_index, k_index\) returned a tensor of "
                                         r"shape \(1, 5, 6, 6\) for 6 queries and 6 keys: an attention bias is None "
                                         r"or \(1, H, T, Tk\) = \(1, 4, 6, 6\)"):
        build_model(spec)(ids)
    monkeypatch.setattr(_BadPositions, "mode", "odd")
    with pytest.raises(ValueError, match=r"the positional module _BadPositions's rotation\(position_ids, ...\) returned tensors "
                                         r"of shapes \(1, 6, 1, 7\) and \(1, 6, 1, 7\) for 6 positions: a rotation is "
                                         r"None or \(cos, sin\), each \(1\|B, T, 1, R\) with R even and at most "
                                         r"head_dim = 32"):
        build_model(spec)(ids)
    monkeypatch.setattr(_BadPositions, "scope", "embedding")
    with pytest.raises(ValueError, match=r"the positional module _BadPositions's embed\(x, position_ids, n_positions\) returned "
                                         r"a tensor of shape \(2, 6, 5\) for embeddings x of shape \(2, 6, 128\)"):
        build_model(spec)(ids)


def test_a_target_that_takes_other_arguments_than_the_builder_gives_is_named(monkeypatch) -> None:
    _swap(monkeypatch, "norm", "layernorm", _WrongNorm)
    with pytest.raises(TypeError, match=r"norm type 'layernorm': its target [\w.]*test_build:_WrongNorm \(registered by tests\) cannot be called as "
                                        r"the builder calls it, Target\(spec, \*, dim\): .*d_model"):
        build_model(load_spec("gpt-nano", overrides=["decoder.n_layers=1"]), device="meta")


class _PlainPositions(torch.nn.Module):
    """Positions written as a plain module, not a Positional."""

    def __init__(self, spec, *, d_model, max_seq_len, n_heads, head_dim, causal) -> None:
        super().__init__()

    def embed(self, x, position_ids, n_positions):
        return x


def test_a_positional_target_that_is_not_a_positional_is_named(monkeypatch) -> None:
    _swap(monkeypatch, "positional", "none", _PlainPositions)
    with pytest.raises(BuildError, match=r"positional type 'none' built a _PlainPositions, which is not a "
                                         r"specformer.components.positional.Positional: subclass it"):
        build_model(load_spec("gpt-nano", overrides=["positional={type: none}"]), device="meta")


def test_a_device_this_machine_lacks_is_a_build_error_that_says_so(monkeypatch) -> None:
    with pytest.raises(BuildError, match=r"device 'foo' is not a torch device \(e\.g\. cpu, cuda"):
        build_model("gpt-nano", device="foo")
    if not torch.cuda.is_available():  # torch's own error: a bare AssertionError, "Torch not compiled with CUDA enabled"
        with pytest.raises(BuildError, match=r"device 'cuda:5': (this torch \(.*\) is built for the CPU only|torch sees "
                                             r"no CUDA GPU here)"):
            build_model("gpt-nano", device="cuda:5")
    # two GPUs: cuda:5 is past them (checked before a weight is made, so nothing reaches CUDA)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(BuildError, match=r"device 'cuda:5': this machine has 2 CUDA GPUs \(cuda:0 to cuda:1\)"):
        build_model("gpt-nano", device="cuda:5")
    assert all(p.is_meta for p in build_model("gpt-nano", device="meta").parameters())  # meta needs no device
