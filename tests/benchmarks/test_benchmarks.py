"""Smoke runs of every benchmark on tiny shapes with one iteration: the scripts keep
working, write the JSON they promise, and compare the same model across libraries.
No timing is asserted (the numbers of a loaded CI machine mean nothing)."""

from __future__ import annotations

import importlib.util
import json
import weakref
from pathlib import Path

import pytest
import torch

import specformer

pytest.importorskip("transformers", reason="the benchmarks compare against transformers: pip install 'specformer[hf]'")

from benchmarks import (  # noqa: E402
    attention,
    cli,
    common,
    data,
    inference,
    memory,
    padded,
    report,
    run_all,
    train,
)
from benchmarks.common import (  # noqa: E402
    QUICK_SHAPES,
    available_libraries,
    build_adapters,
    check_same_logits,
    make_batch,
    select_shapes,
)
from specformer.analysis import flops_per_token  # noqa: E402

HAS_XT = importlib.util.find_spec("x_transformers") is not None
CPU = torch.device("cpu")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("shape", QUICK_SHAPES, ids=lambda s: s.name)
def test_specformer_and_transformers_compute_the_same_logits(shape) -> None:
    adapters = build_adapters(shape, CPU, ["specformer", "transformers"])
    assert [a.library for a in adapters] == ["specformer", "transformers"]
    assert adapters[0].params == adapters[1].params
    batch = make_batch(shape, CPU)
    diff = check_same_logits(adapters, batch)
    assert diff < 1e-4
    with torch.no_grad():  # and the comparison is between non-trivial outputs
        assert adapters[0].logits(batch).std() > 1e-3


def test_check_same_logits_catches_a_different_model() -> None:
    shape = QUICK_SHAPES[0]
    adapters = build_adapters(shape, CPU, ["specformer", "transformers"])
    with torch.no_grad():
        p = next(adapters[1].model.parameters())
        p.add_(torch.randn_like(p))
    with pytest.raises(AssertionError, match="disagree"):
        check_same_logits(adapters, make_batch(shape, CPU))


@pytest.mark.skipif(not HAS_XT, reason="x-transformers is not installed (pip install 'specformer[bench]')")
@pytest.mark.parametrize("shape", [s for s in QUICK_SHAPES if s.kind != "encoder-decoder"], ids=lambda s: s.name)
def test_x_transformers_models_have_the_same_size(shape) -> None:
    ours, xt = build_adapters(shape, CPU, ["specformer", "x-transformers"])
    assert xt.library == "x-transformers"
    # the differences named in XT_NOTES (biases, norm shifts, MLM transform) are under 6%
    assert abs(xt.params - ours.params) / ours.params < 0.06
    logits = xt.logits(make_batch(shape, CPU))
    assert logits.shape == (shape.batch, shape.seq_len, shape.spec["vocab_size"])


def test_matmul_recorder_counts_the_models_linear_flops() -> None:
    shape = select_shapes(["gpt2-style"], quick=True)[0]
    (ours,) = build_adapters(shape, CPU, ["specformer"])
    calls = train.record_matmuls(ours, make_batch(shape, CPU), bf16=False, dev=CPU)
    recorded = sum(count * train._flops(sig) for sig, count in calls.items())
    f = flops_per_token(shape.model_spec(), seq_len=shape.seq_len, count="executed")
    linear = sum(v for k, v in f.components.items() if not k.endswith("scores"))
    # forward + the two backward products of every linear layer; SDPA is not a matmul op
    assert recorded == pytest.approx(3 * linear * shape.tokens, rel=0.01)
    mm = train.matmul_throughput(calls, CPU, repeat=1)
    assert mm["flops"] == recorded and mm["flops_per_s"] > 0


