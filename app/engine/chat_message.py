"""One turn of a conversation as a chat template sees it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation. ``reasoning``: an assistant turn's thinking, apart
    from its answer (``content``); the template decides whether history shows it."""

    role: Role
    content: str
    reasoning: str = ""
