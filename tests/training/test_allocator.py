"""keep_freed_memory: the memory a training step frees stays in the heap for the next step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specformer.training import allocator

pytestmark = pytest.mark.skipif(allocator._glibc() is None, reason="glibc's malloc only")

# one step's buffer, written and freed, as glibc's malloc accounts for it (mallinfo2): served
# by a mapping of its own and unmapped when freed (the next step faults its pages in again),
# or from the heap and kept there as free memory for the next step
_STEP = """
import ctypes, sys
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                      "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, (ctypes.c_size_t,), (ctypes.c_void_p,)
from specformer.training.allocator import keep_freed_memory
print(keep_freed_memory() if sys.argv[1] == "keep" else None)
size = 30 << 20  # an activation of a large step, under glibc's largest mmap threshold
buffer = libc.malloc(size)
ctypes.memset(buffer, 1, size)
print(libc.mallinfo2().hblkhd >= size)  # a mapping of its own
libc.free(buffer)
print(libc.mallinfo2().fordblks >= size)  # kept in the heap once freed
"""


def _run(mode: str, **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    return subprocess.run([sys.executable, "-c", _STEP, mode], capture_output=True, text=True, check=True,
                          env={**environ, **env}).stdout.split()


def test_a_freed_step_buffer_stays_in_the_heap_for_the_next_step() -> None:
    assert _run("default") == ["None", "True", "False"]  # glibc's own: mapped, and given back
    assert _run("keep") == ["True", "False", "True"]


def test_glibcs_own_settings_in_the_environment_are_left_alone() -> None:
    assert _run("keep", MALLOC_TRIM_THRESHOLD_="131072")[0] == "False"
    assert _run("keep", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072") == ["False", "True", "False"]


def test_train_keeps_freed_memory(monkeypatch, tiny) -> None:
    from specformer.training import run

    calls: list[bool] = []
    monkeypatch.setattr(run, "keep_freed_memory", lambda: calls.append(True) or True)
    run.train(tiny("decoder", max_steps=2, val_interval=2), progress=False)
    assert calls == [True]
