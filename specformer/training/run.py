"""``train(spec)``: a spec's ``training:`` section turned into a Lightning ``Trainer`` run.

What ``specformer train`` calls, and usable from Python. Each run writes to
``<out_dir>/<spec name>/<timestamp>/``: ``spec.yaml`` (the resolved spec),
``metrics.csv`` (CSV logger), ``checkpoints/last.ckpt`` and ``summary.json``; all but the
logs are written whole (a temporary file renamed into place) or not at all.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from rich.console import Console

from specformer.builder import build_model
from specformer.builder.lightning import SpecModule
from specformer.data import progress as data_progress
from specformer.data.cache import atomic_write_text
from specformer.data.corpus import DataError
from specformer.data.module import SpecDataModule
from specformer.specs.training import warmup_peak
from specformer.training.allocator import keep_freed_memory
from specformer.training.callbacks import (
    LogGlobalStep,
    PeriodicCheckpoint,
    SpecProgressBar,
    ValidationLines,
)
from specformer.training.checkpoint import (
    CheckpointError,
    check_resumable,
    check_weights,
    checkpoint_file,
    checkpoint_tokenizer,
    checkpoint_tokenizer_spec,
    read_checkpoint,
    read_weights_tokenizer_and_origin,
    remove_stale_temporaries,
    weights_origin,
)
from specformer.training.checkpoint_io import AtomicCheckpointIO
from specformer.training.stops import Terminated, TrainingInterrupted, sigterm_raises, stopped_by

__all__ = ["TrainResult", "TrainingInterrupted", "Terminated", "sigterm_raises", "stopped_by", "train", "build_trainer", "make_run_dir", "lightning_precision", "quiet_lightning"]

RUN_DIR_ENV = "SPECFORMER_RUN_DIR"


@dataclass
class TrainResult:
    """What a run reports at the end (also written to ``summary.json``)."""

    spec_name: str
    run_dir: str
    checkpoint: str | None
    steps: int
    train_loss: float | None
    val_loss: float | None
    val_ppl: float | None
    unigram_loss: float | None
    exact_match: float | None
    tokens: int
    tokens_per_second: float
    train_seconds: float  # from the first step to the last, validations included
    wall_seconds: float
    data: str
    resumed_from: str | None = None
    initialized_from: str | None = None
    # the model FLOPs of a training step per token (show --flops-count executed: 6N + 12·L·T·d for
    # a GPT, nanoGPT's and PaLM's count for MFU, at the lengths the batches ran at; with
    # training.optimizer.freeze, the forward and the backward products the trained parameters
    # need); None for an encoder-decoder, whose tokens differ
    flops_per_token: float | None = None
    # of train_seconds, the time validations took: tokens/s is over the rest, the steps' own time
    val_seconds: float = 0.0
    # of train_seconds, a compiled model's first step, its compilation with it (training.compile):
    # tokens/s leaves it out, with its tokens, where later steps were taken; 0 without compile
    compile_seconds: float = 0.0
    # the tokens this run trained (every process's; tokens counts them from step 0, resumes included)
    run_tokens: int = 0
    # the model's parameters (tied weights once), and of them those the run trained: all but
    # the ones training.optimizer.freeze matches
    parameters: int = 0
    trainable_parameters: int = 0
    # sequence classification: the share of held-out texts classified right at the last validation
    accuracy: float | None = None
    # how many held-out texts (classification) or examples (exact match) the share is of
    val_examples: int | None = None
    # one entry per validation: left out of the repr, which a notebook shows after train()
    history: list[dict[str, float]] = field(default_factory=list, repr=False)
    # how the run was started (`specformer train ...`; None from Python unless train(command=...)
    # is given) and the versions it ran with: with spec.yaml, what it takes to run it again
    # and the working directory, which relative paths in the spec (data, tokenizer) are read from
    command: str | None = field(default=None, repr=False)
    # the --set overrides of that command, as given (a results table's column: what a variant
    # changed; empty from Python unless train(overrides=...) is given)
    overrides: list[str] = field(default_factory=list, repr=False)
    workdir: str | None = field(default=None, repr=False)
    versions: dict[str, str] = field(default_factory=dict, repr=False)


def run_versions() -> dict[str, str]:
    """The versions a run depends on for its numbers: Python, specformer, torch (with its CUDA
    build), Lightning and tokenizers (which trains the BPE)."""
    import platform
    from importlib import metadata

    import torch

    from specformer import __version__

    versions = {"python": platform.python_version(), "specformer": __version__, "torch": torch.__version__}
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    versions["lightning"] = L.__version__
    try:
        versions["tokenizers"] = metadata.version("tokenizers")
    except metadata.PackageNotFoundError:
        pass
    return versions


def spec_yaml_header(command: str | None, versions: dict[str, str], workdir: str | None = None) -> str:
    """The comment lines a run's spec.yaml starts with: the command that started the run (after a
    ``cd`` to its working directory), and the versions it ran with (comments: ``load_spec`` of the
    file is still the spec that ran)."""
    import shlex

    where = f"cd {shlex.quote(workdir)} && " if command and workdir else ""
    lines = [f"# {line}" for line in (where + (command or "")).splitlines()]
    lines.append("# " + ", ".join(f"{name} {version}" for name, version in versions.items()))
    return "\n".join(lines) + "\n"


def _training_flops(spec: Any, lengths: Mapping[int, int] | None = None) -> float | None:
    """The training FLOPs per token of ``spec``, every query against all keys (what MFU counts):
    at the lengths the batches ran at, ``lengths`` mapping each to the tokens trained at it (a
    token of a 16-token SFT batch costs less attention than one of a 256-token block), or at
    ``training.seq_len`` without them. None for an encoder-decoder (its step reads source and
    target tokens, and tokens/s counts the inputs) or a part the analysis has no formula for (a
    plugin's type, or an objective a plugin builds): a figure that leaves it out would
    understate the MFU."""
    if spec.kind == "encoder-decoder":
        return None
    from specformer.analysis import flops_per_token

    weights = {int(n): w for n, w in (lengths or {}).items() if n > 0 and w > 0}
    if not weights:
        weights = {spec.training.seq_len or spec.max_seq_len: 1}
    total = 0.0
    try:
        for n, w in weights.items():
            flops = flops_per_token(spec, seq_len=n, count="executed")
            if flops.not_counted:
                return None
            total += w * float(flops.training)
    except Exception:  # a model the analysis cannot read: the summary leaves the figure out
        return None
    return total / sum(weights.values())


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def lightning_precision(precision: str) -> str:
    return {"32": "32-true", "64": "64-true"}.get(precision, precision)


def run_folder_name(name: str) -> str:
    """``name`` as one folder name: a spec's name cannot lead its runs out of ``out_dir``
    (``../x`` or ``a/b`` become ``..-x`` and ``a-b``)."""
    folder = re.sub(r"[/\\\x00]", "-", name).strip()
    return "run" if folder in ("", ".", "..") else folder


def make_run_dir(out_dir: str | Path, name: str) -> Path:
    """``<out_dir>/<name>/<timestamp>``, shared by every process of a multi-process run."""
    global _made_here
    env = os.environ.get(RUN_DIR_ENV)
    if env and env != _made_here:  # the folder the first process of this run made (not this one, earlier)
        path = Path(env)
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(out_dir).expanduser() / run_folder_name(name)  # as the loggers expand it
    path, n = base / stamp, 1
    while True:
        try:
            path.mkdir(parents=True)  # the folder is this run's only if this call made it
            break
        except FileExistsError:  # a run started in the same second, here or in another process
            n += 1
            path = base / f"{stamp}-{n}"
    # processes that Lightning launches for other ranks inherit the environment
    os.environ[RUN_DIR_ENV] = _made_here = str(path)
    return path


# the run folder this process made last: a later call in the same process (another run of a
# script or notebook) makes its own instead of taking it from the environment
_made_here: str | None = None


def quiet_lightning() -> None:
    """Silence Lightning's start-up banner and the warnings that do not apply here."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    for message in (
        r".*does not have many workers.*",  # a memory-mapped slice needs no workers
        r".*`training_step` returned `None`.*",
        r".*is an invalid version and will not be supported.*",
        r".*Experiment logs directory .* exists and is not empty.*",
        r".*(ckpt_path|checkpoint).*(mid-epoch|before the epoch ended|not an epoch).*",
        r".*The number of training batches .* is smaller than the logging interval.*",
        r".*that has `shuffle=True`.*",
        r".*You are using `torch.load` with `weights_only=False`.*",
        r".*isinstance\(treespec, LeafSpec\)`? is deprecated.*",
        # validation sums its numbers over the processes itself (SpecModule.val_metrics)
        r".*It is recommended to use `self.log\('(step|val/\w+)', \.\.\., sync_dist=True\)`.*",
    ):
        warnings.filterwarnings("ignore", message=message)


