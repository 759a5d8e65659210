"""A reply to a prompt llama.cpp rendered, read by llama.cpp's parser: its thinking
control, its calls and their grammar, the control tokens it must see as text and its
extra stops. The in-process engine and the llama-server backend both use it."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from app.config.setting_records import SamplingParams
from app.engine.chat_format.stream import NativeCalls, NativeSplitter, NativeStream
from app.engine.chat_format.thinking import native_reasoning, opens_thinking
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.thinking import ThinkingControl
from app.engine.tool_spec import NONE, REQUIRED, ToolRequest
from app.engine.tools.binding import ToolDecoding
from app.engine.tools.grammar import call_openers, native_grammar


@dataclass(frozen=True)
class NativeReply:
    thinking: ThinkingControl
    tools: ToolDecoding | None  # None: nothing may be called
    preserved: tuple[str, ...]  # control tokens the parser must see as their text
    stops: tuple[str, ...]  # llama.cpp's extra stop strings for the format


def native_reply(
    template: ChatTemplate,
    tools: ToolRequest | None,
    prompt: str,
    params: SamplingParams,
    end: threading.Event | None,
) -> NativeReply | None:
    """llama.cpp's reading of the reply to ``prompt``; None when llama.cpp did not render
    it (a built-in template, the sandbox fallback, continue-the-text mode)."""
    renderer = template.native
    active = tools is not None and tools.active and tools.choice != NONE
    # Tools the template does not take are written in the generic form: the Python
    # parser reads those calls.
    formatted = renderer.formatted_for(prompt, tools=active) if renderer is not None else None
    if renderer is None or formatted is None or template.completion:
        return None
    named = tools.named() if active and tools is not None else None
    if named is not None:  # that tool alone: its grammar and its parser
        formatted = renderer.only_tool(prompt, named.name) or formatted
    parser = renderer.formatter.parser(formatted, tools=active)
    stream = NativeStream(parser, formatted.thinking_ends, opens_thinking(formatted))
    fmt = template.reasoning or native_reasoning(formatted)
    control = ThinkingControl(
        NativeSplitter(stream, fmt), params.thinking_budget, params.budget_message, end
    )
    decoding = None
    if active:
        assert tools is not None
        # Mistral's templates want call ids of exactly 9 letters and digits.
        prefix = "" if "[TOOL_CALLS]" in formatted.preserved_tokens else "call_"
        forced = named is not None or tools.choice == REQUIRED
        calls = NativeCalls(stream, prefix, tools.parallel, call_openers(formatted))
        decoding = ToolDecoding(calls, native_grammar(formatted, forced, tools.parallel))
    return NativeReply(control, decoding, formatted.preserved_tokens, formatted.stops)
