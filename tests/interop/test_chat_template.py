"""An instruct model's chat template: ``sft`` with ``chat_template: true`` renders each pair as a
user turn and an assistant turn, and ``generate --chat`` a prompt as a user turn with the
generation prompt, token for token as ``transformers``' ``apply_chat_template`` does."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

transformers = pytest.importorskip(
    "transformers", reason="the [hf] extra (transformers) is not installed: pip install 'specformer[hf]'"
)

from specformer.cli import app  # noqa: E402
from specformer.data.chat import NotAPrefixError, read_chat_template  # noqa: E402
from specformer.data.collate import IGNORE_INDEX, SFTCollator  # noqa: E402
from specformer.data.corpus import DataError  # noqa: E402
from specformer.data.module import prepare  # noqa: E402
from specformer.data.tokenizers import file_tokenizer  # noqa: E402
from specformer.specs.errors import SpecError  # noqa: E402
from specformer.specs.loader import load_spec  # noqa: E402
from specformer.training.generate import chat_prompt  # noqa: E402
from specformer.training.run import train  # noqa: E402

pytestmark = pytest.mark.reference
runner = CliRunner()

# Meta-Llama-3-8B-Instruct's template (bos_token comes from the tokenizer's special tokens)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# SmolLM2-Instruct's ChatML template, with its default system turn
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# renders the last turn differently: a user turn alone is not the start of the user + assistant rendering
NOT_A_PREFIX = (
    "{% for m in messages %}{{ m['role'] }}{% if loop.last %}!{% endif %}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<|im_start|>", "<|im_end|>"]
WORDS = ["red", "blue", "cat", "dog", "sun", "sky", "big", "old"]
TEXT = ["user assistant system You are a helpful AI assistant named SmolLM, trained by Hugging Face"] * 20 + [
    "reverse " + " ".join(WORDS[i:] + WORDS[:i]) for i in range(8)] * 20


def _chat_folder(tmp_path: Path, template: str | None, name: str = "chat",
                 eos: str = "<|endoftext|>") -> tuple[Path, Any]:
    """A tiny Llama saved as an instruct model is: a byte-level BPE tokenizer.json whose chat
    tokens are special, and the chat template beside it (None: no template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                                eos_token=eos)
    if template is not None:
        fast.chat_template = template
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128, bos_token_id=1, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.config.architectures = ["LlamaForCausalLM"]
    folder = tmp_path / name
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder, model.eval()


def _ids(hf_tok: Any, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
    out = hf_tok.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def _turns(prompt: str, response: str | None = None) -> list[dict[str, str]]:
    user = [{"role": "user", "content": prompt}]
    return user if response is None else [*user, {"role": "assistant", "content": response}]


def _imported(folder: Path, tmp_path: Path) -> tuple[Path, Path]:
    spec_path, weights = tmp_path / "my.yaml", tmp_path / "my.safetensors"
    result = runner.invoke(app, ["import-hf", str(folder), "-o", str(spec_path), "-w", str(weights)])
    assert result.exit_code == 0, result.output
    return spec_path, weights


def _sft_spec(spec_path: Path, tmp_path: Path, train_path: Path, val_path: Path, **training: Any) -> Any:
    raw = load_spec(spec_path).to_dict()
    raw["training"].update(
        objective={"type": "sft", "chat_template": True},
        data={"type": "pairs", "paths": [str(train_path)], "val_paths": [str(val_path)]},
        out_dir=str(tmp_path / "runs"), cache_dir=str(tmp_path / "cache"), num_workers=0, accelerator="cpu",
        devices=1, seq_len=96, **training)
    return load_spec(raw)


def _jsonl(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in pairs))
    return path


PAIRS = [("What is the sky?", "Blue, mostly."), (" reverse red cat ", "cat red\nreverse"), ("big", "old dog")]


@pytest.mark.parametrize("template", [LLAMA3, CHATML], ids=["llama3", "chatml"])
def test_prompt_and_full_rendering_are_apply_chat_template_s_ids(tmp_path: Path, template: str) -> None:
    folder, _ = _chat_folder(tmp_path, template)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    chat = read_chat_template(folder / "tokenizer.json")
    assert chat.template == template and chat.special_tokens["bos_token"] == "<|begin_of_text|>"
    tok = file_tokenizer(load_spec(_imported(folder, tmp_path)[0]).training.tokenizer)
    for (prompt, response), ids in zip(PAIRS, chat.pair_ids(tok, PAIRS), strict=True):
        assert not isinstance(ids, int)
        want_prompt = _ids(hf_tok, _turns(prompt), add_generation_prompt=True)
        assert ids[0] == want_prompt
        assert ids[0] + ids[1] == _ids(hf_tok, _turns(prompt, response))
        assert chat_prompt(tok, prompt, chat).ids == want_prompt
    # the end of the assistant's turn is the template's own: no end token added
    if template == CHATML:
        assert tok.decode(ids[1]) == "old dog<|im_end|>\n"
    else:
        assert tok.decode(ids[1]) == "old dog<|eot_id|>"


