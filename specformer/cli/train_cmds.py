"""``specformer train``, ``generate``, ``eval``, ``fill-mask`` and ``classify``: training and using models.

Thin: each command loads, calls :mod:`specformer.training` / :mod:`specformer.data`,
and prints. torch and Lightning are imported inside the commands.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from specformer.cli.app import (
    OnceCommand,
    app,
    console,
    err_console,
    loading,
    natural_width,
    print_error,
    reader_gone,
)
from specformer.cli.spec_cmds import SetOption, print_problems
from specformer.specs.errors import SpecError

__all__ = ["train_cmd", "generate_cmd", "eval_cmd", "fill_mask_cmd", "classify_cmd", "load_training_file"]

DEBUG_ENV = "SPECFORMER_DEBUG"


def _fail(message: str, hint: str = "") -> typer.Exit:
    print_error(message, hint)
    return typer.Exit(1)


def _number(low: float | None = None, high: float | None = None, *, above: bool = False, hint: str = "") -> dict[str, Any]:
    """A float option's ``parser`` and ``metavar``: a finite number from ``low``
    (``above``: strictly) to ``high``. The parser runs in every typer version
    the project allows, where click's and pydantic's range checks read ``nan``
    as out of range ("greater than or equal to 0") and ``inf`` as in it."""
    if high is None:
        shown = "" if low is None else f"x>{low:g}" if above else f"x>={low:g}"
    else:
        shown = ("" if low is None else f"{low:g}<" if above else f"{low:g}<=") + f"x<={high:g}"

    def parse(value: str | float) -> float:
        try:
            number = float(value)
        except ValueError:
            raise typer.BadParameter(f"{value!r} is not a number") from None
        if not math.isfinite(number):
            raise typer.BadParameter(f"{value} is not a finite number")
        if (low is not None and (number <= low if above else number < low)) or (high is not None and number > high):
            raise typer.BadParameter(f"{value} is not in the range {shown}" + (f": {hint}" if hint else ""))
        return number

    return {"parser": parse, "metavar": "<float>" if low is None and high is None else f"<float range> [{shown}]"}


INTERRUPTED = 130  # the shell's status for a command stopped by SIGINT (128 + 2); SIGTERM's is 143


def _signal_of(exc: BaseException) -> int:
    """The signal behind a ``KeyboardInterrupt``: SIGTERM for specformer's
    (:class:`~specformer.training.run.Terminated`), else SIGINT (Ctrl-C)."""
    return int(getattr(exc, "signum", signal.SIGINT))


def _stopped_by(exc: BaseException) -> str:
    from specformer.training.stops import stopped_by

    return stopped_by(_signal_of(exc))


def _starting(nothing: str = "nothing was written") -> AbstractContextManager[None]:
    """The imports of torch and Lightning (seconds): Ctrl-C or SIGTERM there is said once they
    end, not silent (the handler of :func:`~specformer.training.run.sigterm_raises` is not in
    place before those imports), and never raised inside them (:func:`~specformer.cli.app.loading`).
    ``nothing``: what the command had not done yet."""
    return loading(f"while starting; {nothing}")


def _first_process() -> bool:
    """Whether this is the run's first process (rank 0), the one that reports; True before
    Lightning knows of others."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


@contextmanager
def _errors_for_people(
    interrupt_hint: Callable[[int, int | None], str] | None = None,
    stopped: str = " before training started; nothing was written to resume from",
    resume_again: Sequence[str] = (),
) -> Iterator[None]:
    """Turn the errors a run can meet into one clear message and exit status 1 (130 for
    Ctrl-C, 143 for SIGTERM, reported as "interrupted" + ``stopped`` unless a run was under
    way). SIGTERM (``kill``, ``timeout``, a scheduler) stops the command as Ctrl-C does."""
    with _starting():
        from specformer.data.corpus import DataError
        from specformer.training.checkpoint import CheckpointError
        from specformer.training.stops import TrainingInterrupted, sigterm_raises

    try:
        with sigterm_raises():
            yield
    except typer.Exit:
        raise
    except SpecError as exc:
        print_problems(exc)
        raise typer.Exit(1) from None
    except (DataError, CheckpointError) as exc:
        raise _fail(str(exc)) from None
    except TrainingInterrupted as exc:
        if not _first_process():  # one message for a run of several processes, which all stop
            raise typer.Exit(exc.exit_status) from None
        if exc.finished and exc.checkpoint:
            print_error(str(exc), f"every step ran; evaluate it with: specformer eval {shlex.quote(exc.checkpoint)}")
        elif exc.checkpoint:
            # a checkpoint of this run holds its settings; the one it resumed from (the run wrote none yet)
            # holds the settings before this run's SPEC, --training and --set, which are given again
            own = Path(exc.checkpoint).resolve().is_relative_to(Path(exc.run_dir).resolve())
            again = "" if own else "".join(f" {shlex.quote(arg)}" for arg in resume_again)
            print_error(str(exc), f"resume with: specformer train --resume {shlex.quote(exc.checkpoint)}{again}")
        else:
            print_error(str(exc), interrupt_hint(exc.step, exc.max_steps) if interrupt_hint else "")
        raise typer.Exit(exc.exit_status) from None
    except KeyboardInterrupt as exc:
        if _first_process():
            print_error(_stopped_by(exc) + stopped)
        raise typer.Exit(128 + _signal_of(exc)) from None
    except Exception as exc:  # Lightning, torch and the OS raise many kinds: say which, briefly
        from specformer.cli import _output_error
        from specformer.cli.app import stdout_gone

        if os.environ.get(DEBUG_ENV) or (isinstance(exc, OSError) and _output_error(exc)) or stdout_gone(exc):
            raise  # a full disk under a redirected output, or `| head` stopped reading: as every command says it
        text = _without_worker_traceback(str(exc).strip(), type(exc).__name__) or type(exc).__name__
        # where a failed run stopped and its checkpoint (specformer.training.run adds it)
        notes = [str(note) for note in getattr(exc, "__notes__", [])]
        raise _fail(f"{type(exc).__name__}: {text}", "\n  ".join([*notes, f"set {DEBUG_ENV}=1 to see the full traceback"])) from None


def _without_worker_traceback(text: str, name: str) -> str:
    """torch raises the error of a data-loading worker process again in the main one with the
    worker's whole traceback in its message ("Caught ValueError in DataLoader worker process 0.
    Original Traceback (most recent call last): ..."): keep the error, and say where it was."""
    head, found, rest = text.partition("\nOriginal Traceback (most recent call last):")
    if not found:
        return text
    lines = rest.splitlines()
    # the error follows the last line of the traceback's frames (indented: File ..., code, ^^^)
    last_frame = max((i for i, line in enumerate(lines) if line[:1].isspace()), default=-1)
    error = "\n".join(lines[last_frame + 1 :]).strip()
    error = error.removeprefix(f"{name}: ")
    where = head.strip().removesuffix(".").partition(" in ")[2]  # "DataLoader worker process 0"
    return f"{error} (raised in {where})" if where else error


def load_training_file(path: str) -> dict[str, Any]:
    """The ``training:`` section in a YAML file: the section itself, or a spec-like file
    with a top-level ``training:`` key."""
    return _read_training_file(path)[0]


def _read_training_file(path: str) -> tuple[dict[str, Any], dict[tuple, Any]]:
    """:func:`load_training_file` and the file position of every key in the section
    (keys relative to the section), for errors that point into the file."""
    from specformer.specs.errors import Position, SpecProblem
    from specformer.specs.loader import not_utf8_problem, parse_yaml

    file = Path(path)
    if file.is_dir() and (file / "spec.yaml").is_file():
        file = file / "spec.yaml"  # a run folder: the training section of the spec it ran
    if file.is_dir():
        raise SpecError([SpecProblem(
            "a folder, not a YAML file: --training takes a file with a training: section (or the section alone), "
            "or a run folder (its spec.yaml)",
            position=Position(str(file)),
        )])
    if not file.exists():  # a pipe (/dev/stdin, <(...)) exists and is read as it is
        where = "" if file.is_absolute() else f" (in {Path.cwd()})"
        raise SpecError([SpecProblem(f"--training {file}: file not found{where}")])
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([not_utf8_problem(exc, str(file))]) from None
    except OSError as exc:
        raise SpecError([SpecProblem(f"cannot read the file: {exc.strerror}", position=Position(str(file)))]) from None
    data, positions = parse_yaml(text, str(file))
    if not isinstance(data, dict):
        found = "the file is empty" if data is None else f"found {type(data).__name__}"
        raise SpecError([SpecProblem(f"a training file is a YAML mapping ({found})",
                                     position=Position(str(file), 1, 1))])
    if isinstance(data.get("training"), dict):
        # a spec-like file (a whole spec, say): its training section, the rest left alone; a file
        # that is no whole spec (no kind, no extends) and writes model fields beside it is told so
        rest = [k for k in data if k not in ("training", "name")]
        if rest and not {"kind", "extends"} & set(data):
            shown = ", ".join(f"{k} (line {positions[(k,)].line})" if (k,) in positions and positions[(k,)].line
                              else str(k) for k in rest)
            print_error(f"--training {path} reads its training: section alone; {shown} left as the spec has "
                        f"{'them' if len(rest) > 1 else 'it'}", "model fields go in the spec, or --set them",
                        label="[dim]note:[/]")
        data = data["training"]
        positions = {p[1:]: pos for p, pos in positions.items() if p[:1] == ("training",)}
    return data, positions


def _with_training_file(data: dict[str, Any], positions: dict, training_file: str) -> dict[str, Any]:
    """``data`` with the file's training section merged in; ``positions`` gains the file's."""
    from specformer.specs.loader import apply_overrides

    section, where = _read_training_file(training_file)
    data = apply_overrides(data, [("training", section)])
    positions.update({("training", *p): pos for p, pos in where.items()})
    return data


def _load_spec(
    source: str | dict[str, Any], training_file: str | None, overrides: list[str] | None
) -> tuple[Any, dict]:
    """A spec (preset, file, or the dict a checkpoint holds), then --training, then --set;
    with where each value was written (the file's line, or the --set that gave it)."""
    from specformer.specs.loader import apply_overrides, load_spec_data

    data, positions = load_spec_data(source)
    if training_file:
        data = _with_training_file(data, positions, training_file)
    data = apply_overrides(data, overrides or [], positions) if overrides else data
    return _validate(data, positions), positions


def _placed(error: SpecError, positions: dict) -> SpecError:
    """``error`` with each problem that names a field but no place placed where that field (or
    the nearest section holding it) was written: the checks a run makes after validation
    (a head no objective trains, a precision this machine cannot run) know the field only."""
    from dataclasses import replace

    def place(path: str) -> Any:
        keys = tuple(int(k) if k.isdigit() else k for k in path.split("."))
        held = keys
        while held not in positions:
            if not held:
                return None
            held = held[:-1]
        found = positions[held]
        if held == keys:
            return found
        # a section holding the field, where no one wrote it: a file's section is where to add it,
        # but not a --set of another field of it, nor the file's first line
        return None if not held or str(getattr(found, "source", "")).startswith("--set") else found

    problems = [replace(p, position=place(p.path)) if p.position is None and p.path else p for p in error.problems]
    return SpecError(problems)


def _validate(data: dict[str, Any], positions: dict) -> Any:
    from pydantic import ValidationError

    from specformer.specs.loader import problems_from_validation
    from specformer.specs.schema import ModelSpec

    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from_validation(exc, positions, data)) from None


