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


def test_version_names_the_package_and_the_libraries_a_bug_report_needs() -> None:
    from importlib import metadata

    import specformer

    assert metadata.version("specformer") == specformer.__version__  # pyproject.toml and the package agree
    run = subprocess.run([sys.executable, "-m", "specformer", "--version"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    line = run.stdout.strip()
    assert line.startswith(f"specformer {specformer.__version__} (Python {sys.version.split()[0]}; ")
    assert f"torch {metadata.version('torch')}" in line and f"lightning {metadata.version('lightning')}" in line
    # read without importing torch, which takes seconds
    code = ("import sys\nfrom specformer.cli.app import app\ntry:\n    app(['--version'])\nexcept SystemExit:\n"
            "    print('torch' in sys.modules)")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert quiet.stdout.splitlines()[-1] == "False"


def test_the_package_docstring_names_what_exists() -> None:
    # help(specformer) points at the names that live in the subpackages: each is there
    import re

    import specformer

    bullets = re.findall(r"^- ``(specformer\.\w+)``:(.*?)(?=^- |\Z)", specformer.__doc__, flags=re.M | re.S)
    assert {m for m, _ in bullets} == {"specformer.analysis", "specformer.training", "specformer.registry",
                                       "specformer.interop"}
    for module, text in bullets:
        mod = importlib.import_module(module)
        for name in re.findall(r"``(\w+)``", text):
            if name not in ("specformer",) and not name.startswith("specformer"):
                assert hasattr(mod, name), f"{module}.{name}"
