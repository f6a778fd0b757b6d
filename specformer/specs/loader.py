"""YAML text -> plain dict -> ModelSpec, keeping the file, line and column of every value.

Loading is safe: only plain YAML data (mappings, lists, strings, numbers, booleans,
null) is accepted; a tag such as ``!!python/object`` is refused, never executed.

``extends:`` names a preset or a path (relative to the file that says it). The
child is deep-merged onto its parent: a mapping merges key by key, anything else
(a list, a scalar, null) replaces, and a mapping whose ``type:`` differs from the
parent's replaces the parent's mapping whole (the parent's fields belong to the
other type). Chains work; a cycle is an error.

``--set a.b.c=value`` overrides are applied last; the value is parsed as YAML, so
``4`` is an int, ``true`` a bool and ``{type: rope}`` a mapping. Files and ``--set``
read plain values by YAML 1.2's rules: ``010`` is 10, ``yes`` and ``1:30`` are strings.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import typing
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from specformer.specs.errors import Position, SpecError, SpecProblem, bom_encoding, did_you_mean
from specformer.specs.merge import deep_merge, family_fields, implicit_type

if TYPE_CHECKING:  # the schema is imported when a spec is first loaded, after any registration
    from specformer.specs.schema import ModelSpec

__all__ = [
    "load_spec",
    "load_spec_data",
    "parse_yaml",
    "apply_overrides",
    "deep_merge",
    "preset_names",
    "preset_path",
    "dump_yaml",
    "SCHEMA_MODELINE",
]

Path_ = tuple[str | int, ...]
DICT_POSITION = Position("<dict>")  # where a value of a spec given as a Python dict is
SCHEMA_MODELINE = "# yaml-language-server: $schema=../specformer.schema.json"

# Names users carry over from other tools, and what they are called here.
TYPE_HINTS = {
    "swiglu": "SwiGLU is `type: glu` with `activation: silu`",
    "geglu": "GeGLU is `type: glu` with `activation: gelu`",
    "reglu": "ReGLU is `type: glu` with `activation: relu`",
    "rotary": "rotary embeddings are `type: rope`",
    "absolute": "a learned absolute table is `type: learned`",
    "relative": "T5's relative bias is `type: t5`",
    "nope": "no positional information (NoPE) is `type: none`",
    "layer_norm": "LayerNorm is `type: layernorm`",
    "rms_norm": "RMSNorm is `type: rmsnorm`",
    "gqa": "grouped-query attention is `type: mha` with `n_kv_heads` < `n_heads`",
    "mqa": "multi-query attention is `type: mha` with `n_kv_heads: 1`",
    # rope scalings: what other tools call them
    "ntk": "dynamic NTK scaling is `dynamic`; NTK-by-parts interpolation is `yarn`",
    "pi": "position interpolation is `linear`",
    "swish": "Swish (SiLU) is `activation: silu` of a `type: mlp` or `type: glu` FFN",
    "silu_glu": "SwiGLU is `type: glu` with `activation: silu`",
    "mlm": "masked language modelling is `masked_lm`",
    "clm": "causal language modelling is `causal_lm`",
    "bert": "a BERT-like model is `kind: encoder`",
    "gpt": "a GPT-like model is `kind: decoder`",
    "llama": "a Llama-like model is `kind: decoder`",
    "seq2seq": "a sequence-to-sequence model is `kind: encoder-decoder`",
    **dict.fromkeys(("char", "chars", "character"),
                    "a character-level tokenizer is `type: byte` (UTF-8 bytes: one token a character of ASCII text)"),
    # training.precision takes Lightning's names
    **dict.fromkeys(
        ("fp16", "float16", "half"),
        "float16 mixed precision (float32 weights, float16 autocast: Hugging Face's fp16=True, "
        "Lightning's 16-mixed) is `16-mixed`, on a GPU",
    ),
    **dict.fromkeys(
        ("bfloat16",),
        "bfloat16 mixed precision (float32 weights, bfloat16 autocast: Hugging Face's bf16=True) is "
        "`bf16-mixed`; bfloat16 weights and optimizer state are `bf16-true`",
    ),
    **dict.fromkeys(
        ("16-true", "fp16-true"),
        "float16 weights and optimizer state (Lightning's 16-true) are not trained here: updates too small for "
        "float16 are lost, and a CPU lacks float16 kernels; bfloat16 weights are `bf16-true`, and float16 mixed "
        "precision (float32 weights, float16 autocast) is `16-mixed`, on a GPU",
    ),
    **dict.fromkeys(("float32",), "float32 training is `32`"),
    **dict.fromkeys(("float64", "fp64", "double", "64-true"), "float64 training is `64`"),
}

# values other tools have that specformer does not build in, and what to do instead: a
# look-alike spelling of a built-in one (relu2 -> relu) would be another function
NOT_BUILT_IN = {
    **dict.fromkeys(
        ("relu2", "relu_squared", "squared_relu", "sqrelu", "relu_sq", "relusquared"),
        "squared ReLU (Primer, relu²) is not built in: register it as an FFN type, as docs/spec.md, "
        "*Plugins*, shows with `type: relu2`",
    ),
}

# Field names from Hugging Face configs, nanoGPT, LitGPT and PyTorch: (the field here, where it
# is written). Said for an unknown field unless "did you mean" already names that field.
_WIDTH = ("d_model", "the width is `d_model`, at the top level")
_LAYERS = ("n_layers", "layers are counted per stack: `decoder: {n_layers: N}` (or `encoder:`)")
_HEADS = ("n_heads", "heads are set in a stack's attention: `attention: {n_heads: N}`")
_KV_HEADS = ("n_kv_heads", "key/value heads are set in a stack's attention: `attention: {n_kv_heads: N}`")
_D_FF = ("d_ff", "the FFN's hidden size is `d_ff`, in a stack's ffn: `ffn: {d_ff: N}`")
_LENGTH = ("max_seq_len", "the longest sequence is `max_seq_len`, at the top level")
_EPS = ("eps", "a norm's epsilon is set in a stack's norm: `norm: {eps: ...}`")
FIELD_HINTS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("hidden_size", "n_embd", "n_embed", "d_embed", "embed_dim", "model_dim"), _WIDTH),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers"), _LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads"), _HEADS),
    **dict.fromkeys(("num_key_value_heads", "n_kv_head", "num_kv_heads", "n_query_groups", "n_kv_heads"), _KV_HEADS),
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_dim", "dim_feedforward", "ffn_hidden_size", "d_ff"), _D_FF),
    # nanoGPT's block_size is the model's context and the length it trains at
    "block_size": ("max_seq_len", "nanoGPT's block_size is the model's `max_seq_len`, at the top level, and the "
                   "length a run trains at, `training: {seq_len: N}`"),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "context_length",
                     "max_seq_length"), _LENGTH),
    **dict.fromkeys(("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"), _EPS),
    **dict.fromkeys(("rope_theta", "rotary_emb_base", "rope_base"),
                    ("base", "the rotary base is set in `positional: {type: rope, base: ...}`")),
    **dict.fromkeys(("rotary_pct", "partial_rotary_factor", "rotary_percentage", "rotary_dim_fraction"),
                    ("fraction", "the rotated share of each head is `positional: {type: rope, fraction: ...}`")),
    **dict.fromkeys(("tie_word_embeddings", "tie_embeddings", "tie_weights"),
                    ("tie_output", "tying is `embedding: {tie_output: true}`")),
    **dict.fromkeys(("hidden_act", "activation_function"),
                    ("activation", "the FFN's activation is set in a stack's ffn: `ffn: {activation: ...}`")),
    "dropout": ("dropout", "dropout is set where it applies: `embedding: {dropout: ...}`, and in a stack's "
                "`attention:`, `ffn:` and `residual:`"),
    "bias": ("bias", "biases are set where they apply: in a stack's `attention: {bias: false}` and `ffn: {bias: "
             "false}`, a layernorm's `norm: {type: layernorm, bias: false}`, and `head: {bias: ...}` (nanoGPT's "
             "bias=False is the first three)"),
    **dict.fromkeys(("max_iters", "max_steps", "num_train_steps", "total_steps"),
                    ("max_steps", "the run's length is `training: {max_steps: N}`")),
    **dict.fromkeys(("learning_rate", "lr"), ("lr", "the learning rate is `training: {optimizer: {lr: ...}}`")),
    **dict.fromkeys(("batch_size", "micro_batch_size"), ("batch_size", "`training: {batch_size: N}`")),
    "gradient_accumulation_steps": ("accumulate", "`training: {accumulate: N}`"),
    **dict.fromkeys(("warmup_iters", "warmup_steps"),
                    ("warmup_steps", "the warmup is `training: {schedule: {warmup_steps: N}}`")),
    "eval_interval": ("val_interval", "`training: {val_interval: N}`"),
    "eval_iters": ("val_batches", "the batches of a validation are `training: {val_batches: N}`"),
    "dtype": ("precision", "the training precision is `training: {precision: ...}` (nanoGPT's dtype bfloat16 "
              "is bf16-mixed, float16 16-mixed, float32 32)"),
    "device": ("accelerator", "the device is `training: {accelerator: ...}` (cpu, gpu, mps, auto)"),
    # names whose value means something else here: the hint says how to convert it
    "min_lr": ("min_lr_ratio", "the schedule's floor is a ratio of the peak lr, `training: {schedule: "
               "{min_lr_ratio: ...}}` (nanoGPT's min_lr / learning_rate: 0.1 for 6e-5 / 6e-4)"),
    "lr_decay_iters": ("max_steps", "the cosine and linear schedules decay until the run's last step, "
                       "`training: {max_steps: N}` (nanoGPT's lr_decay_iters = max_iters)"),
    **dict.fromkeys(("beta1", "beta2"), ("betas", "Adam's betas are one pair, `training: {optimizer: "
                                                  "{betas: [0.9, 0.99]}}`")),
}
# of FIELD_HINTS: another tool's value is not this field's (a --set of it is not written with the value)
OTHER_MEANING = frozenset({"min_lr", "lr_decay_iters", "beta1", "beta2"})
# of FIELD_HINTS: another tool's name for two fields here, the second set with the same value
ALSO_SET = {"block_size": "training.seq_len"}
# of FIELD_HINTS: another tool's values of the field, written as this field's (nanoGPT's dtype)
VALUE_NAMES = {"dtype": {"float32": "32", "bfloat16": "bf16-mixed", "float16": "16-mixed"}}


def set_arguments(name: str, path: str, value: str) -> str:
    """``--set path=value`` (quoted for a shell), and the ``--set`` of the second field
    another tool's ``name`` also stands for (nanoGPT's block_size: max_seq_len and
    training.seq_len)."""
    paths = [path, *([ALSO_SET[name.lower()]] if name.lower() in ALSO_SET else [])]
    value = VALUE_NAMES.get(name.lower(), {}).get(value.strip().strip("'\""), value)
    return " ".join(f"--set {shlex.quote(f'{p}={value}')}" for p in paths)


def field_path(name: str) -> tuple[str, list[str]] | None:
    """The dotted path (for ``--set``) of the field that ``name`` stands for, a spec's own
    field name or another tool's (``batch_size`` -> ``training.batch_size``, nanoGPT's
    ``n_layer`` -> ``decoder.n_layers``), and the same field of the other stacks; None when
    the name is no field, or names several unrelated ones (``dropout``, ``bias``).

    A stack's field is given under ``decoder`` (GPT-like models, the common case), its
    ``encoder`` twin in the list; a cross-attention's copy of a field is left out.
    """
    from specformer.specs.schema import ModelSpec

    key = name.strip().lstrip("-").replace("-", "_").lower()
    field = FIELD_HINTS.get(key, (key, ""))[0]
    paths = [p for p in _field_paths(ModelSpec, field) if "cross_attention" not in p.split(".")]
    if field in paths:  # a top-level field (vocab_size, not training.tokenizer.vocab_size)
        return field, []
    alike = {p.replace("encoder.", "decoder.", 1) if p.startswith("encoder.") else p for p in paths}
    if len(alike) != 1:
        return None
    (path,) = alike
    return path, [p for p in paths if p != path]


def _field_paths(model: type[BaseModel], field: str, prefix: str = "", depth: int = 0) -> list[str]:
    """Every dotted path to a field called ``field`` in ``model`` and the models below it
    (each member of a union of types)."""
    found: list[str] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        if name == field:
            found.append(path)
        if depth >= 6:
            continue
        for member in _unwrap(info.annotation):
            if isinstance(member, type) and issubclass(member, BaseModel):
                found += [p for p in _field_paths(member, field, f"{path}.", depth + 1) if p not in found]
    return found


# --------------------------------------------------------------------------- YAML with positions


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader reading plain scalars as YAML 1.2's core schema does; positions
    are read from the composed node tree.

    PyYAML implements YAML 1.1, whose plain scalars change values behind the user's back:
    ``010`` is 8 (octal), ``1:30`` is 90 (base 60), ``yes``/``no``/``on``/``off`` are
    booleans and ``2024-01-01`` a date. Under 1.2 those are 10 and strings, so a spec says
    what it reads as, and a string where a number or a switch belongs is a type error that
    names the field. ``1e-6`` is a number (1.1 wants a dot, ``1.0e-6``), as users write it.
    """

    # a table of its own, not a copy of SafeLoader's: the 1.1 entries must not match at all
    # (and SafeLoader's table, shared by every PyYAML user in the process, stays as it is)
    yaml_implicit_resolvers: dict[str | None, list[tuple[str, re.Pattern[str]]]] = {}