def _default_loggers(run_dir: Path) -> list[Logger]:
    loggers: list[Logger] = [CSVLogger(save_dir=str(run_dir), name="", version="")]
    try:
        import tensorboard  # noqa: F401
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version=""))
    except ImportError:
        pass
    return loggers


def spec_hparams(spec: Any) -> dict[str, int | float | str | bool]:
    """The spec as TensorBoard's hyperparameters: one entry a field, named by its path
    (``decoder.attention.n_heads``), lists and tables as their YAML; the parameter count too."""
    import yaml

    from specformer.analysis import count_parameters

    flat: dict[str, int | float | str | bool] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, bool | int | float | str):
            flat[prefix] = value
        elif value is not None:  # a list, an empty table
            flat[prefix] = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()

    walk("", spec.to_dict())
    flat["parameters"] = count_parameters(spec).total
    return flat


def _tensorboard_hparams(trainer: L.Trainer, spec: Any) -> None:
    """Write the spec into the run's TensorBoard logs as hyperparameters (its HParams tab
    compares runs by them, against val/loss, val/ppl and train/loss)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    boards = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
    if not boards or trainer.global_rank != 0:
        return
    from torch.utils.tensorboard.summary import hparams

    summaries = hparams(spec_hparams(spec), {"val/loss": 0.0, "val/ppl": 0.0, "train/loss": 0.0})
    for board in boards:
        writer = board.experiment._get_file_writer()
        for summary in summaries:
            writer.add_summary(summary)


def build_trainer(
    spec: Any,
    run_dir: Path,
    *,
    max_steps: int,
    callbacks: Sequence[Callback] | Callback = (),
    loggers: Sequence[Logger] | Logger | bool | None = None,
    progress: bool = True,
    console: Console | None = None,
    log: Console | None = None,
    **trainer_kwargs: Any,
) -> L.Trainer:
    """A ``Trainer`` configured from ``spec.training``; ``trainer_kwargs`` override anything.
    The validation lines go to ``log`` where it is given, else to ``console`` (the bar's)."""
    t = spec.training
    own: list[Callback] = [
        LogGlobalStep(),
        PeriodicCheckpoint(run_dir / "checkpoints", every=t.checkpoint_every),
    ]
    if progress:
        own.insert(0, SpecProgressBar(console, validation_lines=log is None))
    lines = log if log is not None else (console if not progress else None)
    if lines is not None:
        own.insert(1 if progress else 0, ValidationLines(lines))
    extra = [callbacks] if isinstance(callbacks, Callback) else list(callbacks)
    settings: dict[str, Any] = dict(
        max_steps=max_steps,
        max_epochs=-1,
        **_hardware(t),
        num_nodes=t.num_nodes,
        accumulate_grad_batches=t.accumulate,
        gradient_clip_val=t.grad_clip or None,
        val_check_interval=t.val_interval * t.accumulate,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=t.log_interval,
        logger=_loggers(run_dir, loggers),
        callbacks=own + extra,
        # specformer's own checkpoints are PeriodicCheckpoint's; a ModelCheckpoint passed in (the
        # best val/loss kept) needs Lightning's checkpointing on
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in extra),
        enable_progress_bar=progress,
        enable_model_summary=False,
        use_distributed_sampler=False,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(run_dir),
    )
    settings.update(trainer_kwargs)
    return L.Trainer(**settings)


def _loggers(run_dir: Path, loggers: Sequence[Logger] | Logger | bool | None) -> Any:
    """The run's own loggers (metrics.csv, TensorBoard) with the caller's after them;
    ``False``: none at all."""
    if loggers is False:
        return False
    theirs = [] if loggers is None or loggers is True else [loggers] if isinstance(loggers, Logger) else list(loggers)
    return [*_default_loggers(run_dir), *theirs]


def _check_extras(callbacks: Any, loggers: Any) -> None:
    """A callback or logger of another type is named before the run folder is made (Lightning
    would fail on it at its first hook, leaving a folder with a spec.yaml alone)."""
    for what, given, kind in (("callbacks", callbacks, Callback), ("loggers", loggers, Logger)):
        if given is None or isinstance(given, bool | kind):
            continue
        items = list(given) if isinstance(given, Sequence) and not isinstance(given, str) else [given]
        for i, item in enumerate(items):
            if not isinstance(item, kind):
                name = type(item).__name__
                raise TypeError(f"{what}[{i}] is {'an' if name[:1].lower() in 'aeiou' else 'a'} {name}, not a lightning.pytorch "
                                f"{kind.__name__}: pass {kind.__name__} instances (or a sequence of them)")


# Trainer keyword arguments that are settings of the spec's training section
_TRAINER_FIELDS = {
    "max_steps": "max_steps",
    "max_epochs": "max_epochs",
    "accumulate_grad_batches": "accumulate",
    "gradient_clip_val": "grad_clip",
    "precision": "precision",
    "log_every_n_steps": "log_interval",
    "accelerator": "accelerator",
    "devices": "devices",
    "strategy": "strategy",
    "num_nodes": "num_nodes",
}


def _trainer_settings_in_spec(spec: Any, trainer_kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``spec`` with the Trainer keyword arguments that are its training settings
    (``max_steps=4``, ``accumulate_grad_batches=2``, ``precision``, ...) written into it, and
    the others. The run then is what its spec.yaml and checkpoint say: the schedule's length,
    the validation cadence in optimizer steps, the hardware check and a resume read the
    values that ran, not the spec's. A value the spec cannot hold (a Strategy object, a
    max_steps of -1) is passed to the Trainer as it is."""
    from specformer.specs.errors import SpecError
    from specformer.specs.loader import load_spec

    rest, given = dict(trainer_kwargs), {}
    for key in _TRAINER_FIELDS:
        value = rest.get(key)
        if key not in rest or not (value is None or isinstance(value, str | int | float | list | tuple)):
            continue
        if (key == "max_steps" and value == -1) or (key == "max_epochs" and value in (-1, None)):
            continue  # Lightning's "no limit": the spec's own limit stays
        given[key] = rest.pop(key)
    if not given:
        return spec, rest
    values = {_TRAINER_FIELDS[key]: 0.0 if key == "gradient_clip_val" and value is None else value
              for key, value in given.items()}
    if "max_epochs" in values and "max_steps" not in values:
        values["max_steps"] = None  # training by epochs, as a section that gives max_epochs alone does
    if isinstance(values.get("precision"), int):
        values["precision"] = str(values["precision"])
    try:
        return load_spec(spec, overrides=[f"training.{name}={json.dumps(value)}" for name, value in values.items()]), rest
    except SpecError as exc:
        shown = ", ".join(f"{key}={value!r}" for key, value in given.items())
        # the fields' problems, without the --set a command line would have given them by
        problems = "\n".join(f"  {p.path}: {p.message}" for p in exc.problems)
        raise ValueError(f"{shown}: Trainer settings that are the spec's training settings are written into it, "
                         f"and {'this one is' if len(given) == 1 else 'these are'} not valid there:\n"
                         f"{problems}") from None


def _total_steps(spec: Any, dm: SpecDataModule, world_size: int = 1, resumed: tuple[int, int] | None = None) -> int:
    """The run's last step. With ``training.max_epochs`` and a run resumed at ``(step,
    items consumed)``, the steps left are counted in this run's global batches, which may
    differ from the checkpoint's."""
    t = spec.training
    if t.max_steps is not None:
        return t.max_steps
    assert t.max_epochs is not None
    if resumed is None:
        return max(1, math.ceil(t.max_epochs * dm.batches_per_pass(world_size) / t.accumulate))
    step, items = resumed
    per_step = t.batch_size * world_size * t.accumulate
    target = t.max_epochs * dm.batches_per_pass(world_size) * t.batch_size * world_size
    return step + max(0, math.ceil((target - items) / per_step - 1e-9))


