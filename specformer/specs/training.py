"""The ``training:`` section of a spec: objective, data, tokenizer, optimizer, schedule
and the Lightning Trainer settings. Pydantic only; no torch import.

Like the model families, ``objective``, ``data``, ``tokenizer``, ``optimizer`` and
``schedule`` are discriminated unions built from :mod:`specformer.registry`, so a
plugin can register, say, a new schedule and name it in YAML. The built-in types are
registered when this module is imported, before any plugin loads; the unions (and
:class:`TrainingSpec`, whose fields they type) are built by :func:`build_unions` once the
plugins have loaded.

Defaults that depend on the model are filled by :func:`fill_training` while the
:class:`~specformer.specs.schema.ModelSpec` validates, so a resolved spec says
exactly what will run: the objective follows the model's kind (decoder → causal
LM, or supervised fine-tuning on the responses of ``type: pairs`` data; encoder → masked
LM; encoder-decoder → sequence-to-sequence), the data is the
Python standard library's source (or, for an encoder-decoder, the synthetic
reverse task; ``type: pairs`` trains one on the user's own (source, target) files), and a BPE tokenizer gets the model's vocabulary size.
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
import importlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import (
    BeforeValidator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from specformer.registry import PLUGIN_GROUP, REGISTRY, register_builtin
from specformer.specs.base import Spec, family_union, rebuild_models

__all__ = [
    "training_problems",
    "CausalLMSpec",
    "MaskedLMSpec",
    "Seq2SeqSpec",
    "SFTSpec",
    "StdlibDataSpec",
    "FilesDataSpec",
    "HFDataSpec",
    "SyntheticDataSpec",
    "PairsDataSpec",
    "ConversationsDataSpec",
    "ByteTokenizerSpec",
    "BPETokenizerSpec",
    "FileTokenizerSpec",
    "TaskTokenizerSpec",
    "Freeze",
    "LRScale",
    "LRScaleSpec",
    "AdamWSpec",
    "SGDSpec",
    "AdafactorSpec",
    "ConstantScheduleSpec",
    "LinearScheduleSpec",
    "CosineScheduleSpec",
    "InverseSqrtScheduleSpec",
    "TrainingSpec",
    "ObjectiveSpec",
    "DataSpec",
    "TokenizerSpec",
    "OptimizerSpec",
    "ScheduleSpec",
    "TASK_SPECIALS",
    "TASK_SYMBOLS",
    "BYTE_VOCAB_SIZE",
    "OBJECTIVE_FOR_KIND",
    "build_unions",
    "fill_training",
    "training_issues",
    "parameter_plan",
    "optimizer_groups",
    "reference_models",
]

Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]

# The synthetic tasks' vocabulary: five specials, then the symbols tasks use.
TASK_SPECIALS = ("<pad>", "<s>", "</s>", "<unk>", "<mask>")
TASK_SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyz+= "
# 256 bytes, then <|endoftext|>, <pad>, <mask>
BYTE_VOCAB_SIZE = 259

OBJECTIVE_FOR_KIND = {"decoder": "causal_lm", "encoder": "masked_lm", "encoder-decoder": "seq2seq"}


# --------------------------------------------------------------------------- objectives


class CausalLMSpec(Spec):
    """Next-token prediction with a causal mask (Radford et al. 2018, GPT)."""

    type: Literal["causal_lm"] = "causal_lm"
    label_smoothing: Fraction = Field(0.0, description="Label smoothing of the cross-entropy (Szegedy et al. 2016).")


class MaskedLMSpec(Spec):
    """Masked language modelling (Devlin et al. 2019, BERT): of the chosen tokens,
    80% become [MASK], 10% a random token and 10% stay; the loss is on the chosen ones."""

    type: Literal["masked_lm"] = "masked_lm"
    mask_prob: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.15, description="Fraction of tokens chosen for prediction."
    )
    mask_token: Probability = Field(0.8, description="Of the chosen tokens, the fraction replaced by [MASK].")
    random_token: Probability = Field(0.1, description="Of the chosen tokens, the fraction replaced by a random token.")
    label_smoothing: Fraction = Field(0.0, description="Label smoothing of the cross-entropy.")

    @field_validator("random_token")
    @classmethod
    def _sum(cls, value: float, info: Any) -> float:
        mask = info.data.get("mask_token", 0.8)
        if mask + value > 1.0 + 1e-9:
            raise ValueError(f"mask_token + random_token must be at most 1, got {mask} + {value}")
        return value


class Seq2SeqSpec(Spec):
    """Sequence-to-sequence with teacher forcing (Sutskever et al. 2014; Vaswani et al. 2017
    train with label smoothing 0.1). Reports exact-match accuracy of greedy decoding."""

    type: Literal["seq2seq"] = "seq2seq"
    label_smoothing: Fraction = Field(0.0, description="Label smoothing of the cross-entropy (the original paper: 0.1).")
    decoder_start: str | None = Field(
        None,
        min_length=1,
        description=(
            "The token the decoder reads first, as the tokenizer writes it (Hugging Face's "
            "decoder_start_token_id): T5 starts from <pad>, BART from </s>. Default: the tokenizer's "
            "start token (<s>, [CLS], <bos> or <|endoftext|>)."
        ),
    )
    forced_start: str | None = Field(
        None,
        min_length=1,
        description=(
            "A token generation puts first in the output, after decoder_start, whatever the model's "
            "scores (Hugging Face's forced_bos_token_id: BART's <s>). Default: none, the model chooses."
        ),
    )
    forced_end: str | None = Field(
        None,
        min_length=1,
        description=(
            "A token generation puts last when the output reaches its length limit without having ended "
            "(Hugging Face's forced_eos_token_id: BART's </s>). Default: none."
        ),
    )


class SFTSpec(Spec):
    """Supervised fine-tuning of a decoder on (prompt, response) pairs, as torchtune's and TRL's
    SFT: the decoder reads prompt + response + end token as one sequence, and the loss (and
    its token count) covers the response and its end token only. Trains on ``type: pairs``
    data, the prompt under ``source_field`` and the response under ``target_field``."""

    type: Literal["sft"] = "sft"
    label_smoothing: Fraction = Field(0.0, description="Label smoothing of the cross-entropy.")
    chat_template: bool = Field(
        False,
        description="Render each pair as a conversation through the tokenizer's chat template, as TRL and "
        "torchtune do for an instruct model: a user turn (the prompt) and an assistant turn (the response), "
        "the loss on the assistant part alone. The template is the one beside training.tokenizer's "
        "tokenizer.json (type: file: chat_template.jinja, or tokenizer_config.json's chat_template), which a "
        "checkpoint keeps with its tokenizer, rendered by transformers (the [hf] extra). false: prompt + response + end token, as plain text.",
    )
    system: str | None = Field(
        None,
        description="A system prompt, rendered as a {role: system} turn before each user turn (torchtune's "
        "new_system_prompt): the instructions the model is tuned to follow. It is kept in the checkpoint's spec, "
        "and generate --chat puts it first by default. Needs chat_template: true. Default: none (the template's "
        "own default system turn, if it has one).",
    )


class ClassificationSpec(Spec):
    """Sequence classification (BERT's fine-tuning, Devlin et al. 2019): the cross-entropy of
    a classification head's logits against each text's label. Trains an encoder with
    ``head: {type: classification}`` on ``type: labelled`` data; validation reports the loss
    and the accuracy."""

    type: Literal["classification"] = "classification"
    label_smoothing: Fraction = Field(0.0, description="Label smoothing of the cross-entropy.")


# --------------------------------------------------------------------------- data


class StdlibDataSpec(Spec):
    """The running Python's standard-library source files: real code and prose, tens of MB,
    on every machine with no download. Split into train/validation by file."""

    type: Literal["stdlib"] = "stdlib"
    val_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.05, description="Fraction of files held out for validation (chosen by a hash of the path)."
    )
    include_tests: bool = Field(True, description="Include the stdlib's own test suite (`test/`).")
    max_mb: PositiveFloat | None = Field(None, description="Use at most this many MB of files (a hash-chosen subset).")


class FilesDataSpec(Spec):
    """Local text files: paths or globs (``**`` recurses), one document per file; ``.gz``,
    ``.bz2`` and ``.xz`` files are read decompressed, a JSON-lines file (``.jsonl``,
    ``.ndjson``) gives one document per line, and a table (``.csv``, ``.tsv`` with a header
    row, ``.json``) one per row."""

    type: Literal["files"] = "files"
    paths: tuple[str, ...] = Field(
        strict=False, min_length=1,
        description="Files, directories or globs, e.g. ['data/**/*.txt'] (one may be given alone: data/); "
        "relative to the working directory.",
    )
    val_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.05,
        description="Fraction of files (of documents, in a .jsonl file) held out for validation, chosen by a hash "
        "of the path (and line); at least one of two or more, so a few files hold out a whole one (1 of 4 is a "
        "quarter of the text); a single file holds out its last lines. Not used with val_paths.",
    )
    val_paths: tuple[str, ...] | None = Field(
        None, strict=False,
        description="Files, directories or globs to validate on instead, e.g. [data/valid.txt] (one may be given "
        "alone); whatever they find is left out of paths, so paths: data/ with val_paths: data/valid.txt trains on "
        "the rest of data/. Unset: val_fraction holds out part of paths.",
    )
    max_mb: PositiveFloat | None = Field(
        None, description="Use at most this many MB of files: whole files, chosen by a hash of the path; one file "
        "larger than the cap is read whole, and the run's data line says so. Training files only: val_paths are "
        "read whole.",
    )
    text_field: str = Field(
        "text", min_length=1, description="The field of each .jsonl line, .json object or .csv/.tsv column that "
        "holds a document's text."
    )

    @field_validator("paths", "val_paths", mode="before")
    @classmethod
    def _one_path(cls, value: Any) -> Any:
        return None if value is None else _paths(value)


def _paths(value: Any) -> Any:
    # `paths: data/` means the one folder, as `paths: [data/]` does
    if isinstance(value, str):
        value = (value,)
    if isinstance(value, list | tuple) and not value:
        raise PydanticCustomError("paths", "give at least one file, directory or glob, e.g. [data/]")
    # an empty path (an unset shell variable in `paths: [$DATA]`) would read the whole working directory
    if isinstance(value, list | tuple) and any(isinstance(v, str) and not v.strip() for v in value):
        raise PydanticCustomError("paths", "an empty path, which would read every file of the working directory: "
                                           "give a file, directory or glob, e.g. [data/] (or [.] for this folder)")
    return value


class HFDataSpec(Spec):
    """A Hugging Face ``datasets`` text dataset (needs the ``datasets`` package and a network
    or a local cache)."""

    type: Literal["hf"] = "hf"
    name: str = Field(description="Dataset name, e.g. 'wikitext'.")
    config: str | None = Field(None, description="Dataset configuration, e.g. 'wikitext-2-raw-v1'.")
    text_field: str = Field("text", description="Column holding the text.")
    train_split: str = Field("train", description="Split to train on.")
    val_split: str = Field("validation", description="Split to validate on.")
    max_documents: PositiveInt | None = Field(None, description="Use at most this many documents per split.")


class SyntheticDataSpec(Spec):
    """Sequence-to-sequence tasks generated from a seed: copy, reverse, sort (over letters)
    and addition (of decimal numbers); validation examples never appear in training."""

    type: Literal["synthetic"] = "synthetic"
    task: Literal["copy", "reverse", "sort", "addition"] = Field("reverse", description="Which task.")
    min_len: PositiveInt = Field(4, description="Shortest input (symbols; digits per operand for addition).")
    max_len: PositiveInt = Field(12, description="Longest input (symbols; digits per operand for addition).")
    n_symbols: Annotated[int, Field(ge=2, le=26)] = Field(
        26, description="Letters a.. used by copy, reverse and sort."
    )
    n_train: PositiveInt = Field(100_000, description="Examples in one pass over the training set.")
    n_val: PositiveInt = Field(500, description="Held-out examples for validation and exact match.")
    seed: NonNegativeInt = Field(0, description="Seed of the generator (independent of training.seed).")

    @field_validator("max_len")
    @classmethod
    def _lengths(cls, value: int, info: Any) -> int:
        low = info.data.get("min_len", 1)
        if value < low:
            raise ValueError(f"max_len must be at least min_len={low}, got {value}")
        return value


class PairsDataSpec(Spec):
    """(source, target) text pairs: for an encoder-decoder, sequence-to-sequence training
    (translation, summarisation); for a decoder, (prompt, response) pairs of supervised
    fine-tuning (objective sft, the loss on the response alone). JSON-lines files
    (``.jsonl``, ``.ndjson``), one object per line with a source and a target field, or
    two-column tab-separated files (``.tsv``); ``.gz``, ``.bz2`` and ``.xz`` files are read
    decompressed. Pairs longer than ``seq_len`` tokens are cut (a decoder's pair whose
    prompt alone is longer than seq_len is left out), and the run's data line says how many."""

    type: Literal["pairs"] = "pairs"
    paths: tuple[str, ...] = Field(
        strict=False, min_length=1,
        description="Files, directories or globs of pairs, e.g. ['data/train.jsonl'] (one may be given alone); "
        "relative to the working directory.",
    )
    val_paths: tuple[str, ...] | None = Field(
        None, strict=False, min_length=1,
        description="Files of held-out pairs; default: val_fraction of the pairs in paths, chosen by a hash of "
        "the source text.",
    )
    val_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.05, description="Fraction of pairs held out for validation and exact match when val_paths is not given."
    )
    source_field: str = Field("source", min_length=1, description="The field of a JSON line that holds the input.")
    target_field: str = Field("target", min_length=1, description="The field of a JSON line that holds the output.")

    @field_validator("paths", "val_paths", mode="before")
    @classmethod
    def _one_path(cls, value: Any) -> Any:
        return value if value is None else _paths(value)

    @field_validator("target_field")
    @classmethod
    def _two_fields(cls, value: str, info: Any) -> str:
        if value == info.data.get("source_field"):
            raise ValueError(f"source_field and target_field are both {value!r}; they name two fields of a line")
        return value


