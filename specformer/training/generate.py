"""Sampling from trained models: greedy, temperature, top-k and nucleus (top-p), with a
key/value cache.

Shapes: B batch, T prompt length, N new tokens, S source length, V vocabulary.

With the cache (the default), each step runs the model on one new token and reuses
the keys and values of everything before it; without it, each step re-runs the
whole sequence. Both give the same greedy output. When a sequence outgrows the
model's ``max_seq_len``, the context slides: the last ``max_seq_len`` tokens are
re-read from scratch; a model with a sliding window in every layer (Mistral's) goes on
with its rolling cache instead (:func:`generate`).
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec

import torch
from torch import Tensor, nn

__all__ = ["sample_next", "penalize_repeats", "generate", "generate_seq2seq", "beam_search", "Prompt",
           "encode_prompt", "chat_prompt"]


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    n_candidates: int | None = None,
    allowed: Tensor | None = None,
) -> Tensor:
    """Next token ids (B,) from logits (B, V). ``temperature=0`` is greedy (argmax).

    top-k keeps the k most likely tokens; top-p (Holtzman et al. 2020) keeps the
    smallest set whose probability reaches p. Both filters apply before sampling.
    ``n_candidates`` < V keeps ids below it only: a tokenizer smaller than the model's
    vocabulary has no text for the rest. ``allowed`` (bool, (B, V) or (V,)) keeps only
    the ids it marks, before the filters. A row with no token left (every one at -inf: each
    would repeat an n-gram, say) gets -1, :data:`NONE_LEFT`.
    """
    _check_sampling(temperature, top_k, top_p)
    if n_candidates is not None and n_candidates < logits.shape[-1]:
        logits = logits.clone()
        logits[..., n_candidates:] = float("-inf")
    if allowed is not None:
        allowed = allowed.to(device=logits.device, dtype=torch.bool)
        if allowed.shape[-1] < logits.shape[-1]:  # a tokenizer smaller than the vocabulary: the rest has no text
            allowed = torch.nn.functional.pad(allowed, (0, logits.shape[-1] - allowed.shape[-1]), value=False)
        logits = logits.masked_fill(~allowed, float("-inf"))
    none_left = torch.isneginf(logits).all(dim=-1)  # (B,); read on the device, no sync
    if temperature <= 0.0:
        return torch.where(none_left, NONE_LEFT, logits.argmax(dim=-1))
    # such a row is sampled from evenly (multinomial refuses all zeros), then replaced
    logits = logits.float().masked_fill(none_left[:, None], 0.0)
    if temperature < 1e-2:
        # a tiny temperature would overflow float32 (1e-40: inf - inf in the softmax, a NaN):
        # each row's largest logit goes to 0 first, the rest to -inf or below it; below 1e-30
        # (1e-300 is 0 as a float32) the temperature is 1e-30, the argmax all the same
        logits = logits - logits.amax(dim=-1, keepdim=True)
        temperature = max(temperature, 1e-30)
    logits = logits / temperature
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        # transformers' TopPLogitsWarper, operation for operation, so that tied logits (common in
        # bfloat16) keep the same tokens: from the least likely up, drop those whose mass with
        # the ones below them is at most 1 - p; the most likely always stays
        sorted_logits, order = torch.sort(logits, descending=False)  # (B, V)
        drop_sorted = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        drop_sorted[..., -1:] = False
        drop = drop_sorted.scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.where(none_left, NONE_LEFT, torch.multinomial(probs, 1, generator=generator).squeeze(-1))


#: what :func:`sample_next` gives a row that has no token left to take
NONE_LEFT = -1


def _end_where_none_left(tokens: Tensor, eos_id: int | None) -> tuple[Tensor, bool]:
    """Rows that had no token left (:data:`NONE_LEFT`) end there: they take ``eos_id``, as if
    they had produced it (no device sync: :func:`_finish` marks them done); without one, the
    whole generation stops (True), since those rows have nothing to add (the one sync of such
    a step: without an end token no row is ever done)."""
    stuck = tokens == NONE_LEFT
    if eos_id is not None:
        return torch.where(stuck, eos_id, tokens), False
    return tokens, bool(stuck.any())


def _check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Settings outside their range are errors, not a silently different sampler."""
    if not math.isfinite(temperature) or temperature < 0.0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and (_whole(top_k) is None or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 (1 is greedy), got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 keeps every token), got {top_p}")


def penalize_repeats(
    scores: Tensor, history: Tensor, *, repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
    history_mask: Tensor | None = None,
) -> Tensor:
    """``scores`` (B, V) of the next token, with repeats of ``history`` (B, L) (the tokens so
    far, prompt included; ``history_mask`` (B, L) marks real tokens, 0 for padding) made
    less likely, as Hugging Face's logits processors do: ``repetition_penalty`` > 1 divides
    a positive score of every token already in the history by it and multiplies a negative
    one (Keskar et al. 2019); ``no_repeat_ngram_size`` n > 0 forbids the tokens that would
    repeat an n-gram the history already has."""
    _check_penalties(repetition_penalty, no_repeat_ngram_size)
    if repetition_penalty == 1.0 and no_repeat_ngram_size == 0:
        return scores
    v = scores.shape[-1]
    if history_mask is not None:
        history_mask = history_mask.to(device=history.device, dtype=torch.bool)
    if repetition_penalty != 1.0:
        ids = history.clamp(max=v) if history_mask is None else history.masked_fill(~history_mask, v).clamp(max=v)
        seen = torch.zeros(scores.shape[0], v + 1, dtype=torch.bool, device=scores.device)
        seen.scatter_(1, ids.to(scores.device), True)
        penalized = torch.where(scores < 0, scores * repetition_penalty, scores / repetition_penalty)
        scores = torch.where(seen[:, :v], penalized, scores)
    n = no_repeat_ngram_size
    if n > 0 and history.shape[1] >= n:
        tokens = history
        if history_mask is not None:  # padding matches nothing: each position its own negative id
            tokens = torch.where(history_mask, history, -1 - torch.arange(history.shape[1], device=history.device))
        prefix = tokens[:, history.shape[1] + 1 - n:]  # the last n - 1 tokens
        windows = tokens.unfold(1, n, 1)  # (B, L - n + 1, n)
        matches = (windows[..., :-1] == prefix[:, None]).all(-1)
        banned = torch.zeros(scores.shape[0], v + 1, dtype=torch.bool, device=scores.device)
        banned.scatter_(1, torch.where(matches, windows[..., -1].clamp(0, v), v).to(scores.device), True)
        scores = scores.masked_fill(banned[:, :v], float("-inf"))
    return scores