def _fmt(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m {s:02d}s" if m else f"{seconds:.1f}s"


def _titled(table: Table) -> Any:
    """``table`` under its title on a line of its own: rich pads a table's title to the
    table's width, which left a line of trailing spaces in a log."""
    from rich.console import Group
    from rich.text import Text

    title, table.title = table.title, None
    return Group(Text(str(title), style="table.title"), table) if title else table


def _print_table(table: Table) -> None:
    """``table`` under its title on stdout: fitted to a terminal's width; in a file, a pipe or
    CI, at the width it takes whole, as rich's 80 columns there broke a long data path or
    tokens/s line across rows of the table (the path lines below it are kept whole too)."""
    from rich.console import Console

    titled = _titled(table)
    if console.is_terminal:
        console.print(titled)
        return
    Console(file=console.file, width=max(natural_width(titled), 1), soft_wrap=False, no_color=console.no_color).print(titled)


def _summary_table(result: Any) -> Table:
    from specformer.training.callbacks import format_count, share_of_held_out

    table = Table(title=f"trained {result.spec_name}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")  # a path longer than a terminal is wrapped, not cut to "…"
    table.add_row("data", result.data)
    if result.trainable_parameters < result.parameters:
        table.add_row("parameters", _trainable(result.parameters, result.trainable_parameters))
    # the path it started from is printed on a line of its own, below
    start = ("  (resumed: see below)" if result.resumed_from
             else "  (from the weights below)" if result.initialized_from else "")
    table.add_row("steps", str(result.steps) + start)
    table.add_row("train loss", _fmt(result.train_loss) + "  (mean of the last steps)")
    table.add_row("val loss", _fmt(result.val_loss))
    if result.accuracy is None:  # a classifier's loss is over its classes, not a vocabulary: no perplexity
        table.add_row("val perplexity", _fmt(result.val_ppl, 2))
    if result.unigram_loss is not None:
        better = ""
        if result.val_loss is not None:
            gap = result.unigram_loss - result.val_loss
            better = f"  (val loss is {abs(gap):.3f} nats/token {'below' if gap >= 0 else 'above'} it)"
        table.add_row("unigram baseline", _fmt(result.unigram_loss) + better)
    if result.exact_match is not None:
        table.add_row("exact match", share_of_held_out(result.exact_match, result.val_examples, "example"))
    if result.accuracy is not None:
        table.add_row("accuracy", share_of_held_out(result.accuracy, result.val_examples, "text"))
    tokens = format_count(result.tokens)
    if result.resumed_from:
        # the tokens since step 0; tokens/s is this run's own, over the steps it trained
        this_run = result.run_tokens or round(result.tokens_per_second * (result.train_seconds - result.val_seconds))
        tokens += f"  ({format_count(this_run)} in this run, which tokens/s counts)"
    table.add_row("tokens", tokens)
    rate = format_count(result.tokens_per_second)
    if result.flops_per_token and result.tokens_per_second:
        from specformer.cli.analysis_cmds import human_flops

        # nanoGPT's MFU is this over the hardware's peak (its 312 TFLOP/s of an A100 in bf16)
        rate += (f"  ({human_flops(result.tokens_per_second * result.flops_per_token)}/s of model FLOPs, "
                 f"{human_flops(result.flops_per_token)} a token; over the hardware's peak: MFU)")
    table.add_row("tokens/s", rate)
    parts = [f"validation {_duration(result.val_seconds)}"] if result.val_seconds >= 0.05 else []
    if result.compile_seconds:  # training.compile: the first step, which tokens/s leaves out
        parts.append(f"first step, compiling, {_duration(result.compile_seconds)}, which tokens/s leaves out")
    of_it = f", {', '.join(parts)} of it" if parts else ""
    table.add_row("wall time", f"{_duration(result.wall_seconds)}  (training {_duration(result.train_seconds)}{of_it})")
    return table


def _print_summary(result: Any) -> None:
    _print_table(_summary_table(result))
    # the paths are what one copies next: on lines of their own, never cut to the width
    paths = [("resumed", result.resumed_from), ("weights", result.initialized_from),
             ("checkpoint", result.checkpoint), ("logs", Path(result.run_dir) / "metrics.csv")]
    for label, path in paths:
        if path:
            console.print(f"[bold]{label:<10}[/] {escape(str(path))}", highlight=False, soft_wrap=True)


@app.command("train")
def train_cmd(
    spec: Annotated[
        str | None,
        typer.Argument(metavar="SPEC", help="A preset name, a YAML spec or a run folder (its spec.yaml). Leave it out with --resume: the checkpoint's spec, "
                            "with every --set of its run, is used; a spec given there replaces the run's "
                            "training settings (those its --set gave included) with its own."),
    ] = None,
    set_: SetOption = None,
    training: Annotated[
        str | None,
        typer.Option("--training", "-t", help="A YAML file with the training section (replaces the spec's settings it names)."),
    ] = None,
    resume: Annotated[
        str | None, typer.Option("--resume", "-r", help="Continue exactly from this checkpoint (or run folder).")
    ] = None,
    init_from: Annotated[
        str | None,
        typer.Option(
            "--init-from",
            help="Start from these weights (fine-tuning): a .safetensors file from `import-hf --weights`, "
            "or a checkpoint / run folder. A new run: step 0, a fresh optimizer.",
        ),
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar (each validation prints its line either way).")] = True,
) -> None:
    """Train a model on built-in or your own data, as the spec's `training:` section says.

    Writes `runs/<name>/<timestamp>/` (the spec's name; a YAML file that writes none, the
    file's: `rope.yaml` trains into `runs/rope/`) with the resolved spec, `metrics.csv` and
    `checkpoints/last.ckpt`, and ends with a summary: train and validation loss,
    perplexity, the unigram baseline (text), exact match (sequence-to-sequence) or accuracy
    (classification), tokens/s and the model FLOP/s behind them (for MFU),
    wall time and the checkpoint. A field is set with `--set`: nanoGPT's `--batch_size=32`
    is `--set training.batch_size=32`, `--n_layer=6` is `--set decoder.n_layers=6`.

    Examples:

    ```
    specformer train gpt-nano
    specformer train bert-nano --set training.max_steps=200
    specformer train t5-nano --set training.data.task=sort
    specformer train gpt-nano \\
        --set 'training.data={type: files, paths: [input.txt]}' \\
        --set training.tokenizer.type=byte
    specformer train my.yaml --training fast.yaml \\
        --set training.precision=bf16-mixed
    specformer train --resume runs/gpt-nano/20250101-120000   # or its last.ckpt
    specformer train gpt2.yaml --init-from gpt2.safetensors \\
        --set training.max_steps=200
    specformer train gpt2.yaml --init-from gpt2.safetensors \\
        --set training.objective.type=sft \\
        --set 'training.data={type: pairs, paths: [qa.jsonl]}'
    ```

    A decoder given (prompt, response) pairs (`training.data` of type pairs: .jsonl lines
    with a source and a target) fine-tunes on prompt + response + end token with the loss
    on the response alone (objective sft, as TRL's and torchtune's SFT; a spec import-hf
    wrote names objective causal_lm, hence the --set training.objective.type=sft above).
    An encoder with a classification head trains on labelled texts (`training.data` of
    type labelled: .csv/.tsv/.json/.jsonl rows of a text and its label; objective
    classification), reporting accuracy.

    `--resume` continues a run where it stopped; `--init-from` starts a new run from
    weights (those of `specformer import-hf MODEL_DIR -o gpt2.yaml --weights
    gpt2.safetensors`, or of another run). Imported weights train with the model's own
    tokenizer, which the spec import-hf writes names (training.tokenizer: {type: file}).
    """
    spec_obj: Any = None
    positions: dict = {}
    if spec is not None and (resume is None or init_from is None):
        # read before torch and Lightning are imported (seconds): a mistake in the spec or a
        # --set is said as fast as validate says it
        try:
            spec_obj, positions = _load_spec(spec, training, set_)
        except SpecError as exc:
            print_problems(exc)
            raise typer.Exit(1) from None
    with _starting():
        from lightning.pytorch.utilities.rank_zero import rank_zero_only

        from specformer.training.checkpoint import read_checkpoint

    # a multi-process run starts this command again in each other process: only rank 0 reports
    report = rank_zero_only.rank == 0

    def interrupt_hint(step: int, max_steps: int | None = None) -> str:
        if spec_obj is None:
            return ""
        t = spec_obj.training
        last = max_steps if max_steps is not None else t.max_steps  # a max_epochs run's steps, where known
        first = min(t.checkpoint_every, last) if last is not None else t.checkpoint_every
        if step >= first:  # stopped in the validation the first checkpoint is written after
            return (f"nothing to resume from: the checkpoint of step {first} is written after that step's "
                    "validation, which the stop cut short")
        return f"nothing to resume from: the first checkpoint comes at step {first}"

    again = [*([spec] if spec is not None else []), *(["--training", training] if training is not None else []),
             *(arg for value in set_ or [] for arg in ("--set", value))]
    with _errors_for_people(interrupt_hint, resume_again=again):
        if resume is not None and init_from is not None:
            raise _fail(
                "give --resume or --init-from, not both",
                "--resume continues a run (weights, optimizer, step); --init-from starts a new run from weights",
            )
        if spec is None:
            if resume is None:
                raise _fail("give a SPEC to train (a preset name or a YAML file), or --resume CHECKPOINT")
            meta = read_checkpoint(resume).get("specformer")
            if not isinstance(meta, dict) or "spec" not in meta:
                raise _fail(f"{resume}: not a specformer checkpoint (it has no spec)")
            try:
                spec_obj, positions = _load_spec(meta["spec"], training, set_)
            except SpecError as exc:
                print_problems(exc, source=f"{resume} holds")
                if any(p.message.startswith("unknown type") for p in exc.problems):
                    print_error("its model uses a type that is not registered here (a plugin's, or one a script "
                                "registered): install the plugin (a 'specformer.plugins' entry point registers it "
                                "for the command line too)", label="[dim]note:[/]")
                raise typer.Exit(1) from None
        from specformer.training.run import train

        # said once the checkpoint or weights are checked: a refused --resume says only why
        header = (f"[bold]training[/] {escape(spec_obj.name)} ({spec_obj.kind}{_parameters(spec_obj)}) — "
                  "preparing data…")
        try:
            # how the run was started, for its spec.yaml and summary.json (as `specformer`, whatever
            # launched it: the script, python -m specformer)
            command = shlex.join(["specformer", *sys.argv[1:]])
            # the bar on stderr; the validation lines with the summary where stdout is a file or a
            # pipe (train ... > log keeps the run's curve), above the bar where both are the terminal
            result = train(spec_obj, resume=resume, init_from=init_from, progress=progress, console=err_console,
                           log=None if console.is_terminal else console, command=command,
                           overrides=list(set_ or []), header=header if report else None)
        except SpecError as exc:
            raise _placed(exc, positions) from None
    if report:
        _print_summary(result)


def _parameters(spec: Any) -> str:
    """', 891,648 parameters' (tied weights once, as `show` counts them), said as a run starts
    as nanoGPT says its own, with the trainable ones when training.optimizer.freeze leaves
    some out; '' for a component the count does not know (a plugin's)."""
    from specformer.analysis import count_parameters
    from specformer.analysis.memory import trainable_parameters

    try:
        total, trained = count_parameters(spec).total, trainable_parameters(spec)
    except Exception:  # a plugin's part, or a pattern that matches nothing (the run says which)
        return ""
    return f", {_trainable(total, trained)}" if trained < total else f", {total:,} parameters"


def _trainable(total: int, trained: int) -> str:
    """'891,648 parameters, 793,344 trainable (89.0%)': the numbers PEFT's print_trainable_parameters() gives."""
    return f"{total:,} parameters, {trained:,} trainable ({100 * trained / total:.1f}%)"


def _load_checkpoint(path: str, spec_source: str | None = None) -> Any:
    """A checkpoint or run folder, or a ``.safetensors`` file of weights with ``--spec``."""
    from specformer.training.checkpoint import load_checkpoint, load_weights_file

    if Path(path).suffix.lower() == ".safetensors":
        if spec_source is None:
            raise _fail(f"{path} holds weights only; give their spec with --spec SPEC",
                        "e.g. the spec and weights import-hf wrote: --spec my.yaml")
        from specformer.cli.spec_cmds import load_or_exit

        loaded = load_weights_file(path, load_or_exit(spec_source))
        if loaded.tokenizer is None:
            settings = loaded.spec.training.tokenizer
            raise _fail(
                f"{path}: no tokenizer for these weights: the spec's training.tokenizer is "
                + (f"{settings.type}, a tokenizer it would train, not the one the weights' token ids belong to"
                   if settings else "unset (a vocab_size below any text tokenizer's)"),
                "give the model's own: --spec with training.tokenizer: "
                "{type: file, path: path/to/tokenizer.json} (import-hf writes it so)")
    elif spec_source is not None:
        raise _fail(f"--spec is for a .safetensors file of weights; {path} is a checkpoint, which carries its own spec")
    else:
        loaded = load_checkpoint(path)
    # NaN weights: greedy decoding emits token 0, sampling fails inside torch, eval prints nan
    from specformer.training.checkpoint import check_finite_weights, checkpoint_file

    check_finite_weights(loaded.model, source=str(checkpoint_file(Path(loaded.path))))
    return loaded


SpecOfWeights = Annotated[
    str | None,
    typer.Option("--spec", help="The spec of a .safetensors CHECKPOINT (weights only, as import-hf --weights writes them): a preset name or YAML path."),
]


def _conversation_file(path: Path, prompt: str) -> list[dict[str, Any]]:
    """The turns of ``generate --messages``: a JSON list of turns, or an object with them under
    ``messages``, then ``prompt`` as a user turn when given; it must end with a turn for the
    model to answer (not an assistant's)."""
    import json

    from specformer.data.conversations import read_turns
    from specformer.data.corpus import DataError

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _fail(f"--messages: cannot read {path} ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise _fail(f"--messages: {path} is not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise _fail(f"--messages: {path}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg})") from None
    if isinstance(data, dict) and "messages" in data:
        data = data["messages"]
    if not isinstance(data, list):
        raise _fail(f"--messages: {path} holds a JSON {type(data).__name__}; give a list of "
                    '{"role": ..., "content": ...} turns, or an object with them under "messages"')
    try:
        turns = read_turns(data, f"--messages: {path}")
    except DataError as exc:
        raise _fail(str(exc)) from None
    if prompt:
        turns.append({"role": "user", "content": prompt})
    if not turns or turns[-1]["role"] == "assistant":
        raise _fail(f"--messages: {path} {'ends with an assistant turn' if turns else 'holds no turns'}: the model "
                    "answers the last turn; add --prompt with the user's next turn")
    return turns


@app.command("generate", cls=OnceCommand)
def generate_cmd(
    checkpoint: Annotated[str, typer.Argument(metavar="CHECKPOINT", help="A checkpoint (.ckpt), a run folder, or a .safetensors file of weights with --spec.")],
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Text to continue (decoder) or to transform (encoder-decoder); - reads it from standard input, whole.")] = "",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1, help="Tokens to generate at most.")] = 100,
    temperature: Annotated[
        float | None, typer.Option("--temperature", **_number(0), help="Sampling temperature; 0 is greedy. Default 0.8 (decoder); for an encoder-decoder 0 (greedy), or 1 with --top-k or --top-p.")
    ] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", "-k", min=1, help="Sample from the k most likely tokens.")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", **_number(0, 1, above=True, hint="1 keeps every token; for the most likely token use --greedy"), help="Nucleus sampling: the smallest set with this probability.")] = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="Always take the most likely token (same as --temperature 0).")] = False,
    stop_at_eot: Annotated[bool | None, typer.Option("--stop-at-eot/--no-stop-at-eot", help="Decoder: stop at the end-of-text token (the end of a document, or of a response; with --chat, the tokenizer's eos_token, an instruct model's end of turn) instead of going on into a new one. Default: on for a model fine-tuned with the sft objective, whose responses end there, and with --chat; off otherwise.")] = None,
    chat: Annotated[bool | None, typer.Option("--chat/--no-chat", help="Decoder: frame the prompt as a user turn of the tokenizer's chat template, followed by its generation prompt (transformers' apply_chat_template(..., add_generation_prompt=True)), as an instruct model reads a question. The template is the one the checkpoint's tokenizer keeps (read, when it was trained, from beside its tokenizer.json), else the one beside the spec's training.tokenizer (chat_template.jinja or tokenizer_config.json). Default: on for a model fine-tuned with sft and chat_template: true; off otherwise.")] = None,
    system: Annotated[str | None, typer.Option("--system", help="With --chat: a system prompt, rendered as a system turn before the user's (the instructions an instruct model follows). Default: the training.objective.system the model was fine-tuned with, if any; --system '' puts no system turn (the template's own default one, if it has one).")] = None,
    messages: Annotated[Path | None, typer.Option("--messages", help="Decoder, with the chat template: a JSON file of a conversation so far, a list of {\"role\": ..., \"content\": ...} turns (or an object with them under \"messages\", as a line of training's conversations data); the model answers it as the next assistant turn. --prompt, when given too, is one more user turn after it. --system goes first when the conversation has no system turn. Implies --chat.")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**63 - 1, help="Seed of the sampler.")] = 0,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="Reuse keys and values of past tokens (KV cache).")] = True,
    heal: Annotated[bool | None, typer.Option("--heal/--no-heal", help="Decoder: a prompt ending in whitespace is encoded without it, and the first new tokens spell it (token healing). Default: on.")] = None,
    num_beams: Annotated[int, typer.Option("--num-beams", min=1, help="Beam search with this many beams (as transformers' num_beams): the most likely text found, instead of sampling. 1: sample (or --greedy).")] = 1,
    repetition_penalty: Annotated[float, typer.Option("--repetition-penalty", **_number(0, above=True, hint="1 is none; above 1 makes tokens already in the text less likely (1.2 is common)"), help="Above 1, tokens already in the text are less likely: their scores are divided by it (multiplied when negative), as transformers' repetition_penalty. 1: none.")] = 1.0,
    no_repeat_ngram: Annotated[int, typer.Option("--no-repeat-ngram", min=0, help="Never repeat an n-gram of this many tokens that the text already has (transformers' no_repeat_ngram_size). 0: none.")] = 0,
    length_penalty: Annotated[float, typer.Option("--length-penalty", **_number(), help="Beam search: a finished text scores its log-probability / length ** this; above 0 favours longer texts.")] = 1.0,
    num_samples: Annotated[int, typer.Option("--num-samples", min=1, help="Texts to sample from the same prompt, one after another (as nanoGPT's sample.py), separated by a line of dashes.")] = 1,
    context: Annotated[int | None, typer.Option("--max-seq-len", min=1, help="Decoder: the most tokens read at once, where the context slides (default: the spec's max_seq_len; none for a model with a sliding window in every layer and no learned table, whose rolling KV cache goes on as Mistral's). Larger lets a RoPE, ALiBi, T5, sinusoidal or NoPE model generate at positions past the length it was built for; a learned table reads only its rows.")] = None,
    spec_source: SpecOfWeights = None,
) -> None:
    """Sample from a trained model: continue a prompt (decoder) or decode an input (encoder-decoder).

    The text is printed as its tokens are generated (a beam search's when it is done); Ctrl-C
    stops, keeping what is shown.

    A prompt that ends in whitespace ("The model ") is healed with a BPE or tokenizer.json
    tokenizer: those put a word's space at its start (" is"), so a lone trailing space is a
    token training rarely had before a word; the space is taken off and the first new token
    chosen among those that begin with it. --no-heal encodes the prompt as it is.

    Examples:

    ```
    specformer generate runs/gpt-nano/<timestamp>/checkpoints/last.ckpt \\
        --prompt "def" --max-new-tokens 100
    specformer generate CKPT --prompt "import os" --temperature 0.7 --top-k 50 \\
        --top-p 0.95
    specformer generate CKPT --prompt "def" --top-k 200 --num-samples 5
    specformer generate runs/t5-nano/<timestamp> --prompt "hello"
    # import-hf's weights
    specformer generate my.safetensors --spec my.yaml --prompt "Hello" --greedy
    # an instruct model
    specformer generate my.safetensors --spec my.yaml --chat \\
        --prompt "What is 2+2?"
    specformer generate CKPT --prompt "What is 2+2?" --chat \\
        --system "Answer in one word."
    # a conversation so far, then a turn
    specformer generate CKPT --messages chat.json --prompt "And 3+3?"
    specformer generate runs/t5-nano/<timestamp> --prompt "hello" --num-beams 4
    # a RoPE model built for 1024
    specformer generate CKPT --prompt "def" -n 4000 --max-seq-len 4096
    ```
    """
    with _starting("nothing was generated"):
        import torch

        from specformer.components.layout import lay_out_for_decoding
        from specformer.data.tokenizers import decoder_start_id, forced_ids
        from specformer.training.generate import (
            _heals,
            _rolling_reach,
            beam_search,
            chat_prompt,
            encode_prompt,
            generate,
            generate_seq2seq,
        )

    with _errors_for_people(stopped="; nothing more is generated"):
        given_as = "--prompt"
        if prompt == "-":  # the prompt from standard input, whole (`cat prompt.txt | specformer generate CKPT -p -`)
            if sys.stdin.isatty():
                print_error("reading the prompt from standard input (Ctrl-D ends it)", label="[dim]note:[/]")
            prompt, given_as = _stdin_text(), "--prompt - (standard input)"
        _check_utf8(prompt, given_as)
        if system is not None:
            _check_utf8(system, "--system")
        loaded = _load_checkpoint(checkpoint, spec_source)
        spec, model, tok = loaded.spec, loaded.model, loaded.tokenizer
        if tok is None:
            raise _fail(f"{checkpoint}: the checkpoint carries no tokenizer, so text cannot be encoded",
                        "save the model again with the tokenizer it was trained with: "
                        "specformer.training.save_checkpoint(model, path, tokenizer=...)")
        if spec.kind == "encoder":
            if spec.head.type == "classification":
                raise _fail("a sequence classifier (head: classification) does not generate text; use "
                            "`specformer classify` to label texts")
            raise _fail("an encoder does not generate text; use `specformer fill-mask` with a <mask> in the text")
        objective = spec.training.objective if spec.training is not None else None
        turns = _conversation_file(messages, prompt) if messages is not None else None
        if turns is not None and chat is False:
            raise _fail("--messages is a conversation of the chat template's turns: leave out --no-chat")
        if chat is None:  # a model fine-tuned on conversations reads a prompt as a user turn
            chat = turns is not None or (objective is not None and objective.type == "sft" and objective.chat_template)
        stop_given = stop_at_eot
        if stop_at_eot is None:  # a model fine-tuned on (prompt, response) pairs learnt to end its response there,
            # and an instruct model its turn
            stop_at_eot = chat or (objective is not None and objective.type == "sft")
        if chat and spec.kind != "decoder":
            what = "--messages is a conversation" if turns is not None else "--chat frames a prompt as a user turn"
            raise _fail(f"{what} for a decoder to answer; an encoder-decoder reads its input as it is")
        if stop_given is not None and spec.kind != "decoder":
            raise _fail(f"{'--stop-at-eot' if stop_given else '--no-stop-at-eot'} is where a decoder's text ends; an "
                        "encoder-decoder's output always ends at its end token: leave it out")
        if heal is not None and spec.kind != "decoder":
            raise _fail(f"{'--heal' if heal else '--no-heal'} is a decoder's: an encoder-decoder reads its input as "
                        "it is, whitespace included: leave it out")
        heal = heal is not False
        if system is not None and spec.kind != "decoder":
            raise _fail("--system is a turn of a decoder's chat template; an encoder-decoder reads its input as "
                        "it is, with no turns: leave out --system")
        if system is not None and not chat:
            raise _fail("--system is a turn of the chat template: add --chat (a model fine-tuned with "
                        "chat_template: true has it by default)")
        if system is None and objective is not None and objective.type == "sft":
            system = objective.system  # the system prompt the model was fine-tuned with
        if greedy or temperature == 0:  # the most likely token each step: a top-k or top-p would go unused
            sampling = [f"{name} {value:g}" for name, value in (("--temperature", temperature), ("--top-k", top_k),
                                                                 ("--top-p", top_p))
                        if value is not None and not (name == "--temperature" and value == 0)]
            if sampling:
                how = "--greedy" if greedy else "--temperature 0"
                raise _fail(f"{how} takes the most likely token and samples nothing: leave out "
                            f"{', '.join(sampling)}", f"or sample without {how}")
        if num_beams == 1 and length_penalty != 1.0:
            raise _fail("--length-penalty scores the texts of a beam search: add --num-beams K (K > 1)")
        if num_beams > 1:
            sampling = [name for name, given in (("--temperature", temperature), ("--top-k", top_k),
                                                 ("--top-p", top_p)) if given is not None]
            if sampling:
                raise _fail(f"--num-beams searches for the most likely text and samples nothing: leave out "
                            f"{', '.join(sampling)}", "or sample with --num-beams 1")
            if not cache:
                raise _fail("--num-beams runs with the KV cache: leave out --no-cache")
        if context is not None:
            if spec.kind != "decoder":
                raise _fail("--max-seq-len is where a decoder's context slides; an encoder-decoder reads its whole "
                            "input, and its output is capped only by a learned position table")
            _check_length_change(spec, context, "--max-seq-len")
        # the most tokens read at once; none for a decoder with a window in every layer (and positions
        # that are not a table), whose rolling cache goes on past max_seq_len unless --max-seq-len is given
        rolling = spec.kind == "decoder" and context is None and _rolling_reach(model) is not None
        window = context if context is not None else spec.max_seq_len
        # an encoder-decoder decodes greedily by default; a --top-k or --top-p asks for sampling,
        # at temperature 1 (they went unused, silently)
        sampled = top_k is not None or top_p is not None
        temp = 0.0 if greedy else temperature if temperature is not None else (
            0.8 if spec.kind == "decoder" else 1.0 if sampled else 0.0)
        if num_samples > 1 and (num_beams > 1 or temp == 0.0):
            how = (f"--num-beams {num_beams}" if num_beams > 1 else "--greedy" if greedy
                   else "--temperature 0" if temperature is not None else "an encoder-decoder's default, greedy decoding")
            raise _fail(f"--num-samples draws several texts, and {how} gives the same text each time",
                        "leave out --num-beams to sample" if num_beams > 1
                        else "sample with a temperature above 0 (e.g. --temperature 0.8)")
        # a tokenizer smaller than the model's vocabulary (a BPE trained on little text) has no text for the rest
        candidates = tok.vocab_size if tok.vocab_size < spec.vocab_size else None
        learned = spec.positional.type == "learned"
        generator = torch.Generator().manual_seed(seed)
        if cache:  # steps of a few rows read the weights faster laid out for them (components.layout)
            lay_out_for_decoding(model, rows=num_beams)
        ids = tok.with_template(tok.encode(prompt))  # as the model read text: Llama's <s>, T5's </s>
        _warn_unknown_symbols(tok, prompt)
        if spec.kind == "decoder":
            end_id = tok.eot_id  # where --stop-at-eot ends the text
            if chat:
                from specformer.data.chat import chat_template_for

                template = chat_template_for(spec.training, tok)
                encoded = chat_prompt(tok, turns if turns is not None else prompt, template, system=system or None)
                end_id = template.end_id(tok)
            else:
                encoded = encode_prompt(tok, prompt, heal=heal)
            ids = encoded.ids
            if not chat and not prompt.strip() and tok.eot_id is None and not any(tok.template()):
                raise _fail("give a --prompt: this tokenizer has no end-of-text token (nor a template's start "
                            "token) to start from")
            if not heal and not chat and _heals(tok, prompt):
                print_error(f"the prompt ends in whitespace ({prompt[len(prompt.rstrip()):]!r}), which this tokenizer "
                            "reads as a token of its own, rarely seen before a word in training (words carry their "
                            "leading space): the text may go astray; leave out --no-heal to have the first new "
                            "token begin with it", label="[yellow]warning:[/]")
            if len(ids) > window and not rolling and num_beams == 1:  # beams do not slide: refused below
                what = "--max-seq-len" if context is not None else "max_seq_len"
                print_error(f"the prompt is {len(ids)} tokens and the model reads at most {what}="
                            f"{window} at once: only its last {window} are read (the context "
                            "slides, as it does while generating)", label="[yellow]warning:[/]")
            shown = prompt if prompt.strip() or not encoded.healed else ""
            if chat and shown.strip():  # a user's turn, not text the reply goes on with: the reply on a line of its own
                shown = shown.rstrip() + "\n"

            def streamed() -> _Stream:
                # the prompt, then each token's text as it comes; --stop-at-eot ends the text at the end
                # of its document, the marker left out (as an encoder-decoder's end token is), and the
                # healed whitespace is the prompt's, shown with it
                _write_text(shown, dim=True)
                return _Stream(tok, ids, stop_id=end_id if stop_at_eot else None, strip=encoded.healed if shown else "")

            if num_beams > 1:
                room = window - len(ids) if not rolling else max_new_tokens
                what = "--max-seq-len" if context is not None else "max_seq_len"
                if room <= 0:
                    raise _fail(f"the prompt is {len(ids)} tokens and beam search keeps every beam's context "
                                f"within {what}={window}: shorten the prompt")
                if room < max_new_tokens:
                    print_error(f"beam search keeps every beam's context within {what}={window}: after the "
                                f"prompt's {len(ids)} tokens it makes at most {room} of the {max_new_tokens} asked "
                                "for (sampling slides the context and goes on)", label="[yellow]note:[/]")
                found = beam_search(
                    model, torch.tensor([ids]), num_beams=num_beams, max_new_tokens=min(max_new_tokens, room),
                    eos_id=end_id if stop_at_eot else None, length_penalty=length_penalty,
                    n_candidates=candidates, allowed_tokens=encoded.allowed_tokens,
                    repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram,
                    max_seq_len=None if rolling else window,
                )
                stream = streamed()
                for token in found[0, len(ids):].tolist():
                    stream([token])
                stream.finish()
                return
            for sample in range(num_samples):
                if sample:
                    _sample_separator()
                stream = streamed()
                with _shown_on_interrupt(stream, max_new_tokens):
                    generate(
                        model, torch.tensor([ids]), max_new_tokens=max_new_tokens, temperature=temp,
                        top_k=top_k, top_p=top_p, eos_id=end_id if stop_at_eot else None, use_cache=cache,
                        max_seq_len=None if rolling else window, generator=generator, n_candidates=candidates,
                        on_token=stream, allowed_tokens=encoded.allowed_tokens,
                        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram,
                    )
                stream.finish()
            return
        if not ids:
            raise _fail("give a --prompt to decode")
        if learned and len(ids) > spec.max_seq_len:
            raise _fail(f"the prompt is {len(ids)} tokens; this model's encoder reads at most "
                        f"max_seq_len={spec.max_seq_len} (learned positions)")
        if len(ids) > spec.max_seq_len:
            print_error(f"the prompt is {len(ids)} tokens, longer than max_seq_len={spec.max_seq_len}: the encoder "
                        f"reads all of them ({spec.positional.type} positions reach past it), but the model was "
                        f"built for {spec.max_seq_len} tokens and trained on sources cut to training.seq_len="
                        f"{spec.training.seq_len or spec.max_seq_len}",
                        label="[yellow]warning:[/]")

        start = decoder_start_id(tok, spec.training.objective)
        if start is None:
            raise _fail("the tokenizer has no start token for the decoder (<s>, [CLS], <bos> or <|endoftext|>); "
                        "the spec names none as training.objective.decoder_start")
        forced = forced_ids(tok, spec.training.objective)
        for field, forced_id in zip(("forced_start", "forced_end"), forced, strict=True):
            if forced_id is None and getattr(spec.training.objective, field, None) is not None:
                raise _fail(f"training.objective.{field}: {getattr(spec.training.objective, field)!r} is not a "
                            "token of the tokenizer")
        opening = tok.template()[0]  # the target was framed as the source: BART's outputs open with <s>

        def finish(stream: _Stream) -> None:
            stream.finish()
            if not stream.new or stream.wrote:
                return
            # an empty line alone reads as a failure
            if not stream.kept:
                print_error("the output is empty: the model's first token was its end token (a model trained "
                            "for a few steps often ends at once; --num-beams or sampling may find a longer text)",
                            label="[yellow]note:[/]")
                return
            counts = Counter(stream.kept).most_common()
            which = ", ".join(f"id {token} ×{n}" if n > 1 else f"id {token}" for token, n in counts[:3])
            print_error(f"the output is empty: the model's {len(stream.kept)} tokens have no text ({which}"
                        f"{', …' if len(counts) > 3 else ''}: tokens the tokenizer decodes to nothing, such as its "
                        "start and padding tokens; a model trained for a few steps often repeats one; train it "
                        "longer, or sample with --temperature 0.8)", label="[yellow]note:[/]")

        if num_beams > 1:
            limit = min(max_new_tokens, spec.max_seq_len - 1) if learned else max_new_tokens
            if limit < max_new_tokens:
                print_error(f"the decoder's learned positions end at max_seq_len={spec.max_seq_len}: beam search "
                            f"makes at most {limit} of the {max_new_tokens} tokens asked for", label="[yellow]note:[/]")
            found = beam_search(
                model, torch.tensor([ids]), num_beams=num_beams, max_new_tokens=limit, eos_id=tok.eos_id,
                start_id=start, length_penalty=length_penalty, n_candidates=candidates,
                repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram,
                forced_start_id=forced[0], forced_end_id=forced[1],
            )
            stream = _Stream(tok, stop_id=tok.eos_id, skip=opening)
            for token in found[0].tolist():
                stream([token])
            finish(stream)
            return
        for sample in range(num_samples):
            if sample:
                _sample_separator()
            stream = _Stream(tok, stop_id=tok.eos_id, skip=opening)
            with _shown_on_interrupt(stream, max_new_tokens):
                generate_seq2seq(
                    model, torch.tensor([ids]), start_id=start, eos_id=tok.eos_id, max_new_tokens=max_new_tokens,
                    temperature=temp, top_k=top_k, top_p=top_p, use_cache=cache, generator=generator,
                    n_candidates=candidates, max_len=spec.max_seq_len if learned else None, on_token=stream,
                    repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram,
                    forced_start_id=forced[0], forced_end_id=forced[1],
                )
            finish(stream)
            cap = spec.max_seq_len - 1
            if learned and cap < max_new_tokens and len(stream.new) >= cap and tok.eos_id not in stream.new:
                print_error(f"the decoder's learned positions end at max_seq_len={spec.max_seq_len}: the text stopped "
                            f"at {cap} of the {max_new_tokens} tokens asked for", label="[yellow]note:[/]")


