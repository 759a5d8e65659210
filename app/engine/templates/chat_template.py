"""Chat templates: the model's own (Jinja, sandboxed) or one chosen by architecture.

A model's own template runs in ``template_sandbox`` (time, size and depth
limits). When it cannot be used — it does not compile, breaks a limit, raises,
renders an empty prompt, or fails on a conversation with a system prompt — the
built-in template for the architecture is used instead, and ``ChatTemplate.note``
says why, for the status bar.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

# Re-exported: defined in their own modules, imported from here by the rest of the app.
from app.engine.chat_message import ChatMessage
from app.engine.image_part import with_markers
from app.engine.reasoning.format import ReasoningFormat, detect_reasoning
from app.engine.template_errors import ChatTemplateError

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


def _fold_system(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """Merge system text into the first user turn, for formats with no system role."""
    system = "\n\n".join(m.content.strip() for m in messages if m.role == "system" and m.content)
    rest = [m for m in messages if m.role != "system"]
    if system and rest and rest[0].role == "user":
        rest[0] = ChatMessage("user", f"{system}\n\n{rest[0].content}")
    elif system:
        rest.insert(0, ChatMessage("user", system))
    return rest


def _gemma(messages: Sequence[ChatMessage], gen: bool) -> str:
    out = []
    for m in _fold_system(messages):
        role = "model" if m.role == "assistant" else "user"
        out.append(f"<start_of_turn>{role}\n{m.content.strip()}<end_of_turn>\n")
    if gen:
        out.append("<start_of_turn>model\n")
    return "".join(out)


def _llama3(messages: Sequence[ChatMessage], gen: bool) -> str:
    out = [
        f"<|start_header_id|>{m.role}<|end_header_id|>\n\n{m.content.strip()}<|eot_id|>"
        for m in messages
    ]
    if gen:
        out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


def _chatml(messages: Sequence[ChatMessage], gen: bool) -> str:
    out = [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages]
    if gen:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def _phi3(messages: Sequence[ChatMessage], gen: bool) -> str:
    out = [f"<|{m.role}|>\n{m.content}<|end|>\n" for m in messages]
    if gen:
        out.append("<|assistant|>\n")
    return "".join(out)


def _mistral(messages: Sequence[ChatMessage], gen: bool) -> str:
    out = []
    for m in _fold_system(messages):
        if m.role == "user":
            out.append(f"[INST] {m.content.strip()} [/INST]")
        else:
            out.append(f" {m.content.strip()}</s>")
    return "".join(out)


def _llama2(messages: Sequence[ChatMessage], gen: bool) -> str:
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    out = []
    first = True
    for m in messages:
        if m.role == "user":
            content = m.content.strip()
            if first and system:
                content = f"<<SYS>>\n{system}\n<</SYS>>\n\n{content}"
            first = False
            out.append(f"[INST] {content} [/INST]")
        elif m.role == "assistant":
            out.append(f" {m.content.strip()} </s><s>")
    return "".join(out)


BUILTIN: dict[str, tuple[Callable[[Sequence[ChatMessage], bool], str], tuple[str, ...]]] = {
    "gemma": (_gemma, ("<end_of_turn>", "<start_of_turn>")),
    "llama3": (_llama3, ("<|eot_id|>", "<|start_header_id|>")),
    "chatml": (_chatml, ("<|im_end|>", "<|im_start|>")),
    "phi3": (_phi3, ("<|end|>", "<|user|>", "<|assistant|>")),
    "mistral": (_mistral, ("</s>", "[INST]")),
    "llama2": (_llama2, ("</s>", "[INST]")),
}

ARCH_TEMPLATES = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "qwen": "chatml",
    "qwen2": "chatml",
    "qwen2moe": "chatml",
    "qwen3": "chatml",
    "qwen3moe": "chatml",
    "phi3": "phi3",
    "phimoe": "phi3",
    "phi2": "phi3",
    "mistral": "mistral",
    "mistral3": "mistral",
}


def _fixed(fn: Callable[[Sequence[ChatMessage], bool], str]) -> Renderer:
    """A built-in format as a ``Renderer``: it has no variables to take."""
    return lambda messages, gen, _extra: fn(messages, gen)


def builtin_template(name: str, reason: str) -> ChatTemplate:
    renderer, stops = BUILTIN[name]
    return ChatTemplate(name=name, reason=reason, stop_strings=stops, renderer=_fixed(renderer))


def template_for_architecture(arch: str, has_token: Callable[[str], bool]) -> ChatTemplate:
    """The built-in template for ``arch``; ``has_token`` tells llama 2 from 3 and Mistral,
    and a model whose vocabulary has thinking markers (``<think>``) as tokens thinks."""
    template = _for_architecture(arch, has_token)
    return replace(template, reasoning=detect_reasoning(template.render, "", has_token))


def _for_architecture(arch: str, has_token: Callable[[str], bool]) -> ChatTemplate:
    if arch == "llama":
        if has_token("<|start_header_id|>"):
            return builtin_template("llama3", "for llama with llama 3 tokens")
        if has_token("[INST]"):
            return builtin_template("mistral", "for llama with [INST] tokens")
        return builtin_template("llama2", "for llama")
    name = ARCH_TEMPLATES.get(arch)
    if name is None:
        return builtin_template("chatml", f"fallback: no template known for {arch}")
    return builtin_template(name, f"for {arch}")


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (which UTF-8 cannot encode) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


# Special tokens that open or close a turn. A model's own template that uses one
# also stops the reply on it: they detokenize to nothing, so a model that opens a
# new turn would otherwise stream the next (made-up) user turn into its reply.
TURN_MARKERS = (
    "<start_of_turn>",
    "<end_of_turn>",
    "<|im_start|>",
    "<|im_end|>",
    "<|start_header_id|>",
    "<|eot_id|>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|end|>",
    "<|endoftext|>",
    "<|START_OF_TURN_TOKEN|>",
    "<|END_OF_TURN_TOKEN|>",
    "<｜User｜>",
    "<｜Assistant｜>",
)

# The check renders at load: each must succeed, be non-empty and contain every user
# message, or the model's template is not used.
_CHECK_USER = "Lamplight check: what is 2 + 2?"
_CHECKS: tuple[tuple[str, list[ChatMessage]], ...] = (
    ("a simple chat", [ChatMessage("user", _CHECK_USER)]),
    (
        "a chat with a system prompt",
        [
            ChatMessage("system", "You are a helpful assistant."),
            ChatMessage("user", "Hello!"),
            ChatMessage("assistant", "Hi, how can I help?"),
            ChatMessage("user", _CHECK_USER),
        ],
    ),
)


def _message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning:
        # Qwen3, DeepSeek and most others read ``reasoning_content``; gpt-oss ``thinking``.
        out["reasoning_content"] = out["thinking"] = m.reasoning
    if m.tool_calls:
        # Templates read the arguments as a mapping (``tool_call.arguments | tojson``,
        # ``.items()``), as Hugging Face's and llama.cpp's renderers pass them.
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.argument_object()},
                "name": c.name,
                "arguments": c.argument_object(),
            }
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
        out["name"] = m.name
    return out


def _variables(
    messages: Sequence[ChatMessage],
    gen: bool,
    bos_token: str,
    eos_token: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What Hugging Face's ``apply_chat_template`` passes to a template; ``extra`` cannot
    replace the messages, tokens or generation flag."""
    fixed = {
        "messages": [_message(m) for m in messages],
        "add_generation_prompt": gen,
        "bos_token": bos_token,
        "eos_token": eos_token,
    }
    return {"tools": None, "documents": None, **(extra or {}), **fixed}


