"""A request body read and checked, by the kind of request it is (on the server's
parser thread): chat completions and completions (``schema``), Anthropic's messages
and their token count (``messages_schema``), OpenAI's responses (``responses_schema``)."""

from __future__ import annotations

from typing import Literal

from app.api.gateway import ApiKind
from app.api.messages_schema import parse_messages
from app.api.responses_schema import parse_responses
from app.api.schema import ApiRequest, load_body, parse_request

BodyKind = Literal["messages", "count", "responses"]


def parse_body(kind: ApiKind | BodyKind, raw: bytes) -> ApiRequest:
    """``raw`` checked as a ``kind`` request.

    Raises:
        ApiError: 400 naming the field, or 413 (see ``schema.load_body``).
    """
    if kind == "messages" or kind == "count":
        return parse_messages(load_body(raw), counting=kind == "count")
    if kind == "responses":
        return parse_responses(load_body(raw))
    return parse_request(kind, raw)
