"""The schema: defaults, derived sizes, merge semantics, overrides and round trips."""

from __future__ import annotations

import copy
import textwrap

import pydantic
import pytest
import yaml

from specformer import load_spec, preset_names
from specformer.registry import REGISTRY
from specformer.specs.errors import SpecError
from specformer.specs.loader import apply_overrides, deep_merge
from specformer.specs.schema import GLUSpec, LayerNormSpec, ModelSpec, RMSNormSpec, default_glu_d_ff

PRESETS = preset_names()


def test_the_documented_presets_ship():
    expected = {
        "transformer-base", "transformer-big", "bert-base", "bert-large", "gpt2-small", "gpt2-medium",
        "gpt2-large", "gpt2-xl", "t5-small", "t5-base", "llama2-7b", "gpt-nano", "bert-nano", "t5-nano",
    }
    assert expected <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_round_trips_through_yaml(name, tmp_path):
    spec = load_spec(name)
    path = tmp_path / "dumped.yaml"
    path.write_text(spec.to_yaml())
    again = load_spec(path)
    assert again == spec
    assert again.to_yaml() == spec.to_yaml()


@pytest.mark.parametrize("name", PRESETS)
def test_preset_names_its_source_and_carries_the_modeline(name):
    from specformer.specs.loader import SCHEMA_MODELINE, preset_path

    text = preset_path(name).read_text()
    assert text.startswith(SCHEMA_MODELINE + "\n")
    comment = [line for line in text.splitlines()[1:4] if line.startswith("#")]
    assert comment, "a preset says where its numbers come from"


def test_spec_is_frozen_and_fully_defaulted():
    spec = load_spec("gpt2-small")
    with pytest.raises(pydantic.ValidationError):
        spec.d_model = 5
    att = spec.decoder.attention
    assert (att.head_dim, att.n_kv_heads) == (64, 12)
    assert spec.decoder.ffn.d_ff == 3072
    assert spec.decoder.norm.final is True  # pre-norm gets a final norm
    assert load_spec("bert-base").encoder.norm.final is False  # post-norm does not


def test_model_copy_with_update_validates_like_a_new_spec():
    from specformer import SpecError

    spec = load_spec("gpt-nano")
    assert spec.model_copy(update={"name": "mine"}).name == "mine"
    smaller = spec.model_copy(update={"decoder": spec.decoder.model_copy(update={"n_layers": 2})})
    assert smaller.decoder.n_layers == 2 and smaller == load_spec("gpt-nano", overrides=["decoder.n_layers=2"])
    with pytest.raises(SpecError, match=r"vocab_size: input should be greater than 0, got -5"):
        spec.model_copy(update={"vocab_size": -5})
    with pytest.raises(SpecError, match=r"did you mean 'vocab_size'"):
        spec.model_copy(update={"vocab_sise": 300})
    with pytest.raises(SpecError, match=r"n_heads"):
        spec.decoder.attention.model_copy(update={"n_heads": 0})
    with pytest.raises(SpecError, match=r"training.seq_len: seq_len=256 is longer than the model's max_seq_len=32"):
        spec.model_copy(update={"max_seq_len": 32})


def test_model_copy_derives_the_sizes_again_as_load_spec_does():
    spec = load_spec("gpt-nano")
    assert (spec.decoder.attention.head_dim, spec.decoder.ffn.d_ff) == (32, 512)
    wider = spec.model_copy(update={"d_model": 256})
    assert (wider.decoder.attention.head_dim, wider.decoder.ffn.d_ff) == (64, 1024)
    assert wider == load_spec("gpt-nano", overrides=["d_model=256"])
    # what was written keeps its value; a stack taken from another spec brings its
    # settings, not the sizes that spec derived from its own width
    llama = load_spec("llama2-7b")
    small = llama.model_copy(update={"d_model": 512, "vocab_size": 1000})
    assert small.decoder.attention.n_kv_heads == 32 and small.decoder.attention.head_dim == 16
    assert small.decoder.ffn.d_ff == 11008  # written in the preset
    assert small == load_spec("llama2-7b", overrides=["d_model=512", "vocab_size=1000"])
    moved = spec.model_copy(update={"decoder": wider.decoder, "d_model": 64})
    assert (moved.decoder.attention.head_dim, moved.decoder.ffn.d_ff) == (16, 256)
    # an encoder-decoder's cross-attention and an override's layers follow the stack again
    t5 = load_spec("t5-nano", overrides=["decoder.overrides=[{layers: [0], attention: {sliding_window: 8}}]"])
    more_heads = t5.decoder.model_copy(update={"attention": {"n_heads": 8}})
    t5_8 = t5.model_copy(update={"decoder": more_heads})
    assert t5_8.decoder.cross_attention.n_heads == 8 and t5_8.decoder.cross_attention.head_dim == 16
    assert t5.decoder.overrides[0].attention.n_heads == 4
    layer0 = t5_8.decoder.overrides[0].attention
    assert (layer0.n_heads, layer0.head_dim, layer0.sliding_window) == (8, 16, 8)
    # a resolved spec writes every size: its copy keeps them
    resolved = load_spec(spec.to_yaml())
    kept = resolved.model_copy(update={"d_model": 256})
    assert (kept.decoder.attention.head_dim, kept.decoder.ffn.d_ff) == (32, 512)