def _resumed_position(raw: dict[str, Any]) -> tuple[int, int] | None:
    """(step, items consumed) a checkpoint records for its data, or None (an older one)."""
    position = raw.get(SpecDataModule.__qualname__)
    if isinstance(position, dict) and isinstance(position.get("items"), int) and isinstance(position.get("step"), int):
        return position["step"], position["items"]
    return None


def train(
    spec: Any = None,
    *,
    resume: str | Path | None = None,
    init_from: str | Path | None = None,
    callbacks: Sequence[Callback] | Callback = (),
    loggers: Sequence[Logger] | Logger | bool | None = None,
    progress: bool = True,
    console: Console | None = None,
    log: Console | None = None,
    datamodule: SpecDataModule | None = None,
    command: str | None = None,
    header: str | None = None,
    overrides: Sequence[str] = (),
    **trainer_kwargs: Any,
) -> TrainResult:
    """Train ``spec`` (a ModelSpec, preset name, path or dict) as its ``training:`` section says.

    ``resume`` continues from a checkpoint exactly (step, optimizer, scheduler, data
    position, random state); without ``spec``, with the spec the checkpoint holds (as
    ``specformer train --resume CKPT`` does; ``load_spec(load_checkpoint(CKPT).spec,
    overrides=[...])`` is that spec with other settings). ``init_from`` starts a new run (step 0, a fresh optimizer)
    from the weights of a ``.safetensors`` file (``import-hf --weights``) or a checkpoint:
    fine-tuning; they must fit the spec's model exactly, but for a classification head, which
    starts from its initialisation under a body that fits (a masked-LM encoder's). Extra callbacks and loggers
    run beside specformer's own (the run folder's metrics.csv and TensorBoard logs; ``loggers=False``
    turns all logging off), and ``Trainer`` keyword arguments are passed through to Lightning. Ctrl-C raises :class:`TrainingInterrupted`
    (a ``KeyboardInterrupt``) naming the checkpoint to resume from, and so does SIGTERM during
    training, after saving the step reached; any other error that stops the run carries a
    note (``__notes__``) saying at which step, and that checkpoint. ``command``, how the run was
    started, is written with the versions it runs with at the top of the run folder's
    ``spec.yaml`` and into ``summary.json``, and so are ``overrides``, its ``--set`` values
    (recorded only: ``spec`` already has them). ``console`` shows the progress bar and the line
    each validation leaves, which go to ``log`` instead where it is given. ``header``, a line
    said on ``log`` (or ``console``) once the spec, the checkpoint resumed from and the weights started from
    are checked (a run they refuse says only why), comes before the notes on them and the
    data's preparation.
    """
    from specformer.specs.loader import load_spec
    from specformer.specs.schema import ModelSpec

    if resume is not None and init_from is not None:
        raise ValueError(
            "give resume or init_from, not both: resume continues a run (weights, optimizer, step), "
            "init_from starts a new one from weights"
        )
    started = time.perf_counter()
    raw: dict[str, Any] | None = None  # the checkpoint resumed from, read once
    if spec is None:
        if resume is None:
            raise TypeError("give a spec to train (a ModelSpec, preset name, YAML path or dict), or resume= a "
                            "checkpoint to continue with the spec it holds")
        raw = read_checkpoint(resume)
        meta = raw.get("specformer")
        if not isinstance(meta, dict) or "spec" not in meta:
            raise CheckpointError(f"{resume}: not a specformer checkpoint (it has no spec): give the spec to train")
        spec = meta["spec"]
    spec = spec if isinstance(spec, ModelSpec) else load_spec(spec)
    spec, trainer_kwargs = _trainer_settings_in_spec(spec, trainer_kwargs)
    _check_extras(callbacks, loggers)
    t = spec.training
    quiet_lightning()
    # Trainer settings passed here replace the spec's: Lightning checks those itself
    _check_before_data(spec, hardware=not {"accelerator", "devices", "strategy", "precision", "plugins"} & set(trainer_kwargs),
                       console=console, checkpoint=resume is not None or init_from is not None)
    resumed_step: int | None = None
    saved_data: str | None = None  # the fingerprint of the data the checkpoint was trained on
    position: tuple[int, int] | None = None  # (step, items consumed) the checkpoint records
    tokenizer = tokenizer_spec = tokenizer_note = None
    # a run folder's spec.yaml writes every field, the default lr too: only another lr was given.
    # A resumed run: when it changes the checkpoint's
    lr_given = "lr" in t.optimizer.model_fields_set and t.optimizer.lr != type(t.optimizer).model_fields["lr"].default
    heard = log if log is not None else console  # with the validation lines: a log file keeps it
    said = header is None or heard is None or rank_zero_only.rank != 0

    def announce() -> None:
        nonlocal said
        if not said:
            heard.print(header, highlight=False)
            said = True

    if resume is not None:
        # a clear error now, before the data is prepared, rather than deep inside Lightning
        raw = raw if raw is not None else read_checkpoint(resume)
        spec = _with_checkpoint_label_names(spec, raw)
        t = spec.training
        check_resumable(raw, spec, source=str(resume))
        if "optimizer_states" not in raw:  # save_checkpoint's: a model's weights, spec and tokenizer alone
            raise CheckpointError(
                f"{resume} holds a model's weights, spec and tokenizer (save_checkpoint), not a run's step and "
                f"optimizer state to continue: start a new run from them with --init-from {resume}"
            )
        resumed_step = int(raw.get("global_step", 0))
        tokenizer = checkpoint_tokenizer(raw)
        tokenizer_spec = checkpoint_tokenizer_spec(raw) if tokenizer is not None else None
        moved = _batch_changes(raw, spec)
        recut = _seq_len_change(raw, spec)
        changed = _training_changes(raw, spec)
        lr_given = any(c.startswith("training.optimizer.lr ") for c in changed)
        if any(c.startswith("training.optimizer.type ") for c in changed):
            kind = next(c for c in changed if c.startswith("training.optimizer.type "))
            raise CheckpointError(
                f"{resume}: {kind}: a resumed run goes on with the checkpoint's optimizer state (its "
                f"moments), which another optimizer cannot take; keep training.optimizer.type, or start a "
                f"new run from these weights with --init-from {resume}"
            )
        regrouped = _optimizer_group_change(raw, spec)
        if regrouped:
            raise CheckpointError(
                f"{resume}: training.optimizer.freeze or lr_scale puts parameters in other groups than the "
                f"checkpoint's ({regrouped}); a resumed run goes on with the checkpoint's optimizer state, kept per "
                f"parameter group; resume with the checkpoint's training.optimizer.freeze and lr_scale patterns "
                f"(a factor may change), or start a new run from these weights with --init-from {resume}"
            )
        position = _resumed_position(raw)
        stored = raw.get(SpecDataModule.__qualname__)
        saved_data = stored.get("data") if isinstance(stored, dict) else None
        del raw
        limit = trainer_kwargs.get("max_steps", t.max_steps)
        if limit is not None and 0 < limit <= resumed_step:
            raise CheckpointError(
                f"{resume}: the checkpoint is at step {resumed_step} and training.max_steps is {limit}, so "
                f"there is nothing left to train; resume with more steps, e.g. "
                f"--set training.max_steps={resumed_step + max(limit, 1)}"
            )
        if tokenizer_spec is not None:
            spec, tokenizer_note = _with_checkpoint_tokenizer(spec, tokenizer_spec, str(resume))
            t = spec.training
        resume = checkpoint_file(Path(resume))
        announce()
        _warn(console, tokenizer_note)
        if changed and console is not None and rank_zero_only.rank == 0:
            console.print(f"resuming at step {resumed_step} with other training settings than the checkpoint's: "
                          f"{', '.join(changed)}", highlight=False, soft_wrap=True, markup=False)
        # a checkpoint write killed there (SIGKILL) left a checkpoint-sized hidden file
        remove_stale_temporaries(resume.parent)
        if moved:
            _warn(console, f"{moved} changed since the checkpoint, which records its data position in batches "
                           f"(step × accumulate; it was written by an older specformer), so this run reads on "
                           f"from another place in the stream and some examples of the current pass are skipped "
                           f"or seen twice")
        if recut:
            _warn(console, f"{recut}: the data position is a count of sequences, so this run reads on from the "
                           "same count in the text cut into sequences of the new length, not from where the "
                           "checkpoint stopped: some text of the current pass is read twice and some not at all")
        reseeded = next((c for c in changed if c.startswith("training.seed ")), None)
        if reseeded:
            _warn(console, f"{reseeded}: the seed orders each pass over the data, so this run reads on from the "
                           "same count of examples in another order: some examples of the current pass are read "
                           "twice and some not at all (dropout goes on from the checkpoint's random state)")
    weights, origin, fresh_head = None, {}, []
    if init_from is not None:
        # before the data is prepared: weights that do not fit are an error at once
        weights, tokenizer, tokenizer_spec, origin = read_weights_tokenizer_and_origin(init_from)
        meta = build_model(spec, device="meta")
        fresh_head = _fresh_classification_head(spec, meta, weights)
        theirs = [k for k in weights if k.startswith("head.")] if fresh_head else []
        for k in theirs:  # a pretrained body (BERT's masked-LM encoder) under a new classifier head
            del weights[k]
        # the weights' shapes first: a checkpoint of another model is that, not a tokenizer problem
        own = meta.state_dict()
        check_weights(meta, {**weights, **{k: own[k] for k in fresh_head}}, source=str(init_from))
        imported_note = _imported_tokenizer_note(spec, init_from)
        if tokenizer_spec is not None:
            spec, tokenizer_note = _with_checkpoint_tokenizer(spec, tokenizer_spec, str(init_from))
            t = spec.training
        announce()
        if fresh_head:
            _warn(console, f"{init_from}: its head ({_names_of(theirs) or 'none'}) does not fit this spec's "
                           f"classification head ({_names_of(fresh_head)}), which starts from its initialisation "
                           "and is trained on the labels; every other weight is the checkpoint's")
        _warn(console, imported_note)
        _warn(console, tokenizer_note)
    announce()  # before the model is built: a large one takes a while
    L.seed_everything(t.seed, workers=True, verbose=False)
    module = SpecModule(spec)
    if weights is not None:
        # keys and shapes checked above; a new classifier head keeps its initialisation
        missing, unexpected = module.model.load_state_dict(weights, strict=not fresh_head)
        assert sorted(missing) == sorted(fresh_head) and not unexpected, (missing, unexpected)
        del weights
        module.imported_model_type = origin.get("specformer.imported_model_type")
    # a checkpoint's weights fit the token ids of its own tokenizer: the data is
    # tokenized with it, not with a tokenizer trained afresh on this run's data
    dm = datamodule or SpecDataModule(spec, tokenizer=tokenizer)
    # reading, training a BPE and tokenising a large corpus take minutes: each says how far it is
    # (a bar, unless --no-progress) and leaves a line with its time, which a log keeps
    shown = console is not None and rank_zero_only.rank == 0
    with data_progress.reporting(data_progress.rich_reporter(console, bars=progress) if shown else None):
        dm.setup("fit")
    assert dm.data is not None
    for line in dm.data.left_out:  # said before training too: the summary comes at the end of a long run
        _warn(console, line)
    module.tokenizer = module.tokenizer or dm.data.tokenizer
    names = dm.data.extra.get("label_names")
    if names is not None and spec.head.labels != tuple(names):
        # the class names the labels were numbered by go into the saved spec: eval and predict
        # map a name to the id it was trained as
        spec = load_spec(spec.to_dict(), [f"head.labels={json.dumps(list(names))}"])
        module.spec = dm.spec = spec
    if saved_data is not None and dm.data.fingerprint is not None and saved_data != dm.data.fingerprint:
        _warn(console, f"the training data differs from the data {resume} was trained on (a file edited, added "
                       "or removed, or training.data changed): the run reads on from the same example number in "
                       "other data, and validation losses after the resume are not comparable with those before")
    if len(dm.data.train) < t.batch_size:
        # the sampler fills each batch by cycling: what looks like an epoch of steps is many passes
        n = len(dm.data.train)
        unit = dm.data.unit  # blocks of a corpus; labelled texts and pairs are rows of their own
        what = f"{unit}{'s' if n != 1 else ''}" + (" of seq_len tokens" if unit == "sequence" else "")
        _warn(console, f"the training split has {n} {what}, fewer "
                       f"than one batch (training.batch_size={t.batch_size}): every batch repeats them; add "
                       "data or lower training.batch_size")
    # not a folder another process of this run made
    created = os.environ.get(RUN_DIR_ENV) in (None, "", _made_here)
    run_dir = make_run_dir(t.out_dir, spec.name)
    remove_stale_temporaries(run_dir / "checkpoints")  # a run folder used again (SPECFORMER_RUN_DIR)
    try:
        try:
            versions, workdir = run_versions(), os.getcwd()
            atomic_write_text(run_dir / "spec.yaml", spec_yaml_header(command, versions, workdir) + spec.to_yaml())
        except OSError as exc:  # a full disk: nothing ran, leave no run behind
            if created:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise DataError(
                f"training.out_dir: cannot write {run_dir / 'spec.yaml'} ({exc.strerror or exc}); no run was started"
            ) from None
        settings = {"max_steps": t.max_steps if t.max_steps is not None else -1, **trainer_kwargs}
        try:
            trainer = build_trainer(
                spec, run_dir, callbacks=callbacks, loggers=loggers, progress=progress, console=console, log=log,
                **settings
            )
        except BaseException:
            # a setting the Trainer refuses (strategy, accelerator): nothing ran, leave no run behind
            if created:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        if "max_steps" not in trainer_kwargs:
            # an epoch's steps depend on how many processes share each global batch: known once the trainer is
            trainer.fit_loop.epoch_loop.max_steps = _total_steps(spec, dm, trainer.world_size, position)
        max_steps = trainer.max_steps
        if resumed_step is not None and 0 < max_steps <= resumed_step:
            # training.max_epochs: its steps are known only now, with the data
            if created:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise CheckpointError(
                f"{resume}: the checkpoint is at step {resumed_step} and the run's {_steps(max_steps)} "
                f"(training.max_epochs={t.max_epochs}) {'is' if max_steps == 1 else 'are'} done, so there is nothing left to train; resume "
                f"with more, e.g. --set training.max_epochs={2 * t.max_epochs:g}"
            )
        # inverse_sqrt too: its warmup (4000 by default) rises to its own peak, not to the lr
        warmup = getattr(t.schedule, "warmup_steps", 0) if t.schedule is not None else 0
        if 0 < max_steps < warmup:
            _warn(
                console,
                f"training.schedule.warmup_steps={warmup} is above the run's {_steps(max_steps)}: the "
                f"learning rate never reaches {warmup_peak(t.schedule, spec.d_model)} (it ends at "
                f"{max_steps / warmup:.2g} of it)",
            )
        if lr_given and t.schedule is not None and t.schedule.type == "inverse_sqrt":
            _warn(console, _inverse_sqrt_lr_note(spec))
        periodic = next((c for c in trainer.callbacks if isinstance(c, PeriodicCheckpoint)), None)
        if periodic is not None and resume is not None and resumed_step is not None:
            periodic.resumed_from = (Path(resume), resumed_step)

        def nothing_ran() -> bool:
            return (periodic is None or periodic.last_path is None) and trainer.global_step == (resumed_step or 0)

        def _drop_if_nothing_ran() -> None:
            # a run stopped (by an error, Ctrl-C or SIGTERM) before its first step leaves no folder of
            # a spec.yaml alone, which `generate runs/NAME` would then take for the latest run; never
            # a folder holding a checkpoint, whatever this process's trainer says
            if nothing_ran() and created and not any((run_dir / "checkpoints").glob("*.ckpt")):
                shutil.rmtree(run_dir, ignore_errors=True)

        def interrupted(signum: int = signal.SIGINT, finished: bool = False) -> TrainingInterrupted:
            if periodic is not None and periodic.failed:  # the checkpoint of a SIGTERM could not be written
                _warn(console, periodic.failed)
            if periodic is not None and periodic.last_path is not None:
                ckpt, at = str(periodic.last_path), periodic.last_step
            else:
                ckpt, at = (str(resume), resumed_step) if resume else (None, None)
            # a signal at the last step stops the run before its closing validation: every step ran
            finished = finished or 0 < trainer.max_steps <= trainer.global_step
            _drop_if_nothing_ran()
            return TrainingInterrupted(trainer.global_step, ckpt, at, str(run_dir), finished=finished, signum=signum,
                                       max_steps=trainer.max_steps if trainer.max_steps > 0 else None)

        def failed(exc: Exception) -> BaseException:
            """``exc`` with what is left said: the step the run stopped at and its checkpoint."""
            where = interrupted()  # (which drops the folder of a run that took no step)
            logs = _log_write_error(exc)
            if logs is None:  # out of memory, a NaN check: the error itself, with a note
                _note_where_it_stopped(exc, where)
                return exc
            # a full (or read-only) disk under the logs: the folder and the setting, not a traceback
            return DataError(_log_write_message(logs, run_dir, where, started=not nothing_ran()))

        keep_freed_memory()  # each step reuses the memory the one before freed (no page faults)
        with _quiet_log_writer_thread():
            try:
                _tensorboard_hparams(trainer, spec)
                _interruptible(trainer, interrupted, lambda: trainer.fit(
                    module, datamodule=dm, ckpt_path=str(resume) if resume else None, weights_only=True
                ))
                train_seconds = time.perf_counter() - (module.train_started or started)
                val_seconds = min(module.val_seconds, train_seconds)
                if not module.val_history or module.val_history[-1]["step"] != trainer.global_step:
                    closing = time.perf_counter()
                    _interruptible(trainer, lambda signum: interrupted(signum, finished=True),
                                   lambda: trainer.validate(module, datamodule=dm, verbose=False))
                    # the validation after the last step is part of the run's time, said as validation
                    closing = time.perf_counter() - closing
                    train_seconds, val_seconds = train_seconds + closing, val_seconds + closing
            except CheckpointError:  # says which checkpoint is left itself
                raise
            except Exception as exc:  # out of memory, a NaN check, a full disk under the logs
                error = failed(exc)
                if error is exc:
                    raise
                raise error from None
    finally:
        os.environ.pop(RUN_DIR_ENV, None)
    history = module.val_history
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    last = history[-1] if history else {}
    ckpt = periodic.last_path if periodic is not None else None
    losses = [float(x) for x in module.recent_losses]
    tokens_run = (module.tokens_seen - module.tokens_at_start) * trainer.world_size
    steps_seconds, steps_tokens = train_seconds - val_seconds, tokens_run
    compile_seconds = min(module.compile_seconds, steps_seconds)
    compile_tokens = module.compile_tokens * trainer.world_size
    if compile_seconds and steps_seconds > compile_seconds and tokens_run > compile_tokens:
        steps_seconds -= compile_seconds
        steps_tokens -= compile_tokens
    result = TrainResult(
        spec_name=spec.name,
        run_dir=str(run_dir),
        checkpoint=str(ckpt) if ckpt is not None else None,
        steps=trainer.global_step,
        train_loss=sum(losses) / len(losses) if losses else metrics.get("train/loss"),
        val_loss=last.get("val/loss", metrics.get("val/loss")),
        val_ppl=last.get("val/ppl", metrics.get("val/ppl")),
        unigram_loss=dm.data.unigram_loss,
        exact_match=last.get("val/exact_match", metrics.get("val/exact_match")),
        accuracy=last.get("val/accuracy", metrics.get("val/accuracy")),
        val_examples=int(last["val/examples"]) if "val/examples" in last else None,
        tokens=int(module.tokens_seen * trainer.world_size),
        tokens_per_second=steps_tokens / steps_seconds if steps_seconds > 0 else 0.0,
        train_seconds=train_seconds,
        val_seconds=val_seconds,
        compile_seconds=compile_seconds,
        run_tokens=tokens_run,
        wall_seconds=time.perf_counter() - started,
        data=dm.data.description,
        resumed_from=str(resume) if resume else None,
        initialized_from=str(init_from) if init_from is not None else None,
        flops_per_token=_training_flops(spec, module.tokens_by_length),
        parameters=sum(p.numel() for p in module.model.parameters()),
        trainable_parameters=sum(p.numel() for p in module.model.parameters() if p.requires_grad),
        history=[dict(h) for h in history],
        command=command,
        overrides=list(overrides),
        workdir=workdir,
        versions=versions,
    )
    if trainer.is_global_zero:
        try:
            atomic_write_text(run_dir / "summary.json", json.dumps(asdict(result), indent=1))
        except OSError as exc:  # the run is done and its checkpoint written: report it all the same
            done = f" and its checkpoint is {result.checkpoint}" if result.checkpoint else ""
            _warn(console, f"cannot write {run_dir / 'summary.json'} ({exc.strerror or exc}); the run finished{done}")
    return result


