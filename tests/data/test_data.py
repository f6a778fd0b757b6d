"""Corpora, tokenizers, the token cache, collators, the sampler and the synthetic tasks."""

from __future__ import annotations

import errno
import glob
import json
import os
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from specformer.data.collate import (
    IGNORE_INDEX,
    CausalLMCollator,
    MaskedLMCollator,
    Seq2SeqCollator,
)
from specformer.data.corpus import DataError, files_corpus, split_by_path, stdlib_corpus
from specformer.data.sampler import EvalBatchSampler, StreamBatchSampler
from specformer.data.synthetic import SyntheticTask, solve
from specformer.data.tokenizers import (
    ByteTokenizer,
    TaskTokenizer,
    bpe_tokenizer,
    file_tokenizer,
    tokenizer_from_state,
)
from specformer.data.tokens import token_arrays, unigram_cross_entropy
from specformer.specs.training import (
    BPETokenizerSpec,
    FilesDataSpec,
    FileTokenizerSpec,
    MaskedLMSpec,
    StdlibDataSpec,
    SyntheticDataSpec,
)

JSON_GLOB = str(Path(sysconfig.get_paths()["stdlib"]) / "json" / "*.py")


# --------------------------------------------------------------------------- corpora


def test_split_by_path_is_stable_and_independent_of_other_files() -> None:
    keys = [f"pkg/mod{i}.py" for i in range(400)]
    train, val = split_by_path(keys, 0.1)
    assert sorted(train + val) == list(range(400))
    assert 20 < len(val) < 60
    held = {keys[i] for i in val}
    # adding files never moves an existing file between splits
    more = keys + [f"other/x{i}.py" for i in range(100)]
    _, val2 = split_by_path(more, 0.1)
    assert held == {more[i] for i in val2} & set(keys)
    assert split_by_path(["a", "b"], 0.01)[1]  # two files: validation is never empty


def test_stdlib_corpus_is_real_text_split_by_file() -> None:
    corpus = stdlib_corpus(StdlibDataSpec(max_mb=1.0))
    assert 0.5e6 < corpus.n_bytes <= 1.05e6
    assert corpus.train and corpus.val
    assert not set(corpus.train_ids) & set(corpus.val_ids)
    assert any("def " in text for text in corpus.train)
    assert stdlib_corpus(StdlibDataSpec(max_mb=1.0)).fingerprint == corpus.fingerprint
    no_tests = stdlib_corpus(StdlibDataSpec(max_mb=1.0, include_tests=False))
    assert not any(i.startswith("test/") for i in no_tests.train_ids + no_tests.val_ids)


def test_files_corpus_globs_and_errors(tmp_path: Path) -> None:
    corpus = files_corpus(FilesDataSpec(paths=(JSON_GLOB,), val_fraction=0.3))
    assert len(corpus.train) + len(corpus.val) >= 4
    (tmp_path / "a.txt").write_text("hello world\n" * 50)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("second file\n" * 50)
    both = files_corpus(FilesDataSpec(paths=(str(tmp_path),), val_fraction=0.5))
    assert sorted(both.train_ids + both.val_ids) == ["a.txt", "sub/b.txt"]
    with pytest.raises(DataError, match="nothing matches 'nope/\\*.txt'"):
        files_corpus(FilesDataSpec(paths=("nope/*.txt",)))


def test_a_relative_data_path_not_found_names_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a spec in project/ names corpus.txt beside it, and the run starts elsewhere: the
    # message says where a relative path was looked for; an absolute one needs no note
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "corpus.txt").write_text("hello world\n" * 50)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(DataError) as err:
        files_corpus(FilesDataSpec(paths=("corpus.txt",)))
    assert str(err.value) == (
        "training.data.paths: nothing matches 'corpus.txt' (a relative path is read from the working "
        f"directory, {tmp_path / 'elsewhere'}, not from the spec's folder: run from the folder it is relative "
        "to, or give it whole with --set training.data.paths=...)"
    )
    absent = str(tmp_path / "absent.txt")
    with pytest.raises(DataError) as err:
        files_corpus(FilesDataSpec(paths=(absent,)))
    assert str(err.value) == f"training.data.paths: nothing matches {absent!r}"
    with pytest.raises(DataError, match=r"no tokenizer.json at tok.json \(a relative path is read from the working"):
        file_tokenizer(FileTokenizerSpec(path="tok.json"))
    # a folder that is there is no matter of relative paths; a slow tokenizer's files are named
    slow = tmp_path / "elsewhere" / "slow"
    slow.mkdir()
    (slow / "vocab.json").write_text("{}")
    (slow / "merges.txt").write_text("")
    with pytest.raises(DataError) as err:
        file_tokenizer(FileTokenizerSpec(path="slow"))
    assert str(err.value) == (
        "training.tokenizer.path: the folder slow has no tokenizer.json; the folder holds a slow tokenizer's "
        "merges.txt, vocab.json: AutoTokenizer.from_pretrained(folder).save_pretrained(folder) writes its "
        "tokenizer.json")


def test_data_paths_that_find_only_empty_folders_name_them(tmp_path: Path) -> None:
    # an empty folder (or one holding only hidden files) is not "no files found" alone:
    # the message names the paths and says what was left out
    empty = tmp_path / "empty"
    empty.mkdir()
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / ".notes.txt").write_text("hello world\n" * 50)
    with pytest.raises(DataError) as err:
        files_corpus(FilesDataSpec(paths=(str(empty),)))
    assert str(err.value) == (
        f"training.data.paths: no files found: {str(empty)!r} finds only folders with no files in them "
        "(hidden ones, whose names start with '.', are left out)")
    with pytest.raises(DataError) as err:
        files_corpus(FilesDataSpec(paths=(str(empty), str(hidden))))
    assert str(err.value).startswith(f"training.data.paths: no files found: {str(empty)!r}, {str(hidden)!r} find "
                                     "only folders with no files in them")


def test_a_tokenizer_json_that_is_a_git_lfs_pointer_says_so(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 1842767\n")
    with pytest.raises(DataError) as err:
        file_tokenizer(FileTokenizerSpec(path=str(tmp_path)))
    assert str(err.value) == (
        f"training.tokenizer.path: {path} is a Git LFS pointer, not the file itself (the repository was cloned "
        "without Git LFS): fetch the file with `git lfs pull` in that repository, or download it with `hf download`"
    )
    path.write_text("{")  # any other file that is not a tokenizer.json says that
    with pytest.raises(DataError, match=r"tokenizer.json is not a tokenizer.json \(not JSON: Expecting"):
        file_tokenizer(FileTokenizerSpec(path=str(path)))
    # JSON of another kind says which: the tokenizer's settings, a slow tokenizer's vocabulary
    for text, kind in (('{"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>"}',
                        "a tokenizer_config.json (the tokenizer's settings; its tokenizer.json is the file beside it)"),
                       ('{"hello": 0, "world": 1}', "a vocabulary (token -> id), as a slow tokenizer's vocab.json"),
                       ('[1, 2]', None)):
        path.write_text(text)
        with pytest.raises(DataError) as err:
            file_tokenizer(FileTokenizerSpec(path=str(path)))
        said = str(err.value)
        assert said.startswith(f"training.tokenizer.path: {path} is not a tokenizer.json: ")
        assert (kind or "it holds a JSON list, not an object") in said and "save_pretrained(out)" in said


def test_a_max_mb_below_the_one_file_read_is_said(tmp_path: Path) -> None:
    # the cap keeps or leaves out whole files and keeps one: a single 5 kB file under
    # max_mb=0.001 is read whole, and the data line says so instead of ignoring the cap
    (tmp_path / "input.txt").write_text("hello world, again\n" * 263)  # 4,997 bytes
    capped = files_corpus(FilesDataSpec(paths=(str(tmp_path / "input.txt"),), max_mb=0.001))
    assert capped.n_bytes == 4997
    assert capped.notes == ["training.data.max_mb=0.001 is below the 0.005 MB of input.txt, read whole "
                            "(the cap keeps or leaves out whole files)"]
    assert files_corpus(FilesDataSpec(paths=(str(tmp_path / "input.txt"),), max_mb=1.0)).notes == []
    # a large file's size reads as a number of MB, not in exponent notation
    from specformer.data.corpus import _mb

    assert [_mb(n) for n in (4997, 2_500_000, 9_960_000, 150_000_000, 1_234_567_890)] == [
        "0.005", "2.5", "10", "150", "1,235"]


def test_a_utf16_file_is_left_out_with_how_to_make_it_readable(tmp_path: Path) -> None:
    # Windows Notepad's "Unicode" is UTF-16 with a byte-order mark: named as such, not only as "not UTF-8"
    (tmp_path / "notepad.txt").write_bytes("the cat sat on the mat\r\n".encode("utf-16") * 50)
    (tmp_path / "latin.txt").write_bytes("café au lait\n".encode("latin-1") * 50)
    (tmp_path / "fine.txt").write_text("plain notes\n" * 50)
    (tmp_path / "more.txt").write_text("more notes\n" * 50)
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path),)))
    assert corpus.skipped == ["latin.txt", "notepad.txt"]
    assert corpus.notes == ["notepad.txt is UTF-16 text (what Windows Notepad saves as 'Unicode'): save it as "
                            "UTF-8 to train on it"]
    assert corpus.skipped_at == {"latin.txt": "line 1, column 4, byte 0xe9", "notepad.txt": "UTF-16"}
    # the run says it before training, where: the summary comes at the end of a long run
    from specformer.data.module import _left_out

    assert _left_out(corpus) == ["left out 2 files that are not UTF-8 text: latin.txt (line 1, column 4, byte 0xe9), "
                                 "notepad.txt (UTF-16) (save them as UTF-8 to train on them)"]
    with pytest.raises(DataError, match=r"^training.data.paths: no text to train on in the given files; left out "
                                        r"as not UTF-8 text: notepad.txt; notepad.txt is UTF-16 text \(what Windows "
                                        r"Notepad saves as 'Unicode'\): save it as UTF-8 to train on it$"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "notepad.txt"),)))


def test_a_utf32_file_is_left_out_named_as_utf32_not_utf16(tmp_path: Path) -> None:
    # UTF-32-LE's byte-order mark (ff fe 00 00) opens with UTF-16-LE's (ff fe): it was called UTF-16
    # text (what Notepad saves as 'Unicode'); UTF-32-BE's (00 00 fe ff) was 'line 1, column 3, byte 0xfe'
    (tmp_path / "le.txt").write_bytes("the cat sat on the mat\r\n".encode("utf-32") * 50)
    (tmp_path / "be.txt").write_bytes(("\ufeff" + "the cat sat on the mat\n" * 50).encode("utf-32-be"))
    (tmp_path / "notepad.txt").write_bytes("the cat sat on the mat\r\n".encode("utf-16") * 50)
    (tmp_path / "fine.txt").write_text("plain notes\n" * 50)
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path),)))
    assert corpus.skipped == ["be.txt", "le.txt", "notepad.txt"]
    assert corpus.skipped_at == {"be.txt": "UTF-32", "le.txt": "UTF-32", "notepad.txt": "UTF-16"}
    assert corpus.notes == ["notepad.txt is UTF-16 text (what Windows Notepad saves as 'Unicode'): save it as UTF-8 "
                            "to train on it", "be.txt, le.txt are UTF-32 text: save them as UTF-8 to train on them"]
    from specformer.data.module import _left_out

    assert _left_out(corpus) == ["left out 3 files that are not UTF-8 text: be.txt (UTF-32), le.txt (UTF-32), "
                                 "notepad.txt (UTF-16) (save them as UTF-8 to train on them)"]
    with pytest.raises(DataError, match=r"^training.data.paths: no text to train on in the given files; left out "
                                        r"as not UTF-8 text: le.txt; le.txt is UTF-32 text: save it as UTF-8 to "
                                        r"train on it$"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "le.txt"),)))
    with pytest.raises(DataError, match=r"^training.data.paths: no text to train on in the given files; left out "
                                        r"as not UTF-8 text: be.txt, notepad.txt; notepad.txt is UTF-16 text "
                                        r"\(what Windows Notepad saves as 'Unicode'\): save it as UTF-8 to train on "
                                        r"it; be.txt is UTF-32 text: save it as UTF-8 to train on it$"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "be.txt"), str(tmp_path / "notepad.txt"))))