# `_` between digits groups them (max_steps: 100_000), as in Python: unambiguous, and 1.1 read it too
_INT_12 = re.compile(r"^(?:[-+]?[0-9]+(?:_[0-9]+)*|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_12 = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_BOOL_12 = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}

# The order within a first character matters: `10` matches the float pattern too.
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_12, list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+.0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])
# not in the 1.2 core schema, but documented: `<<: *base` shares settings inside a file
_Loader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])


def _scalar_error(node: yaml.ScalarNode, what: str, allowed: str) -> yaml.constructor.ConstructorError:
    value = node.value if len(node.value) <= 60 else f"{node.value[:40]}…{node.value[-10:]}"
    return yaml.constructor.ConstructorError(None, None, f"{value!r} is not {what} ({allowed})", node.start_mark)


# SafeLoader's constructors read 1.1 forms too (`!!int 010` is 8, `!!float 1:30` is 90):
# an explicit tag is read by the same 1.2 rules as a plain scalar.
_MAX_DIGITS = 1_000


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if not _INT_12.match(text):
        raise _scalar_error(node, "an integer", "decimal digits (100_000 groups them), 0o17 octal or 0x1F hex")
    digits = len(text.lstrip("+-").replace("_", ""))
    if digits > _MAX_DIGITS:  # Python reads at most 4,300 decimal digits (and no spec needs 20)
        raise _scalar_error(node, "an integer", f"this one is too long: {digits:,} digits")
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node)
    if not _FLOAT_12.match(text):
        raise _scalar_error(node, "a number", "e.g. 3, 0.5, 1e-6, .inf")
    body = text.lstrip("+-").lower()
    sign = -1.0 if text.startswith("-") else 1.0
    if body == ".inf":
        return sign * float("inf")
    if body == ".nan":
        return float("nan")
    return float(text)


def _construct_bool(loader: _Loader, node: yaml.ScalarNode) -> bool:
    text = loader.construct_scalar(node)
    if text not in _BOOL_12:
        raise _scalar_error(node, "a boolean", "true or false")
    return _BOOL_12[text]


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper that also quotes a string YAML 1.2 reads as something else
    (``0o17``, ``1e5``), so what we write reads back the same here and in YAML 1.1 tools."""

    yaml_implicit_resolvers = {
        first: list(resolvers) for first, resolvers in yaml.SafeDumper.yaml_implicit_resolvers.items()
    }


for _first, _resolvers in _Loader.yaml_implicit_resolvers.items():
    _Dumper.yaml_implicit_resolvers.setdefault(_first, []).extend(_resolvers)


_PLAIN_TAGS = {
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}


# keys and list items one spec file may hold after its aliases are expanded
MAX_VALUES = 50_000
# how deep a spec's mappings and lists may nest: a spec is a few levels deep
MAX_DEPTH = 64
# the largest spec file read: the largest presets are a few KB
MAX_FILE_BYTES = 16 << 20


def _pos(source: str, mark: Any) -> Position:
    return Position(source, mark.line + 1, mark.column + 1)


def parse_yaml(text: str, source: str = "<string>") -> tuple[Any, dict[Path_, Position]]:
    """Parse YAML ``text`` safely; return the data and the position of every key and item.

    Raises :class:`SpecError` listing every duplicate key and refused tag, or the
    syntax error (YAML stops at the first).
    """
    try:
        loader = _Loader(text)  # its reader refuses control characters at once
    except yaml.reader.ReaderError as exc:
        raise SpecError([_reader_problem(exc, source, text)]) from None
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # PyYAML composes nested nodes by recursion
            raise SpecError([SpecProblem(
                f"the YAML is nested too deeply to read (a spec is a few levels deep; at most {MAX_DEPTH})",
                position=Position(source, 1, 1),
            )]) from None
        except yaml.reader.ReaderError as exc:
            raise SpecError([_reader_problem(exc, source, text)]) from None
        except yaml.MarkedYAMLError as exc:
            raise SpecError([_syntax_problem(exc, source, text)]) from None
        except yaml.YAMLError as exc:
            raise SpecError([SpecProblem(f"not valid YAML: {exc}", position=Position(source))]) from None
        if node is None:
            raise SpecError([SpecProblem("the file is empty; a spec is a YAML mapping", position=Position(source, 1, 1))])
        positions: dict[Path_, Position] = {(): _pos(source, node.start_mark)}
        problems: list[SpecProblem] = []
        loader.open_nodes = {}  # the mappings and lists being read, by node: their paths
        loader.text = text
        data = _construct(loader, node, (), source, positions, problems)
        if problems:
            raise SpecError(problems)
        return data, positions
    finally:
        loader.dispose()


def _at_end_of(source: str, before: str) -> Position:
    """The position just after the text ``before`` (everything ahead of it in the file)."""
    return Position(source, before.count("\n") + 1, len(before) - before.rfind("\n"))


def not_utf8_problem(exc: UnicodeDecodeError, source: str) -> SpecProblem:
    """The first byte of a file that is not UTF-8, at its line and column."""
    if encoding := bom_encoding(bytes(exc.object[:4])):
        # Windows PowerShell's `>` and Notepad's "Unicode" write UTF-16
        return SpecProblem(f"not UTF-8 text: the file is {encoding} (it starts with a {encoding} byte order mark)",
                           position=Position(source, 1, 1), hint="save the file as UTF-8")
    return SpecProblem(
        f"not UTF-8 text: the byte 0x{exc.object[exc.start]:02x} is not valid UTF-8",
        position=_at_end_of(source, exc.object[: exc.start].decode("utf-8", errors="replace")),
        hint="save the file as UTF-8 (a Latin-1 or Windows-1252 editor setting writes such bytes)",
    )


def _reader_problem(exc: yaml.reader.ReaderError, source: str, text: str) -> SpecProblem:
    """A character YAML does not allow in a document (a control character, U+FFFE, ...)."""
    char = exc.character if isinstance(exc.character, str) else chr(exc.character)
    return SpecProblem(
        f"the character U+{ord(char):04X} is not allowed in YAML",
        position=_at_end_of(source, text[: exc.position]),
        hint="remove it (YAML text may not hold control characters other than tab and newline)",
    )


def _syntax_problem(exc: yaml.MarkedYAMLError, source: str, text: str) -> SpecProblem:
    mark = exc.problem_mark or exc.context_mark
    position = _pos(source, mark) if mark is not None else Position(source)
    problem = exc.problem or str(exc)
    line = text.splitlines()[mark.line] if mark is not None and mark.line < len(text.splitlines()) else ""
    if "\t" in problem or "'\\t'" in problem or (mark is not None and "\t" in line[: mark.column + 1]):
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        if "\t" in indent or mark is None:
            return SpecProblem(
                "a tab character; YAML indentation must use spaces",
                position=position,
                hint="replace the tab with spaces (2 per level is usual)",
            )
        return SpecProblem(
            "a tab character between values; spec files separate values with spaces",
            position=position,
            hint="replace the tab with a space",
        )
    context = f" ({exc.context})" if exc.context else ""
    escape = "escape" in problem  # a backslash in double quotes: the mistake is at the backslash
    if exc.context and exc.context.startswith("while scanning") and exc.context_mark is not None and not escape:
        # a key without its ':' or a quote never closed: the mistake is where that token began,
        # not the line after it, where the scanner gave up
        position = _pos(source, exc.context_mark)
    return SpecProblem(f"YAML syntax error: {problem}{context}", position=position, hint=_syntax_hint(exc))


def _syntax_hint(exc: yaml.MarkedYAMLError) -> str:
    """What usually causes one of PyYAML's syntax errors, in the words of a spec file."""
    problem, context = exc.problem or "", exc.context or ""
    opened = exc.context_mark.line + 1 if exc.context_mark is not None else None
    if "could not find expected ':'" in problem:
        return "a key without its ':', or without a space after it (d_model: 64)"
    if "mapping values are not allowed here" in problem:
        return ("a 'key: value' where none may start: a line indented deeper than the key above it, which "
                "already has a value, or a value holding ': ' (quote it)")
    if "found '<block mapping start>'" in problem:
        return "this line is indented more than the keys before it: the keys of one mapping start in the same column"
    if "but found '-'" in problem:
        return "a list item ('- ...') among the keys of a mapping: indent it under the key it belongs to"
    if "flow mapping" in context or "flow sequence" in context:
        bracket = "{ ... }" if "mapping" in context else "[ ... ]"
        return f"the {bracket} opened at line {opened} is not closed (or lacks a ',' between its items)"
    if "quoted scalar" in context and "escape" in problem:
        return ("in double quotes a backslash starts an escape (\\n, \\t): write a Windows path in single quotes "
                "('C:\\data\\x.txt') or with '/'")
    if "quoted scalar" in context:
        return "a quote opened here is never closed"
    if "expected a single document" in context:
        return "a spec is one YAML document: remove the '---' here and what follows it, or make it a file of its own"
    return ""


