"""The OpenAI-compatible backend (issue 15) against a real llama-server's ``/v1`` API, and
against a scripted loopback server for what a real one will not do on cue (drop the
connection mid-reply, send vLLM's or OpenAI's error messages, send damaged streams).

Invariant throughout: Token events then exactly one Finished, or a typed Lamplight
error; bounded waits; every server and thread stopped.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config.field_spec import SettingError
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import (
    SERVER_ERROR,
    SIZE_LIMIT,
    TIME_LIMIT,
    Backend,
    Finished,
    KvState,
    Token,
)
from app.engine.chat_message import ChatMessage
from app.gguf.lora import LoraError, LoraStack
from app.remote.connection import Connection
from app.remote.http import TOKEN_SLACK, EventStream, ServerUnreachable
from app.remote.openai import backend as openai_compat
from app.remote.openai.backend import (
    NO_VISION,
    WHY_NOT,
    ApiKeyRefused,
    OpenAIBackend,
)
from app.remote.openai.estimate import DEFAULT_CHARS_PER_TOKEN
from app.remote.openai.models import api_prefix, list_models
from app.remote.openai.wire import ReplyStream
from app.util.errors import (
    ContextOverflowError,
    LamplightError,
    ModelLoadError,
    NoModelLoaded,
)
from tests.hypothesis_budget import examples
from tests.server_fixture import RunningServer, free_port, running_llama_server

STOP_REASONS = {
    "eos",
    "stop_string",
    "max_tokens",
    "context_full",
    "cancelled",
    "connection_lost",
    SIZE_LIMIT,
    TIME_LIMIT,
    SERVER_ERROR,
}
FEW_SHOT = [
    ChatMessage("user", "Give a JSON object with the number one."),
    ChatMessage("assistant", '{"n": 1}'),
    ChatMessage("user", "Give a JSON object with the number two."),
    ChatMessage("assistant", '{"n": 2}'),
    ChatMessage("user", "Give a JSON object with the number three."),
]


def connection(url: str, model: str = "") -> Connection:
    return Connection("test", "test server", "openai", url, model)


def run(
    backend: OpenAIBackend,
    messages: list[ChatMessage],
    params: SamplingParams,
    stop: threading.Event | None = None,
) -> tuple[list[Token], Finished]:
    """All events of one reply; checks their order (tokens, then one Finished)."""
    events = list(backend.generate(messages, params, stop))
    tokens = [e for e in events if isinstance(e, Token)]
    finished = [e for e in events if isinstance(e, Finished)]
    assert len(finished) == 1 and events[-1] is finished[0], events[-3:]
    assert all(isinstance(e, Token | Finished) for e in events)
    assert finished[0].text == "".join(t.text for t in tokens)
    assert finished[0].metrics.stop_reason in STOP_REASONS
    return tokens, finished[0]


def post(server: RunningServer, path: str, body: Any) -> Any:
    request = urllib.request.Request(
        server.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def backend(llama_server: RunningServer) -> Iterator[OpenAIBackend]:
    """The backend on the shared server's /v1, with the server's LoRA off.

    A /v1 request carries no adapter scales, so the server applies its global ones, and
    this llama-server build starts them at 1.0 despite ``--lora-init-without-apply``.
    They are set to 0 for this module (and the slot erased: a global change does not
    drop the cache), then put back.
    """
    adapters = llama_server.get("/lora-adapters")
    assert isinstance(adapters, list)
    post(llama_server, "/lora-adapters", [{"id": a["id"], "scale": 0.0} for a in adapters])
    post(llama_server, "/slots/0?action=erase", {})
    b = OpenAIBackend(connection(llama_server.url + "/v1"))
    b.load("", LoadConfig())
    yield b
    b.unload()
    post(llama_server, "/lora-adapters", [{"id": a["id"], "scale": a["scale"]} for a in adapters])
    post(llama_server, "/slots/0?action=erase", {})


# -- a real llama-server through /v1 ---------------------------------------------


def test_models_listed_with_or_without_v1(llama_server: RunningServer, model_path: Path) -> None:
    assert api_prefix("http://h:1") == "/v1" and api_prefix("http://h:1/v1/") == ""
    for url in (llama_server.url, llama_server.url + "/v1", llama_server.url + "/"):
        assert list_models(connection(url)) == [str(model_path)]


def test_load_reads_the_model_entry(backend: OpenAIBackend, model_path: Path) -> None:
    info = backend.model
    assert info is not None
    assert info.name == model_path.name
    assert info.n_ctx == 2048  # llama-server's meta.n_ctx
    assert info.n_params > 0 and info.file_size > 0
    assert info.server.endswith("/v1") and info.fingerprint["sha256"].startswith("server:")
    assert info.capabilities == backend.capabilities
    assert isinstance(openai_compat.as_backend(backend), Backend)


def test_a_model_the_server_lacks_is_named_with_what_it_has(
    llama_server: RunningServer, model_path: Path
) -> None:
    b = OpenAIBackend(connection(llama_server.url, model="llama-70b"))
    with pytest.raises(ModelLoadError, match="no model 'llama-70b'") as info:
        b.load("", LoadConfig())
    assert str(model_path) in str(info.value)
    assert b.model is None
    with pytest.raises(NoModelLoaded):
        next(b.generate([ChatMessage("user", "hi")], SamplingParams.greedy(2)))


def test_streamed_reply(backend: OpenAIBackend) -> None:
    tokens, done = run(backend, [ChatMessage("user", "Hello there")], SamplingParams.greedy(8))
    m = done.metrics
    assert len(tokens) >= 2
    assert m.stop_reason == "max_tokens" and m.generated_tokens == 8
    assert m.prompt_tokens > 0 and m.n_ctx == 2048
    assert len(m.token_times_ms) == len(tokens)
    assert m.token_times_ms == sorted(m.token_times_ms)
    assert m.native_decode_tok_s > 0 and m.native_prefill_tok_s > 0  # llama-server's timings
    assert m.prefill_ms > 0 and m.seed == 0


def test_stop_mid_reply_is_prompt_and_frees_the_slot(
    backend: OpenAIBackend, llama_server: RunningServer
) -> None:
    stop = threading.Event()
    gen = backend.generate(
        [ChatMessage("user", "Tell a long story")], SamplingParams.greedy(500), stop
    )
    n = 0
    for event in gen:
        if isinstance(event, Token):
            n += 1
            if n == 3:
                stop.set()
                t_stop = time.perf_counter()
        elif isinstance(event, Finished):
            elapsed = time.perf_counter() - t_stop
            assert event.metrics.stop_reason == "cancelled"
            assert event.text
            break
    assert elapsed < 1.0
    deadline = time.monotonic() + 5
    while True:
        slots = llama_server.get("/slots")
        assert isinstance(slots, list)
        if not any(s.get("is_processing") for s in slots):
            break
        assert time.monotonic() < deadline, slots
        time.sleep(0.05)


def test_json_mode_and_schema_give_json(backend: OpenAIBackend) -> None:
    params = SamplingParams(temperature=0.0, top_k=1, seed=0, max_tokens=40, output_format="json")
    _, done = run(backend, FEW_SHOT, params)
    assert done.metrics.stop_reason == "eos"
    assert isinstance(json.loads(done.text), dict)
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    params = SamplingParams(
        temperature=0.0,
        top_k=1,
        seed=0,
        max_tokens=40,
        output_format="json_schema",
        json_schema=json.dumps(schema),
    )
    _, done = run(backend, FEW_SHOT, params)
    assert list(json.loads(done.text)) == ["n"]


def test_grammar_and_bad_schema_refused_before_any_request(
    backend: OpenAIBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_request(*args: object, **kwargs: object) -> None:
        raise AssertionError("a request was sent")

    monkeypatch.setattr(openai_compat, "EventStream", no_request)
    gbnf = SamplingParams(output_format="gbnf", grammar='root ::= "yes"')
    with pytest.raises(SettingError, match="GBNF") as info:
        next(backend.generate([ChatMessage("user", "hi")], gbnf))
    assert info.value.field == "grammar"
    for text in ("{", "[1]", "[" * 200 + "]" * 200):
        bad = SamplingParams(output_format="json_schema", json_schema=text)
        with pytest.raises(SettingError) as info:
            next(backend.generate([ChatMessage("user", "hi")], bad))
        assert info.value.field == "json_schema"


def test_a_prompt_too_long_for_the_context(backend: OpenAIBackend) -> None:
    huge = [ChatMessage("user", "hello world " * 1200)]
    for policy in ("stop", "truncate_middle"):  # one message: nothing to drop
        params = SamplingParams(max_tokens=4, overflow=policy)
        with pytest.raises(ContextOverflowError) as info:
            list(backend.generate(huge, params))
        assert info.value.n_ctx == 2048 and info.value.prompt_tokens > 2048
        assert ContextOverflowError.MARK in str(info.value)
        assert "start the server with a larger context" in str(info.value)


def count_messages_sent(backend: OpenAIBackend, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages each request of ``backend`` sends, from the first estimate on."""
    sent: list[int] = []
    real = EventStream

    def counting(client: Any, path: str, body: Any, stop: threading.Event, *args: Any) -> Any:
        sent.append(len(body["messages"]))
        return real(client, path, body, stop, *args)

    monkeypatch.setattr(openai_compat, "EventStream", counting)
    monkeypatch.setattr(backend._estimate, "chars_per_token", DEFAULT_CHARS_PER_TOKEN)
    return sent


