"""The train, generate, eval and fill-mask commands: outputs for people, errors without tracebacks."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from specformer.cli import app

runner = CliRunner()


def _write(tmp_path: Path, data: dict[str, Any], name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _train(args: list[str]) -> Any:
    result = runner.invoke(app, ["train", *args, "--no-progress"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result


def _checkpoint(tmp_path: Path, name: str) -> Path:
    found = sorted((tmp_path / "runs" / name).glob("*/checkpoints/last.ckpt"))
    assert found
    return found[-1]


def test_train_then_generate_and_eval_a_decoder(tiny: Any, tmp_path: Path) -> None:
    spec = _write(tmp_path, tiny("decoder", max_steps=10, val_interval=5))
    result = _train([str(spec), "--set", "training.max_steps=12"])
    out = result.output
    # the size of the model first, as nanoGPT says it, counted as show counts it
    from specformer import load_spec
    from specformer.analysis import count_parameters

    n = count_parameters(load_spec(spec)).total
    assert out.startswith(f"training tiny-decoder (decoder, {n:,} parameters) — preparing data…")
    # without the bar, each validation still leaves its line (steps 5, 10 and the last, 12), on
    # stdout with the summary where that is no terminal: train ... > log keeps the curve
    lines = [line for line in result.stdout.splitlines() if "val loss" in line and line.startswith("step")]
    assert not [line for line in result.stderr.splitlines() if "val loss" in line]
    assert [line.split("train loss")[0].split() for line in lines] == [["step", "5"], ["step", "10"], ["step", "12"]]
    # the training loss beside the validation loss, as nanoGPT prints them: at the last step, the summary's
    summary = json.loads(next((tmp_path / "runs" / "tiny-decoder").glob("*/summary.json")).read_text())
    assert lines[-1].split("train loss")[1].split()[0] == f"{summary['train_loss']:.4f}"
    assert lines[-1].split("val loss")[1].split()[0] == f"{summary['val_loss']:.4f}"
    # every key of summary.json is in the docs' list of them
    docs = (Path(__file__).parents[2] / "docs" / "training.md").read_text()
    keys = docs[docs.index("`summary.json`'s keys"):].split("\n\n", 1)[0]
    assert [key for key in summary if f"`{key}`" not in keys] == []
    assert summary["tokens_per_second"] == pytest.approx(
        summary["run_tokens"] / (summary["train_seconds"] - summary["val_seconds"] - summary["compile_seconds"]))
    for label in ("val loss", "val perplexity", "unigram baseline", "tokens/s", "wall time", "checkpoint"):
        assert label in out
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    assert "steps" in out and " 12 " in out
    # the paths one copies next are printed whole, however narrow the output
    assert f"checkpoint {ckpt}" in out.replace("\n", " ") and str(ckpt) in out.splitlines()[-2]
    assert out.splitlines()[-1].endswith("metrics.csv")

    gen = runner.invoke(app, ["generate", str(ckpt), "--prompt", "def ", "-n", "20", "--greedy"])
    assert gen.exit_code == 0, gen.output
    assert gen.output.startswith("def ")
    again = runner.invoke(app, ["generate", str(ckpt), "--prompt", "def ", "-n", "20", "--greedy", "--no-cache"])
    assert again.output == gen.output

    sampled = runner.invoke(app, ["generate", str(ckpt.parent.parent), "-p", "import", "--top-k", "5", "--top-p", "0.9"])
    assert sampled.exit_code == 0, sampled.output
    zero = runner.invoke(app, ["generate", str(ckpt), "-p", "import", "--top-p", "0"])
    assert zero.exit_code == 2 and "'--top-p': 0 is not in the range 0<x<=1" in zero.stderr, zero.output
    assert "--greedy" in zero.stderr
    eot = runner.invoke(app, ["generate", str(ckpt), "-p", "import", "-n", "200", "--stop-at-eot", "--seed", "1"])
    assert eot.exit_code == 0, eot.output
    beams = runner.invoke(app, ["generate", str(ckpt), "--prompt", "def", "-n", "12", "--num-beams", "3"])
    assert beams.exit_code == 0, beams.output
    from specformer.training import beam_search, generate, load_checkpoint

    loaded = load_checkpoint(ckpt)
    ids = loaded.tokenizer.encode("def")
    found = beam_search(loaded.model, torch.tensor([ids]), num_beams=3, max_new_tokens=12, eos_id=None)
    assert beams.stdout.rstrip("\n") == loaded.tokenizer.decode(found[0].tolist())
    mixed = runner.invoke(app, ["generate", str(ckpt), "-p", "def", "--num-beams", "3", "--top-k", "5"])
    assert mixed.exit_code == 1 and "--num-beams searches for the most likely text" in mixed.stderr
    assert "leave out --top-k" in mixed.stderr
    fresh = runner.invoke(app, ["generate", str(ckpt), "-p", "def", "-n", "12", "--greedy", "--repetition-penalty",
                                "1.3", "--no-repeat-ngram", "2"])
    assert fresh.exit_code == 0, fresh.output
    expected = generate(loaded.model, torch.tensor([ids]), max_new_tokens=12, temperature=0.0,
                        repetition_penalty=1.3, no_repeat_ngram_size=2)
    assert fresh.stdout.rstrip("\n") == loaded.tokenizer.decode(expected[0].tolist())
    zero = runner.invoke(app, ["generate", str(ckpt), "-p", "def", "--repetition-penalty", "0"])
    assert zero.exit_code == 2 and "'--repetition-penalty': 0 is not in the range x>0" in zero.stderr, zero.output
    alone = runner.invoke(app, ["generate", str(ckpt), "-p", "def", "--length-penalty", "2"])
    assert alone.exit_code == 1 and "add --num-beams" in alone.stderr
    # several samples, as nanoGPT's sample.py draws them: the first is the one --seed draws alone, the
    # next go on from the same generator
    one = runner.invoke(app, ["generate", str(ckpt), "-p", "import", "-n", "10", "--seed", "4"])
    three = runner.invoke(app, ["generate", str(ckpt), "-p", "import", "-n", "10", "--seed", "4", "--num-samples", "3"])
    assert three.exit_code == 0, three.output
    texts = three.stdout.split("---------------\n")
    assert len(texts) == 3 and texts[0] == one.stdout and len(set(texts)) > 1
    assert all(text.startswith("import") for text in texts)
    same = runner.invoke(app, ["generate", str(ckpt), "-p", "def", "--greedy", "--num-samples", "2"])
    assert same.exit_code == 1 and "--greedy gives the same text each time" in same.stderr
    beams = runner.invoke(app, ["generate", str(ckpt), "-p", "def", "--num-beams", "2", "--num-samples", "2"])
    assert beams.exit_code == 1 and "leave out --num-beams to sample" in beams.stderr

    ev = runner.invoke(app, ["eval", str(ckpt), "--batches", "2"], env={"COLUMNS": "200"})
    assert ev.exit_code == 0, ev.output
    assert "val loss" in ev.output and "at step 12" in ev.output
    quiet = runner.invoke(app, ["eval", str(ckpt), "--batches", "2", "--no-progress"], env={"COLUMNS": "200"})
    assert quiet.exit_code == 0 and quiet.stdout == ev.stdout, quiet.output  # as train and classify take it


def test_generate_lays_out_the_weights_for_decoding_one_row_at_a_time(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specformer.components import layout

    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2))
    _train([str(spec)])
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    calls: list[tuple[int, bool]] = []
    real = layout.lay_out_for_decoding

    def recorded(model: Any, rows: int = 1, *, measure: bool = True) -> int:
        moved = real(model, rows=rows, measure=measure)
        calls.append((rows, measure, any(type(m) is layout.DecodingLinear for m in model.modules())))
        return moved

    monkeypatch.setattr(layout, "lay_out_for_decoding", recorded)
    outputs = {}
    for args in (["--greedy"], ["--greedy", "--no-cache"], ["--num-beams", "2"], ["--num-beams", "3"]):
        before = len(calls)
        result = runner.invoke(app, ["generate", str(ckpt), "--prompt", "def", "-n", "8", *args])
        assert result.exit_code == 0, result.output
        outputs[" ".join(args)] = (result.output, calls[before:])
    # once, for the rows of a step, measuring what this machine decodes faster
    assert outputs["--greedy"][1] == [(1, True, True)]
    assert outputs["--num-beams 2"][1] == [(2, True, True)]
    assert outputs["--num-beams 3"][1] == [(3, True, True)]
    assert outputs["--greedy --no-cache"][1] == []
    assert outputs["--greedy"][0] == outputs["--greedy --no-cache"][0]  # the same text either way


def test_eval_says_how_many_tokens_it_scored_and_whether_that_was_the_whole_split(tiny: Any, tmp_path: Path) -> None:
    import re

    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2))
    _train([str(spec)])
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    part = runner.invoke(app, ["eval", str(ckpt), "--batches", "1"], env={"COLUMNS": "200"})
    assert part.exit_code == 0, part.output
    held = int(re.search(r"scored +│ 256 tokens \(8 of the (\d+) held-out sequences: --batches reads more\)",
                         part.output).group(1))
    assert held > 8
    whole = runner.invoke(app, ["eval", str(ckpt), "--batches", "1000"], env={"COLUMNS": "200"})
    assert whole.exit_code == 0, whole.output
    # a causal block of seq_len=32 scores its 32 next tokens
    assert f"scored           │ {held * 32:,} tokens (all {held} held-out sequences)" in whole.output
    # the same numbers as one JSON object on standard output, for scripts
    js = runner.invoke(app, ["eval", str(ckpt), "--batches", "1", "-f", "json", "--no-progress"])
    assert js.exit_code == 0, js.output
    got = json.loads(js.stdout)
    loss = next(line for line in part.stdout.splitlines() if "val loss" in line).split("│")[2].strip()
    assert f"{got['val_loss']:.4f}" == loss and got["val_ppl"] == pytest.approx(math.exp(got["val_loss"]))
    assert (got["scored_tokens"], got["held_out"], got["held_out_unit"], got["whole_split"]) == (256, held, "sequence", False)
    assert got["step"] == 2 and got["checkpoint"] == str(ckpt) and got["interrupted"] is False
    assert got["unigram_loss"] > 0 and got["accuracy"] is None and got["exact_match"] is None
    assert json.loads(runner.invoke(app, ["eval", str(ckpt), "--batches", "1000", "-f", "json"]).stdout)["whole_split"]
    bad = runner.invoke(app, ["eval", str(ckpt), "-f", "yaml"])
    assert bad.exit_code == 2 and "--format must be rich or json, got 'yaml'" in bad.stderr


def test_training_file_and_set_overrides(tiny: Any, tmp_path: Path) -> None:
    data = tiny("decoder")
    spec = _write(tmp_path, data)
    _write(tmp_path, {"training": {"max_steps": 3, "val_interval": 3, "batch_size": 4}}, "fast.yaml")
    _train([str(spec), "--training", str(tmp_path / "fast.yaml"), "--set", "training.max_steps=4"])
    run = next((tmp_path / "runs" / "tiny-decoder").iterdir())
    resolved = yaml.safe_load((run / "spec.yaml").read_text())
    assert resolved["training"]["batch_size"] == 4  # from the file
    assert resolved["training"]["max_steps"] == 4  # --set wins over the file
    assert resolved["training"]["data"]["type"] == "files"  # untouched settings stay


def test_run_folder_records_the_command_working_directory_and_versions(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # spec.yaml and the seed in it are not all it takes to run a run again: the command (a
    # --training file, --init-from weights), the folder its relative paths are read from and the
    # versions; before, a run folder held none of them
    import lightning

    from specformer import __version__, load_spec

    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2))
    args = ["train", "spec.yaml", "--set", "training.seed=3", "--set", "training.max_steps=2", "--no-progress"]
    monkeypatch.setattr(sys, "argv", ["/some/where/specformer", *args])  # what the shell handed on
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    run = next((tmp_path / "runs" / "tiny-decoder").iterdir())
    command = "specformer train spec.yaml --set training.seed=3 --set training.max_steps=2 --no-progress"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["command"] == command and summary["workdir"] == str(tmp_path)
    assert summary["overrides"] == ["training.seed=3", "training.max_steps=2"]  # what this variant changed
    assert summary["versions"]["specformer"] == __version__ and summary["versions"]["torch"] == torch.__version__
    assert summary["versions"]["lightning"] == lightning.__version__
    head = (run / "spec.yaml").read_text().splitlines()[:2]
    assert head[0] == f"# cd {tmp_path} && {command}"
    assert head[1].startswith("# python ") and f"specformer {__version__}, torch {torch.__version__}" in head[1]
    # comments: the file is still the spec that ran
    assert load_spec(str(run / "spec.yaml")) == load_spec(str(spec), overrides=["training.seed=3", "training.max_steps=2"])


def test_resume_from_the_command_line_without_a_spec(tiny: Any, tmp_path: Path) -> None:
    spec = _write(tmp_path, tiny("decoder", max_steps=4, val_interval=4))
    _train([str(spec)])
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    out = _train(["--resume", str(ckpt), "--set", "training.max_steps=6"]).output
    assert "(resumed: see below)" in out and " 6 " in out
    assert f"resumed    {ckpt}\n" in out  # the whole path, on its own line
    # the header comes before the note on what the resumed run changes
    assert out.index("preparing data…") < out.index("resuming at step 4 with other training settings")
    # a resume that is refused says why, and not that it is starting
    done = runner.invoke(app, ["train", "--resume", str(ckpt), "--no-progress"], env={"COLUMNS": "200"})
    assert done.exit_code == 1 and "nothing left to train" in done.stderr, done.output
    assert "preparing data" not in done.output and "training tiny-decoder" not in done.output
    # a checkpoint of a type not registered here (a plugin's): said with what to do
    raw = torch.load(ckpt, weights_only=False)
    raw["specformer"]["spec"]["decoder"]["ffn"] = {"type": "relu2", "d_ff": 64}
    torch.save(raw, tmp_path / "plugin.ckpt")
    plugin = runner.invoke(app, ["train", "--resume", str(tmp_path / "plugin.ckpt"), "--no-progress"])
    said = " ".join(plugin.stderr.split())
    assert plugin.exit_code == 1 and "decoder.ffn.type: unknown type 'relu2'" in said, plugin.output
    assert "install the plugin" in said
    other = _write(tmp_path, {**tiny("decoder", max_steps=4, val_interval=4), "d_model": 48}, "other.yaml")
    refused = runner.invoke(app, ["train", str(other), "--init-from", str(ckpt), "--no-progress"])
    assert refused.exit_code == 1 and "preparing data" not in refused.output, refused.output


def test_init_from_on_the_command_line_and_not_with_resume(tiny: Any, tmp_path: Path) -> None:
    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2))
    _train([str(spec)])
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    out = _train([str(spec), "--init-from", str(ckpt)]).output
    assert "resumed" not in out and "(from the weights below)" in out
    assert f"weights    {ckpt}\n" in out
    both = runner.invoke(app, ["train", str(spec), "--init-from", str(ckpt), "--resume", str(ckpt)])
    assert both.exit_code == 1 and "give --resume or --init-from, not both" in both.stderr


def test_an_encoder_decoder_output_that_ends_at_once_is_said_to(tiny: Any, tmp_path: Path, monkeypatch) -> None:
    import importlib

    gen = importlib.import_module("specformer.training.generate")  # the module, not its generate()
    _train([str(_write(tmp_path, tiny("encoder-decoder", max_steps=1, val_interval=1, val_batches=1), "s2s.yaml"))])
    s2s = _checkpoint(tmp_path, "tiny-encoder-decoder")

    def ends_at_once(model, ids, *, eos_id, on_token, **kwargs):  # an undertrained model's first token
        on_token(torch.tensor([eos_id]))
        return torch.tensor([[eos_id]])

    monkeypatch.setattr(gen, "generate_seq2seq", ends_at_once)
    out = runner.invoke(app, ["generate", str(s2s), "--prompt", "abc", "--greedy"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert out.stdout == "\n"
    assert "note: the output is empty: the model's first token was its end token" in out.stderr

    # a model that repeats a token with no text (its start token, which decodes to nothing)
    # prints an empty line too: the note says which tokens it made
    from specformer.training import load_checkpoint

    tok = load_checkpoint(s2s).tokenizer
    silent = next(i for i in sorted(tok.special_ids) if tok.decode([i]) == "" and i != tok.eos_id)

    def repeats(model, ids, *, eos_id, on_token, max_new_tokens, **kwargs):
        for _ in range(max_new_tokens):
            on_token(torch.tensor([silent]))
        return torch.full((1, max_new_tokens), silent)

    monkeypatch.setattr(gen, "generate_seq2seq", repeats)
    out = runner.invoke(app, ["generate", str(s2s), "--prompt", "abc", "-n", "7"], env={"COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    assert out.stdout == "\n"
    assert (f"note: the output is empty: the model's 7 tokens have no text (id {silent} ×7: tokens the tokenizer "
            "decodes to nothing") in " ".join(out.stderr.split())

    # sampling that the learned positions cut short of -n says so, as beam search does
    letter = tok.encode("a")[-1]

    def to_the_cap(model, ids, *, eos_id, on_token, max_new_tokens, max_len, **kwargs):
        n = min(max_new_tokens, max_len - 1) if max_len is not None else max_new_tokens
        for _ in range(n):
            on_token(torch.tensor([letter]))
        return torch.full((1, n), letter)

    monkeypatch.setattr(gen, "generate_seq2seq", to_the_cap)
    for n, said in ((100, True), (10, False)):
        out = runner.invoke(app, ["generate", str(s2s), "--prompt", "abc", "-n", str(n)], env={"COLUMNS": "300"})
        assert out.exit_code == 0, out.output
        cut = "the decoder's learned positions end at max_seq_len=64: the text stopped at 63 of the 100 tokens"
        assert (cut in " ".join(out.stderr.split())) is said, out.stderr


def test_fill_mask_and_seq2seq_generation(tiny: Any, tmp_path: Path) -> None:
    _train([str(_write(tmp_path, tiny("encoder", max_steps=4, val_interval=4), "enc.yaml"))])
    ckpt = _checkpoint(tmp_path, "tiny-encoder")
    result = runner.invoke(app, ["fill-mask", str(ckpt), "import <mask>s", "-k", "3"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<mask> 1 of 1" in result.output and "filled:" in result.output
    no_mask = runner.invoke(app, ["fill-mask", str(ckpt), "no placeholder"])
    assert no_mask.exit_code == 1 and "no <mask> or [MASK] placeholder" in no_mask.output
    shouted = runner.invoke(app, ["fill-mask", str(ckpt), "import <MASK>s"])
    assert shouted.exit_code == 1 and "(<MASK> is not one: the placeholders are spelled so" in " ".join(
        shouted.output.split())
    # the tiny model's learned table has 64 positions; the byte tokenizer reads 100 bytes as 100 tokens
    long = runner.invoke(app, ["fill-mask", str(ckpt), "x" * 100 + " <mask>"], env={"COLUMNS": "200"})
    assert long.exit_code == 1 and "tokens long and the model reads at most 64" in long.output, long.output

    _train([str(_write(tmp_path, tiny("encoder-decoder", max_steps=4, val_interval=4), "s2s.yaml"))])
    s2s = _checkpoint(tmp_path, "tiny-encoder-decoder")
    out = runner.invoke(app, ["generate", str(s2s), "--prompt", "abc", "-n", "8"])
    assert out.exit_code == 0, out.output
    beams = runner.invoke(app, ["generate", str(s2s), "--prompt", "abc", "-n", "8", "--num-beams", "3"])
    assert beams.exit_code == 0, beams.output
    one = runner.invoke(app, ["generate", str(s2s), "--prompt", "abc", "-n", "8", "--num-beams", "3",
                              "--length-penalty", "0"])
    assert one.exit_code == 0, one.output
    from specformer.data.tokenizers import decoder_start_id
    from specformer.training import beam_search, load_checkpoint

    loaded = load_checkpoint(s2s)
    tok = loaded.tokenizer
    found = beam_search(loaded.model, torch.tensor([tok.with_template(tok.encode("abc"))]), num_beams=3,
                        max_new_tokens=8, eos_id=tok.eos_id, start_id=decoder_start_id(tok, loaded.spec.training.objective))
    row = found[0].tolist()
    assert beams.stdout == tok.decode(row[: row.index(tok.eos_id)] if tok.eos_id in row else row) + "\n"
    # --top-k or --top-p asks an encoder-decoder, greedy by default, to sample (they went unused)
    import importlib

    generation = importlib.import_module("specformer.training.generate")  # the module, not its function
    asked: list[float] = []
    sample = generation.sample_next

    def spy(logits: Any, temperature: float = 1.0, **kwargs: Any) -> Any:
        asked.append(temperature)
        return sample(logits, temperature=temperature, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generation, "sample_next", spy)
        for extra, want in ((["--top-k", "5"], 1.0), (["--top-p", "0.9"], 1.0), ([], 0.0),
                            (["--top-k", "5", "--temperature", "0.5"], 0.5)):
            asked.clear()
            sampled = runner.invoke(app, ["generate", str(s2s), "--prompt", "abc", "-n", "3", *extra])
            assert sampled.exit_code == 0, sampled.output
            assert set(asked) == {want}, (extra, asked)
    huge = runner.invoke(app, ["generate", str(s2s), "--prompt", "abc", "--seed", "99999999999999999999"])
    assert huge.exit_code == 2 and "--seed" in huge.output  # a usage error, not a traceback
    assert "warning" not in out.stderr
    # the task alphabet is a-z: other characters read as <unk>, which is said, not silent
    odd = runner.invoke(app, ["generate", str(s2s), "--prompt", "aBC!", "-n", "8"], env={"COLUMNS": "200"})
    assert odd.exit_code == 0, odd.output
    assert "characters this tokenizer does not have, read as <unk>: '!', 'B', 'C'" in odd.stderr
    wrong = runner.invoke(app, ["fill-mask", str(s2s), "a <mask>"])
    assert wrong.exit_code == 1 and "needs an encoder" in wrong.output
    assert "this checkpoint is an encoder-decoder" in wrong.output


def test_a_prompt_longer_than_max_seq_len_is_said(tiny: Any, tmp_path: Path) -> None:
    # a decoder reads the last max_seq_len tokens of it (64; the byte tokenizer reads 100
    # characters as 100 tokens); a shorter prompt is no warning
    _train([str(_write(tmp_path, tiny("decoder", max_steps=1, val_interval=1, val_batches=1), "dec.yaml"))])
    dec = _checkpoint(tmp_path, "tiny-decoder")
    long = runner.invoke(app, ["generate", str(dec), "--prompt", "x" * 100, "-n", "2"], env={"COLUMNS": "300"})
    assert long.exit_code == 0, long.output
    assert long.stderr == ("warning: the prompt is 100 tokens and the model reads at most max_seq_len=64 at once: "
                           "only its last 64 are read (the context slides, as it does while generating)\n")
    assert long.stdout.startswith("x" * 100)
    short = runner.invoke(app, ["generate", str(dec), "--prompt", "x" * 64, "-n", "2"])
    assert short.exit_code == 0 and "warning" not in short.stderr
    # an encoder-decoder with relative positions reads it all, past what it was built for
    spec = {**tiny("encoder-decoder", max_steps=1, val_interval=1, val_batches=1), "positional": {"type": "t5"}}
    _train([str(_write(tmp_path, spec, "s2s.yaml"))])
    s2s = _checkpoint(tmp_path, "tiny-encoder-decoder")
    long = runner.invoke(app, ["generate", str(s2s), "--prompt", "abc" * 30, "-n", "2"], env={"COLUMNS": "300"})
    assert long.exit_code == 0, long.output
    assert long.stderr.startswith("warning: the prompt is 9")  # the task tokenizer frames the 90 letters
    assert ("longer than max_seq_len=64: the encoder reads all of them (t5 positions reach past it), but the model "
            "was built for 64 tokens and trained on sources cut to training.seq_len=32") in long.stderr
    # fill-mask with an encoder of rotary positions: the same
    spec = {**tiny("encoder", max_steps=1, val_interval=1, val_batches=1), "positional": {"type": "rope"}}
    _train([str(_write(tmp_path, spec, "enc.yaml"))])
    enc = _checkpoint(tmp_path, "tiny-encoder")
    long = runner.invoke(app, ["fill-mask", str(enc), "x" * 100 + " <mask>"], env={"COLUMNS": "300"})
    assert long.exit_code == 0, long.output
    assert long.stderr == ("warning: the text is 102 tokens, longer than max_seq_len=64: the encoder reads all of "
                           "them (rope positions reach past it), but the model was built for 64 tokens and trained "
                           "on blocks of training.seq_len=32\n")
    short = runner.invoke(app, ["fill-mask", str(enc), "x <mask>"])
    assert short.exit_code == 0 and "warning" not in short.stderr


def test_fill_mask_offers_only_ids_the_tokenizer_has(tiny: Any, tmp_path: Path) -> None:
    import re

    # the byte tokenizer has 259 ids, the model's vocabulary 300: ids 259-299 have no text
    _train([str(_write(tmp_path, tiny("encoder", max_steps=1, val_interval=1, val_batches=1), "enc.yaml"))])
    ckpt = _checkpoint(tmp_path, "tiny-encoder")
    result = runner.invoke(app, ["fill-mask", str(ckpt), "import <mask>", "-k", "1000"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    ranks = [int(r) for r in re.findall(r"^│\s+(\d+) │", result.output, flags=re.MULTILINE)]
    assert ranks == list(range(1, 260))


@pytest.mark.parametrize(
    "args,message",
    [
        (["generate", "missing.ckpt"], "no such checkpoint"),
        (["eval", "garbage.ckpt"], "garbage.ckpt is not a specformer checkpoint: it is not a torch zip file"),
        (["eval", "my-variant.yaml"], "my-variant.yaml is a spec, not a checkpoint"),
        (["generate", "my-variant.yml"], "written by `specformer train`"),
        (["generate", "gpt-nano", "-p", "def"], "gpt-nano is a preset spec, not a checkpoint"),
        # the spec a run keeps: that run is meant
        (["generate", "runs/r/spec.yaml"], "runs/r/spec.yaml is the spec of the run runs/r, not a checkpoint: give "
                                           "the run folder runs/r (or its checkpoints/last.ckpt)"),
        (["train"], "give a SPEC"),
        (["train", "gpt-nano", "--training", "nofile.yaml"], "--training nofile.yaml: file not found (in "),
        (["train", "gpt-nano", "--set", "training.precision=8"], "'8' is not allowed"),
        (["train", "gpt-nano", "--set", "training.objective.type=seq2seq"], "does not train a decoder"),
        (["train", "gpt-nano", "--resume", "garbage.ckpt"], "not a specformer checkpoint"),
        (["eval", "random.ckpt"], "it is not a torch zip file (truncated or not a checkpoint)"),
        (["eval", "truncated.ckpt"], "the zip archive is truncated or damaged"),
        # a repository cloned without Git LFS holds a few lines of text in place of each large file
        (["eval", "lfs.ckpt"], "lfs.ckpt is a Git LFS pointer, not the file itself (the repository was cloned "
                               "without Git LFS): fetch the file with `git lfs pull`"),
        (["eval", "lfs.safetensors", "--spec", "gpt-nano"], "lfs.safetensors is a Git LFS pointer"),
        (["train", "gpt-nano", "--init-from", "lfs.safetensors"], "lfs.safetensors is a Git LFS pointer"),
    ],
)
def test_errors_are_one_clear_message(tmp_path: Path, args: list[str], message: str) -> None:
    import torch

    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 548105171\n"
    (tmp_path / "lfs.ckpt").write_bytes(pointer)
    (tmp_path / "lfs.safetensors").write_bytes(pointer)
    (tmp_path / "garbage.ckpt").write_bytes(b"\x00" * 100)
    (tmp_path / "random.ckpt").write_bytes(os.urandom(4096))
    torch.save({"state_dict": {"w": torch.zeros(1000)}}, tmp_path / "whole.ckpt")
    (tmp_path / "truncated.ckpt").write_bytes((tmp_path / "whole.ckpt").read_bytes()[:3000])
    (tmp_path / "my-variant.yaml").write_text("extends: gpt-nano\nd_model: 64\n")
    (tmp_path / "my-variant.yml").write_text("extends: gpt-nano\n")
    (tmp_path / "runs" / "r" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "spec.yaml").write_text("extends: gpt-nano\n")
    torch.save({"state_dict": {}}, tmp_path / "runs" / "r" / "checkpoints" / "last.ckpt")
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    # torch's advice to load without weights_only is unsafe, and its message is cut mid-sentence here
    assert "weights_only" not in result.output and "Re-running" not in result.output


def test_a_training_file_error_points_into_the_file(tiny: Any, tmp_path: Path) -> None:
    (tmp_path / "tr.yaml").write_text("max_steps: 3\nbatch_sise: 4\n")
    result = runner.invoke(app, ["train", "gpt-nano", "--training", "tr.yaml"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "tr.yaml:2:1: training.batch_sise: unknown field" in result.output
    assert "did you mean 'batch_size'?" in result.output

    # the same with the section under a top-level training: key, nested, and with --resume
    (tmp_path / "nested.yaml").write_text("training:\n  optimizer:\n    lr: 0.1\n    bettas: [0.9, 0.95]\n")
    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2)))])
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    for args in (["gpt-nano"], ["--resume", str(ckpt)]):
        result = runner.invoke(app, ["train", *args, "-t", "nested.yaml"], env={"COLUMNS": "200"})
        assert result.exit_code == 1, result.output
        assert "nested.yaml:4:5: training.optimizer.bettas: unknown field" in result.output
        assert "did you mean 'betas'?" in result.output

    (tmp_path / "latin1.yaml").write_bytes("max_steps: 3  # réglage\n".encode("latin-1"))
    result = runner.invoke(app, ["train", "gpt-nano", "--training", "latin1.yaml"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "latin1.yaml:1:18: not UTF-8 text" in result.output
    assert "UnicodeDecodeError" not in result.output and "Traceback" not in result.output

    # a whole spec as the training file: its training section is taken, the rest left alone
    (tmp_path / "whole.yaml").write_text("extends: gpt-nano\nname: other\ntraining:\n  max_steps: 2\n  lr_typo: 1\n")
    result = runner.invoke(app, ["train", "gpt-nano", "--training", "whole.yaml"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "whole.yaml:5:3: training.lr_typo: unknown field" in result.output
    assert "extends" not in result.output and "training.name" not in result.output
    assert "note" not in result.output  # a whole spec: its model fields are plainly not the point
    # model fields beside a training section, in a file that is no whole spec: said, not dropped silently
    (tmp_path / "part.yaml").write_text("training:\n  max_steps: 2\n  lr_typo: 1\nd_model: 64\n")
    result = runner.invoke(app, ["train", "gpt-nano", "--training", "part.yaml"], env={"COLUMNS": "300"})
    assert ("note: --training part.yaml reads its training: section alone; d_model (line 4) left as the spec has "
            "it") in result.output
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["train", "gpt-nano", "--training", str(tmp_path / "empty")], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "a folder, not a YAML file" in result.output
    assert "--training takes a file with a training: section" in result.output
    assert "or a run folder (its spec.yaml)" in result.output
    # a run folder is its spec.yaml, whose training section is taken
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "spec.yaml").write_text("extends: gpt-nano\ntraining:\n  max_steps: 2\n  lr_typo: 1\n")
    result = runner.invoke(app, ["train", "gpt-nano", "--training", str(tmp_path / "run")], env={"COLUMNS": "300"})
    assert result.exit_code == 1, result.output
    assert f"{tmp_path / 'run' / 'spec.yaml'}:4:3: training.lr_typo: unknown field" in result.output


def test_ctrl_c_exits_130_and_says_how_to_resume(tiny: Any, tmp_path: Path, child_env: dict[str, str]) -> None:
    from specformer.training.checkpoint import load_checkpoint

    # a run that would go on for a long time, checkpointing every 2 steps
    spec = _write(tmp_path, tiny("decoder", max_steps=100_000, val_interval=4, checkpoint_interval=2))
    env = {**child_env, "COLUMNS": "400"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specformer", "train", str(spec), "--no-progress"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a child inherits an ignored SIGINT (as Lightning leaves it after a Ctrl-C); start from the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "runs").glob("*/*/checkpoints/last.ckpt")):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    assert "error: interrupted at step " in err
    assert f") is {ckpt}" in err
    assert f"resume with: specformer train --resume {ckpt}" in err
    assert not list(ckpt.parent.glob("*.tmp"))  # nothing half-written
    step = load_checkpoint(ckpt).step
    assert step >= 2 and step % 2 == 0
    assert f"last checkpoint (step {step})" in err

    out = _train(["--resume", str(ckpt), "--set", f"training.max_steps={step + 2}"]).output
    assert f"resumed    {ckpt}" in out and f" {step + 2} " in out


def test_the_resume_hint_repeats_the_settings_a_resumed_run_had_not_yet_checkpointed(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # stopped before its own first checkpoint, a resumed run names the checkpoint it resumed from, which
    # holds the settings before this run's --set: the hint gives them again; a checkpoint of its own holds them
    from specformer.training import run

    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2))
    _train([str(spec)])
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    new_run = tmp_path / "runs" / "tiny-decoder" / "later"

    def stopped(at: Path) -> Any:
        def fake_train(*args: Any, **kwargs: Any) -> None:
            raise run.TrainingInterrupted(5, str(at), 2 if at == ckpt else 4, str(new_run))
        return fake_train

    monkeypatch.setattr(run, "train", stopped(ckpt))
    args = ["train", "--resume", str(ckpt), "--set", "training.max_steps=9", "--set", "training.optimizer.lr=1e-4"]
    result = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 130
    assert (f"resume with: specformer train --resume {ckpt} --set training.max_steps=9 "
            "--set training.optimizer.lr=1e-4\n") in result.stderr
    monkeypatch.setattr(run, "train", stopped(new_run / "checkpoints" / "last.ckpt"))
    result = runner.invoke(app, [*args, "--training", str(spec)], env={"COLUMNS": "400"})
    assert f"resume with: specformer train --resume {new_run / 'checkpoints' / 'last.ckpt'}\n" in result.stderr


def test_sigterm_exits_143_with_a_checkpoint_of_the_step_reached(tiny: Any, tmp_path: Path, child_env: dict[str, str]) -> None:
    # kill, timeout, docker stop and a scheduler's preemption send SIGTERM: the run saves the
    # step it reached and says how to go on, with the shell's status for SIGTERM (128 + 15)
    from specformer.training.checkpoint import load_checkpoint

    spec = _write(tmp_path, tiny("decoder", max_steps=100_000, val_interval=1000, checkpoint_interval=1000))
    env = {**child_env, "COLUMNS": "400"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specformer", "train", str(spec), "--no-progress"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "runs").glob("*/*/metrics.csv")):  # training has begun
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.05)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    step = load_checkpoint(ckpt).step
    assert step > 0  # long before the first checkpoint_interval: written on SIGTERM
    assert f"error: stopped by SIGTERM at step {step}; the last checkpoint (step {step}) is {ckpt}" in err
    assert f"resume with: specformer train --resume {ckpt}" in err
    assert not list(ckpt.parent.glob(".*"))  # nothing half-written


def test_sigterm_before_training_is_said_and_exits_143(tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specformer.data.module import SpecDataModule

    def terminated_while_preparing(self: Any, stage: str | None = None) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(SpecDataModule, "setup", terminated_while_preparing)
    spec = _write(tmp_path, tiny("decoder", max_steps=2))
    before = signal.getsignal(signal.SIGTERM)
    result = runner.invoke(app, ["train", str(spec), "--no-progress"], env={"COLUMNS": "400"})
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler is gone
    assert result.exit_code == 143, result.output
    assert result.stderr.splitlines()[-1] == (
        "error: stopped by SIGTERM before training started; nothing was written to resume from")


def test_a_run_that_fails_says_at_which_step_and_which_checkpoint_is_left(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specformer.builder.lightning import SpecModule

    step = SpecModule.training_step

    def out_of_memory_at_step_5(self: Any, batch: Any, idx: int) -> Any:
        if self.trainer.global_step == 5:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return step(self, batch, idx)

    monkeypatch.setattr(SpecModule, "training_step", out_of_memory_at_step_5)
    spec = _write(tmp_path, tiny("decoder", max_steps=10, val_interval=4, val_batches=1))
    result = runner.invoke(app, ["train", str(spec), "--no-progress"], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    assert result.stderr.splitlines()[-3:] == [
        "error: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
        f"  the run stopped at step 5; its last checkpoint (step 4) is {ckpt}",
        "  set SPECFORMER_DEBUG=1 to see the full traceback",
    ]
    # before the first checkpoint, that there is none
    monkeypatch.setattr(SpecModule, "training_step", out_of_memory_at_step_5)
    result = runner.invoke(app, ["train", str(spec), "--no-progress", "--set", "training.val_interval=8"],
                           env={"COLUMNS": "400"})
    assert "  the run stopped at step 5, before its first checkpoint" in result.stderr.splitlines()


def test_an_error_in_a_data_loading_worker_is_said_without_its_traceback(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch raises a worker's error again with the worker's whole traceback in its message
    from specformer.data.datasets import PackedBlocks

    read, calls = PackedBlocks.__getitem__, []

    def fails_in_the_seventh_batch(self: Any, key: Any) -> Any:
        calls.append(1)  # in the worker process (forked: the patch goes with it)
        if len(calls) > 6 * 8:  # read one batch ahead of the step that uses it
            raise ValueError("cannot read the token file: it was truncated")
        return read(self, key)

    monkeypatch.setattr(PackedBlocks, "__getitem__", fails_in_the_seventh_batch)
    spec = _write(tmp_path, tiny("decoder", max_steps=20, val_interval=4, val_batches=1, num_workers=1))
    result = runner.invoke(app, ["train", str(spec), "--no-progress"], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    assert result.stderr.splitlines()[-3:] == [
        "error: ValueError: cannot read the token file: it was truncated (raised in DataLoader worker process 0)",
        f"  the run stopped at step 5; its last checkpoint (step 4) is {ckpt}",
        "  set SPECFORMER_DEBUG=1 to see the full traceback",
    ]
    assert "Traceback" not in result.output


def test_help_shows_placeholders_and_examples_verbatim() -> None:
    from typer.testing import CliRunner

    from specformer.cli import app

    out = CliRunner().invoke(app, ["fill-mask", "--help"], env={"COLUMNS": "160"}).stdout
    assert "Text with one or more <mask> (or [MASK]) placeholders" in out
    assert 'specformer fill-mask runs/bert-nano/<timestamp> "import <mask>"' in out
    assert 'specformer fill-mask CKPT "def __init__(self, <mask>):" --top-k 10' in out


def test_a_mask_absorbs_the_space_before_it_with_a_bpe_tokenizer(tmp_path: Path) -> None:
    from specformer.cli.train_cmds import _encode_with_masks
    from specformer.data.corpus import Corpus
    from specformer.data.tokenizers import bpe_tokenizer
    from specformer.specs.training import BPETokenizerSpec

    text = "the quick brown fox jumps over the lazy dog\n" * 200
    corpus = Corpus(name="t", train=[text], val=[], fingerprint="mask-space-test")
    tok = bpe_tokenizer(BPETokenizerSpec(vocab_size=300), corpus=corpus, cache_dir=tmp_path)
    ids = _encode_with_masks(tok, "the quick <mask> fox")
    plain = tok.encode("the quick brown fox")
    assert ids == [*tok.encode("the quick"), tok.mask_id, *tok.encode(" fox")]
    assert len(ids) == len(plain)  # the mask stands where " brown" stood, no lone " " token


@pytest.mark.parametrize("steps,says", [(3, "the run's 3 steps: the learning rate never reaches"),
                                         (1, "the run's 1 step: the learning rate never reaches")])
def test_a_warmup_longer_than_the_run_is_pointed_out(tiny: Any, tmp_path: Path, steps: int, says: str) -> None:
    spec = _write(tmp_path, tiny("decoder", max_steps=steps, val_interval=steps))
    result = runner.invoke(app, ["train", str(spec), "--no-progress", "--set", "training.schedule={type: linear, warmup_steps: 6}"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"warmup_steps=6 is above {says}" in result.stderr
    assert f"{steps / 6:.2g} of it" in result.stderr


def test_an_inverse_sqrt_warmup_longer_than_the_run_is_pointed_out_with_its_own_peak(tiny: Any, tmp_path: Path) -> None:
    # inverse_sqrt was left out of the warning (its default warmup of 4000 outlasts gpt-nano's 400
    # steps), and validate's note named training.optimizer.lr, which inverse_sqrt does not use
    from specformer import load_spec

    spec = _write(tmp_path, tiny("decoder", max_steps=3, val_interval=3))
    schedule = "training.schedule={type: inverse_sqrt, warmup_steps: 6}"
    result = runner.invoke(app, ["train", str(spec), "--no-progress", "--set", schedule], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    says = ("warmup_steps=6 is above the run's 3 steps: the learning rate never reaches the inverse_sqrt schedule's "
            "peak, scale · (d_model · warmup_steps)^-0.5 = 0.0722 (it ends at 0.5 of it)")
    assert says in result.stderr
    notes = load_spec(spec, overrides=[schedule]).settings_without_effect()
    assert any("never reaches the inverse_sqrt schedule's peak" in p.message for p in notes)
    assert not any("training.optimizer.lr" in p.message for p in notes)


def test_a_warmup_as_long_as_the_run_is_no_warning(tiny: Any, tmp_path: Path) -> None:
    # the last step reaches the peak learning rate: 'never reaches (it ends at 1 of it)' was wrong
    spec = _write(tmp_path, tiny("decoder", max_steps=3, val_interval=3))
    result = runner.invoke(app, ["train", str(spec), "--no-progress", "--set", "training.schedule={type: linear, warmup_steps: 3}"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "warmup_steps" not in result.stderr


def test_an_lr_the_inverse_sqrt_schedule_ignores_is_pointed_out(tiny: Any, tmp_path: Path) -> None:
    # the schedule sets the rate itself (d_model 32, warmup 4: peaks at (32 * 4)^-0.5 = 0.0884), so
    # the lr of 0.003 the spec gives would silently be something else
    schedule = "training.schedule={type: inverse_sqrt, warmup_steps: 4}"
    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2))
    result = runner.invoke(app, ["train", str(spec), "--no-progress", "--set", schedule], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert ("training.optimizer.lr=0.003 is not used: the inverse_sqrt schedule sets the learning rate itself"
            in result.stderr)
    assert "which peaks at 0.0884 after 4 steps (d_model 32, warmup_steps 4, scale 1)" in result.stderr
    assert "to peak at 0.003, set training.schedule.scale=0.03394" in result.stderr
    assert result.stderr.count("is not used") == 1
    # no lr given: nothing to point out
    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2, optimizer={"type": "adamw"}))
    result = runner.invoke(app, ["train", str(spec), "--no-progress", "--set", schedule], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "is not used" not in result.stderr
    # nor when that run's folder (its spec.yaml writes the default lr) is trained again
    run = sorted((tmp_path / "runs" / "tiny-decoder").glob("*/spec.yaml"))[-1]
    assert "lr: 0.0003" in run.read_text()
    result = runner.invoke(app, ["train", str(run.parent), "--no-progress"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "is not used" not in result.stderr


def test_eval_refuses_model_changes_and_batches_of_a_task(tiny: Any, tmp_path: Path) -> None:
    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2))
    _train([str(spec)])
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    result = runner.invoke(app, ["eval", str(ckpt), "--set", "d_model=64"])
    assert result.exit_code == 1 and "--set d_model: eval runs the checkpoint's own model" in result.stderr
    assert ("only training.* (what is evaluated, e.g. training.data), max_seq_len (how long a sequence it "
            "reads) and positional.scaling") in result.stderr
    result = runner.invoke(app, ["eval", str(ckpt), "--set", "training.tokenizer.type=bpe"])
    assert result.exit_code == 1 and "eval reads the data with the checkpoint's own tokenizer" in result.stderr


def test_eval_reads_longer_sequences_with_a_longer_max_seq_len(tiny: Any, tmp_path: Path) -> None:
    # trained at 32 tokens; a rope model evaluates at 128 (length extrapolation), with the same weights
    data = tiny("decoder", max_steps=2, val_interval=2, val_batches=1)
    data["positional"] = {"type": "rope"}
    _train([str(_write(tmp_path, data))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))

    def scored(result: Any) -> str:
        assert result.exit_code == 0, result.output
        return next(line for line in result.stdout.splitlines() if "scored" in line).split()[3]

    assert scored(runner.invoke(app, ["eval", ckpt], env={"COLUMNS": "200"})) == "256"  # 8 x 32
    longer = runner.invoke(app, ["eval", ckpt, "--set", "max_seq_len=128"], env={"COLUMNS": "200"})
    assert scored(longer) == "1,024"  # 8 x 128: training.seq_len follows max_seq_len
    given = runner.invoke(app, ["eval", ckpt, "--set", "max_seq_len=128", "--set", "training.seq_len=64"],
                          env={"COLUMNS": "200"})
    assert scored(given) == "512"


def test_eval_interpolates_positions_with_a_rope_scaling(tiny: Any, tmp_path: Path, monkeypatch) -> None:
    # the checkpoint's weights with scaled rotary frequencies, at a longer max_seq_len
    import math

    from specformer.components import positional

    data = tiny("decoder", max_steps=2, val_interval=2, val_batches=1)
    data["positional"] = {"type": "rope"}
    _train([str(_write(tmp_path, data))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    computed: list[tuple[Any, float]] = []
    frequencies = positional.rope_frequencies

    def spy(*args: Any, **kwargs: Any) -> Any:
        computed.append(frequencies(*args, **kwargs))
        return computed[-1]

    monkeypatch.setattr(positional, "rope_frequencies", spy)

    def evaluated(*options: str) -> tuple[Any, float]:
        computed.clear()
        result = runner.invoke(app, ["eval", ckpt, "--set", "max_seq_len=128", *options], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "1,024 tokens" in result.stdout  # 8 x 128 either way
        return computed[0]

    plain, one = evaluated()
    assert one == 1.0
    linear, _ = evaluated("--set", "positional.scaling={type: linear, factor: 4}")
    torch.testing.assert_close(linear, plain / 4)
    yarn, factor = evaluated("--set", "positional.scaling={type: yarn, factor: 4, original_max_position_embeddings: 32}")
    assert factor == 0.1 * math.log(4) + 1 and torch.equal(yarn[0], plain[0]) and yarn[-1] < plain[-1]
    # dynamic NTK: sequences of 128 past an original context of 32 grow the base by (2 * 128 / 32 - 1)^(R/(R-2))
    dynamic, _ = evaluated("--set", "positional.scaling={type: dynamic, factor: 2, original_max_position_embeddings: 32}")
    r = 2 * plain.shape[0]
    grown = plain[1].item() ** (-r / 2) * 7 ** (r / (r - 2))  # the plain base, times (2 * 128 / 32 - 1)^(R/(R-2))
    torch.testing.assert_close(dynamic, torch.tensor([grown ** (-2 * i / r) for i in range(r // 2)]), atol=0, rtol=1e-4)


def test_eval_refuses_a_max_seq_len_past_a_learned_table(tiny: Any, tmp_path: Path) -> None:
    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2, val_batches=1)))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    result = runner.invoke(app, ["eval", ckpt, "--set", "max_seq_len=128"])
    assert result.exit_code == 1
    assert "--set max_seq_len=128: this model's learned position table has 64 positions (0-63)" in result.stderr
    # within the table the weights still fit: a shorter max_seq_len keeps the table's 64 rows
    shorter = runner.invoke(app, ["eval", ckpt, "--set", "max_seq_len=16"], env={"COLUMNS": "200"})
    assert shorter.exit_code == 0, shorter.output
    assert "128 tokens" in shorter.stdout  # 8 x 16


def test_eval_refuses_a_max_seq_len_past_a_table_whose_length_the_spec_writes(tmp_path: Path) -> None:
    """A spec that writes its table's max_positions (BART's, import-hf's) was refused by the spec's own
    check first, which asked for a larger table ('use max_positions >= 514'): eval cannot change it."""
    import torch

    from specformer import build_model, load_spec
    from specformer.training import save_checkpoint

    torch.manual_seed(0)
    spec = load_spec("gpt-nano", ["decoder.n_layers=1", "training.tokenizer={type: byte}", "vocab_size=259",
                                  "positional.max_positions=256"])
    ckpt = save_checkpoint(build_model(spec), tmp_path / "gpt.ckpt")
    result = runner.invoke(app, ["eval", str(ckpt), "--set", "max_seq_len=512"], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "max_positions" not in result.output, result.output
    assert "--set max_seq_len=512: this model's learned position table has 256 positions (0-255)" in result.stderr


@pytest.mark.parametrize("beams", [1, 2])
def test_generate_max_seq_len_reads_positions_past_the_built_length(
    tiny: Any, tmp_path: Path, monkeypatch, beams: int
) -> None:
    from specformer.components.positional import Rotary

    data = tiny("decoder", max_steps=2, val_interval=2, val_batches=1)
    data["positional"] = {"type": "rope"}  # max_seq_len 64
    _train([str(_write(tmp_path, data))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    reached: list[int] = []
    rotation = Rotary.rotation

    def spy(self: Any, position_ids: Any, n_positions: int, *, dtype: Any) -> Any:
        reached.append(int(position_ids.max()))
        return rotation(self, position_ids, n_positions, dtype=dtype)

    monkeypatch.setattr(Rotary, "rotation", spy)
    args = ["generate", ckpt, "--prompt", "def", "-n", "100", "--num-beams", str(beams)]
    if beams == 1:
        args.append("--greedy")
    default = runner.invoke(app, args)
    assert default.exit_code == 0, default.output
    # the context slides at max_seq_len, re-reading its last 64 tokens; beams stop at 64 tokens,
    # the last of them not read back
    assert max(reached) == (63 if beams == 1 else 62)
    reached.clear()
    longer = runner.invoke(app, [*args, "--max-seq-len", "256"])
    assert longer.exit_code == 0, longer.output
    # the prompt's 3 bytes and the first 99 new tokens (the last is not read back), none re-read
    assert max(reached) == 3 + 99 - 1


def test_generate_max_seq_len_past_a_learned_table_is_an_error(tiny: Any, tmp_path: Path) -> None:
    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2, val_batches=1)))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    result = runner.invoke(app, ["generate", ckpt, "--prompt", "def", "--max-seq-len", "65"])
    assert result.exit_code == 1
    assert "--max-seq-len=65: this model's learned position table has 64 positions (0-63)" in result.stderr
    assert "Traceback" not in result.output


def test_ctrl_c_in_eval_before_a_batch_exits_130_and_says_so(tiny: Any, tmp_path: Path, monkeypatch) -> None:
    from specformer.builder.lightning import SpecModule

    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2)))])
    ckpt = _checkpoint(tmp_path, "tiny-decoder")

    def ctrl_c(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # Lightning catches it, tears down and calls sys.exit(1)

    monkeypatch.setattr(SpecModule, "validation_step", ctrl_c)
    result = runner.invoke(app, ["eval", str(ckpt)], env={"COLUMNS": "200"})
    assert result.exit_code == 130, result.output
    assert "interrupted before any batch was evaluated" in result.output


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_in_eval_reports_the_batches_scored_before_it(tiny: Any, tmp_path: Path, monkeypatch, signum: int) -> None:
    from specformer.builder.lightning import SpecModule

    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2)))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    two = runner.invoke(app, ["eval", ckpt, "--batches", "2"], env={"COLUMNS": "200"})
    assert two.exit_code == 0, two.output
    step, calls = SpecModule.validation_step, []

    def stopped_after_the_second(self: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 3 and signum == signal.SIGINT:
            raise KeyboardInterrupt  # at once
        if len(calls) == 2 and signum == signal.SIGTERM:
            os.kill(os.getpid(), signum)  # Lightning stops at the end of this batch
        return step(self, *args, **kwargs)

    monkeypatch.setattr(SpecModule, "validation_step", stopped_after_the_second)
    result = runner.invoke(app, ["eval", ckpt, "--batches", "4"], env={"COLUMNS": "200"})
    assert result.exit_code == 128 + signum, result.output
    def loss(out: str) -> str:
        return next(line for line in out.splitlines() if "val loss" in line).split("│")[2].strip()

    assert loss(result.stdout) == loss(two.stdout)  # the two batches scored, as a 2-batch eval reports them
    assert "interrupted after" in result.stdout and "scored tokens" in result.stdout
    assert "unigram baseline" in two.stdout and "unigram baseline" not in result.stdout  # of other tokens
    said = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    cause = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert f"{said}: the numbers above are of the part of the validation split read before {cause}" in result.stderr
    calls.clear()
    as_json = runner.invoke(app, ["eval", ckpt, "--batches", "4", "-f", "json"])
    assert as_json.exit_code == 128 + signum, as_json.output
    got = json.loads(as_json.stdout)  # standard output holds the object alone
    assert got["interrupted"] is True and got["whole_split"] is False and got["unigram_loss"] is None
    assert f"{got['val_loss']:.4f}" == loss(two.stdout)
    assert "the numbers printed are of the part of the validation split" in as_json.stderr


def test_eval_names_a_cache_dir_that_is_a_file(tiny: Any, tmp_path: Path) -> None:
    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2)))])
    (tmp_path / "afile").write_text("")
    result = runner.invoke(app, ["eval", str(_checkpoint(tmp_path, "tiny-decoder")),
                                 "--set", f"training.cache_dir={tmp_path / 'afile'}"], env={"COLUMNS": "300"})
    assert result.exit_code == 1 and "training.cache_dir: " in result.output
    assert "is a file, not a folder" in result.output and "FileExistsError" not in result.output


def test_ctrl_c_while_the_libraries_load_is_said(capsys: Any) -> None:
    import typer

    from specformer.cli.train_cmds import _starting

    with pytest.raises(typer.Exit) as info, _starting():
        os.kill(os.getpid(), signal.SIGINT)  # as during `import lightning`
    assert info.value.exit_code == 130
    assert "interrupted while starting; nothing was written" in capsys.readouterr().err
    with pytest.raises(typer.Exit), _starting("nothing was generated"):  # generate's and chat's
        os.kill(os.getpid(), signal.SIGINT)
    assert "interrupted while starting; nothing was generated" in capsys.readouterr().err


def test_sigterm_while_the_libraries_load_is_said(capsys: Any) -> None:
    import time

    import typer

    from specformer.cli.train_cmds import _starting

    before = signal.getsignal(signal.SIGTERM)
    finished = False
    with pytest.raises(typer.Exit) as info, _starting():
        os.kill(os.getpid(), signal.SIGTERM)  # as during `import torch`: before, the process died silently
        time.sleep(0.2)
        finished = True  # the import is not cut in the middle: its C++ code aborted the process
    assert finished and info.value.exit_code == 143
    assert "stopped by SIGTERM while starting; nothing was written" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the caller's again


def test_generate_prints_each_token_as_it_comes(tiny: Any, tmp_path: Path, monkeypatch) -> None:
    import importlib

    gen = importlib.import_module("specformer.training.generate")  # the module, not the function
    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2)))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    text = "héllo, wörld"  # two characters of two bytes: each waits for its second byte
    seen: list[str] = []

    def spell(*args: Any, **kwargs: Any) -> Any:  # the byte tokenizer's ids of the text, one a step
        sys.stdout.flush()
        seen.append(sys.stdout.buffer.getvalue().decode())  # what the terminal shows before this step
        return torch.tensor([text.encode()[len(seen) - 1]])

    monkeypatch.setattr(gen, "sample_next", spell)
    n = len(text.encode())
    result = runner.invoke(app, ["generate", ckpt, "--prompt", "def ", "-n", str(n), "--greedy"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "def " + text + "\n"
    assert seen[:4] == ["def ", "def h", "def h", "def hé"]  # "é" shown once both its bytes are out
    assert seen[-1] == "def " + text[:-1]


def test_streamed_text_is_the_text_of_its_tokens_decoded_whole(capsys) -> None:
    from specformer.cli.train_cmds import _Stream
    from specformer.data.tokenizers import ByteTokenizer

    tok = ByteTokenizer()
    text = "ünïcode, " * 30  # past the stretch after which shown tokens become the context
    stream = _Stream(tok, tok.encode("say: "))
    for token in tok.encode(text):
        stream([token])
    stream.finish()
    assert capsys.readouterr().out == text + "\n"

    # as decoded, each character its own: not rich's to expand, drop, escape or make an emoji of
    text = "a\\\tb\rc\x07d\\ :smile: [bold]e[/]\\"
    stream = _Stream(tok)
    for token in tok.encode(text):
        stream([token])
    stream.finish()
    assert capsys.readouterr().out == text + "\n"

    # the stop token ends the text, left out with what follows it
    stream = _Stream(tok, stop_id=tok.eot_id)
    for token in [*tok.encode("done"), tok.eot_id, *tok.encode("more")]:
        stream([token])
    stream.finish()
    assert capsys.readouterr().out == "done\n" and len(stream.new) == 9 and stream.kept == tok.encode("done")

    # an opening is left out; tokens that only began it are text
    for tokens, shown in (([1, 2, 65], "A"), ([1, 66], "\x01B"), ([1], "\x01")):
        stream = _Stream(tok, skip=[1, 2])
        for token in tokens:
            stream([token])
        stream.finish()
        assert capsys.readouterr().out == shown + "\n"

    # the whitespace that token healing took off the prompt (shown with it) is not shown twice
    for tokens, shown in ((b"  word", "word"), (b"   ", " "), (b"\tx", "\tx"), (b" x", " x")):
        stream = _Stream(tok, strip="  " if shown != " x" else "\n")
        for token in tokens:
            stream([token])
        stream.finish()
        assert capsys.readouterr().out == shown + "\n", tokens


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_in_generate_prints_the_tokens_generated_so_far(tiny: Any, tmp_path: Path, monkeypatch, signum: int) -> None:
    import importlib

    gen = importlib.import_module("specformer.training.generate")  # the module, not the function
    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2)))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    whole = runner.invoke(app, ["generate", ckpt, "--prompt", "def", "-n", "5", "--greedy"], env={"COLUMNS": "300"})
    assert whole.exit_code == 0, whole.output
    sample, calls = gen.sample_next, []

    def ctrl_c_at_the_sixth(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 6:
            if signum == signal.SIGTERM:
                os.kill(os.getpid(), signum)  # kill PID, timeout: said as Ctrl-C is
            raise KeyboardInterrupt
        return sample(*args, **kwargs)

    monkeypatch.setattr(gen, "sample_next", ctrl_c_at_the_sixth)
    result = runner.invoke(app, ["generate", ckpt, "--prompt", "def", "-n", "50", "--greedy"], env={"COLUMNS": "300"})
    assert result.exit_code == 128 + signum, result.output
    assert result.stdout == whole.stdout  # the five tokens made before Ctrl-C, as a 5-token run prints them
    said = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert f"{said} after 5 of at most 50 new tokens: the text above is what was generated" in result.stderr


def test_stop_at_eot_ends_the_text_without_the_marker(tiny: Any, tmp_path: Path, monkeypatch) -> None:
    import importlib

    import torch

    gen = importlib.import_module("specformer.training.generate")  # the module, not the function
    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2)))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    from specformer.training.checkpoint import load_checkpoint

    tok = load_checkpoint(ckpt).tokenizer
    made = [*tok.encode("ab", specials=False), tok.eot_id]
    steps = iter(made)
    monkeypatch.setattr(gen, "sample_next", lambda logits, **_: torch.tensor([next(steps)]))
    result = runner.invoke(app, ["generate", ckpt, "--prompt", "x", "-n", "50", "--stop-at-eot"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "xab\n"


def _metaspace_tokenizer(tmp_path: Path) -> Path:
    """A SentencePiece-style tokenizer.json, as Llama's, Mistral's and T5's are: a word's
    space is a ▁ at its start, and decoding drops the ▁ that opens the text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<|endoftext|>", "<pad>", "<mask>", "<unk>"])
    tok.train_from_iterator(["The model is here and the model is there, said the modeller."] * 50, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path / "tokenizer.json"


def test_generated_text_keeps_the_space_before_its_first_word_with_a_sentencepiece_tokenizer(
    tiny: Any, tmp_path: Path, monkeypatch
) -> None:
    import importlib

    import torch

    gen = importlib.import_module("specformer.training.generate")  # the module, not the function
    tokenizer = {"type": "file", "path": str(_metaspace_tokenizer(tmp_path))}
    _train([str(_write(tmp_path, tiny("decoder", max_steps=1, val_interval=1, tokenizer=tokenizer)))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    from specformer.training.checkpoint import load_checkpoint

    tok = load_checkpoint(ckpt).tokenizer
    made = tok.encode("The model is here")[len(tok.encode("The model")):]
    assert tok.decode(made) == "is here"  # decoded alone, the first word loses its space
    steps = iter(made)
    monkeypatch.setattr(gen, "sample_next", lambda logits, **_: torch.tensor([next(steps)]))
    result = runner.invoke(app, ["generate", ckpt, "--prompt", "The model", "-n", str(len(made))])
    assert result.exit_code == 0, result.output
    assert result.stdout == "The model is here\n"


def test_a_prompt_ending_in_a_space_is_healed_with_a_bpe(tiny: Any, tmp_path: Path, monkeypatch) -> None:
    # byte-level BPE puts a word's space at its start: "def " ends in a lone space token,
    # which training text rarely has before a word; generate takes it off and has the first
    # new token begin with it
    import importlib

    gen = importlib.import_module("specformer.training.generate")  # the module, not the function
    bpe = {"type": "bpe", "vocab_size": 300}
    _train([str(_write(tmp_path, tiny("decoder", max_steps=1, val_interval=1, tokenizer=bpe)))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    from specformer.training.checkpoint import load_checkpoint

    tok = load_checkpoint(ckpt).tokenizer
    real, seen = gen.generate, {}

    def recording(model: Any, ids: Any, **kwargs: Any) -> Any:
        seen["ids"] = ids[0].tolist()
        out = real(model, ids, **kwargs)
        seen["out"] = out[0].tolist()
        return out

    monkeypatch.setattr(gen, "generate", recording)
    result = runner.invoke(app, ["generate", ckpt, "--prompt", "def ", "-n", "5", "--greedy"])
    assert result.exit_code == 0, result.output
    assert seen["ids"] == tok.encode("def") and result.stderr == ""
    first = seen["out"][len(seen["ids"])]
    assert tok.decode([*seen["ids"], first]).startswith("def ")  # the first new token carries the space
    assert result.stdout == tok.decode(seen["out"]) + "\n"  # the prompt as typed, then the rest
    # --no-heal reads the prompt as it is, and says what that does (without decoding the
    # vocabulary after the prompt, which only healing needs)
    decoded = []
    monkeypatch.setattr(gen, "_token_texts", lambda *args: decoded.append(args) or [])
    result = runner.invoke(app, ["generate", ckpt, "--prompt", "def ", "-n", "5", "--greedy", "--no-heal"],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert decoded == []
    assert seen["ids"] == tok.encode("def ") and seen["ids"][-1] == tok.encode(" ")[0]
    assert result.stderr.startswith("warning: the prompt ends in whitespace (' '), which this tokenizer reads as a "
                                    "token of its own")
    # the byte tokenizer saw every space as the byte it is: nothing to heal, nothing to say
    (tmp_path / "runs").rename(tmp_path / "bpe-runs")
    _train([str(_write(tmp_path, tiny("decoder", max_steps=1, val_interval=1)))])
    byte = str(_checkpoint(tmp_path, "tiny-decoder"))
    result = runner.invoke(app, ["generate", byte, "--prompt", "def ", "-n", "5", "--greedy", "--no-heal"])
    assert result.exit_code == 0 and result.stderr == "" and seen["ids"] == list(b"def ")


def test_a_training_split_smaller_than_one_batch_is_pointed_out(tiny: Any, tmp_path: Path) -> None:
    # 3 sequences and batch_size 8: each batch cycles them, which nothing said
    text = tmp_path / "tiny.txt"
    text.write_text("".join(f"line {i} of a small file\n" for i in range(8)))
    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2, seq_len=16,
                                 data={"type": "files", "paths": [str(text)], "val_fraction": 0.5}))
    result = _train([str(spec)])
    assert "sequences of seq_len tokens, fewer than one batch (training.batch_size=8)" in result.stderr
    plenty = _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2), "plenty.yaml"))])
    assert "fewer than one batch" not in plenty.stderr


