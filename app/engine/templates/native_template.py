"""A model's own chat template rendered by llama.cpp's chat layer (``chat_format``).

llama.cpp shapes the conversation for each template the way the model was trained on
(typed thinking blocks, tool lists, ``developer`` roles, its per-family workarounds)
and renders it with its own Jinja engine, in the chat-format worker. The same apply
gives the reply's parser and grammar: :func:`formatted_for` finds them for a prompt this
template rendered. When llama.cpp cannot render a conversation, the sandboxed Python
rendering of the same template (``jinja_template``) is the fallback.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from app.engine.chat_format.formatted import FormattedChat
from app.engine.chat_format.native import ChatRequest, NativeFormatter
from app.engine.chat_message import ChatMessage
from app.engine.native.chat_shim import ShimError
from app.engine.native.chat_worker import TemplateRefused
from app.engine.template_errors import ChatTemplateError

Renderer = Callable[[Sequence[ChatMessage], bool, Mapping[str, Any]], str]

_RECENT = 8  # applies remembered per template, for the reply that follows a render
# Our request switches that llama.cpp takes as inputs rather than template variables.
_INPUTS = ("tools", "enable_thinking", "tool_choice", "parallel_tool_calls")


def openai_message(m: ChatMessage) -> dict[str, Any]:
    """``m`` as llama.cpp's ``common_chat_msgs_parse_oaicompat`` reads it."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning:
        out["reasoning_content"] = m.reasoning
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.argument_object())},
            }
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
        if m.name:
            out["name"] = m.name
    return out


def native_request(
    messages: Sequence[ChatMessage], gen: bool, extra: Mapping[str, Any]
) -> ChatRequest:
    """The request for a render: ``extra``'s tools and thinking switch are llama.cpp's
    inputs, the rest template variables; an effort of "auto" means the template's own
    default, so it is not passed."""
    tools = extra.get("tools") or []
    kwargs = {k: v for k, v in extra.items() if k not in _INPUTS and v is not None}
    if kwargs.get("reasoning_effort") in ("", "auto"):
        kwargs.pop("reasoning_effort")
    thinking = extra.get("enable_thinking")
    choice = extra.get("tool_choice")
    return ChatRequest(
        messages=[openai_message(m) for m in messages],
        tools=list(tools) if isinstance(tools, list) else [],
        tool_choice=choice if choice in ("auto", "required", "none") else "auto",
        parallel_tool_calls=extra.get("parallel_tool_calls") is True,
        enable_thinking=thinking if isinstance(thinking, bool) else True,
        add_generation_prompt=gen,
        template_kwargs=kwargs,
    )


class NativeRenderer:
    """A template's renders through llama.cpp, remembering the last few applies.

    Bounded like the sandbox: each apply within the sandbox's render budget (the worker
    is killed past it), its prompt within the sandbox's output limit. A template the
    worker refused (it hung or crashed it) is rendered by ``fallback`` (the sandbox's
    renderer of the same template) from then on, when there is one.
    """

    def __init__(
        self,
        formatter: NativeFormatter,
        bos_token: str,
        owner: str,
        advice: str,
        fallback: Renderer | None = None,
    ) -> None:
        self.formatter = formatter
        self._bos = bos_token
        self._owner = owner
        self._advice = advice
        self._fallback = fallback
        # prompt -> (its apply, whether the tools went to llama.cpp)
        self._recent: OrderedDict[str, tuple[FormattedChat, ChatRequest]] = OrderedDict()

    def __call__(self, messages: Sequence[ChatMessage], gen: bool, extra: Mapping[str, Any]) -> str:
        from app.engine.templates.sandbox import RENDER_BUDGET_S, input_chars, output_limit

        request = native_request(messages, gen, extra)
        try:
            formatted = self.formatter.apply(request, RENDER_BUDGET_S)
        except TemplateRefused:
            if self._fallback is None:
                raise self._failed("it hung or crashed llama.cpp's template engine") from None
            return self._fallback(messages, gen, extra)
        except ShimError as exc:
            raise self._failed(str(exc)) from None
        prompt = formatted.prompt
        if len(prompt) > output_limit(input_chars(messages, extra)):
            raise self._failed("it renders far more text than the conversation holds")
        if self._bos and prompt.startswith(self._bos):
            prompt = prompt[len(self._bos) :]  # llama.cpp adds BOS itself
        if gen:  # only a reply's prompt: where the generation prompt is empty (Mistral
            # Small 3.2), the same text rendered without it has another parser.
            self._recent[prompt] = (formatted, request)
            self._recent.move_to_end(prompt)
            while len(self._recent) > _RECENT:
                self._recent.popitem(last=False)
        return prompt

    def _failed(self, why: str) -> ChatTemplateError:
        return ChatTemplateError(
            f"{self._owner} failed on this conversation in llama.cpp: {why}. {self._advice}"
        )

    def formatted_for(self, prompt: str, tools: bool = False) -> FormattedChat | None:
        """The apply that rendered ``prompt`` (with generation prompt), if still known;
        with ``tools``, only one that gave llama.cpp the tools (not the generic form)."""
        found = self._recent.get(prompt)
        if found is None or (tools and not found[1].tools):
            return None
        return found[0]

    def only_tool(self, prompt: str, name: str) -> FormattedChat | None:
        """The grammar and parser for a reply to ``prompt`` that must call the tool
        ``name``: the same request applied with that tool alone, required (llama.cpp has
        no named choice). Its prompt is not used: the reply follows ``prompt``."""
        found = self._recent.get(prompt)
        if found is None:
            return None
        request = found[1]
        chosen = [t for t in request.tools if (t.get("function") or {}).get("name") == name]
        if not chosen:
            return None
        from app.engine.templates.sandbox import RENDER_BUDGET_S

        try:
            narrowed = replace(request, tools=chosen, tool_choice="required")
            return self.formatter.apply(narrowed, RENDER_BUDGET_S)
        except ShimError:
            return None
