"""Validate a GGUF file and read the metadata the app shows, with the ``gguf`` package."""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.util.errors import ModelFileError

GGUF_MAGIC = b"GGUF"


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
    """Check that ``path`` is a complete GGUF file and read its metadata.

    Raises:
        ModelFileError: with a reason a person can act on.
    """
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"Model file not found: {p}")
    if not p.is_file():
        raise ModelFileError(f"Not a file: {p}")
    size = p.stat().st_size
    if size == 0:
        raise ModelFileError(f"{p.name} is empty (0 bytes); an interrupted download?")
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"{p.name} is not a GGUF model file (it starts with {magic!r}, not b'GGUF')."
        )
    try:
        meta, tensors, data_start = _parse_header(p)
    except (ValueError, struct.error, OSError, KeyError) as exc:
        raise ModelFileError(f"{p.name} is a damaged GGUF file: {exc}") from exc

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data_end = data_start
    n_params = 0
    for _name, dims, ttype, offset in tensors:
        n = math.prod(dims)
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError) as exc:
            raise ModelFileError(f"{p.name} uses an unknown tensor type {ttype}.") from exc
        data_end = max(data_end, data_start + offset + n * type_size // block)
        n_params += n
    if data_end > size:
        raise ModelFileError(
            f"{p.name} is truncated: its tensors need {data_end:,} bytes but the file has "
            f"{size:,}. Download it again."
        )
    if not tensors:
        raise ModelFileError(f"{p.name} holds no tensors; it is not a usable model.")

    arch = str(meta.get("general.architecture") or "")
    if not arch:
        raise ModelFileError(f"{p.name} does not name its architecture (general.architecture).")
    ctx = meta.get(f"{arch}.context_length")
    layers = meta.get(f"{arch}.block_count")
    ftype = meta.get("general.file_type")
    template = meta.get("tokenizer.chat_template")
    n_embd = _int(meta.get(f"{arch}.embedding_length"))
    n_head = _int(meta.get(f"{arch}.attention.head_count"))
    n_head_kv = _int(meta.get(f"{arch}.attention.head_count_kv")) or n_head
    head_dim = n_embd // n_head if n_embd and n_head else None
    key_len = _int(meta.get(f"{arch}.attention.key_length")) or head_dim
    value_len = _int(meta.get(f"{arch}.attention.value_length")) or head_dim
    return GgufInfo(
        path=p,
        file_size=size,
        architecture=arch,
        name=str(meta.get("general.name") or ""),
        context_length=int(ctx) if isinstance(ctx, int) else None,
        chat_template=str(template) if isinstance(template, str) and template.strip() else None,
        n_params=n_params,
        n_layers=int(layers) if isinstance(layers, int) else None,
        file_type=_file_type_name(ftype) if isinstance(ftype, int) else None,
        general_type=str(meta["general.type"]) if "general.type" in meta else None,
        n_embd_k_gqa=key_len * n_head_kv if key_len and n_head_kv else None,
        n_embd_v_gqa=value_len * n_head_kv if value_len and n_head_kv else None,
        n_vocab=_int(meta.get("tokenizer.ggml.tokens#len")),
        adapter_type=str(meta["adapter.type"]) if "adapter.type" in meta else None,
    )


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


# GGUF value types (gguf.GGUFValueType) and their struct formats.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_MAX_HEADER_ITEMS = 1 << 24  # more keys or tensors than this is a corrupt count


def _parse_header(
    path: Path, types: dict[str, int] | None = None
) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]:
    """Key/values (arrays skipped), tensor infos and the data offset of a GGUF file.

    ``gguf.GGUFReader`` decodes every array element into numpy objects, which
    takes 12 s for a 262k-token vocabulary; this reads only what we show and
    walks over arrays.
    """
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 4
        (version,) = struct.unpack_from("<I", buf, pos)
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, pos + 4)
        pos += 20
        if n_tensors > _MAX_HEADER_ITEMS or n_kv > _MAX_HEADER_ITEMS:
            raise ValueError("implausible key or tensor count")

        def read_str(at: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", buf, at)
            end = at + 8 + n
            if end > len(buf):
                raise ValueError("string runs past the end of the file")
            return buf[at + 8 : end].decode("utf-8", errors="replace"), end

        def skip_value(vtype: int, at: int) -> int:
            if vtype in _SCALARS:
                return at + struct.calcsize(_SCALARS[vtype])
            if vtype == _STRING:
                (n,) = struct.unpack_from("<Q", buf, at)
                return at + 8 + int(n)
            if vtype == _ARRAY:
                itype, count = struct.unpack_from("<IQ", buf, at)
                at += 12
                if itype in _SCALARS:
                    return at + int(count) * struct.calcsize(_SCALARS[itype])
                for _ in range(count):
                    at = skip_value(itype, at)
                    if at > len(buf):
                        raise ValueError("array runs past the end of the file")
                return at
            raise ValueError(f"unknown value type {vtype}")

        meta: dict[str, Any] = {}
        alignment = 32
        for _ in range(n_kv):
            key, pos = read_str(pos)
            (vtype,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            if types is not None:
                types[key] = vtype
            if vtype in _SCALARS:
                (meta[key],) = struct.unpack_from("<" + _SCALARS[vtype], buf, pos)
            elif vtype == _STRING:
                meta[key], _ = read_str(pos)
            elif vtype == _ARRAY:
                meta[key + "#len"] = struct.unpack_from("<Q", buf, pos + 4)[0]
            pos = skip_value(vtype, pos)
        if isinstance(meta.get("general.alignment"), int) and meta["general.alignment"] > 0:
            alignment = meta["general.alignment"]

        tensors = []
        for _ in range(n_tensors):
            name, pos = read_str(pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            if n_dims > 8:
                raise ValueError(f"tensor {name} has {n_dims} dimensions")
            dims = list(struct.unpack_from(f"<{n_dims}Q", buf, pos + 4))
            pos += 4 + 8 * n_dims
            ttype, offset = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            tensors.append((name, dims, ttype, offset))
        data_start = (pos + alignment - 1) // alignment * alignment
        return meta, tensors, data_start


def _file_type_name(value: int) -> str:
    try:
        from gguf import LlamaFileType

        return str(LlamaFileType(value).name).removeprefix("MOSTLY_")
    except ValueError:
        return str(value)