def test_a_file_with_nul_bytes_is_not_trained_on_as_text(tmp_path: Path) -> None:
    # valid UTF-8 yet not text: ASCII saved as UTF-16 without a byte-order mark ('h\0e\0l\0...'),
    # a file of zeros, a log with a run of NULs; left out and named, never trained on as text
    (tmp_path / "nobom.txt").write_bytes("the cat sat on the mat\n".encode("utf-16-le") * 50)
    (tmp_path / "zeros.txt").write_bytes(bytes(1000))
    (tmp_path / "log.txt").write_bytes(b"started\nok\x00\x00\x00\x00\n" + b"more text here\n" * 50)
    (tmp_path / "fine.txt").write_text("plain notes\n" * 50)
    (tmp_path / "more.txt").write_text("more notes\n" * 50)
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path),)))
    assert sorted(corpus.train_ids + corpus.val_ids) == ["fine.txt", "more.txt"]
    assert not any("\x00" in text for text in corpus.train + corpus.val)
    assert corpus.skipped_at == {"log.txt": "line 2, column 3, a NUL byte: binary data, not text",
                                 "nobom.txt": "UTF-16 without a byte-order mark: every other byte is NUL",
                                 "zeros.txt": "line 1, column 1, a NUL byte: binary data, not text"}
    with pytest.raises(DataError, match=r"^training.data.paths: no text to train on in the given files; left out as "
                                        r"not UTF-8 text: nobom.txt \(UTF-16 without a byte-order mark: every other "
                                        r"byte is NUL\) \(files are read as UTF-8 text, .gz, .bz2 and .xz ones "
                                        r"decompressed\)$"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "nobom.txt"),)))


def test_a_file_that_is_not_utf8_is_named_with_where_and_what_it_is(tmp_path: Path) -> None:
    # the error, not only the warning, says where a file stops being UTF-8 and how to fix it;
    # a gzip file named .txt or an image given as text is named as what it is
    import gzip

    (tmp_path / "latin.txt").write_bytes("notes\ncafé au lait\n".encode("latin-1"))
    (tmp_path / "notes.txt").write_bytes(gzip.compress(b"notes\n" * 50))
    (tmp_path / "pic.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff")
    with pytest.raises(DataError, match=r"^training.data.paths: no text to train on in the given files; left out as "
                                        r"not UTF-8 text: latin.txt \(line 2, column 4, byte 0xe9\) \(files are read "
                                        r"as UTF-8 text, .gz, .bz2 and .xz ones decompressed: save a Latin-1 file as "
                                        r"UTF-8 with `iconv -f latin1 -t utf-8`\)$"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "latin.txt"),)))
    (tmp_path / "latin.txt").unlink()
    with pytest.raises(DataError) as info:
        files_corpus(FilesDataSpec(paths=(str(tmp_path),)))
    assert ("notes.txt (gzip-compressed data: name it notes.txt.gz to have it read decompressed), pic.txt (a PNG "
            "image, not text)") in str(info.value)
    (tmp_path / "notes.txt").rename(tmp_path / "notes.txt.gz")  # named so, it is read
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path),)))
    assert corpus.skipped == ["pic.txt"] and "".join(corpus.train + corpus.val) == "notes\n" * 50


def test_where_a_file_stops_being_text_counts_old_mac_line_ends_as_lines(tmp_path: Path) -> None:
    # line and column as an editor (and open()) counts them: a lone \r ends a line, as \n and \r\n do
    from specformer.data.corpus import read_texts

    for name, end in (("lf.txt", "\n"), ("crlf.txt", "\r\n"), ("cr.txt", "\r")):
        (tmp_path / name).write_bytes(end.join(["notes", "more notes", "café au lait", ""]).encode("latin-1"))
        (tmp_path / f"nul-{name}").write_bytes(end.join(["notes", "ok\0\0", ""]).encode() + b"more text\n" * 50)
    (tmp_path / "fine.txt").write_text("plain notes\n" * 50)
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path),)))
    assert corpus.skipped_at == {**{name: "line 3, column 4, byte 0xe9" for name in ("cr.txt", "crlf.txt", "lf.txt")},
                                 **{f"nul-{name}": "line 2, column 3, a NUL byte: binary data, not text"
                                    for name in ("cr.txt", "crlf.txt", "lf.txt")}}
    with pytest.raises(DataError, match=r"^setting: .*cr.txt:3:4: not UTF-8 text \(byte 0xe9\)"):
        list(read_texts((str(tmp_path / "cr.txt"),), "setting", []))
    with pytest.raises(DataError, match=r"^setting: .*nul-cr.txt:2:3: not text, a NUL byte"):
        list(read_texts((str(tmp_path / "nul-cr.txt"),), "setting", []))


def test_val_paths_that_give_no_text_are_an_error_naming_them(tmp_path: Path) -> None:
    # not a validation split of 0 tokens, nor (one training file left) the token cache's entry of
    # that file split by lines: its last lines were validated on instead of the val_paths given
    (tmp_path / "train.txt").write_text("plain notes\n" * 50)
    (tmp_path / "valid.txt").write_bytes("café\n".encode("latin-1") * 20)
    (tmp_path / "blank.txt").write_text("\n  \n")
    spec = FilesDataSpec(paths=(str(tmp_path / "train.txt"),), val_paths=(str(tmp_path / "valid.txt"),))
    with pytest.raises(DataError, match=r"^training.data.val_paths: no text to validate on in the given files; left "
                                        r"out as not UTF-8 text: valid.txt \(line 1, column 4, byte 0xe9\)"):
        files_corpus(spec)
    with pytest.raises(DataError, match=r"^training.data.val_paths: no text to validate on in the given files; "
                                        r"empty \(or only whitespace\): blank.txt$"):
        files_corpus(spec.model_copy(update={"val_paths": (str(tmp_path / "blank.txt"),)}))
    # a training error lists the training files alone
    with pytest.raises(DataError, match=r"^training.data.paths: no text to train on in the given files; left out as "
                                        r"not UTF-8 text: valid.txt \(line 1, column 4, byte 0xe9\) \(files"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "valid.txt"),), val_paths=(str(tmp_path / "blank.txt"),)))


def test_json_lines_with_old_mac_line_ends_are_read_line_by_line(tmp_path: Path) -> None:
    # Python's open() ends a line at a lone \r too, as a plain text file's lines are read:
    # the same documents as \n and \r\n, not 'Extra data' on one long line
    lines = [json.dumps({"text": f"document {i}"}) for i in range(20)]
    for name, end in (("lf", "\n"), ("crlf", "\r\n"), ("cr", "\r")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "docs.jsonl").write_text(end.join(lines) + end + end, newline="")
    read = [files_corpus(FilesDataSpec(paths=(str(tmp_path / name / "docs.jsonl"),))) for name in ("lf", "crlf", "cr")]
    assert sorted(read[0].train_ids + read[0].val_ids) == sorted(f"docs.jsonl:{i}" for i in range(1, 21))
    assert all((c.train, c.val, c.train_ids, c.val_ids, c.fingerprint) == (read[0].train, read[0].val,
               read[0].train_ids, read[0].val_ids, read[0].fingerprint) for c in read)
    (tmp_path / "cr" / "docs.jsonl").write_text("\r".join(lines[:3] + ['{"text": 3}']), newline="")
    with pytest.raises(DataError, match=r"docs.jsonl:4: .*'text'"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "cr" / "docs.jsonl"),)))


@pytest.mark.parametrize("kind", ["csv", "tsv"])
def test_tables_with_old_mac_line_ends_are_read_row_by_row(tmp_path: Path, kind: str) -> None:
    # the csv module (newline='') ends a row at a lone \r as at \n and \r\n: the same rows, the
    # same line numbers in errors, a quoted line end kept as the text's own
    from specformer.data.labelled import labelled_corpus
    from specformer.specs.training import LabelledDataSpec

    sep = "," if kind == "csv" else "\t"
    rows = [f"review {i}{sep}{'pos' if i % 2 else 'neg'}" for i in range(40)]
    read = {}
    for name, end in (("lf", "\n"), ("crlf", "\r\n"), ("cr", "\r")):
        table = tmp_path / name / f"t.{kind}"
        table.parent.mkdir()
        table.write_text(end.join([f"text{sep}label", *rows, f'"two{end}lines"{sep}pos']) + end, newline="")
        labelled = labelled_corpus(LabelledDataSpec(type="labelled", paths=(str(table),)))
        documents = files_corpus(FilesDataSpec(paths=(str(table),)))
        read[name] = (sorted(labelled.train + labelled.val), sorted(documents.train + documents.val))
    assert read["lf"] == read["crlf"] == read["cr"]
    assert len(read["cr"][0]) == 41 and ("two\nlines", "pos") in read["cr"][0] and "two\nlines" in read["cr"][1]
    table = tmp_path / "cr" / f"t.{kind}"
    table.write_text("\r".join([f"text{sep}label", *rows[:2], f"a{sep}b{sep}c", *rows[2:4]]), newline="")
    with pytest.raises(DataError, match=rf"t.{kind}:4: 3 .*-separated fields, and the header row names 2"):
        labelled_corpus(LabelledDataSpec(type="labelled", paths=(str(table),)))
    if kind == "tsv":  # a stray quote that runs on over lone \r line ends is refused as over \n ones
        table.write_text('text\tlabel\rplain one\tneg\r"Awful\tneg\rplain two\tpos\rplain three"\tneg\rfour\tpos\r',
                         newline="")
        for read_table in (lambda: labelled_corpus(LabelledDataSpec(type="labelled", paths=(str(table),))),
                           lambda: files_corpus(FilesDataSpec(paths=(str(table),)))):
            with pytest.raises(DataError, match=r"t.tsv:3: a field that starts with '\"' is read as quoted text up "
                                                r"to the next '\"', and this one runs on to line 5, reading lines 3-5"):
                read_table()


def test_a_file_that_cannot_be_read_is_named_as_such_not_as_not_utf8(tmp_path: Path) -> None:
    # a dangling symbolic link named in paths (a dataset moved away): what is wrong is said, not "not UTF-8"
    (tmp_path / "fine.txt").write_text("plain notes\n" * 50)
    (tmp_path / "moved.txt").symlink_to(tmp_path / "gone" / "moved.txt")
    paths = (str(tmp_path / "moved.txt"), str(tmp_path / "fine.txt"))
    corpus = files_corpus(FilesDataSpec(paths=paths))
    assert corpus.skipped == []
    assert corpus.unreadable == [f"moved.txt (a symbolic link to {tmp_path / 'gone' / 'moved.txt'}, which does not "
                                 "exist)"]
    assert "".join(corpus.train + corpus.val) == "plain notes\n" * 50  # the one readable file, whole
    with pytest.raises(DataError, match=r"^training.data.paths: no text to train on in the given files; cannot be "
                                        r"read: moved.txt \(a symbolic link to .*gone/moved.txt, which does not "
                                        r"exist\)$"):
        files_corpus(FilesDataSpec(paths=paths[:1]))


def test_csv_tsv_and_json_files_give_one_document_per_row(tmp_path: Path) -> None:
    # a table's text_field column (a header row names them; quoted commas and newlines are
    # the text's), a JSON array's objects, or JSON lines in a .json file: never the markup
    (tmp_path / "rows.csv").write_text("id,text\n" + "".join(f'{i},"row {i}, with a comma"\n' for i in range(30))
                                       + '30,"two\nlines"\n31,\n')
    (tmp_path / "rows.tsv").write_text("text\tlabel\n" + "".join(f"tab row {i}\t{i % 2}\n" for i in range(5)))
    (tmp_path / "records.json.gz").write_bytes(__import__("gzip").compress(
        json.dumps([{"text": f"record {i}"} for i in range(5)]).encode()))
    (tmp_path / "lines.json").write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(5)))
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path),)))
    documents = sorted([*corpus.train, *corpus.val])
    assert len(documents) == 31 + 5 + 5 + 5  # the empty row 31 is dropped
    assert "row 7, with a comma" in documents and "two\nlines" in documents
    assert {"tab row 0", "record 4", "line 2"} <= set(documents)
    assert not any("," in d and d.startswith(("id", "0,")) or "{" in d for d in documents)
    keys = {*corpus.train_ids, *corpus.val_ids}
    assert {"rows.csv:2", "rows.csv:33", "rows.tsv:2", "records.json.gz:1", "lines.json:5"} <= keys  # line / item
    assert corpus.notes == []


def test_a_csv_document_past_the_csv_modules_field_limit_is_read(tmp_path: Path) -> None:
    import csv

    long = "word " * 40_000  # 200,000 characters: the csv module refuses a field past 131,072
    with (tmp_path / "docs.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["text"], [long], ["short"]])
    limit = csv.field_size_limit()
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path / "docs.csv"),)))
    assert sorted([*corpus.train, *corpus.val]) == sorted([long, "short"])
    assert csv.field_size_limit() == limit  # as it was


