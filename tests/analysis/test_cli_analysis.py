"""``specformer show`` and ``specformer diff`` as a user runs them, in every format."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specformer import load_spec
from specformer.analysis import count_parameters, flops_per_token, kv_cache_bytes_per_token
from specformer.cli import app

runner = CliRunner()

LLAMA_70B_YAML = """\
extends: llama2-7b
name: llama2-70b
d_model: 8192
decoder:
  n_layers: 80
  attention: {n_heads: 64, n_kv_heads: 8}
  ffn: {d_ff: 28672}
"""


def _ok(args: list[str]):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result


def test_show_rich_tables() -> None:
    out = _ok(["show", "gpt2-small"]).stdout
    assert "124,439,808" in out and "85,056,000" in out
    for title in ("architecture", "parameters", "FLOPs per token", "memory", "KV cache per token"):
        assert title in out
    assert "layernorm (pre)" in out and "learned (1024 rows)" in out


def test_show_names_the_cross_attention_heads_where_they_differ() -> None:
    def decoder_extras(*sets: str) -> str:
        args = ["show", "t5-small", "--format", "json"] + [a for s in sets for a in ("--set", s)]
        rows = json.loads(_ok(args).stdout)["architecture"]
        return next(r["extras"] for r in rows if r["stack"] == "decoder")

    assert decoder_extras() == "cross-attn"  # T5's are its self-attention's
    # multi-query cross-attention, the self-attention unchanged: the table says so
    assert decoder_extras("decoder.cross_attention.n_kv_heads=1") == "cross-attn 8/1"
    assert decoder_extras("decoder.cross_attention.head_dim=32") == "cross-attn head_dim 32"


def test_show_json_has_stable_keys() -> None:
    data = json.loads(_ok(["show", "llama2-7b", "--format", "json", "--seq-len", "2048", "--batch", "2"]).stdout)
    spec = load_spec("llama2-7b")
    assert data["params"]["total"] == 6_738_415_616
    assert data["params"]["non_embedding"] == count_parameters(spec).non_embedding
    assert data["flops_per_token"]["forward"] == flops_per_token(spec, 2048).forward
    assert data["flops_per_token"]["training"] == 3 * data["flops_per_token"]["forward"]
    assert data["kv_cache_bytes_per_token"] == kv_cache_bytes_per_token(spec, "bf16") == 524_288
    assert data["kv_cache_bytes"] == 524_288 * 2048 * 2  # 2 GiB: no window caps it
    assert data["memory"]["batch"] == 2 and data["memory"]["seq_len"] == 2048
    assert data["memory"]["total"] == sum(
        data["memory"][k] for k in ("weights", "gradients", "optimizer", "weight_casts", "activations")
    )


def test_show_says_a_masked_lm_head_trains_on_its_labelled_tokens() -> None:
    out = _ok(["show", "bert-base", "--seq-len", "512", "-f", "markdown"]).stdout
    assert "| training step (3× forward, head on 15% of tokens) | 587.9 MFLOP | 587,858,688 |" in out
    assert "the masked-LM head on its labelled tokens only" in out


def test_show_markdown() -> None:
    out = _ok(["show", "t5-small", "--format", "markdown", "--dtype", "fp32"]).stdout
    assert out.startswith("### t5-small")
    assert "| component | per layer | layers | total | share |" in out
    assert "| decoder cross-attention |" in out
    assert "fp32" in out


def test_show_says_which_options_show_the_training_step_of_the_spec() -> None:
    out = _ok(["show", "gpt-nano", "--format", "markdown"]).stdout
    note = "`--batch 16 --seq-len 256 --dtype 32` shows its step"
    assert "batch 1 × seq_len 256, bf16-mixed" in out and note in out
    # those options show the step `specformer train gpt-nano` takes, and the note is gone
    step = _ok(["show", "gpt-nano", "--format", "markdown", "--batch", "16", "--seq-len", "256", "--dtype", "32"]).stdout
    assert "batch 16 × seq_len 256, fp32" in step and "shows its step" not in step
    same = ["--set", "training.batch_size=1", "--set", "training.precision=bf16-mixed"]
    assert "shows its step" not in _ok(["show", "gpt-nano", *same]).stdout
    # float64 training (training.precision 64) is estimated too: at twice float32's bytes
    doubled = ["--set", "training.precision=64"]
    assert "`--batch 16 --seq-len 256 --dtype 64` shows its step" in _ok(["show", "gpt-nano", *doubled]).stdout
    fp32, fp64 = (json.loads(_ok(["show", "gpt-nano", "--dtype", d, "-f", "json"]).stdout)["memory"] for d in ("32", "64"))
    assert fp64["dtype"] == "fp64" and fp64["weights"] == 2 * fp32["weights"]
    # all but the dropout masks (a byte) and attention's float32 log-sum-exp
    assert 1.99 * fp32["activations"] < fp64["activations"] < 2 * fp32["activations"]


def test_show_notes_what_attention_dropout_keeps_on_a_cpu() -> None:
    from specformer.analysis.memory import memory_estimate
    from specformer.cli.analysis_cmds import human_bytes

    spec = load_spec("gpt-nano", overrides=["decoder.attention.dropout=0.1"])
    cpu = memory_estimate(spec, batch=4, seq_len=256, dtype="fp32", cpu=True)
    gpu = memory_estimate(spec, batch=4, seq_len=256, dtype="fp32")
    # four layers of 3 float32 T x T tensors of 4 heads, less the output and log-sum-exp the
    # fused kernel keeps: more than two such tensors a layer
    assert cpu.activations - gpu.activations > 4 * 2 * 4 * 4 * 256 * 256 * 4
    out = _ok(["show", "gpt-nano", "--set", "decoder.attention.dropout=0.1", "-b", "4", "--dtype", "32",
               "-f", "markdown"]).stdout
    assert f"activations {human_bytes(cpu.activations)}, total {human_bytes(cpu.total)}" in out
    assert "torch's math kernel" not in _ok(["show", "gpt-nano", "-f", "markdown"]).stdout


def test_show_set_overrides() -> None:
    data = json.loads(_ok(["show", "gpt2-small", "--set", "decoder.n_layers=6", "-f", "json"]).stdout)
    assert data["params"]["total"] == count_parameters(load_spec("gpt2-small", ["decoder.n_layers=6"])).total
    # the JSON names the overrides too (it passed the variant off as gpt2-small)
    assert (data["name"], data["overrides"]) == ("gpt2-small", ["decoder.n_layers=6"])
    assert json.loads(_ok(["show", "gpt2-small", "-f", "json"]).stdout)["overrides"] == []
    # the heading says the tables are of the variant, not of gpt2-small itself
    out = _ok(["show", "gpt2-small", "-s", "decoder.n_layers=6", "-s", "decoder.attention.n_kv_heads=4",
               "-f", "markdown"]).stdout
    assert out.splitlines()[0] == ("### gpt2-small --set decoder.n_layers=6 --set decoder.attention.n_kv_heads=4"
                                   " — decoder, 77,187,840 parameters (77.19M)")
    assert _ok(["show", "gpt2-small", "-s", "decoder.n_layers=6"]).stdout.startswith(
        "gpt2-small --set decoder.n_layers=6 — decoder, ")
    assert _ok(["show", "gpt-nano", "-s", "decoder.n_layers=2", "--tree", "-f", "markdown"]).stdout.startswith(
        "### gpt-nano --set decoder.n_layers=2 module tree\n")


def test_show_bad_spec_exits_1_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("extends: gpt2-small\ndecoder:\n  attention: {n_heads: 5}\n")
    result = runner.invoke(app, ["show", str(path)])
    assert result.exit_code == 1
    assert "bad.yaml:3:" in result.stderr and "n_heads" in result.stderr
    assert "Traceback" not in result.output
    missing = runner.invoke(app, ["show", "gpt3-small"])
    assert missing.exit_code == 1 and "did you mean" in missing.stderr


def test_bad_options_are_reported() -> None:
    result = runner.invoke(app, ["show", "gpt2-small", "--format", "html"])
    assert result.exit_code == 2 and "rich, markdown, json" in result.stderr
    for command in (["show", "gpt2-small"], ["diff", "gpt2-small", "gpt2-medium"]):
        # a bad option value is a usage error (2), like a bad --format
        result = runner.invoke(app, [*command, "--dtype", "fp12"])
        assert result.exit_code == 2 and "--dtype: unknown precision 'fp12'" in result.stderr
        assert "Traceback" not in result.output
    result = runner.invoke(app, ["diff", "gpt2-small"])
    assert result.exit_code == 2 and "at least two specs, or one spec and --set" in result.stderr


def test_diff_rich(tmp_path: Path) -> None:
    variant = tmp_path / "variant.yaml"
    variant.write_text(
        "extends: gpt2-small\nname: gpt2-rope-swiglu\npositional: {type: rope, base: 10000}\n"
        "decoder:\n  attention: {n_kv_heads: 4}\n  ffn: {type: glu, activation: silu, d_ff: 2048}\n"
        "  norm: {type: rmsnorm}\n"
    )
    out = _ok(["diff", "gpt2-small", str(variant)]).stdout
    assert "identical to gpt2-small except:" in out
    assert "decoder.attention.kv_groups (derived)" in out
    assert "consequences" in out and "-8.3%" in out  # parameters: 124.4M -> 114.1M
    assert "checkpoint compatibility" in out and "qkv_proj.weight [2304, 768]→[1280, 768] (×12)" in out


def test_diff_identical() -> None:
    out = _ok(["diff", "gpt2-small", "gpt2-small"]).stdout
    assert "gpt2-small #2 is identical to gpt2-small" in out
    assert "yes: same keys and shapes" in out


def test_diff_json_changes() -> None:
    data = json.loads(_ok(["diff", "gpt2-small", "gpt2-medium", "--format", "json"]).stdout)
    assert data["specs"] == ["gpt2-small", "gpt2-medium"]
    changes = {c["path"]: (c["left"], c["right"]) for c in data["changes"]}
    assert changes["d_model"] == (768, 1024)
    assert changes["decoder.n_layers"] == (12, 24)
    assert [r["params"]["total"] for r in data["reports"]] == [124_439_808, 354_823_168]
    assert data["compatibility"][0]["compatible"] is False


def test_diff_markdown_three_specs() -> None:
    out = _ok(["diff", "gpt2-small", "gpt2-medium", "gpt2-large", "-f", "markdown", "--no-checkpoints"]).stdout
    assert "| field | gpt2-small | gpt2-medium | gpt2-large |" in out
    assert "| decoder.n_layers | 12 | 24 | 36 |" in out
    assert "354,823,168 (+185.1%)" in out
    assert "checkpoint compatibility" not in out


def test_diff_same_names_get_distinct_labels(tmp_path: Path) -> None:
    variant = tmp_path / "deeper.yaml"
    variant.write_text("extends: gpt-nano\ndecoder: {n_layers: 6}\n")
    data = json.loads(_ok(["diff", "gpt-nano", str(variant), "-f", "json"]).stdout)
    assert data["specs"][0] != data["specs"][1]
    # a file that names itself nothing is named after the file, not by the name it inherits
    assert data["specs"] == ["gpt-nano", "deeper"]
    assert json.loads(_ok(["diff", "gpt2-small", str(variant), "-f", "json"]).stdout)["specs"] == [
        "gpt2-small", "deeper"]
    # two such files of one stem (a/config.yaml, b/config.yaml) are told apart by their paths
    other = tmp_path / "b" / "deeper.yaml"
    other.parent.mkdir()
    other.write_text("extends: gpt-nano\ndecoder: {n_layers: 3}\n")
    assert json.loads(_ok(["diff", str(variant), str(other), "-f", "json"]).stdout)["specs"] == [
        str(variant), str(other)]
    named = tmp_path / "named.yaml"
    named.write_text("extends: gpt-nano\nname: my-deep\ndecoder: {n_layers: 6}\n")
    assert json.loads(_ok(["diff", "gpt2-small", str(named), "-f", "json"]).stdout)["specs"] == [
        "gpt2-small", "my-deep"]


def test_diff_labels_a_run_folder_by_its_path(tmp_path: Path) -> None:
    # a run of base.yaml with a --set: its spec.yaml is resolved and says name: base
    base = tmp_path / "base.yaml"
    base.write_text("extends: gpt-nano\ntraining: {max_steps: 20}\n")
    run = tmp_path / "runs" / "base" / "20250101-120000"
    run.mkdir(parents=True)
    (run / "spec.yaml").write_text(load_spec(str(base), overrides=["positional.type=rope"]).to_yaml())
    data = json.loads(_ok(["diff", str(base), str(run), "--no-checkpoints", "-f", "json"]).stdout)
    assert data["specs"] == ["base", str(run)]  # not two "base"s: the run changed positional.type
    data = json.loads(_ok(["diff", "gpt2-small", str(run), "--no-checkpoints", "-f", "json"]).stdout)
    assert data["specs"] == ["gpt2-small", str(run)]


def test_show_and_diff_of_70b(tmp_path: Path) -> None:
    # their time and memory are measured by benchmarks/cli.py, not asserted here
    path = tmp_path / "llama2-70b.yaml"
    path.write_text(LLAMA_70B_YAML)
    data = json.loads(_ok(["show", str(path), "-f", "json"]).stdout)
    assert data["params"]["total"] == 68_976_648_192
    assert "68,976,648,192" in _ok(["diff", "llama2-7b", str(path)]).stdout


def test_show_tree() -> None:
    pytest.importorskip("torch")
    out = _ok(["show", "gpt-nano", "--tree"]).stdout
    assert "891,648 params" in out
    assert "layers.0–layers.3" not in out and "0–3" in out and "×4" in out
    assert "qkv_proj" in out and "[384×128]" in out
    assert "weight [512×128] 65,536 tied to embed.tokens.weight" in out  # the tied LM head
    tree = json.loads(_ok(["show", "gpt-nano", "--tree", "-f", "json"]).stdout)
    assert tree["params"] == count_parameters(load_spec("gpt-nano")).total
    head = next(c for c in tree["children"] if c["name"] == "head")
    assert head["params"] == 0 and head["parameters"][0]["tied_to"] == "embed.tokens.weight"
    md = _ok(["show", "t5-nano", "--tree", "-f", "markdown"]).stdout
    assert md.startswith("### t5-nano module tree") and "rel_bias" in md
    llama = _ok(["show", "llama2-7b", "--tree"]).stdout  # named siblings of equal shape stay apart
    assert "gate_proj (Linear)" in llama and "up_proj (Linear)" in llama and "gate_proj–up_proj" not in llama


@pytest.mark.parametrize("name", ["bert-base", "t5-small", "transformer-base", "gpt-nano"])
@pytest.mark.parametrize("fmt", ["rich", "markdown", "json"])
def test_show_every_kind_in_every_format(name: str, fmt: str) -> None:
    out = _ok(["show", name, "--format", fmt]).stdout
    total = count_parameters(load_spec(name)).total
    if fmt == "json":
        assert json.loads(out)["params"]["total"] == total
    else:
        assert f"{total:,}" in out


def test_show_warns_past_a_learned_position_table():
    result = runner.invoke(app, ["show", "gpt2-small", "--seq-len", "4096"])
    assert result.exit_code == 0, result.output
    assert "--seq-len 4,096 is past this spec's learned position table (1,024 positions)" in result.stderr
    assert "PositionTableWarning" not in result.output and result.stderr.count("learned position table") == 1
    for ok in (["gpt2-small", "--seq-len", "1024"], ["llama2-7b", "--seq-len", "8192"]):  # rope extends
        result = runner.invoke(app, ["show", *ok])
        assert result.exit_code == 0 and "warning" not in result.stderr


def test_diff_says_how_many_key_groups_it_leaves_out_and_explains_only_what_is_shown(tmp_path) -> None:
    variant = tmp_path / "v.yaml"
    variant.write_text("extends: gpt2-small\ndecoder:\n  norm: {type: rmsnorm}\n  ffn: {type: glu, activation: silu}\n")
    out = runner.invoke(app, ["diff", "gpt2-small", str(variant), "--format", "markdown"]).stdout
    assert "49 missing:" in out and "… 1 more group;" in out
    assert "— : the field does not exist" in out  # the mlp's fields are absent from a glu
    same_type = tmp_path / "w.yaml"
    same_type.write_text("extends: gpt2-small\ndecoder: {n_layers: 6}\n")
    out = runner.invoke(app, ["diff", "gpt2-small", str(same_type)], env={"COLUMNS": "400"}).stdout
    assert "— : the field does not exist" not in out and "Compared after resolving extends" in out


def test_diff_names_the_layer_of_a_one_layer_mismatch_and_each_layers_shapes(tmp_path) -> None:
    variant = tmp_path / "v.yaml"
    variant.write_text(
        "extends: gpt-nano\ndecoder:\n  overrides:\n"
        "    - {layers: 1, ffn: {d_ff: 256}}\n    - {layers: [2, 3], ffn: {d_ff: 1024}}\n"
    )
    out = runner.invoke(app, ["diff", "gpt-nano", str(variant), "--format", "markdown"]).stdout
    # one layer: its index, not a `*` that reads as every layer
    assert "decoder.layers.1.ffn.up_proj.weight [512, 128]→[256, 128]" in out
    assert "decoder.layers.*.ffn.up_proj.weight [512, 128]→[256, 128]" not in out
    # layers with other shapes are listed with their own shapes
    assert "decoder.layers.2-3.ffn.up_proj.weight [512, 128]→[1024, 128] (×2)" in out
    # layers apart are named apart, not as a `*`
    gapped = tmp_path / "gapped.yaml"
    gapped.write_text("extends: gpt-nano\ndecoder:\n  overrides:\n    - {layers: [0, 1, 3], ffn: {d_ff: 1024}}\n")
    out = runner.invoke(app, ["diff", "gpt-nano", str(gapped), "--format", "markdown"]).stdout
    assert "decoder.layers.0-1,3.ffn.up_proj.weight [512, 128]→[1024, 128] (×3)" in out


def test_diff_lists_per_layer_rows_in_layer_order(tmp_path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("extends: gpt-nano\ndecoder:\n  overrides:\n    - {layers: [0, 1], ffn: {d_ff: 256}}\n"
                    "    - {layers: [3], attention: {sliding_window: 8}}\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: gpt-nano\ndecoder:\n  overrides:\n    - {layers: [0], ffn: {d_ff: 256}}\n"
                     "    - {layers: [2], ffn: {d_ff: 1024}}\n")
    data = json.loads(_ok(["diff", str(base), str(child), "--format", "json"]).stdout)
    layers = [int(c["path"].split(".")[2].split("-")[0]) for c in data["changes"] if ".layers." in c["path"]]
    assert layers == sorted(layers) and len(layers) >= 3, data["changes"]


def test_diff_names_checkpoints_by_the_labels_of_specs_that_share_a_name(tmp_path) -> None:
    variant = tmp_path / "v.yaml"
    variant.write_text("extends: gpt-nano\nname: gpt-nano\ndecoder: {n_layers: 2}\n")  # a second gpt-nano
    out = runner.invoke(app, ["diff", "gpt-nano", str(variant), "--format", "markdown"]).stdout
    assert f"| gpt-nano | {variant} | no: " in out and f"| {variant} | gpt-nano | no: " in out
    data = json.loads(_ok(["diff", "gpt-nano", str(variant), "--format", "json"]).stdout)
    assert [(c["source"], c["target"]) for c in data["compatibility"]] == [
        ("gpt-nano", str(variant)), (str(variant), "gpt-nano")
    ]


def test_show_and_diff_print_a_name_with_brackets_as_written(tmp_path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text('extends: gpt-nano\nname: "nano[/] [bold]x[/bold]"\n')  # rich markup would fail or eat it
    for args in (["show", str(spec)], ["diff", str(spec), "gpt-nano"]):
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "nano[/] [bold]x[/bold]" in result.stdout


def test_diff_marks_a_layer_an_override_keeps(tmp_path: Path) -> None:
    variant = tmp_path / "wider.yaml"
    variant.write_text("extends: gpt-nano\ndecoder:\n  ffn: {d_ff: 1024}\n"
                       "  overrides:\n    - layers: [2]\n      ffn: {d_ff: 512}\n")
    out = _ok(["diff", "gpt-nano", str(variant), "--format", "markdown"]).stdout
    assert "decoder.layers.2.ffn.d_ff (kept)" in out
    assert "(kept): an override keeps these layers as they were" in out


def test_diff_warns_for_each_spec_evaluated_past_its_learned_position_table() -> None:
    # the default length is the first spec's max_seq_len (256); bert-nano's table has 128
    result = runner.invoke(app, ["diff", "gpt-nano", "bert-nano"])
    assert result.exit_code == 0, result.output
    assert ("seq_len 256 (the first spec's max_seq_len) is past bert-nano's learned position table "
            "(128 positions)") in result.stderr
    assert "gpt-nano's" not in result.stderr
    quiet = runner.invoke(app, ["diff", "gpt-nano", "bert-nano", "--seq-len", "128"])
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr


def test_python_analysis_warns_past_a_learned_position_table_as_the_commands_do() -> None:
    import warnings

    from specformer.analysis import PositionTableWarning, analyze, diff_specs

    with pytest.warns(PositionTableWarning, match=r"seq_len 1,000 is past gpt-nano's learned position table "
                                                   r"\(256 positions\): the model cannot run at that length"):
        analyze("gpt-nano", seq_len=1000)
    with pytest.warns(PositionTableWarning, match="seq_len 1,024 is past gpt-nano's learned position table"):
        diff_specs("gpt2-small", "gpt-nano")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        analyze("gpt-nano", seq_len=256)
        analyze("llama-nano", seq_len=4096)  # rope extends


def test_diff_names_the_problems_of_every_bad_spec_not_only_the_first(tmp_path: Path) -> None:
    (tmp_path / "b1.yaml").write_text("extends: gpt-nano\nd_modle: 64\n")
    (tmp_path / "b2.yaml").write_text("extends: gpt-nano\nkind: decoder-only\n")
    result = runner.invoke(app, ["diff", "gpt-nano", str(tmp_path / "b1.yaml"), str(tmp_path / "b2.yaml")])
    assert result.exit_code == 1 and not result.stdout
    err = " ".join(result.stderr.split())
    assert f"error: 1 problem in the spec {tmp_path / 'b1.yaml'} {tmp_path / 'b1.yaml'}:2:1: d_modle: unknown field" in err
    assert f"error: 1 problem in the spec {tmp_path / 'b2.yaml'} {tmp_path / 'b2.yaml'}:2:1: kind: 'decoder-only'" in err


def test_diff_notes_a_spec_compared_past_its_own_max_seq_len(tmp_path: Path) -> None:
    short = tmp_path / "short.yaml"
    short.write_text("extends: llama2-7b\nmax_seq_len: 128\n")
    result = runner.invoke(app, ["diff", "llama2-7b", str(short)])
    assert result.exit_code == 0, result.output
    assert ("short's figures are at seq_len 4,096 (the first spec's max_seq_len), past its own max_seq_len 128: "
            "`--seq-len 128` compares them at its length") in " ".join(result.stderr.split())
    for args in (["diff", str(short), "llama2-7b"], ["diff", "llama2-7b", str(short), "--seq-len", "128"]):
        quiet = runner.invoke(app, args)  # the first spec the shorter, or a length given: nothing to note
        assert quiet.exit_code == 0 and "note" not in quiet.stderr, quiet.stderr


def test_diff_marks_the_sizes_that_follow_from_other_fields(tmp_path: Path) -> None:
    variant = tmp_path / "h8.yaml"
    variant.write_text("extends: gpt2-small\ndecoder:\n  attention: {n_heads: 8}\n  norm: {placement: post}\n")
    data = json.loads(_ok(["diff", "gpt2-small", str(variant), "--format", "json"]).stdout)
    derived = {c["path"]: c["derived"] for c in data["changes"]}
    assert derived == {
        "name": False,  # h8, named after its file
        "decoder.attention.n_heads": False, "decoder.attention.n_kv_heads": True,
        "decoder.attention.head_dim": True, "decoder.norm.placement": False, "decoder.norm.final": True,
    }
    # a size one spec writes (here 128, not 768 / 8 = 96) is not derived
    written = tmp_path / "h8-128.yaml"
    written.write_text("extends: gpt2-small\ndecoder:\n  attention: {n_heads: 8, head_dim: 128}\n")
    data = json.loads(_ok(["diff", "gpt2-small", str(written), "--format", "json"]).stdout)
    assert {c["path"]: c["derived"] for c in data["changes"]}["decoder.attention.head_dim"] is False


def test_diff_shows_floats_that_differ_past_six_digits_apart(tmp_path: Path) -> None:
    for name, base in (("r1", 1_000_000), ("r2", 1_000_001)):
        (tmp_path / f"{name}.yaml").write_text(f"extends: gpt-nano\nname: {name}\npositional: {{type: rope, base: {base}}}\n")
    out = _ok(["diff", str(tmp_path / "r1.yaml"), str(tmp_path / "r2.yaml"), "--format", "markdown"]).stdout
    assert "| positional.base | 1e+06 | 1000001.0 |" in out


def test_a_table_narrower_than_its_title_keeps_the_title_on_one_line(tmp_path: Path) -> None:
    # one changed field with short values makes a table narrower than "identical to ... except:"
    variant = tmp_path / "t5.yaml"
    variant.write_text("extends: t5-small\nname: t5\n")
    out = _ok(["diff", "t5-small", str(variant), "--no-checkpoints"]).stdout
    assert "identical to t5-small except:\n" in out
    # the table below it is drawn as wide as the title
    lines = out.splitlines()
    start = lines.index("identical to t5-small except:")
    assert len(lines[start + 1]) >= len("identical to t5-small except:")


@pytest.mark.parametrize("name", ["gpt2-small", "t5-small"])
def test_show_in_an_80_column_terminal_turns_the_architecture_table(monkeypatch, name: str) -> None:
    # one column per field does not fit 80 columns: one row per field does, with no
    # header or value broken inside a word ("d_mod el", "decod er")
    import io

    from rich.console import Console

    from specformer.cli import analysis_cmds

    screen = io.StringIO()
    monkeypatch.setattr(analysis_cmds, "console", Console(file=screen, width=80, force_terminal=True,
                                                          color_system=None))
    _ok(["show", name])
    out = screen.getvalue()
    assert max(map(len, out.splitlines())) <= 80
    table = out.split("architecture", 1)[1].split("parameters", 1)[0]
    spec = load_spec(name)
    for role, stack in spec.stacks():
        assert f" {role} " in table.splitlines()[2]  # a stack heads each column
        for field, value in (("d_model", spec.d_model), ("head_dim", stack.attention.head_dim),
                             ("d_ff", stack.ffn.d_ff)):
            assert re.search(rf"│ {field} +│ {value} ", table), (field, table)
    assert f"{spec.decoder.norm.type} ({spec.decoder.norm.placement})" in table
    # a column that is empty throughout (no notes for gpt2-small) is left out
    assert ("│ notes" in table) == (spec.kind == "encoder-decoder")


def test_a_notebook_shows_a_report_and_a_diff_as_the_markdown_tables_and_reprs_them_in_one_line() -> None:
    from specformer.analysis import analyze, diff_specs

    report = analyze(load_spec("gpt2-small"), dtype="fp32")
    assert report._repr_markdown_() == report.to_markdown()
    assert report.to_markdown() == _ok(["show", "gpt2-small", "--format", "markdown", "--dtype", "fp32"]).stdout
    assert repr(report) == ("SpecReport('gpt2-small', params=124,439,808, forward_flops_per_token="
                            f"{report.flops.forward:,}, kv_cache_bytes_per_token=73,728, "
                            f"training_memory_bytes={report.memory.total:,})")
    assert "per_layer" not in repr(report.params) and len(repr(count_parameters(load_spec("llama2-7b")))) < 300

    d = diff_specs("gpt2-small", "gpt2-medium")
    assert d._repr_markdown_() == d.to_markdown() == _ok(["diff", "gpt2-small", "gpt2-medium", "-f", "markdown"]).stdout
    assert repr(d) == ("SpecDiff(['gpt2-small', 'gpt2-medium'], 6 changes: name, d_model, decoder.n_layers, "
                       "decoder.attention.n_heads, decoder.attention.n_kv_heads, … (1 more), checkpoints load: "
                       "gpt2-small→gpt2-medium no, gpt2-medium→gpt2-small no)")
    same = diff_specs("gpt-nano", "gpt-nano", checkpoints=False)
    assert repr(same) == "SpecDiff(['gpt-nano', 'gpt-nano #2'], identical)"
    assert same.to_markdown().startswith("### gpt-nano #2 is identical to gpt-nano")
    # a spec copied from another keeps its name: each still has a column of its own
    nano = load_spec("gpt-nano")
    fewer = diff_specs(nano, nano.model_copy(update={"decoder": nano.decoder.model_copy(update={"n_layers": 2})}))
    assert fewer.names == ["gpt-nano", "gpt-nano #2"]
    assert "| decoder.n_layers | 4 | 2 |" in fewer.to_markdown() and "| field | gpt-nano | gpt-nano #2 |" in fewer.to_markdown()
    # without reports (a model that cannot be built to count it) the changes still render
    fields_only = diff_specs("gpt-nano", "bert-nano", reports=False, checkpoints=False).to_markdown()
    assert "| kind | decoder | encoder |" in fields_only and "consequences" not in fields_only


def test_diff_set_changes_the_last_spec(tmp_path: Path) -> None:
    # one spec and --set: the spec against itself with the overrides
    data = json.loads(_ok(["diff", "gpt2-small", "--set", "decoder.attention.n_kv_heads=4", "-f", "json"]).stdout)
    assert data["specs"] == ["gpt2-small", "gpt2-small (--set)"]
    assert [(c["path"], c["values"]) for c in data["changes"]] == [
        ("decoder.attention.n_kv_heads", [12, 4]), ("decoder.attention.kv_groups", [1, 3])]
    # 12 layers × 8 fewer heads in each of k and v, 64 wide, each with 768 weights and a bias
    assert data["reports"][0]["params"]["total"] - data["reports"][1]["params"]["total"] == 12 * 2 * 8 * 64 * (768 + 1)
    assert [r["label"] for r in data["reports"]] == data["specs"]  # which report is the variant's
    # two specs: only the last one is changed
    data = json.loads(_ok(["diff", "gpt2-small", "gpt2-medium", "-s", "decoder.n_layers=12", "-f", "json"]).stdout)
    assert data["specs"] == ["gpt2-small", "gpt2-medium (--set)"]
    assert "decoder.n_layers" not in {c["path"] for c in data["changes"]}
    assert data["reports"][0]["params"]["total"] == 124_439_808
    # two specs of one name are told apart by their arguments, the --set one marked
    twin = tmp_path / "twin.yaml"
    twin.write_text("extends: gpt2-small\nname: gpt2-small\ndecoder:\n  n_layers: 6\n")
    data = json.loads(_ok(["diff", str(twin), "gpt2-small", "-s", "decoder.n_layers=3", "-f", "json"]).stdout)
    assert data["specs"] == [str(twin), "gpt2-small (--set)"]
    # a bad --set is named as the --set
    result = runner.invoke(app, ["diff", "gpt2-small", "--set", "decoder.attenton.n_heads=4"])
    assert result.exit_code == 1 and "--set decoder.attenton.n_heads=4" in result.stderr
    assert "did you mean 'attention'" in result.stderr


def test_analyze_takes_a_preset_name_as_the_other_analysis_functions_do(tmp_path: Path) -> None:
    from specformer.analysis import analyze

    path = tmp_path / "variant.yaml"
    path.write_text("extends: gpt2-small\nname: variant\ndecoder:\n  attention: {n_kv_heads: 4}\n")
    for source, name in (("gpt2-small", "gpt2-small"), (path, "variant"), ({"extends": "gpt-nano"}, "gpt-nano")):
        report = analyze(source)
        assert report.spec == load_spec(source) and report.name == name
        assert repr(report).startswith(f"SpecReport({name!r}, params={count_parameters(load_spec(source)).total:,}")
        assert report.to_dict()["name"] == name and report.to_markdown().startswith(f"### {name} —")


def test_diff_shows_what_a_sliding_window_saves_of_the_kv_cache() -> None:
    # the bytes per token stay; the cache held at 4,096 tokens is 511 + 128 = 639 of them per layer
    # (its rolling buffer): 32 layers × 2 × 4096 × 2 bytes × 4096 tokens = 2 GiB, and × 639 = 319.5 MiB
    out = _ok(["diff", "llama2-7b", "--set", "decoder.attention.sliding_window=512", "-f", "markdown",
               "--no-checkpoints"]).stdout
    assert "| KV cache bytes/token (bf16) | 524,288 | 524,288 | 0 | 0% |" in out
    assert "| KV cache @ 4096, batch 1 | 2 GiB | 319.5 MiB | -1.688 GiB | -84.4% |" in out


def test_flops_count_executed_is_the_dense_6n_plus_12ltd_figure() -> None:
    # 6·N + 12·L·T·d per training token (N: the weights of the matrix products, the head's
    # included), every query scoring all T keys, as MFU calculators count
    for name, seq_len, n_matmul in (
        ("gpt2-small", 1024, 12 * (4 * 768 * 768 + 2 * 768 * 3072) + 768 * 50257),
        ("llama2-7b", 4096, 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 4096 * 32000),
    ):
        spec = load_spec(name)
        layers, d = spec.decoder.n_layers, spec.d_model
        executed = json.loads(_ok(["show", name, "--flops-count", "executed", "-f", "json"]).stdout)["flops_per_token"]
        assert executed["count"] == "executed" and executed["seq_len"] == seq_len
        assert executed["training"] == 6 * n_matmul + 12 * layers * seq_len * d
        needed = json.loads(_ok(["show", name, "-f", "json"]).stdout)["flops_per_token"]
        # the causal half: (T + 1) / 2 keys per query
        assert needed["training"] == 6 * n_matmul + 12 * layers * (seq_len + 1) * d // 2
    out = _ok(["show", "gpt2-small", "--flops-count", "executed"]).stdout
    assert "every query against all T keys" in out and "854,438,400" in out
    diff = json.loads(_ok(["diff", "gpt2-small", "-s", "decoder.n_layers=6", "--flops-count", "executed",
                           "-f", "json"]).stdout)
    assert [r["flops_per_token"]["count"] for r in diff["reports"]] == ["executed", "executed"]
    assert "FLOPs/token training @ 1024 (executed)" in _ok(
        ["diff", "gpt2-small", "-s", "decoder.n_layers=6", "--flops-count", "executed", "-f", "markdown"]).stdout
    result = runner.invoke(app, ["show", "gpt2-small", "--flops-count", "dense"])
    assert result.exit_code == 2 and "--flops-count must be one of needed, executed, got 'dense'" in result.stderr


def test_show_and_diff_name_the_rope_scaling(tmp_path: Path) -> None:
    out = _ok(["show", "llama2-7b", "-s", "positional.scaling={type: llama3, factor: 8}", "-f", "markdown"]).stdout
    assert "| rope (base 10000, llama3 x8 of 8192) |" in out
    assert "| rope (base 10000, linear x4) |" in _ok(
        ["show", "llama2-7b", "-s", "positional.scaling={type: linear, factor: 4}", "-f", "markdown"]).stdout
    assert "| rope (base 10000, dynamic x2 of 4096) |" in _ok(["show", "llama2-7b", "-s", "positional.scaling="
        "{type: dynamic, factor: 2, original_max_position_embeddings: 4096}", "-f", "markdown"]).stdout
    # a partial rotation names the features it rotates: 48 × 0.3 = 14.4, rounded down as transformers does
    assert "| rope (base 10000, 0.3 of head_dim: 14 of 48) |" in _ok(
        ["show", "gpt-nano", "-s", "positional={type: rope, fraction: 0.3}", "-s", "d_model=192", "-f", "markdown"]
    ).stdout
    # Gemma 3's windowed layers rotate with local_base, unscaled; its global layers with base
    rows = [line for line in _ok(["show", "gemma-3-1b", "-f", "markdown"]).stdout.splitlines()
            if line.startswith("| decoder[")]
    assert rows and all(("| rope (local base 10000) |" in row) is ("window 512" in row) for row in rows)
    assert all("| rope (base 1e+06) |" in row for row in rows if "window" not in row)
    for factor in (8, 32):
        (tmp_path / f"x{factor}.yaml").write_text(
            f"extends: llama2-7b\nname: x{factor}\npositional:\n  scaling: {{type: llama3, factor: {factor}}}\n")
    data = json.loads(_ok(["diff", str(tmp_path / "x8.yaml"), str(tmp_path / "x32.yaml"), "-f", "json"]).stdout)
    changes = {c["path"]: (c["left"], c["right"]) for c in data["changes"]}
    assert changes == {"name": ("x8", "x32"), "positional.scaling.factor": (8.0, 32.0)}
    assert data["compatibility"][0]["compatible"] is True  # no tensor depends on it
    out = _ok(["diff", "llama2-7b", str(tmp_path / "x8.yaml"), "-f", "markdown", "--no-checkpoints"]).stdout
    assert "| positional.scaling.type | — | llama3 |" in out
    assert "| positional.scaling.original_max_position_embeddings | — | 8192 |" in out


def test_show_and_diff_do_not_import_torch(tmp_path: Path) -> None:
    """show and diff are spec arithmetic: importing torch (~2 s, ~200 MB) would make them
    as slow as a training run's start. A sliding window sizes its KV cache too."""
    import subprocess
    import sys

    big = tmp_path / "llama2-70b.yaml"
    big.write_text(LLAMA_70B_YAML)
    windowed = tmp_path / "windowed.yaml"
    windowed.write_text("extends: llama2-7b\ndecoder:\n  attention: {sliding_window: 512}\n")
    code = (
        "import sys; from typer.testing import CliRunner; from specformer.cli import app; r = CliRunner()\n"
        f"for args in (['show', {str(big)!r}], ['show', {str(windowed)!r}, '--format', 'json'],\n"
        f"             ['diff', 'llama2-7b', {str(big)!r}], ['diff', 'llama2-7b', {str(windowed)!r}]):\n"
        "    res = r.invoke(app, args); assert res.exit_code == 0, res.output\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("args", [["show", "gpt2-small"], ["diff", "gpt2-small", "gpt2-medium"]])
def test_a_narrow_terminal_never_folds_a_number(monkeypatch, args) -> None:
    # at 60 columns the parameter totals were folded: "124,439,8" over "08", "39,383,80" over "8"
    import io
    import re

    from rich.console import Console

    from specformer.cli import analysis_cmds

    screen = io.StringIO()
    monkeypatch.setattr(analysis_cmds, "console", Console(file=screen, width=60, force_terminal=True,
                                                          color_system=None))
    _ok(args)
    out = screen.getvalue()
    assert max(map(len, out.splitlines())) <= 60
    assert "124,439,808" in out and "39,383,808" in out
    for line in out.splitlines():  # no number cell ends in a cut group of digits ("39,383,80", "264,")
        for cell in line.strip("│").split("│")[1:]:  # the first column is the row's name, text
            assert not re.fullmatch(r"\s*[+-]?[\d,]*\d,\d{0,2}\s*", cell), line


def test_a_figure_with_nothing_counted_says_not_counted_not_at_least_zero() -> None:
    # every part a plugin's: the forward and the training step have no FLOP counted at all
    from types import SimpleNamespace

    from specformer import load_spec
    from specformer.cli.analysis_cmds import _compute_section

    parts = {"decoder.attention": "attention type 'mine'", "decoder.ffn": "ffn type 'mine'", "head": "head type 'mine'"}
    flops = SimpleNamespace(seq_len=64, count="attended", components={}, forward_not_counted=parts, not_counted=parts,
                            trained_parameters=None, forward=0, training=0)
    section = _compute_section(SimpleNamespace(flops=flops, spec=load_spec("gpt-nano")))
    totals = {row[0].split(",")[0]: row[1:] for row in section.rows}
    assert totals["forward"] == ["not counted", ""] and totals["training step (3× forward)"] == ["not counted", ""]
