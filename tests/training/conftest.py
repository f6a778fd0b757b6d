"""Tiny specs that train in seconds on a CPU, on a small slice of real text."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path
from typing import Any

import pytest

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TEXT_GLOB = str(STDLIB / "json" / "*.py")  # ~70 KB of real code and docstrings, in every Python


def tiny_spec(kind: str = "decoder", tmp: Path | None = None, **training: Any) -> dict[str, Any]:
    """A one-layer model of the given kind with a ``training:`` section for a seconds-long run."""
    stack = {"n_layers": 1, "attention": {"n_heads": 2}, "ffn": {"d_ff": 64}}
    spec: dict[str, Any] = {
        "name": f"tiny-{kind}",
        "kind": kind,
        "vocab_size": 300 if kind != "encoder-decoder" else 64,
        "d_model": 32,
        "max_seq_len": 64,
        "positional": {"type": "learned"},
    }
    if kind == "decoder":
        spec["decoder"] = stack
    elif kind == "encoder":
        spec["encoder"] = stack
    else:
        spec["encoder"] = stack
        spec["decoder"] = stack
    t: dict[str, Any] = {
        "batch_size": 8,
        "seq_len": 32,
        "max_steps": 20,
        "val_interval": 10,
        "val_batches": 4,
        "log_interval": 5,
        "optimizer": {"type": "adamw", "lr": 3e-3},
        "schedule": {"type": "constant", "warmup_steps": 0},
        "num_workers": 0,
        "accelerator": "cpu",
        "devices": 1,
    }
    if kind == "encoder-decoder":
        t["data"] = {"type": "synthetic", "task": "copy", "min_len": 3, "max_len": 6, "n_train": 2000, "n_val": 64}
    else:
        t["data"] = {"type": "files", "paths": [TEXT_GLOB]}
        t["tokenizer"] = {"type": "byte"}
    if tmp is not None:
        t["out_dir"] = str(tmp / "runs")
        t["cache_dir"] = str(tmp / "cache")
    for key, value in training.items():
        t[key] = value
    spec["training"] = t
    return spec


@pytest.fixture
def tiny(tmp_path: Path) -> Any:
    """``tiny(kind, **training)``: a :func:`tiny_spec` whose runs and caches live in the test's folder."""

    def make(kind: str = "decoder", **training: Any) -> dict[str, Any]:
        return tiny_spec(kind, tmp_path, **training)

    return make


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs, caches and Lightning's files stay inside the test's own folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECFORMER_RUN_DIR", raising=False)


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """Tiny models run fastest on one thread, and stay fast on a busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment of a test's subprocess: it imports the specformer under test (not
    another copy installed in the environment) and runs on one thread."""
    import specformer

    root = str(Path(specformer.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def _sigterm_fails_the_test() -> Any:
    """A test that signals its own process (SIGTERM, as ``kill`` sends) where nothing handles
    it fails, instead of ending the whole test session."""
    import signal

    def unhandled(signum: int, frame: Any) -> None:
        if signal.getsignal(signal.SIGTERM) is unhandled:  # not called after Lightning's own handler
            raise AssertionError("SIGTERM reached the test process' own handler")

    previous = signal.signal(signal.SIGTERM, unhandled)
    yield unhandled
    signal.signal(signal.SIGTERM, previous)
