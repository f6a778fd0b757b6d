"""Decoders with a sliding window in every layer generate past max_seq_len with their rolling KV
cache, at the tokens' own positions (as Mistral does), equal to one forward over the whole text."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from specformer import load_spec
from specformer.analysis import kv_cache_bytes
from specformer.builder import build_model
from specformer.components.cache import window_positions
from specformer.training.generate import beam_search, generate

WINDOWS = (8, 12)  # reach: the last (8 - 1) + (12 - 1) + 1 = 19 tokens decide the next one
REACH = sum(w - 1 for w in WINDOWS) + 1


def _windowed(positional: str, windows: tuple[int | None, ...] = WINDOWS, max_seq_len: int = 16) -> Any:
    data = {
        "name": "window", "kind": "decoder", "vocab_size": 50, "d_model": 32, "max_seq_len": max_seq_len,
        "positional": {"type": positional},
        "decoder": {"n_layers": len(windows), "attention": {"n_heads": 4, "n_kv_heads": 2},
                    "ffn": {"d_ff": 64},
                    "overrides": [{"layers": [i], "attention": {"sliding_window": w}}
                                  for i, w in enumerate(windows) if w is not None]},
    }
    torch.manual_seed(0)
    model = build_model(load_spec(data)).eval()
    with torch.no_grad():
        for p in model.parameters():  # far from the initialisation, so that tokens vary
            p.add_(torch.randn_like(p) * 0.2)
    return model


def _recorded(model: Any) -> list[tuple[int, torch.Tensor, Any]]:
    """Each forward's (input length, last logits, cache storage) as generate calls the model: the
    storage as {layer: key tensor shape} and the cache's bytes, then."""
    calls: list[tuple[int, torch.Tensor, Any]] = []

    def record(module: Any, args: Any, kwargs: Any, out: Any) -> None:
        storage = None
        if out.cache is not None:
            storage = ({layer: tuple(k.shape) for layer, k in out.cache._keys.items()}, out.cache.nbytes,
                       out.cache.length, [out.cache.keys(layer).shape[2] for layer in out.cache._keys])
        ids = args[0] if args else kwargs.get("input_ids", kwargs.get("decoder_input_ids"))
        calls.append((ids.shape[1], out.logits[:, -1], storage))

    model.register_forward_hook(record, with_kwargs=True)
    return calls


@pytest.mark.parametrize("positional", ["rope", "alibi", "none", "sinusoidal", "t5"])
@pytest.mark.parametrize("prompt_len", [5, 30])
def test_every_layer_windowed_decodes_past_max_seq_len_as_one_forward_over_the_whole_text(
    positional: str, prompt_len: int
) -> None:
    # max_seq_len 16, 60 new tokens: with the cache every step reads one token, never the context
    # again, and its logits are those of a forward over all 65 (or 90) tokens at their positions
    model = _windowed(positional)
    calls = _recorded(model)
    prompt = torch.randint(0, 50, (2, prompt_len), generator=torch.Generator().manual_seed(1))
    sampled = {"temperature": 1.0}  # sampled, so that the text varies (greedy repeats a token)
    out = generate(model, prompt, max_new_tokens=60, generator=torch.Generator().manual_seed(0), **sampled)
    assert out.shape == (2, prompt_len + 60)
    # the prompt is read once (its last REACH tokens, in chunks of max_seq_len), then one token a step
    first = min(prompt_len, REACH)
    chunks = [min(16, first - a) for a in range(0, first, 16)]
    assert [n for n, _, _ in calls] == [*chunks, *[1] * 59]
    steps = torch.stack([logits for _, logits, _ in calls[len(chunks) - 1:]], dim=1)
    stored = [storage for _, _, storage in calls]
    with torch.no_grad():
        full = model(out).logits  # (2, T + 60, V), no cache
    torch.testing.assert_close(steps, full[:, prompt_len - 1 : -1], atol=1e-5, rtol=0)
    assert len(set(out[0, prompt_len:].tolist())) > 3  # not one token repeated
    # the cache's storage is bounded: W - 1 + min(W, 128) positions per layer, whatever the length
    assert stored[-1][2] == first + 59  # positions seen
    assert all(w - 1 <= kept <= window_positions(w) for kept, w in zip(stored[-1][3], WINDOWS, strict=True))
    for layer, w in enumerate(WINDOWS):  # B, Hkv, positions, Dh
        assert max(shapes[layer] for shapes, *_ in stored) == (2, 2, window_positions(w), 8)
    assert max(nbytes for _, nbytes, *_ in stored) == 2 * 2 * 2 * 8 * 4 * sum(map(window_positions, WINDOWS))
    # without the cache every step reads the REACH tokens that decide it, and draws the same
    again = generate(model, prompt, max_new_tokens=60, generator=torch.Generator().manual_seed(0), use_cache=False,
                     **sampled)
    assert torch.equal(again, out)


