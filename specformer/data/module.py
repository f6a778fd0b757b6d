"""Turning a spec's ``training.data`` and ``training.tokenizer`` into batches: the
:class:`SpecDataModule` (a ``LightningDataModule``) and the :func:`prepare` step
beneath it.

``prepare`` reads the corpus, trains or loads the tokenizer and tokenises once into
memory-mapped arrays (all cached by content hash), generates a synthetic task, or reads
and tokenises the user's (source, target) pairs (cached the same way).
The data module then serves an endless, resumable, rank-sharded training stream
(:mod:`specformer.data.sampler`) and a fixed validation set.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from specformer.data.cache import content_hash
from specformer.data.collate import (
    CausalLMCollator,
    ClassificationCollator,
    ConversationCollator,
    MaskedLMCollator,
    Seq2SeqCollator,
    SFTCollator,
)
from specformer.data.conversations import ConversationCorpus
from specformer.data.corpus import DataError, _names, is_scoring_only
from specformer.data.datasets import LabelledTexts, PackedBlocks, PairDataset
from specformer.data.labelled import LabelledCorpus, label_ids
from specformer.data.pairs import PairCorpus
from specformer.data.sampler import EvalBatchSampler, EvalCollator, StreamBatchSampler
from specformer.data.synthetic import SyntheticTask, length_problem
from specformer.data.tokenizers import EOT, EOT_NAMES, MASK, PAD, Tokenizer, decoder_start_id
from specformer.data.tokens import (
    conversation_token_ids,
    pair_token_ids,
    token_arrays,
    unigram_cross_entropy,
    usable_cores,
)
from specformer.registry import REGISTRY
from specformer.specs.training import BYTE_VOCAB_SIZE, TASK_SPECIALS

__all__ = ["PreparedData", "prepare", "SpecDataModule", "default_num_workers", "classification_ids", "classification_pad_id",
           "sft_pad_id", "text_room"]


@dataclass
class PreparedData:
    """Datasets, tokenizer and facts about the data of one spec."""

    tokenizer: Tokenizer
    train: Dataset
    val: Dataset
    description: str
    unigram_loss: float | None = None
    n_train_tokens: int = 0
    n_val_tokens: int = 0
    task: SyntheticTask | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # a hash of the data's content and settings: a checkpoint records it, and a run resumed
    # on other data (a file edited, added or removed) is told
    fingerprint: str | None = None
    # files the reading left out, each with why: said before training as well as in the summary
    left_out: list[str] = field(default_factory=list)

    @property
    def unit(self) -> str:
        """What one row of the splits is, as messages count them: ``text`` (a labelled text,
        one prediction each), ``sequence`` (a block of ``seq_len`` tokens of a corpus) or
        ``example`` (a pair, or a synthetic task's example)."""
        if "label_names" in self.extra:
            return "text"
        return "sequence" if isinstance(self.val, PackedBlocks) and self.task is None else "example"


def default_num_workers() -> int:
    """Worker processes for loading: none on small machines, where a batch is a slice of a
    memory map and a worker would only compete with the model for a core."""
    cpus = usable_cores()
    return 0 if cpus <= 4 else min(4, cpus // 4)


def prepare(spec: Any, *, cache_dir: str | Path | None = None, tokenizer: Tokenizer | None = None) -> PreparedData:
    """Everything :class:`SpecDataModule` serves, for a validated ``ModelSpec``.

    A given ``tokenizer`` (e.g. from a checkpoint) is used instead of building one.
    """
    t = spec.training
    cache_dir = cache_dir or t.cache_dir
    if t.data is None or t.objective is None:
        raise DataError("the spec's training section has no data or objective")
    if t.data.type == "synthetic":
        return _prepare_task(spec, tokenizer)
    if tokenizer is None and t.tokenizer is None:
        raise DataError(
            f"vocab_size={spec.vocab_size} fits no built-in text tokenizer (byte-level needs "
            f"{BYTE_VOCAB_SIZE}); raise vocab_size or set training.tokenizer"
        )
    corpus = REGISTRY.build("data", t.data)
    if isinstance(corpus, LabelledCorpus):
        return _prepare_labelled(spec, corpus, tokenizer, cache_dir)
    if isinstance(corpus, PairCorpus):
        return _prepare_pairs(spec, corpus, tokenizer, cache_dir)
    if isinstance(corpus, ConversationCorpus):
        return _prepare_conversations(spec, corpus, tokenizer, cache_dir)
    if tokenizer is None:
        tokenizer = REGISTRY.build("tokenizer", t.tokenizer, corpus=corpus, cache_dir=cache_dir)
    _check_vocab(tokenizer, spec.vocab_size, t.tokenizer)
    _check_specials(tokenizer, t.objective, t.tokenizer)
    arrays = token_arrays(corpus, tokenizer, cache_dir)
    seq_len = t.seq_len or spec.max_seq_len
    overlap = 1 if t.objective.type == "causal_lm" else 0
    train, val = PackedBlocks(arrays.train, seq_len, overlap=overlap), PackedBlocks(arrays.val, seq_len, overlap=overlap)
    no_train = len(train) == 0 and not is_scoring_only()  # (eval --data reads no training split)
    if no_train or len(val) == 0:
        split = "training" if no_train else "validation"
        ids = corpus.train_ids if split == "training" else corpus.val_ids
        if corpus.split_by_lines:  # "a.txt (first lines)"
            name, _, part = ids[0].rpartition(" (")
            ids = [f"the {part.removesuffix(')')} of {name}"]
        fraction = ("" if split != "validation" else " to training.data.val_paths" if getattr(t.data, "val_paths", None)
                    else ", raise training.data.val_fraction" if hasattr(t.data, "val_fraction") else "")
        # a causal LM's block is seq_len inputs and the token after them: seq_len tokens make none
        needed = f"seq_len + 1 = {seq_len + 1}" if overlap else f"seq_len={seq_len}"
        raise DataError(
            f"the {split} split{f' ({_names(ids)})' if ids else ''} has fewer than {needed} tokens "
            f"({len(arrays.train) if split == 'training' else len(arrays.val)}); add data{fraction} or lower "
            "training.seq_len"
        )
    from specformer.training.callbacks import format_count as count

    if is_scoring_only() and not corpus.train:  # eval --data: the files are scored, none trained on
        n = len(corpus.val)
        files = list(dict.fromkeys(re.sub(r":\d+$", "", key) for key in corpus.val_ids))  # a JSON line's is file:line
        description = (f"{_names(files)}: {n} document{'s' if n != 1 else ''}, {count(corpus.n_bytes)} "
                       f"characters → {count(len(arrays.val))} tokens, scored in blocks of seq_len={seq_len}")
    else:
        description = (
            f"{corpus.name}: {corpus.documents}, "
            f"{count(corpus.n_bytes)} characters → {count(len(arrays.train))} train / {count(len(arrays.val))} val tokens"
        )
    if getattr(corpus, "skipped", None):
        description += f"; left out {len(corpus.skipped)} file(s) that are not UTF-8 text: {_names(corpus.skipped)}"
    if getattr(corpus, "unreadable", None):
        description += f"; left out {len(corpus.unreadable)} file(s) that cannot be read: {_names(corpus.unreadable)}"
    if getattr(corpus, "not_documents", None):
        description += (f"; left out {len(corpus.not_documents)} file(s) found in a folder with no documents: "
                        f"{_names([entry.split(' (', 1)[0] for entry in corpus.not_documents])}")
    description += _notes(spec, tokenizer, getattr(corpus, "notes", ()), cached=arrays.cached)
    return PreparedData(
        tokenizer=tokenizer,
        train=train,
        val=val,
        description=description,
        # (no baseline for files read to be scored alone: a training split's unigrams make it)
        unigram_loss=None if is_scoring_only() else unigram_cross_entropy(arrays.train, _scored(arrays.val, val, t),
                                                                           tokenizer.vocab_size),
        n_train_tokens=len(arrays.train),
        n_val_tokens=len(arrays.val),
        extra={"token_cache": str(arrays.path)},
        fingerprint=corpus.fingerprint,
        left_out=_left_out(corpus),
    )


def _left_out(corpus: Any) -> list[str]:
    """What the reading left out, a line each, with where a file stops being UTF-8."""
    lines = []
    skipped, where = getattr(corpus, "skipped", []), getattr(corpus, "skipped_at", {})
    if skipped:
        shown = ", ".join(f"{key} ({where[key]})" if key in where else key for key in skipped[:10])
        more = f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""
        lines.append(f"left out {len(skipped)} file{'s' if len(skipped) != 1 else ''} that {'are' if len(skipped) != 1 else 'is'} "
                     f"not UTF-8 text: {shown}{more} (save them as UTF-8 to train on them)")
    documentless = getattr(corpus, "not_documents", [])
    if documentless:
        lines.append(f"left out {len(documentless)} file{'s' if len(documentless) != 1 else ''} found in a folder "
                     f"that hold{'s' if len(documentless) == 1 else ''} no documents: {'; '.join(documentless[:5])}"
                     f"{f' and {len(documentless) - 5} more' if len(documentless) > 5 else ''} (a file named in "
                     "training.data.paths is read as data)")
    unreadable = getattr(corpus, "unreadable", [])
    if unreadable:
        lines.append(f"left out {len(unreadable)} file{'s' if len(unreadable) != 1 else ''} that cannot be read: "
                     f"{_names(unreadable)}")
    return lines


def _bpe_shortfall(spec: Any, tokenizer: Tokenizer) -> str:
    """The data line's note when a BPE learnt fewer tokens than asked, or any tokenizer has fewer
    than the model's vocab_size ('' otherwise)."""
    settings = spec.training.tokenizer
    kind = getattr(settings, "type", None)
    if kind in ("file", "byte", "task") and tokenizer.vocab_size < spec.vocab_size:
        # (an imported model's table may be padded on purpose; one's own tokenizer may want a smaller one;
        # a byte-level model of a preset's vocab_size starts at a loss of ln vocab_size, not ln 259)
        smaller = f" (vocab_size={tokenizer.vocab_size} saves their rows)" if kind in ("byte", "task") else ""
        return (f"; the tokenizer has {tokenizer.vocab_size} tokens and vocab_size is {spec.vocab_size}: ids "
                f"{tokenizer.vocab_size}–{spec.vocab_size - 1} stay unused{smaller}")
    asked = getattr(settings, "vocab_size", None)
    if asked is None:
        return ""
    if tokenizer.vocab_size >= asked:
        # asked for fewer than the model's table (a run's spec.yaml writes the BPE's size, so a
        # --set vocab_size on it leaves the BPE as it was)
        return "" if tokenizer.vocab_size >= spec.vocab_size else (
            f"; the BPE has {tokenizer.vocab_size} tokens (training.tokenizer.vocab_size) and vocab_size is "
            f"{spec.vocab_size}: ids {tokenizer.vocab_size}–{spec.vocab_size - 1} stay unused")
    # the trainer stops when no pair is frequent enough: too little text, or a min_frequency set high
    least = getattr(settings, "min_frequency", None)
    why = "too little text for more" if least is None else (
        f"no pair of tokens left occurs training.tokenizer.min_frequency={least} times in the text it was trained "
        "on: more text, or a lower min_frequency, gives more")
    return (f"; the BPE reached {tokenizer.vocab_size} of the {asked} tokens asked for ({why}): ids "
            f"{tokenizer.vocab_size}–{spec.vocab_size - 1} stay unused")


def _notes(spec: Any, tokenizer: Tokenizer, notes: Any, *, cached: bool) -> str:
    """The end of the data line: a BPE's shortfall, the reader's notes, and whether the
    token ids came from the cache."""
    line = _bpe_shortfall(spec, tokenizer) + "".join(f"; {note}" for note in notes)
    return line + ("; token ids read from the cache" if cached else "")


def _check_vocab(tokenizer: Tokenizer, vocab_size: int, spec_tokenizer: Any = None) -> None:
    """A tokenizer whose ids reach past the model's embedding table is refused, naming the
    ``tokenizer.json`` the spec reads it from (``spec_tokenizer``: ``training.tokenizer``)."""
    if tokenizer.vocab_size > vocab_size:
        raise DataError(
            f"{_tokenizer_setting(spec_tokenizer)}the tokenizer's ids run to {tokenizer.vocab_size - 1} but the model's "
            f"vocab_size is {vocab_size}, so its ids {vocab_size}–{tokenizer.vocab_size - 1} have no embedding; "
            f"set vocab_size={tokenizer.vocab_size} (--set vocab_size={tokenizer.vocab_size}) or use a smaller tokenizer"
        )


def _tokenizer_setting(spec: Any) -> str:
    """'training.tokenizer.path: PATH: ' for a tokenizer.json the spec names, else ''."""
    path = getattr(spec, "path", None)
    return f"training.tokenizer.path: {path}: " if path else ""


def _check_specials(tokenizer: Tokenizer, objective: Any, spec_tokenizer: Any = None) -> None:
    """The special tokens the objective's collator places: refused now, before the data is
    tokenised and a run folder made, rather than when the first batch is drawn."""
    # a chat template ends each turn itself: sft renders no end-of-text token of its own
    chat = objective.type == "sft" and objective.chat_template
    if objective.type in ("causal_lm", "masked_lm", "sft") and not chat and tokenizer.eot_id is None:
        where = "after each response" if objective.type == "sft" else "between documents"
        raise DataError(f"{_tokenizer_setting(spec_tokenizer)}the tokenizer has no end-of-text token, which "
                        f"{objective.type} training puts {where} (one of {', '.join(EOT_NAMES)}); its "
                        f"special tokens: {_special_names(tokenizer)}. Add one when training the tokenizer "
                        f"(special_tokens=[\"<|endoftext|>\", ...]), or use training.tokenizer type bpe or byte")
    if objective.type == "masked_lm" and tokenizer.mask_id is None:
        raise DataError("the masked-LM objective needs a tokenizer with a mask token (<mask> or [MASK]); "
                        "this one has none: use training.tokenizer type bpe or byte, or a tokenizer.json with one")
    if objective.type != "seq2seq":
        return
    for name in ("decoder_start", "forced_start", "forced_end"):
        token = getattr(objective, name)
        if token is not None and tokenizer.token_id(token) is None:
            raise DataError(f"training.objective.{name}: {token!r} is not a token of the tokenizer; its special "
                            f"tokens: {_special_names(tokenizer)}")
    ids = {"pad": tokenizer.pad_id, "start": decoder_start_id(tokenizer, objective), "end": tokenizer.eos_id}
    if None in ids.values():
        lacks = ", ".join(name for name, i in ids.items() if i is None)
        start = ("; or name the token the decoder starts from as training.objective.decoder_start (T5 starts "
                 "from <pad>)") if ids["start"] is None else ""
        raise DataError(f"sequence-to-sequence training needs a tokenizer with pad, start and end tokens; this one "
                        f"has no {lacks} token (start: <s>, [CLS], <bos> or <|endoftext|>; end: </s>, <eos> or "
                        "<|endoftext|>; pad: <pad> or [PAD]): use training.tokenizer type bpe or byte, or a "
                        f"tokenizer.json with them{start}")


def sft_pad_id(tokenizer: Tokenizer) -> int:
    """The id sft pads a batch with: the tokenizer's pad token, else its end-of-text token, else
    (a chat template's tokenizer may have neither) id 0. Padding follows each sequence, is never
    scored and is never attended to from a real token, so any id serves."""
    for i in (tokenizer.pad_id, tokenizer.eot_id):
        if i is not None:
            return i
    return 0


def _special_names(tokenizer: Tokenizer) -> str:
    # (the byte and task tokenizers decode their specials to nothing: their names are looked up)
    named = {tokenizer.token_id(name): name for name in (EOT, PAD, MASK, *TASK_SPECIALS)}
    ids = set(tokenizer.special_ids)
    # a tokenizer.json's own special tokens too, those specformer gives no role ([UNK], [EOS], ...)
    hf = getattr(tokenizer, "tok", None)
    if hf is not None and hasattr(hf, "get_added_tokens_decoder"):
        ids |= {i for i, token in hf.get_added_tokens_decoder().items() if token.special}
    return ", ".join(tokenizer.decode([i]) or named.get(i, f"id {i}") for i in sorted(ids)) or "none"


def _scored(tokens: np.ndarray, blocks: PackedBlocks, t: Any, world_size: int = 1) -> np.ndarray:
    """The validation tokens that validation scores: the targets of the blocks its
    ``val_batches`` global batches cover (all of them when null), so that the unigram
    baseline and the validation loss are measured on the same text."""
    per_batch = t.batch_size * world_size
    n = len(blocks) if t.val_batches is None else min(len(blocks), t.val_batches * per_batch)
    first = blocks.overlap  # a causal block's first token is input only
    return tokens[first : n * blocks.length + blocks.overlap]


def _prepare_task(spec: Any, tokenizer: Tokenizer | None) -> PreparedData:
    t = spec.training
    task: SyntheticTask = REGISTRY.build("data", t.data)
    if tokenizer is None:
        tokenizer = REGISTRY.build("tokenizer", t.tokenizer)
    _check_vocab(tokenizer, spec.vocab_size, t.tokenizer)
    _check_specials(tokenizer, t.objective)
    if (problem := length_problem(spec)) is not None:  # an example is never cut
        raise DataError(problem)

    def encode(pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        return [(tokenizer.encode(src, specials=False), tokenizer.encode(tgt, specials=False)) for src, tgt in pairs]

    train, val = encode(task.split("train")), encode(task.split("val"))
    d = t.data
    description = (
        f"synthetic {d.task}: lengths {d.min_len}-{d.max_len}, {len(train)} training and "
        f"{len(val)} held-out examples"
    ) + _bpe_shortfall(spec, tokenizer)
    n_train = sum(len(s) + len(g) + 1 for s, g in train)
    return PreparedData(
        tokenizer=tokenizer,
        train=PairDataset(train),
        val=PairDataset(val),
        description=description,
        task=task,
        n_train_tokens=n_train,
        n_val_tokens=sum(len(s) + len(g) + 1 for s, g in val),
        fingerprint=content_hash("synthetic", d.model_dump(mode="json")),
    )


def _prepare_pairs(
    spec: Any, corpus: PairCorpus, tokenizer: Tokenizer | None, cache_dir: str | Path | None
) -> PreparedData:
    """The user's (source, target) pairs, tokenised once and cached (:func:`pair_token_ids`).
    As Hugging Face's ``run_translation`` does with its max_source_length and
    max_target_length, a longer source or target is cut to fit (the source to ``seq_len``
    tokens, the target to ``seq_len - 1``: the decoder reads the start token before it), and
    the data line says how many were, and when the ids were read from the cache.

    A ``tokenizer.json`` with a template frames both sides as ``transformers``'
    ``tokenizer(text)`` and ``tokenizer(text_target=...)`` do: T5's target ends in ``</s>``,
    BART's is ``<s> … </s>`` (the collator adds the end token, so the template's own is
    left to it)."""
    t = spec.training
    if tokenizer is None:
        tokenizer = REGISTRY.build("tokenizer", t.tokenizer, corpus=corpus.text_corpus(), cache_dir=cache_dir)
    _check_vocab(tokenizer, spec.vocab_size, t.tokenizer)
    _check_specials(tokenizer, t.objective, t.tokenizer)
    seq_len = t.seq_len or spec.max_seq_len
    if t.objective.type == "sft":
        return _prepare_prompt_responses(spec, corpus, tokenizer, seq_len, cache_dir)
    ids = pair_token_ids(corpus, tokenizer, seq_len, cache_dir)
    train, val, cut = ids.train, ids.val, ids.cut
    description = f"pairs: {_split_counts(corpus.files, len(train), len(val), 'pair')}"
    if cut["source"] or cut["target"]:
        description += (
            f"; cut to fit seq_len={seq_len}: {cut['source']} source{'s' if cut['source'] != 1 else ''} longer "
            f"than {ids.room} tokens, {cut['target']} target{'s' if cut['target'] != 1 else ''} longer than "
            f"{ids.target_room}"
        )
    description += _notes(spec, tokenizer, corpus.notes, cached=ids.cached)
    return PreparedData(
        tokenizer=tokenizer,
        train=train,
        val=val,
        description=description,
        n_train_tokens=train.n_tokens(),
        n_val_tokens=val.n_tokens(),
        extra={"truncated_sources": cut["source"], "truncated_targets": cut["target"], "token_cache": str(ids.path)},
        fingerprint=corpus.fingerprint,
    )


def _split_counts(files: list[str], n_train: int, n_val: int, noun: str) -> str:
    """'1 file, 9500 training and 500 held-out pairs' (``noun`` singular: 'pair'); of files read to
    be scored alone (eval --data), which have no training split, the files and how many are scored:
    'test.jsonl: 500 pairs'."""
    if is_scoring_only():
        return f"{_names(list(dict.fromkeys(files)))}: {n_val} {noun}{'s' if n_val != 1 else ''}"
    n_files = len(files)
    return (f"{n_files} file{'s' if n_files != 1 else ''}, {n_train} training and {n_val} held-out "
            f"{noun}{'s' if max(n_train, n_val) != 1 else ''}")


def _prepare_prompt_responses(
    spec: Any, corpus: PairCorpus, tokenizer: Tokenizer, seq_len: int, cache_dir: str | Path | None
) -> PreparedData:
    """A decoder's (prompt, response) pairs for supervised fine-tuning, tokenised once and cached
    (:func:`pair_token_ids` with ``decoder=True``): each read as prompt + response + end token,
    at most ``seq_len`` tokens read. A longer response is cut, a pair whose prompt alone is longer
    than ``seq_len`` is left out, and the data line says how many of each."""
    chat, system = None, spec.training.objective.system
    if spec.training.objective.chat_template:
        from specformer.data.chat import chat_template_for

        chat = chat_template_for(spec.training, tokenizer)
    ids = pair_token_ids(corpus, tokenizer, seq_len, cache_dir, decoder=True, chat=chat, system=system)
    train, val, left_out = ids.train, ids.val, ids.left_out or {"train": 0, "val": 0}
    held_out = "val_paths" if getattr(spec.training.data, "val_paths", None) is not None else "paths"
    for split, pairs, setting in (("training", train, "paths"), ("held-out", val, held_out)):
        if len(pairs) == 0 and not (split == "training" and is_scoring_only()):  # (eval --data trains on none)
            raise DataError(
                f"training.data.{setting}: every {split} prompt is longer than seq_len={seq_len} tokens, so no "
                "response would be predicted; raise training.seq_len (and the model's max_seq_len) or shorten "
                "the prompts"
            )
    description = (f"pairs: {_split_counts(corpus.files, len(train), len(val), '(prompt, response) pair')}, the "
                   "loss on the responses")
    if chat is not None:
        turns = "a system turn, a user turn and an assistant turn" if system is not None else (
            "a user turn and an assistant turn")
        description += f" (each {turns} of the chat template, {chat.source})"
    cut, dropped = ids.cut["target"], left_out["train"] + left_out["val"]
    if cut or dropped:
        parts = []
        if dropped:
            parts.append(f"left out {dropped} pair{'s' if dropped != 1 else ''} whose prompt is longer than "
                         f"{seq_len} tokens ({left_out['train']} training, {left_out['val']} held-out)")
        if cut:
            parts.append(f"cut {cut} response{'s' if cut != 1 else ''} (and {'its' if cut == 1 else 'their'} end "
                         "token) to fit")
        description += f"; prompt + response longer than seq_len={seq_len}: " + ", ".join(parts)
    description += _notes(spec, tokenizer, corpus.notes, cached=ids.cached)
    return PreparedData(
        tokenizer=tokenizer,
        train=train,
        val=val,
        description=description,
        n_train_tokens=train.n_tokens(),
        n_val_tokens=val.n_tokens(),
        extra={"truncated_responses": cut, "left_out_pairs": dict(left_out), "token_cache": str(ids.path)},
        fingerprint=corpus.fingerprint,
    )


def _prepare_conversations(
    spec: Any, corpus: ConversationCorpus, tokenizer: Tokenizer | None, cache_dir: str | Path | None
) -> PreparedData:
    """A decoder's conversations for supervised fine-tuning, rendered through the tokenizer's chat
    template, tokenised once and cached (:func:`conversation_token_ids`): the loss on every
    assistant turn. A conversation longer than ``seq_len + 1`` tokens is cut, one with no
    assistant token left is left out, and the data line says how many of each."""
    from specformer.data.chat import chat_template_for

    t = spec.training
    if tokenizer is None:
        tokenizer = REGISTRY.build("tokenizer", t.tokenizer, corpus=corpus.text_corpus(), cache_dir=cache_dir)
    _check_vocab(tokenizer, spec.vocab_size, t.tokenizer)
    _check_specials(tokenizer, t.objective, t.tokenizer)
    seq_len = t.seq_len or spec.max_seq_len
    chat, system = chat_template_for(t, tokenizer), t.objective.system
    ids = conversation_token_ids(corpus, tokenizer, seq_len, cache_dir, chat, system)
    train, val, left_out = ids.train, ids.val, ids.left_out or {"train": 0, "val": 0}
    held_out = "val_paths" if t.data.val_paths is not None else "paths"
    for split, conversations, setting in (("training", train, "paths"), ("held-out", val, held_out)):
        if len(conversations) == 0 and not (split == "training" and is_scoring_only()):  # (eval --data: none)
            raise DataError(
                f"training.data.{setting}: no {split} conversation has an assistant token within its first "
                f"seq_len={seq_len} predicted tokens; raise training.seq_len (and the model's max_seq_len)"
            )
    system_turn = "; a system turn first where a conversation has none" if system is not None else ""
    description = (
        f"conversations: {_split_counts(corpus.files, len(train), len(val), 'conversation')} through the chat "
        f"template ({chat.source}{system_turn}), the loss on the assistant turns"
    )
    cut, dropped = ids.cut["target"], left_out["train"] + left_out["val"]
    if cut or dropped:
        parts = []
        if dropped:
            parts.append(f"left out {dropped} with no assistant token in the first {seq_len} predicted"
                         + ("" if is_scoring_only() else f" ({left_out['train']} training, {left_out['val']} held-out)"))
        if cut:
            parts.append(f"cut {cut} to fit")
        description += f"; longer than seq_len={seq_len} + 1 tokens: " + ", ".join(parts)
    description += _notes(spec, tokenizer, corpus.notes, cached=ids.cached)
    # each conversation is two runs of one length, its ids and its mask: half the runs' tokens are ids
    return PreparedData(
        tokenizer=tokenizer,
        train=train,
        val=val,
        description=description,
        n_train_tokens=train.n_tokens() // 2,
        n_val_tokens=val.n_tokens() // 2,
        extra={"cut_conversations": cut, "left_out_conversations": dict(left_out), "token_cache": str(ids.path)},
        fingerprint=corpus.fingerprint,
    )


def _prepare_labelled(
    spec: Any, corpus: LabelledCorpus, tokenizer: Tokenizer | None, cache_dir: str | Path | None
) -> PreparedData:
    """Labelled texts for sequence classification: each text's ids, framed by a
    ``tokenizer.json``'s template (BERT's ``[CLS] … [SEP]``, whose first token the head pools)
    and cut to ``seq_len`` tokens, and its class id (:func:`label_ids`); ``extra["label_names"]``
    holds the class names the labels were numbered by (None for integer labels)."""
    t = spec.training
    if tokenizer is None:
        tokenizer = REGISTRY.build("tokenizer", t.tokenizer, corpus=corpus.text_corpus(), cache_dir=cache_dir)
    _check_vocab(tokenizer, spec.vocab_size, t.tokenizer)
    seq_len = t.seq_len or spec.max_seq_len
    room = text_room(tokenizer, seq_len)
    head = spec.head
    train_held = "val_paths" if getattr(t.data, "val_paths", None) is not None else "paths"
    if not corpus.val:
        raise DataError("training.data.paths: no row was held out for validation; raise training.data.val_fraction "
                        "or give the held-out rows in training.data.val_paths")
    train_raw, val_raw = [label for _, label in corpus.train], [label for _, label in corpus.val]
    if head.labels is None and not all(isinstance(x, int) for x in train_raw or val_raw):  # (eval --data: no train)
        # names are numbered over both splits: a name only held-out rows have is a class of its own (else
        # the count would ask for a head one class short, whose held-out name then is unknown)
        ids, names = label_ids(train_raw + val_raw, head.n_classes, None,
                               setting="training.data.paths" + (" and training.data.val_paths"
                                                                if train_held == "val_paths" else ""))
        labels, val_labels = ids[:len(train_raw)], ids[len(train_raw):]
    else:
        labels, names = label_ids(train_raw, head.n_classes, head.labels)
        val_labels, val_names = label_ids(val_raw, head.n_classes, names if names is not None else head.labels,
                                          setting=f"training.data.{train_held}")
        names = names if train_raw else val_names  # (eval --data: no training row to number the names by)
    untrained = [] if is_scoring_only() else sorted(set(val_labels) - set(labels))  # (eval --data trains on none)
    cut = 0

    def encode(rows: list[tuple[str, Any]], ids: list[int]) -> LabelledTexts:
        nonlocal cut
        out = []
        for (text, _), label in zip(rows, ids, strict=True):
            framed, was_cut = classification_ids(tokenizer, text, seq_len)
            cut += was_cut
            out.append((framed, label))
        return LabelledTexts(out)

    train, val = encode(corpus.train, labels), encode(corpus.val, val_labels)
    classes = f"{head.n_classes} classes" + (f" ({', '.join(names)})" if names is not None else "")
    description = f"labelled: {_split_counts(corpus.files, len(train), len(val), 'text')}, {classes}"
    if untrained:
        shown = ", ".join(repr(names[i]) if names is not None else str(i) for i in untrained)
        description += (f"; {'class' if len(untrained) == 1 else 'classes'} {shown} "
                        f"{'occurs' if len(untrained) == 1 else 'occur'} only in the held-out rows: "
                        "no training row teaches {}".format("it" if len(untrained) == 1 else "them"))
    if cut:
        description += f"; cut {cut} text{'s' if cut != 1 else ''} longer than {room} tokens to fit seq_len={seq_len}"
    description += _conflicting_labels([*corpus.train, *corpus.val])
    return PreparedData(
        tokenizer=tokenizer, train=train, val=val, description=description,
        n_train_tokens=train.n_tokens(), n_val_tokens=val.n_tokens(),
        extra={"label_names": names, "truncated_texts": cut}, fingerprint=corpus.fingerprint,
    )


def _conflicting_labels(rows: Sequence[tuple[str, Any]]) -> str:
    """A note on the texts the rows give more than one label (a labelling mistake, or a
    duplicate across files): no model can fit both, so their loss stays above 0."""
    seen: dict[str, dict[str, None]] = {}
    for text, label in rows:
        seen.setdefault(text, {})[str(label)] = None
    mixed = [(text, list(labels)) for text, labels in seen.items() if len(labels) > 1]
    if not mixed:
        return ""
    text, labels = mixed[0]
    shown = text if len(text) <= 40 else text[:37] + "..."
    return (f"; {len(mixed)} text{'s have' if len(mixed) != 1 else ' has'} more than one label (e.g. {shown!r}: "
            f"{', '.join(labels)}), which no model fits")


def text_room(tokenizer: Tokenizer, seq_len: int, *, setting: str = "training.seq_len") -> int:
    """How many of a text's tokens fit a sequence of ``seq_len`` beside the tokenizer's template
    (BERT's ``[CLS] … [SEP]``); too few for one is an error naming ``setting``."""
    before, after = tokenizer.template()
    room = seq_len - len(before) - len(after)
    if room < 1:
        raise DataError(f"seq_len={seq_len} leaves no room for a text between the tokenizer's "
                        f"{len(before) + len(after)} template tokens; raise {setting}")
    return room


def classification_ids(tokenizer: Tokenizer, text: str, seq_len: int) -> tuple[list[int], bool]:
    """The ids a classifier reads for ``text``, and whether it was cut: its tokens framed by
    the tokenizer's template, the text's first tokens kept so that the whole fits ``seq_len``
    (the template's tokens stay). Training, evaluation and ``classify`` read a text so."""
    before, after = tokenizer.template()
    room = text_room(tokenizer, seq_len)
    tokens = tokenizer.encode(text, specials=False)
    return [*before, *tokens[:room], *after], len(tokens) > room


def classification_pad_id(tokenizer: Tokenizer) -> int:
    """The id a batch of classified texts is padded with (masked out: any id would do, the
    tokenizer's padding token when it has one)."""
    return next((i for i in (tokenizer.pad_id, tokenizer.eot_id) if i is not None), 0)


class SpecDataModule(L.LightningDataModule):
    """The data a spec trains on, as a Lightning data module.

    Training batches come from an endless stream that starts at the items already
    consumed (kept in the checkpoint by :meth:`state_dict`), so a resumed run sees
    exactly the batches an uninterrupted one would, and one resumed with another
    batch size, accumulation or number of processes reads on from the same item.
    Validation uses the first
    ``training.val_batches`` batches of the held-out split, always the same.
    """

    def __init__(
        self,
        spec: Any,
        *,
        cache_dir: str | Path | None = None,
        num_workers: int | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        super().__init__()
        from specformer.specs.loader import load_spec
        from specformer.specs.schema import ModelSpec

        self.spec = spec if isinstance(spec, ModelSpec) else load_spec(spec)
        t = self.spec.training
        self.cache_dir = cache_dir or t.cache_dir
        self.num_workers = num_workers if num_workers is not None else (
            t.num_workers if t.num_workers is not None else default_num_workers()
        )
        self._tokenizer = tokenizer
        self.data: PreparedData | None = None
        # (global step, items consumed) of the checkpoint this run resumed from
        self._resumed_at: tuple[int, int] | None = None

    # ---- Lightning hooks

    def prepare_data(self) -> None:
        # once per node: fills the caches that setup() then reads on every rank
        if self.data is None:
            self.data = prepare(self.spec, cache_dir=self.cache_dir, tokenizer=self._tokenizer)

    def setup(self, stage: str | None = None) -> None:
        if self.data is None:
            self.data = prepare(self.spec, cache_dir=self.cache_dir, tokenizer=self._tokenizer)

    @property
    def tokenizer(self) -> Tokenizer:
        self.setup()
        assert self.data is not None
        return self.data.tokenizer

    def _placement(self) -> tuple[int, int, int]:
        """(rank, world size, micro-batches already consumed)."""
        trainer = self.trainer
        if trainer is None:
            return 0, 1, 0
        return trainer.global_rank, trainer.world_size, trainer.global_step * trainer.accumulate_grad_batches

    def items_consumed(self) -> int:
        """Training items (all processes) read before the trainer's current step. A run
        resumed from a checkpoint that did not record them counts its steps in this
        run's batches."""
        trainer = self.trainer
        if trainer is None:
            return 0
        per_step = trainer.accumulate_grad_batches * self.spec.training.batch_size * trainer.world_size
        step, items = self._resumed_at or (0, 0)
        return items + (trainer.global_step - step) * per_step

    def state_dict(self) -> dict[str, Any]:
        if self.trainer is None:
            return {}
        state: dict[str, Any] = {"step": int(self.trainer.global_step), "items": self.items_consumed()}
        if self.data is not None and self.data.fingerprint is not None:
            state["data"] = self.data.fingerprint
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "items" in state_dict and "step" in state_dict:
            self._resumed_at = (int(state_dict["step"]), int(state_dict["items"]))

    def _collator(self, rank: int) -> Any:
        assert self.data is not None
        t, tok = self.spec.training, self.data.tokenizer
        kind = t.objective.type
        _check_specials(tok, t.objective)
        if kind == "causal_lm":
            return CausalLMCollator()
        if kind == "classification":
            return ClassificationCollator(pad_id=classification_pad_id(tok))
        if kind == "sft" and t.data is not None and t.data.type == "conversations":
            return ConversationCollator(pad_id=sft_pad_id(tok))
        if kind == "sft":
            return SFTCollator(pad_id=sft_pad_id(tok))
        if kind == "masked_lm":
            assert tok.mask_id is not None
            return MaskedLMCollator(
                t.objective, mask_id=tok.mask_id, vocab_size=tok.vocab_size, special_ids=sorted(tok.special_ids),
                seed=t.seed, rank=rank,
            )
        start = decoder_start_id(tok, t.objective)
        assert tok.pad_id is not None and start is not None and tok.eos_id is not None
        return Seq2SeqCollator(pad_id=tok.pad_id, start_id=start, eos_id=tok.eos_id)

    def _loader(self, dataset: Dataset, sampler: Any, rank: int, seed: int, *, evaluation: bool = False) -> DataLoader:
        workers = self.num_workers
        collate = self._collator(rank)
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=EvalCollator(collate, sampler) if evaluation else collate,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(),
            # its own generator: creating an iterator must not draw from the global RNG,
            # or a resumed run's dropout would differ from an uninterrupted one
            generator=torch.Generator().manual_seed(seed),
        )

    def train_dataloader(self) -> DataLoader:
        self.setup()
        assert self.data is not None
        t = self.spec.training
        rank, world, start = self._placement()
        sampler = StreamBatchSampler(
            len(self.data.train), t.batch_size, seed=t.seed, rank=rank, world_size=world, start=start,
            offset=self.items_consumed(), position=lambda: self._placement()[2],
        )
        return self._loader(self.data.train, sampler, rank, t.seed)

    def val_dataloader(self) -> DataLoader:
        self.setup()
        assert self.data is not None
        t = self.spec.training
        rank, world, _ = self._placement()
        if world > 1 and self.data.unigram_loss is not None and isinstance(self.data.val, PackedBlocks):
            # each of the val_batches global batches holds every process's batch_size blocks
            train, val = self.data.train, self.data.val
            assert isinstance(train, PackedBlocks)
            self.data.unigram_loss = unigram_cross_entropy(
                train.tokens, _scored(val.tokens, val, t, world), self.data.tokenizer.vocab_size
            )
        n_batches, batch = t.val_batches, t.batch_size
        if self.data.task is not None:
            # a synthetic task scores its whole held-out set, the same examples at any batch size;
            # its batches grow to hold it in val_batches batches (batch_size 2 took 250 decodes)
            if n_batches is not None:
                batch = max(batch, -(-len(self.data.val) // (n_batches * world)))
            n_batches = None
        sampler = EvalBatchSampler(len(self.data.val), batch, n_batches=n_batches, rank=rank, world_size=world)
        return self._loader(self.data.val, sampler, rank, t.seed + 1, evaluation=True)

    def test_dataloader(self) -> DataLoader:
        """The validation split's batches, as validation reads them: ``Trainer.test`` scores what
        validation scores (the data has no third split)."""
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        """The validation split's batches, for ``Trainer.predict``."""
        return self.val_dataloader()

    def batches_per_pass(self, world_size: int | None = None) -> int:
        """Global batches in one pass over the training split, with ``world_size`` processes
        (default: the trainer's, else 1)."""
        self.setup()
        assert self.data is not None
        world = world_size or (self.trainer.world_size if self.trainer is not None else 1)
        return max(1, int(np.ceil(len(self.data.train) / (self.spec.training.batch_size * world))))
