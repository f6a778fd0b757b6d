"""(source, target) pairs from the user's files: reading, splitting, errors, fingerprints."""

from __future__ import annotations

import errno
import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from specformer import load_spec
from specformer.data.corpus import DataError
from specformer.data.module import _check_specials, prepare
from specformer.data.pairs import pair_corpus
from specformer.data.tokenizers import ByteTokenizer, TaskTokenizer, decoder_start_id
from specformer.specs.errors import SpecError
from specformer.specs.training import PairsDataSpec, Seq2SeqSpec


def _jsonl(path: Path, pairs: list[tuple[str, str]], **extra: Any) -> Path:
    path.write_text(
        "".join(json.dumps({"source": s, "target": t, **extra}) + "\n" for s, t in pairs)
    )
    return path


PAIRS = [(f"w{i} x{i % 7}", f"x{i % 7} w{i}") for i in range(200)]


def test_jsonl_pairs_are_split_by_a_hash_of_the_source(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "train.jsonl", PAIRS + PAIRS[:20])  # 20 sources twice
    corpus = pair_corpus(PairsDataSpec(paths=[str(path)], val_fraction=0.2))
    assert len(corpus.train) + len(corpus.val) == 220
    assert 15 < len(corpus.val) < 70
    # the same on every call, and a repeated source never on both sides
    again = pair_corpus(PairsDataSpec(paths=[str(path)], val_fraction=0.2))
    assert (again.train, again.val) == (corpus.train, corpus.val)
    assert not {s for s, _ in corpus.train} & {s for s, _ in corpus.val}
    assert set(corpus.train + corpus.val) == set(PAIRS)


def test_tsv_with_a_header_compressed_files_and_val_paths(tmp_path: Path) -> None:
    tsv = tmp_path / "train.tsv.gz"
    tsv.write_bytes(
        gzip.compress(
            "\ufeffsource\ttarget\r\nhello world\tworld hello\r\n\r\na b\tb a\r\n".encode()
        )
    )
    val = _jsonl(tmp_path / "val.jsonl", [("one two", "two one")])
    corpus = pair_corpus(PairsDataSpec(paths=[str(tsv)], val_paths=[str(val)]))
    assert corpus.train == [("hello world", "world hello"), ("a b", "b a")]
    assert corpus.val == [("one two", "two one")]
    assert corpus.files == ["train.tsv.gz", "val.jsonl"]
    # other field names
    other = tmp_path / "de-en.jsonl"
    other.write_text(
        json.dumps({"de": "Hallo Welt", "en": "hello world"})
        + "\n"
        + json.dumps({"de": "a", "en": "b"})
    )
    corpus = pair_corpus(PairsDataSpec(paths=[str(other)], source_field="de", target_field="en"))
    assert sorted(corpus.train + corpus.val) == [("Hallo Welt", "hello world"), ("a", "b")]


@pytest.mark.parametrize(
    "name,content,message",
    [
        (
            "a.jsonl",
            '{"source": "x", "target": "y"}\n{"source": "x"}\n',
            "a.jsonl:2: no 'target' field (training.data.target_field); this line has 'source'",
        ),
        (
            "a.jsonl",
            '{"source": "x", "target": "y"}\n\n{"source": 3, "target": "y"}\n',
            "a.jsonl:3: 'source' (training.data.source_field) is a JSON int, not a string",
        ),
        (
            "a.jsonl",
            '{"source": "x", "target": null}\n',
            "a.jsonl:1: 'target' (training.data.target_field) is null, not a string",
        ),
        ("a.jsonl", '["x", "y"]\n', "a.jsonl:1: a JSON list, not an object"),
        ("a.jsonl", '{"source": "x", "target": "y"}\n{oops\n', "a.jsonl:2: not a JSON object"),
        ("a.jsonl", '{"source": " ", "target": "y"}\n', "a.jsonl:1: the source is empty"),
        ("a.jsonl", "\n  \n", "a.jsonl holds no pairs (it is empty, or only blank lines)"),
        (
            "a.tsv",
            "x\ty\nx\ty\tz\n",
            "a.tsv:2: 3 tab-separated columns; a .tsv file of pairs holds two",
        ),
        ("a.tsv", "just one column\n", "a.tsv:1: 1 tab-separated column;"),
        (
            "a.txt",
            "x\ty\n",
            "a.txt is neither JSON lines (.jsonl, .ndjson) nor tab-separated (.tsv)",
        ),
    ],
)
def test_bad_pairs_name_the_file_line_and_setting(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError) as info:
        pair_corpus(PairsDataSpec(paths=[str(path)]))
    assert str(info.value).startswith("training.data.paths: ")
    assert message in str(info.value)


