"""The registry: the one switch between a YAML ``type:`` name and the code it builds.

Each *family* (attention, positional, ffn, norm, head, objective, data, tokenizer,
schedule, ...) maps a type name to an :class:`Entry` that pairs

* the pydantic spec class selected by its ``type`` literal (so every family is a
  discriminated union with exact errors and a JSON Schema), and
* the *target* that the builder instantiates from it: a class or callable, or a
  ``"package.module:attr"`` string resolved lazily, so that importing the schema
  never imports torch.

The set of registered names is the set of valid ``type:`` values. Third-party
packages add entries through the ``specformer.plugins`` entry-point group: each
entry point names a callable that receives the :data:`REGISTRY` and registers
its entries. YAML itself can never name an import path.

This module imports neither torch nor the schema.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Entry",
    "Registry",
    "REGISTRY",
    "register",
    "PLUGIN_GROUP",
    "FAMILIES",
    "REQUIRED_FIELDS",
    "load_plugins",
    "PluginError",
    "TargetCallError",
    "register_builtin",
]

PLUGIN_GROUP = "specformer.plugins"

# the families a spec reads a `type:` from; an entry anywhere else could never be selected
FAMILIES: tuple[str, ...] = (
    "attention",
    "positional",
    "ffn",
    "norm",
    "head",
    "objective",
    "optimizer",
    "schedule",
    "data",
    "tokenizer",
)

# fields the schema and the builder read from every spec of a family, whatever its type
REQUIRED_FIELDS: dict[str, dict[str, str]] = {
    "attention": {
        "n_heads": "int = 8",
        "n_kv_heads": "int | None = None (filled with n_heads)",
        "head_dim": "int | None = None (filled with d_model // n_heads)",
        "sliding_window": "int | None = None",
    },
    "norm": {
        "placement": 'Literal["pre", "post", "sandwich", "output"] = "pre"',
        "final": "bool | None = None (filled from placement)",
    },
    # the schedule is a multiplier of it (training.schedule gets it as base_lr)
    "optimizer": {"lr": "float (the peak learning rate)"},
}

# families whose types the rest of specformer handles one by one: no new type can work there
BUILT_IN_ONLY: dict[str, str] = {
    "objective": "objectives are built in (causal_lm, masked_lm, seq2seq, sft, classification): the data "
    "pipeline prepares "
    "the batches of each and the spec checks which model kind each trains; a new one cannot be added "
    "by registering it (a registered objective's own build target may replace a built-in one with "
    "replace=True)",
}

Target = str | Callable[..., Any] | None


@dataclass(frozen=True)
class Entry:
    """One registered type: its family, name, spec class and build target."""

    family: str
    name: str
    spec: type
    target: Target = None
    source: str = "specformer"

    def resolve(self) -> Callable[..., Any]:
        """Return the build target, importing it if it was given as a string."""
        if self.target is None:
            raise PluginError(
                f"{self.family} type {self.name!r} (registered by {self.source}) has nothing to build: it was "
                f"registered without a target; register({self.family!r}, {self.spec.__name__}, "
                "'package.module:Class') names the module that builds it (or pass the class itself)"
            )
        if isinstance(self.target, str):
            module_name, _, attr = self.target.partition(":")
            try:
                obj: Any = importlib.import_module(module_name)
                for part in attr.split(".") if attr else ():
                    obj = getattr(obj, part)
            except (ImportError, AttributeError) as exc:
                raise PluginError(
                    f"{self.family} type {self.name!r} (registered by {self.source}): its build target "
                    f"{self.target!r} cannot be imported: {type(exc).__name__}: {exc}. A target is "
                    "'package.module:attribute'"
                ) from exc
            return obj
        return self.target


class Registry:
    """Families of named entries. See the module docstring."""

    def __init__(self) -> None:
        self._families: dict[str, dict[str, Entry]] = {}
        self._built: set[str] = set()  # families whose schema union exists
        # makes a built family's union again with a type registered after it (the spec schema
        # sets it once its models exist); None: such a type is refused, as nothing could use it
        self.rebuild_union: Callable[[str], None] | None = None
        self.builtin_defaults: dict[str, str] = {}  # each family's first built-in type
        # (family, name) -> the build target of specformer's own type of that name
        self.builtin_targets: dict[tuple[str, str], Target] = {}

    def register(
        self,
        family: str,
        spec: type,
        target: Target = None,
        *,
        name: str | None = None,
        source: str | None = None,
        replace: bool = False,
    ) -> Entry:
        """Register ``spec`` (a :class:`~specformer.specs.base.Spec` with a ``type``
        literal) in ``family``.

        The name is the single value of the spec's ``type`` literal: YAML selects the
        class by it (``name``, when given, must be that value).
        ``source`` (default: the spec class's module) is named when the type is registered
        again. Registering a name twice is an error unless ``replace=True``. Once the schema is
        built from a family (:meth:`mark_built`), a new type makes its union again
        (:attr:`rebuild_union`; without one it is refused, as it could never validate), and a
        registered name keeps its spec class: only its target may change.
        """
        from specformer.specs.base import Spec

        if family not in FAMILIES:
            close = difflib.get_close_matches(family, FAMILIES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"unknown family {family!r}: {hint}a spec selects a type in one of "
                f"{', '.join(FAMILIES)}"
            )
        if not (isinstance(spec, type) and issubclass(spec, Spec)):
            raise TypeError(
                f"{getattr(spec, '__name__', spec)!r} is not a spec class: derive it from "
                "specformer.specs.base.Spec (frozen, unknown keys refused), with a `type` Literal"
            )
        literal = _type_literal(spec)
        if name is not None and name != literal:
            raise TypeError(
                f"name {name!r} differs from {spec.__name__}.type ({literal!r}): a spec selects its class "
                f"by `type`, so the entry is named {literal!r}; leave name out"
            )
        name = literal
        fields = spec.model_fields
        missing = [f for f in REQUIRED_FIELDS.get(family, {}) if f not in fields]
        if missing:
            wanted = "; ".join(f"{f}: {REQUIRED_FIELDS[family][f]}" for f in missing)
            raise TypeError(
                f"{spec.__name__} lacks the field{'s' * (len(missing) > 1)} {', '.join(missing)} that every "
                f"{family} spec has (specformer reads them whatever the type); declare {wanted}"
            )
        entries = self._families.setdefault(family, {})
        if family in BUILT_IN_ONLY and source != "specformer" and name not in entries:
            raise ValueError(f"{family} type {name!r}: {BUILT_IN_ONLY[family]}")
        existing = entries.get(name)
        if existing is not None and existing.source == "specformer" and source != "specformer" and not (
            _same_definition(existing.spec, spec)
        ):
            raise ValueError(
                f"{family} type {name!r} is built in: a spec class of your own under its name would replace "
                f"it in every spec that uses it, presets included; give {spec.__name__} another type name. To "
                f"build the built-in {name!r} with your own module, register its class with your target: "
                f"register({family!r}, REGISTRY.get({family!r}, {name!r}).spec, target, replace=True)"
            )
        if name in entries and not replace:
            again = ""
            if _same_definition(entries[name].spec, spec):
                again = " (a notebook cell run again registers it again: write replace=True in that cell)"
            raise ValueError(
                f"{family} type {name!r} is already registered (by {entries[name].source}); "
                f"pass replace=True to override it{again}"
            )
        if family in self._built and name in entries and entries[name].spec is not spec:
            first = entries[name].spec
            if _same_definition(first, spec):
                # the same class statement run again (a notebook cell): the schema keeps the
                # class it was built with, which validates exactly as this one; the target is new
                spec = first
        if family in self._built and name in entries and entries[name].spec is not spec:
            first = entries[name].spec
            raise ValueError(
                f"{family} type {name!r} is in the spec schema with the class {first.__name__} of "
                f"{first.__module__}, which the schema was built with; another spec class for it needs a new "
                "Python process (in a notebook, restart the kernel). replace=True with the registered "
                "class changes only the build target"
            )
        late = family in self._built and name not in entries
        if late and self.rebuild_union is None:
            raise ValueError(
                f"{family} type {name!r} is registered after the spec schema was built from the "
                f"{family} family (the first load_spec call builds it, and so does importing build_model, "
                "ModelSpec, specformer.builder or anything else that imports specformer.specs.schema), "
                "and this registry has nothing that makes the union again (Registry.rebuild_union, which the spec "
                "schema sets once it is built), so no spec could use it: register it before that, e.g. at the top "
                "of your script (in a notebook: restart the kernel and run this cell first), or from a "
                "'specformer.plugins' entry point; a spec class derived from a built-in one, which needs the schema "
                "imported first, is registered from an entry point, whose module finds the built-in types "
                f"registered (REGISTRY.get({family!r}, name).spec)"
            )
        entry = Entry(family=family, name=name, spec=spec, target=target, source=source or spec.__module__)
        entries[name] = entry
        if late:
            # the union, and the models typed with it, made again with this type
            assert self.rebuild_union is not None
            try:
                self.rebuild_union(family)
            except Exception:
                del entries[name]
                self.rebuild_union(family)  # as it was
                raise
        return entry

    def is_builtin(self, family: str, name: str) -> bool:
        """Whether ``family`` type ``name`` builds specformer's own module: a built-in type
        whose build target no one replaced. ``register(family, spec, target, replace=True)``
        under a built-in name makes it a plugin's type, whose module only a build can measure."""
        entry = self._families.get(family, {}).get(name)
        return (entry is not None and (family, name) in self.builtin_targets
                and entry.target == self.builtin_targets[(family, name)])

    def mark_built(self, family: str) -> None:
        """Record that a schema union was made from ``family``'s spec classes."""
        self._built.add(family)

    def families(self) -> list[str]:
        return sorted(self._families)

    def entries(self, family: str) -> dict[str, Entry]:
        """Entries of ``family`` in registration order."""
        return dict(self._families.get(family, {}))

    def names(self, family: str) -> list[str]:
        return list(self._families.get(family, {}))

    def get(self, family: str, name: str) -> Entry:
        try:
            return self._families[family][name]
        except KeyError:
            allowed = ", ".join(self.names(family)) or "(none)"
            hint = ""
            if family in FAMILIES and family not in self.builtin_defaults:
                # a script that looks a built-in type up before anything imported the spec schema
                hint = (
                    f"; specformer's own {family} types are registered when the spec schema is first imported: "
                    "`import specformer.specs.schema` before looking one up (a plugin finds them registered "
                    "already). A new spec class, and a new target for a built-in type (replace=True), may "
                    "be registered after that import"
                )
            raise LookupError(
                f"unknown {family} type {name!r}; registered: {allowed}{hint}"
            ) from None

    def spec_classes(self, family: str) -> tuple[type, ...]:
        return tuple(e.spec for e in self._families.get(family, {}).values())

    def build(self, family: str, spec: Any, /, **kwargs: Any) -> Any:
        """Instantiate the target registered for ``spec.type`` with ``spec`` and ``kwargs``."""
        entry = self.get(family, spec.type)
        target = entry.resolve()
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):  # no signature to read (a builtin): the call says
            signature = None
        if signature is not None:
            try:
                signature.bind(spec, **kwargs)
            except TypeError as exc:
                call = ", ".join(["spec", "*", *kwargs]) if kwargs else "spec"
                raise TargetCallError(
                    f"{family} type {spec.type!r}: its target {_target_name(entry, target)} (registered by "
                    f"{entry.source}) cannot be called as the builder calls it, Target({call}): {exc} "
                    "(docs/components.md#adding-a-component lists each family's arguments)"
                ) from None
        try:
            return target(spec, **kwargs)
        except Exception as exc:
            # a module of one's own: its constructor's error (one that cannot run on the meta
            # device, where the model is built first: Tensor.item()) says which part raised it
            if self.builtin_targets.get((family, spec.type)) is entry.target:
                raise
            exc.add_note(f"raised building {family} type {spec.type!r} with {_target_name(entry, target)}; a "
                         "constructor runs on the meta device first (docs/components.md#adding-a-component)")
            raise


