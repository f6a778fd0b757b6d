"""save_checkpoint: a model trained in a loop of one's own, saved as a checkpoint that
load_checkpoint and the commands read."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from specformer import build_model, load_spec
from specformer.cli import app
from specformer.data.tokenizers import ByteTokenizer
from specformer.training import (
    CheckpointError,
    load_checkpoint,
    load_weights_file,
    save_checkpoint,
    train,
)

runner = CliRunner()


def _trained(tiny: Any) -> torch.nn.Module:
    """A tiny decoder after a few optimizer steps of a plain torch loop."""
    torch.manual_seed(0)
    model = build_model(load_spec(tiny()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 256, (4, 17))
    for _ in range(3):
        model(ids[:, :-1], labels=ids[:, 1:]).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


def test_a_saved_model_loads_with_its_spec_weights_and_tokenizer(tiny: Any, tmp_path: Path) -> None:
    model = _trained(tiny)
    path = save_checkpoint(model, tmp_path / "out" / "model.ckpt")  # a missing folder is made
    assert path == tmp_path / "out" / "model.ckpt" and [p.name for p in path.parent.iterdir()] == ["model.ckpt"]
    loaded = load_checkpoint(path)
    assert loaded.spec == model.spec and loaded.step == 0
    assert isinstance(loaded.tokenizer, ByteTokenizer)  # the spec's training.tokenizer: byte
    ids = torch.randint(0, 256, (2, 9))
    assert torch.equal(loaded.model(ids).logits, model(ids).logits)
    # a tokenizer given is the one kept; the spec given is checked against the weights
    other = save_checkpoint(model, tmp_path / "t.ckpt", spec=model.spec, tokenizer=loaded.tokenizer)
    assert isinstance(load_checkpoint(other).tokenizer, ByteTokenizer)
    wide = load_spec(model.spec, overrides=["d_model=64"])
    with pytest.raises(CheckpointError, match=r"the weights do not fit the model\n  different shapes"):
        save_checkpoint(model, tmp_path / "wide.ckpt", spec=wide)
    assert not (tmp_path / "wide.ckpt").exists()
    with pytest.raises(CheckpointError, match=r"no spec for the model: give spec="):
        save_checkpoint(torch.nn.Linear(2, 2), tmp_path / "linear.ckpt")
    with pytest.raises(CheckpointError, match=r"writes a checkpoint \(\.ckpt\)"):
        save_checkpoint(model, tmp_path / "model.safetensors")


def test_a_hugging_face_tokenizer_and_a_spec_modules_model_are_saved_with_it(tiny: Any, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specformer import SpecModule
    from specformer.data.tokenizers import HFTokenizer

    vocab = {chr(97 + i): i for i in range(26)} | {"<unk>": 26}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    model = _trained(tiny)
    loaded = load_checkpoint(save_checkpoint(model, tmp_path / "hf.ckpt", tokenizer=hf))
    assert isinstance(loaded.tokenizer, HFTokenizer) and loaded.tokenizer.encode("cab") == [2, 0, 1]
    module = SpecModule(model.spec)
    module.model.load_state_dict(model.state_dict())
    again = load_checkpoint(save_checkpoint(module, tmp_path / "module.ckpt"))  # its model, under its own names
    ids = torch.randint(0, 256, (2, 9))
    assert torch.equal(again.model(ids).logits, model(ids).logits)
    with pytest.raises(CheckpointError, match=r"tokenizer= is a dict; give a specformer tokenizer"):
        save_checkpoint(model, tmp_path / "bad.ckpt", tokenizer={"type": "byte"})


def test_the_commands_read_a_saved_model_and_a_run_starts_from_it_not_resumes(tiny: Any, tmp_path: Path) -> None:
    model = _trained(tiny)
    path = save_checkpoint(model, tmp_path / "model.ckpt")
    out = runner.invoke(app, ["generate", str(path), "-p", "def", "-n", "8", "--greedy"])
    assert out.exit_code == 0, out.output
    ids = torch.tensor([list(b"def")])
    for _ in range(8):  # greedy, as the command decodes
        ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    assert out.output.rstrip("\n") == ByteTokenizer().decode(ids[0].tolist())
    with pytest.raises(CheckpointError, match=r"not a run's step and optimizer state to continue: start a new run "
                                              r"from them with --init-from"):
        train(model.spec, resume=path)
    result = train(load_spec(model.spec, overrides=["training.max_steps=1"]), init_from=path)
    assert result.checkpoint is not None and load_checkpoint(result.checkpoint).step == 1


def test_load_weights_file_is_the_python_side_of_weights_with_spec(tiny: Any, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = _trained(tiny)
    save_file(model.state_dict(), tmp_path / "w.safetensors")
    loaded = load_weights_file(tmp_path / "w.safetensors", model.spec)
    ids = torch.randint(0, 256, (2, 9))
    assert torch.equal(loaded.model(ids).logits, model(ids).logits)
    assert isinstance(loaded.tokenizer, ByteTokenizer)
    # the spec as generate FILE --spec SPEC gives it: a YAML path (or a preset name, or a dict)
    (tmp_path / "spec.yaml").write_text(model.spec.to_yaml())
    from_file = load_weights_file(tmp_path / "w.safetensors", str(tmp_path / "spec.yaml"))
    assert from_file.spec == model.spec and isinstance(from_file.tokenizer, ByteTokenizer)
    assert torch.equal(from_file.model(ids).logits, model(ids).logits)


def test_a_spec_whose_bpe_is_trained_at_run_time_warns_when_saved_without_a_tokenizer(tiny: Any, tmp_path: Path) -> None:
    # the spec says to train a BPE on the data, not which one the model learned with: the
    # checkpoint cannot encode text, which generate would say only later
    spec = load_spec(tiny(), overrides=["vocab_size=300", "training.tokenizer={type: bpe, vocab_size: 300}"])
    model = build_model(spec)
    with pytest.warns(UserWarning, match=r"bpe.ckpt: the checkpoint carries no tokenizer: the spec's "
                                         r"training.tokenizer \(bpe\) is trained on the data at run time.*"
                                         r"give the one the model was trained with as tokenizer="):
        path = save_checkpoint(model, tmp_path / "bpe.ckpt")
    assert load_checkpoint(path).tokenizer is None
    out = runner.invoke(app, ["generate", str(path), "-p", "def", "-n", "2"])
    assert out.exit_code == 1
    assert "carries no tokenizer, so text cannot be encoded" in out.stderr
    assert "save_checkpoint(model, path, tokenizer=...)" in out.stderr
    with warnings.catch_warnings():  # a tokenizer given: nothing to say
        warnings.simplefilter("error")
        assert load_checkpoint(save_checkpoint(model, tmp_path / "b.ckpt", tokenizer=ByteTokenizer())).tokenizer