def test_bad_val_paths_name_their_setting(tmp_path: Path) -> None:
    train = _jsonl(tmp_path / "train.jsonl", PAIRS[:5])
    bad = tmp_path / "val.jsonl"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(DataError, match=r"training.data.val_paths: .*val.jsonl:1:1: not UTF-8 text \(byte 0xff\): "
                                        r"save the file as UTF-8 \(UTF-16: a byte-order mark opens it"):
        pair_corpus(PairsDataSpec(paths=[str(train)], val_paths=[str(bad)]))
    # UTF-32-LE's byte-order mark (ff fe 00 00) opens with UTF-16-LE's: named UTF-32, as UTF-32-BE's is
    for encoding, at in (("utf-32", "1:1: not UTF-8 text \\(byte 0xff\\)"), ("utf-32-be", "1:3: not UTF-8 text "
                                                                                      "\\(byte 0xfe\\)")):
        bad.write_bytes(("\ufeff" if encoding == "utf-32-be" else "").encode(encoding)
                        + '{"source": "a", "target": "b"}\n'.encode(encoding))
        with pytest.raises(DataError, match=rf"^training.data.val_paths: .*val.jsonl:{at}: save the file as UTF-8 "
                                            r"\(UTF-32: a byte-order mark opens it\)$"):
            pair_corpus(PairsDataSpec(paths=[str(train)], val_paths=[str(bad)]))
    # where the file stops being UTF-8, as an editor counts lines and columns: a Latin-1 'é' on line 3
    bad.write_bytes(b'{"source": "a", "target": "b"}\n\n{"source": "caf\xe9", "target": "c"}\n')
    with pytest.raises(DataError, match=r"^training.data.val_paths: .*val.jsonl:3:16: not UTF-8 text \(byte 0xe9\): "
                                        r"save the file as UTF-8 \(from Latin-1, `iconv -f latin1 -t utf-8`\)$"):
        pair_corpus(PairsDataSpec(paths=[str(train)], val_paths=[str(bad)]))
    with pytest.raises(DataError, match="training.data.val_paths: nothing matches 'nope.jsonl'"):
        pair_corpus(PairsDataSpec(paths=[str(train)], val_paths=["nope.jsonl"]))
    one = _jsonl(tmp_path / "one.jsonl", PAIRS[:1])
    with pytest.raises(DataError, match="found 1 pair in one.jsonl; at least 2 are needed"):
        pair_corpus(PairsDataSpec(paths=[str(one)]))


