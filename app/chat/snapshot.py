"""KV snapshot files: llama.cpp's sequence state plus the tokens and text it covers.

Layout (little-endian)::

    b"LPKV" | u32 header length | header (UTF-8 JSON) | payload

The payload is the sequence state, then the token ids (int32), the text
(UTF-8) and the token/text marks (int32 pairs); the header gives each part's
length, what the state depends on (model fingerprint, llama.cpp version,
context settings, LoRA stack) and a CRC-32 of the payload. No logits are
stored, so the size follows the KV cache. Files are written atomically.
"""

from __future__ import annotations

import json
import struct
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.backend import KvState
from app.util.atomic import atomic_write_bytes
from app.util.errors import LamplightError

MAGIC = b"LPKV"
FORMAT_VERSION = 1
MAX_HEADER = 1 << 20


class SnapshotError(LamplightError):
    """A snapshot that cannot be used; the message says why in one line."""


@dataclass(frozen=True)
class SnapshotHeader:
    """What a snapshot was made with; all of it must match to restore."""

    model: dict[str, Any]  # {"size": int, "sha256": str, "name": str}
    runtime: dict[str, Any]  # {"llama_cpp_python": str}
    cache: dict[str, Any]  # Engine.cache_config()
    lora: list[dict[str, Any]]
    n_tokens: int = 0

    def mismatch(self, current: SnapshotHeader) -> str:
        """Why this snapshot does not fit ``current`` (empty when it does)."""
        if self.model.get("sha256") != current.model.get("sha256"):
            return f"it was saved with another model ({self.model.get('name', 'unknown')})"
        if self.runtime != current.runtime:
            return (
                "it was saved by another llama.cpp version "
                f"({self.runtime.get('llama_cpp_python')} vs "
                f"{current.runtime.get('llama_cpp_python')})"
            )
        for key in sorted(set(self.cache) | set(current.cache)):
            if self.cache.get(key) != current.cache.get(key):
                return (
                    f"the cache setting {key} changed "
                    f"({self.cache.get(key)} then, {current.cache.get(key)} now)"
                )
        if self.lora != current.lora:
            return "the LoRA adapters changed"
        return ""


def runtime_info() -> dict[str, Any]:
    import llama_cpp

    return {"llama_cpp_python": str(llama_cpp.__version__)}


def write_snapshot(path: Path, header: SnapshotHeader, kv: KvState) -> int:
    """Write ``kv`` atomically; returns the file size."""
    tokens = array("i", kv.tokens)
    marks = array("i", [v for m in kv.marks for v in m])
    if tokens.itemsize != 4:  # pragma: no cover - every supported platform has 32-bit int
        raise SnapshotError("this platform has no 32-bit int array")
    text = kv.text.encode("utf-8")
    parts = [kv.state, tokens.tobytes(), text, marks.tobytes()]
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    head = {
        "format": FORMAT_VERSION,
        "model": header.model,
        "runtime": header.runtime,
        "cache": header.cache,
        "lora": header.lora,
        "n_tokens": len(kv.tokens),
        "lengths": [len(p) for p in parts],
        "crc32": crc,
    }
    head_bytes = json.dumps(head, sort_keys=True).encode("utf-8")
    blob = b"".join([MAGIC, struct.pack("<I", len(head_bytes)), head_bytes, *parts])
    atomic_write_bytes(path, blob)
    return len(blob)


def read_header(path: Path) -> tuple[SnapshotHeader, dict[str, Any], int]:
    """The header of a snapshot file, its raw JSON and where the payload starts."""
    try:
        with path.open("rb") as fh:
            start = fh.read(8)
            if len(start) == 0:
                raise SnapshotError("the saved cache file is empty")
            if len(start) < 8 or start[:4] != MAGIC:
                raise SnapshotError("the saved cache file is not a Lamplight snapshot")
            (n,) = struct.unpack("<I", start[4:])
            if n > MAX_HEADER:
                raise SnapshotError("the saved cache file has a damaged header")
            raw = fh.read(n)
    except FileNotFoundError as exc:
        raise SnapshotError("there is no saved cache for this conversation") from exc
    except OSError as exc:
        raise SnapshotError(f"the saved cache could not be read ({exc.strerror})") from exc
    try:
        head = json.loads(raw)
        if head["format"] != FORMAT_VERSION:
            raise SnapshotError(
                f"the saved cache has format {head['format']}, not {FORMAT_VERSION}"
            )
        header = SnapshotHeader(
            model=dict(head["model"]),
            runtime=dict(head["runtime"]),
            cache=dict(head["cache"]),
            lora=list(head["lora"]),
            n_tokens=int(head["n_tokens"]),
        )
    except SnapshotError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError("the saved cache file has a damaged header") from exc
    return header, head, 8 + n


def read_snapshot(path: Path, expected: SnapshotHeader) -> KvState:
    """Read and check a snapshot against the current model and settings.

    The file is read once, into one buffer that llama.cpp then reads the
    state from directly (a 14 MB copy costs ~8 ms here; this path makes one).

    Raises:
        SnapshotError: missing, empty, truncated, corrupt or made for something else.
    """
    header, head, offset = read_header(path)
    why = header.mismatch(expected)
    if why:
        raise SnapshotError(why)
    lengths = head.get("lengths")
    if not (
        isinstance(lengths, list)
        and len(lengths) == 4
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lengths)
        and lengths[1] % 4 == 0
        and lengths[3] % 8 == 0
    ):
        raise SnapshotError("the saved cache file has a damaged header")
    expected_size = offset + sum(lengths)
    try:
        with path.open("rb") as fh:
            data = bytearray(expected_size + 1)
            got = fh.readinto(data)
    except OSError as exc:
        raise SnapshotError(f"the saved cache could not be read ({exc.strerror})") from exc
    if got < expected_size:
        raise SnapshotError(
            f"the saved cache file is truncated ({max(got - offset, 0):,} of "
            f"{sum(lengths):,} bytes)"
        )
    if got > expected_size:
        raise SnapshotError("the saved cache file has trailing data (damaged)")
    view = memoryview(data)[offset:expected_size]
    if zlib.crc32(view) != head.get("crc32"):
        raise SnapshotError("the saved cache file is corrupt (checksum mismatch)")
    parts = []
    at = 0
    for n in lengths:
        parts.append(view[at : at + n])
        at += n
    tokens = array("i")
    tokens.frombytes(parts[1])
    marks = array("i")
    marks.frombytes(parts[3])
    try:
        text = bytes(parts[2]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SnapshotError("the saved cache file is inconsistent (text)") from exc
    pairs = list(zip(marks[0::2], marks[1::2], strict=True))
    if len(tokens) != header.n_tokens or any(
        not (0 <= n <= len(tokens) and 0 <= c <= len(text)) for n, c in pairs
    ):
        raise SnapshotError("the saved cache file is inconsistent (token count)")
    return KvState(state=parts[0], tokens=tokens.tolist(), text=text, marks=pairs)
