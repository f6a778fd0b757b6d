"""Hugging Face interop: bring a ``transformers`` model in, take a specformer model out.

* :func:`spec_from_hf_config` — a ``config.json`` (or ``PretrainedConfig``) -> ModelSpec;
* :func:`load_hf_weights` — load a Hugging Face state dict into a built specformer model;
* :func:`import_hf` — a model directory -> (spec, specformer state dict), untying the
  output layer when the checkpoint's is not tied;
* :func:`hf_config_from_spec` / :func:`hf_state_dict` — the other direction, as plain
  data; :func:`save_hf` writes ``config.json`` + ``model.safetensors`` that
  ``transformers.AutoModel*.from_pretrained`` loads (with the tokenizer, when given, as
  ``tokenizer.json``); :func:`to_hf` returns the live ``transformers`` model.

Supported families: GPT-2, BERT, RoBERTa (and XLM-RoBERTa), T5 (v1.0 and v1.1, and mT5),
BART, Llama (and Mistral, Qwen2, Qwen3, Phi-3, Gemma), GPT-NeoX. XLM-RoBERTa and mT5 are RoBERTa's and T5's models under
other names, and export as ``roberta`` and ``t5``. Only :func:`to_hf` imports ``transformers`` (the optional ``[hf]`` extra).
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
from collections.abc import Callable, Mapping
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from specformer.analysis.params import as_spec
from specformer.data.cache import is_stream, locked, remove_temporaries
from specformer.data.corpus import lfs_pointer
from specformer.interop.hf_config import (
    EXPORTED_AS,
    MULTIMODAL,
    SUPPORTED_MODEL_TYPES,
    HFConversionError,
    export_family,
    hf_config_from_spec,
    hf_family,
    misspelt_config_keys,
    read_hf_config,
    spec_from_hf_config,
)
from specformer.interop.hf_weights import (
    _FAMILIES,
    WeightReport,
    _checkpoint_family,
    _normalise,
    hf_to_specformer,
    specformer_to_hf,
)
from specformer.specs.schema import ModelSpec

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "EXPORTED_AS",
    "MULTIMODAL",
    "HFConversionError",
    "WeightReport",
    "spec_from_hf_config",
    "hf_config_from_spec",
    "read_hf_config",
    "misspelt_config_keys",
    "read_hf_state_dict",
    "load_hf_weights",
    "import_hf",
    "model_tokenizer",
    "read_generation_config",
    "unread_generation_settings",
    "chat_template_source",
    "hf_state_dict",
    "save_hf",
    "write_files",
    "save_safetensors",
    "to_hf",
    "hf_auto_class",
    "hf_auto_name",
]

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


# --------------------------------------------------------------------------- reading checkpoints


def read_hf_state_dict(source: str | Path) -> dict[str, Tensor]:
    """The tensors of a Hugging Face checkpoint: a ``.safetensors`` or ``.bin`` file, or a
    model directory with ``model.safetensors``, ``pytorch_model.bin`` or a sharded index.

    ``.bin`` files are read with ``torch.load(weights_only=True)``: tensors only, no code.
    """
    path = Path(source)
    if path.is_dir():
        found = next((path / f for f in _WEIGHT_FILES if (path / f).is_file()), None)
        if found is None:
            raise HFConversionError(f"{path}: no weights found (looked for {', '.join(_WEIGHT_FILES)})")
        path = found
    if not path.is_file():
        raise HFConversionError(f"{path}: no such file")
    if pointer := lfs_pointer(path):
        raise HFConversionError(pointer)
    if path.name.endswith(".index.json"):
        try:
            index = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise HFConversionError(f"{path}: not a weights index (not UTF-8 JSON text)") from None
        except json.JSONDecodeError as exc:
            raise HFConversionError(f"{path}:{exc.lineno}:{exc.colno}: not a weights index (not valid JSON: "
                                    f"{exc.msg})") from None
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise HFConversionError(f"{path}: not a weights index (no \"weight_map\" object)")
        shards = sorted(set(map(str, weight_map.values())))
        if not shards:
            raise HFConversionError(f"{path}: the index has an empty weight_map")
        out: dict[str, Tensor] = {}
        for shard in shards:
            out.update(read_hf_state_dict(path.parent / shard))
        return out
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise HFConversionError(f"{path}: not a readable safetensors file ({exc})") from None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle errors come in many types
        raise HFConversionError(f"{path}: not a PyTorch weights file readable with weights_only=True "
                                f"({_torch_load_reason(exc)})") from None
    if not isinstance(data, Mapping):
        raise HFConversionError(f"{path}: expected a state dict, found {type(data).__name__}")
    return dict(data)


def _torch_load_reason(exc: BaseException) -> str:
    """One line for why ``torch.load(weights_only=True)`` failed: torch's own message runs
    over many lines, with terminal escapes, to explain how to load the file unsafely."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if found:
        return (f"it holds a Python object of class {found.group(1)}, not only tensors, and is not unpickled "
                "here; save the model's weights as safetensors (save_pretrained) and import those")
    if "Unsupported operand" in text or isinstance(exc, EOFError):
        # bytes that no pickle begins with (torch's advice to load it without weights_only would not help)
        return "its bytes are not what torch.save writes: the file is damaged, truncated or of another kind"
    if "failed reading zip archive" in text:
        return "the zip archive is truncated or damaged: an interrupted copy or download?"
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and "weights_only" not in line and "Weights only load failed" not in line]
    return lines[0].split(". ")[0] if lines else type(exc).__name__


