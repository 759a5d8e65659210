"""The GGUF header walk: every length checked before use, no recursion.

Whatever the bytes, ``walk_header`` returns a ``Header`` or raises ``Malformed``
(with what is wrong, in words) in bounded time and memory; arrays are walked,
not decoded, and arrays of arrays are refused, as llama.cpp refuses them. Only
regular files are opened (``mapped_file``: a FIFO would block the reader).
What llama.cpp needs of the values is checked in ``app.gguf.info``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4

# Header-walk limits: far above any real model, low enough to bound time and memory.
MAX_KV = 1 << 16  # metadata keys (real models: under 100)
MAX_TENSORS = 1 << 16  # real models: a few thousand at most (MoE experts are fused)
MAX_NAME_BYTES = 65535  # one key or tensor name (the GGUF spec's cap for keys)
MAX_ALL_NAMES = 1 << 24  # all keys and tensor names together
MAX_ARRAY_STRINGS = 1 << 24  # strings in all arrays together (vocab + merges: ~1M)
MAX_KEPT_STRING = 1 << 20  # longer string values are walked over, not kept
MAX_KEPT_STRINGS = 1 << 24  # string values kept in all
MAX_KEPT_ARRAY = 1024  # numeric arrays up to this long (per-layer values) are kept
MAX_KEPT_ELEMENTS = 1 << 16  # ... up to this many elements in all

# GGUF value types (gguf.GGUFValueType).
SCALARS = {
    0: struct.Struct("<B"),
    1: struct.Struct("<b"),
    2: struct.Struct("<H"),
    3: struct.Struct("<h"),
    4: struct.Struct("<I"),
    5: struct.Struct("<i"),
    6: struct.Struct("<f"),
    7: struct.Struct("<?"),
    10: struct.Struct("<Q"),
    11: struct.Struct("<q"),
    12: struct.Struct("<d"),
}
UINT32, FLOAT32, BOOL, STRING, ARRAY, FLOAT64 = 4, 6, 7, 8, 9, 12
FLOATS = (FLOAT32, FLOAT64)
INTS = (0, 1, 2, 3, 4, 5, 10, 11)
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")


def shown(text: str, limit: int = 80) -> str:
    """``text`` fit for a one-line message: control characters replaced, long text cut."""
    clean = "".join(
        c if c.isprintable() else "\N{REPLACEMENT CHARACTER}" for c in text[: limit + 1]
    )
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def int_value(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def is_split(header: Header) -> bool:
    """One part of a model split by gguf-split (``split.count`` > 1)."""
    count = header.meta.get("split.count")
    return isinstance(count, int) and count > 1


def is_text(header: Header, key: str) -> bool:
    return header.types.get(key) == STRING


class Malformed(ValueError):
    """The bytes are not a well-formed GGUF header; the message says where."""


class NotRegular(Malformed):
    """A directory, FIFO, socket or device where a file should be."""


class Empty(Malformed):
    def __init__(self) -> None:
        super().__init__("the file is empty")


class NotGguf(Malformed):
    def __init__(self, magic: bytes) -> None:
        self.magic = magic
        super().__init__(f"it starts with {magic!r}, not b'GGUF'")


@dataclass
class Header:
    """A parsed GGUF header: scalar and string values, array spans, tensor infos."""

    size: int
    meta: dict[str, Any] = field(default_factory=dict)  # scalars, strings; "<key>#len"
    types: dict[str, int] = field(default_factory=dict)  # GGUF value type of every key
    arrays: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    # ^ key -> (element type, count, first byte, end byte) of each array
    small_arrays: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    tensors: list[tuple[str, list[int], int, int]] = field(default_factory=list)
    alignment: int = GGUF_DEFAULT_ALIGNMENT
    data_start: int = 0


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _check_regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((what for test, what in _FILE_KINDS if test(mode)), "not a regular file")
        raise NotRegular(kind)


@contextlib.contextmanager
def mapped_file(path: Path) -> Iterator[mmap.mmap]:
    """The file at ``path`` mapped read-only; only regular, non-empty files are opened.

    ``O_NONBLOCK`` keeps a FIFO swapped in after the ``stat`` from blocking the open;
    ``fstat`` then checks what was actually opened.

    Raises:
        OSError, NotRegular, Empty.
    """
    _check_regular(os.stat(path).st_mode)
    flags = os.O_RDONLY
    for extra in ("O_BINARY", "O_NONBLOCK", "O_NOCTTY", "O_CLOEXEC"):
        flags |= getattr(os, extra, 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        _check_regular(st.st_mode)
        if st.st_size == 0:
            raise Empty()
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
            yield buf
    finally:
        os.close(fd)


class _Reader:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def skip(self, n: int, what: str) -> int:
        """Advance over ``n`` bytes; the position they start at."""
        start = self.pos
        if n > self.end - start:
            raise Malformed(f"{what} runs past the end of the file")
        self.pos = start + n
        return start

    def scalar(self, s: struct.Struct, what: str) -> Any:
        return s.unpack_from(self.buf, self.skip(s.size, what))[0]

    def string(self, what: str, limit: int | None = None) -> tuple[int, int]:
        """Walk over a length-prefixed string: (first byte, length)."""
        n = self.scalar(U64, what)
        if limit is not None and n > limit:
            raise Malformed(f"{what} is {n:,} bytes long")
        return self.skip(n, what), n

    def text(self, what: str, limit: int | None = None) -> str:
        start, n = self.string(what, limit)
        return self.buf[start : start + n].decode("utf-8", errors="replace")


def walk_header(buf: mmap.mmap) -> Header:
    """Walk a GGUF header: every length checked before use, no recursion.

    Raises:
        Malformed: with what is wrong, in words.
    """
    magic = buf[:4]
    if magic != GGUF_MAGIC:
        raise NotGguf(magic)
    r = _Reader(buf)
    r.pos = 4
    h = Header(size=len(buf))
    version = r.scalar(U32, "the version")
    if version not in (2, 3):
        raise Malformed(f"unsupported GGUF version {version}")
    n_tensors = r.scalar(U64, "the tensor count")
    n_kv = r.scalar(U64, "the key count")
    left = r.end - r.pos
    # The smallest key/value is 13 bytes, the smallest tensor info 24.
    if n_kv > MAX_KV or n_kv * 13 > left:
        raise Malformed(f"it claims {n_kv:,} metadata keys")
    if n_tensors > MAX_TENSORS or n_tensors * 24 > left:
        raise Malformed(f"it claims {n_tensors:,} tensors")

    names = _Budget(MAX_ALL_NAMES, "its keys and tensor names")
    kept = _Kept()
    for index in range(n_kv):
        key = r.text(f"metadata key #{index}", MAX_NAME_BYTES)
        names.spend(len(key))
        if key in h.types:
            raise Malformed(f"the key {shown(key)} appears twice")
        _read_value(r, h, key, kept)

    alignment = h.meta.get("general.alignment")
    if isinstance(alignment, int) and 0 < alignment <= 1 << 30:
        h.alignment = alignment  # read_gguf_info and lora.py check it is valid

    for index in range(n_tensors):
        name = r.text(f"tensor name #{index}", MAX_NAME_BYTES)
        names.spend(len(name))
        n_dims = r.scalar(U32, f"the shape of {shown(name)}")
        if n_dims > GGML_MAX_DIMS:
            raise Malformed(f"tensor {shown(name)} has {n_dims:,} dimensions")
        start = r.skip(8 * n_dims, f"the shape of {shown(name)}")
        dims = list(struct.unpack_from(f"<{n_dims}Q", buf, start))
        ttype = r.scalar(U32, f"the type of {shown(name)}")
        offset = r.scalar(U64, f"the offset of {shown(name)}")
        h.tensors.append((name, dims, ttype, offset))
    h.data_start = -(-r.pos // h.alignment) * h.alignment
    return h


@dataclass
class _Kept:
    """What the walk has kept of string and array values so far (against their caps)."""

    array_strings: int = 0
    string_bytes: int = 0
    elements: int = 0


def _read_value(r: _Reader, h: Header, key: str, kept: _Kept) -> None:
    """Read the type and value of ``key`` into ``h``: scalars and short strings and
    numeric arrays kept, longer ones and string arrays walked over.

    Raises:
        Malformed: an unknown type, an array of arrays, a length past the end or a cap.
    """
    what = shown(key)
    buf = r.buf
    vtype = r.scalar(U32, f"the type of {what}")
    h.types[key] = vtype
    if vtype in SCALARS:
        h.meta[key] = r.scalar(SCALARS[vtype], what)
        return
    if vtype == STRING:
        start, n = r.string(what)
        if n <= MAX_KEPT_STRING and kept.string_bytes + n <= MAX_KEPT_STRINGS:
            kept.string_bytes += n
            h.meta[key] = buf[start : start + n].decode("utf-8", errors="replace")
        return
    if vtype != ARRAY:
        raise Malformed(f"{what} has unknown value type {vtype}")
    itype = r.scalar(U32, what)
    count = r.scalar(U64, what)
    start = r.pos
    if itype in SCALARS:
        s = SCALARS[itype]
        if count > (r.end - r.pos) // s.size:
            raise Malformed(f"the array {what} runs past the end of the file")
        r.skip(count * s.size, what)
        if count <= MAX_KEPT_ARRAY and kept.elements + count <= MAX_KEPT_ELEMENTS:
            kept.elements += count
            h.small_arrays[key] = tuple(v for (v,) in s.iter_unpack(buf[start : r.pos]))
    elif itype == STRING:
        if count > (r.end - r.pos) // 8 or kept.array_strings + count > MAX_ARRAY_STRINGS:
            raise Malformed(f"the array {what} claims {count:,} strings")
        kept.array_strings += count
        r.pos = _skip_strings(buf, r.pos, count, what)
    elif itype == ARRAY:
        raise Malformed(f"{what} is an array of arrays, which llama.cpp does not read")
    else:
        raise Malformed(f"the array {what} has unknown element type {itype}")
    h.meta[key + "#len"] = count
    h.arrays[key] = (itype, count, start, r.pos)


class _Budget:
    """A running total that refuses to pass a cap."""

    def __init__(self, cap: int, what: str) -> None:
        self.left = cap
        self.what = what

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise Malformed(f"{self.what} are implausibly long")


def _skip_strings(buf: mmap.mmap, pos: int, count: int, what: str) -> int:
    """The end of ``count`` length-prefixed strings starting at ``pos``."""
    end = len(buf)
    unpack = U64.unpack_from
    for _ in range(count):
        if pos + 8 > end:
            break
        pos += 8 + unpack(buf, pos)[0]
        if pos > end:
            break
    else:
        return pos
    raise Malformed(f"the array {what} runs past the end of the file")


def parse_header(
    path: Path, types: dict[str, int] | None = None
) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]:
    """Key/values (arrays as ``<key>#len``), tensor infos and the data offset of a GGUF file.

    ``gguf.GGUFReader`` decodes every array element into numpy objects, which
    takes 12 s for a 262k-token vocabulary; this walks over arrays.

    Raises:
        ValueError: not a well-formed GGUF file (never a bare struct or overflow error).
        OSError: the file cannot be read.
    """
    with mapped_file(Path(path)) as buf:
        h = walk_header(buf)
    if types is not None:
        types.update(h.types)
    return h.meta, h.tensors, h.data_start
