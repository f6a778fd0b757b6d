"""Key/value cache for incremental decoding.

Shape legend: B batch, Hkv key/value heads, L cached positions, C capacity
(allocated positions, C >= L), Dh head size, S source (encoder) length.

One :class:`KVCache` serves a whole model: self-attention keys and values of the
decoder stack, layer by layer, grow as tokens are decoded; cross-attention keys and
values (encoder-decoder) are computed once from the encoder output and reused.
Storage grows by doubling, so decoding N tokens copies O(N) elements in total
instead of the O(N^2) of concatenating at every step.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KVCache"]


class KVCache:
    """Past keys and values, per layer, for incremental decoding.

    Pass it back into the model with the next tokens::

        out = model(prompt_ids, use_cache=True)       # a new cache, filled with the prompt
        out = model(next_ids, cache=out.cache)         # appends; out.cache is the same object

    ``length`` is the number of positions already cached (the position of the next
    token). The model updates the cache in place; ``reorder`` (beam search) and
    ``crop`` (speculative decoding, rewinding) edit it between steps.
    """

    def __init__(self) -> None:
        self._keys: dict[int, Tensor] = {}  # layer -> (B, Hkv, C, Dh)
        self._values: dict[int, Tensor] = {}
        self._lengths: dict[int, int] = {}
        self._cross: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> (B, Hkv, S, Dh) each

    # ------------------------------------------------------------------ reading

    @property
    def length(self) -> int:
        """Positions cached by self-attention (0 for an empty cache)."""
        return self._lengths.get(min(self._lengths), 0) if self._lengths else 0

    def __len__(self) -> int:
        return self.length

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
        """The cached keys of ``layer``: (B, Hkv, L, Dh)."""
        return self._keys[layer][:, :, : self._lengths[layer]]

    def values(self, layer: int) -> Tensor:
        """The cached values of ``layer``: (B, Hkv, L, Dh)."""
        return self._values[layer][:, :, : self._lengths[layer]]

    def cross(self, layer: int) -> tuple[Tensor, Tensor] | None:
        """Cached cross-attention (keys, values) of ``layer``, or None before the first step."""
        return self._cross.get(layer)

    # ------------------------------------------------------------------ writing (called by attention)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k``, ``v`` (B, Hkv, T, Dh) to ``layer``; return all keys and values (B, Hkv, L+T, Dh)."""
        old = self._lengths.get(layer, 0)
        new = old + k.shape[2]
        buf_k = self._keys.get(layer)
        if buf_k is None or buf_k.shape[2] < new:
            capacity = max(new, 2 * (buf_k.shape[2] if buf_k is not None else 0), 16)
            buf_k = self._grow(self._keys.get(layer), k, capacity, old)
            buf_v = self._grow(self._values.get(layer), v, capacity, old)
            self._keys[layer], self._values[layer] = buf_k, buf_v
        buf_v = self._values[layer]
        buf_k[:, :, old:new] = k
        buf_v[:, :, old:new] = v
        self._lengths[layer] = new
        return buf_k[:, :, :new], buf_v[:, :, :new]

    def set_cross(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Store the cross-attention keys and values (B, Hkv, S, Dh) of ``layer``."""
        self._cross[layer] = (k, v)

    @staticmethod
    def _grow(old: Tensor | None, like: Tensor, capacity: int, used: int) -> Tensor:
        b, h, _, d = like.shape
        buf = like.new_empty(b, h, capacity, d)
        if old is not None and used:
            buf[:, :, :used] = old[:, :, :used]
        return buf

    # ------------------------------------------------------------------ editing between steps

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on (rewind after a rejected draft)."""
        if length < 0 or length > self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
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
