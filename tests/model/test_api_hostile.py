"""The local API server tried as a hostile web page, a heavy client and real SDK users
would (issue 26): an in-process server on 127.0.0.1 (port 0) over the scripted
``FakeGateway`` (fast), and over the real engine where what is loaded matters."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from pytestqt.qtbot import QtBot

import app.api.schema
from app.api.config import MAX_BODY_MB, ApiConfig, ApiConfigError
from app.api.host_gateway import HostGateway
from app.api.runner import PARSER_THREAD, THREAD_NAME, ApiServer
from tests.conftest import ONE_THREAD, Serve
from tests.fakes.gateway import FakeGateway
from tests.unit.api.test_api_http import MODEL, USER
from ui.engine.worker import EngineClient


def client(server: ApiServer, key: str = "none", retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=retries, timeout=30)


def root(server: ApiServer) -> str:
    return server.url.removesuffix("/v1")


def wait_for(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


# -- 1. browsers: `*` needs a key; a foreign Host is refused ------------------------------


def test_every_origin_needs_a_key(serve: Serve) -> None:
    problem = ApiConfig(cors_origins=("*",)).problem()
    assert "any web page" in problem and "API key" in problem
    assert ApiConfig(cors_origins=("*",), api_key="k").problem() == ""
    assert ApiConfig(cors_origins=("http://localhost:3000",)).problem() == ""
    gw = FakeGateway()
    try:
        with pytest.raises(ApiConfigError, match=r"\(\*\)"):
            ApiServer(gw, ApiConfig(port=0, cors_origins=("*",))).start()
    finally:
        gw.close()
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]

    server, gw = serve(cors_origins=("*",), api_key="k")
    page = {"origin": "https://any.example"}
    with httpx2.Client(timeout=5) as h:
        for path in ("/v1/models", "/lamplight/status"):
            r = h.get(root(server) + path, headers=page)
            assert r.status_code == 401, path  # a page without the key reads nothing
        r = h.get(server.url + "/models", headers={**page, "authorization": "Bearer k"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
        r = h.post(server.url + "/chat/completions", json={"messages": USER}, headers=page)
        assert r.status_code == 401
    assert gw.submitted == []


def test_a_keyless_server_answers_only_its_own_host_names(serve: Serve) -> None:
    server, gw = serve(host="localhost")
    port = server.address[1]
    with httpx2.Client(timeout=5) as h:
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io"):
            for method, path in (("GET", "/lamplight/status"), ("POST", "/v1/chat/completions")):
                r = h.request(
                    method, root(server) + path, headers={"host": host}, json={"messages": USER}
                )
                assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
                assert server.url in r.json()["error"]["message"]  # the address to use
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            assert h.get(server.url + "/models", headers={"host": host}).status_code == 200
    assert gw.submitted == []


# -- 2. a large body is parsed off the event loop, a hostile one not at all -------------


def test_a_body_being_parsed_does_not_stall_other_clients(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, gw = serve()
    parsing = threading.Event()
    real_parse = app.api.schema.parse_json

    def slow_parse(text: str | bytes, max_depth: int = 64) -> Any:
        parsing.set()
        time.sleep(1.5)  # a large body's parse, standing in for json's GIL-held work
        return real_parse(text, max_depth)

    monkeypatch.setattr(app.api.schema, "parse_json", slow_parse)
    big = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 400_000}]}
    with ThreadPoolExecutor(1) as pool:
        posted = pool.submit(httpx2.post, server.url + "/chat/completions", json=big, timeout=30)
        assert parsing.wait(10)
        t0 = time.monotonic()
        models = httpx2.get(server.url + "/models", timeout=10)
        took = time.monotonic() - t0
        assert models.status_code == 200 and not posted.done()
        assert took < 0.75, f"/v1/models waited {took:.2f} s for another client's body"
        assert posted.result().status_code == 200
    assert gw.submitted[-1].messages[0].content.startswith("word word")


def test_a_body_of_countless_tiny_values_is_refused_at_once(serve: Serve) -> None:
    """8 MB of ``[[],[],...]``: seconds of GIL-held parsing and hundreds of MB before."""
    server, gw = serve()
    junk = b"[" + b",".join([b"[]"] * (8 * 2**20 // 3 - 100)) + b"]"
    body = b'{"messages": [{"role": "user", "content": "Hi"}], "junk": ' + junk + b"}"
    assert len(body) < MAX_BODY_MB * 2**20
    latencies: list[float] = []
    polling, done = threading.Event(), threading.Event()

    def poll() -> None:
        # Polls until the post has returned, and once more after: the refusal can
        # come before this thread is first scheduled (CI saw no poll at all).
        with httpx2.Client(timeout=30) as h:
            while True:
                finished = done.is_set()
                t0 = time.monotonic()
                assert h.get(server.url + "/models").status_code == 200
                latencies.append(time.monotonic() - t0)
                polling.set()
                if finished:
                    return

    with ThreadPoolExecutor(1) as pool:
        poller = pool.submit(poll)
        assert polling.wait(10)
        t0 = time.monotonic()
        r = httpx2.post(
            server.url + "/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
            timeout=30,
        )
        took = time.monotonic() - t0
        done.set()
        poller.result()
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert "commas and brackets" in r.json()["error"]["message"]
    assert took < 2.0, took
    assert max(latencies) < 0.75, latencies
    assert gw.submitted == []


def test_the_body_limit_takes_a_large_image_and_no_more(serve: Serve) -> None:
    from app.util.images import MAX_IMAGE_BYTES

    # The largest image as base64 (4/3 of its bytes) fits; the limit stays tens of MB.
    assert MAX_IMAGE_BYTES * 4 // 3 < ApiConfig().max_body_bytes == MAX_BODY_MB * 2**20
    assert MAX_BODY_MB <= 64
    problem = ApiConfig(max_body_bytes=128 * 2**20).problem()
    assert f"at most {MAX_BODY_MB} MB" in problem and "128 MB" in problem
    server, _ = serve()
    parsers = [t for t in threading.enumerate() if t.name.startswith(PARSER_THREAD)]
    assert len(parsers) == 1  # one body parsed at a time, on a thread the server owns
    server.stop()
    assert not parsers[0].is_alive()


# -- 4. a reply cut short says so ---------------------------------------------------------


def stream_until_stopped(
    server: ApiServer, gw: FakeGateway, stop: Callable[[], object]
) -> tuple[str, openai.APIError]:
    """Stream a long reply, ``stop()`` after three tokens; the text and the SDK's error."""
    gw.tokens = [f" t{i}" for i in range(400)]
    got = ""
    with pytest.raises(openai.APIError) as caught:
        for chunk in client(server).chat.completions.create(
            model=MODEL, messages=USER, stream=True
        ):
            if chunk.choices:
                got += chunk.choices[0].delta.content or ""
            if got.count(" t") == 3:
                stop()
    return got, caught.value


