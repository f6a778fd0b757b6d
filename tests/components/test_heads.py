"""Heads and embeddings: LM (tied, untied, T5 input scale), masked-LM, classification,
embedding scale, segments and shared encoder/decoder embeddings."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch.nn import functional as F

from specformer.builder import build_model
from specformer.specs.schema import ModelSpec

Tiny = Callable[..., ModelSpec]


def test_lm_head_scale_input_multiplies_by_inverse_sqrt_d_model(tiny: Tiny) -> None:
    model = build_model(tiny(head={"type": "lm", "scale_input": True}))
    h = torch.randn(1, 3, 32)
    want = F.linear(h * 32**-0.5, model.embed.tokens.weight)
    assert torch.allclose(model.head(h), want, atol=1e-6)


def test_lm_head_tied_with_bias(tiny: Tiny) -> None:
    model = build_model(tiny(head={"type": "lm", "bias": True}))
    assert model.head.proj is None and model.head.bias.shape == (61,)
    assert "head.bias" in model.state_dict()


def test_mlm_head_is_transform_then_tied_decoder_plus_bias(tiny: Tiny) -> None:
    model = build_model(tiny("encoder", head={"type": "mlm"})).eval()
    head = model.head
    with torch.no_grad():
        head.bias.normal_()
    h = torch.randn(2, 4, 32)
    t = F.layer_norm(
        F.gelu(head.transform.dense(h)), (32,), head.transform.norm.weight, head.transform.norm.bias, 1e-12
    )
    want = t @ model.embed.tokens.weight.T + head.bias
    assert torch.allclose(head(h), want, atol=1e-5)
    untied = build_model(tiny("encoder", head={"type": "mlm"}, embedding={"tie_output": False}))
    assert untied.head.proj.weight.shape == (61, 32)


def test_classification_pooler_and_shapes(tiny: Tiny) -> None:
    spec = tiny("encoder", head={"type": "classification", "n_classes": 5, "pooling": "first"})
    model = build_model(spec).eval()
    out = model(torch.randint(0, 61, (3, 7)))
    assert out.logits.shape == (3, 5)
    h = out.hidden_states[:, 0]
    want = model.head.classifier(torch.tanh(model.head.pooler(h)))
    assert torch.allclose(out.logits, want, atol=1e-6)
    no_pooler = build_model(tiny("encoder", head={"type": "classification", "pooler": False}))
    assert no_pooler.head.pooler is None
    # DistilBERT's pre_classifier: relu where BERT's pooler has tanh
    relu = build_model(tiny("encoder", head={"type": "classification", "pooler_activation": "relu"})).eval()
    out = relu(torch.randint(0, 61, (3, 7)))
    pre = relu.head.pooler(out.hidden_states[:, 0])
    assert (pre < 0).any()  # the two activations differ on these inputs
    assert torch.allclose(out.logits, relu.head.classifier(pre.clamp(min=0)), atol=1e-6)
    with pytest.raises(ValueError, match="pooler_activation needs pooler: true"):
        tiny("encoder", head={"type": "classification", "pooler": False, "pooler_activation": "relu"})


def test_embedding_padding_row_starts_at_zero_and_takes_no_lookup_gradient(tiny: Tiny) -> None:
    for tied, scheme in ((False, "normal"), (True, "normal"), (True, "t5")):
        model = build_model(tiny("encoder-decoder", embedding={"padding_idx": 3, "tie_output": tied},
                                 init={"scheme": scheme}))
        tokens = model.embed.tokens.weight
        assert not tokens[3].any() and tokens[4].any()  # t5 draws the table again, the row included
        ids = torch.tensor([[3, 5, 3, 7]])
        model(ids, decoder_input_ids=ids).logits.sum().backward()
        # no gradient from the lookups (encoder and decoder share the table); tied, the output
        # layer still trains the row, as nn.Embedding's padding_idx leaves it
        assert tokens.grad[3].any() == tied and tokens.grad[5].any()
    with pytest.raises(ValueError, match="padding_idx=61 is not a token: vocab_size is 61"):
        tiny("encoder", embedding={"padding_idx": 61})


def test_embedding_scale_and_segments(tiny: Tiny) -> None:
    spec = tiny(
        "encoder",
        positional={"type": "none"},
        embedding={"scale": True, "segment_vocab_size": 2},
    )
    model = build_model(spec).eval()
    ids = torch.tensor([[3, 4, 5]])
    types = torch.tensor([[0, 1, 1]])
    x = model.embed(ids, position_ids=torch.arange(3)[None], n_positions=3, token_type_ids=types)
    want = model.embed.tokens.weight[ids] * math.sqrt(32) + model.embed.segments.weight[types]
    assert torch.allclose(x, want, atol=1e-6)
    default = model.embed(ids, position_ids=torch.arange(3)[None], n_positions=3)
    zeros = model.embed(ids, position_ids=torch.arange(3)[None], n_positions=3, token_type_ids=torch.zeros_like(ids))
    assert torch.allclose(default, zeros)


def test_shared_and_separate_encoder_decoder_embeddings(tiny: Tiny) -> None:
    shared = build_model(tiny("encoder-decoder"))
    assert shared.decoder_embed is None
    assert not any(k.startswith("decoder_embed.") for k in shared.state_dict())
    separate = build_model(tiny("encoder-decoder", embedding={"share_encoder_decoder": False}))
    assert separate.decoder_embed.tokens.weight.data_ptr() != separate.embed.tokens.weight.data_ptr()
    h = torch.randn(1, 2, 32)
    assert torch.allclose(separate.head(h), h @ separate.decoder_embed.tokens.weight.T)  # tied to the decoder side
    n_shared = sum(p.numel() for p in shared.parameters())
    n_separate = sum(p.numel() for p in separate.parameters())
    assert n_separate - n_shared == 61 * 32


def test_lm_head_softcap_caps_the_logits_and_the_loss_uses_them(tiny: Tiny) -> None:
    model = build_model(tiny(head={"type": "lm", "softcap": 2.0}))
    h = torch.randn(2, 5, 32, requires_grad=True)
    raw = F.linear(h, model.embed.tokens.weight)
    torch.testing.assert_close(model.head(h), 2.0 * torch.tanh(raw / 2.0))
    assert model.head(h).abs().max() < 2.0
    labels = torch.randint(0, 61, (2, 5))
    labels[0, :2] = -100
    loss = model.head.loss(h, labels)
    want = F.cross_entropy((2.0 * torch.tanh(raw / 2.0)).reshape(-1, 61), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(loss, want)
    (g,) = torch.autograd.grad(loss, h)
    (g_want,) = torch.autograd.grad(want, h)
    torch.testing.assert_close(g, g_want)
