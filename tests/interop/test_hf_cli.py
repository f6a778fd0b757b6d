"""``specformer import-hf`` and ``export-hf`` as a user runs them."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specformer.builder import build_model
from specformer.cli import app
from specformer.specs.loader import load_spec

runner = CliRunner()


def _gpt2_config(**extra) -> dict:
    return {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
            "vocab_size": 101, **extra}


def test_import_config_only_writes_a_spec_that_loads(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_gpt2_config()))
    out = tmp_path / "my.yaml"
    result = runner.invoke(app, ["import-hf", str(tmp_path / "config.json"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("# Imported by `specformer import-hf` from the Hugging Face gpt2 model")
    spec = load_spec(out)
    assert (spec.d_model, spec.decoder.n_layers, spec.decoder.ffn.activation) == (32, 2, "gelu_tanh")
    assert "type: learned" in text  # every choice is spelled out even where it is a default
    assert f"{sum(p.numel() for p in build_model(spec, device='meta').parameters()):,} parameters" in result.output


def test_import_preset_sized_config_is_the_preset(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    out = tmp_path / "gpt2.yaml"
    result = runner.invoke(app, ["import-hf", str(tmp_path), "-o", str(out), "--name", "gpt2-small"])
    assert result.exit_code == 0, result.output
    assert load_spec(out) == load_spec("gpt2-small")
    assert "124,439,808 parameters" in result.output


def test_unsupported_config_is_an_error_naming_the_feature(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_gpt2_config(scale_attn_by_inverse_layer_idx=True)))
    result = runner.invoke(app, ["import-hf", str(tmp_path), "-o", str(tmp_path / "x.yaml")])
    assert result.exit_code == 1
    assert "scale_attn_by_inverse_layer_idx=True has no specformer equivalent" in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_name_is_refused_not_replaced_by_the_models(tmp_path, name: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_gpt2_config()))
    result = runner.invoke(app, ["import-hf", str(tmp_path), "-o", str(tmp_path / "x.yaml"), "--name", name])
    assert result.exit_code == 1 and "--name is empty" in result.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_missing_source_and_weights_are_errors(tmp_path) -> None:
    result = runner.invoke(app, ["import-hf", str(tmp_path / "nope"), "-o", str(tmp_path / "x.yaml")])
    assert result.exit_code == 1 and "no such file or folder" in result.stderr
    (tmp_path / "config.json").write_text(json.dumps(_gpt2_config()))
    result = runner.invoke(app, ["import-hf", str(tmp_path), "-o", str(tmp_path / "x.yaml"), "--weights",
                                 str(tmp_path / "w.safetensors")])
    assert result.exit_code == 1 and "no weights found" in result.stderr


def test_a_hub_model_id_is_told_to_be_downloaded_first(tmp_path, monkeypatch) -> None:
    # from_pretrained("gpt2") downloads; import-hf reads a folder, and says how to get one
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["import-hf", "meta-llama/Llama-3.2-1B", "-o", "x.yaml"])
    _clean_error(result, "meta-llama/Llama-3.2-1B: no such file or folder", "not a Hub model id",
                 "hf download meta-llama/Llama-3.2-1B --local-dir Llama-3.2-1B")
    result = runner.invoke(app, ["import-hf", "gpt2", "-o", "x.yaml"])
    _clean_error(result, "hf download gpt2 --local-dir gpt2")
    for path in ("my/config.json", "model.safetensors", "run/last.ckpt", "pytorch_model.bin"):  # files: no such hint
        result = runner.invoke(app, ["import-hf", path, "-o", "x.yaml"])
        _clean_error(result, "no such file or folder")
        assert "Hub" not in result.stderr, path
    assert not (tmp_path / "x.yaml").exists()


def test_export_refuses_a_spec_without_a_hugging_face_family(tmp_path) -> None:
    spec = load_spec("t5-nano")
    weights = tmp_path / "w.safetensors"
    save_file(build_model(spec).state_dict(), str(weights))
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", "t5-nano", "-o", str(tmp_path / "hf")])
    assert result.exit_code == 1
    assert "encoder.attention.scale = None (Hugging Face t5 has 1.0)" in result.stderr
    # what to train instead, and that it does export
    fix = "--set encoder.attention.scale=1.0 --set decoder.attention.scale=1.0 --set decoder.cross_attention.scale=1.0"
    assert fix in " ".join(result.stderr.split())
    from specformer.interop.hf_config import hf_config_from_spec

    assert hf_config_from_spec(load_spec("t5-nano", fix.replace("--set ", "").split()))["model_type"] == "t5"
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["export-hf", str(weights), "-o", str(tmp_path / "hf")])
    assert result.exit_code == 1 and "--spec" in result.stderr


def test_export_of_a_training_checkpoint(tmp_path) -> None:
    pytest.importorskip("specformer.training.checkpoint", reason="training checkpoints are not available")
    spec = load_spec("gpt-nano", ["decoder.n_layers=1"])
    torch.manual_seed(0)
    model = build_model(spec)
    # the training checkpoint layout: Lightning's state_dict under "model." + the resolved spec
    ckpt = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "specformer": {"format": 1, "spec": spec.to_dict()},
        "global_step": 3,
    }
    torch.save(ckpt, tmp_path / "last.ckpt")
    result = runner.invoke(app, ["export-hf", str(tmp_path / "last.ckpt"), "-o", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["n_layer"] == 1
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    # GPT-2 stores its linear layers as Conv1D (in, out)
    assert torch.equal(tensors["transformer.h.0.mlp.c_fc.weight"], model.state_dict()["decoder.layers.0.ffn.up_proj.weight"].t())
    assert "lm_head.weight" not in tensors  # tied: transformers re-ties it on load


def test_import_then_export_round_trip_through_the_command_line(tmp_path) -> None:
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=101, max_position_embeddings=64)
    hf = transformers.BertForMaskedLM(config).eval()
    hf.save_pretrained(tmp_path / "bert")
    spec_path, weights = tmp_path / "bert.yaml", tmp_path / "bert.safetensors"
    result = runner.invoke(app, ["import-hf", str(tmp_path / "bert"), "-o", str(spec_path), "-w", str(weights)])
    assert result.exit_code == 0, result.output
    assert "34 tensors" in result.output
    spec = load_spec(spec_path)
    assert spec.name == "bert"
    model = build_model(spec).eval()
    model.load_state_dict(load_file(str(weights)))
    ids = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(input_ids=ids).logits, atol=1e-4, rtol=0)
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    back = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids).logits, hf(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_bf16_weights_are_written_as_they_are_and_computed_in_float32(tmp_path) -> None:
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=101)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "llama")
    spec_path, weights = tmp_path / "llama.yaml", tmp_path / "llama.safetensors"
    result = runner.invoke(app, ["import-hf", str(tmp_path / "llama"), "-o", str(spec_path), "-w", str(weights)])
    assert result.exit_code == 0, result.output
    state = load_file(str(weights))
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    model = build_model(load_spec(spec_path)).eval()
    model.load_state_dict(state)
    assert next(model.parameters()).dtype == torch.float32
    ids = torch.randint(0, 101, (2, 9))
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama", dtype=torch.float32).eval()
    hf16 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        ours = model(ids).logits
        torch.testing.assert_close(ours, hf32(input_ids=ids).logits, atol=1e-5, rtol=0)
        assert (ours - hf16(input_ids=ids).logits.float()).abs().max() > 1e-4  # bf16 compute rounds


# --------------------------------------------------------------------------- what a user gets wrong


def _clean_error(result, *words: str) -> None:
    """Exit status 1 from an error message naming ``words``: no exception escaped."""
    assert result.exit_code == 1, result.output
    assert type(result.exception) is SystemExit, repr(result.exception)  # not a traceback
    assert "Traceback" not in result.output
    assert result.stderr.startswith("error: ")
    for word in words:
        assert word in result.stderr, result.stderr


def test_a_misspelt_config_key_is_named_with_the_key_whose_default_was_taken(tmp_path) -> None:
    # `n_embd` misspelt: the spec takes GPT-2's default width, and weights of the real one do not fit
    config = {k: v for k, v in _gpt2_config().items() if k != "n_embd"} | {"n_embed": 32}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = runner.invoke(app, ["import-hf", str(tmp_path), "-o", str(tmp_path / "x.yaml")])
    assert result.exit_code == 0, result.output
    assert "warning: config key 'n_embed' is not a gpt2 setting: did you mean 'n_embd'?" in result.stderr
    save_file({"transformer.wte.weight": torch.zeros(101, 32)}, tmp_path / "model.safetensors")
    result = runner.invoke(app, ["import-hf", str(tmp_path), "-o", str(tmp_path / "y.yaml"),
                                 "--weights", str(tmp_path / "w.safetensors")])
    _clean_error(result, "does not fit", "did you mean 'n_embd'?")
    # a correct config says nothing of the kind
    (tmp_path / "config.json").write_text(json.dumps(_gpt2_config()))
    result = runner.invoke(app, ["import-hf", str(tmp_path), "-o", str(tmp_path / "z.yaml")])
    assert result.exit_code == 0 and "did you mean" not in result.output


def _hf_folder(tmp_path) -> str:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(_gpt2_config()))
    return str(tmp_path / "hf")


@pytest.mark.parametrize(
    ("make", "words"),
    [
        ("binary", ["garbage.ckpt", "not a config.json", "not UTF-8 JSON"]),
        ("missing", ["nope", "no such file or folder"]),
        ("no_config", ["empty/config.json", "no such file"]),
        ("bad_json", ["bad.json:1:2", "not valid JSON"]),
        ("json_list", ["list.json", "a config.json holds a JSON object, found list"]),
        # another library's config.json (timm's): the file, and the model types that import
        ("other_library", ["timm/config.json has no model_type", "not a Hugging Face transformers config",
                           "one of: gpt2, gpt_bigcode, opt, bert, roberta, xlm-roberta, distilbert, t5, mt5, bart, marian, llama, mistral, qwen2, qwen3, phi3, gemma, "
                           "gemma2, gemma3_text, olmo, olmo2, gpt_neox, bloom, phi, gptj, falcon, starcoder2, gemma3"]),
        # another file of the model's folder given by mistake
        ("generation_config", ["generation_config.json is not a model config", "give the model's config.json"]),
    ],
)
def test_import_of_a_source_that_is_not_a_config_is_a_clean_error(tmp_path, make: str, words: list[str]) -> None:
    source = {
        "binary": tmp_path / "garbage.ckpt",
        "missing": tmp_path / "nope",
        "no_config": tmp_path / "empty",
        "bad_json": tmp_path / "bad.json",
        "json_list": tmp_path / "list.json",
        "other_library": tmp_path / "timm",
        "generation_config": tmp_path / "generation_config.json",
    }[make]
    if make == "binary":  # a checkpoint given by mistake: not UTF-8 (0xff never starts a character)
        source.write_bytes(b"\xff\xfe\x80" + bytes(range(256)) * 2)
    elif make == "no_config":
        source.mkdir()
    elif make == "bad_json":
        source.write_text("{model_type: gpt2}")
    elif make == "json_list":
        source.write_text("[1, 2]")
    elif make == "generation_config":
        source.write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    elif make == "other_library":
        source.mkdir()
        (source / "config.json").write_text(json.dumps({"architecture": "resnet50", "num_classes": 1000}))
    out = tmp_path / "out" / "x.yaml"
    _clean_error(runner.invoke(app, ["import-hf", str(source), "-o", str(out)]), *words)
    assert not out.exists() and not out.parent.exists()


def test_import_to_an_existing_folder_is_a_clean_error(tmp_path) -> None:
    source = _hf_folder(tmp_path)
    (tmp_path / "adir.yaml").mkdir()
    _clean_error(runner.invoke(app, ["import-hf", source, "-o", str(tmp_path / "adir.yaml")]),
                 "--output", "adir.yaml", "is a folder")
    assert list((tmp_path / "adir.yaml").iterdir()) == []
    (tmp_path / "w.safetensors").mkdir()
    result = runner.invoke(app, ["import-hf", source, "-o", str(tmp_path / "x.yaml"), "-w", str(tmp_path / "w.safetensors")])
    _clean_error(result, "--weights", "w.safetensors", "is a folder")
    assert not (tmp_path / "x.yaml").exists()  # checked before anything is written


def test_import_into_a_path_through_a_file_is_a_clean_error(tmp_path) -> None:
    source = _hf_folder(tmp_path)
    (tmp_path / "afile").write_text("")
    _clean_error(runner.invoke(app, ["import-hf", source, "-o", str(tmp_path / "afile" / "x.yaml")]),
                 "afile is a file, not a folder")


def test_import_into_a_folder_that_is_not_writable_is_a_clean_error(tmp_path, monkeypatch) -> None:
    import os

    source = _hf_folder(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    # chmod does not stop root (CI containers), so the check itself is made to see it
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != locked and access(path, mode, **kw))
    _clean_error(runner.invoke(app, ["import-hf", source, "-o", str(locked / "x.yaml")]),
                 f"the folder {locked} is not writable")
    assert list(locked.iterdir()) == []


def test_a_failed_write_leaves_no_output(tmp_path, monkeypatch) -> None:
    """The spec and the weights are written together or not at all (e.g. a full disk)."""
    import errno

    import specformer.interop.hf as hf

    torch.manual_seed(0)
    spec = load_spec("gpt-nano", ["decoder.n_layers=1"])
    source = hf.save_hf(build_model(spec), spec, tmp_path / "hf")
    out = tmp_path / "out"

    def disk_full(tensors, path, **_) -> None:
        path.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(hf, "save_safetensors", disk_full)
    result = runner.invoke(app, ["import-hf", str(source), "-o", str(out / "x.yaml"), "-w", str(out / "x.safetensors")])
    _clean_error(result, str(out / "x.safetensors"), "No space left on device", "nothing was written")
    assert not out.exists()  # neither the spec nor a temporary file, nor the folder the write made

    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in build_model(spec).state_dict().items()},
                "specformer": {"format": 1, "spec": spec.to_dict()}}, ckpt)
    (out / "hf").mkdir(parents=True)  # a folder that was there stays
    result = runner.invoke(app, ["export-hf", str(ckpt), "-o", str(out / "hf")])
    _clean_error(result, "model.safetensors", "No space left on device")
    assert list((out / "hf").iterdir()) == []  # no config.json without its weights


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_write_stopped_by_ctrl_c_or_sigterm_keeps_the_old_files_and_says_so(tmp_path, monkeypatch, signum) -> None:
    """Ctrl-C or SIGTERM (``kill``, ``timeout``) while the weights are written: the files from
    before stay as they were, no temporary file is left beside them (SIGTERM killed the
    process on the spot, leaving one as large as the weights), and one line says what happened."""
    import os
    import time

    import specformer.interop.hf as hf

    torch.manual_seed(0)
    spec = load_spec("gpt-nano", ["decoder.n_layers=1"])
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in build_model(spec).state_dict().items()},
                "specformer": {"format": 1, "spec": spec.to_dict()}}, ckpt)
    out = tmp_path / "hf"
    assert runner.invoke(app, ["export-hf", str(ckpt), "-o", str(out)]).exit_code == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    imported = tmp_path / "x.yaml"
    imported.write_text("old\n")

    def stopped(tensors, path, **_) -> None:
        path.write_bytes(b"partial")
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the signal arrives here

    monkeypatch.setattr(hf, "save_safetensors", stopped)
    said = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    previous = signal.getsignal(signal.SIGTERM)
    result = runner.invoke(app, ["export-hf", str(ckpt), "-o", str(out)])
    assert result.exit_code == 128 + signum, result.output
    assert result.stderr == f"error: {said} while exporting; nothing was written\n"
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before  # no .model.safetensors.<hex>.tmp
    result = runner.invoke(app, ["import-hf", str(out), "-o", str(imported), "-w", str(tmp_path / "x.safetensors")])
    assert result.exit_code == 128 + signum, result.output
    assert result.stderr == f"error: {said} while importing; nothing was written\n"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["hf", "last.ckpt", "x.yaml"]
    assert imported.read_text() == "old\n"
    assert signal.getsignal(signal.SIGTERM) is previous  # the caller's handler is back


def test_every_file_is_on_disk_before_it_is_renamed_into_place(tmp_path, monkeypatch) -> None:
    """As a checkpoint is: a power cut after the rename must not leave an empty model.safetensors."""
    import os

    import specformer.interop.hf as hf

    synced: set[int] = set()
    renamed: list[tuple[str, bool]] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        synced.add(os.fstat(fd).st_ino)
        fsync(fd)

    def checking_replace(src, dst) -> None:
        renamed.append((Path(dst).name, os.stat(src).st_ino in synced))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", checking_replace)
    spec = load_spec("gpt-nano", ["decoder.n_layers=1"])
    hf.save_hf(build_model(spec), spec, tmp_path / "hf")
    assert sorted(renamed) == [("config.json", True), ("model.safetensors", True)]


def test_an_export_removes_the_temporary_files_a_killed_export_left(tmp_path) -> None:
    """A SIGKILL while the weights are written leaves their hidden temporary file, as large as
    the weights; the next export into the folder removes it, unless another process is writing there."""
    import specformer.interop.hf as hf
    from specformer.data.cache import locked

    spec = load_spec("gpt-nano", ["decoder.n_layers=1"])
    model = build_model(spec)
    out = tmp_path / "hf"
    out.mkdir()
    killed = [out / ".model.safetensors.0123456789abcdef.tmp", out / ".config.json.fedcba9876543210.tmp"]
    others = [out / ".notes.txt.0123456789abcdef.tmp", out / "model.safetensors.bak"]  # not the export's
    for path in killed + others:
        path.write_bytes(b"partial")
    with locked(out, shared=True):  # another export under way: its files are left alone
        hf.save_hf(model, spec, out)
    assert all(path.exists() for path in killed + others)
    hf.save_hf(model, spec, out)
    assert sorted(f.name for f in out.iterdir()) == sorted(["config.json", "model.safetensors"] + [p.name for p in others])


def test_the_python_exports_take_a_spec_as_load_spec_does_and_refuse_a_file_for_a_folder(tmp_path) -> None:
    import specformer.interop.hf as hf

    model = build_model("gpt-nano")
    assert hf.hf_config_from_spec("gpt-nano") == hf.hf_config_from_spec(load_spec("gpt-nano"))
    out = hf.save_hf(model, "gpt-nano", tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"
    # out_dir is a folder: a file there (or above it) is named, and nothing is written
    taken = tmp_path / "notes.py"
    taken.write_text("x = 1\n")
    for out_dir in (taken, taken / "hf"):
        with pytest.raises(NotADirectoryError, match="is a file, not a folder: out_dir is the folder") as info:
            hf.save_hf(model, None, out_dir)
        assert info.value.filename == str(taken)
    assert taken.read_text() == "x = 1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["hf", "notes.py"]


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="needs named pipes")
def test_outputs_through_a_link_or_into_a_pipe_keep_them_what_they_are(tmp_path) -> None:
    """-o through a symbolic link writes the file it points to and keeps the link; -o into a
    pipe or a device (/dev/null) writes into it: a file renamed over it replaced it, /dev/null
    included when run as root."""
    import os
    import threading

    source = _hf_folder(tmp_path)
    (tmp_path / "real.yaml").write_text("old\n")
    (tmp_path / "link.yaml").symlink_to("real.yaml")
    result = runner.invoke(app, ["import-hf", str(source), "-o", str(tmp_path / "link.yaml")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "link.yaml").is_symlink()
    assert load_spec(tmp_path / "real.yaml").d_model == 32

    pipe = tmp_path / "pipe.yaml"
    os.mkfifo(pipe)
    got: list[bytes] = []

    def read() -> None:
        with open(pipe, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    result = runner.invoke(app, ["import-hf", str(source), "-o", str(pipe)])
    reader.join(10)
    assert result.exit_code == 0, result.output
    assert pipe.is_fifo() and got and got[0].startswith(b"# Imported by `specformer import-hf`")
    assert [f.name for f in tmp_path.iterdir() if f.name.endswith(".tmp")] == []


def test_export_to_a_bad_output_is_a_clean_error(tmp_path, monkeypatch) -> None:
    import os

    spec = load_spec("gpt-nano", ["decoder.n_layers=1"])
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in build_model(spec).state_dict().items()},
                "specformer": {"format": 1, "spec": spec.to_dict()}}, ckpt)
    (tmp_path / "afile").write_text("")
    _clean_error(runner.invoke(app, ["export-hf", str(ckpt), "-o", str(tmp_path / "afile")]),
                 "afile: is a file; export-hf writes a folder")
    (tmp_path / "out" / "config.json").mkdir(parents=True)
    _clean_error(runner.invoke(app, ["export-hf", str(ckpt), "-o", str(tmp_path / "out")]),
                 "out/config.json: is a folder")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["config.json"]
    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != locked and access(path, mode, **kw))
    _clean_error(runner.invoke(app, ["export-hf", str(ckpt), "-o", str(locked / "hf")]),
                 f"the folder {locked} is not writable")
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("make", ["binary", "missing", "folder_without_checkpoint"])
def test_export_of_a_source_that_is_not_a_checkpoint_is_a_clean_error(tmp_path, make: str) -> None:
    source = tmp_path / "src"
    if make == "binary":
        source.write_bytes(bytes(range(256)) * 2)
    elif make == "folder_without_checkpoint":
        source.mkdir()
    _clean_error(runner.invoke(app, ["export-hf", str(source), "-o", str(tmp_path / "hf")]), str(source))
    assert not (tmp_path / "hf").exists()


def test_written_weights_get_the_umasks_permissions_like_the_other_files(tmp_path) -> None:
    # safetensors creates owner-only files; a shared folder must stay readable
    import os

    import specformer.interop.hf as hf

    old = os.umask(0o022)
    try:
        spec = load_spec("gpt-nano", ["decoder.n_layers=1"])
        source = hf.save_hf(build_model(spec), spec, tmp_path / "hf")
        result = runner.invoke(app, ["import-hf", str(source), "-o", str(tmp_path / "x.yaml"),
                                     "-w", str(tmp_path / "x.safetensors")])
        assert result.exit_code == 0, result.output
    finally:
        os.umask(old)
    for path in (source / "model.safetensors", source / "config.json", tmp_path / "x.safetensors", tmp_path / "x.yaml"):
        assert path.stat().st_mode & 0o777 == 0o644, path


# --------------------------------------------------------------------------- task heads


def test_sequence_classifier_imports_as_a_classification_head_and_exports_back(tmp_path) -> None:
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=101, max_position_embeddings=64,
                                     num_labels=3)
    hf = transformers.BertForSequenceClassification(config).eval()
    hf.save_pretrained(tmp_path / "cls")
    spec_path, weights = tmp_path / "cls.yaml", tmp_path / "cls.safetensors"
    result = runner.invoke(app, ["import-hf", str(tmp_path / "cls"), "-o", str(spec_path), "-w", str(weights)])
    assert result.exit_code == 0, result.output
    spec = load_spec(spec_path)
    assert (spec.head.type, spec.head.n_classes) == ("classification", 3)
    assert "type: classification" in spec_path.read_text()
    model = build_model(spec).eval()
    model.load_state_dict(load_file(str(weights)))
    ids, mask = torch.randint(0, 101, (2, 9)), torch.ones(2, 9, dtype=torch.long)
    mask[1, 5:] = 0
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).logits  # (2, 3)
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, expected, atol=1e-4, rtol=0)
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    back = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    assert type(back).__name__ == "BertForSequenceClassification"
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids, attention_mask=mask).logits, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        ("BertModel", ["BertModel is the bare bert encoder", "cls.predictions.*", "BertForSequenceClassification"]),
        ("BertForQuestionAnswering", ["specformer has no question-answering head", "BertForMaskedLM"]),
    ],
)
def test_a_head_specformer_does_not_have_is_refused_by_name(tmp_path, make: str, words: list[str]) -> None:
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=101, max_position_embeddings=64)
    getattr(transformers, make)(config).save_pretrained(tmp_path / "hf")
    for extra in ([], ["-w", str(tmp_path / "w.safetensors")]):
        result = runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "-o", str(tmp_path / "x.yaml"), *extra])
        _clean_error(result, f"architectures ['{make}']", *words)
        assert not (tmp_path / "x.yaml").exists()


def test_the_paths_written_are_printed_whole_however_narrow_the_output(tmp_path) -> None:
    # a path longer than the line is copied from the output next: never broken onto two lines
    deep = tmp_path / ("a-folder-with-a-name-long-enough-to-pass-the-width-of-a-terminal" * 2)
    deep.mkdir()
    (deep / "config.json").write_text(json.dumps(_gpt2_config()))
    spec_path = deep / "imported-spec-with-a-long-name.yaml"
    result = runner.invoke(app, ["import-hf", str(deep), "-o", str(spec_path)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert f"wrote {spec_path}: decoder" in result.stdout
    weights = deep / "weights.safetensors"
    save_file(build_model(load_spec(spec_path)).state_dict(), str(weights))
    out = deep / "exported"
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(out)],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: Hugging Face gpt2" in result.stdout
    assert f".from_pretrained({str(out)!r})" in result.stdout


@pytest.mark.parametrize(
    "command,example",
    [
        ("import-hf", "specformer import-hf path/to/model_dir -o my.yaml --weights my.safetensors"),
        ("import-hf", "specformer train my.yaml --init-from my.safetensors"),
        ("export-hf", "specformer export-hf my.safetensors --spec my.yaml -o hf_out"),
    ],
)
def test_help_shows_examples(command: str, example: str) -> None:
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    assert example in result.stdout


def test_export_without_a_tokenizer_names_an_earlier_exports_tokenizer_left_in_the_folder(tmp_path) -> None:
    # weights alone write no tokenizer; one left by an earlier export would still be what AutoTokenizer loads
    spec = load_spec("gpt-nano", ["d_model=32", "decoder.n_layers=1"])
    weights = tmp_path / "w.safetensors"
    save_file(build_model(spec).state_dict(), str(weights))
    (tmp_path / "spec.yaml").write_text(spec.to_yaml())
    out = tmp_path / "hf"
    args = ["export-hf", str(weights), "--spec", str(tmp_path / "spec.yaml"), "-o", str(out)]
    result = runner.invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "still holds" not in result.stderr  # a fresh folder: nothing to say
    (out / "tokenizer.json").write_text("{}")
    result = runner.invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert f"{out} still holds tokenizer.json from before, which this export did not write" in result.stderr
    assert (out / "tokenizer.json").read_text() == "{}"  # the user's file is left alone
    # and any file from_pretrained loads beside the weights: an earlier chat model's template
    # and generation config would come with a plain model's weights
    (out / "tokenizer.json").unlink()
    (out / "chat_template.jinja").write_text("{{ messages }}")
    (out / "generation_config.json").write_text('{"eos_token_id": [1, 2]}')
    result = runner.invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert (f"{out} still holds chat_template.jinja and generation_config.json from before, which this export "
            "did not write") in said


def _model_folder(tmp_path: Path, config: dict, *, tokenizer: bool) -> Path:
    """A Hugging Face model folder as save_pretrained writes it: config, weights and (when
    ``tokenizer``) the model's tokenizer.json."""
    from specformer.data.tokenizers import ByteTokenizer
    from specformer.interop.hf import save_hf, spec_from_hf_config

    spec = spec_from_hf_config(config)
    folder = tmp_path / config["model_type"]
    save_hf(build_model(spec), spec, folder, tokenizer=ByteTokenizer() if tokenizer else None)
    return folder


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 1234\n",
         ["tokenizer.json is a Git LFS pointer, not the file itself", "git lfs pull"]),
        (b'{"version": ', ["tokenizer.json is not a tokenizer.json (not JSON"]),
    ],
    ids=["lfs_pointer", "truncated"],
)
def test_an_unreadable_tokenizer_json_is_a_one_line_error_before_anything_is_written(
    tmp_path, content: bytes, words: list[str]
) -> None:
    folder = _model_folder(tmp_path, {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 4,
                                      "n_positions": 64, "vocab_size": 259}, tokenizer=True)
    (folder / "tokenizer.json").write_bytes(content)
    out, weights = tmp_path / "x.yaml", tmp_path / "w.safetensors"
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(out), "--weights", str(weights)])
    _clean_error(result, *words)
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and not weights.exists()


