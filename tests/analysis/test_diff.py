"""Spec diff: every resolved field, derived values, consequences, checkpoint compatibility."""

from __future__ import annotations

from pathlib import Path

import pytest

from specformer import load_spec, preset_names
from specformer.analysis import ABSENT, count_parameters, diff_specs
from specformer.specs.loader import preset_path


@pytest.mark.parametrize("name", preset_names())
def test_diff_with_itself_is_empty(name: str) -> None:
    d = diff_specs(name, load_spec(name))
    assert d.identical and d.changes == []
    assert all(c.compatible for c in d.compatibility)


@pytest.mark.parametrize(("a", "b"), [("gpt2-small", "llama2-7b"), ("bert-base", "t5-small"), ("t5-nano", "gpt-nano")])
def test_diff_is_symmetric(a: str, b: str) -> None:
    ab = diff_specs(a, b, reports=False, checkpoints=False)
    ba = diff_specs(b, a, reports=False, checkpoints=False)
    assert {c.path: (c.left, c.right) for c in ab.changes} == {c.path: (c.right, c.left) for c in ba.changes}


def test_changed_fields_with_derived_values() -> None:
    left = load_spec("gpt2-small")
    right = load_spec("gpt2-small", overrides=["decoder.attention.n_heads=6", "decoder.attention.n_kv_heads=2",
                                               "decoder.attention.head_dim=null"])
    d = diff_specs(left, right)
    changes = {c.path: c for c in d.changes}
    assert set(changes) == {
        "decoder.attention.n_heads",
        "decoder.attention.n_kv_heads",
        "decoder.attention.head_dim",
        "decoder.attention.kv_groups",
    }
    assert (changes["decoder.attention.head_dim"].left, changes["decoder.attention.head_dim"].right) == (64, 128)
    assert changes["decoder.attention.kv_groups"].derived
    assert (changes["decoder.attention.kv_groups"].left, changes["decoder.attention.kv_groups"].right) == (1, 3)


def test_type_change_reports_absent_fields() -> None:
    d = diff_specs("gpt2-small", load_spec("gpt2-small", overrides=["positional={type: rope}"]), checkpoints=False)
    changes = {c.path: c for c in d.changes}
    assert (changes["positional.type"].left, changes["positional.type"].right) == ("learned", "rope")
    assert changes["positional.offset"].right is ABSENT and changes["positional.offset"].left == 0
    assert changes["positional.base"].left is ABSENT
    as_json = changes["positional.base"].to_dict()
    assert as_json["present"] == [False, True] and as_json["left"] is None


def test_nothing_is_ignored() -> None:
    # dropout, eps and init change no shape and no count, and still show up
    right = load_spec("gpt2-small", overrides=["decoder.norm.eps=1e-6", "init.std=0.01", "embedding.dropout=0.0"])
    d = diff_specs("gpt2-small", right)
    assert {c.path for c in d.changes} == {"decoder.norm.eps", "init.std", "embedding.dropout"}
    assert all(c.compatible for c in d.compatibility)
    left_report, right_report = d.reports
    assert left_report.params.total == right_report.params.total


