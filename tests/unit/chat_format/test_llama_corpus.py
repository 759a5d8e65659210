"""llama.cpp's own chat-layer cases (its tests/test-chat.cpp, dumped as data) through the
chat-format seam: the same prompt, grammar and triggers, and the same parse of every
sample reply, streamed at every split (tests/data/llama_chat/README.md)."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.chat_format.formatted import FormattedChat
from app.engine.chat_format.native import NativeFormatter
from app.engine.native.chat_shim import ChatShim
from app.engine.native.chat_worker import ChatWorker
from tests import llama_chat

CASES = llama_chat.parse_cases()
PROMPTS = llama_chat.generation_prompt_cases()
APPLIED = ("format", "prompt", "generation_prompt", "grammar", "grammar_lazy")
APPLIED_LISTS = ("preserved_tokens", "additional_stops", "thinking_end_tags")


@pytest.fixture(scope="module")
def formatters(shim: ChatShim, worker: ChatWorker) -> dict[str, NativeFormatter]:
    return {}


def _same_apply(got: FormattedChat, want: dict[str, Any]) -> None:
    mine = {
        "format": got.format_name,
        "prompt": got.prompt,
        "generation_prompt": got.generation_prompt,
        "grammar": got.grammar,
        "grammar_lazy": got.grammar_lazy,
        "preserved_tokens": list(got.preserved_tokens),
        "additional_stops": list(got.stops),
        "thinking_end_tags": list(got.thinking_ends),
    }
    for key in ("prompt", "generation_prompt"):
        mine[key] = llama_chat.undated(mine[key])
        want = {**want, key: llama_chat.undated(want[key])}
    for key in (*APPLIED, *APPLIED_LISTS):
        assert mine[key] == want[key], key
    triggers = [{"type": int(t.kind), "value": t.value} for t in got.triggers]
    assert triggers == want["grammar_triggers"]


@pytest.mark.parametrize("case", CASES, ids=[llama_chat.case_id(c, i) for i, c in enumerate(CASES)])
def test_each_case_formats_and_parses_as_llama_cpp_does(
    case: dict[str, Any],
    shim: ChatShim,
    worker: ChatWorker,
    formatters: dict[str, NativeFormatter],
) -> None:
    fmt = llama_chat.formatter(formatters, case["template"], shim, worker)
    _same_apply(fmt.apply(llama_chat.request(case)), case["result"])
    got, matched = llama_chat.read_streamed(fmt, case)  # every split: never an error
    assert matched
    assert llama_chat.comparable(got) == llama_chat.comparable(case["expect"])


@pytest.mark.parametrize(
    "case", PROMPTS, ids=[llama_chat.case_id(c, i) for i, c in enumerate(PROMPTS)]
)
def test_the_generation_prompt_is_llama_cpps(
    case: dict[str, Any],
    shim: ChatShim,
    worker: ChatWorker,
    formatters: dict[str, NativeFormatter],
) -> None:
    fmt = llama_chat.formatter(formatters, case["template"], shim, worker)
    formatted = fmt.apply(llama_chat.request(case))
    undated = llama_chat.undated
    assert undated(formatted.generation_prompt) == undated(case["expected_generation_prompt"])
    assert formatted.prompt.endswith(formatted.generation_prompt)
    assert undated(formatted.prompt) == undated(case["result"]["prompt"])


@pytest.mark.parametrize("name", sorted(p.name for p in llama_chat.TEMPLATES.glob("*.jinja")))
def test_every_corpus_template_formats_a_chat_with_and_without_tools(
    name: str, shim: ChatShim, worker: ChatWorker, formatters: dict[str, NativeFormatter]
) -> None:
    fmt = llama_chat.formatter(formatters, name, shim, worker)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Oslo?"},
    ]
    tool = {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    plain = fmt.apply({"messages": messages, "now": llama_chat.FIXED_NOW})
    assert "Oslo" in plain.prompt
    with_tools = fmt.apply({"messages": messages, "tools": [tool], "now": llama_chat.FIXED_NOW})
    assert "Oslo" in with_tools.prompt
    if fmt.caps.get("supports_tool_calls"):
        assert "weather" in with_tools.prompt


WITH_EOS = [
    (i, c) for i, c in enumerate(CASES) if "eos_token" in llama_chat.template_source(c["template"])
]


@pytest.mark.parametrize(
    ("index", "case"), WITH_EOS, ids=[llama_chat.case_id(c, i) for i, c in WITH_EOS]
)
def test_a_models_eos_text_stays_in_the_prompt_and_out_of_the_replys_shape(
    index: int, case: dict[str, Any], shim: ChatShim, worker: ChatWorker
) -> None:
    # llama.cpp's tests render without BOS/EOS text; a model has them. Mistral Small 3.2
    # ends a past call with {{ eos_token }}, and llama.cpp's analysis took "</s>" for the
    # end of every call: its calls were read as text.
    source = llama_chat.template_source(case["template"])
    fmt = NativeFormatter(source, "<s>", "</s>", worker=worker, shim=shim)
    got, matched = llama_chat.read_streamed(fmt, case)
    assert matched
    assert llama_chat.comparable(got) == llama_chat.comparable(case["expect"])


def test_the_prompt_keeps_the_models_eos_text(shim: ChatShim, worker: ChatWorker) -> None:
    source = llama_chat.template_source("Mistral-Small-3.2-24B-Instruct-2506.jinja")
    fmt = NativeFormatter(source, "<s>", "</s>", worker=worker, shim=shim)
    past = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Again"},
    ]
    formatted = fmt.apply({"messages": past, "now": llama_chat.FIXED_NOW})
    assert "Hello!</s>" in formatted.prompt  # what the model was trained on
