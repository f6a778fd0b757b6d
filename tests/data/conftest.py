from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECFORMER_CACHE", str(tmp_path / "cache"))
