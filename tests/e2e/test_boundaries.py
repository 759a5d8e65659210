"""Project rules as checked facts: the core is Qt-free; the CLI smoke test works."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import app
from tests.conftest import ROOT

ASGI_ROOTS = ("starlette", "uvicorn", "openai")


def loaded_roots(modules: list[str], roots: tuple[str, ...]) -> list[str]:
    """The modules under ``roots`` that importing ``modules`` loads, in a fresh process."""
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {roots!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    return [m for m in out.stdout.strip().split(",") if m]


def test_core_imports_no_qt() -> None:
    modules = [m.name for m in pkgutil.walk_packages(app.__path__, "app.")]
    assert len(modules) > 30  # every module of every layer, not just the packages
    bad = loaded_roots(modules, ("PySide6", "ui", "pyqtgraph"))
    assert bad == [], f"app/ pulled in Qt: {bad}"


def test_smoke_test_flag_prints_metrics(tmp_path: Path, model_path: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ui",
            "--data-dir",
            str(tmp_path),
            "--model",
            str(model_path),
            "--smoke-test",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["ok"] is True
    assert data["metrics"]["generated_tokens"] > 0
    assert data["model"]["template"] == "gemma (for gemma3)"
    assert (tmp_path / "logs" / "lamplight.log").exists()
    # Whether a window could open here (offscreen needs none of it): said, not required.
    window = data["window"]
    assert window["ok"] is True or window["message"].startswith("Lamplight cannot open")


def test_smoke_test_with_a_bad_model_fails_cleanly(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ui",
            "--data-dir",
            str(tmp_path),
            "--model",
            str(bad),
            "--smoke-test",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert out.returncode == 1
    assert "not a GGUF" in json.loads(out.stdout.strip().splitlines()[-1])["error"]


def test_signal_emit_keeps_reference_counts() -> None:
    """PySide6 6.12.0 under Python 3.11 loses a reference to True per emit(): a crash later."""
    from PySide6.QtCore import QObject, Signal

    class Emitter(QObject):
        text = Signal(int, str)

    emitter = Emitter()
    emitter.text.connect(lambda *_: None)
    before = sys.getrefcount(True)
    for _ in range(500):
        emitter.text.emit(1, "token")
    assert sys.getrefcount(True) >= before - 5


def test_the_window_and_serve_load_no_asgi_stack_until_a_server_starts() -> None:
    """Starlette and uvicorn are imported when a server starts, not with the GUI."""
    modules = [
        "ui.main",
        "ui.window.main_window",
        "ui.api.serve",
        "ui.api.api_status",
        "ui.api.api_dialog",
    ]
    loaded = loaded_roots([*modules, "app.api.runner", "app.api.requests"], ASGI_ROOTS)
    assert loaded == [], f"imported at start-up: {loaded}"


def test_serve_loads_no_qt() -> None:
    """``lamplight serve`` runs the engine host on a plain thread: its modules import no Qt
    (``test_api_server`` checks the running process's memory map)."""
    modules = ["ui.main", "ui.api.serve", "app.host.host", "app.api.host_gateway"]
    assert loaded_roots(modules, ("PySide6", "shiboken6")) == []


def test_serve_help_lists_its_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ui", "serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    for option in ("--host", "--port", "--model", "--api-key", "--data-dir", "--smoke-test"):
        assert option in out.stdout
