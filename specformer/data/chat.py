"""Chat templates: a (prompt, response) pair as a conversation, rendered as ``transformers`` does.

An instruct model's tokenizer keeps a Jinja template (``chat_template.jinja``, or
``tokenizer_config.json``'s ``chat_template``) that turns a list of messages into the text the
model was tuned on: Llama 3's ``<|start_header_id|>user<|end_header_id|>\\n\\n…<|eot_id|>``,
ChatML's ``<|im_start|>user\\n…<|im_end|>``. Supervised fine-tuning with
``training.objective: {type: sft, chat_template: true}`` renders each pair as a user turn and
an assistant turn, and ``generate --chat`` a prompt as a user turn followed by the generation
prompt, as TRL's and torchtune's chat SFT do.

Rendering is ``transformers``' own (its sandboxed Jinja environment, with ``raise_exception``,
``strftime_now`` and the rest), so the text is the one ``tokenizer.apply_chat_template`` gives;
the text is then encoded with special-token strings read as their ids and no template tokens
added, as ``apply_chat_template(..., tokenize=True)`` does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specformer.data.corpus import DataError

__all__ = ["ChatTemplate", "NotAPrefixError", "read_chat_template", "chat_template_for"]

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

    def prompt_ids(self, tokenizer: Any, prompt: str) -> list[int]:
        """``prompt`` as a user turn followed by the generation prompt, in token ids: what the
        model reads before its response (``generate --chat``)."""
        text = self.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
        return tokenizer.encode(text, specials=True)

    def pair_ids(self, tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]] | int]:
        """Each (prompt, response) pair as (prompt ids, response ids): the prompt part the
        rendering of the user turn with the generation prompt, the response part the rest of
        the rendering of both turns. A pair whose prompt rendering is not the start of its
        full rendering in token ids gives, in its place, the index of the first token where
        they differ."""
        prompts = [self.render([{"role": "user", "content": p}], add_generation_prompt=True) for p, _ in pairs]
        fulls = [
            self.render([{"role": "user", "content": p}, {"role": "assistant", "content": r}]) for p, r in pairs
        ]
        out: list[tuple[list[int], list[int]] | int] = []
        for prompt, full in zip(tokenizer.encode_batch(prompts, specials=True),
                                tokenizer.encode_batch(fulls, specials=True), strict=True):
            if full[: len(prompt)] != prompt:
                out.append(next((i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b), len(full)))
            else:
                out.append((prompt, full[len(prompt):]))
        return out


def _renderer() -> Any:
    """``transformers``' Jinja rendering, as (messages, template, add_generation_prompt, special
    tokens) -> text; a :class:`DataError` naming the extra to install when it is missing."""
    try:
        from transformers.utils import chat_template_utils as utils
    except ImportError:
        raise DataError(
            "a chat template is rendered by transformers (its sandboxed Jinja environment), which is not "
            "installed: pip install 'specformer[hf]'"
        ) from None
    if hasattr(utils, "render_jinja_template"):

        def render(messages: list, template: str, add_generation_prompt: bool, specials: dict[str, str]) -> str:
            rendered, _ = utils.render_jinja_template(
                conversations=[messages], chat_template=template, add_generation_prompt=add_generation_prompt,
                **specials,
            )
            return rendered[0]

        return render

    def render_compiled(messages: list, template: str, add_generation_prompt: bool, specials: dict[str, str]) -> str:
        compiled = utils._compile_jinja_template(template)
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **specials)

    return render_compiled


def read_chat_template(path: str | Path, *, setting: str = "training.tokenizer.path") -> ChatTemplate:
    """The chat template kept beside the ``tokenizer.json`` at ``path`` (the file or its
    folder), where ``transformers``' ``save_pretrained`` writes it: ``chat_template.jinja``,
    else ``chat_template.json``'s or ``tokenizer_config.json``'s ``chat_template`` (of a list
    of named templates, the one named ``default``). A :class:`DataError` naming ``setting``
    when there is none."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    config = _json(folder / "tokenizer_config.json")
    specials = {}
    for name in _SPECIAL_TOKENS:
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            specials[name] = value
    if (jinja := folder / "chat_template.jinja").is_file():
        return ChatTemplate(jinja.read_text(encoding="utf-8"), str(jinja), specials)
    for name in ("chat_template.json", "tokenizer_config.json"):
        found = _json(folder / name).get("chat_template")
        if isinstance(found, list):  # [{"name": "default", "template": …}, {"name": "tool_use", …}]
            found = next((t.get("template") for t in found if isinstance(t, dict) and t.get("name") == "default"), None)
        if isinstance(found, str) and found.strip():
            return ChatTemplate(found, f"{folder / name}'s chat_template", specials)
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


def chat_template_for(training: Any) -> ChatTemplate:
    """The chat template of a spec's ``training`` section: the one beside its
    ``training.tokenizer`` (``type: file``, as ``import-hf`` writes it)."""
    tokenizer = getattr(training, "tokenizer", None) if training is not None else None
    if tokenizer is None or tokenizer.type != "file":
        kind = "unset" if tokenizer is None else f"type {tokenizer.type}"
        raise DataError(
            f"training.tokenizer is {kind}: a chat template is read from a tokenizer.json's folder "
            "(training.tokenizer: {type: file, path: folder/tokenizer.json}, as import-hf writes it)"
        )
    return read_chat_template(tokenizer.path)