def test_a_resumed_runs_summary_says_which_tokens_its_rate_counts() -> None:
    from rich.console import Console

    from specformer.cli.train_cmds import _summary_table
    from specformer.training.run import TrainResult

    # resumed at step 30 of a run of 512 tokens a step, trained to step 50 in 8 s of which 1.6 s
    # validated: 25.6k tokens since step 0, of which this run's 10.2k make its 1.6k tokens/s
    result = TrainResult(spec_name="m", run_dir="r", checkpoint=None, steps=50, train_loss=1.0, val_loss=1.0,
                         val_ppl=2.7, unigram_loss=None, exact_match=None, tokens=25_600,
                         tokens_per_second=10_240 / 6.4, train_seconds=8.0, wall_seconds=9.0, data="d",
                         resumed_from="old/last.ckpt", val_seconds=1.6)

    def rows(result: TrainResult) -> str:
        console = Console(width=200, record=True)
        console.print(_summary_table(result))
        return console.export_text()

    text = rows(result)
    assert "│ tokens         │ 25.6k  (10.2k in this run, which tokens/s counts)" in text
    assert "compiling" not in text
    assert "│ tokens/s       │ 1.6k" in text
    assert "│ wall time      │ 9.0s  (training 8.0s, validation 1.6s of it)" in text
    result.resumed_from = None
    assert "in this run" not in rows(result)
    # training.compile: the first step, mostly compilation, is named and left out of tokens/s
    result.compile_seconds = 3.2
    assert "│ wall time      │ 9.0s  (training 8.0s, validation 1.6s, first step, compiling, 3.2s, " \
           "which tokens/s leaves out of it)" in rows(result)


