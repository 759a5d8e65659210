"""One reply's stream parsed by llama.cpp's parser, in the shapes the decode loop uses.

The decode loop feeds a thinking splitter (``ReasoningSplitter``) and passes the
answer through a tool-call parser (``ToolCallParser``). For a template llama.cpp
formats, :class:`NativeSplitter` and :class:`NativeCalls` take their places, sharing a
:class:`NativeStream`: every piece re-parses the reply so far and what grew is shown
(thinking and answer apart); call markup never reaches the answer, a marker being
written is held back, and the calls come from the final parse. A reply that ends
inside a call (Stop, the token limit) or does not follow the format keeps its text;
its unfinished calls are reported, never run and never shown as raw syntax.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass

from app.engine.chat_format.reply import ParsedReply, ReplyParser
from app.engine.chat_message import ToolCall
from app.engine.reasoning.format import ReasoningFormat

Part = tuple[bool, str]  # (True for thinking, text), as ReasoningSplitter gives
_ID_CHARS = string.ascii_letters + string.digits
MAX_CALLS = 32  # in one reply, as the Python parser allows


class NativeStream:
    """The reply's text so far, its latest parse, and what of it has been given out."""

    def __init__(self, parser: ReplyParser, ends: tuple[str, ...], starts_inside: bool):
        self._parser = parser
        self.ends = ends  # the thinking block's end tags
        self.text = ""
        self.last = ParsedReply()
        self.final: ParsedReply | None = None
        self._reasoning = ""  # given out so far
        self.closed_by_engine = False  # the engine wrote the block's end itself
        self._content = ""
        self._starts_inside = starts_inside
        self._saw_end = False
        self._longest_end = max((len(e) for e in ends), default=0)

    @property
    def saw_end(self) -> bool:
        """A thinking end tag was written (found once, in the new text and just before it:
        ``inside`` is asked every token)."""
        return self._saw_end

    def _append(self, text: str) -> None:
        self.text += text
        if not self._saw_end:
            tail = self.text[-(len(text) + self._longest_end) :]
            self._saw_end = any(e and e in tail for e in self.ends)

    @property
    def inside(self) -> bool:
        """In the thinking block: it opened (or the prompt opened it) and has not ended."""
        last = self.last
        if last.content.strip() or last.calls or self.closed_by_engine or self.saw_end:
            return False
        return bool(last.reasoning) or self._starts_inside

    def add(self, piece: str) -> list[Part]:
        self._append(piece)
        return self._give(self._parser.update(self.text))

    def add_silently(self, text: str) -> None:
        """Text the engine evaluated itself (the end of a thinking block): parsed, and its
        thinking counted as given out (the caller shows its own words for it)."""
        self._append(text)
        self.closed_by_engine = True
        self.last = self._parser.update(self.text)
        self._reasoning = self.last.reasoning

    def finish(self) -> list[Part]:
        """The final parse (once); what it adds is given out."""
        if self.final is not None:
            return []
        self.final = self._parser.finish(self.text)  # not matched: the partial parse
        out = self._give(self.final)
        self._parser.close()
        return out

    def _give(self, parsed: ParsedReply) -> list[Part]:
        self.last = parsed
        out: list[Part] = []
        grown = _grown(self._reasoning, parsed.reasoning)
        if grown:
            self._reasoning += grown
            out.append((True, grown))
        grown = _grown(self._content, parsed.content)
        if grown:
            self._content += grown
            out.append((False, grown))
        return out


def _whole(arguments: str) -> bool:
    """Arguments that are a whole JSON object (a call cut off mid-value is not)."""
    try:
        return isinstance(json.loads(arguments or "{}"), dict)
    except ValueError:
        return False


def _grown(shown: str, now: str) -> str:
    """What ``now`` adds to ``shown``; '' when it does not extend it (the parser revised
    text it had given: what was shown stands)."""
    return now[len(shown) :] if now.startswith(shown) else ""


