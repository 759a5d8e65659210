"""Hostile embedding-model files: an EmbedderInfo or a ModelFileError, never a crash or a hang.

Two kinds of input: mutations of the real built-in embedder's header (Hypothesis), written
as sparse files (the header, then a hole as long as the tensor data: the checks read only
the header), and tiny BERT files built with ``gguf`` for each refusal
``read_embedder_info`` makes (``docs/notes/documents_plan.md`` §2.1).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.gguf.embedder import POOLING, EmbedderInfo, read_embedder_info
from app.util.errors import EmbedderError, ModelFileError
from tests.embed_model import embedder_path
from tests.hypothesis_budget import examples

TIME_BUDGET_S = 2.0
BOUNDARY = (0, 1, 2, 3, 4, 6, 100, 101, 102, 30521, 30522, 2**31 - 1, 2**32 - 1)
N_TOKENS = 200  # token types the fuzzer may change
TINY_TOKENS = 64  # below llama.cpp's WPM default ids (100-102)


@dataclass(frozen=True)
class RealHeader:
    data: bytes = field(repr=False)  # everything before the tensor data
    size: int  # the whole file
    ints: tuple[tuple[str, int, int], ...]  # (key, position of the value, width)
    token_types: int  # where the token type array's values start


@pytest.fixture(scope="module")
def real() -> RealHeader:
    import gguf

    from app.gguf.header import mapped_file, walk_header

    path = embedder_path()
    with mapped_file(path) as buf:
        h = walk_header(buf)
        data = bytes(buf[: h.data_start])
        types_at = h.arrays["tokenizer.ggml.token_type"][2]
    reader = gguf.GGUFReader(str(path))
    ints = []
    for key, f in reader.fields.items():
        if len(f.parts) == 4 and f.types and f.types[0] in (gguf.GGUFValueType.UINT32,):
            at = f.offset + sum(int(p.nbytes) for p in f.parts[:3])
            if at + 4 <= len(data):
                ints.append((key, at, 4))
    return RealHeader(data, path.stat().st_size, tuple(ints), types_at)


def _sparse(path: Path, header: bytes, size: int) -> Path:
    with path.open("wb") as f:
        f.write(header)
        f.truncate(max(size, len(header)))
    return path


def _check(path: Path) -> EmbedderInfo | None:
    started = time.monotonic()
    try:
        info = read_embedder_info(path)
    except ModelFileError as exc:
        assert "unexpected" not in str(exc), exc
        assert str(exc).endswith((".", ")", "?")), exc
        return None
    finally:
        assert time.monotonic() - started < TIME_BUDGET_S
    assert info.pooling_type in POOLING and info.n_embd > 0 and info.context_length > 0
    return info


def test_the_real_header_passes(real: RealHeader, tmp_path: Path) -> None:
    info = _check(_sparse(tmp_path / "m.gguf", real.data, real.size))
    assert info is not None and info.n_embd == 384


mutation = st.one_of(
    st.tuples(st.just("int"), st.integers(0, 10**6), st.sampled_from(BOUNDARY)),
    st.tuples(st.just("int"), st.integers(0, 10**6), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("byte"), st.integers(0, 10**9), st.integers(0, 255)),
    st.tuples(st.just("type"), st.integers(0, N_TOKENS), st.integers(0, 7)),
    st.tuples(st.just("cut"), st.integers(0, 10**9), st.just(0)),
)


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(mutation, min_size=1, max_size=4))
def test_mutated_headers_are_refused_or_read(
    real: RealHeader, tmp_path: Path, mutations: list[tuple[str, int, int]]
) -> None:
    data = bytearray(real.data)
    size = real.size
    for kind, where, value in mutations:
        if kind == "int":
            _key, at, _width = real.ints[where % len(real.ints)]
            data[at : at + 4] = struct.pack("<I", value)
        elif kind == "byte":
            data[where % len(data)] = value
        elif kind == "type":
            at = real.token_types + 4 * where
            data[at : at + 4] = struct.pack("<i", value)
        else:
            size = where % real.size
            del data[size:]
    _check(_sparse(tmp_path / "m.gguf", bytes(data), size))


# -- tiny files, one refusal each -------------------------------------------------------------


def _tiny(path: Path, drop: tuple[str, ...] = (), **meta: Any) -> Path:
    """A small BERT embedder header with ``meta`` values set (``None`` removes a key)."""
    import gguf
    import numpy as np

    values: dict[str, Any] = {
        "general.name": "tiny",
        "bert.block_count": 1,
        "bert.context_length": 512,
        "bert.embedding_length": 32,
        "bert.feed_forward_length": 64,
        "bert.attention.head_count": 2,
        "bert.attention.layer_norm_epsilon": 1e-12,
        "bert.attention.causal": False,
        "bert.pooling_type": 1,
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.token_type_count": 2,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.seperator_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    values.update(meta)
    arch = str(values.pop("general.architecture", "bert"))
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in values.items():
        if value is None or key in drop:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, value)
    tokens = ["[UNK]", "[CLS]", "[SEP]"] + [f"\u2581t{i}" for i in range(TINY_TOKENS - 3)]
    w.add_token_list(tokens)
    types = [3, 3, 3] + [1] * (TINY_TOKENS - 3)
    if "byte" in drop:
        types[10] = 6
    w.add_token_types(types)
    w.add_tensor("token_embd.weight", np.zeros((TINY_TOKENS, 32), np.float32))
    w.add_tensor("blk.0.attn_output_norm.weight", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_tiny_embedder_passes(tmp_path: Path) -> None:
    info = read_embedder_info(_tiny(tmp_path / "ok.gguf"))
    assert (info.architecture, info.n_embd, info.n_vocab, info.pooling_type) == (
        "bert",
        32,
        TINY_TOKENS,
        1,
    )
    # A template on a non-causal model is harmless (some embedders ship one).
    assert read_embedder_info(_tiny(tmp_path / "t.gguf", **{"tokenizer.chat_template": "x"}))


@pytest.mark.parametrize(
    ("meta", "drop", "message"),
    [
        ({"bert.pooling_type": 0}, (), "does not pool its output"),
        ({"bert.pooling_type": 4}, (), "does not pool its output"),
        ({}, ("bert.pooling_type",), "does not pool its output"),
        ({"tokenizer.ggml.token_type_count": 0}, (), "token_type_count"),
        ({}, ("tokenizer.ggml.token_type_count",), "token_type_count"),
        # An id out of range falls back to llama.cpp's default 101, also out of range here.
        ({"tokenizer.ggml.bos_token_id": 5000}, (), "bos token id 101"),
        ({}, ("tokenizer.ggml.seperator_token_id",), "seperator token id 102"),
        ({}, ("byte",), "byte tokens"),
        ({"general.architecture": "llama", "llama.pooling_type": 1}, (), "architecture 'llama'"),
        ({"general.architecture": "llama"}, (), "is a text-generating model"),
        (
            {"tokenizer.chat_template": "{{ messages }}", "bert.attention.causal": None},
            (),
            "is a chat model, not an embedding model",
        ),
        ({"tokenizer.ggml.model": "gpt2"}, (), None),  # not WordPiece: no WPM rules
    ],
)
def test_each_refusal(
    tmp_path: Path, meta: dict[str, Any], drop: tuple[str, ...], message: str | None
) -> None:
    path = _tiny(tmp_path / "m.gguf", drop, **meta)
    if message is None:
        assert read_embedder_info(path).pooling_type == 1
        return
    with pytest.raises(EmbedderError, match=message):
        read_embedder_info(path)


def test_missing_and_non_gguf_files(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="Embedding model file not found"):
        read_embedder_info(tmp_path / "none.gguf")
    (tmp_path / "x.gguf").write_bytes(b"PK\3\4 not a model")
    with pytest.raises(ModelFileError, match="not a GGUF embedding model file"):
        read_embedder_info(tmp_path / "x.gguf")
