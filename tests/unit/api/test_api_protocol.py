"""The API's request parsing and response shapes, without a server or a model (fast)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from app.api.errors import ApiError, cut_short
from app.api.gateway import ApiFailure, ApiJob
from app.api.schema import BASE, MAX_JSON_ITEMS, load_body, parse_chat, parse_completion
from app.api.sse import ChunkWriter, Reply, failure_event, timings, usage
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics
from app.host.jobs import StopCause
from tests.hypothesis_budget import examples

USER = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, **fields}


# -- parsing ------------------------------------------------------------------------------


def test_chat_fields_map_to_sampling_params() -> None:
    req = parse_chat(
        chat(
            temperature=0.2,
            top_p=0.5,
            top_k=7,
            min_p=0.1,
            typical_p=0.9,
            repeat_penalty=1.1,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            seed=42,
            stop="\n",
            max_tokens=33,
            mirostat=2,
            mirostat_tau=4.0,
            mirostat_eta=0.2,
            stream=True,
            stream_options={"include_usage": True},
            cache_prompt=False,
            user="editor",
            some_future_field={"ignored": True},
        )
    )
    p = req.params
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.typical_p) == (0.2, 0.5, 7, 0.1, 0.9)
    assert (p.repeat_penalty, p.presence_penalty, p.frequency_penalty) == (1.1, 0.5, -0.5)
    assert (p.seed, p.stop, p.max_tokens, p.mirostat) == (42, ("\n",), 33, "v2")
    assert (p.mirostat_tau, p.mirostat_eta) == (4.0, 0.2)
    assert (p.overflow, p.speculative) == ("stop", False)
    assert req.stream and req.include_usage and not req.reuse
    assert (req.user, req.model, req.kind, req.max_tokens) == ("editor", "m", "chat", 33)
    assert req.params_for(4096).max_tokens == 33


def test_omitted_fields_take_the_api_defaults() -> None:
    req = parse_chat({"messages": USER, "temperature": None, "stop": None})
    assert req.params == BASE
    assert SamplingParams(overflow="stop", speculative=False) == BASE
    assert req.max_tokens is None and req.params_for(2048).max_tokens == 2048
    assert (req.model, req.stream, req.include_usage, req.reuse) == ("", False, False, True)


def test_max_completion_tokens_wins_and_is_named() -> None:
    assert parse_chat(chat(max_completion_tokens=5, max_tokens=9)).params.max_tokens == 5
    with pytest.raises(ApiError) as err:
        parse_chat(chat(max_completion_tokens=0))
    assert err.value.param == "max_completion_tokens"


def test_messages_roles_and_text_parts() -> None:
    req = parse_chat(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None},
                {"role": "user", "content": "c", "name": "bob"},
            ]
        }
    )
    assert req.messages == [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "ab"),
        ChatMessage("assistant", ""),
        ChatMessage("user", "c"),
    ]


def test_response_format_and_grammar() -> None:
    assert parse_chat(chat(response_format={"type": "text"})).params.output_format == "text"
    assert parse_chat(chat(response_format={"type": "json_object"})).params.output_format == "json"
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    p = parse_chat(
        chat(
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        )
    ).params
    assert p.output_format == "json_schema" and json.loads(p.json_schema) == schema
    g = parse_chat(chat(grammar='root ::= "yes" | "no"')).params
    assert (g.output_format, g.grammar) == ("gbnf", 'root ::= "yes" | "no"')


def test_completion_prompt() -> None:
    req = parse_completion({"model": "m", "prompt": "Once upon", "max_tokens": 4})
    assert req.kind == "completion" and req.messages == [ChatMessage("user", "Once upon")]
    assert parse_completion({"prompt": ["one"]}).messages == [ChatMessage("user", "one")]
    assert (
        parse_completion({"prompt": "x", "echo": False, "best_of": 1, "suffix": ""}).params == BASE
    )


REFUSED_CHAT: list[tuple[dict[str, Any], str]] = [
    ({"n": 2}, "n"),
    ({"n": 0}, "n"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"audio": {"voice": "alloy"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"temperature": 9}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"seed": 2**40}, "seed"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"stop": ["a"] * 17}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"stop": "x" * 257}, "stop"),
    ({"stop": 5}, "stop"),
    ({"mirostat": 3}, "mirostat"),
    ({"mirostat_tau": 50}, "mirostat_tau"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "bogus"}}}},
        "response_format",
    ),
    ({"response_format": {"type": "json_object"}, "grammar": "root ::= x"}, "grammar"),
    ({"grammar": "no rule here"}, "grammar"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": []}, "stream_options"),
    ({"stream_options": {"include_usage": 1}}, "include_usage"),
    ({"model": 5}, "model"),
    ({"user": 5}, "user"),
    ({"cache_prompt": "no"}, "cache_prompt"),
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}] * 4097}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    (
        {"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]},
        "messages[0].tool_call_id",
    ),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        "messages[0].content[0]",
    ),
    (
        {"messages": [USER[0], {"role": "user", "content": [{"type": "input_audio"}]}]},
        "messages[1].content[0]",
    ),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0]"),
    (
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
        "messages[0].tool_calls[0].function",
    ),
]


def test_chat_refusals_name_their_param() -> None:
    # One test for all (not parametrized): each case costs microseconds, a test 0.1 s.
    for fields, param in REFUSED_CHAT:
        with pytest.raises(ApiError) as err:
            parse_chat(chat(**fields))
        e = err.value
        assert (e.status, e.type, e.param) == (400, "invalid_request_error", param), fields
        assert e.message
        assert e.code in ("invalid_value", "unsupported_parameter", "missing_required_parameter")


REFUSED_COMPLETION: list[tuple[dict[str, Any], str]] = [
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": [[1, 2], [3]]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "suffix": "end"}, "suffix"),
    ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": "x", "logprobs": 2}, "logprobs"),
    ({"prompt": "x", "n": 3}, "n"),
    ({"prompt": "x", "logit_bias": {"1": 1}}, "logit_bias"),
    ({"prompt": "x", "top_p": 2}, "top_p"),
]


def test_completion_refusals_name_their_param() -> None:
    for fields, param in REFUSED_COMPLETION:
        with pytest.raises(ApiError) as err:
            parse_completion(fields)
        assert (err.value.status, err.value.param) == (400, param), fields


def test_body_limits() -> None:
    for raw in (b"", b"  ", b"{", b"[1]", b'"x"', b"\xff\xfe{}", b"nul"):
        with pytest.raises(ApiError) as err:
            load_body(raw)
        assert (err.value.status, err.value.code) == (400, "invalid_json")
    deep = b'{"a":' * 70 + b"1" + b"}" * 70
    with pytest.raises(ApiError, match="nested too deeply"):
        load_body(deep)
    assert load_body(b'{"a":' * 60 + b"1" + b"}" * 60)
    # A lone surrogate escape becomes U+FFFD, never an unencodable string.
    body = load_body(b'{"messages":[{"role":"user","content":"a\\ud800b"}]}')
    assert parse_chat(body).messages[0].content == "a\ufffdb"


def test_a_body_of_many_tiny_values_is_refused_before_parsing() -> None:
    """json holds the GIL for a whole parse, and its time follows the values, not the
    bytes: 8 MB of ``[]`` took seconds and hundreds of MB. Bounded before it starts."""
    hostile = b'{"messages": [], "junk": [' + b",".join([b"[]"] * (MAX_JSON_ITEMS // 2)) + b"]}"
    with pytest.raises(ApiError) as err:
        load_body(hostile)
    assert (err.value.status, err.value.code) == (413, "request_too_large")
    assert f"{MAX_JSON_ITEMS:,}" in err.value.message
    # A long chat (4,096 messages, commas in the text) is far under the bound.
    long_chat = json.dumps(chat(messages=[{"role": "user", "content": "a, b, c"}] * 4096))
    assert len(parse_chat(load_body(long_chat.encode())).messages) == 4096


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = [
    "model", "messages", "prompt", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
    "max_tokens", "max_completion_tokens", "response_format", "grammar", "mirostat", "stream",
    "stream_options", "n", "tools", "logprobs", "logit_bias", "echo", "suffix", "best_of",
    "user", "cache_prompt", "tool_choice", "repeat_penalty", "presence_penalty",
]  # fmt: skip
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "x"]) | JSON},
    optional={"content": JSON | st.text(max_size=10), "tool_calls": JSON},
)
BODY = st.builds(
    lambda fields, shaped: {**fields, **shaped},
    st.dictionaries(st.sampled_from(KEYS), JSON, max_size=8),
    st.fixed_dictionaries(
        {}, optional={"messages": st.lists(MESSAGE, max_size=3), "prompt": JSON | st.text()}
    ),
)


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=BODY | JSON)
def test_any_json_raises_only_api_error(body: Any) -> None:
    for parse in (parse_chat, parse_completion):
        try:
            req = parse(body)
        except ApiError as exc:
            assert exc.status == 400 and exc.message
            json.dumps(exc.body())
        else:
            assert req.messages and req.params.overflow == "stop"
            assert req.params_for(512).max_tokens >= 1


@settings(max_examples=examples(80), deadline=None)
@given(raw=st.binary(max_size=64) | JSON.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_raise_only_api_error(raw: bytes) -> None:
    try:
        body = load_body(raw)
    except ApiError as exc:
        assert exc.status == 400
        return
    for parse in (parse_chat, parse_completion):
        try:
            parse(body)
        except ApiError as exc:
            assert exc.status == 400


# -- responses ----------------------------------------------------------------------------


def metrics(stop_reason: str = "eos") -> MessageMetrics:
    return MessageMetrics(
        prompt_tokens=20,
        cached_tokens=15,
        evaluated_tokens=5,
        prefill_ms=10.0,
        generated_tokens=3,
        token_times_ms=[12.0, 22.0, 32.0],
        stop_reason=stop_reason,
    )


def events(data: bytes) -> list[str]:
    assert data.endswith(b"\n\n")
    chunks = data.decode().split("\n\n")[:-1]
    assert all(c.startswith("data: ") for c in chunks)
    return [c[len("data: ") :] for c in chunks]


def test_usage_and_timings() -> None:
    m = metrics()
    assert usage(m) == {
        "prompt_tokens": 20,
        "completion_tokens": 3,
        "total_tokens": 23,
        "prompt_tokens_details": {"cached_tokens": 15},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    t = timings(m)
    assert (t["prompt_n"], t["cache_n"], t["prompt_ms"], t["predicted_n"]) == (5, 15, 10.0, 3)
    assert t["predicted_per_second"] == round(m.decode_tok_s, 3) == 100.0
    assert t["predicted_ms"] == 20.0 and t["prompt_per_second"] == 500.0


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [
        ("eos", "stop"),
        ("stop_string", "stop"),
        ("max_tokens", "length"),
        ("context_full", "length"),
    ],
)
def test_whole_responses_validate(stop_reason: str, finish: str) -> None:
    done = Finished('Hi "there"\n✓', metrics(stop_reason))
    body = Reply("chat", "chatcmpl-1", "m", 1700000000).body(done)
    chat_reply = ChatCompletion.model_validate(body)
    assert chat_reply.choices[0].message.content == done.text
    assert chat_reply.choices[0].finish_reason == finish
    assert chat_reply.usage and chat_reply.usage.prompt_tokens_details
    assert chat_reply.usage.prompt_tokens_details.cached_tokens == 15
    assert body["timings"]["cache_n"] == 15
    assert set(body["choices"][0]) == {"index", "logprobs", "message", "finish_reason"}
    text = Completion.model_validate(Reply("completion", "cmpl-1", "m", 1).body(done))
    assert text.object == "text_completion" and text.choices[0].text == done.text
    assert text.choices[0].finish_reason == finish


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_chunks_validate(include_usage: bool) -> None:
    w = ChunkWriter(Reply("chat", "chatcmpl-1", "m", 1), include_usage)
    pieces = ["Hel", 'lo "q"', "\n", "\u2028 ✓ \\", ""]
    data = w.start() + b"".join(w.token(p) for p in pieces) + w.finish(Finished("x", metrics()))
    raw = events(data)
    assert raw[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(json.loads(r)) for r in raw[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].delta.content for c in chunks[1 : 1 + len(pieces)]] == pieces
    last_choice = chunks[len(pieces) + 1]
    assert last_choice.choices[0].finish_reason == "stop"
    assert json.loads(raw[len(pieces) + 1])["timings"]["prompt_n"] == 5
    if include_usage:
        assert all(c.usage is None for c in chunks[:-1])
        assert chunks[-1].choices == [] and chunks[-1].usage
        assert chunks[-1].usage.completion_tokens == 3
        assert len(chunks) == len(pieces) + 3
    else:
        assert len(chunks) == len(pieces) + 2
        assert all("usage" not in json.loads(r) for r in raw[:-1])


def test_completion_chunks_validate() -> None:
    w = ChunkWriter(Reply("completion", "cmpl-1", "m", 1), include_usage=True)
    assert w.start() == b""
    raw = events(w.token("a") + w.token("b") + w.finish(Finished("ab", metrics("max_tokens"))))
    data = [json.loads(r) for r in raw[:-1]]
    # OpenAI's own stream sends finish_reason null until the end; the SDK's type (used
    # without validation for streams) has no None, so fill it in to check the rest.
    assert [d["choices"][0]["finish_reason"] for d in data[:2]] == [None, None]
    for d in data[:2]:
        d["choices"][0]["finish_reason"] = "stop"
    chunks = [Completion.model_validate(d) for d in data]
    assert [c.choices[0].text for c in chunks[:2]] == ["a", "b"]
    assert chunks[2].choices[0].finish_reason == "length"
    assert chunks[3].choices == [] and chunks[3].usage and chunks[3].usage.total_tokens == 23


def test_error_bodies() -> None:
    e = ApiError(400, "Bad.", param="n", code="unsupported_parameter")
    assert e.body() == {
        "error": {
            "message": "Bad.",
            "type": "invalid_request_error",
            "param": "n",
            "code": "unsupported_parameter",
        }
    }
    assert (b"x-should-retry", b"false") in e.response_headers()
    busy = ApiError(429, "Busy.", headers={"Retry-After": "2"})
    assert busy.body()["error"]["type"] == "requests"
    assert busy.body()["error"]["code"] == "rate_limit_exceeded"
    assert dict(busy.response_headers()) == {b"retry-after": b"2"}
    loading = ApiError.from_failure(ApiFailure(503, "server_error", "model_loading", "Loading."))
    assert (loading.status, loading.code, loading.headers) == (
        503,
        "model_loading",
        {"Retry-After": "2"},
    )
    event = failure_event(ApiFailure(500, "server_error", "engine_error", "Boom.", None))
    [raw] = events(event)
    assert json.loads(raw) == {
        "error": {"message": "Boom.", "type": "server_error", "param": None, "code": "engine_error"}
    }


def job_stopped_by(why: StopCause) -> ApiJob:
    job = ApiJob("chatcmpl-1", "chat", "m", [], SamplingParams())
    if why:
        job.halt(why)
    return job


@pytest.mark.parametrize(
    ("stop_reason", "why", "status", "code", "retry"),
    [
        ("cancelled", "operator", 503, "request_stopped", False),
        ("cancelled", "shutdown", 503, "server_shutting_down", True),
        ("cancelled", "client", 503, "request_cancelled", True),
        ("cancelled", "", 503, "request_cancelled", True),
        ("connection_lost", "", 502, "upstream_connection_lost", True),
        ("server_error", "", 502, "upstream_error", True),
        ("size_limit", "", 502, "upstream_reply_too_large", True),
        ("time_limit", "", 504, "upstream_timeout", True),
        ("some_future_cap", "", 500, "incomplete_reply", True),
        ("", "", 500, "incomplete_reply", True),
    ],
)
def test_a_reply_cut_short_is_an_error_not_a_stop(
    stop_reason: str, why: StopCause, status: int, code: str, retry: bool
) -> None:
    """Only whole replies get a finish_reason; the rest say they are incomplete."""
    failure = cut_short(job_stopped_by(why), Finished("Half a", metrics(stop_reason)))
    assert failure is not None
    assert (failure.status, failure.code, failure.retry) == (status, code, retry)
    assert "3 tokens" in failure.message and "incomplete" in failure.message
    headers = dict(ApiError.from_failure(failure).response_headers())
    assert (headers.get(b"x-should-retry") == b"false") == (not retry)
    assert (b"retry-after" in headers) == (status == 503 and retry)
    for whole in ("eos", "stop_string", "max_tokens", "context_full"):
        assert cut_short(job_stopped_by(why), Finished("x", metrics(whole))) is None


def test_halt_keeps_the_first_reason() -> None:
    job = job_stopped_by("operator")
    job.halt("shutdown")
    job.halt("client")
    assert job.stop.is_set() and job.stopped_by == "operator"
