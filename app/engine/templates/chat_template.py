"""A chat template: how messages become prompt text, and why it was chosen.

The templates themselves: ``app.engine.templates.builtin`` (one per prompt format, and
plain text), ``app.engine.templates.jinja_template`` (the model's own, sandboxed) and
``app.engine.templates.override`` (the one the user chose for a model).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from app.engine.chat_message import ChatMessage
from app.engine.image_part import with_markers
from app.engine.reasoning.format import ReasoningFormat
from app.engine.template_errors import ChatTemplateError

if TYPE_CHECKING:
    from app.engine.templates.native_template import NativeRenderer

Renderer = Callable[[Sequence[ChatMessage], bool, Mapping[str, Any]], str]
"""Messages, whether to add the generation prompt, and extra template variables
(``enable_thinking``, ``reasoning_effort``, an API request's ``chat_template_kwargs``)."""


@dataclass(frozen=True)
class ChatTemplate:
    """A way to turn messages into prompt text, and why it was chosen."""

    name: str
    reason: str
    stop_strings: tuple[str, ...]
    renderer: Renderer
    note: str = ""  # why the model's own template was not used, for the status bar
    # A template the user chose for the model: the one used if it fails on a conversation.
    fallback: ChatTemplate | None = None
    completion: bool = False  # plain text: no turns, the model continues the text
    # How replies mark their thinking (None: this template shows no sign of it).
    reasoning: ReasoningFormat | None = None
    source: str = ""  # a Jinja template's text ("" for a built-in one): its tool format
    # llama.cpp renders it (and parses its replies): the renderer, for the reply's parser.
    native: NativeRenderer | None = None

    def render(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """Prompt text for ``messages``, valid for UTF-8 (lone surrogates become U+FFFD).
        ``extra``: more template variables (a built-in template ignores them).

        Raises:
            ChatTemplateError: the model's own template failed on these messages.
        """
        shown = with_markers(messages)  # images become markers; look-alikes in text escaped
        return clean_text(self.renderer(shown, add_generation_prompt, extra or {}))

    @property
    def label(self) -> str:
        """Short text for the status bar, e.g. ``gemma (for gemma3)``."""
        return f"{self.name} ({self.reason})"


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (which UTF-8 cannot encode) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


OWN_NAME = "model's own"  # ChatTemplate.name of a template from the GGUF


PYTHON_NAME = "model's own, in Python"  # the same template rendered by our sandbox


def spoken_name(template: ChatTemplate) -> str:
    """``template`` named for a sentence: "the model's own" or "the built-in gemma"."""
    if template.name == PYTHON_NAME:
        return "the model's own (rendered in Python)"
    return "the model's own" if template.name == OWN_NAME else f"the built-in {template.name}"


def fallback_note(failed: ChatTemplateError, fallback: ChatTemplate) -> str:
    """What to say when a chosen template failed on a conversation and ``fallback`` took over."""
    return (
        f"{failed} Using {spoken_name(fallback)} template instead; "
        "fix yours in Model → Chat template"
    )


def render_or_fall_back(
    template: ChatTemplate, messages: Sequence[ChatMessage]
) -> tuple[str, ChatTemplate | None]:
    """Render with ``template``; when a chosen template fails on this conversation, with its
    fallback instead. Returns the prompt and the fallback to use from now on (None when
    ``template`` rendered), whose ``note`` says why.

    Raises:
        ChatTemplateError: the template (with no fallback, or the fallback too) failed.
    """
    try:
        return template.render(messages, True), None
    except ChatTemplateError as exc:
        fallback = template.fallback
        if fallback is None:
            raise
        fallback = replace(fallback, note=fallback_note(exc, fallback) + ".")
        return fallback.render(messages, True), fallback
