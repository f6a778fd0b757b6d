"""Checkpoints: written atomically, loaded safely, self-describing.

A specformer checkpoint is a Lightning checkpoint (weights, optimizer, scheduler,
loop progress, and under ``"SpecDataModule"`` the data position: the step, the
training examples read by then, and a hash of the data's content) plus a ``"specformer"`` entry holding the resolved
spec as plain data, the tokenizer's state, the random-number-generator states and
the tokens seen. Everything in it is tensors and plain Python values, so it loads with
``torch.load(weights_only=True)``: opening a checkpoint never runs code from it.
Before it is loaded, every entry of the archive is checked against the CRC-32 that
``torch.save`` stored with it, so a flipped bit on disk or in a copy is reported as
a damaged file instead of loading as silently wrong weights.

Writes go to a temporary file in the same folder, are flushed to disk and then
renamed over the target (``os.replace``): a crash or SIGKILL leaves either the old
checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import signal
import threading
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from specformer.data.cache import atomic_file, locked, remove_temporaries
from specformer.data.corpus import lfs_pointer

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "read_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
    "write_checkpoint",
    "load_weights_file",
    "LoadedCheckpoint",
    "rng_state",
    "set_rng_state",
    "model_spec_differences",
    "check_resumable",
    "read_weights",
    "read_weights_and_tokenizer",
    "read_weights_tokenizer_and_origin",
    "checkpoint_tokenizer",
    "checkpoint_tokenizer_spec",
    "load_weights",
    "check_weights",
    "remove_stale_temporaries",
    "ctrl_c_after",
]

FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint could not be used or written; the message says which file and why."""


class _CtrlCHeld:
    """The SIGINT handler of an open :func:`ctrl_c_after` block: it notes the signal."""

    def __init__(self, pressed: list[int]) -> None:
        self.pressed = pressed

    def __call__(self, signum: int, frame: Any) -> None:
        self.pressed.append(signum)


@contextmanager
def ctrl_c_after() -> Iterator[None]:
    """Ctrl-C (SIGINT) during the block is raised when it ends (not when the block raises).
    ``torch.save`` into a file object calls back into Python for every record: a
    ``KeyboardInterrupt`` raised in such a call comes out of its C++ writer as a
    ``RuntimeError`` ("unexpected pos"), which would report a Ctrl-C as a failed write.
    Raised after the write, it removes the temporary file as any error does, and the
    previous checkpoint stays. Around a checkpoint's write and the note of what was
    written, it keeps the two in step: a Ctrl-C between them would leave a new checkpoint
    on disk that the run's message does not name. Nested, the outermost block takes it: a
    Ctrl-C during the write of a run's checkpoint lets the write finish, the file is renamed
    into place and noted, and the run stops naming it (a file written whole is not thrown away)."""
    current = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or current in (signal.SIG_IGN, None) or (
        isinstance(current, _CtrlCHeld)
    ):
        yield  # (inside an outer block: that one holds the Ctrl-C)
        return
    pressed: list[int] = []
    previous = signal.signal(signal.SIGINT, _CtrlCHeld(pressed))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> int:
    """Remove the temporary files (``.last.ckpt.<hex>.tmp``) that checkpoint writes killed
    midway (SIGKILL, the OOM killer, the end of a scheduler's grace period) left in ``folder``,
    each as large as a checkpoint. Only when no live process is writing a checkpoint there
    (two runs may share the folder: a run resumed while the first one goes on), which the lock
    every write holds tells; and only those files: nothing else in the folder is touched.
    Returns the bytes freed."""
    if not Path(folder).is_dir():
        return 0
    with locked(folder, wait=False) as alone:  # a folder's lock makes no file in it
        return remove_temporaries(folder) if alone else 0


def _os_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc`` (itself, or what it was raised while handling), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _resumed_from(spec_yaml: Path) -> Path | None:
    """The checkpoint a run was resumed from, as its ``spec.yaml`` header's command gives it
    (``# cd DIR && specformer train --resume X ...``), where it is still a file; else None."""
    import shlex

    try:
        first = spec_yaml.read_text(encoding="utf-8").splitlines()[0]
        words = shlex.split(first.lstrip("# "))
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        return None
    if len(words) < 4 or words[0] != "cd" or "--resume" not in words[:-1]:
        return None
    given = Path(words[words.index("--resume") + 1]).expanduser()
    source = given if given.is_absolute() else Path(words[1]) / given
    source = checkpoint_file(source)
    return source if source.is_file() else None


