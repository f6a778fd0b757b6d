"""Resuming continues exactly; checkpoints are atomic, self-describing and weights_only-safe."""

from __future__ import annotations

import csv
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from specformer import load_spec
from specformer.data.cache import content_hash
from specformer.data.sampler import StreamBatchSampler
from specformer.training.checkpoint import (
    AtomicCheckpointIO,
    CheckpointError,
    check_resumable,
    load_checkpoint,
    read_checkpoint,
)
from specformer.training.run import TrainingInterrupted, train


class LossRecorder(L.Callback):
    """Every optimizer step's training loss, by step."""

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.losses[trainer.global_step] = float(outputs["loss"])


def _spec(tiny: Any, kind: str, **training: Any) -> Any:
    # dropout on, so the restored random state matters too
    data = tiny(kind, checkpoint_interval=3, val_interval=4, **training)
    data["embedding"] = {"dropout": 0.1}
    return load_spec(data)


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_resume_gives_the_same_next_losses_as_an_uninterrupted_run(tiny: Any, kind: str) -> None:
    full = LossRecorder()
    train(_spec(tiny, kind, max_steps=8), progress=False, callbacks=[full])
    first = train(_spec(tiny, kind, max_steps=6), progress=False)
    assert first.checkpoint and read_checkpoint(first.checkpoint)["global_step"] == 6
    resumed = LossRecorder()
    result = train(_spec(tiny, kind, max_steps=8), resume=first.checkpoint, progress=False, callbacks=[resumed])
    assert result.steps == 8
    assert sorted(resumed.losses) == [7, 8]
    for step in (7, 8):
        assert resumed.losses[step] == pytest.approx(full.losses[step], abs=1e-6), (step, resumed.losses, full.losses)


@pytest.mark.parametrize("optimizer", [{"type": "sgd", "lr": 0.05, "nesterov": True}, {"type": "adafactor"}])
def test_other_optimizers_train_and_resume_exactly(tiny: Any, optimizer: dict[str, Any]) -> None:
    full = LossRecorder()
    train(_spec(tiny, "decoder", max_steps=8, optimizer=optimizer), progress=False, callbacks=[full])
    assert full.losses[8] < full.losses[1]  # it learns
    first = train(_spec(tiny, "decoder", max_steps=6, optimizer=optimizer), progress=False)
    resumed = LossRecorder()
    train(_spec(tiny, "decoder", max_steps=8, optimizer=optimizer), resume=first.checkpoint, progress=False,
          callbacks=[resumed])
    for step in (7, 8):  # the momentum or the factored moments came back with the weights
        assert resumed.losses[step] == pytest.approx(full.losses[step], abs=1e-6)
    # another optimizer cannot take the checkpoint's state
    with pytest.raises(CheckpointError, match="training.optimizer.type .* → adamw: a resumed run goes on with the "
                                              "checkpoint's optimizer state"):
        train(_spec(tiny, "decoder", max_steps=8), resume=first.checkpoint, progress=False)


KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    import lightning as L
    from specformer import load_spec
    from specformer.training.run import train

    class Kill(L.Callback):
        # after the checkpoint of step 6 is written, die as a SIGKILL would leave it
        def on_train_batch_end(self, trainer, module, outputs, batch, idx):
            if trainer.global_step == 7:
                os.kill(os.getpid(), signal.SIGKILL)

    spec = load_spec(sys.argv[1])
    train(spec, progress=False, callbacks=[Kill()])
    """
)


def test_sigkill_mid_run_then_resume_continues_the_loss_curve(tiny: Any, tmp_path: Path, child_env: dict[str, str]) -> None:
    spec = _spec(tiny, "decoder", max_steps=9)
    (tmp_path / "spec.yaml").write_text(spec.to_yaml())
    (tmp_path / "killed.py").write_text(KILLED_RUN)
    env = child_env
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "killed.py"), str(tmp_path / "spec.yaml")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpts = list((tmp_path / "runs" / spec.name).glob("*/checkpoints/last.ckpt"))
    assert len(ckpts) == 1
    assert read_checkpoint(ckpts[0])["global_step"] == 6
    assert not list(ckpts[0].parent.glob("*.tmp"))  # no half-written file left behind

    full = LossRecorder()
    train(spec, progress=False, callbacks=[full])
    resumed = LossRecorder()
    train(spec, resume=ckpts[0], progress=False, callbacks=[resumed])
    assert sorted(resumed.losses) == [7, 8, 9]
    for step in (7, 8, 9):
        assert resumed.losses[step] == pytest.approx(full.losses[step], abs=1e-6)


def test_checkpoint_loads_with_weights_only_and_rebuilds_the_model(tiny: Any) -> None:
    spec = load_spec(tiny("decoder", max_steps=3, val_interval=3))
    result = train(spec, progress=False)
    raw = torch.load(result.checkpoint, weights_only=True)  # no arbitrary pickle execution
    meta = raw["specformer"]
    assert load_spec(meta["spec"]) == spec
    assert meta["tokenizer"] == {"type": "byte"}
    loaded = load_checkpoint(result.checkpoint)
    assert loaded.spec == spec and loaded.step == 3
    n = sum(p.numel() for p in loaded.model.parameters())
    # a notebook shows it in one line, not the module tree, the spec and every tensor
    assert repr(loaded) == (f"LoadedCheckpoint({str(result.checkpoint)!r}, spec={spec.name!r}, step=3, "
                            f"model=DecoderModel ({n:,} parameters), tokenizer=ByteTokenizer)")
    from dataclasses import replace

    assert repr(replace(loaded, tokenizer=None)).endswith(", tokenizer=None)")  # not NoneType
    ids = torch.randint(0, 256, (2, 10))
    weights = {k.removeprefix("model."): v for k, v in raw["state_dict"].items()}
    from specformer.builder import build_model

    reference = build_model(spec)
    reference.load_state_dict(weights)
    reference.eval()
    torch.testing.assert_close(loaded.model(ids).logits, reference(ids).logits)


def test_corrupt_truncated_and_foreign_checkpoints_give_clear_errors(tiny: Any, tmp_path: Path) -> None:
    spec = load_spec(tiny("decoder", max_steps=2, val_interval=2))
    good = Path(train(spec, progress=False).checkpoint)
    data = good.read_bytes()

    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"truncated.ckpt is not a specformer checkpoint: the zip archive is truncated"):
        load_checkpoint(truncated)

    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match=r"garbage.ckpt is not a specformer checkpoint: it is not a torch zip file") as info:
        load_checkpoint(garbage)
    assert "weights_only" not in str(info.value)  # never advise an unsafe load

    spec_file = tmp_path / "my-variant.yaml"
    spec_file.write_text(spec.to_yaml())
    with pytest.raises(CheckpointError, match=r"my-variant.yaml is a spec, not a checkpoint"):
        load_checkpoint(spec_file)

    import zipfile

    other_zip = tmp_path / "other.ckpt"
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("notes.txt", "hello")
    with pytest.raises(CheckpointError, match=r"a zip archive, but not one torch.save wrote"):
        load_checkpoint(other_zip)

    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        load_checkpoint(empty)

    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.ckpt")

    early = tmp_path / "stopped-early"
    early.mkdir()
    (early / "spec.yaml").write_text(spec.to_yaml())
    with pytest.raises(CheckpointError, match="is a run folder with no checkpoint: the run stopped before its first"):
        load_checkpoint(early)

    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    with pytest.raises(CheckpointError, match="not a specformer checkpoint"):
        load_checkpoint(foreign)

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, ("echo pwned",))

    unsafe = tmp_path / "unsafe.ckpt"
    torch.save({"specformer": Evil()}, unsafe)
    with pytest.raises(CheckpointError, match="could run arbitrary code|not a readable"):
        load_checkpoint(unsafe)


def _flip_inside(data: bytes, archive: Path, entry_suffix: str) -> bytes:
    """``data`` (the bytes of the zip ``archive``) with one byte flipped in the middle of
    the stored bytes of its largest entry whose name ends with ``entry_suffix``."""
    import struct
    import zipfile

    with zipfile.ZipFile(archive) as z:
        info = max((i for i in z.infolist() if i.filename.endswith(entry_suffix)), key=lambda i: i.file_size)
    header = data[info.header_offset:info.header_offset + 30]
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out)


def test_a_flipped_byte_inside_a_checkpoint_is_reported_not_loaded(tiny: Any, tmp_path: Path) -> None:
    spec = load_spec(tiny("decoder", max_steps=2, val_interval=2))
    good = Path(train(spec, progress=False).checkpoint)
    data = good.read_bytes()
    assert load_checkpoint(good).step == 2

    for suffix, entry in (("data.pkl", r"data\.pkl"), ("/data/0", r"data/0")):
        bad = tmp_path / f"flipped-{suffix.strip('/').replace('/', '-')}.ckpt"
        bad.write_bytes(_flip_inside(data, good, suffix))
        # without the check, the weights tensor loads as silently different numbers
        with pytest.raises(CheckpointError, match=rf"{bad.name} is damaged: the archive entry '[^']*{entry}' is corrupt"):
            load_checkpoint(bad)
        with pytest.raises(CheckpointError, match=rf"{bad.name} is damaged"):
            train(spec, progress=False, resume=bad)

    # archives written without checksums (torch.serialization.set_crc32_options(False)) still load
    raw = read_checkpoint(good)
    unchecked = tmp_path / "no-crc.ckpt"
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(raw, unchecked)
    finally:
        torch.serialization.set_crc32_options(True)
    assert load_checkpoint(unchecked).step == 2


def test_resuming_with_a_different_model_names_the_differences(tiny: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec(tiny("decoder", max_steps=2, val_interval=2))
    ckpt = train(spec, progress=False).checkpoint
    other = load_spec({**tiny("decoder", max_steps=4, val_interval=2), "d_model": 48})

    def no_data(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the data was prepared before the checkpoint was checked")

    monkeypatch.setattr("specformer.training.run.SpecDataModule", no_data)
    with pytest.raises(CheckpointError, match=r"different model[\s\S]*d_model: checkpoint 32, spec 48"):
        train(other, resume=ckpt, progress=False)


def test_the_folder_of_a_specs_runs_that_all_stopped_before_a_checkpoint_says_so(tmp_path: Path) -> None:
    # runs killed (SIGKILL, the OOM killer) before their first checkpoint leave their spec.yaml:
    # the folder of them was "a folder with no last.ckpt (expected a run folder or a .ckpt file)"
    for stamp in ("20250101-120000", "20250102-090000"):
        (tmp_path / "m" / stamp).mkdir(parents=True)
        (tmp_path / "m" / stamp / "spec.yaml").write_text("extends: gpt-nano\n")
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(tmp_path / "m")
    assert str(err.value) == (
        f"{tmp_path / 'm'} holds the runs of a spec, and all 2 of its runs stopped before the first checkpoint "
        "(training.checkpoint_interval), so there is nothing to load or resume from; the latest is "
        f"{tmp_path / 'm' / '20250102-090000'}"
    )


def test_the_folder_of_a_specs_runs_names_its_latest_run(tmp_path: Path) -> None:
    # runs/<spec name>/ is one level above a run folder: the message names the run to give
    for stamp in ("20250101-120000", "20250102-090000"):
        (tmp_path / "runs" / "m" / stamp / "checkpoints").mkdir(parents=True)
        (tmp_path / "runs" / "m" / stamp / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(tmp_path / "runs" / "m")
    latest = tmp_path / "runs" / "m" / "20250102-090000"
    assert str(err.value) == (f"{tmp_path / 'runs' / 'm'} holds the runs of a spec, not one run; its latest is "
                              f"{latest} (and 1 earlier): give that run folder or its checkpoints/last.ckpt")
    with pytest.raises(CheckpointError, match="is a folder with no last.ckpt"):
        read_checkpoint(tmp_path)  # no run below it either
    # eleven runs started in the same second: -11 is the latest (as strings, -9 came after -10)
    for stamp in ["20250103-080000", *(f"20250103-080000-{n}" for n in range(2, 12))]:
        (tmp_path / "runs" / "m" / stamp / "checkpoints").mkdir(parents=True)
        (tmp_path / "runs" / "m" / stamp / "checkpoints" / "last.ckpt").write_bytes(b"")
        (tmp_path / "runs" / "m" / stamp / "spec.yaml").write_text("extends: gpt-nano\n")
    with pytest.raises(CheckpointError, match=r"its latest is \S+/20250103-080000-11 \(and 12 earlier\)"):
        read_checkpoint(tmp_path / "runs" / "m")
    from specformer.specs.errors import SpecError

    with pytest.raises(SpecError, match=r"its latest is \S+/20250103-080000-11 \(and 10 earlier\)"):
        load_spec(str(tmp_path / "runs" / "m"))


def test_a_resumed_run_stopped_before_its_own_checkpoint_names_the_one_it_resumed_from(tmp_path: Path) -> None:
    # "nothing to load or resume from", while the checkpoint it had resumed from was still there
    from specformer.training.run import spec_yaml_header

    earlier = tmp_path / "runs" / "m" / "20250101-120000"
    (earlier / "checkpoints").mkdir(parents=True)
    (earlier / "checkpoints" / "last.ckpt").write_bytes(b"")
    later = tmp_path / "runs" / "m" / "20250101-130000"
    later.mkdir()
    header = spec_yaml_header("specformer train --resume runs/m/20250101-120000 --set training.max_steps=9",
                              {"specformer": "0"}, str(tmp_path))
    (later / "spec.yaml").write_text(header + "extends: gpt-nano\n")
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(later)
    assert str(err.value).endswith(f"; it was resumed from {earlier / 'checkpoints' / 'last.ckpt'}, which is still "
                                   "there: give that")
    (earlier / "checkpoints" / "last.ckpt").unlink()  # gone: nothing more is said
    with pytest.raises(CheckpointError, match=r"nothing to load or resume from$"):
        read_checkpoint(later)


def test_a_hugging_face_model_folder_given_as_a_checkpoint_says_to_import_it(tmp_path: Path) -> None:
    # `train --init-from hf_folder`, `generate hf_out` after export-hf: the folder is transformers'
    (tmp_path / "config.json").write_text('{"model_type": "llama"}', encoding="utf-8")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(tmp_path)
    assert str(err.value).startswith(f"{tmp_path} is a Hugging Face model folder (config.json), not a run: read it "
                                     f"with `specformer import-hf {tmp_path} -o spec.yaml --weights weights.safetensors`")


def test_a_refused_resume_names_every_difference_and_no_field_of_another_type() -> None:
    # a Llama-like checkpoint resumed with gpt-nano: 15 fields differ, among them the
    # positional type; the message lists 12 and names the rest, and a field only one of
    # two norm types has (layernorm's bias) is not a difference of its own
    saved = load_spec({
        "kind": "decoder", "vocab_size": 512, "d_model": 64, "max_seq_len": 128,
        "positional": {"type": "rope"}, "embedding": {"tie_output": False},
        "decoder": {"n_layers": 2, "attention": {"n_heads": 4, "n_kv_heads": 2, "bias": False},
                    "ffn": {"type": "glu"}, "norm": {"type": "rmsnorm", "eps": 1e-6}},
    })
    with pytest.raises(CheckpointError) as err:
        check_resumable({"specformer": {"spec": saved.to_dict()}}, load_spec("gpt-nano"), source="run.ckpt")
    message = str(err.value)
    listed = re.findall(r"^  (\S+): checkpoint", message, flags=re.M)
    assert len(listed) == 12
    assert "  … and 3 more: embedding.tie_output, max_seq_len, positional.type\n" in message
    assert "decoder.norm.type: checkpoint 'rmsnorm', spec 'layernorm'" in message
    assert "norm.bias" not in message and "None" not in message
    assert "decoder.ffn.d_ff: checkpoint 192, spec 512" in message  # a field both types have still counts
    assert ("resume with the spec the checkpoint was written with (training settings may change): "
            "it is in the checkpoint, and `specformer train --resume run.ckpt` with no SPEC uses it") in message
    # a model field changed on purpose (no dropout from here on) trains from the weights in a new run
    assert message.endswith("start a new run, at step 0 with a fresh optimizer: "
                            "`specformer train SPEC --init-from run.ckpt`")


def test_a_model_refused_at_resume_trains_with_init_from_as_the_refusal_says(tiny: Any) -> None:
    spec = load_spec(tiny("decoder", max_steps=2, val_interval=2))
    ckpt = train(load_spec(spec.to_dict(), ["decoder.attention.dropout=0.1"]), progress=False).checkpoint
    with pytest.raises(CheckpointError, match=r"decoder.attention.dropout: checkpoint 0.1, spec 0.0"):
        train(spec, resume=ckpt, progress=False)
    assert train(spec, init_from=ckpt, progress=False).steps == 2


def test_resuming_at_or_past_max_steps_says_nothing_is_left_to_train(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = train(load_spec(tiny("decoder", max_steps=4, val_interval=4)), progress=False).checkpoint

    def no_data(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the data was prepared before the step limit was checked")

    monkeypatch.setattr("specformer.training.run.SpecDataModule", no_data)
    for limit in (3, 4):
        with pytest.raises(CheckpointError, match=rf"at step 4 and training.max_steps is {limit}[\s\S]*max_steps="):
            train(load_spec(tiny("decoder", max_steps=limit, val_interval=4)), resume=ckpt, progress=False)


def test_resuming_a_finished_epoch_run_is_refused_and_another_batch_size_reads_on(tiny: Any, tmp_path: Path) -> None:
    from io import StringIO

    from rich.console import Console

    # 2000 examples at batch 8: a tenth of a pass is 25 steps
    spec = tiny("encoder-decoder", max_steps=None, max_epochs=0.1, val_interval=1000)
    ckpt = train(load_spec(spec), progress=False).checkpoint
    with pytest.raises(CheckpointError, match=r"at step 25 and the run's 25 steps \(training.max_epochs=0.1\) "
                                              r"are done[\s\S]*--set training.max_epochs=0.2"):
        train(load_spec(spec), resume=ckpt, progress=False)
    assert len(list((tmp_path / "runs" / "tiny-encoder-decoder").iterdir())) == 1  # no empty run left behind
    data = content_hash("synthetic", load_spec(spec).training.data.model_dump(mode="json"))  # what it was trained on
    assert read_checkpoint(ckpt)["SpecDataModule"] == {"step": 25, "items": 200, "data": data}

    class FirstItems(L.Callback):
        def on_train_start(self, trainer: L.Trainer, module: Any) -> None:
            sampler = trainer.train_dataloader.batch_sampler
            self.items = [i for _, i in sampler.batch(sampler.start)]

    # another batch size reads on from item 200, where the checkpoint stopped
    out, first = StringIO(), FirstItems()
    smaller = load_spec({**spec, "training": {**spec["training"], "batch_size": 4, "max_epochs": 0.2}})
    result = train(smaller, resume=ckpt, progress=False, console=Console(file=out, width=300), callbacks=[first])
    assert result.steps == 25 + 50  # 0.2 of 2000 examples: 400, of which 200 were read in batches of 8
    assert first.items == [i for _, i in StreamBatchSampler(2000, 4, seed=smaller.training.seed).batch(50)]
    assert "changed since the checkpoint" not in out.getvalue()
    assert read_checkpoint(result.checkpoint)["SpecDataModule"] == {
        "step": result.steps, "items": 200 + 4 * (result.steps - 25), "data": data
    }

    # a checkpoint that does not record its position in items (an older one): the run warns
    legacy = tmp_path / "legacy.ckpt"
    raw = read_checkpoint(ckpt)
    del raw["SpecDataModule"]
    torch.save(raw, legacy)
    out = StringIO()
    train(smaller, resume=legacy, progress=False, console=Console(file=out, width=300))
    assert "training.batch_size 8 → 4 changed since the checkpoint" in out.getvalue()


def test_resuming_on_data_that_changed_since_the_checkpoint_says_so(tiny: Any, tmp_path: Path) -> None:
    from io import StringIO

    from rich.console import Console

    folder = tmp_path / "data"
    folder.mkdir()
    for path in (Path(sysconfig.get_paths()["stdlib"]) / "json").glob("*.py"):
        shutil.copy(path, folder)
    spec = tiny("decoder", max_steps=4, val_interval=4, val_batches=1, data={"type": "files", "paths": [str(folder)]})
    ckpt = train(load_spec(spec), progress=False).checkpoint
    longer = load_spec({**spec, "training": {**spec["training"], "max_steps": 6}})

    def resume() -> str:
        out = StringIO()
        train(longer, resume=ckpt, progress=False, console=Console(file=out, width=400))
        return out.getvalue()

    assert "warning" not in resume()  # the same files: nothing to say
    edited = folder / "encoder.py"
    stat = edited.stat()
    edited.write_text(edited.read_text().replace("def ", "def  "))
    os.utime(edited, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same modification time, other content
    assert f"warning: the training data differs from the data {ckpt} was trained on (a file edited" in resume()


def test_resuming_with_another_seq_len_says_the_data_position_points_at_other_text(tiny: Any) -> None:
    from io import StringIO

    from rich.console import Console

    spec = tiny("decoder", max_steps=2, val_interval=2, val_batches=1)
    ckpt = train(load_spec(spec), progress=False).checkpoint

    def resume(**changes: Any) -> str:
        out = StringIO()
        longer = load_spec({**spec, "training": {**spec["training"], "max_steps": 3, **changes}})
        train(longer, resume=ckpt, progress=False, console=Console(file=out, width=400))
        return out.getvalue()

    assert "warning" not in resume(batch_size=4)  # read on from the same sequence, in smaller batches
    assert ("warning: training.seq_len 32 → 16: the data position is a count of sequences, so this run reads on "
            "from the same count in the text cut into sequences of the new length") in resume(seq_len=16)
    reseeded = resume(seed=7)
    assert ("warning: training.seed 0 → 7: the seed orders each pass over the data, so this run reads on from the "
            "same count of examples in another order") in reseeded and "training.seq_len" not in reseeded
    # (a synthetic task's or pairs' examples are the same ones whatever the length they are cut to)
    task = tiny("encoder-decoder", max_steps=2, val_interval=2)
    task_ckpt = train(load_spec(task), progress=False).checkpoint
    out = StringIO()
    train(load_spec({**task, "training": {**task["training"], "max_steps": 3, "seq_len": 16}}), resume=task_ckpt,
          progress=False, console=Console(file=out, width=400))
    assert "warning" not in out.getvalue()


def test_a_failed_write_leaves_the_previous_checkpoint_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"specformer": {"spec": {}}, "global_step": 1}, path)

    def crash(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"global_step": 2}, path)
    monkeypatch.undo()
    assert read_checkpoint(path)["global_step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_ctrl_c_inside_a_checkpoint_write_is_a_ctrl_c_and_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGINT that lands in one of the file writes ``torch.save`` calls back into Python
    came out of its C++ writer as ``RuntimeError: unexpected pos``: the run said "error:
    RuntimeError" and exited 1 instead of 130 (and sometimes left the temporary file)."""
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1, "w": torch.zeros(10)}, path)
    real = torch.save

    class Pressed:
        """The file, and Ctrl-C at its third write."""

        def __init__(self, f: Any) -> None:
            self.f, self.writes = f, 0

        def write(self, data: Any) -> int:
            self.writes += 1
            if self.writes == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return self.f.write(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: real(obj, Pressed(f), *a, **k))
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 2, "w": torch.ones(100_000), "more": [torch.ones(9)] * 20}, path)
    monkeypatch.undo()
    assert read_checkpoint(path)["global_step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_just_after_a_checkpoint_is_written_still_notes_it(tmp_path: Path) -> None:
    """A Ctrl-C between last.ckpt's rename and the callback's note of it left a new
    checkpoint on disk while the run's message named the one before it."""
    from types import SimpleNamespace

    from specformer.training.callbacks import PeriodicCheckpoint

    periodic = PeriodicCheckpoint(tmp_path, every=2)
    periodic._check_finite = lambda trainer: None  # type: ignore[method-assign]
    # the write is done; the Ctrl-C lands before the callback notes it
    periodic._write = lambda trainer, path: os.kill(os.getpid(), signal.SIGINT)  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        periodic._save(SimpleNamespace(global_step=4))
    assert (periodic.last_path, periodic.last_step) == (tmp_path / "last.ckpt", 4)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_during_a_runs_checkpoint_write_keeps_the_checkpoint_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C while a run's checkpoint was written waited for the write, then threw the
    whole file away: the run lost the steps since its previous checkpoint (and, before the
    first one, said the stop had cut a validation short). The file is kept and named."""
    from types import SimpleNamespace

    from specformer.training.callbacks import PeriodicCheckpoint
    from specformer.training.checkpoint import write_checkpoint

    write_checkpoint({"global_step": 2}, tmp_path / "last.ckpt")
    real = torch.save

    def pressed_midway(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        write = f.write

        def once(data: Any) -> int:
            os.kill(os.getpid(), signal.SIGINT)
            f.write = write
            return write(data)

        f.write = once
        real(obj, f, *args, **kwargs)

    periodic = PeriodicCheckpoint(tmp_path, every=2)
    periodic._check_finite = lambda trainer: None  # type: ignore[method-assign]
    periodic._write = lambda trainer, path: write_checkpoint(  # type: ignore[method-assign]
        {"global_step": trainer.global_step, "w": torch.ones(1000)}, path)
    monkeypatch.setattr(torch, "save", pressed_midway)
    with pytest.raises(KeyboardInterrupt):
        periodic._save(SimpleNamespace(global_step=4))
    monkeypatch.undo()
    assert (periodic.last_path, periodic.last_step) == (tmp_path / "last.ckpt", 4)
    assert read_checkpoint(tmp_path / "last.ckpt")["global_step"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _FullDisk:
    """``torch.save`` onto a disk that fills up after ``room`` bytes (the first ``saves`` writes fit)."""

    def __init__(self, room: int, saves: int = 0) -> None:
        self.room, self.saves, self.save = room, saves, torch.save

    def __call__(self, obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if self.saves > 0:
            self.saves -= 1
            return self.save(obj, f, *args, **kwargs)
        room, write = self.room, f.write

        def full(data: Any) -> int:
            nonlocal room
            room -= len(data)
            if room < 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return write(data)

        f.write = full
        self.save(obj, f, *args, **kwargs)


def test_a_full_disk_is_named_with_the_file_not_torchs_zip_writer_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.ckpt"
    monkeypatch.setattr(torch, "save", _FullDisk(room=100))
    # torch.save itself reports it as "[enforce fail at inline_container.cc] unexpected pos"
    with pytest.raises(OSError, match="No space left on device") as caught:
        AtomicCheckpointIO().save_checkpoint({"global_step": 1, "w": torch.zeros(1000)}, path)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_the_disk_has_no_room_for_says_which_one_to_resume_from(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_spec(tiny("decoder", max_steps=6, val_interval=2, val_batches=1))
    monkeypatch.setattr(torch, "save", _FullDisk(room=1000, saves=1))  # the step-2 checkpoint fits
    with pytest.raises(CheckpointError) as caught:
        train(spec, progress=False)
    message = str(caught.value)
    folder = next((Path(spec.training.out_dir) / "tiny-decoder").iterdir()) / "checkpoints"
    assert message == (
        f"{folder / 'last.ckpt'}: cannot write the checkpoint of step 4 (No space left on device); nothing was "
        f"half-written, and the checkpoint of step 2 ({folder / 'last.ckpt'}) is intact: resume from it"
    )
    monkeypatch.undo()
    assert [p.name for p in folder.iterdir()] == ["last.ckpt"]
    assert read_checkpoint(folder / "last.ckpt")["global_step"] == 2


def test_a_killed_checkpoint_writes_temporary_file_is_removed_on_resume(tiny: Any) -> None:
    from specformer.data.cache import locked

    first = train(load_spec(tiny("decoder", max_steps=2, val_interval=2, val_batches=1)), progress=False)
    folder = Path(first.checkpoint).parent
    # what a checkpoint write killed by SIGKILL (the OOM killer, a scheduler) leaves: as large as a checkpoint
    stale = folder / ".last.ckpt.0123456789abcdef.tmp"
    stale.write_bytes(b"PK\x03\x04" + bytes(4096))
    others = [".notes.tmp", "last.ckpt.0123456789abcdef.tmp", ".last.ckpt.0123.tmp", ".last.ckpt.0123456789abcdef"]
    for name in others:  # not the pattern of a checkpoint's temporary file: not ours to remove
        (folder / name).write_text("kept")
    spec = load_spec(tiny("decoder", max_steps=3, val_interval=3, val_batches=1))
    resumed = train(spec, resume=first.checkpoint, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["last.ckpt", *others])
    assert read_checkpoint(resumed.checkpoint)["global_step"] == 3
    # while a live process writes a checkpoint there (the first run going on), its file stays
    stale.write_bytes(b"PK\x03\x04" + bytes(4096))
    with locked(folder, shared=True):
        train(spec, resume=first.checkpoint, progress=False)
    assert stale.exists()


def test_a_checkpoint_being_written_is_not_taken_for_a_killed_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # another run resuming from this folder cleans up while this one writes: the write survives it
    from specformer.training.checkpoint import remove_stale_temporaries

    save, removed = torch.save, []

    def save_while_another_run_cleans_up(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"PK\x03\x04")
        f.flush()
        removed.append(remove_stale_temporaries(tmp_path))
        f.seek(0)
        save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_while_another_run_cleans_up)
    AtomicCheckpointIO().save_checkpoint({"global_step": 7}, tmp_path / "last.ckpt")
    monkeypatch.undo()
    assert removed == [0] and read_checkpoint(tmp_path / "last.ckpt")["global_step"] == 7
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # the lock leaves no file
    (tmp_path / ".last.ckpt.0123456789abcdef.tmp").write_bytes(bytes(100))  # once no one writes: removed
    assert remove_stale_temporaries(tmp_path) == 100 and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def _nan_weights(module: Any) -> None:
    with torch.no_grad():
        next(module.parameters()).fill_(float("nan"))


class NanBefore(L.Callback):
    """NaN weights (as a too-high learning rate leaves a model) before the batch of step ``step``
    (1 = the first step), whose loss is then NaN."""

    def __init__(self, step: int) -> None:
        self.step, self.batches = step, 0

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, *args: Any) -> None:
        self.batches += 1
        if trainer.global_step == self.step - 1:
            _nan_weights(module)


def test_a_diverged_run_stops_at_its_first_nan_loss_and_says_the_last_finite_one(tiny: Any) -> None:
    # before, the run trained on to its next checkpoint (step 9) and said only that the weights held NaN
    losses, nan = LossRecorder(), NanBefore(3)
    spec = load_spec(tiny("decoder", max_steps=20, checkpoint_interval=9, grad_clip=0))
    with pytest.raises(CheckpointError) as caught:
        train(spec, progress=False, callbacks=[losses, nan])
    assert nan.batches == 3  # no step past the first NaN loss
    assert re.fullmatch(
        rf"training diverged: the training loss is nan at step 3 \(the last finite one was {losses.losses[2]:.4g}, at "
        r"step 2\), so the run stops there and writes no checkpoint of NaN weights; this run has written no "
        r"checkpoint yet: train again with a lower training.optimizer.lr, more training.schedule.warmup_steps or a "
        r"training.grad_clip \(e.g. 1.0\)", str(caught.value)), str(caught.value)
    run = next((Path(spec.training.out_dir) / "tiny-decoder").iterdir(), None)
    assert run is None or not list((run / "checkpoints").glob("*.ckpt"))


def test_a_diverged_run_stops_before_its_nan_weights_replace_the_last_good_checkpoint(tiny: Any) -> None:
    spec = _spec(tiny, "decoder", max_steps=9)  # checkpoints every 3 steps; grad_clip 1.0
    with pytest.raises(CheckpointError) as caught:
        train(spec, progress=False, callbacks=[NanBefore(6)])
    ckpt = next((Path(spec.training.out_dir) / "tiny-decoder").iterdir()) / "checkpoints" / "last.ckpt"
    assert re.fullmatch(
        r"training diverged: the training loss is nan at step 6 \(the last finite one was [\d.]+, at step 5\), so "
        rf"the run stops there and writes no checkpoint of NaN weights; the checkpoint of step 3 \({re.escape(str(ckpt))}\) "
        r"is intact: resume from it with a lower training.optimizer.lr, more training.schedule.warmup_steps or a "
        r"lower training.grad_clip \(it is 1\)", str(caught.value)), str(caught.value)
    kept = load_checkpoint(ckpt)
    assert kept.step == 3 and all(torch.isfinite(w).all() for w in kept.model.state_dict().values())

    # weights made NaN after the loss of a checkpoint's step: the checkpoint still refuses them
    class NanAfterBackward(L.Callback):
        def on_after_backward(self, trainer: L.Trainer, module: Any) -> None:
            if trainer.global_step == 5:  # in step 6
                _nan_weights(module)

    with pytest.raises(CheckpointError) as caught:
        train(spec, progress=False, callbacks=[NanAfterBackward()])
    assert re.search(
        r"training diverged: the model's weights hold NaN or infinite values at step 6 \(the training loss is "
        r"[\d.]+\), so its checkpoint is not written over the last good one; the checkpoint of step 3 \(.*\) is "
        r"intact: resume from it with a lower training.optimizer.lr, more training.schedule.warmup_steps or a "
        r"lower training.grad_clip \(it is 1\)$", str(caught.value)), str(caught.value)

    # diverged at the first step: no finite loss, nothing to resume from, said as a failed write says it
    with pytest.raises(CheckpointError) as caught:
        train(_spec(tiny, "decoder", max_steps=3), progress=False, callbacks=[NanBefore(1)])
    assert str(caught.value).startswith("training diverged: the training loss is nan at step 1 (the first step of "
                                        "this run), so the run stops there"), str(caught.value)
    assert str(caught.value).endswith(
        "this run has written no checkpoint yet: train again with a lower training.optimizer.lr, more "
        "training.schedule.warmup_steps or a lower training.grad_clip (it is 1)"), str(caught.value)


def test_a_diverged_run_whose_first_loss_was_far_above_a_uniform_guess_points_at_the_init(tiny: Any) -> None:
    import math

    data = tiny("decoder", max_steps=10)
    data["init"] = {"std": 20.0}  # logits hundreds of nats apart: the first loss is far above ln(300)
    losses = LossRecorder()
    with pytest.raises(CheckpointError) as caught:
        train(load_spec(data), progress=False, callbacks=[losses, NanBefore(3)])
    assert losses.losses[1] > 2 * math.log(300)
    assert str(caught.value).endswith(
        f"; its first loss, {losses.losses[1]:.4g}, was over twice ln(vocab_size) = 5.7 (a uniform guess's): the "
        "initial weights are the likely cause, see init.std and init.scheme"), str(caught.value)
    # a first loss near ln(vocab_size): no such note
    with pytest.raises(CheckpointError) as caught:
        train(load_spec(tiny("decoder", max_steps=10)), progress=False, callbacks=[NanBefore(3)])
    assert "init.std" not in str(caught.value)


def test_a_step_with_no_labels_adds_nothing_to_the_loss_and_logs_no_nan() -> None:
    from specformer.builder.lightning import SpecModule

    module = SpecModule(load_spec("gpt-nano"))
    ids = torch.randint(0, 100, (2, 16))
    none = {"input_ids": ids, "labels": torch.full((2, 16), -100)}
    some = {"input_ids": ids, "labels": torch.where(torch.arange(16) < 8, -100, ids)}
    returned = module.training_step(none, 0)  # a micro-batch whose prompts fill the window
    assert float(returned.detach()) == 0.0 and module.step_loss is None and not module.recent_losses
    returned.backward()  # its backward reaches the weights with zero gradients, not NaN
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)
    module.training_step(some, 1)  # the same step's next micro-batch (no trainer: one step)
    alone = SpecModule(load_spec("gpt-nano"))
    alone.model.load_state_dict(module.model.state_dict())
    alone.training_step(some, 0)
    # the step's loss is that of the micro-batch with labels alone: the other added 0, not NaN x 0
    assert module.step_loss == pytest.approx(alone.step_loss)
    assert len(module.recent_losses) == 1 and float(module.recent_losses[0]) == pytest.approx(alone.step_loss)


def test_a_resumed_run_that_diverges_before_its_first_checkpoint_names_the_one_it_resumed_from(tiny: Any) -> None:
    first = train(_spec(tiny, "decoder", max_steps=3), progress=False)  # checkpoints every 3 steps
    assert first.checkpoint and read_checkpoint(first.checkpoint)["global_step"] == 3
    with pytest.raises(CheckpointError) as caught:
        train(_spec(tiny, "decoder", max_steps=9), resume=first.checkpoint, progress=False, callbacks=[NanBefore(5)])
    assert re.search(
        r"at step 5 \(the last finite one was [\d.]+, at step 4\), so the run stops there and writes no checkpoint "
        rf"of NaN weights; the checkpoint of step 3 \({re.escape(str(first.checkpoint))}\) is intact: resume from it "
        r"with a lower training.optimizer.lr, more training.schedule.warmup_steps or a lower training.grad_clip "
        r"\(it is 1\)$", str(caught.value)), str(caught.value)
    assert load_checkpoint(first.checkpoint).step == 3


def test_a_checkpoint_gets_the_permissions_torch_save_would_give(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        AtomicCheckpointIO().save_checkpoint({"global_step": 1}, tmp_path / "last.ckpt")
        torch.save({"global_step": 1}, tmp_path / "plain.ckpt")
    finally:
        os.umask(previous)
    mode = (tmp_path / "last.ckpt").stat().st_mode & 0o777
    assert mode == (tmp_path / "plain.ckpt").stat().st_mode & 0o777 == 0o644  # readable by others, not private


def test_a_resumed_run_may_train_longer_on_the_new_schedule(tiny: Any) -> None:
    first = train(load_spec(tiny("decoder", max_steps=4, val_interval=4, schedule={"type": "linear"})), progress=False)
    longer = load_spec(tiny("decoder", max_steps=8, val_interval=8, schedule={"type": "linear"}))
    seen: dict[int, float] = {}

    class Lr(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, idx: int) -> None:
            seen[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]

    train(longer, resume=first.checkpoint, progress=False, callbacks=[Lr()])
    # linear decay over 8 steps to 0 at step 8 (one past the last, as transformers' schedule), not
    # over the first run's 4: step 4 runs at 4/8 of the peak, the last step (7) at 1/8
    assert seen[4] == pytest.approx(3e-3 * 4 / 8)
    assert seen[7] == pytest.approx(3e-3 * 1 / 8)


def test_a_resumed_run_takes_this_specs_optimizer_settings(tiny: Any) -> None:
    # Lightning restores the saved groups' hyperparameters with the moments: the new
    # spec's lr, betas, eps and weight decay must win, and inverse_sqrt stays its formula
    first = train(load_spec(tiny("decoder", max_steps=4, val_interval=4)), progress=False)
    changed = {"type": "adamw", "lr": 5e-4, "betas": [0.5, 0.6], "eps": 1e-6, "weight_decay": 0.5}
    seen: dict[int, list[dict[str, Any]]] = {}

    class Groups(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, idx: int) -> None:
            seen[trainer.global_step] = [dict(g, params=None) for g in trainer.optimizers[0].param_groups]

    train(load_spec(tiny("decoder", max_steps=6, val_interval=6, optimizer=changed)),
          resume=first.checkpoint, progress=False, callbacks=[Groups()])
    for group in seen[4]:
        assert group["lr"] == pytest.approx(5e-4) and group["initial_lr"] == pytest.approx(5e-4)
        assert group["betas"] == (0.5, 0.6) and group["eps"] == 1e-6
    assert {g["weight_decay"] for g in seen[4]} <= {0.5, 0.0} and 0.5 in {g["weight_decay"] for g in seen[4]}

    sqrt = {"type": "inverse_sqrt", "warmup_steps": 2}
    base = train(load_spec(tiny("decoder", max_steps=4, val_interval=4, schedule=sqrt)), progress=False)
    seen.clear()
    train(load_spec(tiny("decoder", max_steps=6, val_interval=6, schedule=sqrt, optimizer=changed)),
          resume=base.checkpoint, progress=False, callbacks=[Groups()])
    fresh: dict[int, list[dict[str, Any]]] = {}
    seen, kept = fresh, seen
    train(load_spec(tiny("decoder", max_steps=6, val_interval=6, schedule=sqrt, optimizer=changed)),
          progress=False, callbacks=[Groups()])
    # inverse_sqrt sets the rate from d_model and the step alone: resumed = uninterrupted
    assert kept[4][0]["lr"] == pytest.approx(fresh[4][0]["lr"])


class InterruptAt(L.Callback):
    """Ctrl-C as Lightning meets it: a KeyboardInterrupt in the middle of training."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, idx: int) -> None:
        if trainer.global_step == self.step:
            raise KeyboardInterrupt


def _metrics(run_dir: str, column: str) -> dict[int, float]:
    with open(Path(run_dir) / "metrics.csv") as f:
        return {int(r["step"]): float(r[column]) for r in csv.DictReader(f) if r.get(column)}


def test_an_interrupted_and_resumed_run_reports_what_an_uninterrupted_run_does(tiny: Any) -> None:
    data = tiny("decoder", max_steps=9, val_interval=3, checkpoint_interval=3, log_interval=1)
    data["embedding"] = {"dropout": 0.1}
    spec = load_spec(data)
    full = train(spec, progress=False)
    with pytest.raises(TrainingInterrupted) as info:
        train(spec, progress=False, callbacks=[InterruptAt(7)])
    stopped = info.value
    assert isinstance(stopped, KeyboardInterrupt)  # code that stops on Ctrl-C still does
    assert (stopped.step, stopped.checkpoint_step) == (7, 6)
    assert stopped.checkpoint is not None and read_checkpoint(stopped.checkpoint)["global_step"] == 6
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Lightning's SIG_IGN is undone

    resumed = train(spec, resume=stopped.checkpoint, progress=False)
    expected = json.loads((Path(full.run_dir) / "summary.json").read_text())
    got = json.loads((Path(resumed.run_dir) / "summary.json").read_text())
    assert [h["step"] for h in expected["history"]] == [3, 6, 9]
    assert got["history"] == expected["history"]  # the validation at step 6 included
    assert got["train_loss"] == expected["train_loss"]  # the mean over the same steps
    assert got["steps"] == expected["steps"] == 9

    # metrics.csv numbers steps as summary.json does: validation after 3 steps is step 3
    assert sorted(_metrics(full.run_dir, "val/loss")) == [3, 6, 9]
    assert _metrics(full.run_dir, "val/loss") == pytest.approx({h["step"]: h["val/loss"] for h in expected["history"]})
    assert sorted(_metrics(full.run_dir, "train/loss")) == list(range(1, 10))
    assert _metrics(resumed.run_dir, "train/loss") == {k: v for k, v in _metrics(full.run_dir, "train/loss").items() if k > 6}
    assert sorted(_metrics(resumed.run_dir, "val/loss")) == [9]


class SigtermAt(L.Callback):
    """``kill PID`` at a given point: after a training batch (micro-batch ``batch``, counted
    from the run's start) or, with ``in_validation``, after the first validation batch."""

    def __init__(self, batch: int, *, in_validation: bool = False) -> None:
        self.batch, self.in_validation, self.seen = batch, in_validation, 0

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.seen += 1
        if self.seen == self.batch and not self.in_validation:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if self.in_validation and self.seen == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_the_step_reached_and_the_run_resumes_exactly(tiny: Any) -> None:
    # preemption (SLURM, a cloud spot instance, docker stop, timeout) sends SIGTERM: the run
    # stops at the end of the step under way, with a checkpoint of that step, not of step 3
    spec = _spec(tiny, "decoder", max_steps=9)
    full = LossRecorder()
    train(spec, progress=False, callbacks=[full])
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as info:
        train(spec, progress=False, callbacks=[SigtermAt(5)])
    stopped = info.value
    assert stopped.signum == signal.SIGTERM and stopped.exit_status == 143
    assert (stopped.step, stopped.checkpoint_step) == (5, 5) and not stopped.finished
    assert str(stopped).startswith("stopped by SIGTERM at step 5; the last checkpoint (step 5) is ")
    assert stopped.checkpoint is not None and read_checkpoint(stopped.checkpoint)["global_step"] == 5
    assert signal.getsignal(signal.SIGTERM) is before  # Lightning's handler is gone again

    resumed = LossRecorder()
    result = train(spec, resume=stopped.checkpoint, progress=False, callbacks=[resumed])
    assert sorted(resumed.losses) == [6, 7, 8, 9] and result.steps == 9
    for step in (6, 7, 8, 9):
        assert resumed.losses[step] == pytest.approx(full.losses[step], abs=1e-6), (step, resumed.losses, full.losses)
    # SIGTERM in the last batch of a validation (val_interval=4): the validation ends, and is in
    # the history of the checkpoint written after it
    with pytest.raises(TrainingInterrupted) as info:
        train(load_spec({**spec.to_dict(), "training": {**spec.to_dict()["training"], "val_batches": 1}}),
              progress=False, callbacks=[SigtermAt(4, in_validation=True)])
    assert info.value.checkpoint_step == 4
    assert [h["step"] for h in read_checkpoint(info.value.checkpoint)["specformer"]["val_history"]] == [4]


def test_sigterm_where_no_step_ended_keeps_the_last_checkpoint(tiny: Any) -> None:
    # between the micro-batches of a step, or inside a validation, the state is not a step's:
    # the run stops and names the last checkpoint, as Ctrl-C does
    spec = _spec(tiny, "decoder", max_steps=9, accumulate=2)
    with pytest.raises(TrainingInterrupted) as info:
        train(spec, progress=False, callbacks=[SigtermAt(9)])  # the first micro-batch of step 5
    assert (info.value.signum, info.value.step, info.value.checkpoint_step) == (signal.SIGTERM, 4, 3)
    assert read_checkpoint(info.value.checkpoint)["global_step"] == 3
    spec = _spec(tiny, "decoder", max_steps=9, val_batches=3)
    with pytest.raises(TrainingInterrupted) as info:
        train(spec, progress=False, callbacks=[SigtermAt(4, in_validation=True)])
    assert (info.value.step, info.value.checkpoint_step) == (4, 3)


def test_ctrl_c_while_a_sigterm_stops_the_run_still_says_where_it_stopped(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from io import StringIO

    from rich.console import Console

    # Ctrl-C while the checkpoint of a SIGTERM is written: that write is dropped (its temporary
    # file removed), the run stops as SIGTERM said, naming the checkpoint that is still whole
    save, out = torch.save, StringIO()

    def ctrl_c_in_the_second_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if obj["global_step"] == 5:
            f.write(b"PK\x03\x04")
            raise KeyboardInterrupt
        save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", ctrl_c_in_the_second_save)
    with pytest.raises(TrainingInterrupted) as info:
        train(_spec(tiny, "decoder", max_steps=9), progress=False, callbacks=[SigtermAt(5)],
              console=Console(file=out, width=400))
    assert (info.value.signum, info.value.step, info.value.checkpoint_step) == (signal.SIGTERM, 5, 3)
    assert "the checkpoint of step 5 was cut off by Ctrl-C while it was written; the checkpoint of step 3 is " \
           "intact" in out.getvalue()
    assert [p.name for p in Path(info.value.checkpoint).parent.iterdir()] == ["last.ckpt"]

    # and Ctrl-C while Lightning tears down a stopped run: not "before training started"
    class CtrlCInTeardown(L.Callback):
        def on_exception(self, trainer: L.Trainer, module: Any, exception: BaseException) -> None:
            raise KeyboardInterrupt

    monkeypatch.undo()
    with pytest.raises(TrainingInterrupted) as info:
        train(_spec(tiny, "decoder", max_steps=9), progress=False, callbacks=[SigtermAt(5), CtrlCInTeardown()])
    assert (info.value.signum, info.value.step, info.value.checkpoint_step) == (signal.SIGINT, 5, 5)


def test_ctrl_c_while_a_resumed_runs_first_sigterm_checkpoint_is_written_names_the_one_it_resumed_from(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from io import StringIO

    from rich.console import Console

    first = train(_spec(tiny, "decoder", max_steps=3), progress=False)
    save, out = torch.save, StringIO()

    def ctrl_c_in_the_save_of_step_5(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if obj["global_step"] == 5:
            f.write(b"PK\x03\x04")
            raise KeyboardInterrupt
        save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", ctrl_c_in_the_save_of_step_5)
    with pytest.raises(TrainingInterrupted) as info:  # SIGTERM at step 5, between validation (4) and checkpoint (6)
        train(_spec(tiny, "decoder", max_steps=9), resume=first.checkpoint, progress=False,
              callbacks=[SigtermAt(2)], console=Console(file=out, width=400))
    assert (info.value.step, info.value.checkpoint, info.value.checkpoint_step) == (5, first.checkpoint, 3)
    assert "the checkpoint of step 5 was cut off by Ctrl-C while it was written; the checkpoint of step 3 is " \
           "intact" in out.getvalue(), out.getvalue()
    assert str(info.value).endswith(f"at step 5; the last checkpoint (step 3) is {first.checkpoint}")


def test_a_sigterm_checkpoint_the_disk_has_no_room_for_is_said(tiny: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    monkeypatch.setattr(torch, "save", _FullDisk(room=1000, saves=1))  # the step-3 checkpoint fits
    with pytest.raises(TrainingInterrupted) as info:
        train(_spec(tiny, "decoder", max_steps=9), progress=False, callbacks=[SigtermAt(5)],
              console=Console(file=out, width=400))
    assert (info.value.signum, info.value.step, info.value.checkpoint_step) == (signal.SIGTERM, 5, 3)
    assert "cannot write the checkpoint of step 5 (No space left on device)" in out.getvalue()
    assert read_checkpoint(info.value.checkpoint)["global_step"] == 3


class FirstWeights(L.Callback):
    """The model's weights when training starts, and the step it starts at."""

    def on_train_start(self, trainer: L.Trainer, module: Any) -> None:
        self.step = trainer.global_step
        self.weights = {k: v.detach().clone() for k, v in module.model.state_dict().items()}


def test_init_from_a_checkpoint_starts_a_new_run_from_its_weights(tiny: Any) -> None:
    first = train(load_spec(tiny("decoder", max_steps=3, val_interval=3)), progress=False)
    seen = FirstWeights()
    second = train(load_spec(tiny("decoder", max_steps=2, val_interval=2)), init_from=first.checkpoint,
                   progress=False, callbacks=[seen])
    trained = load_checkpoint(first.checkpoint).model.state_dict()
    assert seen.step == 0 and second.steps == 2  # a new run: step 0, its own max_steps
    assert seen.weights.keys() == trained.keys()
    assert all(torch.equal(seen.weights[k], trained[k]) for k in trained)

    # weights of another model are reported as weights, before the checkpoint's tokenizer is
    # tried on the spec (its 300 tokens would not fit a 280-token model either)
    bpe = train(load_spec(tiny("decoder", max_steps=1, val_interval=1, tokenizer={"type": "bpe", "vocab_size": 300})),
                progress=False)
    smaller = {**tiny("decoder", max_steps=2, val_interval=2), "vocab_size": 280}
    with pytest.raises(CheckpointError, match=r"the weights do not fit the model[\s\S]*embed.tokens.weight: "
                                              r"checkpoint \(300, 32\), model \(280, 32\)"):
        train(load_spec(smaller), init_from=bpe.checkpoint, progress=False)


def test_init_from_a_checkpoint_tokenizes_the_new_data_with_the_checkpoints_tokenizer(
    tiny: Any, tmp_path: Path
) -> None:
    # the weights fit the ids of the tokenizer they were trained with: fine-tuning on other
    # text must not train a new BPE (whose ids would mean other strings)
    (tmp_path / "a.txt").write_text("def add(a, b):\n    return a + b\n" * 400)
    (tmp_path / "b.txt").write_text("zebra quartz jumps over the wavy fjord, quickly\n" * 400)
    bpe = {"type": "bpe", "vocab_size": 300}
    first = train(load_spec(tiny("decoder", max_steps=1, val_interval=1, tokenizer=bpe,
                                 data={"type": "files", "paths": [str(tmp_path / "a.txt")]})), progress=False)
    other = {"type": "files", "paths": [str(tmp_path / "b.txt")]}
    second = train(load_spec(tiny("decoder", max_steps=1, val_interval=1, tokenizer=bpe, data=other)),
                   init_from=first.checkpoint, progress=False)
    fresh = train(load_spec(tiny("decoder", max_steps=1, val_interval=1, tokenizer=bpe, data=other)), progress=False)
    text = "def zebra(a, b): return a + b"
    ids = load_checkpoint(first.checkpoint).tokenizer.encode(text)
    assert load_checkpoint(second.checkpoint).tokenizer.encode(text) == ids
    assert load_checkpoint(fresh.checkpoint).tokenizer.encode(text) != ids  # the test can tell them apart


def test_a_tokenizer_setting_the_checkpoint_overrides_is_reported_and_not_recorded(tiny: Any) -> None:
    # the run reads the data with the checkpoint's tokenizer, so its spec.yaml (and its
    # checkpoint's spec) must say so, and a different setting asked for is pointed out
    from io import StringIO

    from rich.console import Console

    bpe = {"type": "bpe", "vocab_size": 300}
    first = train(load_spec(tiny("decoder", max_steps=1, val_interval=1, tokenizer=bpe)), progress=False)
    out = StringIO()
    second = train(load_spec(tiny("decoder", max_steps=1, val_interval=1, tokenizer={"type": "byte"})),
                   init_from=first.checkpoint, progress=False, console=Console(file=out, width=300))
    assert "training.tokenizer (type=byte) is not used" in out.getvalue()
    recorded = load_spec(str(Path(second.run_dir) / "spec.yaml"))
    assert recorded.training.tokenizer.type == "bpe" and recorded.training.tokenizer.vocab_size == 300
    assert load_checkpoint(second.checkpoint).spec.training.tokenizer.type == "bpe"
    # the same settings: nothing to say
    out = StringIO()
    train(load_spec(tiny("decoder", max_steps=1, val_interval=1, tokenizer=bpe)), init_from=first.checkpoint,
          progress=False, console=Console(file=out, width=300))
    assert "not used" not in out.getvalue()


def test_init_from_safetensors_loads_them_and_refuses_weights_that_do_not_fit(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import save_file

    from specformer.builder import build_model

    spec = load_spec(tiny("decoder", max_steps=1, val_interval=1))
    torch.manual_seed(123)
    source = build_model(spec).state_dict()
    save_file({k: v.contiguous() for k, v in source.items()}, tmp_path / "w.safetensors")
    seen = FirstWeights()
    train(spec, init_from=tmp_path / "w.safetensors", progress=False, callbacks=[seen])
    assert all(torch.equal(seen.weights[k], source[k]) for k in source)

    wider = load_spec({**tiny("decoder", max_steps=1, val_interval=1), "d_model": 48})

    def no_data(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the data was prepared before the weights were checked")

    monkeypatch.setattr("specformer.training.run.SpecDataModule", no_data)
    with pytest.raises(CheckpointError, match=r"w.safetensors: the weights do not fit the model[\s\S]*different shapes"):
        train(wider, init_from=tmp_path / "w.safetensors", progress=False)
    (tmp_path / "bad.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        train(spec, init_from=tmp_path / "bad.safetensors", progress=False)
    with pytest.raises(ValueError, match="resume or init_from, not both"):
        train(spec, init_from=tmp_path / "w.safetensors", resume=tmp_path / "w.safetensors", progress=False)


def test_resume_from_a_safetensors_file_says_it_holds_weights_only(tmp_path: Path) -> None:
    # import-hf --weights wrote it: no step or optimizer to continue, which --init-from starts anew;
    # it used to be "not a torch zip file (truncated or not a checkpoint)", as if damaged
    from safetensors.torch import save_file
    from typer.testing import CliRunner

    from specformer.builder import build_model
    from specformer.cli import app

    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in build_model(load_spec("gpt-nano")).state_dict().items()}, weights)
    expected = (f"{weights} holds weights only, not a checkpoint of a run (no step, optimizer or spec to continue): "
                f"start a new run from them with `specformer train SPEC --init-from {weights}`; generate, eval, "
                "fill-mask and export-hf read them with --spec SPEC")
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(weights)
    assert str(err.value) == expected
    result = CliRunner().invoke(app, ["train", "--resume", str(weights)], env={"COLUMNS": "1000"})
    assert result.exit_code == 1 and result.stderr == f"error: {expected}\n"


def test_a_resume_of_another_kind_of_model_says_so_in_one_line() -> None:
    # gpt-nano's checkpoint resumed with bert-nano: not nine fields written out in full (whole
    # decoder and encoder dicts), nor --init-from, whose weights would not fit either
    saved = load_spec("gpt-nano")
    with pytest.raises(CheckpointError) as err:
        check_resumable({"specformer": {"spec": saved.to_dict()}}, load_spec("bert-nano"), source="run.ckpt")
    assert str(err.value) == (
        "run.ckpt: the checkpoint is a decoder's and this spec describes an encoder: resume with the "
        "checkpoint's own spec, which `specformer train --resume run.ckpt` with no SPEC uses, or train this "
        "spec from the start without --resume")


def test_weights_of_another_kind_of_model_are_named_so_and_not_as_a_position_table() -> None:
    # a decoder's weights (a 256-row learned table) given to an encoder's spec (128 rows): the
    # cause is the kind of model, not max_seq_len, which the table's hint would have said to change
    from specformer.builder import build_model
    from specformer.training.checkpoint import CheckpointError, check_weights

    weights = build_model(load_spec("gpt-nano"), device="meta").state_dict()
    for other, kind in (("bert-nano", "an encoder"), ("t5-nano", "an encoder-decoder")):
        with pytest.raises(CheckpointError) as info:
            check_weights(build_model(load_spec(other), device="meta"), weights, source="w.safetensors")
        lines = str(info.value).splitlines()
        assert lines[:2] == [
            "w.safetensors: the weights do not fit the model",
            f"  the weights are a decoder's (their layers are decoder.*) and this spec describes {kind}: weights "
            "load only into the kind of model they were trained as; give a spec of a decoder (a checkpoint or "
            "run folder carries its own)"]
        assert "learned position table" not in str(info.value)
    t5 = build_model(load_spec("t5-nano"), device="meta").state_dict()
    with pytest.raises(CheckpointError, match=r"the weights are an encoder-decoder's \(their layers are encoder.\* "
                                              r"and decoder.\*\) and this spec describes a decoder"):
        check_weights(build_model(load_spec("gpt-nano"), device="meta"), t5, source="w.safetensors")


def test_init_from_a_shorter_learned_table_says_why_and_a_rope_model_takes_any_length(tiny: Any) -> None:
    from specformer.builder import build_model
    from specformer.training.checkpoint import CheckpointError, check_weights

    data = tiny("decoder")  # max_seq_len 64, learned positions
    weights = build_model(load_spec(data)).state_dict()
    longer = build_model(load_spec({**data, "max_seq_len": 128}), device="meta")
    with pytest.raises(CheckpointError) as info:
        check_weights(longer, weights, source="w.safetensors")
    assert ("embed.positions.weight is a learned position table, one row per position: the weights have 64 rows "
            "and this spec's max_seq_len (or positional.max_positions) asks for 128") in str(info.value)
    # without a table, a longer max_seq_len builds the same weights: fine-tuning at a longer length
    rope = {**data, "positional": {"type": "rope"}}
    check_weights(build_model(load_spec({**rope, "max_seq_len": 1024}), device="meta"),
                  build_model(load_spec(rope)).state_dict(), source="w.safetensors")


def test_a_resumed_run_says_which_training_settings_changed(tiny: Any) -> None:
    # an edited spec or a --set on resume takes effect: the run says which, so that a change
    # meant (or not) is seen before the steps run
    from io import StringIO

    from rich.console import Console

    first = train(load_spec(tiny("decoder", max_steps=2, val_interval=2)), progress=False)
    out = StringIO()
    changed = tiny("decoder", max_steps=4, val_interval=2, optimizer={"type": "adamw", "lr": 1e-3},
                   schedule={"type": "linear", "warmup_steps": 0})
    train(load_spec(changed), resume=first.checkpoint, progress=False, console=Console(file=out, width=400))
    said = out.getvalue()
    assert ("resuming at step 2 with other training settings than the checkpoint's: training.max_steps 2 → 4, "
            "training.optimizer.lr 0.003 → 0.001, training.schedule.type constant → linear") in said
    out = StringIO()  # only more steps: that is all it says
    train(load_spec(tiny("decoder", max_steps=3, val_interval=2)), resume=first.checkpoint, progress=False,
          console=Console(file=out, width=400))
    assert "than the checkpoint's: training.max_steps 2 → 3\n" in out.getvalue()


def test_init_from_imported_weights_warns_when_the_spec_trains_another_tokenizer(tiny: Any, tmp_path: Path) -> None:
    # import-hf records the model's tokenizer in the weights file: weights whose embeddings are
    # indexed by that tokenizer's ids, fine-tuned on the ids of a BPE trained afresh, learn nothing
    from io import StringIO

    from rich.console import Console
    from typer.testing import CliRunner

    from specformer.builder import build_model
    from specformer.cli import app
    from specformer.data.tokenizers import ByteTokenizer
    from specformer.interop.hf import save_hf, spec_from_hf_config

    hf = spec_from_hf_config({"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 64,
                              "vocab_size": 300})
    save_hf(build_model(hf), hf, tmp_path / "gpt2", tokenizer=ByteTokenizer())
    weights = tmp_path / "w.safetensors"
    result = CliRunner().invoke(app, ["import-hf", str(tmp_path / "gpt2"), "-o", str(tmp_path / "my.yaml"),
                                      "-w", str(weights)])
    assert result.exit_code == 0, result.output
    t = tiny("decoder", max_steps=1, val_interval=1)
    sets = [f"training.{k}={json.dumps(t['training'][k])}" for k in ("data", "seq_len", "batch_size", "max_steps", "val_interval",
                                                         "val_batches", "out_dir", "cache_dir", "accelerator")]
    out = StringIO()
    train(load_spec(tmp_path / "my.yaml", overrides=sets), init_from=weights, progress=False,
          console=Console(file=out, width=400))
    assert "warning" not in out.getvalue()  # the spec import-hf wrote trains with the model's tokenizer
    out = StringIO()
    train(load_spec(tmp_path / "my.yaml", overrides=[*sets, "training.tokenizer={type: byte}"]), init_from=weights,
          progress=False, console=Console(file=out, width=400))
    said = out.getvalue()
    assert f"{weights} holds the weights of {(tmp_path / 'gpt2').resolve()} (import-hf)" in said
    assert "training.tokenizer is byte" in said
    assert f"--set training.tokenizer.path={(tmp_path / 'gpt2' / 'tokenizer.json').resolve()}" in said


def test_ctrl_c_in_the_closing_validation_says_training_finished(tiny: Any) -> None:
    class CtrlCInClosingValidation(L.Callback):
        def on_validation_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
            if trainer.state.fn == "validate":  # the validation after fit, not one during it
                raise KeyboardInterrupt

    # 15 steps, validations at 10: the run's last step is validated after fit
    spec = load_spec(tiny("decoder", max_steps=15, val_interval=10))
    with pytest.raises(TrainingInterrupted) as info:
        train(spec, progress=False, callbacks=[CtrlCInClosingValidation()])
    exc = info.value
    assert exc.finished and exc.step == 15 and exc.checkpoint_step == 15
    assert str(exc).startswith("interrupted in the closing validation, after the last step (15)")


def test_a_checkpoint_of_an_unregistered_type_says_to_register_it(tmp_path: Path) -> None:
    # a model trained with a plugin's (or a script's) norm, loaded where the type is unknown
    spec = load_spec("gpt-nano", overrides=["decoder.n_layers=1"]).to_dict()
    spec["decoder"]["norm"]["type"] = "scalenorm"
    path = tmp_path / "plugin.ckpt"
    torch.save({"specformer": {"format": 1, "spec": spec}, "state_dict": {}, "global_step": 1}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "decoder.norm.type: unknown type 'scalenorm'" in message
    assert "uses a type that is not registered here" in message
    assert "register the type before load_checkpoint" in message


def test_weights_with_none_of_specformers_names_point_at_import_hf() -> None:
    # a Hugging Face model.safetensors (export-hf's, or transformers') given where specformer's own weights go
    from specformer.builder import build_model
    from specformer.training.checkpoint import check_weights

    model = build_model(load_spec("gpt-nano"), device="meta")
    hf_named = {"transformer.wte.weight": torch.zeros(512, 128), "transformer.h.0.ln_1.weight": torch.zeros(128)}
    with pytest.raises(CheckpointError) as info:
        check_weights(model, hf_named, source="hf_out/model.safetensors")
    assert str(info.value).splitlines()[-1] == (
        "  none of its names is one of specformer's: a Hugging Face model's weights (a folder that transformers "
        "or export-hf wrote) are read with `specformer import-hf FOLDER -o spec.yaml --weights "
        "weights.safetensors`, which renames them")
    # weights that share names with the model (another size, a layer more) are not said to be Hugging Face's
    own = {k: v for k, v in model.state_dict().items() if k != "embed.tokens.weight"}
    with pytest.raises(CheckpointError) as info:
        check_weights(model, {**own, "extra.weight": torch.zeros(1)}, source="w.safetensors")
    assert "import-hf" not in str(info.value)


def test_train_without_a_spec_resumes_with_the_checkpoints_own(tiny: Any) -> None:
    # train(resume=CKPT) is `specformer train --resume CKPT`: the spec the checkpoint holds
    full = LossRecorder()
    train(_spec(tiny, "decoder", max_steps=6), progress=False, callbacks=full)  # one callback, not a list
    assert sorted(full.losses) == [1, 2, 3, 4, 5, 6]
    # a run of max_steps 6 stopped at step 3
    import lightning as L

    class StopAt3(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            trainer.should_stop = trainer.should_stop or trainer.global_step == 3

    first = train(_spec(tiny, "decoder", max_steps=6), progress=False, callbacks=[StopAt3()])
    assert first.checkpoint and read_checkpoint(first.checkpoint)["global_step"] == 3
    resumed = LossRecorder()
    result = train(resume=first.checkpoint, progress=False, callbacks=resumed)
    assert result.steps == 6 and sorted(resumed.losses) == [4, 5, 6]
    for step in (4, 5, 6):
        assert resumed.losses[step] == pytest.approx(full.losses[step], abs=1e-6)
    with pytest.raises(TypeError, match="give a spec to train .* or resume= a checkpoint"):
        train()


def test_a_resume_that_changes_a_sections_type_also_names_the_fields_both_types_have() -> None:
    # cosine (warmup 50) → constant (warmup 0): warmup_steps is a field of both, kept across a
    # type change, and its change was left out of the line a resume prints
    from specformer.training.run import _training_changes

    raw = {"specformer": {"spec": load_spec("gpt-nano").to_dict()}}
    spec = load_spec("gpt-nano", overrides=["training.schedule={type: constant, warmup_steps: 0}"])
    assert _training_changes(raw, spec) == ["training.schedule.type cosine → constant",
                                            "training.schedule.warmup_steps 50 → 0"]
    # warmup kept, and min_lr_ratio, a field of both, at the new type's default: that change is said too
    kept = load_spec("gpt-nano", overrides=["training.schedule.type=linear"])
    assert _training_changes(raw, kept) == ["training.schedule.type cosine → linear",
                                            "training.schedule.min_lr_ratio 0.1 → 0.0"]


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1), (3, 2)])
def test_a_resume_with_another_accumulate_validates_on_its_own_steps(tiny: Any, before: int, after: int) -> None:
    # Lightning validates every val_interval × accumulate micro-batches of its restored count,
    # which was the checkpoint's: 6 steps at accumulate 1 then accumulate 2 validated at 7 and 9
    first = train(load_spec(tiny("decoder", max_steps=6, val_interval=2, val_batches=1, accumulate=before)),
                  progress=False)
    resumed = train(load_spec(tiny("decoder", max_steps=12, val_interval=2, val_batches=1, accumulate=after)),
                    resume=first.checkpoint, progress=False)
    assert [h["step"] for h in resumed.history] == [2, 4, 6, 8, 10, 12]
    assert resumed.tokens == 6 * 8 * 32 * (before + after)


def test_a_step_with_no_labels_leaves_the_weights_and_the_optimizer_state_as_they_were() -> None:
    from specformer.builder.lightning import SpecModule

    class AfterEachStep(L.Callback):
        def __init__(self) -> None:
            self.weights: list[dict[str, torch.Tensor]] = []
            self.steps: list[list[float]] = []

        def on_train_batch_end(self, trainer: L.Trainer, module: Any, *args: Any) -> None:
            self.weights.append({k: v.clone() for k, v in module.model.state_dict().items()})
            state = trainer.optimizers[0].state
            self.steps.append([float(state[p]["step"]) for p in module.parameters() if p in state])

    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 17))
    labelled = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    unlabelled = {"input_ids": ids[:, :-1], "labels": torch.full((2, 16), -100)}
    module = SpecModule(load_spec("gpt-nano"))  # AdamW, weight decay 0.1: zero gradients would still move weights
    seen = AfterEachStep()
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[seen])
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader([labelled, unlabelled, labelled], batch_size=None))
    assert trainer.global_step == 3
    # the second step's only micro-batch scores no token: neither decay nor momentum moves a weight,
    # and AdamW's step count (its bias correction) stays where it was
    for name, value in seen.weights[1].items():
        assert torch.equal(value, seen.weights[0][name]), name
    assert seen.steps[0] and set(seen.steps[0]) == {1.0} and set(seen.steps[1]) == {1.0}
    assert set(seen.steps[2]) == {2.0}  # the third step, with labels, learns again
    assert any(not torch.equal(v, seen.weights[1][k]) for k, v in seen.weights[2].items())
