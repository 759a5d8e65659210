"""A tiny random vision projector (``mmproj``) for the default model, built with ``gguf``.

No vision model is small enough to ship with the tests, so :func:`build_projector`
writes a Gemma 3 projector (``clip.projector_type = gemma3``: a SigLIP-style ViT,
average pooling, RMS norm and the input projection into the text model's width) with
random weights and a small geometry: 64×64 pixels, 4-pixel patches pooled 2×2, so an
image is :data:`IMAGE_TOKENS` tokens. It exercises the real libmtmd path (tokenize,
encode, non-causal decode of the embeddings) without testing answers, the way
llama.cpp tests its own mtmd code with tiny random models.

:func:`projector_path` builds it once per checkout into ``.cache/test-models/``,
atomically; ``width`` other than the default model's (640) writes one that does not fit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODEL_CACHE = ROOT / ".cache" / "test-models"
TEXT_WIDTH = 640  # the default model's n_embd
IMAGE_SIZE = 64
PATCH = 4
MERGE = 2
IMAGE_TOKENS = (IMAGE_SIZE // PATCH // MERGE) ** 2
BUILDER_VERSION = 1


def build_projector(
    out: Path,
    width: int = TEXT_WIDTH,
    *,
    seed: int = 7,
    header: dict[str, Any] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> Path:
    """Write a random Gemma 3 projector whose output width is ``width`` to ``out``.

    ``header`` overrides header values without changing the tensors, as a file whose
    header disagrees with its weights would: an int is written as u32, a float as f32,
    a bool, a str, a list as an array, ``(gguf.GGUFValueType, value)`` as that type,
    and None leaves the key out. ``shapes`` gives tensors other (numpy-order) shapes.
    """
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    n_embd, n_ff, n_head = 32, 64, 2
    n_patches = (IMAGE_SIZE // PATCH) ** 2
    shapes = shapes or {}

    def rand(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "clip")
    values: dict[str, Any] = {
        "general.name": "lamplight test projector",
        "clip.projector_type": "gemma3",
        "clip.has_vision_encoder": True,
        "clip.use_gelu": True,
        "clip.vision.image_size": IMAGE_SIZE,
        "clip.vision.patch_size": PATCH,
        "clip.vision.embedding_length": n_embd,
        "clip.vision.feed_forward_length": n_ff,
        "clip.vision.block_count": 1,
        "clip.vision.projection_dim": width,
        "clip.vision.attention.head_count": n_head,
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.vision.projector.scale_factor": MERGE,
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
    }
    for key, value in {**values, **(header or {})}.items():
        _write_value(writer, key, value)
    tensors = {
        "v.patch_embd.weight": rand(n_embd, 3, PATCH, PATCH),
        "v.patch_embd.bias": rand(n_embd),
        "v.position_embd.weight": rand(n_patches, n_embd),
        "v.post_ln.weight": np.ones(n_embd, np.float32),
        "v.post_ln.bias": np.zeros(n_embd, np.float32),
        "mm.soft_emb_norm.weight": np.ones(n_embd, np.float32),
        "mm.input_projection.weight": rand(n_embd, width),
    }
    for name, shape in {
        "attn_q": (n_embd, n_embd),
        "attn_k": (n_embd, n_embd),
        "attn_v": (n_embd, n_embd),
        "attn_out": (n_embd, n_embd),
        "ffn_up": (n_ff, n_embd),
        "ffn_down": (n_embd, n_ff),
    }.items():
        tensors[f"v.blk.0.{name}.weight"] = rand(*shape)
        tensors[f"v.blk.0.{name}.bias"] = rand(shape[0])
    for name in ("ln1", "ln2"):
        tensors[f"v.blk.0.{name}.weight"] = np.ones(n_embd, np.float32)
        tensors[f"v.blk.0.{name}.bias"] = np.zeros(n_embd, np.float32)
    for name, array in tensors.items():
        writer.add_tensor(name, rand(*shapes[name]) if name in shapes else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
    return out


def _write_value(writer: Any, key: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, tuple):
        writer.add_key_value(key, value[1], value[0])
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, value)


def projector_path(width: int = TEXT_WIDTH) -> Path:
    """The test projector for the default model (built on first use). Kept in a folder of
    its own: beside the model, the app would pair it with every test's model."""
    folder = MODEL_CACHE / "projectors"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"mmproj-test-v{BUILDER_VERSION}-{width}.gguf"
    if not out.exists():
        build_projector(out, width)
    return out


def image_bytes(
    color: tuple[int, int, int] = (200, 30, 30), size: tuple[int, int] = (120, 80), fmt: str = "PNG"
) -> bytes:
    """A small one-colour picture encoded as ``fmt`` (PNG, JPEG, WEBP, GIF, BMP)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return buf.getvalue()


def image_part(color: tuple[int, int, int] = (200, 30, 30), name: str = "picture.png") -> Any:
    """An ``ImagePart`` of a small PNG of ``color``."""
    from app.engine.chat_message import ImagePart

    return ImagePart.from_bytes(image_bytes(color), "image/png", 120, 80, name)
