"""The send-time decisions of ``app.chat.composer`` (no Qt, no model): pictures, the
room for passages counted by a tokenizer or estimated, and the tool offer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.chat.composer import (
    DEFAULT_CTX,
    MIN_ROOM,
    NO_MODEL,
    NO_VISION,
    Outgoing,
    chat_tokens,
    compose,
    estimate_tokens,
    fit_warning,
    offers_tools,
    tool_offer,
    unseen_image,
    vision_refusal,
)
from app.chat.conversation import Message
from app.engine.backend import Capabilities, ModelInfo
from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.templates.builtin import plain_template
from app.engine.tool_spec import AUTO, NONE, ToolRequest, ToolSpec

PICTURE = ImagePart.from_bytes(b"picture", "image/png", 4, 3)


def model(n_ctx: int = 8192, vision: bool = False, tools: bool = False) -> ModelInfo:
    caps = Capabilities(vision=vision, tools=tools, why_not={} if tools else {"tools": "why"})
    path = Path("/m/a.gguf")
    bare = ModelInfo(path, "a", "gemma3", 1, 1, n_ctx, n_ctx, 1, 0, "", "cpu", 0.0)
    return replace(bare, capabilities=caps)


def chat(prompt: int, generated: int) -> list[Message]:
    """A chat whose last reply read ``prompt`` tokens and wrote ``generated``."""
    metrics = {"prompt_tokens": prompt, "generated_tokens": generated}
    return [
        Message("user", "hi"),
        Message("assistant", "old", metrics={"prompt_tokens": 1, "generated_tokens": 1}),
        Message("user", "more"),
        Message("assistant", "hello", metrics=metrics),
        Message("user", "unsent edit"),
    ]


def test_the_chat_so_far_is_its_last_replys_prompt_and_answer() -> None:
    assert chat_tokens([]) == 0 and chat_tokens([Message("user", "hi")]) == 0
    assert chat_tokens(chat(1000, 200)) == 1200


def test_the_room_for_passages_counts_the_text_with_the_counter() -> None:
    message = compose("x" * 300, [], model(8192), chat(1000, 200), 512)
    assert isinstance(message, Outgoing)
    assert message.room() == 8192 - 1200 - 100 - 512  # the estimate: 3 characters a token
    assert message.room(lambda text: 10) == 8192 - 1200 - 10 - 512  # the model's tokenizer
    counted: list[str] = []
    empty = compose("", [PICTURE], model(vision=True), [], 512)
    assert isinstance(empty, Outgoing) and empty.images == (PICTURE,)
    assert empty.room(lambda t: counted.append(t) or 5) == 8192 - 512 and counted == []


def test_the_room_has_a_floor_and_a_default_context() -> None:
    full = compose("words", [], model(4096), chat(4000, 90), 512)
    assert isinstance(full, Outgoing) and full.room() == MIN_ROOM
    unknown = compose("", [], model(0), [], 100)  # a server that does not say
    assert isinstance(unknown, Outgoing) and unknown.room() == DEFAULT_CTX - 100
    none = compose("", [], None, [], 100)
    assert isinstance(none, Outgoing) and none.room() == DEFAULT_CTX - 100


def test_pictures_go_only_to_a_model_that_sees_them() -> None:
    assert compose("look", [PICTURE], model(vision=False), [], 64) == NO_VISION
    assert compose("look", [PICTURE], None, [], 64) == NO_MODEL
    assert isinstance(compose("look", [PICTURE], model(vision=True), [], 64), Outgoing)
    assert isinstance(compose("text only", [], model(vision=False), [], 64), Outgoing)
    assert vision_refusal(model(vision=True)) == ""
    assert vision_refusal(model()) == NO_VISION and vision_refusal(None) == NO_MODEL


def test_the_api_finds_the_first_picture_a_model_cannot_see() -> None:
    messages = [ChatMessage("user", "a"), ChatMessage("user", "b", images=(PICTURE,))]
    assert unseen_image(messages, Capabilities()) == 1
    assert unseen_image(messages, Capabilities(vision=True)) is None
    assert unseen_image(messages[:1], Capabilities()) is None


def test_pictures_that_pass_the_context_are_warned_about() -> None:
    assert fit_warning(None, [], 100, 0) == ""
    assert fit_warning(model(1000), [], 0, 0) == ""  # not counted yet
    assert fit_warning(model(0), [], 100, 0) == ""  # the context is not known
    assert "cannot be sent" in fit_warning(model(1000), [], 1000, 0)
    assert fit_warning(model(2000), chat(500, 100), 300, 100) == ""
    warning = fit_warning(model(1000), chat(500, 100), 300, 200)
    assert warning == (
        "with the chat so far that is about 1,100 of 1,000 tokens: older messages will be forgotten"
    )


def test_estimate() -> None:
    assert estimate_tokens("") == 0 and estimate_tokens("abcdefg") == 2


def test_the_tool_offer() -> None:
    tools = ToolRequest((ToolSpec("f"),), AUTO)
    described = ToolRequest((ToolSpec("f"),), NONE)
    able, unable = model(tools=True).capabilities, model(tools=False).capabilities
    assert tool_offer(able, tools).tools is tools and tool_offer(able, None).tools is None
    assert tool_offer(unable, None).tools is None and not tool_offer(unable, None).refusal
    assert tool_offer(unable, described).tools is None  # could not be called anyway
    assert not tool_offer(unable, described).refusal
    refused = tool_offer(unable, tools)
    assert refused.tools is None
    assert refused.refusal == "Tool calling is not available with this model: why."
    bare = tool_offer(Capabilities(), tools).refusal
    assert (
        bare == "Tool calling is not available with this model: this backend has no tool calling."
    )


def test_the_window_offers_no_tools_to_continue_the_text() -> None:
    assert offers_tools(None) and offers_tools(model())
    assert not offers_tools(replace(model(), template=plain_template().label))


def test_the_backends_count_with_their_tokenizer_or_say_they_cannot() -> None:
    from app.config.setting_records import LoadConfig
    from app.remote.connection import Connection
    from app.remote.llama_server.backend import LlamaServerBackend
    from app.remote.openai.backend import OpenAIBackend
    from tests.misbehaving_server import MisbehavingServer

    with MisbehavingServer() as server:
        backend = LlamaServerBackend(Connection("m", "m", "llama-server", server.url))
        backend.load("", LoadConfig())
        try:
            assert backend.count_tokens("ferry") == 5  # its /tokenize: a token a character
        finally:
            backend.unload()
        remote = OpenAIBackend(Connection("o", "o", "openai", server.url))
        assert remote.count_tokens("ferry") == 0  # the caller estimates
