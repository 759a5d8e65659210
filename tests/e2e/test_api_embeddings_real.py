"""``POST /v1/embeddings`` with the real built-in embedder (all-MiniLM-L6-v2, F16): the
in-process server over a real ``EmbedWorker``, and ``lamplight serve --embedder``."""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import numpy as np
import openai
import pytest

from app.api.config import ApiConfig
from app.api.runner import ApiServer
from app.engine.local.embed_worker import EmbedWorker
from tests.embed_model import embedder_path
from tests.fakes.gateway import FakeGateway
from tests.serve_fixture import ROOT, running, serve_command

DIM = 384


@pytest.fixture(scope="module")
def embedder() -> Path:
    return embedder_path()


@pytest.fixture()
def server(embedder: Path) -> Iterator[ApiServer]:
    gateway, worker = FakeGateway(), EmbedWorker(lambda: embedder, n_threads=1)
    api = ApiServer(gateway, ApiConfig(port=0), worker)
    try:
        api.start()
        yield api
    finally:
        api.stop()
        worker.close()
        gateway.close()


def vectors(client: openai.OpenAI, texts: list[str]) -> np.ndarray:
    r = client.embeddings.create(model="text-embedding-3-small", input=texts)
    return np.array([d.embedding for d in r.data], dtype=np.float32)


def test_the_openai_client_gets_real_vectors(server: ApiServer) -> None:
    texts = [
        "How do I bake sourdough bread at home?",
        "A simple recipe for baking bread with a sourdough starter.",
        "The stock market fell sharply on Tuesday.",
    ]
    with openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60) as c:
        r = c.embeddings.create(model="anything", input=texts)
        v = vectors(c, texts)
    assert r.model.startswith("all-MiniLM-L6-v2") or "minilm" in r.model.lower()
    assert [d.index for d in r.data] == [0, 1, 2] and v.shape == (3, DIM)
    assert r.usage.prompt_tokens == r.usage.total_tokens > 3 * 5
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-3)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.2  # similar texts are closer


def test_base64_equals_float_and_dimensions(server: ApiServer) -> None:
    body = {"input": ["one lamp", "two lamps"], "model": "m"}
    url = server.url + "/embeddings"
    floats = httpx2.post(url, json={**body, "encoding_format": "float"}, timeout=60).json()
    packed = httpx2.post(url, json={**body, "encoding_format": "base64"}, timeout=60).json()
    for f, b in zip(floats["data"], packed["data"], strict=True):
        assert np.frombuffer(base64.b64decode(b["embedding"]), "<f4").tolist() == f["embedding"]
    ok = httpx2.post(url, json={**body, "dimensions": DIM}, timeout=60)
    assert ok.status_code == 200
    refused = httpx2.post(url, json={**body, "dimensions": 256}, timeout=60)
    assert refused.status_code == 400 and "384 dimensions" in refused.text


def test_a_text_longer_than_the_context_is_truncated_not_refused(server: ApiServer) -> None:
    long = "lamp " * 3000  # far past 512 tokens
    r = httpx2.post(server.url + "/embeddings", json={"input": [long, "lamp"]}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 3000


def test_serve_answers_embeddings(model_path: Path, embedder: Path, tmp_path: Path) -> None:
    args = ["--port", "0", "--threads", "1", "--n-ctx", "512", "--model", str(model_path)]
    with (
        running(tmp_path / "data", [*args, "--embedder", str(embedder)]) as served,
        openai.OpenAI(base_url=served.url, api_key="x", max_retries=0, timeout=60) as c,
    ):
        r = c.embeddings.create(model="text-embedding-ada-002", input="hello there")
    assert len(r.data[0].embedding) == DIM


def test_serve_makes_the_built_in_embedder_on_the_first_request(
    model_path: Path, embedder: Path, tmp_path: Path
) -> None:
    args = ["--port", "0", "--threads", "1", "--n-ctx", "512", "--model", str(model_path)]
    with (
        running(tmp_path / "data", args) as served,
        openai.OpenAI(base_url=served.url, api_key="x", max_retries=0, timeout=120) as c,
    ):
        r = c.embeddings.create(model="text-embedding-ada-002", input="hello there")
    assert len(r.data[0].embedding) == DIM
    assert (tmp_path / "data" / "embedders" / embedder.name).is_file()


def test_serve_refuses_a_chat_model_as_embedder(model_path: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        serve_command(tmp_path / "data", ["--port", "0", "--embedder", str(model_path)]),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "--embedder:" in done.stderr, done.stderr