def test_a_setting_refused_once_the_run_starts_is_placed_where_it_was_written(
    tiny: Any, tmp_path: Path
) -> None:
    if not torch.cuda.is_available():
        path = _write(tmp_path, tiny("encoder", accelerator="gpu"))
        out = runner.invoke(app, ["train", str(path), "--no-progress"], env={"COLUMNS": "300"})
        assert out.exit_code == 1
        # at the line of training.accelerator (the run's folder is the working directory)
        assert "training.accelerator: 'gpu' cannot run here" in out.output
        line = int(out.output.split("  spec.yaml:")[1].split(":")[0])
        assert path.read_text().splitlines()[line - 1].strip() == "accelerator: gpu"

    out = runner.invoke(
        app, ["train", str(_write(tmp_path, tiny("encoder"), "e.yaml")), "--no-progress",
              "--set", "head={type: classification, n_classes: 2}"], env={"COLUMNS": "300"},
    )
    assert out.exit_code == 1
    assert "objective classification trains on labelled texts, not 'files'" in out.output
    if not torch.cuda.is_available():
        out = runner.invoke(app, ["train", str(_write(tmp_path, tiny("decoder"), "d.yaml")), "--no-progress",
                                  "--set", "training.precision=16-mixed"], env={"COLUMNS": "300"})
        assert out.exit_code == 1
        assert "--set training.precision=16-mixed: training.precision: 16-mixed cannot run on CPU" in out.output


