"""Padding: a padded batch gives, on its real tokens, what each sequence gives alone."""

from __future__ import annotations

import re
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
    # a mask of other values than 1 and 0 would count positions wrong without an error
    for bad, found in ((torch.full((1, 5), 2), "found 2 at"), (torch.full((1, 5), 0.5), "found 0.5 at")):
        with pytest.raises(ValueError, match=rf"attention_mask must (hold|be) 1 for a real token and 0 for padding; {found}"):
            model(ids, attention_mask=bad, **extra)


@pytest.mark.parametrize("kind", ["decoder", "encoder", "encoder-decoder"])
def test_any_integer_dtype_of_ids_is_accepted(tiny: Tiny, kind: str) -> None:
    # uint8 passes "integer" but nn.Embedding takes int64/int32 only: converted, as labels are
    model = build_model(tiny(kind)).eval()
    ids = torch.randint(1, 61, (2, 5))
    with torch.no_grad():
        for dtype in (torch.uint8, torch.int16, torch.int32):
            extra = {"decoder_input_ids": ids.to(dtype)} if kind == "encoder-decoder" else {}
            want = model(ids, **({"decoder_input_ids": ids} if extra else {})).logits
            assert torch.equal(model(ids.to(dtype), **extra).logits, want), dtype


@pytest.mark.parametrize("kind", ["decoder", "encoder", "encoder-decoder"])
@pytest.mark.parametrize("bad", [61, 600, -1])
def test_ids_outside_the_vocabulary_are_a_clear_error(tiny: Tiny, kind: str, bad: int) -> None:
    model = build_model(tiny(kind)).eval()  # vocab_size 61
    ids = torch.randint(1, 61, (2, 5))
    wrong = ids.clone()
    wrong[1, 3] = bad
    allowed = r"input_ids must be token ids in \[0, vocab_size\) = \[0, 61\)"
    extra = {"decoder_input_ids": ids} if kind == "encoder-decoder" else {}
    with pytest.raises(ValueError, match=rf"^{allowed}; found {bad} at input_ids\[1, 3\]$"):
        model(wrong, **extra)
    if kind == "encoder-decoder":
        with pytest.raises(ValueError, match=rf"^decoder_{allowed}; found {bad} at decoder_input_ids\[1, 3\]$"):
            model(ids, decoder_input_ids=wrong)
        with pytest.raises(ValueError, match=rf"found {bad} at input_ids\[1, 3\]"):
            model.encode(wrong)


@pytest.mark.parametrize("kind", ["decoder", "encoder", "encoder-decoder"])
def test_bad_position_ids_are_clear_errors(tiny: Tiny, kind: str) -> None:
    model = build_model(tiny(kind, positional={"type": "learned"})).eval()
    ids = torch.randint(1, 61, (2, 6))
    if kind == "encoder-decoder":
        def call(pos: torch.Tensor) -> object:
            return model(ids, decoder_input_ids=ids, decoder_position_ids=pos)
        name = "decoder_position_ids"
    else:
        def call(pos: torch.Tensor) -> object:
            return model(ids, position_ids=pos)
        name = "position_ids"
    with torch.no_grad():
        torch.testing.assert_close(call(torch.arange(6)[None].int()).logits, call(torch.arange(6)[None]).logits)
        assert call(torch.arange(6).expand(2, 6)).logits.shape[:2] == (2, 6)
    with pytest.raises(ValueError, match=rf"^{name} must be \(batch, length\) = \(2, 6\) or \(1, 6\).*got shape \(1, 5\)$"):
        call(torch.arange(5)[None])
    with pytest.raises(ValueError, match=rf"{name} must be .*got shape \(6,\)$"):
        call(torch.arange(6))
    with pytest.raises(TypeError, match=rf"^{name} must hold integer positions, got torch.float32$"):
        call(torch.arange(6.0)[None])
    with pytest.raises(ValueError, match=rf"^{name} must be positions >= 0; found -2 at {name}\[0, 4\]$"):
        call(torch.tensor([[0, 1, 2, 3, -2, 5]]))


