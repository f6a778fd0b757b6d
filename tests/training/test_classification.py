"""Sequence classification training: labelled tables, the label map, the loss and accuracy."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from specformer.data.corpus import DataError
from specformer.specs.errors import SpecError
from specformer.specs.loader import load_spec


def _table(path: Path, n: int = 400, seed: int = 0) -> Path:
    """Texts holding "good" (label pos) or "bad" (label neg) among random filler words."""
    rng = random.Random(seed)
    words = ["the", "a", "film", "was", "plot", "very", "and", "acting", "it", "so"]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(n):
            good = rng.random() < 0.5
            body = [rng.choice(words) for _ in range(rng.randint(2, 4))]
            body.insert(rng.randint(0, len(body)), "good" if good else "bad")
            w.writerow([" ".join(body) + f" {i}", "pos" if good else "neg"])
    return path


def _spec(tiny: Any, table: Path, **training: Any) -> dict[str, Any]:
    training.setdefault("seq_len", 64)
    spec = tiny("encoder", data={"type": "labelled", "paths": [str(table)], "val_fraction": 0.25}, **training)
    spec["head"] = {"type": "classification", "n_classes": 2, "pooling": "mean"}
    return spec


def test_the_collated_labels_are_the_tables_labels_in_sorted_name_order(tiny: Any, tmp_path: Path) -> None:
    from specformer.data.module import SpecDataModule

    table = _table(tmp_path / "t.csv", n=40)
    spec = load_spec(_spec(tiny, table))
    assert spec.training.objective.type == "classification"  # the head's default objective
    dm = SpecDataModule(spec)
    dm.setup("fit")
    assert dm.data.extra["label_names"] == ("neg", "pos")  # sorted
    rows = {r["text"]: r["label"] for r in csv.DictReader(table.open())}
    collate = dm._collator(0)
    batch = collate([(i, dm.data.train.rows[i]) for i in range(8)])
    texts = [dm.data.tokenizer.decode(ids) for ids, _ in dm.data.train.rows[:8]]
    assert batch["labels"].tolist() == [("neg", "pos").index(rows[t]) for t in texts]
    assert batch["input_ids"].shape[0] == 8
    assert batch["attention_mask"].sum(1).tolist() == [len(ids) for ids, _ in dm.data.train.rows[:8]]
    assert len(dm.data.train) + len(dm.data.val) == 40 and len(dm.data.val) > 0


def test_the_loss_is_the_cross_entropy_of_the_logits_and_accuracy_counts_the_argmax(tiny: Any, tmp_path: Path) -> None:
    from specformer.builder.lightning import SpecModule
    from specformer.data.module import SpecDataModule

    spec = load_spec(_spec(tiny, _table(tmp_path / "t.csv", n=40)))
    module = SpecModule(spec)
    dm = SpecDataModule(spec)
    dm.setup("fit")
    batch = dm._collator(0)([(i, dm.data.train.rows[i]) for i in range(6)])
    batch["labels"][5] = -100  # a filler row: no label
    module.eval()
    out = module.objective(module, batch)
    logits = module.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert logits.shape == (6, 2)
    want = F.cross_entropy(logits[:5], batch["labels"][:5])
    assert torch.allclose(out.loss, want, atol=1e-6)
    assert out.n_predicted == 5
    assert out.correct == int((logits[:5].argmax(-1) == batch["labels"][:5]).sum())


def test_a_tiny_run_learns_a_separable_table_and_saves_its_label_map(tiny: Any, tmp_path: Path) -> None:
    from specformer.builder.lightning import SpecModule
    from specformer.data.module import SpecDataModule
    from specformer.training import train
    from specformer.training.checkpoint import load_checkpoint

    table = _table(tmp_path / "t.csv")
    result = train(load_spec(_spec(tiny, table, max_steps=60, val_interval=60, val_batches=None)), progress=False)
    assert result.accuracy is not None and result.accuracy >= 0.9, result  # chance is 0.5
    assert result.history[-1]["val/accuracy"] == result.accuracy
    loaded = load_checkpoint(result.checkpoint)
    assert loaded.spec.head.labels == ("neg", "pos")  # the label map went with the run
    # evaluating the checkpoint on the same table scores the same accuracy (the same ids)
    module = SpecModule(loaded.spec, tokenizer=loaded.tokenizer)
    module.model.load_state_dict(loaded.model.state_dict())
    dm = SpecDataModule(loaded.spec, tokenizer=loaded.tokenizer)
    dm.setup("validate")
    import lightning as L

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.validate(module, datamodule=dm, verbose=False)
    assert module.val_history[-1]["val/accuracy"] == pytest.approx(result.accuracy)


def test_the_head_names_fix_the_label_order(tmp_path: Path) -> None:
    from specformer.data.labelled import label_ids

    assert label_ids(["pos", "neg", "pos"], 2, None) == ([1, 0, 1], ("neg", "pos"))
    assert label_ids(["pos", "neg"], 2, ("pos", "neg")) == ([0, 1], ("pos", "neg"))
    assert label_ids([1, 0, 2], 3, None) == ([1, 0, 2], None)
    with pytest.raises(DataError, match=r"3 label names \('a', 'b', 'c'\) and the classification head has "
                                        r"n_classes=2: set head.n_classes=3"):
        label_ids(["a", "b", "c"], 2, None)
    with pytest.raises(DataError, match=r"label 2 is not a class id .* n_classes=2 \(ids 0-1\)"):
        label_ids([0, 1, 2], 2, None)
    # ratings 1-5 under a head of 5: the head's names keep the data's numbers (ids count from 0)
    with pytest.raises(DataError, match=r"labels run 1-5: class ids count from 0; .* name the classes: "
                                        r"head.labels: \['1', '2', '3', '4', '5'\] \(or subtract 1"):
        label_ids([1, 2, 5], 5, None)
    stars = ("1", "2", "3", "4", "5")
    assert label_ids([1, 2, 5], 5, stars) == ([0, 1, 4], stars)
    assert label_ids([1, 0], 2, ("neg", "pos")) == ([1, 0], None)  # names that are not the numbers: ids
    with pytest.raises(DataError, match=r"label 'meh' is not one of the classification head's labels"):
        label_ids(["pos", "meh"], 2, ("neg", "pos"))


def test_a_labelled_jsonl_and_tsv_read_as_the_csv(tmp_path: Path) -> None:
    from specformer.data.labelled import labelled_corpus
    from specformer.specs.training import LabelledDataSpec

    (tmp_path / "a.jsonl").write_text('{"text": "x y", "label": 1}\n{"text": "z", "label": "0"}\n')
    (tmp_path / "b.tsv").write_text("label\ttext\n1\tx y\n0\tz\n")
    for name in ("a.jsonl", "b.tsv"):
        corpus = labelled_corpus(LabelledDataSpec(paths=[str(tmp_path / name)], val_fraction=0.5))
        assert sorted(corpus.train + corpus.val) == [("x y", 1), ("z", 0)]
    (tmp_path / "c.csv").write_text("text,y\nx,1\n")
    with pytest.raises(DataError, match=r"c.csv:1: no 'label' column \(training.data.label_field\); the header "
                                        r"row has 'text', 'y'"):
        labelled_corpus(LabelledDataSpec(paths=[str(tmp_path / "c.csv")]))


def test_a_labelled_csv_reads_a_text_past_the_csv_modules_field_limit(tmp_path: Path) -> None:
    import csv as csv_module

    from specformer.data.labelled import labelled_corpus
    from specformer.specs.training import LabelledDataSpec

    long = "word " * 40_000  # 200,000 characters: the csv module refuses a field past 131,072
    with (tmp_path / "t.csv").open("w", newline="") as f:
        w = csv_module.writer(f)
        w.writerows([["text", "label"], [long, "pos"], ["short", "neg"]])
    limit = csv_module.field_size_limit()
    corpus = labelled_corpus(LabelledDataSpec(paths=[str(tmp_path / "t.csv")], val_fraction=0.5))
    assert sorted(corpus.train + corpus.val) == [("short", "neg"), (long, "pos")]
    assert csv_module.field_size_limit() == limit  # as it was


def test_classification_goes_with_a_classification_head_and_labelled_data(tiny: Any, tmp_path: Path) -> None:
    table = _table(tmp_path / "t.csv", n=10)
    spec = _spec(tiny, table)
    from specformer.training import train

    masked = load_spec({**spec, "training": {**spec["training"], "objective": {"type": "masked_lm"},
                                             "data": {"type": "stdlib"}}})  # builds and exports; does not train
    with pytest.raises(SpecError, match=r"head.type: objective 'masked_lm' trains a vocabulary head, and this "
                                        r"model's head is type: classification"):
        train(masked, progress=False)
    with pytest.raises(SpecError, match=r"objective classification trains on labelled texts, not 'files'"):
        load_spec({**spec, "training": {**spec["training"], "data": {"type": "files", "paths": ["x"]}}})
    with pytest.raises(SpecError, match=r"head.type: objective classification trains a classification head"):
        load_spec({**spec, "head": None})
    with pytest.raises(SpecError, match=r"objective 'classification' does not train a decoder model"):
        load_spec({**tiny("decoder", data=spec["training"]["data"], objective={"type": "classification"})})
    # labelled texts for a decoder: not told to set an objective that it then refuses
    with pytest.raises(SpecError) as info:
        load_spec({**tiny("decoder", data=spec["training"]["data"])})
    (problem,) = info.value.problems
    assert "labelled texts train an encoder's classification head" in problem.message
    assert "set training.objective.type: classification" not in problem.message
    # so a decoder's or encoder-decoder's classification head is not told to train with it
    for kind in ("decoder", "encoder-decoder"):
        other = load_spec({**tiny(kind), "head": {"type": "classification", "pooling": "last"}})
        with pytest.raises(SpecError) as info:
            train(other, progress=False)
        (problem,) = info.value.problems
        assert problem.path == "head.type" and "training.objective.type=classification" not in problem.message
        assert f"trains on an encoder only (objective classification); a{'n' if kind[0] == 'e' else ''} {kind}'s" \
            in problem.message
        assert "--set head.type=lm" in problem.message
    with pytest.raises(DataError, match=r"the data has 2 label names \('neg', 'pos'\) and the classification head "
                                        r"has n_classes=3"):
        train(load_spec({**spec, "head": {"type": "classification", "n_classes": 3}}), progress=False)


def test_train_and_eval_on_the_command_line_print_accuracy(tiny: Any, tmp_path: Path) -> None:
    import yaml
    from typer.testing import CliRunner

    from specformer.cli import app

    spec = _spec(tiny, _table(tmp_path / "t.csv", n=200), max_steps=40, val_interval=40, val_batches=None)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    runner = CliRunner()
    out = runner.invoke(app, ["train", str(path), "--no-progress"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    held = int(out.output.split(" training and ")[1].split(" held-out")[0])

    def row(output: str) -> str:
        return next(line for line in output.splitlines() if "│ accuracy" in line).split("│")[2].strip()

    trained = row(out.output)
    assert trained.endswith(f"% of {held} held-out texts"), trained
    assert "│ val loss" in out.output and "perplexity" not in out.output  # a loss over 2 classes, not a vocabulary
    run = next((tmp_path / "runs").glob("*/*"))
    assert yaml.safe_load((run / "spec.yaml").read_text())["head"]["labels"] == ["neg", "pos"]
    out = runner.invoke(app, ["eval", str(run)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert f"all {held} held-out texts" in out.output and "perplexity" not in out.output
    assert row(out.output) == trained  # the same words and number as the training summary's
    got = json.loads(runner.invoke(app, ["eval", str(run), "-f", "json"]).stdout)
    assert (got["scored_texts"], got["val_examples"], got["held_out"], got["held_out_unit"]) == (held, held, held, "text")
    assert got["val_ppl"] is None and f"{100 * got['accuracy']:.1f}%" == trained.split(" of ")[0]
    # a labelled file of its own, scored whole: every row a text, read as the held-out split alone (it
    # was read as both, said as '2 files, 51 training and 51 held-out texts', its cut texts counted twice)
    test = _table(tmp_path / "test.csv", n=50, seed=1)
    with test.open("a") as f:
        f.write(" ".join(["good"] * 100) + ",pos\n")  # longer than seq_len: cut
    scored = json.loads(runner.invoke(app, ["eval", str(run), "-f", "json", "--data", str(test)]).stdout)
    assert (scored["scored_texts"], scored["held_out"]) == (51, 51) and scored["accuracy"] >= 0.8
    assert scored["data"] == "labelled: test.csv: 51 texts, 2 classes (neg, pos); cut 1 text longer than 64 tokens " \
                             "to fit seq_len=64", scored["data"]
    assert float(trained.split("%")[0]) >= 90.0


def test_ctrl_c_in_eval_of_a_classifier_counts_the_texts_scored(tiny: Any, tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from specformer.builder.lightning import SpecModule
    from specformer.cli import app
    from specformer.training import train

    result = train(load_spec(_spec(tiny, _table(tmp_path / "t.csv", n=80), max_steps=2, val_interval=2)),
                   progress=False)
    step, calls = SpecModule.validation_step, []

    def stopped_in_the_third(self: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(SpecModule, "validation_step", stopped_in_the_third)
    out = CliRunner().invoke(app, ["eval", result.checkpoint], env={"COLUMNS": "200"})
    assert out.exit_code == 130, out.output
    # two batches of 8 texts were scored; their tokens are many more than 16
    assert "interrupted after 16 scored texts" in out.stdout and "tokens" not in out.stdout
    assert "% of 16 held-out texts" in out.stdout


def test_a_labelled_split_smaller_than_a_batch_is_counted_in_texts(tiny: Any, tmp_path: Path, capsys) -> None:
    from rich.console import Console

    from specformer.training import train

    spec = _spec(tiny, _table(tmp_path / "t.csv", n=8), max_steps=1, val_interval=1, batch_size=16)
    result = train(load_spec(spec), progress=False, console=Console(stderr=True, width=300))
    err = capsys.readouterr().err
    n = int(result.data.split(", ")[1].split(" training")[0])
    assert 0 < n < 8
    assert f"the training split has {n} texts, fewer than one batch (training.batch_size=16)" in err, err


def test_a_run_resumed_from_the_users_own_spec_numbers_labels_as_the_checkpoint(tiny: Any, tmp_path: Path) -> None:
    from specformer.training import train
    from specformer.training.checkpoint import load_checkpoint

    spec = _spec(tiny, _table(tmp_path / "t.csv", n=60), max_steps=4, val_interval=4)
    first = train(load_spec(spec), progress=False)
    # the spec names no labels; the checkpoint's ('neg', 'pos') are taken, not refused as another model
    spec["training"]["max_steps"] = 6
    resumed = train(load_spec(spec), resume=first.checkpoint, progress=False)
    assert resumed.steps == 6
    assert load_checkpoint(resumed.checkpoint).spec.head.labels == ("neg", "pos")


def test_a_masked_lm_encoder_is_fine_tuned_to_classify_under_a_new_head(tiny: Any, tmp_path: Path) -> None:
    import io

    from rich.console import Console
    from safetensors.torch import save_file

    from specformer.training import train
    from specformer.training.checkpoint import CheckpointError

    table = _table(tmp_path / "t.csv", n=80)
    mlm = train(load_spec(tiny("encoder", max_steps=2, val_interval=2)), progress=False)
    pretrained = torch.load(mlm.checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    pretrained = {k.removeprefix("model."): v for k, v in pretrained.items() if k.startswith("model.")}
    assert any(k.startswith("head.") for k in pretrained)  # BERT's transform: not a classifier's
    spec = _spec(tiny, table, max_steps=1, val_interval=1, val_batches=1)
    spec["training"]["optimizer"] = {"type": "sgd", "lr": 1e-30}  # one step that leaves the weights as loaded
    out = io.StringIO()
    done = train(load_spec(spec), init_from=mlm.checkpoint, progress=False,
                 console=Console(file=out, width=400, color_system=None))
    said = " ".join(out.getvalue().split())
    assert ("its head (head.bias, head.transform.dense.weight, head.transform.dense.bias, head.transform.norm.weight "
            "and 1 more) does not fit this spec's classification head (head.pooler.weight, head.pooler.bias, "
            "head.classifier.weight, head.classifier.bias)") in said
    assert "which starts from its initialisation and is trained on the labels" in said
    tuned = torch.load(done.checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    tuned = {k.removeprefix("model."): v for k, v in tuned.items() if k.startswith("model.")}
    body = [k for k in tuned if not k.startswith("head.")]
    assert body and all(torch.equal(tuned[k], pretrained[k]) for k in body)  # every weight but the head's
    assert not any(k in pretrained for k in tuned if k.startswith("head."))
    # a body that does not fit is refused as before, head or not
    other = {k: v for k, v in pretrained.items() if k != "embed.tokens.weight"}
    save_file({k: v.contiguous() for k, v in other.items()}, tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError, match="missing from the checkpoint: embed.tokens.weight"):
        train(load_spec(spec), init_from=tmp_path / "w.safetensors", progress=False)


def test_a_label_name_only_the_held_out_rows_have_is_counted_as_a_class(tiny: Any, tmp_path: Path) -> None:
    from specformer.data.module import SpecDataModule

    train_table = _table(tmp_path / "t.csv", n=20)
    held = tmp_path / "v.csv"
    held.write_text("text,label\nit was good,pos\nit was bad,neg\nit was fine,neutral\n")
    spec = _spec(tiny, train_table)
    spec["training"]["data"] = {"type": "labelled", "paths": [str(train_table)], "val_paths": [str(held)]}
    # two names in training, three in all: the head needs three (asking for two could never be met)
    with pytest.raises(DataError, match=r"training.data.paths and training.data.val_paths: the data has 3 label "
                                        r"names \('neg', 'neutral', 'pos'\) and the classification head has "
                                        r"n_classes=2: set head.n_classes=3"):
        SpecDataModule(load_spec(spec)).setup("fit")
    dm = SpecDataModule(load_spec({**spec, "head": {**spec["head"], "n_classes": 3}}))
    dm.setup("fit")
    assert dm.data.extra["label_names"] == ("neg", "neutral", "pos")
    assert [label for _, label in dm.data.val.rows] == [2, 0, 1]
    assert {label for _, label in dm.data.train.rows} == {0, 2}
    assert "class 'neutral' occurs only in the held-out rows: no training row teaches it" in dm.data.description


def test_a_text_given_two_labels_is_said_in_the_data_line(tiny: Any, tmp_path: Path) -> None:
    # a labelling mistake (or one text in two files): no model fits both labels
    from specformer.data.module import prepare

    table = _table(tmp_path / "t.csv", n=40)
    with table.open("a", newline="") as f:
        csv.writer(f).writerows([["a film that is both", "pos"], ["a film that is both", "neg"]])
    data = prepare(load_spec(_spec(tiny, table)))
    assert data.description.endswith("; 1 text has more than one label (e.g. 'a film that is both': pos, neg), "
                                     "which no model fits")
    assert "more than one label" not in prepare(load_spec(_spec(tiny, _table(tmp_path / "u.csv", n=40)))).description