@pytest.mark.parametrize(("kept", "n_products"), [(0, 7), (1 << 30, 6)])
def test_matmul_recorder_counts_float32_attention_run_as_products(monkeypatch: pytest.MonkeyPatch, kept: int,
                                                                   n_products: int) -> None:
    # where float32 training attention runs as products, they are in the step's set: per batch
    # row, key/value head and layer, a causal block of all T rows (G heads) against T keys,
    # 2 products forward, 4 backward (dP, dQ, dK, dV) and the scores again where the forward
    # pass kept no probabilities
    from specformer.components import attention

    monkeypatch.setattr(attention, "MATMUL_KEPT_BYTES", kept)
    monkeypatch.setattr(attention, "FLOAT32_ATTENTION", True)
    monkeypatch.setattr(attention, "FLOAT32_PRODUCT_ROWS", 16)
    shape = select_shapes(["llama-style"], quick=True)[0]
    (ours,) = build_adapters(shape, CPU, ["specformer"])
    calls = train.record_matmuls(ours, make_batch(shape, CPU), bf16=False, dev=CPU)
    recorded = sum(count * train._flops(sig) for sig, count in calls.items())
    spec = shape.model_spec()
    f = flops_per_token(spec, seq_len=shape.seq_len, count="executed")
    linear = sum(v for k, v in f.components.items() if not k.endswith("scores"))
    att = spec.decoder.attention
    t, g = shape.seq_len, att.n_heads // att.n_kv_heads
    products = n_products * 2 * (g * t) * att.head_dim * t * shape.batch * att.n_kv_heads * spec.decoder.n_layers
    assert recorded == pytest.approx(3 * linear * shape.tokens + products, rel=1e-6)
    assert any(sig[0] == "addmm_" for sig in calls)  # the key and value gradients, summed in place


@pytest.mark.slow
def test_train_quick(tmp_path: Path) -> None:
    out = tmp_path / "train.json"
    train.main(["--quick", "--shapes", "gpt2-style", "t5-style", "--out", str(out)])
    data = _load(out)
    libs = {r["library"] for r in data["results"]}
    assert libs == ({"specformer", "transformers", "x-transformers"} if HAS_XT else {"specformer", "transformers"})
    for shape in ("gpt2-style", "t5-style"):
        for precision in ("fp32", "bf16"):
            rows = [r for r in data["results"] if r["shape"] == shape and r["precision"] == precision]
            by = {r["library"]: r for r in rows}
            assert {"specformer", "transformers"} <= set(by)
            assert by["specformer"]["speedup_of_specformer"] is None
            ratio = by["specformer"]["step_ms"] / by["transformers"]["step_ms"]
            assert by["transformers"]["speedup_of_specformer"] == pytest.approx(1 / ratio)
            for r in rows:
                assert r["tokens_per_s"] == pytest.approx(r["tokens"] / (r["step_ms"] / 1e3))
                assert r["fraction_of_matmul"] > 0 and r["matmul_tflops_per_s"] > 0
    assert "x-transformers" not in {r["library"] for r in data["results"] if r["shape"] == "t5-style"}
    by_fp32_gpt2 = {r["library"]: r for r in data["results"] if r["shape"] == "gpt2-style" and r["precision"] == "fp32"}
    assert data["machine"]["torch"] == torch.__version__
    assert set(data["machine"]["specformer_training_attention"]) == {"bf16", "fp32"}
    table = report.render(data)
    assert table.count("\n| gpt2-style | fp32 |") == len(libs)
    spread = report.ratios([("run1", data), ("run2", data)])
    row = next(line for line in spread.splitlines() if line.startswith("| gpt2-style | fp32 | transformers |"))
    ratio = f"{by_fp32_gpt2['transformers']['speedup_of_specformer']:.2f}"
    assert row.count(ratio) == 4  # both runs, and the range's two ends


def test_train_without_x_transformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "x_transformers" else real(name, *a))
    assert available_libraries() == ["specformer", "transformers"]
    payload = train.main(["--quick", "--shapes", "llama-style", "--precisions", "fp32"])
    assert [r["library"] for r in payload["results"]] == ["specformer", "transformers"]


def test_train_bf16_true_runs_bfloat16_weights_without_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    real = train.training_step

    def spy(adapter, batch, opt, *, bf16, dev):  # type: ignore[no-untyped-def]
        seen.append((adapter.library, next(adapter.model.parameters()).dtype, bf16))
        return real(adapter, batch, opt, bf16=bf16, dev=dev)

    monkeypatch.setattr(train, "training_step", spy)
    payload = train.main(["--quick", "--shapes", "llama-style", "--libraries", "specformer", "transformers",
                          "--precisions", "fp32", "bf16-true", "bf16"])
    assert seen == [("specformer", torch.float32, False), ("transformers", torch.float32, False),
                    ("specformer", torch.bfloat16, False), ("transformers", torch.bfloat16, False),
                    ("specformer", torch.float32, True), ("transformers", torch.float32, True)]
    assert [r["precision"] for r in payload["results"]] == ["fp32"] * 2 + ["bf16-true"] * 2 + ["bf16"] * 2
    assert all(r["step_ms"] > 0 for r in payload["results"])


