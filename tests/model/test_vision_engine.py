"""Images through the real engine: the default model with the tiny test projector
(``tests/vision_model.py``). The projector's weights are random, so these check the
path (what is evaluated, cached, restored, refused), never the answers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from app.config.setting_records import SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.image_part import image_marker, is_image_token
from app.engine.local.engine import Engine
from app.util.errors import ImageError, ProjectorError
from tests.conftest import TEST_LOAD
from tests.vision_model import IMAGE_TOKENS, image_part, projector_path

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, seed=1)
RED = image_part((200, 30, 30), "red.png")
BLUE = image_part((30, 30, 200), "blue.png")


@pytest.fixture(scope="module")
def vision(model_path: Path) -> Iterator[Engine]:
    engine = Engine()
    engine.load(model_path, replace(TEST_LOAD, mmproj=str(projector_path())))
    yield engine
    engine.unload()


@pytest.fixture()
def eng(vision: Engine) -> Engine:
    vision.reset()
    return vision


def finish(engine: Engine, messages: list[ChatMessage]) -> Finished:
    events = list(engine.generate(messages, GREEDY))
    last = events[-1]
    assert isinstance(last, Finished)
    return last


def image_starts(tokens: list[int]) -> list[int]:
    """Where each run of an image's pseudo-token begins."""
    return [i for i, t in enumerate(tokens) if is_image_token(t) and (i == 0 or tokens[i - 1] != t)]


def image_runs(tokens: list[int]) -> int:
    return len(image_starts(tokens))


def test_projector_loads_and_counts_tokens(eng: Engine) -> None:
    info = eng.model
    assert info is not None and info.projector == projector_path().name
    assert eng.capabilities.vision
    # The image's embeddings, and Gemma 3's <start_of_image> / <end_of_image> around them.
    assert eng.image_tokens(RED) == IMAGE_TOKENS + 2


def test_follow_up_reads_only_the_new_message(eng: Engine) -> None:
    first = [ChatMessage("user", "What is in this picture?", images=(RED,))]
    done = finish(eng, first)
    assert done.metrics.evaluated_tokens == done.metrics.prompt_tokens
    assert image_runs(eng.cached_tokens) == 1
    reply = ChatMessage("assistant", done.text)
    eng.prewarm(first, reply)
    question = "And what colour is it?"
    follow = finish(eng, [*first, reply, ChatMessage("user", question)])
    own = len(eng.tokenize(question)) - 1  # without BOS
    # The new words, and the template's "<end_of_turn>\n<start_of_turn>model\n" after
    # them: never the image again.
    assert follow.metrics.evaluated_tokens <= own + 5
    assert follow.metrics.evaluated_tokens < IMAGE_TOKENS


def test_regenerate_and_snapshot_reuse_the_image(eng: Engine) -> None:
    msgs = [ChatMessage("user", "Describe it.", images=(RED,))]
    finish(eng, msgs)
    again = finish(eng, msgs)
    assert again.metrics.evaluated_tokens == 1  # regenerate: only the last prompt token
    saved = eng.export_state()
    eng.reset()
    eng.import_state(saved)
    restored = finish(eng, msgs)
    assert restored.metrics.evaluated_tokens == 1
    assert restored.metrics.cached_tokens == restored.metrics.prompt_tokens - 1
    # With no snapshot, the stored image is read again: the cache is rebuilt from it.
    eng.reset()
    rebuilt = finish(eng, msgs)
    assert rebuilt.metrics.evaluated_tokens == rebuilt.metrics.prompt_tokens
    assert rebuilt.text == restored.text


def test_another_image_is_read_again_from_where_it_starts(eng: Engine) -> None:
    finish(eng, [ChatMessage("user", "Look.", images=(RED,))])
    cached = eng.cached_tokens
    start = next(i for i, t in enumerate(cached) if is_image_token(t))
    other = finish(eng, [ChatMessage("user", "Look.", images=(BLUE,))])
    # The same opening (up to the image's begin token) is kept, the new image read whole.
    assert other.metrics.cached_tokens == start
    assert image_runs(eng.cached_tokens) == 1
    assert RED.digest != BLUE.digest


