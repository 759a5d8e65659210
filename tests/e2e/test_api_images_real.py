"""Images through the local API with the real engine: ``lamplight serve --mmproj`` with
the default model and the tiny random test projector (``tests/vision_model.py``), driven
over HTTP by the ``openai`` client. The projector's weights are random: these check the
path (what is counted, cached, refused), never the answers."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from app.api.image_parts import NOT_DATA
from tests.serve_fixture import Served, running, serve_command
from tests.vision_model import IMAGE_TOKENS, image_bytes, projector_path

# The image's embeddings, and Gemma 3's <start_of_image> / <end_of_image> around them.
IMAGE_RUN = IMAGE_TOKENS + 2
RED = image_bytes((200, 30, 30))


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def user(text: str, *images: bytes) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": data_url(i)}} for i in images
    ]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def args(model: Path, *more: str) -> list[str]:
    return ["--port", "0", "--threads", "1", "--n-ctx", "2048", "--model", str(model), *more]


@pytest.fixture(scope="module")
def served(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    mmproj = args(model_path, "--mmproj", str(projector_path()))
    with running(tmp_path_factory.mktemp("serve"), mmproj) as s:
        yield s


def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url, api_key="x", max_retries=0, timeout=300)


def test_models_say_vision_and_name_the_projector(served: Served) -> None:
    (entry,) = httpx2.get(f"{served.url}/models", timeout=10).json()["data"]
    assert entry["meta"]["vision"] is True
    assert entry["meta"]["projector"] == projector_path().name


def test_an_image_is_answered_counted_and_cached_for_the_follow_up(served: Served) -> None:
    c = client(served)
    greedy: dict[str, Any] = {"model": served.model, "temperature": 0, "max_tokens": 6}

    def usage(messages: list[Any]) -> tuple[int, int, str]:
        r = c.chat.completions.create(messages=messages, **greedy)
        assert r.choices[0].finish_reason in ("stop", "length")
        u = r.usage
        assert u is not None and u.prompt_tokens_details is not None
        return (
            u.prompt_tokens,
            u.prompt_tokens_details.cached_tokens or 0,
            r.choices[0].message.content or "",
        )

    plain, _, _ = usage([user("What is in this picture?")])
    first: list[Any] = [user("What is in this picture?", RED)]
    prompt, cached, text = usage(first)
    # The same prompt without the image is exactly the image's tokens shorter, and the
    # image is read (only the opening the two share comes from the cache).
    assert prompt - plain == IMAGE_RUN
    assert cached < prompt - IMAGE_RUN
    # The same words without the image: the image conversation is stashed in the pool,
    # not taken for the same request and rewound over.
    usage([user("What is in this picture?")])
    # The follow-up: the image (and the first turn) come back from the pool.
    follow: list[Any] = [*first, {"role": "assistant", "content": text}, user("Its colour?")]
    total, cached, answer = usage(follow)
    assert cached >= prompt
    assert 0 < total - cached < IMAGE_TOKENS  # the new message, never the image
    # The next one extends the live cache.
    third = [*follow, {"role": "assistant", "content": answer}, user("And its shape?")]
    longer, cached_third, _ = usage(third)
    assert cached_third >= total and longer - cached_third < IMAGE_TOKENS
    # Streamed, the usage chunk says the same.
    stream = c.chat.completions.create(
        messages=third, stream=True, stream_options={"include_usage": True}, **greedy
    )
    last = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
    assert last.prompt_tokens == longer and last.prompt_tokens_details is not None
    assert (last.prompt_tokens_details.cached_tokens or 0) >= total


def test_a_remote_url_is_a_400_and_the_model_keeps_serving(served: Served) -> None:
    c = client(served)
    remote: Any = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                {"type": "text", "text": "What is it?"},
            ],
        }
    ]
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=served.model, messages=remote, max_tokens=4)
    assert NOT_DATA in str(err.value) and err.value.param == "messages[0].content[0]"
    damaged: Any = [user("What is it?", RED[:60])]
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=served.model, messages=damaged, max_tokens=4)
    ok = c.chat.completions.create(model=served.model, messages=[user("Hi", RED)], max_tokens=1)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_serve_refuses_a_projector_that_does_not_fit(model_path: Path, tmp_path: Path) -> None:
    wrong = args(model_path, "--mmproj", str(projector_path(width=1024)))
    done = subprocess.run(
        serve_command(tmp_path / "data", wrong),
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert done.returncode != 0
    assert "ready" not in done.stdout
    assert "1024" in done.stderr and "640" in done.stderr, done.stderr[-2000:]
    not_one = tmp_path / "not-a-projector.gguf"
    not_one.write_bytes(b"GGUF" + b"\0" * 60)
    done = subprocess.run(
        serve_command(tmp_path / "data", args(model_path, "--mmproj", str(not_one))),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert done.returncode != 0 and "--mmproj" in done.stderr, done.stderr[-2000:]
    assert json.dumps({"ready": True})[:8] not in done.stdout
