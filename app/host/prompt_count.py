"""A request's prompt counted on the engine thread (Anthropic's ``count_tokens``,
issue 46): exactly where the backend renders the prompt itself (``count_prompt``: the
in-process engine), else estimated from its texts and tools, as the remote servers'
templates are theirs (a count of each part through the server's tokenizer, or the
character estimate where it has none)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from app.config.setting_records import SamplingParams
from app.engine.backend import Backend
from app.engine.chat_message import ChatMessage
from app.engine.token_estimate import estimate_tokens
from app.engine.tool_spec import ToolRequest
from app.util.errors import NoModelLoaded

FRAMING = 4  # tokens a turn's role and markers take, where the template is not known


def count(
    engine: Backend,
    messages: Sequence[ChatMessage],
    params: SamplingParams,
    tools: ToolRequest | None,
) -> int:
    """The prompt's tokens (see the module docstring).

    Raises:
        NoModelLoaded, ChatTemplateError, ImageError: as a reply would.
    """
    if engine.model is None:
        raise NoModelLoaded("No model is loaded.")
    exact = getattr(engine, "count_prompt", None)
    if exact is not None:
        return int(exact(messages, params, tools))
    parts = [m.reasoning + m.content + "".join(c.arguments for c in m.tool_calls) for m in messages]
    if tools is not None:
        parts += [json.dumps(t.openai(), ensure_ascii=False) for t in tools.tools]
    images = sum(engine.image_tokens(i) for m in messages for i in m.images)
    total = FRAMING * len(messages) + images
    for text in parts:
        total += engine.count_tokens(text) or estimate_tokens(text)
    return total
