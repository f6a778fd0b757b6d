"""Padding: a padded batch gives, on its real tokens, what each sequence gives alone."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from specformer.builder import build_model
from specformer.specs.schema import ModelSpec

Tiny = Callable[..., ModelSpec]
PAD = 0


def _batch(seqs: list[torch.Tensor], *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), PAD)
    mask = torch.zeros(len(seqs), n, dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(n - len(s), n) if left else slice(0, len(s))
        ids[i, sl] = s
        mask[i, sl] = 1
    return ids, mask


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "t5", "sinusoidal"])
@pytest.mark.parametrize("left", [False, True])
def test_decoder_padding_invariance(tiny: Tiny, positional: str, left: bool) -> None:
    spec = tiny(positional={"type": positional})
    model = build_model(spec).eval()
    seqs = [torch.randint(1, 61, (n,)) for n in (8, 5, 2)]
    ids, mask = _batch(seqs, left=left)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
        for i, s in enumerate(seqs):
            alone = model(s[None]).logits[0]
            real = batched[i][mask[i].bool()]
            assert torch.allclose(real, alone, atol=1e-5), i


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "t5", "alibi"])
@pytest.mark.parametrize("head", ["mlm", "lm"])
@pytest.mark.parametrize("left", [False, True])
def test_encoder_padding_invariance(tiny: Tiny, positional: str, head: str, left: bool) -> None:
    # positions count real tokens, so left padding does not shift them either
    spec = tiny("encoder", positional={"type": positional}, head={"type": head})
    model = build_model(spec).eval()
    seqs = [torch.randint(1, 61, (n,)) for n in (7, 3)]
    ids, mask = _batch(seqs, left=left)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
        for i, s in enumerate(seqs):
            alone = model(s[None]).logits[0]
            assert torch.allclose(batched[i][mask[i].bool()], alone, atol=1e-5)


@pytest.mark.parametrize("pooling", ["first", "mean", "last"])
def test_classification_pooling_ignores_padding(tiny: Tiny, pooling: str) -> None:
    spec = tiny("encoder", head={"type": "classification", "n_classes": 3, "pooling": pooling})
    model = build_model(spec).eval()
    seqs = [torch.randint(1, 61, (n,)) for n in (6, 4)]
    ids, mask = _batch(seqs, left=False)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
        assert batched.shape == (2, 3)
        for i, s in enumerate(seqs):
            assert torch.allclose(batched[i], model(s[None]).logits[0], atol=1e-5)


@pytest.mark.parametrize("positional", ["t5", "learned", "sinusoidal"])
@pytest.mark.parametrize("left", [False, True])
def test_encoder_decoder_source_padding_invariance(tiny: Tiny, positional: str, left: bool) -> None:
    spec = tiny("encoder-decoder", positional={"type": positional})
    model = build_model(spec).eval()
    srcs = [torch.randint(1, 61, (n,)) for n in (9, 4)]
    tgts = [torch.randint(1, 61, (n,)) for n in (5, 3)]
    src, src_mask = _batch(srcs, left=left)
    tgt, tgt_mask = _batch(tgts, left=False)
    with torch.no_grad():
        batched = model(src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
        for i in range(2):
            alone = model(srcs[i][None], decoder_input_ids=tgts[i][None]).logits[0]
            assert torch.allclose(batched.logits[i, : len(tgts[i])], alone, atol=1e-5)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi", "t5"])
@pytest.mark.parametrize("kind", ["decoder", "encoder", "encoder-decoder"])
def test_bad_ids_and_masks_are_clear_errors(tiny: Tiny, positional: str, kind: str) -> None:
    # caught before the embedding, whatever the positional scheme
    model = build_model(tiny(kind, positional={"type": positional})).eval()
    ids = torch.randint(1, 61, (1, 5))
    extra = {"decoder_input_ids": ids} if kind == "encoder-decoder" else {}
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, length\) = \(1, 5\).*got shape \(1, 4\)"):
        model(ids, attention_mask=torch.ones(1, 4), **extra)
    with pytest.raises(ValueError, match=r"input_ids must be \(batch, length\), got shape \(5,\)"):
        model(ids[0], **extra)
    with pytest.raises(TypeError, match="input_ids must hold integer token ids, got torch.float32"):
        model(ids.float(), **extra)
    if kind == "encoder-decoder":
        with pytest.raises(ValueError, match=r"decoder_attention_mask must be \(batch, length\) = \(1, 5\)"):
            model(ids, decoder_input_ids=ids, decoder_attention_mask=torch.ones(1, 6))
