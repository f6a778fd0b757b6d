"""``specformer`` as a process: a pipe whose reader stops early, a terminal that is not UTF-8,
``-o -``, a terminal narrower than a table."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import specformer
from specformer.cli import app

runner = CliRunner()
ROOT = str(Path(specformer.__file__).resolve().parents[1])


def _env(**extra: str) -> dict[str, str]:
    """The environment of a child process that imports the specformer under test."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "SPECFORMER_DEBUG")}
    return {**env, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


def _closed_early(args: list[str], cwd: Path, read: int = 0) -> subprocess.CompletedProcess[bytes]:
    """Run ``specformer ARGS`` into a pipe whose reader takes ``read`` bytes (none: it is gone
    before the command writes) and closes it, as ``| head -c N`` does."""
    proc = subprocess.Popen([sys.executable, "-m", "specformer", *args], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    if read:
        proc.stdout.read(read)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    return subprocess.CompletedProcess(args, proc.returncode, b"", err)


@pytest.mark.parametrize("args", [["show", "gpt2-small"], ["diff", "gpt2-small", "gpt2-medium"],
                                  ["schema"], ["validate", "gpt2-small"]])
def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path: Path, args: list[str]) -> None:
    # `specformer show gpt2-small | head -1`: exit 1 and nothing said, never a traceback or
    # Python's "Exception ignored ... BrokenPipeError"
    done = _closed_early(args, tmp_path)
    assert done.stderr.decode() == ""
    assert done.returncode in (0, 1)


def test_generate_into_a_reader_that_stops_says_nothing(tmp_path: Path) -> None:
    # `specformer generate ... | head -c 10` printed "error: BrokenPipeError: [Errno 32] Broken pipe"
    from safetensors.torch import save_file

    from specformer.builder import build_model
    from specformer.specs.loader import load_spec

    spec = tmp_path / "tiny.yaml"
    spec.write_text("name: tiny\nkind: decoder\nvocab_size: 300\nd_model: 32\nmax_seq_len: 64\n"
                    "positional: {type: learned}\n"
                    "decoder: {n_layers: 1, attention: {n_heads: 2}, ffn: {d_ff: 64}}\n"
                    "training: {tokenizer: {type: byte}, data: {type: files, paths: [x.txt]}}\n")
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in build_model(load_spec(spec)).state_dict().items()}, weights)
    done = _closed_early(["generate", str(weights), "--spec", str(spec), "-p", "hello", "-n", "2000"], tmp_path,
                         read=10)
    assert done.stderr.decode() == ""
    assert done.returncode == 1


@pytest.mark.parametrize("args", [["show", "gpt-nano"], ["diff", "gpt-nano", "gpt2-small"]])
def test_a_terminal_that_is_not_utf8_gets_the_output_not_a_unicode_error(tmp_path: Path, args: list[str]) -> None:
    # PYTHONIOENCODING=ascii (or a latin-1 terminal): "—", "×", "≥" and rich's box lines
    # raised UnicodeEncodeError
    done = subprocess.run([sys.executable, "-m", "specformer", *args], cwd=tmp_path, capture_output=True,
                          env=_env(PYTHONIOENCODING="ascii"), timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b""
    out = done.stdout.decode("ascii")  # every byte is ASCII
    assert "+--" in out and "|" in out  # rich's boxes drawn in ASCII
    if args[0] == "show":
        assert out.startswith("gpt-nano \\u2014 decoder")  # shown as its code, not dropped


def test_schema_output_dash_is_the_standard_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["schema", "-o", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["title"]
    assert not (tmp_path / "-").exists()


def test_import_hf_output_dash_prints_the_spec_and_reports_on_stderr(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4,
                                                      "n_positions": 64, "vocab_size": 101}))
    result = runner.invoke(app, ["import-hf", "config.json", "-o", "-"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# Imported by `specformer import-hf` from the Hugging Face gpt2 model")
    assert yaml.safe_load(result.stdout)["d_model"] == 32  # the spec alone: the report is on stderr
    assert "the spec: decoder" in result.stderr and "parameters" in result.stderr
    assert not (tmp_path / "-").exists()


def test_export_hf_refuses_output_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # export-hf writes a folder: -o - made one named "-"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.safetensors").write_bytes(b"")
    result = runner.invoke(app, ["export-hf", "w.safetensors", "--spec", "gpt-nano", "-o", "-"],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert result.stderr.startswith("error: --output -: export-hf writes a folder")
    assert not (tmp_path / "-").exists()


_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?%?")


def _rendered(args: list[str], width: int, monkeypatch: pytest.MonkeyPatch) -> str:
    import specformer.cli.analysis_cmds as analysis_cmds

    buffer = io.StringIO()
    monkeypatch.setattr(analysis_cmds, "console", Console(width=width, file=buffer, force_terminal=True,
                                                          color_system=None))
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return buffer.getvalue()


def _numbers(args: list[str]) -> list[str]:
    """Each number in a cell of the markdown version of the tables."""
    markdown = runner.invoke(app, [*args, "--format", "markdown"]).stdout
    cells = [cell for line in markdown.splitlines() if line.startswith("| ")
             for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
    words = (word.strip("()[],;:") for cell in cells for word in cell.split())
    return [word for word in words if _NUMBER.fullmatch(word)]


@pytest.mark.parametrize(("args", "width"), [
    (["show", "t5-base"], 60), (["show", "llama2-7b"], 40), (["diff", "llama2-7b", "mistral-7b"], 60),
    (["diff", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"], 80),
])
def test_a_narrow_terminal_never_crops_a_number(args: list[str], width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # rich narrowed every column of a table wider than the terminal: "131,072,0" for
    # 131,072,000, a column of no width at all
    out = _rendered(args, width, monkeypatch)
    assert max(map(len, out.splitlines())) <= width
    text = re.sub(r"[│┃|]", " ", out)
    cut = [n for n in _numbers(args) if not re.search(r"(?<![\d,.])" + re.escape(n) + r"(?![\d])", text)]
    assert cut == []
    assert "…" not in out.replace("… ", "")  # "… 9 more groups" is the text's own


def test_generated_control_characters_are_escaped_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # a model's escape sequence recoloured (or retitled, or cleared) the terminal it was printed on
    import specformer.cli.train_cmds as train_cmds

    text = "a\x1b[31mred\x07\tb\r\nc\x08\x9b"
    monkeypatch.setattr(train_cmds, "console", Console(file=io.StringIO(), force_terminal=True, no_color=True))
    train_cmds._write_text(text)
    assert capsys.readouterr().out == "a\\x1b[31mred\\x07\tb\r\nc\\x08\\x9b"
    monkeypatch.setattr(train_cmds, "console", Console(file=io.StringIO(), force_terminal=False))
    train_cmds._write_text(text)
    assert capsys.readouterr().out == text  # a pipe or a file: byte for byte