def checkpoint_file(path: Path) -> Path:
    """The checkpoint a path names: a run folder's ``checkpoints/last.ckpt`` (or a folder's own
    ``last.ckpt``), else the path itself."""
    if path.is_dir():
        return path / "checkpoints" / "last.ckpt" if (path / "checkpoints").is_dir() else path / "last.ckpt"
    return path


def read_checkpoint(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)`` with errors that say what is wrong."""
    path = Path(path)
    if not path.exists():
        from specformer.specs.loader import preset_names

        if str(path) in preset_names():  # a preset's name, as train takes it
            raise CheckpointError(
                f"{path} is a preset spec, not a checkpoint: eval, generate, fill-mask, train --resume and "
                f"--init-from take a checkpoint (a .ckpt file or a run folder) written by `specformer train`, e.g. "
                f"specformer train {path}"
            )
        raise CheckpointError(f"{path}: no such checkpoint file")
    if path.is_dir():
        candidate = checkpoint_file(path)
        if not candidate.is_file():
            if (path / "spec.yaml").is_file():
                earlier = _resumed_from(path / "spec.yaml")
                raise CheckpointError(
                    f"{path} is a run folder with no checkpoint: the run stopped before its first one "
                    "(training.checkpoint_interval), so there is nothing to load or resume from"
                    + (f"; it was resumed from {earlier}, which is still there: give that" if earlier else "")
                )
            from specformer.specs.loader import run_order

            runs = sorted((run.parent.parent for run in path.glob("*/checkpoints/last.ckpt")), key=run_order)
            if runs:  # runs/<spec name>/, the folder of a spec's runs: name its latest
                more = f" (and {len(runs) - 1} earlier)" if len(runs) > 1 else ""
                raise CheckpointError(f"{path} holds the runs of a spec, not one run; its latest is {runs[-1]}{more}: "
                                      "give that run folder or its checkpoints/last.ckpt")
            started = sorted((run.parent for run in path.glob("*/spec.yaml")), key=run_order)
            if started:  # runs/<spec name>/ of runs all stopped before their first checkpoint
                which = f"all {len(started)} of its runs" if len(started) > 1 else "its one run"
                raise CheckpointError(
                    f"{path} holds the runs of a spec, and {which} stopped before the first checkpoint "
                    f"(training.checkpoint_interval), so there is nothing to load or resume from; the latest is "
                    f"{started[-1]}"
                )
            if (path / "config.json").is_file():  # what transformers or export-hf wrote
                raise CheckpointError(
                    f"{path} is a Hugging Face model folder (config.json), not a run: read it with `specformer "
                    f"import-hf {path} -o spec.yaml --weights weights.safetensors`, then give weights.safetensors "
                    "(train spec.yaml --init-from weights.safetensors; generate, eval and fill-mask with --spec "
                    "spec.yaml)"
                )
            raise CheckpointError(f"{path} is a folder with no last.ckpt (expected a run folder or a .ckpt file)")
        path = candidate
    if path.suffix.lower() in (".yaml", ".yml"):
        run = path.parent
        if (run / "checkpoints").is_dir() and path.name == "spec.yaml":  # the spec a run folder keeps
            has = (run / "checkpoints" / "last.ckpt").is_file()
            raise CheckpointError(
                f"{path} is the spec of the run {run}, not a checkpoint: give the run folder {run}"
                + (" (or its checkpoints/last.ckpt)" if has else ", once its first checkpoint is written")
            )
        raise CheckpointError(
            f"{path} is a spec, not a checkpoint: eval, generate, fill-mask, train --resume and --init-from take a "
            f"checkpoint (a .ckpt file or a run folder) written by `specformer train`, e.g. specformer train {path}"
        )
    if path.suffix.lower() == ".safetensors":  # import-hf --weights (or any model's weights): no step, no optimizer
        raise CheckpointError(
            f"{path} holds weights only, not a checkpoint of a run (no step, optimizer or spec to continue): "
            f"start a new run from them with `specformer train SPEC --init-from {path}`; generate, eval, fill-mask "
            "and export-hf read them with --spec SPEC"
        )
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty (an interrupted copy?)")
    if pointer := lfs_pointer(path):
        raise CheckpointError(pointer)
    if not zipfile.is_zipfile(path):
        # torch.save writes a zip archive; anything else is not one of ours (or lost its end)
        with open(path, "rb") as f:
            zip_start = f.read(4) == b"PK\x03\x04"
        what = (
            "the zip archive is truncated or damaged (an interrupted copy or download?)" if zip_start
            else "it is not a torch zip file (truncated or not a checkpoint)"
        )
        raise CheckpointError(f"{path} is not a specformer checkpoint: {what}")
    _check_crc(path)
    try:
        data = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "\x00" in str(exc):  # a "global" made of zero bytes: the pickle itself is damaged
            raise CheckpointError(f"{path} is not a readable checkpoint: its data is corrupt") from None
        if "Unsupported global" in str(exc) or "GLOBAL" in str(exc):
            raise CheckpointError(
                f"{path}: the file holds Python objects other than tensors and plain data, so it is "
                "not loaded (loading could run arbitrary code)"
            ) from None
        raise CheckpointError(f"{path} is not a readable checkpoint: its data could not be read ({_short(exc)})") from None
    except (zipfile.BadZipFile, EOFError, RuntimeError) as exc:
        if "inline_container" in str(exc) or "PytorchStreamReader" in str(exc):
            what = f"a zip archive, but not one torch.save wrote ({_short(exc)})"
        else:
            what = f"corrupt or truncated ({_short(exc)})"
        raise CheckpointError(f"{path} is not a specformer checkpoint: {what}") from None
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable checkpoint ({_short(exc)})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a specformer checkpoint (found {type(data).__name__}, expected a mapping)")
    return data


_CHECKED: set[tuple[str, int, int]] = set()


def _check_crc(path: Path) -> None:
    """Read every entry of the zip archive at ``path`` and compare it with its stored CRC-32
    (``torch.load`` does not); raise CheckpointError naming the first that differs. An
    unchanged file (same path, size and modification time) is checked once per process:
    a resume reads its checkpoint twice."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _CHECKED:
        return
    entry_name = "?"
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.CRC == 0 and info.file_size:  # written with torch.serialization.set_crc32_options(False)
                    continue
                entry_name = info.filename
                with archive.open(info) as entry:  # raises at the end of an entry whose CRC differs
                    while entry.read(1 << 24):
                        pass
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as exc:
        what = "its bytes do not match the checksum stored with them" if "CRC" in str(exc) else _short(exc)
        raise CheckpointError(
            f"{path} is damaged: the archive entry {entry_name!r} is corrupt ({what}; a disk error or an "
            "interrupted copy?). Use another checkpoint of the run, or copy this one again"
        ) from None
    _CHECKED.add(key)