@pytest.mark.slow
def test_train_compile_rows_one_per_mode() -> None:
    payload = train.main(["--quick", "--shapes", "gpt2-style", "--libraries", "specformer", "transformers",
                          "--precisions", "fp32", "--compile", "--compile-modes", "default", "reduce-overhead"])
    rows = payload["results"]
    assert [r["library"] for r in rows] == [
        "specformer", "transformers", "specformer+compile", "specformer+compile(reduce-overhead)"]
    assert all(r["step_ms"] > 0 and r["notes"] for r in rows[2:])
    assert "mode=reduce-overhead" in rows[3]["notes"]
    # the peer's row says how the first compiled row compares with it
    peer, compiled = rows[1], rows[2]
    assert peer["speedup_of_compiled"] == pytest.approx(peer["step_ms"] / compiled["step_ms"])
    assert all(r["speedup_of_compiled"] is None for r in rows if r is not peer)
    table = report.render(payload)
    assert "| compiled × |" in table and f"| {peer['speedup_of_compiled']:.2f}× |" in table


@pytest.mark.parametrize("name", ["llama-style", "t5-style", "bert-style"])
def test_padded_batches_change_length_and_label_no_padding(name: str) -> None:
    shape = next(s for s in common.SHAPES if s.name == name)
    batches = padded.padded_batches(shape, torch.device("cpu"), 6)
    widths = {b["input_ids"].shape[1] for b in batches}
    assert len(widths) > 1 and all(shape.seq_len // 4 <= w <= shape.seq_len for w in widths)
    target = "decoder_attention_mask" if shape.kind == "encoder-decoder" else "attention_mask"
    for b in batches:
        mask = b[target]
        assert b["input_ids"].shape[0] == shape.batch == b["labels"].shape[0]
        # right padding: every row's real tokens first, the longest row unpadded
        assert torch.equal(mask, mask.cummin(dim=1).values) and bool(mask.sum(1).eq(mask.shape[1]).any())
        if shape.kind == "encoder":  # a masked LM's: some of the real tokens
            labelled = b["labels"] != -100
            assert not bool((labelled & (mask == 0)).any()) and 0 < int(labelled.sum()) < int(mask.sum())
        else:
            assert torch.equal(b["labels"] == -100, mask == 0)
        assert b["attention_mask"].shape == b["input_ids"].shape
    assert padded.real_tokens(batches) == sum(int(b[target].sum()) for b in batches)
    # the same seed, the same batches: every library steps through these
    again = padded.padded_batches(shape, torch.device("cpu"), 6)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(batches, again, strict=True) for k in a)


@pytest.mark.slow
def test_padded_quick(tmp_path: Path) -> None:
    out = tmp_path / "padded.json"
    padded.main(["--quick", "--shapes", "gpt2-style", "t5-style", "bert-style", "--precisions", "fp32",
                 "--compile", "--out", str(out)])
    data = _load(out)
    rows = data["results"]
    assert {r["shape"] for r in rows} == {"gpt2-style", "t5-style", "bert-style"}
    for shape in ("gpt2-style", "t5-style", "bert-style"):
        by = {r["library"]: r for r in rows if r["shape"] == shape}
        assert set(by) == {"specformer", "transformers", "specformer+compile"}
        peer = by["transformers"]
        # weights copied and padding masked alike: the same loss to float32 rounding
        assert peer["loss_max_diff_fp32"] < 1e-4
        assert peer["speedup_of_specformer"] == pytest.approx(peer["cycle_ms"] / by["specformer"]["cycle_ms"])
        assert peer["speedup_of_compiled"] == pytest.approx(peer["cycle_ms"] / by["specformer+compile"]["cycle_ms"])
        for r in by.values():
            assert len(set(r["widths"])) > 1
            assert r["tokens_per_s"] == pytest.approx(r["tokens"] / (r["cycle_ms"] / 1e3))
    table = report.render(data)
    assert table.count("\n| t5-style | fp32 |") == 3 and "| compiled × |" in table


