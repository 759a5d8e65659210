"""HTML pages: visible text in paragraphs (block elements end one), with source lines."""

from __future__ import annotations

from html.parser import HTMLParser

from app.documents.parse_text import RawBlock, decode_text, split_long

_SKIP = frozenset({"script", "style", "head", "template", "noscript"})
_BLOCK = frozenset(
    {
        *("address", "article", "aside", "blockquote", "body", "br", "caption", "dd"),
        *("details", "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer"),
        *("form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li", "main", "nav"),
        *("ol", "p", "pre", "section", "summary", "table", "td", "th", "tr", "ul"),
    }
)
MAX_TITLE_CHARS = 300


class _TextParser(HTMLParser):
    """Collects paragraphs; no element stack is kept, so deep nesting costs nothing."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[RawBlock] = []
        self.title = ""
        self._skip: dict[str, int] = {}
        self._in_title = False
        self._part: list[str] = []
        self._line = 0

    def _flush(self) -> None:
        if not self._part:
            return
        text = " ".join(" ".join(self._part).split())
        if text:
            self.blocks.extend(split_long(text, None, self._line))
        self._part.clear()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag == "body":
            self._skip.pop("head", None)  # an unclosed <head> ends at <body>
        if tag in _SKIP:
            self._skip[tag] = self._skip.get(tag, 0) + 1
        if tag in _BLOCK:
            self._flush()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if self._skip.get(tag):
            self._skip[tag] -= 1
            if not self._skip[tag]:
                del self._skip[tag]
        if tag in _BLOCK:
            self._flush()

    def handle_data(self, data: str) -> None:
        if self._in_title:
            if len(self.title) < MAX_TITLE_CHARS:
                self.title = " ".join(f"{self.title} {data}".split())[:MAX_TITLE_CHARS]
            return
        if self._skip or not data.strip():
            return
        if not self._part:
            self._line = self.getpos()[0] + data[: len(data) - len(data.lstrip())].count("\n")
        self._part.append(data)

    def finish(self) -> None:
        self.close()
        self._flush()


def parse_html(data: bytes, name: str) -> tuple[str, list[RawBlock]]:
    """(title, blocks) of an HTML page; ``line`` is the source line where a paragraph starts."""
    parser = _TextParser()
    parser.feed(decode_text(data, name))
    parser.finish()
    return parser.title, parser.blocks