def _target_name(entry: Entry, target: Any) -> str:
    """``package.module:Class``, as a target is registered."""
    if isinstance(entry.target, str):
        return entry.target
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    return f"{module}:{name}" if module and name else repr(target)


def _same_definition(first: type, second: type) -> bool:
    """Whether two spec classes are one class statement run twice: the same module and
    name, the same fields with the same types and defaults, and the same validators,
    methods and properties (the schema keeps the first class: its code is what runs)."""
    if first is second:
        return True
    if (first.__module__, first.__qualname__) != (second.__module__, second.__qualname__):
        return False
    try:
        if first.model_json_schema() != second.model_json_schema():  # type: ignore[attr-defined]
            return False
    except Exception:  # a field type without a JSON schema: nothing to compare by
        return False
    return _body(first) == _body(second)


def _body(spec: type) -> list[Any]:
    """The code a spec class and its bases define besides fields (methods, properties,
    validators, each with how it is applied), with line numbers left out: a line added
    above the class in its cell changes nothing."""
    out: list[Any] = []
    for klass in spec.__mro__:
        if klass.__module__.partition(".")[0] in ("pydantic", "builtins"):
            continue
        for key, value in vars(klass).items():
            value = getattr(value, "__func__", value)  # classmethod, staticmethod
            parts = (value.fget, value.fset, value.fdel) if isinstance(value, property) else (value,)
            codes = [_code(part.__code__) for part in parts if hasattr(part, "__code__")]
            if codes:
                out.append((klass.__qualname__, key, codes))
    decorators = getattr(spec, "__pydantic_decorators__", None)
    for kind in ("validators", "field_validators", "root_validators", "field_serializers",
                 "model_serializers", "model_validators", "computed_fields"):
        for key, decorator in sorted(getattr(decorators, kind, {}).items()):
            # (without the addresses of the objects it holds: a computed field's property)
            out.append((kind, key, re.sub(r" at 0x[0-9a-fA-F]+", "", repr(decorator.info))))
    return out


