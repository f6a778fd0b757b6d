"""An imported model's tokenizer template (its post-processor's special tokens: Llama's
``<s>``, BERT's ``[CLS]`` … ``[SEP]``) frames prompts as ``transformers``' ``tokenizer(text)``
does, so ``generate`` and ``fill-mask`` compute what ``transformers`` computes."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

transformers = pytest.importorskip(
    "transformers", reason="the [hf] extra (transformers) is not installed: pip install 'specformer[hf]'"
)

from specformer.cli import app  # noqa: E402
from specformer.data.tokenizers import file_tokenizer  # noqa: E402
from specformer.specs.loader import load_spec  # noqa: E402
from specformer.training.checkpoint import FORMAT_VERSION, read_weights  # noqa: E402
from specformer.training.generate import encode_prompt  # noqa: E402

pytestmark = pytest.mark.reference
runner = CliRunner()
TEXT = ["The model is here and the model is there, said the modeller to the other model."] * 50


def _perturbed(model: Any, seed: int) -> Any:
    """``model`` in eval mode with every parameter moved off its initialisation, so that no
    mapping passes by accident."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.config.architectures = [type(model).__name__]
    return model.eval()


def _llama_folder(tmp_path: Path) -> tuple[Path, Any]:
    """A tiny Llama saved as the Hub has one: its SentencePiece-style tokenizer.json puts
    ``<s>`` before every text (TemplateProcessing), and the model was trained so."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"]))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = _perturbed(transformers.LlamaForCausalLM(config), 1)
    folder = tmp_path / "llama"
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder, model


def _bert_folder(tmp_path: Path, head: str = "BertForMaskedLM", **settings: Any) -> tuple[Path, Any]:
    """A tiny BERT (or DistilBERT: ``head`` a ``DistilBert*`` class) whose WordPiece tokenizer.json
    frames every text as ``[CLS] … [SEP]`` (``head``: its class in transformers; ``settings``:
    more of its config)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(TEXT, trainers.WordPieceTrainer(vocab_size=120, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]")
    if head.startswith("DistilBert"):
        fast.model_input_names = ["input_ids", "attention_mask"]  # DistilBERT has no token types
        config = transformers.DistilBertConfig(
            vocab_size=tok.get_vocab_size(), dim=32, n_layers=2, n_heads=4, hidden_dim=64,
            max_position_embeddings=64, pad_token_id=0, **settings)
    else:
        config = transformers.BertConfig(
            vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, pad_token_id=0, **settings)
    torch.manual_seed(0)
    model = _perturbed(getattr(transformers, head)(config), 2)
    folder = tmp_path / "bert"
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder, model


def _imported_checkpoint(folder: Path, tmp_path: Path) -> Path:
    """``import-hf`` of ``folder``, as a checkpoint (the spec, its tokenizer and the weights)."""
    spec_path, weights = tmp_path / "my.yaml", tmp_path / "my.safetensors"
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(spec_path), "-w", str(weights)])
    assert result.exit_code == 0, result.output
    spec = load_spec(spec_path)
    assert spec.training.tokenizer.type == "file"
    tok = file_tokenizer(spec.training.tokenizer)
    ckpt = tmp_path / "imported.ckpt"
    torch.save({"specformer": {"format": FORMAT_VERSION, "spec": spec.to_dict(), "tokenizer": tok.state()},
                "state_dict": {f"model.{k}": v for k, v in read_weights(weights).items()}, "global_step": 0}, ckpt)
    return ckpt


def _imported_source(folder: Path, tmp_path: Path, source: str) -> list[str]:
    """The command-line source of an imported model: a checkpoint, or the weights
    ``import-hf`` wrote with ``--spec`` the spec it wrote (no training in between)."""
    ckpt = _imported_checkpoint(folder, tmp_path)
    return [str(ckpt)] if source == "checkpoint" else [str(tmp_path / "my.safetensors"), "--spec", str(tmp_path / "my.yaml")]


