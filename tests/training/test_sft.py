"""Supervised fine-tuning of a decoder on (prompt, response) pairs: the loss on the response alone."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from specformer import build_model, load_spec
from specformer.cli import app
from specformer.data.collate import IGNORE_INDEX, SFTCollator
from specformer.data.corpus import DataError
from specformer.data.module import SpecDataModule, prepare
from specformer.specs.errors import SpecError
from specformer.training.checkpoint import load_checkpoint
from specformer.training.objectives import SFT
from specformer.training.run import train

WORDS = ["red", "blue", "cat", "dog", "sun", "sky", "big", "old"]


def _jsonl(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in pairs))
    return path


def _reversals(path: Path, n: int = 400) -> Path:
    rng = random.Random(0)
    pairs = []
    for _ in range(n):
        words = rng.sample(WORDS, rng.randint(2, 4))
        pairs.append((f"reverse {' '.join(words)}:", " " + " ".join(reversed(words))))
    return _jsonl(path, pairs)


def _sft(tiny: Any, path: Path, **training: Any) -> dict[str, Any]:
    return tiny("decoder", data={"type": "pairs", "paths": [str(path)], "val_fraction": 0.1}, **training)


def test_a_decoder_given_pairs_fine_tunes_and_sft_takes_only_pairs_and_a_decoder(tiny: Any, tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "p.jsonl", [("a", "b"), ("c", "d")])
    raw = _sft(tiny, path)
    raw["training"].pop("objective", None)
    assert load_spec(raw).training.objective.type == "sft"
    # a section without a type (a --set of one field) is sft too
    raw["training"]["objective"] = {"label_smoothing": 0.1}
    objective = load_spec(raw).training.objective
    assert (objective.type, objective.label_smoothing) == ("sft", 0.1)

    text = tiny("decoder", objective={"type": "sft"})  # files of text
    with pytest.raises(SpecError) as info:
        load_spec(text)
    (problem,) = info.value.problems
    assert problem.path == "training.data.type"
    assert problem.message.startswith("the sft objective trains on (prompt, response) pairs or conversations, not "
                                      "'files': use type: pairs")
    assert "or type: conversations (.jsonl files of messages)" in problem.message

    seq2seq = tiny("encoder-decoder", objective={"type": "sft"}, data={"type": "pairs", "paths": [str(path)]})
    with pytest.raises(SpecError) as info:
        load_spec(seq2seq)
    (problem,) = info.value.problems
    assert problem.path == "training.objective.type"
    assert problem.message.startswith("objective 'sft' does not train an encoder-decoder model (allowed: seq2seq)")


def test_the_collated_labels_are_minus_100_exactly_on_the_prompt_and_the_padding() -> None:
    eot, pad = 99, 0
    batch = SFTCollator(pad_id=pad)([
        (0, ([5, 6, 7], [8, 9, eot])),  # prompt 3, response 2 + end token
        (0, ([5], [10, eot])),
        (0, ([4, 4, 4, 4], [11])),  # a response cut to fit: no end token
    ])
    x = IGNORE_INDEX
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 10, pad, pad, pad], [4, 4, 4, 4, pad]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]
    # label j is token j + 1: the first two labels of row 0 are prompt tokens 6 and 7
    assert batch["labels"].tolist() == [[x, x, 8, 9, eot], [10, eot, x, x, x], [x, x, x, 11, x]]


def test_prepared_pairs_are_prompt_then_response_and_end_token_and_long_ones_are_cut_or_left_out(
    tiny: Any, tmp_path: Path
) -> None:
    pairs = [("abc", "de"), ("p" * 10, "q" * 10), ("r" * 17, "s"), ("t" * 16, "uv")]
    train_path = _jsonl(tmp_path / "train.jsonl", pairs)
    val_path = _jsonl(tmp_path / "val.jsonl", [("xy", "z"), ("w" * 20, "w")])
    spec = load_spec(tiny("decoder", seq_len=16, data={"type": "pairs", "paths": [str(train_path)],
                                                       "val_paths": [str(val_path)]}))
    data = prepare(spec)
    eot = data.tokenizer.eot_id
    enc = data.tokenizer.encode
    assert eot == 256  # the byte tokenizer's <|endoftext|>
    # the 17-byte prompt leaves no response token within seq_len=16: left out; the 16-byte
    # one reads all 16 and predicts the response's first byte; "q" * 10 + eot is cut to 7
    assert data.train.pairs == [
        (enc("abc"), [*enc("de"), eot]),
        (enc("p" * 10), enc("q" * 7)),
        (enc("t" * 16), enc("u")),
    ]
    assert data.val.pairs == [(enc("xy"), [*enc("z"), eot])]
    assert data.description.startswith(
        "pairs: 2 files, 3 training and 1 held-out (prompt, response) pairs, the loss on the responses; "
        "prompt + response longer than seq_len=16: left out 2 pairs whose prompt is longer than 16 tokens "
        "(1 training, 1 held-out), cut 2 responses (and their end token) to fit"
    )
    # tokenised once: a second run reads the ids, and the counts, from the cache
    again = prepare(spec)
    assert again.description == data.description + "; token ids read from the cache"
    assert (again.train.pairs, again.val.pairs) == (data.train.pairs, data.val.pairs)
    batch = SFTCollator(pad_id=data.tokenizer.pad_id)([(0, p) for p in data.train.pairs])
    assert batch["input_ids"].shape == (3, 16)  # no row reads more than seq_len tokens
    assert (batch["labels"] != IGNORE_INDEX).sum(-1).tolist() == [3, 7, 1]

    # a split with no prompt short enough is refused, naming its setting
    only_long = _jsonl(tmp_path / "long.jsonl", [("w" * 20, "w")])
    spec = load_spec(tiny("decoder", seq_len=16, data={"type": "pairs", "paths": [str(train_path)],
                                                       "val_paths": [str(only_long)]}))
    with pytest.raises(DataError, match=r"training.data.val_paths: every held-out prompt is longer than "
                                        r"seq_len=16 tokens, so no response would be predicted"):
        prepare(spec)


def test_a_tokenizer_json_puts_its_opening_tokens_before_the_prompt_and_its_end_token_after_the_response(
    tiny: Any, tmp_path: Path
) -> None:
    # Llama's: <s> before every text, </s> its end token, no pad token (the padding is </s>, masked)
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(["the cat sat on the mat"] * 20,
                            trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<s>", "</s>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(tmp_path / "tokenizer.json"))
    path = _jsonl(tmp_path / "p.jsonl", [("the cat", " sat"), ("the mat", " on the cat sat")])
    spec = load_spec(tiny("decoder", data={"type": "pairs", "paths": [str(path)], "val_paths": [str(path)]},
                          tokenizer={"type": "file", "path": str(tmp_path / "tokenizer.json")}))
    data = prepare(spec)
    t = data.tokenizer
    assert (t.token_id("<s>"), t.eot_id, t.pad_id) == (1, 2, None)
    assert data.train.pairs == [
        ([1, *t.encode("the cat", specials=False)], [*t.encode(" sat", specials=False), 2]),
        ([1, *t.encode("the mat", specials=False)], [*t.encode(" on the cat sat", specials=False), 2]),
    ]
    module = SpecDataModule(spec)
    module.setup()
    batch = module._collator(0)([(0, pair) for pair in data.train.pairs])
    short = len(data.train.pairs[0][0]) + len(data.train.pairs[0][1]) - 1
    assert batch["input_ids"][0, short:].tolist() == [2] * (batch["input_ids"].shape[1] - short)
    assert batch["attention_mask"][0].tolist() == [1] * short + [0] * (batch["input_ids"].shape[1] - short)
    assert bool((batch["labels"][0, short:] == IGNORE_INDEX).all())


def test_the_loss_is_the_mean_cross_entropy_over_the_response_tokens(tiny: Any, tmp_path: Path) -> None:
    spec = load_spec(_sft(tiny, _reversals(tmp_path / "p.jsonl", 40)))
    dm = SpecDataModule(spec)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    torch.manual_seed(0)
    model = build_model(spec).eval()
    with torch.no_grad():
        out = SFT(spec.training.objective)(model, batch)
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
    # by hand: the positions whose label is a response token (or its end token)
    want, n = 0.0, 0
    every = batch["labels"].clone()  # the labels of a loss on every token read
    for i in range(batch["input_ids"].shape[0]):
        labels = batch["labels"][i]
        predicted = (labels != IGNORE_INDEX).nonzero()[:, 0]
        first, last = int(predicted[0]), int(predicted[-1])
        # the response is contiguous and ends the row's real tokens: before it, the prompt has no loss
        assert predicted.tolist() == list(range(first, last + 1))
        assert last == int(batch["attention_mask"][i].sum()) - 1 and first >= 1
        every[i, :first] = batch["input_ids"][i, 1 : first + 1]
        for j in range(first, last + 1):
            want += float(F.cross_entropy(logits[i, j], labels[j]))
            n += 1
    assert out.n_predicted == n
    assert out.n_input == int(batch["attention_mask"].sum())
    assert float(out.loss) == pytest.approx(want / n, rel=1e-5)
    # which is not the loss over every token the model reads
    everywhere = float(F.cross_entropy(logits.flatten(0, 1), every.flatten()))
    assert abs(everywhere - want / n) > 1e-2


def test_a_few_steps_on_pairs_lower_the_response_loss_and_generate_continues_a_prompt(
    tiny: Any, tmp_path: Path
) -> None:
    spec = load_spec(_sft(tiny, _reversals(tmp_path / "p.jsonl"), max_steps=40, val_interval=20, val_batches=2,
                          seq_len=48))
    result = train(spec, progress=False)
    assert result.data.startswith("pairs: 1 file, 366 training and 34 held-out (prompt, response) pairs")
    losses = [h["val/loss"] for h in result.history]
    assert len(losses) == 2 and losses[-1] < losses[0] - 0.3, losses

    # validation's loss is the mean over the response tokens of its val_batches × batch_size pairs
    loaded = load_checkpoint(result.checkpoint)
    model = loaded.model.eval()
    held_out = prepare(spec, tokenizer=loaded.tokenizer).val.pairs[: 2 * 8]
    total = n = 0.0
    with torch.no_grad():
        for prompt, response in held_out:
            ids = torch.tensor([prompt + response])
            logits = model(ids[:, :-1]).logits[0]  # (T, V)
            total += float(F.cross_entropy(logits[len(prompt) - 1 :], ids[0, len(prompt) :], reduction="sum"))
            n += len(response)
    assert losses[-1] == pytest.approx(total / n, rel=1e-4)

    cli = CliRunner().invoke(app, ["generate", str(result.checkpoint), "--prompt", "reverse red cat:", "-n", "12",
                                   "--greedy"])
    assert cli.exit_code == 0, cli.output
    # (a smoke test: 40 steps of a 1-layer byte model mostly say " ", the responses' first byte)
    text = cli.output.removesuffix("\n")
    assert text.startswith("reverse red cat:") and len(text) > len("reverse red cat:"), cli.output

    # an sft model's response ends at the end token: generate stops there unless told not to
    import importlib

    gen = importlib.import_module("specformer.training.generate")  # the module, not the function
    made = [*loaded.tokenizer.encode("ab", specials=False), loaded.tokenizer.eot_id, *loaded.tokenizer.encode("cd")]
    for flag, said in (([], "x:ab\n"), (["--no-stop-at-eot"], None)):
        steps = iter(made)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(gen, "sample_next", lambda logits, steps=steps, **_: torch.tensor([next(steps)]))
            cli = CliRunner().invoke(app, ["generate", str(result.checkpoint), "--prompt", "x:", "-n", str(len(made)),
                                           *flag])
        assert cli.exit_code == 0, cli.output
        if said is not None:
            assert cli.stdout == said
        else:
            assert cli.stdout.startswith("x:ab") and cli.stdout.rstrip("\n").endswith("cd"), cli.stdout


def test_the_model_flops_a_token_are_counted_at_the_lengths_the_batches_ran_at(tiny: Any, tmp_path: Path) -> None:
    from specformer.analysis import flops_per_token

    # one pair a batch: each batch runs at its pair's own length, and one epoch reads every
    # training pair once, whatever the order, so the run's tokens by length are known here
    spec = load_spec(_sft(tiny, _reversals(tmp_path / "p.jsonl", 40), batch_size=1, val_interval=1000,
                          seq_len=64))
    dm = SpecDataModule(spec)
    dm.setup()
    epoch = itertools.islice(dm.train_dataloader(), len(dm.data.train))  # the stream's first epoch
    lengths = [(int(b["input_ids"].shape[-1]), int(b["attention_mask"].sum())) for b in epoch]
    assert all(n == real for n, real in lengths) and max(n for n, _ in lengths) < spec.training.seq_len

    def training_flops(n: int) -> float:
        return float(flops_per_token(spec, seq_len=n, count="executed").training)

    want = sum(real * training_flops(n) for n, real in lengths) / sum(real for _, real in lengths)
    result = train(load_spec(_sft(tiny, tmp_path / "p.jsonl", batch_size=1, val_interval=1000,
                                  seq_len=64, max_steps=len(lengths))))
    assert result.tokens == sum(real for _, real in lengths)
    assert result.flops_per_token == pytest.approx(want, rel=1e-12)
    # the seq_len figure counts each token's attention over 64 keys, where these read 24 to 42
    assert result.flops_per_token < 0.95 * training_flops(spec.training.seq_len)


def test_accumulated_micro_batches_step_as_one_batch_of_them_all(tiny: Any, tmp_path: Path) -> None:
    # micro-batches of pairs predict different counts of tokens: the mean of their means weighed
    # a token of a short one more, and batch 4 × accumulate 2 stepped elsewhere than batch 8
    # (the gradients' cosine was 0.998, as transformers' before num_items_in_batch)
    path = _reversals(tmp_path / "p.jsonl")
    sgd = {"type": "sgd", "lr": 0.5, "momentum": 0.0, "weight_decay": 0.0}
    runs = {}
    for batch, accumulate in ((8, 1), (4, 2), (2, 4)):
        spec = load_spec(_sft(tiny, path, batch_size=batch, accumulate=accumulate, max_steps=1, grad_clip=0,
                              optimizer=sgd, val_interval=1, val_batches=1))
        result = train(spec, progress=False)
        runs[batch] = (load_checkpoint(result.checkpoint).model.state_dict(), result)
    start = build_model(load_spec(_sft(tiny, path)))  # the same seed: the runs' initial weights
    whole, _ = runs[8]
    for batch in (4, 2):
        weights, _ = runs[batch]
        moved = max(float((whole[k] - start.state_dict()[k]).abs().max()) for k in whole)
        assert moved > 1e-3
        for key in whole:
            assert torch.allclose(weights[key], whole[key], atol=2e-6), (batch, key)
        # and the step's logged loss is the whole batch's: the mean over its predicted tokens
        assert _logged_loss(runs[batch][1]) == pytest.approx(_logged_loss(runs[8][1]), abs=1e-5)


def _logged_loss(result: Any) -> float:
    import csv

    with open(Path(result.run_dir) / "metrics.csv") as f:
        (row,) = [r for r in csv.DictReader(f) if r.get("train/loss")]
    return float(row["train/loss"])


def test_eval_data_scores_pairs_files_whole_as_the_model_was_trained(tiny: Any, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from specformer.cli import app

    result = train(load_spec(_sft(tiny, _reversals(tmp_path / "p.jsonl", 80), max_steps=2, val_interval=2)),
                   progress=False)
    held = _reversals(tmp_path / "held.jsonl", 30)

    def scored(*args: str) -> dict[str, Any]:
        out = CliRunner().invoke(app, ["eval", result.checkpoint, *args, "-f", "json", "--no-progress"])
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout)

    got = scored("--data", str(held))
    beside = scored("--set", f"training.data.val_paths=[{held}]", "--set", "training.val_batches=null")
    assert got["val_loss"] == pytest.approx(beside["val_loss"], rel=1e-6)
    assert got["held_out"] == beside["held_out"] == 30  # every pair of the file
    assert got["scored_tokens"] == beside["scored_tokens"] > 0 and "also in" not in got["data"]
