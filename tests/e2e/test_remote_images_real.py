"""Images through a real llama-server started with ``--mmproj`` (the default model and
the tiny random test projector, ``tests/vision_model.py``): this app's llama-server
backend (its own template, the multimodal ``/completion`` prompt, slot snapshots) and
the OpenAI-compatible backend (``image_url`` parts). The projector's weights are
random: these check the path (counts, what the server evaluates, what it keeps), never
the answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Backend, Finished
from app.engine.chat_message import ChatMessage
from app.remote.connection import Connection
from app.remote.llama_server.backend import LlamaServerBackend
from app.remote.openai.backend import OpenAIBackend
from app.util.errors import ImageError
from tests.server_fixture import RunningServer, connected_backend, running_llama_server
from tests.vision_model import IMAGE_TOKENS, image_part, projector_path

IMAGE_RUN = IMAGE_TOKENS + 2  # the embeddings, <start_of_image> and <end_of_image>
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, seed=1)
RED = image_part((200, 30, 30), "red.png")
BLUE = image_part((30, 30, 200), "blue.png")
QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    work = tmp_path_factory.mktemp("vision-server")
    # No RAM prompt cache on the server: a restored snapshot must come from the slot file.
    extra = ["--mmproj", str(projector_path()), "--cache-ram", "0"]
    with running_llama_server(model_path, work, threads=1, extra=extra) as s:
        yield s


@pytest.fixture()
def native(server: RunningServer) -> Iterator[LlamaServerBackend]:
    with connected_backend(server.url, "vision") as backend:
        yield backend


def finish(backend: Backend, messages: list[ChatMessage]) -> Finished:
    events = list(backend.generate(messages, GREEDY))
    done = events[-1]
    assert isinstance(done, Finished), events[-3:]
    assert done.metrics.stop_reason in ("eos", "max_tokens"), done.metrics.notes
    return done


def test_llama_server_counts_the_image_as_the_server_does(native: LlamaServerBackend) -> None:
    assert native.capabilities.vision and "vision" not in native.capabilities.why_not
    assert native.image_tokens(RED) == IMAGE_RUN
    plain = finish(native, [ChatMessage("user", QUESTION)])
    done = finish(native, [ChatMessage("user", QUESTION, images=(RED,))])
    m = done.metrics
    # This client's count (a run of pseudo-tokens per image) is the server's own: what it
    # evaluated plus what it kept (the opening the two prompts share).
    assert m.prompt_tokens - plain.metrics.prompt_tokens == IMAGE_RUN
    assert m.evaluated_tokens + m.cached_tokens == m.prompt_tokens
    assert m.evaluated_tokens > IMAGE_RUN


def test_llama_server_follow_up_reads_only_the_new_message(native: LlamaServerBackend) -> None:
    first = [ChatMessage("user", QUESTION, images=(RED,))]
    done = finish(native, first)
    reply = ChatMessage("assistant", done.text)
    native.prewarm(first, reply)
    follow = finish(native, [*first, reply, ChatMessage("user", "And its colour?")])
    m = follow.metrics
    assert m.cached_tokens >= done.metrics.prompt_tokens
    assert 0 < m.evaluated_tokens < IMAGE_TOKENS, (m.evaluated_tokens, m.cached_tokens)
    # Another image in the same place is read whole; so is the opening before it, a few
    # tokens of the slot (``Slot.reuses``: the server would restore a saved prompt).
    other = finish(native, [ChatMessage("user", QUESTION, images=(BLUE,))])
    assert other.metrics.evaluated_tokens >= IMAGE_RUN
    assert other.metrics.cached_tokens == 0


def test_llama_server_snapshot_of_a_chat_with_an_image(native: LlamaServerBackend) -> None:
    """The slot file carries the image: restored, the follow-up reads only its words,
    and answers as the conversation read afresh does."""
    first = [ChatMessage("user", QUESTION, images=(RED,))]
    done = finish(native, first)
    follow = [*first, ChatMessage("assistant", done.text), ChatMessage("user", "Its colour?")]
    saved = native.export_state("image-chat")
    finish(native, [ChatMessage("user", "Something else, at some length. " * 6)])
    native.import_state(saved)
    restored = finish(native, follow)
    assert restored.metrics.cached_tokens >= done.metrics.prompt_tokens
    assert restored.metrics.evaluated_tokens < IMAGE_TOKENS
    finish(native, [ChatMessage("user", "Something else again. " * 6)])
    afresh = finish(native, follow)
    assert afresh.metrics.evaluated_tokens >= IMAGE_RUN
    assert restored.text == afresh.text


def test_openai_backend_sends_image_url_parts(server: RunningServer) -> None:
    backend = OpenAIBackend(Connection("vision-v1", "vision /v1", "openai", server.url + "/v1"))
    backend.load("", LoadConfig())
    try:
        assert backend.capabilities.vision  # llama-server lists the model as multimodal
        plain = finish(backend, [ChatMessage("user", QUESTION)])
        first = [ChatMessage("user", QUESTION, images=(RED,))]
        done = finish(backend, first)
        assert done.metrics.prompt_tokens - plain.metrics.prompt_tokens == IMAGE_RUN
        follow = [*first, ChatMessage("assistant", done.text), ChatMessage("user", "Colour?")]
        again = finish(backend, follow)
        m = again.metrics
        assert m.cached_tokens >= done.metrics.prompt_tokens - 1, (m.cached_tokens, m.notes)
        assert m.evaluated_tokens < IMAGE_TOKENS
    finally:
        backend.unload()


def test_a_server_without_a_projector_refuses_images_clearly(
    model_path: Path, tmp_path: Path
) -> None:
    with running_llama_server(model_path, tmp_path, threads=1) as plain:
        native = LlamaServerBackend(Connection("text", "text server", "llama-server", plain.url))
        native.load("", LoadConfig())
        try:
            assert not native.capabilities.vision
            assert "--mmproj" in native.capabilities.why_not["vision"]
            with pytest.raises(ImageError, match="--mmproj"):
                finish(native, [ChatMessage("user", QUESTION, images=(RED,))])
            with pytest.raises(ImageError):
                native.image_tokens(RED)
        finally:
            native.unload()
        v1 = OpenAIBackend(Connection("text-v1", "text /v1", "openai", plain.url + "/v1"))
        v1.load("", LoadConfig())
        try:
            assert not v1.capabilities.vision
            with pytest.raises(ImageError):
                v1.image_tokens(RED)
        finally:
            v1.unload()