def jinja_template(
    source: str,
    bos_token: str,
    eos_token: str,
    has_token: Callable[[str], bool] | None = None,
    owner: str = "The model's chat template",
    advice: str = "Edit or shorten the conversation, or start a new chat.",
) -> ChatTemplate:
    """A template from the model's ``tokenizer.chat_template``, rendered in a sandbox.

    ``has_token`` tells which turn markers are single tokens of the vocabulary:
    those the template uses become stop strings too. ``owner`` and ``advice`` word
    the error of a render that fails (for a template the user wrote, say).

    Raises:
        ChatTemplateError: the template cannot be used; the message says why.
    """
    from app.engine.templates.guard import Rejected, describe, run_bounded
    from app.engine.templates.sandbox import (
        LOAD_BUDGET_S,
        RENDER_BUDGET_S,
        compile_template,
        output_limit,
    )

    def strip_bos(text: str) -> str:
        # llama.cpp adds BOS itself when the vocabulary asks for it.
        if bos_token and text.startswith(bos_token):
            return text[len(bos_token) :]
        return text

    def check() -> Any:
        compiled = compile_template(source)
        for what, messages in _CHECKS:
            try:
                text = strip_bos(
                    compiled.render(**_variables(messages, True, bos_token, eos_token))
                )
            except Exception as exc:
                raise Rejected(f"fails on {what} ({describe(exc)})") from exc
            if not text.strip():
                raise Rejected(f"renders an empty prompt for {what}")
            if any(m.content not in text for m in messages if m.role == "user"):
                raise Rejected(f"leaves the user's message out of {what}")
        return compiled

    compiled = run_bounded(check, LOAD_BUDGET_S, output_limit(len(source)))

    def render(messages: Sequence[ChatMessage], gen: bool, extra: Mapping[str, Any]) -> str:
        variables = _variables(messages, gen, bos_token, eos_token, extra)
        size = sum(
            len(m.content) + len(m.reasoning) + sum(len(c.arguments) for c in m.tool_calls)
            for m in messages
        ) + len(str(extra.get("tools") or ""))
        try:
            text = run_bounded(
                lambda: compiled.render(**variables), RENDER_BUDGET_S, output_limit(size)
            )
        except ChatTemplateError as exc:
            raise ChatTemplateError(
                f"{owner} failed on this conversation: it {exc}. {advice}".strip()
            ) from None
        return strip_bos(text)

    has = has_token or (lambda _text: False)
    stops = (eos_token, *(t for t in TURN_MARKERS if t in source and t != eos_token and has(t)))
    template = ChatTemplate(
        name="model's own",
        reason="from the GGUF",
        stop_strings=tuple(s for s in stops if s),
        renderer=render,
    )
    return replace(
        template, reasoning=detect_reasoning(template.render, source, has_token), source=source
    )


