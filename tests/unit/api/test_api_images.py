"""Images through the local API: ``image_url`` parts with ``data:`` URLs (fast: the
schema alone and the HTTP server over a FakeGateway), hostile URLs and bodies
(Hypothesis); the real engine with the test projector is marked slow."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.api.errors import ApiError
from app.api.gateway import failure_for
from app.api.image_parts import MAX_IMAGES, NOT_DATA, check_vision
from app.api.schema import parse_chat
from app.engine.backend import Capabilities
from app.engine.chat_message import ChatMessage
from app.util.errors import ImageError
from tests.conftest import Serve
from tests.hypothesis_budget import examples


def png(width: int = 8, height: int = 6, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def url_of(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def chat(*parts: Any, role: str = "user") -> dict[str, Any]:
    return {"messages": [{"role": role, "content": list(parts)}]}


def image(url: str, as_object: bool = True) -> dict[str, Any]:
    value: Any = {"url": url, "detail": "high"} if as_object else url
    return {"type": "image_url", "image_url": value}


def refused(body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as err:
        parse_chat(body)
    assert err.value.status == 400
    return err.value


def test_images_become_the_messages_images_in_order() -> None:
    red, blue = png(), png(5, 9, (0, 0, 255))
    req = parse_chat(
        chat(
            {"type": "text", "text": "What "},
            image(url_of(red)),
            {"type": "text", "text": "is this?"},
            image(url_of(blue), as_object=False),
        )
    )
    (m,) = req.messages
    assert m.content == "What is this?"
    assert [i.data for i in m.images] == [red, blue]
    assert (m.images[0].mime, m.images[0].width, m.images[0].height) == ("image/png", 8, 6)
    assert (m.images[1].width, m.images[1].height) == (5, 9)
    # A JPEG sent as "image/png" is what its bytes say.
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, "JPEG")
    (m,) = parse_chat(chat(image(url_of(out.getvalue())))).messages
    assert m.images[0].mime == "image/jpeg" and m.content == ""


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/cat.png",
        "http://127.0.0.1/x.png",
        "file:///etc/passwd",
        "ftp://x/y",
        "cat.png",
        "",
    ],
)
def test_urls_other_than_data_are_refused(url: str) -> None:
    err = refused(chat(image(url)))
    assert NOT_DATA in str(err) and err.param == "messages[0].content[0]"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("data:text/plain;base64,aGVsbG8=", "must be an image"),
        ("data:image/png,rawbytes", "must be base64"),
        ("data:image/png;base64", "comma"),
        ("data:image/png;base64,!!!notbase64", "base64 is damaged"),
        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not an image"),
        ("data:image/png;base64," + base64.b64encode(png()[:40]).decode(), "image"),
        ("data:image/png;base64,", "empty"),
    ],
)
def test_bad_data_urls_say_why(url: str, words: str) -> None:
    assert words in str(refused(chat(image(url))))


def test_images_only_in_user_messages_and_bounded() -> None:
    for role in ("assistant", "system", "tool"):
        body = chat(image(url_of(png())), role=role)
        if role == "tool":
            body["messages"][0]["tool_call_id"] = "x"
        assert "user messages only" in str(refused(body))
    many = chat(*[image(url_of(png(2, 2, (i, 0, 0)))) for i in range(MAX_IMAGES + 1)])
    assert f"At most {MAX_IMAGES} images" in str(refused(many))
    assert '"image_url": {"url"' in str(refused(chat({"type": "image_url"})))
    assert "not supported" in str(refused(chat({"type": "input_audio", "input_audio": {}})))


def test_a_model_without_vision_refuses_images_and_engine_image_errors_are_400() -> None:
    req = parse_chat(chat(image(url_of(png()))))
    with pytest.raises(ApiError) as err:
        check_vision(req.messages, Capabilities())
    assert err.value.status == 400 and "does not accept images" in str(err.value)
    check_vision(req.messages, Capabilities(vision=True))
    check_vision(parse_chat(chat({"type": "text", "text": "hi"})).messages, Capabilities())
    failure = failure_for(ImageError("The image is too large."))
    assert failure.status == 400 and failure.code == "invalid_value"


def post(server: Any, body: dict[str, Any]) -> httpx2.Response:
    return httpx2.post(f"{server.url}/chat/completions", json=body, timeout=10)


def test_http_images_reach_the_job_and_models_say_vision(serve: Serve) -> None:
    server, gw = serve()
    body = chat({"type": "text", "text": "Look"}, image(url_of(png())))
    r = post(server, body)
    assert r.status_code == 400 and "does not accept images" in r.json()["error"]["message"]
    assert httpx2.get(f"{server.url}/models").json()["data"][0]["meta"]["vision"] is False
    assert gw.info is not None
    caps = Capabilities(vision=True)
    gw.info = dataclasses.replace(gw.info, capabilities=caps, projector="mmproj-test.gguf")
    r = post(server, body)
    assert r.status_code == 200, r.text
    (m,) = gw.submitted[-1].messages
    assert m.content == "Look" and m.images[0].data == png()
    meta = httpx2.get(f"{server.url}/models").json()["data"][0]["meta"]
    assert meta["vision"] is True and meta["projector"] == "mmproj-test.gguf"
    r = post(server, chat(image("https://example.com/a.png")))
    assert r.status_code == 400 and NOT_DATA in r.json()["error"]["message"]


# -- hostile input -----------------------------------------------------------------------

_GOOD = png()


@st.composite
def hostile_urls(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["mutated", "text", "scheme", "truncated", "params"]))
    if kind == "mutated":
        data = bytearray(_GOOD)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return url_of(bytes(data))
    if kind == "text":
        return draw(st.text(max_size=200))
    if kind == "scheme":
        scheme = draw(st.sampled_from(["data:", "DATA:", " data:", "data:image/png", "http:"]))
        return scheme + draw(st.text(max_size=100))
    if kind == "truncated":
        return url_of(_GOOD)[: draw(st.integers(0, len(url_of(_GOOD))))]
    params = draw(st.text(alphabet=";=,abcimage/pngbase64 ", max_size=40))
    return "data:" + params + base64.b64encode(_GOOD).decode()


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_urls(), st.booleans())
def test_hostile_data_urls_are_a_400_or_an_image(url: str, as_object: bool) -> None:
    try:
        req = parse_chat(chat(image(url, as_object)))
    except ApiError as exc:
        assert exc.status == 400 and exc.param is not None
        return
    (m,) = req.messages
    assert len(m.images) == 1 and m.images[0].width > 0


@settings(max_examples=examples(100), deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
        max_leaves=12,
    )
)
def test_hostile_image_parts_are_a_400(part: Any) -> None:
    for candidate in (part, {"type": "image_url", "image_url": part}):
        try:
            parse_chat(
                json.loads(json.dumps({"messages": [{"role": "user", "content": [candidate]}]}))
            )
        except ApiError as exc:
            assert exc.status == 400


def test_the_kv_pool_tells_conversations_apart_by_their_images() -> None:
    """An API client's image conversation is not taken for the same words without the
    image (or with another): the pool stashes it rather than rewinding over the image."""
    from app.engine.chat_message import is_prefix
    from tests.vision_model import image_part

    red, blue = image_part((200, 0, 0)), image_part((0, 0, 200))
    with_red = [ChatMessage("user", "What is it?", images=(red,))]
    assert is_prefix(with_red, [*with_red, ChatMessage("assistant", "A dot.")])
    assert is_prefix(with_red, [ChatMessage("user", "What is it?", images=(red,))])
    assert not is_prefix(with_red, [ChatMessage("user", "What is it?")])
    assert not is_prefix(with_red, [ChatMessage("user", "What is it?", images=(blue,))])
    assert not is_prefix([ChatMessage("user", "What is it?")], with_red)


def test_a_phone_sized_photo_fits_the_default_body_limit(serve: Serve) -> None:
    """~10 MB of incompressible pixels (a phone photo's size) is ~13 MB as base64: over
    the old 8 MB limit, within the default one; a body over the limit is a 413."""
    import os

    from PIL import Image

    from app.config.setting_records import ApiSettings

    out = io.BytesIO()
    Image.frombytes("RGB", (2048, 1600), os.urandom(2048 * 1600 * 3)).save(
        out, "PNG", compress_level=0
    )
    photo = out.getvalue()
    assert len(photo) > 9 << 20
    limit = ApiSettings().max_body_mb << 20
    server, gw = serve(max_body_bytes=limit)
    assert gw.info is not None
    gw.info = dataclasses.replace(gw.info, capabilities=Capabilities(vision=True))
    r = httpx2.post(f"{server.url}/chat/completions", json=chat(image(url_of(photo))), timeout=60)
    assert r.status_code == 200, r.text[:500]
    assert gw.submitted[-1].messages[0].images[0].data == photo
    small, _ = serve(max_body_bytes=8 << 20)
    r = httpx2.post(f"{small.url}/chat/completions", json=chat(image(url_of(photo))), timeout=60)
    assert r.status_code == 413
