"""Images in ``/v1/chat/completions`` requests: ``image_url`` content parts, checked.

Only ``data:`` URLs with base64 image bytes are taken: the server never fetches what a
client names (an ``http(s)://`` or ``file:`` URL could make it read the network or the
disk on the client's behalf). Each image is decoded defensively
(``app.util.images.check_image``: size, pixel count, format, truncation), and a request
holds at most ``MAX_IMAGES`` images of ``MAX_TOTAL_BYTES`` in all. Images are taken in
user messages only, and only when the loaded model sees images (``check_vision``).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from typing import Any

from app.api.errors import ApiError, bad
from app.chat.composer import unseen_image
from app.engine.backend import Capabilities
from app.engine.chat_message import ChatMessage, ImagePart
from app.util.errors import ImageError
from app.util.images import MAX_IMAGE_BYTES, check_image

MAX_IMAGES = 16  # per request
MAX_TOTAL_BYTES = 64 << 20  # decoded image bytes per request
IMAGE_KINDS = ("image_url", "input_image", "image")
NOT_DATA = "image_url must be a data: URL; this server does not fetch URLs"
NO_VISION = "the loaded model does not accept images (no vision projector)"
# data:[<mime>][;param=value]*;base64,<data>
_DATA_URL = re.compile(
    r"data:(?P<mime>[A-Za-z0-9.+-]*/[A-Za-z0-9.+-]*)?(?P<params>(?:;[^;,]*)*),", re.ASCII
)
_MAX_HEAD = 256  # characters of a data URL before its comma


class ImageBudget:
    """What a request's images have taken so far (count and bytes), bounded."""

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0

    def take(self, at: str, size: int) -> None:
        self.count += 1
        self.bytes += size
        if self.count > MAX_IMAGES:
            raise bad(f"At most {MAX_IMAGES} images per request ({at}).", at)
        if self.bytes > MAX_TOTAL_BYTES:
            raise bad(
                f"The images of this request hold more than {MAX_TOTAL_BYTES >> 20} MB "
                f"({at}); send fewer or smaller ones.",
                at,
            )


def image_url_of(at: str, part: dict[str, Any]) -> str:
    """The URL of an image content part: ``image_url`` as an object with ``url``
    (``detail`` ignored) or a string; the Responses API's ``input_image`` too."""
    value = part.get("image_url")
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str):
        raise bad(
            f'{at} must be {{"type": "image_url", "image_url": {{"url": "data:image/...;'
            'base64,..."}}.',
            at,
        )
    return value


def data_url_bytes(at: str, url: str) -> bytes:
    """The bytes of a base64 ``data:`` URL of an image.

    Raises:
        ApiError: 400: not a data: URL, not base64, not an image type, too large.
    """
    head = url[: _MAX_HEAD + 5].lstrip()
    if not head[:5].lower() == "data:":
        raise bad(f"{NOT_DATA} ({at}).", at)
    m = _DATA_URL.match("data:" + head[5:])
    if m is None:
        raise bad(f"{at}: a data: URL needs a comma before its data.", at)
    mime = (m.group("mime") or "").lower()
    params = [p.strip().lower() for p in m.group("params").split(";") if p.strip()]
    if not mime.startswith("image/"):
        raise bad(
            f"{at}: the data: URL's type must be an image (image/png, image/jpeg...), "
            f"not {mime or 'missing'!r}.",
            at,
        )
    if "base64" not in params:
        raise bad(f"{at}: the data: URL must be base64 (data:{mime};base64,...).", at)
    data = url.lstrip()[m.end() :]
    if len(data) > (MAX_IMAGE_BYTES // 3 + 1) * 4 + 4096:  # before decoding it
        raise bad(f"{at}: the image is larger than {MAX_IMAGE_BYTES >> 20} MB.", at)
    data = "".join(data.split())  # line breaks some encoders add
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad(f"{at}: the data: URL's base64 is damaged ({exc}).", at) from None


def image_part(at: str, part: dict[str, Any], budget: ImageBudget) -> ImagePart:
    """One image content part as an ``ImagePart``, its bytes checked.

    Raises:
        ApiError: 400 with the reason (``ImageError``'s message for a bad image).
    """
    raw = data_url_bytes(at, image_url_of(at, part))
    budget.take(at, len(raw))
    try:
        info = check_image(raw)
    except ImageError as exc:
        raise bad(f"{at}: {exc}", at) from None
    return ImagePart.from_bytes(raw, info.mime, info.width, info.height)


def check_vision(messages: Sequence[ChatMessage], caps: Capabilities) -> None:
    """Refuse a request with images when the loaded model sees none.

    Raises:
        ApiError: 400 naming the first message with an image.
    """
    i = unseen_image(messages, caps)  # the window's decision too
    if i is None:
        return
    why = caps.why_not.get("vision")
    message = f"{NO_VISION[0].upper()}{NO_VISION[1:]}" + (f": {why}." if why else ".")
    raise ApiError(400, message, code="unsupported_parameter", param=f"messages[{i}].content")
