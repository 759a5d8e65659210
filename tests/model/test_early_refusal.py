"""A prompt that cannot fit is refused before it is tokenized (issue 40).

A 25 MB message took the engine 75 s to tokenize before it said the context holds 2048
tokens, and Stop cannot cut a tokenization short. A lower bound (the text's UTF-8 bytes
over the vocabulary's longest token) now refuses it at once, when even the fewest
messages the overflow policy can leave would not fit. The bound is checked against the
real tokenizer, and the fewest messages against ``plan_drop``; what is asserted is what
reached the tokenizer, not wall time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config.setting_records import SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.image_part import image_marker
from app.engine.local.engine import Engine
from app.engine.prompt.overflow import fewest_kept, plan_drop
from app.engine.prompt.pipeline import EARLY_CHARS, least_tokens
from app.util.errors import ContextOverflowError
from tests.conftest import TEST_CTX
from tests.hypothesis_budget import examples

BIG = 25_000_000
POLICIES = ("stop", "truncate_middle", "rolling")


@pytest.fixture()
def spied(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The size of every text the engine's model tokenizes, in order."""
    sizes: list[int] = []
    llm = engine.llama
    real = llm.tokenize

    def spy(data: bytes, *args: Any, **kwargs: Any) -> Any:
        sizes.append(len(data))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(llm, "tokenize", spy)
    yield sizes


def reply(engine: Engine, messages: list[ChatMessage], params: SamplingParams) -> Finished:
    events = list(engine.generate(messages, params))
    assert isinstance(events[-1], Finished)
    return events[-1]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_25_mb_message_is_refused_without_being_tokenized(
    engine: Engine, spied: list[int], policy: str
) -> None:
    big = "word " * (BIG // 5)
    messages = [
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello."),
        ChatMessage("user", big),
    ]
    params = replace(SamplingParams.greedy(4), overflow=policy)
    with pytest.raises(ContextOverflowError) as refused:
        list(engine.generate(messages, params))
    assert max(spied, default=0) < EARLY_CHARS  # none of the message was tokenized
    longest = engine._loaded.vocab.longest_token() if engine._loaded else 0
    assert 0 < longest < 100  # gemma 3: 48 bytes
    assert refused.value.prompt_tokens > BIG // longest > 20 * TEST_CTX
    message = str(refused.value)
    assert f"needs at least {refused.value.prompt_tokens} tokens" in message
    assert ContextOverflowError.MARK in message and "shorten the message" in message
    # The engine goes on as before.
    spied.clear()
    done = reply(engine, [ChatMessage("user", "Hello")], SamplingParams.greedy(4))
    assert done.metrics.generated_tokens == 4 and max(spied) < 100


def test_a_long_message_the_policy_can_drop_is_not_refused_early(
    engine: Engine, spied: list[int]
) -> None:
    """Only a prompt that would be refused anyway is refused early: here "rolling" drops
    the long first turn (read whole, as before) and the reply goes ahead."""
    long = "word " * (EARLY_CHARS // 5 + 10_000)  # ~60k tokens, over the bound's size
    messages = [
        ChatMessage("user", long),
        ChatMessage("assistant", "Noted."),
        ChatMessage("user", "Hello"),
    ]
    done = reply(engine, messages, replace(SamplingParams.greedy(4), overflow="rolling"))
    assert done.metrics.dropped_count == 2 and done.metrics.generated_tokens == 4
    assert max(spied) >= len(long)  # tokenized, to measure what to drop
    # Under "stop" (or "truncate_middle", which keeps the first exchange) it cannot fit.
    for policy in ("stop", "truncate_middle"):
        spied.clear()
        with pytest.raises(ContextOverflowError, match="needs at least"):
            list(engine.generate(messages, replace(SamplingParams.greedy(4), overflow=policy)))
        assert max(spied, default=0) < EARLY_CHARS


def vocabulary_text(engine: Engine) -> st.SearchStrategy[str]:
    """Texts the model's tokenizer reads in few tokens: runs of its own tokens' text
    (the longest one often), spaces and newlines, special tokens, odd characters."""
    assert engine._loaded is not None
    vocab = engine._loaded.vocab
    n_vocab = engine.llama.n_vocab()
    longest = max(range(n_vocab), key=lambda t: len(vocab.piece(t, special=True)))
    piece = st.integers(0, n_vocab - 1) | st.just(longest)
    pieces = piece.map(lambda t: vocab.piece(t, special=True).decode("utf-8", "replace"))
    odd = st.sampled_from([" " * 31, "\n" * 31, "<start_of_turn>", "<bos>", "\ud800", "é"])
    return st.lists(pieces | odd | st.text(max_size=8), max_size=60).map("".join)


def test_the_bound_is_never_more_than_the_real_tokens(engine: Engine) -> None:
    longest = engine._loaded.vocab.longest_token() if engine._loaded else 0

    @settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
    @given(text=vocabulary_text(engine), repeat=st.integers(1, 40))
    def check(text: str, repeat: int) -> None:
        text *= repeat
        tokens = engine._loaded.tokenizer.tokenize(text, False)
        assert least_tokens(text, longest) <= len(tokens)

    check()


@settings(max_examples=examples(300), deadline=None)
@given(
    roles=st.lists(st.sampled_from(["system", "user", "assistant", "tool"]), max_size=12),
    sizes=st.lists(st.integers(0, 50), min_size=12, max_size=12),
    need=st.integers(1, 400),
    policy=st.sampled_from(POLICIES),
)
def test_no_drop_leaves_fewer_messages_than_fewest_kept(
    roles: list[str], sizes: list[int], need: int, policy: str
) -> None:
    messages = [ChatMessage(role, str(i)) for i, role in enumerate(roles)]
    fewest = {m.content for m in fewest_kept(messages, policy)}
    kept = list(messages)
    for _ in range(3):  # PromptPipeline.fit drops three times at most
        plan = plan_drop(sizes[: len(kept)], [m.role for m in kept], policy, need, keep_last=1)
        if plan is None:
            break
        kept = [*kept[: plan[0]], *kept[plan[1] :]]
        assert fewest <= {m.content for m in kept}
    if policy != "stop" and messages:
        assert messages[-1].content in fewest


def test_image_markers_count_no_bytes() -> None:
    assert least_tokens("x" * 96, 48) == 2
    assert least_tokens("x" * 97, 48) == 3  # rounded up: tokens are whole
    assert least_tokens(image_marker("a" * 64) * 100 + "x", 48) == 1
    assert least_tokens("x" * 96, 0) == 0  # no bound known: nothing refused early