def test_import_trains_with_the_models_own_tokenizer(tmp_path) -> None:
    # the weights' token ids are those of the model's tokenizer.json: a spec that trained a
    # fresh BPE on the user's text would fine-tune them on ids that mean other tokens
    folder = _model_folder(tmp_path, _gpt2_config(vocab_size=300), tokenizer=True)
    out = tmp_path / "my.yaml"
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(out), "-w", str(tmp_path / "w.safetensors")],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    tokenizer = load_spec(out).training.tokenizer
    assert (tokenizer.type, tokenizer.path) == ("file", str((folder / "tokenizer.json").resolve()))
    assert f"training.tokenizer: the model's own, {(folder / 'tokenizer.json').resolve()}" in result.stdout
    assert result.stderr == ""
    # a config.json given as the source finds the tokenizer beside it too
    result = runner.invoke(app, ["import-hf", str(folder / "config.json"), "-o", str(tmp_path / "c.yaml")])
    assert load_spec(tmp_path / "c.yaml").training.tokenizer.type == "file"


def test_import_of_a_model_without_tokenizer_json_warns_that_the_spec_trains_another(tmp_path) -> None:
    folder = _model_folder(tmp_path, _gpt2_config(vocab_size=300), tokenizer=False)
    out = tmp_path / "my.yaml"
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(out)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert load_spec(out).training.tokenizer.type == "bpe"
    assert result.stderr.startswith("warning: ")
    assert f"{folder} has no tokenizer.json" in result.stderr and "training.tokenizer" in result.stderr