@dataclass
class NativeSplitter:
    """``ReasoningSplitter``'s face over a :class:`NativeStream`."""

    stream: NativeStream
    fmt: ReasoningFormat

    @property
    def inside(self) -> bool:
        return self.stream.inside

    @property
    def closed(self) -> bool:
        """The block ended: its close was written (or the engine wrote it), or thinking
        gave way to the answer or a call."""
        stream = self.stream
        if stream.inside:
            return False
        return stream.closed_by_engine or bool(stream.last.reasoning) or stream.saw_end

    @property
    def answered(self) -> bool:
        return bool(self.stream.last.content.strip())

    def feed(self, text: str, marker: bool = False) -> list[Part]:
        return self.stream.add(text) if text else []

    def flush(self) -> list[Part]:
        return self.stream.finish()

    def end_thinking(self) -> list[Part]:
        self.stream.add_silently(self.fmt.closing())
        return []


class NativeCalls:
    """``ToolCallParser``'s face over a :class:`NativeStream`: the answer text it is
    given is already free of call markup; the calls come from the final parse."""

    def __init__(
        self,
        stream: NativeStream,
        id_prefix: str = "call_",
        parallel: bool = True,
        openers: tuple[str, ...] = (),
    ) -> None:
        self._stream = stream
        self._openers = openers  # how a call starts (``tools.grammar.call_openers``)
        self._prefix = id_prefix
        self._parallel = parallel
        self._calls: list[ToolCall] | None = None
        self.problems: list[str] = []

    @property
    def started(self) -> bool:
        return bool(self._stream.last.calls)

    @property
    def call_chars(self) -> int:
        return sum(len(c.arguments) for c in self._stream.last.calls)

    def feed(self, text: str) -> str:
        return text

    def finish(self) -> str:
        self._stream.finish()
        return ""

    @property
    def calls(self) -> list[ToolCall]:
        if self._calls is None:
            self._calls = self._read()
        return self._calls

    def _held_back(self, final: ParsedReply) -> bool:
        """Whether what follows the reply's answer (or its thinking, when it has no
        answer) is the start of a call, which the parser read as none."""
        if self._stream.inside or not self._openers:
            return False  # the reply ended inside its thinking
        text = self._stream.text
        for said in (final.content.strip(), final.reasoning.strip()):
            if said and said in text:
                text = text[text.rindex(said) + len(said) :]
                break
        rest = text.strip()
        closes = [e.strip() for e in self._stream.ends if e.strip().startswith("</")]
        while close := next((c for c in closes if rest.startswith(c)), ""):
            rest = rest[len(close) :].strip()
        return bool(rest) and any(rest.startswith(o) or o.startswith(rest) for o in self._openers)

    def _read(self) -> list[ToolCall]:
        final = self._stream.final
        if final is None:
            return []
        last = len(final.calls) - 1
        whole = []
        for i, call in enumerate(final.calls):
            if _whole(call.arguments) and (final.matched or i < last):
                whole.append(call)
            else:  # the reply ended inside it: never run, never shown as syntax
                who = f"a call to '{call.name}'" if call.name else "a tool call"
                self.problems.append(f"The model's reply ended inside {who}; it was not run.")
        if not final.calls and self._held_back(final):
            # Ended before a call had a name: the parser keeps its start out of the
            # answer, and it is no call either.
            self.problems.append("The model's reply ended inside a tool call; it was not run.")
        # llama.cpp's grammars allow several calls whatever the request said: one when the
        # request asked for one (OpenAI's parallel_tool_calls=false), at most MAX_CALLS.
        keep = 1 if not self._parallel else MAX_CALLS
        if len(whole) > keep:
            self.problems.append(f"The model made {len(whole)} calls; only {keep} allowed.")
            whole = whole[:keep]
        out: list[ToolCall] = []
        seen: set[str] = set()
        for call in whole:
            own = call.id if call.id and call.id not in seen else ""
            ident = own or self._prefix + "".join(secrets.choice(_ID_CHARS) for _ in range(9))
            seen.add(ident)
            out.append(ToolCall(ident, call.name, call.arguments or "{}"))
        return out