def test_the_windows_stop_is_an_error_not_a_finish(serve: Serve) -> None:
    server, gw = serve(delay=0.02)
    text, error = stream_until_stopped(server, gw, server.requests.stop_running)
    assert text.startswith(" t0 t1 t2") and " t399" not in text
    assert error.code == "request_stopped" and "incomplete" in error.message
    # The raw stream: one error event, and no [DONE] to take it for a whole reply.
    with httpx2.stream(
        "POST", server.url + "/completions", json={"prompt": "x", "stream": True}, timeout=30
    ) as r:
        lines = []
        for line in r.iter_lines():
            lines.append(line)
            if line.startswith("data: {") and ' t2"' in line:
                server.requests.stop_running()
    events = [ln.removeprefix("data: ") for ln in lines if ln.startswith("data: ")]
    assert r.status_code == 200 and "[DONE]" not in events
    assert json.loads(events[-1])["error"]["code"] == "request_stopped"
    assert all('"finish_reason":"stop"' not in e for e in events)
    # Not streamed: a 503 the SDK does not send again (the person at the server said stop).
    gw.release.clear()
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(
            lambda: client(server, retries=2).chat.completions.create(model=MODEL, messages=USER)
        )
        wait_for(lambda: server.requests.running() is not None and len(gw.started) == 3)
        server.requests.stop_running()
        gw.release.set()
        with pytest.raises(openai.InternalServerError) as whole:
            asked.result(10)
    assert whole.value.status_code == 503 and whole.value.code == "request_stopped"
    assert whole.value.response.headers["x-should-retry"] == "false"
    assert len(gw.submitted) == 3  # not retried
    assert [o.finish for o in server.requests.recent()] == ["cancelled"] * 3


def test_a_server_stopping_mid_reply_says_so(serve: Serve) -> None:
    server, gw = serve(delay=0.02)
    stopper = threading.Thread(target=server.stop, name="stopper")
    text, error = stream_until_stopped(server, gw, stopper.start)
    stopper.join(10)
    assert error.code == "server_shutting_down" and " t399" not in text
    assert not server.running


def test_a_waiting_request_at_shutdown_gets_503_with_retry_after(serve: Serve) -> None:
    server, gw = serve()
    gw.release.clear()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx2.post, server.url + "/chat/completions", json={"messages": USER})
        wait_for(lambda: len(gw.started) == 1)
        second = pool.submit(httpx2.post, server.url + "/chat/completions", json={"messages": USER})
        wait_for(lambda: len(server.requests.queued()) == 1)
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        wait_for(gw.started[0].stop.is_set)
        gw.release.set()
        answers = [first.result(10), second.result(10)]
        stopper.join(10)
    for r in answers:
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "server_shutting_down"


# -- 5. a burst of clients waits its turn -------------------------------------------------


def test_sixteen_clients_at_once_all_get_their_reply(serve: Serve) -> None:
    server, _ = serve(delay=0.01)
    assert server.requests.max_queue >= 16
    start = threading.Barrier(16)

    def ask(i: int) -> str:
        with client(server) as c:
            start.wait()
            reply = c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Question {i}"}]
            )
            return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(ask, range(16)))
    assert replies == ["Hello there, friend."] * 16
    assert [o.finish for o in server.requests.recent()] == ["stop"] * 16


