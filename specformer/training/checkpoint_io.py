"""Lightning's checkpoint I/O for specformer's runs: atomic writes, ``weights_only`` reads.
Apart from :mod:`specformer.training.checkpoint`, which reads checkpoints without Lightning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from specformer.data.cache import atomic_file, locked
from specformer.training.checkpoint import _os_error, ctrl_c_after, read_checkpoint

__all__ = ["AtomicCheckpointIO"]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O, with atomic writes and ``weights_only`` reads."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically; a failed write (a full disk, a read-only
        folder) raises the ``OSError`` that caused it, naming ``path``, and leaves ``path`` as it was.

        The write holds a shared lock on the folder: :func:`remove_stale_temporaries` removes
        only the temporary files of writes that no live process holds."""
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with locked(Path(path).parent, shared=True), atomic_file(path) as f:
                with ctrl_c_after():
                    torch.save(checkpoint, f)
        except (OSError, RuntimeError) as exc:
            # torch.save reports a failed write as "[enforce fail at inline_container.cc] unexpected pos"
            cause = _os_error(exc)
            if cause is None:
                raise
            raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from exc

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return read_checkpoint(path, map_location=map_location or "cpu")
