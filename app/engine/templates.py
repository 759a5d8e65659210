"""Chat templates: the model's own (Jinja, sandboxed) or one chosen by architecture."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation."""

    role: Role
    content: str


Renderer = Callable[[Sequence[ChatMessage], bool], str]


@dataclass(frozen=True)
class ChatTemplate:
    """A way to turn messages into prompt text, and why it was chosen."""

    name: str
    reason: str
    stop_strings: tuple[str, ...]
    renderer: Renderer

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
        return self.renderer(messages, add_generation_prompt)

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


BUILTIN: dict[str, tuple[Renderer, tuple[str, ...]]] = {
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


def builtin_template(name: str, reason: str) -> ChatTemplate:
    renderer, stops = BUILTIN[name]
    return ChatTemplate(name=name, reason=reason, stop_strings=stops, renderer=renderer)


def template_for_architecture(arch: str, has_token: Callable[[str], bool]) -> ChatTemplate:
    """The built-in template for ``arch``; ``has_token`` tells llama 2 from 3 and Mistral."""
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


def jinja_template(source: str, bos_token: str, eos_token: str) -> ChatTemplate:
    """A template from the model's ``tokenizer.chat_template``, rendered in a sandbox.

    Raises:
        ValueError: the template does not compile or fails on a sample conversation.
    """
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(source)
    except TemplateError as exc:
        raise ValueError(f"the model's chat template does not compile: {exc}") from exc

    def render(messages: Sequence[ChatMessage], gen: bool) -> str:
        text = compiled.render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=gen,
            bos_token=bos_token,
            eos_token=eos_token,
        )
        # llama.cpp adds BOS itself when the vocabulary asks for it.
        if bos_token and text.startswith(bos_token):
            text = text[len(bos_token) :]
        return text

    try:
        render([ChatMessage("user", "hi"), ChatMessage("assistant", "hello")], True)
    except (TemplateError, ValueError, TypeError) as exc:
        raise ValueError(f"the model's chat template fails on a simple chat: {exc}") from exc
    stops = tuple(s for s in (eos_token,) if s)
    return ChatTemplate(
        name="model's own", reason="from the GGUF", stop_strings=stops, renderer=render
    )


def choose_template(
    embedded: str | None,
    arch: str,
    has_token: Callable[[str], bool],
    bos_token: str = "",
    eos_token: str = "",
) -> ChatTemplate:
    """The model's own template when it has a working one, else one for its architecture."""
    if embedded:
        try:
            return jinja_template(embedded, bos_token, eos_token)
        except ValueError as exc:
            fallback = template_for_architecture(arch, has_token)
            return ChatTemplate(
                name=fallback.name,
                reason=f"{fallback.reason}; {exc}",
                stop_strings=fallback.stop_strings,
                renderer=fallback.renderer,
            )
    return template_for_architecture(arch, has_token)