def test_inference_quick(tmp_path: Path) -> None:
    out = tmp_path / "inference.json"
    inference.main(["--quick", "--out", str(out), "--new-tokens", "2"])
    rows = _load(out)["results"]
    tasks = {(r["shape"], r["task"]) for r in rows}
    for s in QUICK_SHAPES:
        assert (s.name, "prefill") in tasks
        has_decode = s.kind != "encoder"
        assert ((s.name, "decode b1") in tasks) is has_decode
        assert ((s.name, "decode b8") in tasks) is has_decode
        # each library's own generation function, greedy: the same tokens as specformer's
        generated = [r for r in rows if r["shape"] == s.name and r["task"] == "generate b1"]
        assert {r["library"] for r in generated} == ({"specformer", "transformers"} if has_decode else set())
        assert all(r["same_tokens_as_specformer"] is True and r["tokens"] == 2 for r in generated)
    for r in rows:
        assert r["tokens_per_s"] > 0
        if r["task"] == "decode b8":
            assert r["tokens"] == 8 * 2
        if r["task"].startswith("decode"):
            assert r["bytes_per_step"] > 0 and r["floor_ms"] > 0
            assert r["fraction_of_floor"] == pytest.approx(r["floor_ms"] / r["ms"])
        else:
            assert r["floor_ms"] is None
    assert "| llama-style | decode b1 |" in report.render(_load(out))
    assert "| llama-style | decode b1 | fp32 | transformers |" in report.ratios([("run", _load(out))])