def test_the_queue_is_bounded_in_length_and_time(serve: Serve) -> None:
    server, gw = serve(max_queue=2, max_wait_s=0.5)
    gw.release.clear()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx2.post, server.url + "/chat/completions", json={"messages": USER})
        wait_for(lambda: len(gw.started) == 1)
        t0 = time.monotonic()
        waited = pool.submit(httpx2.post, server.url + "/chat/completions", json={"messages": USER})
        wait_for(lambda: len(server.requests.queued()) == 1)
        full = httpx2.post(server.url + "/chat/completions", json={"messages": USER})
        assert full.status_code == 429 and int(full.headers["retry-after"]) >= 1
        late = waited.result(10)
        assert 0.4 < time.monotonic() - t0 < 5
        assert late.status_code == 503 and late.json()["error"]["code"] == "queue_timeout"
        assert int(late.headers["retry-after"]) >= 1
        gw.release.set()
        assert first.result(10).status_code == 200
    assert len(gw.submitted) == 1  # the one that timed out never reached the engine


# -- 6. any model name: the loaded model answers ------------------------------------------


def test_any_model_name_gets_the_loaded_model(serve: Serve) -> None:
    server, gw = serve()
    c = client(server)
    for name in ("gpt-3.5-turbo", "gpt-4o", "local-model", MODEL):
        reply = c.chat.completions.create(model=name, messages=USER, max_tokens=2)
        assert reply.model == MODEL and reply.choices[0].message.content == "Hello there"
    text = c.completions.create(model="text-davinci-003", prompt="Once", max_tokens=1)
    assert text.model == MODEL
    with pytest.raises(openai.NotFoundError):  # a lookup by name stays a lookup
        c.models.retrieve("gpt-4o")
    gw.info = None
    with pytest.raises(openai.InternalServerError) as none:
        c.chat.completions.create(model="gpt-4o", messages=USER)
    assert none.value.status_code == 503 and none.value.code == "model_not_loaded"


# -- 7. the address advertised is the address bound ---------------------------------------


def test_the_url_names_the_address_bound(serve: Serve) -> None:
    server, _ = serve(host="localhost")
    host, port = server.address
    assert host == "127.0.0.1" and server.url == f"http://127.0.0.1:{port}/v1"
    assert httpx2.get(server.url + "/models", timeout=5).status_code == 200
    v6, _ = serve(host="::1")
    assert v6.url == f"http://[::1]:{v6.address[1]}/v1"


# -- on the real engine: what is loaded, and a real stop ----------------------------------


@pytest.fixture()
def real(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> Iterator[tuple[ApiServer, EngineClient]]:
    """The default model on the engine worker, served on 127.0.0.1; all stopped after."""
    engine = EngineClient(tmp_path / "models")
    gateway = HostGateway(engine.host)
    server = ApiServer(gateway, ApiConfig(port=0))
    try:
        engine.load(model_path, ONE_THREAD)
        qtbot.waitUntil(
            lambda: gateway.model() is not None and not gateway.loading(), timeout=60_000
        )
        server.start()
        yield server, engine
    finally:
        server.stop()
        assert engine.shutdown()


def test_real_engine_unload_stop_and_burst(
    qtbot: QtBot, real: tuple[ApiServer, EngineClient]
) -> None:
    server, engine = real
    c = client(server)
    [listed] = c.models.list().data
    # Any name, the real model's id in the reply.
    reply = c.chat.completions.create(
        model="gpt-3.5-turbo", messages=USER, max_tokens=2, temperature=0
    )
    assert reply.model == listed.id and reply.choices[0].finish_reason in ("stop", "length")

    # The window's Stop, mid-stream: an error the SDK raises, not a short "stop".
    got: list[str] = []
    with pytest.raises(openai.APIError) as stopped:
        for chunk in c.chat.completions.create(
            model=listed.id, messages=USER, max_tokens=400, temperature=0, stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                got.append(chunk.choices[0].delta.content)
                if len(got) == 3:
                    server.requests.stop_running()
    assert stopped.value.code == "request_stopped" and 3 <= len(got) < 400

    # Twelve clients at once, tiny replies: none refused.
    def ask(i: int) -> str | None:
        with client(server) as mine:
            r = mine.chat.completions.create(
                model=listed.id,
                messages=[{"role": "user", "content": f"Say {i}."}],
                max_tokens=2,
                extra_body={"cache_prompt": False},
            )
            return r.choices[0].finish_reason

    with ThreadPoolExecutor(12) as pool:
        assert set(pool.map(ask, range(12))) <= {"stop", "length"}

    # Model -> Unload: the list follows the engine, and a request says why it fails.
    engine.unload()
    engine.drain()
    assert c.models.list().data == []
    with pytest.raises(openai.InternalServerError) as gone:
        c.chat.completions.create(model=listed.id, messages=USER, max_tokens=2)
    assert gone.value.status_code == 503 and gone.value.code == "model_not_loaded"