def _whole(value: Any) -> int | None:
    """``value`` as an int if it is a whole number of an integer type (not a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _check_limits(model: nn.Module, *, n_candidates: int | None = None, max_seq_len: int | None = None,
                  eos_id: int | None = None, max_seq_len_name: str = "max_seq_len", pad_id: int | None = None) -> None:
    """``n_candidates`` and a context length of at least 1, and an end id inside the vocabulary:
    0 would generate nothing, a negative count slice from the end, an id past the vocabulary
    never match (and be written where a row has no token left)."""
    for label, value in (("n_candidates", n_candidates), (max_seq_len_name, max_seq_len)):
        if value is not None and (_whole(value) is None or value < 1):
            raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
    vocab = getattr(getattr(model, "spec", None), "vocab_size", None)
    for label, value in (("eos_id", eos_id), ("pad_id", pad_id)):
        if value is not None and (_whole(value) is None or value < 0 or (vocab is not None and value >= vocab)):
            within = f" in [0, vocab_size) = [0, {vocab})" if vocab is not None else " >= 0"
            raise ValueError(f"{label} must be a token id{within}, got {value!r}")


def _check_penalties(repetition_penalty: float, no_repeat_ngram_size: int) -> None:
    if not repetition_penalty > 0.0:
        raise ValueError(f"repetition_penalty must be > 0 (1 is none; above 1 discourages repeats), "
                         f"got {repetition_penalty}")
    if isinstance(no_repeat_ngram_size, bool) or not isinstance(no_repeat_ngram_size, int) or no_repeat_ngram_size < 0:
        raise ValueError(f"no_repeat_ngram_size must be an integer >= 0 (0 is none), got {no_repeat_ngram_size!r}")


def _last_logits(logits: Tensor, model: nn.Module, name: str) -> Tensor:
    """The last position's logits (B, V) of a forward's (B, T, V); a head that gives
    anything else (a classifier's (B, C)) has no next token to sample."""
    if logits.dim() != 3:
        head = getattr(getattr(getattr(model, "spec", None), "head", None), "type", None)
        which = f"its {head} head" if head else "its head"
        raise ValueError(
            f"{name} samples the next token from logits (batch, length, vocab), but {which} gives "
            f"{tuple(logits.shape)}; generate from a model with a language-model head (head: {{type: lm}})"
        )
    return logits[:, -1]


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _check_call(model: nn.Module, input_ids: Tensor, max_new_tokens: int, *, kind: str, name: str) -> None:
    """The model's kind and the ids' shape, checked before anything runs."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{name} takes a model (build_model(...), load_checkpoint(...).model), got a "
                        f"{type(model).__name__}")
    model_kind = getattr(getattr(model, "spec", None), "kind", None)
    if model_kind is not None and model_kind != kind:
        other = {"decoder": "generate", "encoder-decoder": "generate_seq2seq"}.get(model_kind)
        head = getattr(getattr(getattr(model, "spec", None), "head", None), "type", None)
        instead = (f"; use {other}" if other else
                   " (a sequence classifier labels texts: see classify)" if head == "classification" else
                   " (an encoder predicts masked tokens: see fill-mask)")
        raise ValueError(f"{name} is for {_a(kind)} model, and this one is {_a(model_kind)}{instead}")
    if not isinstance(input_ids, Tensor):
        raise ValueError(f"input_ids must be an integer tensor (B, T), got {type(input_ids).__name__}; "
                         "torch.tensor([ids]) makes one prompt of a list of ids")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must be an integer tensor (B, T) of token ids, got {input_ids.dtype} "
                         "(ids.long() converts)")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be an integer tensor (B, T), got shape {tuple(input_ids.shape)}; "
                         "one prompt is ids[None]")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids has no tokens: give each prompt at least one (e.g. the end-of-text id)")
    count = _whole(max_new_tokens)  # any kind range() takes: int, numpy's int64, a 0-d integer tensor
    if count is None or count < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _finish(tokens: Tensor, done: Tensor, eos_id: int | None, pad_id: int | None = None) -> tuple[Tensor, Tensor]:
    """Rows already finished go on with ``pad_id`` (default: eos); mark rows that just produced eos."""
    if eos_id is None:
        return tokens, done
    tokens = torch.where(done, torch.full_like(tokens, eos_id if pad_id is None else pad_id), tokens)
    return tokens, done | (tokens == eos_id)


def _forced(scores: Tensor, token_id: int | None) -> Tensor:
    """``scores`` (N, V) with every token but ``token_id`` at -inf and it at 0, as Hugging
    Face's ForcedBOS/ForcedEOS logits processors leave them; unchanged when None."""
    if token_id is None:
        return scores
    forced = torch.full_like(scores, float("-inf"))
    forced[:, token_id] = 0.0
    return forced


def _learned_positions(model: nn.Module) -> int | None:
    """Positions a learned table gives the model (``spec.max_seq_len`` unless the table has
    other rows); ``None`` for every other positional scheme, which has no end."""
    spec = getattr(model, "spec", None)
    positional = getattr(spec, "positional", None)
    if getattr(positional, "type", None) != "learned" or not isinstance(getattr(spec, "max_seq_len", None), int):
        return None
    return positional.rows(spec.max_seq_len) - positional.offset


def _sized_cache(use_cache: bool, length: int, max_seq_len: int | None) -> Any:
    """A new KV cache that will hold ``length`` positions (at most ``max_seq_len``): it allocates
    that much and no more, where doubling would reach up to twice as many. None without a cache."""
    if not use_cache:
        return None
    from specformer.components.cache import KVCache

    return KVCache(max_length=max(1, min(length, max_seq_len) if max_seq_len is not None else length))


_ANY_POSITION = ("rope", "alibi", "none", "t5", "sinusoidal")


def _rolling_reach(model: nn.Module) -> int | None:
    """For a decoder whose every self-attention layer has a sliding window W and whose
    positional scheme gives any position (not a learned table): how many tokens decide the
    next one's logits, Σ_layers (W − 1) + 1, each layer reaching W − 1 further back. Such a
    model decodes past ``max_seq_len`` with its rolling cache at the tokens' own positions,
    as Mistral does; None for any other model (a full-attention layer sees everything)."""
    spec = getattr(model, "spec", None)
    if getattr(getattr(spec, "positional", None), "type", None) not in _ANY_POSITION:
        return None
    layers = getattr(getattr(model, "decoder", None), "layers", None)
    if not layers:
        return None
    windows = [getattr(getattr(layer, "self_attn", None), "sliding_window", None) for layer in layers]
    if not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in windows):
        return None
    return sum(w - 1 for w in windows) + 1


