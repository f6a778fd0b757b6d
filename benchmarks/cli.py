"""``specformer show`` and ``specformer diff`` on a 70B-parameter spec: wall time and peak
resident memory of the whole command, as a person runs it (a fresh process each time,
interpreter start-up and imports included).

    python -m benchmarks.cli [--quick] [--out cli.json]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import base_parser, machine_info, median, print_table, write_json

__all__ = ["main", "run_command", "SPEC_70B"]

SPEC_70B = Path(__file__).resolve().parent / "specs" / "llama2-70b.yaml"


def _specformer() -> list[str]:
    """The installed ``specformer`` entry point next to this interpreter, else ``python -m specformer``."""
    exe = Path(sys.executable).with_name("specformer")
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("specformer")
    return [found] if found else [sys.executable, "-m", "specformer"]


# Linux charges a child's peak RSS with the memory of the process it was forked from, so the
# commands are started from this small launcher (a fresh interpreter that imports nothing
# heavy), never from the benchmark process itself, which has torch loaded.
_LAUNCHER = r"""
import json, os, subprocess, sys, time
cmd = json.loads(sys.argv[1])
start = time.perf_counter()
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
_, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - start
err = proc.stderr.read().decode(errors="replace")
rss = usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024
print(json.dumps({"wall": wall, "rss": rss, "code": os.waitstatus_to_exitcode(status), "err": err[-2000:]}))
"""


def run_command(cmd: Sequence[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one run of ``cmd``, started from a small launcher."""
    out = subprocess.run([sys.executable, "-c", _LAUNCHER, json.dumps(list(cmd))], capture_output=True,
                         text=True, check=True)
    r = json.loads(out.stdout)
    if r["code"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {r['code']}:\n{r['err']}")
    return r["wall"], r["rss"]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = base_parser(__doc__, models=False)  # it runs commands, not models
    p.add_argument("--repeat", type=int, default=None, help="runs per command (default 5; quick 1)")
    p.add_argument("--spec", default=str(SPEC_70B), help="the large spec (default: Llama 2 70B)")
    args = p.parse_args(argv)
    import torch

    repeat = args.repeat or (1 if args.quick else 5)
    sf = _specformer()
    commands = {
        "show": [*sf, "show", args.spec],
        "show --format json": [*sf, "show", args.spec, "--format", "json"],
        "diff 7b 70b": [*sf, "diff", "llama2-7b", args.spec],
        "diff 7b 70b --format json": [*sf, "diff", "llama2-7b", args.spec, "--format", "json"],
        "python -c pass (start-up floor)": [sys.executable, "-c", "pass"],
    }
    rows = []
    for name, cmd in commands.items():
        run_command(cmd)  # warm the file cache
        runs = [run_command(cmd) for _ in range(repeat)]
        walls = [w for w, _ in runs]
        rows.append({"command": name, "argv": cmd, "wall_s": median(walls), "walls_s": walls,
                     "peak_rss_bytes": max(r for _, r in runs)})
    # with PYTHONDONTWRITEBYTECODE set and no bytecode written before, every run compiles
    # specformer's own modules from source (~0.13 s of a show under cProfile on a 2-core Zen 3),
    # which an installed package does not
    no_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    payload = {"benchmark": "cli", "machine": machine_info(torch.device("cpu")), "spec": args.spec,
               "settings": {"repeat": repeat, "quick": args.quick, "dont_write_bytecode": no_bytecode,
                            "targets": "under 1 s and under 300 MB for show/diff of a 70B spec"},
               "results": rows}
    print_table(
        f"specformer show / diff of {Path(args.spec).name} (fresh process per run, median of {repeat})",
        ["command", "wall s", "peak RSS MiB"],
        [[r["command"], r["wall_s"], r["peak_rss_bytes"] / 2**20] for r in rows],
    )
    if no_bytecode:
        print("PYTHONDONTWRITEBYTECODE is set: where no bytecode was written before, each run compiled "
              "specformer's modules from source, which an installed package does not")
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