def _short(exc: BaseException) -> str:
    """The first sentence of an error, without torch's advice to load unsafely."""
    lines = [
        line.strip() for line in str(exc).strip().splitlines()
        if line.strip() and "weights_only" not in line and "Weights only load failed" not in line
    ]
    text = re.sub(r"^\[enforce fail at [^\]]*\]\s*\.?\s*", "", lines[0]) if lines else ""
    first = text.split(". ")[0].rstrip(".")
    if not first:
        return type(exc).__name__
    return first[:160] + ("…" if len(first) > 160 else "")


_SHOWN = 12  # differences written out in full when a resume is refused; the rest are named


def own_modules(spec: Any) -> dict[str, str]:
    """:func:`~specformer.analysis.params.own_built_components` of ``spec``, as a checkpoint
    records them (none for a spec the analysis cannot walk)."""
    from specformer.analysis.params import own_built_components

    try:
        return own_built_components(spec)
    except Exception:  # noqa: BLE001 - a spec the analysis cannot walk: nothing to record
        return {}


def check_own_modules(meta: Any, spec: Any, *, source: str) -> None:
    """Refuse a checkpoint whose parts were built by modules of one's own (:func:`own_modules`,
    as it records them) that build them otherwise here (the plugin not installed)."""
    recorded = meta.get("own_modules") if isinstance(meta, dict) else None
    if not isinstance(recorded, dict) or not recorded:
        return
    here = own_modules(spec)
    changed = {key: what for key, what in recorded.items() if here.get(key) != what}
    if changed:
        parts = "; ".join(f"{key}: {what}, here {_here(here.get(key), what)}" for key, what in changed.items())
        raise CheckpointError(
            f"{source}: its model was built with modules of your own ({parts}): its weights would run through "
            "another computation here; install the plugin that registers them (or register their targets, "
            "replace=True) before loading it"
        )


