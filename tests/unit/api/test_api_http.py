"""The HTTP server in-process on 127.0.0.1 (port 0) over a scripted FakeGateway (fast):
the official ``openai`` client where it fits, httpx2 and raw sockets where it cannot."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import openai
import pytest

from app.api.config import ApiConfig, ApiConfigError
from app.api.gateway import ApiFailure
from app.api.runner import THREAD_NAME, ApiServer
from app.host.kv_pool import GUI, LOCAL_API
from tests.conftest import Serve
from tests.fakes.gateway import FakeGateway

MODEL = "gemma-3-270m-it-Q4_K_M"
USER: Any = [{"role": "user", "content": "Hi"}]


def client(server: ApiServer, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=10)


def raw(server: ApiServer, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; everything the server answers."""
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def error_of(response: httpx2.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert response.headers["content-type"] == "application/json"
    return dict(body["error"])


def wait_for(check: Callable[[], bool], seconds: float = 2.0) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < seconds, "timed out"
        time.sleep(0.005)
    return time.monotonic() - start


def test_models_chat_and_completion(serve: Serve) -> None:
    server, gw = serve()
    c = client(server)
    assert [m.id for m in c.models.list().data] == [MODEL]
    assert c.models.retrieve(MODEL).owned_by == "lamplight"
    with pytest.raises(openai.NotFoundError) as err:
        c.models.retrieve("gpt-4")
    assert err.value.code == "model_not_found"

    raw_reply = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=USER, max_tokens=3
    )
    assert raw_reply.headers["x-lamplight-cached-tokens"] == "3"
    reply = raw_reply.parse()
    assert reply.choices[0].message.content == "Hello there,"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage and reply.usage.completion_tokens == 3
    assert (
        reply.usage.prompt_tokens_details and reply.usage.prompt_tokens_details.cached_tokens == 3
    )
    assert reply.model_extra and reply.model_extra["timings"]["cache_n"] == 3
    job = gw.submitted[-1]
    assert (job.kind, job.model_id, job.params.max_tokens, job.params.overflow) == (
        "chat",
        MODEL,
        3,
        "stop",
    )
    assert job.client.startswith("127.0.0.1:") and job.id.startswith("chatcmpl-")

    c.chat.completions.create(model="Gemma 3 270M", messages=USER, user="my-editor")
    assert gw.submitted[-1].client == "my-editor"
    assert gw.submitted[-1].params.max_tokens == 2048  # omitted: to the end of the context

    text = c.completions.create(model=MODEL, prompt="Once", max_tokens=2)
    assert text.choices[0].text == "Hello there" and text.object == "text_completion"
    pieces = [
        ch.choices[0].text
        for ch in c.completions.create(model=MODEL, prompt="Once", stream=True)
        if ch.choices
    ]
    assert "".join(pieces) == "Hello there, friend."
    assert gw.submitted[-1].kind == "completion" and gw.submitted[-1].id.startswith("cmpl-")

    status = httpx2.get(server.url[: -len("/v1")] + "/lamplight/status").json()
    assert status["model"] == MODEL and status["running"] is None and status["queued"] == []
    assert [o["finish"] for o in status["recent"]] == ["length", "stop", "length", "stop"]


def test_stream_with_usage(serve: Serve) -> None:
    server, _ = serve(delay=0.002)
    stream = client(server).chat.completions.create(
        model=MODEL, messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == "Hello there, friend."
    )
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage and last.usage.completion_tokens == 5
    assert last.usage.prompt_tokens_details and last.usage.prompt_tokens_details.cached_tokens == 3
    assert last.model_extra and last.model_extra["timings"]["predicted_n"] == 5


