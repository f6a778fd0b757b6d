"""The code blocks of README.md and docs/*.md, checked against the code.

Every fenced block is checked by default; a block is named by its file and the line
of its opening fence (``docs/spec.md:109``), so a failure says where in the docs to look.

- ```yaml: a spec loads and validates with :func:`specformer.load_spec`; a fragment is
  merged into the preset :data:`YAML_FRAGMENT_BASE` names. A block whose first line names
  a file (``# my-variant.yaml``) is that file for the other blocks' code and commands.
- ```python: runs statement by statement in a fresh namespace, in a temporary folder;
  a trailing comment that states a value is asserted: ``expr  # 64`` (the value),
  ``x = ...  # (2, 16, 50257)`` (``x.shape``), ``# out.logits: (2, 5, 32128)``,
  ``# out.loss: scalar``, ``# out.logits: None``, ``# out.cache is cache``. Blocks that
  need a model, a checkpoint or a Hugging Face folder get one from :data:`PY_SETUP`.
- ```bash / ```console, and ``specformer ...`` in inline code: every command line is
  parsed by the CLI's own (typer) command, without running it; a preset it names exists
  and its ``--set`` overrides validate on it; ``list``, ``schema``, ``validate``, ``show``
  and ``diff`` run, and exit 0 unless the block shows an error, whose lines must then be
  printed. ``pip install .[extras]`` names extras pyproject.toml has.
- ```toml: the plugin entry point, installed with the plugin code of docs/spec.md.
- plain blocks: a command synopsis lists options the command has, and all of them; the
  package layout names the package's modules; the module tree, every state-dict name.

Blocks left out are listed in :data:`SKIPPED`, each with the reason.
"""

from __future__ import annotations

import ast
import io
import os
import re
import shlex
import subprocess
import sys
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from specformer.cli import app
from specformer.specs.errors import SpecError
from specformer.specs.loader import load_spec, preset_names

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    after: str  # the prose right after the block, up to the next block or heading

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def key(self) -> str:
        """``file: first line``: how the lists below name a block, so they survive edits
        above it."""
        first = next((ln.strip() for ln in self.text.splitlines() if ln.strip()), "")
        return f"{self.file}: {first}"


def read_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = path.relative_to(ROOT).as_posix()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if not lines[i][:indent].strip() else lines[i])
            i += 1
        i += 1
        after = []
        j = i
        while j < len(lines) and not FENCE.match(lines[j]) and not lines[j].startswith("#"):
            after.append(lines[j])
            j += 1
        found.append(Block(rel, start, lang, "\n".join(body) + "\n", "\n".join(after)))
    return found


BLOCKS = [b for path in DOC_FILES for b in read_blocks(path)]


def _blocks(*langs: str) -> list[Any]:
    return [pytest.param(b, id=b.id) for b in BLOCKS if b.lang in langs]


# --------------------------------------------------------------------------- what is left out, and why

SKIPPED: dict[str, str] = {
    "docs/architecture.md: YAML text ──loader──▶ plain dict ──pydantic──▶ ModelSpec ──builder──▶ nn.Module ──▶ LightningModule ──▶ lightning.Trainer":
        "a diagram of the data flow",
    "docs/components.md: pre-norm (GPT-2, Llama)                 post-norm (Vaswani et al. 2017, BERT)":
        "a diagram of the residual wiring",
    "docs/training.md: runs/<spec name>/<timestamp>/":
        "the run folder, written by a training run: tests/training/test_train.py checks its files",
}

# fragments of a spec, checked merged into a preset
YAML_FRAGMENT_BASE: dict[str, str] = {
    # 12 layers of 12 heads: GPT-2 small's stack
    "docs/spec.md: decoder:": "gpt2-small",
}


def _heterogeneous_stack(spec: Any) -> None:
    # "the example's first six layers keep n_heads: 12"; "later entries win"
    stack = spec.decoder
    for i in range(6):
        assert stack.layer(i).attention.n_heads == 12
        assert stack.layer(i).attention.sliding_window == 256
    assert stack.layer(6).attention.sliding_window is None
    assert stack.layer(11).ffn.type == "glu" and stack.layer(10).ffn.type != "glu"


# what the prose around a YAML block says of it
YAML_CHECKS: dict[str, Callable[[Any], None]] = {
    "docs/spec.md: decoder:": _heterogeneous_stack,
}


