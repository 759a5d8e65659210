"""Reasoning through the local API: ``reasoning_content`` apart from the answer (and
``delta.reasoning_content`` when streaming), ``reasoning_tokens`` in the usage, and
the request fields llama-server takes (``reasoning_effort``, ``chat_template_kwargs``,
a thinking budget, an assistant message's ``reasoning_content``), checked."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from app.api.config import ApiConfig
from app.api.errors import ApiError
from app.api.host_gateway import HostGateway
from app.api.runner import ApiServer
from app.api.schema import parse_chat
from app.engine.backend import Finished, Token
from app.engine.local.engine import Engine
from app.engine.metrics import MessageMetrics
from app.engine.templates.override import TemplateOverride
from app.host.host import EngineHost
from app.host.jobs import ReplyJob
from app.host.listener import QuietListener
from tests.conftest import ONE_THREAD
from tests.fakes.gateway import FakeGateway
from tests.reasoning_templates import R1

MODEL = "gemma-3-270m-it-Q4_K_M"
USER: Any = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> Any:
    return parse_chat({"messages": USER, **fields})


def refused(**fields: Any) -> ApiError:
    with pytest.raises(ApiError) as err:
        chat(**fields)
    assert err.value.status == 400
    return err.value


# -- the request fields ----------------------------------------------------------------


def test_reasoning_effort_maps_to_the_thinking_settings() -> None:
    assert chat().params.thinking == "auto" and chat().params.reasoning_effort == "auto"
    for effort, thinking, level in [
        ("low", "auto", "low"),
        ("medium", "auto", "medium"),
        ("high", "auto", "high"),
        ("minimal", "auto", "low"),
        ("none", "off", "auto"),
    ]:
        p = chat(reasoning_effort=effort).params
        assert (p.thinking, p.reasoning_effort) == (thinking, level), effort
    err = refused(reasoning_effort="extreme")
    assert err.param == "reasoning_effort" and "low" in str(err)
    assert refused(reasoning_effort=3).param == "reasoning_effort"


def test_chat_template_kwargs() -> None:
    p = chat(chat_template_kwargs={"enable_thinking": False}).params
    assert p.thinking == "off" and p.template_kwargs == ""
    p = chat(chat_template_kwargs={"enable_thinking": True, "reasoning_effort": "high"}).params
    assert (p.thinking, p.reasoning_effort) == ("on", "high")
    p = chat(chat_template_kwargs={"custom_flag": [1, {"a": "é"}], "builtin_tools": []}).params
    assert json.loads(p.template_kwargs) == {"custom_flag": [1, {"a": "é"}], "builtin_tools": []}
    # The top-level effort wins over the kwargs' one.
    p = chat(reasoning_effort="low", chat_template_kwargs={"reasoning_effort": "high"}).params
    assert p.reasoning_effort == "low"
    for bad, words in [
        ([1], "object"),
        ("enable_thinking", "object"),
        ({"enable_thinking": "yes"}, "true or false"),
        ({"reasoning_effort": "lots"}, "reasoning_effort"),
        ({"x": "y" * 20_000}, "at most"),
        ({"a": [[[[[[[[[[1]]]]]]]]]]}, "nested"),
    ]:
        err = refused(chat_template_kwargs=bad)
        assert (err.param or "").startswith("chat_template_kwargs"), bad
        assert words in str(err), (bad, str(err))


def test_thinking_budget_fields() -> None:
    assert chat(thinking_budget_tokens=300).params.thinking_budget == 300
    assert chat(reasoning_budget=-1).params.thinking_budget == 0
    p = chat(reasoning_budget=0).params
    assert p.thinking == "off" and p.thinking_budget == 0
    assert refused(thinking_budget_tokens="many").param == "thinking_budget_tokens"
    assert refused(reasoning_budget=-5).param == "reasoning_budget"
    assert refused(thinking_budget_tokens=10**9).param == "thinking_budget_tokens"


def test_assistant_messages_carry_their_reasoning() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "because"},
        {"role": "assistant", "content": "<think>raw</think>c", "reasoning": "r"},
        {"role": "user", "content": "d", "reasoning_content": "ignored"},
    ]
    got = parse_chat({"messages": messages}).messages
    assert [(m.content, m.reasoning) for m in got] == [
        ("a", ""),
        ("b", "because"),
        ("<think>raw</think>c", "r"),  # the content is left as the client sent it
        ("d", ""),
    ]
    bad = [{"role": "assistant", "content": "b", "reasoning_content": ["x"]}]
    with pytest.raises(ApiError) as err:
        parse_chat({"messages": bad})
    assert err.value.param == "messages[0].reasoning_content"


# -- the responses, over HTTP ------------------------------------------------------------


class ThinkingGateway(FakeGateway):
    """Thinks in two tokens, then answers in two; usage counts the thinking."""

    def _one(self, job: ReplyJob) -> None:
        t0 = time.perf_counter()
        metrics = MessageMetrics(prompt_tokens=4, n_ctx=2048)
        pieces = [("Let me", True), (" see.", True), ("Hi", False), ("!", False)]
        for text, thought in pieces:
            metrics.generated_tokens += 1
            metrics.token_times_ms.append((time.perf_counter() - t0) * 1000)
            job.relay.send(Token(text, thought))
        metrics.reasoning_tokens = 2
        metrics.first_answer_ms = metrics.token_times_ms[2]
        metrics.stop_reason = "eos"
        job.relay.send(Finished("Hi!", metrics, "Let me see."))


@pytest.fixture()
def thinking_server() -> Iterator[ApiServer]:
    gateway = ThinkingGateway()
    server = ApiServer(gateway, ApiConfig(port=0))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        gateway.close()


def client(server: ApiServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=10)


def test_reasoning_content_and_usage(thinking_server: ApiServer) -> None:
    r = client(thinking_server).chat.completions.create(model=MODEL, messages=USER)
    message = r.choices[0].message
    assert message.content == "Hi!"
    assert message.model_extra and message.model_extra["reasoning_content"] == "Let me see."
    assert r.usage and r.usage.completion_tokens == 4
    assert r.usage.completion_tokens_details
    assert r.usage.completion_tokens_details.reasoning_tokens == 2


def test_streamed_reasoning_deltas(thinking_server: ApiServer) -> None:
    chunks = list(
        client(thinking_server).chat.completions.create(
            model=MODEL, messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    answer = "".join(d.content or "" for d in deltas)
    assert (thought, answer) == ("Let me see.", "Hi!")
    # A thinking chunk has no content field at all (clients add up "content" deltas).
    assert all(d.content is None for d in deltas if (d.model_extra or {}).get("reasoning_content"))
    last = chunks[-1].usage
    assert last and last.completion_tokens_details
    assert last.completion_tokens_details.reasoning_tokens == 2


def test_a_text_completion_keeps_the_thinking_as_text(thinking_server: ApiServer) -> None:
    r = client(thinking_server).completions.create(model=MODEL, prompt="Once")
    assert r.choices[0].text == "Let me see.Hi!"


# -- the real engine, through the host ---------------------------------------------------


@pytest.fixture(scope="module")
def r1_server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """``ApiServer`` over the host over the default model with a template whose
    generation prompt opens the thinking block (R1's): every reply starts thinking."""
    engine = Engine()
    engine.load(model_path, ONE_THREAD)
    info = engine.set_template(TemplateOverride("custom", source=R1))
    assert info.reasoning is not None and info.reasoning.prefilled
    host = EngineHost(engine, tmp_path_factory.mktemp("models"), None, QuietListener())
    thread = host.start()
    server = ApiServer(HostGateway(host), ApiConfig(port=0))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        host.close()
        thread.join(10)
        engine.unload()


def test_real_reply_with_a_thinking_budget(r1_server: ApiServer) -> None:
    c = openai.OpenAI(base_url=r1_server.url, api_key="none", max_retries=0, timeout=120)
    extra = {"thinking_budget_tokens": 8, "cache_prompt": False}
    r = c.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=30, temperature=0, extra_body=extra
    )
    message = r.choices[0].message
    thought = (message.model_extra or {}).get("reasoning_content") or ""
    assert thought.endswith("I will answer now.")  # the budget message
    assert "<think>" not in thought + (message.content or "")
    assert r.usage and r.usage.completion_tokens_details
    assert r.usage.completion_tokens_details.reasoning_tokens == 8  # never more
    assert r.usage.completion_tokens == 30

    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=USER,
            max_tokens=30,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
    )
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed.strip() == thought
    assert "".join(d.content or "" for d in deltas) == (message.content or "")
    last = chunks[-1].usage
    assert last and last.completion_tokens_details
    assert last.completion_tokens_details.reasoning_tokens == 8


def test_real_reply_with_thinking_off_and_history_sent_back(r1_server: ApiServer) -> None:
    c = openai.OpenAI(base_url=r1_server.url, api_key="none", max_retries=0, timeout=120)
    history: Any = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Bye"},
    ]
    r = c.chat.completions.create(
        model=MODEL, messages=history, max_tokens=8, temperature=0, reasoning_effort="none"
    )
    message = r.choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})
    assert message.content and r.usage and r.usage.completion_tokens_details
    assert r.usage.completion_tokens_details.reasoning_tokens == 0
