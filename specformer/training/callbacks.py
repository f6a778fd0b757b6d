"""Lightning callbacks of ``specformer train``: a rich progress bar, periodic checkpoints, and
what keeps a resumed run's logs and summary those of an uninterrupted run."""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ProgressBar
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column

from specformer.data.progress import fitting_progress

__all__ = ["SpecProgressBar", "ValidationLines", "PeriodicCheckpoint", "LogGlobalStep", "format_count", "validation_line",
           "recent_train_loss", "share_of_held_out"]


def format_count(n: float) -> str:
    """1234567 -> '1.23M'; 999600 -> '1M' (rounded first, then given its unit)."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if float(f"{abs(n) / size:.3g}") >= 1:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def validation_line(h: dict[str, Any], train_loss: float | None = None) -> str:
    """One validation's line: step, the training loss of the last steps (when given), the
    validation loss, perplexity (and exact match): the two losses side by side, as nanoGPT
    prints them, so overfitting shows as it starts."""
    train = f"  train loss {train_loss:.4f}" if train_loss is not None else ""
    text = f"step {h['step']:>6}{train}  val loss {h['val/loss']:.4f}"
    if "val/ppl" in h:  # a classifier's loss is over its classes: no perplexity
        text += f"  ppl {h['val/ppl']:.2f}"
    if "val/exact_match" in h:
        text += f"  exact match {100 * h['val/exact_match']:.1f}%"
    if "val/accuracy" in h:
        text += f"  accuracy {100 * h['val/accuracy']:.1f}%"
    return text


def share_of_held_out(share: float, count: float | None, unit: str) -> str:
    """A share of held-out rows, as ``train``'s summary and ``eval`` both word it:
    '37.5% of 32 held-out texts' (without ``count``, as a history saved before it was
    kept: '37.5% of held-out texts')."""
    if count is None:
        return f"{100 * share:.1f}% of held-out {unit}s"
    n = int(count)
    return f"{100 * share:.1f}% of {n:,} held-out {unit}{'s' if n != 1 else ''}"


def recent_train_loss(pl_module: Any) -> float | None:
    """The mean of the module's last training losses (``recent_losses``: the last
    ``max(10, log_interval)`` micro-batches, the summary's train loss); None before any."""
    losses = [float(x) for x in getattr(pl_module, "recent_losses", ())]
    return sum(losses) / len(losses) if losses else None