def _check_before_data(spec: Any, *, hardware: bool = True, console: Console | None = None,
                       checkpoint: bool = False) -> None:
    """Settings that would otherwise fail only once the data is prepared (minutes, for a
    large corpus), each named with what to do instead. From a ``checkpoint`` (resume or
    init_from), its own tokenizer stands in for a spec that has none."""
    from specformer.specs.errors import SpecError
    from specformer.specs.training import training_problems

    t = spec.training
    problems = [p for p in training_problems(spec) if not (checkpoint and p.path == "vocab_size")]
    if problems:
        raise SpecError(problems)
    if getattr(t.optimizer, "freeze", ()) or getattr(t.optimizer, "lr_scale", ()):
        from specformer.analysis.params import meta_build, plugin_components

        if plugin_components(spec):
            # the spec checked its patterns against the names it gives; a plugin's module names
            # its own parameters: a pattern that matches none is said now, not after the data
            from specformer.training.optim import plan_of

            plan_of(meta_build(spec, "to match training.optimizer's patterns to its parameters"), t.optimizer)
    check_folders(t)
    if hardware:
        cpu_processes = _check_hardware(t)
        if cpu_processes:
            _check_memory(spec, cpu_processes, console)


def _with_checkpoint_label_names(spec: Any, raw: dict[str, Any]) -> Any:
    """``spec`` with the class names a classifier's checkpoint was trained with, when the spec
    names none: the run wrote them into the checkpoint's spec (the order its labels were
    numbered by), and a resumed run numbers its labels the same way."""
    from specformer.specs.loader import load_spec

    saved = raw.get("specformer", {}).get("spec", {}) if isinstance(raw.get("specformer"), dict) else {}
    head = saved.get("head") if isinstance(saved, dict) else None
    names = head.get("labels") if isinstance(head, dict) else None
    if names is None or spec.head is None or spec.head.type != "classification" or spec.head.labels is not None:
        return spec
    return load_spec(spec.to_dict(), [f"head.labels={json.dumps(list(names))}"])