def test_the_summary_gives_the_model_flops_per_second_for_mfu(tiny: Any, tmp_path: Path) -> None:
    from rich.console import Console

    from specformer import load_spec
    from specformer.analysis import flops_per_token
    from specformer.cli.train_cmds import _summary_table
    from specformer.training.run import TrainResult, _training_flops

    # nanoGPT's MFU counts 6N + 12·L·T·d FLOPs a token: gpt-nano at seq_len 256 (N: its
    # 851,968 weights of matrices, the tied head once) is 5,111,808 + 1,572,864
    spec = load_spec("gpt-nano")
    assert _training_flops(spec) == 6 * 851_968 + 12 * 4 * 256 * 128 == 6_684_672
    assert _training_flops(load_spec("gpt-nano", ["training.seq_len=64"])) == flops_per_token(
        spec, seq_len=64, count="executed").training
    assert _training_flops(load_spec("t5-nano")) is None
    result = TrainResult(spec_name="m", run_dir="r", checkpoint=None, steps=50, train_loss=1.0, val_loss=1.0,
                         val_ppl=2.7, unigram_loss=None, exact_match=None, tokens=25_600,
                         tokens_per_second=1000.0, train_seconds=8.0, wall_seconds=9.0, data="d",
                         flops_per_token=6_684_672)
    console = Console(width=200, record=True)
    console.print(_summary_table(result))
    assert ("│ tokens/s       │ 1k  (6.685 GFLOP/s of model FLOPs, 6.685 MFLOP a token; over the hardware's peak: "
            "MFU)") in console.export_text()
    # and a run writes it to summary.json
    spec_path = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2))
    _train([str(spec_path)])
    summary = json.loads(next((tmp_path / "runs" / "tiny-decoder").glob("*/summary.json")).read_text())
    assert summary["flops_per_token"] == _training_flops(load_spec(spec_path)) > 0