class ValidationLines(L.Callback):
    """Without a progress bar (``--no-progress``), the line each validation leaves, as
    the bar prints it: a log that keeps the run's curve."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        history = getattr(pl_module, "val_history", [])
        if trainer.is_global_zero and not trainer.sanity_checking and history:
            self.console.print(validation_line(history[-1], recent_train_loss(pl_module)), highlight=False)


RATE_STEPS = 20  # the progress bar's tokens/s is over this many steps
#: what the bar says until a compiled model's first step (or validation batch) is done
COMPILING = "compiling the model (training.compile): the first {} takes longer"


def _compiles(pl_module: L.LightningModule) -> bool:
    """Whether the module runs a ``torch.compile``d model (a SpecModule with training.compile)."""
    return getattr(pl_module, "_compiled", None) is not None


class SpecProgressBar(ProgressBar):
    """One rich bar over optimizer steps: step/total, loss, tokens/s, elapsed and ETA.

    Validation runs show a transient bar and leave one line with val loss,
    perplexity (and exact match for sequence-to-sequence).
    """

    def __init__(self, console: Console | None = None, *, refresh_per_second: float = 4.0,
                 validation_lines: bool = True) -> None:
        super().__init__()
        self.console = console or Console(stderr=True)
        self.validation_lines = validation_lines  # off where the caller reports the result itself
        self.refresh_per_second = refresh_per_second
        self._enabled = True
        self._progress: Progress | None = None
        self._train_task: TaskID | None = None
        self._val_task: TaskID | None = None
        self._last_step = -1
        self._window: deque[tuple[float, int]] = deque(maxlen=RATE_STEPS + 1)  # (time, tokens) at step ends
        self._val_started: float | None = None
        self.tokens_per_second = 0.0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def _start(self) -> Progress:
        if self._progress is None:
            # a narrow terminal drops the elapsed time, then the ETA, then the bar: the step
            # count and the loss stay whole
            whole = {"table_column": Column(no_wrap=True)}  # rich would cut each column short
            self._progress = fitting_progress(
                TextColumn("[bold]{task.description}", **whole),
                BarColumn(bar_width=None),
                MofNCompleteColumn(**whole),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(**whole),
                TextColumn("ETA", **whole),
                TimeRemainingColumn(**whole),
                optional=((4,), (5, 6), (1,)),
                console=self.console,
                refresh_per_second=self.refresh_per_second,
                transient=False,
            )
            self._progress.start()
        return self._progress

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        progress = self._start()
        total = trainer.max_steps if trainer.max_steps > 0 else None
        # torch.compile compiles in the first step, tens of seconds without a visible change
        stats = COMPILING.format("step") if _compiles(pl_module) else ""
        self._train_task = progress.add_task("step", total=total, completed=trainer.global_step, stats=stats)
        self._last_step = trainer.global_step
        self._window = deque([(time.perf_counter(), getattr(pl_module, "tokens_seen", 0) * trainer.world_size)],
                             maxlen=RATE_STEPS + 1)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._progress is None or self._train_task is None or trainer.global_step == self._last_step:
            return
        self._last_step = trainer.global_step
        now, tokens = time.perf_counter(), getattr(pl_module, "tokens_seen", 0) * trainer.world_size
        # the tokens over the time of the last RATE_STEPS steps, not a mean of per-step rates,
        # which counts a fast step as much as a slow one and overstates the rate of a run whose
        # steps vary (a busy machine: 3.5k tok/s shown where 1.6k were trained); the first
        # steps (compilation, warm caches) leave the window after RATE_STEPS steps
        self._window.append((now, tokens))
        first_time, first_tokens = self._window[0]
        if now > first_time:
            self.tokens_per_second = (tokens - first_tokens) / (now - first_time)
        # the step's loss, train/loss's in metrics.csv: with accumulate > 1 the mean of its
        # micro-batches' losses (a SpecModule's step_loss), not the last micro-batch's alone
        loss = getattr(pl_module, "step_loss", None)
        rate = f"{format_count(self.tokens_per_second)} tok/s"
        if loss is None and hasattr(pl_module, "step_loss"):
            # a SpecModule's step with no labels to score (an SFT batch of prompts only): no loss
            self._progress.update(self._train_task, completed=trainer.global_step, stats=f"loss –  {rate}")
            return
        if loss is None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None and pl_module.automatic_optimization:
                # Lightning hands on the loss divided by the micro-batches per step (the share
                # its gradient adds): the micro-batch's own loss is that times accumulate
                loss = float(loss) * trainer.accumulate_grad_batches
        stats = f"loss {float(loss):.3f}  {rate}" if loss is not None else ""
        self._progress.update(self._train_task, completed=trainer.global_step, stats=stats)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not (self._enabled and trainer.is_global_zero) or trainer.sanity_checking:
            return
        progress = self._start()
        batches = [n for n in trainer.num_val_batches if n != float("inf")]
        # a compiled model compiles its evaluation step in the first validation
        first = _compiles(pl_module) and not getattr(pl_module, "val_history", None)
        self._val_task = progress.add_task("validate", total=sum(batches) if batches else None,
                                           stats=COMPILING.format("validation") if first else "")
        self._val_started = time.perf_counter()

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        if self._progress is not None and self._val_task is not None:
            self._progress.update(self._val_task, advance=1, stats="")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._progress is None or self._val_task is None:
            return
        self._progress.remove_task(self._val_task)
        self._val_task = None
        if self._val_started is not None:
            # tok/s is the steps' rate, as the summary's: the validation's time is taken out of the window
            spent = time.perf_counter() - self._val_started
            self._window = deque(((t + spent, n) for t, n in self._window), maxlen=self._window.maxlen)
            self._val_started = None
        history = getattr(pl_module, "val_history", [])
        if history and self.validation_lines:
            self._progress.console.print(validation_line(history[-1], recent_train_loss(pl_module)), highlight=False)

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._train_task = self._val_task = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop()


class PeriodicCheckpoint(Callback):
    """Save ``last.ckpt`` every ``every`` optimizer steps and at the last step, atomically.

    Saving happens right after an optimizer step, so the data position in the
    checkpoint is exactly ``global_step × accumulate`` micro-batches. When a
    validation runs at that step, the checkpoint is written after it, so a run
    resumed from it has that validation in its history, as an uninterrupted run does.

    On SIGTERM Lightning ends the run at the end of the batch under way; when that batch
    ended an optimizer step, its checkpoint is written then (a preempted run loses no
    step). A SIGTERM in a validation, or between the micro-batches of a step
    (``accumulate`` > 1), leaves the last checkpoint: that state is not a step's.

    ``resumed_from`` (path, step) is the checkpoint a resumed run started from: until the
    run writes one of its own, it is the one an error names to resume from.
    """

    def __init__(self, dirpath: str | Path, *, every: int, keep_steps: bool = False) -> None:
        self.dirpath, self.every, self.keep_steps = Path(dirpath), every, keep_steps
        self.last_path: Path | None = None
        self.last_step: int | None = None  # the step of last_path
        self.resumed_from: tuple[Path, int] | None = None  # the checkpoint a resumed run started from
        self.failed: str | None = None  # why the checkpoint of a SIGTERM was not written
        self._saved_step = -1
        self._pending: int | None = None  # a step whose checkpoint waits for its validation
        self._defer = True
        self._batch_from_step = -1  # global_step when the current training batch began
        self._stepped = False  # the last training batch ended an optimizer step
        self._last_finite: tuple[int, float] | None = None  # (step, loss) of this run's last finite step loss
        self._first_loss: float | None = None  # the loss of step 1, when this run took it (not a resumed run)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._batch_from_step, self._stepped = trainer.global_step, False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        self._stepped = step != self._batch_from_step
        if self._stepped:
            self._check_loss(trainer, pl_module)
        if self._pending is not None and self._pending != step:
            # the validation that was due did not run (no validation batches): save at once from now on
            self._pending, self._defer = None, False
        if step == self._saved_step or step == 0:
            return
        at_end = trainer.max_steps > 0 and step >= trainer.max_steps
        if step % self.every and not at_end:
            return
        if self._defer and _validates_after_this_batch(trainer):
            self._pending = step
            return
        self._save(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending is not None and self._pending == trainer.global_step and trainer.state.fn == "fit":
            self._save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending is not None and self._pending == trainer.global_step:
            self._save(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        from specformer.training.checkpoint import CheckpointError

        step = trainer.global_step
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit" or trainer.validating:
            return
        if not self._stepped or step in (0, self._saved_step):
            return
        try:
            self._save(trainer)
        except CheckpointError as exc:  # a full disk: the run still stops, and says what is left
            self.failed = str(exc)
        except KeyboardInterrupt:  # Ctrl-C while it was written: the temporary file is removed
            if self.last_step == step:  # written whole before the Ctrl-C took effect
                return
            intact = self._intact()
            kept = f"the checkpoint of step {intact[1]} is intact" if intact else "there is no checkpoint"
            self.failed = f"the checkpoint of step {step} was cut off by Ctrl-C while it was written; {kept}"

    def _save(self, trainer: L.Trainer) -> None:
        from specformer.training.checkpoint import ctrl_c_after

        step = trainer.global_step
        self._saved_step, self._pending = step, None
        self._check_finite(trainer)
        with ctrl_c_after():  # a Ctrl-C during the write waits for it to finish and be noted
            if self.keep_steps:
                self._write(trainer, self.dirpath / f"step-{step:07d}.ckpt")
            self._write(trainer, self.dirpath / "last.ckpt")
            self.last_path = self.dirpath / "last.ckpt"
            self.last_step = step

    def _intact(self) -> tuple[Path, int] | None:
        """The checkpoint to resume from: the last this run wrote, else the one it resumed from."""
        if self.last_path is not None and self.last_step is not None:
            return self.last_path, self.last_step
        return self.resumed_from

    def _kept(self) -> str:
        intact = self._intact()
        if intact is None:
            return "this run has written no checkpoint yet"
        path, step = intact
        return f"the checkpoint of step {step} ({path}) is intact: resume from it"

    def _check_loss(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A step whose loss is NaN or inf stops the run at once: its gradient has made the
        weights NaN, and every later step would train them on to the next checkpoint. The loss
        is the one the progress bar shows (``step_loss``, read once a step and kept), the same
        on every process. Under fp16 mixed precision the gradient scaler skips a step whose
        loss overflowed: while the weights stay finite, the run goes on."""
        from specformer.training.checkpoint import CheckpointError

        loss = getattr(pl_module, "step_loss", None)
        if loss is None:  # not a SpecModule, or a step with no labels to score
            return
        step, loss = trainer.global_step, float(loss)
        if math.isfinite(loss):
            self._last_finite = (step, loss)
            if step == 1 and self._first_loss is None:
                self._first_loss = loss
            return
        if str(trainer.precision) == "16-mixed" and self._weights_finite(trainer):
            return
        last = (f"the last finite one was {self._last_finite[1]:.4g}, at step {self._last_finite[0]}"
                if self._last_finite is not None else "the first step of this run")
        fix = self._fix(trainer)
        where = f"{self._kept()} with {fix}" if self._intact() is not None else f"{self._kept()}: train again with {fix}"
        raise CheckpointError(
            f"training diverged: the training loss is {loss} at step {step} ({last}), so the run stops there "
            f"and writes no checkpoint of NaN weights; {where}{self._init_note(pl_module)}"
        )

    def _fix(self, trainer: L.Trainer) -> str:
        """What a diverged run's next try changes: a lower learning rate, a longer warmup, and
        gradient clipping (a lower one, when the run clipped)."""
        clip = trainer.gradient_clip_val
        clipping = f"a lower training.grad_clip (it is {float(clip):g})" if clip else "a training.grad_clip (e.g. 1.0)"
        return f"a lower training.optimizer.lr, more training.schedule.warmup_steps or {clipping}"

    def _init_note(self, pl_module: L.LightningModule) -> str:
        """Where the run's first loss was far above a uniform guess's (ln of the vocabulary, or
        of the classes): weights drawn too large, which no learning rate trains back."""
        spec = getattr(pl_module, "spec", None)
        if self._first_loss is None or spec is None:
            return ""
        classes = getattr(getattr(spec, "head", None), "n_classes", None)
        n, what = (classes, "n_classes") if classes else (getattr(spec, "vocab_size", None), "vocab_size")
        if not n or n < 2 or self._first_loss <= 2 * math.log(n):
            return ""
        return (f"; its first loss, {self._first_loss:.4g}, was over twice ln({what}) = {math.log(n):.3g} (a "
                "uniform guess's): the initial weights are the likely cause, see init.std and init.scheme")

    def _weights_finite(self, trainer: L.Trainer) -> bool:
        import torch

        params = [p.detach() for p in trainer.lightning_module.parameters()]
        finite = bool(torch.stack([torch.isfinite(p).all() for p in params]).all()) if params else True
        return bool(trainer.strategy.reduce_boolean_decision(finite, all=True))  # every process's shard

    def _check_finite(self, trainer: L.Trainer) -> None:
        """A diverged run (weights that hold NaN or inf) stops before its checkpoint replaces the
        last good one: nothing could be resumed from it. A loss that overflowed for one step
        under fp16 mixed precision, whose step the gradient scaler skipped, leaves the weights
        finite and goes on."""
        from specformer.training.checkpoint import CheckpointError

        if self._weights_finite(trainer):
            return
        loss = trainer.callback_metrics.get("train/loss")
        said = f" (the training loss is {float(loss):.4g})" if loss is not None and loss.numel() == 1 else ""
        fix = self._fix(trainer)
        where = f"{self._kept()} with {fix}" if self._intact() is not None else f"{self._kept()}: train again with {fix}"
        raise CheckpointError(
            f"training diverged: the model's weights hold NaN or infinite values at step {trainer.global_step}"
            f"{said}, so its checkpoint is not written over the last good one; {where}"
            f"{self._init_note(trainer.lightning_module)}"
        )

    def _write(self, trainer: L.Trainer, path: Path) -> None:
        """``trainer.save_checkpoint(path)``; a failed write (a full disk, a read-only folder)
        is a CheckpointError that says so and which checkpoint the run can resume from."""
        from specformer.training.checkpoint import CheckpointError

        try:
            trainer.save_checkpoint(path)
        except OSError as exc:
            raise CheckpointError(
                f"{path}: cannot write the checkpoint of step {trainer.global_step} ({exc.strerror or exc}); "
                f"nothing was half-written, and {self._kept()}"
            ) from None

    def state_dict(self) -> dict[str, Any]:
        return {"saved_step": self._saved_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved_step = int(state_dict.get("saved_step", -1))


def _validates_after_this_batch(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after the current training batch.

    Lightning decides in ``on_advance_end``, after ``on_train_batch_end``; this asks
    the same question of its training loop (a private method, so a failure reads as no).
    """
    loop = trainer.fit_loop.epoch_loop
    try:
        return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher)) and not loop._skip_next_val
    except Exception:
        return False


class LogGlobalStep(Callback):
    """Log ``step`` = optimizer steps taken, which Lightning's loggers use as the x-axis.

    Without it Lightning writes a training step's metrics and an in-loop validation
    at ``global_step - 1`` but a validation after ``fit`` at ``global_step``; with it
    ``metrics.csv`` and TensorBoard number steps as ``summary.json``, the progress bar
    and ``val_interval`` do: validation after 3 steps is step 3.
    """

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        pl_module.log("step", float(trainer.global_step), on_step=True, on_epoch=False)
        # the last step's training loss, which Lightning logs only at a multiple of log_interval:
        # metrics.csv and TensorBoard end where the run and its summary end
        last = 0 < trainer.max_steps <= trainer.global_step
        logged = getattr(getattr(trainer, "_logger_connector", None), "should_update_logs", True)
        loss = getattr(pl_module, "step_loss", None)
        if last and not logged and loss is not None and trainer.is_global_zero and trainer.loggers:
            metrics = {"train/loss": float(loss)}
            if getattr(pl_module, "step_lr", None) is not None:
                metrics["train/lr"] = float(pl_module.step_lr)
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.log("step", float(trainer.global_step), on_step=False, on_epoch=True, rank_zero_only=True)
