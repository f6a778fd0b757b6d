"""How the interop commands write their files: the weights through the project's own
temporary file, the folders a failed write made removed again, ``config.json`` renamed last."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import specformer.interop.hf as hf
from specformer.builder import build_model
from specformer.data.cache import _TEMPORARY
from specformer.specs.loader import load_spec


def test_save_safetensors_writes_a_file_safetensors_reads(tmp_path) -> None:
    tensors = {
        "w": torch.randn(3, 5), "half": torch.randn(4, 6, dtype=torch.float16).t(),  # not contiguous
        "bf": torch.randn(7, dtype=torch.bfloat16), "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5, dtype=torch.float64), "empty": torch.zeros(0, 4),
        "ids": torch.arange(5), "small": torch.arange(5, dtype=torch.int8),
    }
    path = tmp_path / "w.safetensors"
    hf.save_safetensors(tensors, path, metadata={"specformer.x": "y"})
    assert os.listdir(tmp_path) == ["w.safetensors"]
    loaded = load_file(path)
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"specformer.x": "y", "format": "pt"}
    header = int.from_bytes(path.read_bytes()[:8], "little")
    assert header % 8 == 0  # the data (and so every tensor, the widest first) starts aligned


def test_the_weights_are_written_into_no_temporary_file_but_the_projects(tmp_path) -> None:
    """``safetensors.torch.save_file`` wrote them into a ``.tmpXXXXXX`` of its own beside the
    output, which a SIGKILL left there, as large as the weights, where no cleanup knew it."""
    out = tmp_path / "hf"
    out.mkdir()
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(os.listdir(out))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        weights = {"w": torch.zeros(16_000_000)}  # 64 MB: long enough to be seen being written
        hf.write_files({out / "model.safetensors": lambda path: hf.save_safetensors(weights, path)})
    finally:
        done.set()
        watcher.join()
    assert any(_TEMPORARY.fullmatch(name) for name in seen)
    assert {name for name in seen if not _TEMPORARY.fullmatch(name)} <= {"model.safetensors"}
    assert os.listdir(out) == ["model.safetensors"]


def test_a_write_killed_outright_leaves_only_a_file_the_next_export_removes(tmp_path) -> None:
    """SIGKILL (the OOM killer) while the weights are written: what is left is the hidden
    temporary file the next write into the folder removes, not safetensors' ``.tmpXXXXXX``."""
    out = tmp_path / "hf"
    out.mkdir()
    script = textwrap.dedent(f"""
        import os, signal, threading, time, torch
        from pathlib import Path
        import specformer.interop.hf as hf

        def kill_once_written_to():
            while not os.listdir({str(out)!r}):
                pass
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=kill_once_written_to, daemon=True).start()
        weights = {{"w": torch.zeros(16_000_000)}}
        hf.write_files({{Path({str(out)!r}) / "model.safetensors": lambda path: hf.save_safetensors(weights, path)}})
        time.sleep(60)  # the kill comes
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == -signal.SIGKILL, result.stderr
    left = os.listdir(out)
    assert left and all(_TEMPORARY.fullmatch(name) or name == "model.safetensors" for name in left), left
    spec = load_spec("gpt-nano", ["decoder.n_layers=1"])
    hf.save_hf(build_model(spec), spec, out)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_removes_the_folders_it_made_and_only_those(tmp_path, error) -> None:
    def fails(path: Path) -> None:
        path.write_bytes(b"partial")
        raise error

    with pytest.raises(type(error)):
        hf.write_files({tmp_path / "a" / "b" / "c" / "x.yaml": fails})
    assert os.listdir(tmp_path) == []

    (tmp_path / "there").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "there" / "notes.txt").write_text("keep\n")
    with pytest.raises(type(error)):
        hf.write_files({tmp_path / "there" / "new" / "x.yaml": lambda path: path.write_text("spec\n"),
                        tmp_path / "empty" / "x.safetensors": fails})
    assert sorted(os.listdir(tmp_path)) == ["empty", "there"]  # empty was there before: it stays
    assert os.listdir(tmp_path / "there") == ["notes.txt"] and os.listdir(tmp_path / "empty") == []


def test_a_folder_that_cannot_be_made_removes_those_made_above_it(tmp_path, monkeypatch) -> None:
    mkdir = Path.mkdir

    def refused(self: Path, *args, **kwargs) -> None:
        if self.name == "c" and self.parent.exists():  # once a and b are made
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refused)
    with pytest.raises(PermissionError):
        hf.write_files({tmp_path / "a" / "b" / "c" / "x.yaml": lambda path: path.write_text("spec\n")})
    assert os.listdir(tmp_path) == []


def test_config_json_is_renamed_last_after_the_weights_are_on_disk(tmp_path, monkeypatch) -> None:
    """A crash between two renames must not leave a new config.json beside old or missing
    weights: the weights (the largest file) go first, then the folder is flushed, then config.json."""
    events: list[str] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            events.append("folder synced")
        fsync(fd)

    def recording_replace(src, dst) -> None:
        events.append(Path(dst).name)
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    out = tmp_path / "hf"
    hf.write_files({  # config.json first, as save_hf gives them
        out / "config.json": lambda path: path.write_text("{}\n"),
        out / "tokenizer.json": lambda path: path.write_bytes(b"t" * 1000),
        out / "model.safetensors": lambda path: hf.save_safetensors({"w": torch.zeros(1000)}, path),
    })
    assert events == ["model.safetensors", "tokenizer.json", "folder synced", "config.json", "folder synced"]

    events.clear()
    spec = load_spec("gpt-nano", ["decoder.n_layers=1"])
    hf.save_hf(build_model(spec), spec, out)
    assert [e for e in events if e != "folder synced"] == ["model.safetensors", "config.json"]
