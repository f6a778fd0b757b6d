"""Generation: cache and no cache agree; the sampling filters do what they say."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

from specformer import load_spec
from specformer.builder import build_model
from specformer.training.generate import (
    beam_search,
    encode_prompt,
    generate,
    generate_seq2seq,
    penalize_repeats,
    sample_next,
)


def _model(tiny: Any, kind: str, **extra: Any) -> tuple[Any, Any]:
    data = {**tiny(kind), **extra}
    data["training"]["seq_len"] = min(data["training"]["seq_len"], data["max_seq_len"])
    spec = load_spec(data)
    torch.manual_seed(0)
    model = build_model(spec).eval()
    return spec, model


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "sinusoidal"])
def test_greedy_decoding_is_identical_with_and_without_the_cache(tiny: Any, positional: str) -> None:
    spec, model = _model(tiny, "decoder", positional={"type": positional})
    prompt = torch.randint(0, 256, (2, 5))
    with_cache = generate(model, prompt, max_new_tokens=20, temperature=0.0, use_cache=True)
    without = generate(model, prompt, max_new_tokens=20, temperature=0.0, use_cache=False)
    assert with_cache.shape == (2, 25)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache[:, :5], prompt)


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "sinusoidal"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_prompts_decode_as_each_would_alone(tiny: Any, positional: str, use_cache: bool) -> None:
    spec, model = _model(tiny, "decoder", positional={"type": positional})
    short, long = torch.randint(3, 256, (1, 4)), torch.randint(3, 256, (1, 7))
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], dim=1), long])  # (2, 7)
    mask = torch.ones_like(batch)
    mask[0, :3] = 0
    both = generate(model, batch, attention_mask=mask, max_new_tokens=12, temperature=0.0, use_cache=use_cache)
    for row, prompt in enumerate((short, long)):
        alone = generate(model, prompt, max_new_tokens=12, temperature=0.0, use_cache=use_cache)
        assert torch.equal(both[row, 7:], alone[0, prompt.shape[1]:])
    # the padding matters unless masked: read as tokens, it changes the short row's next-token scores
    with torch.no_grad():
        assert not torch.allclose(model(batch).logits[0, -1], model(short).logits[0, -1], atol=1e-4)


def test_a_mask_must_fit_the_prompts_and_pad_on_the_left(tiny: Any) -> None:
    spec, model = _model(tiny, "decoder")
    prompt = torch.randint(3, 256, (2, 5))
    with pytest.raises(ValueError, match="shape"):
        generate(model, prompt, attention_mask=torch.ones(2, 4, dtype=torch.long), max_new_tokens=2)
    right = torch.ones(2, 5, dtype=torch.long)
    right[1, 3:] = 0
    with pytest.raises(ValueError, match="pad prompts on the left"):
        generate(model, prompt, attention_mask=right, max_new_tokens=2)


def test_generation_slides_past_max_seq_len_the_same_way_with_and_without_cache(tiny: Any) -> None:
    spec, model = _model(tiny, "decoder", max_seq_len=16)
    prompt = torch.randint(0, 256, (1, 10))
    a = generate(model, prompt, max_new_tokens=15, temperature=0.0, max_seq_len=16, use_cache=True)
    b = generate(model, prompt, max_new_tokens=15, temperature=0.0, max_seq_len=16, use_cache=False)
    assert a.shape == (1, 25) and torch.equal(a, b)


@pytest.mark.parametrize("how", ["generate", "beam_search", "seq2seq"])
def test_generation_allocates_the_kv_cache_for_the_length_it_reaches(tiny: Any, monkeypatch, how: str) -> None:
    # a 10-token prompt and 90 new tokens: the cache is asked for 99 positions (the last token is
    # not read back) and holds exactly that, not the 128 that doubling reaches
    from specformer.components.cache import KVCache

    kind = "encoder-decoder" if how == "seq2seq" else "decoder"
    spec, model = _model(tiny, kind, positional={"type": "rope"}, max_seq_len=128)
    made: list[KVCache] = []
    init = KVCache.__init__

    def spy(self: KVCache, max_length: int | None = None) -> None:
        init(self, max_length)
        made.append(self)

    monkeypatch.setattr(KVCache, "__init__", spy)
    prompt = torch.randint(0, spec.vocab_size, (1, 10))
    if how == "generate":
        out = generate(model, prompt, max_new_tokens=90, temperature=0.0)
    elif how == "beam_search":
        out = beam_search(model, prompt, num_beams=2, max_new_tokens=90, eos_id=None)
    else:
        out = generate_seq2seq(model, prompt, start_id=0, eos_id=None, max_new_tokens=99)
    assert out.shape[1] == (99 if how == "seq2seq" else 100)
    stored = made[0]._keys[0].shape[2]
    assert made[0].length == 99 and stored == 99
    if how == "generate":  # capped at max_seq_len when the context slides
        made.clear()
        generate(model, prompt, max_new_tokens=200, temperature=0.0)
        assert made[0].max_length == 128 and made[0]._keys[0].shape[2] == 128


def test_generation_builds_no_autograd_graph(tiny: Any) -> None:
    # generate runs without gradients, whatever the caller's grad mode
    spec, model = _model(tiny, "decoder")
    seen: list[bool] = []
    model.register_forward_hook(lambda module, args, out: seen.append(torch.is_grad_enabled()))
    assert torch.is_grad_enabled()
    generate(model, torch.randint(0, 256, (1, 4)), max_new_tokens=3, temperature=0.0)
    assert seen and not any(seen)



@pytest.mark.parametrize(("kind", "positional"), [("decoder", "rope"), ("decoder", "alibi"), ("encoder-decoder", "t5")])
def test_generation_runs_in_inference_mode_and_training_goes_on_after_it(tiny: Any, kind: str, positional: str) -> None:
    # no autograd bookkeeping at all while decoding, yet the tokens are an ordinary tensor and
    # the tables the model keeps (T5's buckets, rotary cos/sin) still serve a training step
    spec, model = _model(tiny, kind, positional={"type": positional})
    seen: list[bool] = []
    model.register_forward_hook(lambda module, args, out: seen.append(torch.is_inference_mode_enabled()))
    src = torch.randint(5, 40, (2, 6))
    beams = beam_search(model, src, num_beams=2, max_new_tokens=3, eos_id=None,
                        start_id=1 if kind == "encoder-decoder" else None)
    if kind == "encoder-decoder":
        out = generate_seq2seq(model, src, start_id=1, eos_id=None, max_new_tokens=4)
    else:
        out = generate(model, src, max_new_tokens=4, temperature=0.0)
    assert seen and all(seen)
    for tokens in (out, beams):
        assert not tokens.is_inference()
        tokens[0, 0] = 7  # the caller's to change
    model.train()
    if kind == "encoder-decoder":
        loss = model(src, decoder_input_ids=out[:, :-1], labels=out[:, 1:]).loss
    else:
        loss = model(out[:, :-1], labels=out[:, 1:]).loss
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_generation_slides_at_the_models_own_max_seq_len_by_default(tiny: Any) -> None:
    # a learned position table ends at max_seq_len: without max_seq_len= the context
    # slides there (the model's spec), rather than running past the table
    spec, model = _model(tiny, "decoder", positional={"type": "learned"}, max_seq_len=16)
    prompt = torch.randint(0, 256, (1, 10))
    default = generate(model, prompt, max_new_tokens=15, temperature=0.0)
    explicit = generate(model, prompt, max_new_tokens=15, temperature=0.0, max_seq_len=16)
    assert default.shape == (1, 25) and torch.equal(default, explicit)
    with pytest.raises(ValueError, match="past the learned position table"):
        generate(model, prompt, max_new_tokens=15, temperature=0.0, max_seq_len=64)



@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_only_the_last_position_goes_through_the_vocabulary_projection(tiny: Any, kind: str, use_cache: bool) -> None:
    # sampling reads the last position's logits: a (T, V) projection of the prompt (or, without
    # the cache, of the whole sequence at every step) is work and memory for nothing
    spec, model = _model(tiny, kind)
    rows: list[int] = []
    model.head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[1]))
    prompt = torch.randint(5, 40, (2, 9))
    if kind == "decoder":
        out = generate(model, prompt, max_new_tokens=6, temperature=0.0, use_cache=use_cache)
    else:
        out = generate_seq2seq(model, prompt, start_id=1, eos_id=None, max_new_tokens=6, use_cache=use_cache)
    assert len(rows) == 6 and set(rows) == {1}
    # the tokens are those of the full logits' last row
    with torch.no_grad():
        for n in range(6):
            if kind == "decoder":
                logits = model(out[:, : 9 + n]).logits[:, -1]
                assert torch.equal(out[:, 9 + n], logits.argmax(-1))
            else:
                start = torch.cat([torch.ones(2, 1, dtype=torch.long), out[:, :n]], dim=1)
                logits = model(prompt, decoder_input_ids=start).logits[:, -1]
                assert torch.equal(out[:, n], logits.argmax(-1))

def test_seq2seq_greedy_is_identical_with_and_without_the_cache(tiny: Any) -> None:
    spec, model = _model(tiny, "encoder-decoder", positional={"type": "t5"})
    src = torch.randint(5, 40, (3, 7))
    mask = torch.ones_like(src)
    mask[0, 5:] = 0  # padding in one row
    a = generate_seq2seq(model, src, attention_mask=mask, start_id=1, eos_id=None, max_new_tokens=12, use_cache=True)
    b = generate_seq2seq(model, src, attention_mask=mask, start_id=1, eos_id=None, max_new_tokens=12, use_cache=False)
    assert a.shape == (3, 12) and torch.equal(a, b)


def test_sampling_filters() -> None:
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]]).repeat(500, 1)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(sample_next(logits, temperature=0.0), torch.full((500,), 2))
    assert set(sample_next(logits, top_k=1, generator=g).tolist()) == {2}
    assert set(sample_next(logits, top_k=2, generator=g).tolist()) == {2, 3}
    probs = logits[0].softmax(-1)  # 0.032, 0.087, 0.644, 0.237
    assert set(sample_next(logits, top_p=0.6, generator=g).tolist()) == {2}
    assert set(sample_next(logits, top_p=float(probs[2] + probs[3]) - 1e-4, generator=g).tolist()) == {2, 3}
    many = sample_next(logits, temperature=1.0, generator=g)
    freq = torch.bincount(many, minlength=4).float() / 500
    assert torch.allclose(freq, probs, atol=0.07)
    # a high temperature flattens, a low one sharpens
    hot = torch.bincount(sample_next(logits, temperature=100.0, generator=g), minlength=4).float() / 500
    assert hot.min() > 0.15
    a = sample_next(logits, generator=torch.Generator().manual_seed(3))
    b = sample_next(logits, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    # a temperature of 1e-40 overflowed float32 (inf - inf: NaN probabilities, a RuntimeError)
    for tiny_t in (1e-40, 1e-300, 1e-3):
        assert set(sample_next(logits, temperature=tiny_t, generator=g).tolist()) == {2}


def test_generation_stops_at_the_end_token(tiny: Any) -> None:
    spec, model = _model(tiny, "decoder")
    prompt = torch.randint(0, 256, (1, 4))
    first = generate(model, prompt, max_new_tokens=1, temperature=0.0)[0, -1].item()
    out = generate(model, prompt, max_new_tokens=10, temperature=0.0, eos_id=first)
    assert out.shape == (1, 5)


def test_ids_past_the_tokenizer_are_never_sampled() -> None:
    # a BPE smaller than the model's vocabulary: ids >= n_candidates have no text
    logits = torch.tensor([[0.0, 1.0, 3.0, 9.0, 8.0]]).repeat(300, 1)
    g = torch.Generator().manual_seed(0)
    assert set(sample_next(logits, temperature=0.0, n_candidates=3).tolist()) == {2}
    assert set(sample_next(logits, temperature=5.0, generator=g, n_candidates=3).tolist()) <= {0, 1, 2}
    assert set(sample_next(logits, temperature=0.0, n_candidates=5).tolist()) == {3}


def test_seq2seq_output_ends_at_a_learned_position_table(tiny: Any) -> None:
    spec, model = _model(tiny, "encoder-decoder", positional={"type": "learned"}, max_seq_len=16)
    src = torch.randint(5, 40, (1, 7))
    out = generate_seq2seq(model, src, start_id=1, eos_id=None, max_new_tokens=40, max_len=spec.max_seq_len)
    assert out.shape == (1, 15)  # 16 decoder positions, the start token included


@pytest.mark.parametrize("positional", ["learned", "t5", "rope", "sinusoidal"])
def test_seq2seq_output_is_capped_by_default_only_by_a_learned_table(tiny: Any, positional: str) -> None:
    # every other scheme has no last position: -n 100 gives 100 tokens, not max_seq_len - 1
    spec, model = _model(tiny, "encoder-decoder", positional={"type": positional}, max_seq_len=16)
    src = torch.randint(5, 40, (1, 7))
    out = generate_seq2seq(model, src, start_id=1, eos_id=None, max_new_tokens=40)
    assert out.shape == ((1, 15) if positional == "learned" else (1, 40))


@pytest.mark.parametrize("first", ["", "import specformer.training.generate; "])
def test_the_package_exports_the_generate_function_not_its_module(first: str) -> None:
    import subprocess
    import sys

    code = (f"{first}from specformer.training import generate, generate_seq2seq, load_checkpoint; "
            "assert callable(generate) and generate.__name__ == 'generate', generate; "
            "assert generate_seq2seq.__name__ == 'generate_seq2seq'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sampling_settings_out_of_range_are_errors() -> None:
    logits = torch.randn(2, 10)
    for kwargs, words in (({"top_p": 0.0}, "top_p must be in (0, 1]"), ({"top_p": 1.5}, "top_p"),
                          ({"top_k": 0}, "top_k must be an integer >= 1"), ({"top_k": 5.5}, "top_k must be an integer"),
                          ({"temperature": -1.0}, "temperature")):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("]", r"\]")):
            sample_next(logits, **kwargs)
    assert sample_next(logits, top_p=1.0, top_k=50).shape == (2,)  # the edges that keep everything


def test_generate_checks_the_model_and_the_prompts(tiny: Any) -> None:
    _, gpt = _model(tiny, "decoder")
    _, t5 = _model(tiny, "encoder-decoder")
    prompt = torch.tensor([[5, 6, 7]])
    # counts that would generate nothing or slice from the end, an end id no token can be
    for kwargs, words in (({"n_candidates": 0}, "n_candidates must be an integer >= 1, got 0"),
                          ({"n_candidates": -5}, "n_candidates must be an integer >= 1"),
                          ({"max_seq_len": 0}, "max_seq_len must be an integer >= 1, got 0"),
                          ({"eos_id": 9999}, "eos_id must be a token id in [0, vocab_size) = [0, 300), got 9999")):
        with pytest.raises(ValueError, match=re.escape(words)):
            generate(gpt, prompt, max_new_tokens=2, **kwargs)
        if "max_seq_len" not in kwargs:
            with pytest.raises(ValueError, match=re.escape(words).replace("300", "64")):
                generate_seq2seq(t5, prompt, start_id=0, max_new_tokens=2, **{"eos_id": None, **kwargs})
    with pytest.raises(TypeError, match=r"generate takes a model \(build_model"):
        generate("gpt-nano", prompt, max_new_tokens=2)
    from specformer.data.tokenizers import ByteTokenizer

    with pytest.raises(TypeError, match=r"encode_prompt takes the prompt's text, a str; got a int"):
        encode_prompt(ByteTokenizer(), 5)
    latin1 = b"caf\xe9".decode("utf-8", errors="surrogateescape")  # as sys.argv holds a Latin-1 argument
    with pytest.raises(ValueError, match=r"^the prompt holds a lone surrogate \(U\+DCE9, character 4\): .*latin-1"):
        encode_prompt(ByteTokenizer(), latin1)
    with pytest.raises(ValueError, match=r"input_ids must be an integer tensor \(B, T\), got shape \(3,\); "
                                         r"one prompt is ids\[None\]"):
        generate(gpt, torch.tensor([5, 6, 7]), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"token ids, got torch.float32 \(ids.long\(\) converts\)"):
        generate(gpt, torch.tensor([[5.0, 6.0]]), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"got list; torch.tensor\(\[ids\]\) makes one prompt"):
        generate(gpt, [5, 6], max_new_tokens=2)
    for bad in (2.5, -1, True):
        with pytest.raises(ValueError, match=f"max_new_tokens must be an integer >= 0, got {bad}"):
            generate(gpt, torch.tensor([[5, 6]]), max_new_tokens=bad)
    # a whole number that is not a Python int (numpy's, a 0-d tensor's) is a count as range() takes it
    for count in (np.int64(2), torch.tensor(2)):
        assert generate(gpt, torch.tensor([[5, 6]]), max_new_tokens=count, temperature=0.0).shape == (1, 4)
    with pytest.raises(ValueError, match="input_ids has no tokens"):
        generate(gpt, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(ValueError, match="generate is for a decoder model, and this one is an encoder-decoder; "
                                         "use generate_seq2seq"):
        generate(t5, torch.tensor([[5, 6]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="generate_seq2seq is for an encoder-decoder model, and this one is a "
                                         "decoder; use generate"):
        generate_seq2seq(gpt, torch.tensor([[5, 6]]), start_id=1, eos_id=2, max_new_tokens=2)
    assert generate(gpt, torch.tensor([[5, 6]]), max_new_tokens=0).shape == (1, 2)


def test_a_classifier_given_to_generate_is_sent_to_classify_not_fill_mask(tiny: Any) -> None:
    # a sequence classifier has no masked-LM head: "see fill-mask" sent it to a command that refuses it
    _, bert = _model(tiny, "encoder")
    data = tiny("encoder")
    data["head"] = {"type": "classification", "n_classes": 2}
    data["training"]["data"] = {"type": "labelled", "paths": ["reviews.csv"]}
    torch.manual_seed(0)
    classifier = build_model(load_spec(data)).eval()
    with pytest.raises(ValueError, match=r"this one is an encoder \(an encoder predicts masked tokens: see fill-mask\)"):
        generate(bert, torch.tensor([[5, 6]]), max_new_tokens=2)
    for decode in (lambda m: generate(m, torch.tensor([[5, 6]]), max_new_tokens=2),
                   lambda m: beam_search(m, torch.tensor([[5, 6]]), num_beams=2, max_new_tokens=2, eos_id=None)):
        with pytest.raises(ValueError, match=r"this one is an encoder \(a sequence classifier labels texts: see "
                                             r"classify\)"):
            decode(classifier)


def test_seq2seq_generation_stops_at_the_learned_table_by_default(tiny: Any) -> None:
    # a learned decoder table of max_seq_len rows: decoding past it used to raise mid-way
    spec, t5 = _model(tiny, "encoder-decoder", max_seq_len=8, positional={"type": "learned"})
    out = generate_seq2seq(t5, torch.tensor([[5, 6, 7]]), start_id=1, eos_id=None, max_new_tokens=20)
    assert out.shape == (1, spec.max_seq_len - 1)  # the start token takes the first position


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_a_classification_head_has_no_next_token_to_sample(tiny: Any, kind: str) -> None:
    _, model = _model(tiny, kind, head={"type": "classification", "n_classes": 3, "pooling": "last"})
    name = "generate" if kind == "decoder" else "generate_seq2seq"
    with pytest.raises(ValueError, match=rf"^{name} samples the next token from logits \(batch, length, vocab\), but "
                                         r"its classification head gives \(2, 3\); generate from a model with a "
                                         r"language-model head"):
        if kind == "decoder":
            generate(model, torch.tensor([[5, 6], [7, 8]]), max_new_tokens=2)
        else:
            generate_seq2seq(model, torch.tensor([[5, 6], [7, 8]]), start_id=1, eos_id=2, max_new_tokens=2)


# --------------------------------------------------------------------------- healing a prompt's end


def _bpe(tmp_path: Any) -> Any:
    """A byte-level BPE as `specformer train` learns one: a word's space at its start."""
    from specformer.data.corpus import Corpus
    from specformer.data.tokenizers import bpe_tokenizer
    from specformer.specs.training import BPETokenizerSpec

    text = "def model(x):\n    return x + 1\n\n" * 40 + "the model is the thing that is here. " * 40
    corpus = Corpus(name="t", train=[text], val=[text], fingerprint="heal")
    return bpe_tokenizer(BPETokenizerSpec(vocab_size=300), corpus=corpus, cache_dir=tmp_path)


