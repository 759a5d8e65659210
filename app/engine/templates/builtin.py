"""The built-in chat templates: one per prompt format, chosen by a model's architecture,
and plain text (continue-the-text mode)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from app.engine.chat_message import ChatMessage
from app.engine.reasoning.format import detect_reasoning
from app.engine.templates.chat_template import ChatTemplate, Renderer


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


PLAIN_NAME = "plain text"


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