def _sample_separator() -> None:
    """The line between two of --num-samples' texts (nanoGPT's sample.py prints the same)."""
    console.print("[dim]---------------[/]", highlight=False)



@app.command("chat")
def chat_cmd(
    checkpoint: Annotated[str, typer.Argument(metavar="CHECKPOINT", help="A checkpoint (.ckpt), a run folder, or a .safetensors file of weights with --spec, of a decoder whose tokenizer has a chat template.")],
    system: Annotated[str | None, typer.Option("--system", help="A system prompt, the conversation's first turn. Default: the training.objective.system the model was fine-tuned with, if any.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1, help="Tokens of a reply at most.")] = 256,
    temperature: Annotated[float | None, typer.Option("--temperature", **_number(0), help="Sampling temperature; 0 is greedy. Default 0.8.")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", "-k", min=1, help="Sample from the k most likely tokens.")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", **_number(0, 1, above=True, hint="1 keeps every token; for the most likely token use --greedy"), help="Nucleus sampling: the smallest set with this probability.")] = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="Always take the most likely token (same as --temperature 0).")] = False,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**63 - 1, help="Seed of the sampler.")] = 0,
    spec_source: SpecOfWeights = None,
) -> None:
    """Talk with an instruct model: each line you type is a user turn, and the model's reply,
    shown as it is generated, an assistant turn that the next question follows.

    The conversation is rendered through the tokenizer's chat template, as generate --chat
    and --messages render theirs (transformers' apply_chat_template), and each reply ends
    at the end of the assistant's turn. When the conversation outgrows the model's
    max_seq_len, its oldest exchanges are left out (the system turn is kept). Type /reset to
    start a new conversation, /exit (or Ctrl-D) to end; Ctrl-C stops a reply.

    Examples:

    ```
    specformer chat runs/chat/<timestamp>
    specformer chat my.safetensors --spec my.yaml \\
        --system "Answer in one word." --greedy
    ```
    """
    with _starting("nothing was generated"):
        import torch

        from specformer.components.layout import lay_out_for_decoding
        from specformer.data.chat import chat_template_for
        from specformer.data.corpus import DataError
        from specformer.training.generate import chat_prompt, generate

    with _errors_for_people(stopped="; the conversation ends"):
        if system is not None:
            _check_utf8(system, "--system")
        loaded = _load_checkpoint(checkpoint, spec_source)
        spec, model, tok = loaded.spec, loaded.model, loaded.tokenizer
        if tok is None:
            raise _fail(f"{checkpoint}: the checkpoint carries no tokenizer, so text cannot be encoded")
        if spec.kind != "decoder":
            instead = ("specformer generate decodes an encoder-decoder's input" if spec.kind == "encoder-decoder"
                       else "specformer classify labels texts with a sequence classifier"
                       if spec.head.type == "classification"
                       else "specformer fill-mask predicts an encoder's <mask> tokens")
            raise _fail(f"chat answers with a decoder; this is {'an' if spec.kind.startswith('encoder') else 'a'} "
                        f"{spec.kind} model ({instead})")
        if greedy and (temperature not in (None, 0) or top_k is not None or top_p is not None):
            raise _fail("--greedy takes the most likely token and samples nothing: leave out --temperature, "
                        "--top-k and --top-p")
        if temperature == 0 and (top_k is not None or top_p is not None):
            raise _fail("--temperature 0 takes the most likely token and samples nothing: leave out --top-k and "
                        "--top-p", "or sample with a temperature above 0")
        try:
            template = chat_template_for(spec.training, tok)
        except DataError as exc:
            raise _fail(str(exc), f"chat talks with a model whose tokenizer has a chat template; to continue a "
                                  f"text, use specformer generate {shlex.quote(checkpoint)} --prompt TEXT") from None
        objective = spec.training.objective if spec.training is not None else None
        if system is None and objective is not None and objective.type == "sft":
            system = objective.system  # the system prompt the model was fine-tuned with
        end_id = template.end_id(tok)
        lay_out_for_decoding(model, rows=1)
        generator = torch.Generator().manual_seed(seed)
        candidates = tok.vocab_size if tok.vocab_size < spec.vocab_size else None
        window = spec.max_seq_len
        temp = 0.0 if greedy else temperature if temperature is not None else 0.8
        history: list[dict[str, str]] = []
        interactive = sys.stdin.isatty()
        err_console.print(f"[dim]chat with {escape(spec.name)} ({escape(template.source)}); /reset starts over, "
                          "/exit or Ctrl-D ends, Ctrl-C stops a reply[/]", highlight=False)
        while True:
            try:
                line = input("> ") if interactive else _stdin_text(line=True)
            except UnicodeDecodeError as exc:  # typed in a locale that is not UTF-8
                print_error(f"this turn: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}): type it in UTF-8")
                continue
            except EOFError:
                line = ""
            except KeyboardInterrupt as exc:
                if _signal_of(exc) != signal.SIGINT:
                    raise  # SIGTERM ends the command as it ends the others
                err_console.print()
                return
            if not interactive and not line:
                return  # the end of the input
            text = line.rstrip("\n")
            if text.strip() in ("/exit", "/quit") or (interactive and not line):
                return
            if text.strip() == "/reset":
                history.clear()
                err_console.print("[dim]a new conversation[/]", highlight=False)
                continue
            if re.fullmatch(r"/\w+", text.strip()):  # /help, or a command mistyped: not a turn for the model
                said = "" if text.strip() == "/help" else f"{text.strip()} is not a command; "
                err_console.print(f"[dim]{escape(said)}/reset starts a new conversation, /exit or Ctrl-D ends, Ctrl-C "
                                  "stops a reply (a line of more words is a turn, whatever it begins with)[/]",
                                  highlight=False)
                continue
            if not text.strip():
                continue
            not_utf8 = _not_utf8(text, "this turn")
            if not_utf8 is not None:  # said, and the conversation goes on, as after a turn too long
                print_error(not_utf8)
                continue
            turns = [*history, {"role": "user", "content": text}]
            ids = chat_prompt(tok, turns, template, system=system or None).ids
            dropped = 0
            while len(ids) + 1 > window and len(turns) > 1:
                turns = turns[2:] if len(turns) > 2 else turns[1:]  # the oldest exchange
                dropped += 1
                ids = chat_prompt(tok, turns, template, system=system or None).ids
            if len(ids) + 1 > window:
                print_error(f"this turn is {len(ids)} tokens with the chat template, and the model reads at most "
                            f"max_seq_len={window}: say it in fewer words")
                continue
            if dropped:
                oldest = "its oldest exchange is" if dropped == 1 else f"its oldest {dropped} exchanges are"
                print_error(f"the conversation outgrew max_seq_len={window}: {oldest} left out",
                            label="[yellow]note:[/]")
            stream = _Stream(tok, ids, stop_id=end_id)  # the reply, shown as it comes
            room = min(max_new_tokens, window - len(ids))
            stopped = False
            try:
                generate(model, torch.tensor([ids]), max_new_tokens=room,
                         temperature=temp, top_k=top_k, top_p=top_p, eos_id=end_id, max_seq_len=window,
                         generator=generator, n_candidates=candidates, on_token=stream)
            except KeyboardInterrupt as exc:
                if _signal_of(exc) != signal.SIGINT:
                    raise
                err_console.print("[dim] (stopped)[/]", highlight=False, end="")
                stopped = True
            stream.finish()
            if not stopped and room < max_new_tokens and len(stream.new) >= room and end_id not in stream.new:
                # cut by the context, not by -n: said, as a beam search says it makes fewer tokens
                print_error(f"the reply stopped at {room} tokens, where the conversation reaches max_seq_len={window} "
                            f"(-n {max_new_tokens}); the next turn leaves its oldest exchanges out, /reset starts "
                            "a new conversation", label="[yellow]note:[/]")
            reply = _continuation(tok, ids, stream.kept)
            history = [*turns, {"role": "assistant", "content": reply.strip()}]