def test_the_summary_tables_keep_each_row_whole_when_stdout_is_not_a_terminal(tiny: Any, tmp_path: Path) -> None:
    # train ... > log.txt, or CI: rich fell back to 80 columns and broke the data row's paths and
    # the tokens/s line across lines of the table (the checkpoint and logs lines were kept whole)
    deep = tmp_path / ("a_folder_with_a_rather_long_name_" * 4)
    deep.mkdir()
    text = deep / "held_out_text_to_score.py"
    text.write_text(Path(json.__file__).read_text())
    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2, val_batches=1, out_dir=str(deep / "runs")))
    # COLUMNS=80 is rich's width where stdout is no terminal and none is known
    trained = runner.invoke(app, ["train", str(spec), "--no-progress"], env={"COLUMNS": "80"})
    assert trained.exit_code == 0, trained.output
    run = next((deep / "runs" / "tiny-decoder").glob("*/summary.json")).parent
    summary = json.loads((run / "summary.json").read_text())
    ckpt = run / "checkpoints" / "last.ckpt"
    assert f"checkpoint {ckpt}\n" in trained.stdout and f"logs       {run / 'metrics.csv'}\n" in trained.stdout
    scored = runner.invoke(app, ["eval", str(ckpt), "--data", str(text), "--no-progress"], env={"COLUMNS": "80"})
    assert scored.exit_code == 0, scored.output
    for out, whole in ((trained, summary["data"]), (scored, f"{text.name}: 1 document")):
        rows = [line for line in out.stdout.splitlines() if line.startswith("│")]
        assert rows and all(row.split("│")[1].strip() for row in rows), out.stdout  # a broken row goes on unlabelled
        assert any(whole in row and "saves their rows)" in row for row in rows), out.stdout
        assert len({len(row) for row in rows}) == 1 and len(rows[0]) > 80
    assert any("│ tokens/s " in row and row.rstrip("│ ").endswith("MFU)") for row in trained.stdout.splitlines())


