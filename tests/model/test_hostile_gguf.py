"""Hostile and damaged GGUF files: a ModelFileError or a GgufInfo, never a crash or a hang.

Inputs are mutations of the real default model's header (issue 13, "GGUF model
files"). The fuzzers check the header walk in process; the cases that would end
the process inside llama.cpp (``GGML_ASSERT``, ``std::bad_alloc``) are loaded
in a child process with a memory cap. ``docs/notes/gguf.md`` lists what aborted
llama.cpp before ``read_gguf_info`` refused it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.gguf.header import shown
from app.gguf.info import GgufInfo, read_gguf_info
from app.util.errors import ModelFileError
from tests.conftest import make_unreadable
from tests.hypothesis_budget import examples

ROOT = Path(__file__).resolve().parents[2]
BOUNDARY = (0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1)
ODD_FLOATS = (math.nan, -1.0, 0.0, math.inf, -math.inf)
TIME_BUDGET_S = 2.0
CHILD_MEMORY = 2 << 30  # RLIMIT_AS for child processes that load the model
POSIX = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and rlimits")

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


# ---------------------------------------------------------------------------------
# The real header, and where its fields are


@dataclass(frozen=True)
class Field:
    """An integer in the header a mutation may overwrite."""

    what: str
    at: int
    width: int  # bytes


@dataclass
class Header:
    """The default model's header bytes and the position of every field in them."""

    data: bytes  # everything before the tensor data, padding included
    file_size: int
    kv: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    # ^ key -> (start of the key, position of the type tag, start of value, end)
    tensors: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # ^ name -> (position of n_dims, position of the type, position of the offset)
    tensor_order: list[str] = field(default_factory=list)
    fields: list[Field] = field(default_factory=list)

    def u32(self, key: str, value: int) -> bytes:
        return self.put(self.kv[key][2], struct.pack("<I", value))

    def f32(self, key: str, value: float) -> bytes:
        return self.put(self.kv[key][2], struct.pack("<f", value))

    def put(self, at: int, raw: bytes, data: bytes | None = None) -> bytes:
        base = self.data if data is None else data
        return base[:at] + raw + base[at + len(raw) :]

    def add(self, key: str, vtype: int, payload: bytes) -> bytes:
        return _add(self.data, key, vtype, payload)

    def without(self, key: str) -> bytes:
        start, _tag, _value, end = self.kv[key]
        out = bytearray(self.data[:start] + self.data[end:])
        struct.pack_into("<Q", out, 16, struct.unpack_from("<Q", out, 16)[0] - 1)
        return bytes(out)

    def replace(self, key: str, vtype: int, payload: bytes) -> bytes:
        _start, tag, _value, end = self.kv[key]
        return self.data[:tag] + struct.pack("<I", vtype) + payload + self.data[end:]

    def retype(self, name: str, ttype: int) -> bytes:
        """One tensor's type changed, every offset after it moved to stay contiguous."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        out = bytearray(self.data)
        offset = 0
        for tname in self.tensor_order:
            nd_at, type_at, off_at = self.tensors[tname]
            if tname == name:
                struct.pack_into("<I", out, type_at, ttype)
            (n_dims,) = struct.unpack_from("<I", out, nd_at)
            dims = struct.unpack_from(f"<{n_dims}Q", out, nd_at + 4)
            block, size = GGML_QUANT_SIZES[
                GGMLQuantizationType(struct.unpack_from("<I", out, type_at)[0])
            ]
            struct.pack_into("<Q", out, off_at, offset)
            offset += -(-(math.prod(dims) // block * size) // 32) * 32
        return bytes(out)


def _s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _add(data: bytes, key: str, vtype: int, payload: bytes) -> bytes:
    """``data`` with one more key/value, inserted first."""
    entry = _s(key.encode()) + struct.pack("<I", vtype) + payload
    out = bytearray(data[:24] + entry + data[24:])
    struct.pack_into("<Q", out, 16, struct.unpack_from("<Q", out, 16)[0] + 1)
    return bytes(out)


def _layout(path: Path) -> Header:
    with path.open("rb") as fh:
        head = fh.read(16 << 20)
    n_tensors, n_kv = struct.unpack_from("<QQ", head, 8)
    h = Header(data=b"", file_size=path.stat().st_size)
    h.fields += [Field("version", 4, 4), Field("n_tensors", 8, 8), Field("n_kv", 16, 8)]
    pos = 24

    def skip(vtype: int, at: int) -> int:
        if vtype in _SCALAR_SIZES:
            return at + _SCALAR_SIZES[vtype]
        if vtype == _STRING:
            return at + 8 + struct.unpack_from("<Q", head, at)[0]
        itype, count = struct.unpack_from("<IQ", head, at)
        at += 12
        if itype in _SCALAR_SIZES:
            return at + count * _SCALAR_SIZES[itype]
        for _ in range(count):
            at = skip(itype, at)
        return at

    for _ in range(n_kv):
        start = pos
        (n,) = struct.unpack_from("<Q", head, pos)
        key = head[pos + 8 : pos + 8 + n].decode()
        h.fields.append(Field(f"{key}: key length", pos, 8))
        tag = pos + 8 + n
        (vtype,) = struct.unpack_from("<I", head, tag)
        value = tag + 4
        end = skip(vtype, value)
        h.kv[key] = (start, tag, value, end)
        h.fields.append(Field(f"{key}: type", tag, 4))
        if vtype in _SCALAR_SIZES:
            h.fields.append(Field(f"{key}: value", value, _SCALAR_SIZES[vtype]))
        elif vtype == _STRING:
            h.fields.append(Field(f"{key}: string length", value, 8))
        else:
            h.fields += [
                Field(f"{key}: element type", value, 4),
                Field(f"{key}: count", value + 4, 8),
            ]
            if struct.unpack_from("<I", head, value)[0] == _STRING:  # the first string's length
                h.fields.append(Field(f"{key}[0]: length", value + 12, 8))
        pos = end
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", head, pos)
        name = head[pos + 8 : pos + 8 + n].decode()
        h.fields.append(Field(f"tensor {name}: name length", pos, 8))
        nd_at = pos + 8 + n
        (n_dims,) = struct.unpack_from("<I", head, nd_at)
        type_at = nd_at + 4 + 8 * n_dims
        h.tensors[name] = (nd_at, type_at, type_at + 4)
        h.tensor_order.append(name)
        h.fields += [Field(f"tensor {name}: n_dims", nd_at, 4)]
        h.fields += [Field(f"tensor {name}: ne{i}", nd_at + 4 + 8 * i, 8) for i in range(n_dims)]
        h.fields += [Field(f"tensor {name}: type", type_at, 4)]
        h.fields += [Field(f"tensor {name}: offset", type_at + 4, 8)]
        pos = type_at + 12
    h.data = head[: -(-pos // 32) * 32]
    return h


@pytest.fixture(scope="module")
def header(model_path: Path) -> Header:
    read_gguf_info(model_path)  # imports gguf and numpy outside the timed calls
    return _layout(model_path)


def _write(path: Path, header: Header, data: bytes, slack: int = 0) -> Path:
    """``data`` as a header, then a hole as long as the model's tensor data (+ ``slack``)."""
    padded = data + b"\0" * (-len(data) % 32)
    with path.open("wb") as fh:
        fh.write(padded)
        fh.truncate(len(padded) + header.file_size - len(header.data) + slack)
    return path


