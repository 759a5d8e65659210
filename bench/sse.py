"""A streamed JSON POST read with the standard library, for the benches that time
replies token by token: no SDK's event parsing in the figures, the same for every API."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any


def post_events(url: str, body: dict[str, Any], timeout: float = 600.0) -> Iterator[Any]:
    """POST ``body`` as JSON to ``url``; yield each server-sent ``data:`` event, decoded,
    as the server flushes it (``[DONE]`` and other lines skipped)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:  # one SSE line at a time
            line = raw.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                yield json.loads(line[6:])
