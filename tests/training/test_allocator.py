"""keep_freed_memory: a training step's freed memory is reused by the next, without page faults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specformer.training import allocator

pytestmark = pytest.mark.skipif(allocator._glibc() is None, reason="glibc's malloc only")

# a step's pattern: a few activation-sized buffers written, then all freed together. With
# glibc's own thresholds the freed heap top is more than its trim threshold (twice the largest
# buffer) and goes back to the system, so every step faults its pages in again
_STEPS = """
import resource, sys, torch
from specformer.training.allocator import keep_freed_memory
print(keep_freed_memory() if sys.argv[1] == "keep" else None)
def step():
    buffers = [torch.empty(1 << 20).fill_(1.0) for _ in range(8)]  # 8 x 4 MiB
    del buffers
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
"""


def _run(mode: str, **env: str) -> tuple[str, float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _STEPS, mode], capture_output=True, text=True, check=True,
                         env={**environ, **env}).stdout.split()
    return out[0], float(out[1])


def test_training_steps_stop_faulting_in_fresh_pages() -> None:
    applied, kept = _run("keep")
    _, default = _run("default")
    assert applied == "True"
    assert default > 1000  # glibc's own thresholds: a thousand fresh pages and more a step
    assert kept < 50, (kept, default)


def test_glibcs_own_settings_in_the_environment_are_left_alone() -> None:
    applied, faults = _run("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert applied == "False"
    applied, _ = _run("keep", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072")
    assert applied == "False"


def test_train_keeps_freed_memory(monkeypatch, tiny) -> None:
    from specformer.training import run

    calls: list[bool] = []
    monkeypatch.setattr(run, "keep_freed_memory", lambda: calls.append(True) or True)
    run.train(tiny("decoder", max_steps=2, val_interval=2), progress=False)
    assert calls == [True]
