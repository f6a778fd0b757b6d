"""Every registered type of every torch-backed family builds, runs forward and
backward on a tiny model, and yields finite gradients for every parameter.

Parametrised from the registry: an entry registered tomorrow is tested the same day.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from specformer.builder import build_model
from specformer.registry import REGISTRY
from specformer.specs.schema import ModelSpec

Tiny = Callable[..., ModelSpec]
FAMILIES = ("positional", "attention", "ffn", "norm", "head")
KINDS = ("decoder", "encoder", "encoder-decoder")
CASES = [(family, name) for family in FAMILIES for name in REGISTRY.names(family)]


def _spec(tiny: Tiny, family: str, name: str, kind: str) -> ModelSpec:
    sub = {"type": name} if "type" in REGISTRY.get(family, name).spec.model_fields else {}
    if family == "positional":
        return tiny(kind, positional=sub)
    if family == "head":
        return tiny(kind, head=sub)
    if family == "attention":
        sub = {**sub, "n_heads": 4, "n_kv_heads": 2}
    return tiny(kind, stack={family: sub})


def test_every_family_has_entries() -> None:
    for family in FAMILIES:
        assert REGISTRY.names(family), family


@pytest.mark.parametrize(("family", "name"), CASES, ids=[f"{f}-{n}" for f, n in CASES])
@pytest.mark.parametrize("kind", KINDS)
def test_registered_type_builds_and_trains(tiny: Tiny, family: str, name: str, kind: str) -> None:
    spec = _spec(tiny, family, name, kind)
    model = build_model(spec).train()
    ids = torch.randint(0, spec.vocab_size, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    if kind == "encoder-decoder":
        out = model(ids, attention_mask=mask, decoder_input_ids=ids[:, :5])
    else:
        out = model(ids, attention_mask=mask)
    assert torch.isfinite(out.logits).all()
    out.logits.float().pow(2).mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{pname} got no gradient"
        assert torch.isfinite(p.grad).all(), pname
