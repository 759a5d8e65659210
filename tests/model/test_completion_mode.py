"""Continue-the-text mode for base models: the plain template, the engine, and the window
on the real default model (a 270M base model with no chat template)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

import app.engine.local.engine as llama_module
from app.config.model_prefs import FILE_NAME, ModelPrefsStore, model_key
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.templates.builtin import plain_template
from app.engine.templates.jinja_template import TURN_MARKERS
from app.engine.templates.override import AUTO, PLAIN, looks_like_base_model
from app.gguf.info import read_gguf_info
from tests.conftest import ROOT
from tests.hypothesis_budget import examples
from tests.real_window import close, evaluated, send
from tests.real_window import open_window as _open_window
from ui.window.main_window import MainWindow

STORY = "Once upon a time, in a small village"


# -- the plain template -------------------------------------------------------------------

ROLES = st.sampled_from(["system", "user", "assistant"])
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(st.tuples(ROLES, TEXT), max_size=8), st.data())
def test_plain_template_is_the_text_in_separable_parts(
    turns: list[tuple[str, str]], data: st.DataObject
) -> None:
    """No roles, no generation prompt, no system text; each message's text in order; the
    first i messages render a prefix (the cache is reused), and dropping messages i..j
    cuts exactly their part out (what a full context does to the cache)."""
    messages = [ChatMessage(r, t) for r, t in turns]  # type: ignore[arg-type]
    template = plain_template()
    text = template.render(messages, True)
    assert text == template.render(messages, False)
    rest = text
    for m in messages:
        if m.role != "system" and m.content:
            at = rest.find(m.content)
            assert at >= 0 and not rest[:at].strip(), "only a space goes between texts"
            rest = rest[at + len(m.content) :]
    assert not rest.strip()
    i = data.draw(st.integers(0, len(messages)))
    j = data.draw(st.integers(i, len(messages)))
    head = template.render(messages[:i], True)
    assert text.startswith(head)
    tail = text[len(template.render(messages[:j], True)) :]
    assert template.render(messages[:i] + messages[j:], True) == head + tail
    assert template.completion and template.stop_strings == ()


def test_plain_template_joins_turns_as_one_text() -> None:
    render = plain_template().render
    chat = [ChatMessage("system", "Ignored."), ChatMessage("user", "The sky is")]
    assert render(chat) == "The sky is"
    chat += [ChatMessage("assistant", " blue."), ChatMessage("user", "And the sea")]
    assert render(chat) == "The sky is blue. And the sea"
    chat += [ChatMessage("assistant", ",\n"), ChatMessage("user", "too.")]
    assert render(chat) == "The sky is blue. And the sea,\ntoo."
    chat += [ChatMessage("assistant", ""), ChatMessage("user", "Then")]  # a stopped reply
    assert render(chat) == "The sky is blue. And the sea,\ntoo. Then"


@pytest.mark.parametrize(
    ("names", "has_template", "base"),
    [
        (("Gemma 3 270m", "gemma-3-270m-q4_k_m.gguf"), False, True),
        (("Gemma 3 1b It", "gemma-3-1b-it-Q4_K_M.gguf"), False, False),
        (("Qwen2.5 1.5B Instruct", "qwen2.5-1.5b-instruct-q4_k_m.gguf"), False, False),
        (("", "SmolLM2-1.7B-Chat.gguf"), False, False),
        (("Llama 3.2 3B", "Llama-3.2-3B.Q4_K_M.gguf"), False, True),
        (("Mistral 7B", "mistral-7b.gguf"), True, False),  # has a template
        (("Phi 4 Mini", "Phi-4-mini-instruct.gguf"), False, False),
    ],
)
def test_base_model_heuristic(names: tuple[str, str], has_template: bool, base: bool) -> None:
    assert looks_like_base_model(names, has_template) is base


# -- the engine ---------------------------------------------------------------------------


@pytest.fixture()
def plain_engine(one_engine: Engine) -> Iterator[Engine]:
    one_engine.reset()
    assert one_engine.model is not None and one_engine.model.base_model
    one_engine.set_template(PLAIN)
    yield one_engine
    one_engine.set_template(AUTO)
    one_engine.reset()


def test_completion_sends_exactly_the_text_and_continues_it(plain_engine: Engine) -> None:
    engine = plain_engine
    assert (
        engine.model is not None and engine.model.template == "plain text (continue-the-text mode)"
    )
    first = list(engine.generate([ChatMessage("user", STORY)], SamplingParams.greedy(6)))[-1]
    assert isinstance(first, Finished) and first.text.strip()
    assert engine.context_text == STORY + first.text
    assert first.metrics.prompt_tokens == len(engine.tokenize(STORY))
    assert not any(marker in engine.context_text for marker in TURN_MARKERS)
    assert (
        engine.prewarm([ChatMessage("user", STORY)], ChatMessage("assistant", first.text)) == 0
    )  # no turn to open
    chat = [ChatMessage("user", STORY), ChatMessage("assistant", first.text)]
    chat.append(ChatMessage("user", "The end."))
    second = list(engine.generate(chat, SamplingParams.greedy(4)))[-1]
    assert isinstance(second, Finished)
    # The continuation is reused: only the new words are read.
    cached = first.metrics.prompt_tokens + first.metrics.generated_tokens
    assert second.metrics.cached_tokens >= cached - 1
    assert second.metrics.evaluated_tokens <= 6
    sep = "" if first.text[-1:].isspace() else " "
    assert engine.context_text == STORY + first.text + sep + "The end." + second.text


def test_stop_strings_and_max_tokens_end_a_continuation(plain_engine: Engine) -> None:
    params = replace(SamplingParams.greedy(24), stop=(",",))
    done = list(plain_engine.generate([ChatMessage("user", STORY + " in the")], params))[-1]
    assert isinstance(done, Finished)
    assert done.metrics.stop_reason in ("stop_string", "eos") and "," not in done.text
    done = list(plain_engine.generate([ChatMessage("user", "1, 2, 3,")], SamplingParams.greedy(3)))
    end = done[-1]
    assert isinstance(end, Finished) and end.metrics.stop_reason in ("max_tokens", "eos")
    assert end.metrics.generated_tokens <= 3


# -- the window on the real default model ---------------------------------------------------


def open_window(qtbot: QtBot, root: Path, model_path: Path) -> MainWindow:
    return _open_window(qtbot, root, model_path, max_tokens=6)


def test_default_model_offers_and_uses_continue_the_text(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    root = tmp_path / "data"
    win = open_window(qtbot, root, model_path)
    try:
        controls = win.prompt_controls
        qtbot.waitUntil(lambda: "plain text" in win.status_model.text(), timeout=10_000)
        notice = controls.notice
        assert controls.completion and not notice.isHidden()
        assert "is a text-completion model" in notice.label.text()
        assert "Continue-the-text mode</b> is on" in notice.label.text()
        assert notice.button.text() == "Use chat turns instead"
        assert "continues it" in win.chat_input.placeholderText()
        assert not controls.bar.editor.isEnabled() or controls.bar.editor.isReadOnly()

        send(qtbot, win, STORY)
        reply = win.conversation.messages[-1].content
        assert reply.strip() and evaluated(win) == STORY + reply
        first = win.reply_metrics[-1]
        assert first.stop_reason in ("max_tokens", "eos")
        shown = win.transcript.toPlainText()
        assert "Your text" in shown and "Continued by the model" in shown

        # Switched from the notice: chat turns, saved for this model.
        qtbot.mouseClick(notice.button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: "template gemma" in win.status_model.text(), timeout=10_000)
        assert not controls.completion and notice.button.text() == "Continue the text"
        assert "Chat turns are back" in win.transcript.toPlainText()
        key = model_key(model_path, model_path.stat().st_size)
        assert ModelPrefsStore(root / FILE_NAME).get(key).completion is False
        send(qtbot, win, "Hi")
        assert evaluated(win).startswith(f"<start_of_turn>user\n{STORY}<end_of_turn>")
        assert "You" in win.transcript.toPlainText()
    finally:
        close(win)


def test_no_notice_for_a_model_with_a_chat_template(
    qtbot: QtBot, tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = read_gguf_info(model_path)
    source = (ROOT / "tests" / "data" / "templates" / "gemma-3-it.jinja").read_text()
    monkeypatch.setattr(
        llama_module, "read_gguf_info", lambda _p: replace(info, chat_template=source)
    )
    win = open_window(qtbot, tmp_path / "data", model_path)
    try:
        controls = win.prompt_controls
        assert win.session.model is not None and not win.session.model.base_model
        assert controls.notice.isHidden() and not controls.completion
        assert "model's own" in win.status_model.text()
        send(qtbot, win, "Hi")
        assert evaluated(win).startswith("<start_of_turn>user\nHi<end_of_turn>")
    finally:
        close(win)
