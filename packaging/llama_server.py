"""llama.cpp's ``llama-server``, built once from the sources llama-cpp-python vendors.

The remote-backend tests (issue 15) run Lamplight against a real llama-server
of the same llama.cpp as the in-process engine. It is built like that engine
(``packaging/llama_build.py``): shared libraries with ``GGML_BACKEND_DL``, so it
runs on any CPU. Its own build leaves the CPU code out (``GGML_CPU=OFF``) and
takes the CPU variant modules from the installed llama-cpp-python instead: the
same sources and ggml flags, so the same ABI, and the slowest part of the build
is not compiled twice. llama-server's ``ggml_backend_load_all()`` finds them
beside the binary and picks the best one for this CPU.

The result is cached in the user's cache directory, outside the checkout,
keyed by the llama-cpp-python version, its build and these flags: a fresh clone
on the same machine (what CI uses) finds it at once.

Usage: python packaging/llama_server.py   (prints the binary's path, building it if needed)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

FLAGS = (
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_BACKEND_DL=ON",
    "-DGGML_CPU=OFF",  # the CPU modules come from llama-cpp-python's build
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DCMAKE_BUILD_TYPE=Release",
    # The binary finds its libraries beside it once copied into the cache.
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)


def llama_cpp_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def cache_path(version: str | None = None) -> Path:
    """Where the binary for this llama-cpp-python version and these flags lives."""
    from platformdirs import user_cache_dir

    version = version or llama_cpp_version()
    modules = sorted(p.name for p in _backend_modules())
    key = hashlib.sha256("\n".join((version, *FLAGS, *modules)).encode()).hexdigest()[:12]
    return Path(user_cache_dir("lamplight")) / f"llama-server-{version}-{key}" / "llama-server"


def ensure_llama_server(log: bool = True) -> Path:
    """The cached ``llama-server`` binary, built from the pinned sdist when missing."""
    target = cache_path()
    if target.is_file() and os.access(target, os.X_OK):
        return target
    version = llama_cpp_version()
    with tempfile.TemporaryDirectory(prefix="lamplight-llama-server-") as tmp:
        work = Path(tmp)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={version}",
                "-d",
                str(work),
            ],
            log,
        )
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        src = _extract_vendor(sdist, work / "src")
        build = work / "build"
        jobs = str(os.cpu_count() or 2)
        cmake = _tool("cmake")
        ninja = [f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"]
        _run([cmake, "-S", str(src), "-B", str(build), "-G", "Ninja", *ninja, *FLAGS], log)
        _run([cmake, "--build", str(build), "--target", "llama-server", "-j", jobs], log)
        staging = target.parent.with_name(target.parent.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for path in (build / "bin").iterdir():
            if path.name == "llama-server" or ".so" in path.name or path.suffix == ".dll":
                shutil.copy2(path, staging / path.name, follow_symlinks=True)
        for module in _backend_modules():
            shutil.copy2(module, staging / module.name)
        (staging / "llama-server").chmod(0o755)
        shutil.rmtree(target.parent, ignore_errors=True)
        os.replace(staging, target.parent)  # atomic: a half-copied folder is never found
    return target


def _backend_modules() -> list[Path]:
    """The installed llama-cpp-python's backend modules (CPU variants, GPU backends)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llama-cpp-python is not installed in this environment")
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    shared = {"libggml.so", "libggml-base.so"}
    return sorted(
        p for p in lib.glob("libggml-*.so") if p.name not in shared and not p.is_symlink()
    )


def _extract_vendor(sdist: Path, dest: Path) -> Path:
    """Unpack the sdist's ``vendor/llama.cpp`` (members checked to stay inside ``dest``)."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in f"/{m.name}/"]
        tar.extractall(dest, members=members, filter="data")
    return next(dest.glob("*/vendor/llama.cpp"))


def _tool(name: str) -> str:
    """``name`` from this environment (the dev extras install cmake and ninja), else PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} is needed to build llama-server; install it (pip install {name})")
    return found


def _run(cmd: list[str], log: bool) -> None:
    out = None if log else subprocess.DEVNULL
    subprocess.run(cmd, check=True, stdout=out, stderr=out if out is None else subprocess.STDOUT)


if __name__ == "__main__":
    print(ensure_llama_server())