def test_every_listed_block_exists() -> None:
    """A list entry that names no block (or two) is stale: it would skip nothing, or the wrong one."""
    keys = [b.key for b in BLOCKS]
    listed = [*SKIPPED, *YAML_FRAGMENT_BASE, *YAML_CHECKS, *PY_SETUP, *PY_CONTINUES, *PY_CONTINUES.values(),
              *PY_SUBPROCESS, *PY_CHECKS, *CLI_FILES, PLUGIN_TOML, PLUGIN_CODE]
    for key in listed:
        assert keys.count(key) == 1, f"{key!r} names {keys.count(key)} blocks in the docs"


def test_blocks_are_found() -> None:
    langs = {b.lang for b in BLOCKS}
    assert {"yaml", "python", "bash", "console", ""} <= langs
    unknown = [b.id for b in BLOCKS if b.lang not in {"yaml", "python", "bash", "console", "", "toml"}]
    assert not unknown, f"blocks in a language this test does not check: {unknown}"


def _skip_if_listed(block: Block) -> None:
    if block.key in SKIPPED:
        pytest.skip(SKIPPED[block.key])


# --------------------------------------------------------------------------- files the docs define


def doc_files() -> dict[str, str]:
    """YAML blocks whose first line names a file (``# my-variant.yaml — ...``): the commands
    and code of the other blocks use them by that name."""
    files = {}
    for b in BLOCKS:
        m = re.match(r"#\s*([\w.-]+\.ya?ml)\b", b.text)
        if b.lang == "yaml" and m:
            files[m.group(1)] = b.text
    return files


def write_doc_files(folder: Path) -> None:
    for name, text in doc_files().items():
        (folder / name).write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------- yaml