def test_error_statuses_and_shapes(serve: Serve) -> None:
    server, gw = serve(max_body_bytes=4096)
    c = client(server)
    url = server.url
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model=MODEL, messages=USER, n=2)
    assert (bad.value.code, bad.value.param) == ("unsupported_parameter", "n")
    assert bad.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model=MODEL, messages=USER, temperature=9)
    assert bad.value.param == "temperature" and "between 0.0 and 5.0" in bad.value.message
    # Any model name gets the loaded model (clients default to "gpt-4o" and the like).
    assert c.chat.completions.create(model="gpt-4o", messages=USER).model == MODEL
    with pytest.raises(openai.APIStatusError) as big:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 5000}])
    assert big.value.status_code == 413 and big.value.code == "request_too_large"

    with httpx2.Client(timeout=5) as h:
        r = h.get(url + "/chat/completions")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert error_of(r)["code"] == "method_not_allowed"
        r = h.get(url + "/audio/speech")
        assert (
            r.status_code == 404 and "Unknown URL: GET /v1/audio/speech" in error_of(r)["message"]
        )
        r = h.post(url + "/chat/completions", content=b"{}", headers={"content-type": "text/plain"})
        assert r.status_code == 415 and error_of(r)["code"] == "unsupported_media_type"
        r = h.post(
            url + "/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"

        def chunks() -> Iterator[bytes]:  # a chunked body: no Content-Length to refuse early
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"x" * 1000
            yield b'"}]}'

        r = h.post(
            url + "/chat/completions",
            content=chunks(),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"

        gw.is_loading = True
        r = h.post(url + "/chat/completions", json={"model": MODEL, "messages": USER})
        assert (r.status_code, r.headers["retry-after"]) == (503, "2")
        assert error_of(r) == {**error_of(r), "type": "server_error", "code": "model_loading"}
        gw.is_loading, info, gw.info = False, gw.info, None
        r = h.post(url + "/completions", json={"model": MODEL, "prompt": "x"})
        assert (
            r.status_code == 503
            and error_of(r)["code"] == "model_not_loaded"
            and r.headers["retry-after"]
        )
        assert h.get(url + "/models").json() == {"object": "list", "data": []}
        gw.info = info

        # A failure before the first token keeps its status, streaming or not.
        gw.fail = ApiFailure(
            400, "invalid_request_error", "context_length_exceeded", "Too long.", "messages"
        )
        for stream in (False, True):
            r = h.post(url + "/chat/completions", json={"messages": USER, "stream": stream})
            assert r.status_code == 400 and error_of(r)["code"] == "context_length_exceeded"
    # A malformed request, refused by the HTTP layer itself, in the same shape.
    answer = raw(server, b"NOT HTTP AT ALL\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert (
        head.startswith(b"HTTP/1.1 400")
        and json.loads(body)["error"]["type"] == "invalid_request_error"
    )


def test_queue_full_is_429_with_retry_after(serve: Serve) -> None:
    server, gw = serve(max_queue=1)
    gw.release.clear()  # the first job waits before its first token
    results: list[str] = []

    def first() -> None:
        results.append(
            client(server)
            .chat.completions.create(model=MODEL, messages=USER)
            .choices[0]
            .message.content
            or ""
        )

    thread = threading.Thread(target=first)
    thread.start()
    try:
        wait_for(lambda: len(gw.started) == 1)
        with pytest.raises(openai.RateLimitError) as busy:
            client(server).chat.completions.create(model=MODEL, messages=USER)
        assert busy.value.response.headers["retry-after"] == "2"
        assert busy.value.type == "requests" and busy.value.code == "rate_limit_exceeded"
        status = httpx2.get(server.url[:-3] + "/lamplight/status").json()
        assert status["running"]["client"].startswith("127.0.0.1:")
    finally:
        gw.release.set()
        thread.join(5)
    assert results == ["Hello there, friend."]


def test_mid_stream_failure_raises_api_error(serve: Serve) -> None:
    server, gw = serve()
    gw.fail = ApiFailure(500, "server_error", "engine_error", "llama_decode failed.")
    gw.fail_after = 2
    got: list[str] = []
    with pytest.raises(openai.APIError, match="llama_decode failed"):
        for chunk in client(server).chat.completions.create(
            model=MODEL, messages=USER, stream=True
        ):
            got.append(chunk.choices[0].delta.content or "")
    assert "".join(got) == "Hello there"
    with httpx2.stream(
        "POST", server.url + "/completions", json={"prompt": "x", "stream": True}
    ) as r:
        text = r.read().decode()
    assert r.status_code == 200 and '"code": "engine_error"' in text and "[DONE]" not in text


def test_auth(serve: Serve) -> None:
    server, gw = serve(api_key="s3cret-key")
    with pytest.raises(openai.AuthenticationError) as denied:
        client(server, "wrong").models.list()
    assert denied.value.code == "invalid_api_key"
    assert denied.value.response.headers["www-authenticate"].startswith("Bearer")
    r = httpx2.post(server.url + "/chat/completions", json={"messages": USER})
    assert r.status_code == 401 and "needs an API key" in error_of(r)["message"]
    assert gw.submitted == []
    good = client(server, "s3cret-key")
    assert good.chat.completions.create(model=MODEL, messages=USER).choices[0].message.content


def test_each_key_is_its_own_cache_party(serve: Serve) -> None:
    """A request reuses only caches made with its server's key (``KvPool``): the party
    is a digest of the key (never the key itself), another key's differs, and no key
    is the one local party; none is the window's."""
    parties = []
    for key in ("", "key-a", "key-b", "key-a"):
        server, gw = serve(api_key=key) if key else serve()
        client(server, key or "none").chat.completions.create(model=MODEL, messages=USER)
        (job,) = gw.submitted
        parties.append(job.party)
        server.stop()
    assert parties[0] == LOCAL_API and parties[1] == parties[3]
    assert len({*parties, GUI}) == 4
    assert not any("key-" in p for p in parties)


def test_host_check_and_cors(serve: Serve) -> None:
    server, _ = serve()
    port = server.address[1]
    models = server.url + "/models"
    with httpx2.Client() as h:
        for host in (f"evil.example:{port}", "rebind.attacker.test", f"192.168.1.9:{port}"):
            r = h.get(models, headers={"host": host})
            assert r.status_code == 400 and error_of(r)["code"] == "invalid_host"
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]"):
            assert h.get(models, headers={"host": host}).status_code == 200
        # CORS off: no Access-Control headers, a preflight is refused.
        r = h.get(models, headers={"origin": "https://app.example"})
        assert r.status_code == 200 and not [k for k in r.headers if k.startswith("access-control")]
        pre = {"origin": "https://app.example", "access-control-request-method": "POST"}
        assert h.options(server.url + "/chat/completions", headers=pre).status_code == 405

    on, _ = serve(cors_origins=("https://app.example",), api_key="k")
    with httpx2.Client() as h:
        pre_headers = {**pre, "access-control-request-headers": "authorization,content-type"}
        r = h.options(on.url + "/chat/completions", headers=pre_headers)
        assert (
            r.status_code == 200
            and r.headers["access-control-allow-origin"] == "https://app.example"
        )
        r = h.get(
            on.url + "/models",
            headers={"origin": "https://app.example", "authorization": "Bearer k"},
        )
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        r = h.options(
            on.url + "/chat/completions", headers={**pre_headers, "origin": "https://evil.example"}
        )
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers


def test_stream_disconnect_stops_the_job(serve: Serve) -> None:
    server, gw = serve(delay=0.05)
    gw.tokens = [f" t{i}" for i in range(400)]
    with httpx2.stream(
        "POST", server.url + "/chat/completions", json={"messages": USER, "stream": True}
    ) as r:
        # Held: a line iterator dropped after `break` is closed at once, and with it the
        # connection (httpcore closes a stream whose iterator ends early).
        lines = r.iter_lines()
        for line in lines:
            if "t2" in line:  # three tokens in
                break
        job = gw.submitted[-1]
        assert not job.stop.is_set()
        closed = time.monotonic()
    took = wait_for(job.stop.is_set)
    assert time.monotonic() - closed < 1.0, took
    wait_for(lambda: bool(server.requests.recent()))
    outcome = server.requests.recent()[-1]
    assert outcome.finish == "cancelled" and outcome.tokens < 50


def test_non_stream_and_queued_disconnects_stop_the_job(serve: Serve) -> None:
    server, gw = serve(delay=0.05)
    gw.tokens = [f" t{i}" for i in range(400)]
    body = json.dumps({"messages": USER}).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    first = socket.create_connection(server.address)
    second = socket.create_connection(server.address)
    try:
        first.sendall(request)
        wait_for(lambda: len(gw.started) == 1)
        second.sendall(request)
        wait_for(lambda: len(server.requests.queued()) == 1)
        second.close()  # gone while waiting in the queue: dropped, never run
        wait_for(lambda: server.requests.queued() == [], 1.0)
        first.close()
        job = gw.started[0]
        wait_for(job.stop.is_set, 1.0)
    finally:
        first.close()
        second.close()
    wait_for(lambda: len(server.requests.recent()) == 2)
    assert [o.finish for o in server.requests.recent()] == ["cancelled", "cancelled"]
    assert len(gw.submitted) == 1


def test_config_problems_and_stop(serve: Serve) -> None:
    assert ApiConfig().problem() == ""
    assert "API key" in ApiConfig(host="0.0.0.0").problem()
    assert ApiConfig(host="0.0.0.0", api_key="k").problem() == ""
    assert ApiConfig(host="localhost").problem() == "" and ApiConfig(host="::1").problem() == ""
    assert "port" in ApiConfig(port=70000).problem()
    assert "origin" in ApiConfig(cors_origins=("ftp://x/y",)).problem()
    assert "visible" in ApiConfig(api_key="a b").problem()
    gw = FakeGateway()
    try:
        with pytest.raises(ApiConfigError, match="API key"):
            ApiServer(gw, ApiConfig(host="0.0.0.0", port=0)).start()
    finally:
        gw.close()

    server, gw = serve(delay=0.05)
    assert server.running and server.url == f"http://127.0.0.1:{server.address[1]}/v1"
    busy = ApiServer(gw, ApiConfig(port=server.address[1]))
    with pytest.raises(OSError):
        busy.start()
    busy.stop()
    # stop() with a stream open: prompt, the stream ends, the thread is joined.
    gw.tokens = [f" t{i}" for i in range(400)]
    with httpx2.stream(
        "POST", server.url + "/completions", json={"prompt": "x", "stream": True}
    ) as r:
        next(r.iter_lines())
        start = time.monotonic()
        server.stop()
        assert time.monotonic() - start < 5
    assert not server.running and not [t for t in threading.enumerate() if t.name == THREAD_NAME]
    server.stop()  # idempotent