def test_a_table_without_the_text_column_names_the_one_to_read(tmp_path: Path) -> None:
    (tmp_path / "reviews.csv").write_text("id,stars,review\n1,5,a long review of the product\n2,1,too short\n")
    with pytest.raises(DataError) as err:
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "reviews.csv"),)))
    assert str(err.value) == (
        f"training.data.paths: {tmp_path / 'reviews.csv'}:1: no 'text' column (training.data.text_field); the "
        "header row has 'id', 'stars', 'review': to read its 'review', set training.data.text_field=review (or "
        "another of its text columns)"
    )
    assert len(files_corpus(FilesDataSpec(paths=(str(tmp_path / "reviews.csv"),), text_field="review")).train) >= 1
    (tmp_path / "items.json").write_text('[{"text": "fine"}, ["not", "an", "object"]]')
    with pytest.raises(DataError, match=r"items.json: item 2 is a JSON list, not an object"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "items.json"),)))
    (tmp_path / "short.csv").write_text("id,text\n1,ok\n2\n")
    with pytest.raises(DataError, match=r"short.csv:3: the row ends before its 'text' column"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "short.csv"),)))


def test_files_split_does_not_move_when_other_paths_are_added(tmp_path: Path) -> None:
    # keys are relative to the pattern that found each file, not to a root of all files
    (tmp_path / "corpus" / "sub").mkdir(parents=True)
    for i in range(12):
        (tmp_path / "corpus" / "sub" / f"f{i}.txt").write_text(f"document {i}\n" * 20)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "g.txt").write_text("elsewhere\n" * 20)
    alone = files_corpus(FilesDataSpec(paths=(str(tmp_path / "corpus" / "sub" / "*.txt"),), val_fraction=0.3))
    more = files_corpus(FilesDataSpec(paths=(str(tmp_path / "corpus" / "sub" / "*.txt"), str(tmp_path / "other" / "g.txt")),
                                      val_fraction=0.3))
    assert set(alone.val_ids) == set(more.val_ids) - {"g.txt"}
    assert set(alone.train_ids) == set(more.train_ids) - {"g.txt"}
    # the same files found through their directory or a ** glob have the same keys
    by_dir = files_corpus(FilesDataSpec(paths=(str(tmp_path / "corpus"),), val_fraction=0.3))
    by_glob = files_corpus(FilesDataSpec(paths=(str(tmp_path / "corpus" / "**" / "*.txt"),), val_fraction=0.3))
    assert by_dir.val_ids == by_glob.val_ids and "sub/f0.txt" in by_dir.train_ids + by_dir.val_ids


def test_a_directory_leaves_out_hidden_files_and_reports_non_utf8_ones(tmp_path: Path) -> None:
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text(f"{name} text\n" * 20)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / ".notes.txt").write_text("private\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("")
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path),), val_fraction=0.3))
    assert sorted(corpus.train_ids + corpus.val_ids) == ["a.txt", "b.txt", "c.txt"]
    assert corpus.skipped == ["latin1.txt"]
    assert corpus.documents == f"3 documents ({len(corpus.val)} held out)"
    (tmp_path / "a.txt").unlink(), (tmp_path / "b.txt").unlink(), (tmp_path / "c.txt").unlink()
    with pytest.raises(DataError, match="no text to train on.*empty .*: empty.txt; left out as not UTF-8 text: latin1.txt"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path),)))


def test_a_few_files_hold_out_a_whole_one_whatever_val_fraction_says(tmp_path: Path) -> None:
    # as docs/training.md and val_fraction's description say: 1 of 4 files, a quarter of the text
    for i in range(4):
        (tmp_path / f"part{i}.txt").write_text(f"part {i}\n" * 50)
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path),), val_fraction=0.05))
    assert (len(corpus.train), len(corpus.val)) == (3, 1)
    assert corpus.documents == "4 documents (1 held out)"


def test_val_paths_name_the_validation_files_and_leave_them_out_of_paths(tmp_path: Path) -> None:
    data = tmp_path / "wikitext"
    data.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        (data / name).write_text(f"{name} line\n" * 40)
    (data / "more.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(3)))
    # the whole folder, one file of it validating (given alone, not in a list)
    spec = FilesDataSpec.model_validate({"paths": str(data), "val_paths": str(data / "valid.txt")})
    corpus = files_corpus(spec)
    assert corpus.val_ids == ["valid.txt"] and corpus.val == ["valid.txt line\n" * 40]
    assert corpus.train_ids == ["more.jsonl:1", "more.jsonl:2", "more.jsonl:3", "test.txt", "train.txt"]
    assert corpus.documents == "6 documents (1 held out)"
    # one training file: not split inside it; a JSON-lines file validating gives its lines
    one = files_corpus(FilesDataSpec(paths=(str(data / "train.txt"),), val_paths=(str(data / "more.jsonl"),)))
    assert one.train == ["train.txt line\n" * 40] and not one.split_by_lines
    assert one.val == ["doc 0", "doc 1", "doc 2"]
    # the split is in the cache key: the same files split the other way read as other data
    swapped = files_corpus(FilesDataSpec(paths=(str(data / "more.jsonl"),), val_paths=(str(data / "train.txt"),)))
    both = files_corpus(FilesDataSpec(paths=(str(data / "train.txt"), str(data / "more.jsonl")), val_fraction=0.5))
    assert len({one.fingerprint, swapped.fingerprint, both.fingerprint}) == 3
    with pytest.raises(DataError, match="training.data.val_paths: nothing matches 'nope.txt'"):
        files_corpus(FilesDataSpec(paths=(str(data),), val_paths=("nope.txt",)))
    with pytest.raises(DataError, match=r"training.data.paths: every file it finds \(valid.txt\) is in "
                                        "training.data.val_paths"):
        files_corpus(FilesDataSpec(paths=(str(data / "valid.txt"),), val_paths=(str(data / "*.txt"),)))
    # as for pairs: val_fraction is not used when val_paths is given
    given = files_corpus(FilesDataSpec(paths=(str(data),), val_paths=(str(data / "valid.txt"),), val_fraction=0.9))
    assert given.val_ids == ["valid.txt"]


def test_empty_files_are_called_empty_not_unreadable(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(DataError) as info:
        files_corpus(FilesDataSpec(paths=(str(tmp_path),)))
    message = str(info.value)
    assert "empty (or only whitespace): blank.txt, empty.txt" in message
    assert "UTF-8" not in message  # both files are valid UTF-8: nothing was left out as unreadable
    (tmp_path / "blank.txt").unlink()
    (tmp_path / "one.txt").write_text("\n\n\nthe only line")  # one document: its last line is validation
    with pytest.raises(DataError, match="one.txt has text only in its last lines"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "one.txt"),)))


def test_a_single_file_is_split_inside_it(tmp_path: Path) -> None:
    lines = [f"line {i}\n" for i in range(100)]
    (tmp_path / "input.txt").write_text("".join(lines))
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path / "input.txt"),), val_fraction=0.1))
    assert corpus.train == ["".join(lines[:90])] and corpus.val == ["".join(lines[90:])]
    assert corpus.val_ids == ["input.txt (last lines)"]
    assert corpus.documents == "1 document (its last lines held out)"  # what the data line says
    (tmp_path / "one-line.txt").write_text("x" * 1000)
    one = files_corpus(FilesDataSpec(paths=(str(tmp_path / "one-line.txt"),), val_fraction=0.2))
    assert one.train == ["x" * 800] and one.val == ["x" * 200]


def test_windows_line_ends_and_a_byte_order_mark_are_read_as_plain_text(tmp_path: Path) -> None:
    # files saved on Windows: CRLF line ends, and Notepad's UTF-8 BOM before the first line
    lines = [f"line {i} naïve café\n" for i in range(40)]
    (tmp_path / "unix.txt").write_text("".join(lines), encoding="utf-8")
    (tmp_path / "windows.txt").write_bytes("".join(lines).replace("\n", "\r\n").encode("utf-8-sig"))
    (tmp_path / "mac.txt").write_bytes("".join(lines).replace("\n", "\r").encode())
    texts = {}
    for name in ("unix.txt", "windows.txt", "mac.txt"):
        corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path / name),), val_fraction=0.1))
        texts[name] = corpus.train + corpus.val
    assert texts["windows.txt"] == texts["unix.txt"] == texts["mac.txt"]
    assert texts["unix.txt"] == ["".join(lines[:36]), "".join(lines[36:])]


def test_compressed_files_are_read_as_the_text_inside(tmp_path: Path) -> None:
    import bz2
    import gzip
    import lzma

    lines = [f"line {i} of the notes, 東京\n" for i in range(50)]
    text = "".join(lines).encode()
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text))
    (tmp_path / "b.txt.bz2").write_bytes(bz2.compress(text))
    (tmp_path / "c.txt.xz").write_bytes(lzma.compress(text))
    (tmp_path / "d.txt").write_bytes(text)
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path),), val_fraction=0.3))
    assert sorted(corpus.train_ids + corpus.val_ids) == ["a.txt.gz", "b.txt.bz2", "c.txt.xz", "d.txt"]
    assert corpus.train + corpus.val == ["".join(lines)] * 4 and corpus.skipped == []
    # a damaged archive is named, not left out in silence
    (tmp_path / "e.txt.gz").write_bytes(gzip.compress(text)[:40])
    with pytest.raises(DataError, match=r"^training.data.paths: .*e.txt.gz is not a readable gzip file \(.+\)$"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path),)))


def test_json_lines_files_give_one_document_per_line_from_the_text_field(tmp_path: Path) -> None:
    import gzip
    import json

    docs = [f"document {i}: a line\nand another, naïve\u2028still the same document" for i in range(60)]
    lines = [json.dumps({"id": i, "text": d}, ensure_ascii=i % 2 == 0) for i, d in enumerate(docs)]
    lines.insert(5, "")  # blank lines are skipped
    lines.insert(9, json.dumps({"text": ""}))  # an empty document is dropped, as an empty file is
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("\r\n".join(lines) + "\r\n", encoding="utf-8-sig")
    (tmp_path / "data" / "more.ndjson.gz").write_bytes(gzip.compress(json.dumps({"text": "zipped doc"}).encode()))
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path / "data"),), val_fraction=0.2))
    assert sorted(corpus.train + corpus.val) == sorted([*docs, "zipped doc"])  # the text, not the JSON around it
    assert 5 <= len(corpus.val) <= 20
    assert "train.jsonl:1" in corpus.train_ids + corpus.val_ids and "more.ndjson.gz:1" in corpus.train_ids + corpus.val_ids
    assert "train.jsonl:6" not in corpus.train_ids + corpus.val_ids  # the blank line
    # another field by setting; the key of the cached tokens follows it
    (tmp_path / "other.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    other = files_corpus(FilesDataSpec(paths=(str(tmp_path / "other.jsonl"),), text_field="body"))
    assert sorted(other.train + other.val) == sorted(docs)
    (tmp_path / "same.jsonl").write_text("".join(json.dumps({"body": d, "text": d}) + "\n" for d in docs))
    body, text = (files_corpus(FilesDataSpec(paths=(str(tmp_path / "same.jsonl"),), text_field=f)) for f in ("body", "text"))
    assert body.train == text.train and body.fingerprint != text.fingerprint


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"body": "x", "id": 3}', r"no 'text' field \(training.data.text_field\); this line has 'body', 'id': to "
                                   r"read its 'body', set training.data.text_field=body$"),
        ('{"id": 3, "title": "t", "body": "x"}', r"no 'text' field \(training.data.text_field\); this line has 'id', "
                                                 r"'title', 'body': to read its 'title', set "
                                                 r"training.data.text_field=title \(or another of its text fields\)$"),
        ('{"id": 3}', r"no 'text' field \(training.data.text_field\); this line has 'id'$"),
        ('{"text": null}', r"'text' \(training.data.text_field\) is null, not a string"),
        ('{"text": ["a", "b"]}', r"'text' \(training.data.text_field\) is a JSON list, not a string"),
        ('["a", "b"]', r"a JSON list, not an object"),
        ('{"text": "unterminated}', r"not a JSON object \(Unterminated string starting at column 10\)"),
    ],
)
def test_a_json_lines_line_without_its_text_names_the_file_line_and_setting(tmp_path: Path, line: str, says: str) -> None:
    import json

    good = [json.dumps({"text": f"document {i}"}) for i in range(5)]
    (tmp_path / "my data.jsonl").write_text("\n".join([*good[:3], line, *good[3:]]) + "\n")
    with pytest.raises(DataError, match=rf"^training.data.paths: {tmp_path}/my data.jsonl:4: {says}"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path),)))


# --------------------------------------------------------------------------- tokenizers


def test_byte_and_task_tokenizers_round_trip() -> None:
    byte = ByteTokenizer()
    text = "déjà vu — ✓"
    assert byte.decode(byte.encode(text)) == text and byte.vocab_size == 259
    task = TaskTokenizer()
    assert task.decode(task.encode("abc+12=")) == "abc+12="
    assert task.encode("a")[0] >= 5 and task.vocab_size == 44
    for tok in (byte, task):
        assert tokenizer_from_state(tok.state()).encode("a1") == tok.encode("a1")
    # a prompt names special tokens by their strings (as with a BPE); training text does not
    assert byte.encode("<|endoftext|>def <mask>") == [256, *b"def ", 258]
    assert byte.encode("<|endoftext|>def <mask>", specials=False) == list(b"<|endoftext|>def <mask>")


