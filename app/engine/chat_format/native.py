"""A model's template read by llama.cpp's chat layer, in the chat-format worker."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from app.engine.chat_format.formatted import FormattedChat
from app.engine.chat_format.reply import ReplyParser
from app.engine.native.chat_shim import ChatShim, ShimError, load_shim
from app.engine.native.chat_worker import ChatWorker, NativeTemplate

_lock = threading.Lock()
_worker: ChatWorker | None = None


def available() -> bool:
    """Whether this build has llama.cpp's chat layer (the shim)."""
    return load_shim() is not None


def shared_worker() -> ChatWorker:
    """The process's chat-format worker, started on first use."""
    global _worker
    with _lock:
        if _worker is None:
            _worker = ChatWorker()
        return _worker


@dataclass(frozen=True)
class ChatRequest:
    """What a turn asks of the template (OpenAI-shaped messages and tools)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str = "auto"  # "auto" | "required" | "none"
    parallel_tool_calls: bool = False
    enable_thinking: bool = True
    reasoning_format: str = "deepseek"  # thinking parsed out of the content
    add_generation_prompt: bool = True
    continue_final: int = 0  # common_chat_continuation: 0 none, 1 auto, 2 reasoning, 3 content
    json_schema: str = ""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    now: float | None = None  # seconds since the epoch; None: now

    def to_shim(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "tools": self.tools,
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "enable_thinking": self.enable_thinking,
            "reasoning_format": self.reasoning_format,
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final,
            "json_schema": self.json_schema,
            "chat_template_kwargs": self.template_kwargs,
            "now": time.time() if self.now is None else self.now,
        }


_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe", "parameters": {"type": "object", "properties": {}}},
}


class NativeFormatter:
    """One template (with the model's BOS and EOS text): apply requests, make parsers."""

    def __init__(
        self,
        source: str,
        bos: str = "",
        eos: str = "",
        *,
        worker: ChatWorker | None = None,
        shim: ChatShim | None = None,
        deadline_s: float | None = None,
    ) -> None:
        found = shim or load_shim()
        if found is None:
            raise RuntimeError("llama.cpp's chat layer is not in this build")
        self._shim = found
        self._worker = worker or shared_worker()
        self._template: NativeTemplate = self._worker.template(source, bos, eos, deadline_s)
        # llama.cpp derives the reply's shape from past turns as the template renders them,
        # EOS text included: Mistral Small 3.2 ends a call with {{ eos_token }}, so its
        # parser and grammar would want "</s>" after every call, which no engine writes
        # (the EOS token ends the reply). The reply's side comes from an apply without
        # it, as in llama.cpp's own tests; the prompt keeps the model's EOS.
        self._reply: NativeTemplate | None = None
        self._takes_tools: bool | None = None
        if eos and "eos_token" in source:
            self._reply = self._worker.template(source, bos, "", deadline_s)

    @property
    def refused(self) -> bool:
        """The template hung or crashed the worker: llama.cpp does not render it again."""
        return self._worker.refused(self._template)

    @property
    def caps(self) -> dict[str, Any]:
        return dict(self._template.caps)

    def takes_tools(self) -> bool:
        """Whether llama.cpp reads this template's calls: it renders past calls (its caps),
        or it lists tools and llama.cpp's own handler for the family gives a call grammar
        (LFM2, whose template writes past calls as plain text)."""
        if self._takes_tools is None:
            caps = self._template.caps
            self._takes_tools = bool(caps.get("supports_tool_calls"))
            if not self._takes_tools and caps.get("supports_tools"):
                probe = ChatRequest([{"role": "user", "content": "?"}], tools=[_PROBE_TOOL])
                try:
                    self._takes_tools = bool(self.apply(probe).grammar)
                except ShimError:  # a template that fails here takes none
                    self._takes_tools = False
        return self._takes_tools

    def apply(
        self, request: ChatRequest | dict[str, Any], deadline_s: float | None = None
    ) -> FormattedChat:
        raw = request.to_shim() if isinstance(request, ChatRequest) else request
        formatted = FormattedChat.from_shim(self._worker.apply(self._template, raw, deadline_s))
        if self._reply is None or not raw.get("add_generation_prompt", True):
            return formatted  # a history render: its prompt is all that is used
        reply = FormattedChat.from_shim(self._worker.apply(self._reply, raw, deadline_s))
        return replace(reply, prompt=formatted.prompt)

    def parser(self, formatted: FormattedChat, *, tools: bool = True) -> ReplyParser:
        return ReplyParser(self._shim, formatted, tools=tools)


def self_check() -> str:
    """ "llama.cpp" when a template renders through the worker (the frozen app's smoke test
    proves the shim is bundled and its child starts); else why not."""
    from app.engine.native.chat_shim import ShimError, unavailable_reason

    if not available():
        return unavailable_reason()
    try:
        fmt = NativeFormatter("{{ messages[0].content }}")
        prompt = fmt.apply(ChatRequest([{"role": "user", "content": "ok"}])).prompt
    except ShimError as exc:
        return f"the chat-format worker failed: {exc}"
    return "llama.cpp" if prompt == "ok" else f"unexpected render {prompt[:40]!r}"
