"""KV snapshot files: llama.cpp's sequence state plus the tokens and text it covers.

Layout (little-endian)::

    b"LPKV" | u32 header length | header (UTF-8 JSON) | payload

The payload is the sequence state, then the token ids (int32), the text
(UTF-8) and the token/text marks (int32 pairs), and for a recurrent or hybrid model
its checkpoints (the header indexes them: token count and length each); the header
gives each part's length, what the state depends on (model fingerprint, llama.cpp version,
context settings, LoRA stack, and the vision projector's fingerprint when the cache
holds pictures), the draft model loaded when it was made (a record
only: see ``SnapshotHeader.mismatch``) and a CRC-32 of the payload. No logits are
stored, so the size follows the KV cache. Files are written atomically.

What a restore can vouch for: the checksum says the file is as some writer left it,
not that it is what this app saved (anyone can rewrite a file with a matching sum).
So the state is checked again as it is loaded (``app.engine.local.kv_state``): each KV
cache's cells must sit at the last positions of the n saved tokens, once each (all n
of them; the last window at least for a sliding-window cache), and llama.cpp's own
reading checks the layer count, types and row sizes. A state
that fails is refused with a note; the transcript is read again. What no check can
see: altered key or value numbers, cells whose positions were swapped with each
other (the rows are stored in no fixed order: a context shift reorders them), and
token ids changed together with the state. Such a file gives a reply that differs
from a fresh read; only a new read of the transcript (a new chat, an edit before
the altered part) puts it right.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import struct
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from app.config.field_spec import short_repr
from app.engine.backend import DraftInfo, KvState
from app.engine.image_part import IMAGE_ID_MIN, image_token_id, split_markers
from app.util.atomic import atomic_write_bytes
from app.util.datafiles import DataFileError, open_regular, os_reason, parse_json
from app.util.errors import LamplightError
from app.util.sysinfo import physical_memory, size_text

MAGIC = b"LPKV"
FORMAT_VERSION = 1
MAX_HEADER = 1 << 20
HEADER_DEPTH = 4  # {"lora": [{...}]} is 3 levels
MAX_LORA = 64
MAX_TOKENS = 2**31 - 1
MAX_CHECKPOINTS = 64  # a recurrent state's checkpoints in one file
SCALARS = (str, int, float, bool, type(None))


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
    draft: dict[str, Any] = field(default_factory=dict)  # ``draft_record``; {} for none
    # The projector that read the cache's pictures ({"name", "size", "sha256"}); {} when
    # it holds none, so a cache of text restores whatever projector is loaded.
    projector: dict[str, Any] = field(default_factory=dict)

    def mismatch(self, current: SnapshotHeader) -> str:
        """Why this snapshot does not fit ``current`` (empty when it does).

        ``draft`` is not compared: the target's cache holds the target's own keys and
        values for the accepted tokens whatever proposed them (a draft only changes how
        many tokens each batch verifies), and the draft model keeps its own small cache,
        which it rebuilds from the target's tokens. A cache saved with one draft, or
        none, continues exactly under another.
        """
        if self.model.get("sha256") != current.model.get("sha256"):
            return f"it was saved with another model ({self.model.get('name', 'unknown')})"
        if self.runtime != current.runtime:
            then, now = (
                ", ".join(map(str, r.values())) or "unknown"
                for r in (self.runtime, current.runtime)
            )
            return f"it was saved by another llama.cpp version ({then} vs {now})"
        for key in sorted(set(self.cache) | set(current.cache)):
            if self.cache.get(key) != current.cache.get(key):
                return (
                    f"the cache setting {key} changed "
                    f"({self.cache.get(key)} then, {current.cache.get(key)} now)"
                )
        if self.lora != current.lora:
            return "the LoRA adapters changed"
        if self.projector and self.projector.get("sha256") != current.projector.get("sha256"):
            name = short_repr(self.projector.get("name", "unknown"))
            if not current.projector:
                return f"its pictures were read by the vision projector {name}, not loaded now"
            return f"its pictures were read by another vision projector, {name}"
        return ""


def draft_record(info: DraftInfo | None) -> dict[str, Any]:
    """What a snapshot header records of the draft model loaded beside the target."""
    if info is None:
        return {}
    return {"name": info.name, "path": str(info.path), "n_params": info.n_params}


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
    if kv.checkpoints:  # a fifth part: a recurrent state's checkpoints, one after another
        parts.append(b"".join(data for _n, data in kv.checkpoints))
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    head = {
        "format": FORMAT_VERSION,
        "model": header.model,
        "runtime": header.runtime,
        "cache": header.cache,
        "lora": header.lora,
        "draft": header.draft,
        "projector": header.projector,
        "n_tokens": len(kv.tokens),
        "lengths": [len(p) for p in parts],
        "crc32": crc,
    }
    if kv.checkpoints:
        head["checkpoints"] = [[n, len(data)] for n, data in kv.checkpoints]
    head_bytes = json.dumps(head, sort_keys=True).encode("utf-8")
    blob = b"".join([MAGIC, struct.pack("<I", len(head_bytes)), head_bytes, *parts])
    atomic_write_bytes(path, blob)
    return len(blob)


def read_header(path: Path) -> tuple[SnapshotHeader, dict[str, Any], int]:
    """The header of a snapshot file, its raw JSON and where the payload starts.

    Every field is checked for its type and range here, so nothing after this
    meets a list where it expects a number (see ``_checked_header``).

    Raises:
        SnapshotError: missing, not a regular file, unreadable, or a damaged header.
    """
    with _open(path) as (fh, size):
        start = _read(fh, 8)
        if len(start) == 0:
            raise SnapshotError("the saved cache file is empty")
        if len(start) < 8 or start[:4] != MAGIC:
            raise SnapshotError("the saved cache file is not a Lamplight snapshot")
        (n,) = struct.unpack("<I", start[4:])
        if n > MAX_HEADER or 8 + n > size:
            raise SnapshotError("the saved cache file has a damaged header (length)")
        raw = _read(fh, n)
    try:
        head = parse_json(raw, HEADER_DEPTH)
    except DataFileError as exc:
        raise SnapshotError(f"the saved cache file has a damaged header (it {exc})") from exc
    return _checked_header(head), head, 8 + n


def _checked_header(head: Any) -> SnapshotHeader:
    """The header of a parsed JSON object, every field checked.

    Raises:
        SnapshotError: a field is missing, of the wrong type or out of range.
    """
    if not isinstance(head, dict):
        raise _damaged("not an object")
    if head.get("format") != FORMAT_VERSION:
        raise SnapshotError(
            f"the saved cache has format {short_repr(head.get('format'))}, not {FORMAT_VERSION}"
        )
    for key in ("model", "runtime", "cache"):
        if not _is_flat(head.get(key)):
            raise _damaged(key)
    lora = head.get("lora")
    if not (isinstance(lora, list) and len(lora) <= MAX_LORA and all(map(is_lora, lora))):
        raise _damaged("lora")
    n_tokens = head.get("n_tokens")
    if not (_is_int(n_tokens) and 0 <= n_tokens <= MAX_TOKENS):
        raise _damaged("n_tokens")
    lengths = head.get("lengths")
    if not (
        isinstance(lengths, list)
        and len(lengths) in (4, 5)
        and all(_is_int(n) and 0 <= n < 2**63 for n in lengths)
        and lengths[1] == 4 * n_tokens
        and lengths[3] % 8 == 0
    ):
        raise _damaged("lengths")
    if len(lengths) == 5 and not _checkpoint_index(head.get("checkpoints"), n_tokens, lengths[4]):
        raise _damaged("checkpoints")
    if not (_is_int(head.get("crc32")) and 0 <= head["crc32"] < 2**32):
        raise _damaged("crc32")
    draft = head.get("draft", {})  # absent in files from before drafting with a model
    if not _is_flat(draft):
        raise _damaged("draft")
    projector = head.get("projector", {})  # absent in files from before it was recorded
    if not (_is_flat(projector) and isinstance(projector.get("sha256", ""), str)):
        raise _damaged("projector")
    return SnapshotHeader(
        model=dict(head["model"]),
        runtime=dict(head["runtime"]),
        cache=dict(head["cache"]),
        lora=[dict(entry) for entry in lora],
        n_tokens=n_tokens,
        draft=dict(draft),
        projector=dict(projector),
    )


def read_snapshot(path: Path, expected: SnapshotHeader, max_bytes: int | None = None) -> KvState:
    """Read and check a snapshot against the current model and settings.

    The file is read once, into one buffer that llama.cpp then reads the
    state from directly (a 14 MB copy costs ~8 ms here; this path makes one).
    Its size is checked against the header's part lengths and ``max_bytes``
    (default: half the RAM) before anything is allocated.

    Raises:
        SnapshotError: missing, empty, truncated, corrupt or made for something else.
    """
    header, head, offset = read_header(path)
    why = header.mismatch(expected)
    if why:
        raise SnapshotError(why)
    lengths: list[int] = head["lengths"]
    payload = sum(lengths)
    expected_size = offset + payload
    limit = max_bytes if max_bytes is not None else (physical_memory() // 2 or 1 << 34)
    with _open(path) as (fh, size):
        if size < expected_size:
            raise SnapshotError(
                f"the saved cache file is truncated ({max(size - offset, 0):,} of "
                f"{payload:,} bytes)"
            )
        if size > expected_size:
            raise SnapshotError("the saved cache file has trailing data (damaged)")
        if size > limit:
            raise SnapshotError(
                f"the saved cache is too large to load ({size_text(size)}; "
                f"the limit is {size_text(limit)})"
            )
        data = bytearray(expected_size + 1)
        try:
            got = fh.readinto(data)
        except OSError as exc:
            raise SnapshotError(f"the saved cache could not be read ({os_reason(exc)})") from exc
    if got != expected_size:  # it changed while we read
        raise SnapshotError("the saved cache file changed while it was read")
    view = memoryview(data)[offset:expected_size]
    if zlib.crc32(view) != head["crc32"]:
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
    if (
        len(tokens) != header.n_tokens
        or (tokens and min(tokens) < IMAGE_ID_MIN)
        or any(not (0 <= n <= len(tokens) and 0 <= c <= len(text)) for n, c in pairs)
    ):
        raise SnapshotError("the saved cache file is inconsistent (token count)")
    if tokens and min(tokens) < 0 and not _images_named(tokens, text):
        raise SnapshotError("the saved cache file is inconsistent (images)")
    if tokens and min(tokens) < 0 and not header.projector.get("sha256"):
        # Saved before projectors were recorded (or the record was cut out): which
        # projector read its pictures cannot be told, so it is read again.
        raise SnapshotError("it holds pictures but does not say which vision projector read them")
    saved: list[tuple[int, bytes]] = []
    if len(parts) == 5:  # checked against the header's index (``_checkpoint_index``)
        at = 0
        for n, size in head["checkpoints"]:
            saved.append((n, bytes(parts[4][at : at + size])))
            at += size
    return KvState(
        state=parts[0], tokens=tokens.tolist(), text=text, marks=pairs, checkpoints=tuple(saved)
    )


def _checkpoint_index(index: Any, n_tokens: int, total: int) -> bool:
    """Whether ``index`` lists checkpoints as [token count, length] pairs: at most
    ``MAX_CHECKPOINTS``, at increasing counts within the tokens, their lengths adding up
    to ``total`` (the payload's fifth part)."""
    if not (isinstance(index, list) and 0 < len(index) <= MAX_CHECKPOINTS):
        return False
    pairs = [e for e in index if isinstance(e, list) and len(e) == 2 and all(map(_is_int, e))]
    counts = [n for n, _size in pairs]
    return (
        len(pairs) == len(index)
        and all(0 < n <= n_tokens and size > 0 for n, size in pairs)
        and counts == sorted(set(counts))
        and sum(size for _n, size in pairs) == total
    )


def _images_named(tokens: array[int], text: str) -> bool:
    """Every negative id in ``tokens`` is the pseudo-token of an image ``text`` shows."""
    shown = {image_token_id(d) for is_image, d in split_markers(text) if is_image}
    return {t for t in tokens if t < 0} <= shown


@contextlib.contextmanager
def _open(path: Path) -> Iterator[tuple[io.BufferedReader, int]]:
    """``path`` open for reading, with its size; a pipe or device is refused unread."""
    try:
        fd, size = open_regular(path)
    except FileNotFoundError as exc:
        raise SnapshotError("there is no saved cache for this conversation") from exc
    except DataFileError as exc:
        raise SnapshotError(f"the saved cache file {exc}") from exc
    with os.fdopen(fd, "rb") as fh:
        yield fh, size


def _read(fh: io.BufferedReader, n: int) -> bytes:
    try:
        return fh.read(n)
    except OSError as exc:
        raise SnapshotError(f"the saved cache could not be read ({os_reason(exc)})") from exc


def _damaged(what: str) -> SnapshotError:
    return SnapshotError(f"the saved cache file has a damaged header ({what})")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_flat(value: object) -> bool:
    """An object of short keys and scalar values (what model, runtime and cache hold)."""
    return isinstance(value, dict) and all(
        len(k) <= 100 and isinstance(v, SCALARS) and (not isinstance(v, str) or len(v) <= 4096)
        for k, v in value.items()
    )


def is_lora(entry: object) -> bool:
    """A LoRA stack entry as ``LoraStack.signature`` writes it."""
    if not _is_flat(entry):
        return False
    assert isinstance(entry, dict)
    path, scale = entry.get("path"), entry.get("scale")
    return (
        isinstance(path, str)
        and len(path) > 0
        and "\0" not in path
        and isinstance(scale, int | float)
        and not isinstance(scale, bool)
        and math.isfinite(scale)
        and isinstance(entry.get("enabled", True), bool)
        and isinstance(entry.get("sha256"), str | None)
        and isinstance(entry.get("name", ""), str)
        and (entry.get("size") is None or _is_int(entry.get("size")))
    )