@pytest.mark.parametrize("block", _blocks("yaml"))
def test_yaml_block_is_a_valid_spec(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _skip_if_listed(block)
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(block.text)
    assert isinstance(data, dict), f"{block.id}: not a mapping"
    text = block.text
    if block.key in YAML_FRAGMENT_BASE:
        assert "extends" not in data
        text += f"extends: {YAML_FRAGMENT_BASE[block.key]}\n"  # last, so the block's lines keep their numbers
    else:
        assert "extends" in data or "kind" in data, (
            f"{block.id} is neither a whole spec nor listed in YAML_FRAGMENT_BASE with the preset it belongs to"
        )
    named = re.match(r"#\s*([\w.-]+\.ya?ml)\b", block.text)
    path = tmp_path / (named.group(1) if named else "block.yaml")
    path.write_text(text, encoding="utf-8")
    try:
        spec = load_spec(str(path))
    except SpecError as exc:
        pytest.fail(f"{block.id} (line 1 of {path.name} is line {block.line + 1} of {block.file}):\n{exc}")
    if block.key in YAML_CHECKS:
        YAML_CHECKS[block.key](spec)


@pytest.mark.parametrize("block", _blocks("toml"))
def test_toml_block_names_the_plugin_entry_point_group(block: Block) -> None:
    from specformer.registry import PLUGIN_GROUP

    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads(block.text)
    assert PLUGIN_GROUP in data["project"]["entry-points"], f"{block.id}: not the {PLUGIN_GROUP!r} group"


PLUGIN_TOML = "docs/spec.md: [project.entry-points.\"specformer.plugins\"]"
PLUGIN_CODE = "docs/spec.md: from typing import Literal"


def test_the_plugin_example_registers_its_type_once_installed(tmp_path: Path) -> None:
    """The plugin of docs/spec.md, installed (its entry point in a dist-info folder on the
    path, as pip leaves it): ``ffn: {type: relu2}`` validates and is in the JSON Schema."""
    tomllib = pytest.importorskip("tomllib")
    blocks = {b.key: b for b in BLOCKS}
    entry_points = tomllib.loads(blocks[PLUGIN_TOML].text)["project"]["entry-points"]
    (group, points), = entry_points.items()
    (name, target), = points.items()
    module = target.split(":")[0]
    (tmp_path / "my_plugin-0.1.dist-info").mkdir()
    (tmp_path / "my_plugin-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (tmp_path / "my_plugin-0.1.dist-info" / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
    path = tmp_path / Path(*module.split("."))
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "__init__.py").write_text("")
    path.with_suffix(".py").write_text(blocks[PLUGIN_CODE].text)
    (tmp_path / "spec.yaml").write_text(f"extends: gpt-nano\ndecoder:\n  ffn: {{type: {name}}}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    script = (
        "from specformer.cli import app\n"
        "from specformer.specs.jsonschema import spec_json_schema\n"
        "import json, sys\n"
        f"assert {name!r} in json.dumps(spec_json_schema())\n"
        "sys.argv = ['specformer', 'validate', 'spec.yaml', '-q']\n"
        "app()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{PLUGIN_TOML} + {PLUGIN_CODE}:\n{done.stdout}{done.stderr[-3000:]}"


# --------------------------------------------------------------------------- python

NUMBER = re.compile(r"#\s*(-?\d[\d_]*)\s*(?:,|$)")
SHAPE = re.compile(r"#\s*\((\d+(?:,\s*\d+)*),?\)")
ATTRIBUTE = re.compile(r"([A-Za-z_][\w.]*):\s*(\((?:\d+(?:,\s*\d+)*)?,?\)|None|scalar)")
IDENTITY = re.compile(r"\b([A-Za-z_][\w.]*) is ([A-Za-z_][\w.]*)\s*$")


def _comments(source: str) -> dict[int, str]:
    return {
        tok.start[0]: tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def run_python(source: str, *, filename: str, first_line: int, ns: dict[str, Any]) -> list[str]:
    """Run ``source`` one top-level statement at a time in ``ns``; assert what each
    statement's trailing comment says of its value. Returns the claims checked."""
    tree = ast.parse(source)
    ast.increment_lineno(tree, first_line - 1)
    comments = {line + first_line - 1: text for line, text in _comments(source).items()}
    checked: list[str] = []

    def value(expr: str) -> Any:
        return eval(compile(expr, filename, "eval"), ns)

    for stmt in tree.body:
        where = f"{filename}:{stmt.lineno}"
        comment = comments.get(stmt.end_lineno or stmt.lineno, "")
        if isinstance(stmt, ast.Expr):
            result = eval(compile(ast.Expression(stmt.value), filename, "eval"), ns)
            m = NUMBER.match(comment)
            if m:
                expected = int(m.group(1).replace("_", ""))
                assert result == expected, f"{where}: the docs say {expected}, the code gives {result}"
                checked.append(f"{where}: {expected}")
            continue
        exec(compile(ast.Module(body=[stmt], type_ignores=[]), filename, "exec"), ns)
        m = SHAPE.match(comment)
        if m and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            shape = tuple(ns[name].shape)
            assert shape == _shape(m.group(1)), f"{where}: the docs say {name} is {m.group(1)}, the code gives {shape}"
            checked.append(f"{where}: {name} {shape}")
        for expr, said in ATTRIBUTE.findall(comment):
            got = value(expr)
            if said == "None":
                assert got is None, f"{where}: the docs say {expr} is None, the code gives {type(got).__name__}"
            elif said == "scalar":
                assert got.dim() == 0, f"{where}: the docs say {expr} is a scalar, the code gives {tuple(got.shape)}"
            else:
                assert tuple(got.shape) == _shape(said), f"{where}: the docs say {expr}: {said}, the code gives {tuple(got.shape)}"
            checked.append(f"{where}: {expr} {said}")
        m = IDENTITY.search(comment)
        if m and all(side.split(".")[0] in ns for side in m.groups()):  # names, not prose ("the space is healed")
            assert value(m.group(1)) is value(m.group(2)), f"{where}: the docs say {m.group(1)} is {m.group(2)}"
            checked.append(f"{where}: {m.group(0)}")
    return checked


def test_run_python_asserts_what_the_comments_state() -> None:
    """The claims are checked: a wrong number, shape or None fails."""
    ok = "import torch\nx = torch.zeros(2, 3)    # (2, 3)\nx.numel()   # 6, six\nclass O: a = None\no = O()  # o.a: None\n"
    assert len(run_python(ok, filename="t.md", first_line=1, ns={})) == 3
    for wrong in ("x = torch.zeros(2, 3)  # (3, 2)", "x.numel()  # 7", "o.a = 1  # o.a: None", "y = x  # y is x\ny = x + 0  # y is x"):
        source = "import torch\nx = torch.zeros(2, 3)\nclass O: a = None\no = O()\n" + wrong + "\n"
        with pytest.raises(AssertionError, match="t.md:5|t.md:6"):
            run_python(source, filename="t.md", first_line=1, ns={})


# ---- what some blocks need before they run


def _same_vocab_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A decoder and an encoder-decoder with one vocabulary, and the inputs the cache and
    loss examples use (their names, as the text around them has them)."""
    import torch

    from specformer import build_model

    torch.manual_seed(0)
    model = build_model(load_spec("gpt-nano", overrides=["vocab_size=64"]))
    t5 = build_model("t5-nano")
    ids = torch.randint(0, 64, (2, 12))
    return {
        "torch": torch, "model": model, "t5": t5, "ids": ids, "labels": ids.clone(),
        "prompt_ids": ids, "mask": torch.ones_like(ids), "src_ids": ids, "src_mask": torch.ones_like(ids),
        "start_ids": torch.zeros(2, 1, dtype=torch.long),
    }


def _small_bpe(tmp_path: Path) -> Any:
    from specformer.data.corpus import Corpus
    from specformer.data.tokenizers import bpe_tokenizer
    from specformer.specs.training import BPETokenizerSpec

    text = "def model(x):\n    return x + 1\n\nclass Spec:\n    pass\n" * 40
    corpus = Corpus(name="docs", train=[text], val=[text], fingerprint="docs")
    return bpe_tokenizer(BPETokenizerSpec(vocab_size=300), corpus=corpus, cache_dir=tmp_path / "cache")


def _gpt_nano_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``runs/gpt-nano/<ts>/checkpoints/last.ckpt``, as a run writes it (untrained weights)."""
    import torch

    from specformer import build_model
    from specformer.training.checkpoint import FORMAT_VERSION

    spec = load_spec("gpt-nano")
    model = build_model(spec)
    raw = {
        "specformer": {"format": FORMAT_VERSION, "spec": spec.to_dict(), "tokenizer": _small_bpe(tmp_path).state()},
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "global_step": 0,
    }
    path = tmp_path / "runs" / "gpt-nano" / "<ts>" / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    torch.save(raw, path)
    return {}


def _hf_model_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``path/to/model_dir``: a one-layer GPT-2 as ``save_pretrained`` writes it, and its
    ``config.json`` at ``path/to/config.json``; ``tok``, a tokenizer to export with."""
    transformers = pytest.importorskip("transformers")

    folder = tmp_path / "path" / "to" / "model_dir"
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    (tmp_path / "path" / "to" / "config.json").write_text((folder / "config.json").read_text())
    return {"tok": _small_bpe(tmp_path)}


def _small_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Two steps on a slice of the stdlib with the byte tokenizer, instead of 200 on all of it
    with a BPE learned from it: ``load_spec`` adds the overrides, ``Trainer`` the limits."""
    import sysconfig

    import lightning

    import specformer

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    small = [f"training.data={{type: files, paths: [{stdlib / 'json' / '*.py'}]}}", "training.tokenizer={type: byte}",
             "vocab_size=259", "training.batch_size=2", "training.seq_len=32", "training.val_batches=1",
             "training.num_workers=0"]
    monkeypatch.setattr(specformer, "load_spec", lambda source, overrides=(): load_spec(source, [*overrides, *small]))

    class SmallTrainer(lightning.Trainer):
        def __init__(self, **kwargs: Any) -> None:
            kwargs.update(max_steps=2, val_check_interval=1, limit_val_batches=1, enable_progress_bar=False,
                          enable_model_summary=False, accelerator="cpu", devices=1)
            super().__init__(**kwargs)

    monkeypatch.setattr(lightning, "Trainer", SmallTrainer)
    return {}


PY_SETUP: dict[str, Callable[[Path, pytest.MonkeyPatch], dict[str, Any]]] = {
    "docs/components.md: out = model(ids, labels=labels)          # out.loss: scalar; the logits were never held": _same_vocab_models,
    "docs/components.md: out = model(prompt_ids, attention_mask=mask, use_cache=True)   # a new cache, filled by the prompt": _same_vocab_models,
    "docs/training.md: import torch": _gpt_nano_checkpoint,
    "docs/components.md: from specformer.components import lay_out_for_decoding": _same_vocab_models,
    "docs/interop.md: from specformer.builder import build_model": _hf_model_folder,
    "docs/training.md: import lightning as L": _small_training,
}

# blocks that go on from an earlier one: run in its namespace, after it
PY_CONTINUES: dict[str, str] = {
    "docs/training.md: prompts = [ckpt.tokenizer.encode(p) for p in (\"def\", \"class Spec\")]": "docs/training.md: import torch",
}

# blocks that register a type in the process-wide registry before the schema is built: a
# fresh interpreter, as the script the text describes; the files they import are given
SCALENORM = '''
import torch
from torch import nn


class ScaleNorm(nn.Module):
    def __init__(self, spec, *, dim):
        super().__init__()
        self.eps = spec.eps
        self.scale = nn.Parameter(torch.tensor(float(dim) ** 0.5))

    def forward(self, x):
        return self.scale * x / x.norm(dim=-1, keepdim=True).clamp_min(self.eps)
'''
PY_SUBPROCESS: dict[str, dict[str, str]] = {
    "docs/components.md: from typing import Literal": {"my_package/__init__.py": "", "my_package/norms.py": SCALENORM},
}



# what the comments and prose say of a block's results, beyond the values they state
def _round_trip(ns: dict[str, Any]) -> None:
    # "load -> dump -> load gives an equal spec"
    assert load_spec(yaml.safe_load(ns["text"])) == ns["spec"]


def _loss_without_logits(ns: dict[str, Any]) -> None:
    out = ns["model"](ns["input_ids"], decoder_input_ids=ns["dec"][:, :-1], labels=ns["dec"][:, 1:])
    assert out.loss.dim() == 0 and getattr(out, "logits", None) is None  # "no (B, T, V) logits held"


def _logits_never_held(ns: dict[str, Any]) -> None:
    from specformer.components.outputs import LogitsNotComputedError

    with pytest.raises(LogitsNotComputedError, match=r"model\.head\(out\.hidden_states\)$"):
        _ = ns["out"].logits
    assert getattr(ns["out"], "logits", None) is None and "logits=<not computed: labels were given>" in repr(ns["out"])


def _meta_build(ns: dict[str, Any]) -> None:
    assert all(p.is_meta for p in ns["big"].parameters())  # "nothing allocated"


def _cache_position(ns: dict[str, Any]) -> None:
    # "positions already cached = the position of the next token": the prompt, then one
    assert len(ns["cache"]) == ns["cache"].length == ns["prompt_ids"].shape[1] + 1


def _equal_transformers_model(ns: dict[str, Any]) -> None:
    import torch

    # "the equal transformers model (eval mode)"
    hf_model, model = ns["hf_model"], ns["model"]
    assert not hf_model.training
    ids = torch.randint(0, 300, (2, 10))
    model.eval()
    torch.testing.assert_close(hf_model(ids).logits, model(ids).logits, atol=1e-4, rtol=0)
    assert (Path("hf_out") / "config.json").is_file() and (Path("hf_out") / "tokenizer.json").is_file()


def _healed_prompt(ns: dict[str, Any]) -> None:
    # "ids of "def"; the space is healed"
    prompt, tokenizer = ns["prompt"], ns["ckpt"].tokenizer
    assert prompt.ids == tokenizer.encode("def") and prompt.healed == " " and prompt.allowed_tokens is not None
    assert ns["out"].shape[1] == len(prompt.ids) + 50


def _trained_with_plain_lightning(ns: dict[str, Any]) -> None:
    trainer = ns["trainer"]
    assert trainer.global_step == 2
    # "Metrics: train/loss, train/lr, val/loss, val/ppl" (val/exact_match: sequence-to-sequence)
    assert {"train/loss", "train/lr", "val/loss", "val/ppl"} <= set(trainer.callback_metrics), sorted(trainer.callback_metrics)


def _trained_on_own_dataloader(ns: dict[str, Any]) -> None:
    import torch

    trainer, module = ns["trainer"], ns["module"]
    assert trainer.global_step == 5 and module.tokens_seen == 5 * 8 * 16
    assert torch.isfinite(trainer.callback_metrics["train/loss"])


PY_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "README.md: from specformer import load_spec, build_model": _round_trip,
    "README.md: import torch": _loss_without_logits,
    "docs/components.md: out = model(ids, labels=labels)          # out.loss: scalar; the logits were never held":
        _logits_never_held,
    "docs/components.md: import torch": _meta_build,
    "docs/components.md: out = model(prompt_ids, attention_mask=mask, use_cache=True)   # a new cache, filled by the prompt": _cache_position,
    "docs/interop.md: from specformer.builder import build_model": _equal_transformers_model,
    "docs/training.md: import torch": _healed_prompt,
    "docs/training.md: import lightning as L": _trained_with_plain_lightning,
    "docs/training.md: from torch.utils.data import DataLoader": _trained_on_own_dataloader,
}

PREVIOUS = {b.key: b for b in BLOCKS}


@pytest.mark.parametrize("block", _blocks("python"))
def test_python_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFORMER_CACHE", str(tmp_path / "cache"))
    write_doc_files(tmp_path)
    source = block.text
    if block.key in SKIPPED:
        # the imports still name what the package has
        tree = ast.parse(source)
        imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        exec(compile(ast.Module(body=imports, type_ignores=[]), block.file, "exec"), {})
        pytest.skip(SKIPPED[block.key])
    if block.key in PY_SUBPROCESS:
        for name, text in PY_SUBPROCESS[block.key].items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
        (tmp_path / "script.py").write_text(source + "\nprint('ran to the end')\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
        done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and "ran to the end" in done.stdout, f"{block.id}:\n{done.stderr[-3000:]}"
        return
    ns: dict[str, Any] = {"__name__": "__docs__"}
    chain = [block]
    while chain[0].key in PY_CONTINUES:
        chain.insert(0, PREVIOUS[PY_CONTINUES[chain[0].key]])
    for part in chain:
        if part.key in PY_SETUP:
            ns.update(PY_SETUP[part.key](tmp_path, monkeypatch))
        run_python(part.text, filename=part.file, first_line=part.line + 1, ns=ns)
    if block.key in PY_CHECKS:
        PY_CHECKS[block.key](ns)


def test_stated_values_are_found() -> None:
    """The patterns above match the values the docs state (a count, a shape), so a change
    to either cannot leave them silently unchecked."""
    comments = [c for b in BLOCKS if b.lang == "python" for c in _comments(b.text).values()]
    assert sum(bool(NUMBER.match(c)) for c in comments) >= 4
    assert sum(bool(SHAPE.match(c) or ATTRIBUTE.search(c)) for c in comments) >= 4
    assert "# 6738415616" in comments and "# (2, 16, 50257)" in comments


# --------------------------------------------------------------------------- command lines

GROUP: Any = typer.main.get_command(app)  # typer's own click Group
CHEAP = {"list", "schema", "validate", "show", "diff"}
SPEC_PARAMS = {"spec", "specs"}
REPO_TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}

# files the output of a block was made from, beyond those the docs define
CLI_FILES: dict[str, dict[str, str]] = {
    # the spec the README's error example reports on
    "README.md: $ specformer validate my.yaml": {
        "my.yaml": "extends: gpt2-small\nname: my\ndecoder:\n  attention: {n_heads: 12, n_kv_heads: 5}\n"
                   "  ffn: {type: swiglu}\n  n_layer: 4\n",
    },
}


@dataclass(frozen=True)
class Command:
    line: int
    argv: list[str]  # after "specformer"
    output: list[str]  # the lines a console block shows after it


def _words(text: str) -> list[str]:
    words = shlex.split(text, comments=True)
    for i, w in enumerate(words):
        if w in {">", ">>", "2>", "|", "&&", "||", ";", "&"}:
            return words[:i]
    return words


def commands(block: Block) -> list[Command]:
    """The ``specformer`` command lines of a bash or console block (continuations joined)."""
    found: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        start, text = i, lines[i]
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1] + " " + lines[i]
        i += 1
        if block.lang == "console":
            if not text.startswith("$ "):
                m = re.search(r"\bspecformer ([a-z-]+ .*)$", text)
                if m and m.group(1).split()[0] in GROUP.commands:  # a command named in an output line
                    found.append(Command(block.line + 1 + start, _words(m.group(1)), []))
                elif found:
                    found[-1].output.append(text)
                continue
            text = text[2:]
        for part in re.split(r"&&|\|\||;|\|", text):
            words = _words(part)
            if words and words[0] == "specformer":
                found.append(Command(block.line + 1 + start, words[1:], []))
    return found


def inline_commands(path: Path) -> list[tuple[Block, Command]]:
    """``specformer ...`` in the prose's inline code, checked as the blocks' lines are."""
    rel = path.relative_to(ROOT).as_posix()
    found = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in re.finditer(r"(?<!`)`(specformer [^`]+)`(?!`)", line):
            found.append((Block(rel, n, "inline", m.group(1), ""), Command(n, _words(m.group(1))[1:], [])))
    return found


CLI_CASES = [
    *(pytest.param(block, command, id=f"{block.file}:{command.line}")
      for block in BLOCKS if block.lang in ("bash", "console")
      for command in commands(block)),
    *(pytest.param(block, command, id=f"{block.file}:{command.line}:inline")
      for path in DOC_FILES for block, command in inline_commands(path)),
]


def test_cli_lines_are_found() -> None:
    assert len(CLI_CASES) > 30
    assert any(c.values[1].argv[:2] == ["validate", "my.yaml"] for c in CLI_CASES)


def _parse(sub: Any, argv: list[str], where: str, *, whole: bool = True) -> Any:
    """The command's own parse of ``argv`` (options, their values' types), without running it;
    not ``whole``, the arguments may be left out (prose naming a command and an option)."""
    known = {o for p in sub.params for o in (*p.opts, *p.secondary_opts)}
    for word in argv:
        if word.startswith("-") and word != "-" and not re.match(r"-\d", word):
            name = word.split("=")[0]
            assert name in known, f"{where}: {sub.name} has no option {name} (it has {sorted(known)})"
    try:
        ctx = sub.make_context(f"specformer {sub.name}", list(argv), resilient_parsing=not whole)
    except Exception as exc:  # typer's click: a usage error
        pytest.fail(f"{where}: specformer {sub.name} refuses {argv}: {exc}")
    assert not ctx.args, f"{where}: {sub.name} takes no further argument {ctx.args}"
    return ctx


@pytest.mark.parametrize(("block", "command"), CLI_CASES)
def test_cli_line(block: Block, command: Command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = f"{block.file}:{command.line}"
    assert command.argv, f"{where}: no command"
    name = command.argv[0]
    if name.startswith("-"):  # an option of specformer itself: --version, --help
        own = {o for p in GROUP.get_params(GROUP.make_context("specformer", ["list"])) for o in (*p.opts, *p.secondary_opts)}
        assert name in own and len(command.argv) == 1, f"{where}: specformer has no option {name} (it has {sorted(own)})"
        return
    assert name in GROUP.commands, f"{where}: no command {name!r} (there are {sorted(GROUP.commands)})"
    sub = GROUP.commands[name]
    inline = block.lang == "inline"
    ctx = _parse(sub, command.argv[1:], where, whole=not inline)

    monkeypatch.chdir(tmp_path)
    write_doc_files(tmp_path)
    for fname, text in CLI_FILES.get(block.key, {}).items():
        (tmp_path / fname).write_text(text)
    specs: list[str] = []
    resolvable = True
    for param in sub.params:
        if param.name not in SPEC_PARAMS or not ctx.params.get(param.name):
            continue
        values = ctx.params[param.name]
        for v in values if isinstance(values, (list, tuple)) else [values]:
            specs.append(v)
            if (tmp_path / v).exists():
                continue
            if v.split("/")[0] in REPO_TOP:
                assert (ROOT / v).exists(), f"{where}: {v} is not in the repository"
            elif re.fullmatch(r"[a-z0-9][a-z0-9-]*", v):
                assert v in preset_names(), f"{where}: no preset {v!r} (there are {preset_names()})"
            else:
                resolvable = False  # the user's own file
    sets = list(ctx.params.get("set_") or [])
    shows_error = any(line.startswith("error:") for line in command.output)
    if len(specs) == 1 and resolvable and not shows_error and not ctx.params.get("training"):
        try:
            load_spec(specs[0], overrides=sets)  # the overrides name fields of that spec, with valid values
        except SpecError as exc:
            pytest.fail(f"{where}: {specs[0]} with {sets}:\n{exc}")

    if name not in CHEAP or not resolvable or inline:
        return
    result = CliRunner().invoke(app, command.argv, env={"COLUMNS": "200"})
    expected = 1 if shows_error else 0
    assert result.exit_code == expected, f"{where}: exit status {result.exit_code}\n{result.output}"
    printed = [line.rstrip() for line in (result.stdout + result.stderr).splitlines()]
    for line in command.output:
        assert line.rstrip() in printed, f"{where}: the docs show\n{line}\nthe command printed\n" + "\n".join(printed)


# --------------------------------------------------------------------------- plain blocks


def _plain_kind(block: Block) -> str:
    if block.key in SKIPPED:
        return "skipped"
    if re.search(r"^specformer [a-z-]+", block.text, re.M):
        return "synopsis"
    if block.text.startswith("specformer/\n"):
        return "layout"
    if block.text.startswith("DecoderModel / EncoderModel"):
        return "module tree"
    return "unknown"


@pytest.mark.parametrize("block", _blocks(""))
def test_plain_block(block: Block) -> None:
    kind = _plain_kind(block)
    if kind == "skipped":
        pytest.skip(SKIPPED[block.key])
    assert kind != "unknown", f"{block.id}: a plain block this test does not know: check it or list it in SKIPPED"
    if kind == "synopsis":
        for line in block.text.splitlines():
            words = line.split()
            sub = GROUP.commands[words[1]]
            options = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", line))
            known = {o for p in sub.params for o in (*p.opts, *p.secondary_opts)}
            assert options <= known, f"{block.id}: {words[1]} has no option {sorted(options - known)}"
            missing = [p.opts[0] for p in sub.params if p.param_type_name == "option"
                       and not set(p.opts + p.secondary_opts) & options]
            assert not missing, f"{block.id}: the synopsis of {words[1]} leaves out {missing}"
    elif kind == "layout":
        package_part = block.text.split("specformer/\n", 1)[1]
        package_part = re.split(r"^\S", package_part, maxsplit=1, flags=re.M)[0]  # up to the next top-level entry
        listed = {m.group(1) for m in re.finditer(r"^  ([\w.]+/?)", package_part, re.M)}
        package = ROOT / "specformer"
        have = {p.name + ("/" if p.is_dir() else "") for p in package.iterdir()
                if not p.name.startswith(("_", ".")) and (p.is_dir() and (p / "__init__.py").exists() or p.suffix == ".py")}
        assert listed == have, f"{block.id}: the layout lists {sorted(listed - have)} and leaves out {sorted(have - listed)}"
        for top in re.findall(r"^([\w.]+/)", block.text, re.M):
            assert (ROOT / top).is_dir(), f"{block.id}: no {top} in the repository"
    elif kind == "module tree":
        _check_module_tree(block)


def _check_module_tree(block: Block) -> None:
    """Every state-dict name of a shipped preset's model appears in the tree, and every
    parameter-free positional module's name in it or in the paragraph after it."""
    from specformer import build_model
    from specformer.components.positional import Positional

    said = set(re.findall(r"[A-Za-z_]\w*", block.text + block.after))
    names: set[str] = set()
    for preset in preset_names():
        model = build_model(preset, device="meta")
        for key in model.state_dict():
            names.update(part for part in key.split(".") if not part.isdigit())
        names.update(path.rsplit(".", 1)[-1] for path, module in model.named_modules() if isinstance(module, Positional))
    missing = sorted(names - said)
    assert not missing, f"{block.id}: names in the shipped presets' models that the tree does not give: {missing}"


# --------------------------------------------------------------------------- bash: installs


@pytest.mark.parametrize("block", _blocks("bash"))
def test_pip_extras_exist(block: Block) -> None:
    tomllib = pytest.importorskip("tomllib")
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for asked in re.findall(r"\.\[([\w,]+)\]", block.text):
        assert set(asked.split(",")) <= extras, f"{block.id}: pip extras {asked} (pyproject has {sorted(extras)})"



# --------------------------------------------------------------------------- links


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_point_at_files_and_headings(path: Path) -> None:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(ROOT)}: ({target})"
        assert linked.exists(), f"{where}: no such file"
        if anchor and linked.suffix == ".md":
            assert anchor in _headings(linked), f"{where}: no heading #{anchor} in {linked.name}"