class LabelledDataSpec(Spec):
    """Texts with a class label each, for sequence classification (objective classification):
    a table (``.csv`` or ``.tsv`` with a header row, ``.json``) or JSON lines (``.jsonl``,
    ``.ndjson``), one text and its label per row; ``.gz``, ``.bz2`` and ``.xz`` files are read
    decompressed. Labels are class ids 0..n-1 (integers, or digit strings as a CSV holds them),
    or names: names are the head's ``labels`` in their order when the head gives them, else
    sorted, and the run writes them into the saved spec's ``head.labels``, so ``eval`` maps a
    name to the same id. A text longer than ``seq_len`` tokens is cut."""

    type: Literal["labelled"] = "labelled"
    paths: tuple[str, ...] = Field(
        strict=False, min_length=1,
        description="Files, directories or globs of labelled texts, e.g. ['data/train.csv'] (one may be given "
        "alone); relative to the working directory.",
    )
    val_paths: tuple[str, ...] | None = Field(
        None, strict=False, min_length=1,
        description="Files of held-out texts; default: val_fraction of the rows in paths, chosen by a hash of "
        "the text.",
    )
    val_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.1, description="Fraction of rows held out for validation and accuracy when val_paths is not given."
    )
    text_field: str = Field("text", min_length=1, description="The column (or JSON field) that holds the text.")
    label_field: str = Field("label", min_length=1, description="The column (or JSON field) that holds the label.")

    @field_validator("paths", "val_paths", mode="before")
    @classmethod
    def _one_path(cls, value: Any) -> Any:
        return value if value is None else _paths(value)

    @field_validator("label_field")
    @classmethod
    def _two_fields(cls, value: str, info: Any) -> str:
        if value == info.data.get("text_field"):
            raise ValueError(f"text_field and label_field are both {value!r}; they name two columns of a row")
        return value


