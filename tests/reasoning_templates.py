"""Chat templates of the reasoning families, for tests: each is applied to the default
(base) model through the template override, and the model is steered into thinking by
a grammar or by a generation prompt that opens the block."""

from __future__ import annotations

import threading

from app.config.setting_records import SamplingParams
from app.engine.backend import Backend, Finished, Token
from app.engine.chat_message import ChatMessage
from app.engine.templates.override import TemplateOverride

# Qwen3's shape: chatml, ``<think>`` tags, ``enable_thinking``, past thinking dropped.
QWEN3 = (
    "{%- set ns = namespace(found=false, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if message.role == 'user' and not ns.found %}{%- set ns.found = true %}"
    "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is defined and message.reasoning_content is not none %}"
    "{%- set reasoning_content = message.reasoning_content %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n')"
    " + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)

# DeepSeek-R1 distills' shape: the generation prompt opens the block, history keeps
# only what follows ``</think>``, no switch.
R1 = (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{ '<｜User｜>' + message.content }}"
    "{%- elif message.role == 'assistant' %}{% set content = message.content %}"
    "{%- if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}"
    "{%- else %}{{ message.content + '\\n\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}"
)

# gpt-oss's shape (harmony channels), reduced: effort in the system header, thinking in
# the analysis channel, the answer in the final channel, past thinking dropped.
GPT_OSS = (
    "{{- '<|start|>system<|message|>Reasoning: ' + (reasoning_effort | default('medium'))"
    " + '<|end|>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|start|>user<|message|>' + message.content + '<|end|>' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- if loop.last and message.thinking is defined and message.thinking %}"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' }}"
    "{%- endif %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|end|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)

# Magistral's shape: ``[THINK]`` tags that the template renders for every turn.
MAGISTRAL = (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{ '[INST]' + message.content + '[/INST]' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- if message.reasoning_content %}"
    "{{ '[THINK]' + message.reasoning_content + '[/THINK]' }}{%- endif %}"
    "{{ message.content + '</s>' }}"
    "{%- endif %}{%- endfor %}"
)

THINK_GRAMMAR = 'root ::= "<think>\\n" [a-z ]{8,40} "\\n</think>\\n\\n" [a-z ]{4,30}\n'


def use(backend: Backend, source: str) -> None:
    """Apply ``source`` as the custom template; it must show a reasoning format."""
    info = backend.set_template(TemplateOverride("custom", source=source))
    assert info.reasoning is not None, info.notes


def run(
    backend: Backend,
    messages: list[ChatMessage],
    params: SamplingParams,
    end_after: int = 0,
) -> tuple[list[Token], Finished]:
    """One reply's tokens and its end; ``end_after`` thinking pieces set Stop thinking.
    What streamed must add up to what the reply says it was."""
    end = threading.Event()
    tokens: list[Token] = []
    done = None
    for event in backend.generate(messages, params, end_thinking=end):
        if isinstance(event, Token):
            tokens.append(event)
            if end_after and sum(t.reasoning for t in tokens) >= end_after:
                end.set()
        elif isinstance(event, Finished):
            done = event
    assert done is not None
    assert done.text == "".join(t.text for t in tokens if not t.reasoning)
    assert done.reasoning == "".join(t.text for t in tokens if t.reasoning).strip()
    return tokens, done