def _construct(
    loader: _Loader,
    node: yaml.Node,
    path: Path_,
    source: str,
    positions: dict[Path_, Position],
    problems: list[SpecProblem],
) -> Any:
    where = _pos(source, node.start_mark)
    dotted = _dotted(path)
    if len(positions) > MAX_VALUES:
        # aliases (*name) repeat what they point to: a few lines can expand without bound
        raise SpecError([SpecProblem(
            f"the spec expands to more than {MAX_VALUES:,} keys and list items (through aliases: *name)",
            path=dotted, position=where,
            hint="a spec is a few hundred values; check the aliases that repeat large parts of it",
        )])
    if id(node) in loader.open_nodes:  # an alias inside its own anchor: it holds itself
        outer = loader.open_nodes[id(node)]
        anchor = re.match(r"&([^\s,\[\]{}]+)", loader.text[node.start_mark.index:])
        name = anchor.group(1) if anchor else "name"
        raise SpecError([SpecProblem(
            f"an alias (*{name}) inside its own anchor (&{name}) makes this value hold itself without end",
            path=_dotted(outer), position=positions.get(outer, where),
            hint=f"move *{name} out of the value that &{name} names",
        )])
    if len(path) > MAX_DEPTH:
        raise SpecError([SpecProblem(
            f"the spec is nested more than {MAX_DEPTH} levels deep", path=_dotted(path[:1]),
            position=positions.get(path[:1], where), hint="a spec is a few levels deep: check its brackets and indentation",
        )])
    if node.tag not in _PLAIN_TAGS:
        problems.append(
            SpecProblem(
                f"the tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not allowed; "
                "a spec holds plain data only (mappings, lists, strings, numbers, booleans, null)",
                path=dotted,
                position=where,
            )
        )
        return None
    if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
        loader.open_nodes[id(node)] = path
        try:
            return _construct_collection(loader, node, path, source, positions, problems)
        finally:
            del loader.open_nodes[id(node)]
    try:
        return loader.construct_object(node)
    except yaml.YAMLError as exc:
        problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) and exc.problem else exc
        problems.append(SpecProblem(f"bad value: {problem}", path=dotted, position=where))
        return None


def _construct_collection(
    loader: _Loader,
    node: yaml.MappingNode | yaml.SequenceNode,
    path: Path_,
    source: str,
    positions: dict[Path_, Position],
    problems: list[SpecProblem],
) -> Any:
    where = _pos(source, node.start_mark)
    dotted = _dotted(path)
    if isinstance(node, yaml.MappingNode):
        try:
            merged = _flatten(loader, node)
        except yaml.MarkedYAMLError as exc:
            problems.append(SpecProblem(f"bad merge key (<<): {exc.problem}", path=dotted, position=where))
            return None
        out: dict[str, Any] = {}
        first_seen: dict[Any, Position] = {}
        own_keys: set[str] = set()
        for index, (key_node, value_node) in enumerate(node.value):
            key_pos = _pos(source, key_node.start_mark)
            if not isinstance(key_node, yaml.ScalarNode):
                problems.append(SpecProblem("a key must be a plain name", path=dotted, position=key_pos))
                continue
            key = loader.construct_object(key_node)
            if not isinstance(key, str):
                key = key_node.value  # as written: null, true, 3
            if index >= merged:
                if key in first_seen and key not in own_keys:
                    # a key of the mapping itself overrides one merged in with `<<: *base`
                    for p in [p for p in positions if p[: len(path) + 1] == path + (key,)]:
                        del positions[p]
                    del first_seen[key]
                own_keys.add(key)
            elif key in first_seen:  # two merged mappings set it: the later one wins, as in PyYAML
                del first_seen[key]
            if key in first_seen:
                problems.append(
                    SpecProblem(
                        f"duplicate key {key!r} (first set at line {first_seen[key].line})",
                        path=_dotted(path + (key,)),
                        position=key_pos,
                        hint="each key may appear once in a mapping; remove one of them",
                    )
                )
                continue
            first_seen[key] = key_pos
            positions[path + (key,)] = key_pos
            out[key] = _construct(loader, value_node, path + (key,), source, positions, problems)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            positions[path + (i,)] = _pos(source, item.start_mark)
            items.append(_construct(loader, item, path + (i,), source, positions, problems))
        return items


def _flatten(loader: _Loader, node: yaml.MappingNode) -> int:
    """Resolve the merge keys (``<<: *base``) of ``node`` in place; return how many of its
    pairs, at the front, came from merged mappings (the mapping's own keys override those).
    An aliased node is visited again: its count is kept on it."""
    if not hasattr(node, "merged_pairs"):
        own = sum(k.tag != "tag:yaml.org,2002:merge" for k, _ in node.value)
        loader.flatten_mapping(node)
        node.merged_pairs = len(node.value) - own
    return node.merged_pairs


def _dotted(path: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in path)


