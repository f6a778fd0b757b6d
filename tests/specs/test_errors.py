"""Bad spec files give one clear problem each: file:line, the field path, what is allowed."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import pytest
import yaml

from specformer import SpecError, load_spec


def _problems(tmp_path: Path, text: str, name: str = "spec.yaml", overrides=None):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides=overrides)
    return info.value.problems


# (id, yaml, expected line, expected field path, words the message or hint must contain)
BAD_INPUTS = [
    ("yaml-syntax", "kind: decoder\nd_model: [1, 2\n", 3, "", ["YAML syntax error", "the [ ... ] opened at line 2"]),
    # a key without its ':' is placed at its own line, not the next one, where PyYAML gave up
    ("yaml-no-colon", "kind: decoder\nd_model 64\nvocab_size: 5\n", 2, "", ["a key without its ':'"]),
    ("yaml-open-quote", "kind: decoder\nname: 'tiny\n", 2, "", ["a quote opened here is never closed"]),
    # a quote that is closed, whose backslash starts an escape: at the backslash, and not "never closed"
    ("yaml-backslash-in-double-quotes", 'kind: decoder\nname: "C:\\data\\tiny"\n', 2, "",
     ["unknown escape character 'd'", "a backslash starts an escape", "in single quotes"]),
    ("yaml-deeper-indent", "decoder:\n  n_layers: 2\n    attention: {}\n", 3, "",
     ["a line indented deeper than the key above it"]),
    ("yaml-list-item-among-keys", "decoder:\n  n_layers: 2\n  - attention: {}\n", 3, "",
     ["a list item ('- ...') among the keys of a mapping"]),
    ("yaml-open-brace", "kind: decoder\ndecoder: {n_layers: 2\nname: x\n", 3, "", ["the { ... } opened at line 2"]),
    ("tab-indent", "kind: decoder\ndecoder:\n\tn_layers: 2\n", 3, "", ["tab", "spaces"]),
    ("duplicate-key", "kind: decoder\nd_model: 8\nd_model: 16\n", 3, "d_model", ["duplicate key", "line 2"]),
    ("python-tag", "kind: decoder\nname: !!python/object:os.system {}\n", 2, "name", ["!!python/object", "not allowed"]),
    ("python-apply-tag", "kind: !!python/object/apply:os.system ['echo hi']\n", 1, "kind", ["not allowed"]),
    ("unknown-top-key", "extends: gpt-nano\nd_modle: 64\n", 2, "d_modle", ["unknown field", "did you mean 'd_model'"]),
    ("unknown-nested-key", "extends: gpt-nano\ndecoder:\n  attention: {n_head: 4}\n", 3,
     "decoder.attention.n_head", ["unknown field", "did you mean 'n_heads'", "allowed:"]),
    ("wrong-type", "extends: gpt-nano\nd_model: wide\n", 2, "d_model", ["valid integer", "'wide'"]),
    # a list field given one value: what to write, in brackets, with the default as the example
    ("scalar-for-list", "extends: gpt-nano\ntraining:\n  optimizer: {betas: 0.9}\n", 3, "training.optimizer.betas",
     ["expected a list, got 0.9", "a list is written in brackets, e.g. betas: [0.9, 0.95] (the default)"]),
    # a list of a fixed length given too few or too many values: how many, with the default
    ("short-list", "extends: gpt-nano\ntraining:\n  optimizer:\n    betas: [0.9]\n", 4, "training.optimizer.betas",
     ["expected 2 values, got 1: [0.9]", "e.g. betas: [0.9, 0.95] (the default)"]),
    ("long-list", "extends: gpt-nano\ntraining:\n  optimizer:\n    betas: [0.9, 0.95, 0.99]\n", 4,
     "training.optimizer.betas", ["expected 2 values, got 3: [0.9, 0.95, 0.99]", "(the default)"]),
    ("exponent-for-int", "extends: gpt-nano\nd_model: 1e3\n", 2, "d_model",
     ["expected an integer, got the float 1000.0", "write 1000"]),
    ("bad-enum", "extends: gpt-nano\nkind: decoder-only\n", 2, "kind", ["not allowed", "encoder, decoder, encoder-decoder"]),
    ("bad-activation", "extends: gpt-nano\ndecoder:\n  ffn: {activation: gleu}\n", 3,
     "decoder.ffn.activation", ["did you mean 'gelu'", "relu, gelu, gelu_tanh, silu"]),
    # activations are a fixed choice, not a family: the hint says where a new one goes
    ("activation-of-ones-own", "extends: gpt-nano\ndecoder:\n  ffn: {activation: mish}\n", 3,
     "decoder.ffn.activation", ["relu, gelu, gelu_tanh, silu; an activation of your own is an FFN type of your own "
                                "(docs/components.md#adding-a-component)"]),
    ("bad-type-name", "extends: gpt-nano\npositional: {type: rotary}\n", 2, "positional.type",
     ["unknown type 'rotary'", "type: rope", "sinusoidal, learned, rope, alibi, t5, none"]),
    ("misspelt-type", "extends: gpt-nano\ndecoder:\n  norm: {type: rmsnrom}\n", 3, "decoder.norm.type",
     ["did you mean 'rmsnorm'", "layernorm, rmsnorm"]),
    ("negative-size", "extends: gpt-nano\ndecoder:\n  n_layers: -2\n", 3, "decoder.n_layers", ["greater than 0"]),
    ("zero-vocab", "extends: gpt-nano\nvocab_size: 0\n", 2, "vocab_size", ["greater than 0"]),
    ("dropout-range", "extends: gpt-nano\nembedding: {dropout: 1.5}\n", 2, "embedding.dropout", ["less than 1"]),
    ("kv-heads-divide", "extends: gpt-nano\ndecoder:\n  attention: {n_heads: 4, n_kv_heads: 3}\n", 3,
     "decoder.attention.n_kv_heads", ["must divide n_heads=4", "allowed: 1, 2, 4"]),
    ("d-model-heads", "extends: gpt-nano\ndecoder:\n  attention: {n_heads: 3}\n", 3,
     "decoder.attention.n_heads", ["not divisible", "head_dim"]),
    ("rope-odd", "extends: gpt-nano\npositional: {type: rope, fraction: 0.3}\n", 2, "positional.fraction",
     ["even", "head_dim=32"]),
    ("learned-too-short", "extends: gpt-nano\npositional: {type: learned, max_positions: 100}\n", 2,
     "positional.max_positions", ["100 usable positions", "max_seq_len is 256"]),
    ("kind-missing-stack", "extends: gpt-nano\nkind: encoder-decoder\n", 2, "kind", ["needs an encoder stack"]),
    ("kind-null-stack", "extends: t5-nano\nencoder: null\n", 2, "encoder",
     ["needs an encoder stack", "got null"]),
    ("kind-extra-stack", "extends: gpt-nano\nencoder: {n_layers: 2}\n", 2, "encoder", ["has no encoder stack"]),
    ("cross-attn-in-decoder-only", "extends: gpt-nano\ndecoder:\n  cross_attention: {n_heads: 4}\n", 3,
     "decoder.cross_attention", ["only in the decoder of an encoder-decoder"]),
    ("absurdly-deep", "extends: gpt-nano\ndecoder:\n  n_layers: 100000000000\n", 3, "decoder.n_layers",
     ["less than or equal to 10000"]),
    # an unset shell variable (`out_dir: $OUT`) is no folder, not the working directory
    ("empty-out-dir", "extends: gpt-nano\ntraining: {out_dir: ''}\n", 2, "training.out_dir",
     ["an empty folder name, which would write into the working directory", "e.g. runs (or . for this folder)"]),
    ("blank-cache-dir", "extends: gpt-nano\ntraining: {cache_dir: ' '}\n", 2, "training.cache_dir",
     ["an empty folder name"]),
    ("override-out-of-range", "extends: gpt-nano\ndecoder:\n  overrides:\n    - {layers: 7, attention: {sliding_window: 8}}\n",
     4, "decoder.overrides.0.layers", ["out of range", "0-3"]),
    ("override-bad-range", "extends: gpt-nano\ndecoder:\n  overrides:\n    - {layers: 'five', ffn: {d_ff: 8}}\n",
     4, "decoder.overrides.0.layers", ["range like"]),
    ("parallel-post-norm", "extends: bert-nano\nencoder:\n  residual: {type: parallel}\n", 3,
     "encoder.residual.type", ["needs norm placement pre"]),
    ("missing-required", "name: x\nkind: decoder\nd_model: 8\ndecoder: {n_layers: 2}\n", 1, "vocab_size", ["required"]),
    ("not-a-mapping", "- 1\n- 2\n", 1, "", ["mapping, found a list"]),
    ("extends-missing-file", "extends: ../nowhere/parent.yaml\n", 1, "extends", ["file not found"]),
    ("extends-unknown-preset", "extends: gpt2-smal\n", 1, "extends", ["did you mean 'gpt2-small'"]),
    ("extends-not-string", "extends: [gpt-nano]\n", 1, "extends", ["preset name or a path"]),
    ("empty-file", "\n", 1, "", ["empty"]),
    # sizes are integers and switches booleans: 64.0, "128", true or "false" are not coerced
    ("float-size", "extends: gpt-nano\nd_model: 64.0\n", 2, "d_model", ["expected an integer", "64.0", "write 64"]),
    ("fractional-size", "extends: gpt-nano\nd_model: 64.5\n", 2, "d_model", ["valid integer", "64.5"]),
    ("string-size", "extends: gpt-nano\nd_model: '128'\n", 2, "d_model",
     ["expected an integer, got the string '128'", "write 128 without quotes"]),
    ("string-rate", "extends: gpt-nano\ntraining: {optimizer: {lr: '3e-4'}}\n", 2, "training.optimizer.lr",
     ["expected a number, got the string '3e-4'", "write 3e-4 without quotes"]),
    # a look-alike pasted from a web page or a PDF is named, not taken for quotes
    ("no-break-space-after-a-number", "extends: gpt-nano\ndecoder:\n  n_layers: 3\u00a0\n", 3, "decoder.n_layers",
     ["got the string '3\\xa0'", "U+00A0 NO-BREAK SPACE (character 2)", "retype it"]),
    ("cyrillic-letter-in-a-key", "extends: gpt-nano\ndecoder:\n  n_l\u0430yers: 3\n", 3, "decoder.n_l\u0430yers",
     ["U+0430 CYRILLIC SMALL LETTER A (character 4)", "did you mean 'n_layers'?"]),
    ("fullwidth-digit", "extends: gpt-nano\nd_model: \uff16\uff14\n", 2, "d_model",
     ["U+FF16 FULLWIDTH DIGIT SIX (character 1), U+FF14 FULLWIDTH DIGIT FOUR (character 2)"]),
    ("no-break-space-after-a-colon", "extends: gpt-nano\ndecoder:\n  n_layers:\u00a03\n", 2, "decoder",
     ["U+00A0 NO-BREAK SPACE (character 10)"]),
    ("bool-size", "extends: gpt-nano\ndecoder: {n_layers: true}\n", 2, "decoder.n_layers", ["valid integer", "got true"]),
    ("string-bool", "extends: gpt-nano\nembedding: {tie_output: 'false'}\n", 2, "embedding.tie_output",
     ["expected true or false, got the string 'false'", "write true or false, unquoted"]),
    ("yes-for-a-switch", "extends: gpt-nano\ntraining: {compile: yes}\n", 2, "training.compile",
     ["got the string 'yes'", "yes, no, on and off are strings"]),
    ("int-bool", "extends: gpt-nano\nembedding: {tie_output: 1}\n", 2, "embedding.tie_output", ["valid boolean"]),
    ("override-reversed-range", "extends: gpt-nano\ndecoder:\n  overrides:\n    - {layers: '3-1', ffn: {d_ff: 8}}\n",
     4, "decoder.overrides.0.layers", ['range like "0-5" (low to high), got \'3-1\'']),
    # a field of a section one level down is placed there, not taken for a look-alike ('attention')
    ("field-of-a-section-below", "extends: gpt-nano\ndecoder:\n  activation: relu\n", 3, "decoder.activation",
     ["'activation' is a field of decoder.ffn", "allowed here: n_layers"]),
    ("norm-field-in-the-stack", "extends: gpt-nano\ndecoder: {placement: post}\n", 2, "decoder.placement",
     ["'placement' is a field of decoder.norm"]),
    # and a field of the section beside it, there
    ("field-of-a-sibling-section", "extends: gpt-nano\ndecoder:\n  attention: {activation: relu}\n", 3,
     "decoder.attention.activation", ["'activation' is a field of decoder.ffn", "allowed here: type, n_heads"]),
    ("field-of-a-sibling-in-an-override",
     "extends: gpt-nano\ndecoder:\n  overrides:\n    - {layers: 1, norm: {activation: relu}}\n", 4,
     "decoder.overrides.0.norm.activation", ["'activation' is a field of decoder.overrides.0.ffn"]),
    # one mistake, said once: not also "paths: required field is missing"
    ("misspelt-required-field", "extends: gpt-nano\ntraining:\n  data: {type: files, path: [input.txt]}\n", 3,
     "training.data.path", ["did you mean 'paths'?"]),
    ("field-of-a-type-with-required-fields", "extends: gpt-nano\ntraining:\n  data: {text_field: body}\n", 3,
     "training.data.text_field", ["training.data={type: files, paths: [...], text_field: ...}"]),
    ("layernorm-bias-without-gain", "extends: gpt-nano\ndecoder:\n  norm: {weight: false}\n", 3,
     "decoder.norm.bias", ["without a gain (weight: false) has no bias either", "set bias: false"]),
    # YAML's words, not Python's: true, null, a list, a number
    ("bool-for-a-choice", "extends: gpt-nano\ndecoder:\n  attention: {qk_norm: true}\n", 3,
     "decoder.attention.qk_norm", ["true is not allowed", "allowed: none, layernorm, rmsnorm"]),
    ("null-key", "extends: gpt-nano\nnull: foo\n", 2, "null", ["unknown field 'null'"]),
    ("mapping-for-a-list", "extends: gpt-nano\ndecoder:\n  overrides: {layers: 0, ffn: {d_ff: 8}}\n", 3,
     "decoder.overrides", ["expected a list, got a mapping", "overrides: [{layers: 0, ffn: {d_ff: 8}}]"]),
    ("extends-a-number", "extends: 5\n", 1, "extends", ["found a number"]),
    # a range is measured before it is made: a typo of a few digits must not fill memory
    ("override-huge-range", "extends: gpt-nano\ndecoder:\n  overrides:\n    - {layers: '0-99999999999999999999', ffn: {d_ff: 8}}\n",
     4, "decoder.overrides.0.layers", ["covers 100,000,000,000,000,000,000 layers", "at most 10,000"]),
    # an integer longer than Python reads (4,300 digits) is a spec error, not a ValueError
    ("integer-too-long", "extends: gpt-nano\nd_model: " + "1" * 5000 + "\n", 2, "d_model",
     ["too long", "5,000 digits"]),
    # a mapping that holds itself (an alias inside its own anchor) or nesting without end
    ("recursive-alias", "extends: gpt-nano\ndecoder: &a {overrides: [*a]}\n", 2, "decoder",
     ["an alias (*a) inside its own anchor (&a)", "move *a out of"]),
    ("bad-devices", "extends: gpt-nano\ntraining: {devices: [cpu]}\n", 2, "training.devices",
     ["a device count (1, 2, ...), a non-empty list of device indices ([0, 1]) or 'auto'"]),
    ("embedding-norm-placement", "extends: bert-nano\nembedding:\n  norm: {type: layernorm, placement: post}\n", 3,
     "embedding.norm", ["no meaning"]),
    # a scalar where a typed mapping belongs; the error is on this file's line, not the parent's
    ("scalar-for-typed-mapping", "extends: gpt-nano\npositional: rope\n", 2, "positional",
     ["expected a mapping with a type: field, got 'rope'", "write {type: rope}", "sinusoidal, learned, rope"]),
    ("empty-typed-mapping", "extends: gpt-nano\ndecoder:\n  ffn:\n", 3, "decoder.ffn",
     ["got null", "allowed types: mlp, glu"]),
    # a family with one type says what to write, never the name of a Python class
    ("scalar-for-one-type-section", "extends: gpt-nano\ntraining:\n  optimizer: adamw\n", 3, "training.optimizer",
     ["expected a mapping with a type: field, got 'adamw'", "write {type: adamw}"]),
    ("scalar-for-a-section", "extends: gpt-nano\ndecoder: 3\n", 2, "decoder", ["expected a mapping of fields, got 3"]),
    ("cross-attn-in-an-override", "extends: gpt-nano\ndecoder:\n  overrides:\n    - {layers: 1, cross_attention: {}}\n",
     4, "decoder.overrides.0.cross_attention", ["only in the decoder of an encoder-decoder"]),
    # the cross-attention derived from a bad self-attention is not a second problem in the preset
    ("derived-cross-attention", "extends: t5-nano\ndecoder:\n  attention: {n_kv_heads: 3}\n", 3,
     "decoder.attention.n_kv_heads", ["must divide"]),
    # a number is finite: an infinite std or eps builds a model of NaNs (and is not JSON)
    ("infinite-float", "extends: gpt-nano\ninit: {std: .inf}\n", 2, "init.std", ["finite number", "inf"]),
    ("overflowing-float", "extends: gpt-nano\ndecoder:\n  norm: {eps: 1e400}\n", 3, "decoder.norm.eps",
     ["finite number"]),
    # the allowed n_heads are listed without trying every number up to d_model
    ("huge-d-model-heads", "kind: decoder\nvocab_size: 8\nd_model: 1048573\ndecoder: {n_layers: 1}\n", 4,
     "decoder.attention.n_heads",
     ["not divisible", "choose n_heads from 1, 1048573"]),
    # a rope scaling: its types, and its fields' rules
    ("rope-scaling-type", "extends: llama2-7b\npositional:\n  scaling: {type: ntk_by_parts, factor: 2}\n", 3,
     "positional.scaling.type", ["unknown type 'ntk_by_parts'", "allowed: linear, llama3, yarn, dynamic, longrope"]),
    # one LongRoPE factor per rotary frequency: llama2-7b rotates 128 features, 64 frequencies
    ("rope-scaling-longrope-length",
     "extends: llama2-7b\npositional:\n  scaling:\n    type: longrope\n    factor: 2\n"
     "    original_max_position_embeddings: 2048\n    short_factor: [1, 1]\n    long_factor: [" + ", ".join(["2"] * 64)
     + "]\n", 7,
     "positional.scaling.short_factor",
     ["2 factors, but the rotary has 64 frequencies (head_dim=128 × fraction=1.0 = 128 rotated features"]),
    ("rope-scaling-ntk", "extends: llama2-7b\npositional:\n  scaling: {type: ntk, factor: 2}\n", 3,
     "positional.scaling.type", ["unknown type 'ntk'", "dynamic NTK scaling is `dynamic`"]),
    ("rope-scaling-dynamic-length", "extends: llama2-7b\npositional:\n  scaling: {type: dynamic, factor: 2}\n", 3,
     "positional.scaling.original_max_position_embeddings", ["required field is missing"]),
    ("rope-scaling-dynamic-two-features",
     "kind: decoder\nvocab_size: 8\nd_model: 16\nmax_seq_len: 32\ndecoder: {n_layers: 1, attention: {n_heads: 4}}\n"
     "positional:\n  type: rope\n  fraction: 0.5\n  scaling: {type: dynamic, factor: 2, original_max_position_embeddings: 16}\n",
     9, "positional.scaling.type", ["power R / (R - 2)", "which is 2 here (head_dim=4 × fraction=0.5)"]),
    # transformers' check that a YaRN factor is max_position_embeddings / original_max_position_embeddings,
    # where max_seq_len runs past the extended context
    ("rope-scaling-yarn-factor",
     "extends: llama2-7b\npositional:\n  scaling:\n    type: yarn\n    factor: 2\n"
     "    original_max_position_embeddings: 1024\n", 5, "positional.scaling.factor",
     ["factor=2 extends original_max_position_embeddings=1024 to 2048 positions, but max_seq_len=4096",
      "use factor: 4 (max_seq_len / original_max_position_embeddings) or a max_seq_len of at most 2048"]),
    ("rope-scaling-band", "extends: llama2-7b\npositional:\n  scaling:\n    type: llama3\n    high_freq_factor: 1\n",
     5, "positional.scaling.high_freq_factor", ["must exceed low_freq_factor=1", "Llama 3.1: 4 and 1"]),
    ("rope-scaling-without-type", "extends: llama2-7b\npositional:\n  scaling: {factor: 4}\n", 3,
     "positional.scaling.type", ["required field is missing", "allowed types: linear, llama3, yarn, dynamic, longrope"]),
    ("rope-scaling-as-a-word", "extends: llama2-7b\npositional:\n  scaling: llama3\n", 3, "positional.scaling",
     ["expected a mapping with a type: field, got 'llama3'", "write {type: llama3}"]),
    ("rope-scaling-yarn-length", "extends: llama2-7b\npositional:\n  scaling: {type: yarn, factor: 4}\n", 3,
     "positional.scaling.original_max_position_embeddings", ["required field is missing"]),
    ("tab-separator", "extends: gpt-nano\nname:\tx\n", 2, "", ["tab character between values", "with a space"]),
    ("case-only-enum", "extends: gpt-nano\nkind: Decoder\n", 2, "kind", ["did you mean 'decoder'"]),
    ("mqa-name", "extends: gpt-nano\ndecoder:\n  attention: {type: mqa}\n", 3, "decoder.attention.type",
     ["multi-query attention is `type: mha` with `n_kv_heads: 1`"]),
    ("swish-name", "extends: gpt-nano\ndecoder:\n  ffn: {activation: swish}\n", 3, "decoder.ffn.activation",
     ["`activation: silu`"]),
    ("control-character", "extends: gpt-nano\nname: a\x01b\n", 2, "", ["U+0001", "not allowed"]),
    ("absurd-size", "extends: gpt-nano\nvocab_size: 100_000_000_000_000_000_000_000\n", 2, "vocab_size",
     ["less than or equal to 2147483647"]),
    # the derived sizes made from a bad one are not reported as well
    ("zero-heads", "extends: gpt-nano\ndecoder:\n  attention: {n_heads: 0}\n", 3, "decoder.attention.n_heads",
     ["greater than 0"]),
    ("t5-heads-override", "extends: t5-nano\ndecoder: {overrides: [{layers: [1], attention: {n_heads: 8}}]}\n", 2,
     "decoder.overrides.0.attention.n_heads", ["t5 positions are built once for the whole stack", "n_heads=4"]),
    ("rope-head-dim-override", "extends: gpt-nano\npositional: {type: rope}\n"
     "decoder: {overrides: [{layers: [1], attention: {n_heads: 8}}]}\n", 3,
     "decoder.overrides.0.attention.head_dim", ["rope positions", "head_dim=32", "head_dim=16"]),
    ("cross-sliding-window", "extends: t5-nano\ndecoder: {cross_attention: {sliding_window: 4}}\n", 2,
     "decoder.cross_attention.sliding_window", ["self-attention only"]),
    ("encoder-share-embedding", "extends: bert-nano\nembedding: {share_encoder_decoder: false}\n", 2,
     "embedding.share_encoder_decoder", ["an encoder model has one embedding"]),
    # values as YAML writes them (they read true, None); an example that is valid
    ("list-as-true", "extends: gpt-nano\ndecoder: {overrides: [{layers: true, attention: {n_heads: 4}}]}\n", 2,
     "decoder.overrides.0.layers", ["expected a list, got true", "e.g. layers: [...]"]),
    ("null-heads", "extends: gpt-nano\ndecoder:\n  attention: {n_heads: null}\n", 3, "decoder.attention.n_heads",
     ["got null"]),
    ("list-for-an-integer", "extends: gpt-nano\ndecoder: {n_layers: [2]}\n", 2, "decoder.n_layers",
     ["expected an integer, got a list [2]", "write n_layers: 2 (one value, no brackets)"]),
    ("second-document", "extends: gpt-nano\nname: x\n---\n", 3, "",
     ["a spec is one YAML document: remove the '---'"]),
    ("preset-as-a-file", "extends: gpt-nano.yaml\n", 1, "extends",
     ["file not found", "the preset is named without .yaml: gpt-nano"]),
]


def test_aliases_cannot_expand_a_small_file_without_bound(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]  # 10^9 values
    problems = _problems(tmp_path, "\n".join(lines) + "\n")
    assert len(problems) == 1 and "expands to more than 50,000" in str(problems[0])
    assert problems[0].position.source.endswith("spec.yaml")


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_names_file_line_and_field(tmp_path, case):
    _, text, line, path, words = case
    problems = _problems(tmp_path, text)
    assert len(problems) == 1, [str(p) for p in problems]
    problem = problems[0]
    assert problem.position is not None and problem.position.source.endswith("spec.yaml"), str(problem)
    assert problem.position.line == line, str(problem)
    assert problem.path == path, str(problem)
    text_out = str(problem)
    for word in words:
        assert word in text_out, f"{word!r} not in {text_out!r}"


def test_every_problem_is_reported_at_once(tmp_path):
    problems = _problems(
        tmp_path,
        """
        extends: gpt-nano
        d_model: -1
        decoder:
          n_layer: 2
          ffn: {type: swiglu}
          norm: {placement: middle}
        head: {bias: maybe}
        """,
    )
    assert [p.path for p in problems] == [
        "d_model",
        "decoder.n_layer",
        "decoder.ffn.type",
        "decoder.norm.placement",
        "head.bias",
    ]
    assert [p.position.line for p in problems] == [2, 4, 5, 6, 7]
    assert "activation: silu" in problems[2].hint  # users' name for it is explained


def test_overrides_past_the_stack_are_reported_with_every_other_cross_field_problem(tmp_path):
    # each out-of-range override, and the model's other cross-field rules, in one run; the
    # heads an override inherits are said once, at the stack that writes them
    problems = _problems(
        tmp_path,
        """
        extends: gpt-nano
        d_model: 250
        positional: {type: learned, max_positions: 128}
        decoder:
          attention: {n_heads: 8}
          overrides:
            - {layers: "2-5", attention: {sliding_window: 8}}
            - {layers: [7], ffn: {d_ff: 64}}
        """,
    )
    assert [(p.path, p.position.line) for p in problems] == [
        ("positional.max_positions", 3),
        ("decoder.attention.n_heads", 5),
        ("decoder.overrides.0.layers", 7),
        ("decoder.overrides.1.layers", 8),
    ]
    assert "layer indices 4-5 are out of range" in problems[2].message  # the range past the stack, not its first
    assert "layer index 7 is out of range" in problems[3].message


def test_extends_cycle_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: ./a.yaml\nname: b\n")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "a.yaml")
    (problem,) = info.value.problems
    assert "extends cycle" in problem.message
    assert "a.yaml -> " in problem.message and problem.message.endswith("a.yaml")
    assert problem.position.line == 1


def test_error_points_into_the_parent_file_when_the_parent_is_wrong(tmp_path):
    (tmp_path / "parent.yaml").write_text("extends: gpt-nano\nname: parent\n\ndecoder:\n  n_layers: 0\n")
    (tmp_path / "child.yaml").write_text("extends: parent.yaml\nname: child\n")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "child.yaml")
    (problem,) = info.value.problems
    assert problem.position.source.endswith("parent.yaml") and problem.position.line == 5
    assert problem.path == "decoder.n_layers"


def test_override_errors_name_the_override(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["decoder.n_layers=many", "positional.type=rotary"])
    problems = info.value.problems
    assert {p.path for p in problems} == {"decoder.n_layers", "positional.type"}
    assert all(str(p.position).startswith("--set ") for p in problems)
    # a field the new type needs is missing because of the --set, not of the preset
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["training.tokenizer.type=file"])
    (problem,) = info.value.problems
    assert problem.path == "training.tokenizer.path" and str(problem.position) == "--set training.tokenizer.type=file"
    # the same type again keeps the file's positions for the mapping's other fields
    with pytest.raises(SpecError) as info:
        load_spec({"extends": "gpt-nano", "training": {"optimizer": {"type": "adamw", "lr": "fast"}}},
                  overrides=["training.optimizer.type=adamw"])
    (problem,) = info.value.problems
    assert problem.path == "training.optimizer.lr" and not str(problem.position).startswith("--set")


def test_a_kept_field_the_retyping_mapping_gives_itself_is_placed_at_the_set():
    # a norm of another type keeps the stack's placement, but this one is the --set's own
    # (it was placed at the preset's `norm:` line, which says `placement: pre`)
    arg = "decoder.norm={type: rmsnorm, placement: bogus}"
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=[arg])
    (problem,) = info.value.problems
    assert problem.path == "decoder.norm.placement" and str(problem.position) == f"--set {arg}"
    # one it does not give stays the file's
    with pytest.raises(SpecError) as info:
        load_spec({"extends": "gpt-nano", "decoder": {"norm": {"placement": "bogus"}}},
                  overrides=["decoder.norm={type: rmsnorm}"])
    (problem,) = info.value.problems
    assert problem.path == "decoder.norm.placement" and not str(problem.position).startswith("--set")


def test_a_stack_set_to_null_is_placed_at_the_set(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["decoder=null"])
    (problem,) = info.value.problems
    assert problem.path == "decoder" and str(problem.position) == "--set decoder=null"
    assert "kind 'decoder' needs a decoder stack" in str(problem) and "got null" in str(problem)


def test_a_stack_the_kind_lacks_is_refused_even_when_its_fields_are_wrong():
    # the stack's own errors are not all: fixing them would only lead to the stack's refusal
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["encoder.attention.n_heads=2"])
    assert [(p.path, p.message) for p in info.value.problems] == [
        ("encoder", "kind 'decoder' has no encoder stack; remove it or change kind"),
        ("encoder.n_layers", "required field is missing"),
    ]
    assert all(str(p.position) == "--set encoder.attention.n_heads=2" for p in info.value.problems)
    # and when another field is wrong; once, when the rules between fields say it too
    with pytest.raises(SpecError) as info:
        load_spec("bert-nano", overrides=["decoder.n_layers=2", "d_model=wide"])
    assert sorted(p.path for p in info.value.problems) == ["d_model", "decoder"]
    with pytest.raises(SpecError) as info:
        load_spec("bert-nano", overrides=["decoder.n_layers=2"])
    assert [p.path for p in info.value.problems] == ["decoder"]


def test_malformed_override_is_explained():
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["decoder.n_layers"])
    assert "dotted.path=value" in str(info.value)


def test_missing_source_suggests_a_preset():
    with pytest.raises(SpecError) as info:
        load_spec("bert-bsae")
    assert "did you mean 'bert-base'" in str(info.value)


def test_no_file_is_executed_by_yaml_tags(tmp_path):
    marker = tmp_path / "pwned"
    problems = _problems(
        tmp_path,
        f"kind: decoder\nname: !!python/object/apply:os.system ['touch {marker}']\n",
    )
    assert not marker.exists()
    assert "not allowed" in problems[0].message


def test_exponent_floats_without_a_dot_are_numbers(tmp_path):
    # YAML 1.1 (PyYAML) reads 1e-6 as a string; specs read it as users mean it
    path = tmp_path / "spec.yaml"
    path.write_text("extends: gpt-nano\ndecoder:\n  norm: {eps: 1e-6}\n")
    assert load_spec(path).decoder.norm.eps == 1e-6
    assert load_spec("gpt-nano", overrides=["decoder.norm.eps=2E-5"]).decoder.norm.eps == 2e-5
    assert load_spec("gpt-nano", overrides=["name=1e5x"]).name == "1e5x"


# YAML 1.1 (PyYAML) reads each of these as something else: 8, 90, True, False, a date
YAML_12_SCALARS = [
    ("010", 10), ("0o17", 15), ("0x1F", 31), ("-7", -7), ("1.", 1.0), ("1e-5", 1e-5), (".5", 0.5),
    ("1:30", "1:30"), ("yes", "yes"), ("no", "no"), ("on", "on"), ("off", "off"), ("y", "y"), ("n", "n"),
    ("True", True), ("FALSE", False), ("tRUE", "tRUE"), ("~", None), ("Null", None), ("", None),
    ("2024-01-01", "2024-01-01"), ("1_000", 1000), ("1__0", "1__0"), ("_10", "_10"), ("=", "="),
]


@pytest.mark.parametrize(("text", "value"), YAML_12_SCALARS, ids=[t or "empty" for t, _ in YAML_12_SCALARS])
def test_plain_scalars_are_read_as_yaml_1_2(text, value):
    from specformer.specs.loader import apply_overrides, dump_yaml, parse_yaml

    # in a file and in a --set alike; what is written reads back the same
    for read in (parse_yaml(f"x: {text}\n")[0]["x"], apply_overrides({}, [f"x={text}"])["x"]):
        assert read == value and type(read) is type(value)
    assert parse_yaml(dump_yaml({"x": text}))[0]["x"] == text
    assert yaml.safe_load(dump_yaml({"x": text}))["x"] == text  # and in YAML 1.1 tools


def test_no_value_changes_silently_in_a_file_or_a_set(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("extends: gpt-nano\ndecoder: {n_layers: 010}\n")
    assert load_spec(path).decoder.n_layers == 10
    assert load_spec("gpt-nano", overrides=["decoder.n_layers=010"]).decoder.n_layers == 10
    assert load_spec("gpt-nano", overrides=["name=no"]).name == "no"
    # a word where a switch or a number belongs is an error naming the field, not a guess
    problems = _problems(tmp_path, "extends: gpt-nano\ntraining:\n  compile: yes\n")
    assert [(p.path, p.position.line) for p in problems] == [("training.compile", 3)]
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["embedding.tie_output=off", "max_seq_len=1:30"])
    assert [(p.path, str(p.position)) for p in info.value.problems] == [
        ("embedding.tie_output", "--set embedding.tie_output=off"), ("max_seq_len", "--set max_seq_len=1:30")]
    assert "got the string 'off'" in str(info.value) and "got '1:30'" in str(info.value)
    # an explicit tag is read by the same rules
    problems = _problems(tmp_path, "extends: gpt-nano\nd_model: !!int 1:30\n")
    assert problems[0].path == "d_model" and "'1:30' is not an integer" in problems[0].message


def test_the_loaders_yaml_rules_are_its_own():
    # PyYAML's SafeLoader, shared with every other user in the process, keeps YAML 1.1
    from specformer.specs.loader import parse_yaml

    parse_yaml("x: 1\n")
    assert yaml.safe_load("a: yes\nb: 010\n") == {"a": True, "b": 8}


def test_an_override_that_makes_a_mapping_is_where_its_errors_are():
    # `foo.bar=1` makes `foo`: the unknown field is the --set's, not the preset's first line
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["foo.bar=1", "training.nope.deeper=2"])
    assert [(p.path, str(p.position)) for p in info.value.problems] == [
        ("foo", "--set foo.bar=1"), ("training.nope", "--set training.nope.deeper=2")]


@pytest.mark.parametrize("overrides", [[], ["training.optimizer.betas=[0.9, 0.9]"]], ids=["default", "written"])
def test_a_name_where_a_list_index_belongs_is_an_error_at_the_override(overrides):
    # betas is a list (the default, or the spec's own): `betas.x` must not turn it into a mapping
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=[*overrides, "training.optimizer.betas.x=0.9"])
    (problem,) = info.value.problems
    assert str(problem.position) == "--set training.optimizer.betas.x=0.9"
    assert problem.path == "training.optimizer.betas.x"
    assert "'x' is not a list index: training.optimizer.betas is" in problem.message
    assert problem.hint.startswith("allowed: 0-1")
    with pytest.raises(SpecError, match="'layers' is not a list index: decoder.overrides is"):
        load_spec("gpt-nano", overrides=["decoder.overrides.layers=2"])


def test_setting_an_item_of_a_missing_list_says_so():
    with pytest.raises(SpecError) as info:
        load_spec("gpt2-small", overrides=["decoder.overrides.0.layers=2"])
    (problem,) = info.value.problems
    assert "no item 0: the spec has no decoder.overrides list" in str(problem)
    assert "--set 'decoder.overrides=[...]'" in str(problem)


def test_yaml_merge_keys_let_a_mapping_override_what_it_merges(tmp_path):
    # `<<: *enc` then `n_layers: 4` is plain YAML (PyYAML's own loader gives 4), not a duplicate key
    path = tmp_path / "spec.yaml"
    path.write_text(
        "kind: encoder-decoder\nvocab_size: 64\nd_model: 32\n"
        "encoder: &enc\n  n_layers: 6\n  attention: {n_heads: 4}\n"
        "decoder:\n  <<: *enc\n  n_layers: 4\n"
    )
    spec = load_spec(path)
    assert (spec.encoder.n_layers, spec.decoder.n_layers, spec.decoder.attention.n_heads) == (6, 4, 4)
    path.write_text(path.read_text() + "  n_layers: 5\n")  # the mapping's own keys are still checked
    problems = _problems(tmp_path, path.read_text())
    assert [(p.path, p.position.line) for p in problems] == [("decoder.n_layers", 10)]
    assert "duplicate key 'n_layers' (first set at line 9)" in problems[0].message
    problems = _problems(tmp_path, "kind: decoder\ndecoder: {<<: 3}\n")  # a refused merge, not a traceback
    assert "bad merge key" in problems[0].message and problems[0].position.line == 2


def test_did_you_mean_prefers_the_one_choice_a_word_begins() -> None:
    from specformer.specs.errors import did_you_mean

    assert did_you_mean("llama2", ["gpt2-xl", "llama2-7b", "t5-small"]) == "llama2-7b"
    assert did_you_mean("bert-n", ["bert-base", "bert-large", "bert-nano"]) == "bert-nano"
    assert did_you_mean("batch_sise", ["batch_size", "seq_len"]) == "batch_size"  # edit distance still
    assert did_you_mean("zz", ["batch_size"]) is None


def test_an_override_may_set_one_item_of_a_default_list():
    # the spec does not write betas (a default): --set betas.1 changes that item alone
    spec = load_spec("gpt-nano", overrides=["training.optimizer.betas.1=0.99"])
    assert spec.training.optimizer.betas == (0.9, 0.99)
    with pytest.raises(SpecError, match=r"no item 5: training.optimizer.betas is \[0.9, 0.95\] by default"):
        load_spec("gpt-nano", overrides=["training.optimizer.betas.5=0.99"])


def test_a_file_that_is_not_utf8_is_reported_at_its_line_and_column(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("extends: gpt-nano\nname: café\n".encode("latin-1"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    (problem,) = info.value.problems
    assert (problem.position.line, problem.position.column) == (2, 10)
    assert "byte 0xe9 is not valid UTF-8" in str(problem) and "save the file as UTF-8" in str(problem)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_a_utf16_file_is_named_as_one(tmp_path, encoding):
    # `specformer validate x > my.yaml` in Windows PowerShell writes UTF-16
    path = tmp_path / "my.yaml"
    data = "extends: gpt-nano\nname: mine\n".encode(encoding)
    path.write_bytes(data if data.startswith((b"\xff\xfe", b"\xfe\xff")) else b"\xfe\xff" + data)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    (problem,) = info.value.problems
    assert "the file is UTF-16" in problem.message and problem.hint == "save the file as UTF-8"
    assert "Latin-1" not in str(problem) and "binary" not in str(problem)


@pytest.mark.parametrize("encoding", ["utf-32", "utf-32-le", "utf-32-be"])
def test_a_utf32_file_is_named_as_one_not_as_utf16_or_binary(tmp_path, encoding):
    # UTF-32-LE's byte-order mark (ff fe 00 00) opens with UTF-16-LE's (ff fe): it was named UTF-16;
    # UTF-32-BE's (00 00 fe ff) opens with NULs: it was named 'a binary file (model weights ...)'
    path = tmp_path / "my.yaml"
    text = "extends: gpt-nano\nname: mine\n"
    path.write_bytes(text.encode(encoding) if encoding == "utf-32" else ("\ufeff" + text).encode(encoding))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    (problem,) = info.value.problems
    assert problem.message == "not UTF-8 text: the file is UTF-32 (it starts with a UTF-32 byte order mark)"
    assert problem.hint == "save the file as UTF-8" and (problem.position.line, problem.position.column) == (1, 1)


def test_the_encoding_a_byte_order_mark_names() -> None:
    from specformer.specs.errors import bom_encoding

    named = {encoding: bom_encoding(("\ufeff" + "a: 1\n").encode(encoding)) for encoding in
             ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")}
    assert named == {"utf-8": None, "utf-16-le": "UTF-16", "utf-16-be": "UTF-16", "utf-32-le": "UTF-32",
                     "utf-32-be": "UTF-32"}
    assert bom_encoding(b"a: 1\n") is None and bom_encoding(b"") is None and bom_encoding(b"\x00\x00") is None


@pytest.mark.parametrize("make", ["safetensors", "torch.save"])
def test_weights_or_a_checkpoint_given_as_a_spec_are_named_as_binary(tmp_path, make):
    # not "save the file as UTF-8": no editor setting makes weights a spec
    torch = pytest.importorskip("torch")
    path = tmp_path / ("w.safetensors" if make == "safetensors" else "last.ckpt")
    if make == "safetensors":
        from safetensors.torch import save_file

        save_file({"embed.tokens.weight": torch.ones(4, 2)}, str(path))
    else:
        torch.save({"state_dict": {"model.w": torch.ones(2)}}, path)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    (problem,) = info.value.problems
    assert "a binary file (model weights or a checkpoint?), not a YAML spec" in problem.message
    assert "UTF-8" not in str(problem)
    # an extended file alike
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {path}\n")
    with pytest.raises(SpecError) as info:
        load_spec(child)
    assert "a binary file" in info.value.problems[0].message


def test_a_problem_in_an_extended_preset_says_where_to_change_it(tmp_path):
    problems = _problems(tmp_path, "extends: gpt-nano\nkind: encoder\n", name="mine.yaml")
    inherited = next(p for p in problems if p.path == "decoder")
    assert inherited.position.source.endswith("gpt-nano.yaml")
    assert "decoder comes from the preset gpt-nano, which " in inherited.hint
    assert inherited.hint.split(" (")[0].endswith("mine.yaml")  # ... override it in .../mine.yaml
    assert "`decoder: null` drops an inherited section" in inherited.hint
    own = next(p for p in problems if p.path == "kind")
    assert "comes from" not in own.hint
    (heads,) = _problems(tmp_path, "extends: gpt-nano\nd_model: 130\n", name="wide.yaml")
    assert heads.hint.endswith("wide.yaml") and "override it in" in heads.hint and "null" not in heads.hint


@pytest.mark.parametrize(
    "preset,objective,message",
    [
        ("bert-nano", "causal_lm", "objective 'causal_lm' does not train an encoder model (allowed: masked_lm, classification)"),
        ("t5-nano", "masked_lm", "objective 'masked_lm' does not train an encoder-decoder model (allowed: seq2seq)"),
        ("gpt-nano", "masked_lm", "objective 'masked_lm' does not train a decoder model (allowed: causal_lm, sft)"),
    ],
)
def test_an_objective_the_kind_cannot_train_names_the_kind(preset, objective, message):
    with pytest.raises(SpecError) as info:
        load_spec(preset, overrides=[f"training.objective.type={objective}"])
    assert message in str(info.value)


def test_an_encoder_decoder_with_the_wrong_objective_is_not_told_its_pairs_are_wrong():
    # the pairs fit t5-nano: the objective alone is the problem, not "an encoder trains on text"
    with pytest.raises(SpecError) as info:
        load_spec("t5-nano", overrides=["training.data={type: pairs, paths: [p.jsonl]}",
                                        "training.objective.type=causal_lm"])
    (problem,) = info.value.problems
    assert problem.path == "training.objective.type" and "does not train an encoder-decoder model" in problem.message


def test_a_dict_that_extends_a_preset_is_blamed_for_what_it_writes():
    # the dict's own values are not at the preset's lines, which hold other values
    with pytest.raises(SpecError) as info:
        load_spec({"extends": "gpt-nano", "decoder": {"n_layer": 2, "norm": {"type": "rmsnrom"}}})
    problems = {p.path: p for p in info.value.problems}
    assert set(problems) == {"decoder.n_layer", "decoder.norm.type"}
    assert all(str(p.position) == "<dict>" for p in problems.values())
    assert str(info.value).count("gpt-nano.yaml") == 0
    # a value the preset gives keeps its place in the preset
    with pytest.raises(SpecError) as info:
        load_spec({"extends": "gpt-nano", "d_model": 90, "decoder": {"attention": {"bias": False}}})
    (problem,) = info.value.problems
    assert problem.path == "decoder.attention.n_heads"
    assert problem.position.source.endswith("gpt-nano.yaml") and problem.position.line == 11


def test_a_message_that_says_what_it_got_says_it_once():
    with pytest.raises(SpecError) as info:
        load_spec("t5-nano", overrides=["training.data.max_len=2"])
    (problem,) = info.value.problems
    assert problem.message == "max_len must be at least min_len=3, got 2"
    with pytest.raises(SpecError) as info:
        load_spec("bert-nano", overrides=["training.objective.mask_token=0.9", "training.objective.random_token=0.2"])
    (problem,) = info.value.problems
    assert problem.message == "mask_token + random_token must be at most 1, got 0.9 + 0.2"
    # a message that does not say it still gets the value
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["training.max_steps=0"])
    (problem,) = info.value.problems
    assert problem.message == "input should be greater than 0, got 0"
    # a validator's own "got" about something else (a plugin's words) keeps the value
    from specformer.specs.loader import _describe
    from specformer.specs.schema import ModelSpec

    err = {"type": "value_error", "loc": ("d_model",), "msg": "Value error, it got too wide", "input": 7}
    assert _describe(err, ModelSpec)[0][1] == "it got too wide, got 7"


def test_a_bpe_too_small_because_the_model_is_names_the_models_vocab_size():
    # the tokenizer's vocab_size is the model's by default: the model's is the field to raise
    spec = {"extends": "gpt-nano", "training": {"tokenizer": {"type": "bpe"}}}
    with pytest.raises(SpecError) as info:
        load_spec(spec, overrides=["vocab_size=100"])
    (problem,) = info.value.problems
    assert problem.path == "vocab_size" and str(problem.position) == "--set vocab_size=100"
    assert problem.message == ("byte-level BPE (training.tokenizer) needs at least 259 tokens (256 bytes + 3 "
                               "specials) and has the model's vocab_size, 100; use at least 259")
    # a tokenizer size written out is that field's mistake
    with pytest.raises(SpecError) as info:
        load_spec(spec, overrides=["training.tokenizer.vocab_size=100"])
    (problem,) = info.value.problems
    assert problem.path == "training.tokenizer.vocab_size"


def test_field_names_from_other_tools_say_where_the_field_is_written(tmp_path):
    problems = _problems(tmp_path, """
        kind: decoder
        vocab_size: 512
        block_size: 128
        hidden_size: 64
        decoder:
          n_layer: 2
          n_heads: 4
          ffn: {intermediate_size: 128}
        training:
          lr: 1.0e-3
    """)
    hints = {p.path: p.hint for p in problems if p.message.startswith("unknown field")}
    # nanoGPT's block_size is the longest sequence (and the length it trains at), not a misspelt vocab_size
    assert hints["block_size"].startswith("nanoGPT's block_size is the model's `max_seq_len`, at the top level, and "
                                          "the length a run trains at, `training: {seq_len: N}`. allowed here: ")
    assert "did you mean" not in hints["block_size"]
    assert hints["hidden_size"].startswith("the width is `d_model`, at the top level.")
    assert hints["decoder.n_heads"].startswith("heads are set in a stack's attention: `attention: {n_heads: N}`.")
    assert hints["decoder.ffn.intermediate_size"].startswith("the FFN's hidden size is `d_ff`")
    assert hints["training.lr"].startswith("the learning rate is `training: {optimizer: {lr: ...}}`.")
    # a misspelling of a field of this section is still a "did you mean"
    assert hints["decoder.n_layer"].startswith("did you mean 'n_layers'? allowed: n_layers, ")


OWN_TYPE = "; a type of your own is registered first (docs/components.md#adding-a-component)"


def test_names_from_other_tools_are_explained_where_they_apply():
    def hint(override):
        with pytest.raises(SpecError) as info:
            load_spec("gpt-nano", overrides=[override])
        (problem,) = info.value.problems
        return problem.hint

    assert hint("kind=gpt") == "a GPT-like model is `kind: decoder`. allowed: encoder, decoder, encoder-decoder"
    assert hint("kind=bert").startswith("a BERT-like model is `kind: encoder`.")
    assert hint("training.objective.type=mlm") == (
        "masked language modelling is `masked_lm`. allowed: causal_lm, masked_lm, seq2seq, sft, classification")
    # a hint whose name is not among this field's choices is not given: `bert` is no positional type
    assert hint("positional.type=bert") == "allowed: sinusoidal, learned, rope, alibi, t5, none" + OWN_TYPE
    assert hint("decoder.ffn.type=swiglu").startswith("SwiGLU is `type: glu` with `activation: silu`.")
    # where the second name it gives is this field's choice: a GLU written as an activation
    assert hint("decoder.ffn.activation=swiglu") == (
        "SwiGLU is `type: glu` with `activation: silu`. allowed: relu, gelu, gelu_tanh, silu")
    assert hint("decoder.ffn.activation=geglu").startswith("GeGLU is `type: glu` with `activation: gelu`.")
    # swish written as the FFN's type is its activation
    assert hint("decoder.ffn.type=swish").startswith("Swish (SiLU) is `activation: silu` of a `type: mlp`")
    assert hint("positional.type=swish") == "allowed: sinusoidal, learned, rope, alibi, t5, none" + OWN_TYPE
    # NoPE is no positions, not the rope its spelling is nearest to
    assert hint("positional.type=nope") == (
        "no positional information (NoPE) is `type: none`. allowed: sinusoidal, learned, rope, alibi, t5, none")
    # squared ReLU is not built in: not the relu its spelling is nearest to, but the plugin that adds it
    for name in ("relu2", "squared_relu", "ReLU_Squared"):
        assert hint(f"decoder.ffn.activation={name}") == (
            "squared ReLU (Primer, relu²) is not built in: register it as an FFN type, as docs/spec.md, *Plugins*, "
            "shows with `type: relu2`. allowed: relu, gelu, gelu_tanh, silu")


def test_an_odd_rotary_head_dim_names_the_widths_that_give_it():
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["positional={type: rope}", "d_model=60"])
    (problem,) = info.value.problems
    # the heads the user wrote are named, with those that give an even head_dim (it blamed the
    # fraction, which the spec never wrote)
    assert problem.path == "decoder.attention.n_heads"
    assert problem.message == ("rotary needs an even, non-zero rotated dimension; head_dim=15 (d_model=60 / "
                               "n_heads=4) × fraction=1.0 gives 15: choose n_heads from 1, 2, 3, 5, 6, 10, 15, 30, or "
                               "give head_dim (even) explicitly")
    with pytest.raises(SpecError) as info:  # a fraction written is the one to change
        load_spec("gpt-nano", overrides=["positional={type: rope, fraction: 0.1875}", "decoder.attention.n_heads=8"])
    (problem,) = info.value.problems
    assert problem.path == "positional.fraction"
    # a head_dim written out is named alone
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["positional={type: rope}", "decoder.attention.head_dim=15"])
    (problem,) = info.value.problems
    assert problem.message == "rotary needs an even, non-zero rotated dimension; head_dim=15 × fraction=1.0 gives 15"


def test_precision_names_from_other_tools_say_lightnings_name():
    def hint(value):
        with pytest.raises(SpecError) as info:
            load_spec("gpt-nano", overrides=[f"training.precision={value}"])
        (problem,) = info.value.problems
        assert problem.path == "training.precision"
        return problem.hint

    allowed = "allowed: 32, bf16-mixed, 16-mixed, bf16-true, 64"
    # Hugging Face's fp16=True is mixed precision, Lightning's 16-mixed
    for name in ("fp16", "float16", "half", "FP16"):
        assert hint(name).startswith("float16 mixed precision (float32 weights, float16 autocast"), name
        assert "is `16-mixed`, on a GPU." in hint(name) and hint(name).endswith(allowed)
    assert "is `bf16-mixed`; bfloat16 weights and optimizer state are `bf16-true`." in hint("bfloat16")
    assert hint("float32") == f"float32 training is `32`. {allowed}"
    assert hint("fp64") == f"float64 training is `64`. {allowed}"
    # the names a field takes stay plain "did you mean"s elsewhere: fp16 is no positional type
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["positional.type=fp16"])
    assert "16-mixed" not in str(info.value)


# nanoGPT's and other tools' names, or a field of another section, set on the command line
SET_ELSEWHERE = [
    ("batch_size=32", "write --set training.batch_size=32; in a file: `training: {batch_size: N}`"),
    ("n_layer=6", "write --set decoder.n_layers=6 (an encoder's: encoder.n_layers); in a file: "),
    ("n_head=8", "write --set decoder.attention.n_heads=8 (an encoder's: encoder.attention.n_heads)"),
    ("n_embd=384", "write --set d_model=384; in a file: the width is `d_model`"),
    ("block_size=512", "write --set max_seq_len=512 --set training.seq_len=512; in a file: nanoGPT's block_size is"),
    ("max_iters=5000", "write --set training.max_steps=5000; "),
    ("learning_rate=6e-4", "write --set training.optimizer.lr=6e-4; "),
    ("training.lr=3e-3", "write --set training.optimizer.lr=3e-3; "),
    ("eval_iters=200", "write --set training.val_batches=200; "),
    ("training.device=cpu", "write --set training.accelerator=cpu; "),
    # nanoGPT's dtype values are written as training.precision's
    ("dtype=bfloat16", "write --set training.precision=bf16-mixed; in a file: the training precision is"),
    ("training.dtype=float16", "write --set training.precision=16-mixed; "),
    ("training.betas=[0.9, 0.99]",
     "write --set 'training.optimizer.betas=[0.9, 0.99]'; 'betas' is a field of training.optimizer. allowed here:"),
    # a field of rope, on gpt-nano's learned table: the --set gives the type too
    ("positional.rotary_pct=0.25", "write --set 'positional={type: rope, fraction: 0.25}'; in a file: "),
    ("rope_theta=500000", "write --set 'positional={type: rope, base: 500000}'; in a file: "),
    ("training.data.paths=[input.txt]",
     "'paths' is a field of type files, pairs, labelled, conversations, not of type stdlib: give the type with it: "
     "--set 'training.data={type: files, paths: [input.txt]}'. allowed here: type,"),
]


def test_a_field_of_another_type_is_given_with_that_types_required_fields():
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["training.data.text_field=body"])
    (problem,) = info.value.problems
    assert "--set 'training.data={type: files, paths: [...], text_field: body}'" in problem.hint
    # the field itself, of another type, before a look-alike of this type's own (max_mb)
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["training.data.max_len=8"])
    (problem,) = info.value.problems
    assert problem.hint.startswith("'max_len' is a field of type synthetic, not of type stdlib: give the type with "
                                   "it: --set 'training.data={type: synthetic, max_len: 8}'"), problem.hint


@pytest.mark.parametrize(("override", "hint"), SET_ELSEWHERE, ids=[o for o, _ in SET_ELSEWHERE])
def test_a_field_set_in_the_wrong_place_gets_the_set_that_sets_it(override, hint):
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=[override])
    (problem,) = info.value.problems
    assert problem.message.startswith("unknown field") and problem.hint.startswith(hint), problem.hint
    # and the --set it gives is right
    written = shlex.split(re.search(r"--set ('[^']*'|[^\s;]+)", problem.hint)[1])[0]
    assert load_spec("gpt-nano", overrides=[written]).to_dict() != load_spec("gpt-nano").to_dict()


def test_nanogpts_bias_says_where_biases_are_set():
    # nanoGPT's bias=False (and Hugging Face's attention_bias) is no one field here
    for override in ("bias=false", "decoder.bias=false"):
        with pytest.raises(SpecError) as info:
            load_spec("gpt-nano", overrides=[override])
        (problem,) = info.value.problems
        assert problem.hint.startswith(
            "biases are set where they apply: in a stack's `attention: {bias: false}` and `ffn: {bias: false}`, a "
            "layernorm's `norm: {type: layernorm, bias: false}`, and `head: {bias: ...}` (nanoGPT's bias=False is "
            "the first three). allowed here: "), problem.hint
    # an rmsnorm's bias is still said to be a layernorm's, with the --set that gives both
    with pytest.raises(SpecError) as info:
        load_spec("llama2-7b", overrides=["decoder.norm.bias=false"])
    assert info.value.problems[0].hint.startswith(
        "'bias' is a field of type layernorm, not of type rmsnorm: give the type with it: "
        "--set 'decoder.norm={type: layernorm, bias: false}'")


def test_a_train_length_over_the_context_says_how_to_lower_it():
    # gpt-nano trains at seq_len 256: a shorter context (nanoGPT's block_size) needs both
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["max_seq_len=128"])
    (problem,) = info.value.problems
    assert problem.message == ("seq_len=256 is longer than the model's max_seq_len=128: lower it with the model's "
                               "(--set training.seq_len=128; nanoGPT's block_size is both) or raise max_seq_len")
    assert load_spec("gpt-nano", overrides=["max_seq_len=128", "training.seq_len=128"]).training.seq_len == 128


def test_a_field_of_another_type_in_a_file_names_the_type(tmp_path):
    problems = _problems(tmp_path, """
        extends: gpt-nano
        positional: {base: 500}
        embedding: {sliding_window: 8}
        training:
          betas: [0.9, 0.99]
        """)
    hints = {p.path: p.hint for p in problems}
    assert hints["embedding.sliding_window"].startswith(
        "'sliding_window' is a field of decoder.attention and of encoder.attention. allowed here:")
    assert hints["positional.base"].startswith(
        "'base' is a field of type sinusoidal, rope, not of type learned: give the type with it, "
        "positional={type: sinusoidal, base: ...}. allowed here: type, max_positions, offset")
    assert hints["training.betas"].startswith("'betas' is a field of training.optimizer. allowed here: objective,")


@pytest.mark.parametrize(("override", "hint"), [
    ("training.data=input.txt", "write {type: files, paths: [input.txt]}; allowed types: stdlib, files"),
    ("training.data=corpus/", "write {type: files, paths: [corpus/]}; "),
    ("training.tokenizer=tok.json", "write {type: file, path: tok.json}; allowed types: bpe, byte, file"),
    ("training.tokenizer=byte", "write {type: byte}; "),
    ("training.tokenizer.type=char", "a character-level tokenizer is `type: byte`"),
])
def test_a_file_or_a_name_where_a_typed_mapping_belongs_gets_the_mapping(override, hint):
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=[override])
    (problem,) = info.value.problems
    assert problem.hint.startswith(hint), problem.hint


@pytest.mark.parametrize("text", ["First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak.\n",
                                  "hello world\nthis is text\n", "- a list\n- of lines\n"])
def test_a_text_file_given_as_the_spec_says_how_to_train_on_it(tmp_path, monkeypatch, text):
    # nanoGPT reads its input.txt itself; here the text is training.data
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.txt").write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec("input.txt")
    (problem,) = info.value.problems
    assert (str(problem.position), problem.message) == ("input.txt", "a text file, not a YAML spec")
    assert problem.hint.endswith("specformer train gpt-nano --set 'training.data={type: files, paths: [input.txt]}'")
    # a YAML spec in a .txt is read as one, and a wrong one is told what is wrong with it
    (tmp_path / "spec.txt").write_text("extends: gpt-nano\nd_modle: 64\n")
    with pytest.raises(SpecError) as info:
        load_spec("spec.txt")
    assert info.value.problems[0].path == "d_modle"
    (tmp_path / "broken.yaml").write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec("broken.yaml")
    assert "text file" not in str(info.value)


@pytest.mark.parametrize(("override", "hint"), [
    # nanoGPT's min_lr is a rate, min_lr_ratio a ratio: "did you mean" would have 6e-5 read as a ratio
    ("training.schedule.min_lr=6e-5", "the schedule's floor is a ratio of the peak lr"),
    ("min_lr=6e-5", "(nanoGPT's min_lr / learning_rate: 0.1 for 6e-5 / 6e-4)"),
    ("training.schedule.lr_decay_iters=5000", "decay until the run's last step, `training: {max_steps: N}`"),
    ("training.optimizer.beta2=0.99", "Adam's betas are one pair, `training: {optimizer: {betas: [0.9, 0.99]}}`"),
])
def test_a_name_whose_value_means_another_thing_here_says_how_to_convert_it(override, hint):
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=[override])
    (problem,) = info.value.problems
    assert hint in problem.hint and "did you mean" not in problem.hint and "write --set" not in problem.hint


def test_a_type_that_cannot_be_registered_is_not_offered_as_ones_own(tmp_path):
    # rope scalings are not a registry family: no "a type of your own is registered first"
    problems = _problems(tmp_path, "extends: llama2-7b\npositional:\n  scaling: {type: ntk_by_parts, factor: 2}\n")
    assert "allowed: linear, llama3, yarn, dynamic, longrope" in str(problems[0])
    assert "registered" not in str(problems[0])
    # a registry family still says it
    problems = _problems(tmp_path, "extends: gpt-nano\ndecoder:\n  ffn: {type: moe}\n")
    assert "a type of your own is registered first" in str(problems[0])


def test_a_rule_broken_at_a_preset_field_names_the_field_the_user_set(tmp_path):
    # head_dim=7 by --set breaks the preset's rotary fraction: the error sits at the preset's
    # field, and its hint names the --set, the change to undo
    with pytest.raises(SpecError) as info:
        load_spec("llama-nano", overrides=["decoder.attention.head_dim=7"])
    (problem,) = info.value.problems
    assert problem.path == "positional.fraction" and problem.position.source.endswith("llama-nano.yaml")
    assert "decoder.attention.head_dim is set by --set decoder.attention.head_dim=7" in problem.hint
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["d_model=130"])
    assert info.value.problems[0].hint.startswith("d_model is set by --set d_model=130")
    # the same change written in the user's own file: its line
    (problem,) = _problems(tmp_path, "extends: llama-nano\ndecoder:\n  attention: {head_dim: 7}\n")
    assert f"decoder.attention.head_dim is set at {tmp_path / 'spec.yaml'}:3:15" in problem.hint, problem.hint
    assert "comes from the preset llama-nano" in problem.hint
    # a section set whole is named by its type: conversations clash with the preset's BPE tokenizer
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["training.data={type: conversations, paths: [chats.jsonl]}"])
    (problem,) = info.value.problems
    assert problem.path == "training.tokenizer" and problem.position.source.endswith("gpt-nano.yaml")
    assert problem.hint.startswith("training.data is set by --set training.data={type: conversations"), problem.hint
    # a problem at the user's own field needs no such hint
    (problem,) = _problems(tmp_path, "extends: gpt-nano\ndecoder:\n  attention: {n_heads: 3}\n")
    assert " is set " not in problem.hint
