"""specformer's dropout: torch's in eager mode; traced by torch.compile, a float mask with the
same distribution and no boolean tensor (inductor stores booleans element by element)."""

from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.backends.common import aot_autograd

from specformer.components.dropout import Dropout, dropout


@pytest.fixture(autouse=True)
def _fresh_dynamo():  # noqa: ANN202
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_eager_dropout_is_torch_s() -> None:
    x = torch.randn(4, 1000)
    layer = Dropout(0.3)
    assert isinstance(layer, nn.Dropout) and repr(layer) == repr(nn.Dropout(0.3))
    torch.manual_seed(0)
    got = layer(x)
    torch.manual_seed(0)
    assert torch.equal(got, nn.Dropout(0.3)(x))
    assert torch.equal(layer.eval()(x), x)
    assert dropout(x, 0.0) is x and dropout(x, 0.5, training=False) is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_traced_dropout_has_a_float_mask_with_torch_s_distribution(dtype: torch.dtype) -> None:
    ops: set[str] = set()

    def record(gm: torch.fx.GraphModule, _inputs: object):  # noqa: ANN202
        ops.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return make_boxed_func(gm.forward)

    p = 0.25
    layer = torch.compile(Dropout(p), backend=aot_autograd(fw_compiler=record, bw_compiler=record), fullgraph=True)
    x = (torch.rand(200_000) + 0.5).to(dtype).requires_grad_()  # no zeros of its own
    torch.manual_seed(0)
    y = layer(x)
    y.backward(torch.ones_like(y))
    assert y.dtype == dtype
    assert not {op for op in ops if op.split(".")[1] in
                ("native_dropout", "bernoulli", "bernoulli_", "gt", "ge", "lt", "le", "native_dropout_backward")}
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005  # 200k draws: ~5 standard deviations
    scaled = (x.detach().float() / (1 - p)).to(dtype)
    assert torch.allclose(y[kept].float(), scaled[kept].float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6)
    # the gradient is the same mask and scale
    assert torch.equal(x.grad != 0, kept)
    assert torch.allclose(x.grad[kept].float(), torch.full_like(x.grad[kept].float(), 1 / (1 - p)), rtol=1e-2)
