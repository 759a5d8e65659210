"""Real LoRA adapter GGUFs for the default model, written with ``gguf.GGUFWriter``.

Shapes come from the model's own tensor table (read with ``app.gguf.info``), in
llama.cpp's orientation: for a model tensor ``W`` of ``ne = [n_in, n_out]``,
``W.lora_a`` has ``ne = [n_in, rank]`` and ``W.lora_b`` has ``ne = [rank, n_out]``
(numpy shapes are the reverse). Weights are seeded random values, large enough
to move the logits visibly at scale 1.

Broken files for the refusal tests come from the same writer: another
architecture, a pair whose dimensions fit a different tensor, a GGUF that is a
model rather than an adapter, a truncated file and garbage behind a GGUF magic.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.gguf.info import _parse_header

DEFAULT_TARGETS = ("attn_q", "attn_v", "ffn_up")
DEFAULT_LAYERS = (0, 1, 2, 3)


def model_shapes(model_path: Path) -> tuple[str, dict[str, list[int]]]:
    """The model's architecture and its tensors' ``ne`` dims by name."""
    meta, tensors, _ = _parse_header(Path(model_path))
    return str(meta["general.architecture"]), {name: dims for name, dims, _, _ in tensors}


def make_lora(
    path: Path,
    model_path: Path,
    *,
    targets: Sequence[str] = DEFAULT_TARGETS,
    layers: Sequence[int] = DEFAULT_LAYERS,
    rank: int = 8,
    alpha: float = 16.0,
    seed: int = 0,
    strength: float = 0.05,
    architecture: str | None = None,
    general_type: str = "adapter",
    adapter_type: str = "lora",
    dtype: type[np.floating] = np.float32,
    shape_from: str | None = None,
    name: str | None = None,
) -> Path:
    """Write a LoRA adapter for ``model_path``'s tensors ``blk.{layer}.{target}.weight``.

    Args:
        strength: standard deviation of ``lora_b`` (``lora_a`` is scaled by
            1/sqrt(n_in) so its outputs stay near unit size).
        architecture, general_type, adapter_type: override the header (broken files).
        shape_from: take every pair's dimensions from this target instead of its own
            (a wrong-dimension adapter).
    """
    arch, shapes = model_shapes(model_path)
    rng = np.random.default_rng(seed)
    writer = _writer(path, architecture or arch, general_type, name or Path(path).stem)
    writer.add_string("adapter.type", adapter_type)
    writer.add_float32("adapter.lora.alpha", alpha)
    for layer in layers:
        for target in targets:
            tensor = f"blk.{layer}.{target}.weight"
            n_in, n_out = shapes[f"blk.{layer}.{shape_from or target}.weight"][:2]
            a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
            b = rng.standard_normal((n_out, rank)) * strength
            writer.add_tensor(f"{tensor}.lora_a", a.astype(dtype))
            writer.add_tensor(f"{tensor}.lora_b", b.astype(dtype))
    _finish(writer)
    return Path(path)


def wrong_architecture_lora(path: Path, model_path: Path) -> Path:
    """A well-formed adapter that says it was built for llama."""
    return make_lora(path, model_path, architecture="llama")


def wrong_dimension_lora(path: Path, model_path: Path) -> Path:
    """``attn_k`` pairs shaped for ``attn_q`` (640x1024 where the model has 640x256)."""
    return make_lora(path, model_path, targets=("attn_k",), layers=(0,), shape_from="attn_q")


def model_gguf(path: Path, model_path: Path) -> Path:
    """A GGUF whose ``general.type`` is ``model``: not an adapter at all."""
    return make_lora(path, model_path, general_type="model", layers=(0,))


def truncated_lora(path: Path, model_path: Path) -> Path:
    """A valid adapter cut off in the middle of its tensor data."""
    make_lora(path, model_path)
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.truncate(size // 2)
    return Path(path)


def corrupt_lora(path: Path) -> Path:
    """A GGUF magic and version followed by random bytes."""
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + os.urandom(4096))
    return Path(path)


def _writer(path: Path, arch: str, general_type: str, name: str) -> Any:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(general_type)
    writer.add_name(name)
    return writer


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
