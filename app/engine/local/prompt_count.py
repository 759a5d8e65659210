"""How many tokens a request's prompt takes, as ``generate`` would render it (the
template with the request's switches and tools bound), read nowhere: Anthropic's
``count_tokens`` (issue 46). The cache and the bound template are left as they are."""

from __future__ import annotations

from collections.abc import Sequence

from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.local.loaded_model import LoadedModel
from app.engine.local.template_state import TemplateState
from app.engine.tool_spec import ToolRequest


def count_prompt(
    model: LoadedModel,
    chat: TemplateState,
    messages: Sequence[ChatMessage],
    params: SamplingParams,
    tools: ToolRequest | None,
) -> int:
    """The prompt's tokens, its generation prompt and images included.

    Raises:
        ChatTemplateError: the template failed on the messages.
        ImageError: there are images and the model sees none.
    """
    model.tokenizer.use_images(messages)
    template = chat.bound_for(params, tools)
    return len(model.tokenizer.tokenize(template.render(messages, True), bos=True))