def dump_yaml(data: Mapping[str, Any], *, modeline: bool = False) -> str:
    """YAML text of plain ``data`` in key order (what ``ModelSpec.to_yaml`` writes)."""
    text = yaml.dump(dict(data), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return (SCHEMA_MODELINE + "\n" + text) if modeline else text


# --------------------------------------------------------------------------- presets


def _preset_dir() -> Any:
    return resources.files("specformer.specs").joinpath("presets")


def preset_names() -> list[str]:
    """Names of the presets shipped with specformer."""
    return sorted(p.name[:-5] for p in _preset_dir().iterdir() if p.name.endswith(".yaml"))


def preset_path(name: str) -> Path:
    path = _preset_dir().joinpath(f"{name}.yaml")
    if not path.is_file():
        raise SpecError([_unknown_source_problem(name)])
    return Path(str(path))


def _unknown_source_problem(name: str, position: Position | None = None) -> SpecProblem:
    names = preset_names()
    guess = did_you_mean(name, names)
    hint = f"did you mean {guess!r}? " if guess else ""
    return SpecProblem(
        f"no preset or file named {name!r}",
        path="extends" if position else "",
        position=position,
        hint=f"{hint}presets: {', '.join(names)}",
    )


# --------------------------------------------------------------------------- extends + merge


def _looks_like_path(ref: str) -> bool:
    return "/" in ref or "\\" in ref or ref.endswith((".yaml", ".yml"))


def _resolve_source(ref: str, base_dir: Path | None, position: Position | None) -> Path:
    if ref == "-" and position is None:
        ref = "/dev/stdin"  # the command line's name for standard input
    if not ref.strip():
        # Path("") is the current folder: not ". is a directory, not a YAML file"
        raise SpecError([SpecProblem(
            f"the spec's name is empty ({ref!r}): give a preset name, a YAML file or YAML text",
            path="extends" if position else "", position=position, hint=f"presets: {', '.join(preset_names())}",
        )])
    if _looks_like_path(ref):
        path = Path(ref).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if path.is_dir():
            if (path / "spec.yaml").is_file():  # a run folder stands for the spec it ran
                return (path / "spec.yaml").resolve()
            raise SpecError([_directory_problem(path, position)])
        if not path.exists():
            stem = Path(ref).name.removesuffix(".yaml").removesuffix(".yml")
            preset = (f"the preset is named without .yaml: {stem}" if stem in preset_names() and stem != ref
                      else "")
            raise SpecError(
                [SpecProblem(f"file not found: {path}", path="extends" if position else "", position=position,
                             hint=preset)]
            )
        # a pipe (/dev/stdin, a shell's <(...)) is read as it is: resolved, it names no file
        return path.resolve() if path.is_file() else path
    if ref in preset_names():
        return preset_path(ref)
    local = (base_dir or Path.cwd()) / ref
    if local.is_file():
        return local.resolve()
    if local.is_dir():
        if (local / "spec.yaml").is_file():  # a run folder stands for the spec it ran
            return (local / "spec.yaml").resolve()
        # it exists: "no preset or file named" would send the user looking for a typo
        raise SpecError([_directory_problem(Path(ref) if base_dir is None else local, position)])
    raise SpecError([_unknown_source_problem(ref, position)])


_RUN_STAMP = re.compile(r"(\d{8}-\d{6})(?:-(\d+))?")


def run_order(run: Path) -> tuple[int, str, int]:
    """The sort key of a run folder among its spec's: its timestamp, then the count a run
    started in the same second gets (``-2`` ... ``-11``: as strings, ``-10`` came before
    ``-2``); a folder of another name after them, by name."""
    m = _RUN_STAMP.fullmatch(run.name)
    return (0, m.group(1), int(m.group(2) or 1)) if m else (1, run.name, 0)


def _directory_problem(path: Path, position: Position | None) -> SpecProblem:
    hint = "a spec is a preset name, a YAML file or a run folder (its spec.yaml)"
    runs = sorted((p.parent for p in path.glob("*/spec.yaml")), key=run_order)
    if runs:  # runs/<spec name>/, the folder of a spec's runs: name its latest
        more = f" (and {len(runs) - 1} earlier)" if len(runs) > 1 else ""
        hint += f"; this folder holds the runs of a spec, not one run: its latest is {runs[-1]}{more}"
    elif (path / "config.json").is_file():  # a Hugging Face model folder
        hint += f"; the Hugging Face model here converts with: specformer import-hf {path} -o spec.yaml"
    return SpecProblem(
        f"{path} is a directory, not a YAML file", path="extends" if position else "", position=position, hint=hint
    )


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _load_file(
    path: Path, chain: tuple[Path, ...], position: Position | None
) -> tuple[dict[str, Any], dict[Path_, Position]]:
    if path in chain:
        cycle = " -> ".join(_display(p) for p in chain + (path,))
        raise SpecError([SpecProblem(f"extends cycle: {cycle}", path="extends", position=position)])
    source = _display(path)
    try:
        with path.open("rb") as file:  # at most a little past the limit: /dev/zero never ends
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SpecError([SpecProblem(f"cannot read the file: {exc.strerror}", position=Position(source))]) from None
    if b"\0" in raw[:8192] and not bom_encoding(raw):  # UTF-16 or UTF-32 text holds NULs: said as such below
        # weights or a checkpoint given where a spec goes: no text encoding to fix
        raise SpecError([SpecProblem(
            "a binary file (model weights or a checkpoint?), not a YAML spec",
            position=Position(source),
            hint="a spec is a preset name or a YAML file; a checkpoint's spec is in its run folder "
            "(spec.yaml), and export-hf takes weights with --spec",
        )])
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError([SpecProblem(
            f"the file is larger than {MAX_FILE_BYTES >> 20} MiB; a spec is a few KB of YAML",
            position=Position(source), hint="give the spec's YAML file, not data or weights",
        )])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([not_utf8_problem(exc, source)]) from None
    # relative to the file that says it; a pipe (/dev/stdin, /dev/fd/N) has no folder of
    # its own, so from there relative to the working directory
    base = path.parent if path.is_file() else Path.cwd()
    try:
        return _load_text(text, source, base, chain + (path,))
    except SpecError as exc:
        if not chain and path.suffix.lower() in TEXT_SUFFIXES and _unreadable_as_a_spec(exc, source):
            # the text to train on given where the spec goes (nanoGPT reads its input.txt itself)
            data = shlex.quote(f"training.data={{type: files, paths: [{source}]}}")
            raise SpecError([SpecProblem(
                "a text file, not a YAML spec", position=Position(source),
                hint=f"a spec names the model and training.data the text: to train a small GPT on this text, "
                f"specformer train gpt-nano --set {data}",
            )]) from None
        raise


# data files a user may give where the spec goes
TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".jsonl", ".ndjson", ".csv", ".tsv")


def _unreadable_as_a_spec(error: SpecError, source: str) -> bool:
    """Whether ``error`` says the file ``source`` is no YAML mapping at all (a syntax error,
    or text that YAML reads as a string or a list), not that a spec in it is wrong."""
    if len(error.problems) != 1:
        return False
    (problem,) = error.problems
    return problem.position is not None and problem.position.source == source and not problem.path


def _load_text(
    text: str, source: str, base: Path, chain: tuple[Path, ...]
) -> tuple[dict[str, Any], dict[Path_, Position]]:
    """A spec's YAML ``text`` (named ``source`` in errors) with its ``extends`` resolved from
    ``base``; ``chain`` holds the files already being read, for cycles."""
    data, positions = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise SpecError(
            [SpecProblem(f"a spec is a YAML mapping, found {_type_name(data)}", position=positions[()])]
        )
    if "model_type" in data and not {"kind", "extends"} & data.keys():
        # a Hugging Face config.json (JSON is YAML): one problem, not one per key of it
        raise SpecError([SpecProblem(
            f"a Hugging Face config (model_type: {data['model_type']}), not a specformer spec",
            position=positions.get(("model_type",), positions[()]),
            hint=f"convert it to a spec with: specformer import-hf {source} -o spec.yaml",
        )])
    parent_ref = data.pop("extends", None)
    if parent_ref is None:
        return data, positions
    where = positions.get(("extends",))
    if not isinstance(parent_ref, str):
        raise SpecError(
            [SpecProblem(f"extends must be a preset name or a path, found {_type_name(parent_ref)}",
                         path="extends", position=where)]
        )
    parent_path = _resolve_source(parent_ref, base, where)
    parent, parent_positions = _load_file(parent_path, chain, where)
    merged = deep_merge(parent, data)
    # a parent's value the child replaced (`positional: rope` over a mapping) is gone, and
    # so are its positions: an error there must point at the child's line
    kept = {p: pos for p, pos in parent_positions.items() if _exists(merged, p)}
    return merged, {**kept, **positions}


def _exists(data: Any, path: Path_, *, null: bool = True) -> bool:
    """Whether ``data`` has a value at ``path`` (with ``null=False``: a value other than null)."""
    for part in path:
        if isinstance(data, dict) and part in data and (null or data[part] is not None):
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return False
    return True


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "nothing", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _flow_yaml(value: Any) -> str:
    """``value`` written as YAML's flow style: {layers: 0, ffn: {d_ff: 8}}."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow_yaml(v) for v in value) + "]"
    return value if isinstance(value, str) else _shown(value)


def _shown(value: Any) -> str:
    """``value`` as YAML writes it: true, null, 'gelu'."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return repr(value)


# --------------------------------------------------------------------------- overrides


