"""What the installed llama.cpp build can run on: CPU, CUDA, Metal, Vulkan..."""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "accelerator", 4: "meta"}


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    kind: str
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class HardwareInfo:
    """The compute backends llama.cpp reports at run time."""

    gpu_offload: bool
    devices: tuple[Device, ...] = field(default_factory=tuple)
    cpu_name: str = ""
    cpu_flags: tuple[str, ...] = ()  # the instruction sets that decide the kernels
    cpu_variant: str = ""  # the llama.cpp CPU module in use ("haswell"), or "built-in"
    cpu_variants: tuple[str, ...] = ()  # every CPU module of this build
    cpu_forced: bool = False  # chosen through LAMPLIGHT_CPU_VARIANT

    @property
    def label(self) -> str:
        """``CPU``, or the GPU backend's family (``CUDA``, ``Metal``, ``Vulkan``...)."""
        for d in self.devices:
            if d.kind in ("GPU", "iGPU"):
                for family in ("CUDA", "Metal", "MTL", "Vulkan", "ROCm", "HIP", "SYCL"):
                    if d.name.upper().startswith(family.upper()):
                        return "Metal" if family == "MTL" else family
                return d.name
        return "CPU"


def detect_hardware() -> HardwareInfo:
    """Ask the loaded llama.cpp library which devices it has; never raises."""
    import llama_cpp

    from app.engine.native.libs import BackendLoadError, cpu_flags, cpu_name, load_backends

    try:
        loaded = load_backends()
        variant, variants, forced = loaded.cpu_variant, loaded.available, loaded.forced
    except (BackendLoadError, OSError) as exc:
        log.warning("llama.cpp backends: %s", exc)
        variant, variants, forced = "", (), False
    try:
        gpu = bool(llama_cpp.llama_supports_gpu_offload())
    except (AttributeError, OSError):
        gpu = False
    return HardwareInfo(
        gpu_offload=gpu,
        devices=tuple(_devices()),
        cpu_name=cpu_name(),
        cpu_flags=cpu_flags(),
        cpu_variant=variant,
        cpu_variants=variants,
        cpu_forced=forced,
    )


def _devices() -> list[Device]:
    try:
        from app.engine.native.libs import shared_library

        lib = ctypes.CDLL(str(shared_library("ggml")))  # libllama's copy: its registry

        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_char_p
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_memory.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(ctypes.c_size_t),
        ]
        lib.ggml_backend_dev_memory.restype = None
        out = []
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            out.append(
                Device(
                    name=(lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                    description=(lib.ggml_backend_dev_description(dev) or b"").decode(
                        errors="replace"
                    ),
                    kind=_DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown"),
                    free_bytes=free.value,
                    total_bytes=total.value,
                )
            )
        return out
    except (AttributeError, OSError) as exc:
        log.info("ggml device query unavailable: %s", exc)
        return []
