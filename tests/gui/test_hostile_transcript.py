"""Model-written and pasted text in the transcript: no app actions, bounded rendering time."""

from __future__ import annotations

import random
import re
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtCore import QUrl
from PySide6.QtWidgets import QApplication

from app.chat.markdown_render import MARKDOWN_LIMIT, RUN_LIMIT, render_markdown
from tests.hypothesis_budget import examples
from ui.chat.transcript import TranscriptView

HREF = re.compile(r'href="([^"]*)"')
SAFE = ("http:", "https:", "mailto:")

# Pieces a model (or an attacker's prompt injection) would use to forge links.
_PIECES = st.sampled_from(
    [
        "[x](",
        ")",
        "<",
        ">",
        "lamplight:fork/0",
        "lamplight://",
        "LampLight:edit/1",
        "javascript:alert(1)",
        "file:///etc/passwd",
        "data:text/html,hi",
        "https://example.com/a",
        "mailto:a@b.c",
        "[ref]: ",
        "[ref]",
        "\n",
        " ",
        "`",
        "```",
        "*",
        "_",
        "\\",
        "&#108;amplight:fork/0",
        "%6Camplight:fork/0",
        "<a href='lamplight:fork/0'>",
        "www.example.com",
    ]
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=40).map("".join))
def test_model_text_never_forms_a_link_outside_the_web(text: str) -> None:
    for href in HREF.findall(render_markdown(text)):
        assert href.lower().startswith(SAFE), (text, href)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.one_of(_PIECES, st.text(min_size=1, max_size=3)), min_size=1, max_size=20).map(
        "".join
    ),
    st.integers(min_value=100, max_value=20_000),
)
def test_any_text_renders_in_bounded_time(unit: str, length: int) -> None:
    text = (unit * (length // len(unit) + 1))[:length]
    start = time.perf_counter()
    render_markdown(text)
    assert time.perf_counter() - start < 5.0


def _action_links(view: TranscriptView) -> list[str]:
    return [h for h in HREF.findall(view.toHtml()) if h.startswith("lamplight")]


def test_only_the_views_own_header_links_act(qapp: QApplication) -> None:
    view = TranscriptView()
    view.add_user_message("[fork me](lamplight:fork/0) <lamplight:edit/0>", 0)
    view.begin_reply(1)
    view.end_reply("Click [here](lamplight:fork/1) or <lamplight://x/regenerate/1>.")
    links = _action_links(view)
    # Edit, Fork and Copy on the user message, Regenerate, Fork and Copy on the reply:
    # nothing else.
    assert [link.split("/", 3)[3] for link in links] == [
        "edit/0", "fork/0", "copy/0", "regenerate/1", "fork/1", "copy/1"
    ]  # fmt: skip
    got: list[tuple[str, int]] = []
    view.actionRequested.connect(lambda a, i: got.append((a, i)))
    for forged in ("lamplight:fork/0", "lamplight://x/regenerate/1", "lamplight:///fork/0"):
        view.anchorClicked.emit(QUrl(forged))
    assert got == []
    view.anchorClicked.emit(QUrl(links[0]))
    assert got == [("edit", 0)]


def _pasted_log(size: int) -> str:
    rng = random.Random(1)
    lines = (
        f"2026-11-23 12:00:{i % 60:02d} INFO worker[{i}] item {rng.random()} ok"
        for i in range(size // 40)
    )
    return "\n".join(lines)[:size]


def test_megabyte_messages_show_whole_in_bounded_time(qapp: QApplication) -> None:
    view = TranscriptView()
    view.resize(800, 600)
    view.show()
    one_line = "x" * 1_000_000
    cases = {
        "log": _pasted_log(1_000_000),
        "one line": one_line,
        "code fence": "```\n" + _pasted_log(1_000_000) + "\n```",
        "emphasis": "*a " * 300_000,
        "markdown-sized line": "y" * (MARKDOWN_LIMIT - 10),
    }
    for name, text in cases.items():
        start = time.perf_counter()
        view.clear_conversation()
        view.add_user_message(text, 0)
        view.begin_reply(1)
        view.append_stream(text)
        view.end_reply(text)
        qapp.processEvents()
        # Generous: a hang was over a minute; here each case takes about a second.
        assert time.perf_counter() - start < 20, name
    shown = view.toPlainText()
    assert "\u200b" in shown  # the unbroken line has break opportunities for layout...
    view.selectAll()
    copied = view.createMimeDataFromSelection().text()
    assert "y" * (MARKDOWN_LIMIT - 10) in copied  # ...that copying takes out again
    assert "\u200b" not in copied


def test_streamed_runs_get_break_opportunities(qapp: QApplication) -> None:
    view = TranscriptView()
    view.begin_reply(1)
    for _ in range(3 * RUN_LIMIT // 10):
        view.append_stream("z" * 10)
    text = view.toPlainText()
    assert text.count("\u200b") == 2
    assert max(len(run) for run in text.split("\u200b")) <= RUN_LIMIT + 20
