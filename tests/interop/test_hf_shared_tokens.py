"""``embedding.share_positions: false`` (BART): one token table, the decoder's own
positions and embedding norm; the builder, the analytic counts and validation agree."""

from __future__ import annotations

import pytest
import torch

from specformer.analysis import count_parameters
from specformer.analysis.params import parameter_shapes
from specformer.builder import build_model
from specformer.specs.errors import SpecError
from specformer.specs.loader import load_spec

_BART_LIKE = [
    "positional.type=learned",
    "embedding.share_positions=false",
    "embedding.norm={type: layernorm}",
    "encoder.n_layers=1",
    "decoder.n_layers=1",
    "vocab_size=50",
    "d_model=32",
    "encoder.ffn.d_ff=64",
    "decoder.ffn.d_ff=64",
    "max_seq_len=16",
]


def test_decoder_embedding_shares_tokens_but_not_positions_or_norm() -> None:
    spec = load_spec("transformer-base", _BART_LIKE)
    model = build_model(spec)
    names = [n for n in model.state_dict() if "embed" in n]
    assert names == [
        "embed.tokens.weight", "embed.positions.weight", "embed.norm.weight", "embed.norm.bias",
        "decoder_embed.positions.weight", "decoder_embed.norm.weight", "decoder_embed.norm.bias",
    ]
    assert model.decoder_embed.tokens is model.embed.tokens
    assert model.decoder_embed.positions is not model.embed.positions
    # the state dict the builder makes is the one the analysis enumerates
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == parameter_shapes(spec)
    assert count_parameters(spec).total == sum(p.numel() for p in model.parameters())
    shared = count_parameters(load_spec("transformer-base", [o for o in _BART_LIKE if "share_positions" not in o]))
    assert count_parameters(spec).total - shared.total == 16 * 32 + 2 * 32  # one more table and norm


def test_decoder_reads_the_shared_table_through_its_own_positions() -> None:
    spec = load_spec("transformer-base", _BART_LIKE)
    torch.manual_seed(0)
    model = build_model(spec).eval()
    src, tgt = torch.randint(0, 50, (1, 5)), torch.randint(0, 50, (1, 4))
    with torch.no_grad():
        before = model(src, decoder_input_ids=tgt).logits
        model.decoder_embed.positions.weight.add_(1.0)  # only the decoder's table
        after = model(src, decoder_input_ids=tgt).logits
        encoded = model.encode(src)
        model.embed.tokens.weight.mul_(2.0)  # the one token table feeds both stacks
        assert not torch.equal(model.encode(src), encoded)
    assert not torch.allclose(before, after)


@pytest.mark.parametrize(
    ("preset", "overrides", "message"),
    [
        ("t5-nano", ["embedding.share_positions=false", "embedding.share_encoder_decoder=false"],
         "share_positions: false needs share_encoder_decoder: true"),
        ("gpt-nano", ["embedding.share_positions=false"], "share_positions applies to encoder-decoders only"),
    ],
)
def test_share_positions_is_refused_where_it_means_nothing(preset: str, overrides: list[str], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_spec(preset, overrides)
