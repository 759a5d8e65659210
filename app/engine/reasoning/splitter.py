"""Splitting a streamed reply into thinking and answer, as the text arrives.

A ``ReasoningSplitter`` is fed the reply's text piece by piece (a token at a time,
or a server's deltas) and gives back ``(reasoning, text)`` parts. Markers may arrive
split across pieces: text that could be the start of a marker is held back until
it is known not to be. The rules, each for a trap users of other apps report:

- a reply whose prompt opened the block (the template prefills ``<think>``) starts
  inside it;
- the open marker counts only before any answer text (leading whitespace allowed):
  one later in the answer is the model writing about it;
- inside the block, the first close marker ends it; with ``marker_tokens`` (the
  markers are single control tokens of the model) only that token ends it, so a
  ``</think>`` written out in the thoughts does not;
- a stray close marker (the block never opened, or already ended) is dropped, never
  shown (a later open marker is answer text); whether a reply starts inside the
  block is read from the prompt itself;
- a reply that ends inside the block keeps it as thinking, with an empty answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from app.engine.reasoning.format import ReasoningFormat
from app.engine.stopping import partial_suffix

Part = tuple[bool, str]
"""(True for thinking, text)."""


class Splitter(Protocol):
    """What the decode loop asks of a thinking splitter (this module's, or llama.cpp's
    parser in ``chat_format.stream``)."""

    @property
    def fmt(self) -> ReasoningFormat: ...

    @property
    def inside(self) -> bool: ...

    @property
    def closed(self) -> bool: ...  # the block has ended

    @property
    def answered(self) -> bool: ...  # answer text other than whitespace was given out

    def feed(self, text: str, marker: bool = False) -> list[Part]: ...

    def flush(self) -> list[Part]: ...

    def end_thinking(self) -> list[Part]: ...


@dataclass
class ReasoningSplitter:
    """One reply's stream split into thinking and answer (see the module docstring)."""

    fmt: ReasoningFormat
    inside: bool = False  # in the thinking block now
    marker_tokens: bool = False  # markers count only when fed with ``marker=True``
    thought: bool = False  # a block was opened (or the reply started in one)
    closed: bool = False  # the block has ended
    answered: bool = False  # answer text other than whitespace has been given out
    _held: str = ""
    _lead_left: str = field(default="", init=False)
    _lead_seen: str = field(default="", init=False)  # the lead's start, held until it is whole

    def __post_init__(self) -> None:
        if self.inside:
            self.thought = True

    def feed(self, text: str, marker: bool = False) -> list[Part]:
        """The parts ``text`` completes. ``marker``: ``text`` is one control token."""
        if self.marker_tokens:
            if marker and text in (self.fmt.open, self.fmt.close):
                return self._marker(text)
            return self._text(text) if text else []
        out: list[Part] = []
        text = self._held + text
        self._held = ""
        while text:
            cut, found = self._next_marker(text)
            if found:
                out += self._text(text[:cut])
                out += self._marker(found)
                text = text[cut + len(found) :]
                continue
            keep = self._partial(text)
            out += self._text(text[: len(text) - keep])
            self._held = text[len(text) - keep :]
            break
        return _merge(out)

    def flush(self) -> list[Part]:
        """The held-back text, once the reply has ended."""
        held, self._held = self._held, ""
        out = self._text(held)
        if self._lead_seen:  # the reply ended inside what looked like the answer's lead
            out.append((False, self._lead_seen))
            self._lead_left = self._lead_seen = ""
        return _merge(out)

    def end_thinking(self) -> list[Part]:
        """The engine closed the block itself (a budget, Stop thinking), writing the
        answer's lead too (``ReasoningFormat.closing``): what was held back is thinking."""
        if not self.inside:
            return []
        held, self._held = self._held, ""
        self.inside, self.closed = False, True
        return [(True, held)] if held else []

    # -- internals ---------------------------------------------------------------------

    def _wanted(self) -> tuple[str, ...]:
        if self.inside:
            return (self.fmt.close,)
        if self.closed:
            return ()
        return (
            (self.fmt.close,) if self.thought or self.answered else (self.fmt.open, self.fmt.close)
        )

    def _next_marker(self, text: str) -> tuple[int, str]:
        best = (-1, "")
        for m in self._wanted():
            i = text.find(m)
            if i >= 0 and (best[0] < 0 or i < best[0]):
                best = (i, m)
        return best

    def _partial(self, text: str) -> int:
        """How many trailing characters of ``text`` could begin a marker (or the lead)."""
        return partial_suffix(text, (*self._wanted(), self._lead_left))

    def _marker(self, m: str) -> list[Part]:
        if m == self.fmt.open and not self.inside and not self.thought and not self.answered:
            self.inside = self.thought = True
            return []
        if m == self.fmt.close and self.inside:
            self.inside, self.closed = False, True
            self._lead_left, self._lead_seen = self.fmt.answer_lead, ""
            return []
        if m != self.fmt.close:
            return self._text(m)  # an open marker once the answer began: the model's words
        self.closed = True  # a stray close marker: never shown
        return []

    def _text(self, text: str) -> list[Part]:
        if not text:
            return []
        if self.inside:
            return [(True, text)]
        if self._lead_left:
            stripped = text.lstrip() if not self.answered else text
            lead = self._lead_left
            if lead.startswith(stripped):
                self._lead_left = lead[len(stripped) :]
                self._lead_seen = self._lead_seen + stripped if self._lead_left else ""
                return []
            if stripped.startswith(lead):
                text = stripped[len(lead) :]
            elif self._lead_seen:
                # Not the lead after all (gpt-oss's header of a call, say): keep what it held.
                text = self._lead_seen + stripped
            self._lead_left = self._lead_seen = ""
        if not self.answered:
            text = text.lstrip() if self.thought else text
            if not text:
                return []
            self.answered = not text.isspace()
        return [(False, text)]


def _merge(parts: list[Part]) -> list[Part]:
    out: list[Part] = []
    for kind, text in parts:
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def split_text(fmt: ReasoningFormat, text: str, inside: bool = False) -> tuple[str, str]:
    """A whole reply split at once: (thinking, answer)."""
    splitter = ReasoningSplitter(fmt, inside=inside)
    parts = splitter.feed(text) + splitter.flush()
    return (
        "".join(t for r, t in parts if r).strip(),
        "".join(t for r, t in parts if not r),
    )
