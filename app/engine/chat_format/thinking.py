"""What llama.cpp's apply says about a reply's thinking, for the engine's own controls
(a budget, Stop thinking) on a template whose markers our renders did not find."""

from __future__ import annotations

from app.engine.chat_format.formatted import FormattedChat
from app.engine.reasoning.format import ReasoningFormat


def opens_thinking(formatted: FormattedChat) -> bool:
    """Whether the prompt opened the thinking block (a reply starts inside it)."""
    start = formatted.thinking_start.strip()
    return bool(start) and formatted.generation_prompt.rstrip().endswith(start)


def native_reasoning(formatted: FormattedChat) -> ReasoningFormat:
    """A marker pair from llama.cpp's tags; empty markers when it names none."""
    start = formatted.thinking_start.strip()
    ends = [e.strip() for e in formatted.thinking_ends if e.strip()]
    return ReasoningFormat(
        start, ends[0] if ends else "", prefilled=opens_thinking(formatted), source="llama.cpp"
    )
