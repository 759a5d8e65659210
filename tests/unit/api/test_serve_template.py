"""``lamplight serve``'s chat template options (``ui/api/serve_template.py``): a built-in
name, a Jinja file, else the window's saved choice for the model; a bad name or file is
refused naming the option, before anything loads."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from app.config.model_prefs import FILE_NAME, ModelPrefs, ModelPrefsStore, model_key
from app.engine.backend import ModelInfo
from app.engine.templates.override import AUTO, TemplateOverride
from ui.api import serve_template
from ui.api.serve import parse_args

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def info(path: Path, size: int = 1234) -> ModelInfo:
    return ModelInfo(path, "m", "gemma3", 1, size, 512, 512, 1, 0, "", "cpu", 0.0)


def choose(tmp_path: Path, *argv: str) -> TemplateOverride:
    args = parse_args(list(argv))
    return serve_template.chooser(args, tmp_path)(info(tmp_path / "model.gguf"))


def test_a_built_in_name_or_auto(tmp_path: Path) -> None:
    assert choose(tmp_path, "--chat-template", "chatml") == TemplateOverride("builtin", "chatml")
    assert choose(tmp_path, "--chat-template", "auto") == AUTO


def test_a_template_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text(CHATML, encoding="utf-8")
    assert choose(tmp_path, "--chat-template-file", str(path)) == TemplateOverride(
        "custom", source=CHATML
    )


def test_the_windows_saved_choice_else_the_models_own(tmp_path: Path) -> None:
    assert choose(tmp_path) == AUTO
    store = ModelPrefsStore(tmp_path / FILE_NAME)
    key = model_key(tmp_path / "model.gguf", 1234)
    store.set(key, ModelPrefs(template="custom", template_source=CHATML, completion=True))
    # Continue-the-text mode is the window's; the API continues a text at /v1/completions.
    assert choose(tmp_path) == TemplateOverride("custom", source=CHATML)
    # The command line wins.
    assert choose(tmp_path, "--chat-template", "gemma") == TemplateOverride("builtin", "gemma")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "no such file"),
        (b"\xff\xfe\x00", "not UTF-8"),
        (b"   ", "1 to"),
        (b"{% for m in messages %}{{ m.content }", "does not compile"),
        (b"x" * 200_001, "1 to"),
    ],
)
def test_a_file_that_cannot_be_used_names_the_option(
    tmp_path: Path, content: bytes | None, words: str
) -> None:
    path = tmp_path / "t.jinja"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(serve_template.TemplateArgError) as err:
        choose(tmp_path, "--chat-template-file", str(path))
    assert str(err.value).startswith("--chat-template-file:") and words in str(err.value)


def test_an_unknown_name_lists_the_built_in_ones(tmp_path: Path) -> None:
    with pytest.raises(serve_template.TemplateArgError) as err:
        choose(tmp_path, "--chat-template", "vicuna")
    assert "chatml" in str(err.value) and "auto" in str(err.value)


def test_a_name_and_a_file_together_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--chat-template", "chatml", "--chat-template-file", "x"])
    assert isinstance(parse_args([]), argparse.Namespace)