class ConversationsDataSpec(Spec):
    """Multi-turn conversations for supervised fine-tuning of a decoder (objective sft), in the
    conversational format of TRL's SFTTrainer and torchtune's chat datasets: JSON lines
    (``.jsonl``, ``.ndjson``, compressed or not), each an object whose ``messages_field`` is a
    list of ``{"role": ..., "content": ...}`` turns. Each conversation is rendered whole
    through the tokenizer's chat template (``training.objective.chat_template``, true by
    default with this data), and the loss is on every assistant turn: the tokens each assistant
    turn adds after the generation prompt. A conversation longer than ``seq_len + 1`` tokens is
    cut, and one with no assistant token left in it is left out; the run's data line says how
    many."""

    type: Literal["conversations"] = "conversations"
    paths: tuple[str, ...] = Field(
        strict=False, min_length=1,
        description="Files, directories or globs of conversations, e.g. ['data/chats.jsonl'] (one may be given "
        "alone); relative to the working directory.",
    )
    val_paths: tuple[str, ...] | None = Field(
        None, strict=False, min_length=1,
        description="Files of held-out conversations; default: val_fraction of those in paths, chosen by a hash "
        "of the conversation's first turn.",
    )
    val_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.05, description="Fraction of conversations held out for validation when val_paths is not given."
    )
    messages_field: str = Field(
        "messages", min_length=1,
        description="The field of a JSON line that holds the list of turns (TRL's and Hugging Face datasets' "
        "'messages'; 'conversations' in some).",
    )

    @field_validator("paths", "val_paths", mode="before")
    @classmethod
    def _one_path(cls, value: Any) -> Any:
        return value if value is None else _paths(value)


# --------------------------------------------------------------------------- tokenizers


class ByteTokenizerSpec(Spec):
    """UTF-8 bytes as tokens: 256 ids plus <|endoftext|>, <pad> and <mask>; nothing to train."""

    type: Literal["byte"] = "byte"


class BPETokenizerSpec(Spec):
    """Byte-level byte-pair encoding (Sennrich et al. 2016; GPT-2), trained with the
    ``tokenizers`` library on the training split and cached by a hash of its input."""

    type: Literal["bpe"] = "bpe"
    vocab_size: PositiveInt | None = Field(
        None, description="Vocabulary size including specials; default the model's vocab_size."
    )
    min_frequency: PositiveInt = Field(2, description="A pair must occur this often to be merged.")
    train_mb: PositiveFloat = Field(
        8.0,
        description="Train the merges on at most this many MB of text (millions of characters) of the train "
        "split: whole documents while they fit, then the one that crosses it cut at a line end.",
    )


class FileTokenizerSpec(Spec):
    """Any tokenizer saved as a Hugging Face ``tokenizer.json``."""

    type: Literal["file"] = "file"
    path: str = Field(description="Path to a tokenizer.json file (or its folder); relative to the working directory.")

    @field_validator("path")
    @classmethod
    def _a_path(cls, value: str) -> str:
        # an empty path (`path: $TOK` with TOK unset) would be the working directory's tokenizer.json, if any
        if not value.strip():
            raise PydanticCustomError("path", "an empty path: give a tokenizer.json file or its folder")
        return value


class TaskTokenizerSpec(Spec):
    """The fixed symbol vocabulary of the synthetic tasks (digits, letters, '+', '=', ' ')."""

    type: Literal["task"] = "task"


# --------------------------------------------------------------------------- optimizer + schedules

_NAMES = (
    "Patterns are shell-style globs (fnmatch: * matches any characters, dots included; [0-5] one "
    "character of a set) over the model's parameter names as `specformer show SPEC --tree` lists "
    "them, e.g. embed.tokens.weight, decoder.layers.0.self_attn.qkv_proj.weight; a tied output "
    "head's weight is the token table's, embed.tokens.weight. In YAML, quote a pattern that starts "
    "with * or holds [ ]: '*.bias'."
)


class LRScaleSpec(Spec):
    """One entry of ``lr_scale``: the parameters a pattern matches train at lr × factor."""

    pattern: str = Field(min_length=1, description="Which parameters, e.g. 'embed.*'. " + _NAMES)
    factor: PositiveFloat = Field(
        description="Multiplier of the optimizer's lr for these parameters (the schedule scales every group "
        "alike); to stop a parameter training, freeze it."
    )


def _patterns(value: Any) -> Any:
    # `freeze: embed.*` means the one pattern, as `freeze: [embed.*]` does
    return (value,) if isinstance(value, str) else value


Freeze = Annotated[
    tuple[Annotated[str, Field(min_length=1)], ...],
    BeforeValidator(_patterns),
    Field(
        (), strict=False,
        description="Parameters that do not train (requires_grad False, no gradient, no optimizer state), "
        "e.g. ['embed.*', 'decoder.layers.[0-5].*']. " + _NAMES + " A pattern that matches no parameter "
        "is an error; so is freezing every parameter.",
    ),
]
LRScale = Annotated[
    tuple[LRScaleSpec, ...],
    Field(
        (), strict=False,
        description="Per-parameter learning rates: a list of {pattern, factor}; the parameters a pattern "
        "matches train at lr × factor, the others at lr. Where several patterns match a parameter the "
        "last one applies. A pattern that matches no trained parameter is an error.",
    ),
]


