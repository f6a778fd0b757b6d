"""Lightning's checkpoint I/O for specformer's runs: atomic writes, ``weights_only`` reads.
Apart from :mod:`specformer.training.checkpoint`, which reads checkpoints without Lightning."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from specformer.training.checkpoint import read_checkpoint, write_checkpoint

__all__ = ["AtomicCheckpointIO"]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O, with atomic writes and ``weights_only`` reads."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically (:func:`~specformer.training.checkpoint.write_checkpoint`)."""
        write_checkpoint(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return read_checkpoint(path, map_location=map_location or "cpu")
