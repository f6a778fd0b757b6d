"""The shipped nano presets learn what their training sections promise (slow: minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specformer import load_spec
from specformer.training.run import train


@pytest.mark.slow
def test_t5_nano_learns_to_reverse_held_out_strings(tmp_path: Path) -> None:
    spec = load_spec("t5-nano", [f"training.out_dir={tmp_path / 'runs'}"])
    assert spec.training.data.task == "reverse"
    result = train(spec, progress=False)
    assert result.exact_match is not None and result.exact_match > 0.9, result.history


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt-nano", "llama-nano"])
def test_nano_decoder_beats_the_unigram_baseline_quickly(tmp_path: Path, name: str) -> None:
    # the preset's recipe on a quarter of its steps at half its batch, on a smaller slice of the stdlib
    spec = load_spec(
        name,
        [
            f"training.out_dir={tmp_path / 'runs'}",
            "training.max_steps=100",
            "training.batch_size=8",
            "training.val_interval=100",
            "training.data.max_mb=3",
            "training.tokenizer.train_mb=2",
        ],
    )
    result = train(spec, progress=False)
    assert result.unigram_loss is not None and result.val_loss is not None
    assert result.val_loss < result.unigram_loss - 0.5, (result.val_loss, result.unigram_loss)


def test_every_nano_preset_trains_with_its_kinds_objective() -> None:
    expected = {"gpt-nano": ("causal_lm", "stdlib"), "llama-nano": ("causal_lm", "stdlib"),
                "bert-nano": ("masked_lm", "stdlib"), "t5-nano": ("seq2seq", "synthetic")}
    for name, (objective, data) in expected.items():
        t = load_spec(name).training
        assert (t.objective.type, t.data.type) == (objective, data)
        assert t.max_steps is not None and t.max_steps <= 1000
