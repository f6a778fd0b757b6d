"""Render the JSON files of a benchmark run as markdown tables (for RESULTS.md).

    python -m benchmarks.report benchmarks/results/train.json benchmarks/results/inference.json ...
    python -m benchmarks.report --ratios benchmarks/results/train*.json   # one column per run
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "render", "ratios"]

MIB = 2.0**20


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _n(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _floor(r: dict[str, Any]) -> list[str]:
    """The decoding floor's columns (files written before it existed have none)."""
    if r.get("floor_ms") is None:
        return ["–", "–", "–"]
    return [f"{r['bytes_per_step'] / 1e6:.1f}", _n(r["floor_ms"]), f"{100 * r['fraction_of_floor']:.0f}%"]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render(data: dict[str, Any]) -> str:
    kind = data["benchmark"]
    rows = data["results"]
    if kind == "train":
        compiled = any(r.get("speedup_of_compiled") is not None for r in rows)  # runs with --compile
        return _table(
            ["shape", "precision", "library", "params", "step ms", "tokens/s", "specformer ×",
             *(["compiled ×"] if compiled else []), "model GFLOP/s", "matmul GFLOP/s", "of matmul"],
            [[r["shape"], r["precision"], r["library"], f"{r['params']:,}", _n(r["step_ms"]),
              _n(r["tokens_per_s"]), _x(r["speedup_of_specformer"]),
              *([_x(r.get("speedup_of_compiled"))] if compiled else []), _n(1e3 * r["model_tflops_per_s"]),
              _n(1e3 * r["matmul_tflops_per_s"]), f"{100 * r['fraction_of_matmul']:.0f}%"] for r in rows],
        )
    if kind == "padded":
        compiled = any(r.get("speedup_of_compiled") is not None for r in rows)
        return _table(
            ["shape", "precision", "library", "widths", "cycle ms", "tokens/s", "specformer ×",
             *(["compiled ×"] if compiled else [])],
            [[r["shape"], r["precision"], r["library"], f"{min(r['widths'])}–{max(r['widths'])}", _n(r["cycle_ms"]),
              _n(r["tokens_per_s"]), _x(r["speedup_of_specformer"]),
              *([_x(r.get("speedup_of_compiled"))] if compiled else [])] for r in rows],
        )
    if kind == "inference":
        return _table(
            ["shape", "task", "precision", "library", "batch", "ms", "tokens/s", "specformer ×", "MB/step",
             "floor ms", "of floor"],
            [[r["shape"], r["task"], r["precision"], r["library"], str(r["batch"]), _n(r["ms"]),
              _n(r["tokens_per_s"]), _x(r["speedup_of_specformer"]), *_floor(r)] for r in rows],
        )
    if kind == "memory":
        return _table(
            ["shape", "precision", "library", "params", "baseline MiB", "peak MiB", "added MiB",
             "specformer / library"],
            [[r["shape"], r["precision"], r["library"], f"{r['params']:,}", _n(r["baseline_bytes"] / MIB),
              _n(r["peak_bytes"] / MIB), _n((r.get("cuda_max_allocated_bytes") or r["added_bytes"]) / MIB),
              "–" if r["specformer_over_library"] is None else f"{r['specformer_over_library']:.3f}"]
             for r in rows],
        )
    if kind == "attention":
        return _table(
            ["shape", "precision", "B, H / Hkv, T, Dh", "specformer path", "specformer ms", "torch SDPA ms",
             "specformer ×"],
            [[r["shape"], r["precision"], f"{r['batch']}, {r['heads']} / {r['kv_heads']}, {r['seq_len']}, {r['head_dim']}",
              r["specformer_path"], _n(r["specformer_ms"]), _n(r["torch_ms"]), _x(r["speedup_of_specformer"])]
             for r in rows],
        )
    if kind == "cli":
        return _table(
            ["command", "wall s (median)", "all runs s", "peak RSS MiB"],
            [[r["command"], f"{r['wall_s']:.2f}", ", ".join(f"{w:.2f}" for w in r["walls_s"]),
              f"{r['peak_rss_bytes'] / MIB:.0f}"] for r in rows],
        )
    if kind == "data":
        return _table(
            ["what", "s (median)", "all runs s", "MB/s", "tokens", "of floor"],
            [[r["what"], f"{r['seconds']:.2f}", ", ".join(f"{t:.2f}" for t in r.get("times_s", [r["seconds"]])),
              "–" if r["mb_per_s"] is None else f"{r['mb_per_s']:.2f}", f"{r['tokens']:,}",
              "–" if r.get("of_floor") is None else f"{100 * r['of_floor']:.0f}%"] for r in rows],
        )
    raise ValueError(f"unknown benchmark {kind!r}")