def test_model_copy_merges_a_dict_into_a_sub_spec_as_overrides_do():
    # before, a dict replaced the sub-spec whole: Llama's SwiGLU given update={"ffn": {"d_ff": 1000}}
    # silently became a ReLU MLP with biases, and update={"decoder": {...}} lost n_layers
    llama = load_spec("llama2-7b")
    ffn = llama.decoder.model_copy(update={"ffn": {"d_ff": 1000}}).ffn
    assert (ffn.type, ffn.d_ff, ffn.activation, ffn.bias) == ("glu", 1000, "silu", False)
    spec = load_spec("gpt-nano")
    relu = spec.model_copy(update={"decoder": {"ffn": {"activation": "relu"}}})
    assert relu == load_spec("gpt-nano", overrides=["decoder.ffn.activation=relu"])
    assert relu.decoder.n_layers == 4 and relu.decoder.attention.bias is True
    # a new type replaces the sub-spec, as --set decoder.ffn.type=glu does
    glu = spec.model_copy(update={"decoder": {"ffn": {"type": "glu"}}})
    assert glu == load_spec("gpt-nano", overrides=["decoder.ffn.type=glu"]) and glu.decoder.ffn.activation == "silu"
    longer = spec.model_copy(update={"training": {"max_steps": 10}})
    assert longer.training.max_steps == 10 and longer.training.batch_size == spec.training.batch_size
    # a spec object replaces the field
    plain = spec.model_copy(update={"decoder": spec.decoder.model_copy(update={"ffn": llama.decoder.ffn})})
    assert plain.decoder.ffn.d_ff == 11008 and plain.decoder.ffn.type == "glu"
    with pytest.raises(SpecError, match=r"decoder.ffn.activation: 'reluu' is not allowed"):
        spec.model_copy(update={"decoder": {"ffn": {"activation": "reluu"}}})


def test_model_copy_of_a_sub_spec_explains_errors_as_load_spec_does():
    # before: pydantic's own words, "n_layer: Extra inputs are not permitted" with no allowed
    # fields, and "type: Input should be 'layernorm'" for a norm copied as an rmsnorm
    spec = load_spec("gpt-nano")
    with pytest.raises(SpecError, match=r"n_layer: unknown field 'n_layer'\n\s+did you mean 'n_layers'\? allowed: n_layers,"):
        spec.decoder.model_copy(update={"n_layer": 3})
    with pytest.raises(SpecError, match=r"activation: 'reluu' is not allowed\n\s+did you mean 'relu'\? "
                                        r"allowed: relu, gelu, gelu_tanh, silu"):
        spec.decoder.ffn.model_copy(update={"activation": "reluu"})
    with pytest.raises(SpecError, match=r"n_layers: input should be greater than 0, got 0"):
        spec.decoder.model_copy(update={"n_layers": 0})
    with pytest.raises(SpecError, match=r"optimizer.type: unknown type 'adam'\n\s+did you mean 'adamw'\?"):
        spec.training.model_copy(update={"optimizer": {"type": "adam"}})
    with pytest.raises(SpecError, match=r"type: LayerNormSpec is type 'layernorm'; a copy of it cannot become 'rmsnorm'"
                                        r"\n\s+.*parent.model_copy\(update=\{'norm': \{'type': 'rmsnorm'\}\}\)"):
        spec.decoder.norm.model_copy(update={"type": "rmsnorm"})
    assert spec.decoder.model_copy(update={"norm": {"type": "rmsnorm"}}).norm.type == "rmsnorm"
    assert spec.decoder.norm.model_copy(update={"type": "layernorm", "eps": 1e-6}).eps == 1e-6


def test_load_spec_of_something_that_is_no_spec_is_a_type_error():
    # before: "no preset or file named 'None'", as if None were a name
    from specformer import build_model

    for source in (None, 123, 1.5):
        with pytest.raises(TypeError, match=rf"expected a spec \(a preset name, a YAML path or text, a dict or a "
                                            rf"ModelSpec\), got {type(source).__name__}"):
            load_spec(source)
    with pytest.raises(TypeError, match=r"got NoneType"):
        build_model(None)