@pytest.mark.parametrize("source", ["checkpoint", "weights"])
def test_generate_of_an_imported_llama_starts_from_its_bos_as_transformers_does(
    tmp_path: Path, monkeypatch, source: str
) -> None:
    folder, hf = _llama_folder(tmp_path)
    args = _imported_source(folder, tmp_path, source)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    prompt, n = "The model is", 12
    inputs = hf_tok(prompt, return_tensors="pt")
    assert inputs.input_ids[0, 0].item() == 1  # <s>
    hf.generation_config.eos_token_id = None  # all n tokens, as specformer's generate without --stop-at-eot
    theirs = hf.generate(**inputs, do_sample=False, max_new_tokens=n)[0].tolist()

    gen = importlib.import_module("specformer.training.generate")  # the module, not the function
    real, seen = gen.generate, {}

    def recording(model: Any, ids: Any, **kwargs: Any) -> Any:
        out = real(model, ids, **kwargs)
        seen["out"] = out[0].tolist()
        return out

    monkeypatch.setattr(gen, "generate", recording)
    result = runner.invoke(app, ["generate", *args, "--prompt", prompt, "-n", str(n), "--greedy"])
    assert result.exit_code == 0, result.output
    assert seen["out"] == theirs  # token for token, <s> included
    # the text shown is the prompt and what follows it, without the template's <s>
    # (the random model makes <unk>s, which are shown as generated tokens are)
    assert result.stdout == hf_tok.decode(theirs[1:], skip_special_tokens=False) + "\n"
    assert result.stdout.startswith(prompt) and "<s>" not in result.stdout


def test_encode_prompt_applies_the_template_and_heals_after_it(tmp_path: Path) -> None:
    folder, _ = _llama_folder(tmp_path)
    tok = file_tokenizer(load_spec(_imported_checkpoint_spec(folder, tmp_path)).training.tokenizer)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert tok.template() == ([1], [])
    assert encode_prompt(tok, "The model").ids == hf_tok("The model").input_ids
    assert encode_prompt(tok, "The model ", heal=False).ids == hf_tok("The model ").input_ids
    healed = encode_prompt(tok, "The model ")  # the trailing space healed, <s> kept
    assert healed.ids == hf_tok("The model").input_ids and healed.healed == " "
    assert encode_prompt(tok, "").ids == hf_tok("").input_ids == [1]  # an empty prompt starts from <s>


def _imported_checkpoint_spec(folder: Path, tmp_path: Path) -> Path:
    spec_path = tmp_path / "spec-only.yaml"
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(spec_path)])
    assert result.exit_code == 0, result.output
    return spec_path