def test_a_trailing_space_is_taken_off_the_prompt_and_spelt_by_the_first_new_token(tmp_path: Any) -> None:
    from specformer.data.tokenizers import ByteTokenizer
    from specformer.training.generate import encode_prompt

    tok = _bpe(tmp_path)
    assert tok.encode("the model ")[-1] == tok.encode(" ")[0]  # the lone space token, rare before a word
    prompt = encode_prompt(tok, "the model ")
    assert prompt.ids == tok.encode("the model") and prompt.healed == " "
    allowed = prompt.allowed_tokens(torch.zeros(1, 0, dtype=torch.long))[0]
    texts = [tok.decode([*tok.encode("the model"), i])[len("the model"):] for i in range(tok.vocab_size)]
    assert [i for i in range(tok.vocab_size) if allowed[i]] == [i for i, t in enumerate(texts) if t.startswith(" ")]
    assert allowed[tok.encode(" is")[0]] and not allowed[tok.encode("is")[0]]
    # once spelt, sampling is free
    assert prompt.allowed_tokens(torch.tensor([tok.encode(" is")[:1]])) is None
    # a newline and indentation: a token may spell a part of it, and the next the rest
    code = encode_prompt(tok, "def model(x):\n    ")
    assert code.ids == tok.encode("def model(x):") and code.healed == "\n    "
    first = code.allowed_tokens(torch.zeros(1, 0, dtype=torch.long))[0]
    newline = tok.encode("\n")[0]
    assert first[newline] and not first[tok.encode("x")[0]]
    after = code.allowed_tokens(torch.tensor([[newline]]))[0]
    assert after[tok.encode("    return")[0]] and not after[newline]
    # nothing to heal: no trailing whitespace, --no-heal, or the byte tokenizer (a space is a byte it saw)
    assert encode_prompt(tok, "the model").allowed_tokens is None
    assert encode_prompt(tok, "the model ", heal=False).ids == tok.encode("the model ")
    assert encode_prompt(ByteTokenizer(), "the model ").ids == list(b"the model ")
    # an empty prompt starts a document
    assert encode_prompt(tok, "").ids == [tok.eot_id] and encode_prompt(tok, "  ").ids == [tok.eot_id]


