"""GPU layer offload: how many layers fit, falling back to the CPU, and what to install.

``auto`` estimates each layer's weights and KV cache from the GGUF and fits as
many as the free device memory allows, with a margin. A load that fails on
the GPU (out of memory, no device) is retried on the CPU with a one-line note.
"""

from __future__ import annotations

import logging
import platform
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.config.setting_records import LoadConfig
from app.engine.native.hardware import Device, HardwareInfo
from app.gguf.info import GgufInfo, read_gguf_info
from app.gguf.memory import estimate_ram
from app.util.errors import LamplightError, ModelLoadError
from app.util.sysinfo import available_memory, size_text

log = logging.getLogger(__name__)

AUTO = -2  # LoadConfig.n_gpu_layers: let the app decide
ALL = -1  # every layer
MARGIN_BYTES = 512 * 1024 * 1024
MARGIN_FRACTION = 0.10
KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32}


@dataclass(frozen=True)
class FitReport:
    """Whether a model fits, before loading it."""

    ram_needed: int
    ram_available: int
    vram_needed: int
    vram_available: int
    gpu_layers: int

    @property
    def fits(self) -> bool:
        ram_ok = self.ram_available <= 0 or self.ram_needed <= self.ram_available
        vram_ok = self.gpu_layers == 0 or self.vram_needed <= self.vram_available
        return ram_ok and vram_ok

    def warning(self, name: str) -> str:
        if self.fits:
            return ""
        if self.ram_available > 0 and self.ram_needed > self.ram_available:
            return (
                f"{name} needs about {size_text(self.ram_needed)} of memory and "
                f"{size_text(self.ram_available)} is free; it may be very slow or fail."
            )
        return (
            f"{name} needs about {size_text(self.vram_needed)} of GPU memory for "
            f"{self.gpu_layers} layers and {size_text(self.vram_available)} is free."
        )


def gpu_devices(backend: HardwareInfo) -> list[Device]:
    return [d for d in backend.devices if d.kind in ("GPU", "iGPU")]


def layer_bytes(info: GgufInfo, n_ctx: int, kv_type: str) -> float:
    """Weights plus KV cache of one transformer layer (the output layer not counted)."""
    layers = info.n_layers or 1
    kv = 0.0
    if info.n_embd_k_gqa and info.n_embd_v_gqa:
        kv = n_ctx * (info.n_embd_k_gqa + info.n_embd_v_gqa) * KV_BYTES.get(kv_type, 2.0)
    return info.file_size / (layers + 1) + kv


def auto_gpu_layers(info: GgufInfo, config: LoadConfig, backend: HardwareInfo) -> int:
    """Layers to offload: 0 with no GPU, else as many as fit with a margin (ALL if all do)."""
    devices = gpu_devices(backend)
    if not backend.gpu_offload or not devices:
        return 0
    free = max(d.free_bytes for d in devices)
    usable = free - MARGIN_BYTES - MARGIN_FRACTION * free
    per_layer = layer_bytes(info, config.n_ctx, config.kv_type)
    layers = info.n_layers or 0
    if per_layer <= 0 or usable <= 0 or layers == 0:
        return 0
    n = int(usable // per_layer)
    # The output layer needs room too before "all" is honest.
    return ALL if n >= layers + 1 else max(0, min(n, layers))


def resolve(config: LoadConfig, info: GgufInfo, backend: HardwareInfo) -> LoadConfig:
    """``config`` with ``auto`` turned into a layer count."""
    if config.n_gpu_layers != AUTO:
        return config
    return replace(config, n_gpu_layers=auto_gpu_layers(info, config, backend))


def fit_report(path: str | Path, config: LoadConfig, backend: HardwareInfo) -> FitReport:
    """RAM and VRAM a load would need, against what is free (never raises for a bad file)."""
    try:
        info = read_gguf_info(path)
    except LamplightError:
        return FitReport(0, available_memory(), 0, 0, 0)
    resolved = resolve(config, info, backend)
    layers = resolved.n_gpu_layers
    total_layers = (info.n_layers or 0) + 1
    n_gpu = total_layers if layers == ALL else max(0, layers)
    ram = estimate_ram(info, config.n_ctx, KV_BYTES.get(config.kv_type, 2.0))
    vram = int(n_gpu * layer_bytes(info, config.n_ctx, config.kv_type))
    devices = gpu_devices(backend)
    return FitReport(
        ram_needed=max(0, ram - vram),
        ram_available=available_memory(),
        vram_needed=vram,
        vram_available=max((d.free_bytes for d in devices), default=0),
        gpu_layers=n_gpu,
    )


def load_with_fallback(
    engine: Any, path: str | Path, config: LoadConfig, progress: Any = None
) -> tuple[Any, str]:
    """Load with GPU offload; if that fails, load on the CPU. Returns (info, note).

    Raises:
        ModelFileError, ModelLoadError, LoadCancelled: as ``Engine.load``, when the CPU
            load fails too (or the file is bad, which no device can fix).
    """
    try:
        resolved = resolve(config, read_gguf_info(path), engine.hardware())
    except LamplightError:
        resolved = config  # the engine's own load reports what is wrong with the file
    from app.engine.native.llama_log import RECENT_PROBLEMS

    RECENT_PROBLEMS.clear()  # what llama.cpp says during this load alone
    try:
        return engine.load(path, resolved, progress), ""
    except ModelLoadError as exc:
        if resolved.n_gpu_layers == 0:
            raise
        log.warning("GPU load failed, retrying on the CPU: %s", exc)
        why = _gpu_reason(exc, RECENT_PROBLEMS)
        note = f"Loading on the GPU failed ({why}); running on the CPU instead."
        return engine.load(path, replace(resolved, n_gpu_layers=0), progress), note


OUT_OF_MEMORY = ("out of memory", "unable to allocate", "failed to allocate")


def _gpu_reason(exc: ModelLoadError, log_lines: Any) -> str:
    """Why a GPU load failed. llama.cpp's error for any failed load blames the file; an
    allocation failure is told only in its log (seen on an H100, docs/notes/gpu.md)."""
    text = " ".join(str(line) for line in log_lines).lower() + " " + str(exc).lower()
    if any(words in text for words in OUT_OF_MEMORY):
        return "not enough free GPU memory"
    return _first_line(exc)


def accelerator_hint(backend: HardwareInfo) -> str:
    """How to get a GPU build, when this build is CPU-only on a machine with a GPU."""
    if backend.gpu_offload and gpu_devices(backend):
        return ""
    from app.engine.native.libs import loaded

    modules = loaded()
    if modules is not None and modules.gpu_modules:  # a GPU build: a rebuild would not help
        return (
            f"This llama.cpp build has {', '.join(m.upper() for m in modules.gpu_modules)} "
            "support but found no usable GPU: check the GPU driver (and CUDA_VISIBLE_DEVICES "
            "or the like). Models run on the CPU meanwhile."
        )
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return (
            "This llama.cpp build runs on the CPU only. For the Apple GPU, rebuild it: "
            'CMAKE_ARGS="-DGGML_METAL=on" python3 packaging/bootstrap.py run'
        )
    if _has_nvidia():
        return (
            "This llama.cpp build runs on the CPU only, and an NVIDIA GPU is present. "
            'For CUDA, rebuild it: CMAKE_ARGS="-DGGML_CUDA=on" python3 packaging/bootstrap.py run'
        )
    return ""


def _has_nvidia() -> bool:
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else exc.__class__.__name__