def _here(current: str | None, recorded: str) -> str:
    from specformer.analysis.params import BUILT_BY

    if current is not None:
        return current.split(BUILT_BY, 1)[1]
    return "specformer's own " + recorded.split(BUILT_BY, 1)[0]


def check_resumable(raw: dict[str, Any], spec: Any, *, source: str) -> None:
    """Refuse to resume ``spec`` from the checkpoint ``raw`` (read from ``source``) when it
    is not a specformer checkpoint or holds a different model; training settings may differ."""
    meta = raw.get("specformer")
    if not isinstance(meta, dict) or not isinstance(meta.get("spec"), dict):
        raise CheckpointError(f"{source}: not a specformer checkpoint (it has no 'specformer' entry with a spec)")
    check_own_modules(meta, spec, source=source)
    saved_kind, kind = meta["spec"].get("kind"), spec.kind
    if saved_kind != kind and saved_kind in _KIND_NAMES:
        # another kind of model: every part differs, and its weights fit no field changed here
        raise CheckpointError(
            f"{source}: the checkpoint is {_KIND_NAMES[saved_kind]}'s and this spec describes "
            f"{_KIND_NAMES.get(kind, repr(kind))}: resume with the checkpoint's own spec, which `specformer train "
            f"--resume {source}` with no SPEC uses, or train this spec from the start without --resume"
        )
    differences = model_spec_differences(meta["spec"], spec.to_dict())
    if differences:
        shown = "\n  ".join(differences[:_SHOWN])
        if len(differences) > _SHOWN:
            rest = [line.split(":", 1)[0] for line in differences[_SHOWN:]]
            shown += f"\n  … and {len(rest)} more: {', '.join(rest)}"
        raise CheckpointError(
            f"{source}: the checkpoint was trained with a different model than this spec describes:\n  "
            f"{shown}\nresume with the spec the checkpoint was written with (training settings may change): "
            f"it is in the checkpoint, and `specformer train --resume {source}` with no SPEC uses it (and no "
            "--set of these fields); to train the changed model from these weights (a dropout, or any field "
            "that keeps their shapes), start a new run, at step 0 with a fresh optimizer: "
            f"`specformer train SPEC --init-from {source}`"
        )


def check_same_model(raw: dict[str, Any], spec: Any, *, source: str) -> None:
    """Refuse to load the checkpoint ``raw`` into a module of ``spec`` to evaluate it
    (``Trainer.validate``/``test``/``predict`` with ``ckpt_path``) when it holds another
    model: nothing is resumed there, so the way out is a module of the checkpoint's spec."""
    meta = raw.get("specformer")
    if not isinstance(meta, dict) or not isinstance(meta.get("spec"), dict):
        raise CheckpointError(f"{source}: not a specformer checkpoint (it has no 'specformer' entry with a spec)")
    differences = model_spec_differences(meta["spec"], spec.to_dict())
    if differences:
        shown = "\n  ".join(differences[:_SHOWN])
        if len(differences) > _SHOWN:
            shown += f"\n  … and {len(differences) - _SHOWN} more"
        raise CheckpointError(
            f"{source}: the checkpoint holds another model than this SpecModule's spec describes:\n  {shown}\n"
            f"evaluate it with a module of its own spec: SpecModule.load_from_checkpoint({source!r})"
        )


@dataclass
class LoadedCheckpoint:
    """What a checkpoint rebuilds: the spec, the model (weights loaded, eval mode), the
    tokenizer, the step it was saved at, and the raw dictionary."""

    spec: Any
    model: nn.Module
    tokenizer: Any
    step: int
    path: Path
    raw: dict[str, Any]

    def __repr__(self) -> str:
        # one line: the dataclass repr would print the module tree, the spec and every tensor
        n = sum(p.numel() for p in self.model.parameters())
        return (f"LoadedCheckpoint({str(self.path)!r}, spec={self.spec.name!r}, step={self.step}, "
                f"model={type(self.model).__name__} ({n:,} parameters), "
                f"tokenizer={type(self.tokenizer).__name__ if self.tokenizer is not None else None})")