@contextmanager
def _shown_on_interrupt(stream: _Stream, limit: int) -> Iterator[None]:
    """Ctrl-C while generating: the text of the tokens generated so far is ended, then said."""
    try:
        yield
    except KeyboardInterrupt as exc:
        stream.finish()
        if not stream.new:
            raise
        print_error(f"{_stopped_by(exc)} after {len(stream.new)} of at most {limit} new tokens: the text above "
                    "is what was generated")
        raise typer.Exit(128 + _signal_of(exc)) from None


class _Stream:
    """Prints a generated text as its tokens come (an ``on_token`` callback), as chat prints
    its replies and transformers' ``TextStreamer`` its text.

    Each new piece is decoded after the tokens before it (``context``'s last ones, then those
    already shown), since a SentencePiece-style tokenizer reads a word's leading space only
    after another token; a piece whose last character's bytes are not all out yet waits for
    the next token. Decoding a bounded tail keeps each token's cost flat however long the text.
    ``stop_id`` ends the text (left out); ``skip`` is an opening left out when the text starts
    with it (BART's ``<s>``); ``strip`` is text of the prompt's that the first pieces spell
    again (the whitespace token healing took off it), shown once."""

    _TAIL = 16  # tokens of context a piece is decoded after
    _SETTLE = 32  # tokens after which a shown stretch becomes context

    def __init__(self, tok: Any, context: Sequence[int] = (), *, stop_id: int | None = None,
                 skip: Sequence[int] = (), strip: str = "") -> None:
        self.tok, self.stop_id, self.strip = tok, stop_id, strip
        self.new: list[int] = []  # every token generated, the stop token too
        self.kept: list[int] = []  # the text's tokens
        self._skip, self._skipped = list(skip), 0
        self._before = list(context)[-self._TAIL:]
        self._start = 0  # kept[_start:] is the stretch being shown
        self._shown = ""  # the text of that stretch printed so far
        self.ended = False
        self.wrote = False  # whether any text was printed (tokens that decode to none print nothing)

    def __call__(self, nxt: Any) -> None:
        token = int(nxt[0])
        self.new.append(token)
        if self.ended:
            return
        if token == self.stop_id:
            self.ended = True
            return
        if self._skipped < len(self._skip):
            if token == self._skip[self._skipped]:
                self._skipped += 1
                return
            self._unskip()
        self.kept.append(token)
        self._print(final=False)

    def _print(self, *, final: bool) -> None:
        text = _continuation(self.tok, self._before, self.kept[self._start:])
        if text.endswith("\ufffd") and not final:
            return
        # past what is shown; where a later byte rewrote shown text (a byte-fallback
        # tokenizer's stray byte turns a character into replacement marks), past the part
        # that is still the same: what changed stays on screen, nothing after it is lost
        piece = text[len(os.path.commonprefix([text, self._shown])):]
        if self.strip:
            if self.strip.startswith(piece) and not final:  # the next piece may go on spelling it
                return
            piece, self.strip = piece.removeprefix(self.strip), ""
        _write_text(piece)
        self.wrote = self.wrote or bool(piece)
        self._shown = text
        if len(self.kept) - self._start >= self._SETTLE:  # the stretch shown becomes the context
            self._before = [*self._before, *self.kept[self._start:]][-self._TAIL:]
            self._start, self._shown = len(self.kept), ""

    def _unskip(self) -> None:
        """The tokens taken for the opening are text after all (the opening did not go on)."""
        self.kept[:0] = self._skip[: self._skipped]
        self._skip, self._skipped = [], 0

    def finish(self) -> None:
        """Prints what is held back and ends the line."""
        if 0 < self._skipped < len(self._skip):
            self._unskip()
        if self.kept:
            self._print(final=True)
        _write_text("\n")


