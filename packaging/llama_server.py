"""llama.cpp's ``llama-server``, built once from the sources llama-cpp-python vendors.

The remote-backend tests (issue 15) run Lamplight against a real llama-server
of the same llama.cpp as the in-process engine. Building it takes about 12
minutes on two cores, so the binary is cached in the user's cache directory,
outside the checkout, keyed by the llama-cpp-python version and the build
flags: a fresh clone on the same machine (what CI uses) finds it at once.

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
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_NATIVE=ON",
    "-DCMAKE_BUILD_TYPE=Release",
)


def llama_cpp_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def cache_path(version: str | None = None) -> Path:
    """Where the binary for this llama-cpp-python version and these flags lives."""
    from platformdirs import user_cache_dir

    version = version or llama_cpp_version()
    key = hashlib.sha256("\n".join((version, *FLAGS)).encode()).hexdigest()[:12]
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
        built = build / "bin" / "llama-server"
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(target.name + ".tmp")
        shutil.copy2(built, staging)
        staging.chmod(0o755)
        os.replace(staging, target)  # atomic: a half-copied binary is never found
    return target


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
