"""``specformer validate``, ``schema`` and ``list`` as a user runs them."""

from __future__ import annotations

import json
import os
import re
import threading
from importlib import resources
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import specformer
from specformer.cli import app
from specformer.specs.jsonschema import spec_json_schema
from specformer.specs.loader import load_spec

runner = CliRunner()


def test_validate_prints_the_resolved_spec():
    result = runner.invoke(app, ["validate", "gpt2-small", "--set", "decoder.n_layers=4"])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert data["decoder"]["n_layers"] == 4
    assert data["decoder"]["attention"]["head_dim"] == 64


def test_validate_json_format():
    result = runner.invoke(app, ["validate", "t5-small", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["positional"]["type"] == "t5"


def test_validate_reports_problems_and_exits_1(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("extends: gpt2-small\ndecoder:\n  attention: {n_heads: 12, n_kv_heads: 5}\n  norm: {type: rmsnrom}\n")
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    err = result.stderr
    assert "2 problems" in err
    assert "my.yaml:3:" in err and "decoder.attention.n_kv_heads" in err
    assert "my.yaml:4:" in err and "did you mean 'rmsnorm'" in err
    assert "Traceback" not in result.output


def test_validate_notes_what_train_would_refuse_in_a_valid_spec():
    # a decoder's classification head builds and analyses (valid), but does not train
    result = runner.invoke(app, ["validate", "gpt-nano", "--set", "head={type: classification}"],
                           env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["head"]["type"] == "classification"
    note = " ".join(result.stderr.split())
    assert note.startswith("note: specformer train refuses this spec: head.type: objective 'causal_lm' trains a "
                           "vocabulary head")
    assert "--set head.type=lm" in note
    assert runner.invoke(app, ["validate", "gpt-nano"]).stderr == ""
    assert runner.invoke(app, ["validate", "gpt-nano", "--set", "head={type: classification}", "-q"]).output == ""


def test_validate_notes_text_data_with_a_vocabulary_no_text_tokenizer_fits(tmp_path):
    # vocab_size below the byte tokenizer's leaves training.tokenizer unset: validate said nothing, and
    # train refused it only once it was preparing the data
    from specformer.specs.errors import SpecError
    from specformer.training.run import _check_before_data

    says = ("vocab_size: vocab_size=100 fits no built-in text tokenizer (byte-level needs 259); raise vocab_size or "
            "set training.tokenizer (type: file, a tokenizer.json of at most vocab_size tokens)")
    result = runner.invoke(app, ["validate", "gpt-nano", "--set", "vocab_size=100"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert " ".join(result.stderr.split()) == f"note: specformer train refuses this spec: {says}"
    pairs = runner.invoke(app, ["validate", "t5-nano", "--set", "training.data={type: pairs, paths: [p.jsonl]}"],
                          env={"COLUMNS": "400"})  # README's t5-nano on pairs needs --set vocab_size=512
    assert "vocab_size=64 fits no built-in text tokenizer" in pairs.stderr
    assert runner.invoke(app, ["validate", "t5-nano"]).stderr == ""  # the synthetic tasks' own vocabulary
    out = runner.invoke(app, ["train", "gpt-nano", "--set", "vocab_size=100", "--set",
                              f"training.out_dir={tmp_path / 'runs'}", "--no-progress"], env={"COLUMNS": "400"})
    assert out.exit_code == 1 and f"--set vocab_size=100: {says}" in " ".join(out.stderr.split()), out.output
    assert not (tmp_path / "runs").exists()
    spec = load_spec("gpt-nano", ["vocab_size=100"])
    with pytest.raises(SpecError):
        _check_before_data(spec, hardware=False)
    _check_before_data(spec, hardware=False, checkpoint=True)  # a checkpoint's own tokenizer stands in


def test_validate_notes_a_setting_that_changes_nothing():
    # local_base rotates the windowed layers; with no window anywhere it rotates none
    result = runner.invoke(app, ["validate", "llama-nano", "--set", "positional.local_base=100"],
                           env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    note = " ".join(result.stderr.split())
    assert note.startswith("note: positional.local_base: no layer has a sliding window, so local_base=100 rotates "
                           "none: every layer rotates with base 10000"), note
    windowed = runner.invoke(app, ["validate", "llama-nano", "--set", "positional.local_base=100", "--set",
                                   "decoder.overrides=[{layers: [0], attention: {sliding_window: 8}}]"])
    assert windowed.exit_code == 0 and windowed.stderr == "", windowed.output
    assert runner.invoke(app, ["validate", "gemma-3-1b"]).stderr == ""
    # a window past max_seq_len masks nothing in training, and generation then reads further back
    wide = runner.invoke(app, ["validate", "llama-nano", "--set", "max_seq_len=64", "--set", "training.seq_len=64", "--set",
                               "decoder.overrides=[{layers: [1], attention: {sliding_window: 100}}]"],
                         env={"COLUMNS": "400"})
    assert wide.exit_code == 0, wide.output
    assert " ".join(wide.stderr.split()).startswith(
        "note: decoder.overrides.0.attention.sliding_window: a window of 100 reaches every key of max_seq_len 64, "
        "so it masks nothing in training; generation past max_seq_len reads up to 99 tokens back, further than "
        "any trained distance (63)"), wide.stderr
    exact = runner.invoke(app, ["validate", "llama-nano", "--set", "max_seq_len=64", "--set", "training.seq_len=64", "--set",
                                "decoder.attention.sliding_window=64"])
    assert exact.exit_code == 0 and exact.stderr == "", exact.output  # a rolling cache at trained distances
    # a warmup longer than the run, which train warned of only once started
    long = runner.invoke(app, ["validate", "gpt-nano", "--set", "training.schedule.warmup_steps=5000", "--set",
                               "training.max_steps=100"], env={"COLUMNS": "400"})
    assert long.exit_code == 0 and " ".join(long.stderr.split()).startswith(
        "note: training.schedule.warmup_steps: warmup_steps=5000 is above max_steps=100: the learning rate never "
        "reaches training.optimizer.lr (it ends at 0.02 of it)"), long.stderr


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(specformer.__file__).parent / "specs/presets").glob("*.yaml")))
def test_no_preset_writes_a_setting_without_effect(name):
    assert load_spec(name).settings_without_effect() == []


@pytest.mark.parametrize("preset,overrides,path,says", [
    # BART's own decoder positions, in a spec with no position table of its own
    ("t5-nano", ["embedding.share_positions=false"], "embedding.share_positions",
     "and this spec has none of them (positional t5, no segments, no embedding norm)"),
    # a decoder's forward takes no token types: only row 0 is ever added
    ("gpt-nano", ["embedding.segment_vocab_size=2"], "embedding.segment_vocab_size",
     "every token adds row 0 of the 2 segment rows and the other 1 never train"),
    ("t5-nano", ["embedding.segment_vocab_size=3"], "embedding.segment_vocab_size", "the other 2 never train"),
    # every layer windowed: they rotate with local_base, which is never scaled
    ("llama-nano", ["positional.local_base=100", "positional.scaling={type: linear, factor: 2}",
                    "decoder.attention.sliding_window=8"], "positional.scaling", "scaling (linear, of base 10000"),
    # scheme t5 draws every weight from its shape; std only learned position and segment tables
    ("t5-nano", ["init.std=0.05"], "init.std", "std=0.05 draws only learned position and segment tables"),
    ("llama-nano", ["init.scheme=t5", "init.std=0.05"], "init.std", "this spec has neither"),
    # validation files given: no fraction of paths is held out
    ("gpt-nano", ["training.data={type: files, paths: [a.txt], val_paths: [b.txt], val_fraction: 0.2}"],
     "training.data.val_fraction", "val_fraction=0.2 holds out nothing"),
])
def test_settings_of_parts_the_model_lacks_are_noted(preset, overrides, path, says):
    notes = load_spec(preset, overrides=overrides).settings_without_effect()
    assert [n.path for n in notes] == [path], notes
    assert says in notes[0].message, notes[0].message


@pytest.mark.parametrize("preset,overrides", [
    ("bart-base", []),  # its own learned positions and embedding norm
    ("bert-nano", ["embedding.segment_vocab_size=3"]),  # an encoder takes token types
    ("gpt-nano", ["embedding.segment_vocab_size=1"]),  # one learned vector added to every token
    ("t5-nano", ["init.std=0.05", "positional={type: learned}"]),  # std draws the position table
    ("gpt-nano", ["training.data={type: files, paths: [a.txt], val_paths: [b.txt]}"]),
    ("llama-nano", ["positional.local_base=100", "positional.scaling={type: linear, factor: 2}",
                    "decoder.overrides=[{layers: [0], attention: {sliding_window: 8}}]"]),  # layer 1 scales
])
def test_the_same_settings_where_they_act_are_not_noted(preset, overrides):
    assert load_spec(preset, overrides=overrides).settings_without_effect() == []


def test_validate_bad_override_exits_1():
    result = runner.invoke(app, ["validate", "gpt-nano", "--set", "decoder.n_layers=lots"])
    assert result.exit_code == 1
    assert "--set decoder.n_layers=lots" in result.stderr


def test_schema_is_json_schema_of_a_spec():
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["$schema"].endswith("2020-12/schema")
    assert {"kind", "d_model", "decoder", "extends"} <= set(schema["properties"])


def test_shipped_schema_file_is_current():
    shipped = json.loads(resources.files("specformer.specs").joinpath("specformer.schema.json").read_text())
    assert shipped == spec_json_schema(), (
        "specformer/specs/specformer.schema.json is stale: regenerate it with "
        "`specformer schema -o specformer/specs/specformer.schema.json`"
    )


def test_list_shows_every_preset_with_its_size():
    result = runner.invoke(app, ["list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("gpt2-small", "bert-base", "t5-small", "llama2-7b", "gpt-nano"):
        assert name in result.stdout
    assert " 124M " in result.stdout  # gpt2-small with tied embeddings
    assert " 6.74B " in result.stdout  # llama2-7b
    # gemma-3-1b's 999,885,952 round to 1000M: it is 1B, not 1e+03M
    assert re.search(r"gemma-3-1b .* 1B ", result.stdout) and "e+" not in result.stdout


def test_help_teaches():
    result = runner.invoke(app, ["validate", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--set" in result.stdout and "Examples" in result.stdout


def test_docs_field_reference_is_current():
    from pathlib import Path

    from specformer.specs.reference import END, START, field_reference

    text = (Path(__file__).parents[2] / "docs" / "spec.md").read_text()
    generated = text.split(START, 1)[1].split(END, 1)[0]
    assert generated == "\n" + field_reference(), (
        "docs/spec.md is stale: run `python -m specformer.specs.reference docs/spec.md`"
    )


def test_errors_show_the_users_text_as_written(tmp_path):
    # square brackets in a path, a value or a --set are not rich markup
    path = tmp_path / "[red]my.yaml"
    path.write_text('kind: "[bold]decodr"\nvocab_size: 10\nd_model: 8\n')
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    assert f"{path}:1:1: kind: '[bold]decodr' is not allowed" in result.stderr
    result = runner.invoke(app, ["validate", "gpt2-small", "--set", "training.optimizer.betas=[a, b]"])
    assert result.exit_code == 1
    assert "--set training.optimizer.betas=[a, b]: training.optimizer.betas.0" in result.stderr


def test_a_directory_is_not_reported_as_missing(tmp_path):
    folder = tmp_path / "specs.yaml"
    folder.mkdir()
    result = runner.invoke(app, ["validate", str(folder)])
    assert result.exit_code == 1
    assert f"{folder} is a directory, not a YAML file" in result.stderr


def test_a_directory_named_bare_is_not_reported_as_missing(tmp_path, monkeypatch):
    # `validate x` for a folder x: not "no preset or file named 'x'", which sends one looking for a typo
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    result = runner.invoke(app, ["validate", "run"])
    assert result.exit_code == 1
    assert "run is a directory, not a YAML file" in result.stderr and "no preset" not in result.stderr
    assert "a spec is a preset name, a YAML file or a run folder (its spec.yaml)" in result.stderr
    (tmp_path / "child.yaml").write_text("extends: run\n")
    result = runner.invoke(app, ["validate", "child.yaml"])
    assert f"child.yaml:1:1: extends: {tmp_path / 'run'} is a directory" in result.stderr


def test_a_run_folder_stands_for_its_spec_yaml(tmp_path, monkeypatch):
    # `diff runs/x/A runs/x/B`: a folder holding a spec.yaml (a run folder) is that spec, as a run
    # folder is its checkpoint for generate; it was refused with a hint to give its spec.yaml
    monkeypatch.chdir(tmp_path)
    for run, layers in (("20260101-000000", 4), ("20260102-000000", 6)):
        (tmp_path / "runs" / "x" / run).mkdir(parents=True)
        (tmp_path / "runs" / "x" / run / "spec.yaml").write_text(
            f"# cd /home/me && specformer train x.yaml\nextends: gpt-nano\nname: x\ndecoder: {{n_layers: {layers}}}\n")
    a, b = "runs/x/20260101-000000", "runs/x/20260102-000000"
    result = runner.invoke(app, ["diff", a, b, "-f", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["specs"] == [a, b]
    assert [(c["path"], c["values"]) for c in data["changes"]] == [("decoder.n_layers", [4, 6])]
    assert runner.invoke(app, ["validate", b]).stdout == runner.invoke(app, ["validate", f"{b}/spec.yaml"]).stdout
    assert runner.invoke(app, ["validate", "runs/x/20260102-000000/"]).exit_code == 0
    # in extends too, relative to the file that says it, and its errors point into the run's spec.yaml
    (tmp_path / "child.yaml").write_text(f"extends: {b}\nd_model: 256\n")
    assert load_spec(str(tmp_path / "child.yaml")).decoder.n_layers == 6
    (tmp_path / "runs" / "x" / "20260102-000000" / "spec.yaml").write_text("extends: gpt-nano\nd_modle: 1\n")
    result = runner.invoke(app, ["validate", b])
    assert result.exit_code == 1 and "runs/x/20260102-000000/spec.yaml:2:1: d_modle: unknown field" in result.stderr
    # the folder of a spec's runs is not one run: its latest is named
    result = runner.invoke(app, ["validate", "runs/x"])
    assert result.exit_code == 1 and "runs/x is a directory, not a YAML file" in result.stderr
    assert "this folder holds the runs of a spec, not one run: its latest is runs/x/20260102-000000 (and 1 earlier)" in result.stderr


def test_list_never_shortens_a_preset_name():
    # piped or in a narrow terminal, the names a user types next stay whole
    from specformer.specs.loader import preset_names

    result = runner.invoke(app, ["list"], env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    for name in preset_names():
        assert f" {name} " in result.stdout


@pytest.mark.parametrize("width", [60, 80, 100])
def test_list_in_a_narrow_terminal_leaves_columns_out_instead_of_cutting_cells(monkeypatch, width):
    # every cell cut to "enco…", "lay… (po…" and a size to "1.5…" was no table to read
    import io

    from rich.console import Console

    from specformer.cli import spec_cmds

    screen = io.StringIO()
    monkeypatch.setattr(spec_cmds, "console", Console(file=screen, width=width, force_terminal=True,
                                                      color_system=None))
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    out = screen.getvalue()
    table, note = out.split("┘", 1)[0], out.split("┘", 1)[1]
    assert "…" not in table and max(map(len, table.splitlines())) <= width
    assert " 1.56B " in table and " 6.74B " in table
    assert "ffn" in note and "specformer list | cat" in note.replace("\n", " ")


@pytest.mark.parametrize("width", [40, 55])
def test_list_in_a_very_narrow_terminal_shows_whole_cells(monkeypatch, width):
    # at 55 columns every kind was folded ("encode" over "r"), at 40 the layers column had no
    # width and showed no value, and d_model was spelled down the header a letter a line
    import io

    from rich.console import Console

    from specformer.cli import spec_cmds
    from specformer.specs.loader import preset_names

    screen = io.StringIO()
    monkeypatch.setattr(spec_cmds, "console", Console(file=screen, width=width, force_terminal=True,
                                                      color_system=None))
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    out = screen.getvalue()
    table, note = out.split("┘", 1)
    assert max(map(len, table.splitlines())) <= width
    header = next(line for line in table.splitlines() if "name" in line)
    shown = [cell.strip() for cell in header.strip("┃").split("┃")]
    assert shown[0] == "name" and shown[-1] == "params"
    rows = [line for line in table.splitlines() if line.startswith("│")]
    assert len(rows) == len(preset_names())  # one line a preset: no cell folded onto a second
    assert all(cell.strip() for row in rows for cell in row.strip("│").split("│"))  # no empty column
    if "kind" in shown:
        assert any("encoder-decoder" in row for row in rows)
    assert "d_model" in note and "specformer list | cat" in note.replace("\n", " ")


def test_help_examples_are_shown_verbatim():
    result = runner.invoke(app, ["schema", "--help"], env={"COLUMNS": "120"})
    assert "# yaml-language-server: $schema=specformer.schema.json" in result.stdout
    result = runner.invoke(app, ["show", "--help"], env={"COLUMNS": "120"})
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    first = lines.index("  specformer show llama2-7b --batch 8 --seq-len 2048 --dtype bf16-mixed \\")
    assert lines[first + 1] == "      --format markdown"  # a command too long for 80 columns goes on, as a shell reads it


def test_field_reference_lists_the_choices_of_a_type_field():
    from specformer.specs.reference import field_reference

    ref = field_reference()
    assert "| `type` | `sequential` \\| `parallel` | `sequential` |" in ref  # residual: one model, two choices
    assert "| `type` | `rope`" not in ref  # a registry entry's name is its table's title
    # the stack's row names both residual wirings, not the default alone
    assert "| `residual` | `{type: sequential}` \\| `{type: parallel}` | `{type: sequential}` |" in ref


def _load_through_a_pipe(fifo, text):
    """load_spec of a FIFO that a thread writes ``text`` into."""
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(text))
    writer.start()
    try:
        return load_spec(str(fifo))
    finally:
        writer.join(timeout=5)
        if writer.is_alive():  # the pipe was never read: read it, so the writer ends and the test fails
            fifo.read_text()
            writer.join()


def test_a_spec_can_come_through_a_pipe(tmp_path):
    # `... | specformer validate /dev/stdin`, or a shell's <(...): a pipe, not a regular file
    spec = _load_through_a_pipe(tmp_path / "spec.pipe", "extends: gpt-nano\nd_model: 256\n")
    assert spec.d_model == 256 and spec.decoder.n_layers == 4
    result = runner.invoke(app, ["validate", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 1 and "file not found" in result.output + result.stderr


def test_a_piped_spec_extends_a_relative_path_from_the_working_directory(tmp_path, monkeypatch):
    # a pipe has no folder of its own (/dev/stdin would resolve ./variant.yaml in /dev)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "variant.yaml").write_text("extends: gpt-nano\nd_model: 256\n")
    (tmp_path / "pipes").mkdir()
    spec = _load_through_a_pipe(tmp_path / "pipes" / "spec.pipe", "extends: ./variant.yaml\nname: z\n")
    assert (spec.name, spec.d_model) == ("z", 256)


def test_validate_in_a_terminal_never_cuts_a_long_value(monkeypatch):
    # the resolved YAML is copied from the terminal: a path longer than the line is
    # wrapped by the terminal, not cut at its edge
    import io

    from rich.console import Console

    from specformer.cli import spec_cmds

    screen = io.StringIO()
    monkeypatch.setattr(spec_cmds, "console", Console(file=screen, width=80, force_terminal=True, color_system=None))
    out_dir = "/data/experiments/" + "a-long-folder-name-for-one-sweep/" * 4 + "runs"
    result = runner.invoke(app, ["validate", "gpt-nano", "--set", f"training.out_dir={out_dir}"])
    assert result.exit_code == 0, result.output
    assert f"out_dir: {out_dir}\n" in screen.getvalue()


def test_a_hugging_face_config_is_named_as_one_with_the_command_that_converts_it(tmp_path):
    # not one "unknown field" per key of the config: what it is, and what to run
    config = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
              "vocab_size": 101, "activation_function": "gelu_new", "attn_pdrop": 0.1}
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    for args in (["validate", str(tmp_path / "config.json")], ["show", str(tmp_path / "config.json")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1
        assert "1 problem in the spec" in result.stderr
        assert f"{tmp_path / 'config.json'}:2:3: a Hugging Face config (model_type: gpt2), not a specformer spec" \
            in result.stderr
        assert f"specformer import-hf {tmp_path / 'config.json'} -o spec.yaml" in result.stderr
    # the model's folder, given where a spec goes
    result = runner.invoke(app, ["show", str(tmp_path)])
    assert result.exit_code == 1
    assert f"specformer import-hf {tmp_path} -o spec.yaml" in result.stderr
    # a spec that happens to carry a stray model_type key gets the usual field error
    (tmp_path / "mine.yaml").write_text("extends: gpt-nano\nmodel_type: gpt2\n")
    result = runner.invoke(app, ["validate", str(tmp_path / "mine.yaml")])
    assert "unknown field 'model_type'" in result.stderr


def test_a_dash_reads_the_spec_from_standard_input():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "specformer", "validate", "-"], input="extends: gpt-nano\nd_model: 64\n",
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "d_model: 64" in run.stdout
    run = subprocess.run([sys.executable, "-m", "specformer", "validate", "-"], input="extends: gpt-nano\nd_model: 6x\n",
                         capture_output=True, text=True)
    assert run.returncode == 1 and "/dev/stdin:2:1: d_model: input should be a valid integer" in run.stderr
    # read once: diff of standard input against itself with --set; twice is refused by name
    run = subprocess.run([sys.executable, "-m", "specformer", "diff", "-", "--set", "decoder.n_layers=6", "--format",
                          "json"], input="extends: gpt-nano\nd_model: 64\n", capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert [(c["path"], c["values"]) for c in json.loads(run.stdout)["changes"]] == [("decoder.n_layers", [4, 6])]
    run = subprocess.run([sys.executable, "-m", "specformer", "diff", "-", "-"], input="extends: gpt-nano\n",
                         capture_output=True, text=True)
    assert run.returncode == 2 and "standard input (-) can be read once" in run.stderr


def test_help_keeps_every_angle_bracketed_token_of_the_docstrings():
    # the help is rendered as markdown, which drops a bare <pad> or </s> as an HTML tag
    import re

    import typer.main

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        tokens = set(re.findall(r"</?[\w|-]+>", command.help or ""))
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "250"})
        shown = " ".join(result.stdout.split())
        missing = sorted(t for t in tokens if t not in shown)
        assert not missing, f"{name} --help drops {missing}"


def test_help_examples_fit_80_columns_whole():
    # a wrapped example's first line is an incomplete command, and its second a stray one
    import re

    import typer.main

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        for block in re.findall(r"```\n(.*?)```", command.help or "", flags=re.S):
            for line in block.splitlines():
                assert len(line.strip()) <= 76, f"{name} --help: an example past 80 columns: {line.strip()}"
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "80"})
        lines = result.stdout.splitlines()
        for i, line in enumerate(lines[:-1]):
            if line.startswith("  specformer ") and not line.rstrip().endswith("\\"):
                assert not re.match(r"  [^\s#s]", lines[i + 1]), f"{name} --help wraps: {line!r} / {lines[i + 1]!r}"


@pytest.mark.parametrize("columns", [80, 100, 250])
def test_help_shows_every_option_and_its_help_whole_at_any_width(columns):
    # on 80 columns (a default terminal, and output that is piped) typer's table cut long
    # names and words short: "--repetition-pen…", "(encoder-decode…"
    import typer.main

    group = typer.main.get_command(app)
    for name, command in [("", group), *group.commands.items()]:
        result = runner.invoke(app, [name, "--help"] if name else ["--help"], env={"COLUMNS": str(columns)})
        assert result.exit_code == 0, result.output
        assert "…" not in result.stdout, f"{name} --help at {columns} columns:\n{result.stdout}"
        assert max(len(line) for line in result.stdout.splitlines()) <= columns
        # a flag takes no value: typer's "--tree <bool>" reads as if it took one; and braces in
        # the usage line ("show [OPTIONS] {SPEC}") mean a choice of values, not a required argument
        assert "<bool>" not in result.stdout, f"{name} --help at {columns} columns:\n{result.stdout}"
        usage = next(line for line in result.stdout.splitlines() if "Usage:" in line)
        assert "{" not in usage, usage
        for param in command.params:
            if param.param_type_name == "argument":
                assert (param.metavar if param.required else f"[{param.metavar}") in usage, usage
        shown = "".join(result.stdout.replace("│", "").split())
        for param in command.params:
            names = [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else [param.metavar]
            for flag in names:
                assert flag in result.stdout, f"{name} --help at {columns} columns has no {flag}"
            for word in (param.help or "").replace("`", "").split():  # wrapped anywhere, markdown's marks left out
                assert word in shown, f"{name} --help at {columns} columns: {param.opts[0]}'s help lacks {word!r}"


@pytest.mark.parametrize(("argv", "said"), [
    (["train", "gpt-nano", "--batch_size=32"], "No such option: --batch_size. A spec's fields are set with --set: "
                                               "--set training.batch_size=32"),
    (["validate", "gpt-nano", "--n_layer", "6"], "--set decoder.n_layers=6"),
    (["train", "gpt-nano", "--max-iters=100"], "--set training.max_steps=100"),
    # nanoGPT's block_size is both the model's context and the length it trains at
    (["train", "gpt-nano", "--block_size=128"], "--set max_seq_len=128 --set training.seq_len=128"),
    (["train", "gpt-nano", "--dropout=0.2"], "A spec's fields are set with --set; dropout is set where it applies"),
    # nanoGPT's dtype values are training.precision's names; its bias is no one field
    (["train", "gpt-nano", "--dtype=bfloat16"], "--set training.precision=bf16-mixed"),
    (["train", "gpt-nano", "--bias=False"], "A spec's fields are set with --set; biases are set where they apply"),
    # the command's own near options are named first
    (["show", "gpt-nano", "--batch_size=8"], "No such option: --batch_size (Possible options: --batch). A spec's "
                                             "fields are set with --set: --set training.batch_size=8"),
])
def test_an_option_named_after_a_field_says_how_to_set_it(argv, said):
    # nanoGPT's configurator takes --batch_size=32; here fields are --set
    result = runner.invoke(app, argv, env={"COLUMNS": "400"})
    assert result.exit_code == 2
    text = " ".join(result.output.split()).replace("│", "").replace("  ", " ")
    assert said in " ".join(text.split()), result.output


def test_an_option_that_is_no_field_is_refused_as_before():
    for argv in (["train", "gpt-nano", "--bogus=1"], ["generate", "x", "--seq_len", "3"]):
        result = runner.invoke(app, argv, env={"COLUMNS": "400"})
        assert result.exit_code == 2 and "No such option" in result.output
        assert "--set" not in result.output.replace("--seed", "")


def test_an_option_whose_value_means_another_thing_here_is_not_copied_into_a_set():
    result = runner.invoke(app, ["train", "gpt-nano", "--min_lr=6e-5"], env={"COLUMNS": "400"})
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "min_lr_ratio" in text and "=6e-5" not in text


@pytest.mark.parametrize("split", [
    ["training.data={type:", "files,", "paths:", "[input.txt]}"],  # spaces, unquoted
    ["training.data=type:files", "training.data=paths:[input.txt]"],  # what bash's brace expansion makes
])
def test_a_set_value_the_shell_split_says_to_quote_it(split):
    result = runner.invoke(app, ["validate", "gpt-nano", "--set", *split], env={"COLUMNS": "400"})
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "Got unexpected extra argument" in text
    assert ("A --set value with spaces, commas or braces is quoted whole, or the shell splits it: "
            "--set 'training.data={type: files, paths: [input.txt]}'") in text
    plain = runner.invoke(app, ["validate", "gpt-nano", "extra"], env={"COLUMNS": "400"})
    assert plain.exit_code == 2 and "quoted whole" not in plain.output


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, whose every write fails as on a full disk")
@pytest.mark.parametrize("args", [["schema"], ["validate", "gpt-nano"], ["show", "gpt-nano"], ["list"]])
def test_an_output_that_cannot_be_written_is_one_line_not_a_traceback(args):
    """``specformer schema > file`` on a full disk: the command says the output is incomplete."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        run = subprocess.run([sys.executable, "-m", "specformer", *args], stdout=full, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 1
    assert run.stderr.startswith("error: cannot write the output (No space left on device)"), run.stderr
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, whose every write fails as on a full disk")
def test_train_into_an_output_that_cannot_be_written_says_so_as_the_other_commands_do(tmp_path):
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        run = subprocess.run([sys.executable, "-m", "specformer", "train", "gpt-nano", "--set", "training.max_steps=1"],
                             stdout=full, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                             env={**os.environ, "COLUMNS": "200", "SPECFORMER_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 1
    assert run.stderr.startswith("error: cannot write the output (No space left on device)"), run.stderr
    assert "OSError" not in run.stderr and "Traceback" not in run.stderr


def test_schema_output_makes_missing_folders_and_its_help_says_so(tmp_path):
    out = tmp_path / "new" / "deeper" / "specformer.schema.json"
    result = runner.invoke(app, ["schema", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text()) == spec_json_schema()
    for command in (["schema"], ["import-hf"], ["export-hf"]):
        text = " ".join(runner.invoke(app, [*command, "--help"], env={"COLUMNS": "300"}).stdout.split())
        assert "missing folders on its path are made" in text or "made, with any missing parents" in text, command


def test_schema_output_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    out = tmp_path / "new" / "specformer.schema.json"
    result = runner.invoke(app, ["schema", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text()) == spec_json_schema()
    assert out.read_text() == runner.invoke(app, ["schema"]).stdout  # the same text as printed

    import errno

    import specformer.data.cache as cache

    out.write_text("the schema from before\n")
    real = cache.os.fsync

    def disk_full(fd: int) -> None:  # the write reached the disk's end
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.os, "fsync", disk_full)
    result = runner.invoke(app, ["schema", "-o", str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr == (f"error: --output {out}: cannot write (No space left on device); nothing was written; "
                             "the file from before is as it was\n")
    assert out.read_text() == "the schema from before\n"
    assert [f.name for f in out.parent.iterdir()] == [out.name]  # no temporary file left beside it
    monkeypatch.setattr(cache.os, "fsync", real)

    (tmp_path / "afile").write_text("")
    for bad, said in [(tmp_path, "is a folder"), (tmp_path / "afile" / "x.json", "afile is a file, not a folder")]:
        result = runner.invoke(app, ["schema", "-o", str(bad)], env={"COLUMNS": "300"})
        assert result.exit_code == 1 and said in result.stderr, result.output


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_schema_output_through_a_link_or_into_a_pipe_keeps_it_what_it_is(tmp_path):
    """A symbolic link stays one (the file it points to gets the schema), and a pipe or a
    device (/dev/null, /dev/stdout) is written as it is: a file renamed over it would replace
    it, /dev/null included when run as root."""
    (tmp_path / "real.json").write_text("old\n")
    (tmp_path / "link.json").symlink_to("real.json")
    result = runner.invoke(app, ["schema", "-o", str(tmp_path / "link.json")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "link.json").is_symlink()
    assert json.loads((tmp_path / "real.json").read_text()) == spec_json_schema()

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    got: list[bytes] = []

    def read() -> None:
        with open(pipe, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    result = runner.invoke(app, ["schema", "-o", str(pipe)])
    reader.join(10)
    assert result.exit_code == 0, result.output
    assert pipe.is_fifo() and json.loads(got[0]) == spec_json_schema()
    assert "wrote" not in result.stdout  # the schema alone goes down a pipe (-o /dev/stdout)
    # a pipe whose reader stops (-o /dev/stdout | head): quiet, as a closed standard output is
    def read_a_little() -> None:
        with open(pipe, "rb") as f:
            got.append(f.read(10))

    reader = threading.Thread(target=read_a_little, daemon=True)
    reader.start()
    result = runner.invoke(app, ["schema", "-o", str(pipe)])
    reader.join(10)
    assert result.exit_code == 0 and result.output == "", result.output
    assert got[-1] == b'{\n  "$defs'[:10]
