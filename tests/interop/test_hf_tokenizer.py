"""A checkpoint's tokenizer on export: its special ids in config.json (None without one,
never a family's defaults) and its tokenizer.json, which transformers loads."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from specformer.builder import build_model
from specformer.cli import app
from specformer.data.tokenizers import ByteTokenizer, HFTokenizer, TaskTokenizer, Tokenizer
from specformer.interop.hf import HFConversionError, save_hf
from specformer.interop.hf_config import hf_config_from_spec, spec_from_hf_config
from specformer.interop.hf_tokenizer import hf_tokenizer_json
from specformer.specs.loader import load_spec
from specformer.specs.schema import ModelSpec

runner = CliRunner()
STDLIB = Path(sysconfig.get_paths()["stdlib"])
TEXTS = ["def f(x):\n    return {'a': [1, 2.5]}  # héllo ☃", "reverse: abc+12=xyz", "", "a<pad>b<mask>c<|endoftext|>"]


def _bpe(vocab_size: int = 300) -> HFTokenizer:
    """A byte-level BPE trained as ``training.tokenizer: {type: bpe}`` trains one."""
    from tokenizers import Tokenizer as _Tok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from specformer.data.tokenizers import EOT, MASK, PAD

    tok = _Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT, PAD, MASK],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([(STDLIB / "json" / "decoder.py").read_text()], trainer=trainer)
    return HFTokenizer(tok)


def _t5_spec() -> ModelSpec:
    return spec_from_hf_config({"model_type": "t5", "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 1,
                                "num_heads": 4, "vocab_size": 64, "feed_forward_proj": "relu"}, name="tiny-t5")


# every tokenizer type a checkpoint can store, each with a spec it fits
TOKENIZERS: dict[str, Any] = {
    "byte": lambda: (ByteTokenizer(), load_spec("gpt-nano", ["decoder.n_layers=1"])),
    "task": lambda: (TaskTokenizer(), _t5_spec()),
    "bpe": lambda: (_bpe(), load_spec("gpt-nano", ["decoder.n_layers=1", "vocab_size=300"])),
}


def _ids(tok: Tokenizer) -> dict[str, int | None]:
    return {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_tokenizer_json_encodes_like_the_tokenizer(kind: str) -> None:
    from tokenizers import Tokenizer as _Tok

    tok, _ = TOKENIZERS[kind]()
    theirs = _Tok.from_str(hf_tokenizer_json(tok.state()))
    assert theirs.get_vocab_size(with_added_tokens=True) == tok.vocab_size
    for text in TEXTS:
        assert theirs.encode(text, add_special_tokens=False).ids == tok.encode(text)
        if kind != "task":  # the task alphabet has no letters for most of TEXTS
            # the byte tokenizer's decode left <pad> and <mask> out where the exported one keeps them
            ids = tok.encode(text)
            assert tok.decode(ids) == theirs.decode(ids, skip_special_tokens=False), text
    for name in ("bos_id", "eos_id", "pad_id", "mask_id"):
        i = getattr(tok, name)
        assert i is None or theirs.id_to_token(i) is not None


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_export_carries_the_tokenizer_and_its_special_ids(kind: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    tok, spec = TOKENIZERS[kind]()
    torch.manual_seed(0)
    save_hf(build_model(spec), spec, tmp_path, tokenizer=tok)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    got = {key: getattr(config, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    assert got == _ids(tok)
    assert all(i is None or 0 <= i < config.vocab_size for i in got.values())
    if spec.kind == "encoder-decoder":  # specformer's decoder starts from bos unless the spec names another
        assert config.decoder_start_token_id == tok.bos_id is not None
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert hf_tok.encode(text) == tok.encode(text)
    assert (hf_tok.eos_token_id, hf_tok.pad_token_id) == (tok.eos_id, tok.pad_id)


def test_export_of_a_trained_checkpoint_through_the_command_line(tmp_path: Path, monkeypatch) -> None:
    """`specformer train` with a 512-token BPE, then `specformer export-hf` (bug: the config
    had GPT-2's 50256 as bos/eos, outside the vocabulary)."""
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    train = pytest.importorskip("specformer.training.run", reason="training is not available").train
    from specformer.training.checkpoint import load_checkpoint

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFORMER_CACHE", str(tmp_path / "cache"))
    spec = load_spec("gpt-nano", ["decoder.n_layers=1", "d_model=32", "max_seq_len=64", "training.seq_len=32"])
    training = {"batch_size": 4, "max_steps": 2, "val_interval": 2, "val_batches": 1,
                "num_workers": 0, "accelerator": "cpu", "devices": 1, "out_dir": str(tmp_path / "runs"),
                "data": {"type": "files", "paths": [str(STDLIB / "json" / "*.py")]},
                "tokenizer": {"type": "bpe"}}
    data = spec.to_dict()
    data["training"] = {**data["training"], **training}
    result = train(load_spec(data), progress=False)
    tok = load_checkpoint(result.checkpoint).tokenizer
    assert tok.vocab_size == 512 and tok.eos_id is not None

    out = tmp_path / "hf"
    cli = runner.invoke(app, ["export-hf", result.run_dir, "-o", str(out)])
    assert cli.exit_code == 0, cli.output
    assert "tokenizer.json" in cli.output
    config = transformers.AutoConfig.from_pretrained(out)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (tok.bos_id, tok.eos_id, tok.pad_id)
    assert all(i is None or 0 <= i < 512 for i in (config.bos_token_id, config.eos_token_id, config.pad_token_id))
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        assert hf_tok.encode(text) == tok.encode(text)
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.generation_config.eos_token_id == tok.eos_id


@pytest.mark.parametrize("preset", ["gpt-nano", "bert-nano"])
def test_export_without_a_tokenizer_has_no_token_ids(preset: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    spec = load_spec(preset)
    save_hf(build_model(spec), spec, tmp_path)
    assert not (tmp_path / "tokenizer.json").exists()
    written = json.loads((tmp_path / "config.json").read_text())
    assert {written[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")} == {None}
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    # not GPT-2's 50256 (or BERT's 0): the model has no such token to name
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (None, None, None)


def test_export_of_weights_and_a_spec_has_no_token_ids(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    spec = load_spec("gpt-nano", ["decoder.n_layers=1"])
    save_file(build_model(spec).state_dict(), str(tmp_path / "w.safetensors"))
    result = runner.invoke(app, ["export-hf", str(tmp_path / "w.safetensors"), "--spec", _spec_file(spec, tmp_path),
                                 "-o", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    assert "bos/eos/pad token ids are null" in result.output
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (None, None, None)


def _spec_file(spec: ModelSpec, tmp_path: Path) -> str:
    from specformer.specs.loader import dump_yaml

    path = tmp_path / "spec.yaml"
    path.write_text(dump_yaml(spec.to_dict()))
    return str(path)


def test_token_ids_outside_the_vocabulary_are_refused() -> None:
    spec = load_spec("gpt-nano")
    with pytest.raises(HFConversionError, match=r"eos_token_id = 50256 is not a token of the model \(vocab_size 512\)"):
        hf_config_from_spec(spec, token_ids={"eos_token_id": 50256})


def test_roberta_keeps_the_pad_id_that_places_its_positions() -> None:
    spec = spec_from_hf_config({"model_type": "roberta", "hidden_size": 32, "num_hidden_layers": 1,
                                "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 300,
                                "max_position_embeddings": 66, "pad_token_id": 1})
    warnings: list[str] = []
    config = hf_config_from_spec(spec, token_ids=_ids(ByteTokenizer()), warnings=warnings)
    assert config["pad_token_id"] == 1 and config["eos_token_id"] == 256
    assert any("pad_token_id is 1 (it sets the position offset)" in w for w in warnings)
    assert spec_from_hf_config(config) == spec


def test_tokenizer_config_names_robertas_cls_sep_and_unk() -> None:
    # a byte-level BPE's model has no unknown token, and RoBERTa's post-processor names
    # <s> and </s> as its classification and separator tokens
    from tokenizers import ByteLevelBPETokenizer, processors

    from specformer.interop.hf_tokenizer import hf_tokenizer_files

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["the model is here"] * 20, vocab_size=280,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok = bpe._tokenizer
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    config = json.loads(hf_tokenizer_files({"type": "hf", "json": tok.to_str()})["tokenizer_config.json"])
    assert {k: config.get(k) for k in ("cls_token", "sep_token", "unk_token", "pad_token", "mask_token")} == {
        "cls_token": "<s>", "sep_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}


def test_an_exported_bpe_reads_a_mask_as_fill_mask_does(tmp_path: Path) -> None:
    """A trained BPE's word carries the space before it, and was masked with it: fill-mask
    reads "import <mask>" as `import` + `<mask>`. The exported tokenizer.json marks `<mask>`
    lstrip (as RoBERTa's), so transformers' fill-mask pipeline reads the same ids and gives
    the same probabilities (bug: it read a lone " " token before the mask)."""
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    from specformer.cli.train_cmds import _encode_with_masks

    tok = _bpe()
    spec = load_spec("bert-nano", ["encoder.n_layers=1", "vocab_size=300"])
    torch.manual_seed(0)
    model = build_model(spec).eval()
    save_hf(model, spec, tmp_path, tokenizer=tok)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in ("import <mask>", "x = <mask>(y) <mask>", "<mask> json"):
        ours = _encode_with_masks(tok, text)
        assert hf_tok(text).input_ids == ours
    text = "def <mask>(self):"
    ids = _encode_with_masks(tok, text)
    with torch.no_grad():
        probs = model(torch.tensor([ids])).logits[0, ids.index(tok.mask_id)].softmax(-1)
    hf_model = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path)
    got = transformers.pipeline("fill-mask", model=hf_model, tokenizer=hf_tok, top_k=3)(text)
    assert [d["token"] for d in got] == probs.topk(3).indices.tolist()
    assert [d["score"] for d in got] == pytest.approx(probs.topk(3).values.tolist(), abs=1e-6)
    # the text itself encodes as before: the flag only takes the space before a mask
    for text in TEXTS:
        assert hf_tok.encode(text) == tok.encode(text)
    # another tokenizer.json (an imported model's) is written as it is
    other = json.loads(tok.tok.to_str())
    other["added_tokens"][2]["content"] = "[MASK]"
    from specformer.interop.hf_tokenizer import hf_tokenizer_json
    assert hf_tokenizer_json({"type": "hf", "json": json.dumps(other)}) == json.dumps(other)


def test_fill_mask_gives_the_pipelines_probabilities_when_the_bpe_ended_below_vocab_size(tmp_path: Path) -> None:
    # a BPE trained on a small corpus stops below the spec's vocab_size: fill-mask ranks the
    # tokenizer's ids alone, but its probabilities are BertForMaskedLM's, over every id
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    from safetensors.torch import save_file

    tok = _bpe()
    assert tok.vocab_size == 300
    out = tmp_path / "hf"
    spec = load_spec("bert-nano", ["encoder.n_layers=1", "vocab_size=400"])
    torch.manual_seed(0)
    model = build_model(spec).eval()
    save_hf(model, spec, out, tokenizer=tok)
    spec = load_spec(spec, [f"training.tokenizer={{type: file, path: {out / 'tokenizer.json'}}}"])
    (tmp_path / "spec.yaml").write_text(spec.to_yaml())
    save_file(model.state_dict(), str(tmp_path / "w.safetensors"))
    text = "def <mask>(self):"
    result = runner.invoke(app, ["fill-mask", str(tmp_path / "w.safetensors"), "--spec", str(tmp_path / "spec.yaml"),
                                 text, "-k", "3"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    import re

    shown = [float(p) for p in re.findall(r"│\s+\d\s+│\s+\S+\s+│\s+([\d.]+)\s+│", result.stdout)]
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    inputs = hf_tok(text, return_tensors="pt")
    with torch.no_grad():
        logits = transformers.AutoModelForMaskedLM.from_pretrained(out)(**inputs).logits[0]
    at = inputs.input_ids[0].tolist().index(hf_tok.mask_token_id)
    probs = logits[at].softmax(-1)  # what the pipeline scores, over all 400 ids
    assert shown == [round(p, 3) for p in probs[:300].topk(3).values.tolist()]
    assert shown != [round(p, 3) for p in logits[at, :300].softmax(-1).topk(3).values.tolist()]