def test_older_turns_dropped_by_estimate(
    backend: OpenAIBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = count_messages_sent(backend, monkeypatch)
    chat = [
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello."),
        # 8,400 characters, ~1,400 tokens: it would fit, but the first estimate is 2,800.
        ChatMessage("user", "hello world " * 700),
        ChatMessage("assistant", "ok"),
        ChatMessage("user", "Bye"),
    ]
    _, done = run(backend, chat, SamplingParams.greedy(4))
    assert sent == [3]  # dropped before sending; the server never refused it
    m = done.metrics
    assert (m.dropped_from, m.dropped_count) == (2, 2) and m.dropped_tokens > 0
    assert any("older messages" in n for n in m.notes)


def test_older_turns_dropped_after_the_server_counts(
    backend: OpenAIBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Digits are one token each here: the estimate is 3x short, the server says 400,
    and its count corrects the estimate."""
    sent = count_messages_sent(backend, monkeypatch)
    chat = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello."),
        ChatMessage("user", "0123456789" * 250),
        ChatMessage("assistant", "ok"),
        ChatMessage("user", "Bye"),
    ]
    _, done = run(backend, chat, SamplingParams.greedy(4))
    assert sent == [6, 4]
    m = done.metrics
    assert (m.dropped_from, m.dropped_count) == (3, 2)
    assert m.stop_reason == "max_tokens"
    assert backend._estimate.chars_per_token < 1.5  # corrected from the server's count


def test_capabilities_all_off_with_reasons(backend: OpenAIBackend) -> None:
    caps = backend.capabilities
    for name in ("snapshots", "lora", "grammar", "prewarm", "token_latency", "gpu_offload"):
        assert getattr(caps, name) is False
        assert len(caps.why_not[name]) > 20, name
    # This server has no projector: its /v1/models says so (vision off, with the reason).
    assert caps.why_not == WHY_NOT | {"vision": NO_VISION} and not caps.vision
    assert backend.export_state("chat") == KvState(b"", [], "", [])
    backend.import_state(KvState(b"", [], "", []))
    with pytest.raises(LamplightError, match="no cache"):
        backend.import_state(KvState(b"x", [1, 2], "ab", [(0, 0)]))
    assert backend.set_lora_stack(LoraStack()) is False
    stack = LoraStack()
    stack.push(Path("/x/adapter.gguf"), 1.0)
    with pytest.raises(LoraError, match="LoRA"):
        backend.set_lora_stack(stack)
    assert backend.prewarm([ChatMessage("user", "hi")], ChatMessage("assistant", "hello")) == 0
    assert backend.lora_signature() == [] and len(backend.lora_stack) == 0
    assert backend.ping() == ""
    assert backend.cache_config()["n_ctx"] == 2048


# -- API keys and unreachable servers ----------------------------------------------


@pytest.fixture(scope="module")
def keyed_server(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_llama_server(
        model_path, tmp_path_factory.mktemp("keyed"), n_ctx=512, extra=["--api-key", "secret"]
    ) as server:
        yield server


def test_api_key(keyed_server: RunningServer) -> None:
    wrong = OpenAIBackend(connection(keyed_server.url), api_key="wrong")
    with pytest.raises(ModelLoadError, match="refused the API key"):
        wrong.load("", LoadConfig())
    assert "refused the API key" in wrong.ping()
    with pytest.raises(ApiKeyRefused):
        list_models(connection(keyed_server.url))

    b = OpenAIBackend(connection(keyed_server.url), api_key="secret")
    b.load("", LoadConfig())
    try:
        assert b.ping() == ""
        _, done = run(b, [ChatMessage("user", "hi")], SamplingParams.greedy(2))
        assert done.metrics.generated_tokens == 2
        for client in (b._link.client, b._link.streams):  # the key changed on the server
            client.headers["Authorization"] = "Bearer revoked"
        with pytest.raises(ApiKeyRefused, match="Check the API key"):
            list(b.generate([ChatMessage("user", "hi")], SamplingParams.greedy(2)))
    finally:
        b.unload()


def test_nothing_listening() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    b = OpenAIBackend(connection(url))
    t0 = time.monotonic()
    with pytest.raises(ModelLoadError, match=r"Cannot reach the server at 127\.0\.0\.1"):
        b.load("", LoadConfig())
    assert "nothing answered" in b.ping()
    with pytest.raises(ServerUnreachable):
        list_models(connection(url))
    assert time.monotonic() - t0 < 10
    with pytest.raises(ModelLoadError, match="http:// or https://"):
        OpenAIBackend(connection("ftp://example.org")).load("", LoadConfig())


# -- a scripted server: dropped connections and other servers' errors ---------------

MODELS = {"object": "list", "data": [{"id": "org/model-7b", "max_model_len": 4096}]}


def chunk(content: str | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    delta = {"content": content} if content is not None else {}
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def sse(events: list[Any], *, chunked: bool = True, done: bool = True) -> bytes:
    """An HTTP response streaming ``events``; ``done`` False cuts it off after them."""
    parts = [f"data: {json.dumps(e) if not isinstance(e, str) else e}\n\n".encode() for e in events]
    if done:
        parts.append(b"data: [DONE]\n\n")
    if chunked:
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
        head = b"Transfer-Encoding: chunked\r\n"
        body += b"0\r\n\r\n" if done else b""
    else:
        body = b"".join(parts)
        head = b"Connection: close\r\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + head + b"\r\n" + body


def json_response(status: int, data: Any) -> bytes:
    body = json.dumps(data).encode()
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


class Scripted(ThreadingHTTPServer):
    """Answers /v1/models with ``MODELS`` and each chat request with the next scripted
    response (raw bytes), then closes the connection."""

    daemon_threads = False
    block_on_close = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: list[bytes] = []
        self.bodies: list[dict[str, Any]] = []
        self.seen: list[tuple[str, str]] = []  # path and Authorization header of each request

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Scripted

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers.get("Authorization", "")))
        self.wfile.write(json_response(200, MODELS))
        self.close_connection = True

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.bodies.append(json.loads(body))
        self.server.seen.append((self.path, self.headers.get("Authorization", "")))
        script = self.server.script
        self.wfile.write(script.pop(0) if len(script) > 1 else script[0])
        self.wfile.flush()
        self.close_connection = True


@contextlib.contextmanager
def scripted() -> Iterator[tuple[Scripted, OpenAIBackend]]:
    server = Scripted()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    b = OpenAIBackend(connection(server.url + "/v1"))
    try:
        b.load("", LoadConfig())
        yield server, b
    finally:
        b.unload()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


HALF = [chunk("Hello"), chunk(" wor"), chunk("ld")]


@pytest.mark.parametrize("chunked", [True, False], ids=["cut-mid-chunked", "closed-cleanly"])
def test_connection_dropped_mid_reply_keeps_the_text(chunked: bool) -> None:
    with scripted() as (server, b):
        assert b.model is not None and b.model.n_ctx == 4096  # vLLM's max_model_len
        server.script = [sse(HALF, chunked=chunked, done=False)]
        tokens, done = run(b, [ChatMessage("user", "hi")], SamplingParams(max_tokens=50))
    assert done.text == "Hello world" and len(tokens) == 3
    assert done.metrics.stop_reason == "connection_lost"
    assert done.metrics.generated_tokens == 3
    note = done.metrics.notes[-1]
    assert "incomplete; the text so far is kept" in note and "127.0.0.1" in note


def test_request_fields_and_usage() -> None:
    with scripted() as (server, b):
        final = chunk(None, "stop")
        usage = chunk(
            None,
            usage={
                "prompt_tokens": 30,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 12},
            },
        )
        usage["choices"] = []
        server.script = [sse([chunk("a"), chunk("b"), final, usage])]
        params = SamplingParams(seed=7, stop=("END",), mirostat="v2", max_tokens=9)
        chat = [ChatMessage("system", "s"), ChatMessage("user", "hi")]
        _, done = run(b, chat, params)
        body = server.bodies[-1]
        # The server's cached count is shown for this client's own follow-up only: the
        # first request's could be another conversation's (issue 40 item 11).
        follow = [*chat, ChatMessage("assistant", "ab"), ChatMessage("user", "?")]
        _, again = run(b, follow, params)
    assert body["model"] == "org/model-7b" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hi"},
    ]
    assert (body["seed"], body["stop"], body["max_tokens"]) == (7, ["END"], 9)
    assert {"top_k", "min_p", "repeat_penalty", "repetition_penalty"} <= set(body)
    assert "response_format" not in body and "grammar" not in body
    m = done.metrics
    assert (m.prompt_tokens, m.cached_tokens, m.evaluated_tokens) == (30, 0, 30)
    assert m.generated_tokens == 2 and m.stop_reason == "eos"
    m = again.metrics
    assert (m.prompt_tokens, m.cached_tokens, m.evaluated_tokens) == (30, 12, 18)
    assert any("mirostat" in n for n in m.notes)


def test_other_servers_errors() -> None:
    ok = sse([chunk("x"), chunk(None, "length")])
    with scripted() as (server, b):
        # OpenAI's own API refuses fields it does not know: sent again without them.
        refused = {"error": {"message": "Unrecognized request argument supplied: top_k"}}
        server.script = [json_response(400, refused), ok]
        _, done = run(b, [ChatMessage("user", "hi")], SamplingParams(max_tokens=1))
        assert "top_k" in server.bodies[0] and "top_k" not in server.bodies[1]
        assert any("refused the fields" in n for n in done.metrics.notes)
        assert done.metrics.stop_reason == "max_tokens"

        # vLLM: the prompt fits, but not with max_tokens: asked again with what is left.
        too_long = {
            "error": {
                "message": "'max_tokens' or 'max_completion_tokens' is too large: 1024. This "
                "model's maximum context length is 4096 tokens and your request has 3500 "
                "input tokens (1024 > 4096 - 3500).",
                "type": "BadRequestError",
                "code": 400,
            }
        }
        server.bodies.clear()
        server.script = [json_response(400, too_long), ok]
        run(b, [ChatMessage("user", "hi")], SamplingParams(max_tokens=1024, overflow="stop"))
        assert [x["max_tokens"] for x in server.bodies] == [1024, 596]

        # OpenAI: the prompt alone is too long, and nothing can be dropped.
        over = {
            "error": {
                "message": "This model's maximum context length is 4096 tokens. However, your "
                "messages resulted in 5000 tokens. Please reduce the length of the messages.",
                "code": "context_length_exceeded",
            }
        }
        server.script = [json_response(400, over)]
        with pytest.raises(ContextOverflowError) as info:
            list(b.generate([ChatMessage("user", "hi")], SamplingParams(max_tokens=8)))
        assert (info.value.prompt_tokens, info.value.n_ctx) == (5000, 4096)

        # An overflow that gives no numbers still reads as a sentence.
        server.script = [json_response(400, {"error": "context length exceeded"})]
        with pytest.raises(ContextOverflowError) as info:
            list(b.generate([ChatMessage("user", "hi")], SamplingParams(max_tokens=8)))
        assert "needs more than 4096 tokens but the context holds 4096" in str(info.value)
        assert ContextOverflowError.MARK in str(info.value)

        # An error event after some text: the reply ends there, its text kept, with the
        # server's words.
        server.script = [sse([chunk("x"), {"error": {"message": "out of memory"}}])]
        _, done = run(b, [ChatMessage("user", "hi")], SamplingParams(max_tokens=8))
        assert done.text == "x" and done.metrics.stop_reason == SERVER_ERROR
        assert any("out of memory" in n for n in done.metrics.notes)

        # Damaged JSON after some text: the same, and it is not asked for again (its
        # text would show twice).
        server.bodies.clear()
        server.script = [sse([chunk("x"), "{not json"])]
        _, done = run(b, [ChatMessage("user", "hi")], SamplingParams(max_tokens=8))
        assert done.text == "x" and done.metrics.stop_reason == SERVER_ERROR
        assert any("not valid JSON" in n for n in done.metrics.notes)
        assert len(server.bodies) == 1

        # The connection drops after the last chunk: nothing is lost.
        server.script = [sse([chunk("x"), chunk(None, "stop")], done=False)]
        _, done = run(b, [ChatMessage("user", "hi")], SamplingParams(max_tokens=8))
        assert done.metrics.stop_reason == "eos"
        assert not any("incomplete" in n for n in done.metrics.notes)

        # A server that ignores max_tokens is cut off.
        server.script = [sse([chunk("y")] * 40)]
        _, done = run(b, [ChatMessage("user", "hi")], SamplingParams(max_tokens=4))
        assert done.metrics.stop_reason == "max_tokens"
        assert len(done.text) == 4 + TOKEN_SLACK + 1


# -- damaged streams ---------------------------------------------------------------

FUZZ = settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def real_stream(llama_server: RunningServer) -> list[Any]:
    """The events of one real streamed reply from llama-server's /v1, with usage."""
    body = {
        "messages": [{"role": "user", "content": "Hello"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 6,
        "temperature": 0,
    }
    request = urllib.request.Request(
        llama_server.url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        lines = r.read().decode().splitlines()
    events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert len(events) >= 8 and "usage" in events[-1] and "timings" in events[-1]
    return events


def _mutate(value: Any, rng: random.Random, replacement: Any) -> Any:
    """``value`` with one node (a dict value or list item, at any depth) replaced."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        return {**value, key: _mutate(value[key], rng, replacement)}
    if isinstance(value, list) and value and rng.random() < 0.7:
        i = rng.randrange(len(value))
        return [*value[:i], _mutate(value[i], rng, replacement), *value[i + 1 :]]
    return replacement


@FUZZ
@given(
    seed=st.integers(0, 2**32 - 1),
    replacements=st.lists(JSON_VALUES, max_size=4),
    cut=st.integers(0, 30),
    chunked=st.booleans(),
    done=st.booleans(),
)
def test_damaged_streams_end_in_one_finished_or_a_typed_error(
    real_stream: list[Any],
    seed: int,
    replacements: list[Any],
    cut: int,
    chunked: bool,
    done: bool,
) -> None:
    rng = random.Random(seed)
    events = list(real_stream)
    for value in replacements:  # mutate, duplicate or drop real events
        i = rng.randrange(len(events))
        action = rng.random()
        if action < 0.6:
            events[i] = _mutate(events[i], rng, value)
        elif action < 0.8:
            events.insert(i, events[i])
        else:
            del events[i]
    events = events[: max(1, len(events) - cut)] if cut < 10 else events
    raw = [e if rng.random() < 0.95 else "{not json" for e in events]
    with scripted() as (server, b):
        server.script = [sse(raw, chunked=chunked, done=done)]
        with contextlib.suppress(LamplightError):
            run(b, [ChatMessage("user", "Hello")], SamplingParams(max_tokens=6))


@settings(max_examples=examples(300), deadline=None)
@given(events=st.lists(JSON_VALUES, max_size=6))
def test_reply_stream_takes_any_json(events: list[Any]) -> None:
    reply = ReplyStream()
    pieces = [reply.feed(e) for e in events]
    pieces.append("".join(t for r, t in reply.finish() if not r))  # a held-back "<think"
    assert reply.text == "".join(pieces)
    assert reply.deltas >= sum(1 for p in pieces[:-1] if p)
    assert isinstance(reply.usage, dict) and isinstance(reply.timings, dict)


def test_key_sent_only_as_a_bearer_header() -> None:
    with scripted() as (server, _):
        server.seen.clear()
        b = OpenAIBackend(connection(server.url), api_key="k-123")
        b.load("", LoadConfig())
        server.script = [sse([chunk("x"), chunk(None, "stop")])]
        run(b, [ChatMessage("user", "hi")], SamplingParams(max_tokens=3))
        b.unload()
        assert [p for p, _ in server.seen] == ["/v1/models", "/v1/chat/completions"]
        assert all(auth == "Bearer k-123" for _, auth in server.seen)
        assert "k-123" not in json.dumps(server.bodies)
