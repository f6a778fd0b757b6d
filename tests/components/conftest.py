"""Tiny specs for component tests: built from dicts so each test says what it varies."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

from specformer.specs.merge import deep_merge
from specformer.specs.schema import ModelSpec


def make_tiny(kind: str = "decoder", **changes: Any) -> ModelSpec:
    """A tiny model of ``kind``; keyword arguments deep-merge into the spec dict
    (``stack=`` applies to every stack present)."""
    stack: dict[str, Any] = {
        "n_layers": 2,
        "attention": {"n_heads": 4, "n_kv_heads": 2},
        "ffn": {"type": "mlp", "d_ff": 64, "activation": "gelu"},
        "norm": {"type": "layernorm"},
    }
    data: dict[str, Any] = {"kind": kind, "vocab_size": 61, "d_model": 32, "max_seq_len": 64}
    data["positional"] = {"type": "rope"}
    stack_changes = changes.pop("stack", {})
    stack = deep_merge(stack, stack_changes)
    if kind in ("decoder", "encoder-decoder"):
        data["decoder"] = copy.deepcopy(stack)
    if kind in ("encoder", "encoder-decoder"):
        data["encoder"] = copy.deepcopy(stack)
    if kind == "encoder":
        data["head"] = {"type": "lm"}
    data = deep_merge(data, changes)
    return ModelSpec.model_validate(data)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def tiny() -> Callable[..., ModelSpec]:
    """The :func:`make_tiny` factory."""
    return make_tiny


class RecordedOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the names of the ATen operations run under it, and the dtypes of each one's
    tensor arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.dtypes: list[tuple[torch.dtype, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(func.__name__)
        self.dtypes.append(tuple(a.dtype for a in args if isinstance(a, torch.Tensor)))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def recorded_ops() -> type[RecordedOps]:
    """``with recorded_ops() as ops: ...``: ``ops.names``, the ATen operations run under it
    (``ops.dtypes``, their tensor arguments' dtypes)."""
    return RecordedOps


def _loss_and_grads(model: torch.nn.Module, ids: torch.Tensor, *, bf16: bool = False
                    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(ids[:, :-1], labels=ids[:, 1:]).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.fixture
def loss_and_grads() -> Callable[..., tuple[torch.Tensor, list[torch.Tensor]]]:
    """``loss_and_grads(model, ids, bf16=False)``: one language-model training forward and
    backward on ``ids`` (B, T + 1), in bfloat16 autocast with ``bf16``: the loss and every
    parameter's gradient (copies)."""
    return _loss_and_grads