def ratios(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """specformer × each peer, per shape (and task, for inference) and precision, one
    column per run of the same benchmark: how much the same ratio moves between runs."""
    keys: dict[tuple[str, ...], dict[str, float]] = {}
    for name, data in runs:
        for r in data["results"]:
            if r["speedup_of_specformer"] is not None and not r["library"].startswith("specformer"):
                key = (r["shape"], *([r["task"]] if "task" in r else []), r["precision"], r["library"])
                keys.setdefault(key, {})[name] = r["speedup_of_specformer"]
    names = [name for name, _ in runs]
    task = any("task" in r for _, data in runs for r in data["results"])
    rows = []
    for key, by_run in keys.items():
        values = [by_run[n] for n in names if n in by_run]
        rows.append([*key, *(_x(by_run.get(n)) for n in names), f"{min(values):.2f}–{max(values):.2f}×"])
    header = ["shape", *(["task"] if task else []), "precision", "specformer × …"]
    return _table([*header, *names, "range"], rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Render benchmark JSON files as Markdown tables.")
    parser.add_argument("files", nargs="+", help="JSON files written by the benchmarks' --out")
    parser.add_argument("--ratios", action="store_true",
                        help="one table of each specformer × ratio across the files (run to run)")
    args = parser.parse_args(argv)
    missing = [p for p in args.files if not Path(p).is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    loaded = [(path, _load(path, parser)) for path in args.files]
    if args.ratios:
        kinds = sorted({data["benchmark"] for _, data in loaded})
        if len(kinds) > 1:
            parser.error(f"--ratios compares runs of one benchmark; these files are of {', '.join(kinds)}")
        # each run its own column: files of the same name in other folders (results/*/train.json)
        # are told apart by their paths
        stems = [Path(path).stem for path, _ in loaded]
        names = stems if len(set(stems)) == len(stems) else [path for path, _ in loaded]
        print(ratios([(name, data) for name, (_, data) in zip(names, loaded, strict=True)]))
        return
    for path, data in loaded:
        m = data.get("machine", {})
        print(f"### {data['benchmark']} — `{path}`\n")
        print(f"{m.get('date', '?')}, {m.get('cpu', '?')}, {m.get('cpu_count', '?')} cores, torch threads "
              f"{m.get('torch_threads', '?')}, device {m.get('device', '?')}, torch {m.get('torch', '?')}, "
              f"transformers {m.get('transformers', '–')}, x-transformers {m.get('x-transformers', '–')}"
              + (f", malloc {m['malloc']}" if "malloc" in m else "")
              + (f", specformer's float32 products: {m['specformer_fp32_products']}" if "specformer_fp32_products" in m else "")
              + (", training attention: " + ", ".join(f"{k} {v}" for k, v in m["specformer_training_attention"].items())
                 if "specformer_training_attention" in m else "")
              + "\n")
        rounds = sorted({len(r["times_s"]) for r in data["results"] if isinstance(r, dict) and r.get("times_s")})
        if rounds:
            shown = f"{rounds[0]}" if len(rounds) == 1 else f"{rounds[0]}–{rounds[-1]}"
            print(f"Medians of {shown} timed round{'s' if rounds[-1] != 1 else ''} each."
                  + (" A --quick run: a smoke test of the benchmark, not a measurement."
                     if data.get("settings", {}).get("quick") else "") + "\n")
        try:
            print(render(data) + "\n")
        except (KeyError, TypeError, ValueError) as exc:
            parser.error(f"{path}: a row lacks what its table needs ({type(exc).__name__}: {exc}); "
                         "was it written by this version's benchmarks?")


def _load(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """A benchmark's JSON, or an error naming the file and what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        parser.error(f"{path}: not a benchmark's JSON ({exc})")
    if not isinstance(data, dict) or not isinstance(data.get("results"), list) or "benchmark" not in data:
        parser.error(f"{path}: not a benchmark's JSON (no 'benchmark' and 'results' list): write one with a "
                     "benchmark's --out")
    return data


if __name__ == "__main__":
    main()