# the control characters a generated text is not shown with on a terminal: all but tab,
# line feed and carriage return (a text's own line ends, \r\n)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _write_text(text: str, *, dim: bool = False) -> None:
    """``text`` on the standard output as it is: a generated text's tabs, carriage returns,
    backslashes and ``:name:`` words are its own, not rich's to expand, drop, escape or turn
    into emoji; ``dim`` on a terminal (a prompt, shown before what the model adds). On a
    terminal, the other control characters (escape, backspace, bell, ...) are shown as
    ``\\x1b``: a model's escape sequence would recolour, move or retitle the terminal; a
    pipe or file gets every byte as it is."""
    if not text:
        return
    out = sys.stdout
    if console.is_terminal:
        text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    styled = dim and console.is_terminal and not console.no_color
    out.write(f"\x1b[2m{text}\x1b[22m" if styled else text)
    out.flush()


def _continuation(tok: Any, ids: list[int], new: list[int]) -> str:
    """The text ``new`` adds after ``ids``: decoded with them, less their own text. Decoded
    alone, a SentencePiece-style tokenizer (Llama's, Mistral's) drops the space that opens
    the first new word (``▁is`` alone is "is"; after "The model" it is " is")."""
    head = tok.decode(ids)
    whole = tok.decode([*ids, *new])
    return whole[len(head):] if whole.startswith(head) else tok.decode(new)


def _not_utf8(text: str, what: str) -> str | None:
    """Why ``text``, from the command line or standard input, is not UTF-8, or None. Python
    reads bytes that are not UTF-8 there as lone surrogates (0xff as ``\\udcff``), which no
    tokenizer encodes (the ``tokenizers`` library failed with "TextInputSequence must be str")."""
    from specformer.specs.errors import bom_encoding

    bad = re.search(r"[\ud800-\udfff]", text)
    if bad is None:
        return None
    try:  # the bytes it was read from (a byte-order mark's 0xff 0xfe: \udcff\udcfe)
        encoding = bom_encoding(text[:4].encode("utf-8", errors="surrogateescape"))
    except UnicodeEncodeError:
        encoding = None
    if encoding is not None:  # a file PowerShell's `>` or Notepad wrote, piped in
        return (f"{what}: not UTF-8 text ({encoding}: a byte-order mark opens it): save it as UTF-8 "
                f"(`iconv -f {encoding} -t UTF-8`)")
    code = ord(bad.group())
    byte = f"byte 0x{code - 0xdc00:02x}, " if 0xdc80 <= code <= 0xdcff else ""
    return (f"{what}: not UTF-8 text ({byte}character {bad.start() + 1}): give it as UTF-8 (from Latin-1, "
            "`iconv -f latin1 -t utf-8`)")