def test_sft_with_the_chat_template_puts_the_loss_on_the_assistant_turn_and_lowers_it(tmp_path: Path) -> None:
    folder, _ = _chat_folder(tmp_path, CHATML)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    spec_path, _ = _imported(folder, tmp_path)
    rng = __import__("random").Random(0)
    pairs = []
    for _ in range(120):
        words = rng.sample(WORDS, rng.randint(2, 4))
        pairs.append((f"reverse {' '.join(words)}", " ".join(reversed(words))))
    train_path, val_path = _jsonl(tmp_path / "train.jsonl", pairs[:100]), _jsonl(tmp_path / "val.jsonl", pairs[100:])
    spec = _sft_spec(spec_path, tmp_path, train_path, val_path, batch_size=8, max_steps=30, val_interval=15,
                     val_batches=2, log_interval=5, optimizer={"type": "adamw", "lr": 3e-3},
                     schedule={"type": "constant", "warmup_steps": 0})
    data = prepare(spec)
    assert "each a user turn and an assistant turn of the chat template" in data.description
    for (prompt, response), (p_ids, r_ids) in zip(pairs[:3], data.train.pairs[:3], strict=True):
        assert p_ids == _ids(hf_tok, _turns(prompt), add_generation_prompt=True)
        assert p_ids + r_ids == _ids(hf_tok, _turns(prompt, response))
    rows = [data.train.pairs[0], data.train.pairs[1]]
    batch = SFTCollator(pad_id=data.tokenizer.pad_id or data.tokenizer.eot_id)([(0, r) for r in rows])
    width = batch["labels"].shape[1]
    for i, (p_ids, r_ids) in enumerate(rows):
        full = p_ids + r_ids
        scored = [j for j in range(width) if batch["labels"][i, j] != IGNORE_INDEX]
        # label j is token j + 1: -100 on every prompt position and the padding, the assistant's tokens after
        assert scored == list(range(len(p_ids) - 1, len(full) - 1))
        assert batch["labels"][i, scored].tolist() == r_ids
    assert width == max(len(p) + len(r) for p, r in rows) - 1

    result = train(spec, progress=False)
    losses = [h["val/loss"] for h in result.history]
    assert len(losses) == 2 and losses[-1] < losses[0] - 0.3, losses


def test_generate_chat_frames_the_prompt_as_apply_chat_template_and_generates_as_transformers(
    tmp_path: Path, monkeypatch
) -> None:
    folder, hf = _chat_folder(tmp_path, LLAMA3)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    spec_path, weights = _imported(folder, tmp_path)
    prompt, n = "reverse red cat", 10
    ids = _ids(hf_tok, _turns(prompt), add_generation_prompt=True)
    hf.generation_config.eos_token_id = None  # all n tokens, as specformer's generate without --stop-at-eot
    theirs = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         do_sample=False, max_new_tokens=n)[0].tolist()

    seen = _recorded_generate(monkeypatch)
    args = ["generate", str(weights), "--spec", str(spec_path), "--prompt", prompt, "-n", str(n), "--greedy",
            "--no-stop-at-eot"]
    result = runner.invoke(app, [*args, "--chat"])
    assert result.exit_code == 0, result.output
    assert seen["out"] == theirs  # token for token, the template's tokens included
    # the user's turn, then the reply on a line of its own (not glued on, as plain text goes on)
    assert result.stdout == prompt + "\n" + hf_tok.decode(theirs[len(ids):]) + "\n"
    # without --chat (a spec that fine-tuned with no chat template) the prompt is plain text
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen["out"][: len(hf_tok(prompt, add_special_tokens=False).input_ids)] == hf_tok(
        prompt, add_special_tokens=False).input_ids


def test_generate_chat_stops_at_the_end_of_the_assistant_s_turn(tmp_path: Path, monkeypatch) -> None:
    folder, _ = _chat_folder(tmp_path, CHATML)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_end|>"}))  # SmolLM2's
    spec_path, weights = _imported(folder, tmp_path)
    tok = file_tokenizer(load_spec(spec_path).training.tokenizer)
    end = tok.token_id("<|im_end|>")
    assert end is not None and end != tok.eot_id
    made = [*tok.encode("ab", specials=False), end, *tok.encode("cd", specials=False)]
    gen = importlib.import_module("specformer.training.generate")
    for flags, said in ((["--chat"], "hi\nab\n"), (["--chat", "--no-stop-at-eot"], None), ([], None)):
        steps = iter(made)
        monkeypatch.setattr(gen, "sample_next", lambda logits, steps=steps, **_: torch.tensor([next(steps)]))
        result = runner.invoke(app, ["generate", str(weights), "--spec", str(spec_path), "--prompt", "hi ",
                                     "-n", str(len(made)), *flags])
        assert result.exit_code == 0, result.output
        if said is not None:
            assert result.stdout == said
        else:  # past the end of turn (without --chat, an imported spec's generate stops nowhere by default)
            assert result.stdout.rstrip("\n").endswith("cd"), result.stdout


def test_export_hf_writes_the_chat_template_back(tmp_path: Path) -> None:
    folder, _ = _chat_folder(tmp_path, LLAMA3)
    spec_path, weights = _imported(folder, tmp_path)
    out = tmp_path / "exported"
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "chat_template.jinja").read_text(encoding="utf-8") == LLAMA3
    theirs, back = transformers.AutoTokenizer.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(out)
    for prompt, response in PAIRS:
        assert _ids(back, _turns(prompt, response)) == _ids(theirs, _turns(prompt, response))
    # a tokenizer with none is written without one
    plain, _ = _chat_folder(tmp_path, None, name="plain")
    spec_path, weights = _imported(plain, tmp_path / "plain")
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(tmp_path / "out2")])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out2" / "chat_template.jinja").exists()