def test_generation_held_to_the_healed_whitespace_starts_with_it(tiny: Any, tmp_path: Any) -> None:
    from specformer.training.generate import encode_prompt

    tok = _bpe(tmp_path)
    spec, model = _model(tiny, "decoder")
    prompt = encode_prompt(tok, "the model ")
    firsts = set()
    for seed in range(20):
        out = generate(model, torch.tensor([prompt.ids]), max_new_tokens=3, temperature=2.0,
                       generator=torch.Generator().manual_seed(seed), n_candidates=tok.vocab_size,
                       allowed_tokens=prompt.allowed_tokens)[0].tolist()
        first = out[len(prompt.ids)]
        assert tok.decode([*prompt.ids, first]).startswith("the model "), tok.decode(out)
        firsts.add(first)
    assert len(firsts) > 3  # sampled among the tokens that begin with the space, not forced to one


def test_a_healed_prompt_stops_reading_the_new_tokens_once_they_can_have_spelt_it(
    tiny: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from specformer.training.generate import encode_prompt

    gen = importlib.import_module("specformer.training.generate")  # the module, not the function
    tok = _bpe(tmp_path)
    spec, model = _model(tiny, "decoder")
    read = []  # the rows of new tokens read, one list per row
    left = gen._Spelling._left
    monkeypatch.setattr(gen._Spelling, "_left", lambda self, row: read.append(list(row)) or left(self, row))
    for text in ("the model ", "def model(x):\n    "):
        read.clear()
        prompt = encode_prompt(tok, text)
        generate(model, torch.tensor([prompt.ids]), max_new_tokens=12, temperature=1.0,
                 generator=torch.Generator().manual_seed(0), n_candidates=tok.vocab_size,
                 allowed_tokens=prompt.allowed_tokens)
        # every token spells a character of the whitespace or frees the row: 1 and 5 steps at the most, not 12
        assert len(read) <= len(prompt.healed) and max(map(len, read)) < len(prompt.healed), (text, read)


# --------------------------------------------------------------------------- beam search


def _sequence_log_prob(model: Any, prompt: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Summed log-probability of continuations ``new`` (N, n) of one prompt (1, T)."""
    ids = torch.cat([prompt.expand(new.shape[0], -1), new], dim=1)
    with torch.no_grad():
        logp = model(ids).logits.float().log_softmax(-1)
    t = prompt.shape[1]
    return logp[:, t - 1:-1].gather(-1, new[:, :, None]).squeeze(-1).sum(-1)


def test_beam_search_with_every_prefix_kept_finds_the_most_likely_continuation() -> None:
    # V**(n-1) beams keep every prefix, so the search is exhaustive: it must find the
    # continuation of highest probability among all V**n, also where greedy decoding misses it
    spec = load_spec({"kind": "decoder", "vocab_size": 6, "d_model": 16, "max_seq_len": 16,
                      "decoder": {"n_layers": 1, "attention": {"n_heads": 2}}})
    prompt = torch.tensor([[1, 2]])
    every = torch.cartesian_prod(*[torch.arange(6)] * 3)  # (216, 3)
    greedy_missed = 0
    for seed in range(20):
        torch.manual_seed(seed)
        model = build_model(spec).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        scores = _sequence_log_prob(model, prompt, every)
        found = beam_search(model, prompt, num_beams=36, max_new_tokens=3, eos_id=None)
        assert torch.equal(found[0, 2:], every[scores.argmax()]), seed
        greedy = generate(model, prompt, max_new_tokens=3, temperature=0.0)
        greedy_missed += bool(_sequence_log_prob(model, prompt, greedy[:, 2:]) < scores.max() - 1e-3)
        # one beam and no end token is greedy decoding
        assert torch.equal(beam_search(model, prompt, num_beams=1, max_new_tokens=3, eos_id=None), greedy)
    assert greedy_missed  # the search is worth it for some of them


def test_beam_search_ends_at_eos(tiny: Any) -> None:
    spec, model = _model(tiny, "decoder")

    class LikesToEnd(torch.nn.Module):  # the same model, with the end token made the likeliest
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.spec = model, model.spec

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            out = self.inner(*args, **kwargs)
            out.logits[..., 7] += 20.0
            return out

    prompt = torch.randint(8, 256, (2, 4))
    assert not (beam_search(model, prompt, num_beams=3, max_new_tokens=6, eos_id=7) == 7).any()
    found = beam_search(LikesToEnd(), prompt, num_beams=3, max_new_tokens=6, eos_id=7)
    assert torch.equal(found, torch.cat([prompt, torch.full((2, 1), 7)], dim=1))  # ended at the first step


def test_beam_search_of_an_encoder_decoder_drops_the_start_token(tiny: Any) -> None:
    spec, model = _model(tiny, "encoder-decoder")
    src = torch.randint(3, 32, (2, 6))
    one = beam_search(model, src, num_beams=1, max_new_tokens=5, eos_id=None, start_id=1)
    greedy = generate_seq2seq(model, src, start_id=1, eos_id=None, max_new_tokens=5)
    assert torch.equal(one, greedy)
    assert beam_search(model, src, num_beams=4, max_new_tokens=5, eos_id=None, start_id=1).shape == (2, 5)


def test_beam_search_checks_its_arguments(tiny: Any) -> None:
    spec, model = _model(tiny, "decoder")
    prompt = torch.randint(3, 256, (1, 4))
    assert torch.equal(beam_search(model, prompt, num_beams=2, max_new_tokens=0, eos_id=None), prompt)
    with pytest.raises(ValueError, match="num_beams must be an integer >= 1"):
        beam_search(model, prompt, num_beams=0, max_new_tokens=3, eos_id=None)
    with pytest.raises(ValueError, match="must fit max_seq_len"):
        beam_search(model, prompt, num_beams=2, max_new_tokens=spec.max_seq_len, eos_id=None)
    # start_id says which kind the call is for: one that does not match the model is named,
    # not answered with "use generate", which has no beams
    with pytest.raises(ValueError, match="start_id is for an encoder-decoder, whose decoder starts from it: a "
                                         "decoder continues its prompt; leave start_id out"):
        beam_search(model, prompt, num_beams=2, max_new_tokens=3, eos_id=None, start_id=1)
    _, seq2seq = _model(tiny, "encoder-decoder")
    with pytest.raises(ValueError, match=r"beam_search of an encoder-decoder needs start_id="):
        beam_search(seq2seq, prompt, num_beams=2, max_new_tokens=3, eos_id=None)
    for stopping in ("never", None):  # a TypeError deep in the search
        with pytest.raises(ValueError, match=r"early_stopping must be True or False, got .*'never'.* not implemented"):
            beam_search(model, prompt, num_beams=2, max_new_tokens=3, eos_id=5, early_stopping=stopping)


def test_a_row_that_ends_before_the_others_goes_on_with_pad_id(tiny: Any) -> None:
    spec, model = _model(tiny, "decoder")
    prompts = torch.randint(3, 256, (2, 4))
    first = generate(model, prompts, max_new_tokens=1, temperature=0.0)[:, -1]
    eos = int(first[0])  # row 0 ends at its first new token
    out = generate(model, prompts, max_new_tokens=6, temperature=0.0, eos_id=eos)
    padded = generate(model, prompts, max_new_tokens=6, temperature=0.0, eos_id=eos, pad_id=0)
    if out.shape[1] == 5:  # row 1 ended at once too: nothing follows an end
        pytest.skip("both rows ended at their first token")
    assert out[0, 4] == padded[0, 4] == eos  # the end token itself
    assert (out[0, 5:] == eos).all() and (padded[0, 5:] == 0).all()
    differ = out[1] != padded[1]  # only after row 1's own end, if it has one
    assert (out[1][differ] == eos).all() and (padded[1][differ] == 0).all()
    with pytest.raises(ValueError, match=r"pad_id must be a token id in \[0, vocab_size\)"):
        generate(model, prompts, max_new_tokens=2, eos_id=1, pad_id=spec.vocab_size)


def test_penalize_repeats_divides_seen_scores_and_bans_repeated_ngrams() -> None:
    scores = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    out = penalize_repeats(scores, torch.tensor([[0, 1, 1]]), repetition_penalty=2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]  # seen: 0 and 1, positive halved, negative doubled
    # 5 6 … 5: the bigram (5, 6) exists, so after a 5 the 6 is banned, nothing else
    banned = penalize_repeats(torch.zeros(1, 8), torch.tensor([[5, 6, 2, 5]]), no_repeat_ngram_size=2)
    assert torch.isinf(banned).nonzero().tolist() == [[0, 6]]
    # padding is no token: left padding of 5s neither counts as seen nor forms n-grams
    padded = torch.tensor([[5, 5, 6, 2, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    assert not torch.isinf(penalize_repeats(torch.zeros(1, 8), padded, no_repeat_ngram_size=2,
                                            history_mask=mask)).any()
    assert penalize_repeats(torch.ones(1, 8), padded, repetition_penalty=2.0, history_mask=mask)[0, 5] == 0.5
    assert penalize_repeats(torch.ones(1, 8), padded[:, 2:4], repetition_penalty=2.0)[0, 5] == 1.0
    with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
        penalize_repeats(scores, torch.tensor([[0]]), repetition_penalty=0.0)
    with pytest.raises(ValueError, match="no_repeat_ngram_size must be an integer >= 0"):
        penalize_repeats(scores, torch.tensor([[0]]), no_repeat_ngram_size=-1)


def test_no_repeat_ngram_holds_in_sampled_and_beam_outputs(tiny: Any) -> None:
    spec, model = _model(tiny, "decoder")
    prompt = torch.randint(3, 256, (2, 3))
    for out in (generate(model, prompt, max_new_tokens=30, temperature=0.0, no_repeat_ngram_size=2),
                generate(model, prompt, max_new_tokens=30, temperature=1.5, no_repeat_ngram_size=2,
                         generator=torch.Generator().manual_seed(0)),
                beam_search(model, prompt, num_beams=3, max_new_tokens=20, eos_id=None, no_repeat_ngram_size=2)):
        for row in out.tolist():
            grams = list(zip(row, row[1:], strict=False))
            assert len(grams) == len(set(grams))


def test_a_start_token_that_is_the_end_token_is_no_repeat(tiny: Any, monkeypatch) -> None:
    # bpe and byte tokenizers start the decoder from <|endoftext|>, the end token too: in the
    # history, --no-repeat-ngram 1 would forbid ending and a penalty discourage it
    import importlib

    gen = importlib.import_module("specformer.training.generate")
    spec, model = _model(tiny, "encoder-decoder")
    seen: list[list[int]] = []
    real = gen.penalize_repeats

    def recording(scores: Any, history: Any, **kwargs: Any) -> Any:
        seen.append(history[0].tolist())
        return real(scores, history, **kwargs)

    monkeypatch.setattr(gen, "penalize_repeats", recording)
    source = torch.randint(3, spec.vocab_size, (1, 5))
    for start, eos in ((0, 0), (0, 1)):
        seen.clear()
        gen.generate_seq2seq(model, source, start_id=start, eos_id=eos, max_new_tokens=3, no_repeat_ngram_size=1)
        assert (seen[0] == []) == (start == eos) and seen[0][:1] in ([], [start])
        seen.clear()
        gen.beam_search(model, source, num_beams=2, start_id=start, eos_id=eos, max_new_tokens=3, no_repeat_ngram_size=1)
        assert (seen[0] == []) == (start == eos)


class _NoCache(torch.nn.Module):
    """A self-attention that ignores the cache, as a plugin's may."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Any, *, cache: Any = None, **kwargs: Any) -> Any:
        return self.inner(x, **kwargs)


def test_exact_match_decodes_without_the_cache_an_attention_that_keeps_none(tiny: Any) -> None:
    from specformer.specs.training import Seq2SeqSpec
    from specformer.training.objectives import Seq2Seq

    spec, model = _model(tiny, "encoder-decoder", positional={"type": "t5"})
    src = torch.randint(5, 40, (3, 7))
    target = generate_seq2seq(model, src, start_id=1, eos_id=2, max_new_tokens=6, use_cache=False)
    for layer in model.decoder.layers:
        layer.self_attn = _NoCache(layer.self_attn)
    labels = target.clone()
    labels[1, -1] = (labels[1, -1] + 1) % spec.vocab_size  # one row the model does not produce
    correct, total = Seq2Seq(Seq2SeqSpec()).exact_match(
        model, {"input_ids": src, "labels": labels}, start_id=1, eos_id=2
    )
    assert (correct, total) == (2, 3)


def test_beam_search_of_an_attention_that_keeps_no_cache_says_to_sample_without_one(tiny: Any) -> None:
    # beam search needs the cache: "--no-cache" alone would be refused with --num-beams
    from specformer.components import CacheNotFilledError

    spec, model = _model(tiny, "decoder")
    for layer in model.decoder.layers:
        layer.self_attn = _NoCache(layer.self_attn)
    with pytest.raises(CacheNotFilledError) as info:
        beam_search(model, torch.randint(0, 256, (1, 4)), num_beams=2, max_new_tokens=3, eos_id=None)
    message = str(info.value)
    assert message.startswith("beam search reorders a KV cache as beams are chosen, and layer 0's self-attention "
                              "(_NoCache) did not store its keys and values")
    assert message.endswith("generate(..., use_cache=False) (specformer generate --no-cache, without --num-beams)")


def test_forced_tokens_open_and_close_the_output_and_exact_match_opens_with_the_start(tiny: Any) -> None:
    from specformer.specs.training import Seq2SeqSpec
    from specformer.training.objectives import Seq2Seq

    spec, model = _model(tiny, "encoder-decoder", positional={"type": "t5"})
    src = torch.randint(5, 40, (3, 7))
    free = generate_seq2seq(model, src, start_id=1, eos_id=None, max_new_tokens=6)
    forced_start = int((free[0, 0] + 1) % spec.vocab_size)  # a token the model does not choose first
    out = generate_seq2seq(model, src, start_id=1, eos_id=None, max_new_tokens=6, forced_start_id=forced_start,
                           forced_end_id=2)
    assert out[:, 0].tolist() == [forced_start] * 3 and out[:, -1].tolist() == [2] * 3
    assert torch.equal(out[:, 1:-1], generate_seq2seq(model, src, start_id=1, eos_id=None, max_new_tokens=5,
                                                      forced_start_id=forced_start)[:, 1:])
    beams = beam_search(model, src, num_beams=3, max_new_tokens=6, eos_id=None, start_id=1,
                        forced_start_id=forced_start, forced_end_id=2)
    assert beams[:, 0].tolist() == [forced_start] * 3 and beams[:, -1].tolist() == [2] * 3

    # targets the model gives after the forced start: exact match decodes them only if it forces it too
    labels = generate_seq2seq(model, src, start_id=1, eos_id=2, max_new_tokens=6, forced_start_id=forced_start)
    objective = Seq2Seq(Seq2SeqSpec())
    batch = {"input_ids": src, "labels": labels}
    assert objective.exact_match(model, batch, start_id=1, eos_id=2) == (0, 3)
    assert objective.exact_match(model, batch, start_id=1, eos_id=2, forced_start_id=forced_start) == (3, 3)


def test_validation_decodes_from_the_forced_start_the_spec_names(monkeypatch) -> None:
    from specformer.builder.lightning import SpecModule
    from specformer.data.tokenizers import TaskTokenizer
    from specformer.specs.loader import load_spec

    spec = load_spec("t5-nano", ["training.objective.forced_start=<s>", "training.objective.forced_end=</s>"])
    tok = TaskTokenizer()
    module = SpecModule(spec, tokenizer=tok)
    seen: dict[str, Any] = {}

    def exact_match(model: Any, batch: Any, **kwargs: Any) -> tuple[int, int]:
        seen.update(kwargs)
        return 0, 1

    monkeypatch.setattr(module.objective, "exact_match", exact_match)
    module.on_validation_epoch_start()
    src = torch.randint(5, 20, (2, 6))
    dec = torch.full((2, 4), tok.bos_id)
    with torch.no_grad():  # as Lightning runs validation
        module.validation_step({"input_ids": src, "attention_mask": torch.ones_like(src), "decoder_input_ids": dec,
                                "decoder_attention_mask": torch.ones_like(dec), "labels": dec.clone()}, 0)
    # the forced start opens every decode; the forced end is left out (it would end unfinished ones)
    assert seen == {"start_id": tok.bos_id, "eos_id": tok.eos_id, "forced_start_id": tok.token_id("<s>")}


def test_generation_ends_where_no_token_is_left(tiny: Any) -> None:
    # no_repeat_ngram_size=1 over 256 ids: after 256 distinct tokens every id repeats a 1-gram
    spec, model = _model(tiny, "decoder", max_seq_len=512)
    n = spec.vocab_size
    prompt = torch.randint(3, n, (1, 4))
    distinct = len(set(prompt[0].tolist()))
    for temperature in (0.0, 1.0):
        out = generate(model, prompt, max_new_tokens=n + 10, temperature=temperature, no_repeat_ngram_size=1,
                       generator=torch.Generator().manual_seed(0))
        new = out[0, 4:].tolist()
        # every id is taken once (the prompt's ones already spent), then generation stops, no id repeated
        assert len(new) == n - distinct and len(set(out[0].tolist())) == n, (temperature, len(new))
    # with an end token, the row ends with it instead
    out = generate(model, prompt, max_new_tokens=n + 10, temperature=0.0, no_repeat_ngram_size=1, eos_id=2)
    assert out[0, -1].item() == 2 and out.shape[1] <= n + 1
    # nothing to sample from at all: -1, not a crash or a banned id
    blocked = torch.full((2, 5), float("-inf"))
    blocked[1, 3] = 0.0
    assert sample_next(blocked, temperature=0.0).tolist() == [-1, 3]
    assert sample_next(blocked, temperature=1.0, generator=torch.Generator().manual_seed(0)).tolist() == [-1, 3]


def test_settings_that_are_not_numbers_are_refused(tiny: Any) -> None:
    spec, model = _model(tiny, "decoder")
    prompt = torch.randint(3, 256, (1, 4))
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature must be a finite number"):
            generate(model, prompt, max_new_tokens=2, temperature=bad)
        with pytest.raises(ValueError, match="length_penalty must be a finite number"):
            beam_search(model, prompt, num_beams=2, max_new_tokens=2, eos_id=None, length_penalty=bad)


def test_top_p_keeps_the_tokens_transformers_keeps_among_tied_logits() -> None:
    # [1, 1, 1, 1, 0] at p 0.5: transformers kept {1, 2, 3}, specformer's descending cut {0, 1, 2}
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    warper = transformers.TopPLogitsWarper(top_p=0.5)
    g = torch.Generator().manual_seed(0)
    cases = [torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])]
    cases += [torch.randint(-3, 4, (4, 12)).float() for _ in range(20)]  # ties everywhere
    for logits in cases:
        for p in (0.3, 0.5, 0.9):
            warper.top_p = p
            kept = torch.isfinite(warper(None, logits.clone()))
            sampled = sample_next(logits.repeat(200, 1), top_p=p, generator=g).view(200, -1)
            for row in range(logits.shape[0]):
                assert set(sampled[:, row].tolist()) <= set(kept[row].nonzero().flatten().tolist())


def test_seq2seq_samples_when_a_top_k_or_top_p_asks(tiny: Any, monkeypatch) -> None:
    # greedy by default: a top_k given alone went unused, silently
    import importlib

    generation = importlib.import_module("specformer.training.generate")
    asked: list[float] = []
    sample = generation.sample_next

    def spy(logits: Any, temperature: float = 1.0, **kwargs: Any) -> Any:
        asked.append(temperature)
        return sample(logits, temperature=temperature, **kwargs)

    monkeypatch.setattr(generation, "sample_next", spy)
    _, model = _model(tiny, "encoder-decoder")
    source = torch.randint(5, 40, (1, 6))
    for kwargs, want in (({}, 0.0), ({"top_k": 5}, 1.0), ({"top_p": 0.9}, 1.0), ({"top_k": 5, "temperature": 0.5}, 0.5)):
        asked.clear()
        generation.generate_seq2seq(model, source, start_id=1, eos_id=None, max_new_tokens=2, **kwargs)
        assert set(asked) == {want}, (kwargs, asked)