def test_bpe_is_trained_once_and_cached_by_content(tmp_path: Path) -> None:
    corpus = files_corpus(FilesDataSpec(paths=(JSON_GLOB,)))
    spec = BPETokenizerSpec(vocab_size=400)
    tok = bpe_tokenizer(spec, corpus=corpus, cache_dir=tmp_path)
    assert tok.vocab_size == 400 and tok.eot_id is not None and tok.mask_id is not None
    text = corpus.val[0][:500]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()) / 1.2  # 141 merges already compress
    cached = list((tmp_path / "tokenizers").glob("bpe-*.json"))
    assert len(cached) == 1
    again = bpe_tokenizer(spec, corpus=corpus, cache_dir=tmp_path)
    assert again.encode(text) == ids and len(list((tmp_path / "tokenizers").iterdir())) == 1
    bpe_tokenizer(BPETokenizerSpec(vocab_size=300), corpus=corpus, cache_dir=tmp_path)
    assert len(list((tmp_path / "tokenizers").glob("bpe-*.json"))) == 2  # other settings, other entry
    assert tokenizer_from_state(tok.state()).encode(text) == ids


def test_a_bpe_trained_again_removes_what_a_killed_write_left(tmp_path: Path) -> None:
    corpus = files_corpus(FilesDataSpec(paths=(JSON_GLOB,)))
    spec = BPETokenizerSpec(vocab_size=300)
    bpe_tokenizer(spec, corpus=corpus, cache_dir=tmp_path)
    (cached,) = (tmp_path / "tokenizers").glob("bpe-*.json")
    cached.unlink()  # as if the process writing it had been killed: only its temporary file is there
    left = cached.with_name(f".{cached.name}.0123456789abcdef.tmp")
    other = cached.with_name(".bpe-another.json.0123456789abcdef.tmp")  # another entry's: not this write's
    left.write_text("{")
    other.write_text("{")
    bpe_tokenizer(spec, corpus=corpus, cache_dir=tmp_path)
    assert sorted(f.name for f in cached.parent.iterdir()) == sorted([cached.name, other.name])


def test_a_tokenizer_json_template_is_read_from_its_post_processor(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from specformer.data.tokenizers import HFTokenizer

    vocab = {"[CLS]": 0, "[SEP]": 1, "<s>": 2, "</s>": 3, "a": 4, "b": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    assert HFTokenizer(tok).template() == ([], [])  # no post-processor
    tok.post_processor = processors.ByteLevel()  # GPT-2's: adds nothing
    assert HFTokenizer(tok).template() == ([], [])
    cases = {
        "bert": (processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 0), ("[SEP]", 1)]),
                 [0], [1]),
        "llama": (processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)]), [2], []),
        "roberta": (processors.RobertaProcessing(("</s>", 3), ("<s>", 2)), [2], [3]),
    }
    for post, before, after in cases.values():
        tok.post_processor = post
        framed = HFTokenizer(tok)
        assert framed.template() == (before, after)
        assert framed.with_template([5, 4]) == [*before, 5, 4, *after] == tok.encode("b a").ids
        assert framed.encode("b a") == [5, 4]  # encode() is the text's own ids, as training reads it
        assert HFTokenizer.from_str(framed.state()["json"]).template() == (before, after)  # a checkpoint keeps it
        assert {*before, *after} <= framed.special_ids  # never masked by the masked-LM objective
    # specformer's own tokenizers have none: a prompt is its text
    for own in (ByteTokenizer(), TaskTokenizer(), bpe_tokenizer(BPETokenizerSpec(vocab_size=300),
                                                                corpus=files_corpus(FilesDataSpec(paths=(JSON_GLOB,))),
                                                                cache_dir=tmp_path)):
        assert own.template() == ([], []) and own.with_template([7, 8]) == [7, 8]


def test_special_token_strings_in_training_text_stay_text(tmp_path: Path) -> None:
    # a corpus that quotes the special tokens (docs about tokenizers, GPT-2 dumps)
    docs = [f"doc {i}: the model ends with <|endoftext|> and hides words as <mask>, pads <pad>.\n" * 20
            for i in range(30)]
    (tmp_path / "docs").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "docs" / f"{i:02d}.txt").write_text(d)
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path / "docs" / "*.txt"),), val_fraction=0.2))
    tok = bpe_tokenizer(BPETokenizerSpec(vocab_size=320), corpus=corpus, cache_dir=tmp_path / "cache")
    assert tok.mask_id is not None and tok.eot_id is not None and tok.pad_id is not None
    arrays = token_arrays(corpus, tok, cache_dir=tmp_path / "cache")
    stream = np.asarray(arrays.train)
    # the only special ids are the separators between documents, one per document
    assert int((stream == tok.eot_id).sum()) == len(corpus.train)
    assert not np.isin(stream, [tok.mask_id, tok.pad_id]).any()
    first = stream[: int(np.argmax(stream == tok.eot_id))]
    assert tok.decode(first.tolist()) == corpus.train[0]
    # a prompt still names them: what `generate` and `fill-mask` read
    assert tok.mask_id in tok.encode("import <mask>")
    assert tok.mask_id not in tok.encode("import <mask>", specials=False)
    reloaded = tokenizer_from_state(tok.state())
    assert reloaded.encode("a <mask>") == tok.encode("a <mask>")
    assert reloaded.encode("a <mask>", specials=False) == tok.encode("a <mask>", specials=False)


# --------------------------------------------------------------------------- token cache


def test_token_arrays_are_tokenised_once_and_memory_mapped(tmp_path: Path) -> None:
    corpus = files_corpus(FilesDataSpec(paths=(JSON_GLOB,)))
    tok = ByteTokenizer()
    arrays = token_arrays(corpus, tok, tmp_path)
    assert isinstance(arrays.train, np.memmap) and arrays.train.dtype == np.uint16
    assert int((arrays.train == tok.eot_id).sum()) == len(corpus.train)
    assert len(arrays.train) == sum(len(t.encode()) for t in corpus.train) + len(corpus.train)

    class Refuse(ByteTokenizer):
        def encode_batch(self, texts):  # a cache hit must not tokenise again
            raise AssertionError("tokenised twice")

        encode_arrays = encode_batch

    again = token_arrays(corpus, Refuse(), tmp_path)
    assert np.array_equal(again.train, arrays.train)
    assert (arrays.cached, again.cached) == (False, True)


def test_a_tokenizer_json_template_frames_each_document_in_the_token_stream(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from specformer.data.tokenizers import HFTokenizer

    def char_level(specials: list[str], post: Any) -> HFTokenizer:
        vocab = {**{t: i for i, t in enumerate(specials)}, **{chr(c): len(specials) + c for c in range(32, 127)}}
        tok = Tokenizer(models.WordLevel(vocab, unk_token=specials[-1]))
        tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
        tok.add_special_tokens(specials)
        tok.post_processor = post
        return HFTokenizer(tok)

    corpus = files_corpus(FilesDataSpec(paths=(JSON_GLOB,)))
    # Llama's template puts <s> before each document; the end-of-text </s> follows it, as Llama was trained
    llama = char_level(["<s>", "</s>", "<unk>"], processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)]))
    docs = [llama.encode(t, specials=False) for t in corpus.train]
    assert (llama.bos_id, llama.eot_id) == (0, 1)
    assert token_arrays(corpus, llama, tmp_path).train.tolist() == [i for d in docs for i in [0, *d, 1]]
    # BERT's ends each document with [SEP], its end-of-text: not a second one
    bert = char_level(["[CLS]", "[SEP]", "[UNK]"], processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 0), ("[SEP]", 1)]))
    assert (bert.bos_id, bert.eot_id) == (0, 1)
    assert token_arrays(corpus, bert, tmp_path).train.tolist() == [i for d in docs for i in [0, *d, 1]]
    # without a template, each document is its text then the end-of-text id, as with specformer's own tokenizers
    plain = char_level(["<s>", "</s>", "<unk>"], None)
    assert token_arrays(corpus, plain, tmp_path).train.tolist() == [i for d in docs for i in [*d, 1]]
    # specformer's own tokenizers keep their cache entries; a templated stream is not read from an entry made
    # before documents were framed (the same tokenizer.json, the same key otherwise)
    import tokenizers

    from specformer import __version__
    from specformer.data.cache import content_hash

    def unframed_key(tok: Any) -> str:
        return content_hash("tokens", "literal-specials", corpus.fingerprint, tok.fingerprint(), tokenizers.__version__,
                            __version__)

    assert token_arrays(corpus, ByteTokenizer(), tmp_path).path.name == unframed_key(ByteTokenizer())
    assert token_arrays(corpus, plain, tmp_path).path.name == unframed_key(plain)
    assert token_arrays(corpus, llama, tmp_path).path.name != unframed_key(llama)


@pytest.mark.parametrize("damage", ["truncated train.bin", "missing val.bin", "garbled meta.json"])
def test_a_damaged_token_cache_entry_is_made_again(tmp_path: Path, damage: str) -> None:
    corpus = files_corpus(FilesDataSpec(paths=(JSON_GLOB,)))
    first = np.array(token_arrays(corpus, ByteTokenizer(), tmp_path).train)
    (entry,) = (tmp_path / "tokens").iterdir()
    if damage == "truncated train.bin":
        os.truncate(entry / "train.bin", 1000)
    elif damage == "missing val.bin":
        (entry / "val.bin").unlink()
    else:
        (entry / "meta.json").write_text('{"dtype": "uint16", "corp')
    again = token_arrays(corpus, ByteTokenizer(), tmp_path)  # not an mmap or JSON error
    assert np.array_equal(np.array(again.train), first)
    assert not again.cached


def test_a_full_disk_leaves_no_partial_cache_file_and_names_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = files_corpus(FilesDataSpec(paths=(JSON_GLOB,)))

    def full(fd: int) -> None:  # a disk that fills up before the data reaches it
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DataError) as caught:
        token_arrays(corpus, ByteTokenizer(), tmp_path)
    (entry,) = (tmp_path / "tokens").iterdir()
    assert str(caught.value) == (
        f"training.cache_dir: cannot write the token cache {entry} (No space left on device); nothing was "
        "half-written: free space there, or set training.cache_dir (or $SPECFORMER_CACHE) to another folder"
    )
    with pytest.raises(DataError, match=r"cannot write the trained tokenizer .*bpe-\w+\.json \(No space left"):
        bpe_tokenizer(BPETokenizerSpec(vocab_size=300), corpus=corpus, cache_dir=tmp_path)
    # no temporary file fills the disk further (the entries' empty lock files stay)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []

    def read_only(fd: int) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "fsync", read_only)  # a folder that cannot be written: no room to make is not the advice
    with pytest.raises(DataError, match=r"\(Read-only file system\); nothing was half-written: set "
                                        r"training.cache_dir \(or \$SPECFORMER_CACHE\) to a folder that can be written"):
        token_arrays(corpus, ByteTokenizer(), tmp_path)
    monkeypatch.undo()
    arrays = token_arrays(corpus, ByteTokenizer(), tmp_path)
    assert arrays.train[: len(corpus.train[0].encode())].tobytes() == np.frombuffer(
        corpus.train[0].encode(), dtype=np.uint8
    ).astype(np.uint16).tobytes()


def test_a_killed_writers_temporary_files_are_removed_when_the_entry_is_made_again(tmp_path: Path) -> None:
    corpus = files_corpus(FilesDataSpec(paths=(JSON_GLOB,)))
    first = np.array(token_arrays(corpus, ByteTokenizer(), tmp_path).train)
    (entry,) = (tmp_path / "tokens").iterdir()
    # a process SIGKILLed while writing: its temporary copy stays, and the entry is incomplete
    (entry / ".train.bin.0123456789abcdef.tmp").write_bytes(b"\0" * 4096)
    (entry / "meta.json").unlink()
    again = token_arrays(corpus, ByteTokenizer(), tmp_path)
    assert np.array_equal(np.array(again.train), first)
    assert sorted(p.name for p in entry.iterdir()) == [".lock", "meta.json", "train.bin", "val.bin"]