def load_checkpoint(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> LoadedCheckpoint:
    """Rebuild the model of a checkpoint from the spec it carries and load its weights."""
    from specformer.builder import build_model
    from specformer.specs.errors import SpecError
    from specformer.specs.loader import load_spec

    path = Path(path)
    raw = read_checkpoint(path, map_location=map_location)
    meta = raw.get("specformer")
    if not isinstance(meta, dict) or "spec" not in meta:
        raise CheckpointError(f"{path}: not a specformer checkpoint (it has no 'specformer' entry with a spec)")
    version = meta.get("format", 0)
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: written by a newer specformer (format {version}; this one reads up to {FORMAT_VERSION})"
        )
    try:
        spec = load_spec(meta["spec"])
    except SpecError as exc:
        unknown = any(p.message.startswith("unknown type") for p in exc.problems)
        hint = (
            "\nits model uses a type that is not registered here (a plugin's, or one a script registered): "
            "install the plugin (a 'specformer.plugins' entry point registers it for the command line too), "
            "or register the type before load_checkpoint"
        ) if unknown else ""
        raise CheckpointError(f"{path}: the spec stored in the checkpoint is not valid here:\n{exc}{hint}") from None
    check_own_modules(meta, spec, source=str(path))
    model = build_model(spec)
    load_weights(model, _model_weights(raw, path), source=str(path))
    model.eval()
    tokenizer = checkpoint_tokenizer(raw)
    return LoadedCheckpoint(spec=spec, model=model, tokenizer=tokenizer, step=int(raw.get("global_step", 0)), path=path, raw=raw)


def save_checkpoint(
    model: nn.Module, path: str | os.PathLike[str], *, spec: Any = None, tokenizer: Any = None
) -> Path:
    """Write ``model`` (a model :func:`~specformer.build_model` built, trained in a loop of your
    own) as a specformer checkpoint that :func:`load_checkpoint`, ``specformer generate``,
    ``eval``, ``fill-mask``, ``classify``, ``export-hf`` and ``train --init-from`` read: the
    weights, the resolved spec (``model.spec`` unless ``spec`` is given) and the tokenizer
    (a specformer tokenizer, as ``load_checkpoint(...).tokenizer``, or a ``tokenizers.Tokenizer``;
    by default the spec's ``training.tokenizer`` when it is a ``tokenizer.json`` or ``byte``/``task``).
    The file has no optimizer state or step, so a run starts from it with ``--init-from``, not
    ``--resume``. The write is atomic, as a run's checkpoint: ``path`` is the old file or the
    new one, never a torn file. Returns the path written."""
    from specformer import __version__
    from specformer.builder import build_model
    from specformer.specs.schema import ModelSpec

    path = Path(path)
    if path.suffix.lower() in (".safetensors", ".yaml", ".yml"):
        raise CheckpointError(f"{path}: save_checkpoint writes a checkpoint (.ckpt); a .safetensors file of weights "
                              "or a spec would not carry the other (use a name ending in .ckpt)")
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder; give the checkpoint file to write, e.g. {path / 'model.ckpt'}")
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the weights' names without _orig_mod.
    if isinstance(getattr(model, "model", None), nn.Module) and hasattr(model.model, "spec"):
        # a SpecModule (Lightning): the model it trains, with the module's tokenizer by default
        tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        model = model.model
    spec = spec if spec is not None else getattr(model, "spec", None)
    if not isinstance(spec, ModelSpec):
        raise CheckpointError(
            f"{path}: no spec for the model: give spec= (a ModelSpec; a model build_model made carries "
            f"its own as model.spec){f', not a {type(spec).__name__}' if spec is not None else ''}"
        )
    weights = model.state_dict()
    check_weights(build_model(spec, device="meta"), weights, source=f"{path}: the model")
    if tokenizer is None:
        tokenizer = weights_tokenizer(path, spec)
        settings = spec.training.tokenizer if spec.training is not None else None
        if tokenizer is None and settings is not None:
            # a BPE is trained on the run's data: which one the model learned with is not in the spec
            warnings.warn(
                f"{path}: the checkpoint carries no tokenizer: the spec's training.tokenizer ({settings.type}) is "
                f"trained on the data at run time, so generate, eval and export-hf cannot encode text with it; "
                f"give the one the model was trained with as tokenizer=, e.g. "
                f"SpecDataModule(spec).tokenizer (the one specformer train would train on the spec's data)",
                stacklevel=2,
            )
    elif not hasattr(tokenizer, "state"):
        from tokenizers import Tokenizer as _Tok

        from specformer.data.tokenizers import HFTokenizer

        if not isinstance(tokenizer, _Tok):
            raise CheckpointError(f"{path}: tokenizer= is a {type(tokenizer).__name__}; give a specformer tokenizer "
                                  "(load_checkpoint(...).tokenizer) or a tokenizers.Tokenizer")
        tokenizer = HFTokenizer(tokenizer)
    checkpoint = {
        "state_dict": {f"model.{k}": v.detach().cpu() for k, v in weights.items()},
        "global_step": 0,
        "specformer": {
            "format": FORMAT_VERSION,
            "version": __version__,
            "spec": spec.to_dict(),
            "tokenizer": tokenizer.state() if tokenizer is not None else None,
            "own_modules": own_modules(spec),
        },
    }
    write_checkpoint(checkpoint, path)
    return path