def _check(path: Path) -> GgufInfo | ModelFileError:
    """read_gguf_info's answer, held to the invariant: typed, one line, in time."""
    t0 = time.perf_counter()
    try:
        result: GgufInfo | ModelFileError = read_gguf_info(path)
    except ModelFileError as exc:
        result = exc
        message = str(exc)
        assert "\n" not in message and "\r" not in message and len(message) < 400, message
        # read_gguf_info's last-resort clause: a Python error the walk did not foresee
        assert "GGUF file (unexpected " not in message, message
    elapsed = time.perf_counter() - t0
    assert elapsed < TIME_BUDGET_S, f"read_gguf_info took {elapsed:.1f} s"
    return result


# ---------------------------------------------------------------------------------
# Fuzzing the header walk


def _mutate(header: Header, ops: list[tuple[Any, ...]]) -> bytes:
    data = bytearray(header.data)
    cut: int | None = None
    for op in ops:
        kind = op[0]
        if kind == "int":
            f, value = op[1], op[2]
            data[f.at : f.at + f.width] = (value & ((1 << (8 * f.width)) - 1)).to_bytes(
                f.width, "little"
            )
        elif kind == "float":
            f, value = op[1], op[2]
            data[f.at : f.at + 4] = struct.pack("<f", value)
        elif kind == "flip":
            bit = op[1] % (8 * len(data))
            data[bit // 8] ^= 1 << (bit % 8)
        elif kind == "flip_in":
            f = op[1]
            bit = op[2] % (8 * f.width)
            data[f.at + bit // 8] ^= 1 << (bit % 8)
        elif kind == "cut":
            cut = op[1]
    return bytes(data[:cut]) if cut is not None else bytes(data)


def _ops(header: Header) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    def pick(test: Callable[[Field], bool]) -> st.SearchStrategy[Field]:
        return st.sampled_from([f for f in header.fields if test(f)])

    # Three kinds of field, drawn evenly: the tensor table's ~1200 would drown the rest.
    tensors = pick(lambda f: f.what.startswith("tensor "))
    sizes = pick(lambda f: f.width == 8 and not f.what.startswith("tensor "))  # counts, lengths
    values = pick(lambda f: not f.what.startswith("tensor ") and f.what.endswith(("value", "type")))
    fields = st.one_of(sizes, values, tensors)
    floats = pick(lambda f: f.what.endswith(": value") and f.width == 4)
    types = pick(lambda f: f.what.endswith("type"))
    op = st.one_of(
        st.tuples(st.just("int"), fields, st.sampled_from(BOUNDARY)),
        st.tuples(st.just("int"), types, st.sampled_from((*range(14), 30, 39, 41, 2**32 - 1))),
        st.tuples(st.just("float"), floats, st.sampled_from(ODD_FLOATS)),
        st.tuples(st.just("flip_in"), fields, st.integers(0, 63)),
        st.tuples(st.just("flip"), st.integers(0, 8 * len(header.data) - 1)),
        st.tuples(st.just("cut"), st.integers(0, len(header.data))),
    )
    return st.lists(op, min_size=1, max_size=3)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile-gguf") / "mutant.gguf"


# Hypothesis calls the test many times with one module-scoped scratch file: fine,
# each example overwrites it.
_FUZZ = settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_header_walk_survives_mutations_of_the_real_header(header: Header, scratch: Path) -> None:
    @_FUZZ
    @given(ops=_ops(header))
    def run(ops: list[tuple[Any, ...]]) -> None:
        data = _mutate(header, ops)
        if any(op[0] == "cut" for op in ops):
            scratch.write_bytes(data)  # a truncated file: no tensor data at all
        else:
            _write(scratch, header, data)
        _check(scratch)

    run()


@settings(max_examples=examples(200), deadline=None)
@given(
    version=st.sampled_from((2, 3, 1, 4, 2**32 - 1)),
    counts=st.tuples(st.sampled_from(BOUNDARY), st.sampled_from(BOUNDARY)),
    rest=st.binary(max_size=512),
)
def test_header_walk_survives_any_bytes_after_the_magic(
    version: int, counts: tuple[int, int], rest: bytes, scratch: Path
) -> None:
    scratch.write_bytes(b"GGUF" + struct.pack("<IQQ", version, *counts) + rest)
    assert isinstance(_check(scratch), ModelFileError)


def test_the_real_header_reads_back(header: Header, model_path: Path, scratch: Path) -> None:
    info = _check(_write(scratch, header, header.data))
    assert isinstance(info, GgufInfo), info
    assert (info.architecture, info.n_layers, info.n_vocab) == ("gemma3", 18, 262144)
    assert dataclasses.replace(info, path=model_path) == read_gguf_info(model_path)


# ---------------------------------------------------------------------------------
# Each case the issue names, and each that aborted llama.cpp in the child-process runs


def _deep_arrays(h: Header, depth: int) -> bytes:
    payload = struct.pack("<IQ", _ARRAY, 1) * depth + struct.pack("<IQ", 4, 0)
    return h.add("lamplight.nested", _ARRAY, payload)


def _set_token(h: Header, index: int, text: bytes) -> bytes:
    pos = h.kv["tokenizer.ggml.tokens"][2] + 12
    for _ in range(index):
        pos += 8 + struct.unpack_from("<Q", h.data, pos)[0]
    n = struct.unpack_from("<Q", h.data, pos)[0]
    return h.data[:pos] + _s(text) + h.data[pos + 8 + n :]


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


def _str(text: str) -> bytes:
    return _s(text.encode())


REFUSED: list[tuple[str, Callable[[Header], bytes], str]] = [
    # block_count: GGML_ASSERT(n_layer_all > 0 && n_layer_all <= LLAMA_MAX_LAYERS)
    ("block_count 0", lambda h: h.u32("gemma3.block_count", 0), "0 layers"),
    ("block_count 1000", lambda h: h.u32("gemma3.block_count", 1000), "1,000 layers"),
    (
        "block_count 2^32-1",
        lambda h: h.u32("gemma3.block_count", 2**32 - 1),
        "4,294,967,295 layers",
    ),
    ("block_count 17", lambda h: h.u32("gemma3.block_count", 17), "says 17 layers but it holds 18"),
    # ggml: GGML_ASSERT(eps >= 0.0f) at the first token
    ("rms eps NaN", lambda h: h.f32("gemma3.attention.layer_norm_rms_epsilon", math.nan), "is nan"),
    (
        "rms eps -1",
        lambda h: h.f32("gemma3.attention.layer_norm_rms_epsilon", -1.0),
        "greater than 0",
    ),
    (
        "rms eps 0",
        lambda h: h.f32("gemma3.attention.layer_norm_rms_epsilon", 0.0),
        "greater than 0",
    ),
    ("freq_base inf", lambda h: h.f32("gemma3.rope.freq_base", math.inf), "is inf"),
    # Python exceptions that escaped the old walk
    (
        "scores count 2^63-1",
        lambda h: h.put(h.kv["tokenizer.ggml.scores"][2] + 4, struct.pack("<Q", 2**63 - 1)),
        "runs past the end",
    ),
    (
        "tokens count 2^64-1",
        lambda h: h.put(h.kv["tokenizer.ggml.tokens"][2] + 4, struct.pack("<Q", 2**64 - 1)),
        "strings",
    ),
    ("nested arrays", lambda h: _deep_arrays(h, 100_000), "array of arrays"),
    ("key length 2^64-1", lambda h: h.put(24, struct.pack("<Q", 2**64 - 1)), "metadata key #0"),
    ("kv count 2^63", lambda h: h.put(16, struct.pack("<Q", 2**63)), "metadata keys"),
    ("tensor count 2^64-1", lambda h: h.put(8, struct.pack("<Q", 2**64 - 1)), "tensors"),
    (
        "string value length 2^63-1",
        lambda h: h.put(h.kv["general.name"][2], struct.pack("<Q", 2**63 - 1)),
        "runs past the end",
    ),
    # std::bad_alloc / MemoryError from sizes
    (
        "sliding window 2^30",
        lambda h: h.u32("gemma3.attention.sliding_window", 2**30),
        "sliding window",
    ),
    ("context 2^30", lambda h: h.u32("gemma3.context_length", 2**30), "context length"),
    ("context 0", lambda h: h.u32("gemma3.context_length", 0), "context length"),
    # rope: n_rot 0 hangs the first decode, odd or wider than a head aborts it
    ("n_rot 0", lambda h: h.add("gemma3.rope.dimension_count", 4, _u32(0)), "rope.dimension_count"),
    ("n_rot 3", lambda h: h.add("gemma3.rope.dimension_count", 4, _u32(3)), "even number"),
    ("n_rot 512", lambda h: h.add("gemma3.rope.dimension_count", 4, _u32(512)), "head size 256"),
    (
        "n_rot swa 0",
        lambda h: h.add("gemma3.rope.dimension_count_swa", 4, _u32(0)),
        "dimension_count_swa",
    ),
    (
        "rope scaling bogus",
        lambda h: h.add("gemma3.rope.scaling.type", _STRING, _str("bogus")),
        "rope scaling",
    ),
    # mixture of experts: load_hparams' GGML_ASSERTs
    ("experts 8, used 0", lambda h: h.add("gemma3.expert_count", 4, _u32(8)), "0 of its 8 experts"),
    ("experts 0, used 2", lambda h: h.add("gemma3.expert_used_count", 4, _u32(2)), "has none"),
    ("nextn 19", lambda h: h.add("gemma3.nextn_predict_layers", 4, _u32(19)), "extra layers"),
    # tensors
    ("norm as F16", lambda h: h.retype("blk.17.post_ffw_norm.weight", 1), "not stored as F32"),
    ("norm as Q4_0", lambda h: h.retype("blk.0.attn_norm.weight", 2), "not stored as F32"),
    ("matrix as I32", lambda h: h.retype("blk.0.attn_q.weight", 26), "cannot multiply"),
    ("embedding as F64", lambda h: h.retype("token_embd.weight", 28), "cannot multiply"),
    (
        "offset moved",
        lambda h: h.put(h.tensors["blk.3.attn_k.weight"][2], struct.pack("<Q", 32)),
        "not where",
    ),
    ("5 dims", lambda h: h.put(h.tensors["output_norm.weight"][0], _u32(5)), "dimensions"),
    ("alignment 1", lambda h: h.add("general.alignment", 4, _u32(1)), "cannot map"),
    ("alignment 3", lambda h: h.add("general.alignment", 4, _u32(3)), "power of two"),
    ("alignment u64", lambda h: h.add("general.alignment", 10, struct.pack("<Q", 32)), "32-bit"),
    # vocabulary
    # llama.cpp: GGML_ASSERT(id_to_token.size() == token_to_id.size()); it reads C strings
    ("duplicate token", lambda h: _set_token(h, 5, b"<0x0A>"), "twice"),
    ("token cut by a NUL", lambda h: _set_token(h, 5, b"<0x0A>\0tail"), "twice"),
    (
        "bert tokenizer",
        lambda h: h.replace("tokenizer.ggml.model", _STRING, _str("bert")),
        "embedding model",
    ),
    ("rwkv tokenizer", lambda h: h.replace("tokenizer.ggml.model", _STRING, _str("rwkv")), "RWKV"),
    (
        "duplicate key",
        lambda h: h.add("general.architecture", _STRING, _str("gemma3")),
        "appears twice",
    ),
    ("no architecture", lambda h: h.without("general.architecture"), "architecture"),
]


@pytest.mark.parametrize(
    ("mutate", "expected"), [(m, e) for _, m, e in REFUSED], ids=[i for i, _, _ in REFUSED]
)
def test_header_values_llama_cpp_trusts_are_refused(
    mutate: Callable[[Header], bytes], expected: str, header: Header, scratch: Path
) -> None:
    # Slack: a retyped tensor may need more data than the model has.
    result = _check(_write(scratch, header, mutate(header), slack=4 << 30))
    assert isinstance(result, ModelFileError), "accepted"
    assert expected in str(result)


def test_a_split_part_is_not_held_to_the_whole_layer_count(header: Header, scratch: Path) -> None:
    data = _add(header.u32("gemma3.block_count", 30), "split.count", 4, _u32(3))
    accepted = _check(_write(scratch, header, data))
    assert isinstance(accepted, GgufInfo), accepted
    assert accepted.n_layers == 30


# ---------------------------------------------------------------------------------
# Files that are not files, or cannot be read


@POSIX
def test_a_fifo_is_refused_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    results: list[object] = []
    # Also with the FIFO swapped in after the type check: the open must not block.
    real_stat = os.stat
    regular = real_stat(__file__)

    def racing_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        return regular if Path(str(path)) == fifo else real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    def read_both() -> None:
        results.append(_check(fifo))
        with monkeypatch.context() as m:
            m.setattr(os, "stat", racing_stat)
            results.append(_check(fifo))

    reader = threading.Thread(target=read_both, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():
        with fifo.open("wb"):  # unblock the reader so the thread can end
            pass
        reader.join(5)
        pytest.fail("reading a FIFO blocked")
    said = f"Not a file: {shown(str(fifo))} is a FIFO (named pipe)."  # a long path is cut
    assert [str(r) for r in results] == [said] * 2


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda d: d, "is a directory"),
        (lambda d: Path("/dev/zero"), "is a character device"),
        (lambda d: d / ("x" * 300 + ".gguf"), "too long"),
        (lambda d: d / "missing.gguf", "not found"),
        (lambda d: d / "missing" / "model.gguf", "not found"),
        (lambda d: _touch(d / "file", b"") / "model.gguf", "not found"),
        (lambda d: _touch(d / "empty.gguf", b""), "empty"),
        (lambda d: _touch(d / "short.gguf", b"GG"), "not a GGUF"),
        (lambda d: _touch(d / "v1.gguf", b"GGUF" + struct.pack("<I", 1)), "version 1"),
        (
            lambda d: _touch(d / "cut.gguf", b"GGUF" + struct.pack("<I", 3) + b"\0" * 5),
            "runs past the end",
        ),
    ],
    ids=[
        "directory",
        "device",
        "long-name",
        "missing",
        "missing-dir",
        "under-a-file",
        "empty",
        "short",
        "v1",
        "cut",
    ],
)
def test_paths_that_are_not_models_are_refused(
    make: Callable[[Path], Path], expected: str, tmp_path: Path
) -> None:
    result = _check(make(tmp_path))
    assert isinstance(result, ModelFileError) and expected in str(result)