def test_preset_change_reaches_a_variant_that_extends_it(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    variant = tmp_path / "variant.yaml"
    base.write_text(preset_path("gpt-nano").read_text())  # the preset as written
    variant.write_text("extends: base.yaml\nname: variant\ndecoder:\n  attention: {n_kv_heads: 2}\n")
    before = {c.path for c in diff_specs("gpt-nano", variant, checkpoints=False).changes}
    assert "d_model" not in before and "decoder.attention.n_kv_heads" in before
    base.write_text(base.read_text().replace("d_model: 128", "d_model: 256"))
    after = {c.path: c for c in diff_specs("gpt-nano", variant, checkpoints=False).changes}
    assert (after["d_model"].left, after["d_model"].right) == (128, 256)
    assert (after["decoder.attention.head_dim"].left, after["decoder.attention.head_dim"].right) == (32, 64)


def test_consequences_and_checkpoints_for_gqa() -> None:
    right = load_spec("llama2-7b", overrides=["decoder.attention.n_kv_heads=8"])
    d = diff_specs("llama2-7b", right, seq_len=2048)
    left_r, right_r = d.reports
    assert left_r.params.total - right_r.params.total == 32 * 2 * 24 * 128 * 4096
    assert right_r.kv_cache_bytes_per_token * 4 == left_r.kv_cache_bytes_per_token
    assert left_r.flops.seq_len == right_r.flops.seq_len == 2048
    forward, back = d.compatibility
    assert not forward.compatible and not back.compatible
    assert not forward.missing and not forward.unexpected
    assert [k for k, _, _ in forward.mismatched] == [f"decoder.layers.{i}.self_attn.qkv_proj.weight" for i in range(32)]
    assert forward.mismatched[0][1:] == ((12288, 4096), (6144, 4096))


def test_checkpoint_keys_missing_and_unexpected() -> None:
    d = diff_specs("gpt-nano", load_spec("gpt-nano", overrides=["embedding.tie_output=false"]))
    tied_into_untied, untied_into_tied = d.compatibility
    assert tied_into_untied.missing == ["head.proj.weight"] and not tied_into_untied.unexpected
    assert untied_into_tied.unexpected == ["head.proj.weight"] and not untied_into_tied.missing


def test_n_way_diff() -> None:
    d = diff_specs("gpt2-small", "gpt2-medium", "gpt2-large")
    n_layers = next(c for c in d.changes if c.path == "decoder.n_layers")
    assert n_layers.values == (12, 24, 36)
    assert [r.params.total for r in d.reports] == [
        count_parameters(load_spec(n)).total for n in ("gpt2-small", "gpt2-medium", "gpt2-large")
    ]
    assert len(d.compatibility) == 4
    with pytest.raises(ValueError, match="at least two"):
        diff_specs("gpt2-small")


def test_diff_meta_method_agrees_with_analytic() -> None:
    pytest.importorskip("torch")
    right = load_spec("t5-nano", overrides=["embedding.share_encoder_decoder=false", "decoder.n_layers=3"])
    analytic = diff_specs("t5-nano", right, reports=False).compatibility
    meta = diff_specs("t5-nano", right, reports=False, checkpoint_method="meta").compatibility
    assert [m.method for m in meta] == ["meta build", "meta build"]
    for a, m in zip(analytic, meta, strict=True):
        assert (a.missing, a.unexpected, a.mismatched) == (m.missing, m.unexpected, m.mismatched)


def test_overrides_are_compared_by_their_effect_on_layers() -> None:
    local = load_spec({"extends": "gpt-nano", "decoder": {"overrides": [
        {"layers": "0-2", "attention": {"sliding_window": 32}}]}})
    d = diff_specs("gpt-nano", local, reports=False, checkpoints=False)
    assert [(c.path, c.left, c.right) for c in d.changes] == [
        ("decoder.layers.0-2.attention.sliding_window", None, 32)
    ]
    # an override that repeats the stack's own setting changes nothing
    same = load_spec({"extends": "gpt-nano", "decoder": {"overrides": [{"layers": [1], "ffn": {"d_ff": 512}}]}})
    assert diff_specs("gpt-nano", same, reports=False, checkpoints=False).identical
    # every layer overridden vs the stack's own setting: the layers agree, the stack field differs
    everywhere = load_spec({"extends": "gpt-nano", "decoder": {"overrides": [
        {"layers": "0-3", "attention": {"sliding_window": 32}}]}})
    stack_level = load_spec("gpt-nano", overrides=["decoder.attention.sliding_window=32"])
    changes = diff_specs(everywhere, stack_level, reports=False, checkpoints=False).changes
    assert [(c.path, c.left, c.right, c.kept) for c in changes] == [
        ("decoder.attention.sliding_window", None, 32, False),
        ("decoder.layers.0-3.attention.sliding_window", 32, 32, True),
    ]


def test_a_layer_an_override_keeps_is_listed_under_its_stacks_change() -> None:
    # the stack's d_ff changes, but an override keeps layer 2 (and only it) at the old size
    wider = load_spec({"extends": "gpt-nano", "decoder": {
        "ffn": {"d_ff": 1024}, "overrides": [{"layers": [2], "ffn": {"d_ff": 512}}]}})
    d = diff_specs("gpt-nano", wider, reports=False, checkpoints=False)
    assert [(c.path, c.values, c.kept) for c in d.changes] == [
        ("decoder.ffn.d_ff", (512, 1024), False),
        ("decoder.layers.2.ffn.d_ff", (512, 512), True),
    ]
    assert d.to_dict()["changes"][1]["kept"] is True
    # both sides keep layer 2 at 256 while the stack changes: still kept
    a = load_spec({"extends": "gpt-nano", "decoder": {"overrides": [{"layers": [2], "ffn": {"d_ff": 256}}]}})
    b = load_spec({"extends": "gpt-nano", "decoder": {
        "ffn": {"d_ff": 1024}, "overrides": [{"layers": [2], "ffn": {"d_ff": 256}}]}})
    changes = diff_specs(a, b, reports=False, checkpoints=False).changes
    assert [(c.path, c.values, c.kept) for c in changes] == [
        ("decoder.ffn.d_ff", (512, 1024), False),
        ("decoder.layers.2.ffn.d_ff", (256, 256), True),
    ]
    # an override on another field is not listed when the stack's d_ff changes
    other = load_spec({"extends": "gpt-nano", "decoder": {
        "ffn": {"d_ff": 1024}, "overrides": [{"layers": [2], "attention": {"sliding_window": 8}}]}})
    changes = diff_specs("gpt-nano", other, reports=False, checkpoints=False).changes
    assert [(c.path, c.kept) for c in changes] == [
        ("decoder.ffn.d_ff", False), ("decoder.layers.2.attention.sliding_window", False)]


def test_a_layer_d_ff_that_its_new_ffn_type_derives_is_marked_derived() -> None:
    # gpt-nano: d_model 128, mlp d_ff 512; a glu on layer 3 derives 8/3 · 128 → 384
    glu = load_spec({"extends": "gpt-nano", "decoder": {"overrides": [{"layers": [3], "ffn": {"type": "glu"}}]}})
    changes = {c.path: c for c in diff_specs("gpt-nano", glu, reports=False, checkpoints=False).changes}
    assert changes["decoder.layers.3.ffn.d_ff"].values == (512, 384)
    assert changes["decoder.layers.3.ffn.d_ff"].derived
    # as the same change to the whole stack is
    stack = load_spec("gpt-nano", overrides=["decoder.ffn={type: glu}"])
    changes = {c.path: c for c in diff_specs("gpt-nano", stack, reports=False, checkpoints=False).changes}
    assert changes["decoder.ffn.d_ff"].values == (512, 384) and changes["decoder.ffn.d_ff"].derived
    # a size an override writes is not derived, even with a new type
    sized = load_spec({"extends": "gpt-nano", "decoder": {"overrides": [
        {"layers": [3], "ffn": {"type": "glu", "d_ff": 512}}]}})
    changes = {c.path: c for c in diff_specs(glu, sized, reports=False, checkpoints=False).changes}
    assert changes["decoder.layers.3.ffn.d_ff"].values == (384, 512)
    assert not changes["decoder.layers.3.ffn.d_ff"].derived


def test_a_section_null_in_one_spec_is_shown_by_its_fields_not_as_a_null_row() -> None:
    # gpt-nano has no encoder (null); t5-nano has one: each encoder field is absent on the
    # left, and no `encoder: null | absent` row claims t5-nano has no encoder
    d = diff_specs("gpt-nano", "t5-nano", reports=False, checkpoints=False)
    paths = {c.path: c for c in d.changes}
    assert "encoder" not in paths and "decoder.cross_attention" not in paths
    assert paths["encoder.n_layers"].values == (ABSENT, 2)
    assert paths["decoder.cross_attention.n_heads"].values == (ABSENT, 4)
    # a field that is null in the only spec that has its section is still a row
    assert paths["encoder.cross_attention"].values == (ABSENT, None)


def test_a_size_the_spec_writes_is_not_marked_derived_even_where_it_equals_the_derivation() -> None:
    # d_ff: 512 written at d_model 128 is 4·d_model, but it stays 512 when d_model changes:
    # the spec's own value, not one that follows from d_model
    written = load_spec({"extends": "gpt-nano", "decoder": {"ffn": {"d_ff": 512}, "attention": {"head_dim": 32},
                                                            "norm": {"final": True}}})
    wide = load_spec("gpt-nano", overrides=["d_model=256"])
    changes = {c.path: c for c in diff_specs(written, wide, reports=False, checkpoints=False).changes}
    assert changes["decoder.ffn.d_ff"].values == (512, 1024) and not changes["decoder.ffn.d_ff"].derived
    assert not changes["decoder.attention.head_dim"].derived
    # where neither writes it, it follows from d_model in both
    changes = {c.path: c for c in diff_specs("gpt-nano", wide, reports=False, checkpoints=False).changes}
    assert changes["decoder.ffn.d_ff"].derived and changes["decoder.attention.head_dim"].derived
    post = load_spec("gpt-nano", overrides=["decoder.norm.placement=post"])
    assert {c.path: c.derived for c in diff_specs(written, post, reports=False, checkpoints=False).changes}[
        "decoder.norm.final"] is False
    assert {c.path: c.derived for c in diff_specs("gpt-nano", post, reports=False, checkpoints=False).changes}[
        "decoder.norm.final"] is True
    # a layer's: an override that writes the size the new type derives, and a stack's written size it keeps
    glu = load_spec({"extends": "gpt-nano", "decoder": {"overrides": [{"layers": [3], "ffn": {"type": "glu"}}]}})
    sized = load_spec({"extends": "gpt-nano", "decoder": {"overrides": [
        {"layers": [3], "ffn": {"type": "glu", "d_ff": 384}}]}})
    assert {c.path: c.derived for c in diff_specs("gpt-nano", glu, reports=False, checkpoints=False).changes}[
        "decoder.layers.3.ffn.d_ff"] is True
    assert {c.path: c.derived for c in diff_specs("gpt-nano", sized, reports=False, checkpoints=False).changes}[
        "decoder.layers.3.ffn.d_ff"] is False
    kept = load_spec({"extends": "gpt-nano", "d_model": 256, "decoder": {
        "ffn": {"d_ff": 1024}, "overrides": [{"layers": [0], "attention": {"sliding_window": 8}}]}})
    changes = {c.path: c for c in diff_specs("gpt-nano", kept, reports=False, checkpoints=False).changes}
    assert not changes["decoder.ffn.d_ff"].derived


def test_sizes_of_a_section_the_spec_leaves_out_are_derived() -> None:
    # no attention: or ffn: written, and a decoder's cross-attention copied from its
    # self-attention: every size in them follows from the fields the spec writes
    minimal = {"name": "m", "kind": "decoder", "vocab_size": 1000, "d_model": 256, "decoder": {"n_layers": 2}}
    changes = {c.path: c for c in diff_specs(minimal, {**minimal, "d_model": 512},
                                             reports=False, checkpoints=False).changes}
    assert changes["decoder.attention.head_dim"].derived and changes["decoder.ffn.d_ff"].derived
    fewer = load_spec("t5-nano", overrides=["decoder.attention.n_heads=2"])
    changes = {c.path: c for c in diff_specs("t5-nano", fewer, reports=False, checkpoints=False).changes}
    assert changes["decoder.cross_attention.n_heads"].values == (4, 2)
    assert changes["decoder.cross_attention.head_dim"].derived
    assert changes["decoder.cross_attention.n_kv_heads"].derived


def test_out_bias_and_training_seq_len_follow_what_they_default_to() -> None:
    # out_bias defaults to the attention's bias, training.seq_len to max_seq_len: unwritten,
    # they are marked derived; written, they are the spec's own even where they are equal
    minimal = {"name": "m", "kind": "decoder", "vocab_size": 1000, "d_model": 64, "max_seq_len": 128,
               "decoder": {"n_layers": 2, "attention": {"n_heads": 4}}}
    other = {**minimal, "max_seq_len": 256, "decoder": {"n_layers": 2, "attention": {"n_heads": 4, "bias": False},
                                                          "overrides": [{"layers": [1], "attention": {"bias": True}}]}}
    changes = {c.path: c for c in diff_specs(minimal, other, reports=False, checkpoints=False).changes}
    assert changes["training.seq_len"].values == (128, 256) and changes["training.seq_len"].derived
    assert changes["decoder.attention.out_bias"].values == (True, False)
    assert changes["decoder.attention.out_bias"].derived and not changes["decoder.attention.bias"].derived
    kept = changes["decoder.layers.1.attention.out_bias"]  # layer 1 keeps true, as its bias does
    assert kept.kept and kept.values == (True, True) and kept.derived
    written = {**other, "training": {"seq_len": 256},
               "decoder": {"n_layers": 2, "attention": {"n_heads": 4, "bias": False, "out_bias": False}}}
    changes = {c.path: c for c in diff_specs(minimal, written, reports=False, checkpoints=False).changes}
    assert not changes["training.seq_len"].derived and not changes["decoder.attention.out_bias"].derived
    layered = {**minimal, "decoder": {"n_layers": 2, "attention": {"n_heads": 4},
                                      "overrides": [{"layers": [0], "attention": {"bias": False}}]}}
    changes = {c.path: c for c in diff_specs(minimal, layered, reports=False, checkpoints=False).changes}
    assert changes["decoder.layers.0.attention.out_bias"].derived
    assert not changes["decoder.layers.0.attention.bias"].derived


def test_diff_specs_arguments_are_checked_as_a_notebook_passes_them() -> None:
    with pytest.raises(TypeError, match=r"diff_specs takes the specs as arguments: diff_specs\(\*specs\), not one list"):
        diff_specs(["gpt-nano", "llama-nano"])
    with pytest.raises(TypeError, match=r"labels are one name per spec, in a list: labels=\[...\], not the string .ab."):
        diff_specs("gpt-nano", "llama-nano", labels="ab")
    with pytest.raises(ValueError, match="3 labels for 2 specs"):
        diff_specs("gpt-nano", "llama-nano", labels=["a", "b", "c"])
    # a label given twice is numbered, as a repeated name is: each column and checkpoint line is one spec's
    d = diff_specs("gpt-nano", "llama-nano", labels=["a", "a"], reports=False)
    assert d.names == ["a", "a #2"] and d.compatibility[0].target == "a #2"