def write_checkpoint(checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``checkpoint`` to ``path`` atomically; a failed write (a full disk, a read-only
    folder) raises the ``OSError`` that caused it, naming ``path``, and leaves ``path`` as it was.

    The write holds a shared lock on the folder: :func:`remove_stale_temporaries` removes
    only the temporary files of writes that no live process holds."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with locked(Path(path).parent, shared=True), atomic_file(path) as f, ctrl_c_after():
            torch.save(checkpoint, f)
    except (OSError, RuntimeError) as exc:
        # torch.save reports a failed write as "[enforce fail at inline_container.cc] unexpected pos"
        cause = _os_error(exc)
        if cause is None:
            raise
        raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from exc


def load_weights_file(path: str | os.PathLike[str], spec: Any) -> LoadedCheckpoint:
    """The model of ``spec`` (a ModelSpec, preset name, YAML path or dict) with the weights of a ``.safetensors`` file (what ``import-hf
    --weights`` writes), as :func:`load_checkpoint` rebuilds a checkpoint's: an imported
    model generates, evaluates and fills masks before any training. Its tokenizer is the
    spec's ``training.tokenizer`` when that is a ``tokenizer.json`` (``type: file``, as
    ``import-hf`` writes it) or a fixed one (``byte``, ``task``), else the one ``import-hf``
    recorded in the file's header, else None (a BPE the spec would train has none of the
    weights' ids)."""
    from specformer.analysis.params import as_spec
    from specformer.builder import build_model

    spec = as_spec(spec)  # a preset name, a YAML path, a dict
    path = Path(path)
    weights, _, _ = read_weights_and_tokenizer(path)
    model = build_model(spec)
    load_weights(model, weights, source=str(path))
    model.eval()
    return LoadedCheckpoint(spec=spec, model=model, tokenizer=weights_tokenizer(path, spec), step=0, path=path, raw={})


def weights_tokenizer(path: str | os.PathLike[str], spec: Any) -> Any:
    """The tokenizer of a ``.safetensors`` file's weights: the spec's ``training.tokenizer``
    when it is a ``tokenizer.json`` (``type: file``) or one with nothing to train (``byte``,
    ``task``: the same ids for every run), else the one ``import-hf`` recorded in the
    file's header, else None."""
    from specformer.data.tokenizers import ByteTokenizer, TaskTokenizer, file_tokenizer
    from specformer.specs.training import FileTokenizerSpec

    settings = spec.training.tokenizer
    if settings is not None and settings.type in ("byte", "task"):
        return ByteTokenizer() if settings.type == "byte" else TaskTokenizer()
    if settings is None or settings.type != "file":
        recorded = weights_origin(path).get("specformer.tokenizer")
        settings = FileTokenizerSpec(type="file", path=recorded) if recorded else None
    return file_tokenizer(settings) if settings is not None else None


def _model_weights(raw: dict[str, Any], path: Path) -> dict[str, torch.Tensor]:
    """The model's weights in a Lightning checkpoint, without the module's ``model.`` prefix."""
    state = raw.get("state_dict")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: the checkpoint has no weights (no state_dict)")
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def checkpoint_tokenizer(raw: dict[str, Any]) -> Any:
    """The tokenizer a checkpoint (read with :func:`read_checkpoint`) was trained with,
    or None when it carries none."""
    from specformer.data.tokenizers import tokenizer_from_state

    meta = raw.get("specformer")
    state = meta.get("tokenizer") if isinstance(meta, dict) else None
    return tokenizer_from_state(state) if state else None


def checkpoint_tokenizer_spec(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The ``training.tokenizer`` settings of the spec stored in a checkpoint, or None."""
    meta = raw.get("specformer")
    spec = meta.get("spec") if isinstance(meta, dict) else None
    training = spec.get("training") if isinstance(spec, dict) else None
    tokenizer = training.get("tokenizer") if isinstance(training, dict) else None
    return tokenizer if isinstance(tokenizer, dict) else None


def read_weights(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """A model's weights, by specformer names: a ``.safetensors`` file (as ``import-hf
    --weights`` writes), or a specformer checkpoint (a ``.ckpt`` or a run folder)."""
    return read_weights_and_tokenizer(path)[0]


def read_weights_and_tokenizer(
    path: str | os.PathLike[str],
) -> tuple[dict[str, torch.Tensor], Any, dict[str, Any] | None]:
    """:func:`read_weights`, the checkpoint's tokenizer and its ``training.tokenizer``
    settings (None, None for a ``.safetensors`` file): weights fit the token ids they
    were trained on."""
    weights, tokenizer, settings, _ = read_weights_tokenizer_and_origin(path)
    return weights, tokenizer, settings


def read_weights_tokenizer_and_origin(
    path: str | os.PathLike[str],
) -> tuple[dict[str, torch.Tensor], Any, dict[str, Any] | None, dict[str, str]]:
    """:func:`read_weights_and_tokenizer` and the weights' origin: :func:`weights_origin` of a
    ``.safetensors`` file; of a checkpoint, the ``specformer.imported_model_type`` its run
    kept from the imported weights it started from (empty when there is none)."""
    path = Path(path)
    if path.suffix.lower() != ".safetensors":
        raw = read_checkpoint(path)
        tokenizer = checkpoint_tokenizer(raw)
        meta = raw.get("specformer")
        imported = meta.get("imported_model_type") if isinstance(meta, dict) else None
        origin = {"specformer.imported_model_type": imported} if isinstance(imported, str) else {}
        return (_model_weights(raw, path), tokenizer, checkpoint_tokenizer_spec(raw) if tokenizer else None,
                origin)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    if pointer := lfs_pointer(path):
        raise CheckpointError(pointer)
    try:
        return load_file(path), None, None, weights_origin(path)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from None


def weights_origin(path: str | os.PathLike[str]) -> dict[str, str]:
    """What ``import-hf --weights`` recorded in a ``.safetensors`` file's header about where
    the weights came from (``specformer.imported_from``, ``specformer.tokenizer``); empty for
    any other file."""
    path = Path(path)
    if path.suffix.lower() != ".safetensors":
        return {}
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError):
        return {}
    return {k: v for k, v in metadata.items() if k.startswith("specformer.")}


def load_weights(model: nn.Module, weights: dict[str, torch.Tensor], *, source: str) -> None:
    """Load a state dict, refusing (with a list of what differs) anything but an exact match."""
    check_weights(model, weights, source=source)
    model.load_state_dict(weights, strict=True)


def check_weights(model: nn.Module, weights: dict[str, torch.Tensor], *, source: str) -> None:
    """Refuse ``weights`` unless their keys and shapes are exactly ``model``'s (which may be
    on the meta device: nothing is copied)."""
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    shapes = [
        f"{k}: checkpoint {tuple(weights[k].shape)}, model {tuple(own[k].shape)}"
        for k in own
        if k in weights and tuple(weights[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shapes:
        lines = [f"{source}: the weights do not fit the model"]
        theirs, ours = _stacks(weights), _stacks(own)
        if theirs and ours and theirs != ours:
            # another kind of model altogether: its shapes and names differ everywhere, a table's rows included
            lines.append(
                f"  the weights are {_KIND_NAMES['-'.join(theirs)]}'s (their layers are {' and '.join(s + '.*' for s in theirs)}) "
                f"and this spec describes {_KIND_NAMES['-'.join(ours)]}: weights load only into the kind of model they "
                f"were trained as; give a spec of {_KIND_NAMES['-'.join(theirs)]} (a checkpoint or run folder carries its own)"
            )
        if shapes:
            lines += ["  different shapes:"] + [f"    {s}" for s in shapes[:10]]
            tables = [k for k in own if k.endswith("positions.weight") and k in weights
                      and weights[k].dim() == 2 and tuple(weights[k].shape[1:]) == tuple(own[k].shape[1:])
                      and weights[k].shape[0] != own[k].shape[0]]
            for k in tables if theirs == ours else ():
                lines.append(
                    f"  {k} is a learned position table, one row per position: the weights have "
                    f"{weights[k].shape[0]} rows and this spec's max_seq_len (or positional.max_positions) "
                    f"asks for {own[k].shape[0]}; keep the weights' length, as a table has no trained row for "
                    "a later position (rope, alibi, t5, sinusoidal and none positions have no table and run "
                    "at any max_seq_len)"
                )
        if missing:
            lines.append(f"  missing from the checkpoint: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}")
        if unexpected:
            lines.append(f"  not in the model: {', '.join(unexpected[:10])}{' ...' if len(unexpected) > 10 else ''}")
        if weights and not set(weights) & set(own):
            # no name in common: most likely a Hugging Face model's (transformers', or export-hf's)
            lines.append("  none of its names is one of specformer's: a Hugging Face model's weights (a folder that "
                         "transformers or export-hf wrote) are read with `specformer import-hf FOLDER -o spec.yaml "
                         "--weights weights.safetensors`, which renames them")
        raise CheckpointError("\n".join(lines))


def check_finite_weights(model: nn.Module, *, source: str) -> None:
    """Refuse a model whose weights hold NaN or inf (a run that diverged, written by an older
    specformer or by hand): greedy decoding would emit token 0, sampling fail inside torch and
    eval print nan. One ``isfinite(...).all()`` a tensor: cheap beside loading them."""
    bad = [name for name, t in model.state_dict().items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise CheckpointError(
            f"{source}: the weights hold NaN or infinite values ({shown}): the run that wrote them diverged, and "
            "nothing the model computes from them means anything; use a checkpoint from before it diverged"
        )


_KIND_NAMES = {"decoder": "a decoder", "encoder": "an encoder", "encoder-decoder": "an encoder-decoder"}


def _stacks(state: dict[str, Any]) -> tuple[str, ...]:
    """The layer stacks (``encoder``, ``decoder``, in this order) whose layers a state dict
    holds: what kind of model its names are a specformer model's of."""
    return tuple(stack for stack in ("encoder", "decoder") if any(k.startswith(f"{stack}.layers.") for k in state))


def model_spec_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths where two spec dicts differ, ignoring the training section and the name
    (what a resumed run may change)."""
    keys = set(saved) | set(current)
    if "type" in saved and "type" in current and saved["type"] != current["type"]:
        keys = set(saved) & set(current)  # a field of one type only is not a second difference
    out: list[str] = []
    for key in sorted(keys):
        if not prefix and key in ("training", "name"):
            continue
        a, b = saved.get(key), current.get(key)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += model_spec_differences(a, b, path + ".")
        elif a != b:
            out.append(f"{path}: checkpoint {_value(saved, key)}, spec {_value(current, key)}")
    return out


def _value(mapping: dict[str, Any], key: str) -> str:
    return repr(mapping[key]) if key in mapping else "(absent)"


# --------------------------------------------------------------------------- random state


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) generator states as tensors and plain data."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *[float(x) if isinstance(x, float) else int(x) for x in np_state[2:]]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def __getattr__(name: str) -> Any:
    # Lightning's checkpoint I/O class, defined where Lightning is imported: reading a
    # checkpoint (generate, eval, classify) does not import Lightning (seconds)
    if name == "AtomicCheckpointIO":
        from specformer.training.checkpoint_io import AtomicCheckpointIO

        return AtomicCheckpointIO
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
