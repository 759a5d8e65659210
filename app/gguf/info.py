"""Read a GGUF file's header, and refuse the files llama.cpp would crash on.

Model files are untrusted: anything in the models folder can be named ``*.gguf``.
The header walk is total: whatever the bytes, :func:`read_gguf_info` returns a
:class:`GgufInfo` or raises :class:`~app.util.errors.ModelFileError` with a
one-line reason, in bounded time and memory. No length read from the file is
used before it is checked against the bytes that remain and a sane cap; arrays
are walked without recursion, and arrays of arrays are refused, as llama.cpp
refuses them. Only regular files are opened (a FIFO would block the reader).

llama.cpp trusts some header values and ends the whole process on a bad one
(``GGML_ASSERT``, ``std::bad_alloc``, a segfault in a compute kernel) or hangs.
:func:`read_gguf_info` checks those before llama.cpp sees the file. Each rule
below was found by loading mutated copies of the default model in a child
process; ``docs/notes/gguf.md`` lists what aborted and how.
"""

from __future__ import annotations

import contextlib
import errno
import math
import mmap
import os
import re
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.util.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # gguf.cpp refuses tensor names this long or longer
TENSOR_ALIGNMENT = 32  # ggml-backend asserts a mapped weight buffer starts on this
LLAMA_MAX_LAYERS = 512  # llama.cpp asserts 0 < block_count <= this
INT64_MAX = (1 << 63) - 1

# What a real model can plausibly declare. The largest published context is 10M
# tokens (Llama 4 Scout); llama-cpp-python allocates context_length tokens for
# every tokenize call, so a 2^30 context is a MemoryError and 2^31 wraps negative.
MAX_CONTEXT = 1 << 24
MAX_WIDTH = 1 << 20  # embedding, feed-forward and head sizes
MAX_HEADS = 1 << 16

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
MAX_VOCAB = 1 << 21  # llama.cpp's token ids are int32; real vocabularies: up to 262k