def test_the_summary_table_fits_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    from specformer.cli import train_cmds
    from specformer.training.run import TrainResult

    result = TrainResult(spec_name="m", run_dir="r", checkpoint=None, steps=50, train_loss=1.0, val_loss=1.0,
                         val_ppl=2.7, unigram_loss=None, exact_match=None, tokens=25_600, tokens_per_second=1000.0,
                         train_seconds=8.0, wall_seconds=9.0, data="files: " + "/a/long/folder" * 12 + "/text.txt",
                         flops_per_token=6_684_672)
    screen = io.StringIO()
    monkeypatch.setattr(train_cmds, "console", Console(file=screen, force_terminal=True, width=80, color_system=None))
    train_cmds._print_table(train_cmds._summary_table(result))
    lines = screen.getvalue().splitlines()
    assert lines[0] == "trained m" and max(len(line) for line in lines) == 80
    cells = [line.split("│")[1:3] for line in lines if line.startswith("│")]
    steps = next(i for i, (label, _) in enumerate(cells) if label.strip() == "steps")
    # wrapped to the terminal, not cut short to "…"
    assert "".join(value.strip() for _, value in cells[:steps]) == result.data.replace(" ", "")


def test_train_help_resumes_as_the_interruption_hint_says() -> None:
    # a spec given with --resume replaces the run's training settings (its --set included):
    # the help's example resumes without one, as the Ctrl-C hint does, and says so
    out = " ".join(CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).stdout.split())
    assert "specformer train --resume runs/gpt-nano/20250101-120000" in out
    assert "specformer train gpt-nano --resume" not in out
    assert "Leave it out with --resume: the checkpoint's spec, with every --set of its run, is used" in out


def test_generate_refuses_greedy_with_sampling_options_it_would_leave_unused(
    tiny: Any, tmp_path: Path
) -> None:
    # --greedy takes the argmax: a --temperature, --top-k or --top-p beside it would be silently
    # unused, so it is refused by name, as --num-beams refuses them
    from safetensors.torch import save_file

    from specformer import load_spec
    from specformer.builder import build_model

    spec = _write(tmp_path, tiny("decoder"))
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in build_model(load_spec(spec)).state_dict().items()}, weights)
    base = ["generate", str(weights), "--spec", str(spec), "-p", "def", "-n", "4"]
    mixed = runner.invoke(app, [*base, "--greedy", "--temperature", "0.5", "--top-k", "5"])
    assert mixed.exit_code == 1 and "Traceback" not in mixed.output
    assert mixed.stderr.splitlines() == [
        "error: --greedy takes the most likely token and samples nothing: leave out --temperature 0.5, --top-k 5",
        "  or sample without --greedy"]
    nucleus = runner.invoke(app, [*base, "--greedy", "--top-p", "0.9"])
    assert nucleus.exit_code == 1 and "leave out --top-p 0.9" in nucleus.stderr
    # --temperature 0 is the same as --greedy: the same text, no error
    greedy = runner.invoke(app, [*base, "--greedy"])
    both = runner.invoke(app, [*base, "--greedy", "--temperature", "0"])
    assert greedy.exit_code == 0 and both.exit_code == 0, both.output
    assert greedy.stdout.startswith("def") and both.stdout == greedy.stdout
    # --temperature 0 with a filter is refused as --greedy is; a temperature or length penalty
    # that is no number is refused before anything runs
    zero = runner.invoke(app, [*base, "--temperature", "0", "--top-k", "5"])
    assert zero.exit_code == 1 and "--temperature 0 takes the most likely token" in zero.stderr
    assert "leave out --top-k 5" in zero.stderr
    for option, value in (("--temperature", "inf"), ("--temperature", "nan"), ("--length-penalty", "nan"),
                          ("--top-p", "nan"), ("--repetition-penalty", "-inf")):
        bad = runner.invoke(app, [*base, option, value])
        assert bad.exit_code == 2 and f"'{option}': {value} is not a finite number" in bad.stderr, bad.output
    assert "'--temperature': -1 is not in the range x>=0" in runner.invoke(app, [*base, "--temperature", "-1"]).stderr
    assert "'--temperature': 'warm' is not a number" in runner.invoke(app, [*base, "--temperature", "warm"]).stderr
    for option, value, problem in (("--temperature", "nan", "nan is not a finite number"),
                                   ("--top-p", "0", "0 is not in the range 0<x<=1")):  # chat's too, before it loads
        bad = runner.invoke(app, ["chat", str(tmp_path / "none.ckpt"), option, value])
        assert bad.exit_code == 2 and f"'{option}': {problem}" in bad.stderr, bad.output
    # beams do not slide: a prompt past max_seq_len is refused without the sliding warning,
    # and fewer new tokens than asked for are said
    long = runner.invoke(app, [*base[:4], "-p", "x" * 80, "-n", "4", "--num-beams", "2"])
    assert long.exit_code == 1 and "beam search keeps every beam's context within max_seq_len=64" in long.stderr
    assert "slides" not in long.stderr
    short = runner.invoke(app, [*base[:4], "-p", "x" * 60, "-n", "10", "--num-beams", "2"])
    assert short.exit_code == 0, short.output
    assert "after the prompt's 60 tokens it makes at most 4 of the 10 asked for" in " ".join(short.stderr.split())
    # every id banned (a 1-gram may not repeat) ends the text where none is left, with the text kept
    banned = runner.invoke(app, [*base, "-n", "600", "--no-repeat-ngram", "1", "--temperature", "1"])
    assert banned.exit_code == 0 and "Traceback" not in banned.output and banned.stdout.startswith("def")


def test_generate_given_its_prompt_as_an_argument_says_to_use_prompt(tiny: Any, tmp_path: Path) -> None:
    # fill-mask and classify take their text as an argument, generate with --prompt: the usage
    # error says so (the checkpoint is not read: the command line is refused first)
    spec = _write(tmp_path, tiny("decoder"))
    weights = tmp_path / "w.safetensors"
    base = ["generate", str(weights), "--spec", str(spec), "-p", "def", "-n", "4"]
    positional = runner.invoke(app, ["generate", str(weights), "--spec", str(spec), "def f", "-n", "4"],
                               env={"COLUMNS": "400"})
    text = " ".join(positional.output.replace("│", " ").split())
    assert positional.exit_code == 2, text
    assert ("Got unexpected extra argument(s) (def f). The prompt is given with --prompt (-p): specformer generate "
            "CHECKPOINT --prompt 'TEXT'") in text
    other = runner.invoke(app, [*base, "extra"], env={"COLUMNS": "400"})
    assert other.exit_code == 2 and "extra argument(s) (extra)" in other.output and "--prompt (-p)" not in other.output


def test_reading_a_checkpoint_does_not_import_lightning(tiny: Any, tmp_path: Path, child_env: dict[str, str]) -> None:
    # Lightning (with torch._dynamo and sympy) took seconds of every generate's start-up: the
    # commands that read a checkpoint run without it
    spec = _write(tmp_path, tiny("decoder", max_steps=2, val_interval=2))
    _train([str(spec)])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    commands = {"generate": ["generate", ckpt, "-p", "def", "-n", "3", "--greedy"],
                "classify": ["classify", ckpt, "a text"],  # refused: not a classifier
                "chat": ["chat", ckpt]}  # refused: no chat template
    for name, argv in commands.items():
        code = ("import sys\nfrom specformer.cli import app\ntry:\n    app(" + repr(argv) + ")\n"
                "except SystemExit as exc:\n    print('exit', exc.code, 'lightning' in sys.modules)")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env,
                             cwd=tmp_path, timeout=300)
        last = run.stdout.strip().splitlines()[-1]
        assert last == f"exit {0 if name == 'generate' else 1} False", (name, run.stdout, run.stderr)
        assert name != "chat" or "chat talks with a model whose tokenizer has a chat template; to continue a text, " \
            f"use specformer generate {ckpt} --prompt TEXT" in " ".join(run.stderr.split()), run.stderr