def apply_overrides(
    data: dict[str, Any],
    overrides: Iterable[str | tuple[str, Any]] | Mapping[str, Any],
    positions: dict[Path_, Position] | None = None,
) -> dict[str, Any]:
    """Apply dotted overrides (``"decoder.n_layers=4"``, ``("decoder.n_layers", 4)`` or a
    mapping) to a copy of ``data``; string values are parsed as YAML."""
    data = copy.deepcopy(data)
    items = overrides.items() if isinstance(overrides, Mapping) else overrides
    problems: list[SpecProblem] = []
    written: set[Path_] = set()  # the paths earlier overrides of this call set
    for item in items:
        if isinstance(item, str):
            label = f"--set {item}"
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or not key:
                problems.append(
                    SpecProblem(
                        f"an override is dotted.path=value, got {item!r}",
                        position=Position(label),
                        hint="e.g. --set decoder.n_layers=4 --set positional.type=rope",
                    )
                )
                continue
            try:
                value, _ = parse_yaml(raw, label) if raw.strip() else (None, {})
            except SpecError as exc:
                problems.extend(exc.problems)
                continue
        else:
            key, value = item
            label = f"override {key}"
        parts: list[str | int] = [int(p) if p.isdigit() else p for p in key.split(".")]
        if any(p == "" for p in parts):
            problems.append(SpecProblem(f"empty name in the path {key!r}", position=Position(label)))
            continue
        if parts[0] == "extends":
            problems.append(SpecProblem("extends cannot be overridden; load that spec instead", position=Position(label)))
            continue
        retyped = parts[-1] == "type" and len(parts) > 1 and _type_at(data, parts[:-1]) != value
        # a mapping this override gives another type (`ffn.type=glu`, `ffn={type: glu}`):
        # the fields an earlier override of this call set in it stay, as they would in
        # either order (`--set ffn.d_ff=512 --set ffn.type=glu` is a glu of 512)
        retyping = tuple(parts[:-1]) if retyped else (
            tuple(parts) if isinstance(value, dict) and "type" in value
            and _type_at(data, parts) not in (None, value["type"]) else None)
        carried = _written_fields(data, retyping, written) if retyping else {}
        # the types it changes between: the fields of the run both have stay, and their positions
        retypes = (_type_at(data, list(retyping)), value if retyped else value["type"]) if retyping else None
        # the containers on the way that the spec does not write: the override makes them
        created = [tuple(parts[:k]) for k in range(1, len(parts)) if not _exists(data, tuple(parts[:k]), null=False)]
        try:
            _materialize_default_list(data, parts)
            _set_path(data, parts, value)
        except _OverrideError as exc:
            problems.append(SpecProblem(exc.message, path=key, position=Position(label), hint=exc.hint))
            continue
        if carried:
            node = _node_at(data, retyping)
            carried = {k: v for k, v in carried.items() if isinstance(node, dict) and k not in node}
            node.update(carried)
        written.update(_paths_in(tuple(parts), value))
        if positions is not None:
            # setting another `type` makes the whole mapping the override's (a field the
            # new type misses is the override's doing, not the file's)
            owned = tuple(parts[:-1]) if retyped else tuple(parts)
            # (but for those the override's mapping gives itself: `norm={type: rmsnorm, placement: x}`)
            kept = {(*owned, k) for k in family_fields(owned[-1], *retypes)
                    if not (isinstance(value, dict) and k in value)} if retypes and owned else set()
            kept |= {(*retyping, k) for k in carried}  # where the earlier override put them
            for p in [p for p in positions if p[: len(owned)] == owned and p[: len(owned) + 1] not in kept]:
                del positions[p]
            # so is a mapping it made: `foo.bar=1` makes `foo`, and an unknown `foo` is this
            # override's error, not the file's (whose root would be the nearest position)
            for p in created:
                positions[p] = Position(label)
            positions[owned] = Position(label)
            positions[tuple(parts)] = Position(label)
    if problems:
        raise SpecError(problems)
    return data


def _node_at(data: Any, path: Path_) -> Any:
    """The value at ``path`` in ``data``, or None where the path leads nowhere."""
    node = data
    for part in path:
        if isinstance(node, dict) and isinstance(part, str):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def _paths_in(path: Path_, value: Any) -> list[Path_]:
    """``path`` and, for a mapping value, the path of every field it sets."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths_in((*path, k), v)
    return out


def _written_fields(data: Any, mapping: Path_, written: set[Path_]) -> dict[str, Any]:
    """The fields of the mapping at ``mapping`` (but its ``type``) that an override in
    ``written`` set, with their values."""
    node = _node_at(data, mapping)
    if not isinstance(node, dict):
        return {}
    n = len(mapping)
    set_here = {w[n] for w in written if len(w) > n and w[:n] == mapping}
    return {k: copy.deepcopy(v) for k, v in node.items() if k in set_here and k != "type"}


class _OverrideError(Exception):
    """A path an override cannot follow; ``apply_overrides`` reports it at the override."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def _bad_index(list_path: Sequence[str | int], index: str | int, items: list, *, default: bool) -> _OverrideError:
    """The error for ``index`` into the list at ``list_path``: out of range, or not a number."""
    where = _dotted(list_path)
    what = f"{where} is {items} by default" if default else f"{where} is a list of {len(items)}"
    whole = f"set the whole list, e.g. --set '{where}=[...]'"
    indices = f"items 0-{len(items) - 1}" if len(items) > 1 else "item 0" if items else "empty"
    if isinstance(index, int):
        return _OverrideError(f"no item {index}: {what} ({indices}); set the whole list to change its length")
    allowed = f"allowed: {indices.split()[1]}; or {whole}" if items else f"it is empty: {whole}"
    return _OverrideError(f"{index!r} is not a list index: {what}", allowed)


def _materialize_default_list(data: dict[str, Any], parts: list[str | int]) -> None:
    """For a path into a list the spec does not write (``training.optimizer.betas.1``,
    a default), write the resolved default list first, so one item can be set. A name
    where that list wants an index (``betas.x``) is an error here: ``_set_path`` would
    make a mapping in the list's place, and pydantic blame the file's line for it."""
    missing = next((k for k in range(1, len(parts)) if not _exists(data, tuple(parts[:k]), null=False)), None)
    if missing is None:
        return  # the spec writes every container on the way: _set_path checks them
    from specformer.specs.schema import ModelSpec

    try:
        resolved: Any = ModelSpec.model_validate(copy.deepcopy(data)).to_dict()
    except ValidationError:
        return  # other problems first; the plain message stands
    for k, part in enumerate(parts[:-1]):
        if isinstance(resolved, dict) and part in resolved:
            resolved = resolved[part]
        elif isinstance(resolved, list) and isinstance(part, int) and part < len(resolved):
            resolved = resolved[part]
        else:
            return
        if isinstance(resolved, list) and k + 1 >= missing:  # a default list, not the spec's
            index = parts[k + 1]
            if isinstance(index, int) and not resolved:
                return  # _set_path says the spec has no such list
            if not isinstance(index, int) or index >= len(resolved):
                raise _bad_index(parts[: k + 1], index, resolved, default=True)
            _set_path(data, parts[: k + 1], list(resolved))
            return


def _type_at(data: Any, parts: list[str | int]) -> Any:
    """The (implicit) ``type`` of the mapping at ``parts``, or None if there is none."""
    node = _node_at(data, parts)
    return implicit_type(node, parts[-1]) if isinstance(node, dict) and parts else None


def _set_path(data: Any, parts: list[str | int], value: Any) -> None:
    node = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not isinstance(part, int) or part >= len(node):
                raise _bad_index(parts[:i], part, node, default=False)
            node = node[part]
            continue
        if not isinstance(node, dict):
            raise _OverrideError(f"{_dotted(parts[:i])} is {_type_name(node)}, not a mapping")
        if node.get(part) is None:
            if isinstance(parts[i + 1], int):  # an item of a list the spec does not have
                raise _OverrideError(
                    f"no item {parts[i + 1]}: the spec has no {_dotted(parts[: i + 1])} list; set the whole "
                    f"list, e.g. --set '{_dotted(parts[: i + 1])}=[...]'"
                )
            node[part] = {}
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        if not isinstance(last, int) or last >= len(node):
            raise _bad_index(parts[:-1], last, node, default=False)
        node[last] = value
    elif isinstance(node, dict):
        if isinstance(value, dict) and isinstance(node.get(last), dict):
            node[last] = deep_merge(node[last], value, last)
        elif last == "type" and implicit_type(node, parts[-2] if len(parts) > 1 else None) not in (None, value):
            # another type: the old one's fields do not belong to it, but for those of the
            # whole family (as with extends)
            key = parts[-2] if len(parts) > 1 else None
            kept = {k: node[k] for k in family_fields(key, implicit_type(node, key), value) if k in node}
            node.clear()
            node.update(type=value, **kept)
        else:
            node[last] = value
    else:
        raise _OverrideError(f"{_dotted(parts[:-1])} is {_type_name(node)}, not a mapping")


# --------------------------------------------------------------------------- load_spec


def load_spec_data(
    source: str | Path | Mapping[str, Any] | ModelSpec,
    overrides: Iterable[str | tuple[str, Any]] | Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[Path_, Position]]:
    """Resolve ``extends`` and overrides: the plain dict that pydantic validates, and
    the position of every value in it."""
    if isinstance(overrides, str):  # one "path=value", not a sequence of characters
        overrides = [overrides]
    if isinstance(source, BaseModel):
        # what the spec was given, as model_copy(update=...) takes it: the sizes it derived
        # (head_dim, d_ff, ...) are derived again from the overridden values, as for a preset
        data, positions = source.model_dump(mode="json", exclude_unset=True), {}
    elif isinstance(source, Mapping):
        data, positions = copy.deepcopy(dict(source)), {}
        if "extends" in data:
            ref = data.pop("extends")
            parent, positions = _load_file(_resolve_source(str(ref), Path.cwd(), None), (), None)
            _own_positions(data, positions)
            data = deep_merge(parent, data)
    elif isinstance(source, str) and "\n" in source.strip():
        # YAML text (a notebook's triple-quoted string): no preset name or path has a line break
        data, positions = _load_text(source, "<string>", Path.cwd(), ())
    elif not isinstance(source, (str, os.PathLike)):
        # load_spec(None) from an unset notebook variable: not "no preset or file named 'None'"
        raise TypeError(
            f"expected a spec (a preset name, a YAML path or text, a dict or a ModelSpec), got {type(source).__name__}"
        )
    else:
        ref = str(source)
        path = Path(ref).expanduser()
        # a bare preset name is the preset, as in `extends:` (./name is a file of that name)
        if path.is_file() and (_looks_like_path(ref) or ref not in preset_names()):
            resolved = path.resolve()
        else:
            resolved = _resolve_source(ref, None, None)
        data, positions = _load_file(resolved, (), None)
        _name_after_the_file(data, positions, resolved)
    if overrides:
        data = apply_overrides(data, overrides, positions)
    return data, positions


