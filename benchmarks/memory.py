"""Peak memory of the training step (forward + backward + AdamW), each library measured
alone in its own fresh process so that one model's allocations never hide another's.

On CPU: the peak resident set size. The peak is reset after the imports (Linux
``/proc/self/clear_refs``), so ``peak - baseline`` is what building the model, the
optimizer and running the steps added; the absolute peak is reported too. Before the
baseline, each process runs one step of a tiny model of the same library, so one-time
costs (lazy imports, kernel set-up) are not counted as the model's; the memory that step
freed goes back to the system first (``malloc_trim``), so the model measured faults in its
own pages even where it is as small as the warm-up's (``--quick``). On CUDA:
``torch.cuda.max_memory_allocated``.

    python -m benchmarks.memory [--quick] [--shapes ...] [--out memory.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    apply_malloc,
    at_least,
    available_libraries,
    base_parser,
    machine_info,
    print_table,
    select_shapes,
    write_json,
)

__all__ = ["main", "child"]

ROOT = Path(__file__).resolve().parent.parent


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _release_freed_memory() -> None:
    """glibc's ``malloc_trim(0)``: free heap pages go back to the system (nothing elsewhere)."""
    from specformer.training.allocator import _glibc

    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def child(shape_name: str, library: str, precision: str, quick: bool, steps: int) -> dict[str, Any]:
    """Runs in the subprocess: build one library's model, train ``steps`` steps, report."""
    import gc

    import torch

    from benchmarks.common import (
        build_single,
        current_rss_bytes,
        device,
        make_batch,
        make_optimizer,
        peak_memory_bytes,
        quiet,
        training_step,
    )

    quiet()
    dev = device()
    shape = select_shapes([shape_name], quick)[0]
    if library == "transformers":
        import transformers  # noqa: F401  (imported before the baseline, as its import is not the model)
    elif library == "x-transformers":
        import x_transformers  # noqa: F401
    # one step of the tiny version first: lazy imports, kernel and allocator set-up are
    # one-time costs of the process, not memory the model needs
    tiny = select_shapes([shape_name], True)[0]
    warm = build_single(tiny, dev, library)
    if warm is not None:
        training_step(warm, make_batch(tiny, dev), make_optimizer(warm.model, dev),
                      bf16=precision == "bf16", dev=dev)()
    del warm
    batch = make_batch(shape, dev)
    gc.collect()
    # the warm-up's freed memory back to the system: kept (--malloc keep), a model as small as
    # the warm-up's (--quick) would reuse its pages and add nothing to the resident set
    _release_freed_memory()
    reset = _reset_peak()
    baseline = current_rss_bytes()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    adapter = build_single(shape, dev, library)
    if adapter is None:
        return {"skipped": f"{library} has no {shape.kind} model"}
    opt = make_optimizer(adapter.model, dev)
    step = training_step(adapter, batch, opt, bf16=precision == "bf16", dev=dev)
    for _ in range(steps):
        step()
    out = {"params": adapter.params, "baseline_bytes": baseline, "peak_bytes": peak_memory_bytes(),
           "peak_reset": reset}
    out["added_bytes"] = out["peak_bytes"] - baseline
    if dev.type == "cuda":
        out["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
    return out


def _run_child(shape: str, library: str, precision: str, quick: bool, steps: int,
               threads: int | None, malloc: str = "keep") -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.memory", "--child", shape, library, precision, "--steps", str(steps),
           "--malloc", malloc]
    if quick:
        cmd.append("--quick")
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {shape}/{library}/{precision} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = base_parser(__doc__)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--steps", type=at_least(1), default=None, help="training steps per process (default 3; quick 1)")
    p.add_argument("--child", nargs=3, metavar=("SHAPE", "LIBRARY", "PRECISION"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    steps = args.steps or (1 if args.quick else 3)
    apply_malloc(args)  # the parent, and each child process as it starts
    if args.child:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        result = child(*args.child, quick=args.quick, steps=steps)
        print(json.dumps(result))
        return result
    import torch

    from benchmarks.common import device

    dev = device()
    shapes = select_shapes(args.shapes, args.quick)
    libraries = available_libraries(args.libraries)
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        for precision in args.precisions:
            ours = None
            for lib in libraries:
                r = _run_child(shape.name, lib, precision, args.quick, steps, args.threads, args.malloc)
                if "skipped" in r:
                    continue
                key = "cuda_max_allocated_bytes" if dev.type == "cuda" else "added_bytes"
                if lib == "specformer":
                    ours = r[key]
                rows.append({"shape": shape.name, "precision": precision, "library": lib, **r,
                             "measure": key,
                             "specformer_over_library": ours / r[key] if lib != "specformer" and ours else None})
    payload = {"benchmark": "memory", "machine": machine_info(dev), "libraries": libraries,
               "settings": {"steps": steps, "quick": args.quick, "torch": torch.__version__,
                            "what": "peak RSS above the post-import baseline (CPU) or "
                                    "torch.cuda.max_memory_allocated (CUDA), one process per row"},
               "results": rows}
    mib = 2.0**20
    print_table(
        f"Peak memory of the training step on {dev} ({steps} steps, one process per row)",
        ["shape", "precision", "library", "params", "baseline MiB", "peak MiB", "added MiB", "specformer / lib"],
        [[r["shape"], r["precision"], r["library"], r["params"], r["baseline_bytes"] / mib, r["peak_bytes"] / mib,
          (r.get("cuda_max_allocated_bytes") or r["added_bytes"]) / mib, r["specformer_over_library"]]
         for r in rows],
    )
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
