"""How many positions a sliding-window layer's KV cache holds: one formula for the cache
(:class:`specformer.components.cache.KVCache`) and for ``show``/``diff``, in a module that
imports neither torch nor the spec schema (a plugin may import the components before it
registers its types, and the analysis runs without torch)."""

from __future__ import annotations

__all__ = ["window_positions", "window_slack"]


def window_slack(window: int) -> int:
    """Room a sliding-window KV cache keeps beyond its W - 1 positions before it compacts."""
    return min(window, 128)


def window_positions(window: int) -> int:
    """The most positions a layer with a sliding ``window`` W stores in its KV cache, however
    long the sequence: the W - 1 a later query can see, plus min(W, 128) of room to append
    before they move to a fresh buffer."""
    return window - 1 + window_slack(window)
