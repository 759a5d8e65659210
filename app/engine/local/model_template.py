"""A loaded model's automatic chat template, and the tokens llama.cpp puts before a prompt."""

from __future__ import annotations

from typing import Any

from app.engine.local.vocab import Vocab
from app.engine.templates.builtin import template_for_architecture
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.override import AUTO as AUTO_TEMPLATE
from app.engine.templates.override import TemplateInputs, build_template
from app.gguf.info import GgufInfo


def auto_template(
    gguf: GgufInfo, llm: Any, vocab: Vocab
) -> tuple[TemplateInputs, ChatTemplate, frozenset[int]]:
    """What a loaded model's templates are made from, its automatic template, and that
    template's stop tokens that have no text.
    """
    inputs = TemplateInputs(
        embedded=gguf.chat_template or "",
        arch=gguf.architecture,
        builtin=template_for_architecture(gguf.architecture, vocab.is_special).name,
        bos_token=vocab.text(llm.token_bos()),
        eos_token=vocab.text(llm.token_eos()),
    )
    template = build_template(AUTO_TEMPLATE, inputs, vocab.is_special)
    return inputs, template, vocab.stop_tokens(template.stop_strings)


def head_tokens(llm: Any) -> tuple[int, ...]:
    """The tokens llama.cpp puts before a prompt's text (BOS, when the model wants one)."""
    probe = b"a"
    with_head = list(llm.tokenize(probe, add_bos=True, special=True))
    bare = list(llm.tokenize(probe, add_bos=False, special=True))
    for i in range(len(with_head) - len(bare) + 1):
        if with_head[i : i + len(bare)] == bare:
            return tuple(with_head[:i])
    return ()
