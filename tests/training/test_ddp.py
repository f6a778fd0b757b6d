"""Two-process data-parallel training on CPU (gloo) through Lightning's own DDP strategy."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

DDP_RUN = textwrap.dedent(
    """
    import sys
    import torch
    import lightning as L
    from specformer import load_spec
    from specformer.training.run import train

    class SaveWeights(L.Callback):
        def on_train_end(self, trainer, module):
            state = {k: v.detach().clone() for k, v in module.model.state_dict().items()}
            torch.save({"state": state, "world": trainer.world_size, "steps": trainer.global_step},
                       f"rank{trainer.global_rank}.pt")

    if __name__ == "__main__":
        torch.set_num_threads(1)
        train(load_spec(sys.argv[1]), progress=False, callbacks=[SaveWeights()])
    """
)


@pytest.mark.slow
def test_two_process_ddp_ends_with_identical_weights(tiny: Any, tmp_path: Path, child_env: dict[str, str]) -> None:
    import yaml

    spec = tiny("decoder", max_steps=6, val_interval=3, strategy="ddp", devices=2, accelerator="cpu")
    spec["embedding"] = {"dropout": 0.1}  # ranks draw different dropout masks; gradients still agree
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "ddp_run.py").write_text(DDP_RUN)
    env = child_env
    proc = subprocess.run(
        [sys.executable, "ddp_run.py", "spec.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["world"] == r1["world"] == 2 and r0["steps"] == r1["steps"] == 6
    assert r0["state"].keys() == r1["state"].keys()
    for name, value in r0["state"].items():
        assert torch.equal(value, r1["state"][name]), name
    # and training moved them: not the initial weights
    from specformer import load_spec
    from specformer.builder import build_model

    torch.manual_seed(0)
    initial = build_model(load_spec(spec)).state_dict()
    assert any(not torch.equal(initial[k], r0["state"][k]) for k in initial)
    ckpts = list((tmp_path / "runs" / spec["name"]).glob("*/checkpoints/last.ckpt"))
    assert len(ckpts) == 1  # both ranks wrote into one run folder, rank 0 saved


@pytest.mark.slow
def test_a_two_process_run_from_the_command_line_reports_once(tiny: Any, tmp_path: Path, child_env: dict[str, str]) -> None:
    import yaml

    spec = tiny("decoder", max_steps=2, val_interval=2, strategy="ddp", devices=2, accelerator="cpu")
    spec["training"]["schedule"] = {"type": "linear", "warmup_steps": 4}  # longer than the run: a warning
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = {**child_env, "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "specformer", "train", "spec.yaml", "--no-progress"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the second process runs the command too; only rank 0 prints
    assert proc.stdout.count("preparing data") == 1 and proc.stdout.count("trained tiny-decoder") == 1, proc.stdout
    assert proc.stderr.count("warmup_steps=4 is above") == 1, proc.stderr
    assert "deprecated" not in proc.stderr, proc.stderr  # torch's words about Lightning's all_gather
    # validation sums over the processes itself: Lightning's advice to sync its logs is not shown
    assert "sync_dist=True" not in proc.stderr, proc.stderr
    # the training loss is the global batch's: one process of the same global batch logs the same
    single = subprocess.run(
        [sys.executable, "-m", "specformer", "train", "spec.yaml", "--no-progress", "--set", "training.devices=1",
         "--set", "training.strategy=auto", "--set", f"training.batch_size={2 * spec['training']['batch_size']}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    import csv

    def train_losses(run: Path) -> list[float]:
        with open(run / "metrics.csv") as f:
            return [float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]

    two, one = sorted((tmp_path / "runs" / spec["name"]).iterdir())
    assert train_losses(two) == pytest.approx(train_losses(one), rel=1e-5) and train_losses(two)


@pytest.mark.slow
def test_two_processes_of_pairs_step_as_one_process_of_the_whole_batch(
        tiny: Any, tmp_path: Path, child_env: dict[str, str]) -> None:
    # each process's micro-batch of pairs predicts its own count of tokens: averaging the
    # processes' means (DDP's) weighed a token of the shorter shard more
    import json
    import random

    import yaml

    rng = random.Random(0)
    words = ["red", "blue", "cat", "dog", "sun", "sky", "big", "old"]
    lines = []
    for _ in range(200):
        picked = rng.sample(words, rng.randint(1, 4))
        lines.append(json.dumps({"source": f"reverse {' '.join(picked)}:", "target": " " + " ".join(picked[::-1])}))
    (tmp_path / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    sgd = {"type": "sgd", "lr": 0.5, "momentum": 0.0, "weight_decay": 0.0}
    common = dict(max_steps=1, val_interval=1, val_batches=1, grad_clip=0, optimizer=sgd,
                  data={"type": "pairs", "paths": [str(tmp_path / "pairs.jsonl")], "val_fraction": 0.1})
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(tiny("decoder", batch_size=4, strategy="ddp", devices=2,
                                                           accelerator="cpu", **common)))
    (tmp_path / "ddp_run.py").write_text(DDP_RUN)
    proc = subprocess.run([sys.executable, "ddp_run.py", "ddp.yaml"], cwd=tmp_path, env=child_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = torch.load(tmp_path / "rank0.pt", weights_only=True)["state"]

    from specformer import load_spec
    from specformer.training.checkpoint import load_checkpoint
    from specformer.training.run import train

    one = load_checkpoint(train(load_spec(tiny("decoder", batch_size=8, **common)), progress=False).checkpoint)
    for name, value in one.model.state_dict().items():
        assert torch.allclose(two[name], value, atol=2e-6), name