def _stdin_text(*, line: bool = False) -> str:
    """Standard input, all of it (or its next ``line``), as its bytes are: line ends kept, and a
    byte that is not UTF-8 read as a lone surrogate whatever the locale (a strict one raised
    UnicodeDecodeError), so that :func:`_not_utf8` names it."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:
        return sys.stdin.readline() if line else sys.stdin.read()
    data = buffer.readline() if line else buffer.read()
    return data.decode("utf-8", errors="surrogateescape")


def _check_utf8(text: str, what: str) -> None:
    """``text`` is UTF-8, or the command ends with one line naming ``what`` (an option)."""
    message = _not_utf8(text, what)
    if message is not None:
        raise _fail(message)


def _warn_unknown_symbols(tok: Any, text: str) -> None:
    """A tokenizer with a fixed alphabet (the synthetic tasks') reads what it lacks as
    <unk>: say which characters, rather than decode a prompt of unknowns in silence."""
    index = getattr(tok, "index", None)
    if not isinstance(index, dict) or getattr(tok, "unk_id", None) is None:
        return
    unknown = sorted({ch for ch in text if ch not in index})
    if unknown:
        shown = ", ".join(repr(ch) for ch in unknown[:12]) + (" …" if len(unknown) > 12 else "")
        known = "".join(t for t in index if len(t) == 1)
        print_error(f"the prompt has characters this tokenizer does not have, read as <unk>: {shown} "
                    f"(it has: {known})", label="[yellow]warning:[/]")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


@app.command("eval")
def eval_cmd(
    checkpoint: Annotated[str, typer.Argument(metavar="CHECKPOINT", help="A checkpoint (.ckpt), a run folder, or a .safetensors file of weights with --spec.")],
    set_: SetOption = None,
    batches: Annotated[int | None, typer.Option("--batches", min=1, help="Validation batches (default: the spec's val_batches); a synthetic task always scores its whole held-out set, in batches large enough to hold it in this many.")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar (on a terminal) while the batches are scored.")] = True,
    spec_source: SpecOfWeights = None,
    data: Annotated[list[str] | None, typer.Option("--data", "-d", metavar="PATH", help="Score these files, directories or globs whole (repeatable), in the model's training data format: text for a language model, the pairs, labelled rows or conversations it was trained on. Without it, the validation split of the spec's training.data.")] = None,
    output_format: Annotated[str, typer.Option("--format", "-f", metavar="[rich|json]", help="rich: a table; json: one object (checkpoint, step, val_loss, val_ppl, scored tokens, ...: summary.json's names) on standard output, for scripts that compare checkpoints.")] = "rich",
) -> None:
    """Loss and perplexity (and exact match for sequence-to-sequence, accuracy for classification) on the validation split, or on files of your own (--data).

    `--set training.*` changes what is evaluated (e.g. another corpus with the same tokenizer);
    `--set max_seq_len=N` evaluates sequences of N tokens (training.seq_len follows unless set), past
    the length the model was trained at: length extrapolation of RoPE, ALiBi, T5, sinusoidal or no
    positions (a learned table reads only the positions it has rows for). With it, `--set
    positional.scaling=...` evaluates a RoPE model with scaled frequencies (position interpolation,
    YaRN, dynamic NTK: docs/spec.md lists the types), the same weights.

    Examples:

    ```
    specformer eval runs/gpt-nano/<timestamp>/checkpoints/last.ckpt
    specformer eval CKPT --batches 50
    # perplexity on a test file of your own, all of it
    specformer eval CKPT --data wiki.test.txt
    # a RoPE model trained at 512, at 2048 tokens
    specformer eval CKPT --set max_seq_len=2048
    specformer eval CKPT --set max_seq_len=2048 \\
        --set 'positional.scaling={type: linear, factor: 4}'
    specformer eval CKPT --set max_seq_len=2048 \\
        --set 'positional.scaling={type: dynamic, factor: 2,
                                   original_max_position_embeddings: 512}'
    specformer eval my.safetensors --spec my.yaml --data my_texts/
    # every checkpoint of a run, one JSON line each
    for c in runs/my-run/checkpoints/*.ckpt; do
        specformer eval "$c" --no-progress -f json | jq -c '{step, val_loss}'
    done
    ```
    """
    if output_format not in ("rich", "json"):
        print_error(f"--format must be rich or json, got {output_format!r}")
        raise typer.Exit(2)
    with _starting():
        import lightning as L

        from specformer.builder.lightning import SpecModule
        from specformer.data.corpus import DataError, scoring_only
        from specformer.data.module import SpecDataModule
        from specformer.specs.loader import load_spec
        from specformer.training.callbacks import SpecProgressBar
        from specformer.training.run import (
            Terminated,
            _interruptible,
            check_folders,
            check_precision,
            quiet_lightning,
        )

    with _errors_for_people(stopped=" before any batch was evaluated"):
        loaded = _load_checkpoint(checkpoint, spec_source)
        overrides = list(set_ or [])
        keys = [o.partition("=")[0].strip() for o in overrides]
        # a rope scaling changes no weight: position interpolation of the trained model, at any length
        model_fields = [k for k in keys if k not in ("max_seq_len", "positional.scaling")
                        and not k.startswith(("training.", "positional.scaling."))]
        if model_fields:
            raise _fail(f"--set {', '.join(model_fields)}: eval runs the checkpoint's own model; only training.* "
                        "(what is evaluated, e.g. training.data), max_seq_len (how long a sequence it reads) "
                        "and positional.scaling (a rope model's frequency scaling) can change")
        scaling = [k for k in keys if k == "positional.scaling" or k.startswith("positional.scaling.")]
        if scaling and loaded.spec.positional.type != "rope":
            # the spec's own hint (give positional={type: rope, ...}) would change the model, which eval refuses
            raise _fail(f"--set {', '.join(scaling)}: positional.scaling scales the frequencies of rope positions, "
                        f"and this model's positions are {loaded.spec.positional.type}; eval runs the model "
                        "as it was trained, so only a rope model's positions can be scaled")
        if data:
            overrides += _scored_data(loaded.spec, keys, data)
        if "max_seq_len" in keys and "training.seq_len" not in keys:
            # a longer max_seq_len is asked for to evaluate longer sequences: the checkpoint's own
            # training.seq_len would otherwise keep them at the trained length
            overrides.append("training.seq_len=null")
        if "max_seq_len" in keys and loaded.spec.positional.type == "learned":
            # the table's rows follow the length, to be checked against the checkpoint's below (the spec's own
            # max_positions would refuse a longer one first, asking for a larger table, which eval cannot change)
            overrides.append("positional.max_positions=null")
        tokenizer_fields = [o.partition("=")[0].strip() for o in overrides
                            if o.partition("=")[0].strip().startswith("training.tokenizer")]
        if tokenizer_fields:
            raise _fail(f"--set {', '.join(tokenizer_fields)}: eval reads the data with the checkpoint's own "
                        "tokenizer (its weights fit those ids); it cannot change")
        spec = load_spec(loaded.spec.to_dict(), overrides) if overrides else loaded.spec
        if spec.max_seq_len != loaded.spec.max_seq_len:
            _check_length_change(loaded.spec, spec.max_seq_len, "--set max_seq_len")
            if spec.positional.type == "learned":  # the table keeps the checkpoint's rows
                rows = loaded.spec.positional.rows(loaded.spec.max_seq_len)
                spec = load_spec(spec.to_dict(), [f"positional.max_positions={rows}"])
        if batches is not None:
            # a synthetic task's whole held-out set, in batches large enough to hold it in this many
            spec = load_spec(spec.to_dict(), [f"training.val_batches={batches}"])
        if loaded.tokenizer is None and not (spec.training.tokenizer is not None
                                             and spec.training.tokenizer.type in ("byte", "file", "task")):
            # a checkpoint of a Trainer of your own: its ids may be another tokenizer's than the one
            # the spec's training.tokenizer makes from the data now (a BPE trained afresh)
            print_error(f"{checkpoint}: the checkpoint carries no tokenizer: the data is read with the one the "
                        "spec's training.tokenizer makes from it, and the scores mean something only if the model "
                        "was trained on its ids (a run of specformer train saves its tokenizer)",
                        label="[yellow]warning:[/]")
        quiet_lightning()
        check_folders(spec.training, cache=True, out=False)
        bar = progress and err_console.is_terminal  # a long evaluation shows how far it is
        with warnings.catch_warnings():  # Lightning's own word on 16-mixed on a CPU: check_precision says it
            warnings.filterwarnings("ignore", message=".*is not supported on CPU")
            trainer = L.Trainer(
                accelerator=spec.training.accelerator, devices=1, logger=False, enable_progress_bar=bar,
                callbacks=[SpecProgressBar(err_console, validation_lines=False)] if bar else None,
                enable_model_summary=False, precision=_precision(spec.training.precision),
            )
        check_precision(spec.training, trainer)  # as train, before the data: no 16-mixed run as bf16 on a CPU
        module = SpecModule(spec, tokenizer=loaded.tokenizer)
        module.model.load_state_dict(loaded.model.state_dict())
        dm = SpecDataModule(spec, tokenizer=loaded.tokenizer)
        try:
            with scoring_only() if data else nullcontext():
                dm.setup("validate")
        except DataError as exc:
            if not data:
                raise
            # the settings --data stands for, named as the user gave them
            said = re.sub(r"training\.data\.(val_)?paths(?=[:; ,)=]|$)", "--data", str(exc))
            # a path given on the command line is read from the working directory, as any is: no spec's folder
            # to tell it from, nor a --set to give it whole with
            said = re.sub(r", not from the spec's folder: [^)]*", "", said)
            raise DataError(said.replace("validation split", "data to score")) from None
        interrupted: KeyboardInterrupt | None = None  # what cut the validation short
        try:
            _interruptible(trainer, lambda signum: Terminated() if signum == signal.SIGTERM else KeyboardInterrupt(),
                           lambda: trainer.validate(module, datamodule=dm, verbose=False))
        except KeyboardInterrupt as exc:
            # what was scored before Ctrl-C is still a measurement: report it as what it is
            partial = module.val_metrics()
            if partial is None:
                raise
            module.val_history.append({"step": loaded.step, **partial})
            interrupted = exc
        if not module.val_history:
            raise _fail("the validation split gave no batches")
        h = module.val_history[-1]
    assert dm.data is not None
    # a classifier scores one prediction a text: its count is of texts, not of their tokens
    scored, unit = ((h.get("val/examples", 0), "text") if dm.data.unit == "text"
                    else (module._val_sums["tokens"], "token"))
    part = (f", interrupted after {int(scored):,} scored {unit}{'s' if int(scored) != 1 else ''}"
            if interrupted is not None else "")
    if output_format == "json":
        typer.echo(json.dumps(_eval_json(checkpoint, spec, loaded.step, dm.data, h, module._val_sums["tokens"],
                                         scored, interrupted is not None), indent=2))
    else:
        _print_eval_table(spec, loaded.step, part, dm.data, h, module._val_sums["tokens"], interrupted is not None,
                          given=bool(data))
    if interrupted is not None:
        signum = _signal_of(interrupted)
        cause = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        what = "numbers above" if output_format == "rich" else "numbers printed"
        print_error(f"{_stopped_by(interrupted)}: the {what} are of the part of the validation split read "
                    f"before {cause}")
        raise typer.Exit(128 + signum)


def _scored_data(spec: Any, keys: list[str], data: list[str]) -> list[str]:
    """The ``--set`` overrides of ``eval --data PATHS``: the paths read whole as the
    validation split, in the format of the checkpoint's training data (text files for a
    language model trained on text; pairs, labelled rows or conversations as it was)."""
    given = [k for k in keys if k == "training.data" or k.startswith("training.data.")]
    if given:
        raise _fail(f"--data and --set {', '.join(given)} both say what to score: give one")
    trained = spec.training.data
    tokenizer = spec.training.tokenizer
    if trained is not None and trained.type == "synthetic" and (tokenizer is None or tokenizer.type == "task"):
        raise _fail(f"--data: this model was trained on the synthetic task {trained.task!r}, whose held-out "
                    "examples eval scores without it; --data reads files of text, pairs, labelled rows or "
                    "conversations")
    paths = json.dumps(list(data))
    whole = "training.val_batches=null"  # every batch of them (--batches, applied after, reads fewer)
    if trained is not None and trained.type in ("files", "pairs", "labelled", "conversations"):
        # the same fields and format as training read (a JSON-lines text_field too); under scoring_only
        # the pairs, rows or conversations of val_paths are read as the validation split alone, and scored
        return [f"training.data.paths={paths}", f"training.data.val_paths={paths}", whole]
    # weights not trained on files (import-hf's: their spec has the kind's default data, an
    # encoder-decoder's a synthetic task its tokenizer never read): text, or an encoder-decoder's pairs
    read_as = "pairs" if spec.kind == "encoder-decoder" else "files"
    return [f"training.data={{type: {read_as}, paths: {paths}, val_paths: {paths}}}", whole]


def _eval_json(checkpoint: str, spec: Any, step: int, data: Any, h: dict[str, Any], tokens: float, scored: float,
               interrupted: bool) -> dict[str, Any]:
    """``eval --format json``'s object: the table's numbers as numbers (None where the table
    leaves a row out), under names a script reads."""
    held, read = _split_read(spec.training, data)
    classify = data.unit == "text"
    return {
        "checkpoint": checkpoint,
        "spec": spec.name,
        "step": step,
        "max_seq_len": spec.max_seq_len,
        "data": data.description,
        "val_loss": h["val/loss"],
        "val_ppl": None if classify else h["val/ppl"],
        "scored_tokens": int(tokens),
        "scored_texts": int(scored) if classify else None,
        "held_out": held,
        "held_out_unit": data.unit,
        "whole_split": read == held and not interrupted,
        "unigram_loss": data.unigram_loss if not interrupted else None,
        "exact_match": h.get("val/exact_match"),
        "accuracy": h.get("val/accuracy"),
        "val_examples": int(h["val/examples"]) if "val/examples" in h else None,
        "interrupted": interrupted,
    }


def _print_eval_table(spec: Any, step: int, part: str, data: Any, h: dict[str, Any], tokens: float,
                      interrupted: bool, *, given: bool = False) -> None:
    """``eval``'s table of what it scored."""
    from specformer.training.callbacks import share_of_held_out

    table = Table(title=f"{spec.name} at step {step}{part}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")  # a path longer than a terminal is wrapped, not cut to "…"
    table.add_row("data", data.description)
    table.add_row("val loss", _fmt(h["val/loss"]))
    if "val/accuracy" not in h:  # a classifier's loss is over its classes, not a vocabulary: no perplexity
        table.add_row("val perplexity", _fmt(h["val/ppl"], 2))
    if not interrupted:
        table.add_row("scored", _scored_line(spec.training, data, int(tokens), given=given))
    if data.unigram_loss is not None and not interrupted:  # measured on the whole of what was asked
        table.add_row("unigram baseline", _fmt(data.unigram_loss))
    if "val/exact_match" in h:
        table.add_row("exact match", share_of_held_out(h["val/exact_match"], h.get("val/examples"), "example"))
    if "val/accuracy" in h:
        table.add_row("accuracy", share_of_held_out(h["val/accuracy"], h.get("val/examples"), "text"))
    _print_table(table)


