"""llama.cpp's shared libraries: which CPU variant and GPU backends run, and on what machine.

Lamplight's llama.cpp is built the way llama.cpp's own releases are
(``GGML_BACKEND_DL`` + ``GGML_CPU_ALL_VARIANTS``, see ``packaging/llama_build.py``):
the CPU code is one module per instruction-set level (``libggml-cpu-x64.so`` …
``libggml-cpu-sapphirerapids.so``) and nothing is linked in. Before any model
loads, :func:`load_backends` picks the CPU module this processor runs best (each
module's own ``ggml_backend_score``, as ``ggml_backend_load_best`` does, but here,
so the choice is known and can be forced) and loads the GPU modules that are
there. ``LAMPLIGHT_CPU_VARIANT=x64`` (or any module's tag) forces a variant: the
frozen bundle's smoke test uses it to prove it does not need the builder's CPU.

A build without backend modules (an older venv, a static build) has its CPU
code linked in; then there is nothing to load and the variant is ``built-in``.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

VARIANT_ENV = "LAMPLIGHT_CPU_VARIANT"
BUILT_IN = "built-in"
# CPU flags that decide which kernels run; the machine key and the Hardware page use them.
_KEY_FLAGS = (
    "sse4_2",
    "avx",
    "f16c",
    "fma",
    "avx2",
    "bmi2",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimddp",
    "sve",
    "sve2",
    "i8mm",
    "sme",
)


class BackendLoadError(RuntimeError):
    """The llama.cpp build has backend modules but none of them can run here."""


@dataclass(frozen=True)
class LoadedBackends:
    """What :func:`load_backends` loaded."""

    cpu_variant: str  # the module's tag ("haswell"), or BUILT_IN
    cpu_library: Path | None  # the loaded CPU module; None when linked in
    forced: bool  # chosen through LAMPLIGHT_CPU_VARIANT
    available: tuple[str, ...]  # every CPU variant in the build, by tag
    gpu_modules: tuple[str, ...]  # GPU backend modules that loaded ("cuda")
    failed: tuple[str, ...] = ()  # modules that would not load, with why


_lock = threading.Lock()
_loaded: LoadedBackends | None = None


def lib_dir() -> Path:
    """The folder llama-cpp-python loaded ``libllama`` from (its ``llama_cpp/lib``)."""
    from llama_cpp import llama_cpp as lc

    return Path(lc._base_path)


def _module_name(stem: str) -> str:
    if sys.platform == "win32":
        return f"{stem}.dll"
    return f"lib{stem}.so"  # ggml names backend modules .so on macOS too


def shared_library(stem: str, directory: Path | None = None) -> Path:
    """The file of llama.cpp's shared library ``stem`` ("ggml", "ggml-base") that
    ``libllama`` itself loaded, so that ctypes gets the same copy.

    A Linux wheel holds ``libggml.so``, ``libggml.so.0`` and ``libggml.so.0.y.z`` as
    three separate files; ``libllama`` loads ``libggml.so.0`` (its soname). Opening
    ``libggml.so`` would load a second copy with its own backend registry, where the
    backends loaded here do not exist.
    """
    directory = directory or lib_dir()
    if sys.platform == "win32":
        return directory / f"{stem}.dll"
    if sys.platform == "darwin":
        return directory / f"lib{stem}.dylib"
    versioned = sorted(directory.glob(f"lib{stem}.so.*"), key=lambda p: len(p.name))
    return versioned[0] if versioned else directory / f"lib{stem}.so"


def cpu_variants(directory: Path | None = None) -> dict[str, Path]:
    """The CPU modules of this build, tag -> file (empty when the CPU code is linked in)."""
    directory = directory or lib_dir()
    prefix = _module_name("ggml-cpu-").rsplit(".", 1)[0]
    suffix = "." + _module_name("x").rsplit(".", 1)[1]
    out = {}
    for path in sorted(directory.glob(f"{prefix}*{suffix}")):
        tag = path.name[len(prefix) : -len(suffix)]
        if tag:
            out[tag] = path
    return out


def _gpu_modules(directory: Path) -> list[Path]:
    skip = {_module_name(s) for s in ("ggml", "ggml-base", "ggml-cpu")}
    cpu_prefix = _module_name("ggml-cpu-").rsplit(".", 1)[0]
    suffix = "." + _module_name("x").rsplit(".", 1)[1]
    prefix = _module_name("ggml-").rsplit(".", 1)[0]
    return [
        p
        for p in sorted(directory.glob(f"{prefix}*{suffix}"))
        if p.name not in skip and not p.name.startswith(cpu_prefix)
    ]


def _score(path: Path) -> int:
    """The module's own ``ggml_backend_score()``: 0 when this CPU cannot run it."""
    try:
        mod = ctypes.CDLL(str(path))
    except OSError as exc:
        log.info("CPU module %s does not load: %s", path.name, exc)
        return 0
    try:
        fn = mod.ggml_backend_score
        fn.restype = ctypes.c_int
        fn.argtypes = []
        return int(fn())
    except AttributeError:
        return 0
    finally:
        _unload(mod)  # as ggml_backend_load_best does: only the chosen one stays