def test_load_spec_of_a_spec_with_overrides_derives_the_sizes_again():
    # a notebook's spec object, overridden like a preset: before, its derived sizes were
    # written into the overridden data, so d_model=256 kept head_dim 32 and d_ff 512
    spec = load_spec("gpt-nano")
    wider = load_spec(spec, overrides=["d_model=256"])
    assert (wider.decoder.attention.head_dim, wider.decoder.ffn.d_ff) == (64, 1024)
    assert wider == spec.model_copy(update={"d_model": 256}) == load_spec("gpt-nano", overrides=["d_model=256"])
    assert load_spec(spec) == spec
    t5 = load_spec(load_spec("t5-nano"), overrides={"decoder.attention.n_heads": 8})
    assert t5.decoder.cross_attention.n_heads == 8 and t5.decoder.attention.head_dim == 16
    # a resolved spec writes every size: they are kept, as model_copy keeps them
    resolved = load_spec(spec.to_yaml())
    assert load_spec(resolved, overrides=["d_model=256"]).decoder.attention.head_dim == 32


def test_derived_sizes_follow_the_model_width():
    spec = ModelSpec(name="x", kind="decoder", vocab_size=100, d_model=96, decoder={"n_layers": 1, "ffn": {"type": "glu"}})
    assert spec.decoder.attention.head_dim == 96 // 8
    assert spec.decoder.ffn.d_ff == default_glu_d_ff(96) == 256
    assert default_glu_d_ff(4096) % 64 == 0 and default_glu_d_ff(4096) >= 8 * 4096 / 3
    assert spec.head.type == "lm"
    assert ModelSpec(kind="encoder", vocab_size=10, d_model=8, encoder={"n_layers": 1}).head.type == "mlm"


def test_explicit_head_dim_is_kept():
    spec = load_spec("gpt-nano", overrides=["decoder.attention.head_dim=16"])
    assert spec.decoder.attention.head_dim == 16


def test_encoder_decoder_cross_attention_defaults_to_self_attention_settings():
    spec = load_spec("t5-small", overrides=["decoder.attention.sliding_window=16"])
    cross = spec.decoder.cross_attention
    assert cross is not None and cross.scale == 1.0 and cross.head_dim == 64
    assert cross.sliding_window is None
    assert spec.encoder.cross_attention is None
    # a partial cross_attention changes those settings field by field; the rest still
    # follow the self-attention (not the attention defaults: 8 heads, a bias)
    t5_nano = load_spec("t5-nano")
    partial = load_spec("t5-nano", overrides=["decoder.cross_attention.scale=1.0"]).decoder.cross_attention
    assert partial.scale == 1.0
    assert partial.model_dump(exclude={"scale"}) == t5_nano.decoder.cross_attention.model_dump(exclude={"scale"})
    assert (partial.n_heads, partial.bias) == (t5_nano.decoder.attention.n_heads, t5_nano.decoder.attention.bias)


def test_turning_query_and_key_norms_off_drops_their_inherited_settings():
    # the self-attention's q/k-norm settings are inherited by the cross-attention and by a
    # layer override; one that writes qk_norm: none keeps none of them (and no error about them)
    qk = ["decoder.attention.qk_norm=rmsnorm", "decoder.attention.qk_norm_scope=all",
          "decoder.attention.qk_norm_eps=1e-5", "decoder.attention.qk_norm_offset=1"]
    spec = load_spec("t5-nano", overrides=[*qk, "decoder.cross_attention.qk_norm=none",
                                           "decoder.overrides=[{layers: [0], attention: {qk_norm: none}}]"])
    for att in (spec.decoder.cross_attention, spec.decoder.layer(0).attention):
        assert (att.qk_norm, att.qk_norm_scope, att.qk_norm_eps, att.qk_norm_offset) == ("none", "head", 1e-6, 0.0)
    kept = spec.decoder.layer(1).attention
    assert (kept.qk_norm, kept.qk_norm_scope, kept.qk_norm_eps, kept.qk_norm_offset) == ("rmsnorm", "all", 1e-5, 1.0)
    inherited = load_spec("t5-nano", overrides=qk).decoder.cross_attention
    assert (inherited.qk_norm, inherited.qk_norm_scope, inherited.qk_norm_eps) == ("rmsnorm", "all", 1e-5)
    # written on a stack without q/k norms, a setting is still an error at its field
    with pytest.raises(SpecError, match="qk_norm_scope needs a qk_norm"):
        load_spec("t5-nano", overrides=["decoder.attention.qk_norm_scope=all"])


def test_mapping_without_type_is_the_family_default():
    spec = load_spec("gpt-nano", overrides=["decoder.norm={eps: 1.0e-6}"])
    assert isinstance(spec.decoder.norm, LayerNormSpec) and spec.decoder.norm.eps == 1e-6


