"""Key/value cache for incremental decoding.

Shape legend: B batch, Hkv key/value heads, L cached positions, C capacity
(allocated positions, C >= L), Dh head size, S source (encoder) length.

One :class:`KVCache` serves a whole model: self-attention keys and values of the
decoder stack, layer by layer, grow as tokens are decoded; cross-attention keys and
values (encoder-decoder) are computed once from the encoder output and reused.
Storage grows by doubling, so decoding N tokens copies O(N) elements in total
instead of the O(N^2) of concatenating at every step; a cache told the length it will
reach (``KVCache(max_length=...)``, as generation does) never allocates past it.

A layer with a sliding window W (Beltagy et al. 2020; Mistral) is a rolling buffer:
between steps it keeps only the last W - 1 positions, the oldest any later query can
see. Its storage is at most W - 1 + slack positions (slack = min(W, 128):
:func:`window_positions`); when the slack is used up, the last W - 1 positions move to a
fresh buffer, a copy of W - 1 positions every ``slack`` tokens. A prompt (or chunk) longer
than that is read where it is and only its last W - 1 positions are stored. Memory stays
O(W) however long the sequence.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specformer.specs.window import window_positions, window_slack

__all__ = ["KVCache", "CacheNotFilledError", "window_positions"]


class CacheNotFilledError(ValueError):
    """A layer's self-attention left the cache unfilled (an attention module that does not
    call :meth:`KVCache.update`): the model decodes only without a cache. ``detail`` says
    which layer, without the remedy the message ends with."""

    def __init__(self, detail: str, remedy: str) -> None:
        super().__init__(f"{detail}; {remedy}")
        self.detail = detail


class KVCache:
    """Past keys and values, per layer, for incremental decoding.

    Pass it back into the model with the next tokens::

        out = model(prompt_ids, use_cache=True)       # a new cache, filled with the prompt
        out = model(next_ids, cache=out.cache)         # appends; out.cache is the same object

    ``length`` is the number of positions already cached (the position of the next
    token). The model updates the cache in place; ``reorder`` (beam search) and
    ``crop`` (speculative decoding, rewinding) edit it between steps.

    ``max_length``, when the caller knows it (a generation's prompt plus new tokens), is
    the most positions the cache will be asked to hold: storage doubles up to it but not
    past it, so a layer allocates at most ``max_length`` positions instead of up to twice
    as many (past it, storage grows by doubling again).
    """

    def __init__(self, max_length: int | None = None) -> None:
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be at least 1, got {max_length}")
        self.max_length = max_length
        self._keys: dict[int, Tensor] = {}  # layer -> (B, Hkv, C, Dh)
        self._values: dict[int, Tensor] = {}
        self._lengths: dict[int, int] = {}  # layer -> positions seen (absolute end)
        self._starts: dict[int, int] = {}  # layer -> absolute position of storage index 0
        self._windows: dict[int, int | None] = {}
        self._cross: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> (B, Hkv, S, Dh) each

    # ------------------------------------------------------------------ reading

    @property
    def length(self) -> int:
        """Positions cached by self-attention (0 for an empty cache)."""
        return self._lengths.get(min(self._lengths), 0) if self._lengths else 0

    def __len__(self) -> int:
        return self.length

    def layer_length(self, layer: int) -> int:
        """Positions ``layer``'s self-attention has cached (0 before it stored any)."""
        return self._lengths.get(layer, 0)

    @property
    def n_layers(self) -> int:
        """Layers with cached self-attention keys and values."""
        return len(self._lengths)

    @property
    def batch_size(self) -> int | None:
        for k in self._keys.values():
            return k.shape[0]
        for k, _ in self._cross.values():
            return k.shape[0]
        return None

    def keys(self, layer: int) -> Tensor:
        """The cached keys of ``layer``: (B, Hkv, L', Dh), positions ``first_position(layer)``
        to ``length - 1`` (L' = L unless the layer has a sliding window)."""
        return self._keys[layer][:, :, : self._lengths[layer] - self._starts[layer]]

    def values(self, layer: int) -> Tensor:
        """The cached values of ``layer``: (B, Hkv, L', Dh), as :meth:`keys`."""
        return self._values[layer][:, :, : self._lengths[layer] - self._starts[layer]]

    def first_position(self, layer: int) -> int:
        """The absolute position of ``keys(layer)[:, :, 0]``: 0 unless a sliding window
        has dropped older positions."""
        return self._starts[layer]

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors the cache holds: self-attention storage (allocated positions,
        not only those in use) and cross-attention keys and values."""
        stored = [*self._keys.values(), *self._values.values(), *(t for kv in self._cross.values() for t in kv)]
        return sum(t.numel() * t.element_size() for t in stored)

    def cross(self, layer: int) -> tuple[Tensor, Tensor] | None:
        """Cached cross-attention (keys, values) of ``layer``, or None before the first step."""
        return self._cross.get(layer)

    # ------------------------------------------------------------------ writing (called by attention)

    def update(self, layer: int, k: Tensor, v: Tensor, window: int | None = None) -> tuple[Tensor, Tensor]:
        """Append ``k``, ``v`` (B, Hkv, T, Dh) to ``layer``; return the keys and values the new
        queries attend to (B, Hkv, S, Dh): all L + T positions, or with a sliding ``window``
        W the positions from max(0, L - (W - 1)) on (the oldest the first new query sees)."""
        if window is not None:
            return self._update_window(layer, k, v, window)
        t = k.shape[2]
        old = self._lengths.get(layer, 0)
        buf_k, buf_v = self._keys.get(layer), self._values.get(layer)
        if buf_k is None or buf_k.shape[2] < old + t:
            capacity = max(old + t, 2 * (buf_k.shape[2] if buf_k is not None else 0), 16)
            if self.max_length is not None and old + t <= self.max_length:  # no room past the last position
                capacity = min(capacity, self.max_length)
            buf_k = self._grow(buf_k, k, capacity, 0, old)
            buf_v = self._grow(buf_v, v, capacity, 0, old)
        buf_k.narrow(2, old, t).copy_(k)  # narrow: one operation where indexing takes three
        buf_v.narrow(2, old, t).copy_(v)
        self._keys[layer], self._values[layer] = buf_k, buf_v
        self._lengths[layer], self._starts[layer], self._windows[layer] = old + t, 0, None
        return buf_k.narrow(2, 0, old + t), buf_v.narrow(2, 0, old + t)

    def _update_window(self, layer: int, k: Tensor, v: Tensor, window: int) -> tuple[Tensor, Tensor]:
        """:meth:`update` of a layer with a sliding window: a rolling buffer of at most
        :func:`window_positions` (W - 1 + min(W, 128)) positions."""
        t = k.shape[2]
        old = self._lengths.get(layer, 0)
        start = self._starts.get(layer, 0)
        end = old + t
        first = max(start, old - (window - 1))  # the oldest stored key a new query sees
        room = window_positions(window)
        buf_k, buf_v = self._keys.get(layer), self._values.get(layer)
        if buf_k is not None and end - start <= buf_k.shape[2]:  # room to append in place
            buf_k[:, :, old - start : end - start] = k
            buf_v[:, :, old - start : end - start] = v
            seen_k, seen_v = buf_k[:, :, first - start : end - start], buf_v[:, :, first - start : end - start]
        elif end - first <= room:  # a fresh buffer holds what the new queries see, plus slack to append
            capacity = self._clamped(min(room, end - first + window_slack(window)), first, end)
            buf_k = self._grow(buf_k, k, capacity, first - start, old - start)
            buf_v = self._grow(buf_v, v, capacity, first - start, old - start)
            start = first
            buf_k[:, :, old - start : end - start] = k
            buf_v[:, :, old - start : end - start] = v
            seen_k, seen_v = buf_k[:, :, : end - start], buf_v[:, :, : end - start]
        else:  # more than the buffer holds (a long prompt or chunk): the queries read the keys where
            # they are, and the buffer keeps the last W - 1, the oldest any later query sees
            if old > first:
                seen_k = torch.cat([buf_k[:, :, first - start : old - start], k], dim=2)
                seen_v = torch.cat([buf_v[:, :, first - start : old - start], v], dim=2)
            else:
                seen_k, seen_v = k, v
            keep = window - 1
            start = end - keep
            capacity = self._clamped(room, start, end)
            n = seen_k.shape[2]
            buf_k = self._grow(seen_k, k, capacity, n - keep, n)
            buf_v = self._grow(seen_v, v, capacity, n - keep, n)
        self._keys[layer], self._values[layer] = buf_k, buf_v
        self._lengths[layer], self._starts[layer], self._windows[layer] = end, start, window
        return seen_k, seen_v

    def _clamped(self, capacity: int, start: int, end: int) -> int:
        """``capacity`` for a buffer from position ``start``, no larger than ``max_length`` needs."""
        if self.max_length is not None and end <= self.max_length:  # no room past the last position
            capacity = min(capacity, self.max_length - start)
        return max(capacity, end - start)

    def set_cross(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Store the cross-attention keys and values (B, Hkv, S, Dh) of ``layer``."""
        self._cross[layer] = (k, v)

    @staticmethod
    def _grow(old: Tensor | None, like: Tensor, capacity: int, begin: int, end: int) -> Tensor:
        """A new (B, Hkv, capacity, Dh) buffer starting with ``old[:, :, begin:end]``."""
        b, h, _, d = like.shape
        buf = like.new_empty(b, h, capacity, d)
        if old is not None and end > begin:
            buf[:, :, : end - begin] = old[:, :, begin:end]
        return buf

    # ------------------------------------------------------------------ editing between steps

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on (rewind after a rejected draft)."""
        if length < 0 or length > self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        for layer, window in self._windows.items():
            if window is not None and max(0, length - (window - 1)) < self._starts[layer]:
                raise ValueError(
                    f"cannot crop to {length}: layer {layer} has a sliding window of {window} and "
                    f"keeps positions from {self._starts[layer]} on, but a query at {length} sees "
                    f"positions from {length - (window - 1)} on"
                )
        for layer in self._lengths:
            self._lengths[layer] = min(self._lengths[layer], length)

    def reorder(self, index: Tensor) -> None:
        """Select batch rows ``index`` (B',) everywhere, e.g. the surviving beams."""
        for layer in self._keys:
            self._keys[layer] = self._keys[layer].index_select(0, index)
            self._values[layer] = self._values[layer].index_select(0, index)
        for layer, (k, v) in self._cross.items():
            self._cross[layer] = (k.index_select(0, index), v.index_select(0, index))

    def to(self, device: torch.device | str) -> KVCache:
        """Move every cached tensor to ``device`` (in place); return self."""
        for store in (self._keys, self._values):
            for layer, t in store.items():
                store[layer] = t.to(device)
        for layer, (k, v) in self._cross.items():
            self._cross[layer] = (k.to(device), v.to(device))
        return self

    def __repr__(self) -> str:
        return f"KVCache(length={self.length}, layers={self.n_layers}, cross={len(self._cross)})"