def _unload(mod: ctypes.CDLL) -> None:
    import _ctypes

    close = getattr(_ctypes, "FreeLibrary" if sys.platform == "win32" else "dlclose", None)
    if close is not None:
        close(mod._handle)


def _libggml(directory: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(shared_library("ggml", directory)))
    lib.ggml_backend_load.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_load.restype = ctypes.c_void_p
    return lib


def load_backends() -> LoadedBackends:
    """Load the CPU variant and GPU modules once per process; later calls return the same.

    Raises:
        BackendLoadError: the build has CPU modules but the forced one is unknown or
            none runs on this CPU.
    """
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load(lib_dir(), os.environ.get(VARIANT_ENV, "").strip())
            log.info(
                "llama.cpp CPU variant %s%s (of %s); GPU modules %s",
                _loaded.cpu_variant,
                " (forced)" if _loaded.forced else "",
                ", ".join(_loaded.available) or "none",
                ", ".join(_loaded.gpu_modules) or "none",
            )
        return _loaded


def loaded() -> LoadedBackends | None:
    """What :func:`load_backends` loaded, or None before it ran."""
    return _loaded


def _load(directory: Path, forced: str) -> LoadedBackends:
    variants = cpu_variants(directory)
    if not variants:
        return LoadedBackends(BUILT_IN, None, False, (), ())
    if forced:
        if forced not in variants:
            raise BackendLoadError(
                f"{VARIANT_ENV}={forced} names no CPU variant of this build "
                f"(it has {', '.join(variants)})."
            )
        choice = forced
    else:
        scores = {tag: _score(path) for tag, path in variants.items()}
        choice, best = max(scores.items(), key=lambda kv: kv[1])
        if best <= 0:
            raise BackendLoadError(
                "None of this llama.cpp build's CPU variants runs on this processor "
                f"({', '.join(variants)})."
            )
    ggml = _libggml(directory)
    failed: list[str] = []
    gpus: list[str] = []
    for module in _gpu_modules(directory):
        if ggml.ggml_backend_load(str(module).encode()):
            gpus.append(module.stem.removeprefix("lib").removeprefix("ggml-"))
        else:  # no driver, no device: the CPU still works
            failed.append(f"{module.name}: does not load here (see the log)")
    if not ggml.ggml_backend_load(str(variants[choice]).encode()):
        raise BackendLoadError(f"The CPU module {variants[choice].name} does not load.")
    return LoadedBackends(
        choice, variants[choice], bool(forced), tuple(variants), tuple(gpus), tuple(failed)
    )


def cpu_flags() -> tuple[str, ...]:
    """The instruction-set flags of this CPU that decide which kernels run (Linux reads
    ``/proc/cpuinfo``; elsewhere empty)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read(1_000_000)
    except OSError:
        return ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            present = set(value.split())
            return tuple(f for f in _KEY_FLAGS if f in present)
    return ()


def cpu_name() -> str:
    """The processor's model name, as the OS gives it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh.read(1_000_000).splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_id(directory: Path | None = None) -> str:
    """Names the llama.cpp build: llama-cpp-python's version and its libraries' names and sizes."""
    import importlib.metadata

    directory = directory or lib_dir()
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    h = hashlib.sha256(version.encode())
    for path in sorted(directory.iterdir()) if directory.is_dir() else ():
        try:
            h.update(f"{path.name}:{path.stat().st_size}".encode())
        except OSError:
            continue
    return f"{version}-{h.hexdigest()[:12]}"


def machine_key(directory: Path | None = None) -> str:
    """The build and the CPU: a verdict about a native code path holds for this pair.

    The forced variant is part of it: another variant runs other kernels.
    """
    state = loaded()
    variant = os.environ.get(VARIANT_ENV, "").strip() or (state.cpu_variant if state else "")
    cpu = hashlib.sha256(
        "|".join((platform.machine(), cpu_name(), *cpu_flags(), variant)).encode()
    ).hexdigest()[:12]
    return f"{build_id(directory)}/{cpu}"
