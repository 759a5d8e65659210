"""Thinking in one reply: the template a request renders with, and the engine's own
end of a thinking block (a budget, Stop thinking).

``request_template`` binds the request's switches to the chat template: the
template's own variables where it reads them (``enable_thinking``,
``reasoning_effort``, an API request's ``chat_template_kwargs``), else the generation
prompt is written the way such templates write it: an empty block for "off", the
open marker for "on". Every render of the request (prompt, overflow, next turn) then
agrees. ``ThinkingControl`` says when the engine must close the block itself and
what it writes: the budget message, then the template's own closing text.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.config.params import template_variables
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.reasoning.format import ReasoningFormat
from app.engine.reasoning.splitter import ReasoningSplitter, Splitter
from app.engine.templates.chat_template import ChatTemplate


def request_template(template: ChatTemplate, params: SamplingParams) -> ChatTemplate:
    """``template`` with ``params``' thinking switches and template variables bound.

    Raises:
        SettingError: ``params.template_kwargs`` is not a JSON object.
    """
    extra = template_variables(params)
    fmt = template.reasoning
    if template.native is not None:  # llama.cpp takes the switches and writes the block
        extra = {**extra, **_native_switches(params)}
        # ...but a template with no switch of its own that opens the block whatever it is
        # told gets it closed here for "off", as before (its replies then take the Python
        # reading: the prompt is no longer the one llama.cpp rendered). "on" opens nothing.
        write = _writes_block(fmt, params.thinking) if params.thinking == "off" else ""
    else:
        if fmt is not None:
            extra = {**extra, **fmt.extra(params.thinking, params.reasoning_effort)}
        write = _writes_block(fmt, params.thinking)
    if (not extra and not write) or template.completion:
        return template
    base = template.renderer

    def renderer(messages: Sequence[ChatMessage], gen: bool, more: Mapping[str, Any]) -> str:
        text = base(messages, gen, {**extra, **more})
        if gen and fmt is not None and write:
            text = _with_block(text, fmt, write)
        return text

    fallback = template.fallback
    return replace(
        template,
        renderer=renderer,
        fallback=request_template(fallback, params) if fallback is not None else None,
    )


def _native_switches(params: SamplingParams) -> dict[str, Any]:
    """The switches llama.cpp's chat layer reads: ``enable_thinking`` (it knows how each
    family turns thinking on and off) and the effort (``native_request`` leaves an "auto"
    effort out: the template's own default)."""
    out: dict[str, Any] = {}
    if params.thinking in ("on", "off"):
        out["enable_thinking"] = params.thinking == "on"
    if params.reasoning_effort:
        out["reasoning_effort"] = params.reasoning_effort
    return out


def _writes_block(fmt: ReasoningFormat | None, thinking: str) -> str:
    """ "off"/"on" when the generation prompt must be written by hand (no switch)."""
    if fmt is None or fmt.switch or fmt.answer_lead or thinking not in ("on", "off"):
        return ""
    return thinking


def _with_block(prompt: str, fmt: ReasoningFormat, thinking: str) -> str:
    tail = prompt.rstrip()
    if thinking == "off":
        if tail.endswith(fmt.close):
            return prompt
        if tail.endswith(fmt.open):
            return prompt + fmt.closing().lstrip("\n")
        return prompt + fmt.empty_block()
    if tail.endswith(fmt.open):
        return prompt
    return prompt + fmt.open + "\n"


def starts_inside(fmt: ReasoningFormat | None, prompt: str) -> bool:
    """Whether a reply to ``prompt`` starts inside the thinking block (the prompt opened it)."""
    return fmt is not None and prompt.rstrip().endswith(fmt.open)


@dataclass
class ThinkingControl:
    """One reply's thinking: its splitter, and when the engine closes the block itself.

    ``budget``: the most thinking tokens (0: no limit); ``end``: set by Stop thinking.
    """

    splitter: Splitter
    budget: int = 0
    message: str = ""
    end: threading.Event | None = None
    markers: frozenset[int] = frozenset()  # marker token ids (see ``marker_ids``)

    @property
    def fmt(self) -> ReasoningFormat:
        return self.splitter.fmt

    def due(self, thought: int) -> str:
        """ "budget" or "user" when the block must be closed now, after ``thought`` tokens."""
        if not self.splitter.inside:
            return ""
        if self.end is not None and self.end.is_set():
            return "user"
        if self.budget and thought >= self.budget:
            return "budget"
        return ""

    def closing(self, why: str) -> tuple[str, str]:
        """(thinking text to show, text to evaluate) that end the block for ``why``."""
        message = self.message.strip() if why == "budget" else ""
        shown = f"\n{message}" if message else ""
        return shown, shown + self.fmt.closing()


def thinking_control(
    fmt: ReasoningFormat | None,
    prompt: str,
    params: SamplingParams,
    end: threading.Event | None,
    markers: frozenset[int] = frozenset(),
) -> ThinkingControl | None:
    """The reply's ``ThinkingControl`` (None when the template shows no thinking)."""
    if fmt is None:
        return None
    inside = starts_inside(fmt, prompt)
    splitter = ReasoningSplitter(fmt, inside=inside, marker_tokens=bool(markers))
    return ThinkingControl(splitter, params.thinking_budget, params.budget_message, end, markers)


def marker_ids(fmt: ReasoningFormat | None, tokenize: Callable[[str], list[int]]) -> frozenset[int]:
    """The markers' token ids when both are single tokens (then only those tokens count
    as markers, and a marker written out in the thoughts does not); else none."""
    if fmt is None:
        return frozenset()
    o, c = tokenize(fmt.open), tokenize(fmt.close)
    return frozenset((*o, *c)) if len(o) == 1 and len(c) == 1 else frozenset()
