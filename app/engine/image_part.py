"""An image in a conversation as the engine sees it, and how it sits in prompt text.

A chat template renders text, so each image of a message is rendered as a marker,
``<__lamplight_image:DIGEST__>``, placed before the message's text (as llama.cpp's
server places its media marker). The engine splits prompt text at the markers and
puts the image's chunk (``app.engine.local.vision``) there. Text a user or a model wrote
cannot contain a marker: :func:`with_markers` escapes look-alikes first.

In the engine's token list an image is a run of one negative pseudo-token id
(:func:`image_token_id`, from its digest), as long as the image's tokens: prefix
matching, rewinds and snapshots treat it like any text, and the same picture gives
the same ids in every session.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from app.engine.chat_message import ChatMessage

MARKER_OPEN = "<__lamplight_image:"
MARKER_CLOSE = "__>"
_MARKER = re.compile(re.escape(MARKER_OPEN) + r"([0-9a-f]{64})" + re.escape(MARKER_CLOSE))
# The lowest pseudo-token id an image can get: ids in [IMAGE_ID_MIN, -2] are images.
IMAGE_ID_MIN = -(2**31) + 1


def image_marker(digest: str) -> str:
    """The text that stands for the image ``digest`` in a rendered prompt."""
    return f"{MARKER_OPEN}{digest}{MARKER_CLOSE}"


def escape_markers(text: str) -> str:
    """``text`` with anything that opens a marker broken up, so it stays text."""
    return text.replace(MARKER_OPEN, "<__lamplight_image\u200b:")


def split_markers(text: str) -> list[tuple[bool, str]]:
    """``text`` cut at its image markers: ``(False, text)`` and ``(True, digest)`` parts,
    in order, empty text parts left out."""
    out: list[tuple[bool, str]] = []
    at = 0
    for m in _MARKER.finditer(text):
        if m.start() > at:
            out.append((False, text[at : m.start()]))
        out.append((True, m.group(1)))
        at = m.end()
    if at < len(text):
        out.append((False, text[at:]))
    return out


def has_markers(text: str) -> bool:
    return MARKER_OPEN in text and _MARKER.search(text) is not None


def with_markers(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """``messages`` as a template renders them: markers for each message's images
    before its text, and marker look-alikes in any text escaped."""
    out = []
    for m in messages:
        content = escape_markers(m.content)
        if m.images:
            content = "".join(image_marker(i.digest) for i in m.images) + content
        if content != m.content or m.images:
            m = dataclasses.replace(m, content=content, images=())
        out.append(m)
    return out


def image_token_id(digest: str) -> int:
    """The pseudo-token id of every position of the image ``digest`` (negative, ≤ -2)."""
    return -2 - int(digest[:16], 16) % (-IMAGE_ID_MIN - 2)


def is_image_token(token: int) -> bool:
    return IMAGE_ID_MIN <= token <= -2