def test_deep_merge_semantics():
    base = {"a": {"x": 1, "y": [1, 2]}, "ffn": {"type": "mlp", "activation": "gelu", "bias": True}}
    assert deep_merge(base, {"a": {"y": [3]}}) == {"a": {"x": 1, "y": [3]}, "ffn": base["ffn"]}  # list replaces
    assert deep_merge(base, {"a": {"z": 2}})["a"] == {"x": 1, "y": [1, 2], "z": 2}  # mapping merges
    # a different type replaces the whole mapping: the parent's fields belong to another type
    assert deep_merge(base, {"ffn": {"type": "glu"}})["ffn"] == {"type": "glu"}
    assert deep_merge(base, {"a": None})["a"] is None
    assert base["a"]["y"] == [1, 2]  # inputs untouched


def test_a_mapping_without_type_is_its_default_type_before_the_schema_is_imported(tmp_path):
    # `train` resolves extends and --set before it imports the schema (which registers the
    # families' defaults): the ffn given another type is replaced whole there too, as validate
    # and show replace it, not merged key by key into a glu with the mlp's d_ff and activation
    import subprocess
    import sys

    (tmp_path / "base.yaml").write_text(textwrap.dedent("""\
        kind: decoder
        vocab_size: 50
        d_model: 64
        decoder: {n_layers: 1, ffn: {activation: relu, d_ff: 300}}
    """))
    (tmp_path / "child.yaml").write_text("extends: base.yaml\ndecoder: {ffn: {type: glu}}\n")
    code = ("from specformer.specs.loader import load_spec_data\n"
            f"print(load_spec_data({str(tmp_path / 'child.yaml')!r})[0]['decoder']['ffn'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "{'type': 'glu'}"


def test_a_mapping_without_type_is_its_default_type_when_another_type_is_merged_over_it(tmp_path):
    # `ffn: {activation: gelu}` is an mlp: a glu over it must not inherit the mlp's gelu,
    # exactly as when the mlp is written with `type: mlp` (extends, --set and overrides)
    implicit = {"kind": "decoder", "vocab_size": 50, "d_model": 64,
                "decoder": {"n_layers": 2, "ffn": {"activation": "gelu", "d_ff": 100}, "norm": {"bias": False}}}
    explicit = copy.deepcopy(implicit)
    explicit["decoder"]["ffn"]["type"] = "mlp"
    explicit["decoder"]["norm"]["type"] = "layernorm"
    glu = {"type": "glu", "activation": "silu", "d_ff": 192, "bias": False, "dropout": 0.0}
    for base in (implicit, explicit):
        over = load_spec(base, overrides=["decoder.ffn={type: glu}"]).decoder.ffn
        assert over.model_dump() == glu
        assert load_spec(base, overrides=["decoder.ffn.type=glu"]).decoder.ffn.model_dump() == glu
        layered = copy.deepcopy(base)
        layered["decoder"]["overrides"] = [{"layers": [1], "ffn": {"type": "glu"}, "norm": {"type": "rmsnorm"}}]
        spec = load_spec(layered)
        assert spec.decoder.layer(1).ffn.model_dump() == glu
        assert spec.decoder.layer(1).norm.type == "rmsnorm"  # no layernorm `bias` carried over
        assert spec.decoder.layer(0).ffn.activation == "gelu" and spec.decoder.layer(0).norm.bias is False
        parent = tmp_path / "parent.yaml"
        parent.write_text(yaml.safe_dump(base))
        child = tmp_path / "child.yaml"
        child.write_text("extends: parent.yaml\ndecoder:\n  ffn: {type: glu}\n")
        assert load_spec(child).decoder.ffn.model_dump() == glu
    # an override's norm of another type keeps the stack's placement (a stack-wide setting)
    post = load_spec({"kind": "decoder", "vocab_size": 50, "d_model": 64, "decoder": {
        "n_layers": 2, "norm": {"placement": "post"}, "overrides": [{"layers": [1], "norm": {"type": "rmsnorm"}}]}})
    assert (post.decoder.layer(1).norm.type, post.decoder.layer(1).norm.placement) == ("rmsnorm", "post")
    # without a type on either side the mapping still merges field by field
    assert load_spec(implicit, overrides=["decoder.ffn.d_ff=7"]).decoder.ffn.activation == "gelu"
    assert deep_merge({"ffn": {"activation": "gelu"}}, {"ffn": {"type": "mlp", "d_ff": 8}}) == {
        "ffn": {"activation": "gelu", "type": "mlp", "d_ff": 8}}


def test_another_type_keeps_the_fields_of_the_run_the_types_share(tmp_path):
    # an ablation of the schedule's shape alone: `--set training.schedule.type=linear` on a cosine
    # with a warmup of 50 reset the warmup to 0; the parameters an optimizer freezes and the ffn's
    # dropout were dropped the same way. extends, --set path.type and --set path={type: ...} agree
    parent = tmp_path / "parent.yaml"
    parent.write_text(
        "extends: gpt-nano\n"
        "decoder:\n  ffn: {activation: gelu, dropout: 0.1}\n"
        "training:\n"
        "  optimizer: {type: adamw, lr: 1.0e-3, weight_decay: 0.05, freeze: [embed.*]}\n"
        "  schedule: {type: cosine, warmup_steps: 50, min_lr_ratio: 0.05}\n"
    )
    child = tmp_path / "child.yaml"
    child.write_text("extends: parent.yaml\ndecoder:\n  ffn: {type: glu}\n"
                     "training:\n  optimizer: {type: sgd}\n  schedule: {type: linear}\n")
    sets = ["decoder.ffn.type=glu", "training.optimizer.type=sgd", "training.schedule.type=linear"]
    dicts = ["decoder.ffn={type: glu}", "training.optimizer={type: sgd}", "training.schedule={type: linear}"]
    for spec in (load_spec(child), load_spec(parent, overrides=sets), load_spec(parent, overrides=dicts)):
        t = spec.training
        # kept: what describes the run (warmup, frozen parameters, dropout)
        assert (t.schedule.type, t.schedule.warmup_steps) == ("linear", 50)
        assert (t.optimizer.type, t.optimizer.freeze) == ("sgd", ("embed.*",))
        assert (spec.decoder.ffn.type, spec.decoder.ffn.dropout) == ("glu", 0.1)
        # the new type's own defaults: what is fitted to each type
        assert t.schedule.min_lr_ratio == 0.0 and (t.optimizer.lr, t.optimizer.weight_decay) == (0.1, 0.0)
        assert spec.decoder.ffn.activation == "silu"
    # inverse_sqrt's warmup (4000 in the paper, never 0) is the formula's own: not carried either way
    assert load_spec(parent, overrides=["training.schedule.type=inverse_sqrt"]).training.schedule.warmup_steps == 4000
    back = {"schedule": {"type": "inverse_sqrt", "warmup_steps": 8}}
    assert deep_merge(back, {"schedule": {"type": "constant"}}) == {"schedule": {"type": "constant"}}
    assert deep_merge({"schedule": {"type": "cosine", "warmup_steps": 8}}, {"schedule": {"type": "linear"}}) == {
        "schedule": {"type": "linear", "warmup_steps": 8}}
    # a field kept from the file is the file's: its error points there, whichever form of --set
    from specformer import SpecError

    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: gpt-nano\ntraining:\n  optimizer: {type: adamw, freeze: [embedding.*]}\n")
    for override in ("training.optimizer.type=sgd", "training.optimizer={type: sgd}"):
        with pytest.raises(SpecError, match=r"bad.yaml:3:37: training.optimizer.freeze.0: pattern 'embedding.\*'"):
            load_spec(bad, overrides=[override])
    # unless an earlier --set gave it, as for any field
    given = load_spec(parent, overrides=["training.schedule.warmup_steps=8", "training.schedule.type=inverse_sqrt"])
    assert given.training.schedule.warmup_steps == 8


def test_yaml_text_loads_as_a_file_does_with_lines_in_its_errors(tmp_path, monkeypatch):
    from specformer import SpecError, build_model

    text = "extends: gpt-nano\nname: mine\ndecoder:\n  n_layers: 2\n"
    spec = load_spec(text, overrides=["d_model=64"])
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    assert spec == load_spec(path, overrides=["d_model=64"]) and spec.decoder.attention.head_dim == 16
    assert type(build_model(text, device="meta")).__name__ == "DecoderModel"
    with pytest.raises(SpecError, match=r"<string>:3:3: decoder.n_layer: unknown field 'n_layer'"):
        load_spec("extends: gpt-nano\ndecoder:\n  n_layer: 2\n")
    monkeypatch.chdir(tmp_path)  # extends: a path is relative to the working directory
    assert load_spec("extends: mine.yaml\nname: again\n").decoder.n_layers == 2


def test_extends_by_path_and_chain(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mid.yaml").write_text("extends: gpt2-small\nname: mid\ndecoder: {n_layers: 6}\n")
    (tmp_path / "leaf.yaml").write_text(
        textwrap.dedent(
            """
            extends: sub/mid.yaml
            name: leaf
            positional: {type: rope, base: 500000}
            decoder:
              attention: {n_kv_heads: 4}
              ffn: {type: glu, activation: silu, d_ff: 2048}
              norm: {type: rmsnorm}
            """
        )
    )
    spec = load_spec(tmp_path / "leaf.yaml")
    assert spec.name == "leaf" and spec.decoder.n_layers == 6
    assert spec.decoder.attention.n_heads == 12 and spec.decoder.attention.n_kv_heads == 4
    assert spec.decoder.attention.bias is True  # merged from gpt2-small
    assert isinstance(spec.decoder.ffn, GLUSpec) and spec.decoder.ffn.bias is False  # type changed: GLU defaults
    assert isinstance(spec.decoder.norm, RMSNormSpec) and spec.decoder.norm.placement == "pre"
    assert spec.positional.base == 500000


def test_a_file_that_names_itself_nothing_is_named_after_the_file(tmp_path):
    (tmp_path / "mid.yaml").write_text("extends: gpt-nano\nname: mid\ndecoder: {n_layers: 3}\n")
    (tmp_path / "rope.yaml").write_text("extends: mid.yaml\npositional: {type: rope}\n")
    (tmp_path / "tiny.yaml").write_text("kind: decoder\nvocab_size: 64\nd_model: 32\ndecoder: {n_layers: 1}\n")
    # not the parent's name, whose runs folder it would share, nor "unnamed"
    assert load_spec(tmp_path / "rope.yaml").name == "rope"
    assert load_spec(str(tmp_path / "tiny.yaml")).name == "tiny"
    assert load_spec(tmp_path / "mid.yaml").name == "mid"  # a name it writes is kept
    assert load_spec(tmp_path / "rope.yaml", overrides=["name=rope-base"]).name == "rope-base"
    assert load_spec("gpt-nano").name == "gpt-nano"
    # a dict has no file to be named after: it keeps the name it extends
    assert load_spec({"extends": str(tmp_path / "mid.yaml")}).name == "mid"
    # the resolved spec (a run's spec.yaml) writes the name, so it is read back unchanged
    again = tmp_path / "spec.yaml"
    again.write_text(load_spec(tmp_path / "rope.yaml").to_yaml())
    assert load_spec(again).name == "rope"


def test_overrides_are_typed_like_yaml():
    spec = load_spec(
        "gpt2-small",
        overrides=["decoder.n_layers=4", "positional.type=rope", "embedding.tie_output=false", "decoder.attention={n_kv_heads: 3}"],
    )
    assert spec.decoder.n_layers == 4 and spec.positional.type == "rope"
    assert spec.embedding.tie_output is False
    assert spec.decoder.attention.n_kv_heads == 3 and spec.decoder.attention.n_heads == 12


def test_setting_another_type_drops_the_old_types_fields():
    # cosine's min_lr_ratio does not belong to inverse_sqrt: --set ...type= works as extends does
    spec = load_spec("gpt-nano", overrides=["training.schedule.type=inverse_sqrt"])
    assert spec.training.schedule.type == "inverse_sqrt"
    same = load_spec("gpt-nano", overrides=["training.schedule.type=cosine"])
    assert same.training.schedule == load_spec("gpt-nano").training.schedule  # same type: fields kept
    assert apply_overrides({"n": {"type": "a", "x": 1}}, ["n.type=b"]) == {"n": {"type": "b"}}


@pytest.mark.parametrize(
    "overrides",
    [
        ["positional.fraction=0.5", "positional.type=rope"],
        ["positional.type=rope", "positional.fraction=0.5"],
        ["positional.fraction=0.5", "positional={type: rope}"],
        ["positional={fraction: 0.5}", "positional.type=rope"],
    ],
)
def test_a_type_set_after_its_fields_keeps_them(overrides):
    # partial rotary whichever --set comes first; the preset's own fields (learned's offset) go
    spec = load_spec("gpt-nano", overrides=overrides)
    assert spec.positional.type == "rope" and spec.positional.fraction == 0.5
    ffn = load_spec("gpt-nano", overrides=["decoder.ffn.d_ff=100", "decoder.ffn.type=glu"]).decoder.ffn
    assert (ffn.type, ffn.d_ff, ffn.activation) == ("glu", 100, "silu")
    assert apply_overrides({"n": {"type": "a", "x": 1}}, ["n.y=2", "n.type=b"]) == {"n": {"type": "b", "y": 2}}


def test_a_field_set_for_the_old_type_is_named_when_the_type_changes():
    # contradictory --sets are an error at the first one, never a field silently dropped
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["training.schedule.min_lr_ratio=0.2", "training.schedule.type=inverse_sqrt"])
    (problem,) = info.value.problems
    assert problem.path == "training.schedule.min_lr_ratio"
    assert str(problem.position) == "--set training.schedule.min_lr_ratio=0.2"


def test_override_forms():
    data = {"a": {"b": 1}, "l": [{"x": 1}]}
    assert apply_overrides(data, ["a.c=[1, 2]"]) == {"a": {"b": 1, "c": [1, 2]}, "l": [{"x": 1}]}
    assert apply_overrides(data, [("a.b", 5)])["a"]["b"] == 5
    assert apply_overrides(data, {"l.0.x": 9})["l"][0]["x"] == 9
    assert apply_overrides(data, ["new.deep.key=true"])["new"] == {"deep": {"key": True}}
    assert apply_overrides(data, ["new.deep.key=yes"])["new"] == {"deep": {"key": "yes"}}  # YAML 1.2
    assert apply_overrides(data, ["a.b="])["a"]["b"] is None
    # one override as a plain string is that override, not its characters
    from specformer import load_spec

    assert load_spec("gpt-nano", overrides="decoder.n_layers=2").decoder.n_layers == 2


def test_a_classifier_has_at_least_two_classes():
    # with one class, softmax cross-entropy is always 0: nothing would train
    from specformer import SpecError, load_spec

    with pytest.raises(SpecError, match="head.n_classes"):
        load_spec({**load_spec("bert-nano").to_dict(), "head": {"type": "classification", "n_classes": 1}})


def test_per_layer_overrides_resolve_per_layer():
    spec = load_spec(
        "gpt-nano",
        overrides=[
            "decoder.overrides=[{layers: '0-1', attention: {sliding_window: 16}}, {layers: [3], ffn: {type: glu}}]"
        ],
    )
    layers = list(spec.decoder.layers())
    assert [layer.attention.sliding_window for layer in layers] == [16, 16, None, None]
    assert all(layer.attention.n_heads == 4 and layer.attention.bias for layer in layers)
    assert [layer.ffn.type for layer in layers] == ["mlp", "mlp", "mlp", "glu"]
    assert layers[3].ffn.d_ff == default_glu_d_ff(128)


def test_an_override_of_no_layer_is_refused():
    from specformer import SpecError

    with pytest.raises(SpecError, match=r"decoder.overrides.0.layers: give at least one layer index"):
        load_spec("gpt-nano", overrides=["decoder.overrides=[{layers: [], ffn: {activation: relu}}]"])


def test_override_changing_heads_rederives_head_dim():
    spec = load_spec("gpt-nano", overrides=["decoder.overrides=[{layers: 0, attention: {n_heads: 8}}]"])
    assert spec.decoder.layer(0).attention.head_dim == 16 and spec.decoder.layer(0).attention.n_kv_heads == 8
    assert spec.decoder.layer(1).attention.head_dim == 32


def test_override_norm_cannot_change_placement():
    with pytest.raises(Exception, match="apply to the whole stack"):
        load_spec("gpt-nano", overrides=["decoder.overrides=[{layers: 0, norm: {placement: post}}]"])


def test_learned_table_may_be_longer_than_max_seq_len():
    spec = load_spec("gpt-nano", overrides=["positional.max_positions=300"])
    assert spec.positional.max_positions == 300


def test_gqa_and_mqa_are_valid():
    assert load_spec("gpt-nano", overrides=["decoder.attention.n_kv_heads=1"]).decoder.attention.n_kv_heads == 1
    assert load_spec("gpt-nano", overrides=["decoder.attention.n_kv_heads=2"]).decoder.attention.n_kv_heads == 2


def test_python_objects_equal_yaml():
    from_yaml = load_spec("gpt2-small")
    from_python = ModelSpec.model_validate(from_yaml.to_dict())
    assert from_python == from_yaml
    assert load_spec(from_yaml.to_dict()) == from_yaml


def test_schema_module_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from typer.testing import CliRunner; from specformer.cli import app; "
        "r = CliRunner().invoke(app, ['validate', 'gpt2-small', '-q']); assert r.exit_code == 0, r.output; "
        "r = CliRunner().invoke(app, ['schema']); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_family_type_is_in_the_schema():
    from specformer.specs.jsonschema import spec_json_schema

    text = str(spec_json_schema())
    for family in ("positional", "attention", "ffn", "norm", "head"):
        for name in REGISTRY.names(family):
            assert f"'const': '{name}'" in text, (family, name)


def test_top_level_names_resolve():
    import specformer

    for name in specformer.__all__:
        assert getattr(specformer, name) is not None, name


def test_load_spec_is_annotated_to_return_a_model_spec() -> None:
    # editors and type checkers complete `spec.decoder.attention...` from it
    import typing

    from specformer import load_spec
    from specformer.specs.schema import ModelSpec

    hints = typing.get_type_hints(load_spec, localns={"ModelSpec": ModelSpec})
    assert hints["return"] is ModelSpec


def test_a_mapping_given_another_type_keeps_the_fields_of_its_whole_family(tmp_path):
    # a post-norm BERT with RMSNorm stays post-norm; a GPT's attention of another type keeps
    # its heads: placement and the attention sizes are the family's, not the old type's
    child = tmp_path / "child.yaml"
    child.write_text("extends: bert-nano\nencoder:\n  norm: {type: rmsnorm}\n")
    for spec in (
        load_spec("bert-nano", overrides=["encoder.norm.type=rmsnorm"]),
        load_spec("bert-nano", overrides=["encoder.norm={type: rmsnorm}"]),
        load_spec(child),
    ):
        assert (spec.encoder.norm.type, spec.encoder.norm.placement, spec.encoder.norm.final) == ("rmsnorm", "post", False)
        assert spec.encoder.norm.eps == 1e-5  # the layernorm's own eps is not carried over
    gqa = {"kind": "decoder", "vocab_size": 50, "d_model": 64, "decoder": {
        "n_layers": 1, "attention": {"type": "mha", "n_heads": 8, "n_kv_heads": 2, "sliding_window": 16,
                                     "bias": True}}}
    over = deep_merge(gqa["decoder"], {"attention": {"type": "other"}})["attention"]
    assert over == {"type": "other", "n_heads": 8, "n_kv_heads": 2, "sliding_window": 16}
    # what the new mapping says wins
    assert deep_merge(gqa["decoder"], {"attention": {"type": "other", "n_heads": 4}})["attention"]["n_heads"] == 4
    # an optimizer of another type takes its own learning rate: SGD's 0.1 is not AdamW's 3e-4
    assert load_spec("gpt-nano", overrides=["training.optimizer.type=sgd"]).training.optimizer.lr == 0.1
    # a positional scheme has no such fields: another type is the new mapping alone
    assert deep_merge({"positional": {"type": "rope", "base": 5e5}}, {"positional": {"type": "alibi"}}) == {
        "positional": {"type": "alibi"}}


def test_a_bare_preset_name_is_the_preset_beside_a_file_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt-nano").write_text("extends: gpt-nano\nd_model: 64\n")
    (tmp_path / "child.yaml").write_text("extends: gpt-nano\n")
    assert load_spec("gpt-nano").d_model == load_spec("child.yaml").d_model == 128  # as extends reads it
    assert load_spec("./gpt-nano").d_model == 64


def test_a_spec_shows_as_its_yaml_and_keeps_pydantics_repr() -> None:
    spec = load_spec("gpt-nano")
    assert str(spec) + "\n" == spec.to_yaml() and load_spec(yaml.safe_load(str(spec))) == spec  # print(spec)
    assert repr(spec).startswith("ModelSpec(name='gpt-nano', kind='decoder', vocab_size=512, ")  # one line, pydantic's
    assert "\n" not in repr(spec)

    class Printer:  # what IPython's pretty printer hands _repr_pretty_
        def __init__(self) -> None:
            self.out = ""

        def text(self, text: str) -> None:
            self.out += text

    shown = Printer()
    spec._repr_pretty_(shown, False)
    assert shown.out.startswith("# ModelSpec\nname: gpt-nano\nkind: decoder\n")
    assert load_spec(yaml.safe_load(shown.out)) == spec
    part = Printer()
    spec.decoder.attention._repr_pretty_(part, False)
    assert part.out.splitlines()[:4] == ["# AttentionSpec", "type: mha", "n_heads: 4", "n_kv_heads: 4"]
    # print(spec.decoder): a part prints as its YAML too, which is the part's own fields
    assert str(spec.decoder.attention).splitlines()[:3] == ["type: mha", "n_heads: 4", "n_kv_heads: 4"]
    # print() ends the line: no blank line after the YAML
    assert not str(spec.decoder.attention).endswith("\n") and str(spec) == spec.to_yaml().rstrip("\n")
    assert yaml.safe_load(str(spec.decoder)) == spec.decoder.model_dump(mode="json")
    assert spec.model_copy(update={"decoder": yaml.safe_load(str(spec.decoder))}) == spec
    assert repr(spec.decoder).startswith("StackSpec(n_layers=4, ") and "\n" not in repr(spec.decoder)


def test_an_empty_spec_name_says_so_not_that_the_current_folder_is_one(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for source in ("", "  ", "\n"):
        with pytest.raises(SpecError, match=r"the spec's name is empty \(.*\): give a preset name, a YAML file or YAML "
                                            r"text\n    presets: bart-base, bert-base,") as info:
            load_spec(source)
        assert "is a directory" not in str(info.value)
    (tmp_path / "child.yaml").write_text("extends: ''\nname: child\n")
    with pytest.raises(SpecError, match=r"child\.yaml:1:1: extends: the spec's name is empty \(''\)"):
        load_spec(tmp_path / "child.yaml")
