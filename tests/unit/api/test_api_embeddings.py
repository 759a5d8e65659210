"""``POST /v1/embeddings`` in-process on 127.0.0.1 over a fake embed worker (fast): the
official ``openai`` client, httpx2 and raw sockets; hostile bodies fuzzed."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import httpx2
import numpy as np
import numpy.typing as npt
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.config import ApiConfig
from app.api.embeddings import (
    MAX_INPUT_CHARS,
    MAX_INPUTS,
    NO_EMBEDDER,
    EmbedRequest,
    EmbedService,
    TextEmbedder,
    parse_embeddings,
)
from app.api.errors import ApiError
from app.api.runner import ApiServer
from app.util.errors import DocumentCancelled, EmbedderError
from tests.fakes.gateway import FakeGateway
from tests.hypothesis_budget import examples

T = TypeVar("T")
NAME = "all-MiniLM-L6-v2-F16"
DIM = 8


class FakeEmbedder:
    """Bag-of-words vectors (texts sharing words are close), L2-normalised."""

    name = NAME
    dim = DIM

    def __init__(self) -> None:
        self.hold = False  # True: embed() waits (5 s at most) for its stop event
        self.holding = threading.Event()
        self.stopped = threading.Event()  # set when a job saw its stop event

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2

    def embed(
        self, texts: Sequence[str], stop: threading.Event | None = None
    ) -> npt.NDArray[np.float32]:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        if self.hold and stop is not None:
            self.holding.set()
            stop.wait(5)
        for i, text in enumerate(texts):
            if stop is not None and stop.is_set():
                self.stopped.set()
                raise DocumentCancelled("Stopped.")
            for word in text.lower().split():
                out[i, hashlib.sha256(word.encode()).digest()[0] % DIM] += 1.0
            out[i] /= max(float(np.linalg.norm(out[i])), 1e-9)
        return out


class FakeWorker:
    """``EmbedWorker``'s ``submit`` on one thread; ``gate`` cleared holds each job;
    ``fail`` makes the next jobs fail as a load would."""

    def __init__(self) -> None:
        self.embedder = FakeEmbedder()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="fake-embed")
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.fail: Exception | None = None
        self.urgent: list[bool] = []

    def submit(self, fn: Callable[[TextEmbedder], T], urgent: bool = False) -> Future[T]:
        self.urgent.append(urgent)

        def run() -> T:
            self.started.set()
            self.gate.wait(10)
            if self.fail is not None:
                raise self.fail
            return fn(self.embedder)

        return self.pool.submit(run)

    def close(self) -> None:
        self.gate.set()
        self.pool.shutdown(wait=True, cancel_futures=True)


Start = Callable[..., tuple[ApiServer, FakeWorker]]


@pytest.fixture()
def start() -> Iterator[Start]:
    """``start(embedder=True, **ApiConfig fields)``; every server, gateway and worker is
    stopped at the end."""
    made: list[tuple[ApiServer, FakeGateway, FakeWorker]] = []

    def go(embedder: bool = True, **fields: Any) -> tuple[ApiServer, FakeWorker]:
        gateway, worker = FakeGateway(), FakeWorker()
        service: EmbedService | None = worker if embedder else None
        server = ApiServer(gateway, ApiConfig(**{"port": 0, **fields}), service)
        made.append((server, gateway, worker))
        server.start()
        return server, worker

    yield go
    for server, gateway, worker in made:
        worker.gate.set()
        server.stop()
        worker.close()
        gateway.close()


def client(server: ApiServer, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=10)


def post(server: ApiServer, body: Any, **kw: Any) -> httpx2.Response:
    data = json.dumps(body).encode()  # NaN and Infinity too: not JSON, to be refused
    headers = {"content-type": "application/json"}
    return httpx2.post(server.url + "/embeddings", content=data, headers=headers, timeout=10, **kw)


def error_of(response: httpx2.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


# -- answers -------------------------------------------------------------------------------


def test_the_openai_client_gets_vectors(start: Start) -> None:
    server, worker = start()
    with client(server) as c:
        one = c.embeddings.create(model="text-embedding-3-small", input="a red apple")
        many = c.embeddings.create(model=NAME, input=["a red apple", "the cold sea", "x"])
    assert one.object == "list" and one.model == NAME and len(one.data) == 1
    assert one.data[0].object == "embedding" and one.data[0].index == 0
    assert len(one.data[0].embedding) == DIM
    assert one.usage.prompt_tokens == one.usage.total_tokens == 5
    assert [d.index for d in many.data] == [0, 1, 2]
    assert many.usage.prompt_tokens == 5 + 5 + 3
    assert worker.urgent and all(worker.urgent)  # API jobs go before indexing batches
    for d in many.data:
        assert abs(float(np.linalg.norm(d.embedding)) - 1.0) < 1e-5


def test_base64_equals_float(start: Start) -> None:
    server, _ = start()
    texts = ["alpha beta", "gamma delta epsilon", "beta"]
    floats = post(server, {"input": texts, "encoding_format": "float"}).json()
    packed = post(server, {"input": texts, "encoding_format": "base64"}).json()
    assert floats["usage"] == packed["usage"] and floats["model"] == packed["model"]
    for f, b in zip(floats["data"], packed["data"], strict=True):
        assert isinstance(b["embedding"], str)
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == f["embedding"]


def test_similar_texts_are_closer(start: Start) -> None:
    server, _ = start()
    with client(server) as c:
        r = c.embeddings.create(model="any", input=["red apple pie", "apple pie red", "zz qq"])
    v = np.array([d.embedding for d in r.data])
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])


def test_dimensions_must_be_the_models(start: Start) -> None:
    server, _ = start()
    with client(server) as c:
        assert (
            len(c.embeddings.create(model="m", input="hi", dimensions=DIM).data[0].embedding) == DIM
        )
        with pytest.raises(openai.BadRequestError) as refused:
            c.embeddings.create(model="m", input="hi", dimensions=3)
    assert refused.value.code == "invalid_value"
    assert f"{DIM} dimensions" in str(refused.value)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"input": [1, 2, 3]}, "takes text input for embeddings"),
        ({"input": [[1, 2], [3]]}, "check_embedding_ctx_length=False"),  # LangChain's default
        ({}, "`input` is required"),
        ({"input": []}, "empty list"),
        ({"input": ""}, "empty string"),
        ({"input": ["a", ""]}, "`input[1]` is an empty string"),
        ({"input": ["a", 3]}, "a string or a list of strings"),
        ({"input": {"a": 1}}, "a string or a list of strings"),
        ({"input": ["a"] * (MAX_INPUTS + 1)}, "smaller batches"),
        ({"input": "a" * (MAX_INPUT_CHARS + 1)}, "smaller pieces"),
        ({"input": ["a" * MAX_INPUT_CHARS] * 63}, "characters in all"),
        ({"input": "a", "encoding_format": "int8"}, '"float" or "base64"'),
        ({"input": "a", "dimensions": True}, "positive whole number"),
        ({"input": "a", "dimensions": 0}, "positive whole number"),
        ({"input": "a", "model": 7}, "`model` must be a string"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_bodies_are_400(start: Start, body: Any, said: str) -> None:
    server, worker = start()
    r = post(server, body)
    assert r.status_code == 400, r.text
    assert said in error_of(r)["message"]
    assert r.headers["x-should-retry"] == "false"
    assert worker.urgent == []  # nothing reached the worker


def test_no_embedder_is_503(start: Start) -> None:
    server, _ = start(embedder=False)
    with client(server) as c, pytest.raises(openai.InternalServerError) as refused:
        c.embeddings.create(model="m", input="hi")
    assert refused.value.status_code == 503
    assert NO_EMBEDDER in str(refused.value)
    assert refused.value.response.headers["x-should-retry"] == "false"


def test_a_model_that_cannot_load_is_503_with_its_reason(start: Start) -> None:
    server, worker = start()
    worker.fail = EmbedderError("the file is damaged.")
    r = post(server, {"input": "hi"})
    assert r.status_code == 503
    assert error_of(r)["message"] == "The embedding model cannot be used: the file is damaged."
    worker.fail = EmbedderError("The embedding model package is not installed; install it.")
    r = post(server, {"input": "hi"})
    assert error_of(r)["message"] == "The embedding model package is not installed; install it."
    worker.fail = None
    assert post(server, {"input": "hi"}).status_code == 200  # the next job tries again


def test_auth_is_required_when_the_server_has_a_key(start: Start) -> None:
    server, worker = start(api_key="s3cret-key")
    r = post(server, {"input": "hi"})
    assert r.status_code == 401 and worker.urgent == []
    with client(server, "wrong") as c, pytest.raises(openai.AuthenticationError):
        c.embeddings.create(model="m", input="hi")
    with client(server, "s3cret-key") as c:
        assert c.embeddings.create(model="m", input="hi").data


def test_body_rules_are_the_other_routes(start: Start) -> None:
    server, _ = start(max_body_bytes=2**20)
    r = httpx2.post(server.url + "/embeddings", content=b'{"input": "a"}', timeout=10)
    assert r.status_code == 415  # not application/json
    big = json.dumps({"input": ["b" * 30_000] * 40})
    assert post(server, json.loads(big)).status_code == 413
    r = httpx2.get(server.url + "/embeddings", timeout=10)
    assert r.status_code == 405


def test_the_loop_stays_free_and_a_leaving_client_stops_the_job(start: Start) -> None:
    server, worker = start()
    worker.embedder.hold = True
    body = json.dumps({"input": ["one two", "three"]}).encode()
    host, port = server.address
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(head + body)
        assert worker.embedder.holding.wait(5)
        t0 = time.monotonic()
        models = httpx2.get(server.url + "/models", timeout=5)  # not blocked by the job
        assert models.status_code == 200 and time.monotonic() - t0 < 2
    assert worker.embedder.stopped.wait(4)  # the server saw the disconnect: stop was set


# -- hostile bodies: never a 500 ---------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "input": JSON | st.text(max_size=50) | st.lists(st.text(max_size=30), max_size=5),
        "model": JSON,
        "encoding_format": st.sampled_from(["float", "base64", "", None, 1]),
        "dimensions": st.sampled_from([None, DIM, 0, -1, 3, True, 8.0, "8"]),
        "user": JSON,
    },
)


@settings(max_examples=examples(300), deadline=None)
@given(body=FIELDS | JSON)
def test_parse_refuses_with_400_only(body: Any) -> None:
    try:
        req = parse_embeddings(json.dumps(body).encode())
    except ApiError as exc:
        assert exc.status in (400, 413)
        return
    assert isinstance(req, EmbedRequest) and req.texts and all(req.texts)


@settings(max_examples=examples(300), deadline=None)
@given(raw=st.binary(max_size=200))
def test_parse_refuses_raw_bytes_with_400_only(raw: bytes) -> None:
    try:
        parse_embeddings(raw)
    except ApiError as exc:
        assert exc.status in (400, 413)


def test_hostile_bodies_over_http_are_never_500(start: Start) -> None:
    server, _ = start()

    @settings(max_examples=examples(40), deadline=None)
    @given(body=FIELDS)
    def check(body: dict[str, Any]) -> None:
        r = post(server, body)
        assert r.status_code in (200, 400), r.text
        if r.status_code == 200:
            texts = parse_embeddings(json.dumps(body).encode()).texts
            assert len(r.json()["data"]) == len(texts)

    check()
