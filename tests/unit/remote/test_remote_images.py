"""Images to servers (fast units): OpenAI ``image_url`` parts, what a server says about
images, and llama-server's multimodal prompt."""

from __future__ import annotations

import base64

import pytest

from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.image_part import image_marker
from app.remote.http import ServerError
from app.remote.image_wire import (
    content_parts,
    media_marker,
    multimodal_prompt,
    refuses_images,
    vision_of_model,
    vision_of_props,
)
from app.remote.openai.tool_wire import wire_message
from app.remote.openai.wire import parse_models

PIC = ImagePart.from_bytes(b"\x89PNG fake", "image/png", 2, 2)


def test_user_images_go_as_image_url_parts_before_the_text() -> None:
    m = ChatMessage("user", "What is it?", images=(PIC,))
    url = "data:image/png;base64," + base64.b64encode(PIC.data).decode()
    assert wire_message(m)["content"] == [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is it?"},
    ]
    assert content_parts(ChatMessage("user", "hi")) == "hi"


def test_what_servers_say_about_images() -> None:
    assert vision_of_props({"modalities": {"vision": True}}) is True
    assert vision_of_props({"modalities": {"vision": "yes"}}) is None
    assert vision_of_props([]) is None
    llama = {
        "models": [{"model": "m", "capabilities": ["completion"]}],
        "data": [{"id": "m", "owned_by": "llamacpp"}],
    }
    assert parse_models(llama)[0].vision is False
    llama["models"][0]["capabilities"] = ["completion", "multimodal"]  # type: ignore[index]
    assert parse_models(llama)[0].vision is True
    assert vision_of_model({"id": "x", "architecture": {"input_modalities": ["text", "image"]}})
    assert vision_of_model({"id": "x", "type": "llm"}) is False
    assert vision_of_model({"id": "gpt"}) is None
    assert refuses_images(ServerError(400, "image input is not supported - provide the mmproj"))
    assert not refuses_images(ServerError(400, "context size exceeded"))
    assert media_marker({"media_marker": "<__media_abc__>"}) == "<__media_abc__>"
    assert media_marker({}) == "<__media__>"


def test_the_multimodal_prompt_puts_the_servers_marker_where_each_image_is() -> None:
    text = "<bos>user " + image_marker(PIC.digest) + "hi <__m__> there"
    out = multimodal_prompt(text, {PIC.digest: PIC}, "<__m__>", "<bos>")
    assert out["prompt_string"] == "user <__m__>hi  there"  # a marker in text is dropped
    assert out["multimodal_data"] == [base64.b64encode(PIC.data).decode()]


def test_a_server_that_cannot_save_images_in_a_slot_says_so() -> None:
    from app.engine.image_part import image_token_id
    from app.remote.llama_server.images import save_refused

    refusal = ServerError(501, "This feature is not supported by multimodal", "not_supported")
    with_image = [2, 10, *[image_token_id(PIC.digest)] * 66, 11]
    assert "holds images" in str(save_refused(refusal, with_image))
    assert "--mmproj" in str(save_refused(refusal, [2, 10, 11]))
    other = ServerError(400, "Invalid slot ID")
    assert save_refused(other, with_image) is other
    # Through the backend: the snapshot is refused with the reason, the slot untouched.
    from app.config.setting_records import LoadConfig, SamplingParams
    from app.remote.connection import Connection
    from app.remote.llama_server.backend import LlamaServerBackend
    from app.util.errors import LamplightError
    from tests.misbehaving_server import MisbehavingServer

    with MisbehavingServer() as server:
        backend = LlamaServerBackend(Connection("m", "m", "llama-server", server.url))
        backend.load("", LoadConfig())
        try:
            list(backend.generate([ChatMessage("user", "hi")], SamplingParams(max_tokens=2)))
            real_call = backend._link.call

            def call(method: str, path: str, body: object = None) -> object:
                if "action=save" in path:
                    raise refusal
                return real_call(method, path, body)

            backend._link.call = call  # type: ignore[method-assign]
            with pytest.raises(LamplightError, match="vision projector"):
                backend.export_state("chat")
        finally:
            backend.unload()
