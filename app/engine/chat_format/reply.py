"""The streamed reply parsed by llama.cpp's parser for its format, in-process.

Like llama-server, every update re-parses the whole reply so far (``is_partial``) and
the caller takes the difference; the parser holds back a marker that is still being
written, so half a ``<tool_call>`` is never shown. Unlike llama-server, a final parse
that does not match the format never loses the reply: the partial parse of the same
text is kept and :attr:`ParsedReply.matched` says the format was not followed.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from app.engine.chat_format.formatted import FormattedChat
from app.engine.native.chat_shim import ChatShim, ShimError


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text; partial while the call is being written
    id: str


@dataclass(frozen=True)
class ParsedReply:
    content: str = ""
    reasoning: str = ""
    calls: tuple[ParsedCall, ...] = ()
    matched: bool = True  # False: the final text did not follow the format

    @classmethod
    def from_shim(cls, d: dict[str, Any]) -> ParsedReply:
        calls = []
        for call in d.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else {}
            args = fn.get("arguments", "")
            args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            calls.append(ParsedCall(str(fn.get("name", "")), args, str(call.get("id", ""))))
        content = d.get("content") or ""
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return cls(
            content=str(content),
            reasoning=str(d.get("reasoning_content") or ""),
            calls=tuple(calls),
        )


class ReplyParser:
    """One reply's parser: built from an apply's result, freed by :meth:`close`."""

    def __init__(self, shim: ChatShim, formatted: FormattedChat, *, tools: bool = True) -> None:
        self._shim = shim
        self._lock = threading.Lock()
        spec = {
            "format": formatted.format_id,
            "generation_prompt": formatted.generation_prompt,
            "parser": formatted.parser_spec,
            "parse_tool_calls": tools,
        }
        self._handle: int | None = shim.parser_new(spec)
        self.last = ParsedReply()

    def update(self, text: str) -> ParsedReply:
        """The reply so far; on a refusal the last good parse stands."""
        with contextlib.suppress(ShimError):
            self.last = self._parse(text, partial=True)
        return self.last

    def finish(self, text: str, *, cut: bool = False) -> ParsedReply:
        """The whole reply. ``cut``: it was stopped or ran out of tokens, so it is parsed
        as partial (an unfinished call stays a call, never raw syntax)."""
        if not cut:
            try:
                return self._parse(text, partial=False)
            except ShimError:
                pass
        try:
            found = self._parse(text, partial=True)
        except ShimError:
            found = ParsedReply(content=text)
        return ParsedReply(found.content, found.reasoning, found.calls, matched=cut)

    def close(self) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            self._shim.parser_free(handle)

    def _parse(self, text: str, *, partial: bool) -> ParsedReply:
        with self._lock:
            if self._handle is None:
                raise ShimError("the parser is closed")
            answer = self._shim.parse(self._handle, text, partial)
        return ParsedReply.from_shim(answer)

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.close()