def _positions(full_mask: Tensor | None, total: int, length: int, device: torch.device) -> Tensor:
    """Positions (B|1, length) of the last ``length`` of ``total`` tokens, counted over the real
    tokens of ``full_mask`` (B, total) when there is one, as the model counts them."""
    from specformer.components.models import default_position_ids

    return default_position_ids(full_mask, total - length, length, device)


def _prefill(model: nn.Module, context: Tensor, mask: Tensor | None, positions: Tensor | None, cache: Any,
             chunk: int | None) -> Any:
    """The model's output for ``context`` (B, T), its last position's logits only, read into ``cache`` in chunks
    of at most ``chunk`` tokens (a rolling cache keeps only what later queries see, so a
    context longer than ``max_seq_len`` never makes a T x T mask); in one forward without a
    cache."""
    t = context.shape[1]
    step = t if cache is None or chunk is None else max(1, chunk)
    out = None
    for a in range(0, t, step):
        b = min(t, a + step)
        out = model(context[:, a:b], attention_mask=mask[:, :b] if mask is not None else None,
                    position_ids=positions[:, a:b] if positions is not None else None,
                    cache=cache, use_cache=cache is not None, logits_to_keep=1)
    return out


_P = ParamSpec("_P")


def _inference(fn: Callable[_P, Tensor]) -> Callable[_P, Tensor]:
    """Run a generation in inference mode, with no autograd bookkeeping at all (under
    ``no_grad`` each of a decoding step's few hundred small operations still passes autograd's
    dispatch: batch-1 generation took 0.86–0.93 of its time without it at t5-style, 0.94–1.00
    at llama-style, on a 2-core AMD EPYC). The tokens come back as an ordinary tensor, copied outside
    inference mode, that the caller may change in place; what the model caches for later
    forwards (position tables) is made so that training can still use it."""

    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> Tensor:
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            tokens = fn(*args, **kwargs)
        return tokens.clone()

    return run


def _spec_max_seq_len(model: nn.Module) -> int | None:
    spec = getattr(model, "spec", None)
    value = getattr(spec, "max_seq_len", None)
    return value if isinstance(value, int) else None