# --------------------------------------------------------------------------- import


def _untied_in_checkpoint(state_dict: Mapping[str, Tensor], spec: ModelSpec) -> bool:
    """Whether a spec that ties its output layer meets a checkpoint whose output matrix
    differs from its token embeddings (T5 v1.1 under transformers >= 5 is the usual case)."""
    if not spec.embedding.tie_output:
        return False
    model_type = _checkpoint_family(state_dict, hf_family(spec))
    family = _FAMILIES[model_type]
    theirs = _normalise(state_dict, family)
    tokens_name = _tokens_name(model_type)
    tokens = theirs.get(tokens_name)
    if tokens is None:
        return False
    for name in family.tied_copies:
        if name.endswith(("embed_tokens.weight", "decoder.bias")) or name not in theirs:
            continue
        if theirs[name].shape != tokens.shape or not torch.equal(theirs[name], tokens):
            return True
    return False


def _tokens_name(model_type: str) -> str:
    return {
        "gpt2": "transformer.wte.weight",
        "gpt_bigcode": "transformer.wte.weight",
        "opt": "model.decoder.embed_tokens.weight",
        "bert": "bert.embeddings.word_embeddings.weight",
        "roberta": "roberta.embeddings.word_embeddings.weight",
        "distilbert": "distilbert.embeddings.word_embeddings.weight",
        "t5": "shared.weight",
        "bart": "model.shared.weight",
        "marian": "model.shared.weight",
        "llama": "model.embed_tokens.weight",
        "mistral": "model.embed_tokens.weight",
        "qwen2": "model.embed_tokens.weight",
        "qwen3": "model.embed_tokens.weight",
        "phi3": "model.embed_tokens.weight",
        "gemma": "model.embed_tokens.weight",
        "gemma2": "model.embed_tokens.weight",
        "gemma3_text": "model.embed_tokens.weight",
        "olmo": "model.embed_tokens.weight",
        "olmo2": "model.embed_tokens.weight",
        "gpt_neox": "gpt_neox.embed_in.weight",
        "bloom": "transformer.word_embeddings.weight",
        "phi": "model.embed_tokens.weight",
        "gptj": "transformer.wte.weight",
        "falcon": "transformer.word_embeddings.weight",
        "starcoder2": "model.embed_tokens.weight",
    }[model_type]