def test_export_hf_stops_where_generate_chat_stops(tmp_path: Path, monkeypatch) -> None:
    # ChatML saved as SmolLM2-Instruct is: the tokenizer's eos_token is the end of a turn, <|im_end|>,
    # while specformer's end-of-text token is <|endoftext|>
    folder, _ = _chat_folder(tmp_path, CHATML, eos="<|im_end|>")
    spec_path, weights = _imported(folder, tmp_path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    end, eot = hf_tok.convert_tokens_to_ids("<|im_end|>"), hf_tok.convert_tokens_to_ids("<|endoftext|>")
    out = tmp_path / "exported"
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    assert config["eos_token_id"] == end  # as an instruct model's config.json has it
    assert generation["eos_token_id"] == [end, eot]  # and its generation_config.json: the turn's end first
    back = transformers.AutoTokenizer.from_pretrained(out)
    assert back.eos_token_id == end
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert loaded.generation_config.eos_token_id == [end, eot]
    # generate --chat stops at that id
    gen = importlib.import_module("specformer.training.generate")
    seen: dict[str, Any] = {}
    real = gen.generate
    monkeypatch.setattr(gen, "generate", lambda *a, **k: seen.update(k) or real(*a, **k))
    result = runner.invoke(app, ["generate", str(weights), "--spec", str(spec_path), "--prompt", "hi", "--chat",
                                 "-n", "3"])
    assert result.exit_code == 0, result.output
    assert seen["eos_id"] == end
    # without a chat template, or where the turn ends at the end-of-text token, nothing changes
    plain, _ = _chat_folder(tmp_path, None, name="plain")
    spec_path, weights = _imported(plain, tmp_path / "plain")
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(tmp_path / "out2")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out2" / "config.json").read_text())["eos_token_id"] == eot
    assert not (tmp_path / "out2" / "generation_config.json").exists()


def test_chat_template_errors_name_what_is_missing_and_where(tmp_path: Path, monkeypatch) -> None:
    # a tokenizer with no chat template
    plain, _ = _chat_folder(tmp_path, None, name="plain")
    with pytest.raises(DataError, match=r"training.tokenizer.path: the tokenizer in .*plain has no chat template"):
        read_chat_template(plain / "tokenizer.json")
    spec_path, weights = _imported(plain, tmp_path)
    result = runner.invoke(app, ["generate", str(weights), "--spec", str(spec_path), "--prompt", "hi", "--chat"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "has no chat template" in said and "generate --no-chat reads a prompt" in said

    # a template whose prompt rendering is not the start of the full one: the pair's line is named
    odd, _ = _chat_folder(tmp_path, NOT_A_PREFIX, name="odd")
    spec_path, _ = _imported(odd, tmp_path)
    train_path = _jsonl(tmp_path / "t.jsonl", PAIRS)
    spec = _sft_spec(spec_path, tmp_path, train_path, _jsonl(tmp_path / "v.jsonl", PAIRS[:1]))
    with pytest.raises(NotAPrefixError, match=r"training.data.paths: .*t.jsonl:1: the chat template's rendering "
                                              r"of the prompt .* is not the start of its rendering with the response"):
        prepare(spec)

    # chat_template with a tokenizer that has no folder to keep one
    raw = spec.to_dict()
    raw["training"]["tokenizer"] = {"type": "byte"}
    with pytest.raises(SpecError, match="training.objective.chat_template"):
        load_spec(raw)

    # without transformers (nor the jinja2 it brings), the error says what to install
    from specformer.data.chat import _jinja_renderer

    chat = read_chat_template(odd)
    for name in ("transformers", "transformers.utils", "transformers.utils.chat_template_utils", "jinja2"):
        monkeypatch.setitem(sys.modules, name, None)
    _jinja_renderer.cache_clear()
    with pytest.raises(DataError, match=r"pip install 'specformer\[hf\]'"):
        chat.render(_turns("hi"))
    _jinja_renderer.cache_clear()


def _recorded_generate(monkeypatch) -> dict[str, list[int]]:
    """generate's output ids, recorded as the command runs (``seen["out"]``)."""
    gen = importlib.import_module("specformer.training.generate")
    real, seen = gen.generate, {}

    def recording(model: Any, ids: Any, **kwargs: Any) -> Any:
        out = real(model, ids, **kwargs)
        seen["out"] = out[0].tolist()
        return out

    monkeypatch.setattr(gen, "generate", recording)
    return seen


def test_a_checkpoint_keeps_the_chat_template_with_its_tokenizer(tmp_path: Path, monkeypatch) -> None:
    folder, _ = _chat_folder(tmp_path, CHATML)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_end|>"}))
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    spec_path, weights = _imported(folder, tmp_path)
    pairs = [(f"reverse {a} {b}", f"{b} {a}") for a in WORDS for b in WORDS if a != b]
    spec = _sft_spec(spec_path, tmp_path, _jsonl(tmp_path / "train.jsonl", pairs[:40]),
                     _jsonl(tmp_path / "val.jsonl", pairs[40:48]), batch_size=4, max_steps=2, val_interval=2,
                     val_batches=1, log_interval=1)
    result = train(spec, progress=False, init_from=weights)
    assert result.checkpoint is not None
    saved = torch.load(result.checkpoint, weights_only=True)["specformer"]["tokenizer"]["chat_template"]
    assert saved["template"] == CHATML and saved["special_tokens"]["eos_token"] == "<|im_end|>"

    seen = _recorded_generate(monkeypatch)
    args = ["generate", result.checkpoint, "--prompt", "reverse red cat", "-n", "6", "--greedy", "--no-stop-at-eot"]
    before = runner.invoke(app, args)
    assert before.exit_code == 0, before.output
    ids_before = seen.pop("out")
    prompt_ids = _ids(hf_tok, _turns("reverse red cat"), add_generation_prompt=True)
    assert ids_before[: len(prompt_ids)] == prompt_ids  # --chat by default: the prompt as a user turn

    folder.rename(tmp_path / "moved")  # the tokenizer folder the spec names is gone
    after = runner.invoke(app, args)
    assert after.exit_code == 0, after.output
    assert seen["out"] == ids_before and after.stdout == before.stdout
    evaluated = runner.invoke(app, ["eval", result.checkpoint])  # its pairs rendered with the kept template
    assert evaluated.exit_code == 0, evaluated.output

    # the export of the checkpoint writes the template back, with the special tokens it reads
    out = tmp_path / "exported"
    result_export = runner.invoke(app, ["export-hf", result.checkpoint, "-o", str(out)])
    assert result_export.exit_code == 0, result_export.output
    assert (out / "chat_template.jinja").read_text(encoding="utf-8") == CHATML
    back = transformers.AutoTokenizer.from_pretrained(out)
    assert back.eos_token == "<|im_end|>"
    for prompt, response in PAIRS:
        assert _ids(back, _turns(prompt, response)) == _ids(hf_tok, _turns(prompt, response))


def test_chat_sft_needs_no_end_of_text_token(tmp_path: Path) -> None:
    """A tokenizer with no end-of-text token trains with a template that ends its turns itself."""
    folder, _ = _chat_folder(tmp_path, CHATML)
    data = json.loads((folder / "tokenizer.json").read_text())
    # <|endoftext|> renamed, so that no end-of-text token is found (ids unchanged)
    for token in data["added_tokens"]:
        if token["content"] == "<|endoftext|>":
            token["content"] = "<|unused|>"
    data["model"]["vocab"]["<|unused|>"] = data["model"]["vocab"].pop("<|endoftext|>")
    (folder / "tokenizer.json").write_text(json.dumps(data))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_end|>"}))
    spec_path, _ = _imported(folder, tmp_path)
    tok = file_tokenizer(load_spec(spec_path).training.tokenizer)
    assert tok.eot_id is None and tok.pad_id is None
    train_path, val_path = _jsonl(tmp_path / "t.jsonl", PAIRS * 4), _jsonl(tmp_path / "v.jsonl", PAIRS)
    spec = _sft_spec(spec_path, tmp_path, train_path, val_path, batch_size=4, max_steps=1, val_interval=1,
                     val_batches=1)
    data = prepare(spec)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    p_ids, r_ids = data.train.pairs[0]
    assert p_ids + r_ids == _ids(hf_tok, _turns(*PAIRS[0]))
    assert tok.decode(r_ids).endswith("<|im_end|>\n")
    result = train(spec, progress=False)
    assert result.steps == 1 and result.val_loss is not None
    # without the chat template the response needs an end token of the tokenizer's: still refused
    raw = spec.to_dict()
    raw["training"]["objective"]["chat_template"] = False
    with pytest.raises(DataError, match="has no end-of-text token"):
        prepare(load_spec(raw))


def test_a_system_prompt_is_a_system_turn_first(tmp_path: Path, monkeypatch) -> None:
    folder, _ = _chat_folder(tmp_path, CHATML)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    spec_path, weights = _imported(folder, tmp_path)
    system = "You reverse words."
    spec = _sft_spec(spec_path, tmp_path, _jsonl(tmp_path / "t.jsonl", PAIRS), _jsonl(tmp_path / "v.jsonl", PAIRS),
                     batch_size=2)
    raw = spec.to_dict()
    raw["training"]["objective"]["system"] = system
    data = prepare(load_spec(raw))
    assert "each a system turn, a user turn and an assistant turn of the chat template" in data.description
    for (prompt, response), (p_ids, r_ids) in zip(PAIRS, data.train.pairs, strict=True):
        turns = [{"role": "system", "content": system}, *_turns(prompt)]
        assert p_ids == _ids(hf_tok, turns, add_generation_prompt=True)
        assert p_ids + r_ids == _ids(hf_tok, [*turns, {"role": "assistant", "content": response}])
        # not the template's default system turn
        assert p_ids != _ids(hf_tok, _turns(prompt), add_generation_prompt=True)

    # generate --system
    seen = _recorded_generate(monkeypatch)
    args = ["generate", str(weights), "--spec", str(spec_path), "--prompt", "big", "-n", "1", "--greedy", "--chat"]
    result = runner.invoke(app, [*args, "--system", system])
    assert result.exit_code == 0, result.output
    want = _ids(hf_tok, [{"role": "system", "content": system}, *_turns("big")], add_generation_prompt=True)
    assert seen["out"][:-1] == want
    result = runner.invoke(app, args)  # none: the template's own default system turn
    assert result.exit_code == 0, result.output
    assert seen["out"][:-1] == _ids(hf_tok, _turns("big"), add_generation_prompt=True)
    # a spec fine-tuned with a system prompt: generate puts it first by default, --system '' leaves it out
    sys_spec = tmp_path / "sys.yaml"
    sys_spec.write_text(json.dumps(raw))
    result = runner.invoke(app, ["generate", str(weights), "--spec", str(sys_spec), "--prompt", "big", "-n", "1",
                                 "--greedy"])
    assert result.exit_code == 0, result.output
    assert seen["out"][:-1] == want
    result = runner.invoke(app, ["generate", str(weights), "--spec", str(sys_spec), "--prompt", "big", "-n", "1",
                                 "--greedy", "--system", ""])
    assert result.exit_code == 0, result.output
    assert seen["out"][:-1] == _ids(hf_tok, _turns("big"), add_generation_prompt=True)

    # without --chat, or without the chat template, a system prompt is refused
    result = runner.invoke(app, [*args[:-1], "--no-chat", "--system", system])
    assert result.exit_code == 1 and "--system is a turn of the chat template" in " ".join(result.output.split())
    raw["training"]["objective"]["chat_template"] = False
    with pytest.raises(SpecError, match="training.objective.system"):
        load_spec(raw)


@pytest.mark.parametrize("template", [LLAMA3, CHATML], ids=["llama3", "chatml"])
def test_without_transformers_helpers_jinja2_renders_as_transformers(
    tmp_path: Path, monkeypatch, template: str
) -> None:
    from transformers.utils import chat_template_utils

    from specformer.data import chat as chat_module

    folder, _ = _chat_folder(tmp_path, template)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok = file_tokenizer(load_spec(_imported(folder, tmp_path)[0]).training.tokenizer)
    chat = read_chat_template(folder)
    system = [{"role": "system", "content": "Ünïcode — «quotes»"}]
    conversations = [(_turns(p, r), False) for p, r in PAIRS] + [(system + _turns("hi"), True)]
    # transformers' own text and ids, before its helpers are taken away
    want = [(hf_tok.apply_chat_template(m, tokenize=False, add_generation_prompt=g),
             _ids(hf_tok, m, add_generation_prompt=g)) for m, g in conversations]
    for mode in ("compile", "jinja2"):
        monkeypatch.delattr(chat_template_utils, "render_jinja_template")
        if mode == "jinja2":  # an older transformers with neither helper where they are looked for
            monkeypatch.delattr(chat_template_utils, "_compile_jinja_template")
        used = []
        real = chat_module._jinja_renderer
        monkeypatch.setattr(chat_module, "_jinja_renderer", lambda real=real, used=used: used.append(1) or real())
        for (messages, generation), (want_text, want_ids) in zip(conversations, want, strict=True):
            text = chat.render(messages, add_generation_prompt=generation)
            assert text == want_text and tok.encode(text) == want_ids
        assert bool(used) == (mode == "jinja2")
        monkeypatch.undo()

    # the environment transformers makes: loop controls, tojson keeping non-ASCII, raise_exception, strftime_now
    monkeypatch.setitem(sys.modules, "transformers", None)
    render = chat_module._renderer()
    probe = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m | tojson }}\n"
             "{% endfor %}{{ strftime_now('%Y') | length }}")
    assert render(system + _turns("x"), probe, False, {}) == json.dumps(system[0], ensure_ascii=False) + "\n4"
    with pytest.raises(DataError, match="fails to render: no system turn"):
        type(chat)("{{ raise_exception('no system turn') }}", "probe").render(_turns("x"))


