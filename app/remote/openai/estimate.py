"""This client's estimate of an OpenAI-compatible server's token counts, and the older
turns dropped by it.

The server counts the tokens, and this client cannot tokenize for it. When the server
says its context size, each message is estimated at ``len(content) / chars_per_token``
plus ``MESSAGE_OVERHEAD`` tokens; the ratio starts conservative
(``DEFAULT_CHARS_PER_TOKEN``) and is corrected from the server's own count
(``usage.prompt_tokens`` of each reply, or the count in a context-overflow error). With
the ``truncate_middle`` and ``rolling`` policies, whole older turns are dropped
(``plan_drop``) before sending; if the server still says the prompt is too long, the
ratio is corrected from its count and the drop planned again, once per attempt.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.prompt.overflow import plan_drop, reply_budget
from app.engine.tool_spec import ToolRequest
from app.remote.openai.reply import Request
from app.remote.openai.tool_wire import message_chars, tools_chars

DEFAULT_CHARS_PER_TOKEN = 3.0  # below English's ~4: an estimate errs towards dropping early
MESSAGE_OVERHEAD = 4  # tokens a chat template adds around each message


class TokenEstimate:
    """Tokens estimated from characters, at a ratio the server's counts correct."""

    def __init__(self) -> None:
        self.chars_per_token = DEFAULT_CHARS_PER_TOKEN

    def reset(self) -> None:
        self.chars_per_token = DEFAULT_CHARS_PER_TOKEN

    def of_message(self, message: ChatMessage) -> int:
        return int(message_chars(message) / self.chars_per_token) + MESSAGE_OVERHEAD

    def of(self, messages: Sequence[ChatMessage]) -> int:
        return sum(self.of_message(m) for m in messages)

    def of_tools(self, tools: ToolRequest | None) -> int:
        return int(tools_chars(tools) / self.chars_per_token)

    def calibrate(
        self, messages: Sequence[ChatMessage], n_tokens: int, tools: ToolRequest | None
    ) -> None:
        """Correct the ratio from the server's count of ``messages`` (and ``tools``)."""
        chars = sum(message_chars(m) for m in messages) + tools_chars(tools)
        text_tokens = n_tokens - MESSAGE_OVERHEAD * len(messages)
        if chars > 0 and text_tokens > 0:
            self.chars_per_token = min(8.0, max(0.5, chars / text_tokens))

    def fit(self, req: Request, params: SamplingParams, n_ctx: int) -> bool:
        """Drop whole older turns until the estimate plus a reply budget fits ``n_ctx``;
        True when something was dropped."""
        sizes = [self.of_message(m) for m in req.messages]
        need = sum(sizes) + reply_budget(params.max_tokens, n_ctx) - n_ctx
        plan = plan_drop(sizes, [m.role for m in req.messages], params.overflow, need, 1)
        if plan is None:
            return False
        a, b = plan
        if not req.dropped_count:
            req.dropped_from = a
        req.dropped_count += b - a
        req.dropped_tokens += sum(sizes[a:b])
        req.messages = [*req.messages[:a], *req.messages[b:]]
        return True