def test_left_padded_prompts_of_a_windowed_model_decode_as_each_would_alone() -> None:
    model = _windowed("rope")
    g = torch.Generator().manual_seed(2)
    short, long = torch.randint(3, 50, (1, 20), generator=g), torch.randint(3, 50, (1, 25), generator=g)
    batch = torch.cat([torch.cat([torch.zeros(1, 5, dtype=torch.long), short], dim=1), long])  # (2, 25)
    mask = torch.ones_like(batch)
    mask[0, :5] = 0
    for use_cache in (True, False):
        both = generate(model, batch, attention_mask=mask, max_new_tokens=30, temperature=0.0, use_cache=use_cache)
        for row, prompt in enumerate((short, long)):
            alone = generate(model, prompt, max_new_tokens=30, temperature=0.0)
            assert torch.equal(both[row, 25:], alone[0, prompt.shape[1]:])


def test_a_model_with_a_full_attention_layer_still_slides_at_max_seq_len() -> None:
    # one layer sees every position: past max_seq_len the context slides and is read again
    model = _windowed("rope", windows=(8, None))
    calls = _recorded(model)
    prompt = torch.randint(0, 50, (1, 5))
    out = generate(model, prompt, max_new_tokens=20, temperature=0.0)
    assert max(n for n, _, _ in calls) == 16  # re-read at max_seq_len
    assert torch.equal(out, generate(model, prompt, max_new_tokens=20, temperature=0.0, max_seq_len=16))
    # and a learned table is a table: it slides too
    learned = _windowed("learned")
    calls = _recorded(learned)
    generate(learned, prompt, max_new_tokens=20, temperature=0.0)
    assert max(n for n, _, _ in calls) == 16


def test_a_windowed_model_slides_where_max_seq_len_is_given() -> None:
    model = _windowed("rope")
    calls = _recorded(model)
    prompt = torch.randint(0, 50, (1, 5))
    generate(model, prompt, max_new_tokens=20, temperature=0.0, max_seq_len=16)
    assert max(n for n, _, _ in calls) == 16


def test_beam_search_of_a_windowed_model_runs_past_max_seq_len() -> None:
    # beams keep their context within max_seq_len unless every layer has a window: then the
    # rolling cache goes on, and one beam is greedy decoding
    model = _windowed("rope")
    prompt = torch.randint(0, 50, (1, 30), generator=torch.Generator().manual_seed(4))
    one = beam_search(model, prompt, num_beams=1, max_new_tokens=40, eos_id=None)
    assert torch.equal(one, generate(model, prompt, max_new_tokens=40, temperature=0.0))
    four = beam_search(model, prompt, num_beams=4, max_new_tokens=40, eos_id=None)
    assert four.shape == (1, 70)
    with pytest.raises(ValueError, match="must fit max_seq_len"):
        beam_search(_windowed("rope", windows=(8, None)), prompt[:, :10], num_beams=2, max_new_tokens=10, eos_id=None)


def test_show_reports_the_bytes_a_windowed_cache_holds_after_a_long_generation(tmp_path: Any) -> None:
    # windows 3 (storage 2 + 3 = 5 positions) and 200 (199 + 128 = 327), 2 KV heads of 8, fp32
    from typer.testing import CliRunner

    from specformer.cli import app

    model = _windowed("rope", windows=(3, 200), max_seq_len=64)
    calls = _recorded(model)
    prompt = torch.randint(0, 50, (1, 10))
    generate(model, prompt, max_new_tokens=500, temperature=0.0)
    peak = max(storage[1] for _, _, storage in calls)  # the bytes of the cache's tensors
    path = tmp_path / "window.yaml"
    path.write_text(model.spec.to_yaml())
    result = CliRunner().invoke(app, ["show", str(path), "--seq-len", "510", "--dtype", "fp32", "-f", "markdown"])
    assert result.exit_code == 0, result.output
    shown = re.search(r"\| KV cache at seq_len 510, batch 1 \| ([\d,]+) \|", result.output)
    assert shown is not None, result.output
    assert int(shown.group(1).replace(",", "")) == 2 * 2 * 8 * 4 * (5 + 327) == peak
    assert kv_cache_bytes(model.spec, seq_len=100, dtype="fp32") == 2 * 2 * 8 * 4 * (5 + 100)