@pytest.mark.parametrize("head", ["BertForMaskedLM", "DistilBertForMaskedLM"])
@pytest.mark.parametrize("source", ["checkpoint", "weights"])
def test_fill_mask_of_an_imported_bert_reads_cls_and_sep_as_transformers_does(
    tmp_path: Path, source: str, head: str
) -> None:
    folder, hf = _bert_folder(tmp_path, head)
    args = _imported_source(folder, tmp_path, source)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = "the model is [MASK] and the model is there."
    inputs = hf_tok(text, return_tensors="pt")
    assert inputs.input_ids[0, 0].item() == 2 and inputs.input_ids[0, -1].item() == 3  # [CLS] ... [SEP]
    with torch.no_grad():
        logits = hf(**inputs).logits[0]
    at = inputs.input_ids[0].tolist().index(hf_tok.mask_token_id)
    best = logits[at].softmax(-1).topk(3)

    result = runner.invoke(app, ["fill-mask", *args, text, "-k", "3"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = re.findall(r"│\s+(\d)\s+│\s+(\S+)\s+│\s+([\d.]+)\s+│", result.stdout)
    expected = [(str(r), repr(hf_tok.decode([i])), f"{p:.3f}")
                for r, (p, i) in enumerate(zip(best.values.tolist(), best.indices.tolist(), strict=True), 1)]
    assert rows == expected
    filled = next(line for line in result.stdout.splitlines() if line.startswith("filled:"))
    assert "[CLS]" not in filled and "[SEP]" not in filled
    ids = inputs.input_ids[0].tolist()
    ids[at] = best.indices[0].item()
    assert filled == "filled: " + hf_tok.decode(ids[1:-1])


@pytest.mark.parametrize("head", ["BertForSequenceClassification", "DistilBertForSequenceClassification"])
@pytest.mark.parametrize("source", ["checkpoint", "weights"])
def test_classify_of_an_imported_bert_classifier_gives_the_text_classification_pipelines_scores(
    tmp_path: Path, source: str, head: str
) -> None:
    import json

    folder, hf = _bert_folder(tmp_path, head, num_labels=3,
                              id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2})
    args = _imported_source(folder, tmp_path, source)
    texts = ["the model is here", "said the modeller to the other model.", "the model " * 40]  # the last: cut
    pipe = transformers.pipeline("text-classification", model=hf, tokenizer=transformers.AutoTokenizer
                                 .from_pretrained(folder), top_k=None, truncation=True, max_length=64)
    theirs = [{d["label"]: d["score"] for d in found} for found in pipe(texts)]

    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["classify", *args, *texts, "--top-k", "3", "-o", str(out), "--batch-size", "2"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "1 of the 3 texts is longer than 64 tokens" in " ".join(result.output.split())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["text"] for row in rows] == texts
    for row, scores in zip(rows, theirs, strict=True):
        ours = {row[f"prediction{s}"]: row[f"probability{s}"] for s in ("", "_2", "_3")}
        assert set(ours) == {"neg", "neu", "pos"}
        for label, p in scores.items():
            assert ours[label] == pytest.approx(p, abs=1e-5), (label, ours, scores)
        assert row["prediction"] == max(scores, key=scores.get)


# --------------------------------------------------------------------------- encoder-decoders

PAIRS = [("the model is here", "here is the model"), ("said the modeller", "the modeller said"),
         ("to the other model", "model other the to"), ("the model", "model the")]


def _seq2seq_folder(tmp_path: Path, family: str) -> tuple[Path, Any]:
    """A tiny T5 or BART saved as the Hub has one. T5's tokenizer.json ends a text with
    ``</s>`` and has no start token (its decoder starts from ``<pad>``); BART's frames a text
    as ``<s> … </s>`` and its decoder starts from ``</s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = {"t5": ["<pad>", "</s>", "<unk>"], "bart": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]}[family]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=120, special_tokens=specials))
    torch.manual_seed(0)
    if family == "t5":
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                                    unk_token="<unk>")
        config = transformers.T5Config(
            vocab_size=tok.get_vocab_size(), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout_rate=0.0)
        model = transformers.T5ForConditionalGeneration(config)
    else:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", pad_token="<pad>",
                                                    eos_token="</s>", unk_token="<unk>", mask_token="<mask>")
        config = transformers.BartConfig(
            vocab_size=tok.get_vocab_size(), d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
            max_position_embeddings=64, bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
            forced_eos_token_id=None, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
        model = transformers.BartForConditionalGeneration(config)
    model = _perturbed(model, 3)
    folder = tmp_path / family
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder, model


@pytest.mark.parametrize(("family", "start"), [("t5", "<pad>"), ("bart", "</s>")])
def test_an_imported_encoder_decoder_trains_on_pairs_as_transformers_fine_tunes_it(
    tmp_path: Path, family: str, start: str
) -> None:
    from specformer.builder import build_model
    from specformer.data.module import SpecDataModule, prepare
    from specformer.specs.schema import ModelSpec

    folder, hf = _seq2seq_folder(tmp_path, family)
    spec_path, weights = tmp_path / "my.yaml", tmp_path / "my.safetensors"
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(spec_path), "-w", str(weights)])
    assert result.exit_code == 0, result.output
    spec = load_spec(spec_path)
    assert spec.training.tokenizer.type == "file"  # the model's own tokenizer.json
    assert spec.training.objective.decoder_start == start  # T5 starts from <pad>, BART from </s>

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(f'{{"source": "{s}", "target": "{t}"}}\n' for s, t in PAIRS), encoding="utf-8")
    data = spec.to_dict()
    data["training"]["data"] = {"type": "pairs", "paths": [str(pairs)], "val_paths": [str(pairs)]}
    spec = ModelSpec.model_validate(data)
    module = SpecDataModule(spec)
    module.data = prepare(spec)
    batch = module._collator(0)(list(enumerate(module.data.train.pairs)))

    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    sources, targets = [s for s, _ in PAIRS], [t for _, t in PAIRS]
    order = [sources.index(hf_tok.decode(src, skip_special_tokens=True)) for src, _ in module.data.train.pairs]
    theirs = hf_tok([sources[i] for i in order], text_target=[targets[i] for i in order], padding=True,
                    return_tensors="pt")
    labels = theirs["labels"].masked_fill(theirs["labels"] == hf_tok.pad_token_id, -100)
    assert torch.equal(batch["input_ids"], theirs["input_ids"])
    assert torch.equal(batch["labels"], labels)  # T5: target </s>; BART: <s> target </s>
    assert batch["decoder_input_ids"][:, 0].tolist() == [hf.config.decoder_start_token_id] * len(PAIRS)

    model = build_model(spec)
    model.load_state_dict(read_weights(weights))
    model.eval()
    with torch.no_grad():
        ours = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                     decoder_input_ids=batch["decoder_input_ids"],
                     decoder_attention_mask=batch["decoder_attention_mask"], labels=batch["labels"]).loss
        expected = hf(input_ids=theirs["input_ids"], attention_mask=theirs["attention_mask"], labels=labels).loss
    assert abs(float(ours) - float(expected)) < 1e-5, (float(ours), float(expected))


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_generate_of_an_imported_encoder_decoder_starts_as_transformers_does(
    tmp_path: Path, family: str, monkeypatch
) -> None:
    folder, hf = _seq2seq_folder(tmp_path, family)
    ckpt = _imported_checkpoint(folder, tmp_path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    prompt, n = "the model is here", 10
    hf.generation_config.eos_token_id = None  # all n tokens
    theirs = hf.generate(**hf_tok(prompt, return_tensors="pt"), do_sample=False, max_new_tokens=n)[0].tolist()
    assert theirs[0] == hf.config.decoder_start_token_id

    gen = importlib.import_module("specformer.training.generate")
    real, seen = gen.generate_seq2seq, {}

    def recording(model: Any, ids: Any, **kwargs: Any) -> Any:
        seen["source"] = ids[0].tolist()
        out = real(model, ids, **kwargs)
        seen["out"] = out[0].tolist()
        return out

    monkeypatch.setattr(gen, "generate_seq2seq", recording)
    result = runner.invoke(app, ["generate", str(ckpt), "--prompt", prompt, "-n", str(n)])
    assert result.exit_code == 0, result.output
    assert seen["source"] == hf_tok(prompt).input_ids
    assert seen["out"] == theirs[1:]  # token for token, after the same start token
    assert result.stdout == hf_tok.decode(theirs[1:]) + "\n"

    # a fine-tuned BART's output opens with its template's <s> and ends with </s>: the
    # text shown is what lies between (a stand-in decoder emits those ids)
    def emitting(model: Any, ids: Any, *, on_token: Any, **kwargs: Any) -> Any:
        for i in [*hf_tok("here is", add_special_tokens=True).input_ids]:
            on_token(torch.tensor([i]))

    monkeypatch.setattr(gen, "generate_seq2seq", emitting)
    result = runner.invoke(app, ["generate", str(ckpt), "--prompt", prompt])
    assert result.exit_code == 0, result.output
    assert result.stdout == hf_tok.decode(hf_tok("here is", add_special_tokens=False).input_ids) + "\n"

    # exported back, the config names the same start token, and transformers decodes the same
    out = tmp_path / "exported"
    result = runner.invoke(app, ["export-hf", str(ckpt), "-o", str(out)])
    assert result.exit_code == 0, result.output
    back = type(hf).from_pretrained(out).eval()
    assert back.config.decoder_start_token_id == hf.config.decoder_start_token_id
    back.generation_config.eos_token_id = None
    again = back.generate(**hf_tok(prompt, return_tensors="pt"), do_sample=False, max_new_tokens=n)[0].tolist()
    assert again == theirs


def test_bart_generation_forces_its_start_and_end_tokens_as_transformers_does(tmp_path: Path, monkeypatch) -> None:
    """A BART whose generation_config.json forces ``<s>`` first and ``</s>`` at the length
    limit (facebook/bart-large's forced_bos_token_id 0 and forced_eos_token_id 2): the
    imported spec names both tokens, generate and beam search give transformers' ids, and
    the export forces them again."""
    folder, hf = _seq2seq_folder(tmp_path, "bart")
    hf.generation_config.forced_bos_token_id, hf.generation_config.forced_eos_token_id = 0, 2
    hf.generation_config.save_pretrained(folder)
    spec_path, weights = tmp_path / "my.yaml", tmp_path / "my.safetensors"
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(spec_path), "-w", str(weights)])
    assert result.exit_code == 0, result.output
    assert "forced_start: <s>" in result.output and "forced_end: </s>" in result.output
    objective = load_spec(spec_path).training.objective
    assert (objective.decoder_start, objective.forced_start, objective.forced_end) == ("</s>", "<s>", "</s>")

    gen = importlib.import_module("specformer.training.generate")
    seen = {}

    def recording(name: str) -> Any:
        real = getattr(gen, name)

        def record(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            seen["out"] = out[0].tolist()
            return out
        return record

    monkeypatch.setattr(gen, "generate_seq2seq", recording("generate_seq2seq"))
    monkeypatch.setattr(gen, "beam_search", recording("beam_search"))
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = hf_tok("the model is here", return_tensors="pt")
    source = [str(weights), "--spec", str(spec_path), "--prompt", "the model is here"]
    for n, beams in ((1, 1), (2, 1), (6, 1), (6, 3)):
        theirs = hf.generate(**ids, do_sample=False, num_beams=beams, max_new_tokens=n)[0].tolist()
        assert theirs[1] == (2 if n == 1 else 0) and theirs[-1] == 2  # <s> first, </s> at the limit (which wins)
        result = runner.invoke(app, ["generate", *source, "-n", str(n), "--num-beams", str(beams)])
        assert result.exit_code == 0, result.output
        assert seen["out"] == theirs[1:], (n, beams)

    out = tmp_path / "exported"
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    back = type(hf).from_pretrained(out).eval()
    assert (back.generation_config.forced_bos_token_id, back.generation_config.forced_eos_token_id) == (0, 2)
    assert back.generate(**ids, do_sample=False, max_new_tokens=6).tolist() == hf.generate(
        **ids, do_sample=False, max_new_tokens=6).tolist()


def test_import_hf_names_the_generation_settings_generate_does_not_read(tmp_path: Path) -> None:
    folder, hf = _llama_folder(tmp_path)
    hf.generation_config.eos_token_id = [2, 0]
    hf.generation_config.num_beams, hf.generation_config.no_repeat_ngram_size = 4, 3
    hf.generation_config.temperature = 1.0  # transformers' default: no setting
    hf.generation_config.save_pretrained(folder)
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(tmp_path / "my.yaml")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "generation settings specformer generate does not read" in said
    assert "num_beams=4 (give --num-beams 4)" in said and "no_repeat_ngram_size=3 (give --no-repeat-ngram 3)" in said
    assert "eos_token_id=[2, 0]" in said and "temperature" not in said

    hf.generation_config.eos_token_id = 0  # <unk>: not the token the tokenizer ends a text with
    hf.generation_config.save_pretrained(folder)
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(tmp_path / "other.yaml")])
    assert "eos_token_id=0 (an output ends at the tokenizer's end token instead: </s> (2))" in " ".join(
        result.output.split())


@pytest.mark.parametrize("family", ["bert", "llama", "t5", "bart"])
def test_an_exported_import_names_the_tokenizers_special_tokens_as_the_original(tmp_path: Path, family: str) -> None:
    """The exported tokenizer_config.json names the unknown, classification and separator
    tokens the model's own does (BERT's [UNK], [CLS], [SEP]; Llama's <unk>), so
    ``tokenizer.sep_token_id`` and ``unk_token_id`` are what they were."""
    if family in ("t5", "bart"):
        folder, _ = _seq2seq_folder(tmp_path, family)
    else:
        folder, _ = {"bert": _bert_folder, "llama": _llama_folder}[family](tmp_path)
    spec_path, weights, out = tmp_path / "my.yaml", tmp_path / "my.safetensors", tmp_path / "exported"
    assert runner.invoke(app, ["import-hf", str(folder), "-o", str(spec_path), "-w", str(weights)]).exit_code == 0
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    theirs, back = transformers.AutoTokenizer.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(out)
    for name in ("unk_token", "cls_token", "sep_token", "pad_token", "mask_token", "eos_token"):
        if getattr(theirs, name) is not None:
            assert getattr(back, name) == getattr(theirs, name), name
    assert back.unk_token_id is not None
    assert back("the model zzz").input_ids == theirs("the model zzz").input_ids


def test_import_hf_says_where_the_chat_template_is_used(tmp_path: Path) -> None:
    folder, _ = _llama_folder(tmp_path)
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(tmp_path / "plain.yaml")])
    assert result.exit_code == 0 and "chat template" not in result.output
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    tok.save_pretrained(folder)  # chat_template.jinja (transformers 5) or tokenizer_config.json's chat_template
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(tmp_path / "chat.yaml")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert ("the tokenizer has a chat template (chat_template.jinja): generate --chat frames a prompt as a user "
            "turn, training.objective: {type: sft, chat_template: true} fine-tunes") in said


def test_import_hf_says_why_a_bart_without_its_tokenizer_forces_nothing(tmp_path: Path) -> None:
    """A BART folder without tokenizer.json: its forced tokens are not read, since the spec
    names them by their strings there, and the note says that the folder lacks the file
    (bug: it said the spec names a token of the model's tokenizer.json, which it did not have)."""
    config = transformers.BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32)
    folder = tmp_path / "bart"
    transformers.BartForConditionalGeneration(config).save_pretrained(folder)
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(tmp_path / "my.yaml")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert ("forced_eos_token_id=2 (not read: the folder has no tokenizer.json, in which the spec names the "
            "token; set training.objective.forced_end to the token)") in said  # BartConfig's default
