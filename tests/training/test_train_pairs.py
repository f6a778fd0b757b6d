"""An encoder-decoder trained on the user's own (source, target) pairs, end to end."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from typer.testing import CliRunner

from specformer import load_spec
from specformer.cli import app
from specformer.data.module import prepare
from specformer.training.checkpoint import load_checkpoint
from specformer.training.generate import generate_seq2seq
from specformer.training.run import train

WORDS = ["red", "blue", "cat", "dog", "sun", "sky", "big", "old"]


def _reversed_words(path: Path, n: int = 400) -> Path:
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(n):
            words = rng.sample(WORDS, rng.randint(2, 4))
            f.write(
                json.dumps({"source": " ".join(words), "target": " ".join(reversed(words))}) + "\n"
            )
    return path


def test_pairs_train_an_encoder_decoder_scored_by_exact_match_on_held_out_pairs(
    tiny: Any, tmp_path: Path
) -> None:
    data = {
        "type": "pairs",
        "paths": [str(_reversed_words(tmp_path / "pairs.jsonl"))],
        "val_fraction": 0.1,
    }
    raw = tiny(
        "encoder-decoder",
        max_steps=200,
        val_interval=100,
        val_batches=2,
        data=data,
        tokenizer={"type": "bpe", "min_frequency": 1},
    )
    # tied, as the t5 presets are: with init scheme t5 (one std of 0.02 for every weight leaves
    # the tied head's logits near zero at this vocabulary size, and exact match at 0%: docs/training.md)
    spec = load_spec({**raw, "vocab_size": 300, "init": {"scheme": "t5"}})
    assert spec.embedding.tie_output
    result = train(spec, progress=False)
    assert result.data.startswith("pairs: 1 file, 363 training and 37 held-out pairs")
    losses = [h["val/loss"] for h in result.history]
    assert len(losses) == 2 and losses[-1] < losses[0] - 0.3, losses
    assert result.exact_match is not None and result.exact_match > 0  # it learns: the recount below is not 0 == 0

    # exact match is greedy decoding of the first val_batches × batch_size held-out pairs
    loaded = load_checkpoint(result.checkpoint)
    tok, model = loaded.tokenizer, loaded.model.eval()
    held_out = prepare(spec, tokenizer=tok).val.pairs[: 2 * 8]
    correct = 0
    for source, target in held_out:
        out = generate_seq2seq(
            model,
            torch.tensor([source]),
            start_id=tok.bos_id,
            eos_id=tok.eos_id,
            max_new_tokens=len(target) + 1,
            temperature=0.0,
        )
        correct += out[0].tolist()[: len(target) + 1] == [*target, tok.eos_id]
    assert result.exact_match == correct / len(held_out)

    # `generate` decodes a typed input with the run's tokenizer
    cli = CliRunner().invoke(
        app, ["generate", str(result.checkpoint), "--prompt", "red cat", "-n", "8"]
    )
    assert cli.exit_code == 0, cli.output
    assert cli.output.strip() and all(word in WORDS for word in cli.output.split()), cli.output
