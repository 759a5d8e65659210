"""Tools with llama-server's native API, the way the in-process engine does them.

The llama.cpp-server backend renders every prompt itself and sends it to
``/completion`` as token ids, so the server's slot holds exactly the tokens this
client tracks (snapshots, prewarm, the overflow policies depend on it). Tools keep
that path rather than switching to ``/v1/chat/completions``, where the server would
render the chat with its own template (not the one chosen here), re-tokenize the
reply, and put the client's map of the slot out of step; a follow-up would then
re-read the assistant turn as the server re-renders it, not only the tool result.

So the request's template is bound with the tools (``tool_binding.bind_tools``:
the model's own way, or the generic Hermes form), its renders include them in every
prompt and prewarm (the definitions are part of the cached prefix), the grammar of
the call format goes to ``/completion`` as a lazy grammar (``grammar_lazy``,
``grammar_triggers``, ``preserved_tokens``: llama-server's own sampler arms it), and
the answer text is parsed here by the same ``ToolCallParser`` as in-process; nothing
in a thinking block is parsed.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import replace
from typing import Any

from app.config.field_spec import SettingError
from app.engine.backend import (
    SERVER_ERROR,
    SIZE_LIMIT,
    TIME_LIMIT,
    CallProgress,
    EngineEvent,
    Finished,
    Token,
)
from app.engine.templates.chat_template import ChatTemplate
from app.engine.tool_spec import TOOL_CALLS, ToolRequest
from app.engine.tools.binding import ToolDecoding, bind_tools, tool_decoding
from app.engine.tools.format import ToolFormat, template_tool_format
from app.engine.tools.native_reply import NativeReply

TRIGGER_WORD = 1  # llama.cpp's COMMON_GRAMMAR_TRIGGER_TYPE_WORD (a token when it is one)
TRIGGER_PATTERN = 2  # COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN
# A reply that ended so makes no calls: what came may be half a call.
_NO_CALLS = ("cancelled", "connection_lost", SERVER_ERROR, TIME_LIMIT, SIZE_LIMIT)


class ServerTools:
    """One request's tools on the ``/completion`` path (None: nothing to call)."""

    def __init__(self, tools: ToolRequest | None, has_token: Callable[[str], bool]) -> None:
        self.tools = tools
        self._has_token = has_token
        self.decoding: ToolDecoding | None = None
        self.native: NativeReply | None = None  # llama.cpp reads the reply (set per request)
        self._markers: tuple[str, ...] = ()  # what the reply's parsers read (set by start)

    def format(self, template: ChatTemplate) -> ToolFormat:
        """How ``template``'s model writes calls (the generic form when it knows none)."""
        return template_tool_format(template, self._has_token)

    def bind(self, template: ChatTemplate) -> ChatTemplate:
        """``template`` rendering the request's tools (and past calls and results)."""
        return bind_tools(template, self.tools, self.format)

    def start(self, template: ChatTemplate, prompt: str, grammar: str) -> None:
        """Ready the parser and grammar for a reply to ``prompt``.

        Raises:
            SettingError: tools asked for together with structured output (``grammar``).
        """
        if self.native is not None:
            self.decoding = self.native.tools
            self._markers = self.native.preserved
        else:
            fmt = self.format(template)
            self.decoding = tool_decoding(fmt, self.tools, template.reasoning, prompt)
            r = template.reasoning
            thinking = (r.open, r.close) if r is not None else ()
            calls = fmt.markers if self.decoding is not None else ()
            self._markers = tuple(m for m in (*calls, *thinking) if m)
        if grammar and self.decoding is not None:
            raise SettingError(
                "output_format", "Tools cannot be offered in a reply with structured output."
            )

    def grammar_fields(self, grammar: str) -> dict[str, Any]:
        """The ``/completion`` fields of the reply's grammar: the output format's, or the
        tool calls' (lazy: armed by its triggers)."""
        g = self.decoding.grammar if self.decoding is not None else None
        if g is None:
            return {"grammar": grammar} if grammar else {}
        if not g.lazy:  # an eager chat-format grammar starts with the generation prompt
            if not g.prefill:
                return {"grammar": g.gbnf}
            # "tool_calls": the server feeds the grammar the generation prompt first.
            return {"grammar": g.gbnf, "grammar_type": "tool_calls", "generation_prompt": g.prefill}
        triggers = [{"type": TRIGGER_PATTERN, "value": p} for p in g.patterns]
        triggers += [{"type": TRIGGER_WORD, "value": t} for t in g.tokens]
        if not triggers:  # the server refuses a lazy grammar with nothing to arm it
            return {}
        return {
            "grammar": g.gbnf,
            "grammar_lazy": True,
            "grammar_triggers": triggers,
        }

    def preserved(self) -> tuple[str, ...]:
        """The markers the reply's parsers read, which llama-server must write as text
        where they are control tokens (it writes those as nothing otherwise): llama.cpp's
        for its format; else the Python family's call markers, the thinking markers and
        the grammar's token triggers."""
        g = self.decoding.grammar if self.decoding is not None else None
        return tuple(dict.fromkeys((*(g.tokens if g is not None else ()), *self._markers)))

    def stops(self) -> tuple[str, ...]:
        """llama.cpp's extra stop strings for the reply's format."""
        return self.native.stops if self.native is not None else ()

    def parse(
        self, events: Generator[EngineEvent, None, None]
    ) -> Generator[EngineEvent, None, None]:
        """``events`` with the calls taken out of the answer text; the calls end the
        reply (``Finished.tool_calls``, ``stop_reason`` "tool_calls")."""
        shown: list[str] = []
        call_pieces = 0  # of a call being written: shown as progress, not text
        for event in events:
            decoding = self.decoding
            if decoding is None:
                yield event
                continue
            parser = decoding.parser
            if isinstance(event, Token) and not event.reasoning:
                text = parser.feed(event.text)
                if text:
                    shown.append(text)
                    yield replace(event, text=text)
                elif parser.started:
                    call_pieces += 1
                    yield CallProgress(call_pieces, parser.call_chars)
            elif isinstance(event, Finished):
                tail = parser.finish()
                if tail:
                    shown.append(tail)
                    yield Token(tail)
                metrics = event.metrics
                calls = tuple(parser.calls) if metrics.stop_reason not in _NO_CALLS else ()
                metrics.notes.extend(parser.problems)
                if calls:
                    metrics.stop_reason = TOOL_CALLS
                yield Finished("".join(shown), metrics, event.reasoning, calls)
            else:
                yield event