@_inference
def generate(
    model: nn.Module,
    input_ids: Tensor,
    *,
    max_new_tokens: int,
    attention_mask: Tensor | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    use_cache: bool = True,
    max_seq_len: int | None = None,
    generator: torch.Generator | None = None,
    n_candidates: int | None = None,
    on_token: Callable[[Tensor], None] | None = None,
    allowed_tokens: Callable[[Tensor], Tensor | None] | None = None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    pad_id: int | None = None,
) -> Tensor:
    """Continue prompts (B, T) of a decoder-only model; returns (B, T + N), N ≤ max_new_tokens
    (fewer when every row has produced ``eos_id``; a row that ended before the others goes on
    with ``pad_id``, by default ``eos_id``, as Hugging Face's with its ``pad_token_id``). ``n_candidates``: see :func:`sample_next`;
    ``on_token`` is called with each step's new tokens (B,) as they come (to show them, or
    to keep them when generation is interrupted). ``allowed_tokens``, called before each step
    with the tokens generated so far (B, n), returns which ids the step may take (bool,
    (B, V) or (V,)) or None for any: :func:`encode_prompt` gives one that heals a prompt's
    trailing whitespace.

    Prompts of different lengths go in one batch left-padded, with ``attention_mask``
    (B, T) (1 for real tokens, 0 for padding, as Hugging Face's): each row then decodes
    as it would alone, its positions counted from its first real token.

    ``max_seq_len`` (default: the model's ``spec.max_seq_len``) is where the context
    slides; pass a larger number to let a model without a position table (RoPE, ALiBi)
    run past it. A model with a sliding window in every self-attention layer and positions
    that are not a learned table does not slide by default: as Mistral's, its rolling cache
    goes on past ``spec.max_seq_len`` at the tokens' own positions, one token a step; only
    the last Σ(W − 1) + 1 tokens decide the next one, so a longer prompt is read from there
    (in chunks of ``spec.max_seq_len``) and, without the cache, each step reads those. A
    ``max_seq_len`` given slides it there all the same. ``repetition_penalty`` and ``no_repeat_ngram_size``: see
    :func:`penalize_repeats` (over the prompt and the tokens generated).

    On a CPU, :func:`specformer.components.lay_out_for_decoding` (``rows=B``) called once on the
    model beforehand can make each cached step faster, as ``specformer generate`` does."""
    _check_call(model, input_ids, max_new_tokens, kind="decoder", name="generate")
    _check_limits(model, n_candidates=n_candidates, max_seq_len=max_seq_len, eos_id=eos_id, pad_id=pad_id)
    _check_sampling(temperature, top_k, top_p)
    _check_penalties(repetition_penalty, no_repeat_ngram_size)
    reach = _rolling_reach(model) if max_seq_len is None else None
    if max_seq_len is None and reach is None:
        max_seq_len = _spec_max_seq_len(model)
    seq = input_ids
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"attention_mask must have the prompts' shape {tuple(input_ids.shape)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        if bool((attention_mask[:, -1] == 0).any()):
            raise ValueError(
                "attention_mask ends in padding: pad prompts on the left, so that every row's "
                "new tokens follow its last real token"
            )
    mask = attention_mask
    full_mask = attention_mask  # every token so far, for the penalties (mask slides with the context)
    done = torch.zeros(seq.shape[0], dtype=torch.bool, device=seq.device)
    cache: Any = None
    absolute = False  # a rolling model read from past its first token: positions are passed
    with _eval_mode(model):
        for i in range(max_new_tokens):
            too_long = max_seq_len is not None and seq.shape[1] > max_seq_len
            if use_cache and cache is not None and not too_long:
                positions = _positions(full_mask, seq.shape[1], 1, seq.device) if absolute else None
                logits = model(seq[:, -1:], attention_mask=mask, position_ids=positions,
                               cache=cache).logits  # (B, 1, V)
            elif reach is not None:
                # every layer has a window: the last `reach` tokens decide the next one, read at
                # their own positions, and the rolling cache goes on from there without an end
                context = seq[:, -reach:]
                absolute = context.shape[1] < seq.shape[1]
                mask = full_mask[:, -context.shape[1]:] if full_mask is not None else None
                positions = _positions(full_mask, seq.shape[1], context.shape[1], seq.device) if absolute else None
                cache = _sized_cache(use_cache, context.shape[1] + max_new_tokens - i - 1, None)
                logits = _prefill(model, context, mask, positions, cache, _spec_max_seq_len(model)).logits
                if not use_cache:
                    cache = None
            else:
                context = seq[:, -max_seq_len:] if max_seq_len is not None else seq
                window = mask[:, -context.shape[1]:] if mask is not None else None
                # only the last position's logits are sampled from: no (T, V) projection
                out = model(context, attention_mask=window, cache=_sized_cache(use_cache, context.shape[1] + (
                    max_new_tokens - i - 1), max_seq_len), use_cache=use_cache, logits_to_keep=1)
                cache, logits = out.cache, out.logits  # (B, 1, V)
                if mask is not None:
                    mask = window  # the cache covers the window only
            if use_cache and max_seq_len is not None and cache is not None and cache.length >= max_seq_len:
                cache = None  # full: the next step re-reads the last max_seq_len tokens
            allowed = allowed_tokens(seq[:, input_ids.shape[1]:]) if allowed_tokens is not None else None
            scores = penalize_repeats(_last_logits(logits, model, "generate"), seq, history_mask=full_mask,
                                      repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
            nxt = sample_next(scores, temperature=temperature, top_k=top_k,
                              top_p=top_p, generator=generator, n_candidates=n_candidates, allowed=allowed)
            nxt, stop = _end_where_none_left(nxt, eos_id)
            if stop:
                break
            nxt, done = _finish(nxt, done, eos_id, pad_id)
            if on_token is not None:
                on_token(nxt)
            seq = torch.cat([seq, nxt[:, None]], dim=1)  # (B, T + n)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
                full_mask = torch.cat([full_mask, full_mask.new_ones(full_mask.shape[0], 1)], dim=1)
            if eos_id is not None and bool(done.all()):  # without an end token no row is done
                break
    return seq


@_inference
def generate_seq2seq(
    model: nn.Module,
    input_ids: Tensor,
    *,
    start_id: int,
    eos_id: int | None,
    max_new_tokens: int,
    attention_mask: Tensor | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    n_candidates: int | None = None,
    max_len: int | None = None,
    on_token: Callable[[Tensor], None] | None = None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    forced_start_id: int | None = None,
    forced_end_id: int | None = None,
    pad_id: int | None = None,
) -> Tensor:
    """Decode sources (B, S) with an encoder-decoder; the encoder runs once. Returns the
    generated ids (B, N) without the start token ``start_id`` (the tokenizer's bos, or T5's
    pad: see ``training.objective.decoder_start``); a row that ended before the others goes on
    with ``pad_id`` (default ``eos_id``). Greedy by default; a ``top_k`` or ``top_p`` samples, at
    ``temperature`` 1 unless one is given. ``max_len`` caps the decoder sequence, start
    token included: by default a learned position table's length (``spec.max_seq_len``),
    and no cap for the other positional schemes. ``n_candidates`` and ``on_token``: see
    :func:`sample_next` and :func:`generate`; ``repetition_penalty`` and
    ``no_repeat_ngram_size``: :func:`penalize_repeats`, over the decoder's tokens (its start
    token included, as Hugging Face's). ``forced_start_id`` is the first generated token and
    ``forced_end_id`` the last one when the output reaches its length limit (the last of
    ``max_new_tokens``, or ``max_len``) without having ended, whatever the scores: Hugging
    Face's ``forced_bos_token_id`` and ``forced_eos_token_id`` (BART's ``<s>`` and ``</s>``)."""
    if temperature is None:  # greedy, unless a top-k or top-p asks to sample (at temperature 1)
        temperature = 1.0 if top_k is not None or top_p is not None else 0.0
    _check_call(model, input_ids, max_new_tokens, kind="encoder-decoder", name="generate_seq2seq")
    _check_limits(model, n_candidates=n_candidates, max_seq_len=max_len, eos_id=eos_id, max_seq_len_name="max_len",
                  pad_id=pad_id)
    _check_sampling(temperature, top_k, top_p)
    _check_penalties(repetition_penalty, no_repeat_ngram_size)
    if max_len is None:
        max_len = _learned_positions(model)
    if max_len is not None:
        max_new_tokens = min(max_new_tokens, max_len - 1)
    b = input_ids.shape[0]
    with _eval_mode(model):
        encoded = model.encode(input_ids, attention_mask)  # (B, S, D)
        seq = torch.full((b, 1), start_id, dtype=torch.long, device=input_ids.device)
        # a start token that is the end token (specformer's bpe and byte tokenizers start the decoder
        # from <|endoftext|>) is no repeat: in the history it would ban or penalise ending at all
        skip = int(start_id == eos_id)
        done = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
        cache: Any = _sized_cache(use_cache, max_new_tokens, None)  # the start token and N - 1 read back
        for step in range(max_new_tokens):
            if use_cache and cache is not None and cache.length:
                dec_in = seq[:, -1:]
            else:
                dec_in = seq
            out = model(
                attention_mask=attention_mask,
                decoder_input_ids=dec_in,
                encoder_hidden_states=encoded,
                cache=cache,
                use_cache=use_cache,
                logits_to_keep=1,
            )  # logits (B, 1, V)
            cache = out.cache
            scores = penalize_repeats(_last_logits(out.logits, model, "generate_seq2seq"), seq[:, skip:],
                                      repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
            scores = _forced(scores, forced_start_id if step == 0 else None)
            scores = _forced(scores, forced_end_id if step == max_new_tokens - 1 else None)
            nxt = sample_next(scores, temperature=temperature,
                              top_k=top_k, top_p=top_p, generator=generator, n_candidates=n_candidates)
            nxt, stop = _end_where_none_left(nxt, eos_id)
            if stop:
                break
            nxt, done = _finish(nxt, done, eos_id, pad_id)
            if on_token is not None:
                on_token(nxt)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            if eos_id is not None and bool(done.all()):  # without an end token no row is done
                break
    return seq[:, 1:]


# --------------------------------------------------------------------------- beam search


@_inference
def beam_search(
    model: nn.Module,
    input_ids: Tensor,
    *,
    num_beams: int,
    max_new_tokens: int,
    eos_id: int | None,
    attention_mask: Tensor | None = None,
    start_id: int | None = None,
    length_penalty: float = 1.0,
    early_stopping: bool = False,
    pad_id: int | None = None,
    n_candidates: int | None = None,
    allowed_tokens: Callable[[Tensor], Tensor | None] | None = None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    forced_start_id: int | None = None,
    forced_end_id: int | None = None,
    max_seq_len: int | None = None,
) -> Tensor:
    """The most likely continuation of each prompt found keeping the ``num_beams`` best
    partial sequences at every step, with the KV cache (reordered as beams are chosen).

    A decoder-only model continues prompts (B, T) and returns (B, T + N); an
    encoder-decoder (``start_id`` required: its decoder's start token) decodes sources
    (B, S) and returns (B, N) without the start token, as :func:`generate_seq2seq`.
    N ≤ ``max_new_tokens`` is the longest returned continuation; shorter ones end in
    ``eos_id`` and are filled with ``pad_id`` (default ``eos_id``).

    The search is Hugging Face's (``generate(num_beams=k, do_sample=False)``), to the
    token: a finished sequence scores its summed log-probabilities over its length
    ``** length_penalty``; ``early_stopping=False`` stops once no running beam can beat
    the finished ones by that measure at its current length, ``True`` as soon as
    ``num_beams`` sequences have finished. ``n_candidates`` and ``allowed_tokens`` (called
    with each beam's tokens so far, (B * num_beams, n)): see :func:`generate`.
    ``repetition_penalty`` and ``no_repeat_ngram_size`` apply to each beam's
    log-probabilities, as Hugging Face's do (:func:`penalize_repeats`); ``forced_start_id`` and
    ``forced_end_id`` (the first new token, and the last at ``max_new_tokens``) as in
    :func:`generate_seq2seq`. A decoder's beams do not slide: prompt and new tokens fit
    ``max_seq_len`` (default: the model's ``spec.max_seq_len``; a larger one lets a model
    without a position table run past it), except that a model with a sliding window in
    every layer runs on by default with its rolling cache, as in :func:`generate`."""
    _check_penalties(repetition_penalty, no_repeat_ngram_size)
    from specformer.components.cache import CacheNotFilledError

    kind = "encoder-decoder" if start_id is not None else "decoder"
    model_kind = getattr(getattr(model, "spec", None), "kind", None)
    if model_kind == "encoder-decoder" and start_id is None:
        raise ValueError("beam_search of an encoder-decoder needs start_id=, the token its decoder starts "
                         "from (decoder_start_id(tokenizer, spec.training.objective) gives it)")
    if model_kind == "decoder" and start_id is not None:
        raise ValueError("start_id is for an encoder-decoder, whose decoder starts from it: a decoder "
                         "continues its prompt; leave start_id out")
    _check_call(model, input_ids, max_new_tokens, kind=kind, name="beam_search")
    _check_limits(model, n_candidates=n_candidates, max_seq_len=max_seq_len, eos_id=eos_id, pad_id=pad_id)
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1 (1 is greedy), got {num_beams!r}")
    if not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty}")
    if not isinstance(early_stopping, bool):
        raise ValueError(f"early_stopping must be True or False, got {early_stopping!r} (transformers' 'never', "
                         "which searches on until no beam could still win, is not implemented)")
    b, k = input_ids.shape[0], num_beams
    if max_new_tokens == 0:  # nothing to search: the prompts (an encoder-decoder's empty outputs)
        return input_ids[:, :0] if start_id is not None else input_ids
    fill = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)
    dev = input_ids.device

    def expand(t: Tensor | None) -> Tensor | None:  # (B, ...) -> (B * k, ...), each row k times
        return None if t is None else t.repeat_interleave(k, dim=0)

    dropped = 0  # prompt tokens left unread (by a model with a window in every layer)
    with _eval_mode(model):
        if start_id is not None:
            mask = expand(attention_mask)
            encoded = expand(model.encode(input_ids, attention_mask))
            seq = torch.full((b, k, 1), start_id, dtype=torch.long, device=dev)

            def step(tokens: Tensor, cache: Any) -> Any:
                return model(attention_mask=mask, decoder_input_ids=tokens, encoder_hidden_states=encoded,
                             cache=cache, use_cache=True, logits_to_keep=1)
        else:
            reach = _rolling_reach(model) if max_seq_len is None else None
            limit = max_seq_len if max_seq_len is not None else None if reach is not None else _spec_max_seq_len(model)
            if limit is not None and input_ids.shape[1] + max_new_tokens > limit:
                raise ValueError(
                    f"beam search keeps every beam's context: prompt ({input_ids.shape[1]}) + max_new_tokens "
                    f"({max_new_tokens}) must fit max_seq_len ({limit})"
                )
            # a model with a window in every layer reads only the prompt's last `reach` tokens, at
            # their own positions, and its rolling cache goes on past max_seq_len
            dropped = max(0, input_ids.shape[1] - reach) if reach is not None else 0
            full_mask = expand(attention_mask)  # every token so far, for the positions
            mask = full_mask[:, dropped:] if full_mask is not None else None  # what the cache covers
            seq = input_ids[:, None, :].expand(b, k, -1).clone()

            def step(tokens: Tensor, cache: Any) -> Any:
                nonlocal mask, full_mask
                if cache.length == 0:  # the prompt
                    context = tokens[:, dropped:]
                    positions = _positions(full_mask, tokens.shape[1], context.shape[1], dev) if dropped else None
                    return _prefill(model, context, mask, positions, cache, _spec_max_seq_len(model) if reach else None)
                if mask is not None and full_mask is not None:  # past the prompt
                    mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
                    full_mask = torch.cat([full_mask, full_mask.new_ones(full_mask.shape[0], 1)], dim=1)
                total = dropped + cache.length + tokens.shape[1]
                positions = _positions(full_mask, total, tokens.shape[1], dev) if dropped else None
                return model(tokens, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                             logits_to_keep=1)

        prompt_len = seq.shape[-1]
        max_len = prompt_len + max_new_tokens
        keep = 2 * k  # candidates per row: enough that k go on when up to k of them end here
        running = torch.zeros(b, k, device=dev)
        running[:, 1:] = -1e9  # the k copies of a prompt: only the first starts
        finished = torch.full((b, k, max_len), fill, dtype=torch.long, device=dev)
        finished_scores = torch.full((b, k), -1e9, device=dev)
        finished_any = torch.zeros(b, k, dtype=torch.bool, device=dev)
        improvable = torch.ones(b, 1, dtype=torch.bool, device=dev)
        top_k_mask = torch.arange(keep, device=dev) < k
        offsets = torch.arange(b, device=dev)[:, None] * k
        try:
            out = step(seq.reshape(b * k, -1), _sized_cache(True, max_len - 1 - dropped, None))  # the last is not read
        except CacheNotFilledError as exc:
            raise CacheNotFilledError(
                f"beam search reorders a KV cache as beams are chosen, and {exc.detail}",
                "this model decodes without one, by sampling or greedily: generate(..., use_cache=False) "
                "(specformer generate --no-cache, without --num-beams)",
            ) from None
        cache = out.cache
        cur = prompt_len
        while cur < max_len:
            logits = _last_logits(out.logits, model, "beam_search").float()
            if n_candidates is not None and n_candidates < logits.shape[-1]:
                logits[:, n_candidates:] = float("-inf")
            allowed = allowed_tokens(seq[:, :, prompt_len:].reshape(b * k, -1)) if allowed_tokens else None
            if allowed is not None:
                allowed = allowed.to(device=dev, dtype=torch.bool)
                allowed = torch.nn.functional.pad(allowed, (0, logits.shape[-1] - allowed.shape[-1]), value=False)
                logits = logits.masked_fill(~allowed, float("-inf"))
            vocab = logits.shape[-1]
            history_mask = None
            if start_id is None and attention_mask is not None:  # the prompt's padding, then real tokens
                history_mask = torch.nn.functional.pad(expand(attention_mask), (0, cur - prompt_len), value=1)
            skip = int(start_id is not None and start_id == eos_id)  # as in generate_seq2seq
            logp = penalize_repeats(logits.log_softmax(-1), seq[:, :, skip:].reshape(b * k, -1), history_mask=history_mask,
                                    repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
            logp = _forced(logp, forced_start_id if cur == prompt_len else None)
            logp = _forced(logp, forced_end_id if cur + 1 == max_len else None)
            scores = (logp.view(b, k, vocab) + running[:, :, None]).view(b, k * vocab)
            cand_scores, cand = torch.topk(scores, keep, dim=-1)  # (B, 2k)
            source, token = cand // vocab, cand % vocab
            cand_seq = torch.cat([seq.gather(1, source[:, :, None].expand(-1, -1, cur)), token[:, :, None]], dim=-1)
            ends = torch.full_like(token, cur + 1 >= max_len, dtype=torch.bool)
            if eos_id is not None:
                ends |= token == eos_id
            # the k best candidates that go on
            go_on = torch.topk(cand_scores + ends.float() * -1e9, k, dim=-1).indices  # (B, k)
            seq = cand_seq.gather(1, go_on[:, :, None].expand(-1, -1, cur + 1))
            running = (cand_scores + ends.float() * -1e9).gather(1, go_on)
            beam_source = source.gather(1, go_on)
            # those among the top k that end join the finished ones, scored by their length
            new = cand_scores / ((cur + 1 - prompt_len) ** length_penalty)
            full = finished_any.all(-1, keepdim=True) & early_stopping
            new = new + (full | ~improvable).float() * -1e9 + (~(ends & top_k_mask)).float() * -1e9
            padded = torch.nn.functional.pad(cand_seq, (0, max_len - cur - 1), value=fill)
            merged_scores = torch.cat([finished_scores, new], dim=1)
            best = torch.topk(merged_scores, k, dim=-1).indices
            finished = torch.cat([finished, padded], dim=1).gather(1, best[:, :, None].expand(-1, -1, max_len))
            finished_scores = merged_scores.gather(1, best)
            finished_any = torch.cat([finished_any, ends & top_k_mask], dim=1).gather(1, best)
            cur += 1
            # can a running beam still beat the worst finished one, at its current length?
            best_running = running[:, :1] / ((cur - prompt_len) ** length_penalty)
            worst = torch.where(finished_any, finished_scores.min(-1, keepdim=True).values, -1e9)
            improvable = improvable & (best_running > worst).any(-1, keepdim=True)
            open_beam = not (bool(finished_any.all()) and early_stopping)
            if not (bool(improvable.any()) and open_beam and not bool(ends.all())):
                break
            cache.reorder((beam_source + offsets).reshape(-1))
            out = step(seq[:, :, -1].reshape(b * k, 1), cache)
    best_seq = finished[:, 0]  # (B, max_len): each row's finished sequences are kept best first
    best_seq = best_seq[:, : prompt_len + _generated_length(best_seq, prompt_len, eos_id)]
    return best_seq[:, 1:] if start_id is not None else best_seq


def _generated_length(seq: Tensor, prompt_len: int, eos_id: int | None) -> int:
    """The longest continuation among the rows of ``seq`` (B, L): each ends at its first
    ``eos_id`` (included) after the prompt, or runs to L."""
    gen = seq[:, prompt_len:]
    if eos_id is None:
        return gen.shape[1]
    is_eos = gen == eos_id
    has = is_eos.any(-1)
    first = torch.where(has, is_eos.int().argmax(-1) + 1, torch.full_like(has, gen.shape[1], dtype=torch.long))
    return int(first.max())


# --------------------------------------------------------------------------- prompts


@dataclass
class Prompt:
    """A prompt's ids for :func:`generate`, and what healing its end left to the model.

    ``healed`` is the trailing whitespace taken off the text before encoding ('' when none);
    ``allowed_tokens`` (for :func:`generate`) then has the first new tokens spell it out, so
    the model chooses how the whitespace joins the next word (`` the``, ``\\n    return``)
    instead of continuing a lone whitespace token it rarely saw in training."""

    ids: list[int]
    healed: str = ""
    allowed_tokens: Callable[[Tensor], Tensor | None] | None = None


def encode_prompt(tokenizer: Any, text: str, *, heal: bool = True) -> Prompt:
    """``text`` encoded for :func:`generate`, framed by the tokenizer's own template and its
    trailing whitespace healed.

    A ``tokenizer.json`` whose post-processor adds special tokens (Llama's ``<s>`` before the
    text) gets them here, as ``transformers``' ``tokenizer(text)`` adds them by default: the
    model was trained on text that starts so. specformer's own tokenizers have no template.

    A byte-level BPE (GPT-2's, and the one ``specformer train`` learns) puts a word's space
    at its start (`` model``), and SentencePiece (Llama's) its ▁, so text ending in a space
    encodes that space as a token of its own, which training text rarely has before a word:
    "The model " is continued worse than "The model". With ``heal`` (and a subword
    tokenizer: the byte tokenizer saw each space as the byte it is) the whitespace is taken
    off and the first new tokens are held to those that spell it, e.g. `` is``, after which
    sampling is free (token healing). A template that puts tokens after the text (an
    end-of-sequence) leaves nothing to heal: such a prompt is encoded as it is. An empty
    prompt (or one of whitespace only) starts from the template's tokens (``<s>``), else
    from the end-of-text token, as a document does."""
    if not isinstance(text, str):
        raise TypeError(f"encode_prompt takes the prompt's text, a str; got a {type(text).__name__} (ids go "
                        "straight to generate as torch.tensor([ids]))")
    if (lone := re.search("[\ud800-\udfff]", text)) is not None:  # no tokenizer encodes one
        raise ValueError(f"the prompt holds a lone surrogate (U+{ord(lone.group()):04X}, character {lone.start() + 1}): "
                         "text decoded from bytes that are not UTF-8 with errors='surrogateescape' (as sys.argv "
                         "and os.environ are); decode the bytes as what they are, e.g. data.decode('latin-1')")
    if not heal or not _heals(tokenizer, text):
        ids = _framed(tokenizer, tokenizer.encode(text))
        return Prompt(ids=ids or _start(tokenizer))
    stripped = text.rstrip()
    ids = _framed(tokenizer, tokenizer.encode(stripped)) or _start(tokenizer)
    texts = _token_texts(tokenizer, ids[-8:])
    trailing = text[len(stripped):]
    return Prompt(ids=ids, healed=trailing, allowed_tokens=_Spelling(texts, trailing))


def chat_prompt(
    tokenizer: Any, text: str | Sequence[dict[str, Any]], template: Any, *, system: str | None = None
) -> Prompt:
    """``text`` as a user turn of ``template`` (a :class:`~specformer.data.chat.ChatTemplate`,
    e.g. ``chat_template_for(spec.training, tokenizer)``), after a ``system`` turn when given,
    followed by its generation prompt, in token ids: ``tokenizer.apply_chat_template([{"role":
    "system", "content": system}, {"role": "user", "content": text}], add_generation_prompt=True)``'s
    ids, which an instruct model continues with its answer. ``text`` may be a list of turns
    instead, a conversation so far (``[{"role": "user", "content": ...}, {"role": "assistant",
    ...}, ...]``), rendered as it is after the ``system`` turn when it has none. The template
    frames the text, so nothing is healed or added."""
    return Prompt(ids=template.prompt_ids(tokenizer, text, system=system))


def _heals(tokenizer: Any, text: str) -> bool:
    """Whether :func:`encode_prompt` heals ``text``: it ends in whitespace, the tokenizer is a
    subword one, and its template puts nothing after the text."""
    from specformer.data.tokenizers import HFTokenizer

    return text != text.rstrip() and isinstance(tokenizer, HFTokenizer) and not tokenizer.template()[1]


def _framed(tokenizer: Any, ids: list[int]) -> list[int]:
    """``ids`` in the tokenizer's template; an empty text stays empty when it adds nothing."""
    return tokenizer.with_template(ids) if hasattr(tokenizer, "with_template") else ids


def _start(tokenizer: Any) -> list[int]:
    return [tokenizer.eot_id] if getattr(tokenizer, "eot_id", None) is not None else []


def _token_texts(tokenizer: Any, context: Sequence[int]) -> list[str]:
    """The text each id of the vocabulary adds after ``context`` (decoded with it, less its
    own text: alone, a SentencePiece token drops the space that opens the text)."""
    context = list(context)
    head = tokenizer.decode(context)
    rows = [[*context, i] for i in range(tokenizer.vocab_size)]
    wholes = tokenizer.tok.decode_batch(rows, skip_special_tokens=False)
    return [w[len(head):] if w.startswith(head) else "" for w in wholes]


class _Spelling:
    """``allowed_tokens`` for :func:`generate` that holds the first new tokens of each row to
    those that spell ``text``: a token that starts with what is left of it (`` is`` for
    " "), or that what is left starts with (``\\n`` of "\\n    "); free once it is spelt."""

    def __init__(self, texts: Sequence[str], text: str) -> None:
        self.texts, self.text = list(texts), text
        self._masks: dict[str, Tensor] = {}

    def __repr__(self) -> str:
        return f"tokens spelling {self.text!r}"

    def _mask(self, left: str) -> Tensor | None:
        if left not in self._masks:
            ok = [bool(t) and (t.startswith(left) or left.startswith(t)) for t in self.texts]
            self._masks[left] = torch.tensor(ok, dtype=torch.bool)
        mask = self._masks[left]
        return mask if bool(mask.any()) else None  # (never empty: the whitespace's own tokens spell it)

    def _left(self, row: Sequence[int]) -> str:
        left = self.text
        for i in row:
            if not left:
                break
            t = self.texts[i] if 0 <= i < len(self.texts) else ""
            left = left[len(t):] if left.startswith(t) and t else ""
        return left

    def __call__(self, new: Tensor) -> Tensor | None:
        # each token spells at least a character of the text, or ends the spelling: after as many
        # tokens as it has characters every row is free, and the tokens need not be read again
        if new.shape[1] >= len(self.text):
            return None
        lefts = [self._left(row) for row in new.tolist()]
        if not any(lefts):
            return None
        masks = []
        for left in lefts:
            mask = self._mask(left) if left else None
            masks.append(mask if mask is not None else torch.ones(len(self.texts), dtype=torch.bool))
        return torch.stack(masks)
