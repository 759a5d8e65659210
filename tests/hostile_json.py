"""Hostile JSON for the loaders' fuzzers: any JSON value (with the ones that broke things
before), and mutations of a file the app wrote (values replaced, keys deleted, deep
nesting, flipped bytes, truncation, other encodings); with the checks they share."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

BUDGET_S = 2.0  # per call; generous for a loaded 2-core machine (typical: a few ms)


def tree(root: Path) -> dict[str, Any]:
    """Every entry under ``root``: bytes for regular files, the kind for the rest."""
    out: dict[str, Any] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st_ = path.lstat()
            rel = str(path.relative_to(root))
            out[rel] = path.read_bytes() if stat.S_ISREG(st_.st_mode) else stat.S_IFMT(st_.st_mode)
    return out


def timed(call: Callable[[], Any]) -> Any:
    t0 = time.monotonic()
    try:
        return call()
    finally:
        assert time.monotonic() - t0 < BUDGET_S, "over the time budget"


def one_line(message: str) -> None:
    assert message and "\n" not in message and len(message) < 1000, message


# JSON values of any type, with the values that broke things before.
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**31, 2**32 + 512, 2**40, 2**63, 2**64, 2**100, -1, 0, 100000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e20, -1e20, 1e308]),
    st.text(max_size=12),
    st.sampled_from(
        ["\ud800", "a\udfffb", "../../x", "..", "", "\x00", "CON", "a" * 300, "\u202e"]
    ),
)
VALUES = st.recursive(
    LEAVES,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=10,
)
NEST = "\u0001NEST\u0001"


def paths_in(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths_in(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:6]):  # a few list items are enough
            yield from paths_in(v, (*prefix, i))


def replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy: Any = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[path[0]] = replaced(doc[path[0]], path[1:], value)
    return copy


def deleted(doc: Any, path: tuple[Any, ...]) -> Any:
    if len(path) == 1:
        copy: Any = dict(doc) if isinstance(doc, dict) else list(doc)
        del copy[path[0]]
        return copy
    return replaced(doc, path[:1], deleted(doc[path[0]], path[1:]))


@st.composite
def mutated(draw: st.DrawFn, raw: bytes) -> bytes:
    """``raw`` (a JSON file the app wrote) changed the way damage or an attacker would."""
    doc = json.loads(raw)
    kind = draw(st.sampled_from(["replace", "replace", "replace", "nest", "delete", "bytes"]))
    paths = list(paths_in(doc))
    path = draw(st.sampled_from(paths))
    if kind == "replace":
        return json.dumps(replaced(doc, path, draw(VALUES))).encode()
    if kind == "delete" and path:
        return json.dumps(deleted(doc, path)).encode()
    if kind == "nest":
        depth = draw(st.sampled_from([3, 9, 17, 40, 900, 1100, 100_000]))
        inner = json.dumps(_get(doc, path))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        text = json.dumps(replaced(doc, path, NEST))
        return text.replace(json.dumps(NEST), opener * depth + inner + closer * depth).encode()
    how = draw(st.sampled_from(["flip", "truncate", "utf-16", "utf-32", "latin-1", "bom"]))
    if how == "flip":
        data = bytearray(raw)
        for pos in draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8)):
            data[pos] ^= draw(st.integers(1, 255))
        return bytes(data)
    if how == "truncate":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    return raw.decode().encode(how, errors="replace")


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc
