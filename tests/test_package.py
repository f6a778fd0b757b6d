"""The package's public names: importable from where the docs say, and listed by dir()."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["specformer", "specformer.builder", "specformer.data", "specformer.training"])
def test_dir_lists_every_public_name(module: str) -> None:
    # tab completion in a notebook offers the lazily imported names too
    mod = importlib.import_module(module)
    assert set(mod.__all__) <= set(dir(mod))
    for name in mod.__all__:
        assert getattr(mod, name) is not None


def test_dir_of_the_package_imports_nothing_heavy() -> None:
    code = "import sys, specformer; d = dir(specformer); print('build_model' in d, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]