def _optimizer_group_change(raw: dict[str, Any], spec: Any) -> str:
    """What a resumed run's ``training.optimizer.freeze`` and ``lr_scale`` change in the
    optimizer's parameter groups ("now frozen: embed.tokens.weight"), else ""."""
    from specformer.analysis import count_parameters
    from specformer.specs.training import optimizer_groups

    meta = raw.get("specformer")
    saved = meta.get("spec", {}).get("training", {}).get("optimizer") if isinstance(meta, dict) else None
    new = spec.training.optimizer
    if not isinstance(saved, dict) or saved.get("type") != new.type:
        return ""
    try:
        old = type(new).model_validate(saved)
    except ValueError:
        return ""  # the fit itself compares the groups' names
    shapes = count_parameters(spec).shapes
    before = {n: (f, d) for f, d, names in optimizer_groups(old, shapes) for n in names}
    after = {n: (f, d) for f, d, names in optimizer_groups(new, shapes) for n in names}
    if [names for *_, names in optimizer_groups(old, shapes)] == [names for *_, names in optimizer_groups(new, shapes)]:
        return ""
    parts = []
    frozen = [n for n in before if n not in after]
    thawed = [n for n in after if n not in before]
    moved = [n for n in after if n in before and before[n][0] != after[n][0]]
    for what, names in (("now frozen", frozen), ("no longer frozen", thawed), ("in another lr_scale group", moved)):
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            parts.append(f"{what}: {shown}")
    return "; ".join(parts) or "training.optimizer.lr_scale groups the parameters otherwise"


