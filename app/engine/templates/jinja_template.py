"""A model's own chat template (Jinja, sandboxed), or the built-in one when it cannot be used.

A model's own template runs in ``template_sandbox`` (time, size and depth
limits). When it cannot be used — it does not compile, breaks a limit, raises,
renders an empty prompt, or fails on a conversation with a system prompt — the
built-in template for the architecture is used instead, and ``ChatTemplate.note``
says why, for the status bar.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from app.engine.chat_message import ChatMessage
from app.engine.reasoning.format import detect_reasoning
from app.engine.template_errors import ChatTemplateError, TemplateLimitError
from app.engine.templates.builtin import template_for_architecture
from app.engine.templates.chat_template import OWN_NAME, PYTHON_NAME, ChatTemplate

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

# How a failed render is worded for the model's own template (a user's names itself).
OWNER = "The model's chat template"
ADVICE = "Edit or shorten the conversation, or start a new chat."

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


def _check_failure(text: str, messages: Sequence[ChatMessage], what: str) -> str:
    """Why a load check's render is not usable ("" when it is): empty, or a user message
    left out."""
    if not text.strip():
        return f"renders an empty prompt for {what}"
    if any(m.content not in text for m in messages if m.role == "user"):
        return f"leaves the user's message out of {what}"
    return ""


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
    owner: str = OWNER,
    advice: str = ADVICE,
) -> ChatTemplate:
    """A template from the model's ``tokenizer.chat_template``: rendered by llama.cpp's chat
    layer when the build has it (``native_template``), with the sandboxed rendering as its
    fallback; else the sandboxed rendering alone.

    Raises:
        ChatTemplateError: the template cannot be used either way; the message says why.
    """
    try:
        sandboxed: ChatTemplate | None = sandboxed_template(
            source, bos_token, eos_token, has_token, owner, advice
        )
        failed: ChatTemplateError | None = None
    except TemplateLimitError:
        raise  # hostile: never handed to an engine without limits
    except ChatTemplateError as exc:  # what jinja2 cannot do, llama.cpp's engine may
        sandboxed, failed = None, exc
    native = native_template(source, bos_token, eos_token, has_token, owner, advice, sandboxed)
    if native is not None:
        return native
    if sandboxed is None:
        assert failed is not None
        raise failed
    return sandboxed


def _stops(source: str, eos_token: str, has: Callable[[str], bool]) -> tuple[str, ...]:
    stops = (eos_token, *(t for t in TURN_MARKERS if t in source and t != eos_token and has(t)))
    return tuple(s for s in stops if s)


def native_template(
    source: str,
    bos_token: str,
    eos_token: str,
    has_token: Callable[[str], bool] | None,
    owner: str,
    advice: str,
    fallback: ChatTemplate | None,
) -> ChatTemplate | None:
    """The template rendered by llama.cpp, when the build has its chat layer and the
    template passes the load checks there; None otherwise."""
    from app.engine.chat_format.native import NativeFormatter, available
    from app.engine.native.chat_shim import ShimError
    from app.engine.templates.native_template import NativeRenderer
    from app.engine.templates.sandbox import LOAD_BUDGET_S

    if not available():
        return None
    try:
        formatter = NativeFormatter(source, bos_token, eos_token, deadline_s=LOAD_BUDGET_S)
        behind = fallback.renderer if fallback is not None else None
        renderer = NativeRenderer(formatter, bos_token, owner, advice, behind)
        for what, messages in _CHECKS:
            if _check_failure(renderer(messages, True, {}), messages, what):
                return None
    except (ShimError, ChatTemplateError):
        return None
    if formatter.refused:  # a check hung or crashed llama.cpp: the sandbox rendered it
        return None
    has = has_token or (lambda _text: False)
    template = ChatTemplate(
        name=OWN_NAME,
        reason="from the GGUF, read by llama.cpp",
        stop_strings=_stops(source, eos_token, has),
        renderer=renderer,
        fallback=replace(fallback, name=PYTHON_NAME) if fallback is not None else None,
        source=source,
        native=renderer,
    )
    return replace(template, reasoning=detect_reasoning(template.render, source, has_token))


def sandboxed_template(
    source: str,
    bos_token: str,
    eos_token: str,
    has_token: Callable[[str], bool] | None = None,
    owner: str = OWNER,
    advice: str = ADVICE,
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
        input_chars,
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
            if why := _check_failure(text, messages, what):
                raise Rejected(why)
        return compiled

    compiled = run_bounded(check, LOAD_BUDGET_S, output_limit(len(source)))

    def render(messages: Sequence[ChatMessage], gen: bool, extra: Mapping[str, Any]) -> str:
        variables = _variables(messages, gen, bos_token, eos_token, extra)
        size = input_chars(messages, extra)
        try:
            text = run_bounded(
                lambda: compiled.render(**variables), RENDER_BUDGET_S, output_limit(size)
            )
        except ChatTemplateError as exc:
            raise ChatTemplateError(
                f"{owner} failed on this conversation: it {exc}. {advice}".strip()
            ) from None
        return strip_bos(text)

    template = ChatTemplate(
        name=OWN_NAME,
        reason="from the GGUF",
        stop_strings=_stops(source, eos_token, has_token or (lambda _text: False)),
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