def test_the_same_corpus_tokenised_twice_at_once_is_tokenised_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time

    from specformer.data import tokens

    corpus = files_corpus(FilesDataSpec(paths=(JSON_GLOB,)))
    calls, tokenize = [], tokens.write_token_stream

    def slow(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        time.sleep(0.3)  # long enough for the other to arrive while this one works
        return tokenize(*args, **kwargs)

    monkeypatch.setattr(tokens, "write_token_stream", slow)
    results: list[np.ndarray] = []
    # two threads stand for two processes: the entry's lock (flock) is taken per opened file
    workers = [
        threading.Thread(target=lambda: results.append(np.array(token_arrays(corpus, ByteTokenizer(), tmp_path).train)))
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(calls) == 2  # the train and the validation split, once: the second waited and read the entry
    assert len(results) == 2 and np.array_equal(results[0], results[1])

    # a BPE trained by two at once likewise: the second waits for the first's and reads it
    from specformer.data import tokenizers

    trained, train_bpe = [], tokenizers._train_bpe

    def slow_bpe(*args: Any, **kwargs: Any) -> Any:
        trained.append(1)
        time.sleep(0.3)
        return train_bpe(*args, **kwargs)

    monkeypatch.setattr(tokenizers, "_train_bpe", slow_bpe)
    vocabularies: list[dict] = []
    workers = [
        threading.Thread(target=lambda: vocabularies.append(
            bpe_tokenizer(BPETokenizerSpec(vocab_size=300), corpus=corpus, cache_dir=tmp_path).tok.get_vocab()))
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(trained) == 1 and len(vocabularies) == 2 and vocabularies[0] == vocabularies[1]


def test_a_run_waiting_for_another_process_to_prepare_the_data_says_so(tmp_path: Path) -> None:
    """A run whose cache entry another process was making (a sweep sharing a cache_dir, or a
    run stopped with Ctrl-Z holding the lock) waited without a word: it looked hung."""
    import threading
    import time
    from contextlib import contextmanager

    from specformer.data import progress
    from specformer.data.cache import locked, made_once

    lock, steps = tmp_path / "locks" / "entry.lock", []

    @contextmanager
    def reporter(description: str, total: int | None) -> Any:
        steps.append(description)
        yield lambda done: None

    lock.parent.mkdir()
    with locked(lock):  # another process's: flock is taken per opened file
        result: list[str] = []

        def run() -> None:
            with progress.reporting(reporter):
                result.append(made_once(lock, lambda: None, lambda alone: f"made, alone={alone}", what="the token cache"))

        worker = threading.Thread(target=run)
        worker.start()
        time.sleep(0.3)
        assert worker.is_alive() and steps == [f"waiting for another process preparing the token cache (it holds {lock})"]
    worker.join()
    assert result == ["made, alone=True"]
    steps.clear()  # a lock no one holds: no wait, nothing said
    with progress.reporting(reporter):
        assert made_once(lock, lambda: None, lambda alone: "again", what="the token cache") == "again"
    assert steps == []


def test_another_tokenizers_release_tokenises_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the library that encodes is part of the cache key: its next release may split differently
    import tokenizers

    corpus = files_corpus(FilesDataSpec(paths=(JSON_GLOB,)))
    token_arrays(corpus, ByteTokenizer(), tmp_path)
    monkeypatch.setattr(tokenizers, "__version__", "999.0.0")
    token_arrays(corpus, ByteTokenizer(), tmp_path)
    assert len(list((tmp_path / "tokens").iterdir())) == 2


def test_unigram_cross_entropy_matches_its_definition() -> None:
    train = np.array([0, 0, 0, 1, 1, 2])
    val = np.array([0, 0, 1, 3])
    counts = np.array([3, 2, 1, 0]) + 1.0
    p = counts / counts.sum()
    expected = -np.mean(np.log(p[[0, 0, 1, 3]]))
    assert expected < np.log(4)
    assert unigram_cross_entropy(train, val, 4) == pytest.approx(expected)
    # validation tokens training rarely has (another language held out) score worse than a
    # uniform guess: the baseline is the better of the two, never above ln V
    train = np.zeros(10_000, dtype=np.int64)
    val = np.arange(1, 100)
    smoothed = -np.mean(np.log(1.0 / (10_000 + 512)))
    assert smoothed > np.log(512) and unigram_cross_entropy(train, val, 512) == pytest.approx(np.log(512))


@pytest.mark.parametrize("objective", ["causal_lm", "masked_lm"])
def test_the_unigram_baseline_is_measured_on_the_tokens_validation_scores(tmp_path: Path, objective: str) -> None:
    # validation reads val_batches x batch_size blocks; the baseline it is compared with
    # must cover those tokens, not the whole held-out split
    from specformer import load_spec
    from specformer.data.module import prepare

    kind, preset = ("decoder", "gpt-nano") if objective == "causal_lm" else ("encoder", "bert-nano")
    spec = load_spec(preset, [f"training.cache_dir={tmp_path}", "training.tokenizer={type: byte}",
                              "vocab_size=259", "training.batch_size=2", "training.seq_len=32",
                              "training.val_batches=3", f"training.data={{type: files, paths: ['{JSON_GLOB}']}}"])
    data = prepare(spec)
    assert spec.kind == kind and len(data.val) > 6
    # the data line says when the ids were read from the cache
    assert prepare(spec).description == data.description + "; token ids read from the cache"
    blocks = [data.val[(-1, i)][1] for i in range(6)]  # the 3 batches of 2 that validation reads
    shift = 1 if objective == "causal_lm" else 0
    scored = np.concatenate([b[shift:] for b in blocks])
    assert data.unigram_loss == pytest.approx(
        unigram_cross_entropy(data.train.tokens, scored, data.tokenizer.vocab_size))
    assert data.unigram_loss != pytest.approx(
        unigram_cross_entropy(data.train.tokens, data.val.tokens, data.tokenizer.vocab_size))


def test_the_unigram_baseline_covers_every_process_share_of_validation(tmp_path: Path) -> None:
    # with 2 processes each of the val_batches global batches holds 2 x batch_size blocks
    from types import SimpleNamespace

    from specformer import load_spec
    from specformer.data.module import SpecDataModule

    spec = load_spec("gpt-nano", [f"training.cache_dir={tmp_path}", "training.tokenizer={type: byte}",
                                  "vocab_size=259", "training.batch_size=2", "training.seq_len=32",
                                  "training.val_batches=3", f"training.data={{type: files, paths: ['{JSON_GLOB}']}}"])
    dm = SpecDataModule(spec)
    dm.setup()
    assert dm.data is not None and len(dm.data.val) > 12
    dm.trainer = SimpleNamespace(global_rank=0, world_size=2, global_step=0, accumulate_grad_batches=1)
    dm.val_dataloader()
    scored = np.concatenate([dm.data.val[(-1, i)][1][1:] for i in range(12)])  # 3 global batches of 2 x 2
    assert dm.data.unigram_loss == pytest.approx(
        unigram_cross_entropy(dm.data.train.tokens, scored, dm.data.tokenizer.vocab_size))


# --------------------------------------------------------------------------- collators


def test_causal_collator_shifts_by_one() -> None:
    blocks = [(0, np.arange(6)), (0, np.arange(10, 16))]
    batch = CausalLMCollator()(blocks)
    assert batch["input_ids"].tolist()[0] == [0, 1, 2, 3, 4]
    assert batch["labels"].tolist()[1] == [11, 12, 13, 14, 15]


def test_masked_lm_collator_follows_bert() -> None:
    rng = np.random.default_rng(0)
    x = [(5, rng.integers(10, 500, size=512)) for _ in range(32)]
    x[0][1][:10] = 3  # special tokens are never chosen
    collate = MaskedLMCollator(MaskedLMSpec(), mask_id=2, vocab_size=500, special_ids=[1, 2, 3], seed=0)
    batch = collate(x)
    original = torch.from_numpy(np.stack([b for _, b in x]))
    chosen = batch["labels"] != IGNORE_INDEX
    assert chosen.float().mean().item() == pytest.approx(0.15, abs=0.01)
    assert not chosen[0, :10].any()
    assert torch.equal(batch["labels"][chosen], original[chosen])
    assert torch.equal(batch["input_ids"][~chosen], original[~chosen])
    masked = (batch["input_ids"] == 2) & chosen
    kept = (batch["input_ids"] == original) & chosen
    n = chosen.sum().item()
    assert masked.sum().item() / n == pytest.approx(0.8, abs=0.03)
    assert kept.sum().item() / n == pytest.approx(0.1 + 0.1 / 500, abs=0.03)
    # the same batch position gives the same masks (workers, resume); another gives others
    assert torch.equal(collate(x)["input_ids"], batch["input_ids"])
    other = collate([(6, b) for _, b in x])
    assert not torch.equal(other["input_ids"], batch["input_ids"])


def test_masked_lm_collator_predicts_at_least_one_token_of_every_row() -> None:
    # short blocks (seq_len 4): at 15% most rows would have nothing to predict, and a batch
    # of such rows no loss at all (NaN in the logs and the summary's train loss)
    rng = np.random.default_rng(0)
    x = [(p, rng.integers(10, 500, size=4)) for p in range(64)]
    x[0][1][:] = 3  # a row of special tokens only has nothing to choose
    collate = MaskedLMCollator(MaskedLMSpec(), mask_id=2, vocab_size=500, special_ids=[1, 2, 3], seed=0)
    for position in range(8):
        chosen = collate([(position, b) for _, b in x])["labels"] != IGNORE_INDEX  # (64, 4)
        assert not chosen[0].any()
        assert chosen[1:].any(-1).all()


def test_seq2seq_collator_pads_and_teacher_forces() -> None:
    batch = Seq2SeqCollator(pad_id=0, start_id=1, eos_id=2)([(0, ([5, 6, 7], [7, 6, 5])), (0, ([8], [8]))])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["decoder_input_ids"].tolist() == [[1, 7, 6, 5], [1, 8, 0, 0]]
    assert batch["labels"].tolist() == [[7, 6, 5, 2], [8, 2, -100, -100]]
    assert batch["decoder_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


# --------------------------------------------------------------------------- sampler


def test_stream_sampler_resumes_exactly_and_shards_ranks() -> None:
    full = StreamBatchSampler(10, 4, seed=3)
    it = iter(full)
    first = [next(it) for _ in range(6)]  # 24 items: crosses two pass boundaries
    resumed = iter(StreamBatchSampler(10, 4, seed=3, start=4))
    assert next(resumed) == first[4] and next(resumed) == first[5]
    one_pass = [i for batch in first[:5] for _, i in batch][:10]
    assert sorted(one_pass) == list(range(10))  # a pass is a permutation
    assert [i for _, i in first[0]] != [0, 1, 2, 3]  # shuffled
    r0 = StreamBatchSampler(100, 4, seed=0, rank=0, world_size=2).batch(7)
    r1 = StreamBatchSampler(100, 4, seed=0, rank=1, world_size=2).batch(7)
    assert not {i for _, i in r0} & {i for _, i in r1}
    assert {p for p, _ in r0 + r1} == {7}


def test_stream_sampler_reads_on_from_the_same_item_with_another_batch_or_world() -> None:
    stream = [i for batch in (StreamBatchSampler(10, 1, seed=3).batch(b) for b in range(40)) for _, i in batch]
    # 3 global batches of 4 (12 items), then batches of 2 on 3 processes from position 3
    before = [i for b in range(3) for _, i in StreamBatchSampler(10, 4, seed=3).batch(b)]
    ranks = [StreamBatchSampler(10, 2, seed=3, rank=r, world_size=3, start=3, offset=12) for r in range(3)]
    after = [i for b in range(3, 6) for r in ranks for _, i in r.batch(b)]
    assert before + after == stream[:30]
    assert {p for p, _ in ranks[1].batch(4)} == {4}  # positions still count batches
    # without an offset, the start is in batches of the current size, as before
    assert StreamBatchSampler(10, 4, seed=3, start=2).batch(2) == StreamBatchSampler(10, 4, seed=3).batch(2)


def test_eval_sampler_is_fixed_and_covers_the_split() -> None:
    batches = list(EvalBatchSampler(10, 4))
    assert [[i for _, i in b] for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(EvalBatchSampler(100, 4, n_batches=3)) == 3


def test_eval_sampler_on_several_ranks_fills_the_last_batch_and_says_so() -> None:
    from specformer.data.collate import CausalLMCollator
    from specformer.data.sampler import EvalCollator

    blocks = [np.full(5, i, dtype=np.int64) for i in range(10)]  # item i is all i
    labelled = []
    for rank in range(2):
        sampler = EvalBatchSampler(10, 4, rank=rank, world_size=2)
        collate = EvalCollator(CausalLMCollator(), sampler)
        batches = list(sampler)
        assert len(batches) == 2 and all(len(b) == 4 for b in batches)  # equal on every rank
        for b in batches:
            out = collate([(p, blocks[i]) for p, i in b])
            rows = out["labels"][:, 0]
            labelled += [int(r) for r in rows if r != -100]
    assert sorted(labelled) == list(range(10))  # every item once; the 6 filler rows unlabelled
    assert EvalBatchSampler(10, 4, rank=1, world_size=2).n_real(-2) == 0
    assert EvalBatchSampler(10, 4, rank=0, world_size=2).n_real(-2) == 2


# --------------------------------------------------------------------------- synthetic tasks


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "addition"])
def test_synthetic_tasks_are_right_seeded_and_held_out(task: str) -> None:
    spec = SyntheticDataSpec(task=task, min_len=2, max_len=5, n_train=3000, n_val=200, seed=1)
    data = SyntheticTask(spec)
    train, val = data.split("train"), data.split("val")
    assert len(train) == 3000 and len(val) == 200
    assert not {s for s, _ in train} & {s for s, _ in val}
    for src, tgt in train[:50] + val[:50]:
        assert tgt == solve(task, src)
    assert SyntheticTask(spec).split("val") == val
    src, tgt = val[0]
    if task == "reverse":
        assert tgt == src[::-1]
    if task == "addition":
        a, b = src.split("+")
        assert int(tgt) == int(a) + int(b)


def test_a_task_too_small_to_hold_out_is_refused() -> None:
    with pytest.raises(DataError, match="too few to hold out"):
        SyntheticTask(SyntheticDataSpec(n_symbols=2, min_len=2, max_len=3, n_val=100)).split("val")


@pytest.mark.parametrize(("batch_size", "val_batches", "want"), [(2, 20, (20, 10)), (128, 20, (2, 128)),
                                                                  (2, None, (100, 2))])
def test_a_task_scores_its_whole_held_out_set_in_val_batches_batches(batch_size, val_batches, want) -> None:
    # the same 200 examples at any batch size; small batches grow to hold them in val_batches
    from specformer import load_spec
    from specformer.data.module import SpecDataModule

    spec = load_spec("t5-nano", [f"training.batch_size={batch_size}", f"training.val_batches={val_batches or 'null'}",
                                 "training.data.n_train=2000", "training.data.n_val=200"])
    dm = SpecDataModule(spec)
    dm.setup()
    batches = list(dm.val_dataloader())
    assert (len(batches), batches[0]["input_ids"].shape[0]) == want
    assert sum(b["input_ids"].shape[0] for b in batches) == 200


@pytest.mark.parametrize(("overrides", "says"), [
    (["training.seq_len=4"], "reverse task makes sequences of up to 7 tokens (training.data.max_len=6) but "
                             "training.seq_len is 4; lower training.data.max_len, or raise training.seq_len"),
    (["training.data.max_len=64"], "up to 65 tokens (training.data.max_len=64) but max_seq_len is 64; lower "
                                   "training.data.max_len, or raise max_seq_len"),
])
def test_a_task_longer_than_seq_len_is_refused_not_trained_past_it(overrides: list[str], says: str) -> None:
    # training.seq_len was ignored by the synthetic tasks: t5-nano at seq_len=4 trained 7-token targets
    from specformer import load_spec
    from specformer.data.module import SpecDataModule

    spec = load_spec("t5-nano", [*overrides, "training.data.n_train=200", "training.data.n_val=20"])
    with pytest.raises(DataError) as err:
        SpecDataModule(spec).setup()
    assert says in str(err.value)
    # known from the spec alone: validate notes it and train refuses it before any data is made
    from specformer.specs.training import training_problems

    (problem,) = training_problems(spec)
    assert problem.path == "training.data.max_len" and problem.message == str(err.value)


def test_hugging_face_data_without_datasets_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from specformer.data.corpus import hf_corpus
    from specformer.specs.training import HFDataSpec

    real_import = builtins.__import__

    def no_datasets(name: str, *args, **kwargs):
        if name == "datasets":
            raise ImportError("No module named 'datasets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(DataError, match="pip install datasets"):
        hf_corpus(HFDataSpec(name="wikitext", config="wikitext-2-raw-v1"))


def _write_local_dataset(root: Path) -> Path:
    """A dataset folder as `datasets.load_dataset(folder)` reads it: one JSON-lines file per split."""
    import json

    root.mkdir()
    train = [{"text": f"train document {i}", "id": i} for i in range(6)] + [{"text": "   ", "id": 6}]
    val = [{"text": "validation document", "id": 0}]
    for split, rows in (("train", train), ("validation", val)):
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture
def offline_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read when datasets is first imported
    datasets = pytest.importorskip("datasets")  # the [hf] extra
    # and where an earlier test imported it online: else it tries the network, with retries
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    hub_constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    return datasets


def test_hugging_face_dataset_is_read_by_its_splits(offline_datasets, tmp_path: Path) -> None:
    from specformer.data.corpus import hf_corpus
    from specformer.specs.training import HFDataSpec

    folder = _write_local_dataset(tmp_path / "ds")
    corpus = hf_corpus(HFDataSpec(name=str(folder)))
    assert corpus.train == [f"train document {i}" for i in range(6)]  # the blank one is dropped
    assert corpus.val == ["validation document"]
    assert corpus.name == f"hf:{folder}"
    capped = hf_corpus(HFDataSpec(name=str(folder), max_documents=2))
    assert capped.train == ["train document 0", "train document 1"]
    assert capped.fingerprint != corpus.fingerprint
    assert hf_corpus(HFDataSpec(name=str(folder))).fingerprint == corpus.fingerprint
    with pytest.raises(DataError, match="has no column 'body'; columns: text, id"):
        hf_corpus(HFDataSpec(name=str(folder), text_field="body"))
    with pytest.raises(DataError, match="could not load dataset .* split 'test'"):
        hf_corpus(HFDataSpec(name=str(folder), val_split="test"))


def test_a_hub_dataset_that_cannot_be_reached_says_what_to_do(
    offline_datasets, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specformer.data.corpus import hf_corpus
    from specformer.specs.training import HFDataSpec

    # offline, a dataset never downloaded: what datasets really raises
    with pytest.raises(DataError) as info:
        hf_corpus(HFDataSpec(name="someone/never-downloaded"))
    text = str(info.value)
    assert text.startswith("could not load dataset 'someone/never-downloaded' split 'train': Couldn't reach")
    assert "it is not in the local Hugging Face cache, and HF_HUB_OFFLINE keeps it from being downloaded" in text
    assert "or give the dataset's local folder as training.data.name, or its text files with type: files" in text

    # online but no network: datasets retries, then raises the same ConnectionError
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(offline_datasets.config, "HF_HUB_OFFLINE", False)

    def unreachable(name, *args, **kwargs):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(offline_datasets, "load_dataset", unreachable)
    with pytest.raises(DataError, match=r"\(LocalEntryNotFoundError\); without network, a dataset downloaded "
                                        r"before is read from the local cache with HF_HUB_OFFLINE=1"):
        hf_corpus(HFDataSpec(name="someone/never-downloaded"))

    # other errors get no network advice
    def broken(name, *args, **kwargs):
        raise ValueError("BuilderConfig 'x' not found")

    monkeypatch.setattr(offline_datasets, "load_dataset", broken)
    with pytest.raises(DataError) as info:
        hf_corpus(HFDataSpec(name="someone/never-downloaded"))
    assert str(info.value).endswith("BuilderConfig 'x' not found")


def test_training_on_a_hugging_face_dataset(offline_datasets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specformer import load_spec
    from specformer.training.run import train

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFORMER_CACHE", str(tmp_path / "cache"))
    folder = _write_local_dataset(tmp_path / "ds")
    spec = load_spec(
        {
            "name": "tiny-hf-data",
            "kind": "decoder",
            "vocab_size": 300,
            "d_model": 16,
            "max_seq_len": 16,
            "decoder": {"n_layers": 1, "attention": {"n_heads": 2}, "ffn": {"d_ff": 32}},
            "training": {
                "data": {"type": "hf", "name": str(folder)},
                "tokenizer": {"type": "byte"},
                "batch_size": 2,
                "seq_len": 8,
                "max_steps": 3,
                "val_interval": 3,
                "val_batches": 1,
                "num_workers": 0,
                "accelerator": "cpu",
                "out_dir": str(tmp_path / "runs"),
                "cache_dir": str(tmp_path / "cache"),
            },
        }
    )
    result = train(spec, progress=False)
    assert result.steps == 3 and result.val_loss is not None and result.val_loss == result.val_loss


def test_a_bpe_smaller_than_asked_is_pointed_out(tmp_path: Path) -> None:
    from specformer import load_spec
    from specformer.data.module import prepare

    (tmp_path / "a.txt").write_text("the cat sat on the mat\n" * 400)
    (tmp_path / "b.txt").write_text("the dog sat on the log\n" * 400)
    spec = load_spec("gpt-nano", [f"training.data={{type: files, paths: ['{tmp_path}/*.txt'], val_fraction: 0.5}}",
                                  "training.seq_len=16", f"training.cache_dir={tmp_path / 'cache'}"])
    data = prepare(spec)
    assert data.tokenizer.vocab_size < 512
    n = data.tokenizer.vocab_size
    assert f"the BPE reached {n} of the 512 tokens asked for" in data.description
    assert f"ids {n}–511 stay unused" in data.description
    assert "training.tokenizer.min_frequency=2 times" in data.description
    # a min_frequency set high stops it too: the line names that setting, not only "too little text"
    picky = prepare(load_spec(spec.to_dict(), ["training.tokenizer.min_frequency=100000"]))
    assert picky.tokenizer.vocab_size == 259  # the bytes and the specials: no pair occurs that often
    assert ("the BPE reached 259 of the 512 tokens asked for (no pair of tokens left occurs "
            "training.tokenizer.min_frequency=100000 times in the text it was trained on: more text, or a lower "
            "min_frequency, gives more): ids 259–511 stay unused") in picky.description
    # a BPE asked for fewer than the model's table (a run's spec.yaml with --set vocab_size=600)
    fewer = prepare(load_spec(spec.to_dict(), [f"training.tokenizer.vocab_size={n}", "vocab_size=600"]))
    assert fewer.tokenizer.vocab_size == n
    assert f"the BPE has {n} tokens (training.tokenizer.vocab_size) and vocab_size is 600: ids {n}–599 stay " \
           "unused" in fewer.description


def test_a_tokenizer_json_smaller_than_vocab_size_is_pointed_out(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from specformer import load_spec
    from specformer.data.module import prepare

    (tmp_path / "a.txt").write_text("the cat sat on the mat\n" * 400)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train([str(tmp_path / "a.txt")], trainers.BpeTrainer(
        vocab_size=270, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    n = tok.get_vocab_size()
    base = [f"training.data={{type: files, paths: ['{tmp_path}/a.txt']}}", "training.seq_len=16",
            f"training.tokenizer={{type: file, path: '{tmp_path}/tokenizer.json'}}",
            f"training.cache_dir={tmp_path / 'cache'}"]
    data = prepare(load_spec("gpt-nano", base))  # vocab_size 512
    assert f"; the tokenizer has {n} tokens and vocab_size is 512: ids {n}–511 stay unused" in data.description
    assert "stay unused" not in prepare(load_spec("gpt-nano", [*base, f"vocab_size={n}"])).description
    # larger than the model's table: refused, naming the file and the --set that fits it
    with pytest.raises(DataError) as caught:
        prepare(load_spec("gpt-nano", [*base, "vocab_size=260"]))
    assert str(caught.value) == (
        f"training.tokenizer.path: {tmp_path}/tokenizer.json: the tokenizer's ids run to {n - 1} but the model's "
        f"vocab_size is 260, so its ids 260–{n - 1} have no embedding; set vocab_size={n} (--set vocab_size={n}) or "
        "use a smaller tokenizer")


def test_a_tokenizer_json_of_ids_with_gaps_and_without_an_unknown_token(tmp_path: Path) -> None:
    # 7 tokens, ids to 400: sized 7, id 400 crashed the baseline (IndexError), past 65,535 the
    # cache (uint16); a vocabulary that cannot encode "a" crashed the template probe
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from specformer import load_spec
    from specformer.data.module import prepare
    from specformer.data.tokenizers import HFTokenizer

    gaps = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 3, "<|endoftext|>": 4, "zzz": 400}, unk_token="[UNK]"))
    gaps.pre_tokenizer = pre_tokenizers.Whitespace()
    gaps.add_special_tokens(["<|endoftext|>"])
    assert HFTokenizer(gaps).vocab_size == 401
    gaps.save(str(tmp_path / "gaps.json"))
    (tmp_path / "a.txt").write_text("a b zzz a\n" * 400)
    base = [f"training.data={{type: files, paths: ['{tmp_path}/a.txt']}}", "training.seq_len=16",
            f"training.cache_dir={tmp_path / 'cache'}"]
    with pytest.raises(DataError, match=r"the tokenizer's ids run to 400 but the model's vocab_size is 300"):
        prepare(load_spec("gpt-nano", [*base, "vocab_size=300", f"training.tokenizer={{type: file, path: "
                                                                  f"'{tmp_path}/gaps.json'}}"]))
    strict = Tokenizer(models.WordLevel({"b": 0, "c": 1, "zzz": 2, "<|endoftext|>": 3, "<s>": 4}))
    strict.pre_tokenizer = pre_tokenizers.Whitespace()
    strict.add_special_tokens(["<|endoftext|>", "<s>"])
    strict.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 4)])
    assert HFTokenizer(strict).template() == ([4], [])
    strict.save(str(tmp_path / "strict.json"))
    (tmp_path / "b.txt").write_text("b c zzz b\n" * 400)
    data = prepare(load_spec("gpt-nano", [*base, "training.data.paths=['" + str(tmp_path / "b.txt") + "']",
                                          f"training.tokenizer={{type: file, path: '{tmp_path}/strict.json'}}"]))
    assert data.tokenizer.vocab_size == 5 and data.train.tokens.max() <= 4


def test_cache_files_are_written_whole_with_the_umask_permissions(tmp_path: Path) -> None:
    from specformer.data.cache import atomic_file, atomic_write_text

    previous = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "meta.json", "{}")
    finally:
        os.umask(previous)
    assert (tmp_path / "meta.json").stat().st_mode & 0o777 == 0o644  # not mkstemp's private 0600
    with pytest.raises(RuntimeError), atomic_file(tmp_path / "meta.json") as f:
        f.write(b'{"half')
        raise RuntimeError("interrupted")
    assert (tmp_path / "meta.json").read_text() == "{}"  # the old file, and no temporary left
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]


def test_files_paths_literal_brackets_odd_names_and_linked_folders(tmp_path: Path) -> None:
    # a folder named with [ ] is itself, not a character class
    notes = tmp_path / "notes [v2]"
    notes.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (notes / name).write_text(f"text of {name}\n" * 50)
    corpus = files_corpus(FilesDataSpec(paths=(str(notes),), val_fraction=0.3))
    assert sorted(corpus.train_ids + corpus.val_ids) == ["a.txt", "b.txt", "c.txt"]
    # a file name that is not UTF-8 is read like any other
    (notes / os.fsdecode(b"caf\xe9.txt")).write_text("hello\n" * 50)
    odd = files_corpus(FilesDataSpec(paths=(str(notes),)))
    assert len(odd.train_ids + odd.val_ids) == 4
    # a folder reached through a link counts, as a ** glob counts it; a link cycle ends
    real = tmp_path / "real"
    real.mkdir()
    (real / "d.txt").write_text("linked\n" * 50)
    (notes / "linked").symlink_to(real)
    (real / "loop").symlink_to(real)
    below = files_corpus(FilesDataSpec(paths=(str(notes),)))
    globbed = files_corpus(FilesDataSpec(paths=(glob.escape(str(notes)) + "/**/*.txt",)))
    assert "linked/d.txt" in below.train_ids + below.val_ids
    # (the glob's keys are relative to its fixed part, the folder above `notes [v2]`)
    assert sorted(below.train_ids + below.val_ids) == sorted(
        k.removeprefix("notes [v2]/") for k in globbed.train_ids + globbed.val_ids)


def test_hf_rows_without_the_text_field_are_said_and_other_values_refused(offline_datasets, tmp_path: Path) -> None:
    import json

    from specformer import load_spec
    from specformer.data.corpus import hf_corpus
    from specformer.data.module import prepare
    from specformer.specs.training import HFDataSpec

    folder = tmp_path / "ds"
    folder.mkdir()
    train = [{"text": f"train document {i} " * 30} for i in range(8)]
    train[2] = {"body": "this line lacks the field"}
    train[5] = {"body": "and so does this one"}
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (folder / "validation.jsonl").write_text(json.dumps({"text": "validation document " * 30}) + "\n")
    corpus = hf_corpus(HFDataSpec(name=str(folder)))
    assert len(corpus.train) == 6
    assert corpus.notes == ["2 train rows without 'text' (training.data.text_field) left out, the first row 3"]
    spec = load_spec("gpt-nano", [f"training.data={{type: hf, name: '{folder}'}}", "training.tokenizer.type=byte",
                                  "vocab_size=259", "training.seq_len=16", f"training.cache_dir={tmp_path / 'cache'}"])
    assert "; 2 train rows without 'text' (training.data.text_field) left out, the first row 3" in prepare(spec).description
    # a column of something else than text is refused, not dropped row by row into an empty corpus
    lists = tmp_path / "lists"
    lists.mkdir()
    for split in ("train", "validation"):
        (lists / f"{split}.jsonl").write_text(json.dumps({"text": ["a", "list"]}) + "\n")
    with pytest.raises(DataError, match=r"split 'train': column 'text' \(training.data.text_field\) holds list "
                                        r"values, not text \(row 1\)"):
        hf_corpus(HFDataSpec(name=str(lists)))


def test_a_document_moved_between_hf_splits_changes_the_cache_key(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    import json

    from specformer.data.corpus import hf_corpus
    from specformer.specs.training import HFDataSpec

    docs = [f"document number {i} " * 20 for i in range(12)]

    def write(train: list[str], val: list[str]) -> str:
        for split, texts in (("train", train), ("validation", val)):
            (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        return hf_corpus(HFDataSpec(name=str(tmp_path))).fingerprint

    assert write(docs[:10], docs[10:]) != write(docs[:9], docs[9:])


def test_a_tokenizer_without_the_objectives_special_tokens_is_refused_before_tokenising(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from specformer import load_spec
    from specformer.data.module import prepare

    (tmp_path / "a.txt").write_text("the cat sat on the mat\n" * 200)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(tmp_path / "a.txt")], trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    spec = load_spec("bert-nano", [f"training.data={{type: files, paths: ['{tmp_path}/a.txt']}}",
                                   f"training.tokenizer={{type: file, path: '{tmp_path}/tokenizer.json'}}",
                                   "training.seq_len=16", f"training.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(DataError, match="masked-LM objective needs a tokenizer with a mask token"):
        prepare(spec)
    assert not (tmp_path / "cache" / "tokens").exists()  # nothing tokenised for a run that cannot start


def test_a_validation_split_too_short_for_one_sequence_names_its_files(tmp_path: Path) -> None:
    from specformer import load_spec
    from specformer.data.module import prepare

    split = split_by_path(["big.txt", "note.txt"], 0.05)
    held, kept = ("note.txt", "big.txt") if split[1] == [1] else ("big.txt", "note.txt")
    (tmp_path / kept).write_text("the cat sat on the mat\n" * 50)
    (tmp_path / held).write_text("a note\n")
    spec = load_spec("gpt-nano", [f"training.data={{type: files, paths: ['{tmp_path}']}}", "training.tokenizer.type=byte",
                                  "vocab_size=259", "training.seq_len=32", f"training.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(DataError, match=rf"the validation split \({held}\) has fewer than seq_len \+ 1 = 33 tokens "
                                        r"\(8\); add data, raise training.data.val_fraction or lower training.seq_len"):
        prepare(spec)
    # the validation files given: the fix is more text in them
    spec = load_spec("gpt-nano", [f"training.data={{type: files, paths: ['{tmp_path}/*.txt'], val_paths: ['{tmp_path / held}']}}",
                                  "training.tokenizer.type=byte", "vocab_size=259", "training.seq_len=32",
                                  f"training.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(DataError, match=rf"the validation split \({held}\) has fewer than seq_len \+ 1 = 33 tokens "
                                        r"\(8\); add data to training.data.val_paths or lower training.seq_len"):
        prepare(spec)


def test_a_split_of_exactly_seq_len_tokens_is_too_short_for_a_causal_block_and_says_why(tmp_path: Path) -> None:
    # a causal LM's block is seq_len inputs and the token after them: a validation split of
    # exactly seq_len tokens makes no block, and the error said it had "fewer than seq_len=32 tokens (32)"
    from specformer import load_spec
    from specformer.data.module import prepare

    (tmp_path / "train.txt").write_text("the cat sat on the mat\n" * 50)
    (tmp_path / "valid.txt").write_text("a" * 30 + "\n")  # 31 bytes and the end-of-text token: 32 tokens
    data = f"training.data={{type: files, paths: ['{tmp_path}/train.txt'], val_paths: ['{tmp_path}/valid.txt']}}"
    overrides = [data, "training.tokenizer.type=byte", "vocab_size=259", "training.seq_len=32",
                 f"training.cache_dir={tmp_path / 'cache'}"]
    with pytest.raises(DataError, match=r"the validation split \(valid.txt\) has fewer than seq_len \+ 1 = 33 tokens "
                                        r"\(32\); add data to training.data.val_paths"):
        prepare(load_spec("gpt-nano", overrides))
    # a masked-LM block is seq_len tokens: the same split makes one
    assert len(prepare(load_spec("bert-nano", overrides)).val) == 1
    (tmp_path / "valid.txt").write_text("a" * 29 + "\n")
    with pytest.raises(DataError, match=r"the validation split \(valid.txt\) has fewer than seq_len=32 tokens \(31\)"):
        prepare(load_spec("bert-nano", overrides))


def test_files_paths_take_one_path_alone_and_refuse_none() -> None:
    from specformer import load_spec
    from specformer.specs.errors import SpecError

    spec = load_spec("gpt-nano", [f"training.data={{type: files, paths: {JSON_GLOB}}}"])
    assert spec.training.data.paths == (JSON_GLOB,)  # `paths: data/` is `paths: [data/]`
    with pytest.raises(SpecError, match=r"training.data.paths: give at least one file, directory or glob"):
        load_spec("gpt-nano", ["training.data={type: files, paths: []}"])
    # an empty path (`paths: [$DATA]` with DATA unset) read every file of the working directory
    for data in ("{type: files, paths: ['']}", "{type: files, paths: ' '}", "{type: files, paths: [data/, '']}",
                 "{type: pairs, paths: [qa.jsonl], val_paths: ['']}", "{type: labelled, paths: ['']}"):
        with pytest.raises(SpecError, match=r"training.data.(val_)?paths: an empty path, which would read every "
                                            r"file of the working directory: give a file, directory or glob"):
            load_spec("gpt-nano", [f"training.data={data}"])
    with pytest.raises(SpecError, match=r"training.tokenizer.path: an empty path: give a tokenizer.json file or its "
                                        r"folder"):
        load_spec("gpt-nano", ["training.tokenizer={type: file, path: ''}"])


def test_a_tokenizer_json_without_an_end_of_text_token_is_named_with_its_special_tokens(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from specformer import load_spec
    from specformer.data.module import prepare

    (tmp_path / "a.txt").write_text("the cat sat on the mat\n" * 200)
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(tmp_path / "a.txt")], trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]", "[PAD]", "[EOS]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    spec = load_spec("gpt-nano", [f"training.data={{type: files, paths: ['{tmp_path}/a.txt']}}",
                                  f"training.tokenizer={{type: file, path: '{tmp_path}/tokenizer.json'}}",
                                  "training.seq_len=16", f"training.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(DataError) as info:
        prepare(spec)
    assert str(info.value) == (
        f"training.tokenizer.path: {tmp_path}/tokenizer.json: the tokenizer has no end-of-text token, which "
        "causal_lm training puts between documents (one of <|endoftext|>, </s>, <eos>, [SEP], <|end_of_text|>); "
        "its special tokens: [UNK], [PAD], [EOS]. Add one when training the tokenizer "
        '(special_tokens=["<|endoftext|>", ...]), or use training.tokenizer type bpe or byte')
    assert not (tmp_path / "cache" / "tokens").exists()


def test_the_byte_tokenizer_below_vocab_size_is_pointed_out(tmp_path: Path) -> None:
    # character-level training on a preset: 259 byte ids in a 512-row table
    from specformer import load_spec
    from specformer.data.module import prepare

    (tmp_path / "input.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 200)
    base = [f"training.data={{type: files, paths: ['{tmp_path}/input.txt']}}", "training.seq_len=16",
            "training.tokenizer.type=byte", f"training.cache_dir={tmp_path / 'cache'}"]
    data = prepare(load_spec("gpt-nano", base))  # vocab_size 512
    assert data.tokenizer.vocab_size == 259
    assert ("; the tokenizer has 259 tokens and vocab_size is 512: ids 259–511 stay unused "
            "(vocab_size=259 saves their rows)") in data.description
    assert "stay unused" not in prepare(load_spec("gpt-nano", [*base, "vocab_size=259"])).description


def test_a_synthetic_tasks_tokenizer_below_vocab_size_is_pointed_out() -> None:
    # an encoder-decoder written with vocab_size 512 trains the reverse task on its 44 symbols
    from specformer import load_spec
    from specformer.data.module import prepare

    base = ["training.data.n_train=200", "training.data.n_val=20"]
    data = prepare(load_spec("t5-nano", [*base, "vocab_size=512"]))
    assert data.tokenizer.vocab_size == 44
    assert data.description == ("synthetic reverse: lengths 3-6, 200 training and 20 held-out examples; the tokenizer "
                                "has 44 tokens and vocab_size is 512: ids 44–511 stay unused (vocab_size=44 saves "
                                "their rows)")
    assert "stay unused" not in prepare(load_spec("t5-nano", [*base, "vocab_size=44"])).description


def test_bpe_trains_on_at_most_train_mb_cutting_the_crossing_document_at_a_line_end(tmp_path: Path, monkeypatch) -> None:
    from specformer.data import tokenizers as toks
    from specformer.data.corpus import Corpus

    lines = [f"line {i:03d} " + "x" * 90 + "\n" for i in range(100)]  # 100 lines of 100 characters
    big = "".join(lines)
    assert toks._training_texts(["ab\n", big], 1_000) == (["ab\n", "".join(lines[:9])], 903)
    assert toks._training_texts([big], 1_050) == (["".join(lines[:10])], 1_000)  # cut at a line end
    assert toks._training_texts(["y" * 2_000], 500) == (["y" * 500], 500)  # no line end: at the budget
    small = ["one\n", "two\n"]
    assert toks._training_texts(small, 1_000) == (small, 8)  # a corpus under the budget, whole
    assert toks._training_texts(["a" * 600, "b" * 600, "c"], 600) == (["a" * 600], 600)

    seen: list[list[str]] = []
    real = toks._train_bpe
    monkeypatch.setattr(toks, "_train_bpe", lambda spec, texts, path: seen.append(texts) or real(spec, texts, path))
    corpus = Corpus(name="big", train=[big * 30], val=[big], fingerprint="big")  # one 300 kB document
    tok = bpe_tokenizer(BPETokenizerSpec(vocab_size=300, train_mb=0.05), corpus=corpus, cache_dir=tmp_path)
    assert tok.vocab_size == 300
    (texts,) = seen
    assert sum(map(len, texts)) == 50_000 and texts[-1].endswith("\n")


def test_a_stray_quote_in_a_tsv_file_is_an_error_not_rows_read_as_one(tmp_path: Path) -> None:
    # a field that starts with '"' is read as quoted (the csv module's and pandas' rule): a text
    # that only opens with a quotation lost its quotes, or ran on to the next '"', the rows in
    # between (tabs, labels and all) read as one row's text, silently
    from specformer.data.labelled import labelled_corpus
    from specformer.specs.training import LabelledDataSpec

    table = tmp_path / "reviews.tsv"

    def refused(match: str) -> None:
        with pytest.raises(DataError, match=match):
            labelled_corpus(LabelledDataSpec(type="labelled", paths=(str(table),)))
        with pytest.raises(DataError, match=match):
            files_corpus(FilesDataSpec(paths=(str(table),)))

    table.write_text('text\tlabel\nplain one\tneg\n"Great," she said\tpos\nplain two\tneg\n')
    refused(r"^training.data.paths: .*reviews.tsv:3: a field that starts with '\"' is read as quoted text up to the "
            r"next '\"', and this one cannot be read so \('\\t' expected after '\"'\); in a .tsv file a quote")
    table.write_text('text\tlabel\nplain one\tneg\n"Awful\tneg\nplain two\tpos\nplain three" he wrote\tneg\n'
                     'plain four\tpos\n')
    refused(r"reviews.tsv:3: .* cannot be read so \('\\t' expected after '\"'\)")
    table.write_text('text\tlabel\nplain one\tneg\n"Awful\tneg\nplain two\tpos\nplain three"\tneg\nplain four\tpos\n')
    refused(r"^training.data.paths: .*reviews.tsv:3: a field that starts with '\"' is read as quoted text up to the "
            r"next '\"', and this one runs on to line 5, reading lines 3-5 as one row; in a .tsv file")
    table.write_text('text\tlabel\nplain one\tneg\n"Awful\tneg\nplain two\tpos\n')  # to the end of the file
    refused(r"reviews.tsv:3: .* cannot be read so \(unexpected end of data\)")
    # quotes as csv.writer writes them read back as the texts they quote, a tab or a line end included
    import csv

    rows = [("plain one", "neg"), ('"Great," she said', "pos"), ("a\ttab", "neg"), ("two\nlines", "pos")]
    with table.open("w", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    corpus = labelled_corpus(LabelledDataSpec(type="labelled", paths=(str(table),)))
    assert sorted(corpus.train + corpus.val) == sorted(rows)
    corpus = files_corpus(FilesDataSpec(paths=(str(table),)))
    assert sorted(corpus.train + corpus.val) == sorted(text for text, _ in rows)


def test_a_table_row_with_more_fields_than_its_header_is_an_error_not_a_cut_text(tmp_path: Path) -> None:
    # an unquoted comma in a text: the text was cut at it, the label read from the rest of the
    # text (a new class, "fun film") and the true label dropped, silently
    from specformer.data.labelled import labelled_corpus
    from specformer.specs.training import LabelledDataSpec

    table = tmp_path / "reviews.csv"
    table.write_text("text,label\na good film,pos\na good, fun film,pos\na bad film,neg\nfine,pos\n")
    message = (r"^training.data.paths: .*reviews.csv:3: 3 comma-separated fields, and the header row names 2 "
               r"\('text', 'label'\): a text with a comma in it is quoted \(\"a, b\"\), as csv.writer")
    with pytest.raises(DataError, match=message):
        labelled_corpus(LabelledDataSpec(type="labelled", paths=(str(table),)))
    with pytest.raises(DataError, match=message):
        files_corpus(FilesDataSpec(paths=(str(table),)))
    tsv = tmp_path / "reviews.tsv"
    tsv.write_text("text\tlabel\na good film\tpos\na good\tfun film\tpos\na bad film\tneg\nfine\tpos\n")
    with pytest.raises(DataError, match=r"reviews.tsv:3: 3 tab-separated fields, and the header row names 2 "
                                        r"\('text', 'label'\): a text with a tab in it is quoted, as csv.writer"):
        labelled_corpus(LabelledDataSpec(type="labelled", paths=(str(tsv),)))
    # quoted as csv.writer quotes it, the comma is the text's
    table.write_text('text,label\na good film,pos\n"a good, fun film",pos\na bad film,neg\nfine,pos\n')
    corpus = labelled_corpus(LabelledDataSpec(type="labelled", paths=(str(table),)))
    assert ("a good, fun film", "pos") in corpus.train + corpus.val
    # fewer fields than the header names: the row ends before its label, said as the text column's
    # end is, not as a JSON null; a .jsonl row's null label is one
    table.write_text("text,label\na good film,pos\na bad film,neg\nshort\n")
    with pytest.raises(DataError, match=r"reviews.csv:4: the row ends before its 'label' column "
                                        r"\(training.data.label_field\): 1 of the header's 2 columns$"):
        labelled_corpus(LabelledDataSpec(type="labelled", paths=(str(table),)))
    rows = tmp_path / "reviews.jsonl"
    rows.write_text('{"text": "a good film", "label": "pos"}\n{"text": "a bad film", "label": null}\n')
    with pytest.raises(DataError, match=r"reviews.jsonl:2: the label \('label'\) is null"):
        labelled_corpus(LabelledDataSpec(type="labelled", paths=(str(rows),)))


def test_a_tsv_without_the_text_column_and_a_stray_quote_names_the_column(tmp_path: Path) -> None:
    # the rows read for the hint met the quote: a raw csv.Error, not the header's error
    table = tmp_path / "rows.tsv"
    table.write_text('body\tid\n"Great," she said\t1\nplain\t2\n')
    with pytest.raises(DataError, match=r"rows.tsv:1: no 'text' column \(training.data.text_field\); the header row "
                                        r"has 'body', 'id'"):
        files_corpus(FilesDataSpec(paths=(str(table),)))


class _Prepending(ByteTokenizer):
    """Bytes after a marker that opens every input, as a SentencePiece ▁ prepended to it: a
    text encoded in pieces would have a marker at each."""

    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        return [0, *super().encode(text, specials=specials)]

    def encode_arrays(self, texts: Any, dtype: Any) -> list[np.ndarray]:
        return [np.asarray(self.encode(t, specials=False), dtype=dtype) for t in texts]


@pytest.mark.parametrize("kind", ["bpe", "byte", "wordpiece", "metaspace", "prepending"])
def test_a_long_document_is_encoded_in_pieces_with_the_ids_of_the_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # one 40 MB input.txt encoded at once took ~6 GB and showed no progress until it ended:
    # a long document is cut where the ids around the cut are those of the whole, and a
    # tokenizer that reads a cut differently (a marker opening every input) is left whole
    import random

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from specformer.data import tokens
    from specformer.data.corpus import Corpus
    from specformer.data.tokenizers import HFTokenizer

    rng = random.Random(0)
    words = "the of and to in is was naïve 日本語 emoji😀 x=1; don't it's \tTab".split(" ") + ["  two", "end.\n"]
    text = "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(3000)) + "\n"
    if kind == "bpe":
        tok = bpe_tokenizer(BPETokenizerSpec(vocab_size=400), corpus=Corpus(
            name="t", train=[text[:20000]], val=["x"], fingerprint="pieces"), cache_dir=tmp_path)
    elif kind in ("byte", "prepending"):
        tok = ByteTokenizer() if kind == "byte" else _Prepending()
    else:
        model = models.WordPiece(unk_token="[UNK]") if kind == "wordpiece" else models.BPE(unk_token="[UNK]")
        raw = Tokenizer(model)
        raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer() if kind == "wordpiece" else pre_tokenizers.Metaspace()
        trainer = (trainers.WordPieceTrainer if kind == "wordpiece" else trainers.BpeTrainer)(
            vocab_size=300, special_tokens=["[UNK]", "<|endoftext|>"])
        raw.train_from_iterator([text[:20000]], trainer)
        tok = HFTokenizer(raw)
    docs = [text, "a short one", text[:7000]]
    whole = tokens.tokenize_to_array(docs, tok, np.dtype(np.int32), tok.eot_id)
    assert whole.size == sum(len(tok.encode(d, specials=False)) + 1 for d in docs)
    monkeypatch.setattr(tokens, "PIECE_CHARS", 2000)
    pieces = list(tokens._pieces(docs, tok))
    assert "".join(p for p, _, _ in pieces) == "".join(docs)
    assert [(first, last) for _, first, last in pieces].count((True, True)) >= 1  # the short one, whole
    assert sum(last for _, _, last in pieces) == 3 and sum(first for _, first, _ in pieces) == 3
    if kind == "prepending":
        assert len(pieces) == 3  # no cut reads as the whole: each document encoded whole
    else:
        assert len(pieces) > 20
    assert np.array_equal(tokens.tokenize_to_array(docs, tok, np.dtype(np.int32), tok.eot_id), whole)
    seen: list[int] = []
    n = tokens.write_token_stream(tmp_path / "s.bin", docs, tok, np.dtype(np.int32), tok.eot_id, advance=seen.append)
    assert n == whole.size and sum(seen) == sum(map(len, docs))
    assert np.array_equal(np.fromfile(tmp_path / "s.bin", dtype=np.int32), whole)


def test_a_folder_s_json_and_csv_without_documents_are_left_out_not_the_run_s_end(tmp_path: Path) -> None:
    # a project folder holds a package.json, a tsconfig.json with comments and a CSV of numbers:
    # walking the folder leaves them out, said; naming one of them is still an error
    from specformer.data.module import _left_out

    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "notes.txt").write_text("plain notes about the project\n" * 50)
    (tmp_path / "proj" / "package.json").write_text('{"name": "x", "version": 1}\n')
    (tmp_path / "proj" / "tsconfig.json").write_text('{"compilerOptions": {} // comment\n}\n')
    (tmp_path / "proj" / "numbers.csv").write_text("a,b\n1,2\n")
    (tmp_path / "proj" / "docs.jsonl").write_text('{"text": "a document"}\n{"text": "another"}\n')
    corpus = files_corpus(FilesDataSpec(paths=(str(tmp_path / "proj"),)))
    assert sorted(corpus.train_ids + corpus.val_ids) == ["docs.jsonl:1", "docs.jsonl:2", "notes.txt"]
    assert [entry.split(" (", 1)[0] for entry in corpus.not_documents] == ["numbers.csv", "package.json",
                                                                            "tsconfig.json"]
    assert "package.json (" + str(tmp_path / "proj" / "package.json") + ":1: no 'text' field" in corpus.not_documents[1]
    (line,) = _left_out(corpus)
    assert line.startswith("left out 3 files found in a folder that hold no documents: numbers.csv (")
    with pytest.raises(DataError, match=r"package.json:1: no 'text' field"):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "proj" / "package.json"),)))
    # a folder of nothing else: no text to train on, each file named with why
    (tmp_path / "proj" / "notes.txt").unlink()
    (tmp_path / "proj" / "docs.jsonl").unlink()
    with pytest.raises(DataError, match=r"no text to train on in the given files; found in a folder, with no "
                                        r"documents: numbers.csv \("):
        files_corpus(FilesDataSpec(paths=(str(tmp_path / "proj"),)))