# ----------------------------------------------------------------------------- conversations

CHAT = [
    {"role": "user", "content": "reverse red cat"},
    {"role": "assistant", "content": "cat red"},
    {"role": "user", "content": "reverse big old dog"},
    {"role": "assistant", "content": "dog old big"},
]


def _conversations(path: Path, conversations: list[list[dict[str, str]]], field: str = "messages") -> Path:
    path.write_text("".join(json.dumps({field: c, "id": i}) + "\n" for i, c in enumerate(conversations)))
    return path


def _conversation_spec(spec_path: Path, tmp_path: Path, train_path: Path, val_path: Path, **training: Any) -> Any:
    raw = load_spec(spec_path).to_dict()
    raw["training"].pop("objective")  # conversations on a decoder: sft with the chat template, by default
    raw["training"].update(
        data={"type": "conversations", "paths": [str(train_path)], "val_paths": [str(val_path)]},
        out_dir=str(tmp_path / "runs"), cache_dir=str(tmp_path / "cache"), num_workers=0, accelerator="cpu",
        devices=1, **{"seq_len": 96, **training})
    return load_spec(raw)


@pytest.mark.parametrize("template", [LLAMA3, CHATML], ids=["llama3", "chatml"])
def test_a_conversation_is_apply_chat_template_s_ids_with_the_loss_on_every_assistant_turn(
    tmp_path: Path, template: str
) -> None:
    folder, _ = _chat_folder(tmp_path, template)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    chat = read_chat_template(folder / "tokenizer.json")
    tok = file_tokenizer(load_spec(_imported(folder, tmp_path)[0]).training.tokenizer)
    for messages in (CHAT, [{"role": "system", "content": "Be brief."}, *CHAT]):
        ids, mask = chat.conversation_ids(tok, messages)
        assert ids == _ids(hf_tok, messages) and len(mask) == len(ids)
        # the trained tokens are what each assistant turn adds after the generation prompt, as TRL's
        # assistant-only loss marks them: its content and the template's end of turn, no header
        want = [0] * len(ids)
        for i, turn in enumerate(messages):
            if turn["role"] == "assistant":
                start = len(_ids(hf_tok, messages[:i], add_generation_prompt=True))
                want[start : len(_ids(hf_tok, messages[: i + 1]))] = [1] * (len(_ids(hf_tok, messages[: i + 1])) - start)
        assert mask == want
        trained = [tok.decode([t]) for t, m in zip(ids, mask, strict=True) if m]
        end = "<|im_end|>\n" if template == CHATML else "<|eot_id|>"
        assert "".join(trained) == f"cat red{end}dog old big{end}"
    # a one-exchange conversation is the (prompt, response) pair of sft on pairs, token for token
    (pair,) = chat.pair_ids(tok, [("reverse red cat", "cat red")])
    ids, mask = chat.conversation_ids(tok, CHAT[:2])
    assert ids == pair[0] + pair[1] and mask == [0] * len(pair[0]) + [1] * len(pair[1])
    # a system prompt goes first where the conversation has none of its own
    ids, _ = chat.conversation_ids(tok, CHAT, system="Be brief.")
    assert ids == _ids(hf_tok, [{"role": "system", "content": "Be brief."}, *CHAT])
    own = [{"role": "system", "content": "Mine."}, *CHAT]
    assert chat.conversation_ids(tok, own, system="Be brief.")[0] == _ids(hf_tok, own)


