"""Suite-wide settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from specformer.components import products


@pytest.fixture(autouse=True)
def _native_bf16_products() -> Iterator[None]:
    """bfloat16 products stay bfloat16 in every test of this process, whatever this machine
    measures (on a CPU without bfloat16 kernels they would run in float32): the tests of the
    bfloat16 kernels then test those kernels everywhere. tests/components/test_bf16_in_float32.py
    tests the float32 path; commands run in subprocesses measure, as they do for users."""
    saved = products.BF16_IN_FLOAT32
    products.BF16_IN_FLOAT32 = False
    yield
    products.BF16_IN_FLOAT32 = saved
