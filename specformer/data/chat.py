"""Chat templates: a (prompt, response) pair as a conversation, rendered as ``transformers`` does.

An instruct model's tokenizer keeps a Jinja template (``chat_template.jinja``, or
``tokenizer_config.json``'s ``chat_template``) that turns a list of messages into the text the
model was tuned on: Llama 3's ``<|start_header_id|>user<|end_header_id|>\\n\\n…<|eot_id|>``,
ChatML's ``<|im_start|>user\\n…<|im_end|>``. Supervised fine-tuning with
``training.objective: {type: sft, chat_template: true}`` renders each pair as a user turn and
an assistant turn, and ``generate --chat`` a prompt as a user turn followed by the generation
prompt, as TRL's and torchtune's chat SFT do.

A system prompt (``training.objective.system``, ``generate --system``) is a ``{"role": "system"}``
turn before the user's, as torchtune's ``new_system_prompt`` puts it.

Rendering is ``transformers``' own (its sandboxed Jinja environment, with ``raise_exception``,
``strftime_now`` and the rest), so the text is the one ``tokenizer.apply_chat_template`` gives;
the text is then encoded with special-token strings read as their ids and no template tokens
added, as ``apply_chat_template(..., tokenize=True)`` does. Where this ``transformers`` has
neither of the helpers it renders with (``render_jinja_template``, ``_compile_jinja_template``:
they moved between releases), or is not installed, the template is rendered by ``jinja2``
in an environment made as ``transformers`` makes its own.

A tokenizer read from a ``tokenizer.json`` keeps the template found beside it
(:func:`find_chat_template`), and its ``state()`` keeps it with the special-token strings the
template reads: a checkpoint renders a conversation with no tokenizer folder beside it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from specformer.data.corpus import DataError

__all__ = [
    "ChatTemplate",
    "NotAPrefixError",
    "find_chat_template",
    "read_chat_template",
    "chat_template_for",
    "conversation",
]

# the named special tokens transformers passes to a template (its special_tokens_map)
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class NotAPrefixError(DataError):
    """The rendering of a prompt alone is not the start of its rendering with the response."""


@dataclass(frozen=True)
class ChatTemplate:
    """A tokenizer's chat template, where it was read from, and the special-token strings
    (``bos_token``, ``eos_token``, …) ``transformers`` gives the template beside the messages."""

    template: str
    source: str
    special_tokens: dict[str, str] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        """Plain data (kept in a tokenizer's ``state()``, so in a checkpoint) that
        :meth:`from_state` rebuilds from."""
        return {"template": self.template, "source": self.source, "special_tokens": dict(self.special_tokens)}

    @classmethod
    def from_state(cls, state: Any) -> ChatTemplate | None:
        """The template kept as :meth:`state`; None for anything else."""
        if not isinstance(state, dict) or not isinstance(state.get("template"), str):
            return None
        specials = state.get("special_tokens")
        specials = {k: v for k, v in specials.items() if isinstance(v, str)} if isinstance(specials, dict) else {}
        return cls(state["template"], str(state.get("source", "a checkpoint's tokenizer")), specials)

    def render(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = False) -> str:
        """The text of ``messages`` (``[{"role": "user", "content": …}, …]``), as
        ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=…)``."""
        render = _renderer()
        try:
            return render(list(messages), self.template, add_generation_prompt, self.special_tokens)
        except Exception as exc:  # a template's raise_exception, or a Jinja error in the template
            raise DataError(f"the chat template ({self.source}) fails to render: {exc}") from None

    def end_id(self, tokenizer: Any) -> int | None:
        """The id that ends an assistant's turn, where generation stops: the tokenizer's
        ``eos_token`` (an instruct model's ``<|eot_id|>``, ``<|im_end|>``), as
        ``transformers``' ``generate`` stops at ``eos_token_id``; else its end-of-text token."""
        eos = self.special_tokens.get("eos_token")
        found = tokenizer.token_id(eos) if eos is not None else None
        return found if found is not None else tokenizer.eot_id

    def prompt_ids(self, tokenizer: Any, prompt: str | Sequence[dict[str, Any]], *, system: str | None = None) -> list[int]:
        """``prompt`` as a user turn (after a ``system`` turn, when given) followed by the
        generation prompt, in token ids: what the model reads before its response
        (``generate --chat``). A list of turns (a conversation so far) is rendered as it is,
        after the ``system`` turn when it has none of its own."""
        if isinstance(prompt, str):
            turns = conversation(prompt, system=system)
        else:
            turns = list(prompt)
            if system is not None and (not turns or turns[0].get("role") != "system"):
                turns.insert(0, {"role": "system", "content": system})
        text = self.render(turns, add_generation_prompt=True)
        return tokenizer.encode(text, specials=True)

    def pair_ids(
        self, tokenizer: Any, pairs: Sequence[tuple[str, str]], *, system: str | None = None
    ) -> list[tuple[list[int], list[int]] | int]:
        """Each (prompt, response) pair as (prompt ids, response ids): the prompt part the
        rendering of the user turn (after a ``system`` turn, when given) with the generation
        prompt, the response part the rest of the rendering of the conversation. A pair whose
        prompt rendering is not the start of its full rendering in token ids gives, in its
        place, the index of the first token where they differ."""
        prompts = [self.render(conversation(p, system=system), add_generation_prompt=True) for p, _ in pairs]
        fulls = [self.render(conversation(p, r, system=system)) for p, r in pairs]
        out: list[tuple[list[int], list[int]] | int] = []
        for prompt, full in zip(tokenizer.encode_batch(prompts, specials=True),
                                tokenizer.encode_batch(fulls, specials=True), strict=True):
            if full[: len(prompt)] != prompt:
                out.append(next((i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b), len(full)))
            else:
                out.append((prompt, full[len(prompt):]))
        return out


    def conversation_ids(
        self, tokenizer: Any, messages: Sequence[dict[str, Any]], *, system: str | None = None
    ) -> tuple[list[int], list[int]] | tuple[int, int]:
        """A whole conversation's rendering in token ids, and a mask of the same length that is
        1 on the tokens of its assistant turns: what each assistant turn's rendering adds to the
        rendering of the turns before it with the generation prompt (its content and the
        template's end of turn, not the header the generation prompt already wrote), as TRL's
        ``assistant_only_loss`` trains. A ``system`` turn goes first when the conversation has
        none of its own. A prefix whose rendering is not the start of the whole rendering in
        token ids gives instead (the first token where they differ, the 0-based turn)."""
        return self.conversations_ids(tokenizer, [messages], system=system)[0]

    def conversations_ids(
        self, tokenizer: Any, conversations: Sequence[Sequence[dict[str, Any]]], *, system: str | None = None
    ) -> list[tuple[list[int], list[int]] | tuple[int, int]]:
        """:meth:`conversation_ids` of each conversation, their texts encoded in one batch."""
        texts: list[str] = []
        plans: list[tuple[int, list[int]]] = []  # each conversation's first text and assistant turns
        for messages in conversations:
            turns = list(messages)
            if system is not None and (not turns or turns[0].get("role") != "system"):
                turns.insert(0, {"role": "system", "content": system})
            at = [i for i, turn in enumerate(turns) if turn.get("role") == "assistant"]
            plans.append((len(texts), at))
            texts.append(self.render(turns))
            for i in at:
                texts += [self.render(turns[:i], add_generation_prompt=True), self.render(turns[: i + 1])]
        encoded = tokenizer.encode_batch(texts, specials=True)
        out: list[tuple[list[int], list[int]] | tuple[int, int]] = []
        for first, at in plans:
            full, parts = encoded[first], encoded[first + 1 : first + 1 + 2 * len(at)]
            mask: list[int] | None = [0] * len(full)
            for n, i in enumerate(at):
                bad = next((p for p in parts[2 * n : 2 * n + 2] if full[: len(p)] != p), None)
                if bad is not None:
                    differ = next((j for j, (a, b) in enumerate(zip(bad, full, strict=False)) if a != b), len(full))
                    out.append((differ, i))
                    mask = None
                    break
                start, end = len(parts[2 * n]), len(parts[2 * n + 1])
                mask[start:end] = [1] * (end - start)
            if mask is not None:
                out.append((full, mask))
        return out


def conversation(prompt: str, response: str | None = None, *, system: str | None = None) -> list[dict[str, str]]:
    """The messages of one exchange: a ``system`` turn when given, the user's ``prompt``, and
    the assistant's ``response`` when given."""
    turns = [{"role": "system", "content": system}] if system is not None else []
    turns.append({"role": "user", "content": prompt})
    if response is not None:
        turns.append({"role": "assistant", "content": response})
    return turns


_Render = Callable[[list, str, bool, dict], str]


def _renderer() -> _Render:
    """A chat template's rendering, as (messages, template, add_generation_prompt, special
    tokens) -> text: ``transformers``' own where this release has it where we look
    (``render_jinja_template``, else ``_compile_jinja_template``, in
    ``transformers.utils.chat_template_utils``), else :func:`_jinja_renderer`."""
    try:
        from transformers.utils import chat_template_utils as utils
    except ImportError:  # no transformers, or one older than the module (4.4x kept the helper on the tokenizer)
        utils = None
    if utils is not None and callable(render_jinja := getattr(utils, "render_jinja_template", None)):

        def render(messages: list, template: str, add_generation_prompt: bool, specials: dict) -> str:
            rendered, _ = render_jinja(conversations=[messages], chat_template=template,
                                       add_generation_prompt=add_generation_prompt, **specials)
            return rendered[0]

        return render
    if utils is not None and callable(compile_template := getattr(utils, "_compile_jinja_template", None)):

        def render_compiled(messages: list, template: str, add_generation_prompt: bool, specials: dict) -> str:
            return compile_template(template).render(messages=messages, tools=None, documents=None,
                                                     add_generation_prompt=add_generation_prompt, **specials)

        return render_compiled
    return _jinja_renderer()


@lru_cache(maxsize=1)
def _jinja_renderer() -> _Render:
    """A chat template rendered by ``jinja2`` as ``transformers`` renders it: a sandboxed
    environment (a template cannot reach Python's internals) with ``trim_blocks``,
    ``lstrip_blocks`` and the ``loopcontrols`` extension (``{% break %}``), a ``tojson`` that
    keeps non-ASCII characters, and the globals ``raise_exception`` and ``strftime_now``. A
    :class:`DataError` naming what to install when ``jinja2`` (3.1.6 or later, the first without
    known sandbox escapes) is missing."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise DataError(
            "a chat template is rendered by transformers (its sandboxed Jinja environment), which is not "
            "installed: pip install 'specformer[hf]'"
        ) from None
    version = tuple(int(p) if p.isdigit() else 0 for p in jinja2.__version__.split(".")[:3])
    if version < (3, 1, 6):
        raise DataError(f"a chat template is rendered by jinja2 3.1.6 or later (earlier ones have known sandbox "
                        f"escapes), and this one is {jinja2.__version__}: pip install -U 'jinja2>=3.1.6'")

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now

    @lru_cache(maxsize=8)
    def compiled(template: str) -> Any:
        return env.from_string(template)

    def render(messages: list, template: str, add_generation_prompt: bool, specials: dict) -> str:
        # tools and documents are None, as transformers passes them when it is given none
        return compiled(template).render(messages=messages, tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **specials)

    return render


def find_chat_template(path: str | Path) -> ChatTemplate | None:
    """The chat template kept beside the ``tokenizer.json`` at ``path`` (the file or its
    folder), where ``transformers``' ``save_pretrained`` writes it: ``chat_template.jinja``,
    else ``chat_template.json``'s or ``tokenizer_config.json``'s ``chat_template`` (of a list
    of named templates, the one named ``default``), with the special-token strings
    ``tokenizer_config.json`` names; None when there is none. A ``chat_template.jinja`` that
    cannot be read (permissions, not UTF-8) is a :class:`DataError` naming it."""
    p = Path(path).expanduser()
    folder = p if p.is_dir() else p.parent
    config = _json(folder / "tokenizer_config.json")
    specials = {}
    for name in _SPECIAL_TOKENS:
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            specials[name] = value
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        # it is the template (transformers reads it before any other): one that cannot be read
        # is an error, not a silent turn to an older one in tokenizer_config.json
        try:
            return ChatTemplate(jinja.read_text(encoding="utf-8"), str(jinja), specials)
        except UnicodeDecodeError as exc:
            raise DataError(f"{jinja}: the chat template is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                            "save it as UTF-8, or remove it to use tokenizer_config.json's") from None
        except OSError as exc:
            raise DataError(f"{jinja}: the chat template cannot be read ({exc.strerror or exc}); "
                            "fix its permissions, or remove it to use tokenizer_config.json's") from None
    for name in ("chat_template.json", "tokenizer_config.json"):
        found = _json(folder / name).get("chat_template")
        if isinstance(found, list):  # [{"name": "default", "template": …}, {"name": "tool_use", …}]
            found = next((t.get("template") for t in found if isinstance(t, dict) and t.get("name") == "default"), None)
        if isinstance(found, str) and found.strip():
            return ChatTemplate(found, f"{folder / name}'s chat_template", specials)
    return None


def read_chat_template(path: str | Path, *, setting: str = "training.tokenizer.path") -> ChatTemplate:
    """:func:`find_chat_template`; a :class:`DataError` naming ``setting`` when there is none."""
    found = find_chat_template(path)
    if found is not None:
        return found
    p = Path(path).expanduser()
    folder = p if p.is_dir() else p.parent
    raise DataError(
        f"{setting}: the tokenizer in {folder} has no chat template (no chat_template.jinja, and no chat_template "
        "in tokenizer_config.json); use an instruct model's tokenizer folder, which has one (transformers: "
        "tokenizer.save_pretrained(folder) writes it); or do without: generate --no-chat reads a prompt as "
        "plain text, and training.objective.chat_template: false reads each pair as prompt + response + end token"
    )


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def chat_template_for(training: Any, tokenizer: Any = None) -> ChatTemplate:
    """The chat template ``tokenizer`` keeps (one read from a ``tokenizer.json`` with a
    template beside it, or a checkpoint's), else the one beside the spec's
    ``training.tokenizer`` (``type: file``, as ``import-hf`` writes it); a :class:`DataError`
    saying where it was looked for when there is none."""
    kept = getattr(tokenizer, "chat_template", None)
    if isinstance(kept, ChatTemplate):
        return kept
    settings = getattr(training, "tokenizer", None) if training is not None else None
    if settings is None or settings.type != "file":
        kind = "unset" if settings is None else f"type {settings.type}"
        raise DataError(
            f"training.tokenizer is {kind}: a chat template is read from a tokenizer.json's folder "
            "(training.tokenizer: {type: file, path: folder/tokenizer.json}, as import-hf writes it)"
        )
    return read_chat_template(settings.path)