def test_bad_token_type_ids_are_clear_errors(tiny: Tiny) -> None:
    model = build_model(tiny("encoder", embedding={"segment_vocab_size": 2})).eval()
    ids = torch.randint(1, 61, (2, 6))
    types = torch.zeros(2, 6, dtype=torch.long)
    types[:, 3:] = 1
    with torch.no_grad():
        torch.testing.assert_close(model(ids, token_type_ids=types.to(torch.uint8)).logits,
                                   model(ids, token_type_ids=types).logits)
    wrong = types.clone()
    wrong[1, 2] = 5
    with pytest.raises(ValueError, match=r"^token_type_ids must be segment ids in \[0, 2\).*found 5 at token_type_ids\[1, 2\]$"):
        model(ids, token_type_ids=wrong)
    with pytest.raises(ValueError, match=r"^token_type_ids must be \(batch, length\) = \(2, 6\) or \(1, 6\).*got shape \(2, 3\)$"):
        model(ids, token_type_ids=types[:, :3])
    with pytest.raises(TypeError, match="^token_type_ids must hold integer segment ids, got torch.float32$"):
        model(ids, token_type_ids=types.float())
    # no segment embeddings: every token is segment 0, so any other type would be silently dropped
    plain = build_model(tiny("encoder")).eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(ids, token_type_ids=torch.zeros_like(ids)).logits, plain(ids).logits)
    with pytest.raises(ValueError, match=r"^token_type_ids must be 0 \(this model has no segment embeddings"):
        plain(ids, token_type_ids=types)


def test_encoder_outputs_and_masks_that_do_not_match_are_clear_errors(tiny: Tiny) -> None:
    model = build_model(tiny("encoder-decoder")).eval()
    src, tgt = torch.randint(1, 61, (2, 10)), torch.randint(1, 61, (2, 5))
    with torch.no_grad():
        enc = model.encode(src)  # (2, 10, 32)
    want = r"encoder_hidden_states must be \(batch, source length, d_model\) = \(2, S, 32\), with the batch of "
    for bad in (enc[:1], enc[0], enc[..., :16]):
        with pytest.raises(ValueError, match=rf"^{want}decoder_input_ids; got shape {re.escape(str(tuple(bad.shape)))}$"):
            model(decoder_input_ids=tgt, encoder_hidden_states=bad)
    mask = torch.ones(1, 10)
    mask[0, 4:] = 0  # batch 1 for batch 2 would apply row 0's padding to every row
    for bad in (mask, torch.ones(2, 3)):
        with pytest.raises(ValueError, match=rf"^attention_mask must be \(batch, source length\) = \(2, 10\), covering "
                           rf"the positions of encoder_hidden_states \(2, 10, 32\); got shape {re.escape(str(tuple(bad.shape)))}$"):
            model(attention_mask=bad, decoder_input_ids=tgt, encoder_hidden_states=enc)
        with pytest.raises(ValueError, match=r"^attention_mask must be \(batch, length\) = \(2, 10\)"):
            model(src, attention_mask=bad, decoder_input_ids=tgt)
    with pytest.raises(ValueError, match="^input_ids has a batch of 1 sources but decoder_input_ids has a batch of 2"):
        model(src[:1], decoder_input_ids=tgt)
    with pytest.raises(TypeError, match="^encoder_hidden_states must be a floating-point tensor, got torch.int64$"):
        model(decoder_input_ids=tgt, encoder_hidden_states=enc.long())


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("left", [False, True])
def test_training_on_right_padded_rows_leaves_the_mask_out_with_the_same_loss_and_gradients(
        tiny: Tiny, monkeypatch: pytest.MonkeyPatch, left: bool, bf16: bool) -> None:
    # a causal query at a real token of a right-padded row sees real keys only: training drops
    # the mask (attention keeps its causal path: in bf16 the products, not torch's masked
    # kernel), and the loss and every gradient are those of the masked model; left padding
    # (real keys after padded ones) keeps it
    from torch.nn import functional as F

    from specformer.components import attention

    monkeypatch.setattr(attention, "MATMUL_ATTENTION", True)
    spec = tiny(positional={"type": "rope"}, stack={"norm": {"type": "rmsnorm"}})
    model = build_model(spec).train()
    seqs = [torch.randint(1, 61, (n,)) for n in (70, 41, 9)]  # past one 64-row attention block
    ids, mask = _batch(seqs, left=left)
    labels = ids.masked_fill(mask == 0, -100)
    masked: list[bool] = []
    real_sdpa = F.scaled_dot_product_attention

    def sdpa(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        masked.append(kwargs.get("attn_mask") is not None)
        return real_sdpa(*args, **kwargs)

    def loss_and_grads(**kwargs):  # noqa: ANN003, ANN202
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(ids, labels=labels, **kwargs).loss
        loss.backward()
        return float(loss), [p.grad.clone() for p in model.parameters()]

    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    got, got_grads = loss_and_grads(attention_mask=mask)
    assert any(masked) == left  # right padding: no masked attention call at all
    # the reference: the same rows with the mask applied inside attention (eval-mode masking)
    monkeypatch.setattr("specformer.components.blocks.padded_on_the_right", lambda key_padding: False)
    masked.clear()
    want, want_grads = loss_and_grads(attention_mask=mask)
    assert any(masked)
    tol = 2e-2 if bf16 else 1e-5
    assert got == pytest.approx(want, rel=tol)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert (g - w).norm() <= tol * w.norm() + 1e-7


def test_right_padded_rows_keep_their_mask_outside_training(tiny: Tiny) -> None:
    # eval (and a no-grad forward) keep the mask: the padding's own logits are those of the
    # masked attention, as every other library computes them
    model = build_model(tiny(positional={"type": "rope"}))
    ids, mask = _batch([torch.randint(1, 61, (n,)) for n in (9, 4)], left=False)
    model.eval()
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).logits
    model.train()
    with torch.no_grad():
        assert torch.equal(model(ids, attention_mask=mask).logits, ref)
    unmasked_pad = model.eval()(ids).logits[1, 4:]
    assert not torch.allclose(ref[1, 4:], unmasked_pad, atol=1e-4)  # the mask does change the padding's logits


