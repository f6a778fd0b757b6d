"""End-to-end tiny runs: every objective learns, runs are written where documented."""

from __future__ import annotations

import csv
import errno
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from specformer import load_spec
from specformer.training.run import train


@pytest.mark.parametrize(
    "kind,objective",
    [("decoder", "causal_lm"), ("encoder", "masked_lm"), ("encoder-decoder", "seq2seq")],
)
def test_each_objective_lowers_the_validation_loss(tiny, kind: str, objective: str) -> None:
    spec = load_spec(tiny(kind, max_steps=40, val_interval=10))
    assert spec.training.objective.type == objective  # the default follows the kind
    result = train(spec, progress=False)
    losses = [h["val/loss"] for h in result.history]
    assert len(losses) == 4
    assert losses[-1] < losses[0] - 0.3, losses
    # the first validation already follows 10 steps; the untrained model is near ln(V)
    assert losses[0] < torch.log(torch.tensor(float(spec.vocab_size))).item() + 0.5
    if kind != "encoder-decoder":
        # bytes of English and code: a context-free model needs 3-5 nats per token
        assert result.unigram_loss is not None and 3.0 < result.unigram_loss < 5.0
    else:
        assert result.exact_match is not None and 0.0 <= result.exact_match <= 1.0


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_activation_checkpointing_trains_the_same_run(tiny, kind: str) -> None:
    import lightning as L

    seen: list[bool] = []

    class Seen(L.Callback):
        def on_train_start(self, trainer: L.Trainer, module: Any) -> None:
            seen.append(module.model.is_gradient_checkpointing)

    plain = train(load_spec(tiny(kind, max_steps=6, val_interval=3)), progress=False, callbacks=[Seen()])
    checkpointed = train(load_spec(tiny(kind, max_steps=6, val_interval=3, activation_checkpointing=True)),
                         progress=False, callbacks=[Seen()])
    assert seen == [False, True]
    assert [h["val/loss"] for h in checkpointed.history] == pytest.approx(
        [h["val/loss"] for h in plain.history], abs=1e-5)
    assert checkpointed.train_loss == pytest.approx(plain.train_loss, abs=1e-5)


