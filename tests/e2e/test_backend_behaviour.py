"""One behaviour suite for every ``Backend``: in-process llama.cpp, the fake, a real
llama-server through its native API, and the same server through its OpenAI API.

What each checks holds for all of them, or, where a backend declares a capability
off, that it says why and refuses instead of ignoring the request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Backend, Finished, KvState, PrefillProgress, Token
from app.engine.chat_message import ChatMessage
from app.gguf.lora import LoraError, LoraStack
from app.remote.connection import Connection
from app.util.errors import ContextOverflowError, LamplightError
from tests.conftest import TEST_CTX
from tests.fakes.engine import FakeEngine, as_backend
from tests.server_fixture import RunningServer

KINDS = ("inprocess", "fake", "llama-server", "openai")
GREEDY = SamplingParams(temperature=0.0, seed=7, max_tokens=12)
FLAGS = ("snapshots", "lora", "grammar", "prewarm", "token_latency", "gpu_offload")


@pytest.fixture(params=KINDS)
def backend(
    request: pytest.FixtureRequest, llama_server: RunningServer, model_path: Path
) -> Iterator[Backend]:
    kind = request.param
    if kind == "inprocess":
        engine = request.getfixturevalue("engine")
        engine.set_lora_stack(LoraStack())
        yield engine
        engine.set_lora_stack(LoraStack())
        return
    if kind == "fake":
        fake = FakeEngine(reply="one two three four five six seven eight nine ten", delay=0.01)
        fake.load(model_path, LoadConfig(n_ctx=TEST_CTX))
        yield as_backend(fake)
        return
    if kind == "llama-server":
        from app.remote.llama_server.backend import LlamaServerBackend

        remote: Backend = LlamaServerBackend(
            Connection("behaviour", "test server", "llama-server", llama_server.url)
        )
    else:
        from app.remote.openai.backend import OpenAIBackend

        remote = OpenAIBackend(
            Connection("behaviour-oai", "test openai", "openai", llama_server.url)
        )
    remote.load("", LoadConfig())
    yield remote
    remote.unload()


def run(backend: Backend, messages: list[ChatMessage], params: SamplingParams = GREEDY) -> list:
    return list(backend.generate(messages, params))


def ask(text: str) -> list[ChatMessage]:
    return [ChatMessage("user", text)]


def test_event_order_and_one_terminal_event(backend: Backend) -> None:
    events = run(backend, ask("Name three colours."))
    kinds = [type(e) for e in events]
    assert kinds[-1] is Finished and kinds.count(Finished) == 1
    first_token = kinds.index(Token) if Token in kinds else len(kinds) - 1
    assert all(k is PrefillProgress for k in kinds[:first_token])
    assert all(k is Token for k in kinds[first_token:-1])
    end = events[-1]
    assert end.text == "".join(e.text for e in events if isinstance(e, Token))
    assert end.metrics.generated_tokens >= 1 and end.metrics.stop_reason
    assert backend.model is not None and backend.model.capabilities == backend.capabilities


def test_stop_is_prompt_and_the_backend_goes_on(backend: Backend) -> None:
    stop = threading.Event()
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=400)
    seen = 0
    stopped_at = 0.0
    end = None
    for event in backend.generate(ask("Tell me a long story about a lighthouse."), params, stop):
        if isinstance(event, Token):
            seen += 1
            if seen == 3:
                stop.set()
                stopped_at = time.perf_counter()
        elif isinstance(event, Finished):
            end = event
    assert end is not None and end.metrics.stop_reason == "cancelled"
    assert time.perf_counter() - stopped_at < 1.0
    assert 3 <= end.metrics.generated_tokens < 400
    again = run(backend, ask("Hello"))  # the backend is usable right after a stop
    assert isinstance(again[-1], Finished) and again[-1].metrics.stop_reason != "cancelled"


def test_a_prompt_over_the_context_is_the_same_error(backend: Backend) -> None:
    params = SamplingParams(max_tokens=8, overflow="stop")
    with pytest.raises(ContextOverflowError) as caught:
        run(backend, ask("word " * (TEST_CTX + 500)), params)
    assert ContextOverflowError.MARK in str(caught.value)


# The fake counts words, not tokens, and drops nothing: this is for the real engines.
@pytest.mark.parametrize("backend", [k for k in KINDS if k != "fake"], indirect=True)
def test_overflow_policy_drops_older_turns(backend: Backend) -> None:
    filler = " ".join(f"w{i}" for i in range(300))
    chat = [ChatMessage("user", "Remember the word lamp."), ChatMessage("assistant", "Lamp.")]
    for i in range(6):
        chat += [ChatMessage("user", f"{i}: {filler}"), ChatMessage("assistant", "ok")]
    chat.append(ChatMessage("user", "Which word?"))
    end = run(backend, chat, SamplingParams(temperature=0.0, max_tokens=8))[-1]
    assert isinstance(end, Finished)
    assert end.metrics.dropped_count >= 2 and end.metrics.dropped_tokens > 0
    assert any("left the model's memory" in n for n in end.metrics.notes)


def test_snapshot_round_trip_evaluates_only_new_tokens(backend: Backend) -> None:
    if not backend.capabilities.snapshots:
        assert backend.capabilities.why_not.get("snapshots")
        with pytest.raises(LamplightError):
            backend.import_state(KvState(b"state", [1, 2, 3], "abc", [(0, 0), (3, 3)]))
        return
    backend.reset()
    first = run(backend, ask("Write a short poem about rain."))[-1]
    kv = backend.export_state("round-trip")
    assert len(kv.tokens) > 10
    backend.reset()
    backend.import_state(kv)
    chat = [*ask("Write a short poem about rain."), ChatMessage("assistant", first.text)]
    end = run(backend, [*chat, ChatMessage("user", "Another one.")])[-1]
    assert isinstance(end, Finished)
    assert end.metrics.cached_tokens >= len(kv.tokens) - 2
    assert end.metrics.evaluated_tokens < 30  # the new turn only, not the whole chat


def test_lora_scale_changes_output_and_drops_the_cache(backend: Backend, server_lora: Path) -> None:
    if not backend.capabilities.lora:
        assert backend.capabilities.why_not.get("lora")
        stack = LoraStack()
        stack.push(server_lora, 1.0)
        with pytest.raises(LoraError):
            backend.set_lora_stack(stack)
        return
    backend.set_lora_stack(LoraStack())
    backend.reset()
    messages = ask("The capital of France is")
    plain = run(backend, messages)[-1]
    again = run(backend, messages)[-1]
    assert again.metrics.cached_tokens > 0
    stack = LoraStack()
    stack.push(server_lora, 1.0)
    assert backend.set_lora_stack(stack) is True  # the cache went stale
    tuned = run(backend, messages)[-1]
    assert tuned.text != plain.text
    assert tuned.metrics.cached_tokens == 0 and "LoRA" in tuned.metrics.cache_note
    backend.set_lora_stack(LoraStack())
    back = run(backend, messages)[-1]
    assert back.text == plain.text


def test_capability_flags_say_why(backend: Backend) -> None:
    caps = backend.capabilities
    for flag in FLAGS:
        if not getattr(caps, flag):
            assert caps.why_not.get(flag), f"{flag} is off without a reason"
    if not caps.grammar:
        with pytest.raises(LamplightError):
            run(backend, ask("Hi"), SamplingParams(output_format="gbnf", grammar='root ::= "a"'))
    assert backend.ping() == ""