class AdamWSpec(Spec):
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019); biases, norms and other
    1-D parameters are not decayed."""

    type: Literal["adamw"] = "adamw"
    lr: PositiveFloat = Field(3e-4, description="Peak learning rate (not used by the inverse_sqrt schedule, which sets its own: a run that gives another than this default warns).")
    betas: tuple[Fraction, Fraction] = Field((0.9, 0.95), strict=False, description="Adam's beta1, beta2, each in [0, 1).")
    eps: PositiveFloat = Field(1e-8, description="Adam's epsilon.")
    weight_decay: Annotated[float, Field(ge=0.0)] = Field(0.1, description="Decoupled weight decay of matrices.")
    freeze: Freeze
    lr_scale: LRScale


class SGDSpec(Spec):
    """Stochastic gradient descent with momentum (and Nesterov's variant); biases, norms and
    other 1-D parameters are not decayed."""

    type: Literal["sgd"] = "sgd"
    lr: PositiveFloat = Field(0.1, description="Peak learning rate.")
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(0.9, description="Momentum; 0 keeps no state.")
    nesterov: bool = Field(False, description="Nesterov momentum (needs momentum > 0).")
    weight_decay: Annotated[float, Field(ge=0.0)] = Field(0.0, description="L2 weight decay of matrices.")
    freeze: Freeze
    lr_scale: LRScale

    @model_validator(mode="after")
    def _nesterov(self) -> SGDSpec:
        if self.nesterov and self.momentum == 0.0:
            raise PydanticCustomError("nesterov", "nesterov: true needs a momentum above 0")
        return self


class AdafactorSpec(Spec):
    """Adafactor (Shazeer & Stern 2018, T5's optimizer), as ``torch.optim.Adafactor``: a
    second moment factored into row and column means for each matrix, no first moment,
    so its state is O(rows + columns) per matrix; biases, norms and other 1-D parameters
    are not decayed."""

    type: Literal["adafactor"] = "adafactor"
    lr: PositiveFloat = Field(1e-2, description="Peak learning rate (scaled by each matrix's RMS, as Adafactor does).")
    beta2_decay: Annotated[float, Field(lt=0.0)] = Field(
        -0.8, description="The second moment's decay, beta2 = 1 - step ** beta2_decay."
    )
    eps: PositiveFloat = Field(1e-3, description="Floor of the parameter scale the update is relative to.")
    d: PositiveFloat = Field(1.0, description="Update clipping threshold.")
    weight_decay: Annotated[float, Field(ge=0.0)] = Field(0.0, description="Decoupled weight decay of matrices.")
    freeze: Freeze
    lr_scale: LRScale


_WARMUP = "Linear warmup over this many steps: step k (from 0) runs at (k + 1) / warmup_steps of lr."


class ConstantScheduleSpec(Spec):
    """A constant learning rate after an optional linear warmup."""

    type: Literal["constant"] = "constant"
    warmup_steps: NonNegativeInt = Field(0, description=_WARMUP)


class LinearScheduleSpec(Spec):
    """Linear warmup, then linear decay to min_lr_ratio × lr at step max_steps, one past the last
    (transformers' get_linear_schedule_with_warmup): the last step runs above it."""

    type: Literal["linear"] = "linear"
    warmup_steps: NonNegativeInt = Field(0, description=_WARMUP)
    min_lr_ratio: Probability = Field(0.0, description="The lr the decay ends at (at step max_steps, one past the last), as a fraction of the peak.")


class CosineScheduleSpec(Spec):
    """Linear warmup, then cosine decay to min_lr_ratio × lr at step max_steps, one past the last
    (Loshchilov & Hutter 2017; transformers' get_cosine_with_min_lr_schedule_with_warmup)."""

    type: Literal["cosine"] = "cosine"
    warmup_steps: NonNegativeInt = Field(0, description=_WARMUP)
    min_lr_ratio: Probability = Field(0.1, description="The lr the decay ends at (at step max_steps, one past the last), as a fraction of the peak.")


class InverseSqrtScheduleSpec(Spec):
    """The original Transformer's schedule (Vaswani et al. 2017, eq. 3):
    lr = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)."""

    type: Literal["inverse_sqrt"] = "inverse_sqrt"
    warmup_steps: PositiveInt = Field(4000, description="Steps of linear increase (4000 in the paper).")
    scale: PositiveFloat = Field(1.0, description="Multiplier of the whole formula.")

    @field_validator("warmup_steps", mode="before")
    @classmethod
    def _some_warmup(cls, value: Any) -> Any:
        # the formula divides by the warmup, which sets the peak too: a bare "greater than 0"
        # says neither what to give nor where a run without warmup is written
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError(
                f"the inverse_sqrt schedule needs a warmup of at least 1 step, got {value}: it rises for "
                "warmup_steps steps to its peak, scale · (d_model · warmup_steps)^-0.5 (a shorter warmup peaks "
                "higher); give 4000, the paper's, or for a shorter run about a tenth of training.max_steps "
                "(40 of 400); a schedule without warmup is constant, linear or cosine with warmup_steps: 0"
            )
        return value


# --------------------------------------------------------------------------- registry + unions

_FAMILY_ENTRIES: dict[str, list[tuple[type, str]]] = {
    "objective": [
        (CausalLMSpec, "specformer.training.objectives:CausalLM"),
        (MaskedLMSpec, "specformer.training.objectives:MaskedLM"),
        (Seq2SeqSpec, "specformer.training.objectives:Seq2Seq"),
        (SFTSpec, "specformer.training.objectives:SFT"),
        (ClassificationSpec, "specformer.training.objectives:Classification"),
    ],
    "data": [
        (StdlibDataSpec, "specformer.data.corpus:stdlib_corpus"),
        (FilesDataSpec, "specformer.data.corpus:files_corpus"),
        (HFDataSpec, "specformer.data.corpus:hf_corpus"),
        (SyntheticDataSpec, "specformer.data.synthetic:SyntheticTask"),
        (PairsDataSpec, "specformer.data.pairs:pair_corpus"),
        (LabelledDataSpec, "specformer.data.labelled:labelled_corpus"),
        (ConversationsDataSpec, "specformer.data.conversations:conversation_corpus"),
    ],
    "tokenizer": [
        (BPETokenizerSpec, "specformer.data.tokenizers:bpe_tokenizer"),
        (ByteTokenizerSpec, "specformer.data.tokenizers:ByteTokenizer"),
        (FileTokenizerSpec, "specformer.data.tokenizers:file_tokenizer"),
        (TaskTokenizerSpec, "specformer.data.tokenizers:TaskTokenizer"),
    ],
    "optimizer": [
        (AdamWSpec, "specformer.training.optim:adamw"),
        (SGDSpec, "specformer.training.optim:sgd"),
        (AdafactorSpec, "specformer.training.optim:adafactor"),
    ],
    "schedule": [
        (CosineScheduleSpec, "specformer.training.schedules:cosine"),
        (ConstantScheduleSpec, "specformer.training.schedules:constant"),
        (LinearScheduleSpec, "specformer.training.schedules:linear"),
        (InverseSqrtScheduleSpec, "specformer.training.schedules:inverse_sqrt"),
    ],
}

for _family, _entries in _FAMILY_ENTRIES.items():
    for _spec, _target in _entries:
        register_builtin(_family, _spec, _target)


# The unions of these families, and TrainingSpec whose fields they type, are made by
# build_unions once every plugin has loaded (specformer.specs.schema calls it after
# load_plugins): a plugin may import this module and look up a built-in type at import,
# and one loaded after it may still add a type to these families.
_UNIONS = {
    "ObjectiveSpec": "objective",
    "DataSpec": "data",
    "TokenizerSpec": "tokenizer",
    "OptimizerSpec": "optimizer",
    "ScheduleSpec": "schedule",
}
if TYPE_CHECKING:
    ObjectiveSpec: TypeAlias = Any
    DataSpec: TypeAlias = Any
    TokenizerSpec: TypeAlias = Any
    OptimizerSpec: TypeAlias = Any
    ScheduleSpec: TypeAlias = Any


def build_unions() -> None:
    """Make the training families' unions from the registry and complete
    :class:`TrainingSpec` with them; once (the schema calls it after loading the plugins)."""
    if _unions_built():
        return
    for name, family in _UNIONS.items():
        globals()[name] = family_union(family)
    TrainingSpec.model_rebuild()


def rebuild_union(family: str) -> None:
    """Make ``family``'s union again, with a type registered after it was built, and complete
    :class:`TrainingSpec` with it (the schema then completes the models that hold it)."""
    for name, union_family in _UNIONS.items():
        if union_family == family:
            globals()[name] = family_union(family)
    rebuild_models((TrainingSpec,), tuple(_UNIONS))


def _unions_built() -> bool:
    return all(name in globals() for name in _UNIONS)


def _need_unions(what: str) -> None:
    """Build the schema (which loads the plugins, then calls build_unions) for ``what``,
    used before it; refused while the plugins load."""
    if not _unions_built():
        importlib.import_module("specformer.specs.schema")
    if not _unions_built():
        raise ImportError(
            f"{what} is built once every '{PLUGIN_GROUP}' entry point has loaded, so that it holds the "
            "types plugins register: a plugin may use the training types' spec classes at import "
            "(REGISTRY.get('optimizer', 'adamw').spec, or AdamWSpec from specformer.specs.training), "
            f"not {what}"
        )


def __getattr__(name: str) -> Any:
    if name in _UNIONS:
        _need_unions(name)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


Precision = Literal["32", "bf16-mixed", "16-mixed", "bf16-true", "64"]


# --------------------------------------------------------------------------- the section


class TrainingSpec(Spec):
    """How to train the model: what ``specformer train`` runs. Every field is also a
    ``--set training.<field>=...`` override."""

    objective: ObjectiveSpec | None = Field(
        None, description="Default follows the kind: causal_lm (decoder; sft for a decoder given pairs data), "
        "masked_lm (encoder; classification for one with a classification head or given labelled data), "
        "seq2seq (encoder-decoder)."
    )
    data: DataSpec | None = Field(
        None, description="Default stdlib (the Python standard library's source); synthetic reverse for encoder-decoders; "
        "none for an encoder with a classification head (it trains on labelled data, which must be given)."
    )
    tokenizer: TokenizerSpec | None = Field(
        None, description="Default bpe with the model's vocab_size; task for synthetic data."
    )
    optimizer: OptimizerSpec = Field(default_factory=AdamWSpec)
    schedule: ScheduleSpec = Field(default_factory=CosineScheduleSpec)
    batch_size: PositiveInt = Field(16, description="Sequences per device per micro-batch.")
    seq_len: PositiveInt | None = Field(None, description="Tokens per sequence; default the model's max_seq_len.")
    accumulate: PositiveInt = Field(1, description="Micro-batches accumulated per optimizer step; the step's gradient is that of the mean over every token they predict, as one batch of them all.")
    grad_clip: Annotated[float, Field(ge=0.0)] = Field(1.0, description="Clip the gradient norm to this; 0 disables.")
    max_steps: PositiveInt | None = Field(1000, description="Optimizer steps to train for.")
    max_epochs: PositiveFloat | None = Field(
        None, description="Passes over the training data, instead of max_steps (a section that gives "
        "max_epochs and no max_steps trains by epochs; the two together are an error)."
    )
    val_interval: PositiveInt = Field(100, description="Validate every this many optimizer steps (and at the end).")
    val_batches: PositiveInt | None = Field(20, description="Batches per validation; null for the whole split. A synthetic task always scores its whole held-out set, in batches made large enough to hold it in this many.")
    checkpoint_interval: PositiveInt | None = Field(
        None, description="Write a checkpoint every this many steps; default val_interval."
    )
    log_interval: PositiveInt = Field(10, description="Log training metrics every this many steps.")
    seed: NonNegativeInt = Field(0, description="Seed of weights, data order, masking and dropout.")
    precision: Precision = Field(
        "32", description="32 (or fp32), bf16-mixed (or bf16), 16-mixed (or 16; GPU), bf16-true or 64."
    )
    compile: bool = Field(
        False, description="Compile the model with torch.compile (tens of seconds before the first step; "
        "specformer's CPU kernels stay in the compiled step, and the elementwise work around them is fused). "
        "Needs a C++ compiler on the CPU, Triton on a GPU: train checks before the data."
    )
    activation_checkpointing: bool = Field(
        False, description="Keep each layer's input only and run its forward again in the backward pass "
        "(Hugging Face's gradient checkpointing): the layers' activations for about a third more compute."
    )
    strategy: str = Field("auto", description="Lightning strategy: auto, ddp (one process a device), fsdp and deepspeed (GPUs), ...; spawning ones (ddp_spawn) are refused")
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu"] = Field(
        "auto", description="Lightning accelerator: auto, cpu, gpu, cuda, mps, tpu."
    )
    devices: PositiveInt | Annotated[tuple[NonNegativeInt, ...], Field(strict=False, min_length=1)] | Literal["auto"] = Field(
        "auto", description="Devices per node: a count, a list of indices or auto."
    )

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, value: Any) -> Any:
        # one clear message instead of one per member of the union
        def index(x: Any) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and x >= 0

        if value == "auto" or (index(value) and value > 0) or (
            isinstance(value, list | tuple) and value and all(map(index, value))
        ):
            return value
        raise PydanticCustomError(
            "devices", "expected a device count (1, 2, ...), a non-empty list of device indices ([0, 1]) or 'auto'"
        )
    num_nodes: PositiveInt = Field(1, description="Machines taking part.")
    num_workers: NonNegativeInt | None = Field(
        None, description="DataLoader worker processes; default a small number that fits the machine."
    )
    out_dir: str = Field("runs", description="Runs are written to <out_dir>/<spec name>/<timestamp>/.")
    cache_dir: str | None = Field(
        None,
        description="Tokenizers and token arrays; default $SPECFORMER_CACHE, else $XDG_CACHE_HOME/specformer, "
        "else ~/.cache/specformer.",
    )

    @field_validator("out_dir", "cache_dir")
    @classmethod
    def _a_folder(cls, value: str | None, info: Any) -> str | None:
        # an empty one (an unset shell variable in `out_dir: $OUT`) would write into the working directory
        if value is not None and not value.strip():
            raise PydanticCustomError(
                "folder", f"an empty folder name, which would write into the working directory: give a folder, "
                f"e.g. {'runs' if info.field_name == 'out_dir' else '~/.cache/specformer'} (or . for this folder)")
        return value

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return {32: "32", 16: "16-mixed", 64: "64"}.get(value, str(value))
        if value in ("32-true", "fp32"):
            return "32"
        if value == "bf16":
            return "bf16-mixed"
        if value == "16":
            return "16-mixed"
        return value

    @property
    def checkpoint_every(self) -> int:
        return self.checkpoint_interval or self.val_interval

    @classmethod
    def model_rebuild(cls, *, force: bool = False, raise_errors: bool = True, **_: Any) -> bool | None:
        """Complete the class with the training families' unions (the first use before the
        schema builds it, loading the plugins). Its fields' types are this module's names."""
        _need_unions("TrainingSpec")
        return super().model_rebuild(force=force, raise_errors=raise_errors, _parent_namespace_depth=0)


# --------------------------------------------------------------------------- derivation + rules


def fill_training(data: dict[str, Any]) -> None:
    """Fill the model-dependent defaults of ``data["training"]`` in a raw spec dict, in place."""
    kind = data.get("kind")
    if kind not in OBJECTIVE_FOR_KIND:
        return
    training = data.get("training")
    if training is None:
        training = {}
    if not isinstance(training, dict):
        return
    training = copy.deepcopy(training)
    # a section given without `type:` (e.g. `--set training.data.n_val=100`) gets the
    # type this kind of model defaults to, not the family's first entry
    head = data.get("head")
    classify = isinstance(head, dict) and head.get("type") == "classification"
    objective_type = training["objective"].get("type") if isinstance(training.get("objective"), dict) else None
    if classify and kind == "encoder" and training.get("data") is None and objective_type in (None, "classification"):
        pass  # a classifier's labelled texts have no default: `train` asks for them
    else:
        _default_type(training, "data", "synthetic" if kind == "encoder-decoder" else "stdlib")
    data_type = training["data"].get("type") if isinstance(training.get("data"), dict) else None
    # a decoder given (prompt, response) pairs fine-tunes on the responses
    # ... and an encoder with a classification head (or given labelled texts) learns to classify
    objective = ("sft" if kind == "decoder" and data_type in ("pairs", "conversations")
                 else "classification" if kind == "encoder" and (classify or data_type == "labelled")
                 else OBJECTIVE_FOR_KIND[kind])
    _default_type(training, "objective", objective)
    sft = training["objective"] if isinstance(training.get("objective"), dict) else None
    if data_type == "conversations" and sft is not None and sft.get("type") == "sft" and "chat_template" not in sft:
        sft["chat_template"] = True  # a conversation is rendered through the template: it has no other form
    vocab = data.get("vocab_size")
    if data_type == "synthetic":
        _default_type(training, "tokenizer", "task")
    elif not isinstance(vocab, int) or vocab >= BYTE_VOCAB_SIZE:
        # a smaller vocabulary fits no text tokenizer: left unset, `train` says so
        _default_type(training, "tokenizer", "bpe")
    tok = training.get("tokenizer")
    if isinstance(tok, dict) and tok.get("type", "bpe") == "bpe" and tok.get("vocab_size") is None:
        if isinstance(data.get("vocab_size"), int) and data["vocab_size"] > 0:
            tok["vocab_size"] = data["vocab_size"]
    if training.get("max_epochs") is not None and "max_steps" not in training:
        # a section that says how many epochs, and not how many steps, trains by epochs
        training["max_steps"] = None
    if training.get("seq_len") is None and isinstance(data.get("max_seq_len"), int) and data["max_seq_len"] > 0:
        training["seq_len"] = data["max_seq_len"]
    if training.get("seq_len") is None and data.get("max_seq_len") is None:
        training["seq_len"] = 1024
    data["training"] = training


def _default_type(training: dict[str, Any], key: str, type_: str) -> None:
    value = training.get(key)
    if value is None:
        training[key] = {"type": type_}
    elif isinstance(value, dict) and "type" not in value:
        training[key] = {"type": type_, **value}


def training_issues(
    training: TrainingSpec, *, kind: str, vocab_size: int, max_seq_len: int, head: str | None = None
) -> Iterator[tuple[str, str]]:
    """Cross-field problems between the training section and the model (``head``: its head's
    type), as (field, message)."""
    objective, data, tok = training.objective, training.data, training.tokenizer
    yield from _classification_issues(objective, data, kind, head)
    allowed = {
        "decoder": ("causal_lm", "sft"),
        "encoder": ("masked_lm", "classification"),
        "encoder-decoder": ("seq2seq",),
    }[kind]
    if objective is not None and objective.type not in allowed:
        sft = (" (sft fine-tunes a decoder on (prompt, response) pairs; an encoder-decoder trains on pairs "
               "with seq2seq)") if objective.type == "sft" else ""
        yield (
            "training.objective.type",
            f"objective {objective.type!r} does not train {'an' if kind.startswith('encoder') else 'a'} {kind} model "
            f"(allowed: {', '.join(allowed)}){sft}",
        )
    synthetic = data is not None and data.type == "synthetic"
    paired = data is not None and data.type in ("synthetic", "pairs")
    if objective is not None and objective.type == "seq2seq" and data is not None and not paired:
        yield (
            "training.data.type",
            f"the seq2seq objective needs paired data, not {data.type!r}: use type: pairs (your own "
            "(source, target) files) or type: synthetic",
        )
    if (objective is not None and objective.type == "sft" and objective.chat_template
            and (tok is None or tok.type != "file")):
        chats = data is not None and data.type == "conversations"
        what = ("conversations are rendered through the chat template beside a tokenizer.json" if chats
                else "a chat template is read from a tokenizer.json's folder")
        kind_of = "unset" if tok is None else f"type {tok.type}"
        yield (
            "training.tokenizer" if chats else "training.objective.chat_template",
            f"{what}, and training.tokenizer is {kind_of}: set training.tokenizer: {{type: file, path: "
            f"folder/tokenizer.json}} (an instruct model's, as import-hf writes it){'' if chats else ', or chat_template: false'}",
        )
    if objective is not None and objective.type == "sft" and objective.system is not None and not objective.chat_template:
        yield (
            "training.objective.system",
            "a system prompt is a turn of the tokenizer's chat template, and chat_template is false: set "
            "training.objective.chat_template: true, or leave out system",
        )
    conversations = data is not None and data.type == "conversations"
    if conversations and kind != "decoder":
        yield (
            "training.data.type",
            f"conversations fine-tune a decoder (objective sft), not {'an' if kind.startswith('encoder') else 'a'} "
            f"{kind} model",
        )
    elif conversations and objective is not None and objective.type != "sft":
        yield (
            "training.objective.type",
            f"conversations train a decoder with objective sft (the loss on the assistant turns), not "
            f"{objective.type}: set training.objective.type: sft (a spec import-hf wrote names causal_lm)",
        )
    elif conversations and objective is not None and not objective.chat_template:
        yield (
            "training.objective.chat_template",
            "conversations are rendered through the tokenizer's chat template, and chat_template is false: leave it "
            "out (it is true by default with conversations), or give (prompt, response) pairs as type: pairs",
        )
    if (objective is not None and objective.type == "sft" and kind == "decoder" and data is not None
            and data.type not in ("pairs", "conversations")):
        yield (
            "training.data.type",
            f"the sft objective trains on (prompt, response) pairs or conversations, not {data.type!r}: use type: "
            "pairs (.jsonl or .tsv files, the prompt under source_field, the response under target_field) or "
            "type: conversations (.jsonl files of messages); text trains with objective causal_lm",
        )
    elif paired and objective is not None and objective.type not in ("seq2seq", "sft"):
        what = "synthetic tasks are" if synthetic else "(source, target) pairs are"
        files = "type: files, whose .jsonl lines give it as text_field"
        if kind == "decoder" and not synthetic:
            yield (
                "training.objective.type",
                f"(source, target) pairs train a decoder with objective sft (prompt + response, the loss on the "
                f"response alone): set training.objective.type: sft (a spec import-hf wrote names causal_lm); "
                f"{objective.type} trains on text, with a loss on every token ({files})",
            )
        elif kind != "encoder-decoder":  # an encoder-decoder's data is right: the objective's problem says what is not
            text = "" if synthetic else f"; an encoder trains on text, masked LM ({files})"
            yield ("training.data.type", f"{what} sequence-to-sequence: they train encoder-decoder models{text}")
    if tok is not None:
        if tok.type == "task" and not synthetic:
            yield ("training.tokenizer.type", "the task vocabulary only covers the synthetic tasks; use bpe or byte")
        if tok.type == "task" and vocab_size < len(TASK_SPECIALS) + len(TASK_SYMBOLS):
            yield (
                "vocab_size",
                f"the synthetic tasks use {len(TASK_SPECIALS) + len(TASK_SYMBOLS)} tokens but vocab_size is {vocab_size}",
            )
        if tok.type == "byte" and vocab_size < BYTE_VOCAB_SIZE:
            yield (
                "vocab_size",
                f"the byte tokenizer has {BYTE_VOCAB_SIZE} tokens but vocab_size is {vocab_size}; use at least {BYTE_VOCAB_SIZE}",
            )
        if tok.type == "bpe" and tok.vocab_size is not None and tok.vocab_size > vocab_size:
            yield (
                "training.tokenizer.vocab_size",
                f"the tokenizer would have {tok.vocab_size} tokens but the model's vocab_size is {vocab_size}",
            )
        if tok.type == "bpe" and tok.vocab_size == vocab_size < BYTE_VOCAB_SIZE:
            # the tokenizer's size is the model's (its default): the model's is the one to raise
            yield (
                "vocab_size",
                f"byte-level BPE (training.tokenizer) needs at least {BYTE_VOCAB_SIZE} tokens (256 bytes + 3 "
                f"specials) and has the model's vocab_size, {vocab_size}; use at least {BYTE_VOCAB_SIZE}",
            )
        elif tok.type == "bpe" and tok.vocab_size is not None and tok.vocab_size < BYTE_VOCAB_SIZE:
            yield (
                "training.tokenizer.vocab_size",
                f"byte-level BPE needs at least {BYTE_VOCAB_SIZE} tokens (256 bytes + 3 specials), "
                f"got {tok.vocab_size}",
            )
    if training.seq_len is not None and training.seq_len > max_seq_len:
        yield (
            "training.seq_len",
            f"seq_len={training.seq_len} is longer than the model's max_seq_len={max_seq_len}: lower it with "
            f"the model's (--set training.seq_len={max_seq_len}; nanoGPT's block_size is both) or raise max_seq_len",
        )
    if training.max_steps is None and training.max_epochs is None:
        yield ("training.max_steps", "give max_steps or max_epochs")
    if training.max_steps is not None and training.max_epochs is not None:
        yield (
            "training.max_epochs",
            f"max_epochs={training.max_epochs:g} and max_steps={training.max_steps} are both set (max_steps "
            "perhaps by the spec this one extends); a run has one length: to train by epochs also set "
            "max_steps to null (--set training.max_steps=null), or remove max_epochs",
        )


def _classification_issues(objective: Any, data: Any, kind: str, head: str | None) -> Iterator[tuple[str, str]]:
    """A classification objective, a classification head and labelled data go together."""
    classify = objective is not None and objective.type == "classification"
    labelled = data is not None and data.type == "labelled"
    # (a classification head with another objective is refused by `train`: such a spec still
    # builds, exports and analyses)
    if classify and kind == "encoder" and head != "classification":
        yield (
            "head.type",
            f"objective classification trains a classification head, and this model's head is {head or 'none'}: "
            "set head: {type: classification, n_classes: N}",
        )
    if classify and data is not None and not labelled:
        yield (
            "training.data.type",
            f"objective classification trains on labelled texts, not {data.type!r}: use type: labelled "
            "(a .csv, .tsv, .json or .jsonl table with text_field and label_field columns)",
        )
    elif labelled and kind != "encoder":
        yield (
            "training.data.type",
            f"labelled texts train an encoder's classification head (objective classification), and this is "
            f"{'an' if kind.startswith('encoder') else 'a'} {kind} model: start from an encoder (extends: "
            "bert-nano, head: {type: classification, n_classes: N}), or train this model on text (type: files), "
            "pairs or conversations",
        )
    elif labelled and objective is not None and not classify:
        yield (
            "training.data.type",
            f"labelled texts train objective classification, not {objective.type!r}: set "
            "training.objective.type: classification (and head: {type: classification})",
        )


def parameter_plan(
    optimizer: Any, names: Sequence[str], *, tied: dict[str, str] | None = None
) -> dict[str, float | None]:
    """Each parameter name's learning-rate factor under ``optimizer``'s ``freeze`` and
    ``lr_scale``, in the order of ``names``: 1.0 by default, an lr_scale entry's factor
    (the last that matches), None for a frozen parameter.

    ``names`` are the model's parameter names (``named_parameters()``, each tensor once);
    ``tied`` maps the other names of a shared tensor to its name (``head.weight`` ->
    ``embed.tokens.weight``), for the message of a pattern that names only those.
    A pattern that matches no parameter, an lr_scale pattern that matches only frozen
    ones and a freeze that leaves nothing to train are a
    :class:`~specformer.specs.errors.SpecError` naming the field, the pattern and the
    nearest real names."""
    from specformer.specs.errors import SpecError, SpecProblem

    names = list(names)
    plan: dict[str, float | None] = dict.fromkeys(names, 1.0)
    problems: list[SpecProblem] = []
    for i, pattern in enumerate(getattr(optimizer, "freeze", ())):
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            problems.append(_unmatched(f"training.optimizer.freeze.{i}", pattern, names, tied))
        plan.update(dict.fromkeys(hits))
    for i, entry in enumerate(getattr(optimizer, "lr_scale", ())):
        hits = [n for n in names if fnmatch.fnmatchcase(n, entry.pattern)]
        trained = [n for n in hits if plan[n] is not None]
        if not hits:
            problems.append(_unmatched(f"training.optimizer.lr_scale.{i}.pattern", entry.pattern, names, tied))
        elif not trained:
            problems.append(SpecProblem(
                f"{entry.pattern!r} matches only frozen parameters ({_some(hits)}), which train at no lr",
                path=f"training.optimizer.lr_scale.{i}.pattern",
                hint="remove the entry, or the freeze pattern that matches them",
            ))
        plan.update(dict.fromkeys(trained, entry.factor))
    if names and not problems and all(factor is None for factor in plan.values()):
        problems.append(SpecProblem(
            f"the patterns freeze all {len(names)} parameters of the model: nothing would train",
            path="training.optimizer.freeze",
            hint="freeze fewer (`specformer show SPEC --tree` lists the parameter names)",
        ))
    if problems:
        raise SpecError(problems)
    return plan


def optimizer_groups(
    optimizer: Any, shapes: dict[str, tuple[int, ...]], *, tied: dict[str, str] | None = None
) -> list[tuple[float, bool, list[str]]]:
    """The optimizer's parameter groups as (lr factor, decayed, parameter names): for each lr
    factor (1 first, then in the order of ``lr_scale``) the matrices, decayed, then the 1-D
    parameters (biases, norm gains), not decayed; frozen parameters in none, empty groups
    left out. ``shapes`` maps the model's parameter names (each tensor once) to their shapes."""
    plan = parameter_plan(optimizer, list(shapes), tied=tied)
    factors = dict.fromkeys([1.0, *(e.factor for e in getattr(optimizer, "lr_scale", ()))])
    groups = {(f, decayed): [] for f in factors for decayed in (True, False)}
    for name, shape in shapes.items():
        factor = plan[name]
        if factor is not None:
            groups[(factor, len(shape) >= 2)].append(name)
    return [(f, decayed, names) for (f, decayed), names in groups.items() if names]


def _some(names: Sequence[str], n: int = 3) -> str:
    more = len(names) - n
    return ", ".join(names[:n]) + (f" and {more} more" if more > 0 else "")


def _unmatched(path: str, pattern: str, names: Sequence[str], tied: dict[str, str] | None) -> Any:
    """The problem of a pattern that matches no parameter, with the real names nearest to it."""
    from specformer.specs.errors import SpecProblem

    aliases = {a: n for a, n in (tied or {}).items() if fnmatch.fnmatchcase(a, pattern)}
    if aliases:
        a, n = next(iter(aliases.items()))
        return SpecProblem(
            f"pattern {pattern!r} matches only {a}, which is tied to {n}: the one tensor goes by {n}",
            path=path,
            hint=f"name it as {n}; freezing or scaling it acts on both uses",
        )
    inside = [n for n in names if n.startswith(pattern.rstrip(".") + ".")]
    if inside:  # a module's name: its parameters' names go on (`decoder.layers.0` -> `.weight`)
        hint = f"a pattern matches whole names: {pattern.rstrip('.')}.* matches {_some(inside)}"
    else:
        # the names that share the longest start with the pattern's literal part, nearest first
        literal = pattern
        for i, ch in enumerate(pattern):
            if ch in "*?[":
                literal = pattern[:i]
                break
        pool: list[str] = []
        while literal and not pool:
            pool = [n for n in names if n.startswith(literal)]
            literal = literal[:-1]
        pool = pool or list(names)
        near = sorted(pool, key=lambda n: -difflib.SequenceMatcher(None, pattern, n).ratio())
        hint = f"nearest names: {', '.join(near[:3])}"
    return SpecProblem(
        f"pattern {pattern!r} matches no parameter of the model",
        path=path,
        hint=f"{hint}; `specformer show SPEC --tree` lists every parameter name",
    )


def reference_models() -> list[tuple[str, type[Spec]]]:
    """(title, model) of every training spec model, for the field reference in docs/spec.md."""
    out: list[tuple[str, type[Spec]]] = [("`training:`", TrainingSpec)]
    for family in _FAMILY_ENTRIES:
        for name, entry in REGISTRY.entries(family).items():
            out.append((f"`training.{family}:` `type: {name}`", entry.spec))
        if family == "optimizer":
            out.append(("`training.optimizer.lr_scale:` entries", LRScaleSpec))
    return out


def training_problems(spec: Any) -> list[Any]:
    """What ``specformer train`` refuses in a spec that validates (it builds and analyses):
    a classification head under an objective that trains a vocabulary head, a classifier
    with no labelled data, a synthetic task whose examples are longer than the run's
    sequences, and text data with no tokenizer (a ``vocab_size`` below the byte tokenizer's,
    which leaves ``training.tokenizer`` unset). ``validate`` says them as a note; ``train``
    refuses them before any data is prepared."""
    from specformer.specs.errors import SpecProblem

    t = spec.training
    if t is None:
        return []
    if spec.head is not None and spec.head.type == "classification" and t.objective is not None \
            and t.objective.type != "classification":
        if spec.kind != "encoder":  # objective classification trains an encoder only
            article = "an" if spec.kind.startswith("e") else "a"
            return [SpecProblem(
                f"objective {t.objective.type!r} trains a vocabulary head, and this model's head is type: "
                f"classification, which trains on an encoder only (objective classification); {article} "
                f"{spec.kind}'s classification head builds and analyses, but does not train: give it "
                "--set head.type=lm to train it as a language model, or classify with an encoder (kind: encoder)",
                path="head.type",
            )]
        return [SpecProblem(
            f"objective {t.objective.type!r} trains a vocabulary head, and this model's head is type: "
            "classification: train it with objective classification on type: labelled data "
            "(--set training.objective.type=classification --set 'training.data={type: labelled, paths: [train.csv]}')",
            path="head.type",
        )]
    if t.objective is not None and t.objective.type == "classification" and t.data is None:
        return [SpecProblem(
            "a classifier trains on labelled texts, which have no default: set training.data: {type: labelled, "
            "paths: [train.csv]} (a .csv, .tsv, .json or .jsonl table with a text and a label column)",
            path="training.data",
        )]
    if t.data is not None and t.data.type == "synthetic":
        from specformer.data.synthetic import length_problem

        if (problem := length_problem(spec)) is not None:
            return [SpecProblem(problem, path="training.data.max_len")]
    if t.data is not None and t.tokenizer is None:  # left unset by the defaults: no text tokenizer fits
        return [SpecProblem(
            f"vocab_size={spec.vocab_size} fits no built-in text tokenizer (byte-level needs {BYTE_VOCAB_SIZE}); "
            "raise vocab_size or set training.tokenizer (type: file, a tokenizer.json of at most vocab_size tokens)",
            path="vocab_size",
        )]
    return []


def warmup_peak(schedule: Any, d_model: int) -> str:
    """What a schedule's warmup rises to, in words: ``training.optimizer.lr``, or for
    ``inverse_sqrt``, which sets the rate itself and ignores that lr, its own peak."""
    if getattr(schedule, "type", None) == "inverse_sqrt":
        peak = schedule.scale * (d_model * schedule.warmup_steps) ** -0.5
        return f"the inverse_sqrt schedule's peak, scale · (d_model · warmup_steps)^-0.5 = {peak:.3g}"
    return "training.optimizer.lr"