def test_loggers_given_run_beside_the_runs_own_and_a_wrong_callback_is_named_first(tiny, tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    spec = load_spec(tiny("decoder", max_steps=4, val_interval=2, log_interval=1))
    result = train(spec, progress=False, loggers=[CSVLogger(str(tmp_path / "mine"), name="", version="")])
    assert (Path(result.run_dir) / "metrics.csv").is_file()  # the run folder's, as documented
    assert "train/loss" in (tmp_path / "mine" / "metrics.csv").read_text()  # and the caller's
    quiet = train(spec, progress=False, loggers=False)
    assert not (Path(quiet.run_dir) / "metrics.csv").exists()
    runs = set(Path(result.run_dir).parent.iterdir())
    for callbacks in ([5], 5):
        with pytest.raises(TypeError, match=r"callbacks\[0\] is an int, not a lightning.pytorch Callback"):
            train(spec, progress=False, callbacks=callbacks)
    assert set(Path(result.run_dir).parent.iterdir()) == runs  # no folder with a spec.yaml alone
    # a spawning strategy would fail on pickling the run's console after the data is prepared
    from specformer.specs.errors import SpecError

    spawned = load_spec(tiny("decoder", max_steps=4, strategy="ddp_spawn", devices=1, accelerator="cpu"))
    with pytest.raises(SpecError, match=r"'ddp_spawn' starts its processes by pickling the trainer"):
        train(spawned, progress=False)
    assert set(Path(result.run_dir).parent.iterdir()) == runs
    # training.compile without a C++ compiler failed at the first step, in inductor's words
    from torch._inductor import cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    def no_compiler() -> str:
        raise InvalidCxxCompiler()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
        compiled = load_spec(tiny("decoder", max_steps=4, compile=True))
        with pytest.raises(SpecError, match=r"training.compile: torch.compile cannot build its CPU kernels here: "
                                            r"No working C\+\+ compiler.*\n.*or set training.compile=false"):
            train(compiled, progress=False)
    assert set(Path(result.run_dir).parent.iterdir()) == runs
    # a Trainer argument the spec cannot hold names the field, not a --set the caller never wrote
    with pytest.raises(ValueError, match=r"max_steps='5': .* not valid there:\n  training.max_steps: expected an "
                                         r"integer, got the string '5'$") as info:
        train(spec, progress=False, max_steps="5")
    assert "--set" not in str(info.value)


def test_a_run_that_fails_before_its_first_step_leaves_no_folder(tiny, tmp_path: Path) -> None:
    # it left runs/NAME/<ts>/ with a spec.yaml alone, which `generate runs/NAME` took for the latest run
    import io

    import lightning as L
    from rich.console import Console

    class Boom(L.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
            raise RuntimeError("out of memory at the first step")

    spec = load_spec(tiny("decoder", max_steps=2, schedule={"type": "cosine", "warmup_steps": 3}))
    out = io.StringIO()
    with pytest.raises(RuntimeError, match="out of memory at the first step"):
        train(spec, progress=False, callbacks=[Boom()], console=Console(file=out, width=300))
    runs = tmp_path / "runs" / "tiny-decoder"
    assert not runs.exists() or not any(runs.iterdir())
    assert "training.schedule.warmup_steps=3 is above the run's 2 steps" in out.getvalue()
    # and so does Ctrl-C before the first step
    from specformer.training.stops import TrainingInterrupted

    class CtrlC(L.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
            raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted, match="at step 0; no checkpoint yet"):
        train(spec, progress=False, callbacks=[CtrlC()])
    assert not runs.exists() or not any(runs.iterdir())
    # a folder that holds a checkpoint is kept, whatever this process's trainer says of its steps
    from specformer.training import run

    class CheckpointThenCtrlC(L.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
            folder = Path(os.environ[run.RUN_DIR_ENV]) / "checkpoints"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "last.ckpt").write_bytes(b"written by another process")
            raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted):
        train(spec, progress=False, callbacks=[CheckpointThenCtrlC()])
    assert [p.name for p in runs.glob("*/checkpoints/*.ckpt")] == ["last.ckpt"]


def test_a_step_far_past_the_machines_memory_is_refused_with_the_batch_that_fits(tiny, tmp_path: Path,
                                                                                   monkeypatch) -> None:
    # batch_size 100,000 on a 23 GiB machine was killed by the kernel after the data, saying nothing
    import io

    from rich.console import Console

    from specformer.analysis.memory import memory_estimate
    from specformer.specs.errors import SpecError
    from specformer.training import run

    spec = load_spec(tiny("decoder", max_steps=1, batch_size=4096))
    estimate = memory_estimate(spec, batch=4096, seq_len=32, dtype="32")
    machine = estimate.total // 4
    monkeypatch.setattr(run, "_memory_of_this_machine", lambda: (machine, machine))
    with pytest.raises(SpecError) as info:
        train(spec, progress=False)
    text = str(info.value)
    assert "training.batch_size: a training step of 4,096 sequences of 32 tokens takes about" in text
    fits = int(re.search(r"training.batch_size=(\d+) fits", text).group(1))
    per_sequence = estimate.activations / 4096
    assert (estimate.total - estimate.activations) + fits * per_sequence <= 0.8 * machine  # room beside it
    assert (estimate.total - estimate.activations) + (fits + 1) * per_sequence > 0.8 * machine
    assert f"accumulate={-(-4096 // fits)}" in text
    # an accumulate set already is kept in the batch the hint keeps (4096 × 4 sequences a step)
    with pytest.raises(SpecError) as info:
        train(load_spec(tiny("decoder", max_steps=1, batch_size=4096, accumulate=4)), progress=False)
    assert f"accumulate={-(-4096 * 4 // fits)}" in str(info.value)
    # placed at no --set of another field (it was labelled with --set training.max_steps=5)
    from typer.testing import CliRunner

    from specformer.cli import app

    (tmp_path / "big.yaml").write_text(yaml.safe_dump(tiny("decoder", batch_size=4096)))
    out = CliRunner().invoke(app, ["train", str(tmp_path / "big.yaml"), "--set", "training.max_steps=5"],
                             env={"COLUMNS": "300"})
    assert out.exit_code == 1 and "big.yaml:15:3: training.batch_size: a training step of 4,096" in out.stderr
    assert "--set training.max_steps" not in out.stderr
    out = CliRunner().invoke(app, ["train", "gpt-nano", "--set", "training.batch_size=4096", "--set",
                                   "training.max_steps=5"], env={"COLUMNS": "300"})
    assert "--set training.batch_size=4096: training.batch_size:" in out.stderr, out.output  # the one that set it
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("spec.yaml"))
    # past what is free now (but not the machine): a warning, and the run goes on
    small = load_spec(tiny("decoder", max_steps=1, val_interval=1, val_batches=1))
    need = memory_estimate(small, batch=8, seq_len=32, dtype="32").total
    monkeypatch.setattr(run, "_memory_of_this_machine", lambda: (10 * need, need // 2))
    out = io.StringIO()
    train(small, progress=False, console=Console(file=out, width=300))
    assert "more than the 0.0 GiB free on this machine now: it may swap, or be killed for memory" in out.getvalue()


def test_run_folder_holds_spec_logs_checkpoint_and_summary(tiny, tmp_path: Path) -> None:
    spec = load_spec(tiny("decoder", max_steps=12, val_interval=6, log_interval=2))
    result = train(spec, progress=False)
    run = Path(result.run_dir)
    assert run.parent == tmp_path / "runs" / "tiny-decoder"
    assert load_spec(str(run / "spec.yaml")) == spec
    assert Path(result.checkpoint) == run / "checkpoints" / "last.ckpt"
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    train_steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert train_steps and max(train_steps) >= 10
    assert any(r.get("val/loss") for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["val_loss"] == pytest.approx(result.val_loss)
    assert summary["tokens"] == 12 * 8 * 32  # batch × seq_len per step, every step
    assert result.tokens_per_second > 0 and result.wall_seconds >= result.train_seconds > 0
    # tokens/s is over the steps' own time: the validations' (here 2 of them) are left out, as
    # nanoGPT's time per iteration leaves out its evaluations
    assert 0 < result.val_seconds < result.train_seconds
    assert result.tokens_per_second == pytest.approx(summary["tokens"] / (result.train_seconds - result.val_seconds))
    # what a notebook shows after train(): the numbers, not one dict per validation
    assert summary["history"] == result.history and len(result.history) == 2
    assert "history" not in repr(result) and f"val_loss={result.val_loss!r}" in repr(result)


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_validation_loss_is_the_likelihood_whatever_the_label_smoothing(tiny, kind: str) -> None:
    # the same weights and data, trained 0 steps: val/loss is the model's NLL, not the
    # smoothed training loss (which is larger), so perplexity means what it says
    import lightning as L

    from specformer.builder.lightning import SpecModule
    from specformer.data.module import SpecDataModule

    losses = []
    for smoothing in (0.0, 0.3):
        spec = load_spec(tiny(kind, max_steps=1, val_interval=1,
                              objective={"type": "causal_lm" if kind == "decoder" else "seq2seq",
                                         "label_smoothing": smoothing}))
        L.seed_everything(0, verbose=False)
        module, data = SpecModule(spec), SpecDataModule(spec)
        trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_checkpointing=False, limit_val_batches=2, enable_model_summary=False)
        trainer.validate(module, datamodule=data, verbose=False)
        losses.append(module.val_history[-1]["val/loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    # the training loss does include the smoothing (another number on the same batch)
    batch = next(iter(data.val_dataloader()))
    with torch.no_grad():
        smoothed = float(module.objective(module, batch).loss)
        plain = float(module.objective(module._unsmoothed, batch).loss)
    assert abs(smoothed - plain) > 1e-4


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_validation_on_two_processes_counts_each_example_once(tiny, monkeypatch, kind: str) -> None:
    # 50 held-out examples at batch 8 on 2 processes: the last global batch has 2 real rows
    # (rank 0) and 14 that only fill it up, 6 of them rank 1's whole batch. Summed over the
    # ranks, validation must equal one process over the same examples.
    from specformer.builder.lightning import SpecModule
    from specformer.data.module import SpecDataModule

    if kind == "decoder":
        spec = load_spec(tiny(kind, val_batches=None))
    else:
        spec = load_spec(tiny(kind))
        spec = load_spec(spec.to_dict(), ["training.data.n_val=50"])
    torch.manual_seed(0)
    module = SpecModule(spec)

    def sums(rank: int, world: int) -> tuple[dict[str, float], int]:
        data = SpecDataModule(spec)
        data.setup()
        monkeypatch.setattr(data, "_placement", lambda: (rank, world, 0))
        module.tokenizer = data.tokenizer
        module.on_validation_epoch_start()
        with torch.no_grad():
            for i, batch in enumerate(data.val_dataloader()):
                module.validation_step(batch, i)
        return module._val_sums, len(data.data.val)

    one, n = sums(0, 1)
    assert n % 16 not in (0, 8)  # the last global batch is short of rank 1's share
    r0, _ = sums(0, 2)
    r1, _ = sums(1, 2)
    assert r0["tokens"] + r1["tokens"] == one["tokens"]
    assert r0["loss"] + r1["loss"] == pytest.approx(one["loss"], rel=1e-6)
    if kind == "encoder-decoder":
        assert one["examples"] == 50 and r0["examples"] + r1["examples"] == 50
        assert r0["correct"] + r1["correct"] == one["correct"]


def test_a_spec_name_cannot_lead_its_run_folder_out_of_out_dir(tiny, tmp_path: Path) -> None:
    spec = load_spec({**tiny("decoder", max_steps=1, val_interval=1), "name": "../../escaped/x"})
    result = train(spec, progress=False)
    runs = (tmp_path / "runs").resolve()
    assert Path(result.run_dir).resolve().parent == runs / "..-..-escaped-x"
    assert not (tmp_path.parent / "escaped").exists()


def test_settings_that_cannot_run_fail_before_the_data_is_prepared(tiny, tmp_path: Path, monkeypatch) -> None:
    from specformer.data import module as data_module
    from specformer.data.corpus import DataError
    from specformer.specs.errors import SpecError

    def no_data(*args, **kwargs):
        raise AssertionError("the data was prepared")

    monkeypatch.setattr(data_module.SpecDataModule, "setup", no_data)
    (tmp_path / "f").write_text("")
    with pytest.raises(DataError, match=r"training.out_dir: .*/f is a file, not a folder"):
        train(load_spec(tiny("decoder", out_dir=str(tmp_path / "f"))), progress=False)
    with pytest.raises(DataError, match=r"training.out_dir: cannot create the folder .*f/x"):
        train(load_spec(tiny("decoder", out_dir=str(tmp_path / "f" / "x"))), progress=False)
    with pytest.raises(DataError, match=r"training.cache_dir: .*/f is a file, not a folder"):
        train(load_spec(tiny("decoder", cache_dir=str(tmp_path / "f"))), progress=False)
    # a cache folder the spec does not name is named as the user set it
    monkeypatch.setenv("SPECFORMER_CACHE", str(tmp_path / "f" / "cache"))
    with pytest.raises(DataError, match=r"^\$SPECFORMER_CACHE \(the default training.cache_dir\): cannot create "
                                        r"the folder .*f/cache"):
        train(load_spec(tiny("decoder", cache_dir=None)), progress=False)
    classifier = {**tiny("encoder"), "head": {"type": "classification", "n_classes": 2}}
    del classifier["training"]["data"]
    with pytest.raises(SpecError, match=r"training.data: a classifier trains on labelled texts, which have no default"):
        train(load_spec(classifier), progress=False)
    for field, value in (("accelerator", "banana"), ("devices", [])):
        with pytest.raises(SpecError, match=f"training.{field}"):
            load_spec(tiny("decoder", **{field: value}))
    # what Lightning refuses or changes on this machine, named by its field
    if not torch.cuda.is_available():
        with pytest.raises(SpecError, match=r"training.accelerator: 'gpu' cannot run here"):
            train(load_spec(tiny("decoder", accelerator="gpu")), progress=False)
        with pytest.raises(SpecError, match=r"training.precision: 16-mixed cannot run on CPU: Lightning would run "
                                            r"bf16-mixed[\s\S]*training.precision=bf16-mixed"):
            train(load_spec(tiny("decoder", precision="16-mixed")), progress=False)
    with pytest.raises(SpecError, match=r"training.strategy: 'bogus' is not a strategy Lightning knows"):
        train(load_spec(tiny("decoder", strategy="bogus")), progress=False)
    # a typo gets the closest name; the spawning strategies, refused, are not offered
    with pytest.raises(SpecError) as info:
        train(load_spec(tiny("decoder", strategy="dpp")), progress=False)
    assert "did you mean 'ddp'? allowed: auto, ddp," in str(info.value) and "spawn" not in str(info.value)
    # forked processes take the steps: this process's trainer said step 0, and a Ctrl-C after
    # thousands of steps removed the run folder with its checkpoints as a run that trained nothing
    for forked in ("ddp_fork", "ddp_notebook"):
        with pytest.raises(SpecError, match=rf"training.strategy: '{forked}' trains in processes forked from this "
                                            r"one[\s\S]*strategy: ddp"):
            train(load_spec(tiny("decoder", strategy=forked, accelerator="cpu", devices=1)), progress=False)
    assert "fork" not in str(info.value)  # nor offered
    # one CPU process a device: more processes than cores is refused before any starts
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with pytest.raises(SpecError, match=rf"training.devices: {cores + 1} starts {cores + 1} training processes on the "
                                        rf"CPU, which has {cores} cores?[\s\S]*give at most {cores}"):
        train(load_spec(tiny("decoder", accelerator="cpu", devices=cores + 1)), progress=False)
    assert not list((tmp_path / "runs").glob("*/*"))  # no run folder left behind
    monkeypatch.undo()
    # a Trainer setting passed to train() replaces the spec's: the spec's is not checked
    done = train(load_spec(tiny("decoder", max_steps=1, val_interval=1, strategy="bogus")), progress=False,
                 strategy="auto")
    assert done.steps == 1


def test_a_read_only_out_dir_is_refused_before_the_data_is_prepared(tiny, tmp_path: Path, monkeypatch) -> None:
    from specformer.data import module as data_module
    from specformer.data.corpus import DataError

    def no_data(*args, **kwargs):
        raise AssertionError("the data was prepared")

    frozen = tmp_path / "frozen"
    frozen.mkdir()
    real_open, real_mkdir = os.open, os.mkdir

    def read_only(real):  # a read-only file system: it refuses root too, whatever the permissions
        def call(path, *args, **kwargs):
            if Path(os.fsdecode(path)).is_relative_to(frozen):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "open", read_only(real_open))
    monkeypatch.setattr(os, "mkdir", read_only(real_mkdir))
    monkeypatch.setattr(data_module.SpecDataModule, "setup", no_data)
    with pytest.raises(DataError) as caught:
        train(load_spec(tiny("decoder", out_dir=str(frozen))), progress=False)
    assert str(caught.value) == f"training.out_dir: cannot write in the folder {frozen} (Read-only file system)"


def test_the_validation_after_the_last_step_is_counted_as_validation(tiny, monkeypatch) -> None:
    # 5 steps, a validation every 4: the run validates once more after step 5, which takes
    # (at least) the time slept here; it is part of the run's time and said as validation time
    import time

    import lightning

    validate = lightning.Trainer.validate

    def slow(self, *args, **kwargs):
        time.sleep(0.5)
        return validate(self, *args, **kwargs)

    monkeypatch.setattr(lightning.Trainer, "validate", slow)
    result = train(load_spec(tiny("decoder", max_steps=5, val_interval=4)), progress=False)
    assert [h["step"] for h in result.history] == [4, 5]
    assert result.val_seconds >= 0.5 and result.train_seconds - result.val_seconds > 0
    assert result.wall_seconds >= result.train_seconds


def test_a_run_that_fails_before_it_starts_leaves_no_output_folder(tiny, tmp_path: Path, monkeypatch) -> None:
    from specformer.data import module as data_module
    from specformer.data.corpus import DataError

    def bad_data(*args, **kwargs):
        raise DataError("training.data.paths: nothing matches 'nothere.txt'")

    monkeypatch.setattr(data_module.SpecDataModule, "setup", bad_data)
    out = tmp_path / "new" / "runs"
    with pytest.raises(DataError, match="nothere.txt"):
        train(load_spec(tiny("decoder", out_dir=str(out))), progress=False)
    assert not (tmp_path / "new").exists()


def test_a_full_disk_at_the_start_leaves_no_run_and_at_the_end_keeps_the_result(tiny, tmp_path: Path, monkeypatch) -> None:
    from io import StringIO

    from rich.console import Console

    from specformer.data.corpus import DataError
    from specformer.training import run as run_module

    write = run_module.atomic_write_text

    def full(name: str):
        def write_or_fail(path, text):
            if Path(path).name == name:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            write(path, text)
        return write_or_fail

    spec = load_spec(tiny("decoder", max_steps=2, val_interval=2, val_batches=1))
    monkeypatch.setattr(run_module, "atomic_write_text", full("spec.yaml"))
    with pytest.raises(DataError, match=r"^training.out_dir: cannot write .*/spec.yaml \(No space left on device\); "
                                        r"no run was started$"):
        train(spec, progress=False)
    assert not list((tmp_path / "runs").glob("*/*"))  # no run folder with half a spec.yaml
    monkeypatch.setattr(run_module, "atomic_write_text", full("summary.json"))
    out = StringIO()
    result = train(spec, progress=False, console=Console(file=out, width=400))
    assert result.steps == 2 and result.val_loss is not None  # the finished run is reported, not lost to an error
    assert (f"warning: cannot write {Path(result.run_dir) / 'summary.json'} (No space left on device); the run "
            f"finished and its checkpoint is {result.checkpoint}") in out.getvalue()
    assert sorted(p.name for p in Path(result.run_dir).iterdir() if p.is_file()) == ["metrics.csv", "spec.yaml"]


class _FullDiskForTensorBoard:
    """TensorBoard's events file on a disk that is full once ``full`` is set: its writer thread
    fails, and the main thread meets the error at its next write."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, full: bool) -> None:
        from tensorboard.summary.writer.record_writer import RecordWriter

        self.full, write = full, RecordWriter.write

        def write_or_fail(writer: Any, data: bytes) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            write(writer, data)

        monkeypatch.setattr(RecordWriter, "write", write_or_fail)


def test_a_disk_full_from_the_start_is_one_message_naming_out_dir(tiny, tmp_path: Path, monkeypatch, capfd) -> None:
    # out_dir on a disk with room for spec.yaml and nothing more: TensorBoard's writer thread
    # printed its traceback, then the run failed with a bare "OSError: [Errno 28]"
    pytest.importorskip("tensorboard")
    from specformer.data.corpus import DataError

    _FullDiskForTensorBoard(monkeypatch, full=True)
    spec = load_spec(tiny("decoder", max_steps=3, val_interval=3, val_batches=1))
    with pytest.raises(DataError) as caught:
        train(spec, progress=False)
    assert re.fullmatch(
        rf"training.out_dir: cannot write the logs in {re.escape(str(tmp_path))}/runs/tiny-decoder/[0-9-]+ "
        r"\(No space left on device\); no run was started: free space there, or set training.out_dir to another folder",
        str(caught.value)), str(caught.value)
    assert not list((tmp_path / "runs").glob("*/*"))  # nothing ran: no run folder is left
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err

    from typer.testing import CliRunner

    from specformer.cli import app

    (tmp_path / "spec.yaml").write_text(spec.to_yaml())
    result = CliRunner().invoke(app, ["train", str(tmp_path / "spec.yaml"), "--no-progress"], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].startswith("error: training.out_dir: cannot write the logs in ")
    assert "Traceback" not in result.output and "Errno" not in result.output


def test_a_disk_that_fills_up_midway_says_which_checkpoint_to_resume_from(tiny, tmp_path: Path, monkeypatch, capfd) -> None:
    pytest.importorskip("tensorboard")
    import lightning as L

    from specformer.data.corpus import DataError
    from specformer.training.checkpoint import read_checkpoint

    disk = _FullDiskForTensorBoard(monkeypatch, full=False)

    class FillUpAt5(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            disk.full = disk.full or trainer.global_step == 5

    spec = load_spec(tiny("decoder", max_steps=100, val_interval=4, val_batches=1, log_interval=1))
    with pytest.raises(DataError) as caught:
        train(spec, progress=False, callbacks=[FillUpAt5()])
    message = str(caught.value)
    found = re.fullmatch(
        r"training.out_dir: cannot write the logs in (?P<run>\S+) \(No space left on device\); the run stopped at "
        r"step (?P<step>\d+), and its last checkpoint \(step (?P<at>\d+)\) is (?P<ckpt>\S+): free space there, or "
        r"set training.out_dir to another folder, then resume from it", message)
    assert found, message
    assert Path(found["ckpt"]) == Path(found["run"]) / "checkpoints" / "last.ckpt"
    assert read_checkpoint(found["ckpt"])["global_step"] == int(found["at"]) >= 4
    assert int(found["step"]) >= 5 and Path(found["run"]).is_dir()  # the run and its checkpoint are kept
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err


def test_out_dir_with_a_tilde_is_one_folder_in_the_home(tiny, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    result = train(load_spec(tiny("decoder", max_steps=1, val_interval=1, out_dir="~/myruns")), progress=False)
    run_dir = Path(result.run_dir)
    assert run_dir.parent.parent == tmp_path / "home" / "myruns"
    assert (run_dir / "spec.yaml").is_file() and Path(result.checkpoint).is_relative_to(run_dir)
    assert (run_dir / "metrics.csv").is_file()  # the loggers' files in the same folder
    assert not (tmp_path / "~").exists()


def test_counts_are_rounded_before_they_get_a_unit() -> None:
    from specformer.training.callbacks import format_count

    assert [format_count(n) for n in (12, 999.6, 1234, 999_400, 999_600, 1_234_567, 999_600_000, 1.5e12)] == [
        "12", "1k", "1.23k", "999k", "1M", "1.23M", "1B", "1.5T"]


def test_max_epochs_alone_trains_by_epochs_and_with_max_steps_is_an_error(tiny) -> None:
    from specformer.specs.errors import SpecError

    section = {k: v for k, v in tiny("decoder")["training"].items() if k != "max_steps"}
    spec = load_spec({**tiny("decoder"), "training": {**section, "max_epochs": 0.5}})
    assert (spec.training.max_steps, spec.training.max_epochs) == (None, 0.5)
    with pytest.raises(SpecError, match=r"training.max_epochs: max_epochs=0.5 and max_steps=20 are both set"
                                        r"[\s\S]*--set training.max_steps=null"):
        load_spec(tiny("decoder"), overrides=["training.max_epochs=0.5"])


def test_a_setting_the_trainer_refuses_leaves_no_run_folder(tiny, tmp_path: Path, monkeypatch) -> None:
    import specformer.training.run as run

    # a refusal only the real Trainer makes (the early check passes)
    monkeypatch.setattr(run, "_check_hardware", lambda t: None)
    spec = load_spec(tiny("decoder", max_steps=1, val_interval=1, strategy="bogus"))
    with pytest.raises(ValueError, match="strategy"):
        train(spec, progress=False)
    assert not list((tmp_path / "runs").glob("*/*"))


def test_max_epochs_sets_the_number_of_steps(tiny) -> None:
    spec = load_spec(tiny("encoder-decoder", max_steps=None, max_epochs=0.1, val_interval=1000))
    result = train(spec, progress=False)
    # 2000 examples / batch 8 = 250 batches per pass; a tenth of a pass
    assert result.steps == 25


def test_trainer_keyword_arguments_override_the_spec_max_steps_included(tiny) -> None:
    spec = load_spec(tiny("decoder", max_steps=2, val_interval=2))
    result = train(spec, progress=False, max_steps=3, limit_val_batches=1)
    assert result.steps == 3


def test_max_epochs_counts_the_batches_of_every_process(tiny, monkeypatch) -> None:
    from specformer.training import run

    class Stop(Exception):
        pass

    seen = {}

    def instead_of_fit(trainer, interrupted, fit) -> None:  # no processes launched
        seen.update(world=trainer.world_size, max_steps=trainer.max_steps)
        raise Stop

    monkeypatch.setattr(run, "_interruptible", instead_of_fit)
    spec = load_spec(tiny("encoder-decoder", max_steps=None, max_epochs=0.1, strategy="ddp", devices=2))
    with pytest.raises(Stop):
        train(spec, progress=False)
    # 2000 examples / (batch 8 × 2 processes) = 125 global batches per pass; a tenth of a pass
    assert seen == {"world": 2, "max_steps": 13}


def test_accumulation_and_clipping_are_applied(tiny) -> None:
    spec = load_spec(tiny("decoder", max_steps=4, accumulate=2, grad_clip=0.5, val_interval=4))
    result = train(spec, progress=False)
    assert result.steps == 4
    assert result.tokens == 4 * 2 * 8 * 32  # two micro-batches per optimizer step


@pytest.mark.parametrize(("log_interval", "steps"), [(1, [1, 2, 3, 4]), (3, [3, 4])])
def test_logged_train_loss_of_a_step_is_the_mean_of_its_micro_batches(tiny, log_interval: int, steps: list[int]) -> None:
    # metrics.csv's train/loss at step N is the loss of step N's batch, whose gradient the step
    # takes; with accumulate=2 it was the second micro-batch's loss alone (half the batch). The
    # logs end at the last step whatever the log_interval: at 3, they ended at step 3, before
    # the run and its summary did
    import lightning as L

    micro: dict[int, list[float]] = {}

    class Seen(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, i: int) -> None:
            # Lightning hands on the loss divided by accumulate; global_step is already the step's
            step = trainer.global_step if i % 2 else trainer.global_step + 1
            micro.setdefault(step, []).append(float(outputs["loss"]) * 2)

    spec = load_spec(tiny("decoder", max_steps=4, accumulate=2, log_interval=log_interval, val_interval=4))
    result = train(spec, progress=False, callbacks=[Seen()])
    with open(Path(result.run_dir) / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
    assert [int(r["step"]) for r in rows] == steps  # once each
    assert sorted(micro) == [1, 2, 3, 4]
    for r in rows:
        losses = micro[int(r["step"])]
        assert len(losses) == 2 and abs(losses[0] - losses[1]) > 1e-4  # two different micro-batches
        assert float(r["train/loss"]) == pytest.approx(sum(losses) / 2, abs=1e-5)
        assert float(r["train/lr"]) == pytest.approx(3e-3)  # the constant schedule's


def test_progress_bar_shows_the_loss_metrics_csv_logs_for_the_step(tiny) -> None:
    # the bar's loss of a step is train/loss's in metrics.csv: with accumulate=4 the mean of the
    # step's four micro-batches' losses; it showed the last micro-batch's alone (a quarter of the
    # batch), so the bar and the log of the same step disagreed
    import io
    import re

    import lightning as L
    from rich.console import Console

    shown: dict[int, float] = {}
    last_micro: dict[int, float] = {}

    class Seen(L.Callback):
        # after the bar's own update, which comes first: what it shows once each step is taken
        def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, i: int) -> None:
            if i % 4 == 3:
                bar = next(c for c in trainer.callbacks if type(c).__name__ == "SpecProgressBar")
                stats = bar._progress.tasks[0].fields["stats"]
                shown[trainer.global_step] = float(re.match(r"loss (\d+\.\d+)", stats).group(1))
                last_micro[trainer.global_step] = float(outputs["loss"]) * 4

    spec = load_spec(tiny("decoder", max_steps=3, accumulate=4, log_interval=1, val_interval=3))
    out = io.StringIO()
    result = train(spec, progress=True, console=Console(file=out, width=200), callbacks=[Seen()])
    with open(Path(result.run_dir) / "metrics.csv") as f:
        logged = {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}
    assert sorted(shown) == sorted(logged) == [1, 2, 3]
    for step, loss in shown.items():
        assert loss == pytest.approx(logged[step], abs=5e-4)  # the bar prints 3 decimals
    # the last micro-batch's loss is not the step's: the bar showed that
    assert any(abs(last_micro[s] - logged[s]) > 2e-3 for s in logged)
    assert [float(x) for x in re.findall(r"loss (\d+\.\d+)  ", out.getvalue())][-1] == shown[3]


def test_progress_bar_says_a_compiled_model_is_compiling_until_its_first_step() -> None:
    # torch.compile's first step takes tens of seconds: the bar says why until it is done
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from specformer.training import callbacks

    for compiled, says in ((object(), True), (None, False)):
        bar = callbacks.SpecProgressBar(Console(file=io.StringIO(), width=200))
        trainer = SimpleNamespace(is_global_zero=True, max_steps=10, global_step=0, world_size=1,
                                  accumulate_grad_batches=1, sanity_checking=False, num_val_batches=[2])
        module = SimpleNamespace(tokens_seen=0, automatic_optimization=True, _compiled=compiled, val_history=[])
        bar.on_train_start(trainer, module)  # type: ignore[arg-type]
        stats = bar._progress.tasks[0].fields["stats"]
        assert ("compiling the model (training.compile)" in stats) is says and ("first step" in stats) is says
        module.tokens_seen, trainer.global_step = 1000, 1
        bar.on_train_batch_end(trainer, module, {"loss": torch.tensor(2.0)}, None, 0)  # type: ignore[arg-type]
        assert bar._progress.tasks[0].fields["stats"].startswith("loss 2.000")
        for history in ([], [{"val/loss": 2.0}]):  # the first validation compiles the evaluation step
            module.val_history = history
            bar.on_validation_start(trainer, module)  # type: ignore[arg-type]
            stats = bar._progress.tasks[-1].fields["stats"]
            assert ("first validation" in stats) is (says and not history)
            bar.on_validation_batch_end(trainer, module)  # type: ignore[arg-type]
            assert bar._progress.tasks[-1].fields["stats"] == ""
            bar._progress.remove_task(bar._val_task)
            bar._val_task = None
        bar.on_train_end(trainer, module)  # type: ignore[arg-type]


def test_progress_bar_tokens_per_second_is_tokens_over_time_when_steps_vary(monkeypatch) -> None:
    # steps of 0.01 s and 0.3 s in turn (a busy machine), 1,000 tokens each: 2,000 tokens every
    # 0.31 s is 6.45k tok/s; a smoothed mean of the steps' own rates (100k and 3.3k) said ~50k
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from specformer.training import callbacks

    clock = [100.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: clock[0])

    def run(durations: list[float]) -> float:
        bar = callbacks.SpecProgressBar(Console(file=io.StringIO(), width=200))
        trainer = SimpleNamespace(is_global_zero=True, max_steps=400, global_step=0, world_size=1,
                                  accumulate_grad_batches=1)
        module = SimpleNamespace(tokens_seen=0, automatic_optimization=True)
        bar.on_train_start(trainer, module)  # type: ignore[arg-type]
        for step, seconds in enumerate(durations, start=1):
            clock[0] += seconds
            module.tokens_seen += 1000
            trainer.global_step = step
            bar.on_train_batch_end(trainer, module, {"loss": torch.tensor(2.0)}, None, step)  # type: ignore[arg-type]
        bar.on_train_end(trainer, module)  # type: ignore[arg-type]
        return bar.tokens_per_second

    assert run([0.01, 0.3] * 100) == pytest.approx(2000 / 0.31)
    # a first step of 30 s (compilation) is out of the rate once the window has passed it
    assert run([30.0] + [0.01] * 40) == pytest.approx(1000 / 0.01)
    assert run([30.0] + [0.01] * 5) == pytest.approx(6000 / 30.05)  # and in it before: what the run has done

    # a validation of 5 s between steps is not the steps' time: the rate stays theirs, as the summary's
    bar = callbacks.SpecProgressBar(Console(file=io.StringIO(), width=200))
    trainer = SimpleNamespace(is_global_zero=True, max_steps=400, global_step=0, world_size=1,
                              accumulate_grad_batches=1, sanity_checking=False, num_val_batches=[2])
    module = SimpleNamespace(tokens_seen=0, automatic_optimization=True, val_history=[])
    bar.on_train_start(trainer, module)  # type: ignore[arg-type]
    for step in range(1, 11):
        clock[0] += 0.1
        if step == 5:
            bar.on_validation_start(trainer, module)  # type: ignore[arg-type]
            clock[0] += 5.0
            bar.on_validation_end(trainer, module)  # type: ignore[arg-type]
        module.tokens_seen += 1000
        trainer.global_step = step
        bar.on_train_batch_end(trainer, module, {"loss": torch.tensor(2.0)}, None, step)  # type: ignore[arg-type]
    assert bar.tokens_per_second == pytest.approx(1000 / 0.1)
    bar.on_train_end(trainer, module)  # type: ignore[arg-type]


def test_bf16_mixed_precision_trains_on_cpu(tiny) -> None:
    spec = load_spec(tiny("decoder", max_steps=3, val_interval=3, precision="bf16-mixed"))
    result = train(spec, progress=False)
    assert result.steps == 3 and result.val_loss is not None and result.val_loss == result.val_loss  # not NaN


def test_float64_training_logs_the_validation_loss_at_float64(tiny) -> None:
    # Lightning makes a logged Python number a tensor of the default dtype, float32 outside the
    # steps: metrics.csv's val/loss and the monitor's were float32's (2e-7 off summary.json's)
    import lightning as L

    seen: dict[str, torch.Tensor] = {}

    class Seen(L.Callback):
        def on_train_end(self, trainer: L.Trainer, module: Any) -> None:
            seen.update(trainer.callback_metrics)

    spec = load_spec(tiny("decoder", max_steps=2, val_interval=2, val_batches=2, log_interval=1, precision=64))
    result = train(spec, progress=False, callbacks=[Seen()])
    assert result.val_loss is not None and result.val_ppl is not None
    assert seen["val/loss"].dtype == torch.float64 and seen["val/loss"].item() == result.val_loss
    assert seen["val/ppl"].item() == result.val_ppl
    summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
    assert (summary["val_loss"], summary["val_ppl"]) == (result.history[-1]["val/loss"], result.history[-1]["val/ppl"])
    with open(Path(result.run_dir) / "metrics.csv") as f:
        logged = [row for row in csv.DictReader(f) if row["val/loss"]]
    assert [float(row["val/loss"]) for row in logged] == [h["val/loss"] for h in result.history]
    assert float(logged[-1]["val/ppl"]) == result.val_ppl


def test_bf16_mixed_precision_takes_the_fused_optimizer_and_still_clips(tiny, monkeypatch) -> None:
    # bf16-mixed has no gradient scaler: its AdamW is fused (~4x the plain one's speed on a
    # CPU), and Lightning still clips its gradients (it refuses to for an optimizer that says
    # it unscales them itself); the run is the plain optimizer's, clipping included. AdamW
    # hardly feels a gradient's scale, but clipped to a norm of 1e-7 the gradients fall under
    # its eps (1e-8 per element), and the model stops learning
    import lightning as L

    from specformer.training import optim

    fused: list[bool] = []

    class Seen(L.Callback):
        def on_train_start(self, trainer: L.Trainer, module: Any) -> None:
            fused.append(bool(trainer.optimizers[0].defaults.get("fused")))

    def run() -> Any:
        spec = load_spec(tiny("decoder", max_steps=4, val_interval=2, precision="bf16-mixed", grad_clip=1e-7))
        return train(spec, progress=False, callbacks=[Seen()])

    with_fused = run()
    monkeypatch.setattr(optim, "_FUSED_DEVICES", ())
    plain = run()
    assert fused == [True, False]
    assert [h["val/loss"] for h in with_fused.history] == pytest.approx([h["val/loss"] for h in plain.history], abs=2e-3)
    monkeypatch.setattr(optim, "_FUSED_DEVICES", ("cpu",))
    unclipped = train(load_spec(tiny("decoder", max_steps=4, val_interval=2, precision="bf16-mixed", grad_clip=0.0)),
                      progress=False)
    assert unclipped.history[-1]["val/loss"] < plain.history[-1]["val/loss"] - 0.1  # clipping is felt


def test_compile_keeps_state_dict_names() -> None:
    from specformer.builder import SpecModule

    spec = load_spec("gpt-nano", ["training.compile=true"])
    module = SpecModule(spec)
    names = set(module.state_dict())
    module.configure_model()
    assert module._compiled is not None and module._compiled is not module.model
    assert set(module.state_dict()) == names
    assert all(n.startswith("model.") for n in names)
    assert load_spec("gpt-nano").training.compile is False


def _seq2seq_batch(source: int, target: int, *, padded: bool) -> dict[str, torch.Tensor]:
    ids, dec = torch.randint(5, 40, (2, source)), torch.randint(5, 40, (2, target))
    mask, dec_mask = torch.ones_like(ids), torch.ones_like(dec)
    if padded:
        mask[1, source // 2:] = 0
        dec_mask[1, target // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec,
            "decoder_attention_mask": dec_mask, "labels": dec.masked_fill(dec_mask == 0, -100)}


@pytest.mark.parametrize("padded", [True, False])
def test_a_compiled_module_traces_padded_batches_with_symbolic_lengths_from_the_first(padded: bool) -> None:
    # padded batches (pairs here) change length at every step: their first trace already takes
    # the lengths as symbols, so one graph serves every length; unpadded batches (a corpus cut
    # into blocks) keep the static first graph dynamo makes, and a second once a length changes
    from torch._dynamo.utils import counters

    from specformer.builder import SpecModule

    module = SpecModule(load_spec("t5-nano", ["training.compile=true"]))
    module.configure_model()
    module.__dict__["_compiled"] = torch.compile(module.model, backend="aot_eager")
    torch._dynamo.reset()
    counters.clear()
    try:
        for source, target in [(17, 16), (23, 19), (31, 27)]:
            batch = _seq2seq_batch(source, target, padded=padded)
            got = module(**batch).loss
            assert float(got) == pytest.approx(float(module.model(**batch).loss), rel=1e-5)
        assert module._padded is padded
        assert counters["stats"]["unique_graphs"] == (1 if padded else 2)
    finally:
        torch._dynamo.reset()


def test_a_compiled_module_drops_a_mask_of_ones_and_keeps_the_attention_products(monkeypatch) -> None:
    # masked LM's blocks come with a mask of ones; the eager model drops it itself, but a traced
    # one cannot read it, and ran its attention through torch's masked fused kernel (a bert-nano
    # bf16 step 148 ms against 79 eager): the module drops it before the compiled call
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from specformer.builder import SpecModule
    from specformer.components import attention

    monkeypatch.setattr(attention, "MATMUL_ATTENTION", True)
    targets: set[str] = set()

    def record(gm: torch.fx.GraphModule, _inputs: object):  # noqa: ANN202
        targets.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return make_boxed_func(gm.forward)

    module = SpecModule(load_spec("bert-nano", ["training.compile=true"]))
    module.configure_model()
    module.__dict__["_compiled"] = torch.compile(
        module.model, backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    torch._dynamo.reset()
    try:
        ids = torch.randint(5, 200, (2, 64))
        labels = torch.full_like(ids, -100)
        labels[:, ::5] = ids[:, ::5]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = module(ids, attention_mask=torch.ones_like(ids), labels=labels).loss
            want = module.model(ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        got.backward()
        assert module._padded is False
        assert float(got) == pytest.approx(float(want), rel=1e-2)
        assert not {t for t in targets if "scaled_dot_product" in t}, targets
        assert "aten.bmm.default" in targets
    finally:
        torch._dynamo.reset()


@pytest.mark.slow
def test_compile_trains_the_same_run_through_specformer_s_kernels(tiny, monkeypatch) -> None:
    # training.compile=true with inductor: the oneDNN products and the float32 attention as
    # products stay in the compiled step (tests/components/test_compile.py shows the graphs),
    # in one graph per mode, and the run is the eager run to float32 rounding
    from torch._dynamo.utils import counters

    from specformer.components import attention, products

    monkeypatch.setattr(products, "ONEDNN", True)
    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_PRODUCT_ROWS", 64)
    ran: list[int] = []
    real = products._onednn_linear
    monkeypatch.setattr(products, "_onednn_linear", lambda *a: ran.append(1) or real(*a))

    def run(compile: bool):  # noqa: ANN202
        spec = tiny("decoder", max_steps=6, val_interval=3, compile=compile)
        spec["positional"] = {"type": "rope"}
        spec["decoder"]["attention"] = {"n_heads": 4, "n_kv_heads": 2}
        return train(load_spec(spec), progress=False)

    from specformer.builder import lightning as spec_lightning

    warmed: list[tuple[str, torch.dtype]] = []
    real_warm = spec_lightning.warm_tables
    monkeypatch.setattr(spec_lightning, "warm_tables",
                        lambda model, dev, dtype: warmed.append((dev.type, dtype)) or real_warm(model, dev, dtype))
    plain = run(False)
    assert not warmed
    torch._dynamo.reset()
    counters.clear()
    ran.clear()
    compiled = run(True)
    torch._dynamo.reset()
    assert ran and not counters["graph_break"]
    assert warmed == [("cpu", torch.float32)]  # the rotary tables, cached once before the first trace
    # the first step, its compilation with it, is named and left out of tokens/s with its tokens
    assert plain.compile_seconds == 0 and plain.tokens_per_second == pytest.approx(
        plain.run_tokens / (plain.train_seconds - plain.val_seconds))
    assert 0 < compiled.compile_seconds < compiled.train_seconds - compiled.val_seconds
    first_step_tokens = 8 * 32  # batch_size x seq_len
    assert compiled.tokens_per_second == pytest.approx(
        (compiled.run_tokens - first_step_tokens)
        / (compiled.train_seconds - compiled.val_seconds - compiled.compile_seconds))
    assert [h["val/loss"] for h in compiled.history] == pytest.approx([h["val/loss"] for h in plain.history], abs=1e-4)
    assert compiled.train_loss == pytest.approx(plain.train_loss, abs=1e-4)


def test_tensorboard_logs_the_same_metrics_as_the_csv(tiny) -> None:
    pytest.importorskip("tensorboard")  # the [dev] extra
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = load_spec(tiny("decoder", max_steps=8, val_interval=4, log_interval=2))
    result = train(spec, progress=False)
    run = Path(result.run_dir)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "val/loss"} <= tags
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for tag in ("train/loss", "val/loss"):
        csv_points = {int(r["step"]): float(r[tag]) for r in rows if r.get(tag)}
        tb_points = {e.step: e.value for e in events.Scalars(tag)}
        assert tb_points.keys() == csv_points.keys() and len(tb_points) >= 2
        for step, value in tb_points.items():
            assert value == pytest.approx(csv_points[step], rel=1e-6)
    # the spec is its hyperparameters (the HParams tab), each field by its path, the metrics named
    from tensorboard.plugins.hparams import plugin_data_pb2

    written = [plugin_data_pb2.HParamsPluginData.FromString(v) for v in events.PluginTagToContent("hparams").values()]
    start = next(d.session_start_info for d in written if d.HasField("session_start_info"))
    metrics = next([m.name.tag for m in d.experiment.metric_infos] for d in written if d.HasField("experiment"))
    assert set(metrics) == {"val/loss", "val/ppl", "train/loss"}
    assert start.hparams["d_model"].number_value == 32 and start.hparams["kind"].string_value == "decoder"
    assert start.hparams["decoder.attention.n_heads"].number_value == 2
    assert start.hparams["training.optimizer.lr"].number_value == pytest.approx(3e-3)
    assert start.hparams["training.data.paths"].string_value == f"[{spec.training.data.paths[0]}]"
    assert start.hparams["parameters"].number_value == result.parameters


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path: Path, monkeypatch) -> None:
    from specformer.training import run

    class Frozen:
        @staticmethod
        def now() -> Any:
            import datetime

            return datetime.datetime(2025, 1, 1, 12, 0, 0)

    monkeypatch.setattr(run, "datetime", Frozen)
    first = run.make_run_dir(tmp_path, "m")
    monkeypatch.delenv(run.RUN_DIR_ENV)
    # another process makes the next folder between a check and this one's mkdir
    monkeypatch.setattr(Path, "exists", lambda self: False)
    second = run.make_run_dir(tmp_path, "m")
    assert first.name == "20250101-120000" and second.name == "20250101-120000-2"
    # a later call in the same process makes its own folder: the environment names the one this
    # process made, for the other processes of its run (it returned that folder for every spec)
    third = run.make_run_dir(tmp_path, "other")
    assert third.parent.name == "other" and third != second
    monkeypatch.setenv(run.RUN_DIR_ENV, str(tmp_path / "given"))  # another process's: taken as it is
    assert run.make_run_dir(tmp_path, "m") == tmp_path / "given"
    monkeypatch.delenv(run.RUN_DIR_ENV)


def test_a_run_says_what_its_data_preparation_does(tiny, tmp_path: Path, monkeypatch) -> None:
    # reading and tokenising a large corpus take minutes: each step leaves a line with its size and rate
    import io

    from rich.console import Console

    from specformer.data import progress

    monkeypatch.setattr(progress, "LINE_AFTER_S", 0.0)  # every step, however short here
    spec = load_spec(tiny("decoder", max_steps=1, val_interval=1, val_batches=1))
    out = io.StringIO()
    train(spec, progress=True, console=Console(file=out, width=200))
    lines = out.getvalue().splitlines()
    steps = [line.split(":")[0] for line in lines if line.endswith(" MB/s)")]
    assert steps[0].startswith("reading ") and steps[0].endswith(" files")
    assert steps[1:] == ["tokenising the training text", "tokenising the validation text"]
    # read from the cache the second time: only the files are read
    out.truncate(0)
    out.seek(0)
    train(spec, progress=True, console=Console(file=out, width=200))
    assert [line for line in out.getvalue().splitlines() if "tokenising" in line] == []
    # without the bar (--no-progress, a log's flag), each step still leaves its line
    out.truncate(0)
    out.seek(0)
    other = tiny("decoder", max_steps=1, val_interval=1, val_batches=1, cache_dir=str(tmp_path / "another cache"))
    result = train(load_spec(other), progress=False, console=Console(file=out, width=200))
    assert not result.data.endswith("read from the cache")
    assert [line.split(":")[0] for line in out.getvalue().splitlines() if line.startswith("tokenising")] == [
        "tokenising the training text", "tokenising the validation text"]


@pytest.mark.parametrize("width", [50, 60, 70, 80, 120])
def test_progress_bar_gives_way_to_a_narrow_terminal_whole(width: int) -> None:
    # at 50 columns rich cut every column short ("step ━╸ 12… loss 3.123 0:0… ETA -:-…"): the
    # elapsed time, then the ETA, then the bar give way, and the step count and loss stay whole
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from specformer.training import callbacks

    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None)
    bar = callbacks.SpecProgressBar(console)
    trainer = SimpleNamespace(is_global_zero=True, max_steps=2000, global_step=0, world_size=1,
                              accumulate_grad_batches=1, sanity_checking=False, num_val_batches=[20])
    module = SimpleNamespace(tokens_seen=0, automatic_optimization=True, val_history=[])
    bar.on_train_start(trainer, module)  # type: ignore[arg-type]
    module.tokens_seen, trainer.global_step = 12_000, 1234
    bar.on_train_batch_end(trainer, module, {"loss": torch.tensor(3.123)}, None, 0)  # type: ignore[arg-type]
    bar.on_validation_start(trainer, module)  # type: ignore[arg-type]
    table = bar._progress.make_tasks_table(bar._progress.tasks)
    bar._progress.stop()
    shown = Console(file=io.StringIO(), width=width, color_system=None)
    shown.print(table)
    lines = [line.rstrip() for line in shown.file.getvalue().splitlines()]
    step, validate = lines
    assert "1234/2000 loss 3.123" in step and "tok/s" in step and "…" not in step, lines
    assert " 0/20" in validate and "…" not in validate, lines
    assert all(len(line) <= width for line in lines)
    assert ("ETA" in step) is (width >= 60) and ("━" in step or "╸" in step) is (width >= 50)
    assert ("0:00:00 ETA" in step) is (width >= 70)


def _own_trainer(**kwargs: Any) -> Any:
    import lightning as L

    settings = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, use_distributed_sampler=False, limit_val_batches=1)
    return L.Trainer(**{**settings, **kwargs})


def test_a_trainer_of_your_own_reads_on_through_epochs_and_keeps_its_sanity_check_out(tiny) -> None:
    # limit_train_batches cuts epochs short: each epoch read the same first batches again, the
    # checkpoint counting them as new; the sanity check's two batches were the step-0 validation
    import hashlib

    import lightning as L

    from specformer.builder.lightning import SpecModule
    from specformer.data.module import SpecDataModule

    spec = load_spec(tiny("decoder", max_steps=6, val_interval=3, val_batches=2))
    seen: list[str] = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
            seen.append(hashlib.sha1(batch["input_ids"].numpy().tobytes()).hexdigest())

    module, dm = SpecModule(spec), SpecDataModule(spec)
    trainer = _own_trainer(max_epochs=3, limit_train_batches=2, callbacks=[Record()])
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 6 and len(seen) == 6 and len(set(seen)) == 6
    # the same batches as an uninterrupted stream's first six
    stream = dm.train_dataloader().batch_sampler
    assert [b[0][0] for b in (stream.batch(i) for i in range(6))] == list(range(6))
    assert [entry["step"] for entry in module.val_history] == [2, 4, 6]  # no step-0 sanity check
    assert dm.state_dict()["items"] == 6 * spec.training.batch_size


def test_a_trainer_of_your_own_whose_epochs_end_mid_accumulation_is_refused(tiny) -> None:
    # 3 batches an epoch, 2 a step: Lightning stepped on the third alone, and the next epoch
    # read on from global_step × 2 = 4 micro-batches, so stream batch 3 was never seen
    import lightning as L

    from specformer.builder.lightning import SpecModule
    from specformer.data.module import SpecDataModule

    spec = load_spec(tiny("decoder", max_steps=4))
    with pytest.raises(ValueError, match=r"an epoch of 3 batches \(limit_train_batches\) ends between the "
                                         r"micro-batches of an optimizer step \(accumulate_grad_batches=2\).*"
                                         r"skip 1; give limit_train_batches a multiple of 2"):
        _own_trainer(max_epochs=2, limit_train_batches=3, accumulate_grad_batches=2).fit(
            SpecModule(spec), datamodule=SpecDataModule(spec))
    # a multiple reads eight different batches, and the checkpoint counts them
    import hashlib

    positions: list[str] = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
            positions.append(hashlib.sha1(batch["input_ids"].numpy().tobytes()).hexdigest())

    dm = SpecDataModule(spec)
    trainer = _own_trainer(max_epochs=2, limit_train_batches=4, accumulate_grad_batches=2, callbacks=[Record()])
    trainer.fit(SpecModule(spec), datamodule=dm)
    assert trainer.global_step == 4 and len(positions) == 8 and len(set(positions)) == 8
    assert dm.state_dict()["items"] == 8 * spec.training.batch_size


def test_a_trainer_of_your_own_clips_as_the_spec_says_unless_it_names_a_value(tiny) -> None:
    # SpecModule took the spec's optimizer and schedule but not its grad_clip: a norm of 2.4 stepped as it was
    import lightning as L

    from specformer.builder.lightning import SpecModule
    from specformer.data.module import SpecDataModule

    norms: list[float] = []

    class Norm(L.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, index: int) -> None:
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    spec = load_spec(tiny("decoder", max_steps=1, grad_clip=0.1))
    _own_trainer(max_steps=1, callbacks=[Norm()]).fit(SpecModule(spec), datamodule=SpecDataModule(spec))
    _own_trainer(max_steps=1, callbacks=[Norm()], gradient_clip_val=0.05).fit(
        SpecModule(spec), datamodule=SpecDataModule(spec))
    unclipped = load_spec(tiny("decoder", max_steps=1, grad_clip=0))
    _own_trainer(max_steps=1, callbacks=[Norm()]).fit(SpecModule(unclipped), datamodule=SpecDataModule(unclipped))
    assert norms[0] == pytest.approx(0.1, rel=1e-4) and norms[1] == pytest.approx(0.05, rel=1e-4)
    assert norms[2] > 0.5  # the gradient as it was


def test_a_trainer_of_your_own_without_an_end_is_refused_with_what_to_give(tiny) -> None:
    from specformer.builder.lightning import SpecModule
    from specformer.data.module import SpecDataModule

    spec = load_spec(tiny("decoder", max_steps=6))
    with pytest.raises(ValueError, match=r"SpecModule trains on an endless stream of batches .*: give the Trainer "
                                         r"max_steps \(the spec's training.max_steps is 6\)"):
        _own_trainer(max_epochs=1).fit(SpecModule(spec), datamodule=SpecDataModule(spec))
    # epochs of a length: the schedule spans their steps
    module = SpecModule(spec)
    _own_trainer(max_epochs=2, limit_train_batches=2).fit(module, datamodule=SpecDataModule(spec))
    assert module._schedule_steps() == 4 and module.trainer.global_step == 4


def test_trainer_keyword_arguments_that_are_spec_settings_are_written_into_the_run_s_spec(tiny) -> None:
    # accumulate_grad_batches=2 validated at steps 1, 3, 4, 6 (the cadence came from the spec's
    # accumulate 1) and spec.yaml said accumulate: 1, max_steps: 6 for a 4-step run
    spec = load_spec(tiny("decoder", max_steps=6, val_interval=2, val_batches=1))
    result = train(spec, progress=False, max_steps=4, accumulate_grad_batches=2, gradient_clip_val=None)
    assert result.steps == 4 and [entry["step"] for entry in result.history] == [2, 4]
    assert result.tokens == 4 * 2 * 8 * 32
    ran = load_spec(Path(result.run_dir) / "spec.yaml").training
    assert (ran.max_steps, ran.accumulate, ran.grad_clip) == (4, 2, 0.0)
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=0: Trainer settings that are the spec's training "
                                         r"settings are written into it"):
        train(spec, progress=False, accumulate_grad_batches=0)


def test_a_trainer_of_your_own_tests_predicts_and_loads_a_checkpoint_by_its_spec(tiny, tmp_path: Path) -> None:
    import lightning as L

    from specformer.builder.lightning import SpecModule
    from specformer.data.module import SpecDataModule
    from specformer.training.checkpoint import CheckpointError

    spec = load_spec(tiny("decoder", max_steps=2, val_interval=2, val_batches=2))
    module, dm = SpecModule(spec), SpecDataModule(spec)
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "mine", save_last=True)
    _own_trainer(max_steps=2, val_check_interval=2, check_val_every_n_epoch=None, callbacks=[checkpoints],
                 enable_checkpointing=True).fit(module, datamodule=dm)
    # test scores the validation split as validation does; predict gives the logits of each batch
    tested = _own_trainer(limit_test_batches=1).test(module, datamodule=dm, verbose=False)
    assert tested[0]["test/loss"] == pytest.approx(module.val_history[-1]["val/loss"], rel=1e-5)
    predicted = _own_trainer(limit_predict_batches=1).predict(module, datamodule=dm)
    assert predicted[0].logits.shape[-1] == spec.vocab_size
    # the checkpoint holds its spec: no spec= needed
    last = tmp_path / "mine" / "last.ckpt"
    again = SpecModule.load_from_checkpoint(last)
    assert again.spec == module.spec
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), module.state_dict().values(), strict=True))
    # the command evaluates it, and says that the ids it reads come from a tokenizer made now
    from typer.testing import CliRunner

    from specformer.cli import app
    from specformer.training.checkpoint import read_checkpoint

    assert read_checkpoint(last)["specformer"]["tokenizer"]  # the data module's, as train() keeps it
    scored = CliRunner().invoke(app, ["eval", str(last)], env={"COLUMNS": "300"})
    assert scored.exit_code == 0 and "carries no tokenizer" not in scored.stderr, scored.output
    # one trained on a DataLoader of your own has none
    raw = torch.load(last, weights_only=False)
    raw["specformer"]["tokenizer"] = None
    raw["specformer"]["spec"]["training"]["tokenizer"] = {"type": "bpe", "vocab_size": 300}  # made afresh
    bare = tmp_path / "bare.ckpt"
    torch.save(raw, bare)
    scored = CliRunner().invoke(app, ["eval", str(bare)], env={"COLUMNS": "300"})
    assert scored.exit_code == 0, scored.output
    assert f"warning: {bare}: the checkpoint carries no tokenizer" in " ".join(scored.stderr.split())
    # evaluating it with a module of another model says so, with the path and the way out
    other = SpecModule(load_spec(tiny("decoder", max_steps=2), overrides=["decoder.n_layers=2"]))
    with pytest.raises(CheckpointError, match=rf"^{last}: the checkpoint holds another model than this SpecModule's "
                                              r"spec describes:\n  decoder.n_layers"):
        _own_trainer().validate(other, datamodule=dm, ckpt_path=str(last), verbose=False)


def test_train_takes_a_model_checkpoint_among_its_callbacks(tiny, tmp_path: Path) -> None:
    import lightning as L

    spec = load_spec(tiny("decoder", max_steps=2, val_interval=2, val_batches=1))
    best = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "best", monitor="val/loss", mode="min")
    result = train(spec, progress=False, callbacks=[best])
    assert result.steps == 2 and Path(best.best_model_path).is_file()
