"""Markdown to the HTML subset Qt's rich text engine draws, with highlighted code.

Raw HTML in the source is escaped, never passed through, and images are not
rendered (no remote or local resource is ever referenced). Links are made only
for absolute http, https and mailto targets: the text a model writes can never
form a link into the app's own action namespace.

Rendering time is bounded for any input (a pasted 1 MB log, one unbroken 1 MB
line, thousands of brackets or code blocks): long messages are shown as plain
text, code is highlighted only up to a size per block and per message, and
unbroken runs of characters get invisible break opportunities, because Qt lays
out a line with no break opportunity in quadratic time. The parser's work is
counted in rule calls (``OPS_BUDGET`` per message; a message past it is shown
as plain text), and structure nested deeper than ``MAX_LEVEL`` (lists in lists
in quotes...) is shown as plain text where it starts: markdown-it would drop
everything past its own nesting limit, and Qt slows down with every level.
"""

from __future__ import annotations

import contextlib
import html
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

LIGHT_STYLE = "default"
DARK_STYLE = "monokai"

LINK_SCHEMES = ("http:", "https:", "mailto:")
MARKDOWN_LIMIT = 100_000  # characters; a longer message is shown as plain text
HIGHLIGHT_LIMIT = 20_000  # characters of one code block coloured by its language
HIGHLIGHT_BUDGET = 40_000  # characters coloured in one message, all blocks together
GUESS_LIMIT = 4_000  # characters of an unlabelled block whose language is guessed
GUESS_BLOCKS = 8  # unlabelled blocks per message whose language is guessed (~2 ms each)
# Parser rule calls per message: real text takes about 1.3 per character (a 100,000
# character log 130,000), text made of markup only up to 20 (100,000 "[" 1,900,000, which
# took 2-4 s). 200,000 calls take 0.2-0.7 s on a busy 2-core machine.
OPS_BUDGET = 200_000
# Block nesting past which the rest of a block is plain text: 8 lists deep (each list
# and item is a level), under markdown-it's maxNesting (20), past which it drops text.
MAX_LEVEL = 16
RUN_LIMIT = 500  # characters of an unbroken run before a break opportunity
BREAK = "\u200b"  # zero-width space: a break opportunity that draws nothing
_RUN = re.compile(r"\S{" + str(RUN_LIMIT + 1) + ",}")


def breakable(text: str) -> str:
    """``text`` with a zero-width space every ``RUN_LIMIT`` characters of an unbroken run.

    Copying from the view strips them again (``strip_breaks``).
    """
    if len(text) <= RUN_LIMIT:
        return text

    def split(m: re.Match[str]) -> str:
        run = m.group(0)
        return BREAK.join(run[i : i + RUN_LIMIT] for i in range(0, len(run), RUN_LIMIT))

    return _RUN.sub(split, text)


def strip_breaks(text: str) -> str:
    return text.replace(BREAK, "")


def safe_link(url: str) -> bool:
    """Whether a Markdown link target becomes a link: absolute http, https or mailto only."""
    return url.strip().lower().startswith(LINK_SCHEMES)


def plain_html(text: str) -> str:
    """``text`` as escaped, wrapped plain text (no Markdown)."""
    return f'<p style="white-space: pre-wrap">{html.escape(breakable(text))}</p>'


class _TooMuchWork(Exception):
    """The parser used up ``OPS_BUDGET`` on one message."""


def _counted(rule: Callable[..., Any]) -> Callable[..., Any]:
    """``rule`` counting its calls in the render's ``env`` (one count per message)."""

    def counted(state: Any, *args: Any) -> Any:
        env = state.env
        env["ops"] = ops = env.get("ops", 0) + 1
        if ops > OPS_BUDGET:
            raise _TooMuchWork
        return rule(state, *args)

    return counted


def _flat_when_deep(state: Any, start: int, end: int, silent: bool) -> bool:
    """Block rule: past ``MAX_LEVEL``, the rest of this block is one plain-text token."""
    if state.level < MAX_LEVEL:
        return False
    if silent:
        return True
    line = start + 1
    while line < end and not state.isEmpty(line) and state.sCount[line] >= state.blkIndent:
        line += 1
    token = state.push("flat_text", "", 0)
    token.content = state.getLines(start, line, state.blkIndent, False)
    token.map = [start, line]
    state.line = line
    return True


def _lexer(lang: str, code: str, env: dict[str, Any]) -> Any:
    """The lexer for one block; ``env`` keeps what is left of the message's budgets."""
    left = env.setdefault("highlight_left", HIGHLIGHT_BUDGET)
    if len(code) > min(HIGHLIGHT_LIMIT, left):
        return TextLexer()
    env["highlight_left"] = left - len(code)
    if lang:
        try:
            return get_lexer_by_name(lang)
        except ClassNotFound:
            return TextLexer()
    guesses = env.setdefault("guesses_left", GUESS_BLOCKS)
    if len(code) > GUESS_LIMIT or guesses <= 0:
        return TextLexer()
    env["guesses_left"] = guesses - 1
    try:
        lexer = guess_lexer(code)
    except ClassNotFound:
        return TextLexer()
    # A weak guess colours prose as code; plain text is the safer default.
    return lexer if lexer.analyse_text(code) >= 0.3 else TextLexer()


