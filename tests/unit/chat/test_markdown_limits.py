"""Markdown of any shape renders in bounded work, and nothing written is left out.

A list nested deeper than markdown-it's limit lost everything after that point from
the view; a message of thousands of small code blocks took 14 s (a guess of each
block's language); 100,000 brackets took 2-4 s. Work is counted in parser rule calls
(``OPS_BUDGET``), so the bounds here are counts, with a generous wall bound on top.
"""

from __future__ import annotations

import html
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chat.markdown_render import (
    BREAK,
    GUESS_BLOCKS,
    MARKDOWN_LIMIT,
    OPS_BUDGET,
    MarkdownRenderer,
    plain_html,
    render_markdown,
)
from tests.hypothesis_budget import examples

WALL_S = 5.0  # generous for a loaded 2-core machine; typical is well under a second
TAG = re.compile(r"<[^>]+>")
WORD = re.compile(r"[A-Za-z0-9]*[A-Za-z][A-Za-z0-9]*")


def shown(rendered: str) -> str:
    """The text a reader sees in the rendered HTML."""
    return html.unescape(TAG.sub(" ", rendered)).replace(BREAK, "")


def timed_render(text: str) -> str:
    start = time.perf_counter()
    out = render_markdown(text)
    assert time.perf_counter() - start < WALL_S
    return out


def check_every_word_shown(text: str) -> None:
    seen = shown(timed_render(text))
    missing = [w for w in WORD.findall(text) if w not in seen]
    assert not missing, missing[:5]


DEEP = {
    "list on one line": "- " * 5000 + "deepest",
    "ordered on one line": "1. " * 5000 + "deepest",
    "quotes": "> " * 5000 + "deepest",
    "list by indentation": "".join("  " * i + f"- item{i}\n" for i in range(300)),
    "quotes by line": "".join(">" * i + f" line{i}\n" for i in range(1, 400)),
    "lists in quotes": "".join("> - " * (i % 30) + f"w{i}\n" for i in range(1200)),
    "after the deep part": "- " * 40 + "deep\n\nafter words here\n\n- and a list\n",
}


@pytest.mark.parametrize("text", DEEP.values(), ids=DEEP.keys())
def test_deep_nesting_shows_every_word(text: str) -> None:
    assert len(text) <= MARKDOWN_LIMIT
    assert MarkdownRenderer().ops(text) <= OPS_BUDGET
    check_every_word_shown(text)


def test_shallow_lists_still_render_as_lists() -> None:
    out = render_markdown("- a\n  - b\n    - c\n")
    assert out.count("<ul>") == 3 and "white-space: pre-wrap" not in out


def test_thousands_of_code_blocks_are_bounded() -> None:
    """Each unlabelled block's language was guessed (about 2 ms each)."""
    text = "```\nx = 1\n```\n" * 7000
    renderer = MarkdownRenderer()
    assert renderer.ops(text) <= OPS_BUDGET  # the blocks themselves are cheap to parse
    assert len(text) <= MARKDOWN_LIMIT
    assert shown(timed_render(text)).count("x = 1") == 7000
    assert len(renderer.code_blocks(text)) == 7000
    labelled = "```python\nprint(1)\n```\n" * 200
    coloured = render_markdown(labelled).count("<span")
    assert 0 < coloured < 200 * 10  # coloured while the message's budget lasts
    assert GUESS_BLOCKS < 50


@pytest.mark.parametrize("unit", ["[", "![", "[>***", "**\n\n1.\n>", "a*", "[a]("])
def test_markup_only_text_over_budget_is_shown_plain(unit: str) -> None:
    text = (unit * MARKDOWN_LIMIT)[: MARKDOWN_LIMIT - 1]
    renderer = MarkdownRenderer()
    assert renderer.ops(text) == OPS_BUDGET + 1  # ran out: shown as plain text
    assert timed_render(text) == plain_html(text)
    assert renderer.code_blocks(text) == []  # in step with what render shows


def test_a_real_long_reply_still_renders_as_markdown() -> None:
    reply = (
        "## Steps\n\nThis is **some** text with `code`, a [link](https://x.y) and _emph_.\n\n"
        "- item one\n- item two\n  1. nested\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "```python\nprint('hi')\n```\n\n"
    ) * 500
    text = reply[:MARKDOWN_LIMIT]
    assert MarkdownRenderer().ops(text) < OPS_BUDGET
    assert "<h2>" in timed_render(text)


# Pieces of Markdown whose words always show (no link targets, reference definitions or
# table cells beyond the header's, which Markdown itself hides).
_LIST = ["- ", "* ", "+ ", "1. ", "2) ", "> ", ">", "  ", "    ", "\t", "\n", "\n\n"]
SHOWN_PIECES = st.sampled_from([*_LIST, *"*_`[]<! ", "**", "```\n", "# ", "~~"])
WORDS = st.from_regex(r"[a-z]{1,6}[0-9]{0,2}", fullmatch=True)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.lists(st.one_of(SHOWN_PIECES, WORDS), min_size=1, max_size=30).map("".join),
    st.integers(1, 400),
)
def test_any_nesting_of_markdown_shows_every_word(unit: str, times: int) -> None:
    text = (unit * times)[: MARKDOWN_LIMIT // 4]
    check_every_word_shown(text)


_MARKUP = ["![", "**", "```", "~~", "- ", "1. ", "> ", "  ", "    ", "\n", "\n\n", "[x]: "]
NASTY = st.sampled_from([*"[]()*_`|<>&#\\:=", *_MARKUP, "http://a.b"])


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.lists(st.one_of(NASTY, st.text(min_size=1, max_size=3)), min_size=1, max_size=12).map(
        "".join
    ),
)
def test_any_markdown_renders_within_the_budget(unit: str) -> None:
    text = (unit * (MARKDOWN_LIMIT // len(unit) + 1))[:MARKDOWN_LIMIT]
    assert MarkdownRenderer().ops(text) <= OPS_BUDGET + 1
    timed_render(text)