def _name_after_the_file(data: dict[str, Any], positions: dict[Path_, Position], path: Path) -> None:
    """A spec file that writes no ``name`` of its own is named after the file: ``rope.yaml``
    that ``extends: gpt-nano`` is ``rope``, not a second ``gpt-nano`` whose runs land in
    gpt-nano's folder, and a file with no ``extends`` is not ``unnamed``. A pipe
    (``/dev/stdin``) has no name to give."""
    where = positions.get(("name",))
    if path.is_file() and (where is None or where.source != _display(path)):
        data["name"] = path.stem
        positions[("name",)] = Position(_display(path))


def _own_positions(data: Any, positions: dict[Path_, Position], path: Path_ = ()) -> None:
    """Mark what a dict that ``extends`` a file writes as the dict's: an error in it is
    not at the line of the file where the value it replaces was."""
    positions[path] = DICT_POSITION
    if isinstance(data, dict):
        for key, value in data.items():
            _own_positions(value, positions, path + (key,))
        return
    for p in [p for p in positions if len(p) > len(path) and p[: len(path)] == path]:
        del positions[p]


def load_spec(
    source: str | Path | Mapping[str, Any] | ModelSpec,
    overrides: Iterable[str | tuple[str, Any]] | Mapping[str, Any] | None = None,
) -> ModelSpec:
    """Load a spec from a preset name, a YAML path, YAML text (a string of several lines),
    a dict or a :class:`~specformer.specs.schema.ModelSpec`, apply overrides, validate.

    ``overrides`` are ``"path=value"`` strings (the value parsed as YAML, as ``--set``
    takes it), ``(path, value)`` pairs or a ``{path: value}`` mapping. Sizes the source
    derived rather than wrote (``head_dim``, ``d_ff``, ...) follow the new values:
    ``load_spec(spec, overrides=["d_model=256"])`` is ``spec.model_copy(update={"d_model": 256})``.

    Returns a frozen, fully-defaulted :class:`~specformer.specs.schema.ModelSpec`.
    Raises :class:`SpecError` listing every problem with its file, line, column and
    field path.
    """
    from specformer.specs.schema import ModelSpec

    data, positions = load_spec_data(source, overrides)
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from_validation(exc, positions, data)) from None


# --------------------------------------------------------------------------- pydantic errors -> problems


def problems_from_validation(
    exc: ValidationError, positions: Mapping[Path_, Position], data: Any = None
) -> list[SpecProblem]:
    """Turn pydantic's errors into :class:`SpecProblem` s with positions and hints."""
    from specformer.specs.schema import ModelSpec

    problems: list[SpecProblem] = []
    seen: set[tuple[str, str]] = set()
    for err in exc.errors(include_url=False):
        for path, message, hint in _describe(err, ModelSpec):
            key = (_dotted(path), message)
            if key in seen:
                continue
            seen.add(key)
            problems.append(
                SpecProblem(message, path=_dotted(path), position=_nearest(positions, path), hint=hint)
            )
    problems = [p for p in problems if not _copied_to_cross_attention(p, problems, positions)]
    problems = [p for p in problems if not _misspelt_in_the_same_mapping(p, problems)]
    problems = [_set_elsewhere(p) for p in problems]
    problems += _stacks_the_kind_lacks(problems, positions, data)
    problems = [_names_what_the_user_set(p, positions, data) for p in problems]
    problems = [_inherited(p, positions.get(())) for p in problems]
    problems.sort(key=_order)
    return problems


def _misspelt_in_the_same_mapping(problem: SpecProblem, problems: list[SpecProblem]) -> bool:
    """A required field reported missing where the same mapping has an unknown field taken
    for it (``path:`` for ``paths:``): one mistake, said once, by the unknown field's "did you
    mean"."""
    if problem.message != "required field is missing":
        return False
    section, _, name = problem.path.rpartition(".")
    return any(other.message.startswith("unknown field ") and other.hint.startswith(f"did you mean {name!r}?")
               and other.path.rpartition(".")[0] == section for other in problems)


def _set_elsewhere(problem: SpecProblem) -> SpecProblem:
    """An unknown field set by ``--set name=value`` whose name is another tool's, or a field
    of another section (``--set batch_size=32``, ``--set n_layer=4``): its hint gives the
    ``--set`` that sets it, with the same value, before the way a file writes it."""
    source = problem.position.source if problem.position is not None else ""
    if not (source.startswith("--set ") and problem.message.startswith("unknown field ")):
        return problem
    key, _, raw = source[len("--set "):].partition("=")
    name = problem.path.rpartition(".")[2]
    if key.strip() != problem.path or problem.hint.startswith("did you mean") or name.lower() in OTHER_MEANING:
        return problem
    given = re.search(rf"give the type with it, (\S+)=\{{(type: [\w-]+(?:, \w+: [^,{{}}]+)*), {re.escape(name)}: \.\.\.\}}",
                      problem.hint)
    if given:  # a field of another type of the family: the --set that gives both, with the value
        both = shlex.quote(f"{given[1]}={{{given[2]}, {name}: {raw.strip()}}}")
        return SpecProblem(problem.message, path=problem.path, position=problem.position,
                           hint=problem.hint.replace(given[0], f"give the type with it: --set {both}"))
    found = field_path(name)
    if found is None or found[0] == problem.path:
        return problem
    path, others = found
    also = f" (an encoder's: {', '.join(others)})" if others else ""
    in_a_file = "in a file: " if name.lower() in FIELD_HINTS else ""
    section, _, field = path.rpartition(".")
    allowed = problem.hint.rpartition("allowed here: ")[2].split(", ") if "allowed here: " in problem.hint else []
    typed = re.search(rf"\{{type: ([\w-]+), {re.escape(field)}: \.\.\.\}}", FIELD_HINTS.get(name.lower(), ("", ""))[1])
    if typed and allowed and field not in allowed:  # a field of another type than this one (rope's fraction)
        both = shlex.quote(f"{section}={{type: {typed[1]}, {field}: {raw.strip()}}}")
        return SpecProblem(problem.message, path=problem.path, position=problem.position,
                           hint=f"write --set {both}; {in_a_file}{problem.hint}")
    return SpecProblem(problem.message, path=problem.path, position=problem.position,
                       hint=f"write {set_arguments(name, path, raw.strip())}{also}; {in_a_file}{problem.hint}")


def _names_what_the_user_set(problem: SpecProblem, positions: Mapping[Path_, Position], data: Any) -> SpecProblem:
    """A rule between fields, reported at one that a preset set (``positional.fraction``),
    whose message names another that the user set (``head_dim=7`` by ``--set``, or in the
    user's own file): the hint says where that one was set, the likelier change to undo."""
    pos = problem.position
    root = positions.get(())
    if pos is None or root is None:
        return problem
    presets = Path(str(_preset_dir())).resolve()

    def from_user(where: Position) -> bool:
        if where.source.startswith("--set "):
            return True
        return where.source == root.source and Path(root.source).resolve().parent != presets

    if from_user(pos):
        return problem
    named = []
    for path, where in positions.items():
        if not path or not isinstance(path[-1], str) or not from_user(where) or isinstance(node := _node_at(data, path), list):
            continue
        if isinstance(node, Mapping):
            # a section set whole (--set training.data={type: conversations, ...}) is named by its type
            words = [node["type"]] if isinstance(node.get("type"), str) and len(path) > 1 else []
        else:
            words = [path[-1]]
        if any(re.search(rf"(?<![\w.]){re.escape(word)}\b", problem.message) for word in words):
            named.append(f"{_dotted(path)} is set {'by' if where.source.startswith('--set ') else 'at'} {where}")
    if not named:
        return problem
    hint = "; ".join(named) + (f"; {problem.hint}" if problem.hint else "")
    return SpecProblem(problem.message, path=problem.path, position=pos, hint=hint)


def _stacks_the_kind_lacks(
    problems: list[SpecProblem], positions: Mapping[Path_, Position], data: Any
) -> list[SpecProblem]:
    """A stack that ``kind`` has no place for, which the rules between fields report only
    once every field is valid: an error inside it (``--set encoder.attention.n_heads=2``
    on a decoder says that ``encoder.n_layers`` is missing) would otherwise be fixed
    first, only for the stack to be refused next."""
    if not isinstance(data, Mapping):
        return []
    kind = data.get("kind")
    out = []
    for role in {"encoder": ("decoder",), "decoder": ("encoder",)}.get(kind, ()):
        message = f"kind {kind!r} has no {role} stack; remove it or change kind"
        if data.get(role) is None or any(p.path == role and p.message == message for p in problems):
            continue
        out.append(SpecProblem(message, path=role, position=_nearest(positions, [role])))
    return out