class MarkdownRenderer:
    """Renders chat messages; one instance per colour scheme."""

    def __init__(self, dark: bool = False) -> None:
        self.dark = dark
        self._formatter = HtmlFormatter(
            style=DARK_STYLE if dark else LIGHT_STYLE, noclasses=True, nowrap=True
        )
        self._code_bg = "#272822" if dark else "#f3f4f6"
        self._code_fg = "#f8f8f2" if dark else "#1f2328"
        md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
        md.enable(["table", "strikethrough"])
        md.disable("image")
        # Instance attribute: markdown-it calls ``self.validateLink`` for links and autolinks.
        md.validateLink = safe_link  # type: ignore[method-assign]

        # markdown-it binds rules to its renderer, so the rule takes that as ``self``.
        def fence(_renderer: Any, tokens: Any, idx: int, _options: Any, env: Any) -> str:
            return self._render_fence(tokens[idx], env)

        def text(_renderer: Any, tokens: Any, idx: int, _options: Any, _env: Any) -> str:
            return html.escape(breakable(tokens[idx].content), quote=False)

        def code_inline(_renderer: Any, tokens: Any, idx: int, _options: Any, _env: Any) -> str:
            return f"<code>{html.escape(breakable(tokens[idx].content), quote=False)}</code>"

        # validateLink is not asked about an empty target (``[x]()``): a link whose
        # target is not a safe one is shown as its text alone.
        def link_open(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
            safe = safe_link(str(tokens[idx].attrGet("href") or ""))
            env.setdefault("links", []).append(safe)
            return str(renderer.renderToken(tokens, idx, options, env)) if safe else ""

        def link_close(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
            safe = env["links"].pop() if env.get("links") else False
            return str(renderer.renderToken(tokens, idx, options, env)) if safe else ""

        def flat_text(_renderer: Any, tokens: Any, idx: int, _options: Any, _env: Any) -> str:
            return plain_html(tokens[idx].content) + "\n"

        # Every parser rule counts against the message's budget; the nesting guard first.
        for ruler in (md.core.ruler, md.block.ruler, md.inline.ruler, md.inline.ruler2):
            for rule in ruler.__rules__:
                rule.fn = _counted(rule.fn)
            ruler.__cache__ = None
        md.block.ruler.before(md.block.ruler.get_all_rules()[0], "flat_when_deep", _flat_when_deep)
        md.add_render_rule("flat_text", flat_text)
        md.add_render_rule("link_open", link_open)
        md.add_render_rule("link_close", link_close)
        md.add_render_rule("fence", fence)
        md.add_render_rule("code_block", fence)
        md.add_render_rule("text", text)
        md.add_render_rule("code_inline", code_inline)
        self._md = md

    def render(self, text: str, code_link: Callable[[int], str] | None = None) -> str:
        """HTML for ``text``; safe to hand to ``QTextDocument``, in bounded time.

        ``code_link(n)``, when given, is the target of a "Copy" link on the ``n``-th code
        block (counted as ``code_blocks`` counts them). It comes from the caller, never
        from the text, so the text still cannot make an app link.
        """
        if len(text) > MARKDOWN_LIMIT:
            return plain_html(text)
        env: dict[str, Any] = {"code_link": code_link, "blocks": 0}
        try:
            tokens = self._md.parse(text, env)
        except _TooMuchWork:
            return plain_html(text)
        return str(self._md.renderer.render(tokens, self._md.options, env))

    def code_blocks(self, text: str) -> list[str]:
        """The source of each code block of ``text``, in the order ``render`` links them
        (none when ``render`` shows the text plain)."""
        if len(text) > MARKDOWN_LIMIT:
            return []
        try:
            tokens = self._md.parse(text, {})
        except _TooMuchWork:
            return []
        return [t.content.rstrip("\n") for t in tokens if t.type in ("fence", "code_block")]

    def ops(self, text: str) -> int:
        """Parser rule calls for ``text`` (``OPS_BUDGET`` + 1 when it ran out)."""
        env: dict[str, Any] = {}
        with contextlib.suppress(_TooMuchWork):
            self._md.parse(text, env)
        return int(env.get("ops", 0))

    def _render_fence(self, token: Any, env: dict[str, Any]) -> str:
        lang = (token.info or "").strip().split(maxsplit=1)[0] if token.info else ""
        code = breakable(token.content.rstrip("\n"))
        body = highlight(code, _lexer(lang, code, env), self._formatter).rstrip("\n")
        n = env.get("blocks", 0)
        env["blocks"] = n + 1
        link = env.get("code_link")
        copy = f'<a href="{html.escape(link(n))}" style="color:#6b7a90">Copy</a>' if link else ""
        caption = (
            '<tr><td style="color:#888888; font-size:small">'
            f'{html.escape(lang)}</td><td align="right" style="font-size:small">{copy}</td></tr>'
            if lang or copy
            else ""
        )
        # Qt draws backgrounds on table cells, not on <pre>, so code sits in a table.
        return (
            f'<table width="100%" cellspacing="0" cellpadding="6" bgcolor="{self._code_bg}">'
            f'{caption}<tr><td colspan="2"><pre style="color:{self._code_fg}">{body}</pre>'
            "</td></tr></table>\n"
        )


@lru_cache(maxsize=2)
def renderer(dark: bool = False) -> MarkdownRenderer:
    return MarkdownRenderer(dark)


def render_markdown(
    text: str, dark: bool = False, code_link: Callable[[int], str] | None = None
) -> str:
    return renderer(dark).render(text, code_link)


def code_blocks(text: str) -> list[str]:
    """The source of each code block of ``text`` (see ``MarkdownRenderer.code_blocks``)."""
    return renderer(False).code_blocks(text)