def test_a_file_of_nul_bytes_or_a_compressed_one_named_as_text_is_an_error_saying_what_it_is(tmp_path: Path) -> None:
    # pairs, labelled texts and conversations read their files alike (read_texts): a .tsv saved as
    # UTF-16 without a byte-order mark is valid UTF-8 ('s\0o\0...'), yet no text to read pairs from
    import gzip

    from specformer.data.conversations import conversation_corpus
    from specformer.data.labelled import labelled_corpus
    from specformer.specs.training import ConversationsDataSpec, LabelledDataSpec

    tsv = "".join(f"{s}\t{t}\n" for s, t in PAIRS)
    (tmp_path / "nobom.tsv").write_bytes(tsv.encode("utf-16-le"))
    (tmp_path / "log.tsv").write_bytes(b"a\tb\nc\x00\x00\td\n")
    (tmp_path / "packed.tsv").write_bytes(gzip.compress(tsv.encode()))
    for name, said in (("nobom.tsv", "nobom.tsv: not text, UTF-16 without a byte-order mark: every other byte is NUL; "
                                     "save the file as UTF-8 text"),
                       ("log.tsv", "log.tsv:2:2: not text, a NUL byte: binary data, not text; save the file as UTF-8 "
                                   "text"),
                       ("packed.tsv", "packed.tsv: not UTF-8 text: gzip-compressed data: name it packed.tsv.gz to "
                                      "have it read decompressed")):
        with pytest.raises(DataError) as info:
            pair_corpus(PairsDataSpec(paths=[str(tmp_path / name)]))
        assert str(info.value) == f"training.data.paths: {tmp_path / name}{said.removeprefix(name)}"
    (tmp_path / "rows.csv").write_bytes("text,label\na,0\n".encode("utf-16-le"))
    with pytest.raises(DataError, match=r"rows.csv: not text, UTF-16 without a byte-order mark"):
        labelled_corpus(LabelledDataSpec(paths=(str(tmp_path / "rows.csv"),)))
    # JSON lines end as open() ends lines, an old Mac's lone \r too: the same records, the same lines
    turns = [{"messages": [{"role": "user", "content": s}, {"role": "assistant", "content": t}]} for s, t in PAIRS]
    for end in ("\n", "\r"):
        (tmp_path / "p.jsonl").write_text(end.join(json.dumps({"source": s, "target": t}) for s, t in PAIRS), newline="")
        (tmp_path / "l.jsonl").write_text(end.join(json.dumps({"text": s, "label": i % 2}) for i, (s, _) in
                                                   enumerate(PAIRS)), newline="")
        (tmp_path / "c.jsonl").write_text(end.join(map(json.dumps, turns)), newline="")
        pairs = pair_corpus(PairsDataSpec(paths=[str(tmp_path / "p.jsonl")]))
        assert sorted(pairs.train + pairs.val) == sorted(PAIRS)
        assert len(labelled_corpus(LabelledDataSpec(paths=(str(tmp_path / "l.jsonl"),))).train) > 150
        assert len(conversation_corpus(ConversationsDataSpec(paths=(str(tmp_path / "c.jsonl"),))).train) > 150
    (tmp_path / "p.jsonl").write_text('{"source": "a", "target": "b"}\r{"source": "c"}\r', newline="")
    with pytest.raises(DataError, match=r"p.jsonl:2: no 'target' field"):
        pair_corpus(PairsDataSpec(paths=[str(tmp_path / "p.jsonl")]))


def test_the_fingerprint_follows_the_files_and_settings(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "train.jsonl", PAIRS[:50])
    spec = PairsDataSpec(paths=[str(path)])
    first = pair_corpus(spec).fingerprint
    assert pair_corpus(spec).fingerprint == first
    _jsonl(path, PAIRS[:49] + [("changed", "changed")])
    edited = pair_corpus(spec).fingerprint
    assert edited != first
    assert pair_corpus(PairsDataSpec(paths=[str(path)], val_fraction=0.3)).fingerprint != edited
    assert (
        pair_corpus(PairsDataSpec(paths=[str(path)], val_paths=[str(path)])).fingerprint != edited
    )


def _s2s(tmp_path: Path, data: dict[str, Any], **training: Any) -> dict[str, Any]:
    stack = {"n_layers": 1, "attention": {"n_heads": 2}, "ffn": {"d_ff": 64}}
    return {
        "name": "tiny-pairs",
        "kind": "encoder-decoder",
        "vocab_size": 300,
        "d_model": 32,
        "max_seq_len": 64,
        "positional": {"type": "learned"},
        "encoder": stack,
        "decoder": stack,
        "training": {"data": data, "cache_dir": str(tmp_path / "cache"), **training},
    }


