"""Using a trained classifier: classify() and `specformer classify` on a tiny model trained
in the test on a separable table (test_classification's)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_classification import _spec, _table

from specformer.specs.loader import load_spec

LONG = "the film was very good and the acting " * 20  # past the 64 tokens trained at


@pytest.fixture
def classifier(tiny: Any, tmp_path: Path) -> Any:
    """A checkpoint of a classifier trained on the 'good'/'bad' table (labels neg, pos)."""
    from specformer.training import train

    table = _table(tmp_path / "t.csv", n=200)
    result = train(load_spec(_spec(tiny, table, max_steps=40, val_interval=40, val_batches=None)), progress=False)
    assert result.accuracy is not None and result.accuracy >= 0.9
    # a loss over the classes: accuracy in place of a perplexity, in the log and the result
    assert result.val_ppl is None
    assert "val/ppl" not in (Path(result.run_dir) / "metrics.csv").read_text().splitlines()[0]
    return result.checkpoint


def _cli(*args: str, input: str | None = None) -> Any:
    from typer.testing import CliRunner

    from specformer.cli import app

    return CliRunner().invoke(app, ["classify", *args], input=input, env={"COLUMNS": "200"})


def test_the_probabilities_are_the_softmax_of_the_logits_of_the_ids_training_reads(classifier: str) -> None:
    from specformer.data.module import classification_ids
    from specformer.training import classify
    from specformer.training.checkpoint import load_checkpoint

    loaded = load_checkpoint(classifier)
    assert loaded.spec.head.labels == ("neg", "pos")
    texts = ["the plot was good", "a bad film", LONG]
    result = classify(loaded.model, loaded.tokenizer, texts, top_k=2)
    assert result.seq_len == 64 and result.classes == ("neg", "pos")
    assert result.truncated == 1 and [p.truncated for p in result.predictions] == [False, False, True]
    for text, prediction in zip(texts, result.predictions, strict=True):
        ids, _ = classification_ids(loaded.tokenizer, text, 64)
        assert len(ids) <= 64
        with torch.no_grad():
            want = loaded.model(torch.tensor([ids])).logits[0].softmax(-1)  # (C,)
        assert prediction.probabilities == pytest.approx(want.tolist(), abs=1e-6)
        best = int(want.argmax())
        assert prediction.label == ("neg", "pos")[best]
        assert prediction.probability == pytest.approx(float(want[best]), abs=1e-6)
        assert [label for label, _ in prediction.top] == [("neg", "pos")[best], ("neg", "pos")[1 - best]]
        assert sum(p for _, p in prediction.top) == pytest.approx(1.0, abs=1e-6)
    assert [p.label for p in result.predictions] == ["pos", "neg", "pos"]  # the model learnt the table


def test_batching_and_padding_do_not_change_a_prediction(classifier: str) -> None:
    from specformer.training import classify
    from specformer.training.checkpoint import load_checkpoint

    loaded = load_checkpoint(classifier)
    texts = ["good", "the acting was so very bad and the plot it was", "a film", LONG, "bad plot", "so good 7"]
    alone = [classify(loaded.model, loaded.tokenizer, [t]).predictions[0] for t in texts]
    for batch_size in (2, 4, 32):
        together = classify(loaded.model, loaded.tokenizer, texts, batch_size=batch_size).predictions
        for one, many in zip(alone, together, strict=True):  # in the texts' own order
            assert many.label == one.label
            assert many.probabilities == pytest.approx(one.probabilities, abs=1e-5)


def test_a_model_without_names_labels_by_class_id_and_the_score_counts_unknown_labels() -> None:
    from specformer.training.classify import Prediction, class_names, score

    spec = load_spec({"extends": "bert-nano", "head": {"type": "classification", "n_classes": 3},
                      "training": {"data": {"type": "labelled", "paths": ["x.csv"]}}})
    assert class_names(spec) == (0, 1, 2)
    named = load_spec({"extends": "bert-nano", "head": {"type": "classification", "labels": ["neg", "pos"]},
                       "training": {"data": {"type": "labelled", "paths": ["x.csv"]}}})
    assert class_names(named) == ("neg", "pos")

    def p(label: Any) -> Prediction:
        return Prediction(label=label, probability=0.9, top=[(label, 0.9)], probabilities=[])

    predictions = [p("pos"), p("neg"), p("pos"), p("neg"), p("pos")]
    s = score(predictions, ["pos", "pos", "meh", "neg", "meh"], ("neg", "pos"))
    assert (s.correct, s.counted, s.unknown) == (2, 3, {"meh": 2})
    assert s.accuracy == pytest.approx(2 / 3)
    s = score(predictions, [1, 0, 0, 0, 7], ("neg", "pos"))  # all integers: class ids, as training reads them
    assert (s.correct, s.counted, s.unknown) == (3, 4, {7: 1})
    s = score(predictions, [None, 0, None, 0, 1], ("neg", "pos"))  # None: the row has no label
    assert (s.correct, s.counted, s.unknown) == (3, 3, {})
    s = score(predictions, [None, 0, None, "neg", "pos"], ("neg", "pos"))  # names, as training reads a mix
    assert (s.correct, s.counted, s.unknown) == (2, 2, {0: 1})
    assert score(predictions, [None] * 5, ("neg", "pos")).accuracy is None
    # star ratings under head.labels ["1", "2", "3"] are names, as training reads them (3 was
    # class id 3, unknown, and 2 class "3": 0% for a model right on every text)
    stars = [p("1"), p("3"), p("2"), p("3")]
    s = score(stars, [1, 3, 2, 3], ("1", "2", "3"))
    assert (s.correct, s.counted, s.unknown) == (4, 4, {})
    s = score(stars, [0, 2, 1, 2], ("1", "2", "3"))  # 0 is no name: class ids
    assert (s.correct, s.counted, s.unknown) == (4, 4, {})


@pytest.mark.parametrize(("kind", "head", "command"), [
    ("decoder", None, "specformer generate"),
    ("encoder", None, "specformer fill-mask"),
    ("encoder-decoder", None, "specformer generate"),
])
def test_a_model_that_is_not_a_classifier_is_named_with_the_command_that_fits_it(
    tiny: Any, kind: str, head: Any, command: str
) -> None:
    from specformer.builder import build_model
    from specformer.training import classify
    from specformer.training.classify import NotAClassifier

    spec = load_spec(tiny(kind))
    with pytest.raises(NotAClassifier, match=rf"this model is .*use `{command}`.* classify needs a sequence "
                                             r"classifier: an encoder with head: \{type: classification"):
        classify(build_model(spec), None, ["a text"])


def test_fill_mask_and_generate_given_a_classifier_name_classify(tiny: Any, tmp_path: Path) -> None:
    # an encoder whose head scores classes: fill-mask failed inside with "IndexError: too many
    # indices for tensor of dimension 1", and generate said to use fill-mask
    import yaml
    from safetensors.torch import save_file
    from typer.testing import CliRunner

    from specformer.builder import build_model
    from specformer.cli import app

    data = _spec(tiny, _table(tmp_path / "t.csv", n=40))
    data["training"]["tokenizer"] = {"type": "byte"}
    spec = tmp_path / "cls.yaml"
    spec.write_text(yaml.safe_dump(data))
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in build_model(load_spec(spec)).state_dict().items()}, weights)
    runner = CliRunner()
    masked = runner.invoke(app, ["fill-mask", str(weights), "--spec", str(spec), "a <mask> film"],
                           env={"COLUMNS": "1000"})
    assert masked.exit_code == 1 and masked.stderr == (
        "error: fill-mask needs a masked LM (head: mlm); this checkpoint is a sequence classifier (head: "
        "classification): use `specformer classify` to label texts\n")
    generated = runner.invoke(app, ["generate", str(weights), "--spec", str(spec), "-p", "a film"],
                              env={"COLUMNS": "1000"})
    assert generated.exit_code == 1 and generated.stderr == (
        "error: a sequence classifier (head: classification) does not generate text; use `specformer classify` "
        "to label texts\n")


def test_the_command_shows_labels_and_probabilities_of_texts(classifier: str) -> None:
    out = _cli(classifier, "the plot was good", "a bad [b]film[/b]", "--top-k", "2")
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if "│" in line]
    assert "good" in lines[0] and "pos" in lines[0] and "neg" in lines[1]
    assert "a bad [b]film[/b]" in out.output  # the text as it is, not read as markup
    probs = [float(line.split("│")[-2]) for line in lines]
    assert probs[0] >= 0.5 >= probs[1] and probs[0] + probs[1] == pytest.approx(1.0, abs=2e-3)
    assert "accuracy" not in out.output  # texts on the command line carry no labels


def test_standard_input_gives_one_text_a_line(classifier: str) -> None:
    out = _cli(classifier, "-", input="good good\n\nbad bad\n")
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if "│" in line and "text" not in line]
    assert len(rows) == 2 and "pos" in rows[0] and "neg" in rows[1]


def test_a_text_files_lines_are_its_texts_and_minus_writes_them_tab_separated(classifier: str, tmp_path: Path) -> None:
    # str.splitlines broke a file's line at a form feed or U+2028 (6 texts), standard input at
    # line feeds (4 texts); the written rows now carry their line numbers
    text = "good film\nbad\x0cplot\n\nfine line\u2028second part\nlast line no newline"
    plain = tmp_path / "edge.txt"
    plain.write_bytes(text.encode())
    from_file = _cli(classifier, "--file", str(plain), "-o", "-")
    from_stdin = _cli(classifier, "-", "-o", "-", input=text)
    for out in (from_file, from_stdin):
        assert out.exit_code == 0, out.output
        rows = list(csv.reader(io.StringIO(out.stdout), delimiter="\t"))
        assert rows[0] == ["line", "text", "prediction", "probability"]
        assert [(r[0], r[1]) for r in rows[1:]] == [("1", "good film"), ("2", "bad\x0cplot"),
                                                   ("4", "fine line\u2028second part"), ("5", "last line no newline")]
        assert all(r[2] in ("neg", "pos") and 0.5 <= float(r[3]) <= 1 for r in rows[1:])
        assert "wrote 4 predictions to standard output" in out.stderr
    # for cut: no quoting, a tab inside a text is a space ("line with\ttab" quoted broke cut -f 3)
    quoted = _cli(classifier, "-", "-o", "-", input='a "good"\tfilm\n')
    assert quoted.exit_code == 0, quoted.output
    line = quoted.stdout.splitlines()[1].split("\t")
    assert line[:2] == ["1", 'a "good" film'] and line[2] in ("neg", "pos") and len(line) == 4
    one = _cli(classifier, "good", "-o", str(tmp_path / "one.csv"))
    assert "wrote 1 prediction to" in one.output
    # a table's accuracy line goes to standard error, beside the rows
    table = tmp_path / "test.csv"
    table.write_text("text,label\ngood film,pos\nbad plot,neg\n")
    out = _cli(classifier, "--file", str(table), "-o", "-")
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[0] == "text\tlabel\tprediction\tprobability" and len(out.stdout.splitlines()) == 3
    assert "accuracy" in out.stderr and "accuracy" not in out.stdout


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".json"])
def test_a_tables_predictions_are_written_with_its_own_columns_and_scored(
    classifier: str, tmp_path: Path, suffix: str
) -> None:
    from specformer.training import classify
    from specformer.training.checkpoint import load_checkpoint

    test = tmp_path / "test.jsonl"
    rows = [{"id": i, "review": text, "gold": gold, "note": None if i else {"a": 1}}
            for i, (text, gold) in enumerate([("good film", "pos"), ("bad plot", "neg"), ("very good", "neg"),
                                              ("it was bad", "meh"), (LONG, "pos")])]
    test.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out_path = tmp_path / f"out{suffix}"
    out = _cli(classifier, "--file", str(test), "--text-column", "review", "--label-column", "gold", "-o",
               str(out_path), "--top-k", "2", "--batch-size", "2")
    assert out.exit_code == 0, out.output
    loaded = load_checkpoint(classifier)
    want = classify(loaded.model, loaded.tokenizer, [r["review"] for r in rows], top_k=2).predictions
    if suffix in (".csv", ".tsv"):
        with out_path.open(newline="") as f:
            back = list(csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ","))
        assert list(back[0]) == ["id", "review", "gold", "note", "prediction", "probability", "prediction_2",
                                 "probability_2"]
        assert [r["id"] for r in back] == ["0", "1", "2", "3", "4"] and back[0]["note"] == '{"a": 1}'
        assert back[1]["note"] == ""
    else:
        text = out_path.read_text()
        back = json.loads(text) if suffix == ".json" else [json.loads(line) for line in text.splitlines()]
        assert list(back[0]) == ["id", "review", "gold", "note", "prediction", "probability", "prediction_2",
                                 "probability_2"]
        assert [r["id"] for r in back] == [0, 1, 2, 3, 4] and back[0]["note"] == {"a": 1}
    for row, source, prediction in zip(back, rows, want, strict=True):
        assert row["review"] == source["review"] and row["gold"] == source["gold"]
        assert row["prediction"] == prediction.label and row["prediction_2"] == prediction.top[1][0]
        assert float(row["probability"]) == pytest.approx(prediction.probability, abs=1e-6)
        assert float(row["probability_2"]) == pytest.approx(prediction.top[1][1], abs=1e-6)
    correct = sum(p.label == r["gold"] for p, r in zip(want, rows, strict=True) if r["gold"] != "meh")
    assert f"accuracy {100 * correct / 4:.1f}% ({correct} of 4 texts with a label, the 'gold' column)" in out.output
    assert "labels this model does not have: 'meh' (1 text); they are left out of the accuracy (the model's " \
           "labels: 'neg', 'pos')" in " ".join(out.output.split())
    assert "1 of the 5 texts is longer than 64 tokens" in " ".join(out.output.split())
    assert f"wrote 5 predictions to {out_path}" in out.output.replace("\n", "")
    # the file read back is the same table: classified again, its own columns are kept
    again = _cli(classifier, "--file", str(out_path), "--text-column", "review", "-o", str(tmp_path / "again.csv"))
    assert again.exit_code == 0, again.output
    with (tmp_path / "again.csv").open(newline="") as f:
        assert list(next(csv.reader(f))) == ["id", "review", "gold", "note", "prediction", "probability",
                                             "prediction_2", "probability_2"]


def test_the_training_columns_are_the_default_and_a_label_column_gives_accuracy(classifier: str, tmp_path: Path) -> None:
    table = _table(tmp_path / "test.csv", n=60, seed=1)
    out = _cli(classifier, "--file", str(table))
    assert out.exit_code == 0, out.output
    assert "true (label)" in out.output
    accuracy = float(out.output.split("accuracy")[1].split("%")[0])
    assert accuracy >= 90.0 and "of 60 texts with a label, the 'label' column" in out.output
    assert "note: 60 texts: -o predictions.csv (or .tsv, .jsonl, .json) writes them to a file" in out.output
    blank = tmp_path / "blank.csv"
    blank.write_text("text,label\ngood film,pos\nbad plot,\nso bad,neg\n")  # a row without its label
    out = _cli(classifier, "--file", str(blank))
    assert out.exit_code == 0, out.output
    assert "accuracy 100.0% (2 of 2 texts with a label, the 'label' column)" in out.output
    # JSON lines: a row without the label key is one without a label, as the empty cell is
    lines = tmp_path / "blank.jsonl"
    lines.write_text('{"text": "good film", "label": "pos"}\n{"text": "bad plot"}\n{"text": "so bad", "label": "neg"}\n')
    for extra in ([], ["--label-column", "label"]):
        out = _cli(classifier, "--file", str(lines), *extra)
        assert out.exit_code == 0, out.output
        assert "accuracy 100.0% (2 of 2 texts with a label, the 'label' column)" in out.output
    plain = tmp_path / "texts.txt"
    plain.write_text("good film\n\nbad plot\n")
    out = _cli(classifier, "--file", str(plain))
    assert out.exit_code == 0, out.output
    assert "accuracy" not in out.output and out.output.count("│ pos") + out.output.count("│ neg") == 2


def test_errors_name_the_file_the_columns_and_the_command_that_fits(
    classifier: str, tiny: Any, tmp_path: Path
) -> None:
    from specformer.training import train

    out = _cli(classifier, "--file", str(tmp_path / "nope.csv"))
    assert out.exit_code == 1 and f"error: --file {tmp_path / 'nope.csv'}: no such file" in out.output
    table = tmp_path / "t2.csv"
    table.write_text("body,y\nx,1\n")
    out = _cli(classifier, "--file", str(table))
    assert out.exit_code == 1
    assert f"--file: {table}:1: no 'text' column (--text-column); the header row has 'body', 'y'" in out.output
    out = _cli(classifier, "--file", str(table), "--text-column", "body", "--label-column", "label")
    assert out.exit_code == 1 and "no 'label' column (--label-column); the header row has 'body', 'y'" in out.output
    out = _cli(classifier, "a", "--file", str(table))
    assert out.exit_code == 1 and "give texts or --file, not both" in out.output
    out = _cli(classifier)
    assert out.exit_code == 1 and "give texts to classify, --file FILE, or - to read them" in out.output
    out = _cli(classifier, "a", "-o", str(tmp_path / "out.txt"))
    assert out.exit_code == 1 and "give a .csv, .tsv, .jsonl, .ndjson or .json name" in out.output
    out = _cli(classifier, "a", "--text-column", "x")
    assert out.exit_code == 1 and "--text-column names a column of a --file table" in out.output
    out = _cli(classifier, "--file", "-", "--text-column", "x", input="good\n")
    assert out.exit_code == 1 and "standard input is read as plain text, one text a line" in out.output
    if not torch.cuda.is_available():
        out = _cli(classifier, "a", "--device", "cuda")
        assert out.exit_code == 1 and "--device cuda: this machine has no CUDA GPU" in out.output
    out = _cli(classifier, "a", "--device", "tpu")
    assert out.exit_code == 1 and "--device tpu: not a device; give auto, cpu, cuda, cuda:N or mps" in out.output
    out = _cli(classifier, "a", "--max-length", "100")  # the model's learned table has 64 rows
    assert out.exit_code == 1 and "--max-length=100: this model's learned position table has 64 positions" in out.output
    decoder = train(load_spec(tiny("decoder", max_steps=2, val_interval=2)), progress=False).checkpoint
    out = _cli(decoder, "a text")
    assert out.exit_code == 1
    said = " ".join(out.output.split())
    assert "this model is a decoder language model (head: lm): it continues text; use `specformer generate`" in said
    assert "Traceback" not in out.output


def test_ctrl_c_leaves_no_half_written_output(classifier: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    module = sys.modules["specformer.training.classify"]  # the package's `classify` is the function
    table = _table(tmp_path / "test.csv", n=40, seed=2)
    out_path = tmp_path / "out.csv"
    out_path.write_text("before\n")
    real = module.class_probabilities
    calls = []

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "class_probabilities", interrupted)
    out = _cli(classifier, "--file", str(table), "-o", str(out_path), "--batch-size", "8")
    assert out.exit_code == 130 and "interrupted; nothing was written" in out.output
    monkeypatch.setattr(module, "class_probabilities", real)

    import specformer.data.cache as cache

    def fsync(fd: int) -> None:  # Ctrl-C while the file is written
        raise KeyboardInterrupt

    monkeypatch.setattr(cache.os, "fsync", fsync)
    out = _cli(classifier, "--file", str(table), "-o", str(out_path))
    assert out.exit_code == 130, out.output
    assert out_path.read_text() == "before\n" and sorted(p.name for p in tmp_path.iterdir() if "out" in p.name) == [
        "out.csv"]
