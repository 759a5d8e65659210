"""End to end: the official ``openai`` client against ``lamplight serve`` on 127.0.0.1.

One server process for the module (the default model, one thread, a queue of 3), always
stopped at the end. Greedy requests with ``cache_prompt: false`` start from an empty
cache, so they are comparable run to run (NOTES: batch shape changes the arithmetic).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from app.config.setting_records import ApiSettings, LoadConfig, SamplingParams
from app.engine.backend import Finished, Token
from app.engine.chat_message import ChatMessage
from app.remote.connection import Connection
from app.remote.openai.backend import OpenAIBackend
from tests.serve_fixture import Served, running

FRESH = {"cache_prompt": False}
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": FRESH}
HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]


@pytest.fixture(scope="module")
def served(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    args = ["--port", "0", "--threads", "1", "--max-queue", "3", "--n-ctx", "2048"]
    with running(tmp_path_factory.mktemp("serve"), [*args, "--model", str(model_path)]) as s:
        yield s


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=served.url, api_key="x", max_retries=0, timeout=120)
    yield c
    c.close()


def chat(client: openai.OpenAI, served: Served, **kw: Any) -> Any:
    kw.setdefault("messages", HELLO)
    return client.chat.completions.create(model=served.model, **kw)


def stream_text(client: openai.OpenAI, served: Served, **kw: Any) -> tuple[str, list[Any]]:
    chunks = list(chat(client, served, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_models_lists_the_loaded_model(client: openai.OpenAI, served: Served) -> None:
    models = list(client.models.list())
    assert [m.id for m in models] == [served.model]
    assert models[0].owned_by == "lamplight"
    assert "gemma" in served.model.lower()
    assert client.models.retrieve(served.model).id == served.model


def test_chat_non_streaming(client: openai.OpenAI, served: Served) -> None:
    r = chat(client, served, max_tokens=12, **GREEDY)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == served.model
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.prompt_tokens > 5
    assert 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_equals_non_streaming(client: openai.OpenAI, served: Served) -> None:
    whole = chat(client, served, max_tokens=12, **GREEDY)
    text, chunks = stream_text(
        client, served, max_tokens=12, stream_options={"include_usage": True}, **GREEDY
    )
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None  # the usage chunk comes last
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == whole.choices[0].finish_reason and not any(finish[:-1])
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_completion_both_ways(client: openai.OpenAI, served: Served) -> None:
    prompt = "The three primary colours are"
    r = client.completions.create(
        model=served.model, prompt=prompt, max_tokens=10, temperature=0, extra_body=FRESH
    )
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage is not None and r.usage.completion_tokens <= 10
    parts = client.completions.create(
        model=served.model,
        prompt=prompt,
        max_tokens=10,
        temperature=0,
        stream=True,
        extra_body=FRESH,
    )
    assert "".join(c.choices[0].text for c in parts if c.choices) == r.choices[0].text


def test_json_schema_output_parses(client: openai.OpenAI, served: Served) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "mood": {"enum": ["happy", "sad"]},
        },
        "required": ["name", "mood"],
    }
    r = chat(
        client,
        served,
        messages=[{"role": "user", "content": "Describe a cat as JSON."}],
        max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}},
        **GREEDY,
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    data = json.loads(r.choices[0].message.content or "")
    assert set(data) >= {"name", "mood"} and data["mood"] in ("happy", "sad")
    assert len(data["name"]) <= 12


def test_json_object_output_parses_when_it_ends(client: openai.OpenAI, served: Served) -> None:
    r = chat(
        client,
        served,
        messages=[{"role": "user", "content": "Give a JSON object with the number two."}],
        max_tokens=60,
        response_format={"type": "json_object"},
        **GREEDY,
    )
    content = r.choices[0].message.content or ""
    assert content.lstrip().startswith(("{", "["))
    if r.choices[0].finish_reason == "stop":  # a base model may run to the limit
        json.loads(content)


def test_stop_string(client: openai.OpenAI, served: Served) -> None:
    r = client.completions.create(
        model=served.model,
        prompt="Monday\nTuesday\nWednesday\n",
        max_tokens=32,
        temperature=0,
        stop=["\n"],
        extra_body=FRESH,
    )
    assert "\n" not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop"


def test_max_tokens_gives_length(client: openai.OpenAI, served: Served) -> None:
    r = chat(client, served, max_tokens=8, **GREEDY)
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 8


def test_same_seed_same_text(client: openai.OpenAI, served: Served) -> None:
    kw: dict[str, Any] = {"max_tokens": 16, "temperature": 0.9, "seed": 1234}
    a = chat(client, served, extra_body=FRESH, **kw).choices[0].message.content
    b = chat(client, served, extra_body=FRESH, **kw).choices[0].message.content
    assert a and a == b


def test_any_model_name_gets_the_loaded_model(client: openai.OpenAI, served: Served) -> None:
    """As llama-server: clients that send their default name ("gpt-3.5-turbo") work."""
    r = client.chat.completions.create(model="gpt-3.5-turbo", messages=HELLO, max_tokens=4)
    assert r.model == served.model and r.choices[0].message.content
    with pytest.raises(openai.NotFoundError) as caught:  # a lookup by name is still one
        client.models.retrieve("gpt-3.5-turbo")
    assert caught.value.code == "model_not_found"


@pytest.mark.parametrize(("extra", "param"), [({"n": 2}, "n"), ({"temperature": 9}, "temperature")])
def test_bad_fields_are_400_naming_the_param(
    client: openai.OpenAI, served: Served, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, served, max_tokens=4, **extra)
    assert caught.value.param == param
    assert caught.value.type == "invalid_request_error"


def test_oversized_body_is_413(client: openai.OpenAI, served: Served) -> None:
    # Just over the default limit (which leaves room for a phone photo as base64).
    huge = [{"role": "user", "content": "x" * ((ApiSettings().max_body_mb + 1) * 2**20)}]
    with pytest.raises(openai.APIStatusError) as caught:
        chat(client, served, messages=huge, max_tokens=4)
    assert caught.value.status_code == 413
    assert caught.value.code == "request_too_large"
    assert chat(client, served, max_tokens=2).choices  # and the server goes on


def test_follow_up_evaluates_only_the_new_tokens(client: openai.OpenAI, served: Served) -> None:
    first = [{"role": "user", "content": "Name a colour of the sky at dusk."}]
    r1 = chat(client, served, messages=first, max_tokens=16, temperature=0)
    reply = r1.choices[0].message.content
    follow = [
        *first,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And at noon?"},
    ]
    r2 = chat(client, served, messages=follow, max_tokens=8, temperature=0)
    u1, u2 = r1.usage, r2.usage
    assert u1 is not None and u2 is not None and u2.prompt_tokens_details is not None
    cached = u2.prompt_tokens_details.cached_tokens or 0
    assert cached >= u1.prompt_tokens + u1.completion_tokens - 1, (u1, u2)
    assert u2.prompt_tokens - cached <= 24, (u1, u2)


def test_disconnect_stops_generation(client: openai.OpenAI, served: Served) -> None:
    stream = chat(client, served, max_tokens=2000, stream=True, **GREEDY)
    got = []
    for chunk in stream:
        got.append(chunk)
        if len(got) >= 3:
            break
    job_id = got[0].id
    stream.close()
    t0 = time.monotonic()
    outcome = None
    while time.monotonic() - t0 < 2.0 and outcome is None:
        outcome = next((o for o in served.status()["recent"] if o["id"] == job_id), None)
        time.sleep(0.05)
    assert outcome is not None, served.status()
    assert outcome["finish"] == "cancelled" and outcome["tokens"] < 2000


def test_two_concurrent_streams_match_their_solo_runs(
    client: openai.OpenAI, served: Served
) -> None:
    prompts = [
        [{"role": "user", "content": "Tell me about rivers."}],
        [{"role": "user", "content": "Tell me about mountains."}],
    ]
    solo = [stream_text(client, served, messages=p, max_tokens=24, **GREEDY)[0] for p in prompts]
    start = threading.Barrier(2)

    def run(p: list[dict[str, str]]) -> str:
        start.wait()
        return stream_text(client, served, messages=p, max_tokens=24, **GREEDY)[0]

    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(run, prompts))
    assert both == solo
    assert solo[0] != solo[1]


def test_a_full_queue_is_429(client: openai.OpenAI, served: Served) -> None:
    start = threading.Barrier(5)

    def run(_i: int) -> str:
        start.wait()
        try:
            chat(client, served, max_tokens=24, **GREEDY)
        except openai.RateLimitError as exc:
            assert exc.code == "rate_limit_exceeded"
            return "429"
        return "ok"

    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(run, range(5)))
    assert results.count("429") >= 1 and results.count("ok") >= 3, results


def test_our_openai_backend_against_it(served: Served) -> None:
    backend = OpenAIBackend(Connection("lamplight", "Lamplight", "openai", served.root))
    info = backend.load("", LoadConfig())
    try:
        assert info.name
        params = SamplingParams.greedy(8)
        msgs = [ChatMessage("user", "Say something about bread.")]
        events = list(backend.generate(msgs, params))
        tokens = [e for e in events if isinstance(e, Token)]
        [done] = [e for e in events if isinstance(e, Finished)]
        assert tokens and done.text == "".join(t.text for t in tokens)
        assert done.metrics.generated_tokens == 8
        follow = [*msgs, ChatMessage("assistant", done.text), ChatMessage("user", "Why?")]
        again = [e for e in backend.generate(follow, params) if isinstance(e, Finished)]
        assert again[0].metrics.cached_tokens >= done.metrics.prompt_tokens
    finally:
        backend.unload()


def test_requests_are_logged_to_stderr(served: Served) -> None:
    lines = [ln for ln in served.stderr().splitlines() if "chatcmpl-" in ln]
    assert lines and any("cancelled" in ln for ln in lines)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_serve_streams_with_no_qt_loaded(client: openai.OpenAI, served: Served) -> None:
    """The engine host runs on a plain thread: the server process maps no Qt library."""
    text, chunks = stream_text(client, served, max_tokens=8, **GREEDY)
    assert text and chunks[-1].choices[0].finish_reason in ("stop", "length")
    maps = Path(f"/proc/{served.proc.pid}/maps").read_text().lower()
    qt = sorted(
        {
            line.split()[-1]
            for line in maps.splitlines()
            if "qt6" in line or "pyside6" in line or "shiboken" in line
        }
    )
    assert qt == [], f"lamplight serve mapped Qt: {qt}"