def _inherited(problem: SpecProblem, root: Position | None) -> SpecProblem:
    """``problem`` with a hint saying where to change it when it sits in a file the spec
    extends (a preset, which the user cannot edit), not in the spec itself."""
    pos = problem.position
    if root is None or pos is None or pos.source == root.source:
        return problem
    presets = Path(str(_preset_dir())).resolve()
    origin = Path(pos.source)
    if origin.resolve().parent != presets or Path(root.source).resolve().parent == presets:
        return problem  # not a preset under the user's own file
    advice = (f"{problem.path or 'it'} comes from the preset {origin.stem}, which {root.source} extends: "
              f"override it in {root.source}")
    if problem.path and "." not in problem.path and "remove it" in problem.message:
        advice += f" (`{problem.path}: null` drops an inherited section)"
    hint = f"{problem.hint}; {advice}" if problem.hint else advice
    return SpecProblem(problem.message, path=problem.path, position=pos, hint=hint)


def _copied_to_cross_attention(
    problem: SpecProblem, problems: list[SpecProblem], positions: Mapping[Path_, Position]
) -> bool:
    """Whether ``problem`` is a self-attention problem again in the cross-attention derived from
    it: the user wrote it once, and no cross_attention (which the error would blame)."""
    stack, sep, rest = problem.path.partition(".cross_attention.")
    written = tuple(_split(stack)) + ("cross_attention",)
    if not sep or any(p[: len(written)] == written for p in positions):
        return False
    return any(q.path == f"{stack}.attention.{rest}" and q.message == problem.message for q in problems)


def _order(p: SpecProblem) -> tuple:
    pos = p.position
    if pos is None:
        return ("~", 0, 0, p.path)
    return (pos.source, pos.line or 0, pos.column or 0, p.path)


def _nearest(positions: Mapping[Path_, Position], path: Sequence[str | int]) -> Position | None:
    path = tuple(path)
    while True:
        if path in positions:
            return positions[path]
        if not path:
            return None
        path = path[:-1]


def _describe(err: Mapping[str, Any], root: type[BaseModel]) -> list[tuple[list, str, str]]:
    """pydantic's error as (path, message, hint) triples; a look-alike character is named."""
    described = _describe_error(err, root)
    written = str(err["loc"][-1]) if err["type"] == "extra_forbidden" and err["loc"] else err.get("input")
    if not isinstance(written, str) or not (note := _unusual_characters(written)):
        return described
    # `n_lаyers` with a Cyrillic a, `3` followed by a no-break space: the look-alike is the
    # mistake, and "write 3 without quotes" would not fix it
    return [(path, message, note if "without quotes" in hint or not hint else f"{note}; {hint}")
            for path, message, hint in described]


def _unusual_characters(text: str) -> str:
    """Name the characters of ``text`` that look like ASCII but are not (pasted from a web page
    or a PDF): a spec's field names, types and numbers are plain ASCII."""
    import unicodedata

    found = []
    for i, char in enumerate(text):
        if char.isascii() and (char.isprintable() or char == "\t"):
            continue
        name = unicodedata.name(char, "a control character")
        found.append(f"U+{ord(char):04X} {name} (character {i + 1})")
    if not found:
        return ""
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return f"{text!r} holds {shown}, where a plain ASCII character belongs: retype it"


def _describe_error(err: Mapping[str, Any], root: type[BaseModel]) -> list[tuple[list, str, str]]:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    path, owner, annotation = _walk(tuple(err["loc"]), root)
    value = err.get("input")

    if kind == "cross_field":
        if "issues" in ctx:
            return [(path + _split(field), msg, "") for field, msg in ctx["issues"]]
        return [(path + _split(ctx.get("field", "")), err["msg"], "")]

    if kind == "extra_forbidden":
        allowed = list(owner.model_fields) if owner is not None else []
        name = str(path[-1]) if path else ""
        guess = did_you_mean(name, allowed)
        field, where = FIELD_HINTS.get(name.lower(), (None, ""))
        # a field of another type of this family (an rmsnorm's bias is a layernorm's) says so first
        typed = _field_of_another_type(name, path, owner) if name.lower() == "bias" else None
        if field is not None and (field != guess or name.lower() in OTHER_MEANING):
            # a name from another tool, or a field of another section: say where it is written
            hint = f"{typed or where}. " + (f"allowed here: {', '.join(allowed)}" if allowed else "")
        elif field is None and (below := _sections_below(owner, name)):
            # a field one section down (decoder: {activation: ...} is decoder.ffn's), before a
            # look-alike of this section's own (attention)
            where = " and of ".join(_dotted([*path[:-1], section]) for section in below)
            hint = f"{name!r} is a field of {where}. " + (f"allowed here: {', '.join(allowed)}" if allowed else "")
        elif another := _field_of_another_type(name, path, owner):
            # the field itself, of another type of this section (training.data's max_len, of
            # type synthetic, under type stdlib), before a look-alike of this type's own (max_mb)
            hint = f"{another}. " + (f"allowed here: {', '.join(allowed)}" if allowed else "")
        elif field is None and guess is None and (
                beside := _sections_beside(tuple(err["loc"]), path, root, name)):
            # a field of a sibling section (decoder.attention: {activation: ...} is decoder.ffn's),
            # after a look-alike of this section's own (training.data's path is paths)
            where = " and of ".join(_dotted([*path[:-2], section]) for section in beside)
            hint = f"{name!r} is a field of {where}. " + (f"allowed here: {', '.join(allowed)}" if allowed else "")
        elif guess is None and (elsewhere := _field_elsewhere(name, path, owner)):
            hint = f"{elsewhere}. " + (f"allowed here: {', '.join(allowed)}" if allowed else "")
        else:
            hint = (f"did you mean {guess!r}? " if guess else "") + (
                f"allowed: {', '.join(allowed)}" if allowed else ""
            )
        return [(path, f"unknown field {name!r}", hint)]

    if kind == "model_type" and not isinstance(value, dict):
        # a section with one type (training.optimizer: adamw): say what to write, not the class
        tags = _tags(annotation)
        if tags:
            return [(path, f"expected a mapping with a type: field, got {_shown(value)}",
                     f"write {{type: {tags[0]}}}; allowed types: {', '.join(tags)}")]
        return [(path, f"expected a mapping of fields, got {_shown(value)}", "")]

    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tags = _tags(annotation)
        if not isinstance(value, dict):  # `positional: rope`, or nothing, where a mapping belongs
            example = (did_you_mean(value, tags) if isinstance(value, str) else None) or (tags or ["..."])[0]
            written = _path_example(value, annotation) or f"{{type: {example}}}"
            return [(path, f"expected a mapping with a type: field, got {_shown(value)}",
                     f"write {written}; allowed types: {', '.join(tags)}")]
        tag = ctx.get("tag", value.get("type"))
        if tag is None:  # a mapping without a type:, where the section has no default type
            return [(path + ["type"], "required field is missing", f"allowed types: {', '.join(tags)}")]
        return [_unknown_type(path + ["type"], tag, tags)]

    if kind == "literal_error":
        expected = ctx.get("expected", "")
        choices = [c.strip().strip("'\"") for c in expected.replace(" or ", ", ").split(",") if c.strip()]
        if path and path[-1] == "type" and _is_family_spec(owner):
            # a family with one registered type (attention): its union is that class alone
            return [_unknown_type(path, value, choices)]
        if known := _name_hint(value, choices):
            # a name from another tool: say what it is here rather than the nearest spelling
            return [(path, f"{_shown(value)} is not allowed", f"{known}. allowed: {', '.join(choices)}")]
        if isinstance(value, str) and (missing := NOT_BUILT_IN.get(value.lower())):
            return [(path, f"{_shown(value)} is not allowed", f"{missing}. allowed: {', '.join(choices)}")]
        guess = did_you_mean(str(value), choices) if isinstance(value, str) else None
        hint = (f"did you mean {guess!r}? " if guess else "") + f"allowed: {', '.join(choices)}"
        if not guess and path and path[-1] == "activation" and _is_ffn_spec(owner):
            # no registry of activations: a new one is a module, registered as an FFN type
            hint += ("; an activation of your own is an FFN type of your own "
                     "(docs/components.md#adding-a-component)")
        return [(path, f"{_shown(value)} is not allowed", hint)]

    if kind in ("missing", "too_long") and isinstance(value, list | tuple):
        # `betas: [0.9]` or `betas: [0.9, 0.95, 0.99]`: a list of a fixed length
        at = path[:-1] if kind == "missing" and path and isinstance(path[-1], int) else path
        field = getattr(owner, "model_fields", {}).get(str(at[-1])) if at else None
        default = getattr(field, "default", None)
        fixed = isinstance(default, tuple) and default and (kind == "missing" or ctx.get("max_length") == len(default))
        if fixed:
            return [(at, f"expected {len(default)} values, got {len(value)}: {list(value)}",
                     f"e.g. {at[-1]}: [{', '.join(map(str, default))}] (the default)")]

    if kind == "missing":
        return [(path, "required field is missing", "")]

    if kind == "int_type" and isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        # `d_model: 1e3` reads as the float 1000.0; an integer field takes it written whole
        return [(path, f"expected an integer, got the float {value!r}",
                 f"write {int(value)} (a number written with an exponent or a decimal point is a float)")]

    if kind in ("bool_type", "bool_parsing") and isinstance(value, str):
        # `compile: yes` or `compile: "true"`: a switch is YAML's true or false, unquoted
        return [(path, f"expected true or false, got the string {value!r}",
                 "write true or false, unquoted (yes, no, on and off are strings in a spec, as in YAML 1.2)")]

    if kind in ("int_type", "int_parsing", "float_type", "float_parsing") and isinstance(value, str) \
            and re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*", value):
        # `d_model: "128"`: a number in quotes is a string
        number = "an integer" if kind.startswith("int") else "a number"
        return [(path, f"expected {number}, got the string {value!r}",
                 f"write {value.strip()} without quotes (quoted, it is a string)")]

    if kind in ("int_type", "int_parsing", "float_type", "float_parsing", "bool_type", "string_type") \
            and isinstance(value, list | tuple):
        # `n_layers: [2]`: one value where a list was written
        what = {"int": "an integer", "float": "a number", "bool": "true or false", "string": "a string"}[
            kind.split("_")[0]]
        one = f"write {path[-1]}: {_flow_yaml(value[0])} (one value, no brackets)" if len(value) == 1 and path else ""
        return [(path, f"expected {what}, got a list {_flow_yaml(list(value))}", one)]

    if kind in ("tuple_type", "list_type") and isinstance(value, dict):
        # `overrides: {layers: 0, ...}`: one item where a list of them belongs
        item = _flow_yaml(value)
        return [(path, "expected a list, got a mapping",
                 f"a list is written in brackets (or one '- ' line per item): {path[-1] if path else 'it'}: [{item}]")]

    if kind in ("tuple_type", "list_type") and not isinstance(value, dict | list):
        # `betas: 0.9`: a list is written in brackets; the field's default shows its form
        field = getattr(owner, "model_fields", {}).get(str(path[-1])) if path else None
        default = getattr(field, "default", None)
        example = (f"e.g. {path[-1]}: [{', '.join(map(str, default))}] (the default)"
                   if isinstance(default, tuple | list) and default
                   else f"e.g. {path[-1]}: [{value}]" if isinstance(value, int | str) and not isinstance(value, bool)
                   else f"e.g. {path[-1]}: [...]")
        return [(path, f"expected a list, got {_shown(value)}", f"a list is written in brackets, {example}")]

    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    message = message[0].lower() + message[1:] if message else message
    # a message of our own may say already what it got ("..., got 2"); a plugin's "got"
    # that names something else still gets the value
    said = kind == "value_error" and " got " in message and (repr(value) in message or str(value) in message)
    if not isinstance(value, dict | list) and not said:
        message = f"{message}, got {_shown(value)}"
    return [(path, message, "")]


