#!/usr/bin/env python3
"""llama-cpp-python built to run on any CPU of its platform, cached per machine.

    python packaging/llama_build.py [--python PY]   # build if needed, install into PY's env

A plain ``pip install llama-cpp-python`` compiles llama.cpp with
``-march=native``: the result only runs on CPUs like the builder's (a bundle
made on an AVX-512 machine dies with SIGILL elsewhere), and on a CPU with AMX
it takes the AMX kernels that crash on some Sapphire Rapids parts. This script
builds it the way llama.cpp's own releases are built instead:

- ``GGML_BACKEND_DL=ON``: the CPU code and any GPU backend are modules that
  ``app/engine/native/libs.py`` loads at start-up, choosing among them;
- ``GGML_CPU_ALL_VARIANTS=ON``: one CPU module per instruction-set level, from
  ``x64`` (any x86-64) up; the loader picks the best one this CPU runs, and
  ``LAMPLIGHT_CPU_VARIANT`` forces one;
- ``GGML_BACKEND_DIR=llama_cpp/lib``: the modules are installed next to
  ``libllama`` in the wheel;
- ``LLAMA_OPENSSL=OFF``: llama.cpp's common library (its chat layer) would
  otherwise need OpenSSL 3 on the user's machine, for downloads we never make.

The sdist is unpacked and two libraries are added to the wheel's ``llama_cpp/lib``:
llama.cpp's ``llama-common`` (built anyway, but installed outside the package) and
Lamplight's chat shim (``packaging/chat_shim``: a C face of llama.cpp's chat layer
for ctypes, ``app/engine/native/chat_shim.py``), compiled in the same CMake run so
its C++ ABI is that of ``llama-common``.

On macOS only ``GGML_NATIVE=OFF`` is set (Apple's compiler targets every Apple
CPU by default; Metal comes from llama-cpp-python's own build). ``CMAKE_ARGS``
from the environment are added after these, so a CUDA or Vulkan build (README,
"GPU builds") becomes one more backend module.

The wheel is cached in the user cache directory, keyed by the llama-cpp-python
version, the flags and the platform, so a fresh clone on the same machine (what
CI uses) installs it in seconds. pip's own wheel cache is not used for this: it
is keyed by the source URL alone and would hand back a build made with other
``CMAKE_ARGS``.

Stdlib only: it runs before the environment has anything installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pinned_version() -> str:
    """The llama-cpp-python version pyproject.toml pins (``==``)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'"llama-cpp-python==([0-9][0-9A-Za-z.+-]*)"', text)
    if found is None:
        raise SystemExit("pyproject.toml does not pin llama-cpp-python with ==")
    return found.group(1)


VERSION = pinned_version()
PORTABLE = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_BACKEND_DL=ON",
    "-DGGML_CPU_ALL_VARIANTS=ON",
    # STRING: ggml declares it a PATH, and CMake would make a relative PATH given on the
    # command line absolute (the temporary source folder), installing the modules there.
    "-DGGML_BACKEND_DIR:STRING=llama_cpp/lib",
    "-DLLAMA_OPENSSL=OFF",
)
MACOS = ("-DGGML_NATIVE=OFF", "-DLLAMA_OPENSSL=OFF")
SHIM = ROOT / "packaging" / "chat_shim"
# Appended to llama-cpp-python's CMakeLists.txt: the shim, and both libraries installed
# into the package (its own install helper: llama_cpp/lib, rpath $ORIGIN).
SHIM_CMAKE = """
# Lamplight (packaging/llama_build.py): llama.cpp's chat layer for ctypes.
if (LLAMA_BUILD AND TARGET llama-common)
    add_subdirectory(lamplight_chat)
    llama_cpp_python_install_target(llama-common)
    llama_cpp_python_install_target(lamplight-chat)
endif()
"""
STAMP_NAME = ".lamplight-llama-build"


def say(msg: str) -> None:
    print(f"[lamplight] {msg}", flush=True)


