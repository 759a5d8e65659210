"""Memory figures from psutil, and what the app does when psutil cannot give them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from app.config.setting_records import LoadConfig
from app.engine.local.offload import fit_report
from app.engine.native.hardware import detect_hardware
from app.util import sysinfo
from tests.conftest import ROOT
from ui.models.model_manager import fits_hint


def test_figures_are_real() -> None:
    total, free, rss = sysinfo.physical_memory(), sysinfo.available_memory(), sysinfo.rss_bytes()
    assert total >= free > 0
    assert total == psutil.virtual_memory().total
    # This process (Python, numpy, Qt, llama_cpp imported) holds tens of MB at least.
    assert 20_000_000 < rss < total


def test_rss_follows_allocations() -> None:
    # In a fresh process: after a long test run this one holds freed memory that is still
    # resident, and a new block can reuse it without the figure moving (seen in CI).
    code = (
        "from app.util import sysinfo\n"
        "before = sysinfo.rss_bytes()\n"
        "block = bytearray(64 * 1024 * 1024)\n"
        "block[::4096] = b'x' * len(block[::4096])  # touch every page so it is resident\n"
        "print(sysinfo.rss_bytes() - before)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 48 * 1024 * 1024


def _refuse(*_args: object, **_kwargs: object) -> object:
    raise psutil.AccessDenied(1, "test")


def test_unknown_when_psutil_fails(
    monkeypatch: pytest.MonkeyPatch, model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(psutil, "virtual_memory", _refuse)
    monkeypatch.setattr(sysinfo, "_this_process", _refuse)
    monkeypatch.setattr(sysinfo, "_WARNED", set())
    assert sysinfo.physical_memory() == 0
    assert sysinfo.available_memory() == 0
    assert sysinfo.rss_bytes() == 0
    assert sysinfo.rss_bytes() == 0
    warnings = [r.getMessage() for r in caplog.records if "unknown" in r.getMessage()]
    assert len(warnings) == 3, warnings  # once per figure, not once per call
    # Callers read 0 as "unknown": no badge, no refusal to load, no message.
    assert fits_hint(300_000_000, sysinfo.available_memory()) == ""
    report = fit_report(model_path, LoadConfig(n_ctx=2048), detect_hardware())
    assert report.ram_available == 0 and report.fits and report.warning("m") == ""


def test_process_is_made_again_after_a_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    first = sysinfo._this_process()
    assert sysinfo._this_process() is first
    monkeypatch.setattr(sysinfo.os, "getpid", lambda: first.pid + 1_000_000)
    monkeypatch.setattr(psutil, "Process", lambda pid: ("made for", pid))
    assert sysinfo._this_process() == ("made for", first.pid + 1_000_000)
    monkeypatch.undo()
    assert sysinfo._this_process().pid == first.pid
