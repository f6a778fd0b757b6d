"""KV cache: incremental decoding reproduces the full forward; cache editing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from specformer.builder import build_model
from specformer.components import KVCache
from specformer.registry import REGISTRY
from specformer.specs.schema import ModelSpec

Tiny = Callable[..., ModelSpec]


@pytest.mark.parametrize("positional", REGISTRY.names("positional"))
@pytest.mark.parametrize("window", [None, 4])
def test_incremental_decoding_equals_full_forward(tiny: Tiny, positional: str, window: int | None) -> None:
    spec = tiny(positional={"type": positional}, stack={"attention": {"sliding_window": window}})
    model = build_model(spec).eval()
    ids = torch.randint(0, spec.vocab_size, (2, 13))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :5], use_cache=True)  # prefill
        steps = [out.logits]
        cache = out.cache
        steps.append(model(ids[:, 5:8], cache=cache).logits)  # a chunk of three
        for t in range(8, 13):
            out = model(ids[:, t : t + 1], cache=cache)
            assert out.cache is cache
            steps.append(out.logits)
    assert cache.length == 13
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


@pytest.mark.parametrize("positional", ["t5", "sinusoidal", "rope"])
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_incremental_decoding_equals_full_forward_encoder_decoder(
    tiny: Tiny, positional: str, placement: str
) -> None:
    spec = tiny("encoder-decoder", positional={"type": positional}, stack={"norm": {"placement": placement}})
    model = build_model(spec).eval()
    src = torch.randint(0, spec.vocab_size, (2, 9))
    src_mask = torch.ones(2, 9, dtype=torch.long)
    src_mask[1, 6:] = 0
    tgt = torch.randint(0, spec.vocab_size, (2, 8))
    with torch.no_grad():
        full = model(src, attention_mask=src_mask, decoder_input_ids=tgt).logits
        enc = model.encode(src, src_mask)
        out = model(decoder_input_ids=tgt[:, :1], encoder_hidden_states=enc, attention_mask=src_mask, use_cache=True)
        steps = [out.logits]
        cross_k = out.cache.cross(0)[0]
        for t in range(1, 8):
            out = model(
                decoder_input_ids=tgt[:, t : t + 1],
                encoder_hidden_states=enc,
                attention_mask=src_mask,
                cache=out.cache,
            )
            steps.append(out.logits)
        assert out.cache.cross(0)[0] is cross_k  # cross keys computed once, then reused
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


@pytest.mark.parametrize(
    "stack,new_tokens",
    [
        ({}, 1),
        # sliding windows on layers 0 and 2 beside a full-attention layer, past the window
        ({"n_layers": 3, "overrides": [{"layers": [0, 2], "attention": {"sliding_window": 4}}]}, 12),
    ],
)
def test_left_padded_batch_decodes_like_each_sequence_alone(tiny: Tiny, stack: dict, new_tokens: int) -> None:
    spec = tiny(positional={"type": "rope"}, stack=stack)
    model = build_model(spec).eval()
    a = torch.randint(1, spec.vocab_size, (1, 10))
    b = torch.randint(1, spec.vocab_size, (1, 7))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], dim=1)])
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    nxt = torch.randint(1, spec.vocab_size, (2, new_tokens))
    with torch.no_grad():
        out = model(batch, attention_mask=mask, use_cache=True)
        for i in range(new_tokens):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
            step = model(nxt[:, i : i + 1], attention_mask=mask, cache=out.cache).logits
        alone_a = model(torch.cat([a, nxt[:1]], dim=1)).logits[:, -1]
        alone_b = model(torch.cat([b, nxt[1:]], dim=1)).logits[:, -1]
    assert torch.allclose(step[0, -1], alone_a[0], atol=1e-5)
    assert torch.allclose(step[1, -1], alone_b[0], atol=1e-5)
    if stack:
        assert out.cache.keys(1).shape[2] == 10 + new_tokens  # the full-attention layer keeps everything
        assert out.cache.keys(0).shape[2] < 10 + new_tokens


def test_cache_grows_crops_and_reorders() -> None:
    cache = KVCache()
    assert cache.length == 0 and cache.batch_size is None
    k = torch.randn(3, 2, 5, 4)
    v = torch.randn(3, 2, 5, 4)
    keys, values = cache.update(0, k, v)
    assert torch.equal(keys, k) and torch.equal(values, v)
    for _ in range(40):  # past the initial capacity: storage grows, contents stay
        keys, values = cache.update(0, k[:, :, :1], v[:, :, :1])
    assert cache.length == 45 and keys.shape == (3, 2, 45, 4)
    assert torch.equal(keys[:, :, :5], k) and torch.equal(keys[:, :, 44], k[:, :, 0])
    cache.crop(7)
    assert cache.length == 7 and cache.keys(0).shape == (3, 2, 7, 4)
    cache.set_cross(0, k, v)
    cache.reorder(torch.tensor([2, 0]))
    assert cache.batch_size == 2
    assert torch.equal(cache.keys(0)[0], keys[2, :, :7])
    assert torch.equal(cache.cross(0)[1][1], v[0])
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(8)


def test_crop_rewinds_decoding(tiny: Tiny) -> None:
    model = build_model(tiny()).eval()
    ids = torch.randint(0, 61, (1, 8))
    with torch.no_grad():
        out = model(ids[:, :6], use_cache=True)
        model(torch.randint(0, 61, (1, 2)), cache=out.cache)  # a rejected draft
        out.cache.crop(6)
        resumed = model(ids[:, 6:], cache=out.cache).logits
        full = model(ids).logits
    assert torch.allclose(resumed, full[:, 6:], atol=1e-5)


def test_logits_to_keep_projects_only_the_last_positions(tiny: Tiny) -> None:
    model = build_model(tiny()).eval()
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        full = model(ids).logits
        last = model(ids, logits_to_keep=1)
    assert last.logits.shape == (2, 1, 61)
    assert torch.allclose(last.logits, full[:, -1:], atol=1e-6)
    assert last.hidden_states.shape == (2, 7, 32)
    s2s = build_model(tiny("encoder-decoder")).eval()
    with torch.no_grad():
        a = s2s(ids, decoder_input_ids=ids[:, :4]).logits
        b = s2s(ids, decoder_input_ids=ids[:, :4], logits_to_keep=2).logits
    assert torch.allclose(b, a[:, -2:], atol=1e-6)


def test_logits_to_keep_that_is_not_a_count_is_an_error(tiny: Tiny) -> None:
    # a negative count gave every row; Hugging Face's tensor of indices failed inside torch
    model = build_model(tiny()).eval()
    s2s = build_model(tiny("encoder-decoder")).eval()
    ids = torch.randint(0, 61, (2, 7))
    for call in (lambda **kw: model(ids, **kw), lambda **kw: s2s(ids, decoder_input_ids=ids[:, :4], **kw)):
        with pytest.raises(ValueError, match=r"logits_to_keep must be >= 0 \(the number of last positions; 0: all\), got -1"):
            call(logits_to_keep=-1)
        with pytest.raises(TypeError, match="logits_to_keep must be an int.*got Tensor"):
            call(logits_to_keep=torch.tensor([0, 3]))
        with pytest.raises(TypeError, match="got bool"):
            call(logits_to_keep=True)


def test_a_mask_that_does_not_cover_the_cache_is_a_readable_error(tiny: Tiny) -> None:
    model = build_model(tiny()).eval()
    with torch.no_grad():
        out = model(torch.randint(0, 61, (1, 4)), use_cache=True)
        with pytest.raises(ValueError, match=r"attention_mask must be \(batch, length\) = \(1, 5\), covering the 4 cached and 1 new "
                           r"positions of input_ids; got shape \(1, 1\)"):
            model(torch.randint(0, 61, (1, 1)), attention_mask=torch.ones(1, 1), cache=out.cache)


@pytest.mark.parametrize("positional", REGISTRY.names("positional"))
def test_sliding_window_cache_is_a_rolling_buffer(tiny: Tiny, positional: str) -> None:
    # window 3: slack 3, storage at most W - 1 + slack = 5 positions; a 9-token prompt, a chunk of 4 and
    # 26 single steps cross the compaction point many times
    spec = tiny(positional={"type": positional}, stack={"attention": {"sliding_window": 3}}, max_seq_len=64)
    model = build_model(spec).eval()
    ids = torch.randint(0, spec.vocab_size, (2, 39))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :9], use_cache=True)
        steps, cache = [out.logits], out.cache
        steps.append(model(ids[:, 9:13], cache=cache).logits)
        for t in range(13, 39):
            steps.append(model(ids[:, t : t + 1], cache=cache).logits)
            stored = cache.keys(0)
            assert cache.first_position(0) == t + 1 - stored.shape[2]
            assert 2 <= stored.shape[2] <= 5  # at least the W - 1 the next query needs
            b, hkv, _, dh = stored.shape
            assert stored.untyped_storage().nbytes() == b * hkv * 5 * dh * 4  # fp32
            assert cache.nbytes == 2 * 2 * b * hkv * 5 * dh * 4  # keys and values of 2 layers
    assert cache.length == 39
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


@pytest.mark.parametrize("window", [None, 4])
def test_a_cache_told_its_length_allocates_no_more(tiny: Tiny, window: int | None) -> None:
    # 10 prompt positions, then single steps to 100: doubling allocates 16, 32, 64, 128
    # positions; told max_length=100 it stops at 100 and decodes the same. A window layer holds
    # W - 1 + slack = 7 positions, and the last time it moves only the 5 up to position 100: the
    # W - 1 = 3 that position 98 sees, and 98 and 99
    model = build_model(tiny(stack={"attention": {"sliding_window": window}}, max_seq_len=128)).eval()
    ids = torch.randint(0, 61, (1, 100))
    runs = {}
    for max_length in (None, 100):
        cache = KVCache(max_length=max_length)
        with torch.no_grad():
            steps = [model(ids[:, :10], cache=cache).logits]
            steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(10, 100)]
        runs[max_length] = (torch.cat(steps, dim=1), cache._keys[0].shape[2])
    assert torch.equal(runs[None][0], runs[100][0])
    assert (runs[None][1], runs[100][1]) == ((128, 100) if window is None else (7, 5))
    cache = KVCache(max_length=4)  # told too little: it still holds everything, by doubling again
    with torch.no_grad():
        steps = [model(ids[:, t : t + 1], cache=cache).logits for t in range(0, 10)]
    assert cache.length == 10 and torch.allclose(torch.cat(steps, dim=1), runs[None][0][:, :10], atol=1e-5)
    if window is None:
        assert cache.keys(0).shape[2] == 10 and cache._keys[0].shape[2] == 16  # 4, then at least 16 as without it
    with pytest.raises(ValueError, match="max_length must be at least 1, got 0"):
        KVCache(max_length=0)


def test_crop_within_a_sliding_window_and_beyond_it(tiny: Tiny) -> None:
    model = build_model(tiny(stack={"attention": {"sliding_window": 4}})).eval()
    ids = torch.randint(0, 61, (1, 20))
    with torch.no_grad():
        out = model(ids[:, :18], use_cache=True)  # keeps positions 15, 16, 17
        model(torch.randint(0, 61, (1, 2)), cache=out.cache)  # a rejected draft: 18, 19
        out.cache.crop(18)
        resumed = model(ids[:, 18:], cache=out.cache).logits
        full = model(ids).logits
        assert torch.allclose(resumed, full[:, 18:], atol=1e-5)
        with pytest.raises(ValueError, match="sliding window of 4 and keeps positions from"):
            out.cache.crop(3)


def test_attention_weights_of_a_window_layer_cover_the_keys_it_holds(tiny: Tiny) -> None:
    model = build_model(tiny(stack={"attention": {"sliding_window": 4}})).eval()
    ids = torch.randint(0, 61, (1, 12))
    with torch.no_grad():
        out = model(ids[:, :11], use_cache=True)
        step = model(ids[:, 11:], cache=out.cache, output_attentions=True)
        full = model(ids, output_attentions=True)
    weights = step.attentions[0]  # (B, H, 1, 4): positions 8..11
    assert weights.shape[-2:] == (1, 4)
    assert torch.allclose(weights[..., 0, :], full.attentions[0][..., 11, 8:], atol=1e-6)
    assert torch.allclose(full.attentions[0][..., 11, :8], torch.zeros(1), atol=0)  # outside the window


@pytest.mark.parametrize("kind", ["decoder", "encoder-decoder"])
def test_a_cache_of_another_batch_is_a_readable_error(tiny: Tiny, kind: str) -> None:
    model = build_model(tiny(kind)).eval()
    ids = torch.randint(0, 61, (2, 4))
    name = "decoder_input_ids" if kind == "encoder-decoder" else "input_ids"
    with torch.no_grad():
        if kind == "encoder-decoder":
            enc = model.encode(ids)
            cache = model(decoder_input_ids=ids, encoder_hidden_states=enc, use_cache=True).cache
            step = {"decoder_input_ids": ids[:1, :1], "encoder_hidden_states": enc[:1]}
        else:
            cache = model(ids, use_cache=True).cache
            step = {"input_ids": ids[:1, :1]}
        with pytest.raises(ValueError, match=rf"^the cache holds a batch of 2 sequences but {name} has a batch of 1"):
            model(**step, cache=cache)
        cache.reorder(torch.tensor([1]))  # keep one row: now batch 1 is right
        assert model(**step, cache=cache).logits.shape[:2] == (1, 1)


class _NoCache(torch.nn.Module):
    """A self-attention that ignores the cache, as a plugin's may."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x, *, cache=None, **kwargs):  # type: ignore[no-untyped-def]
        return self.inner(x, **kwargs)


def test_an_attention_that_does_not_fill_the_cache_is_refused_not_decoded_from(tiny: Tiny) -> None:
    # without the cache the layer would see only each new token: wrong text, no error
    from specformer.training.generate import generate

    spec = tiny()
    model = build_model(spec).eval()
    model.decoder.layers[1].self_attn = _NoCache(model.decoder.layers[1].self_attn)
    ids = torch.randint(0, spec.vocab_size, (1, 6))
    with torch.no_grad(), pytest.raises(ValueError) as info:
        model(ids, use_cache=True)
    message = str(info.value)
    assert "layer 1's self-attention (_NoCache)" in message and "holds 0 of the 6 positions" in message
    assert "cache.update(layer_idx, k, v)" in message and "use_cache=False" in message
    with pytest.raises(ValueError, match="layer 1's self-attention"):
        generate(model, ids, max_new_tokens=2, temperature=0.0)
    # without a cache it decodes, as the full forward does
    out = generate(model, ids, max_new_tokens=2, temperature=0.0, use_cache=False)
    with torch.no_grad():
        assert int(out[0, -2]) == int(model(ids).logits[0, -1].argmax())