# GGUF value types (gguf.GGUFValueType).
_SCALARS = {
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
_UINT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _FLOAT64 = 4, 6, 7, 8, 9, 12
_FLOATS = (_FLOAT32, _FLOAT64)
_INTS = (0, 1, 2, 3, 4, 5, 10, 11)
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# ggml types with no matrix-multiply or row-lookup kernel on the CPU: llama.cpp loads
# a weight of one of these and then segfaults or aborts at the first token.
_NO_KERNEL_TYPES = {9: "Q8_1", 15: "Q8_K", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64"}
_LAYER = re.compile(r"blk\.(\d+)\.")
_ROPE_SCALING = ("none", "linear", "yarn", "longrope")


@dataclass(frozen=True)
class GgufInfo:
    """What a GGUF file says about itself."""

    path: Path
    file_size: int
    architecture: str
    name: str
    context_length: int | None
    chat_template: str | None
    n_params: int
    n_layers: int | None
    file_type: str | None
    general_type: str | None
    n_embd_k_gqa: int | None = None  # K values per token per layer
    n_embd_v_gqa: int | None = None
    n_vocab: int | None = None
    adapter_type: str | None = None  # "lora" for LoRA adapters

    @property
    def display_name(self) -> str:
        return self.name or self.path.stem


def read_gguf_info(path: str | Path) -> GgufInfo:
    """Check that ``path`` is a complete GGUF file llama.cpp can load, and read it.

    Raises:
        ModelFileError: with a one-line reason a person can act on.
    """
    p = Path(path)
    name = shown(p.name)
    try:
        with _mapped(p) as buf:
            header = _parse(buf)
            n_params = _check_tensors(name, header)
            _check_model(name, header, buf)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise ModelFileError(f"Model file not found: {shown(str(p))}") from exc
    except PermissionError as exc:
        raise ModelFileError(f"{name} cannot be read: permission denied.") from exc
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise ModelFileError(f"The path of {name} is too long for the file system.") from exc
        reason = shown(exc.strerror or str(exc))
        raise ModelFileError(f"{name} cannot be read: {reason}.") from exc
    except _NotRegular as exc:
        raise ModelFileError(f"Not a file: {shown(str(p))} is {exc}.") from exc
    except _Empty as exc:
        raise ModelFileError(f"{name} is empty (0 bytes); an interrupted download?") from exc
    except _NotGguf as exc:
        raise ModelFileError(
            f"{name} is not a GGUF model file (it starts with {exc.magic!r}, not b'GGUF')."
        ) from exc
    except _Malformed as exc:
        raise ModelFileError(f"{name} is a damaged GGUF file: {exc}.") from exc
    except (ValueError, OverflowError, MemoryError, RecursionError, struct.error) as exc:
        # Not reached by any input the tests found; kept so a missed case is still a
        # refusal. tests/test_hostile_gguf.py fails if this message ever appears.
        raise ModelFileError(
            f"{name} is a damaged GGUF file (unexpected {type(exc).__name__})."
        ) from exc
    return _info(p, header, n_params)


def _info(p: Path, header: _Header, n_params: int) -> GgufInfo:
    meta = header.meta
    arch = str(meta["general.architecture"])
    ctx = _int(meta.get(f"{arch}.context_length"))
    layers = _int(meta.get(f"{arch}.block_count"))
    ftype = _int(meta.get("general.file_type"))
    template = meta.get("tokenizer.chat_template")
    n_embd = _int(meta.get(f"{arch}.embedding_length"))
    n_head = _int(meta.get(f"{arch}.attention.head_count"))
    n_head_kv = _int(meta.get(f"{arch}.attention.head_count_kv")) or n_head
    head_dim = n_embd // n_head if n_embd and n_head else None
    key_len = _int(meta.get(f"{arch}.attention.key_length")) or head_dim
    value_len = _int(meta.get(f"{arch}.attention.value_length")) or head_dim
    general_type = meta.get("general.type")
    adapter_type = meta.get("adapter.type")
    return GgufInfo(
        path=p,
        file_size=header.size,
        architecture=arch,
        name=str(meta.get("general.name") or "") if _is_text(header, "general.name") else "",
        context_length=ctx,
        chat_template=str(template) if isinstance(template, str) and template.strip() else None,
        n_params=n_params,
        n_layers=layers,
        file_type=_file_type_name(ftype) if ftype is not None else None,
        general_type=general_type if isinstance(general_type, str) else None,
        n_embd_k_gqa=key_len * n_head_kv if key_len and n_head_kv else None,
        n_embd_v_gqa=value_len * n_head_kv if value_len and n_head_kv else None,
        n_vocab=_int(meta.get("tokenizer.ggml.tokens#len")),
        adapter_type=adapter_type if isinstance(adapter_type, str) else None,
    )


def shown(text: str, limit: int = 80) -> str:
    """``text`` fit for a one-line message: control characters replaced, long text cut."""
    clean = "".join(
        c if c.isprintable() else "\N{REPLACEMENT CHARACTER}" for c in text[: limit + 1]
    )
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _is_split(header: _Header) -> bool:
    """One part of a model split by gguf-split (``split.count`` > 1)."""
    count = header.meta.get("split.count")
    return isinstance(count, int) and count > 1


def _is_text(header: _Header, key: str) -> bool:
    return header.types.get(key) == _STRING


# ---------------------------------------------------------------------------------
# The header walk


class _Malformed(ValueError):
    """The bytes are not a well-formed GGUF header; the message says where."""


class _NotRegular(_Malformed):
    """A directory, FIFO, socket or device where a file should be."""


class _Empty(_Malformed):
    def __init__(self) -> None:
        super().__init__("the file is empty")


class _NotGguf(_Malformed):
    def __init__(self, magic: bytes) -> None:
        self.magic = magic
        super().__init__(f"it starts with {magic!r}, not b'GGUF'")


@dataclass
class _Header:
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
        raise _NotRegular(kind)


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap]:
    """The file at ``path`` mapped read-only; only regular, non-empty files are opened.

    ``O_NONBLOCK`` keeps a FIFO swapped in after the ``stat`` from blocking the open;
    ``fstat`` then checks what was actually opened.

    Raises:
        OSError, _NotRegular, _Empty.
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
            raise _Empty()
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
            raise _Malformed(f"{what} runs past the end of the file")
        self.pos = start + n
        return start

    def scalar(self, s: struct.Struct, what: str) -> Any:
        return s.unpack_from(self.buf, self.skip(s.size, what))[0]

    def string(self, what: str, limit: int | None = None) -> tuple[int, int]:
        """Walk over a length-prefixed string: (first byte, length)."""
        n = self.scalar(_U64, what)
        if limit is not None and n > limit:
            raise _Malformed(f"{what} is {n:,} bytes long")
        return self.skip(n, what), n

    def text(self, what: str, limit: int | None = None) -> str:
        start, n = self.string(what, limit)
        return self.buf[start : start + n].decode("utf-8", errors="replace")


def _parse(buf: mmap.mmap) -> _Header:
    """Walk a GGUF header: every length checked before use, no recursion.

    Raises:
        _Malformed: with what is wrong, in words.
    """
    magic = buf[:4]
    if magic != GGUF_MAGIC:
        raise _NotGguf(magic)
    r = _Reader(buf)
    r.pos = 4
    h = _Header(size=len(buf))
    version = r.scalar(_U32, "the version")
    if version not in (2, 3):
        raise _Malformed(f"unsupported GGUF version {version}")
    n_tensors = r.scalar(_U64, "the tensor count")
    n_kv = r.scalar(_U64, "the key count")
    left = r.end - r.pos
    # The smallest key/value is 13 bytes, the smallest tensor info 24.
    if n_kv > MAX_KV or n_kv * 13 > left:
        raise _Malformed(f"it claims {n_kv:,} metadata keys")
    if n_tensors > MAX_TENSORS or n_tensors * 24 > left:
        raise _Malformed(f"it claims {n_tensors:,} tensors")

    strings = kept_bytes = kept_elements = 0
    names = _Budget(MAX_ALL_NAMES, "its keys and tensor names")
    for index in range(n_kv):
        key = r.text(f"metadata key #{index}", MAX_NAME_BYTES)
        names.spend(len(key))
        what = shown(key)
        if key in h.types:
            raise _Malformed(f"the key {what} appears twice")
        vtype = r.scalar(_U32, f"the type of {what}")
        h.types[key] = vtype
        if vtype in _SCALARS:
            h.meta[key] = r.scalar(_SCALARS[vtype], what)
        elif vtype == _STRING:
            start, n = r.string(what)
            if n <= MAX_KEPT_STRING and kept_bytes + n <= MAX_KEPT_STRINGS:
                kept_bytes += n
                h.meta[key] = buf[start : start + n].decode("utf-8", errors="replace")
        elif vtype == _ARRAY:
            itype = r.scalar(_U32, what)
            count = r.scalar(_U64, what)
            start = r.pos
            if itype in _SCALARS:
                s = _SCALARS[itype]
                if count > (r.end - r.pos) // s.size:
                    raise _Malformed(f"the array {what} runs past the end of the file")
                r.skip(count * s.size, what)
                if count <= MAX_KEPT_ARRAY and kept_elements + count <= MAX_KEPT_ELEMENTS:
                    kept_elements += count
                    h.small_arrays[key] = tuple(v for (v,) in s.iter_unpack(buf[start : r.pos]))
            elif itype == _STRING:
                if count > (r.end - r.pos) // 8 or strings + count > MAX_ARRAY_STRINGS:
                    raise _Malformed(f"the array {what} claims {count:,} strings")
                strings += count
                r.pos = _skip_strings(buf, r.pos, count, what)
            elif itype == _ARRAY:
                raise _Malformed(f"{what} is an array of arrays, which llama.cpp does not read")
            else:
                raise _Malformed(f"the array {what} has unknown element type {itype}")
            h.meta[key + "#len"] = count
            h.arrays[key] = (itype, count, start, r.pos)
        else:
            raise _Malformed(f"{what} has unknown value type {vtype}")

    alignment = h.meta.get("general.alignment")
    if isinstance(alignment, int) and 0 < alignment <= 1 << 30:
        h.alignment = alignment  # read_gguf_info and lora.py check it is valid

    for index in range(n_tensors):
        name = r.text(f"tensor name #{index}", MAX_NAME_BYTES)
        names.spend(len(name))
        n_dims = r.scalar(_U32, f"the shape of {shown(name)}")
        if n_dims > GGML_MAX_DIMS:
            raise _Malformed(f"tensor {shown(name)} has {n_dims:,} dimensions")
        start = r.skip(8 * n_dims, f"the shape of {shown(name)}")
        dims = list(struct.unpack_from(f"<{n_dims}Q", buf, start))
        ttype = r.scalar(_U32, f"the type of {shown(name)}")
        offset = r.scalar(_U64, f"the offset of {shown(name)}")
        h.tensors.append((name, dims, ttype, offset))
    h.data_start = -(-r.pos // h.alignment) * h.alignment
    return h


class _Budget:
    """A running total that refuses to pass a cap."""

    def __init__(self, cap: int, what: str) -> None:
        self.left = cap
        self.what = what

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _Malformed(f"{self.what} are implausibly long")


def _skip_strings(buf: mmap.mmap, pos: int, count: int, what: str) -> int:
    """The end of ``count`` length-prefixed strings starting at ``pos``."""
    end = len(buf)
    unpack = _U64.unpack_from
    for _ in range(count):
        if pos + 8 > end:
            break
        pos += 8 + unpack(buf, pos)[0]
        if pos > end:
            break
    else:
        return pos
    raise _Malformed(f"the array {what} runs past the end of the file")


def _parse_header(
    path: Path, types: dict[str, int] | None = None
) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]:
    """Key/values (arrays as ``<key>#len``), tensor infos and the data offset of a GGUF file.

    ``gguf.GGUFReader`` decodes every array element into numpy objects, which
    takes 12 s for a 262k-token vocabulary; this walks over arrays.

    Raises:
        ValueError: not a well-formed GGUF file (never a bare struct or overflow error).
        OSError: the file cannot be read.
    """
    with _mapped(Path(path)) as buf:
        h = _parse(buf)
    if types is not None:
        types.update(h.types)
    return h.meta, h.tensors, h.data_start


# ---------------------------------------------------------------------------------
# What llama.cpp does not check


def _check_tensors(name: str, h: _Header) -> int:
    """gguf.cpp's tensor-table rules, and the types llama.cpp has kernels for.

    Returns:
        The number of parameters.

    Raises:
        ModelFileError, _Malformed.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if "general.alignment" in h.types:
        a = h.meta.get("general.alignment")
        if h.types["general.alignment"] != _UINT32 or not isinstance(a, int) or a <= 0:
            raise _Malformed("general.alignment is not a 32-bit unsigned integer")
        if a & (a - 1):
            raise _Malformed(f"its alignment {a} is not a power of two")
    if h.tensors and h.data_start % TENSOR_ALIGNMENT:
        raise _Malformed(
            f"its tensor data starts at byte {h.data_start:,}, which llama.cpp cannot map "
            f"(it needs a multiple of {TENSOR_ALIGNMENT})"
        )
    seen: set[str] = set()
    expected = 0
    data_end = h.data_start
    n_params = 0
    for tname, dims, ttype, offset in h.tensors:
        what = shown(tname)
        if len(tname.encode("utf-8")) >= GGML_MAX_NAME:
            raise _Malformed(f"the tensor name {what} is too long")
        if tname in seen:
            raise _Malformed(f"the tensor {what} appears twice")
        seen.add(tname)
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError) as exc:
            raise ModelFileError(f"{name} uses an unknown tensor type {ttype}.") from exc
        n = math.prod(dims)
        if any(d < 1 for d in dims) or n > INT64_MAX:
            raise _Malformed(f"tensor {what} has shape {dims}")
        if dims and dims[0] % block:
            raise _Malformed(f"tensor {what} has rows of {dims[0]}, not whole blocks of its type")
        if offset != expected:
            raise _Malformed(f"tensor {what} is not where the tensor table says")
        nbytes = n // block * type_size
        expected += -(-nbytes // h.alignment) * h.alignment
        data_end = max(data_end, h.data_start + offset + nbytes)
        n_params += n
    if data_end > h.size:
        raise ModelFileError(
            f"{name} is truncated: its tensors need {data_end:,} bytes but the file has "
            f"{h.size:,}. Download it again."
        )
    # gguf-split --no-tensor-first-split leaves the first part without tensors.
    if not h.tensors and not _is_split(h):
        raise ModelFileError(f"{name} holds no tensors; it is not a usable model.")
    return n_params


_Value = Callable[[str], "int | None"]  # an integer hyperparameter by key suffix
_Refuse = Callable[[str], ModelFileError]


def _check_model(name: str, h: _Header, buf: mmap.mmap) -> None:
    """Refuse the header values that make llama.cpp abort, crash or hang.

    Raises:
        ModelFileError: naming the value and what it should be.
    """
    meta, types = h.meta, h.types
    arch = meta.get("general.architecture")
    if types.get("general.architecture") != _STRING or not arch:
        raise ModelFileError(f"{name} does not name its architecture (general.architecture).")
    # An adapter changes some layers; one part of a split model holds some of them.
    partial = meta.get("general.type") == "adapter" or _is_split(h)

    def value(suffix: str) -> int | None:
        key = f"{arch}.{suffix}"
        return _int(meta.get(key)) if types.get(key) in _INTS else None

    def refuse(reason: str) -> ModelFileError:
        return ModelFileError(f"{name} cannot be loaded: {reason}.")

    # Tensors: types llama.cpp computes with.
    for tname, dims, ttype, _offset in h.tensors:
        vector = len(dims) <= 1 or tname.endswith("_norm.weight")
        if vector and ttype != 0:
            # ggml's CPU kernels take norm weights and biases in F32 only (GGML_ASSERT).
            raise refuse(f"the vector {shown(tname)} is not stored as F32")
        if not vector and ttype in _NO_KERNEL_TYPES:
            raise refuse(
                f"the weight {shown(tname)} is stored as {_NO_KERNEL_TYPES[ttype]}, "
                "which llama.cpp cannot multiply"
            )

    # Layers: llama.cpp asserts 0 < block_count <= 512.
    layers = value("block_count")
    if layers is not None:
        if not 0 < layers <= LLAMA_MAX_LAYERS:
            raise refuse(
                f"its header says {layers:,} layers; llama.cpp takes 1 to {LLAMA_MAX_LAYERS}"
            )
        nextn = value("nextn_predict_layers") or 0
        if nextn > layers:
            raise refuse(f"it predicts with {nextn} extra layers but has only {layers}")
        held = {int(m.group(1)) for t, *_ in h.tensors if (m := _LAYER.match(t))}
        if held and not partial and max(held) + 1 not in (layers, layers - nextn):
            raise refuse(f"its header says {layers:,} layers but it holds {max(held) + 1}")

    # Sizes llama.cpp allocates from.
    context = value("context_length")
    if context is not None and not 0 < context <= MAX_CONTEXT:
        raise refuse(f"its context length {context:,} is not between 1 and {MAX_CONTEXT:,}")
    window = value("attention.sliding_window")
    if window is not None and window > MAX_CONTEXT:
        raise refuse(f"its sliding window of {window:,} tokens is larger than {MAX_CONTEXT:,}")
    embd = value("embedding_length")
    if embd is not None and not 0 < embd <= MAX_WIDTH:
        raise refuse(f"its embedding length {embd:,} is not between 1 and {MAX_WIDTH:,}")
    for suffix in ("feed_forward_length", "attention.key_length", "attention.value_length"):
        size = value(suffix)
        if size is not None and size > MAX_WIDTH:
            raise refuse(f"its {suffix} of {size:,} is larger than {MAX_WIDTH:,}")
    for suffix in ("attention.head_count", "attention.head_count_kv"):
        key = f"{arch}.{suffix}"
        counts = h.small_arrays.get(key, ()) if key in h.arrays else (value(suffix),)
        if any(c is not None and not 0 <= c <= MAX_HEADS for c in counts):
            raise refuse(f"its {suffix} is not between 0 and {MAX_HEADS:,}")

    # Rotary embedding: n_rot 0 hangs the first decode; odd or wider than a head aborts.
    n_head = value("attention.head_count")
    head_dim = value("attention.key_length") or (embd // n_head if embd and n_head else None)
    for suffix in ("rope.dimension_count", "rope.dimension_count_swa"):
        n_rot = value(suffix)
        if n_rot is not None and (n_rot < 2 or n_rot % 2 or (head_dim and n_rot > head_dim)):
            limit = f" up to the head size {head_dim}" if head_dim else ""
            raise refuse(f"its {suffix} is {n_rot:,}; it must be an even number from 2{limit}")
    scaling_key = f"{arch}.rope.scaling.type"
    scaling = meta.get(scaling_key)
    if types.get(scaling_key) == _STRING and scaling not in _ROPE_SCALING:
        raise refuse(f"its rope scaling type {shown(str(scaling))!r} is unknown")

    # Floats: NaN or infinity anywhere in the hyperparameters; epsilons must be > 0
    # (ggml asserts eps >= 0, and NaN fails that too).
    for key, vtype in types.items():
        if vtype not in _FLOATS or not key.startswith(f"{arch}."):
            continue
        x = meta[key]
        if not math.isfinite(x):
            raise refuse(f"{shown(key)} is {x}")
        if ("epsilon" in key or key.endswith("_eps")) and x <= 0:
            raise refuse(f"{shown(key)} is {x}; it must be greater than 0")

    _check_experts(h, value, refuse)
    _check_vocab(h, str(arch), buf, refuse)


def _check_experts(h: _Header, value: _Value, refuse: _Refuse) -> None:
    """llama.cpp's GGML_ASSERTs on mixture-of-experts counts (load_hparams)."""
    arch = h.meta["general.architecture"]
    n_expert = value("expert_count") or 0
    used_key = f"{arch}.expert_used_count"
    used_all = (
        h.small_arrays.get(used_key, ()) if used_key in h.arrays else (value("expert_used_count"),)
    )
    used = max((u for u in used_all if u is not None), default=0)
    groups = value("expert_group_count") or 0
    group_used = value("expert_group_used_count") or 0
    if n_expert == 0:
        if used or groups:
            raise refuse(f"it uses {used} experts per token but has none")
        return
    if not 0 < used <= n_expert:
        raise refuse(f"it uses {used} of its {n_expert} experts per token")
    if groups >= n_expert:
        raise refuse(f"it has {groups} expert groups for {n_expert} experts")
    if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
        raise refuse(f"its {n_expert} experts do not divide into {groups} groups as declared")


def _check_vocab(h: _Header, arch: str, buf: mmap.mmap, refuse: _Refuse) -> None:
    """Vocabularies llama.cpp aborts on while loading them."""
    model_key = "tokenizer.ggml.model"
    tokenizer = h.meta.get(model_key) if h.types.get(model_key) == _STRING else None
    if tokenizer == "bert":
        raise refuse("it is a BERT-style embedding model; Lamplight needs a model that writes text")
    if tokenizer == "rwkv" and "rwkv" not in arch:
        raise refuse(f"its RWKV tokenizer does not belong to the {shown(arch)} architecture")
    span = h.arrays.get("tokenizer.ggml.tokens")
    if span is None or span[0] != _STRING:
        return
    # llama.cpp maps text -> id and asserts the map is as long as the list. It reads each
    # text as a C string, so a NUL ends it: "a\0b" and "a" are the same token.
    _itype, count, pos, _end = span
    if count > MAX_VOCAB:
        raise refuse(f"its vocabulary of {count:,} tokens is larger than {MAX_VOCAB:,}")
    texts: list[bytes] = []
    append = texts.append
    unpack = _U64.unpack_from
    for _ in range(count):
        n = unpack(buf, pos)[0]
        pos += 8
        append(buf[pos : pos + n].partition(b"\0")[0])
        pos += n
    if len(set(texts)) == count:
        return
    seen: set[bytes] = set()
    for index, text in enumerate(texts):
        if text in seen:
            word = shown(text.decode("utf-8", errors="replace"), 40)
            raise refuse(f"its vocabulary lists the token {word!r} twice (again at {index})")
        seen.add(text)


def _file_type_name(value: int) -> str:
    try:
        from gguf import LlamaFileType

        return str(LlamaFileType(value).name).removeprefix("MOSTLY_")
    except ValueError:
        return str(value)