def import_hf(
    source: str | Path | Any,
    *,
    state_dict: Mapping[str, Tensor] | None = None,
    weights: bool = True,
    name: str | None = None,
) -> tuple[ModelSpec, dict[str, Tensor] | None, WeightReport | None]:
    """Import a Hugging Face model: (spec, specformer state dict, report).

    ``source`` is a model directory, a ``config.json`` path, a config dict or a
    ``PretrainedConfig``. Weights come from ``state_dict`` if given, else from the
    directory (when ``weights``). A checkpoint whose output layer is not tied to its
    embeddings gets a spec with ``embedding.tie_output: false``. The spec trains with the
    model's own ``tokenizer.json`` when the folder has one (``training.tokenizer: {type:
    file, path: ...}``): the weights fit its token ids. An encoder-decoder's spec also
    names the token its decoder starts from (``training.objective.decoder_start``: T5's
    ``<pad>``, BART's ``</s>``) where that is not the tokenizer's own start token.
    """
    config = read_hf_config(source)
    generation = read_generation_config(source)
    spec = spec_from_hf_config(source if isinstance(source, str | Path) else config, name=name)
    tokenizer = model_tokenizer(source) if isinstance(source, str | Path) else None
    if tokenizer is not None:
        _check_tokenizer(tokenizer)
        data = spec.to_dict()
        data["training"]["tokenizer"] = {"type": "file", "path": str(tokenizer)}
        if spec.kind == "encoder-decoder":
            objective = {
                "decoder_start": _decoder_start(tokenizer, config.get("decoder_start_token_id")),
                # what generate() forces: BART's <s> first, </s> at the length limit
                "forced_start": _token(tokenizer, generation.get("forced_bos_token_id")),
                "forced_end": _token(tokenizer, generation.get("forced_eos_token_id")),
            }
            if any(v is not None for v in objective.values()):
                data["training"]["objective"] = {
                    "type": "seq2seq", **{k: v for k, v in objective.items() if v is not None}}
        spec = ModelSpec.model_validate(data)
    if state_dict is None and weights:
        if not isinstance(source, str | Path):
            return spec, None, None
        directory = Path(source) if Path(source).is_dir() else Path(source).parent
        state_dict = read_hf_state_dict(directory)
    if state_dict is None:
        return spec, None, None
    if _untied_in_checkpoint(state_dict, spec):
        data = spec.to_dict()
        data["embedding"]["tie_output"] = False
        spec = ModelSpec.model_validate(data)
    ours, report = hf_to_specformer(state_dict, spec)
    return spec, ours, report


def _check_tokenizer(path: Path) -> None:
    """A model's ``tokenizer.json`` that ``tokenizers`` cannot read (a Git LFS pointer, a
    damaged or truncated file) is an error naming it, before the spec names it for training."""
    from tokenizers import Tokenizer

    from specformer.data.tokenizers import _not_a_tokenizer

    try:
        Tokenizer.from_file(str(path))
    except Exception as exc:
        raise HFConversionError(lfs_pointer(path) or _not_a_tokenizer(path, exc)) from None


def _decoder_start(tokenizer_json: Path, start_id: Any) -> str | None:
    """The token string of an encoder-decoder's ``decoder_start_token_id``, or None when it
    is the tokenizer's own start token (specformer's default) or no token of it."""
    from specformer.data.tokenizers import HFTokenizer

    if not isinstance(start_id, int):
        return None
    tok = HFTokenizer.from_str(tokenizer_json.read_text(encoding="utf-8"))
    token = tok.tok.id_to_token(start_id)
    return None if token is None or start_id == tok.bos_id else token


def _token(tokenizer_json: Path, token_id: Any) -> str | None:
    """The token string of ``token_id`` in the tokenizer, or None when it is not one id
    (absent, a list) or no token of it."""
    from specformer.data.tokenizers import HFTokenizer

    if not isinstance(token_id, int) or isinstance(token_id, bool):
        return None
    return HFTokenizer.from_str(tokenizer_json.read_text(encoding="utf-8")).tok.id_to_token(token_id)