def test_sft_on_conversations_trains_on_the_assistant_turns_and_lowers_the_loss(tmp_path: Path) -> None:
    from specformer.data.collate import ConversationCollator

    folder, _ = _chat_folder(tmp_path, CHATML)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    spec_path, _ = _imported(folder, tmp_path)
    rng = __import__("random").Random(0)
    conversations = []
    for _ in range(120):
        turns = []
        for _ in range(rng.randint(1, 3)):
            words = rng.sample(WORDS, rng.randint(2, 4))
            turns += [{"role": "user", "content": f"reverse {' '.join(words)}"},
                      {"role": "assistant", "content": " ".join(reversed(words))}]
        conversations.append(turns)
    train_path = _conversations(tmp_path / "train.jsonl", conversations[:100])
    val_path = _conversations(tmp_path / "val.jsonl", conversations[100:])
    spec = _conversation_spec(spec_path, tmp_path, train_path, val_path, batch_size=8, max_steps=30,
                              val_interval=15, val_batches=2, log_interval=5,
                              optimizer={"type": "adamw", "lr": 3e-3}, schedule={"type": "constant", "warmup_steps": 0})
    assert spec.training.objective.type == "sft" and spec.training.objective.chat_template
    data = prepare(spec)
    assert data.description.startswith("conversations: 2 files, 100 training and 20 held-out conversations through "
                                       "the chat template (")
    assert "the loss on the assistant turns" in data.description
    for messages, (ids, mask) in zip(conversations[:3], data.train.pairs[:3], strict=True):
        assert ids == _ids(hf_tok, messages) and set(mask) == {0, 1}
    assert data.n_train_tokens == sum(len(ids) for ids, _ in data.train.pairs)
    rows = data.train.pairs[:2]
    batch = ConversationCollator(pad_id=0)([(0, r) for r in rows])
    assert batch["input_ids"].shape[1] == max(len(ids) for ids, _ in rows) - 1
    for i, (ids, mask) in enumerate(rows):
        n = len(ids) - 1
        assert batch["input_ids"][i, :n].tolist() == ids[:-1] and batch["attention_mask"][i].sum() == n
        # label j is token j + 1: scored exactly where that token is an assistant's
        assert [j for j in range(batch["labels"].shape[1]) if batch["labels"][i, j] != IGNORE_INDEX] == [
            j for j in range(n) if mask[j + 1]]
        assert batch["labels"][i, :n][torch.tensor(mask[1:], dtype=torch.bool)].tolist() == [
            t for t, m in zip(ids[1:], mask[1:], strict=True) if m]
    result = train(spec, progress=False)
    losses = [h["val/loss"] for h in result.history]
    assert len(losses) == 2 and losses[-1] < losses[0] - 0.3, losses
    # the same data again: read from the cache, to the same ids and masks
    again = prepare(spec)
    assert again.description.endswith("; token ids read from the cache") and not data.description.endswith("cache")
    assert again.train.pairs == data.train.pairs