def test_a_second_prompt_or_file_is_refused_not_silently_dropped(tiny: Any, tmp_path: Path) -> None:
    # click keeps the last of a repeated option: `--prompt a --prompt b` generated from b alone,
    # `classify --file a --file b` classified b alone; both are refused before anything is read
    spec = _write(tmp_path, tiny("decoder"))
    weights = tmp_path / "w.safetensors"
    cases = {
        ("generate", "-p", "a", "--prompt=b"): "--prompt is given 2 times: one --prompt is read",
        ("generate", "-p", "a", "--chat", "--system", "x", "--system", "y"): "--system is given 2 times",
        ("classify", "--file", "a.csv", "-f", "b.csv"): "--file is given 2 times: one --file is read; run the "
                                                       "command once per file",
    }
    for (command, *options), expected in cases.items():
        result = runner.invoke(app, [command, str(weights), "--spec", str(spec), *options], env={"COLUMNS": "400"})
        text = " ".join(result.output.replace("│", " ").split())
        assert result.exit_code == 2 and expected in text, text
    once = runner.invoke(app, ["generate", str(weights), "--spec", str(spec), "-p", "a"], env={"COLUMNS": "400"})
    assert once.exit_code == 1 and "given 2 times" not in once.output  # one prompt: on to reading the weights


def test_eval_with_a_rope_scaling_of_a_model_without_rope_says_so(tiny: Any, tmp_path: Path) -> None:
    # the spec's own error for positional.scaling on learned positions says to give
    # positional={type: rope, ...}, a change of model that eval then refuses: eval says why first
    from safetensors.torch import save_file

    from specformer import load_spec
    from specformer.builder import build_model

    spec = _write(tmp_path, tiny("decoder"))  # learned positions
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in build_model(load_spec(spec)).state_dict().items()}, weights)
    for override in ("positional.scaling={type: linear, factor: 2}", "positional.scaling.factor=2"):
        result = runner.invoke(app, ["eval", str(weights), "--spec", str(spec), "--set", override],
                               env={"COLUMNS": "1000"})
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert result.stderr == (
            f"error: --set {override.partition('=')[0]}: positional.scaling scales the frequencies of rope positions, "
            "and this model's positions are learned; eval runs the model as it was trained, so only a rope "
            "model's positions can be scaled\n")


def test_chat_sends_an_encoder_to_the_command_that_fits_it(tmp_path: Path) -> None:
    """chat of an encoder said "specformer generate decodes an encoder-decoder's input", which an
    encoder refuses: a masked LM is sent to fill-mask, a classifier to classify."""
    import torch

    from specformer import build_model, load_spec
    from specformer.training import save_checkpoint

    torch.manual_seed(0)
    small = ["encoder.n_layers=1", "training.tokenizer={type: byte}"]
    mlm = save_checkpoint(build_model(load_spec("bert-nano", small)), tmp_path / "mlm.ckpt")
    classifier = save_checkpoint(build_model(load_spec("bert-nano", [
        *small, "head={type: classification, n_classes: 2}",
        "training.data={type: labelled, paths: [reviews.csv]}"])), tmp_path / "cls.ckpt")
    for ckpt, command in ((mlm, "specformer fill-mask predicts an encoder's <mask> tokens"),
                          (classifier, "specformer classify labels texts with a sequence classifier")):
        result = runner.invoke(app, ["chat", str(ckpt)], input="hi\n", env={"COLUMNS": "200"})
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert " ".join(result.output.split()) == f"error: chat answers with a decoder; this is an encoder model ({command})"


def test_text_that_is_not_utf8_is_one_line_naming_where_it_is(tmp_path: Path) -> None:
    """A byte that is not UTF-8 in a prompt or a text (Python reads it as a lone surrogate,
    0xff as \\udcff) failed with "error: TypeError: TextInputSequence must be str"."""
    import torch

    from specformer import build_model, load_spec
    from specformer.training import save_checkpoint

    torch.manual_seed(0)
    byte = "training.tokenizer={type: byte}"
    gpt = save_checkpoint(build_model(load_spec("gpt-nano", ["decoder.n_layers=1", byte])), tmp_path / "gpt.ckpt")
    bert = save_checkpoint(build_model(load_spec("bert-nano", ["encoder.n_layers=1", byte])), tmp_path / "bert.ckpt")
    classifier = save_checkpoint(build_model(load_spec("bert-nano", [
        "encoder.n_layers=1", byte, "head={type: classification, n_classes: 2}",
        "training.data={type: labelled, paths: [reviews.csv]}"])), tmp_path / "cls.ckpt")
    latin1 = "a caf\udce9 <mask>"  # "café" in Latin-1, read from argv
    why = "not UTF-8 text (byte 0xe9, character 6): give it as UTF-8 (from Latin-1, `iconv -f latin1 -t utf-8`)"
    for args, where in ((["generate", str(gpt), "-p", latin1], "--prompt"),
                        (["fill-mask", str(bert), latin1], "TEXT"),
                        (["classify", str(classifier), "fine", latin1], "text 2")):
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 1 and "TypeError" not in result.output, result.output
        assert " ".join(result.output.split()) == f"error: {where}: {why}"
    # standard input's bytes, whatever the locale (a strict one raised UnicodeDecodeError)
    for args, where in ((["generate", str(gpt), "-p", "-"], "--prompt - (standard input)"),
                        (["classify", str(classifier), "-"], "standard input, line 2")):
        result = runner.invoke(app, args, input=b"fine\ncaf\xe9 <mask>\n", env={"COLUMNS": "200"})
        assert result.exit_code == 1 and "Error:" not in result.output, result.output
        assert " ".join(result.output.split()).startswith(f"error: {where}: not UTF-8 text (byte 0xe9, character ")
    # a file saved as UTF-16 or UTF-32 (PowerShell's `>`, Notepad's "Unicode") and piped in is named as that,
    # not as Latin-1: UTF-32-LE's byte-order mark (ff fe 00 00) opens with UTF-16-LE's (ff fe)
    for encoding, named in (("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32"),
                            ("utf-32-be", "UTF-32")):
        data = "fine\ngood\n".encode(encoding)
        data = data if encoding in ("utf-16", "utf-32") else "\ufeff".encode(encoding) + data
        for args, where in ((["generate", str(gpt), "-p", "-"], "--prompt - (standard input)"),
                            (["classify", str(classifier), "-"], "standard input, line 1")):
            result = runner.invoke(app, args, input=data, env={"COLUMNS": "200"})
            assert result.exit_code == 1, result.output
            assert " ".join(result.output.split()) == (f"error: {where}: not UTF-8 text ({named}: a byte-order mark "
                                                       f"opens it): save it as UTF-8 (`iconv -f {named} -t UTF-8`)")


