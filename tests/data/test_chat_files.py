"""Where a tokenizer folder's chat template is read from, and what an unreadable one says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specformer.data.chat import find_chat_template
from specformer.data.corpus import DataError

JINJA = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
OLDER = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": OLDER, "eos_token": "<|im_end|>"}))
    return tmp_path


def test_chat_template_jinja_comes_before_tokenizer_config(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    assert find_chat_template(folder / "tokenizer.json").template == OLDER
    (folder / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
    found = find_chat_template(folder / "tokenizer.json")
    assert found.template == JINJA and found.special_tokens["eos_token"] == "<|im_end|>"


def test_an_unreadable_chat_template_jinja_is_an_error_not_the_older_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _folder(tmp_path)
    jinja = folder / "chat_template.jinja"
    jinja.write_bytes(b"{{ m['content'] }}\xff\xfe")
    with pytest.raises(DataError, match=r"chat_template.jinja: the chat template is not UTF-8 text .*tokenizer_config"):
        find_chat_template(folder)
    jinja.write_text(JINJA, encoding="utf-8")
    real = Path.read_text

    def denied(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.name == "chat_template.jinja":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(DataError, match=r"chat_template.jinja: the chat template cannot be read \(Permission denied\)"):
        find_chat_template(folder)