def _check_length_change(spec: Any, max_seq_len: int, option: str) -> None:
    """Refuse to run a checkpoint at another ``max_seq_len`` when its weights depend on it: a
    learned position table has one row per position, and the rows past it were never trained.
    Every other positional scheme computes its positions (RoPE, ALiBi, sinusoids) or buckets
    its distances (T5), so its weights read any length."""
    if spec.positional.type != "learned":
        return
    usable = spec.positional.rows(spec.max_seq_len) - spec.positional.offset
    if max_seq_len > usable:
        raise _fail(f"{option}={max_seq_len}: this model's learned position table has {usable} positions "
                    f"(0-{usable - 1}), and there is no trained row for a later one",
                    f"use at most {usable}; a model with rope, alibi, sinusoidal, t5 or none positions runs "
                    "at any length")


def _split_read(t: Any, data: Any) -> tuple[int, int]:
    """(rows of the validation split, rows of it ``eval`` reads): ``val_batches`` batches of
    them, or all (a synthetic task's, and with ``val_batches`` null)."""
    held = len(data.val)
    return held, held if t.val_batches is None or data.task is not None else min(held, t.val_batches * t.batch_size)


def _scored_line(t: Any, data: Any, tokens: int, *, given: bool = False) -> str:
    """How much of the validation split ``eval`` scored (``given``: of the files of --data):
    its tokens, and whether that was all of it (a loss over a few hundred tokens is a rough
    number, and a larger --batches than the split holds reads no more)."""
    held, read = _split_read(t, data)
    unit = data.unit
    classify = unit == "text"  # one prediction a text: the count is of texts
    kind, of = ("", " of --data") if given else ("held-out ", "")
    whole = (f"all {held:,} {kind}{unit}{'s' if held != 1 else ''}{of}" if read == held
             else f"{read:,} of the {held:,} {kind}{unit}s{of}: --batches reads more")
    return whole if classify else f"{tokens:,} tokens ({whole})"


def _precision(precision: str) -> str:
    from specformer.training.run import lightning_precision

    return lightning_precision(precision)


@app.command("fill-mask")
def fill_mask_cmd(
    checkpoint: Annotated[str, typer.Argument(metavar="CHECKPOINT", help="A checkpoint of an encoder (masked LM), or a .safetensors file of its weights with --spec.")],
    text: Annotated[str, typer.Argument(metavar="TEXT", help="Text with one or more `<mask>` (or `[MASK]`) placeholders.")],
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="Candidates shown per mask.")] = 5,
    spec_source: SpecOfWeights = None,
) -> None:
    """Predict the tokens behind `<mask>` placeholders with a masked-LM encoder.

    Examples:

    ```
    specformer fill-mask runs/bert-nano/<timestamp> "import <mask>"
    specformer fill-mask CKPT "def __init__(self, <mask>):" --top-k 10
    specformer fill-mask my.safetensors \\
        --spec my.yaml "Paris is the <mask> of France."
    ```
    """
    with _starting():
        import torch

    with _errors_for_people(stopped="; nothing was predicted"):
        loaded = _load_checkpoint(checkpoint, spec_source)
        spec, model, tok = loaded.spec, loaded.model, loaded.tokenizer
        if spec.kind != "encoder":
            raise _fail(f"fill-mask needs an encoder (masked LM); this checkpoint is {'an' if spec.kind.startswith('e') else 'a'} {spec.kind}; use `specformer generate`")
        if spec.head.type == "classification":  # an encoder whose head scores classes, not tokens
            raise _fail("fill-mask needs a masked LM (head: mlm); this checkpoint is a sequence classifier "
                        "(head: classification): use `specformer classify` to label texts")
        if tok is None or tok.mask_id is None:
            raise _fail("the checkpoint's tokenizer has no mask token")
        _check_utf8(text, "TEXT")
        text_ids = _encode_with_masks(tok, text)
        before, after = tok.template()
        ids = tok.with_template(text_ids)  # as the model read text: BERT's [CLS] ... [SEP]
        positions = [i for i, t in enumerate(ids) if t == tok.mask_id]
        if not positions:
            other = re.search(r"<mask>|\[mask\]", text, flags=re.IGNORECASE)
            said = f" ({other.group()} is not one: the placeholders are spelled so, case and all)" if other else ""
            raise _fail(f"the text has no <mask> or [MASK] placeholder{said}",
                        'e.g. specformer fill-mask CKPT "import <mask>"')
        limit = _position_limit(spec)
        if limit is not None and len(ids) > limit:
            raise _fail(f"the text is {len(ids)} tokens long and the model reads at most {limit} "
                        f"(its learned position table); shorten the text around the <mask>")
        if limit is None and len(ids) > spec.max_seq_len:
            print_error(f"the text is {len(ids)} tokens, longer than max_seq_len={spec.max_seq_len}: the encoder "
                        f"reads all of them ({spec.positional.type} positions reach past it), but the model was "
                        f"built for {spec.max_seq_len} tokens and trained on blocks of training.seq_len="
                        f"{spec.training.seq_len or spec.max_seq_len}", label="[yellow]warning:[/]")
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]  # (T, V)
        # over the whole vocabulary, as BertForMaskedLM's (and pipeline("fill-mask")'s) are; ids past
        # the tokenizer's (a BPE that ended below vocab_size) have no text: never candidates
        probs = logits[positions].float().softmax(-1)[:, : tok.vocab_size]  # (M, V)
        best = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    filled = list(ids)
    for n, pos in enumerate(positions):
        table = Table(title=f"<mask> {n + 1} of {len(positions)}", title_justify="left")
        table.add_column("rank", justify="right")
        table.add_column("token")
        table.add_column("probability", justify="right")
        for rank, (p, i) in enumerate(zip(best.values[n].tolist(), best.indices[n].tolist(), strict=True), 1):
            table.add_row(str(rank), repr(tok.decode([i])), f"{p:.3f}")
        filled[pos] = int(best.indices[n, 0])
        console.print(_titled(table))
    filled = filled[len(before) : len(filled) - len(after)]  # the text, without the template's tokens
    console.print("[bold]filled:[/] " + _escape(tok.decode(filled)), highlight=False, soft_wrap=True)


def _position_limit(spec: Any) -> int | None:
    """The most tokens an encoder reads at once: a learned position table ends; other
    positional schemes extend (quality past max_seq_len is another matter)."""
    pos = spec.positional
    if pos.type != "learned":
        return None
    return pos.rows(spec.max_seq_len) - pos.offset


def _encode_with_masks(tok: Any, text: str) -> list[int]:
    """Encode ``text``, turning every ``<mask>`` / ``[MASK]`` into the mask id."""
    import re

    from specformer.data.tokenizers import HFTokenizer

    pieces = re.split(r"(<mask>|\[MASK\])", text)
    # a BPE word carries its leading space, and a masked word was masked with it: the mask
    # absorbs the space before it (RoBERTa's lstrip), else the model sees a lone " " token
    absorb = isinstance(tok, HFTokenizer)
    ids: list[int] = []
    for n, piece in enumerate(pieces):
        if piece in ("<mask>", "[MASK]"):
            ids.append(tok.mask_id)
        elif piece:
            if absorb and n + 1 < len(pieces) and piece.endswith(" "):
                piece = piece[:-1]
            if piece:
                ids.extend(tok.encode(piece))
    return ids


_OUTPUT_KINDS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json"}


@app.command("classify", cls=OnceCommand)
def classify_cmd(
    checkpoint: Annotated[str, typer.Argument(metavar="CHECKPOINT", help="A checkpoint (.ckpt) or run folder of a classifier, or a .safetensors file of its weights with --spec.")],
    texts: Annotated[list[str] | None, typer.Argument(metavar="TEXT", help="Texts to classify; - reads them from standard input, one a line.", show_default=False)] = None,
    file: Annotated[str | None, typer.Option("--file", "-f", help="Texts to classify: a table (.csv, .tsv with a header row, .json, .jsonl, .ndjson; .gz, .bz2, .xz read decompressed) or a plain text file, one text a line; - is standard input.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the predictions to this file, as its extension says: .csv, .tsv, .jsonl (.ndjson) or .json; a table's own columns are kept. - writes tab-separated values to standard output (for cut, awk, a pipe). Default: a table on the screen.")] = None,
    text_column: Annotated[str | None, typer.Option("--text-column", help="The table's column (or JSON field) of texts. Default: the one the model was trained on (training.data.text_field), else text.")] = None,
    label_column: Annotated[str | None, typer.Option("--label-column", help="The table's column of true labels, for an accuracy line. Default: the one the model was trained on (training.data.label_field, else label) when the table has it.")] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="Labels shown (and written) per text, most likely first.")] = 1,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", min=1, help="Texts read by the model at once.")] = 32,
    max_length: Annotated[int | None, typer.Option("--max-length", min=1, help="The most tokens of a text read, template included. Default: the length the model was trained at (training.seq_len, else max_seq_len), where training cut its texts.")] = None,
    device: Annotated[str, typer.Option("--device", help="auto (a GPU when there is one: cuda, then mps), cpu, cuda, cuda:N or mps.")] = "auto",
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar (on a terminal) while more texts than a batch are classified.")] = True,
    spec_source: SpecOfWeights = None,
) -> None:
    """Classify texts with a trained sequence classifier: each text's most likely label and its probability.

    As Hugging Face's `pipeline("text-classification")`: the probabilities are the softmax
    of the classification head's logits, and the labels the names the model was trained
    with (`head.labels`; class ids for a model trained on integer labels). Each text is
    read as training read it: framed by the tokenizer's template and cut to the length the
    model was trained at (a warning says how many texts were cut).

    Without `-o` the predictions are shown as a table; `-o` writes every prediction to a
    file (replaced whole when done: Ctrl-C leaves no half-written file), with the input
    table's own columns (a plain text file's: `line`, its line number, and `text`) and
    `prediction`, `probability` (and `prediction_2`, `probability_2`, ... with `--top-k`);
    `-o -` writes them to standard output, tab-separated. A table with a column of true
    labels (the model's own label column, or `--label-column`) also gets an accuracy line:
    a test set scored as `eval` scores the held-out rows.

    Examples:

    ```
    specformer classify runs/my-bert/<timestamp> "a good film" "a bad plot"
    # accuracy when test.csv has a label column
    specformer classify CKPT --file test.csv -o predictions.csv
    specformer classify CKPT --file reviews.jsonl --text-column review \\
        --top-k 3 -o out.jsonl
    cat texts.txt | specformer classify CKPT - -o - | cut -f 3
    # import-hf's classifier
    specformer classify my.safetensors --spec my.yaml "a good film"
    ```
    """
    from specformer.cli.app import check_output_file

    given = list(texts or [])
    stdin = given == ["-"] or file == "-"
    if given and file is not None:
        raise _fail("give texts or --file, not both")
    if not given and file is None:
        raise _fail("give texts to classify, --file FILE, or - to read them from standard input",
                    'e.g. specformer classify CKPT "a good film"')
    if "-" in given and len(given) > 1:
        raise _fail("- reads the texts from standard input: give it alone")
    from specformer.data.cache import is_stream

    piped = output is not None and (str(output) == "-" or is_stream(output))  # the messages then go to stderr
    if output is not None and str(output) != "-":
        if output.suffix.lower() not in _OUTPUT_KINDS and not is_stream(output):
            raise _fail(f"--output {output}: the extension says how it is written; give a .csv, .tsv, .jsonl, "
                        ".ndjson or .json name, or - for tab-separated values on standard output")
        check_output_file(output, "--output")
    table_options = [name for name, value in (("--text-column", text_column), ("--label-column", label_column))
                     if value is not None]
    if table_options and file is None:
        raise _fail(f"{', '.join(table_options)} name{'s' if len(table_options) == 1 else ''} a column of a "
                    "--file table; texts given on the command line have none")
    with _starting():
        import torch

        from specformer.training.classify import NotAClassifier, check_classifier, classify, score

    with _errors_for_people(stopped="; nothing was written"):
        loaded = _load_checkpoint(checkpoint, spec_source)
        spec, model, tok = loaded.spec, loaded.model, loaded.tokenizer
        try:
            check_classifier(spec)
        except NotAClassifier as exc:
            raise _fail(f"{checkpoint}: {exc}") from None
        if tok is None:
            raise _fail(f"{checkpoint}: the checkpoint carries no tokenizer, so text cannot be encoded",
                        "save the model again with the tokenizer it was trained with: "
                        "specformer.training.save_checkpoint(model, path, tokenizer=...)")
        table = _classify_inputs(given, file, stdin, spec, text_column, label_column)
        length = max_length if max_length is not None else (spec.training.seq_len or spec.max_seq_len)
        if max_length is not None:
            _check_length_change(spec, max_length, "--max-length")
        from specformer.data.module import text_room

        text_room(tok, length, setting="--max-length")
        model.to(_classify_device(device, torch))
        n = len(table.texts)
        bar = progress and err_console.is_terminal and n > batch_size
        with _classify_progress(bar, n) as advance:
            result = classify(model, tok, table.texts, top_k=top_k, batch_size=batch_size, seq_len=length,
                              on_batch=advance)
        if result.truncated:
            trained = "the length the model was trained at" if max_length is None else "--max-length"
            cut = result.truncated
            which = ("the text is" if n == 1 else f"{cut} of the {n:,} texts {'is' if cut == 1 else 'are'}")
            print_error(f"{which} longer than {length} tokens ({trained}, template included): "
                        f"{'it was' if cut == 1 else 'each was'} cut to its first tokens, as training cuts a text",
                        label="[yellow]warning:[/]")
        if output is not None:
            _write_predictions(output, table, result.predictions, top_k=min(top_k, len(result.classes)))
        else:
            _show_predictions(table, result.predictions)
            if n > 50:
                print_error(f"{n:,} texts: -o predictions.csv (or .tsv, .jsonl, .json) writes them to a file",
                            label="[dim]note:[/]")
        if table.labels is not None:
            scored = score(result.predictions, table.labels, result.classes)
            _show_score(scored, result.classes, table.label_column, out=err_console if piped else console)
    if output is not None:
        n = len(result.predictions)
        where = "standard output" if str(output) == "-" else escape(str(output))
        (err_console if piped else console).print(
            f"wrote {n:,} prediction{'s' if n != 1 else ''} to {where}", highlight=False, soft_wrap=True)