def test_the_spec_takes_pairs_for_seq2seq_and_sft_only(tmp_path: Path) -> None:
    spec = load_spec(_s2s(tmp_path, {"type": "pairs", "paths": "train.jsonl"}))
    assert spec.training.objective.type == "seq2seq"
    assert spec.training.data.paths == ("train.jsonl",)
    assert spec.training.tokenizer.type == "bpe" and spec.training.tokenizer.vocab_size == 300
    for other in ({"type": "stdlib"}, {"type": "files", "paths": ["a.txt"]}):
        with pytest.raises(
            SpecError, match="the seq2seq objective needs paired data.*use type: pairs"
        ):
            load_spec(_s2s(tmp_path, other))
    gpt = {
        "name": "g",
        "kind": "decoder",
        "vocab_size": 300,
        "d_model": 32,
        "max_seq_len": 64,
        "decoder": {"n_layers": 1, "attention": {"n_heads": 2}},
        "training": {"data": {"type": "pairs", "paths": ["a.jsonl"]}},
    }
    # a decoder given pairs fine-tunes on the responses (objective sft); causal_lm is for text
    assert load_spec(gpt).training.objective.type == "sft"
    gpt["training"]["objective"] = {"type": "causal_lm"}
    with pytest.raises(SpecError, match=r"\(source, target\) pairs train a decoder with objective sft \(prompt "
                       r"\+ response, the loss on the response alone\): set training.objective.type: sft \(a "
                       r"spec import-hf wrote names causal_lm\); causal_lm trains on text, with a loss on every "
                       r"token \(type: files"):
        load_spec(gpt)
    with pytest.raises(SpecError, match="source_field and target_field are both 'x'"):
        load_spec(
            _s2s(
                tmp_path,
                {"type": "pairs", "paths": ["a"], "source_field": "x", "target_field": "x"},
            )
        )


def test_long_pairs_are_cut_to_seq_len_and_counted(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "train.jsonl", [("a" * 40, "b" * 5), ("c" * 3, "d" * 30), ("e" * 2, "f" * 2)] * 4
    )
    spec = load_spec(
        _s2s(
            tmp_path,
            {"type": "pairs", "paths": [str(path)], "val_fraction": 0.3},
            tokenizer={"type": "byte"},
            seq_len=16,
        )
    )
    data = prepare(spec)
    pairs = data.train.pairs + data.val.pairs
    assert max(len(s) for s, _ in pairs) == 16 and max(len(t) for _, t in pairs) == 15
    assert data.extra["truncated_sources"] == 4 and data.extra["truncated_targets"] == 4
    assert (
        "cut to fit seq_len=16: 4 sources longer than 16 tokens, 4 targets longer than 15"
        in data.description
    )
    assert data.fingerprint == pair_corpus(spec.training.data).fingerprint


def test_seq2seq_tokenizers_have_start_tokens_or_say_which_they_lack() -> None:
    byte = ByteTokenizer()
    assert byte.bos_id == byte.eos_id == byte.eot_id == 256
    _check_specials(byte, Seq2SeqSpec())

    class NoStart(ByteTokenizer):
        def __init__(self) -> None:
            super().__init__()
            self.bos_id = None

    with pytest.raises(DataError, match="this one has no start token.*training.objective.decoder_start"):
        _check_specials(NoStart(), Seq2SeqSpec())
    # T5's way: the decoder starts from <pad>
    _check_specials(NoStart(), Seq2SeqSpec(decoder_start="<pad>"))
    assert decoder_start_id(NoStart(), Seq2SeqSpec(decoder_start="<pad>")) == 257
    assert decoder_start_id(byte, Seq2SeqSpec()) == 256
    with pytest.raises(DataError, match=r"decoder_start: '<s>' is not a token of the tokenizer; its special "
                                        r"tokens: <\|endoftext\|>, <pad>, <mask>$"):
        _check_specials(byte, Seq2SeqSpec(decoder_start="<s>"))
    with pytest.raises(DataError, match=r"its special tokens: <pad>, <s>, </s>, <mask>$"):
        _check_specials(TaskTokenizer(), Seq2SeqSpec(decoder_start="<go>"))


def test_a_repeated_source_stays_on_one_side_when_a_pair_is_held_out_by_force(
    tmp_path: Path,
) -> None:
    # with a tiny val_fraction no hash falls below it, and one source is held out by force:
    # all of its pairs go with it, whichever source that is
    pairs = [(f"s{i}", f"t{i}") for i in range(6)]
    path = _jsonl(tmp_path / "train.jsonl", pairs + pairs)  # every source twice
    corpus = pair_corpus(PairsDataSpec(paths=[str(path)], val_fraction=1e-9))
    assert len(corpus.val) == 2 and len(corpus.train) == 10
    assert not {s for s, _ in corpus.train} & {s for s, _ in corpus.val}
    # nearly all held out: one source is kept for training by force, again with both copies
    corpus = pair_corpus(PairsDataSpec(paths=[str(path)], val_fraction=1 - 1e-9))
    assert len(corpus.train) == 2 and len(corpus.val) == 10
    assert not {s for s, _ in corpus.train} & {s for s, _ in corpus.val}


