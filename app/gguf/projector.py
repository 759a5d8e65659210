"""Vision projector (``mmproj``) files: read their header, and check they fit a model
before llama.cpp's loader sees them (its checks abort the process on some bad files).

Only the header is read, with the bounded walk of ``app.gguf.header`` and the tensor
table rules of ``app.gguf.info`` (a truncated file is refused here, not by a crash).
The width a projector writes is what llama.cpp's ``clip_n_mmproj_embd`` reads: the
shape of the family's last projection tensor, else ``clip.vision.projection_dim``
(which the converter sets to the text model's width).
"""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path

from app.gguf.header import (
    Header,
    int_value,
    is_text,
    shown,
)
from app.gguf.info import _check_tensors, checked_header
from app.gguf.projector_shapes import check_geometry, check_types
from app.util.errors import ModelFileError, ProjectorError

# Projector types this build of libmtmd knows (clip-impl.h PROJECTOR_TYPE_NAMES).
KNOWN_TYPES = frozenset(
    [
        "mlp",
        "mlp_norm",
        "ldp",
        "ldpv2",
        "resampler",
        "adapter",
        "qwen2vl_merger",
        "qwen2.5vl_merger",
        "qwen3vl_merger",
        "gemma3",
        "gemma3nv",
        "idefics3",
        "pixtral",
        "internvl",
        "llama4",
        "lfm2",
        "kimivl",
        "cogvlm",
        "janus_pro",
        "glm4v",
        "phi4",
        "paddleocr",
        "lightonocr",
        "dots_ocr",
        "deepseekocr",
        "youtuvl",
        "hunyuanvl",
        "minicpmv4_6",
        "step3vl",
        "gemma4v",
    ]
)
# Per type: the tensor whose shape gives the output width, and which dimension
# (ggml order: a weight's ne[1] is its output size; gemma3's is used transposed).
_OUT_TENSORS = {
    "gemma3": ("mm.input_projection.weight", 0),
    "mlp": ("mm.2.weight", 1),
    "mlp_norm": ("mm.2.weight", 1),
    "pixtral": ("mm.2.weight", 1),
    "lfm2": ("mm.2.weight", 1),
    "kimivl": ("mm.2.weight", 1),
    "qwen2vl_merger": ("mm.2.weight", 1),
    "qwen2.5vl_merger": ("mm.2.weight", 1),
    "idefics3": ("mm.model.fc.weight", 1),
    "llama4": ("mm.model.fc.weight", 1),
    "internvl": ("mm.3.weight", 1),
}
# Projector types made for one text architecture only (others are not checked).
_ARCHITECTURES = {
    "gemma3": ("gemma3",),
    "qwen2vl_merger": ("qwen2vl",),
    "qwen2.5vl_merger": ("qwen2vl",),
    "qwen3vl_merger": ("qwen3vl", "qwen3vlmoe"),
    "llama4": ("llama4",),
}
MAX_SIDE = 1 << 16  # image_size / patch_size larger than this are nonsense


@dataclass(frozen=True)
class ProjectorInfo:
    path: Path
    projector_type: str
    n_embd_out: int  # the width of the embeddings it writes (0: unknown)
    image_size: int
    patch_size: int
    fingerprint: str = ""  # sha256 of the header, and the size: what libmtmd's asserts read

    @property
    def name(self) -> str:
        return self.path.name


def read_projector(path: str | Path) -> ProjectorInfo:
    """Read a projector's header.

    Raises:
        ProjectorError: not a readable GGUF file, or not a vision projector llama.cpp knows.
    """
    p = Path(path)
    fingerprint: list[str] = []

    def check(name: str, h: Header, buf: mmap.mmap) -> int:
        n_params = _check_tensors(name, h)
        fingerprint.append(f"{hashlib.sha256(buf[: h.data_start]).hexdigest()}:{h.size}")
        return n_params

    try:
        header, _ = checked_header(p, check, kind="projector")
    except ModelFileError as exc:
        raise ProjectorError(str(exc)) from exc
    info = _info(shown(p.name), header)
    return ProjectorInfo(p, *info, fingerprint=fingerprint[0])


def _info(name: str, header: Header) -> tuple[str, int, int, int]:
    """Type, output width, image and patch size of a projector libmtmd can load."""
    meta = header.meta
    arch = meta.get("general.architecture") if is_text(header, "general.architecture") else None
    if arch != "clip":
        what = f"a model ({shown(str(arch))})" if arch else "a GGUF file without an architecture"
        raise ProjectorError(
            f"{name} is {what}, not a vision projector; choose the mmproj file published "
            "with the model."
        )
    if meta.get("clip.has_vision_encoder") is not True:
        raise ProjectorError(f"{name} has no vision encoder (an audio-only projector?).")
    kind = ""
    for key in ("clip.vision.projector_type", "clip.projector_type"):
        if is_text(header, key):
            kind = str(meta[key])
            break
    if kind not in KNOWN_TYPES:
        shown_kind = repr(shown(kind, 40)) if kind else "no"
        raise ProjectorError(
            f"{name} names {shown_kind} projector type, which this version of llama.cpp "
            "does not know."
        )
    size = int_value(meta.get("clip.vision.image_size")) or 0
    patch = int_value(meta.get("clip.vision.patch_size")) or 0
    if not 0 <= size <= MAX_SIDE or not 0 <= patch <= MAX_SIDE or (size and not patch):
        raise ProjectorError(
            f"{name} cannot be used: its image size {size} and patch size {patch} make no sense."
        )
    check_types(name, header)
    check_geometry(name, header, kind)
    return kind, _width(header, kind), size, patch


def _width(header: Header, kind: str) -> int:
    """The width of the embeddings a projector of type ``kind`` writes (0: unknown)."""
    if kind in _OUT_TENSORS:
        tensor, dim = _OUT_TENSORS[kind]
        for tname, dims, _type, _offset in header.tensors:
            if tname == tensor and len(dims) > dim:
                return int(dims[dim])
    width = int_value(header.meta.get("clip.vision.projection_dim")) or 0
    return width if 0 < width <= 1 << 20 else 0


def check_fits(
    info: ProjectorInfo, n_embd: int | None, architecture: str = "", model: str = "this model"
) -> None:
    """Refuse a projector whose embeddings ``model`` cannot read.

    Raises:
        ProjectorError: its width differs from ``n_embd``, or it is made for another
            architecture (checked only for projector types made for one).
    """
    arch = architecture.lower()
    allowed = _ARCHITECTURES.get(info.projector_type)
    if arch and allowed is not None and arch not in allowed:
        raise ProjectorError(
            f"{shown(info.name)} does not fit {model}: it is a {info.projector_type} projector, "
            f"made for {' or '.join(allowed)} models, and the model is {shown(arch)}. Use the "
            "mmproj file published with this model."
        )
    if info.n_embd_out and n_embd and info.n_embd_out != n_embd:
        raise ProjectorError(
            f"{shown(info.name)} does not fit {model}: it makes {info.n_embd_out}-wide "
            f"embeddings; this model reads {n_embd}-wide ones. Use the mmproj file published "
            "with this model."
        )