def choose_template(
    embedded: str | None,
    arch: str,
    has_token: Callable[[str], bool],
    bos_token: str = "",
    eos_token: str = "",
) -> ChatTemplate:
    """The model's own template when it works, else the built-in one for its architecture.

    A failing own template never fails the load: the built-in one is used, and
    its ``note`` says why.
    """
    if not embedded:
        return template_for_architecture(arch, has_token)
    try:
        return jinja_template(embedded, bos_token, eos_token, has_token)
    except ChatTemplateError as exc:
        fallback = template_for_architecture(arch, has_token)
        why = str(exc)
        return ChatTemplate(
            name=fallback.name,
            reason=f"{fallback.reason}; the model's own template {why}",
            stop_strings=fallback.stop_strings,
            renderer=fallback.renderer,
            reasoning=fallback.reasoning,
            note=(
                f"This model's chat template was not used: it {why}. "
                f"Using the built-in {fallback.name} template instead."
            ),
        )


# -- Choices the user makes per model: an override, or continue-the-text mode ----------

PLAIN_NAME = "plain text"
OWN_NAME = "model's own"  # ChatTemplate.name of a template from the GGUF
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


@dataclass(frozen=True)
class TemplateInputs:
    """What a loaded model offers for its template; enough for a preview off its thread."""

    embedded: str = ""  # the GGUF's tokenizer.chat_template ("" for none)
    arch: str = ""
    builtin: str = "chatml"  # the built-in template for the architecture (a BUILTIN name)
    bos_token: str = ""
    eos_token: str = ""


def _plain(messages: Sequence[ChatMessage], gen: bool) -> str:
    """The messages' text as one document: no roles, no generation prompt, no system text.

    A reply continues the text before it as it is; the user's next words follow it
    after a space when the reply does not end with one. Each message's part depends on
    that message alone, so rendering any messages gives the concatenation of their
    parts: the first ``i`` render a prefix of all of them (the cache is reused), and
    dropping messages from the middle (a full context) cuts their parts out exactly
    as the engine cuts their tokens out of the cache.
    """
    out: list[str] = []
    for m in messages:
        if m.role == "user":
            out.append(m.content)
        elif m.role == "assistant":
            out.append(m.content if m.content[-1:].isspace() else m.content + " ")
    return "".join(out)


def plain_template() -> ChatTemplate:
    """Continue-the-text mode: the conversation is one document the model continues.

    No stop strings of its own: the model's end-of-generation token, the user's stop
    strings and ``max_tokens`` end a reply.
    """
    return ChatTemplate(
        name=PLAIN_NAME,
        reason="continue-the-text mode",
        stop_strings=(),
        renderer=_fixed(_plain),
        completion=True,
    )


def _which(template: ChatTemplate) -> str:
    """``template`` named for a sentence: "the model's own" or "the built-in gemma"."""
    return "the model's own" if template.name == OWN_NAME else f"the built-in {template.name}"


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
            f"one Lamplight has. Using {_which(default)} template instead.",
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
                f"Using {_which(default)} template instead.",
            )
        return replace(own, name="your own", reason="set for this model", fallback=default)
    return default


def fallback_note(failed: ChatTemplateError, fallback: ChatTemplate) -> str:
    """What to say when a chosen template failed on a conversation and ``fallback`` took over."""
    return f"{failed} Using {_which(fallback)} template instead; fix yours in Model → Chat template"


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