def check_folders(t: Any, *, out: bool = True, cache: bool = True) -> None:
    """``training.out_dir`` and ``training.cache_dir`` are folders, or can be made, and files
    can be made in ``out_dir`` (a run writes there; a read-only cache may hold what it needs)."""
    from specformer.data.cache import default_cache_dir

    folders = {}
    if out:
        folders["training.out_dir"] = Path(t.out_dir).expanduser()
    if cache:
        # named as the user set it: the spec's field, or the environment variable that gave the default
        env = next((v for v in ("SPECFORMER_CACHE", "XDG_CACHE_HOME") if os.environ.get(v)), None)
        name = "training.cache_dir" if t.cache_dir or env is None else f"${env} (the default training.cache_dir)"
        folders[name] = Path(t.cache_dir).expanduser() if t.cache_dir else default_cache_dir()
    for name, folder in folders.items():
        if folder.exists() and not folder.is_dir():
            raise DataError(f"{name}: {folder} is a file, not a folder")
        if name == "training.out_dir":
            # made when the run starts: a run that fails before leaves no empty folder behind;
            # until then, a file can be made where it will be (or in the folder it goes into)
            where = folder
            while not where.exists() and where.parent != where:
                where = where.parent
            if not where.is_dir():
                raise DataError(f"{name}: cannot create the folder {folder} ({where} is a file)")
            try:
                with tempfile.TemporaryFile(dir=where):
                    pass
            except OSError as exc:  # a read-only file system (which refuses root as well), no permission
                verb = "write in" if where == folder else "create"
                raise DataError(f"{name}: cannot {verb} the folder {folder} ({exc.strerror or exc})") from None
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataError(f"{name}: cannot create the folder {folder} ({exc.strerror or exc})") from None


def _hardware(t: Any) -> dict[str, Any]:
    """The Trainer's accelerator, devices, strategy and precision, from ``training``."""
    return {
        "accelerator": t.accelerator,
        "devices": list(t.devices) if isinstance(t.devices, tuple) else t.devices,
        "strategy": t.strategy,
        "precision": lightning_precision(t.precision),
    }


def _check_hardware(t: Any) -> int:
    """The accelerator, devices, strategy and precision, as Lightning resolves them on this
    machine: a GPU setting without a GPU, an unknown strategy, or fp16 on a CPU (which
    Lightning would quietly run as bf16) is an error naming the field, before any data.
    Returns the number of training processes on the CPU (0 on a GPU)."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.accelerators import CPUAccelerator

    from specformer.data.tokens import usable_cores
    from specformer.specs.errors import SpecError, SpecProblem

    _check_strategy_name(t.strategy)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe = L.Trainer(**_hardware(t), logger=False, enable_checkpointing=False,
                              enable_progress_bar=False, enable_model_summary=False)
    except (MisconfigurationException, ValueError, ImportError, RuntimeError, TypeError) as exc:
        text = _first_line(exc)
        field = next((f for f in ("strategy", "precision", "devices") if f in text.lower()), "accelerator")
        if field == "accelerator" and isinstance(t.strategy, str) and t.strategy != "auto" and (
                t.strategy in text or t.strategy.split("_")[0] in text.lower()):
            field = "strategy"  # xla: "Requirement 'torch_xla>=1.13' not met", the strategy's package
        value = getattr(t, field)
        hints = {
            "accelerator": "accelerator: auto picks the GPU when there is one, else the CPU",
            "devices": "devices: auto uses every device of the accelerator",
            "strategy": "strategy: auto picks one for the devices; ddp runs one process per device",
            "precision": "allowed: 32, bf16-mixed, 16-mixed (GPU), bf16-true, 64",
        }
        raise SpecError([SpecProblem(f"{value!r} cannot run here: {text}", path=f"training.{field}",
                                     hint=hints[field])]) from None
    method = getattr(probe.strategy, "_start_method", None)
    if method in ("spawn", "forkserver"):
        # Lightning pickles the Trainer for such processes, and the run's console, progress bar and
        # loggers hold locks: it would fail after the data is prepared
        raise SpecError([SpecProblem(
            f"{t.strategy!r} starts its processes by pickling the trainer, which the run's console and progress "
            "callbacks cannot go through", path="training.strategy",
            hint="strategy: ddp (each process starts the command again, as torchrun does), or auto")])
    if method == "fork":
        # the steps are taken in forked processes: this one's trainer never sees them, so the run's
        # summary said step 0, and a stop took the run for one that had trained nothing
        raise SpecError([SpecProblem(
            f"{t.strategy!r} trains in processes forked from this one, whose steps, checkpoints and losses this "
            "process never sees", path="training.strategy",
            hint="in a notebook, Lightning's auto forks: train several devices from a script (specformer train), "
                 "or one device here (devices: 1)" if t.strategy == "auto" else
                 "strategy: ddp (each process starts the command again, as torchrun does), or auto")])
    cores = usable_cores()
    if isinstance(probe.accelerator, CPUAccelerator) and probe.num_devices > cores:
        # one process a device: more than the cores starve each other (64 on 2 cores never got going)
        raise SpecError([SpecProblem(
            f"{t.devices!r} starts {probe.num_devices} training processes on the CPU, which has {cores} core"
            f"{'s' if cores != 1 else ''}", path="training.devices",
            hint=f"give at most {cores} (one process a core; 1 uses every core through torch's threads), "
                 "or train on a GPU")])
    if t.compile:
        _check_compiler(isinstance(probe.accelerator, CPUAccelerator))
    check_precision(t, probe)
    return probe.num_devices if isinstance(probe.accelerator, CPUAccelerator) else 0


def check_precision(t: Any, trainer: L.Trainer) -> None:
    """Refuse a ``training.precision`` that ``trainer`` runs as another (16-mixed on a CPU, which
    Lightning would quietly run as bf16-mixed): train's check, and eval's of its own trainer."""
    from specformer.specs.errors import SpecError, SpecProblem

    ran = str(trainer.precision)
    if lightning_precision(t.precision) != ran:
        raise SpecError([SpecProblem(
            f"{t.precision} cannot run on {type(trainer.accelerator).__name__.removesuffix('Accelerator')}: "
            f"Lightning would run {ran} instead",
            path="training.precision",
            hint=f"set training.precision={ran} (fp16 mixed precision needs a GPU)",
        )])


def _memory_of_this_machine() -> tuple[int, int | None] | None:
    """(the memory a process here may use, what is free of it now) in bytes: the machine's, or
    its container's limit (cgroup) where lower; None where neither can be read."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None
    available: int | None = None
    with contextlib.suppress(OSError, ValueError, IndexError):  # no /proc (macOS): what is free is unknown
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    for limit_file, used_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                   "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = int(Path(limit_file).read_text().strip())  # "max": no limit (ValueError)
        except (OSError, ValueError):
            continue
        if 0 < limit < total:
            total = limit
            with contextlib.suppress(OSError, ValueError):  # the container's use unread: the machine's free
                free = limit - int(Path(used_file).read_text().strip())
                available = free if available is None else min(available, free)
        break
    return total, available


