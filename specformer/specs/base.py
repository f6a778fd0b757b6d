"""The base class of every spec model, importable by plugins without the full schema."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Spec"]


class Spec(BaseModel):
    """A frozen pydantic model that refuses unknown keys.

    Every node of a specformer spec derives from this: a typo is an error, never a
    silently ignored setting, and a validated spec can be hashed and shared.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
