"""The train, generate, eval and fill-mask commands: outputs for people, errors without tracebacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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
    out = _train([str(spec), "--set", "training.max_steps=12"]).output
    for label in ("val loss", "val perplexity", "unigram baseline", "tokens/s", "wall time", "checkpoint"):
        assert label in out
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    assert "steps" in out and " 12 " in out

    gen = runner.invoke(app, ["generate", str(ckpt), "--prompt", "def ", "-n", "20", "--greedy"])
    assert gen.exit_code == 0, gen.output
    assert gen.output.startswith("def ")
    again = runner.invoke(app, ["generate", str(ckpt), "--prompt", "def ", "-n", "20", "--greedy", "--no-cache"])
    assert again.output == gen.output

    sampled = runner.invoke(app, ["generate", str(ckpt.parent.parent), "-p", "import", "--top-k", "5", "--top-p", "0.9"])
    assert sampled.exit_code == 0, sampled.output

    ev = runner.invoke(app, ["eval", str(ckpt), "--batches", "2"], env={"COLUMNS": "200"})
    assert ev.exit_code == 0, ev.output
    assert "val loss" in ev.output and "at step 12" in ev.output


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


def test_resume_from_the_command_line_without_a_spec(tiny: Any, tmp_path: Path) -> None:
    spec = _write(tmp_path, tiny("decoder", max_steps=4, val_interval=4))
    _train([str(spec)])
    ckpt = _checkpoint(tmp_path, "tiny-decoder")
    out = _train(["--resume", str(ckpt), "--set", "training.max_steps=6"]).output
    assert "resumed from" in out and " 6 " in out


def test_fill_mask_and_seq2seq_generation(tiny: Any, tmp_path: Path) -> None:
    _train([str(_write(tmp_path, tiny("encoder", max_steps=4, val_interval=4), "enc.yaml"))])
    ckpt = _checkpoint(tmp_path, "tiny-encoder")
    result = runner.invoke(app, ["fill-mask", str(ckpt), "import <mask>s", "-k", "3"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<mask> 1 of 1" in result.output and "filled:" in result.output
    no_mask = runner.invoke(app, ["fill-mask", str(ckpt), "no placeholder"])
    assert no_mask.exit_code == 1 and "no <mask>" in no_mask.output

    _train([str(_write(tmp_path, tiny("encoder-decoder", max_steps=4, val_interval=4), "s2s.yaml"))])
    s2s = _checkpoint(tmp_path, "tiny-encoder-decoder")
    out = runner.invoke(app, ["generate", str(s2s), "--prompt", "abc", "-n", "8"])
    assert out.exit_code == 0, out.output
    wrong = runner.invoke(app, ["fill-mask", str(s2s), "a <mask>"])
    assert wrong.exit_code == 1 and "needs an encoder" in wrong.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["generate", "missing.ckpt"], "no such checkpoint"),
        (["eval", "garbage.ckpt"], "not a readable checkpoint"),
        (["train"], "give a SPEC"),
        (["train", "gpt-nano", "--set", "training.precision=8"], "'8' is not allowed"),
        (["train", "gpt-nano", "--set", "training.objective.type=seq2seq"], "does not train a decoder"),
        (["train", "gpt-nano", "--resume", "garbage.ckpt"], "not a readable checkpoint"),
    ],
)
def test_errors_are_one_clear_message(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "garbage.ckpt").write_bytes(b"\x00" * 100)
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert message in result.output
    assert "Traceback" not in result.output