def read_generation_config(source: Any) -> dict[str, Any]:
    """The generation settings ``transformers``' ``generate`` starts from: the folder's
    ``generation_config.json`` when it has one, else the ``config.json`` itself (older
    models keep ``forced_bos_token_id``, ``num_beams``, ... there). ``{}`` when neither is
    readable."""
    if isinstance(source, str | Path):
        path = Path(source)
        found = (path if path.is_dir() else path.parent) / "generation_config.json"
        if found.is_file():
            try:
                data = json.loads(found.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                return {}
            return data if isinstance(data, dict) else {}
    try:
        return read_hf_config(source)
    except HFConversionError:
        return {}


# generate()'s settings that specformer's generate takes as options instead, with
# transformers' defaults (a value equal to its default is no setting)
_GENERATION_OPTIONS = {
    "do_sample": (False, "--temperature or --greedy"),
    "temperature": (1.0, "--temperature"),
    "top_k": (50, "--top-k"),
    "top_p": (1.0, "--top-p"),
    "num_beams": (1, "--num-beams"),
    "length_penalty": (1.0, "--length-penalty"),
    "repetition_penalty": (1.0, "--repetition-penalty"),
    "no_repeat_ngram_size": (0, "--no-repeat-ngram"),
    "max_new_tokens": (None, "--max-new-tokens"),
    "max_length": (20, "--max-new-tokens"),
    "min_length": (0, "not read"),
    "min_new_tokens": (None, "not read"),
    "early_stopping": (False, "not read"),
    "num_return_sequences": (1, "not read"),
}


def unread_generation_settings(source: Any, spec: ModelSpec | None = None) -> list[str]:
    """The model's generation settings (:func:`read_generation_config`) that specformer's
    ``generate`` does not take from it, each with what to do instead: a sampling or beam
    setting is an option of ``specformer generate`` (``num_beams=4: --num-beams``), and of
    several end-of-sequence ids only the tokenizer's one ends an output. The forced tokens
    of an encoder-decoder are read (``training.objective.forced_start``/``forced_end``);
    another model's are listed."""
    generation = read_generation_config(source)
    notes = []
    for key, (default, instead) in _GENERATION_OPTIONS.items():
        value = generation.get(key)
        if value is None or value == default or (key == "max_length" and "max_new_tokens" in generation):
            continue
        if instead == "not read" or key == "do_sample":
            notes.append(f"{key}={json.dumps(value)} ({instead})")
        elif key == "max_length" and isinstance(value, int):
            # transformers counts the decoder's start token (a decoder's prompt) in max_length
            new = (f"give --max-new-tokens {value - 1}" if spec is not None and spec.kind == "encoder-decoder"
                   else "give --max-new-tokens, which counts the new tokens alone")
            notes.append(f"max_length={value} ({new})")
        else:
            notes.append(f"{key}={json.dumps(value)} (give {instead} {json.dumps(value)})")
    eos = generation.get("eos_token_id")
    if isinstance(eos, list) and len(eos) > 1:
        notes.append(f"eos_token_id={json.dumps(eos)} (an output ends at the tokenizer's one end token only)")
    elif isinstance(eos, int) and isinstance(source, str | Path) and (found := model_tokenizer(source)) is not None:
        from specformer.data.tokenizers import HFTokenizer

        tok = HFTokenizer.from_str(found.read_text(encoding="utf-8"))
        if tok.eos_id != eos:
            ours = "none" if tok.eos_id is None else f"{tok.tok.id_to_token(tok.eos_id)} ({tok.eos_id})"
            notes.append(f"eos_token_id={eos} (an output ends at the tokenizer's end token instead: {ours})")
    if spec is None or spec.kind != "encoder-decoder":
        for key in ("forced_bos_token_id", "forced_eos_token_id"):
            if generation.get(key) is not None:
                notes.append(f"{key}={json.dumps(generation[key])} (not read: only an encoder-decoder's are)")
    else:
        objective = spec.training.objective
        # the spec names the forced token by its string in the model's tokenizer.json
        has_tokenizer = isinstance(source, str | Path) and model_tokenizer(source) is not None
        why = ("that tokenizer.json has no token of that id" if has_tokenizer else
               "the folder has no tokenizer.json, in which the spec names the token")
        for key, field in (("forced_bos_token_id", "forced_start"), ("forced_eos_token_id", "forced_end")):
            if generation.get(key) is not None and getattr(objective, field, None) is None:
                notes.append(f"{key}={json.dumps(generation[key])} (not read: {why}; "
                             f"set training.objective.{field} to the token)")
    return notes


def chat_template_source(source: str | Path) -> str | None:
    """Where the model's tokenizer keeps a chat template (``chat_template.jinja``, or
    ``tokenizer_config.json``'s ``chat_template``), which ``sft`` with ``chat_template: true``
    and ``generate --chat`` read beside the spec's ``training.tokenizer``; None when it has none."""
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return "chat_template.jinja" if (folder / "chat_template.jinja").is_file() else "chat_template.json"
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return "tokenizer_config.json's chat_template" if isinstance(config, dict) and config.get("chat_template") else None


def model_tokenizer(source: str | Path) -> Path | None:
    """The ``tokenizer.json`` beside a model's ``config.json`` (an absolute path), or None
    when the folder has none (an older model may have only ``vocab.json`` + ``merges.txt``
    or a SentencePiece ``tokenizer.model``)."""
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    found = folder / "tokenizer.json"
    return found.resolve() if found.is_file() else None


def load_hf_weights(
    model: nn.Module, state_dict: Mapping[str, Tensor], *, spec: ModelSpec | None = None
) -> WeightReport:
    """Load a Hugging Face state dict into a specformer ``model`` built from ``spec``
    (default ``model.spec``). Every tensor of the model must be found and every tensor of
    the checkpoint placed, else :class:`HFConversionError` says which."""
    spec = spec if spec is not None else getattr(model, "spec", None)
    if spec is None:
        raise HFConversionError("the model has no .spec; pass spec=")
    ours, report = hf_to_specformer(state_dict, spec)
    _load_exact(model, ours)
    return report


def _load_exact(model: nn.Module, state_dict: Mapping[str, Tensor]) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    extra = sorted(set(state_dict) - set(own))
    shapes = [
        f"{k}: model {tuple(own[k].shape)}, checkpoint {tuple(v.shape)}"
        for k, v in state_dict.items()
        if k in own and own[k].shape != v.shape
    ]
    if missing or extra or shapes:
        problems = [f"missing {', '.join(missing[:8])}"] if missing else []
        problems += [f"unexpected {', '.join(extra[:8])}"] if extra else []
        problems += shapes[:8]
        raise HFConversionError("the weights do not fit the model: " + "; ".join(problems))
    model.load_state_dict(state_dict, strict=True)


# --------------------------------------------------------------------------- export


def hf_state_dict(
    model: nn.Module | Mapping[str, Tensor], spec: ModelSpec | None = None, *, model_type: str | None = None
) -> dict[str, Tensor]:
    """The Hugging Face state dict of a specformer model (or of its state dict), tied
    copies included, under the names of ``model_type`` (default: the spec's family)."""
    if isinstance(model, nn.Module):
        spec = spec if spec is not None else getattr(model, "spec", None)
        state = model.state_dict()
    else:
        state = dict(model)
    if spec is None:
        raise HFConversionError("give the spec of the weights (spec=)")
    return specformer_to_hf(state, spec, model_type=model_type)


def save_hf(
    model: nn.Module | Mapping[str, Tensor],
    spec: ModelSpec | str | Path | Mapping[str, Any] | None,
    out_dir: str | Path,
    *,
    warnings: list[str] | None = None,
    tokenizer: Any = None,
    imported_as: str | None = None,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` that ``transformers`` loads with
    ``AutoModel*.from_pretrained(out_dir)``. Needs no ``transformers``.

    ``imported_as``: the ``model_type`` the weights were imported under; an ``mt5``,
    ``xlm-roberta`` or ``phi3`` model is written under that name (see :func:`hf_config_from_spec`).

    ``tokenizer`` (a specformer tokenizer, e.g. a checkpoint's) gives the config its
    bos/eos/pad token ids and is written as ``tokenizer.json`` + ``tokenizer_config.json``
    for ``AutoTokenizer.from_pretrained(out_dir)``, with ``chat_template.jinja`` when it keeps a
    chat template (a checkpoint's tokenizer does) or the spec's ``training.tokenizer`` folder has
    one; without it those ids are None. The
    files are written under temporary names and renamed into place once all are written.
    """
    from specformer.interop.hf_tokenizer import hf_tokenizer_files, special_token_ids

    if spec is None:
        spec = getattr(model, "spec", None)
    if spec is None:
        raise HFConversionError("give the spec of the weights (spec=)")
    spec = as_spec(spec)
    token_ids = special_token_ids(tokenizer, spec) if tokenizer is not None else None
    chat = _chat_template(spec, tokenizer) if tokenizer is not None else None
    ends = _turn_ends(spec, tokenizer, chat, token_ids)
    if ends is not None:
        token_ids = {**token_ids, "eos_token_id": ends[0]}  # type: ignore[dict-item]
    config = hf_config_from_spec(spec, warnings=warnings, token_ids=token_ids, imported_as=imported_as)
    model_type = export_family(spec, imported_as)
    tensors = hf_state_dict(model, spec, model_type=model_type)
    # tied copies are left out, as transformers' save_pretrained does; loading re-ties them
    family = _FAMILIES[model_type]
    tensors = _unshared({k: v for k, v in tensors.items() if k not in family.tied_copies or _needed(k, spec)})
    dtype = next(iter(tensors.values())).dtype
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    texts = {"config.json": json.dumps(config, indent=2) + "\n"}
    if tokenizer is not None:
        texts.update(hf_tokenizer_files(tokenizer.state(), max_length=spec.max_seq_len))
        if chat is not None:
            texts["chat_template.jinja"] = chat.template
    if ends is not None:  # transformers' generate stops at any of them, as generate --chat does at the first
        generation = {key: config.get(key) for key in ("bos_token_id", "pad_token_id")}
        texts["generation_config.json"] = json.dumps({**generation, "eos_token_id": ends}, indent=2) + "\n"
    out = Path(out_dir)
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is a file, not a folder: out_dir is the folder that "
                                 "config.json and model.safetensors are written into", str(existing))
    writers: dict[Path, Callable[[Path], None]] = {
        out / name: (lambda path, text=text: path.write_text(text, encoding="utf-8")) for name, text in texts.items()
    }
    writers[out / "model.safetensors"] = lambda path: save_safetensors(tensors, path)
    write_files(writers)
    return out


def _turn_ends(spec: ModelSpec, tokenizer: Any, chat: Any, token_ids: Mapping[str, int | None] | None
               ) -> list[int] | None:
    """For a decoder whose chat template ``chat`` ends a turn at a token of its own (the
    tokenizer's ``eos_token`` ``<|im_end|>`` or ``<|eot_id|>``, where ``generate --chat`` stops)
    other than the end-of-text token: that id, then the end-of-text one, as an instruct model's
    ``generation_config.json`` lists them (its ``config.json`` names the first). None otherwise."""
    if chat is None or token_ids is None or spec.kind != "decoder":
        return None
    end, eos = chat.end_id(tokenizer), token_ids.get("eos_token_id")
    if end is None or end == eos:
        return None
    return [end] if eos is None else [end, eos]


def _chat_template(spec: ModelSpec, tokenizer: Any = None) -> Any:
    """The chat template ``tokenizer`` keeps (a checkpoint's, read when it was trained), else
    the one beside the spec's ``training.tokenizer`` (an imported instruct model's), which an
    exported tokenizer keeps as ``chat_template.jinja``; None when none."""
    from specformer.data.chat import chat_template_for
    from specformer.data.corpus import DataError

    try:
        return chat_template_for(spec.training, tokenizer)
    except DataError:
        return None


def _safetensors_dtypes() -> dict[torch.dtype, str]:
    names = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
             "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "C64": "complex64",
             "U64": "uint64", "U32": "uint32", "U16": "uint16", "F8_E4M3": "float8_e4m3fn",
             "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz"}
    return {getattr(torch, name): code for code, name in names.items() if hasattr(torch, name)}


def save_safetensors(tensors: Mapping[str, Tensor], path: Path, *, metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` to ``path`` in the safetensors format, ``metadata`` (strings) in the
    file's header beside ``format: pt``; the file ``safetensors.torch.load_file`` reads.

    ``path`` itself is written, one tensor at a time (a model on a GPU is copied to the CPU a
    tensor at a time, never whole): no other file is made. ``safetensors.torch.save_file``
    writes a temporary file of its own (``.tmpXXXXXX``) beside ``path`` and renames it, which
    a write killed outright (SIGKILL, the OOM killer) leaves behind, as large as the weights,
    where no cleanup knows it; serialising to bytes first (``safetensors.torch.save``) would
    hold the weights twice in memory. This is not atomic by itself: :func:`write_files`
    passes it its own temporary file (which its cleanup removes) and renames that into place."""
    import sys

    dtypes = _safetensors_dtypes()
    meta = {**(metadata or {}), "format": "pt"}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise TypeError(f"safetensors metadata holds strings only: {meta!r}")
    if sys.byteorder != "little":  # the format is little-endian: let safetensors swap the bytes
        from safetensors.torch import save

        data = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=meta)
        with open(path, "wb") as f:
            f.write(data)
        return
    for name, tensor in tensors.items():
        if tensor.dtype not in dtypes:
            raise TypeError(f"{name}: safetensors cannot hold a {tensor.dtype} tensor")
        if tensor.layout != torch.strided:
            raise TypeError(f"{name}: safetensors holds dense tensors only, not a {tensor.layout} one")
    # the widest dtypes first, as safetensors orders them: every tensor starts aligned to its
    # element size (the data starts at a multiple of 8)
    order = sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))
    header: dict[str, Any] = {"__metadata__": meta}
    offset = 0
    for name in order:
        tensor = tensors[name]
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": dtypes[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for name in order:
            data = tensors[name].detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            f.write(data.numpy().data)


def _umask_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_files(writers: Mapping[Path, Callable[[Path], None]]) -> None:
    """Write several files all or nothing: ``writers[path](tmp)`` writes each to a temporary
    file beside ``path``; once every one is written and flushed to disk they are renamed into
    place. On an error (an ``OSError`` is raised) no temporary file is left, no target is
    replaced by a partial file, and the folders this call made (``parents=True``) are removed
    again, each only when it is empty. The renames are not one step: the largest file (the
    weights) is renamed first and ``config.json`` last (see :func:`_rename_into_place`), so
    a crash between them leaves new weights beside the old ``config.json``, never the reverse.

    The temporary files that a write killed midway (SIGKILL, the OOM killer) left beside
    these targets, each as large as its file, are removed first, unless another process is
    writing there now: each write holds a shared lock on its folders, as a checkpoint's does."""
    for path in writers:
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    # a symbolic link stays one (the file it points to is replaced); a device or a pipe
    # (/dev/null, a FIFO) is written as it is, never replaced by a file renamed over it
    files = [path for path in writers if not is_stream(path)]
    targets = {path: Path(os.path.realpath(path)) if path in files else path for path in writers}
    staged: list[tuple[Path, Path]] = []
    made: list[Path] = []  # the folders this call makes, each after the one it is in
    try:
        with ExitStack() as folders:
            for folder in sorted({targets[path].parent for path in files}):
                _make_folder(folder, made)
                with locked(folder, wait=False) as alone:
                    if alone:
                        for path in files:
                            if targets[path].parent == folder:
                                remove_temporaries(folder, targets[path].name)
                folders.enter_context(locked(folder, shared=True))
            try:
                for path, write in writers.items():
                    target = targets[path]
                    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp") if path in files else target
                    if path in files:
                        staged.append((tmp, target))  # atomic_file's names
                    try:
                        write(tmp)
                        if path in files:
                            _fsync(tmp)
                    except OSError as exc:
                        if exc.filename in (str(tmp), None):  # name the file the caller asked for
                            raise OSError(exc.errno, exc.strerror, str(path)) from None
                        raise
                _rename_into_place(staged)
            finally:
                for tmp, _ in staged:
                    tmp.unlink(missing_ok=True)
    except BaseException:
        for folder in reversed(made):  # the innermost first; one that holds a file stays
            with suppress(OSError):
                os.rmdir(folder)
        raise


def _make_folder(folder: Path, made: list[Path]) -> None:
    """Make ``folder`` and the folders above it that are missing, adding to ``made`` those this
    call made (not one another process made meanwhile), outermost first."""
    missing = []
    for above in (folder, *folder.parents):
        if above.exists() or above.is_symlink():
            break
        missing.append(above)
    for above in reversed(missing):
        try:
            above.mkdir()
        except FileExistsError:
            continue
        except OSError:
            break  # raised below, by the mkdir that names the problem
        made.append(above)
    folder.mkdir(parents=True, exist_ok=True)


def _rename_into_place(staged: list[tuple[Path, Path]]) -> None:
    """Rename each written temporary file over its target: the largest (the weights) first and
    ``config.json`` last, each folder flushed to disk (where the platform allows) before the
    ``config.json`` in it is renamed and again after. ``transformers`` takes a folder with a
    ``config.json`` for a model: a crash or a power cut midway leaves the new weights beside
    the old ``config.json`` (or none), never a new ``config.json`` beside old or missing weights."""
    mode = _umask_mode()
    sizes = {tmp: os.stat(tmp).st_size for tmp, _ in staged}
    first = sorted((pair for pair in staged if pair[1].name != "config.json"), key=lambda pair: -sizes[pair[0]])
    last = [pair for pair in staged if pair[1].name == "config.json"]
    for group in (first, last):
        for tmp, target in group:
            # a writer may make an owner-only (0600) file (safetensors' save_file does): give
            # each what a plain open gives (the umask applies), like every other file written here
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        for folder in sorted({target.parent for _, target in staged}):
            _fsync_folder(folder)


def _fsync_folder(folder: Path) -> None:
    """Flush ``folder``'s entries (the renames into it) to disk; a no-op where a folder cannot
    be opened or flushed (Windows, some network file systems)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync(path: Path) -> None:
    """Flush ``path`` to the disk before it is renamed into place: after a power cut the
    name then holds the old file or the whole new one, not an empty or torn one."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _needed(name: str, spec: ModelSpec) -> bool:
    # With an untied output layer transformers 5 re-ties none of the copies on loading: a
    # BART stack's embed_tokens and a BERT/RoBERTa decoder's bias are then tensors of their
    # own, which the file must hold (4.x made them one tensor; the values agree either way)
    return not spec.embedding.tie_output


def _unshared(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """``tensors`` with a copy of every tensor that an earlier name already holds (a tied
    copy is the same tensor, and safetensors refuses to write one tensor under two names)."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for name, tensor in tensors.items():
        key = (tensor.data_ptr(), tensor.numel())
        out[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    return out


_AUTO = {"decoder": "AutoModelForCausalLM", "encoder": "AutoModelForMaskedLM",
         "encoder-decoder": "AutoModelForSeq2SeqLM"}


def hf_auto_name(spec: ModelSpec) -> str:
    """The name of the ``transformers`` Auto class with the task head that matches ``spec``
    (needs no ``transformers``)."""
    if spec.head.type == "classification":
        return "AutoModelForSequenceClassification"
    return _AUTO[spec.kind]


def hf_auto_class(spec: ModelSpec) -> Any:
    """The ``transformers`` Auto class with the task head that matches ``spec``."""
    import transformers

    return getattr(transformers, hf_auto_name(spec))


def to_hf(model: nn.Module, spec: ModelSpec | str | Path | Mapping[str, Any] | None = None) -> Any:
    """The ``transformers`` model equal to a specformer ``model`` (requires ``transformers``),
    in the model's dtype and in eval mode."""
    try:
        import transformers
    except ImportError:
        raise HFConversionError(
            "to_hf needs transformers: pip install 'specformer[hf]' (save_hf does not)"
        ) from None
    spec = spec if spec is not None else getattr(model, "spec", None)
    if spec is None:
        raise HFConversionError("the model has no .spec; pass spec=")
    spec = as_spec(spec)
    config = hf_config_from_spec(spec)
    hf_config = transformers.AutoConfig.for_model(**config)
    # T5Config (and MT5Config) tie whatever tie_word_embeddings says: from_pretrained unties
    # a checkpoint's distinct lm_head, but a model built from the config shares one tensor
    hf_config.tie_word_embeddings = spec.embedding.tie_output
    tensors = hf_state_dict(model, spec)
    dtype = next(iter(model.parameters())).dtype
    # soft-capped scores (Gemma 2) only in transformers' eager attention: its SDPA (the default
    # of earlier 5.x releases, 5.16 among them) leaves the cap out
    capped = any(getattr(stack.attention, "softcap", None) is not None for _, stack in spec.stacks())
    extra = {"attn_implementation": "eager"} if capped else {}
    hf_model = hf_auto_class(spec).from_config(hf_config, **extra).to(dtype)
    result = hf_model.load_state_dict(tensors, strict=False)
    tied = set(_FAMILIES[config["model_type"]].tied_copies)
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise HFConversionError(
            f"transformers' {type(hf_model).__name__} did not take the weights: missing {missing[:8]}, "
            f"unexpected {result.unexpected_keys[:8]}"
        )
    if spec.embedding.tie_output:
        hf_model.tie_weights()
    return hf_model.eval()