def _code(code: types.CodeType) -> types.CodeType:
    """``code`` and the code inside it (lambdas, comprehensions) as if it began at line 1."""
    consts = tuple(_code(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_firstlineno=1, co_consts=consts)


def _type_literal(spec: type) -> str:
    field = getattr(spec, "model_fields", {}).get("type")
    if field is None:
        raise TypeError(
            f"{spec.__name__} has no 'type' field: YAML selects a spec class by it; declare "
            f'type: Literal["name"] = "name"'
        )
    args = typing.get_args(field.annotation)
    if typing.get_origin(field.annotation) is not typing.Literal or len(args) != 1 or not isinstance(args[0], str):
        raise TypeError(
            f'{spec.__name__}.type must be a Literal of exactly one string, e.g. type: Literal["name"] = "name"'
        )
    return args[0]


REGISTRY = Registry()
_plugins_loaded = False


def register(family: str, spec: type, target: Target = None, **kwargs: Any) -> Entry:
    """Register an entry in the global :data:`REGISTRY`."""
    return REGISTRY.register(family, spec, target, **kwargs)


def register_builtin(family: str, spec: type, target: Target) -> None:
    """Register one of specformer's own types in the global :data:`REGISTRY`, refusing a
    class of the same name that a script registered first, which would replace it."""
    name = _type_literal(spec)
    existing = REGISTRY.entries(family).get(name)
    # a mapping without `type:` is the family's first built-in type, whatever a script
    # registered before it
    REGISTRY.builtin_defaults.setdefault(family, name)
    if existing is None:
        REGISTRY.register(family, spec, target, source="specformer")
        REGISTRY.builtin_targets[(family, name)] = target
    elif existing.spec is not spec and existing.source == "specformer" and _same_definition(existing.spec, spec):
        # the schema's module run again (its first import failed on a plugin, now fixed): its own classes anew
        REGISTRY.register(family, spec, target, source="specformer", replace=True)
        REGISTRY.builtin_targets[(family, name)] = target
    elif existing.spec is not spec:
        error = ValueError(
            f"{family} type {name!r} is built in, and {existing.spec.__name__}, registered under that "
            f"name before the schema was built, would replace it in every spec that uses it: give "
            f"that type another name; to build the built-in {name!r} with your own module, "
            f"register after the first load_spec: register({family!r}, REGISTRY.get({family!r}, "
            f"{name!r}).spec, target, replace=True)"
        )
        plugin = _PLUGIN_OF.get((family, name))
        if plugin is not None:
            raise PluginError(_plugin_failure(plugin, error))
        raise error


def load_plugins(group: str = PLUGIN_GROUP) -> list[str]:
    """Load every ``specformer.plugins`` entry point once; return their names.

    An entry point names a callable taking the registry, e.g. in a plugin's
    ``pyproject.toml``::

        [project.entry-points."specformer.plugins"]
        myffn = "my_package.specformer_plugin:register"

    Importing the spec schema calls it, after specformer's own types are registered, so a
    plugin finds them and may look any of them up. Called before that (a script that loads
    the plugins first), it imports the schema, which registers the built-ins and then the
    plugins, and returns the names loaded.
    """
    global _plugins_loaded
    if group == PLUGIN_GROUP and "specformer.specs.schema" not in sys.modules:
        loaded_before = len(_LOADED)
        importlib.import_module("specformer.specs.schema")  # built-ins first; it loads the plugins
        return _LOADED[loaded_before:]
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    loaded = []
    for ep in importlib.metadata.entry_points(group=group):
        dist = getattr(ep, "dist", None)
        package = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "its package"
        plugin = f"the specformer plugin {ep.name!r} ({ep.value}, from {package})"
        if (ep.name, ep.value) in _HOOKED:  # registered before another plugin failed: its types are there
            continue
        before = {(family, name) for family in FAMILIES for name in REGISTRY.names(family)}
        try:
            hook = ep.load()
            if callable(hook):
                hook(REGISTRY)
        except Exception as exc:
            _plugins_loaded = False  # a retry, once the plugin is fixed or removed, loads them again
            raise PluginError(_plugin_failure(plugin, exc)) from exc
        for key in {(family, name) for family in FAMILIES for name in REGISTRY.names(family)} - before:
            _PLUGIN_OF[key] = plugin
        _HOOKED.add((ep.name, ep.value))
        loaded.append(ep.name)
    if group == PLUGIN_GROUP:
        _LOADED.extend(loaded)
    return loaded


# the names of the plugins loaded so far
_LOADED: list[str] = []
# the entry points whose hook has run: a retry after another plugin failed does not run them again
_HOOKED: set[tuple[str, str]] = set()


# (family, name) -> the plugin that registered it, named when a built-in type finds it taken
_PLUGIN_OF: dict[tuple[str, str], str] = {}


def _plugin_failure(plugin: str, exc: Exception) -> str:
    return (f"{plugin} failed to register: {type(exc).__name__}: {exc}. Fix that package or uninstall it: "
            f"specformer loads every '{PLUGIN_GROUP}' entry point installed")


class PluginError(RuntimeError):
    """A ``specformer.plugins`` entry point failed to load or to register its entries, or a
    registered build target cannot be imported or called as the builder calls it."""


class TargetCallError(PluginError, TypeError):
    """A build target whose signature does not take the arguments the builder passes."""
