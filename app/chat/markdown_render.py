"""Markdown to the HTML subset Qt's rich text engine draws, with highlighted code.

Raw HTML in the source is escaped, never passed through, and images are not
rendered (no remote or local resource is ever referenced).
"""

from __future__ import annotations

import html
from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

LIGHT_STYLE = "default"
DARK_STYLE = "monokai"


def _lexer(lang: str, code: str) -> Any:
    if lang:
        try:
            return get_lexer_by_name(lang)
        except ClassNotFound:
            return TextLexer()
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

        # markdown-it binds rules to its renderer, so the rule takes that as ``self``.
        def fence(_renderer: Any, tokens: Any, idx: int, _options: Any, _env: Any) -> str:
            return self._render_fence(tokens[idx])

        md.add_render_rule("fence", fence)
        md.add_render_rule("code_block", fence)
        self._md = md

    def render(self, text: str) -> str:
        """HTML for ``text``; safe to hand to ``QTextDocument``."""
        return str(self._md.render(text))

    def _render_fence(self, token: Any) -> str:
        lang = (token.info or "").strip().split(maxsplit=1)[0] if token.info else ""
        code = token.content.rstrip("\n")
        body = highlight(code, _lexer(lang, code), self._formatter).rstrip("\n")
        caption = (
            f'<tr><td style="color:#888888; font-size:small">{html.escape(lang)}</td></tr>'
            if lang
            else ""
        )
        # Qt draws backgrounds on table cells, not on <pre>, so code sits in a one-cell table.
        return (
            f'<table width="100%" cellspacing="0" cellpadding="6" bgcolor="{self._code_bg}">'
            f'{caption}<tr><td><pre style="color:{self._code_fg}">{body}</pre></td></tr>'
            "</table>\n"
        )


@lru_cache(maxsize=2)
def renderer(dark: bool = False) -> MarkdownRenderer:
    return MarkdownRenderer(dark)


def render_markdown(text: str, dark: bool = False) -> str:
    return renderer(dark).render(text)