def test_two_images_and_an_edit_keep_the_prefix(eng: Engine) -> None:
    both = [ChatMessage("user", "Compare them.", images=(RED, BLUE))]
    done = finish(eng, both)
    assert image_runs(eng.cached_tokens) == 2
    edited = [ChatMessage("user", "Compare these two.", images=(RED, BLUE))]
    again = finish(eng, edited)
    # Both images come before the text: an edit of the text keeps them.
    assert again.metrics.cached_tokens >= 2 * IMAGE_TOKENS
    assert done.metrics.prompt_tokens > 2 * IMAGE_TOKENS


def test_marker_lookalikes_in_text_stay_text(eng: Engine) -> None:
    fake = image_marker(RED.digest)
    done = finish(eng, [ChatMessage("user", f"Say {fake} back.")])
    assert image_runs(eng.cached_tokens) == 0
    assert done.metrics.prompt_tokens > 0


def test_a_damaged_image_is_refused_and_the_cache_kept(eng: Engine) -> None:
    finish(eng, [ChatMessage("user", "Hello.")])
    before = eng.cached_tokens
    bad = ImagePart.from_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "image/png")
    with pytest.raises(ImageError):
        finish(eng, [ChatMessage("user", "Hello.", images=(bad,))])
    assert eng.cached_tokens == before


def test_images_need_a_projector(engine: Engine) -> None:
    assert not engine.capabilities.vision
    with pytest.raises(ImageError, match="vision projector"):
        finish(engine, [ChatMessage("user", "What is it?", images=(RED,))])
    with pytest.raises(ImageError):
        engine.image_tokens(RED)


def test_a_projector_for_another_width_is_refused_before_llama_cpp(
    model_path: Path, vision: Engine
) -> None:
    before = vision.model
    with pytest.raises(ProjectorError, match="1024"):
        vision.load(model_path, replace(TEST_LOAD, mmproj=str(projector_path(width=1024))))
    assert vision.model == before  # the loaded model stays
    with pytest.raises(ProjectorError):
        vision.load(model_path, replace(TEST_LOAD, mmproj=str(model_path)))  # a model file


@pytest.fixture(scope="module")
def small(model_path: Path) -> Iterator[Engine]:
    """The projector with a 512-token context, for the overflow policies."""
    engine = Engine()
    engine.load(model_path, replace(TEST_LOAD, n_ctx=512, mmproj=str(projector_path())))
    yield engine
    engine.unload()


def long_chat(first_images: tuple[ImagePart, ...]) -> list[ChatMessage]:
    words = " ".join(f"word{i}" for i in range(40))
    msgs = [ChatMessage("user", "Look at this.", images=first_images)]
    for i in range(8):
        msgs += [ChatMessage("assistant", f"Reply {i}: {words}"), ChatMessage("user", f"Turn {i}.")]
    return msgs


@pytest.mark.parametrize("policy", ["truncate_middle", "rolling"])
def test_overflow_keeps_or_drops_an_image_turn_whole(small: Engine, policy: str) -> None:
    small.reset()
    params = replace(GREEDY, overflow=policy, max_tokens=4)
    msgs = long_chat((RED,))
    done = None
    for event in small.generate(msgs, params):
        if isinstance(event, Finished):
            done = event
    assert done is not None and done.metrics.stop_reason != "error"
    tokens = small.cached_tokens
    runs = image_starts(tokens)
    # Truncate middle keeps the first exchange (the picture); rolling drops it first.
    assert len(runs) == (1 if policy == "truncate_middle" else 0)
    for start in runs:  # a kept picture is whole
        assert tokens[start : start + IMAGE_TOKENS] == [tokens[start]] * IMAGE_TOKENS
    assert done.metrics.prompt_tokens < small.llama.n_ctx() < len(small.tokenize(str(msgs)))
    assert done.metrics.dropped_count > 0


def test_stop_while_an_image_is_read_leaves_no_part_of_it(eng: Engine) -> None:
    import threading

    stop = threading.Event()
    stop.set()  # stopped before the prompt's first batch: nothing of the picture is kept
    events = list(eng.generate([ChatMessage("user", "Look.", images=(BLUE,))], GREEDY, stop))
    last = events[-1]
    assert isinstance(last, Finished) and last.metrics.stop_reason == "cancelled"
    assert image_runs(eng.cached_tokens) == 0
    after = finish(eng, [ChatMessage("user", "Look.", images=(BLUE,))])
    assert image_runs(eng.cached_tokens) == 1
    assert after.metrics.evaluated_tokens == after.metrics.prompt_tokens
