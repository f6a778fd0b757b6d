"""The base class of every spec model, importable by plugins without the full schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Spec", "family_union", "FAMILY_DEFAULTS", "rebuild_models"]

# family -> the type a mapping without ``type:`` is (filled in by family_union)
FAMILY_DEFAULTS: dict[str, str] = {}


class Spec(BaseModel):
    """A frozen pydantic model that refuses unknown keys.

    Every node of a specformer spec derives from this: a typo is an error, never a
    silently ignored setting, and a validated spec can be hashed and shared. Numbers
    are finite: ``std: .inf`` (or ``eps: 1e400``) is an error, not a model of NaNs.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False
    )

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied, validated.

        pydantic's own ``model_copy(update=...)`` sets the values unchecked, which would
        let ``vocab_size=-5``, a typo'd field or a broken cross-field rule reach the
        builder; here what the spec was given, with the update, goes through validation
        like any other spec (a :class:`~specformer.specs.errors.SpecError` for a whole
        ``ModelSpec``), as ``load_spec(source, overrides=[...])`` does. So the sizes it
        derived (``head_dim``, ``d_ff``, the tokenizer's ``vocab_size``, ...) are derived
        again: ``update={"d_model": 256}`` gives the new width's ``head_dim`` and
        ``d_ff``, and sizes that were written keep their values. A resolved spec (a run's
        ``spec.yaml``, ``to_yaml()``) has every size written.

        A dict given for a field that holds a spec merges into it key by key, as
        ``extends`` and ``--set`` merge (a different ``type:`` replaces it, keeping the
        sizes every type of its family has): ``update={"ffn": {"d_ff": 1024}}`` keeps a
        GLU's type, activation and bias. A spec object (``spec.decoder.model_copy(...)``)
        or any other value replaces the field."""
        if not update:
            return super().model_copy(deep=deep)
        from specformer.specs.merge import deep_merge

        own_type = getattr(self, "type", None)
        if "type" in update and own_type is not None and update["type"] != own_type:
            from specformer.registry import FAMILIES, REGISTRY
            from specformer.specs.errors import SpecError, SpecProblem

            field = next((f for f in FAMILIES if any(e.spec is type(self) for e in REGISTRY.entries(f).values())),
                         "field")
            raise SpecError([SpecProblem(
                f"{type(self).__name__} is type {own_type!r}; a copy of it cannot become {update['type']!r}",
                path="type",
                hint=("copy the spec that holds it, with a dict for this one, which may change its type: "
                      f"parent.model_copy(update={{{field!r}: {{'type': {update['type']!r}}}}})"),
            )])
        data = self.model_dump(exclude_unset=True)
        for key, value in update.items():
            current = getattr(self, key, None) if isinstance(key, str) else None
            if isinstance(value, Mapping) and isinstance(current, Spec):
                written = data.get(key, {})
                value = deep_merge(written, dict(value), key)
            data[key] = value
        return self._validated(data)

    def __str__(self) -> str:
        """``print(spec.decoder)``: the part's fields as YAML, as they read in a spec file
        (``specformer validate`` prints a whole spec so); ``repr()`` stays pydantic's."""
        from specformer.specs.loader import dump_yaml

        return dump_yaml(self.model_dump(mode="json")).rstrip("\n")  # print() ends the line

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """How IPython and Jupyter show a spec: its fields as YAML (what ``specformer validate``
        prints) after a comment naming its class, not pydantic's one line of every field; the
        text loads back as the spec. ``repr()`` stays pydantic's."""
        from specformer.specs.loader import dump_yaml

        p.text(f"# {type(self).__name__}\n" + dump_yaml(self.model_dump(mode="json")).rstrip("\n"))

    @classmethod
    def _validated(cls, data: dict[str, Any]) -> Self:
        from pydantic import ValidationError

        from specformer.specs.errors import SpecError, SpecProblem

        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            from specformer.specs.loader import _describe, _dotted

            # read as a whole spec's problems are: allowed values, "did you mean"
            problems = [
                SpecProblem(message, path=_dotted(path), hint=hint)
                for err in exc.errors(include_url=False)
                for path, message, hint in _describe(err, cls)
            ]
            raise SpecError(problems) from None


def family_union(family: str, default: str | None = None) -> Any:
    """The discriminated union of a registry family's spec classes, selected by ``type``.

    A mapping without ``type:`` is ``default`` (when not given, the family's first
    built-in type, else its first registered one), which keeps short specs short:
    ``norm: {eps: 1e-6}`` is a layernorm.
    """
    from specformer.registry import REGISTRY

    entries = REGISTRY.entries(family)
    REGISTRY.mark_built(family)
    fallback = default if default is not None else REGISTRY.builtin_defaults.get(family, next(iter(entries)))
    FAMILY_DEFAULTS[family] = fallback
    if len(entries) == 1:
        return next(iter(entries.values())).spec

    def pick(value: Any) -> Any:
        if isinstance(value, dict):
            return value.get("type", fallback)
        return getattr(value, "type", None)

    members = tuple(Annotated[e.spec, Tag(name)] for name, e in entries.items())
    return Annotated[Union[members], Discriminator(pick)]  # noqa: UP007


def rebuild_models(models: tuple[type[BaseModel], ...], unions: tuple[str, ...]) -> None:
    """Complete ``models`` again, in this order (a model before the models that hold it),
    with what the names ``unions`` are now in their modules (family unions made again, with
    a type registered after the first): pydantic evaluates a field's annotation once, when
    its class is made. A field written with one of those names (its annotation a string, as
    ``from __future__ import annotations`` keeps it) is typed from that string again; the
    rest of the field (default, description, constraints) stays as it was."""
    import copy
    import re
    import sys

    from pydantic.fields import FieldInfo

    named = re.compile(r"\b(?:" + "|".join(map(re.escape, unions)) + r")\b")
    for model in models:
        written = model.__dict__.get("__annotations__", {})
        namespace = vars(sys.modules[model.__module__])
        fields = model.__pydantic_fields__
        for name, info in list(fields.items()):
            text = written.get(name)
            if not (isinstance(text, str) and named.search(text)):
                continue
            # `FFNSpec | None` as pydantic read it when the class was made, with today's FFNSpec
            fresh = FieldInfo.from_annotation(eval(text, namespace))  # noqa: S307 (the class's own source)
            info = copy.copy(info)  # a subclass that inherited this FieldInfo keeps it
            info.annotation = fresh.annotation
            # the old union's discriminator (a top-level union's, kept as metadata) gives way to the new one's
            info.metadata = [*fresh.metadata, *(m for m in info.metadata if not isinstance(m, Discriminator))]
            fields[name] = info
        model.model_rebuild(force=True)
