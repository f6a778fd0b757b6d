"""Run every benchmark and write one JSON file per benchmark into a folder.

    python -m benchmarks.run_all [--quick] [--out-dir benchmarks/results]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import attention, cli, data, inference, memory, padded, train

__all__ = ["main", "BENCHMARKS"]

BENCHMARKS = {"train": train.main, "padded": padded.main, "inference": inference.main, "memory": memory.main,
              "attention": attention.main, "cli": cli.main, "data": data.main}


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--quick", action="store_true", help="tiny shapes, 1-2 iterations")
    p.add_argument("--out-dir", default="benchmarks/results")
    p.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads for the benchmarks that run models (all but cli and data)")
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    durations = {}
    for name in args.only:
        start = time.perf_counter()
        extra = ["--quick"] if args.quick else []
        if args.threads and name not in ("cli", "data"):  # they run no model
            extra += ["--threads", str(args.threads)]
        BENCHMARKS[name]([*extra, "--out", str(out / f"{name}.json")])
        durations[name] = time.perf_counter() - start
        print(f"{name}: {durations[name]:.0f} s")
    return durations


if __name__ == "__main__":
    main()
