"""Tools in one request: the template renders them, the parser reads the calls, and
the grammar keeps a call well-formed.

A template that reads ``tools`` (Qwen, Llama 3.x, Mistral, gpt-oss...) gets the
request's tools as its ``tools`` variable and renders calls and results its own way.
Any other template (built-in, a base model's, one with no tool support) gets the
generic form: the tools described in the system turn, calls written as Hermes'
``<tool_call>{json}</tool_call>`` (the shape most small models are trained on), and
results passed back as a user turn in ``<tool_response>``. Either way every render of
the request (prompt, overflow, next turn) agrees, so the tool definitions are part of
the cached prefix and a result is all a follow-up evaluates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from app.engine.chat_message import ChatMessage, ToolCall
from app.engine.reasoning.format import ReasoningFormat
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.thinking import starts_inside
from app.engine.tool_spec import CHOICES, NONE, REQUIRED, ToolRequest
from app.engine.tools.format import ToolFormat

if TYPE_CHECKING:
    from app.engine.tools.grammar import ToolGrammar

GENERIC_INTRO = (
    "You can call the following tools. Each is described by a JSON object giving its "
    "name, what it does and the JSON schema of its arguments:\n"
)
GENERIC_HOWTO = (
    "\n\nTo call a tool, answer with a JSON object naming the tool and its arguments "
    "inside <tool_call></tool_call> tags, and nothing else:\n<tool_call>\n"
    '{"name": "<tool name>", "arguments": {<arguments>}}\n</tool_call>\n'
    "Its result comes back inside <tool_response></tool_response> tags. When you need "
    "no tool, answer normally."
)


def bind_tools(
    template: ChatTemplate,
    tools: ToolRequest | None,
    fmt_for: Callable[[ChatTemplate], ToolFormat],
) -> ChatTemplate:
    """``template`` rendering ``tools`` (and the calls and results in the history) the
    way its format does; its fallback likewise."""
    if template.completion:
        return template
    specs = [t.openai() for t in tools.tools] if tools is not None else []
    base = template.renderer
    if fmt_for(template).native:
        if not specs:
            return template  # the template renders past calls and results by itself

        # llama.cpp's chat layer takes the choice (its grammar) and the parallel switch; it
        # knows no named choice, so a named tool is "required" there.
        assert tools is not None
        choice = tools.choice if tools.choice in CHOICES else REQUIRED
        asked = {"tools": specs, "tool_choice": choice, "parallel_tool_calls": tools.parallel}

        def native(messages: Sequence[ChatMessage], gen: bool, extra: Mapping[str, Any]) -> str:
            return base(messages, gen, {**asked, **extra})

        renderer = native
    else:

        def generic(messages: Sequence[ChatMessage], gen: bool, extra: Mapping[str, Any]) -> str:
            return base(generic_messages(messages, specs), gen, extra)

        renderer = generic
    fallback = template.fallback
    return replace(
        template,
        renderer=renderer,
        fallback=bind_tools(fallback, tools, fmt_for) if fallback is not None else None,
    )


def generic_messages(
    messages: Sequence[ChatMessage], specs: Sequence[Mapping[str, Any]]
) -> list[ChatMessage]:
    """``messages`` for a template that knows no tools: the tools in the system turn,
    calls as ``<tool_call>`` blocks, results (consecutive ones together) as user turns."""
    out: list[ChatMessage] = []
    if specs:
        listing = "\n".join(json.dumps(s["function"], ensure_ascii=False) for s in specs)
        described = GENERIC_INTRO + listing + GENERIC_HOWTO
        if messages and messages[0].role == "system":
            first = messages[0]
            out.append(replace(first, content=f"{first.content.rstrip()}\n\n{described}"))
            messages = messages[1:]
        else:
            out.append(ChatMessage("system", described))
    results: list[str] = []
    for m in messages:
        if m.role == "tool":
            results.append(f"<tool_response>\n{m.content}\n</tool_response>")
            continue
        if results:
            out.append(ChatMessage("user", "\n".join(results)))
            results = []
        if m.role == "assistant" and m.tool_calls:
            calls = "\n".join(call_text(c.name, c.argument_object()) for c in m.tool_calls)
            content = f"{m.content.rstrip()}\n{calls}" if m.content.strip() else calls
            out.append(ChatMessage("assistant", content, m.reasoning))
        else:
            out.append(m)
    if results:
        out.append(ChatMessage("user", "\n".join(results)))
    return out


def call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """A call in the generic (Hermes) form, as Hermes' template writes it."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


class CallParser(Protocol):
    """What the decode loop asks of a reply's tool-call parser (``ToolCallParser``, or
    llama.cpp's parser in ``chat_format.stream``)."""

    problems: list[str]

    @property
    def calls(self) -> list[ToolCall]: ...

    @property
    def started(self) -> bool: ...

    @property
    def call_chars(self) -> int: ...

    def feed(self, text: str) -> str: ...

    def finish(self) -> str: ...


@dataclass
class ToolDecoding:
    """One reply's tool machinery: the parser of its answer text and the grammar the
    sampler uses (None: calls are parsed but not constrained)."""

    parser: CallParser
    grammar: ToolGrammar | None


def tool_decoding(
    fmt: ToolFormat,
    tools: ToolRequest | None,
    reasoning: ReasoningFormat | None,
    prompt: str,
) -> ToolDecoding | None:
    """The reply's ``ToolDecoding``; None when the model may call nothing."""
    from app.engine.tools.grammar import tool_grammar
    from app.engine.tools.parser import ToolCallParser

    if tools is None or not tools.active or tools.choice == NONE:
        return None
    schemas = {t.name: t.parameters for t in tools.tools}  # Qwen3-Coder types its values
    inside = reasoning is not None and starts_inside(reasoning, prompt)
    grammar = tool_grammar(
        fmt,
        tools,
        think_close=reasoning.close if reasoning is not None else "",
        starts_inside=inside,
        think_open=reasoning.open if reasoning is not None else "",
    )
    # Mistral's templates want call ids of exactly 9 letters and digits.
    prefix = "" if fmt.family == "mistral" else "call_"
    return ToolDecoding(ToolCallParser(fmt, schemas, id_prefix=prefix), grammar)
