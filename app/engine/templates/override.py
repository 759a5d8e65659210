"""The chat template the user chose for a model: an override, or continue-the-text mode."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from app.config.model_prefs import ModelPrefs
from app.engine.chat_message import ChatMessage
from app.engine.template_errors import ChatTemplateError
from app.engine.templates.builtin import BUILTIN, builtin_template, plain_template
from app.engine.templates.chat_template import ChatTemplate, spoken_name
from app.engine.templates.jinja_template import choose_template, jinja_template

OverrideKind = Literal["auto", "builtin", "custom", "plain"]


@dataclass(frozen=True)
class TemplateOverride:
    """The chat template chosen for a model.

    ``auto``: no choice (the model's own template when it works, else the built-in one
    for its architecture); ``builtin``: the built-in template ``name``; ``custom``: the
    Jinja text ``source``, run in the same sandbox as a GGUF's; ``plain``: text
    completion: the messages' text with no turns around it.
    """

    kind: OverrideKind = "auto"
    name: str = ""
    source: str = ""


AUTO = TemplateOverride()
PLAIN = TemplateOverride("plain")


def effective_override(prefs: ModelPrefs, completion: bool) -> TemplateOverride:
    """The template to use for a model with ``prefs`` (saved by the window's template
    dialog), in continue-the-text mode or not."""
    if completion:
        return PLAIN
    if prefs.template == "builtin":
        return TemplateOverride("builtin", name=prefs.template_name)
    if prefs.template == "custom":
        return TemplateOverride("custom", source=prefs.template_source)
    return AUTO


@dataclass(frozen=True)
class TemplateInputs:
    """What a loaded model offers for its template; enough for a preview off its thread."""

    embedded: str = ""  # the GGUF's tokenizer.chat_template ("" for none)
    arch: str = ""
    builtin: str = "chatml"  # the built-in template for the architecture (a BUILTIN name)
    bos_token: str = ""
    eos_token: str = ""


def build_template(
    override: TemplateOverride, inputs: TemplateInputs, has_token: Callable[[str], bool]
) -> ChatTemplate:
    """The template ``override`` asks for, on a model described by ``inputs``.

    Never raises for a bad choice: a custom template that does not compile or fails
    the load checks (the same as a GGUF's), or a built-in name that does not exist,
    gives the automatic choice with a ``note`` saying why. A custom template that
    works carries that automatic choice as its ``fallback``, for a conversation it
    fails on later.
    """
    default = choose_template(
        inputs.embedded or None, inputs.arch, has_token, inputs.bos_token, inputs.eos_token
    )
    if override.kind == "plain":
        return plain_template()
    if override.kind == "builtin":
        if override.name in BUILTIN:
            return builtin_template(override.name, "chosen for this model")
        return replace(
            default,
            note=f"The chat template chosen for this model ({override.name[:40]!r}) is not "
            f"one Lamplight has. Using {spoken_name(default)} template instead.",
        )
    if override.kind == "custom":
        try:
            own = jinja_template(
                override.source,
                inputs.bos_token,
                inputs.eos_token,
                has_token,
                owner="Your chat template for this model",
                advice="",
            )
        except ChatTemplateError as exc:
            return replace(
                default,
                note=f"Your chat template for this model was not used: it {exc}. "
                f"Using {spoken_name(default)} template instead.",
            )
        return replace(own, name="your own", reason="set for this model", fallback=default)
    return default


def preview_prompt(
    override: TemplateOverride, inputs: TemplateInputs, messages: Sequence[ChatMessage]
) -> tuple[str, str]:
    """The prompt ``override`` renders for ``messages`` (no BOS), and a note on the choice.

    Runs a custom template in the sandbox with the same checks and limits as at load,
    so it may take up to the load budget: call it off the GUI thread.

    Raises:
        ChatTemplateError: the custom template cannot be used (the message says why,
            e.g. "ran longer than 2 s"), or fails on ``messages``.
    """
    builtin = inputs.builtin if inputs.builtin in BUILTIN else "chatml"
    note = ""
    template: ChatTemplate
    if override.kind == "plain":
        template = plain_template()
    elif override.kind == "builtin":
        if override.name not in BUILTIN:
            raise ChatTemplateError(f"there is no built-in template called {override.name!r}")
        template = builtin_template(override.name, "chosen for this model")
    elif override.kind == "custom":
        template = jinja_template(
            override.source,
            inputs.bos_token,
            inputs.eos_token,
            owner="This template",
            advice="",
        )
    elif inputs.embedded:
        try:
            template = jinja_template(inputs.embedded, inputs.bos_token, inputs.eos_token)
        except ChatTemplateError as exc:
            template = builtin_template(builtin, f"for {inputs.arch}")
            note = f"The model's own template is not used: it {exc}."
    else:
        template = builtin_template(builtin, f"for {inputs.arch}")
    return template.render(messages, not template.completion), note


# Words in a model's name that say it was tuned to chat ("-it": Gemma's instruction-tuned).
_CHAT_WORDS = re.compile(
    r"instruct|chat|assistant|hermes|(?<![a-z])(it|sft|dpo|rlhf|orpo)(?![a-z])", re.IGNORECASE
)


def looks_like_base_model(names: Sequence[str], has_template: bool) -> bool:
    """A model with no chat template whose names (metadata name, file name) do not say
    it was tuned to chat: a text-completion model, which echoes questions in chat turns."""
    return not has_template and not any(_CHAT_WORDS.search(n) for n in names if n)