def test_imported_weights_evaluate_and_generate_with_spec_before_any_training(tmp_path, monkeypatch) -> None:
    # import-hf's weights + spec are a model already: eval reads them as a checkpoint of
    # the same weights would be read, with the model's own tokenizer the spec names
    from specformer.data.tokenizers import file_tokenizer
    from specformer.training.checkpoint import FORMAT_VERSION

    monkeypatch.chdir(tmp_path)
    folder = _model_folder(tmp_path, _gpt2_config(vocab_size=300), tokenizer=True)
    spec_path, weights = tmp_path / "my.yaml", tmp_path / "w.safetensors"
    assert runner.invoke(app, ["import-hf", str(folder), "-o", str(spec_path), "-w", str(weights)]).exit_code == 0
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("the model is here and the model is there\n" * 40)
    data = ["--set", "training.data={type: files, paths: [texts/]}", "--set", "training.seq_len=16", "--batches", "2"]
    spec = load_spec(spec_path)
    ckpt = tmp_path / "same.ckpt"
    torch.save({"specformer": {"format": FORMAT_VERSION, "spec": spec.to_dict(),
                               "tokenizer": file_tokenizer(spec.training.tokenizer).state()},
                "state_dict": {f"model.{k}": v for k, v in load_file(str(weights)).items()}, "global_step": 0}, ckpt)

    def val_loss(*source: str) -> str:
        result = runner.invoke(app, ["eval", *source, *data], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        return next(line for line in result.stdout.splitlines() if "val loss" in line).split()[-2]

    assert val_loss(str(weights), "--spec", str(spec_path)) == val_loss(str(ckpt))
    result = runner.invoke(app, ["generate", str(weights), "--spec", str(spec_path), "-p", "the", "-n", "3", "--greedy"])
    assert result.exit_code == 0 and result.stdout.startswith("the"), result.output


def test_weights_with_a_spec_whose_tokenizer_has_nothing_to_train_run_with_it(tmp_path) -> None:
    # a byte tokenizer gives the same ids in every run: the weights' own, not a tokenizer to train
    spec_path, weights = tmp_path / "byte.yaml", tmp_path / "w.safetensors"
    spec_path.write_text("extends: gpt-nano\nvocab_size: 259\ntraining:\n  tokenizer: {type: byte}\n")
    model = build_model(load_spec(spec_path))
    save_file(dict(model.state_dict()), str(weights))
    result = runner.invoke(app, ["generate", str(weights), "--spec", str(spec_path), "-p", "def", "-n", "4",
                                 "--greedy"])
    assert result.exit_code == 0, result.output
    from specformer.data.tokenizers import ByteTokenizer

    ids = torch.tensor([list(b"def")])
    with torch.no_grad():
        for _ in range(4):  # the greedy continuation of these weights, as bytes
            ids = torch.cat([ids, model.eval()(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert result.stdout.strip() == ByteTokenizer().decode(ids[0].tolist()).strip()


def test_weights_without_their_spec_or_tokenizer_are_clean_errors(tmp_path) -> None:
    folder = _model_folder(tmp_path, _gpt2_config(vocab_size=300), tokenizer=False)
    spec_path, weights = tmp_path / "my.yaml", tmp_path / "w.safetensors"
    assert runner.invoke(app, ["import-hf", str(folder), "-o", str(spec_path), "-w", str(weights)]).exit_code == 0
    result = runner.invoke(app, ["generate", str(weights), "-p", "x"])
    _clean_error(result, "holds weights only", "--spec SPEC")
    # the spec trains a BPE: its ids are not the weights', so nothing is generated from them
    result = runner.invoke(app, ["generate", str(weights), "--spec", str(spec_path), "-p", "x"])
    _clean_error(result, "no tokenizer for these weights", "training.tokenizer is bpe", "{type: file, path:")
    # a spec with no tokenizer at all trains none either
    small = tmp_path / "small.yaml"
    small.write_text("extends: gpt-nano\nvocab_size: 100\n")
    save_file(dict(build_model(load_spec(small)).state_dict()), str(tmp_path / "small.safetensors"))
    result = runner.invoke(app, ["generate", str(tmp_path / "small.safetensors"), "--spec", str(small), "-p", "x"])
    _clean_error(result, "training.tokenizer is unset (a vocab_size below any text tokenizer's)", "{type: file, path:")
    assert "it would train" not in result.stderr
    result = runner.invoke(app, ["fill-mask", str(weights), "--spec", "gpt-nano", "a <mask>"])
    _clean_error(result, "the weights do not fit the model")


def test_imported_weights_export_again_with_the_models_tokenizer(tmp_path) -> None:
    # import-hf's spec names the model's tokenizer.json: export-hf of the weights with that
    # spec writes it beside them, with its bos/eos/pad ids, as the source folder had them
    folder = _model_folder(tmp_path, _gpt2_config(vocab_size=300), tokenizer=True)
    spec_path, weights = tmp_path / "my.yaml", tmp_path / "w.safetensors"
    assert runner.invoke(app, ["import-hf", str(folder), "-o", str(spec_path), "-w", str(weights)]).exit_code == 0
    out = tmp_path / "out"
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(out)],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "config.json + model.safetensors + tokenizer.json" in result.stdout
    source, written = json.loads((folder / "config.json").read_text()), json.loads((out / "config.json").read_text())
    ids = ("eos_token_id", "pad_token_id")
    assert [written[k] for k in ids] == [source[k] for k in ids] == [256, 257]
    assert written["bos_token_id"] == 256  # <|endoftext|> starts a text too, as GPT-2's 50256 does
    assert json.loads((out / "tokenizer.json").read_text())["model"] == json.loads(
        (folder / "tokenizer.json").read_text())["model"]
    # a spec that trains a BPE: the tokenizer import-hf recorded in the weights' header
    spec = load_spec(spec_path, ["training.tokenizer={type: bpe}"])
    (tmp_path / "bpe.yaml").write_text(spec.to_yaml())
    args = ["export-hf", str(weights), "--spec", str(tmp_path / "bpe.yaml"), "-o"]
    result = runner.invoke(app, [*args, str(tmp_path / "out2")], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "+ tokenizer.json" in result.stdout, result.output
    # ... and weights without that header: no tokenizer, null ids
    save_file(load_file(str(weights)), str(weights))
    result = runner.invoke(app, [*args, str(tmp_path / "out3")], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "no tokenizer (the spec's training.tokenizer is not a tokenizer.json)" in result.stdout
    assert json.loads((tmp_path / "out3" / "config.json").read_text())["eos_token_id"] is None


class _NotATensor:
    pass


@pytest.mark.parametrize(
    ("make", "words"),
    [
        # a .bin that pickles a Python object: one line naming its class, not torch's many-line advice
        ("pickled_object", ["pytorch_model.bin: not a PyTorch weights file readable with weights_only=True",
                            "a Python object of class", "_NotATensor", "save the model's weights as safetensors"]),
        ("index_not_json", ["model.safetensors.index.json:1:2: not a weights index (not valid JSON"]),
        # a model repository cloned without Git LFS: each weights file is a few lines of text
        ("lfs_safetensors", ["model.safetensors is a Git LFS pointer, not the file itself", "git lfs pull"]),
        ("lfs_bin", ["pytorch_model.bin is a Git LFS pointer, not the file itself", "git lfs pull"]),
        # damaged or another kind of file: said so, without torch's advice to load it unsafely
        ("random_bin", ["pytorch_model.bin: not a PyTorch weights file", "its bytes are not what torch.save writes"]),
        ("html_bin", ["pytorch_model.bin: not a PyTorch weights file", "its bytes are not what torch.save writes"]),
        ("empty_bin", ["pytorch_model.bin: not a PyTorch weights file", "its bytes are not what torch.save writes"]),
        ("truncated_bin", ["pytorch_model.bin: not a PyTorch weights file", "the zip archive is truncated or damaged"]),
    ],
)
def test_unreadable_weights_are_one_line_errors(tmp_path, make: str, words: list[str]) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_gpt2_config()))
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 548105171\n"
    if make == "pickled_object":
        torch.save({"weights": {}, "extra": _NotATensor()}, folder / "pytorch_model.bin")
    elif make.startswith("lfs_"):
        (folder / ("model.safetensors" if make == "lfs_safetensors" else "pytorch_model.bin")).write_bytes(pointer)
    elif make == "truncated_bin":
        torch.save({"w": torch.zeros(1000)}, folder / "pytorch_model.bin")
        (folder / "pytorch_model.bin").write_bytes((folder / "pytorch_model.bin").read_bytes()[:3000])
    elif make.endswith("_bin"):
        data = {"random_bin": bytes(range(256)) * 8, "html_bin": b"<!DOCTYPE html><html>404</html>", "empty_bin": b""}
        (folder / "pytorch_model.bin").write_bytes(data[make])
    else:
        (folder / "model.safetensors.index.json").write_text("{not json")
    out = tmp_path / "x.yaml"
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(out), "-w", str(tmp_path / "w.safetensors")])
    _clean_error(result, *words)
    assert len(result.stderr.strip().splitlines()) == 1 and "\x1b" not in result.stderr
    assert "Re-running" not in result.stderr and "weights_only` set to `False" not in result.stderr
    assert not out.exists() and not (tmp_path / "w.safetensors").exists()


def test_eval_batches_of_an_imported_encoder_decoder_on_pairs(tmp_path, monkeypatch) -> None:
    # the imported spec's data is the default synthetic task; --set gives the pairs evaluated,
    # and --batches counts their batches
    monkeypatch.chdir(tmp_path)
    config = {"model_type": "t5", "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 1, "num_heads": 4,
              "vocab_size": 260, "decoder_start_token_id": 0}
    folder = _model_folder(tmp_path, config, tokenizer=True)
    spec_path, weights = tmp_path / "my.yaml", tmp_path / "w.safetensors"
    assert runner.invoke(app, ["import-hf", str(folder), "-o", str(spec_path), "-w", str(weights)]).exit_code == 0
    assert load_spec(spec_path).training.data.type == "synthetic"
    lines = [json.dumps({"source": f"ab{c}", "target": f"{c}ba"}) for c in "cdefghijklmnopqrstuvwxyz"] * 4
    (tmp_path / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    source = [str(weights), "--spec", str(spec_path)]
    pairs = ["--set", "training.data={type: pairs, paths: [pairs.jsonl]}", "--set", "training.batch_size=4"]
    result = runner.invoke(app, ["eval", *source, *pairs, "--batches", "1"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "pairs: 1 file" in result.stdout and "exact match" in result.stdout
    # a synthetic task scores its whole held-out set whatever --batches says: in that many batches
    whole = runner.invoke(app, ["eval", *source], env={"COLUMNS": "200"})
    result = runner.invoke(app, ["eval", *source, "--batches", "1"], env={"COLUMNS": "200"})
    assert whole.exit_code == result.exit_code == 0, result.output
    assert [line for line in whole.stdout.splitlines() if "exact match" in line or "val loss" in line] == \
           [line for line in result.stdout.splitlines() if "exact match" in line or "val loss" in line]


def test_a_tied_checkpoint_under_an_untied_config_says_so(tmp_path) -> None:
    # saved tied (no lm_head.weight), then config.json edited to tie_word_embeddings: false
    folder = _model_folder(tmp_path, _gpt2_config(vocab_size=300), tokenizer=False)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    out = tmp_path / "x.yaml"
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(out), "-w", str(tmp_path / "w.safetensors")])
    _clean_error(result, "lacks 1 tensor(s) the spec needs: lm_head.weight",
                 "config.json says tie_word_embeddings: false", "if the model was trained tied, set it true")
    assert not out.exists()


def test_a_path_written_with_a_tilde_is_in_the_home_folder(tmp_path, monkeypatch) -> None:
    # the shell leaves ~ as written after --output= and in quotes: it names the home folder,
    # as it does in a spec's paths, not a folder named ~ in the working directory
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    (home / "model").mkdir()
    (home / "model" / "config.json").write_text(json.dumps(_gpt2_config()))
    result = runner.invoke(app, ["import-hf", "~/model", "--output=~/my.yaml"])
    assert result.exit_code == 0, result.output
    spec = load_spec(home / "my.yaml")
    assert spec.d_model == 32
    save_file(build_model(spec).state_dict(), str(home / "my.safetensors"))
    result = runner.invoke(app, ["export-hf", "~/my.safetensors", "--spec", "~/my.yaml", "--output=~/hf"])
    assert result.exit_code == 0, result.output
    assert json.loads((home / "hf" / "config.json").read_text())["n_embd"] == 32
    result = runner.invoke(app, ["schema", "--output=~/s.json"])
    assert result.exit_code == 0, result.output
    assert json.loads((home / "s.json").read_text())["title"]
    assert list(work.iterdir()) == []  # no folder named ~ here


def test_every_command_expands_a_tilde() -> None:
    import typer.main

    from specformer.cli.app import PATH_PARAMETERS, Command

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        assert isinstance(command, Command), name
    named = {param.name for command in group.commands.values() for param in command.params}
    assert PATH_PARAMETERS <= named  # each name is a parameter of some command


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("command", ["import-hf", "export-hf"])
def test_ctrl_c_or_sigterm_while_torch_loads_is_said(tmp_path, monkeypatch, command: str, signum: int) -> None:
    import os
    import sys
    import time
    import types

    imported = []

    class Loading(types.ModuleType):  # `from specformer.interop.hf import ...` while `import torch` runs
        def __getattr__(self, name: str):
            os.kill(os.getpid(), signum)
            time.sleep(0.05)  # the signal is held: raised here, inside torch's C++ import, it aborted the process
            imported.append(name)
            return None

    monkeypatch.setitem(sys.modules, "specformer.interop.hf", Loading("specformer.interop.hf"))
    (tmp_path / "config.json").write_text(json.dumps(_gpt2_config()))
    args = ([command, str(tmp_path), "-o", str(tmp_path / "x.yaml")] if command == "import-hf"
            else [command, str(tmp_path / "config.json"), "-o", str(tmp_path / "hf")])

    def terminated(signum: int, frame) -> None:  # as the command's own handler, not the test's death
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        result = runner.invoke(app, args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 128 + signum, result.output  # SIGTERM killed the process silently
    said = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert result.stderr.strip() == f"error: {said} while starting; nothing was written"
    assert "HFConversionError" in imported  # the whole import ran, then the command stopped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_import_hf_help_names_every_supported_model_type() -> None:
    import re

    from specformer.interop.hf_config import SUPPORTED_MODEL_TYPES

    out = runner.invoke(app, ["import-hf", "--help"], env={"COLUMNS": "300"}).output
    named = set(re.findall(r"\(([\w, -]+)\)", " ".join(out.split())))
    types = {t.strip() for group in named for t in group.split(",")}
    assert set(SUPPORTED_MODEL_TYPES) <= types, set(SUPPORTED_MODEL_TYPES) - types


def test_export_hf_help_names_every_family_it_writes() -> None:
    # the families hf_family() picks for a spec (not those only imported weights export under)
    out = " ".join(runner.invoke(app, ["export-hf", "--help"], env={"COLUMNS": "300"}).output.split())
    for family in ("GPT-2", "GPT-BigCode", "OPT", "BLOOM", "BERT", "RoBERTa", "DistilBERT", "T5", "BART", "Marian",
                   "Llama", "Mistral", "Qwen2", "Qwen3", "Phi-3", "Gemma", "OLMo", "OLMo 2", "GPT-NeoX", "Phi,",
                   "GPT-J", "Falcon", "StarCoder2"):
        assert family in out, family