@pytest.mark.parametrize("beams", [1, 3])
def test_the_cli_generates_past_max_seq_len_with_a_windowed_models_rolling_cache(
    tmp_path: Any, monkeypatch: Any, beams: int
) -> None:
    # max_seq_len 16 and -n 40: every step reads one token, none re-reads the context, and no
    # warning says the prompt is read in part
    from typer.testing import CliRunner

    from specformer.cli import app
    from specformer.interop.hf import save_safetensors

    model = _windowed("rope", max_seq_len=16)
    data = model.spec.to_dict()
    data["vocab_size"] = 300
    data["training"] = {"tokenizer": {"type": "byte"}}
    spec = load_spec(data)
    torch.manual_seed(0)
    model = build_model(spec)
    save_safetensors(model.state_dict(), tmp_path / "w.safetensors")
    (tmp_path / "w.yaml").write_text(spec.to_yaml())
    lengths: list[int] = []
    forward = type(model).forward

    def spy(self: Any, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        lengths.append(input_ids.shape[1])
        return forward(self, input_ids, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    prompt = "a prompt of more than sixteen bytes"  # 35 tokens: the last REACH are read, in chunks of 16
    args = ["generate", str(tmp_path / "w.safetensors"), "--spec", str(tmp_path / "w.yaml"), "-p", prompt,
            "-n", "40", "--num-beams", str(beams)] + (["--greedy"] if beams == 1 else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
    assert lengths[:2] == [16, REACH - 16] and set(lengths[2:]) == {1} and len(lengths) == 41
    # --max-seq-len slides it as before
    lengths.clear()
    result = CliRunner().invoke(app, [*args, "--max-seq-len", "64"])
    assert result.exit_code == 0, result.output
    assert lengths[0] == len(prompt)


def test_a_decoding_step_of_a_windowed_model_builds_its_bias_over_the_window_only(monkeypatch: Any) -> None:
    # ALiBi's bias and the padding cover the keys the widest window sees (12), not every position
    # so far: a step costs the same at the 100th token as at the 20th
    from specformer.components.positional import ALiBi

    keys: list[int] = []
    bias = ALiBi.bias

    def spy(self: Any, q_index: torch.Tensor, k_index: torch.Tensor, *, dtype: torch.dtype) -> torch.Tensor:
        keys.append(k_index.shape[0])
        return bias(self, q_index, k_index, dtype=dtype)

    monkeypatch.setattr(ALiBi, "bias", spy)
    model = _windowed("alibi")
    prompt = torch.randint(3, 50, (2, 6))
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0
    out = generate(model, prompt, attention_mask=mask, max_new_tokens=100, temperature=0.0)
    assert keys[0] == 6 and max(keys[1:]) == max(WINDOWS) and keys[-1] == max(WINDOWS)
    with torch.no_grad():  # and the tokens are those of one forward over the whole text
        logits = model(out, attention_mask=torch.cat([mask, torch.ones(2, 100, dtype=torch.long)], dim=1)).logits
    assert torch.equal(logits[:, 5:-1].argmax(-1), out[:, 6:])


def test_an_encoder_decoder_with_a_windowed_decoder_decodes_past_max_seq_len_with_its_rolling_cache() -> None:
    # generate_seq2seq caps the output only at a learned table: the decoder's rolling cache goes
    # on, its storage bounded, and the tokens are those decoded without the cache
    from specformer.training.generate import generate_seq2seq

    data = {
        "name": "window-t5", "kind": "encoder-decoder", "vocab_size": 50, "d_model": 32, "max_seq_len": 16,
        "positional": {"type": "rope"},
        "encoder": {"n_layers": 1, "attention": {"n_heads": 4}, "ffn": {"d_ff": 64}},
        "decoder": {"n_layers": 2, "attention": {"n_heads": 4, "sliding_window": 4}, "ffn": {"d_ff": 64}},
    }
    torch.manual_seed(0)
    model = build_model(load_spec(data)).eval()
    calls = _recorded(model)
    src = torch.randint(3, 50, (2, 10))
    out = generate_seq2seq(model, src, start_id=0, eos_id=None, max_new_tokens=40, temperature=0.0)
    assert out.shape == (2, 40)
    assert torch.equal(out, generate_seq2seq(model, src, start_id=0, eos_id=None, max_new_tokens=40, use_cache=False))
    shapes = [storage[0] for *_, storage in calls[:40]]
    assert max(s[layer] for s in shapes for layer in s) == (2, 4, window_positions(4), 8)