def _path_example(value: Any, annotation: Any) -> str:
    """For a file name given where a mapping with a type belongs (``training.data: input.txt``),
    the mapping of the type that reads files (``{type: files, paths: [input.txt]}``); ''
    for anything else."""
    if not isinstance(value, str) or not re.search(r"[./\\]", value) or " " in value:
        return ""
    for member in _unwrap(annotation):
        fields = getattr(member, "model_fields", {})
        kind = fields.get("type")
        if kind is None or not isinstance(kind.default, str):
            continue
        if "paths" in fields:
            return f"{{type: {kind.default}, paths: [{value}]}}"
        if "path" in fields:
            return f"{{type: {kind.default}, path: {value}}}"
    return ""


def _sections_below(owner: Any, name: str) -> list[str]:
    """The sections of ``owner`` (a spec class) whose own fields include ``name``."""
    if owner is None or not hasattr(owner, "model_fields"):
        return []
    found = []
    for section, info in owner.model_fields.items():
        members = [m for m in _unwrap(info.annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
        if any(name in m.model_fields for m in members) and section not in found:
            found.append(section)
    return found


def _sections_beside(loc: tuple, path: list, root: type[BaseModel], name: str) -> list[str]:
    """The sections beside the one at ``path[:-1]`` (of the class that holds it) whose own
    fields include ``name``: ``ffn`` for ``activation`` under ``decoder.attention``."""
    if len(path) < 2 or not isinstance(path[-2], str):
        return []
    for k in range(len(loc) - 1, 0, -1):
        walked, holder, _ = _walk(loc[:k], root)
        if walked == path[:-1]:
            return [s for s in _sections_below(holder, name) if s != path[-2]]
    return []


def _field_of_another_type(name: str, path: list, owner: Any) -> str:
    """Where an unknown field ``name`` is a field of another type of the same family
    (``paths`` under ``training.data`` of type stdlib is a field of type files), with the
    mapping that gives that type, its required fields and this one; '' if of none."""
    from specformer.registry import FAMILIES, REGISTRY

    for family in FAMILIES:
        classes = REGISTRY.spec_classes(family)
        if owner not in classes:
            continue
        having = [c for c in classes if name in c.model_fields]
        if having:
            types = [c.model_fields["type"].default for c in having]
            needed = [f"{f}: {_placeholder(info)}" for f, info in having[0].model_fields.items()
                      if info.is_required() and f not in ("type", name)]
            section = _dotted(path[:-1])
            return (f"{name!r} is a field of type {', '.join(types)}, not of type {owner.model_fields['type'].default}: "
                    f"give the type with it, {section}={{{', '.join([f'type: {types[0]}', *needed])}, {name}: ...}}")
    return ""


def _placeholder(info: Any) -> str:
    """``[...]`` for a field that takes a list, ``...`` for any other: a value to fill in."""
    listed = any(typing.get_origin(m) in (list, tuple) for m in _unwrap(info.annotation))
    return "[...]" if listed else "..."


def _field_elsewhere(name: str, path: list, owner: Any) -> str:
    """Where an unknown field ``name`` is a field of another section after all
    (``training.betas`` is ``training.optimizer.betas``); '' if nowhere."""
    found = field_path(name)
    if found is None or found[0] == _dotted(path):
        return ""
    sections = [p.rpartition(".")[0] or "the top level" for p in (found[0], *found[1])]
    return f"{name!r} is a field of {' and of '.join(sections)}"


def _unknown_type(path: list, tag: Any, tags: list[str]) -> tuple[list, str, str]:
    """The problem of a ``type:`` that no registered class of its family has."""
    hint_parts = []
    known = _name_hint(tag, tags)
    if known:
        hint_parts.append(known + ".")
    guess = did_you_mean(str(tag), tags) if tag is not None and not known else None
    if guess:
        hint_parts.append(f"did you mean {guess!r}?")
    from specformer.registry import BUILT_IN_ONLY, FAMILIES, REGISTRY

    # a name another tool gives a built-in type is that type, not one of the user's own; and
    # only a registry family takes types of one's own (not objectives, not rope scalings)
    pluggable = any(
        set(REGISTRY.names(family)) == set(tags) for family in FAMILIES if family not in BUILT_IN_ONLY
    )
    fixed = known or not pluggable
    hint_parts.append(f"allowed: {', '.join(tags)}" + ("" if fixed else "; a type of your own is registered "
                      "first (docs/components.md#adding-a-component)"))
    return (path, f"unknown type {tag!r}", " ".join(hint_parts))


def _is_family_spec(owner: Any) -> bool:
    """Whether ``owner`` is a registered spec class, whose ``type`` selects it in its family."""
    from specformer.registry import FAMILIES, REGISTRY

    return owner is not None and any(owner in REGISTRY.spec_classes(family) for family in FAMILIES)


def _is_ffn_spec(owner: Any) -> bool:
    """Whether ``owner`` is a registered FFN spec class (whose ``activation`` is a fixed choice)."""
    from specformer.registry import REGISTRY

    return owner is not None and owner in REGISTRY.spec_classes("ffn")


def _name_hint(value: Any, choices: list[str]) -> str | None:
    """What another tool's name ``value`` is called here, if that is one of ``choices`` (the
    hint for `mlm` as an objective, not as a positional type)."""
    hint = TYPE_HINTS.get(value.lower()) if isinstance(value, str) else None
    # any name the hint gives: `activation: swiglu` is told of `type: glu` with `activation: silu`
    targets = re.findall(r"`(?:\w+: )?([\w-]+)`", hint) if hint else []
    return hint if any(target in choices for target in targets) else None


def _split(field: str) -> list[str | int]:
    return [int(p) if p.isdigit() else p for p in field.split(".") if p]


def _unwrap(annotation: Any) -> list[Any]:
    """The member types of an annotation, with Annotated, Optional and unions flattened."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                out.extend(_unwrap(arg))
        return out
    return [annotation]


def _tags(annotation: Any) -> list[str]:
    tags = []
    for member in _unwrap(annotation):
        field = getattr(member, "model_fields", {}).get("type")
        if field is not None and isinstance(field.default, str):
            tags.append(field.default)
    return tags


def _walk(loc: tuple, root: type[BaseModel]) -> tuple[list, type[BaseModel] | None, Any]:
    """Follow pydantic's error location through the schema, dropping union tags.

    Returns the data path, the model class that owns the last key, and the
    annotation found at the end.
    """
    path: list[str | int] = []
    owner: type[BaseModel] | None = None
    annotation: Any = root
    for element in loc:
        members = _unwrap(annotation)
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if len(models) > 1 or (models and isinstance(element, str) and element in _tags(annotation) and element not in models[0].model_fields):
            chosen = next((m for m in models if m.model_fields.get("type") is not None and m.model_fields["type"].default == element), None)
            if chosen is None:
                chosen = next((m for m in models if m.__name__ == element), None)
            if chosen is not None:
                annotation = chosen
                continue
            path.append(element)
            annotation = None
            continue
        if len(models) == 1:
            owner = models[0]
            path.append(element)
            field = owner.model_fields.get(element) if isinstance(element, str) else None
            annotation = field.annotation if field is not None else None
            continue
        sequence = next(
            (m for m in members if typing.get_origin(m) in (tuple, list)), None
        )
        path.append(element)
        if sequence is not None and isinstance(element, int):
            args = [a for a in typing.get_args(sequence) if a is not Ellipsis]
            annotation = args[0] if args else None
        else:
            annotation = None
    return path, owner, annotation
