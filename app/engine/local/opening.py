"""A new chat's opening read once (issue 44): a project's system turn, with the tools it
offers, is what every chat in the project starts with. ``opening`` says what it is
(text and tokens, for the host to key a saved copy by), ``warm_opening`` reads it into
an empty cache and marks its end, so the first question's prompt keeps it and only the
question is read (``PromptPipeline.build`` keeps the cache up to the last mark whose
text the prompt starts with)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from app.config.setting_records import SamplingParams
from app.engine.backend import Opening
from app.engine.chat_message import ChatMessage
from app.engine.local.kv_sequence import KvSequence
from app.engine.local.loaded_model import LoadedModel
from app.engine.local.template_state import TemplateState
from app.engine.prompt.driver import PromptDriver, Warmup
from app.engine.tool_spec import ToolRequest


def opening(
    parts: tuple[LoadedModel, TemplateState, KvSequence, PromptDriver],
    messages: Sequence[ChatMessage],
    params: SamplingParams,
    tools: ToolRequest | None,
) -> Opening | None:
    """``Engine.opening``: the template bound as ``generate`` binds it, nothing read."""
    model, chat, _kv, prompter = parts
    chat.start(params, tools)
    warm = prompter.opening(messages, model.llm.n_ctx())
    return Opening(warm.head, tuple(warm.tokens)) if warm is not None else None


def warm_opening(
    parts: tuple[LoadedModel, TemplateState, KvSequence, PromptDriver],
    found: Opening,
    stop: threading.Event | None = None,
) -> int:
    """``Engine.warm_opening``: an empty cache (under the applied adapters), then the
    opening read and marked; on a hybrid model it ends on a checkpoint."""
    _model, _chat, kv, prompter = parts
    kv.clear()
    kv.sync_lora()
    tokens = list(found.tokens)
    return prompter.warm_opening(Warmup(tokens, 0, len(tokens), found.head, None), stop)