def test_long_conversations_are_cut_or_left_out_and_said(tmp_path: Path) -> None:
    folder, _ = _chat_folder(tmp_path, CHATML)
    spec_path, _ = _imported(folder, tmp_path)
    chat = read_chat_template(folder / "tokenizer.json")
    tok = file_tokenizer(load_spec(spec_path).training.tokenizer)
    long_user = [{"role": "user", "content": " ".join(WORDS * 12)}, {"role": "assistant", "content": "red"}]
    n_ids = len(chat.conversation_ids(tok, CHAT)[0])
    train_path = _conversations(tmp_path / "t.jsonl", [CHAT, CHAT[:2], long_user])
    val_path = _conversations(tmp_path / "v.jsonl", [CHAT[:2]])
    first_reply = len(chat.conversation_ids(tok, CHAT[:2])[0])
    seq_len = first_reply + 2  # CHAT is cut inside its second exchange; long_user's reply is out of reach
    assert n_ids > seq_len + 1 > first_reply and len(chat.conversation_ids(tok, long_user)[0]) > 2 * seq_len
    data = prepare(_conversation_spec(spec_path, tmp_path, train_path, val_path, seq_len=seq_len))
    assert len(data.train) == 2 and [len(ids) for ids, _ in data.train.pairs] == [seq_len + 1, first_reply]
    assert (f"longer than seq_len={seq_len} + 1 tokens: left out 1 with no assistant token in the first "
            f"{seq_len} predicted (1 training, 0 held-out), cut 1 to fit") in data.description
    # eval --data reads its files as the held-out split alone: each conversation counted once (they were
    # read as both splits, said as '2 files, 2 training and 2 held-out', the cut and left out ones twice)
    from specformer.data.corpus import scoring_only

    with scoring_only():
        scored = prepare(_conversation_spec(spec_path, tmp_path, train_path, train_path, seq_len=seq_len))
    assert len(scored.train) == 0 and len(scored.val) == 2
    assert scored.description.startswith("conversations: t.jsonl: 2 conversations through the chat template ("), (
        scored.description)
    assert (f"longer than seq_len={seq_len} + 1 tokens: left out 1 with no assistant token in the first "
            f"{seq_len} predicted, cut 1 to fit") in scored.description, scored.description


