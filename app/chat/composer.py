"""What goes with a message, decided before it is sent (no Qt): the window's Send and
the API both ask here.

- Pictures: a model without a vision projector takes none (``vision_refusal`` says why
  to the window, ``unseen_image`` finds the API's first one); pictures that with the chat
  so far pass the context get a warning (``fit_warning``).
- Documents: the tokens left for their passages (``Outgoing.room``): the context less
  what the chat already uses, the typed text and the reply.
- Tools: what a reply may call, given the model (``tool_offer``, ``offers_tools``).

``compose`` makes the message about to go (``Outgoing``), or says why it cannot.

Text is counted with the model's tokenizer (a ``TokenCounter``: the backend's
``count_tokens`` on the engine thread, which the caller runs). Where a backend cannot
count (an OpenAI-compatible server) or there is no time to ask (the window's warning,
redrawn as the user types), ``app.engine.token_estimate.estimate_tokens`` stands in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.chat.conversation import Message
from app.engine.backend import Capabilities, ModelInfo
from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.token_estimate import estimate_tokens
from app.engine.tool_spec import ToolRequest

TokenCounter = Callable[[str], int]
"""Tokens a text takes in the prompt."""

DEFAULT_CTX = 4096  # a server that does not say its context size
MIN_ROOM = 256  # fewer tokens than this for passages: still a few lines
NO_VISION = "This model has no vision projector: open a vision model with its mmproj file."
NO_MODEL = "No model is loaded: open a vision model with its mmproj file to attach images."
NO_TOOLS = "this backend has no tool calling"


def chat_tokens(messages: Sequence[Message]) -> int:
    """Tokens the chat already uses: its last reply's prompt and answer (0 before one)."""
    for m in reversed(messages):
        metrics = m.message_metrics() if m.role == "assistant" else None
        if metrics is not None:
            return metrics.prompt_tokens + metrics.generated_tokens
    return 0


def vision_refusal(info: ModelInfo | None) -> str:
    """Why pictures cannot be attached or sent ("" when they can)."""
    if info is not None and info.capabilities.vision:
        return ""
    return NO_VISION if info is not None else NO_MODEL


def unseen_image(messages: Sequence[ChatMessage], caps: Capabilities) -> int | None:
    """The first message with pictures when the model sees none (None: all may go)."""
    if caps.vision:
        return None
    return next((i for i, m in enumerate(messages) if m.images), None)


def fit_warning(
    info: ModelInfo | None, messages: Sequence[Message], image_tokens: int, text_tokens: int
) -> str:
    """What attached pictures of ``image_tokens`` mean for the context ("" when they fit
    or nothing is known): more than all of it, or older messages forgotten."""
    if info is None or not image_tokens or info.n_ctx <= 0:
        return ""
    if image_tokens >= info.n_ctx:
        return f"more than the whole context ({info.n_ctx:,} tokens): it cannot be sent"
    needed = chat_tokens(messages) + image_tokens + text_tokens
    if needed > info.n_ctx:
        return (
            f"with the chat so far that is about {needed:,} of {info.n_ctx:,} tokens: "
            "older messages will be forgotten"
        )
    return ""


@dataclass(frozen=True)
class Outgoing:
    """A message that may go: its text and pictures, and what its passages have room
    for (``room``, once the text is counted)."""

    text: str
    images: tuple[ImagePart, ...]
    info: ModelInfo | None
    chat_tokens: int  # what the chat before it uses
    max_tokens: int  # the reply's

    def room(self, count: TokenCounter = estimate_tokens) -> int:
        """Tokens left for passages: the context (``DEFAULT_CTX`` when the server does
        not say) less the chat so far, the text and the reply; at least ``MIN_ROOM``.
        ``count``: the model's tokenizer, which may mean waiting for the engine thread."""
        n_ctx = self.info.n_ctx if self.info is not None and self.info.n_ctx > 0 else DEFAULT_CTX
        text_tokens = count(self.text) if self.text else 0
        return max(MIN_ROOM, n_ctx - self.chat_tokens - text_tokens - self.max_tokens)


def compose(
    text: str,
    images: Sequence[ImagePart],
    info: ModelInfo | None,
    messages: Sequence[Message],
    max_tokens: int,
) -> Outgoing | str:
    """The message ``text`` with ``images`` after the chat's ``messages`` (read now, on
    the thread that owns them), a reply of ``max_tokens``; or why it cannot go (pictures
    the model cannot see)."""
    if images and (why := vision_refusal(info)):
        return why
    return Outgoing(text, tuple(images), info, chat_tokens(messages), max_tokens)


@dataclass(frozen=True)
class ToolOffer:
    """The tools a reply is offered (None: none), or why the request is refused."""

    tools: ToolRequest | None
    refusal: str = ""


def tool_offer(caps: Capabilities, requested: ToolRequest | None) -> ToolOffer:
    """The requested tools, if the model can take them: tools it may call are refused
    where the backend has no tool calling; tools it may not call (``tool_choice``
    "none") are then dropped, as they could not be called anyway."""
    if requested is None or caps.tools:
        return ToolOffer(requested)
    if not requested.active:
        return ToolOffer(None)
    why = caps.why_not.get("tools") or NO_TOOLS
    return ToolOffer(None, f"Tool calling is not available with this model: {why}.")


def offers_tools(info: ModelInfo | None) -> bool:
    """Whether the window's replies are offered its tools: not in continue-the-text mode,
    whose prompt has no turns to call from."""
    return info is None or not info.continues_text