def _check_memory(spec: Any, processes: int, console: Console | None = None) -> None:
    """A training step whose estimated memory (``show``'s, for ``processes`` processes of
    ``batch_size`` sequences each) is far past this machine's is refused, naming the batch that
    fits; one past what is free now is warned of (counted as a CPU trains: attention dropout
    keeps its probabilities there). Without it a batch_size of 100,000 on a
    23 GiB machine was killed by the kernel, saying nothing, after the data."""
    from specformer.analysis.memory import memory_estimate
    from specformer.specs.errors import SpecError, SpecProblem

    machine = _memory_of_this_machine()
    if machine is None:
        return
    total, available = machine
    t = spec.training
    seq_len = t.seq_len or spec.max_seq_len
    try:
        estimate = memory_estimate(spec, batch=t.batch_size, seq_len=seq_len, dtype=str(t.precision), cpu=True)
    except Exception:  # a plugin's part the estimate cannot size: no check
        return
    need = estimate.total * processes
    if need <= 1.25 * total:  # (the estimate is within about 15% of what a step takes)
        if available is not None and need > available:
            _warn(console, f"a training step takes about {_gib(need)} (specformer show's estimate), more than the "
                           f"{_gib(available)} free on this machine now: it may swap, or be killed for memory")
        return
    fixed = (estimate.total - estimate.activations) * processes
    per_sequence = estimate.activations * processes / t.batch_size
    room = 0.8 * total  # what is left beside the data, the libraries and the rest of the machine
    fits = int((room - fixed) // per_sequence) if per_sequence and room > fixed else 0
    hint = (f"training.batch_size={fits} fits (training.accumulate keeps the batch: batch_size={fits}, "
            f"accumulate={math.ceil(t.batch_size * t.accumulate / fits)}); or a shorter training.seq_len" if fits
            else "the weights, gradients and optimizer states alone do not fit: a smaller model, or a GPU" if fixed > room
            else "not one sequence fits beside the weights, gradients and optimizer states: a shorter "
                 "training.seq_len, a smaller model, or a GPU")
    raise SpecError([SpecProblem(
        f"a training step of {t.batch_size:,} sequences of {seq_len:,} tokens"
        f"{f' in each of {processes} processes' if processes > 1 else ''} takes about {_gib(need)} "
        f"(specformer show's estimate), past the {_gib(total)} of this machine",
        path="training.batch_size", hint=hint)])


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _first_line(exc: BaseException) -> str:
    """An exception's first line of text, or its type's name where it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_strategy_name(strategy: Any) -> None:
    """A strategy name Lightning does not know, with the names it does (those that start
    their processes by pickling the trainer left out: they are refused) and the closest one."""
    if not isinstance(strategy, str):
        return  # a Strategy object given from Python
    import difflib

    from lightning.pytorch.strategies import StrategyRegistry

    from specformer.specs.errors import SpecError, SpecProblem

    known = ["auto", *sorted(StrategyRegistry.available_strategies())]
    if strategy in known:
        return
    # those that start their processes by pickling the trainer or by forking this one are refused
    offered = [name for name in known if not any(word in name for word in ("spawn", "notebook", "fork"))]
    close = difflib.get_close_matches(strategy, offered, n=1, cutoff=0.5)
    near = f"did you mean {close[0]!r}? " if close else ""
    raise SpecError([SpecProblem(
        f"{strategy!r} is not a strategy Lightning knows", path="training.strategy",
        hint=f"{near}allowed: {', '.join(offered)}")])


def _check_compiler(cpu: bool) -> None:
    """``training.compile`` needs what inductor builds its kernels with: a C++ compiler on the
    CPU, Triton on a GPU. Without it the first step failed, after the data, in torch's words."""
    from specformer.specs.errors import SpecError, SpecProblem

    if cpu:
        from torch._inductor import cpp_builder

        try:
            cpp_builder.get_cpp_compiler()
        except Exception as exc:  # InvalidCxxCompiler, or whatever the search meets
            raise SpecError([SpecProblem(
                f"torch.compile cannot build its CPU kernels here: {_first_line(exc)}", path="training.compile",
                hint="install a C++ compiler (g++ or clang++; the CXX variable names another), "
                     "or set training.compile=false to train uncompiled")]) from None
        return
    from torch.utils._triton import has_triton

    if not has_triton():
        raise SpecError([SpecProblem(
            "torch.compile builds its GPU kernels with Triton, which is not installed", path="training.compile",
            hint="pip install triton (the version your torch names), or set training.compile=false")])


def _batch_changes(raw: dict[str, Any], spec: Any) -> str:
    """The batch settings a resumed run changes ("training.batch_size 2 → 4") when the
    checkpoint does not record its data position in items (older checkpoints), else ""."""
    if _resumed_position(raw) is not None:
        return ""  # the stream reads on from the same item whatever the batch
    meta = raw.get("specformer")
    saved = meta.get("spec", {}).get("training") if isinstance(meta, dict) else None
    if not isinstance(saved, dict):
        return ""
    changes = []
    for name in ("batch_size", "accumulate"):
        old, new = saved.get(name), getattr(spec.training, name)
        if old is not None and old != new:
            changes.append(f"training.{name} {old} → {new}")
    return ", ".join(changes)


def _seq_len_change(raw: dict[str, Any], spec: Any) -> str:
    """"training.seq_len 32 → 16" when a resumed run cuts text into sequences of another length
    than the checkpoint's (its data position, a count of sequences, then points at other
    text), else "". Pairs and synthetic examples are the same examples whatever the length."""
    meta = raw.get("specformer")
    saved = meta.get("spec") if isinstance(meta, dict) else None
    t = spec.training
    if not isinstance(saved, dict) or not isinstance(saved.get("training"), dict) or t.data is None:
        return ""
    if t.data.type in ("synthetic", "pairs", "conversations"):
        return ""
    old = saved["training"].get("seq_len") or saved.get("max_seq_len")
    new = t.seq_len or spec.max_seq_len
    return f"training.seq_len {old} → {new}" if old is not None and old != new else ""


def _training_changes(raw: dict[str, Any], spec: Any) -> list[str]:
    """The ``training`` settings a resumed run changes ("training.optimizer.lr 0.0003 → 0.001"),
    so that what a ``--set`` or an edited spec did is said; the tokenizer is the checkpoint's
    (said apart when another is asked for)."""
    meta = raw.get("specformer")
    saved = meta.get("spec", {}).get("training") if isinstance(meta, dict) else None
    if not isinstance(saved, dict):
        return []
    current = spec.to_dict().get("training", {})

    def walk(a: Any, b: Any, path: str) -> list[str]:
        if isinstance(a, dict) and isinstance(b, dict):
            if a.get("type") != b.get("type"):
                # another kind of section: its own fields are another's; those both kinds have
                # (a schedule's warmup_steps, an optimizer's lr) are compared as ever
                shared = sorted((set(a) & set(b)) - {"type"})
                return [f"{path}.type {a.get('type')} → {b.get('type')}",
                        *(change for key in shared for change in walk(a[key], b[key], f"{path}.{key}"))]
            # a list the checkpoint's specformer did not have yet (training.optimizer.freeze) was empty
            old = {k: a[k] if k in a or not isinstance(b.get(k), list | tuple) else [] for k in set(a) | set(b)}
            return [change for key in sorted(old) for change in walk(old[key], b.get(key), f"{path}.{key}")]
        return [] if a == b or (isinstance(a, list | tuple) and isinstance(b, list | tuple) and list(a) == list(b)) else [
            f"{path} {_shown(a)} → {_shown(b)}"]

    return [c for key in sorted(set(saved) | set(current)) if key != "tokenizer"
            for c in walk(saved.get(key), current.get(key), f"training.{key}")]


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(_shown, value)) + "]"
    return str(value)


def _inverse_sqrt_lr_note(spec: Any) -> str:
    """What a run with the inverse_sqrt schedule does with the training.optimizer.lr it was given:
    nothing, as the schedule sets the rate itself; its peak, and the scale that peaks at that lr."""
    s, lr = spec.training.schedule, spec.training.optimizer.lr
    peak = s.scale * (spec.d_model * s.warmup_steps) ** -0.5
    return (
        f"training.optimizer.lr={lr:g} is not used: the inverse_sqrt schedule sets the learning rate itself, "
        f"scale · d_model^-0.5 · min(n^-0.5, n · warmup_steps^-1.5), which peaks at {peak:.3g} after "
        f"{s.warmup_steps} steps (d_model {spec.d_model}, warmup_steps {s.warmup_steps}, scale {s.scale:g}); to peak at "
        f"{lr:g}, set training.schedule.scale={s.scale * lr / peak:.4g}"
    )