def test_conversation_errors_name_the_file_line_and_field(tmp_path: Path) -> None:
    folder, _ = _chat_folder(tmp_path, CHATML)
    spec_path, _ = _imported(folder, tmp_path)
    val_path = _conversations(tmp_path / "v.jsonl", [CHAT])
    bad = {
        '{"messages": [{"role": "user", "content": "hi"}]}': r"t.jsonl:2: no assistant turn \(its roles: user\)",
        '{"turns": []}': r"t.jsonl:2: no 'messages' field \(training.data.messages_field\); this line has 'turns'",
        '{"messages": "hi"}': r"t.jsonl:2: 'messages' is a JSON str; it holds the conversation's turns",
        '{"messages": [{"role": "user"}]}': r"t.jsonl:2: turn 1: its 'content' is missing, not a string",
        '{"messages": [{"role": "user", "content": null}]}': r"t.jsonl:2: turn 1: its 'content' is null",
        "[1, 2]": r"t.jsonl:2: a JSON list, not an object with a 'messages' field",
    }
    for line, message in bad.items():
        (tmp_path / "t.jsonl").write_text(json.dumps({"messages": CHAT}) + "\n" + line + "\n")
        spec = _conversation_spec(spec_path, tmp_path, tmp_path / "t.jsonl", val_path)
        with pytest.raises(DataError, match="training.data.paths: .*" + message):
            prepare(spec)
    # another field name
    train_path = _conversations(tmp_path / "c.jsonl", [CHAT, CHAT[:2]], field="conversations")
    val_path = _conversations(tmp_path / "cv.jsonl", [CHAT], field="conversations")
    raw = _conversation_spec(spec_path, tmp_path, train_path, val_path).to_dict()
    raw["training"]["data"]["messages_field"] = "conversations"
    assert len(prepare(load_spec(raw)).train) == 2
    # the objective and the model that conversations train, each named
    for change, field, message in (
        ({"objective": {"type": "causal_lm"}}, "training.objective.type", "conversations train a decoder with "
                                                                          "objective sft"),
        ({"objective": {"type": "sft", "chat_template": False}}, "training.objective.chat_template",
         "conversations are rendered through the tokenizer's chat template"),
    ):
        changed = _conversation_spec(spec_path, tmp_path, train_path, val_path).to_dict()
        changed["training"].update(change)
        with pytest.raises(SpecError, match=message) as caught:
            load_spec(changed)
        assert any(p.path == field for p in caught.value.problems)
    # an imported spec's causal_lm turned to sft: the chat template is on, as when no objective is named
    changed = _conversation_spec(spec_path, tmp_path, train_path, val_path).to_dict()
    changed["training"]["objective"] = {"type": "causal_lm"}
    assert load_spec(changed, overrides=["training.objective.type=sft"]).training.objective.chat_template
    # a tokenizer with no folder for a template: the tokenizer is what to change (chat_template has no other value)
    with pytest.raises(SpecError) as caught:
        load_spec("gpt-nano", overrides=["training.data={type: conversations, paths: [c.jsonl]}"])
    (problem,) = caught.value.problems
    assert problem.path == "training.tokenizer" and problem.message == (
        "conversations are rendered through the chat template beside a tokenizer.json, and training.tokenizer is "
        "type bpe: set training.tokenizer: {type: file, path: folder/tokenizer.json} (an instruct model's, as "
        "import-hf writes it)")
    with pytest.raises(SpecError) as caught:
        load_spec("gpt-nano", overrides=["training.data={type: pairs, paths: [c.jsonl]}",
                                         "training.objective.chat_template=true"])
    assert caught.value.problems[0].message.endswith(
        "set training.tokenizer: {type: file, path: folder/tokenizer.json} (an instruct model's, as import-hf writes "
        "it), or chat_template: false")
    with pytest.raises(SpecError, match="conversations fine-tune a decoder"):
        load_spec({"extends": "bert-nano", "training": {"data": {"type": "conversations", "paths": ["c.jsonl"]}}})
    # a template that renders a turn differently when more follow: the conversation's line is named
    odd, _ = _chat_folder(tmp_path, NOT_A_PREFIX, name="odd")
    odd_spec, _ = _imported(odd, tmp_path)
    with pytest.raises(NotAPrefixError, match=r"training.data.paths: .*c.jsonl:1: the chat template's rendering of "
                                              r"the turns before turn 2 \(an assistant turn\) is not the start"):
        prepare(load_spec({**raw, "training": {**raw["training"], "tokenizer": load_spec(odd_spec).to_dict()[
            "training"]["tokenizer"]}}))


def test_generate_messages_answers_a_conversation_as_transformers_does(tmp_path: Path, monkeypatch) -> None:
    folder, hf = _chat_folder(tmp_path, LLAMA3)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    spec_path, weights = _imported(folder, tmp_path)
    hf.generation_config.eos_token_id = None
    seen = _recorded_generate(monkeypatch)
    args = ["generate", str(weights), "--spec", str(spec_path), "-n", "6", "--greedy", "--no-stop-at-eot"]
    history = tmp_path / "chat.json"
    for data, then, turns in (
        (CHAT[:3], [], CHAT[:3]),                                   # a list of turns, ending with the user's
        ({"messages": CHAT}, ["--prompt", "reverse sun sky"],       # a conversations line, then one more turn
         [*CHAT, {"role": "user", "content": "reverse sun sky"}]),
        (CHAT[:3], ["--system", "Be brief."], [{"role": "system", "content": "Be brief."}, *CHAT[:3]]),
    ):
        history.write_text(json.dumps(data))
        result = runner.invoke(app, [*args, "--messages", str(history), *then])  # --chat is implied
        assert result.exit_code == 0, result.output
        ids = _ids(hf_tok, turns, add_generation_prompt=True)
        theirs = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=6)[0].tolist()
        assert seen["out"] == theirs
    # what cannot be answered, each named
    for data, then, message in (
        (CHAT, [], "ends with an assistant turn: the model answers the last turn; add --prompt"),
        ([], [], "holds no turns"),
        ({"turns": CHAT}, [], "holds a JSON dict; give a list of"),
        ([{"role": "user", "content": 3}], [], "turn 1: its 'content' is a JSON int, not a string"),
        (CHAT[:1], ["--no-chat"], "--messages is a conversation of the chat template's turns: leave out --no-chat"),
    ):
        history.write_text(json.dumps(data))
        result = runner.invoke(app, [*args, "--messages", str(history), *then])
        assert result.exit_code == 1 and message in " ".join(result.stderr.split()), result.output
    history.write_text("[{")
    result = runner.invoke(app, [*args, "--messages", str(history)])
    assert result.exit_code == 1 and f"--messages: {history}:1:3: not JSON" in " ".join(result.stderr.split())
    result = runner.invoke(app, [*args, "--messages", str(history), "--messages", str(history)])
    assert result.exit_code == 2 and "--messages is given 2 times" in result.output


