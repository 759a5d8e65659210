"""Where the body of a server's answer lies in the file: its HTTP byte range."""

from __future__ import annotations

import re
from typing import Any

# RFC 9110 "bytes first-last/complete": at most 19 digits, so int() never meets a huge number.
_CONTENT_RANGE = re.compile(r"bytes[ \t]+(\d{1,19})-(\d{1,19})/(\d{1,19}|\*)", re.IGNORECASE)
_UNSATISFIED = re.compile(r"bytes[ \t]+\*/(\d{1,19})", re.IGNORECASE)


class WrongRange(Exception):
    """The server answered bytes that cannot be placed in the part; tried again."""


def body_range(response: Any, size: int) -> tuple[int, int, int | None]:
    """Where the body of ``response`` lies in the file: ``(start, end_exclusive, total)``,
    ``total`` being the file size a ``Content-Range`` states (None when it states none).

    Raises:
        WrongRange: a status other than 200/206, or a 206 whose ``Content-Range`` is
            missing, malformed or impossible.
    """
    status = response.status_code
    if status == 200:
        return 0, size, None
    if status != 206:
        raise WrongRange(f"the server answered {status} to a request for a byte range")
    text = str(response.headers.get("Content-Range", ""))
    match = _CONTENT_RANGE.fullmatch(text.strip())
    if match is None:
        shown = ascii(text[:60]) if text else "none"
        raise WrongRange(
            f"the server answered a byte range without a usable Content-Range ({shown})"
        )
    first, last = int(match[1]), int(match[2])
    total = None if match[3] == "*" else int(match[3])
    if first > last or last >= (size if total is None else total):
        raise WrongRange(f"the server answered an impossible byte range ({text[:60]!a})")
    return first, last + 1, total


def unsatisfied_total(response: Any) -> int | None:
    """The file size a 416 answer states (``Content-Range: bytes */N``), if it states one."""
    match = _UNSATISFIED.fullmatch(str(response.headers.get("Content-Range", "")).strip())
    return int(match[1]) if match else None