def _warn(console: Console | None, message: str | None) -> None:
    """A warning (none for ``None``), printed once (by the first process) on the console the run reports on."""
    if message is not None and console is not None and rank_zero_only.rank == 0:
        console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def _fresh_classification_head(spec: Any, model: Any, weights: dict[str, Any]) -> list[str]:
    """The names of ``model``'s head parameters to leave at their initialisation when
    ``weights`` are a body that fits it under another head: the spec's head is a classifier and
    every weight but the head's fits, as when fine-tuning BERT's masked-LM encoder (or a
    classifier of other classes) to classify, as transformers' ``from_pretrained`` of a
    classifier does. Else []: the weights load whole or not at all."""
    if spec.head.type != "classification":
        return []
    own = model.state_dict()
    heads = [k for k in own if k.startswith("head.")]
    body = {k: v for k, v in own.items() if not k.startswith("head.")}
    theirs = {k: v for k, v in weights.items() if not k.startswith("head.")}
    if set(body) != set(theirs) or any(tuple(v.shape) != tuple(theirs[k].shape) for k, v in body.items()):
        return []  # not this model's body: check_weights says how
    if all(k in weights and tuple(weights[k].shape) == tuple(own[k].shape) for k in heads) and \
            not [k for k in weights if k.startswith("head.") and k not in own]:
        return []  # the head fits too: a classifier of the same classes
    return heads


def _names_of(keys: list[str]) -> str:
    return ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def _imported_tokenizer_note(spec: Any, init_from: str | Path) -> str | None:
    """Weights from ``import-hf --weights`` fit the token ids of the model's own tokenizer: the
    warning for a spec that trains with another (a BPE trained afresh on this run's data)."""
    origin = weights_origin(init_from)
    source = origin.get("specformer.imported_from")
    tokenizer = spec.training.tokenizer
    if source is None or tokenizer is None or tokenizer.type == "file":
        return None
    own = origin.get("specformer.tokenizer")
    fix = (f"--set training.tokenizer.type=file --set training.tokenizer.path={own}" if own else
           "save the model's tokenizer as tokenizer.json and set training.tokenizer: {type: file, path: ...}")
    return (f"{init_from} holds the weights of {source} (import-hf), which fit the token ids of that model's "
            f"tokenizer, but training.tokenizer is {tokenizer.type}: its ids mean other tokens, and the "
            f"imported embeddings start out meaningless; to fine-tune with the model's own: {fix}")


def _with_checkpoint_tokenizer(spec: Any, tokenizer_spec: dict[str, Any], source: str) -> tuple[Any, str | None]:
    """``spec`` with the ``training.tokenizer`` of the checkpoint it starts from: the
    weights fit that tokenizer's ids, so the run uses it and its spec.yaml says so; and the
    note to give where the spec named another."""
    from specformer.specs.errors import SpecError
    from specformer.specs.loader import load_spec

    ours = spec.training.tokenizer.model_dump(mode="json") if spec.training.tokenizer is not None else None
    data = spec.to_dict()
    data["training"]["tokenizer"] = tokenizer_spec
    try:
        adopted = load_spec(data)
    except SpecError as exc:
        problems = "\n  ".join(str(p) for p in exc.problems)
        raise CheckpointError(
            f"{source}: the tokenizer its weights were trained with ({_short(tokenizer_spec)}) does not fit "
            f"this spec:\n  {problems}\nthe run would use that tokenizer (the weights fit its ids); start from "
            "a checkpoint of this model, or change the spec to the checkpoint's"
        ) from None
    theirs = adopted.training.tokenizer.model_dump(mode="json") if adopted.training.tokenizer is not None else None
    note = None
    if ours != theirs and ours is not None:
        note = (f"training.tokenizer ({_short(ours)}) is not used: the weights of {source} fit the tokenizer they "
                f"were trained with ({_short(theirs)}), which this run uses and records in its spec.yaml")
    return adopted, note


def _short(settings: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (settings or {}).items() if v is not None)


def _interruptible(trainer: L.Trainer, interrupted: Callable[[int], BaseException], run: Callable[[], Any]) -> None:
    """Run ``trainer.fit`` / ``validate``, turning Ctrl-C and SIGTERM into ``interrupted(signum)``
    (:class:`TrainingInterrupted` in :func:`train`).

    Lightning catches ``KeyboardInterrupt`` itself: it tears the run down, ignores
    SIGINT from then on and calls ``sys.exit(1)``. SIGTERM it meets with its own handler,
    which stops the run at the end of the batch under way with ``SIGTERMException`` (a
    ``SystemExit``; :class:`~specformer.training.callbacks.PeriodicCheckpoint` saves the step
    reached first). Here either exit becomes an exception that says where the run stopped,
    and SIGINT is handled as before again.
    """
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT)
    try:
        run()
    except SystemExit as exc:
        if not trainer.interrupted:
            raise
        # Terminated: a SIGTERM before Lightning's handler was in place, which Lightning took for Ctrl-C
        term = isinstance(exc, SIGTERMException) or isinstance(exc.__context__, Terminated)
        raise interrupted(signal.SIGTERM if term else signal.SIGINT) from None
    except KeyboardInterrupt as exc:
        # one that Lightning did not turn into its exit: a second Ctrl-C while it tore down a run
        # stopped by SIGTERM or an error, say; still the same report of where the run stopped
        if isinstance(exc, TrainingInterrupted):
            raise
        raise interrupted(int(getattr(exc, "signum", signal.SIGINT))) from None
    finally:
        if main and previous is not None and signal.getsignal(signal.SIGINT) != previous:
            signal.signal(signal.SIGINT, previous)


# code that writes the run's logs: Lightning's loggers (and its hparams.yaml), TensorBoard's writer
_LOGGER_CODE = ("/lightning/pytorch/loggers/", "/lightning/fabric/loggers/", "/lightning/pytorch/core/saving.py",
                "/tensorboard/", "/torch/utils/tensorboard/")


def _log_write_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` of a logger's write (a full disk, a read-only folder) behind ``exc``, else None."""
    from specformer.training.checkpoint import _os_error

    cause = _os_error(exc)
    if cause is None:
        return None
    frames = traceback.extract_tb(cause.__traceback__)
    if any(part in frame.filename.replace("\\", "/") for frame in frames for part in _LOGGER_CODE):
        return cause
    return None


def _log_write_message(exc: OSError, run_dir: Path, where: TrainingInterrupted, *, started: bool) -> str:
    """What a failed write of the logs says: the file (or the run's folder), why, what is left,
    and which setting to change."""
    name = str(exc.filename) if isinstance(exc.filename, str) and exc.filename else None
    what = name if name and Path(name).resolve().is_relative_to(run_dir.resolve()) else None
    text = f"training.out_dir: cannot write {what or f'the logs in {run_dir}'} ({exc.strerror or exc})"
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    fix = ("free space there, or set training.out_dir to another folder" if full
           else "set training.out_dir to a folder that can be written")
    if not started:
        return f"{text}; no run was started: {fix}"
    if where.checkpoint is not None:
        return (f"{text}; the run stopped at step {where.step}, and its last checkpoint (step "
                f"{where.checkpoint_step}) is {where.checkpoint}: {fix}, then resume from it")
    return f"{text}; the run stopped at step {where.step}, before its first checkpoint: {fix}"


@contextmanager
def _quiet_log_writer_thread() -> Iterator[None]:
    """TensorBoard writes its events file from a thread of its own: a write that fails there
    (a full disk) was printed as that thread's traceback, then raised again in the main thread
    at its next write or flush (Lightning flushes before it closes the file), where
    :func:`train` reports it. The thread's traceback is left out."""
    previous = threading.excepthook

    def hook(args: Any) -> None:
        if not (type(args.thread).__module__.startswith("tensorboard") and isinstance(args.exc_value, OSError)):
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


def _note_where_it_stopped(exc: BaseException, where: TrainingInterrupted) -> None:
    """Add to ``exc`` (in ``__notes__``, which tracebacks and the command line show) the step at
    which the run stopped and the checkpoint to resume from."""
    if where.checkpoint is not None:
        note = (f"the run stopped at step {where.step}; its last checkpoint (step {where.checkpoint_step}) is "
                f"{where.checkpoint}")
    elif where.step > 0:
        note = f"the run stopped at step {where.step}, before its first checkpoint"
    else:
        return
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