def _touch(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_an_unreadable_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "locked.gguf"
    target.write_bytes(b"GGUF")
    make_unreadable(target, monkeypatch)
    result = _check(target)
    assert str(result) == "locked.gguf cannot be read: permission denied."


def test_messages_are_one_line_whatever_the_names(tmp_path: Path, header: Header) -> None:
    hostile = tmp_path / "evil\nname\x1b[31m\u202e.gguf"
    _write(hostile, header, header.u32("gemma3.block_count", 0))
    result = _check(hostile)
    assert isinstance(result, ModelFileError)
    assert "\x1b" not in str(result) and "\u202e" not in str(result)


# ---------------------------------------------------------------------------------
# The library lists the good model beside bad ones


@POSIX
def test_bad_files_do_not_hide_the_good_model(
    tmp_path: Path, model_path: Path, header: Header
) -> None:
    from app.models.library import Library

    models = tmp_path / "models"
    models.mkdir()
    os.symlink(model_path, models / "good.gguf")
    _write(models / "layers.gguf", header, header.u32("gemma3.block_count", 1000))
    _write(models / "nested.gguf", header, _deep_arrays(header, 50_000))
    _touch(models / "noise.gguf", os.urandom(4096))
    _touch(models / "empty.gguf", b"")
    (models / "folder.gguf").mkdir()
    os.mkfifo(models / "pipe.gguf")
    os.symlink(models / "loop.gguf", models / "loop.gguf")
    t0 = time.perf_counter()
    entries = {
        e.path.name: e for e in Library(models, tmp_path / "library.json", hf_cache=False).scan()
    }
    assert time.perf_counter() - t0 < 10
    assert entries["good.gguf"].valid, entries["good.gguf"].error
    bad = {name: e.error for name, e in entries.items() if name != "good.gguf"}
    assert all(not entries[name].valid for name in bad), bad
    assert "1,000 layers" in bad["layers.gguf"] and "array of arrays" in bad["nested.gguf"]


# ---------------------------------------------------------------------------------
# llama.cpp itself, in a child process: accepted mutants load or fail cleanly

_CHILD = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    from app.config.setting_records import LoadConfig, SamplingParams
    from app.engine.local.engine import Engine
    from app.engine.chat_message import ChatMessage
    from app.util.errors import LamplightError

    model, headers = sys.argv[1], sys.argv[2:]
    engine = Engine()
    for header in headers:
        with open(header, "rb") as src, open(model, "r+b") as dst:
            dst.write(src.read())
        print("START", header, flush=True)
        try:
            engine.load(model, LoadConfig(n_ctx=256, n_threads=1, n_batch=64))
            for _ in engine.generate([ChatMessage("user", "Hi")], SamplingParams.greedy(2)):
                pass
            outcome = "ok"
        except LamplightError as exc:
            outcome = type(exc).__name__
        engine.unload()
        print("DONE", header, outcome, flush=True)
    """
).format(limit=CHILD_MEMORY)

# In-place mutants (the header keeps its length) that read_gguf_info accepts.
ACCEPTED: list[tuple[str, Callable[[Header], bytes], str]] = [
    ("bos id 2^32-1", lambda h: h.u32("tokenizer.ggml.bos_token_id", 2**32 - 1), "ok"),
    ("add_bos 255", lambda h: h.put(h.kv["tokenizer.ggml.add_bos_token"][2], b"\xff"), "ok"),
    ("context 2^24", lambda h: h.u32("gemma3.context_length", 2**24), "ok"),
    ("window 2^24", lambda h: h.u32("gemma3.attention.sliding_window", 2**24), "ok"),
    ("embedding 1000", lambda h: h.u32("gemma3.embedding_length", 1000), "ModelLoadError"),
    ("token type 255", lambda h: h.put(h.kv["tokenizer.ggml.token_type"][2] + 12, _u32(255)), "ok"),
]


@pytest.fixture(scope="module")
def model_copy(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    copy = tmp_path_factory.mktemp("model-copy") / "mutant.gguf"
    shutil.copyfile(model_path, copy)
    yield copy
    copy.unlink()


def _run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@POSIX
def test_accepted_mutants_do_not_abort_llama_cpp(
    header: Header, model_copy: Path, tmp_path: Path
) -> None:
    files = []
    for label, mutate, _ in ACCEPTED:
        data = mutate(header)
        assert len(data) == len(header.data), label
        assert isinstance(_check(_write(tmp_path / "probe.gguf", header, data)), GgufInfo), label
        files.append(tmp_path / f"{len(files)}.header")
        files[-1].write_bytes(data)
    child = _run_child(_CHILD, str(model_copy), *map(str, files))
    done = {
        line.split()[1]: line.split()[2]
        for line in child.stdout.splitlines()
        if line.startswith("DONE")
    }
    started = [line.split()[1] for line in child.stdout.splitlines() if line.startswith("START")]
    crashed = [ACCEPTED[files.index(Path(s))][0] for s in started if s not in done]
    assert child.returncode == 0 and not crashed, (child.returncode, crashed, child.stderr[-2000:])
    assert [done[str(f)] for f in files] == [expected for _, _, expected in ACCEPTED]


@POSIX
def test_llama_cpp_still_aborts_without_the_check(header: Header, model_copy: Path) -> None:
    """The reason for the block_count rule, and proof that the child harness sees an abort.

    If a newer llama.cpp refuses this file cleanly, the rule (and this test) can go.
    """
    with model_copy.open("r+b") as fh:
        fh.write(header.u32("gemma3.block_count", 0))
    code = (
        "import resource\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({CHILD_MEMORY}, {CHILD_MEMORY}))\n"
        "import sys, llama_cpp\n"
        "from app.engine.native.libs import load_backends\n"
        "load_backends()\n"
        "llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, verbose=False)\n"
    )
    child = _run_child(code, str(model_copy))
    assert child.returncode < 0, (child.returncode, child.stderr[-2000:])


@pytest.mark.parametrize(
    "config",
    [{"n_batch": -1}, {"n_threads": 100_000}, {"n_ctx": 2**32 + 512}, {"kv_type": "bogus"}],
    ids=["batch", "threads", "ctx", "kv-type"],
)
def test_settings_llama_cpp_would_abort_on_are_refused_before_it(
    config: dict[str, Any], model_path: Path
) -> None:
    from app.config.setting_records import LoadConfig
    from app.engine.local.loader import open_llama
    from app.util.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="was not loaded"):
        open_llama(read_gguf_info(model_path), LoadConfig(**config), None)
