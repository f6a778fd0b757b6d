"""A checkpoint's tokenizer as Hugging Face files: ``tokenizer.json`` + ``tokenizer_config.json``.

A specformer checkpoint stores its tokenizer as plain data (``Tokenizer.state()``):
a trained BPE or a loaded ``tokenizer.json`` is kept verbatim, and the byte and task
tokenizers are rebuilt here as ``tokenizers`` pipelines with the same ids:

* ``byte``: GPT-2's byte-level alphabet with no merges (one token per UTF-8 byte, in
  byte order), then ``<|endoftext|>``, ``<pad>``, ``<mask>``;
* ``task``: one token per symbol of the synthetic tasks after the five specials, unknown
  characters to ``<unk>``.

``transformers.AutoTokenizer.from_pretrained(folder)`` loads the files as a
``PreTrainedTokenizerFast`` that encodes text to the ids specformer's tokenizer gives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["special_token_ids", "hf_tokenizer_json", "hf_tokenizer_files"]


def special_token_ids(tokenizer: Any, spec: Any = None) -> dict[str, int | None]:
    """``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` of a specformer tokenizer
    (None where it has no such token), and an encoder-decoder ``spec``'s
    ``decoder_start_token_id`` (``training.objective.decoder_start``, else the bos), and its
    ``forced_bos_token_id`` / ``forced_eos_token_id`` (``training.objective.forced_start`` /
    ``forced_end``; None when it names none)."""
    ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    if spec is not None and spec.kind == "encoder-decoder":
        from specformer.data.tokenizers import decoder_start_id, forced_ids

        ids["decoder_start_token_id"] = decoder_start_id(tokenizer, spec.training.objective)
        ids["forced_bos_token_id"], ids["forced_eos_token_id"] = forced_ids(tokenizer, spec.training.objective)
    return ids


def _byte_chars() -> list[str]:
    """The printable stand-in of each byte 0-255 in GPT-2's byte-level alphabet (what the
    ``ByteLevel`` pre-tokenizer turns a byte into)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    out, shifted = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + shifted))
            shifted += 1
    return out


def hf_tokenizer_json(state: Mapping[str, Any]) -> str:
    """The ``tokenizer.json`` text of a tokenizer stored as ``state`` (``Tokenizer.state()``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from specformer.data.tokenizers import EOT, MASK, PAD
    from specformer.specs.training import TASK_SPECIALS, TASK_SYMBOLS

    kind = state.get("type")
    if kind == "hf" and isinstance(state.get("json"), str):
        return _mask_takes_the_space_before_it(state["json"])
    if kind == "byte":
        tok = Tokenizer(models.BPE(vocab={c: b for b, c in enumerate(_byte_chars())}, merges=[]))
        # no regex split and no prefix space: the text's bytes, one token each, nothing added
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([EOT, PAD, MASK])  # 256, 257, 258
    elif kind == "task":
        tokens = [*TASK_SPECIALS, *TASK_SYMBOLS]
        # BPE without merges and without a pre-tokenizer: one token per character
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[], unk_token="<unk>"))
        tok.decoder = decoders.Fuse()
        tok.add_special_tokens(list(TASK_SPECIALS))
    else:
        raise ValueError(f"no Hugging Face tokenizer for tokenizer state of type {kind!r}")
    return tok.to_str()


def _mask_takes_the_space_before_it(text: str) -> str:
    """``text`` with its ``<mask>`` marked ``lstrip`` when it is the byte-level BPE that
    ``training.tokenizer: {type: bpe}`` trains (``<|endoftext|>``, ``<pad>``, ``<mask>`` at ids
    0-2, a ``ByteLevel`` pre-tokenizer): a word there carries the space before it, and was
    masked with it, so ``fill-mask`` reads ``"import <mask>"`` as ``import`` + ``<mask>``, as
    RoBERTa's tokenizer does; without the flag ``transformers`` would read a lone ``" "`` token
    before the mask, another input than the model was trained on. Any other ``tokenizer.json``
    (an imported model's) is returned as it is."""
    from specformer.data.tokenizers import EOT, MASK, PAD

    data = json.loads(text)
    added = data.get("added_tokens") or []
    own = [(t.get("id"), t.get("content")) for t in added[:3]] == [(0, EOT), (1, PAD), (2, MASK)]
    if not own or (data.get("pre_tokenizer") or {}).get("type") != "ByteLevel" or added[2].get("lstrip"):
        return text
    added[2]["lstrip"] = True
    return json.dumps(data, ensure_ascii=False)


def _framing_tokens(data: Mapping[str, Any]) -> dict[str, str | None]:
    """The ``unk_token``, ``cls_token`` and ``sep_token`` a ``tokenizer.json`` has (its
    model's unknown token, else ``<unk>`` or ``[UNK]``; the classification and separator
    tokens of its BERT or RoBERTa post-processor, else ``[CLS]`` and ``[SEP]`` where it has
    them), which ``tokenizer_config.json`` names for ``transformers``
    (``tokenizer.sep_token_id``)."""
    model = data.get("model") or {}
    vocab = model.get("vocab")
    unk = model.get("unk_token")
    if model.get("type") == "Unigram" and isinstance(model.get("unk_id"), int) and isinstance(vocab, list):
        unk = vocab[model["unk_id"]][0] if 0 <= model["unk_id"] < len(vocab) else None
    post = data.get("post_processor") or {}
    processors = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    cls = sep = None
    for processor in processors:
        if (processor or {}).get("type") in ("BertProcessing", "RobertaProcessing"):
            cls, sep = processor["cls"][0], processor["sep"][0]
    added = {t.get("content") for t in data.get("added_tokens") or []}
    known = added | (set(vocab) if isinstance(vocab, dict) else set())
    cls = cls if cls is not None else "[CLS]" if "[CLS]" in known else None
    sep = sep if sep is not None else "[SEP]" if "[SEP]" in known else None
    if not isinstance(unk, str):  # a byte-level BPE's model has none, yet RoBERTa's vocabulary holds <unk>
        unk = next((name for name in ("<unk>", "[UNK]") if name in known), None)
    return {"unk_token": unk, "cls_token": cls, "sep_token": sep}


def hf_tokenizer_files(state: Mapping[str, Any], *, max_length: int | None = None) -> dict[str, str]:
    """``{file name: text}``: ``tokenizer.json`` and a ``tokenizer_config.json`` naming the
    special tokens, for the tokenizer stored as ``state``; those its chat template was kept with
    (the strings the template reads, such as ``eos_token``) are named as they were."""
    from tokenizers import Tokenizer

    from specformer.data.tokenizers import tokenizer_from_state

    text = hf_tokenizer_json(state)
    ours = tokenizer_from_state(dict(state))
    theirs = Tokenizer.from_str(text)

    def token(i: int | None) -> str | None:
        return None if i is None else theirs.id_to_token(i)

    framing = _framing_tokens(json.loads(text))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token(ours.bos_id),
        "eos_token": token(ours.eos_id),
        "pad_token": token(ours.pad_id),
        "mask_token": token(ours.mask_id),
        "unk_token": token(getattr(ours, "unk_id", None)) or framing["unk_token"],
        "cls_token": framing["cls_token"],
        "sep_token": framing["sep_token"],
        "clean_up_tokenization_spaces": False,
    }
    # a chat template reads the special-token strings of the tokenizer_config.json it was kept with
    # (SmolLM2's eos_token is its end of turn, <|im_end|>): written back, so that it renders the same
    chat = state.get("chat_template")
    kept = chat.get("special_tokens") if isinstance(chat, Mapping) else None
    for name, value in (kept.items() if isinstance(kept, Mapping) else ()):
        if name in config and isinstance(value, str) and theirs.token_to_id(value) is not None:
            config[name] = value
    if max_length is not None:
        config["model_max_length"] = max_length
    config = {k: v for k, v in config.items() if v is not None}
    return {"tokenizer.json": text, "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}