@pytest.mark.parametrize("bf16", [False, True])
def test_a_training_encoder_adds_its_padding_to_the_attention_products(
        tiny: Tiny, monkeypatch: pytest.MonkeyPatch, bf16: bool) -> None:
    # a bidirectional stack in training masks padded keys alone ((B, 1, 1, S), no T x S mask),
    # and attention's products path adds that mask to its scores instead of handing the batch
    # to torch's masked kernel; the loss over real tokens and every gradient are those of each
    # sequence trained alone. A row of padding alone stays finite (the mask is the dtype's
    # finite minimum, not -inf, so no NaN reaches a real row through the values)
    from torch.nn import functional as F

    from specformer.components import attention

    monkeypatch.setattr(attention, "MATMUL_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_PRODUCT_ROWS", 32)
    model = build_model(tiny("encoder", max_seq_len=128, stack={"norm": {"type": "rmsnorm"}})).train()
    seqs = [torch.randint(1, 61, (n,)) for n in (70, 41, 9)]  # past one attention block
    ids, mask = _batch(seqs, left=False)
    labels = ids.masked_fill(mask == 0, -100)
    masked: list[bool] = []
    real_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **kw: masked.append(True) or real_sdpa(*a, **kw))

    def loss_and_grads(ids: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None, scale: float = 1.0):  # noqa: ANN202
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(ids, attention_mask=mask, labels=labels).loss
        grads = torch.autograd.grad(loss * scale, list(model.parameters()))
        return float(loss), grads

    got, got_grads = loss_and_grads(ids, labels, mask)
    assert not masked  # every attention call through the products
    total = int(mask.sum())
    want, want_grads = 0.0, [torch.zeros_like(p) for p in model.parameters()]
    for s in seqs:  # each sequence alone, weighted by its share of the real tokens
        loss, grads = loss_and_grads(s[None], s[None], None, scale=len(s) / total)
        want += loss * len(s) / total
        want_grads = [w + g for w, g in zip(want_grads, grads, strict=True)]
    tol = 2e-2 if bf16 else 1e-5
    assert got == pytest.approx(want, rel=tol)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert (g.float() - w.float()).norm() <= tol * w.float().norm() + 1e-6
    empty = mask.clone()
    empty[2] = 0  # a row of padding alone
    loss, grads = loss_and_grads(ids, labels.masked_fill(empty == 0, -100), empty)
    assert torch.isfinite(torch.tensor(loss)) and all(torch.isfinite(g).all() for g in grads)