def test_pairs_that_all_share_one_source_cannot_be_split(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "same.jsonl", [("hello", "a"), ("hello", "b"), ("hello", "c")])
    with pytest.raises(DataError, match=r"same\.jsonl has the same source.*val_paths"):
        pair_corpus(PairsDataSpec(paths=[str(path)]))


def test_val_paths_pairs_whose_source_is_trained_on_are_counted(tmp_path: Path) -> None:
    train = _jsonl(tmp_path / "train.jsonl", PAIRS[:50])
    val = _jsonl(tmp_path / "val.jsonl", [PAIRS[3], (PAIRS[7][0], "other"), ("new one", "one new")])
    data = {"type": "pairs", "paths": [str(train)], "val_paths": [str(val)]}
    prepared = prepare(load_spec(_s2s(tmp_path, data, tokenizer={"type": "byte"})))
    assert prepared.description.endswith(
        "; 2 of the 3 pairs of training.data.val_paths have a source that is also in "
        "training.data.paths (their loss and exact match are not held out)"
    )
    clean = _jsonl(tmp_path / "clean.jsonl", [("new one", "one new")])
    assert not pair_corpus(PairsDataSpec(paths=[str(train)], val_paths=[str(clean)])).notes


def _cached_pairs_spec(tmp_path: Path, path: Path, **training: Any) -> Any:
    data = {"type": "pairs", "paths": [str(path)], "val_fraction": 0.2}
    return load_spec(_s2s(tmp_path, data, **{"tokenizer": {"type": "byte"}, "seq_len": 16, **training}))


def _first_batches(spec: Any, n: int = 3) -> list[dict[str, Any]]:
    from specformer.data.module import SpecDataModule

    loader = iter(SpecDataModule(spec, num_workers=0).train_dataloader())
    return [next(loader) for _ in range(n)]