def test_inference_says_and_records_new_tokens_that_max_seq_len_cuts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a prompt of 30 at max_seq_len 32 leaves room for 2: the title said 64 and the rows held 2 tokens
    out = tmp_path / "inference.json"
    inference.main(["--quick", "--shapes", "gpt2-style", "--libraries", "specformer", "--prompt", "30",
                    "--new-tokens", "64", "--decode-batches", "1", "--no-generate", "--out", str(out)])
    assert "note: gpt2-style: 2 new tokens a decode run, not 64" in capsys.readouterr().err
    data = _load(out)
    decoded = [r for r in data["results"] if r["task"] == "decode b1"]
    assert decoded and all(r["new_tokens"] == 2 and r["tokens"] == 2 for r in decoded)
    assert data["settings"]["new_tokens"] == 64 and data["settings"]["repeat"] == 1
    assert data["machine"]["specformer"].startswith(specformer.__version__)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_decode_bytes_are_the_weights_and_the_kv_cache_a_step_reads(kind: str) -> None:
    # every weight but the embedding tables (one row of them is read), plus the keys and
    # values of every position up to the new one; activations add about 1% at this size
    d, layers, kv_heads, vocab, prompt, steps = 256, 2, 2, 1024, 24, 4
    spec = (common.llama_style(d, layers, 4, kv_heads, 512, vocab, 64) if kind == "llama"
            else common.gpt2_style(d, layers, 4, vocab, 64))
    shape = common.Shape(kind, spec, batch=1, seq_len=64)
    adapter = common.build_single(shape, CPU, "specformer")
    adapter.model.eval()
    batch = make_batch(shape, CPU, batch=1, seq_len=prompt, seed=1)
    weights = sum(p.numel() * 4 for n, p in adapter.model.named_parameters()
                  if not n.startswith("embed.") or (kind == "gpt2" and n == "embed.tokens.weight"))
    heads_kv = kv_heads if kind == "llama" else 4
    kv = 2 * layers * heads_kv * (d // 4) * 4 * sum(prompt + 1 + i for i in range(steps)) / steps
    got = inference.decode_bytes(adapter, batch, steps, bf16=False, dev=CPU)
    assert weights + kv <= got <= 1.02 * (weights + kv)


@pytest.mark.slow
def test_memory_quick(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    memory.main(["--quick", "--shapes", "llama-style", "--precisions", "fp32", "--out", str(out)])
    rows = {r["library"]: r for r in _load(out)["results"]}
    assert {"specformer", "transformers"} <= set(rows)
    assert rows["specformer"]["params"] == rows["transformers"]["params"]
    for r in rows.values():
        assert r["peak_bytes"] >= r["baseline_bytes"] > 0
        assert r["added_bytes"] == r["peak_bytes"] - r["baseline_bytes"]
        # at least the weights, their gradients and AdamW's two moments, in float32: the tiny
        # model measured does not reuse the pages its tiny warm-up freed
        assert r["added_bytes"] >= 16 * r["params"], r
    assert "| llama-style | fp32 | specformer |" in report.render(_load(out))


def test_attention_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # each shape's attention both ways; the row says which path specformer took, and the two
    # compute the same attention
    from specformer.components import attention as attention_module

    monkeypatch.setattr(attention_module, "MATMUL_ATTENTION", True)  # whatever this machine measures
    monkeypatch.setattr(attention_module, "FLOAT32_ATTENTION", False)
    out = tmp_path / "attention.json"
    attention.main(["--quick", "--shapes", "gpt2-style", "t5-style", "llama-style", "--dims", "1,6,2,40,8",
                    "--out", str(out)])
    data = _load(out)
    assert [(r["shape"], r["precision"]) for r in data["results"]] == [
        (s, p) for s in ("gpt2-style", "llama-style", "dims") for p in ("fp32", "bf16")]  # t5's trained bias: left out
    extra = data["results"][-1]
    assert (extra["batch"], extra["heads"], extra["kv_heads"], extra["seq_len"], extra["head_dim"]) == (1, 6, 2, 40, 8)
    for r in data["results"]:
        rows = min(128, r["seq_len"])
        assert r["specformer_path"] == ("fused kernel" if r["precision"] == "fp32" else f"products, blocks of {rows} rows")
        assert r["output_max_diff"] < (1e-5 if r["precision"] == "fp32" else 0.05)
        assert r["speedup_of_specformer"] == pytest.approx(r["torch_ms"] / r["specformer_ms"])
    llama = next(r for r in data["results"] if r["shape"] == "llama-style")
    assert (llama["heads"], llama["kv_heads"], llama["causal"]) == (4, 2, True)
    table = report.render(data)
    assert "| llama-style | bf16 | 2, 4 / 2, 32, 8 | products, blocks of 32 rows |" in table
    with pytest.raises(SystemExit, match="HKV dividing H"):
        attention.main(["--quick", "--shapes", "llama-style", "--dims", "1,6,4,40,8"])


def test_cli_quick(tmp_path: Path) -> None:
    out = tmp_path / "cli.json"
    cli.main(["--quick", "--out", str(out)])
    rows = {r["command"]: r for r in _load(out)["results"]}
    assert {"show", "diff 7b 70b"} <= set(rows)
    for r in rows.values():
        assert r["wall_s"] > 0 and r["peak_rss_bytes"] > 0
    # the launcher keeps the benchmark's own memory (torch is loaded here) out of the children's peak
    assert rows["python -c pass (start-up floor)"]["peak_rss_bytes"] < 100 * 2**20
    assert "| diff 7b 70b |" in report.render(_load(out))


def test_data_quick(tmp_path: Path) -> None:
    out = tmp_path / "data.json"
    data.main(["--quick", "--out", str(out)])
    payload = _load(out)
    floor, written, cached = payload["results"]
    # the same ids as the tokenizers library's, and one end-of-text token a document
    assert written["tokens"] == floor["tokens"] + payload["settings"]["documents"] == cached["tokens"]
    assert written["of_floor"] == pytest.approx(floor["seconds"] / written["seconds"])
    assert "| specformer token_arrays, from the cache |" in report.render(payload)


def test_cli_rejects_a_failing_command() -> None:
    with pytest.raises(RuntimeError, match="exited with"):
        cli.run_command([*cli._specformer(), "show", "no-such-spec-anywhere"])


def test_run_all_writes_one_file_per_benchmark(tmp_path: Path) -> None:
    # --threads goes to the benchmarks that run models; cli runs commands and has no such option
    run_all.main(["--quick", "--only", "cli", "--threads", "1", "--out-dir", str(tmp_path)])
    assert _load(tmp_path / "cli.json")["benchmark"] == "cli"


@pytest.mark.parametrize("option", [["--threads", "4"], ["--shapes", "llama-style"], ["--libraries", "transformers"]])
def test_the_cli_benchmark_refuses_the_options_it_would_ignore(option: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--quick", *option])
    assert info.value.code == 2


def _saved_storages(adapter, batch, *, training_loss: bool = False) -> dict[int, tuple[int, tuple[int, ...]]]:
    """(bytes, shape) of each distinct storage autograd keeps saved for backward after one
    forward + loss (the library's own training loss with ``training_loss``, else
    cross-entropy of the logits). Tensors saved by a graph gone by then do not count."""
    saved: list[weakref.ref] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if training_loss:
            loss = adapter.loss(batch)
        else:
            logits = adapter.logits(batch)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.labels.flatten())
    storages = {}
    for ref in saved:
        t = ref()
        if t is not None:
            storages[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), tuple(t.shape))
    del loss
    return storages


def _saved_bytes(adapter, batch) -> int:
    return sum(n for n, _ in _saved_storages(adapter, batch).values())


@pytest.mark.parametrize("name", ["llama-style", "gpt2-style", "t5-style"])
def test_specformer_saves_no_more_for_backward_than_transformers(name: str) -> None:
    # with rotary, q and k are new tensors; v must not keep the whole fused qkv output alive
    shape = select_shapes([name], quick=True)[0]
    ours, theirs = build_adapters(shape, CPU, ["specformer", "transformers"])
    batch = make_batch(shape, CPU)
    assert _saved_bytes(ours, batch) <= _saved_bytes(theirs, batch)


@pytest.mark.parametrize("name", ["gpt2-style", "bert-style", "llama-style"])
def test_specformer_training_loss_keeps_no_logits_for_backward(name: str) -> None:
    # at the benchmark's own sizes (vocabulary 8192), the (B, T, V) logits, their float32
    # copy and log-softmax are the largest tensors transformers keeps for backward
    shape = select_shapes([name], quick=False)[0]
    ours, theirs = build_adapters(shape, CPU, ["specformer", "transformers"])
    batch = make_batch(shape, CPU)
    vocab = shape.spec["vocab_size"]
    mine = _saved_storages(ours, batch, training_loss=True).values()
    peer = _saved_storages(theirs, batch, training_loss=True).values()

    def logits_like(saved):  # (..., V) over the positions: logits, log-probabilities
        return [shape for _, shape in saved if len(shape) >= 2 and shape[-1] == vocab]

    assert logits_like(peer) and not logits_like(mine), logits_like(mine)
    assert sum(n for n, _ in mine) < sum(n for n, _ in peer)


def test_mlm_step_runs_the_head_on_labelled_positions_only() -> None:
    shape = select_shapes(["bert-style"], quick=True)[0]
    (ours,) = build_adapters(shape, CPU, ["specformer"])
    batch = make_batch(shape, CPU)
    labelled = int((batch.labels != -100).sum())
    assert 0 < labelled < 0.4 * batch.labels.numel()
    calls = train.record_matmuls(ours, batch, bf16=False, dev=CPU)
    recorded = sum(count * train._flops(sig) for sig, count in calls.items())
    spec = shape.model_spec()
    f = flops_per_token(spec, seq_len=shape.seq_len, count="executed")
    layers = sum(v for k, v in f.components.items() if not k.endswith("scores") and k != "head")
    want = 3 * (layers * shape.tokens + f.components["head"] * labelled)
    assert recorded == pytest.approx(want, rel=0.01)
    # the step's products plus attention's scores, which record_matmuls does not see (SDPA)
    needed = flops_per_token(spec, seq_len=shape.seq_len)
    scores = sum(v for k, v in needed.components.items() if k.endswith("scores"))
    assert train.executed_flops(spec, shape, batch) == pytest.approx(recorded + 3 * scores * shape.tokens, rel=0.01)


@pytest.mark.parametrize("module", [train, padded, inference, memory, attention, cli, run_all],
                         ids=lambda m: m.__name__.split(".")[-1])
def test_help_describes_the_benchmark_in_whole_sentences(module, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    first_paragraph = " ".join(module.__doc__.split("\n\n")[0].split())
    assert first_paragraph in text and first_paragraph.endswith(".")


def test_report_tells_runs_apart_refuses_mixed_benchmarks_and_names_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # results/*/train.json: files of one name in two folders were one column, the second run's
    row = {"shape": "gpt2-style", "precision": "fp32", "library": "transformers", "speedup_of_specformer": 1.14}
    for folder, ratio in (("a", 1.14), ("b", 9.99)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "train.json").write_text(json.dumps(
            {"benchmark": "train", "machine": {}, "results": [{**row, "speedup_of_specformer": ratio}]}))
    report.main(["--ratios", str(tmp_path / "a" / "train.json"), str(tmp_path / "b" / "train.json")])
    out = capsys.readouterr().out
    assert "| gpt2-style | fp32 | transformers | 1.14× | 9.99× | 1.14–9.99× |" in out
    (tmp_path / "inference.json").write_text(json.dumps({"benchmark": "inference", "results": []}))
    with pytest.raises(SystemExit):
        report.main(["--ratios", str(tmp_path / "a" / "train.json"), str(tmp_path / "inference.json")])
    assert "--ratios compares runs of one benchmark; these files are of inference, train" in capsys.readouterr().err
    (tmp_path / "cut.json").write_text('{"benchmark": "train", "results": [{"shape": ')
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "cut.json")])
    assert f"{tmp_path / 'cut.json'}: not a benchmark's JSON (" in capsys.readouterr().err


def test_libraries_come_in_their_order_specformer_first_however_asked() -> None:
    from benchmarks.common import available_libraries

    assert available_libraries(["transformers", "specformer"]) == ["specformer", "transformers"]
    assert available_libraries(["transformers"])[0] == "specformer"