def test_classify_reads_a_plain_files_lines_as_open_ends_them(tmp_path: Path) -> None:
    """A plain text file (or standard input) saved with an old Mac's lone \\r line ends was one
    text; lines end at \\n, \\r\\n or a lone \\r, a form feed or U+2028 staying in its line."""
    import csv
    import io

    import torch

    from specformer import build_model, load_spec
    from specformer.training import save_checkpoint

    torch.manual_seed(0)
    classifier = save_checkpoint(build_model(load_spec("bert-nano", [
        "encoder.n_layers=1", "training.tokenizer={type: byte}", "head={type: classification, n_classes: 2}",
        "training.data={type: labelled, paths: [reviews.csv]}"])), tmp_path / "cls.ckpt")
    expected = [("1", "good film"), ("2", "bad\x0cplot"), ("4", "fine line\u2028second part"), ("5", "last")]
    for name, end in (("lf", "\n"), ("crlf", "\r\n"), ("cr", "\r"), ("mixed", "\r\n")):
        text = end.join(["good film", "bad\x0cplot", "", "fine line\u2028second part", "last"]) + end
        if name == "mixed":
            text = "good film\rbad\x0cplot\n\r\nfine line\u2028second part\rlast"
        plain = tmp_path / f"{name}.txt"
        plain.write_bytes(text.encode())
        for args, given in ((["--file", str(plain)], None), (["-"], text.encode())):
            result = runner.invoke(app, ["classify", str(classifier), *args, "-o", "-"], input=given,
                                   env={"COLUMNS": "200"})
            assert result.exit_code == 0, result.output
            rows = list(csv.reader(io.StringIO(result.stdout), delimiter="\t"))
            assert [(r[0], r[1]) for r in rows[1:]] == expected, (name, args)
    # a line that is not UTF-8 is named at its line, a lone \r counted as a line end
    (tmp_path / "cr.txt").write_bytes(b"fine\rgood\rcaf\xe9\r")
    result = runner.invoke(app, ["classify", str(classifier), "-"], input=b"fine\rgood\rcaf\xe9\r",
                           env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert " ".join(result.output.split()).startswith("error: standard input, line 3: not UTF-8 text (byte 0xe9")
    result = runner.invoke(app, ["classify", str(classifier), "--file", str(tmp_path / "cr.txt")],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "cr.txt:3:4: not UTF-8 text (byte 0xe9)" in " ".join(result.output.split())


def test_chat_refuses_greedy_with_a_temperature_even_the_default_one(tmp_path: Path) -> None:
    """chat --greedy --temperature 0.8 went greedy in silence: 0.8, the default, was taken for none given."""
    import torch

    from specformer import build_model, load_spec
    from specformer.training import save_checkpoint

    torch.manual_seed(0)
    gpt = save_checkpoint(build_model(load_spec("gpt-nano", ["decoder.n_layers=1", "training.tokenizer={type: byte}"])),
                          tmp_path / "gpt.ckpt")
    for value in ("0.8", "0.5"):
        result = runner.invoke(app, ["chat", str(gpt), "--greedy", "--temperature", value], input="hi\n")
        assert result.exit_code == 1 and "--greedy takes the most likely token and samples nothing" in result.stderr
    # --temperature 0 is greedy too, as generate takes it; refused here only as the model has no chat template
    result = runner.invoke(app, ["chat", str(gpt), "--greedy", "--temperature", "0"], input="hi\n")
    assert result.exit_code == 1 and "chat template" in result.stderr and "--greedy" not in result.stderr


def test_generate_reads_the_prompt_from_standard_input_given_minus(tmp_path: Path) -> None:
    """`--prompt -` read a prompt of one dash; `cat prompt.txt | generate CKPT -p -` reads the file's text."""
    import torch

    from specformer import build_model, load_spec
    from specformer.training import save_checkpoint

    torch.manual_seed(0)
    gpt = save_checkpoint(build_model(load_spec("gpt-nano", ["decoder.n_layers=1", "training.tokenizer={type: byte}"])),
                          tmp_path / "gpt.ckpt")
    given = runner.invoke(app, ["generate", str(gpt), "-p", "import os\n", "-n", "5", "--greedy"])
    piped = runner.invoke(app, ["generate", str(gpt), "-p", "-", "-n", "5", "--greedy"], input="import os\n")
    assert given.exit_code == piped.exit_code == 0, piped.output
    assert piped.stdout == given.stdout and piped.stdout.startswith("import os\n")


def test_an_encoder_decoder_refuses_chat_and_system_without_sending_from_one_to_the_other(tmp_path: Path) -> None:
    """--system on an encoder-decoder said "add --chat", which an encoder-decoder refuses:
    each is refused for what it is, and a plain prompt still decodes."""
    import torch

    from specformer import build_model, load_spec
    from specformer.training import save_checkpoint

    torch.manual_seed(0)
    ckpt = save_checkpoint(build_model(load_spec("t5-nano", ["encoder.n_layers=1", "decoder.n_layers=1"])),
                           tmp_path / "t5.ckpt")
    said = {}
    for extra in (["--system", "be brief"], ["--chat"], ["--chat", "--system", "be brief"], []):
        result = runner.invoke(app, ["generate", str(ckpt), "-p", "abc", "-n", "3", *extra], env={"COLUMNS": "200"})
        said[" ".join(extra)] = (result.exit_code, " ".join(result.output.split()))
    system = ("--system is a turn of a decoder's chat template; an encoder-decoder reads its input as it is, "
              "with no turns: leave out --system")
    assert said["--system be brief"] == (1, f"error: {system}")
    assert said["--chat"][0] == 1 and "an encoder-decoder reads its input as it is" in said["--chat"][1]
    assert said["--chat --system be brief"][0] == 1
    assert "add --chat" not in said["--system be brief"][1]
    assert said[""][0] == 0
    for flag in ("--stop-at-eot", "--no-stop-at-eot"):  # it ends at its end token: the flag would do nothing
        result = runner.invoke(app, ["generate", str(ckpt), "-p", "abc", flag], env={"COLUMNS": "200"})
        assert result.exit_code == 1 and (f"{flag} is where a decoder's text ends; an encoder-decoder's output always "
                                          "ends at its end token") in " ".join(result.output.split())
    chat = tmp_path / "chat.json"
    chat.write_text('[{"role": "user", "content": "abc"}]')
    result = runner.invoke(app, ["generate", str(ckpt), "--messages", str(chat)], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and ("--messages is a conversation for a decoder to answer; an encoder-decoder reads "
                                      "its input as it is") in " ".join(result.output.split())


def test_an_encoder_decoder_refuses_heal_which_it_would_leave_unused(tmp_path: Path) -> None:
    """--no-heal on an encoder-decoder was accepted and did nothing (its input is encoded as it is)."""
    import torch

    from specformer import build_model, load_spec
    from specformer.training import save_checkpoint

    torch.manual_seed(0)
    ckpt = save_checkpoint(build_model(load_spec("t5-nano", ["encoder.n_layers=1", "decoder.n_layers=1"])),
                           tmp_path / "t5.ckpt")
    for flag in ("--heal", "--no-heal"):
        result = runner.invoke(app, ["generate", str(ckpt), "-p", "abc ", "-n", "3", flag], env={"COLUMNS": "200"})
        assert result.exit_code == 1 and (f"error: {flag} is a decoder's: an encoder-decoder reads its input as it "
                                          "is, whitespace included") in " ".join(result.output.split())
    assert runner.invoke(app, ["generate", str(ckpt), "-p", "abc ", "-n", "3"]).exit_code == 0


def test_a_stop_before_any_checkpoint_says_when_the_first_comes(tiny: Any, tmp_path: Path, monkeypatch) -> None:
    # stopped before step 5, the first checkpoint is still to come; stopped at step 5, in the
    # validation it is written after, the stop cut it short
    from specformer.training import run
    from specformer.training.stops import TrainingInterrupted

    spec = _write(tmp_path, tiny("decoder", max_steps=20, val_interval=5))
    for step, hint in ((3, "the first checkpoint comes at step 5"),
                       (5, "the checkpoint of step 5 is written after that step's validation, which the stop cut")):
        def stopped(*args: Any, step: int = step, **kwargs: Any) -> Any:
            raise TrainingInterrupted(step, None, None, str(tmp_path / "runs"))

        monkeypatch.setattr(run, "train", stopped)
        out = runner.invoke(app, ["train", str(spec), "--no-progress"], env={"COLUMNS": "300"})
        assert out.exit_code == 130 and f"interrupted at step {step}; no checkpoint yet" in out.stderr, out.output
        assert hint in " ".join(out.stderr.split())
    # a run by epochs of 20 steps writes its first checkpoint at its last step, not at val_interval
    by_epochs = _write(tmp_path, tiny("decoder", max_steps=None, max_epochs=0.5, val_interval=100))

    def stopped_early(*args: Any, **kwargs: Any) -> Any:
        raise TrainingInterrupted(3, None, None, str(tmp_path / "runs"), max_steps=20)

    monkeypatch.setattr(run, "train", stopped_early)
    out = runner.invoke(app, ["train", str(by_epochs), "--no-progress"], env={"COLUMNS": "300"})
    assert out.exit_code == 130 and "the first checkpoint comes at step 20" in " ".join(out.stderr.split())


def test_a_mistake_in_the_spec_is_said_before_torch_and_lightning_are_imported() -> None:
    # train reads the spec and its --set first: a typo is said as fast as validate says it
    import subprocess
    import sys

    code = ("import sys\nfrom specformer.cli.app import app\ntry:\n"
            "    app(['train', 'gpt-nano', '--set', 'decoder.n_layer=2'])\nexcept SystemExit as e:\n"
            "    print('exit', e.code, 'torch' in sys.modules, 'lightning' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines()[-1] == "exit 1 False False"
    assert "decoder.n_layer: unknown field 'n_layer'" in run.stderr and "did you mean 'n_layers'?" in run.stderr


def _nan_checkpoint(tiny: Any, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A checkpoint, a .safetensors file and its spec, of a model whose weights hold NaN and inf (a
    diverged run's, written by an older specformer or by hand)."""
    from safetensors.torch import save_file

    from specformer import build_model, load_spec
    from specformer.training.checkpoint import save_checkpoint

    spec_path = _write(tmp_path, tiny("decoder"))
    model = build_model(load_spec(str(spec_path)))
    with torch.no_grad():
        names = [n for n, _ in model.named_parameters()]
        for name in names[:4]:
            model.get_parameter(name).view(-1)[0] = float("nan")
        model.get_parameter(names[-1]).view(-1)[-1] = float("inf")
    ckpt = save_checkpoint(model, tmp_path / "nan.ckpt")
    weights = tmp_path / "nan.safetensors"
    save_file({k: v.clone().contiguous() for k, v in model.state_dict().items()}, str(weights))
    return ckpt, weights, spec_path


def test_weights_that_hold_nan_are_refused_by_generate_and_eval_naming_the_tensors(tiny: Any, tmp_path: Path) -> None:
    # before, greedy decoding printed token 0 over and over, sampling failed inside torch and eval printed nan
    ckpt, weights, spec_path = _nan_checkpoint(tiny, tmp_path)
    from specformer import build_model, load_spec

    names = list(build_model(load_spec(str(spec_path))).state_dict())
    shown = f"({', '.join(names[:3])} and 2 more)"
    for args, source in (
        (["generate", str(ckpt), "-p", "def", "-n", "5", "--greedy"], ckpt),
        (["generate", str(ckpt), "-p", "def", "-n", "5", "--seed", "1"], ckpt),
        (["eval", str(ckpt), "--batches", "1", "--no-progress"], ckpt),
        (["generate", str(weights), "--spec", str(spec_path), "-p", "def", "-n", "5", "--greedy"], weights),
    ):
        out = runner.invoke(app, args, env={"COLUMNS": "400"})
        assert out.exit_code == 1, (args, out.output)
        assert f"error: {source}: the weights hold NaN or infinite values {shown}: the run that wrote them " \
               "diverged" in " ".join(out.output.split()), (args, out.output)
        assert "Traceback" not in out.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="16-mixed runs on a GPU")
def test_eval_refuses_fp16_mixed_precision_on_a_cpu_as_train_does(tiny: Any, tmp_path: Path) -> None:
    from specformer import build_model, load_spec
    from specformer.training.checkpoint import save_checkpoint

    spec = load_spec(tiny("decoder"))
    ckpt = save_checkpoint(build_model(spec), tmp_path / "model.ckpt")
    # before, eval ran it as bf16-mixed without a word
    out = runner.invoke(app, ["eval", str(ckpt), "--batches", "1", "--no-progress", "--set",
                              "training.precision=16-mixed"], env={"COLUMNS": "300"})
    assert out.exit_code == 1, out.output
    assert "training.precision: 16-mixed cannot run on CPU: Lightning would run bf16-mixed instead" in out.output
    assert "set training.precision=bf16-mixed (fp16 mixed precision needs a GPU)" in out.output
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.bin"))  # refused before the data


def test_16_true_precision_says_float16_weights_do_not_train_and_what_to_use(tiny: Any, tmp_path: Path) -> None:
    out = runner.invoke(app, ["train", "gpt-nano", "--no-progress", "--set", "training.precision=16-true"],
                        env={"COLUMNS": "400"})
    assert out.exit_code == 1
    text = " ".join(out.output.split())
    # before: "did you mean 'bf16-true'?", which trains bfloat16 weights, not the float16 asked for
    assert "did you mean" not in text, text
    assert ("float16 weights and optimizer state (Lightning's 16-true) are not trained here: updates too small for "
            "float16 are lost, and a CPU lacks float16 kernels; bfloat16 weights are `bf16-true`, and float16 mixed "
            "precision (float32 weights, float16 autocast) is `16-mixed`, on a GPU.") in text, text


def test_eval_data_scores_files_whole_with_no_training_text(tiny: Any, tmp_path: Path) -> None:
    import sysconfig

    STDLIB = Path(sysconfig.get_paths()["stdlib"])  # (as conftest's; `tests` is no package to import it from)

    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2)))])
    ckpt = str(_checkpoint(tmp_path, "tiny-decoder"))
    test = tmp_path / "test.txt"
    test.write_text((STDLIB / "textwrap.py").read_text()[:6000])

    def scored(args: list[str]) -> dict[str, Any]:
        out = runner.invoke(app, ["eval", ckpt, *args, "-f", "json", "--no-progress"])
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout)

    got = scored(["--data", str(test)])
    # the same number as the file given as validation files beside training ones, as train reads it
    beside = scored(["--set", f"training.data={{type: files, paths: [{STDLIB / 'json' / '*.py'}], val_paths: [{test}]}}",
                     "--set", "training.val_batches=null"])
    assert got["val_loss"] == pytest.approx(beside["val_loss"], rel=1e-6)
    # the whole file, in blocks of seq_len=32 (byte tokens: one a byte; the last partial block is not scored)
    assert got["scored_tokens"] == beside["scored_tokens"] == len(test.read_bytes()) // 32 * 32
    assert got["whole_split"] and got["unigram_loss"] is None  # no training split to take unigrams from
    assert scored(["--data", str(test), "--batches", "1"])["scored_tokens"] == 8 * 32  # --batches still reads fewer
    assert got["data"].startswith("test.txt: 1 document, 6k characters → 6k tokens, scored in blocks of seq_len=32")
    table = runner.invoke(app, ["eval", ckpt, "--data", str(test), "--no-progress"], env={"COLUMNS": "200"})
    assert f"│ {got['scored_tokens']:,} tokens (all {got['held_out']} sequences of --data)" in table.stdout
    twice = scored(["--data", str(test), "--data", str(STDLIB / "json" / "decoder.py")])
    assert twice["scored_tokens"] > got["scored_tokens"] and twice["data"].startswith("decoder.py, test.txt: 2 documents")

    (tmp_path / "empty.txt").write_text("\n")
    out = runner.invoke(app, ["eval", ckpt, "--data", "empty.txt"])
    assert out.exit_code == 1 and out.stderr.startswith(
        "error: --data: no text to validate on in the given files; empty (or only whitespace): empty.txt"), out.stderr
    (tmp_path / "short.txt").write_text("def f(): pass\n")
    out = runner.invoke(app, ["eval", ckpt, "--data", "short.txt"])
    assert out.exit_code == 1 and "the data to score (short.txt) has fewer than seq_len + 1 = 33 tokens (15)" in out.stderr  # and the end token
    out = runner.invoke(app, ["eval", ckpt, "--data", str(test), "--set", "training.data.val_fraction=0.5"])
    assert out.exit_code == 1 and "--data and --set training.data.val_fraction both say what to score" in out.stderr


def test_eval_data_of_a_task_model_is_refused(tiny: Any, tmp_path: Path) -> None:
    _train([str(_write(tmp_path, tiny("encoder-decoder", max_steps=2, val_interval=2)))])
    out = runner.invoke(app, ["eval", str(_checkpoint(tmp_path, "tiny-encoder-decoder")), "--data", "x.jsonl"])
    assert out.exit_code == 1 and "--data: this model was trained on the synthetic task 'copy'" in out.stderr


def test_eval_data_of_an_encoder_decoder_names_the_pairs_files_and_counts_each_pair_once(tmp_path: Path) -> None:
    """eval --data of a seq2seq model said 'pairs: 2 files, 50 training and 50 held-out pairs' of
    one file (read as both splits, its cut sources counted twice); weights whose spec has the kind's
    default data (import-hf's, a synthetic task with another tokenizer) were refused as a task model;
    a path that finds nothing was told to 'give it whole with --set --data=...'."""
    import torch

    from specformer import build_model, load_spec
    from specformer.training import save_checkpoint

    pairs = tmp_path / "test.jsonl"
    pairs.write_text("".join(json.dumps({"source": f"w{i} " * (i % 3 + 1) + "x" * 40, "target": f"w{i}"}) + "\n"
                             for i in range(50)))
    byte = ["encoder.n_layers=1", "decoder.n_layers=1", "vocab_size=259", "max_seq_len=32", "training.seq_len=32",
            "training.tokenizer={type: byte}", "training.batch_size=8"]
    torch.manual_seed(0)
    model = build_model(load_spec("t5-nano", [*byte, "training.data={type: pairs, paths: [a.tsv]}"]))
    trained = save_checkpoint(model, tmp_path / "pairs.ckpt")
    # the same weights with the spec's default data, a synthetic task (its tokenizer is not the task's)
    imported = save_checkpoint(model, tmp_path / "default.ckpt", spec=load_spec("t5-nano", byte))
    said = {}
    for ckpt in (trained, imported):
        out = runner.invoke(app, ["eval", str(ckpt), "--data", str(pairs), "-f", "json", "--no-progress"])
        assert out.exit_code == 0, out.output
        said[ckpt] = json.loads(out.stdout)
    assert said[trained]["data"] == ("pairs: test.jsonl: 50 pairs; cut to fit seq_len=32: 50 sources longer than 32 "
                                     "tokens, 0 targets longer than 31")
    assert said[trained]["held_out"] == said[imported]["held_out"] == 50 and said[trained]["whole_split"]
    assert said[imported]["val_loss"] == pytest.approx(said[trained]["val_loss"], rel=1e-6)
    out = runner.invoke(app, ["eval", str(trained), "--data", "nothing.jsonl"])
    assert out.exit_code == 1 and out.stderr.strip() == (
        f"error: --data: nothing matches 'nothing.jsonl' (a relative path is read from the working directory, "
        f"{tmp_path})"), out.stderr


def test_eval_data_reads_json_lines_with_the_text_field_the_model_was_trained_with(tiny: Any, tmp_path: Path) -> None:
    import sysconfig

    STDLIB = Path(sysconfig.get_paths()["stdlib"])  # (as conftest's; `tests` is no package to import it from)

    text = (STDLIB / "textwrap.py").read_text()
    lines = text.splitlines()

    def jsonl(path: Path, part: list[str]) -> Path:
        path.write_text("".join(json.dumps({"content": "\n".join(part[i:i + 20])}) + "\n" for i in range(0, len(part), 20)))
        return path

    train_file = jsonl(tmp_path / "train.jsonl", lines[: len(lines) // 2])
    test_file = jsonl(tmp_path / "test.jsonl", lines[len(lines) // 2:])
    data = {"type": "files", "paths": [str(train_file)], "text_field": "content"}
    _train([str(_write(tmp_path, tiny("decoder", max_steps=2, val_interval=2, data=data)))])
    out = runner.invoke(app, ["eval", str(_checkpoint(tmp_path, "tiny-decoder")), "--data", str(test_file), "-f", "json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    assert got["data"].startswith("test.jsonl: ") and got["scored_tokens"] > 1000 and got["whole_split"]