def test_pairs_are_tokenised_once_and_read_from_the_cache_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    path = _jsonl(tmp_path / "train.jsonl", PAIRS[:60] + [("a" * 30, "b" * 3)])
    spec = _cached_pairs_spec(tmp_path, path)
    encoded: list[int] = []
    encode = ByteTokenizer.encode_batch

    def counted(self: Any, texts: list[str], **kwargs: Any) -> Any:
        encoded.append(len(texts))
        return encode(self, texts, **kwargs)

    monkeypatch.setattr(ByteTokenizer, "encode_batch", counted)
    first = prepare(spec)
    assert sum(encoded) == 2 * 61  # each source and target of both splits
    assert "read from the cache" not in first.description
    batches = _first_batches(spec)
    encoded.clear()
    second = prepare(spec)
    assert encoded == []  # nothing tokenised again
    assert second.description == first.description + "; token ids read from the cache"
    assert "cut to fit seq_len=16: 1 source longer than 16 tokens" in second.description
    assert (second.train.pairs, second.val.pairs) == (first.train.pairs, first.val.pairs)
    assert (second.n_train_tokens, second.n_val_tokens) == (first.n_train_tokens, first.n_val_tokens)
    assert second.extra == first.extra and Path(first.extra["token_cache"]).parent == tmp_path / "cache" / "tokens"
    for a, b in zip(batches, _first_batches(spec), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_pairs_cache_follows_the_files_the_tokenizer_and_the_lengths(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "train.jsonl", PAIRS[:60])
    spec = _cached_pairs_spec(tmp_path, path)
    first = prepare(spec)
    assert "read from the cache" in prepare(spec).description
    # a file edited (same size, same mtime): other ids
    stat = path.stat()
    _jsonl(path, PAIRS[:59] + [("w59 x9", "x9 w59")])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    edited = prepare(spec)
    assert "read from the cache" not in edited.description
    assert (edited.train.pairs, edited.val.pairs) != (first.train.pairs, first.val.pairs)
    # a length setting: cut otherwise
    short = prepare(_cached_pairs_spec(tmp_path, path, seq_len=4))
    assert "read from the cache" not in short.description
    assert max(len(s) for s, _ in short.train.pairs) == 4 and "cut to fit seq_len=4" in short.description
    # the split settings
    assert "read from the cache" not in prepare(
        load_spec(_s2s(tmp_path, {"type": "pairs", "paths": [str(path)], "val_fraction": 0.4},
                       tokenizer={"type": "byte"}, seq_len=16))).description
    # another tokenizer
    bpe = prepare(_cached_pairs_spec(tmp_path, path, tokenizer={"type": "bpe", "vocab_size": 300, "min_frequency": 1}))
    assert "read from the cache" not in bpe.description
    assert bpe.train.pairs != edited.train.pairs
    # and each is read back after
    assert "read from the cache" in prepare(_cached_pairs_spec(tmp_path, path, seq_len=4)).description


@pytest.mark.parametrize("damage", ["truncated ids", "cut meta.json", "lengths that do not add up", "ids past the vocabulary"])
def test_a_damaged_pairs_cache_entry_is_made_again(tmp_path: Path, damage: str) -> None:
    import numpy as np

    path = _jsonl(tmp_path / "train.jsonl", PAIRS[:60])
    spec = _cached_pairs_spec(tmp_path, path)
    first = prepare(spec)
    expected = (first.train.pairs, first.val.pairs)  # read now: the damage below is done in place
    entry = Path(first.extra["token_cache"])
    if damage == "truncated ids":
        raw = (entry / "train.bin").read_bytes()
        (entry / "train.bin").write_bytes(raw[: len(raw) // 2])
    elif damage == "cut meta.json":
        (entry / "meta.json").write_text('{"dtype": "uint16", "n_tok')
    elif damage == "lengths that do not add up":
        lengths = np.fromfile(entry / "train.lengths.bin", dtype=np.uint32)
        lengths[0] += 1
        lengths.tofile(entry / "train.lengths.bin")
    else:
        ids = np.fromfile(entry / "val.bin", dtype=np.uint16)
        ids[0] = 60000
        ids.tofile(entry / "val.bin")
    again = prepare(spec)
    assert "read from the cache" not in again.description  # made again, not an error
    assert (again.train.pairs, again.val.pairs) == expected
    assert "read from the cache" in prepare(spec).description


def test_a_pairs_cache_that_cannot_be_written_names_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _jsonl(tmp_path / "train.jsonl", PAIRS[:60])
    spec = _cached_pairs_spec(tmp_path, path)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DataError, match=r"^training.cache_dir: cannot write the token cache .* \(No space left on "
                                        r"device\); nothing was half-written"):
        prepare(spec)
    assert [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []


def test_cached_pairs_are_held_as_a_memory_map_that_travels_by_file_name(tmp_path: Path) -> None:
    import pickle

    import numpy as np

    path = _jsonl(tmp_path / "train.jsonl", PAIRS * 20)
    data = prepare(_cached_pairs_spec(tmp_path, path))
    train = data.train
    assert isinstance(train._ids.tokens, np.memmap)  # 2 bytes a token, not a list of Python ints
    assert train.n_tokens() == sum(len(s) + len(g) + 1 for s, g in train.pairs)
    assert len(pickle.dumps(train)) < 2 * len(train) * 8 + 4096  # the lengths, not the ids (a worker maps the file)
    again = pickle.loads(pickle.dumps(train))
    assert again.pairs == train.pairs and again[(7, 3)] == (7, train.pair(3))
    with pytest.raises(IndexError):
        train.pair(len(train))


def test_pairs_tokenised_a_chunk_at_a_time_are_the_pairs_tokenised_at_once(tmp_path: Path, monkeypatch) -> None:
    from specformer.data import tokens

    path = _jsonl(tmp_path / "train.jsonl", PAIRS * 3)
    whole = prepare(_cached_pairs_spec(tmp_path / "a", path))
    monkeypatch.setattr(tokens, "_PAIRS_PER_CHUNK", 4)  # several chunks, the last one short
    chunked = prepare(_cached_pairs_spec(tmp_path / "b", path))
    assert "read from the cache" not in chunked.description
    assert len(whole.train) > 4 and len(whole.train) % 4 and (chunked.train.pairs, chunked.val.pairs) == (
        whole.train.pairs, whole.val.pairs)
    assert chunked.extra["truncated_sources"] == whole.extra["truncated_sources"]


def test_a_seq_len_with_no_room_for_a_target_is_refused_before_anything_is_tokenised(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "train.jsonl", PAIRS[:20])
    with pytest.raises(DataError, match=r"training.seq_len=1 leaves no room for a source and a target"):
        prepare(_cached_pairs_spec(tmp_path, path, seq_len=1))
    assert not (tmp_path / "cache" / "tokens").exists() or not any((tmp_path / "cache" / "tokens").rglob("*.bin"))


def test_a_tsv_first_line_of_other_names_than_the_fields_is_read_as_a_pair_and_said(tmp_path: Path) -> None:
    # `question<TAB>answer` with the default fields trained as a pair, silently
    rows = "".join(f"what is {i}?\tit is {i}\n" for i in range(10))
    path = tmp_path / "qa.tsv"
    path.write_text("question\tanswer\n" + rows)
    corpus = pair_corpus(PairsDataSpec(paths=[str(path)]))
    assert ("question", "answer") in corpus.train + corpus.val
    assert corpus.notes == [f"the first line of {path} ('question', 'answer') is read as a pair: a header line is "
                            "skipped when it names training.data.source_field and target_field ('source', "
                            "'target'): if it is one, set them to its names"]
    named = pair_corpus(PairsDataSpec(paths=[str(path)], source_field="question", target_field="answer"))
    assert len(named.train + named.val) == 10 and named.notes == []
    path.write_text(rows)  # a first line of text is no header: nothing to say
    assert pair_corpus(PairsDataSpec(paths=[str(path)])).notes == []


def test_tsv_pairs_end_lines_as_open_does_an_old_macs_lone_cr_too(tmp_path: Path) -> None:
    # a .tsv saved with lone \r line ends was one line of 201 columns: 'a .tsv file of pairs holds two'
    lines = ["source\ttarget"] + [f"{s}\t{t}" for s, t in PAIRS]
    read = {}
    for name, end in (("lf", "\n"), ("crlf", "\r\n"), ("cr", "\r")):
        (tmp_path / f"{name}.tsv").write_text(end.join(lines) + end + end, newline="")
        corpus = pair_corpus(PairsDataSpec(paths=[str(tmp_path / f"{name}.tsv")]))
        read[name] = sorted(corpus.train + corpus.val)
        assert corpus.notes == []
    assert read["lf"] == read["crlf"] == read["cr"] == sorted(PAIRS)
    # an error's line number counts lone \r line ends as lines
    (tmp_path / "cr.tsv").write_text("\r".join(lines[:3] + ["one\ttwo\tthree"] + lines[3:5]), newline="")
    with pytest.raises(DataError, match=r"cr.tsv:4: 3 tab-separated columns; a .tsv file of pairs holds two"):
        pair_corpus(PairsDataSpec(paths=[str(tmp_path / "cr.tsv")]))
    # the first line's note reads the first line alone, ended by a lone \r too
    (tmp_path / "cr.tsv").write_text("\r".join(["question\tanswer"] + lines[1:]), newline="")
    corpus = pair_corpus(PairsDataSpec(paths=[str(tmp_path / "cr.tsv")]))
    assert corpus.notes == [f"the first line of {tmp_path / 'cr.tsv'} ('question', 'answer') is read as a pair: a "
                            "header line is skipped when it names training.data.source_field and target_field "
                            "('source', 'target'): if it is one, set them to its names"]
    # a form feed or U+2028 is a text's own, not a line end (str.splitlines would break there)
    (tmp_path / "ff.tsv").write_text("a\x0cb\tc\u2028d\rx y\ty x\r", newline="")
    corpus = pair_corpus(PairsDataSpec(paths=[str(tmp_path / "ff.tsv")]))
    assert sorted(corpus.train + corpus.val) == [("a\x0cb", "c\u2028d"), ("x y", "y x")]