@contextmanager
def _classify_progress(shown: bool, total: int) -> Iterator[Callable[[int], None] | None]:
    """A rich bar over the texts classified (on stderr), or nothing."""
    if not shown:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column

    from specformer.data.progress import fitting_progress

    whole = {"table_column": Column(no_wrap=True)}
    with fitting_progress(TextColumn("[bold]classify", **whole), BarColumn(bar_width=None), MofNCompleteColumn(**whole),
                          TimeElapsedColumn(**whole), TextColumn("ETA", **whole), TimeRemainingColumn(**whole),
                          optional=((3,), (4, 5), (1,)), console=err_console, transient=True) as bar:
        task = bar.add_task("classify", total=total)
        yield lambda done: bar.update(task, completed=done)


def _classify_device(name: str, torch: Any) -> Any:
    """The device of ``--device``: auto takes a GPU when there is one (cuda, then mps)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    try:
        found = torch.device(name)
    except (RuntimeError, ValueError):
        raise _fail(f"--device {name}: not a device; give auto, cpu, cuda, cuda:N or mps") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        raise _fail(f"--device {name}: this machine has no CUDA GPU (or torch was built without CUDA)",
                    "leave --device out (auto) to run where it can")
    if found.type == "cuda" and found.index is not None and found.index >= torch.cuda.device_count():
        raise _fail(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA GPUs (cuda:0-"
                    f"{torch.cuda.device_count() - 1})")
    if found.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise _fail(f"--device {name}: this machine has no MPS GPU")
    if found.type not in ("cpu", "cuda", "mps"):
        raise _fail(f"--device {name}: give auto, cpu, cuda, cuda:N or mps")
    return found


class _Inputs:
    """The texts to classify: a table's rows (its columns kept for the output) or bare texts."""

    def __init__(self, texts: list[str], *, columns: list[str] | None = None, records: list[dict] | None = None,
                 labels: list[Any] | None = None, label_column: str | None = None) -> None:
        self.texts, self.labels, self.label_column = texts, labels, label_column
        self.columns = columns if columns is not None else ["text"]
        self.records = records if records is not None else [{"text": t} for t in texts]


def _lines_of(text: str) -> _Inputs:
    """A plain text's texts, one a line (its lines ended as Python's ``open()`` ends them: at
    ``\\n``, ``\\r\\n`` or an old Mac's lone ``\\r``, not at a form feed or U+2028 in scraped
    text, which ``str.splitlines()`` breaks at), blank lines left out; each keeps its line
    number (``line``), so that written predictions join the input."""
    from specformer.data.corpus import numbered_lines

    records = [{"line": n, "text": line} for n, line in numbered_lines(text)]
    records = [r for r in records if r["text"].strip()]
    return _Inputs([r["text"] for r in records], columns=["line", "text"], records=records)


def _classify_inputs(given: list[str], file: str | None, stdin: bool, spec: Any, text_column: str | None,
                     label_column: str | None) -> _Inputs:
    """What ``classify`` reads: texts on the command line, lines of standard input, a plain
    text file's lines, or a table's rows (the reader of labelled training data, with the
    columns the model was trained on unless the options name others)."""
    import sys

    from specformer.data.corpus import DataError, read_texts
    from specformer.data.labelled import Columns, is_table, read_text_table

    if given and not stdin:
        empty = [i for i, text in enumerate(given, start=1) if not text.strip()]
        if empty:
            raise _fail(f"text {empty[0]} is empty; every text needs something to classify")
        for i, text in enumerate(given, start=1):
            _check_utf8(text, f"text {i}")
        return _Inputs(given)
    if stdin:
        if text_column or label_column:
            raise _fail("standard input is read as plain text, one text a line: --text-column and --label-column "
                        "name a column of a --file table")
        if sys.stdin.isatty():
            print_error("reading texts from standard input, one a line (Ctrl-D ends them)", label="[dim]note:[/]")
        inputs = _lines_of(_stdin_text())
        for record in inputs.records or []:
            _check_utf8(record["text"], f"standard input, line {record['line']}")
        if not inputs.texts:
            raise _fail("standard input holds no texts (it is empty, or blank lines only)")
        return inputs
    assert file is not None
    path = Path(file).expanduser()
    if not path.exists():
        raise _fail(f"--file {file}: no such file")
    if path.is_dir():
        raise _fail(f"--file {file}: is a folder; give the file of texts")
    key, path, text = next(read_texts((str(path),), "--file", []))
    if not is_table(path):
        if table_options := [o for o, v in (("--text-column", text_column), ("--label-column", label_column)) if v]:
            raise _fail(f"--file {file} is plain text, one text a line: {', '.join(table_options)} name a column of a "
                        "table (.csv, .tsv, .json, .jsonl, .ndjson)")
        inputs = _lines_of(text)
        if not inputs.texts:
            raise _fail(f"--file {file} holds no texts (it is empty, or blank lines only)")
        return inputs
    data = spec.training.data if spec.training is not None else None
    trained = data if data is not None and data.type == "labelled" else None
    columns = Columns(
        text=text_column or (trained.text_field if trained else "text"),
        label=label_column or (trained.label_field if trained else "label"),
        text_setting="--text-column", label_setting="--label-column",
    )
    try:
        table = read_text_table(path, text, "--file", columns, optional_label=label_column is None, blank_labels=True)
    except DataError as exc:
        raise _fail(str(exc)) from None
    return _Inputs(table.texts, columns=table.columns, records=table.records, labels=table.labels,
                   label_column=columns.label if table.labels is not None else None)


def _prediction_fields(prediction: Any, top_k: int) -> dict[str, Any]:
    """``prediction``, ``probability`` (and ``prediction_2``, ``probability_2``, ...)."""
    fields: dict[str, Any] = {}
    for rank, (label, p) in enumerate(prediction.top[:top_k], start=1):
        suffix = "" if rank == 1 else f"_{rank}"
        fields[f"prediction{suffix}"] = label
        fields[f"probability{suffix}"] = p
    return fields


def _write_predictions(output: Path, table: _Inputs, predictions: list[Any], *, top_k: int) -> None:
    """The input's rows with their predictions, written atomically as ``output``'s extension
    says; the file is replaced only once it is whole."""
    import csv
    import io
    import json

    from specformer.data.cache import atomic_file

    rows = [{**record, **_prediction_fields(p, top_k)} for record, p in zip(table.records, predictions, strict=True)]
    added = list(_prediction_fields(predictions[0], top_k))
    replaced = [c for c in added if c in table.columns]
    if replaced:
        print_error(f"the input's column{'s' if len(replaced) > 1 else ''} {', '.join(map(repr, replaced))} "
                    f"{'are' if len(replaced) > 1 else 'is'} replaced by the predictions in {output}",
                    label="[yellow]warning:[/]")
    columns = [*table.columns, *(c for c in added if c not in table.columns)]
    kind = _OUTPUT_KINDS.get(output.suffix.lower(), "tsv")  # standard output, a pipe: tab-separated
    to_stdout = str(output) == "-"
    if to_stdout:
        # for cut and awk: one line a row, no quoting; a tab or line break inside a text is a space
        def plain(value: Any) -> str:
            return re.sub(r"[\t\r\n]", " ", _cell(value))

        data = "".join("\t".join(plain(v) for v in row) + "\n"
                       for row in [columns, *([r.get(c) for c in columns] for r in rows)])
    elif kind in ("csv", "tsv"):
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer, delimiter="\t" if kind == "tsv" else ",", lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in columns])
        data = buffer.getvalue()
    else:
        lines = [json.dumps({c: row[c] for c in columns if c in row}, ensure_ascii=False) for row in rows]
        data = "\n".join(lines) + "\n" if kind == "jsonl" else "[\n" + ",\n".join(lines) + "\n]\n"
    try:
        if to_stdout:
            sys.stdout.write(data)
            sys.stdout.flush()
            return
        with atomic_file(output) as f:
            f.write(data.encode("utf-8"))
    except OSError as exc:
        if reader_gone(exc, output) or (to_stdout and isinstance(exc, BrokenPipeError)):
            raise typer.Exit(0) from None
        kept = "; the file from before is as it was" if output.is_file() else ""
        raise _fail(f"--output {output}: cannot write ({exc.strerror or exc}); nothing was written{kept}") from None


def _cell(value: Any) -> str:
    """A table cell: a string as it is, a JSON value (from a .jsonl input) as JSON, nothing as ''."""
    import json

    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def _show_predictions(table: _Inputs, predictions: list[Any]) -> None:
    """The predictions as a table on the screen: each text, then its labels by rank."""
    from rich.text import Text

    ranks = max(len(p.top) for p in predictions)
    out = Table(show_lines=ranks > 1)
    out.add_column("#", justify="right", style="dim")
    out.add_column("text", overflow="fold", ratio=1)
    if ranks > 1:
        out.add_column("rank", justify="right")
    out.add_column("label")
    out.add_column("probability", justify="right")
    if table.labels is not None:
        out.add_column(f"true ({escape(str(table.label_column))})")
    for n, (text, p) in enumerate(zip(table.texts, predictions, strict=True), start=1):
        shown = text if len(text) <= 200 else text[:199] + "…"
        truth = [Text("" if table.labels[n - 1] is None else str(table.labels[n - 1]))] if table.labels is not None else []
        labels = [Text(str(label)) for label, _ in p.top]
        probs = [f"{q:.3f}" for _, q in p.top]
        if ranks > 1:
            out.add_row(str(n), Text(shown), "\n".join(str(r) for r in range(1, len(p.top) + 1)),
                        Text("\n").join(labels), "\n".join(probs), *truth)
        else:
            out.add_row(str(n), Text(shown), labels[0], probs[0], *truth)
    console.print(out)


def _show_score(scored: Any, names: tuple[Any, ...], column: str | None, *, out: Any = console) -> None:
    """The accuracy line (on ``out``), and the labels the model does not know."""
    if scored.unknown:
        shown = ", ".join(f"{label!r} ({count} text{'s' if count != 1 else ''})"
                          for label, count in list(scored.unknown.items())[:10])
        more = f", and {len(scored.unknown) - 10} more" if len(scored.unknown) > 10 else ""
        print_error(f"the {column!r} column has labels this model does not have: {shown}{more}; they are left out "
                    f"of the accuracy (the model's labels: {', '.join(map(repr, names))})",
                    label="[yellow]warning:[/]")
    if scored.counted:
        texts = "text" if scored.counted == 1 else "texts"
        out.print(f"[bold]accuracy[/] {100 * scored.accuracy:.1f}% ({scored.correct:,} of {scored.counted:,} "
                  f"{texts} with a label, the {escape(repr(column))} column)", highlight=False, soft_wrap=True)