def flags() -> tuple[str, ...]:
    """The CMake flags for this platform, then the user's ``CMAKE_ARGS``."""
    ours = MACOS if sys.platform == "darwin" else PORTABLE
    extra = tuple(os.environ.get("CMAKE_ARGS", "").split())
    return (*ours, *extra)


def user_cache_dir() -> Path:
    """platformdirs' ``user_cache_dir("lamplight")``, without platformdirs."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "lamplight" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "lamplight"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lamplight"


def shim_digest() -> str:
    """The chat shim's sources, so a change to them is a new build."""
    digest = hashlib.sha256()
    for path in sorted(SHIM.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_key(version: str = VERSION) -> str:
    """Names one build: version, flags, the shim, OS and machine."""
    text = "\n".join((version, *flags(), shim_digest(), sys.platform, platform.machine()))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def wheel_dir(version: str = VERSION) -> Path:
    return user_cache_dir() / "wheels" / f"llama-cpp-python-{version}-{build_key(version)}"


def cached_wheel(version: str = VERSION) -> Path | None:
    found = sorted(wheel_dir(version).glob("llama_cpp_python-*.whl"))
    return found[0] if found else None


def unpacked_sdist(python: str, work: Path, version: str = VERSION) -> Path:
    """The llama-cpp-python sdist, downloaded and unpacked, with the chat shim added."""
    cmd = [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*cmd, "-d", str(work), f"llama-cpp-python=={version}"], check=True)
    sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(work / "src", filter="data")
    src = next((work / "src").glob("llama_cpp_python-*"))
    add_shim(src)
    return src


def add_shim(src: Path) -> None:
    """Copy the shim into the unpacked sdist and add it to its CMakeLists.txt."""
    lists = src / "CMakeLists.txt"
    text = lists.read_text(encoding="utf-8")
    if "llama_cpp_python_install_target" not in text:
        raise SystemExit("llama-cpp-python's CMakeLists.txt changed: no install helper")
    shutil.copytree(SHIM, src / "lamplight_chat", dirs_exist_ok=True)
    lists.write_text(text + SHIM_CMAKE, encoding="utf-8")


def pip_wheel(python: str, cmake_args: str, out: Path, version: str = VERSION) -> Path:
    """``pip wheel`` llama-cpp-python from its sdist with ``cmake_args`` into ``out``."""
    env = {
        **os.environ,
        "CMAKE_ARGS": cmake_args,
        "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2),
    }
    src = unpacked_sdist(python, out / "sdist", version)
    # --no-cache-dir: never a wheel pip built earlier with other flags.
    cmd = [python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(out)]
    subprocess.run([*cmd, str(src)], check=True, env=env)
    return next(out.glob("llama_cpp_python-*.whl"))


def build_wheel(python: str, version: str = VERSION) -> Path:
    """Build the wheel (minutes: several CPU modules) into the cache; returns it."""
    target = wheel_dir(version)
    say(f"building llama.cpp for any CPU ({' '.join(flags())}); about 20 minutes on two cores")
    with tempfile.TemporaryDirectory(prefix="lamplight-wheel-") as tmp:
        built = pip_wheel(python, " ".join(flags()), Path(tmp), version)
        target.mkdir(parents=True, exist_ok=True)
        staging = target / (built.name + ".tmp")
        shutil.copy2(built, staging)
        os.replace(staging, target / built.name)  # atomic: never a half-copied wheel
    wheel = cached_wheel(version)
    assert wheel is not None
    return wheel


def ensure_installed(python: str, venv: Path) -> None:
    """Install the portable build into ``venv`` unless it already has this very build."""
    stamp = venv / STAMP_NAME
    key = build_key()
    if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == key:
        return
    wheel = cached_wheel() or build_wheel(python)
    say(f"installing {wheel.name} (build {key})")
    subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)], check=True
    )
    stamp.write_text(key, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the environment's python")
    parser.add_argument("--print-key", action="store_true", help="print the build key and exit")
    args = parser.parse_args(argv)
    if args.print_key:
        print(build_key())
        return 0
    # Not resolve(): a venv's python is a symlink to the base interpreter.
    venv = Path(args.python).absolute().parent.parent
    ensure_installed(args.python, venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
