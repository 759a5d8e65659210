"""Reasoning on the real engine: thinking apart, budgets, Stop thinking, switches, and
history the template's way at no extra cost (issue 28).

The default model is a base model that never thinks by itself: a reasoning template
is applied through the template override, and the model is steered into thinking by
a grammar (it writes the markers) or by a generation prompt that opens the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from app.config.setting_records import SamplingParams
from app.engine.chat_format.native import available as native_available
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.templates.override import AUTO
from tests import llama_chat
from tests.conftest import TEST_LOAD
from tests.reasoning_templates import GPT_OSS, MAGISTRAL, QWEN3, R1, THINK_GRAMMAR, run, use

GREEDY = SamplingParams.greedy(max_tokens=48)
GRAMMAR = replace(GREEDY, output_format="gbnf", grammar=THINK_GRAMMAR, max_tokens=120)


@pytest.fixture()
def reasoning(engine: Engine) -> Iterator[Engine]:
    yield engine
    engine.set_template(AUTO)
    engine.reset()


def test_thinking_streams_apart_and_the_answer_has_no_markers(reasoning: Engine) -> None:
    use(reasoning, QWEN3)
    tokens, done = run(reasoning, [ChatMessage("user", "Say hi.")], GRAMMAR)
    thought = "".join(t.text for t in tokens if t.reasoning)
    answer = "".join(t.text for t in tokens if not t.reasoning)
    assert done.reasoning and done.reasoning == thought.strip()
    assert done.text == answer and answer.strip()
    for text in (thought, answer):
        assert "<think>" not in text and "</think>" not in text
    m = done.metrics
    assert 0 < m.reasoning_tokens < m.generated_tokens
    assert m.first_answer_ms >= m.ttft_ms > 0 and m.reasoning_ms > 0
    assert m.thinking_cut == ""


def test_next_turn_evaluates_only_the_new_message_with_past_thinking_dropped(
    reasoning: Engine,
) -> None:
    use(reasoning, QWEN3)
    first = [ChatMessage("user", "Say hi.")]
    _tokens, done = run(reasoning, first, GRAMMAR)
    reply = ChatMessage("assistant", done.text, done.reasoning)
    reworked = reasoning.prewarm(first, reply)
    assert reworked > 0  # the reply's thinking left the cache
    history = [*first, reply, ChatMessage("user", "And now say bye.")]
    template = reasoning._chat.rendering
    expected = template.render(history, True)
    assert "<think>" not in expected  # the template drops past thinking...
    _tokens, second = run(reasoning, history, GREEDY)
    m = second.metrics
    # ...and the cache held exactly what the template renders: only the new words read.
    new = len(reasoning.tokenize("And now say bye.<|im_end|>\n<|im_start|>assistant\n")) - 1
    assert m.evaluated_tokens <= new + 1, (m.evaluated_tokens, new)
    assert reasoning.native is not None
    assert reasoning._kv.map.text.startswith(expected)


def test_budget_closes_the_block_and_the_model_answers(reasoning: Engine) -> None:
    use(reasoning, R1)  # the prompt opens the block: the reply starts inside it
    params = replace(GREEDY, thinking_budget=12, max_tokens=40, budget_message="Answer now.")
    tokens, done = run(reasoning, [ChatMessage("user", "Count to three.")], params)
    m = done.metrics
    assert m.reasoning_tokens == 12  # never more than the budget
    assert m.thinking_cut == "budget"
    assert done.reasoning.endswith("Answer now.")
    assert done.text.strip() and m.generated_tokens == 40
    assert "</think>" in reasoning._kv.map.text  # the block was closed in the cache
    assert any(not t.reasoning for t in tokens)


def test_stop_thinking_ends_the_block_at_once(reasoning: Engine) -> None:
    use(reasoning, R1)
    params = replace(GREEDY, max_tokens=40)
    _tokens, done = run(reasoning, [ChatMessage("user", "Count.")], params, end_after=5)
    m = done.metrics
    assert m.thinking_cut == "user"
    # At the next token: a token that shows no text yet (a marker's start) counts too.
    assert 5 <= m.reasoning_tokens <= 8
    assert done.text.strip()
    assert "Answer now" not in done.reasoning  # the budget message is for the budget only


def test_switch_off_and_on(reasoning: Engine) -> None:
    use(reasoning, QWEN3)
    msgs = [ChatMessage("user", "Hi.")]
    _t, off = run(reasoning, msgs, replace(GREEDY, thinking="off", max_tokens=8))
    assert reasoning._kv.map.text.count("<think>\n\n</think>\n\n") == 1  # the template's own off
    assert off.reasoning == "" and off.metrics.reasoning_tokens == 0
    if native_available():
        # llama.cpp's chat layer closes a block the template opens with no switch (the real
        # R1 distill template), as llama-server does.
        use(reasoning, llama_chat.template_source(llama_chat.R1_DISTILL))
        _t, off = run(reasoning, msgs, replace(GREEDY, thinking="off", max_tokens=8))
        assert "<think>\n</think>" in reasoning._kv.map.text
    else:
        use(reasoning, R1)  # no switch: "off" writes the empty block itself
        _t, off = run(reasoning, msgs, replace(GREEDY, thinking="off", max_tokens=8))
        assert "<think>\n</think>\n\n" in reasoning._kv.map.text
    assert off.reasoning == "" and off.text.strip()
    if native_available():
        return  # llama.cpp, like llama-server, opens no block a template does not open
    # "on" with no switch, where the model would not think: the block is opened for it.
    use(reasoning, QWEN3.replace("enable_thinking", "no_such_switch"))
    params = replace(GREEDY, thinking="on", max_tokens=8)
    _t, on = run(reasoning, msgs, params)
    assert on.metrics.reasoning_tokens > 0


def test_channels_and_effort(reasoning: Engine) -> None:
    use(reasoning, GPT_OSS)
    info = reasoning.model
    assert info is not None and info.reasoning is not None and info.reasoning.effort
    grammar = (
        'root ::= "<|channel|>analysis<|message|>" [a-z ]{4,20} '
        '"<|end|><|start|>assistant<|channel|>final<|message|>" [a-z ]{2,20}\n'
    )
    params = replace(GRAMMAR, grammar=grammar, reasoning_effort="high")
    _tokens, done = run(reasoning, [ChatMessage("user", "Hi.")], params)
    assert "Reasoning: high" in reasoning._kv.map.text
    assert done.reasoning and done.text.strip()
    assert "<|" not in done.text and "<|" not in done.reasoning
    budget = replace(GREEDY, thinking="on", thinking_budget=6, max_tokens=20)
    _t, cut = run(reasoning, [ChatMessage("user", "Hi.")], budget)
    # gpt-oss has no switch: "on" is the template's default, which does not open the
    # block; so nothing is cut and nothing counts as thinking unless the model opens it.
    assert cut.metrics.reasoning_tokens <= 6


def test_snapshot_of_a_reasoning_chat_resumes_without_reading_again(
    reasoning: Engine,
) -> None:
    use(reasoning, QWEN3)
    first = [ChatMessage("user", "Say hi.")]
    _t, done = run(reasoning, first, GRAMMAR)
    reply = ChatMessage("assistant", done.text, done.reasoning)
    reasoning.prewarm(first, reply)
    kv = reasoning.export_state()
    reasoning.reset()
    reasoning.import_state(kv)
    history = [*first, reply, ChatMessage("user", "Bye.")]
    _t, second = run(reasoning, history, GREEDY)
    m = second.metrics
    assert m.cached_tokens >= len(kv.tokens) - 1
    assert m.evaluated_tokens <= m.prompt_tokens - len(kv.tokens) + 1


def test_restored_long_chat_resumes_after_a_reply_the_template_trims(engine: Engine) -> None:
    """A chat longer than gemma 3's 512-token sliding window, whose reply ends in a
    newline the template trims: the restored snapshot holds only the last window, so
    it cannot be rewound; the next turn must already be in it (prepared before save)."""
    first = [ChatMessage("user", " ".join(f"item{i}" for i in range(300)))]
    params = replace(GREEDY, output_format="gbnf", grammar='root ::= [a-z]{3,8} "\\n"')
    _t, done = run(engine, first, params)
    assert done.text.endswith("\n")
    reply = ChatMessage("assistant", done.text)
    assert engine.prewarm(first, reply) > 0
    kv = engine.export_state()
    assert len(kv.tokens) > 600
    engine.reset()
    engine.import_state(kv)
    _t, second = run(engine, [*first, reply, ChatMessage("user", "Bye.")], GREEDY)
    m = second.metrics
    assert m.cached_tokens == len(kv.tokens), m.cache_note
    assert m.evaluated_tokens < 12


def test_overflow_drops_whole_reasoning_turns(model_path: Path) -> None:
    """A small context fills with reasoning turns: rolling drops whole older turns, each
    reply still splits, and the rework after each reply keeps working."""
    small = Engine()
    small.load(model_path, replace(TEST_LOAD, n_ctx=256))
    try:
        use(small, QWEN3)
        params = replace(GRAMMAR, overflow="rolling", max_tokens=60)
        history: list[ChatMessage] = []
        drops = 0  # turns that dropped older ones: two, then the point is made
        for i in range(8):
            history.append(ChatMessage("user", f"Fact {i} about the sea and the sky, please."))
            _t, done = run(small, history, params)
            assert done.metrics.stop_reason in ("eos", "max_tokens", "stop_string")
            assert done.reasoning and "</think>" not in done.text
            drops += done.metrics.dropped_count > 0
            reply = ChatMessage("assistant", done.text, done.reasoning)
            small.prewarm(history, reply)
            history.append(reply)
            if drops == 2:
                break
        assert drops == 2
    finally:
        small.unload()


def test_bracket_markers_on_the_real_engine(reasoning: Engine) -> None:
    use(reasoning, MAGISTRAL + "{% if add_generation_prompt %}{% endif %}")
    grammar = 'root ::= "[THINK]" [a-z ]{4,20} "[/THINK]" [a-z ]{2,20}\n'
    _t, done = run(reasoning, [ChatMessage("user", "Hi.")], replace(GRAMMAR, grammar=grammar))
    assert done.reasoning and done.text.strip()
    assert "[" not in done.text and "[" not in done.reasoning