def test_chat_keeps_the_conversation_and_answers_each_turn_as_transformers_does(tmp_path: Path, monkeypatch) -> None:
    folder, hf = _chat_folder(tmp_path, CHATML)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    spec_path, weights = _imported(folder, tmp_path)
    gen = importlib.import_module("specformer.training.generate")
    real, prompts = gen.generate, []

    def recording(model: Any, ids: Any, **kwargs: Any) -> Any:
        prompts.append(ids[0].tolist())
        return real(model, ids, **kwargs)

    monkeypatch.setattr(gen, "generate", recording)
    lines = ["reverse red cat", "", "/help", "reverse big dog", "/rest", "/reset", "reverse sun sky", "/exit",
             "never read"]
    result = runner.invoke(app, ["chat", str(weights), "--spec", str(spec_path), "-n", "5", "--greedy",
                                 "--system", "Be brief."], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    replies = result.stdout.split("\n")[:3]
    assert len(prompts) == 3 and result.stdout.count("\n") == 3  # the blank line and /exit's rest: nothing asked
    system = [{"role": "system", "content": "Be brief."}]
    first = [*system, {"role": "user", "content": "reverse red cat"}]
    # the second turn follows the first exchange, the reply as its text; /reset starts over
    second = [*first, {"role": "assistant", "content": replies[0].strip()}, {"role": "user", "content": "reverse big dog"}]
    third = [*system, {"role": "user", "content": "reverse sun sky"}]
    for seen, messages, reply in zip(prompts, (first, second, third), replies, strict=True):
        ids = _ids(hf_tok, messages, add_generation_prompt=True)
        assert seen == ids
        theirs = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=5, eos_token_id=hf_tok.convert_tokens_to_ids("<|im_end|>"))
        new = theirs[0, len(ids):].tolist()
        new = new[: new.index(hf_tok.convert_tokens_to_ids("<|im_end|>"))] if hf_tok.convert_tokens_to_ids(
            "<|im_end|>") in new else new
        assert reply == hf_tok.decode(ids + new)[len(hf_tok.decode(ids)):]
    assert "a new conversation" in result.stderr
    # /help and a mistyped command are answered, not sent to the model as turns
    said = " ".join(result.stderr.split())
    assert "/rest is not a command; /reset starts a new conversation, /exit or Ctrl-D ends" in said
    assert said.count("/reset starts a new conversation") == 2


def test_chat_outgrowing_the_model_leaves_out_the_oldest_exchanges(tmp_path: Path) -> None:
    folder, _ = _chat_folder(tmp_path, CHATML)
    spec_path, weights = _imported(folder, tmp_path)
    long = " ".join(WORDS * 3)
    result = runner.invoke(app, ["chat", str(weights), "--spec", str(spec_path), "-n", "4", "--greedy"],
                           input=f"{long}\n{long}\n{long}\n" + " ".join(WORDS * 30) + "\n")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "the conversation outgrew max_seq_len=128: its oldest exchange is left out" in said
    assert "this turn is" in said and "say it in fewer words" in said
    # not a chat model: generate is the command
    plain, _ = _chat_folder(tmp_path, None, name="plain")
    spec_path, weights = _imported(plain, tmp_path)
    result = runner.invoke(app, ["chat", str(weights), "--spec", str(spec_path)], input="hi\n")
    assert result.exit_code == 1 and "has no chat template" in " ".join(result.stderr.split())


def test_a_reply_the_context_cuts_short_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # -n 500 past what max_seq_len leaves: the reply stops there, and is not taken for a whole one
    import importlib

    generation = importlib.import_module("specformer.training.generate")  # the module, not the function
    folder, _ = _chat_folder(tmp_path, CHATML)
    spec_path, weights = _imported(folder, tmp_path)
    asked: list[int] = []

    def endless(model: Any, ids: Any, *, max_new_tokens: int, on_token: Any, **kwargs: Any) -> Any:
        asked.append(max_new_tokens)  # a reply that never says its end token
        for _ in range(max_new_tokens):
            on_token(torch.tensor([65]))
        return ids

    monkeypatch.setattr(generation, "generate", endless)
    result = runner.invoke(app, ["chat", str(weights), "--spec", str(spec_path), "-n", "500", "--greedy"],
                           input="reverse red cat\n")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert f"the reply stopped at {asked[0]} tokens, where the conversation reaches max_seq_len=128 (-n 500)" in said
    assert 0 < asked[0] < 128
    quiet = runner.invoke(app, ["chat", str(weights), "--spec", str(spec_path), "-n", "5", "--greedy"],
                          input="reverse red cat\n")
    assert quiet.exit_code == 0 and asked[-1] == 5 and "the reply stopped" not in quiet.stderr
