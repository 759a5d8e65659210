"""Native paths that crash on some CPUs: checked in a child, switched off, remembered, shown.

The crash that motivated this (AMX kernels behind llama.cpp's repacked weights on
some Sapphire Rapids CPUs) cannot happen on every test machine, so the crash is
injected: a child command that segfaults or aborts where the real check runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config.setting_records import LoadConfig
from app.engine.native.guard import NativeGuard, Prepared, wanted_paths
from app.engine.native.libs import VARIANT_ENV, cpu_variants, load_backends, machine_key
from app.engine.native.path_probe import ProbeResult, crash_name, run_probe
from app.engine.native.paths import FILE_NAME, PathVerdicts, RiskyPath
from app.util.errors import ModelLoadError
from tests.conftest import ONE_THREAD
from tests.hypothesis_budget import examples

ROOT = Path(__file__).resolve().parents[2]
SEGFAULT = [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]
ABORT = [sys.executable, "-c", "import os; os.abort()"]
POSIX = pytest.mark.skipif(os.name != "posix", reason="signals")


def _fake_probe(crashing: set[RiskyPath | None], calls: list[RiskyPath | None]):  # type: ignore[no-untyped-def]
    def probe(path: RiskyPath | None, model: Path, threads: int) -> ProbeResult:
        calls.append(path)
        crashed = path in crashing
        return ProbeResult(path, crashed, True, "crashed (SIGSEGV)" if crashed else "ok", 0.1)

    return probe


# -- the store --------------------------------------------------------------------


def test_verdicts_are_remembered_per_machine(tmp_path: Path) -> None:
    file = tmp_path / FILE_NAME
    here = PathVerdicts(file, "build-a/cpu-1")
    here.record(RiskyPath.EXTRA_BUFTS, False, "a test run crashed (SIGSEGV)", "probe")
    here.record(RiskyPath.FLASH_ATTN, True, "worked", "probe")
    other = PathVerdicts(file, "build-b/cpu-1")  # a llama.cpp upgrade: checked again
    assert other.verdicts() == {}
    other.record(RiskyPath.EXTRA_BUFTS, True, "worked", "probe")
    again = PathVerdicts(file, "build-a/cpu-1")  # the next start
    assert again.disabled() == {RiskyPath.EXTRA_BUFTS}
    assert again.unknown() == (RiskyPath.GPU_OFFLOAD,)
    assert "SIGSEGV" in again.verdicts()[RiskyPath.EXTRA_BUFTS].reason
    again.forget(RiskyPath.EXTRA_BUFTS)
    assert again.disabled() == frozenset()
    assert PathVerdicts(file, "build-b/cpu-1").verdicts()[RiskyPath.EXTRA_BUFTS].ok


def test_a_damaged_store_is_set_aside_and_the_checks_run_again(tmp_path: Path) -> None:
    file = tmp_path / FILE_NAME
    file.write_text("{not json")
    store = PathVerdicts(file, "k")
    assert store.verdicts() == {}
    assert any("set aside" in n for n in store.notes)
    assert (tmp_path / f"{FILE_NAME}.bad").exists()
    store.record(RiskyPath.EXTRA_BUFTS, False, "crashed", "probe")
    assert PathVerdicts(file, "k").disabled() == {RiskyPath.EXTRA_BUFTS}


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_mutated_store_files_never_break_reading(tmp_path: Path, data: st.DataObject) -> None:
    file = tmp_path / FILE_NAME
    good = {
        "version": 1,
        "machines": {
            "k": {"extra_bufts": {"ok": False, "reason": "x", "source": "probe", "when": 1.0}}
        },
    }
    raw = bytearray(json.dumps(good).encode())
    for _ in range(data.draw(st.integers(0, 6))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(0, len(raw) - 1)))
        if op == "flip" and raw:
            raw[pos] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del raw[pos:]
        else:
            raw[pos:pos] = data.draw(st.binary(max_size=8))
    file.write_bytes(bytes(raw))
    store = PathVerdicts(file, "k")
    for path, verdict in store.verdicts().items():  # whatever survives is well formed
        assert isinstance(path, RiskyPath) and isinstance(verdict.ok, bool)
    store.record(RiskyPath.FLASH_ATTN, True, "ok", "probe")  # and it can be written again
    assert PathVerdicts(file, "k").verdicts()[RiskyPath.FLASH_ATTN].ok


# -- the child --------------------------------------------------------------------


@POSIX
@pytest.mark.parametrize(("command", "signal_name"), [(SEGFAULT, "SIGSEGV"), (ABORT, "SIGABRT")])
def test_a_child_that_dies_is_a_crash(tmp_path: Path, command: list[str], signal_name: str) -> None:
    result = run_probe(RiskyPath.EXTRA_BUFTS, tmp_path / "m.gguf", command=command)
    assert result.crashed and result.conclusive
    assert signal_name in result.detail


def test_a_child_that_reports_an_error_is_not_a_crash(tmp_path: Path) -> None:
    failing = [sys.executable, "-c", 'print(\'{"ok": false, "error": "no room"}\'); exit(3)']
    result = run_probe(RiskyPath.GPU_OFFLOAD, tmp_path / "m.gguf", command=failing)
    assert not result.crashed and result.conclusive
    assert "no room" in result.detail


def test_a_child_that_hangs_is_inconclusive(tmp_path: Path) -> None:
    hang = [sys.executable, "-c", "import time; time.sleep(30)"]
    result = run_probe(RiskyPath.FLASH_ATTN, tmp_path / "m.gguf", command=hang, timeout=1)
    assert not result.crashed and not result.conclusive


def test_exit_codes_that_are_crashes() -> None:
    assert crash_name(-11) == "SIGSEGV"
    assert crash_name(-4) == "SIGILL"
    assert crash_name(0xC0000005).startswith("exception 0XC0000005")
    assert crash_name(0) == crash_name(3) == ""


def test_the_real_check_passes_on_this_machine(model_path: Path) -> None:
    """The child loads the real model with the path on and evaluates a batch. The one
    crash known on CPUs we test on is the AMX kernels behind the repacked weights."""
    from app.engine.native.libs import cpu_flags

    for path in (None, RiskyPath.EXTRA_BUFTS, RiskyPath.FLASH_ATTN):
        result = run_probe(path, model_path, threads=1)
        assert result.conclusive, result
        if result.crashed and path is RiskyPath.EXTRA_BUFTS and "amx_tile" in cpu_flags():
            continue  # llama.cpp issue 20824: what the guard is for
        assert not result.crashed, result
        assert result.detail == "a test run in a separate process worked"


# -- the guard --------------------------------------------------------------------


def test_a_crashing_path_is_switched_off_remembered_and_reported(tmp_path: Path) -> None:
    file, calls = tmp_path / FILE_NAME, []
    guard = NativeGuard(file, _fake_probe({RiskyPath.EXTRA_BUFTS}, calls), key=lambda: "machine")
    prepared = guard.prepare(tmp_path / "m.gguf", ONE_THREAD, gpu=False)
    assert calls == [RiskyPath.EXTRA_BUFTS, None]  # the path, then the control run
    assert not prepared.extra_bufts
    assert prepared.off == {RiskyPath.EXTRA_BUFTS}
    assert "is off on this computer" in prepared.notes[0]
    assert "read more slowly" in prepared.notes[0]  # what it costs
    # The next start: nothing is run again, the path stays off.
    calls2: list[RiskyPath | None] = []
    again = NativeGuard(file, _fake_probe(set(), calls2), key=lambda: "machine")
    assert not again.prepare(tmp_path / "m.gguf", ONE_THREAD, gpu=False).extra_bufts
    assert calls2 == []


def test_a_crash_the_control_run_shares_blames_nothing(tmp_path: Path) -> None:
    calls: list[RiskyPath | None] = []
    guard = NativeGuard(
        tmp_path / FILE_NAME, _fake_probe({RiskyPath.EXTRA_BUFTS, None}, calls), key=lambda: "m"
    )
    # Every load crashes here: loading in-process would kill the app (seen on a GPU
    # machine, docs/notes/gpu.md), so the load is refused with the reason.
    with pytest.raises(ModelLoadError, match="even with every risky path off"):
        guard.prepare(tmp_path / "m.gguf", ONE_THREAD, gpu=False)
    assert PathVerdicts(tmp_path / FILE_NAME, "m").verdicts() == {}  # no path is blamed
    with pytest.raises(ModelLoadError):
        guard.prepare(tmp_path / "m.gguf", ONE_THREAD, gpu=False)
    assert calls == [RiskyPath.EXTRA_BUFTS, None]  # not retried in this process


def test_only_the_paths_a_load_uses_are_checked(tmp_path: Path) -> None:
    calls: list[RiskyPath | None] = []
    guard = NativeGuard(
        tmp_path / FILE_NAME, _fake_probe({RiskyPath.FLASH_ATTN}, calls), key=lambda: "m"
    )
    plain = guard.prepare(tmp_path / "m.gguf", ONE_THREAD, gpu=False)
    assert calls == [RiskyPath.EXTRA_BUFTS] and plain.off == frozenset()
    q8 = guard.prepare(tmp_path / "m.gguf", replace(ONE_THREAD, kv_type="q8_0"), gpu=False)
    assert calls[1:] == [RiskyPath.FLASH_ATTN, None]
    assert q8.config.kv_type == "f16" and not q8.config.flash_attn  # q8_0 needs flash attn
    assert wanted_paths(replace(ONE_THREAD, n_gpu_layers=-1), gpu=True)[-1] is RiskyPath.GPU_OFFLOAD
    assert RiskyPath.GPU_OFFLOAD not in wanted_paths(replace(ONE_THREAD, n_gpu_layers=-1), False)


def test_an_unwritable_store_still_protects_this_run(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    calls: list[RiskyPath | None] = []
    guard = NativeGuard(
        blocked / FILE_NAME, _fake_probe({RiskyPath.EXTRA_BUFTS}, calls), key=lambda: "m"
    )
    assert not guard.prepare(tmp_path / "m.gguf", ONE_THREAD, gpu=False).extra_bufts
    assert not guard.prepare(tmp_path / "m.gguf", ONE_THREAD, gpu=False).extra_bufts
    assert calls == [RiskyPath.EXTRA_BUFTS, None]


@POSIX
def test_the_engine_loads_without_the_path_whose_child_crashed(
    tmp_path: Path, model_path: Path
) -> None:
    """End to end: a real child crashes (injected segfault) for the repacked weights, the
    real control child survives, and the real engine loads and answers without them."""
    from app.config.setting_records import SamplingParams
    from app.engine.backend import Token
    from app.engine.chat_message import ChatMessage
    from app.engine.local.engine import Engine

    def probe(path: RiskyPath | None, model: Path, threads: int) -> ProbeResult:
        command = SEGFAULT if path is RiskyPath.EXTRA_BUFTS else None
        return run_probe(path, model, threads=threads, command=command)

    file = tmp_path / FILE_NAME
    engine = Engine(guard=NativeGuard(file, probe))
    try:
        info = engine.load(model_path, ONE_THREAD)
        assert any("is off on this computer" in n and "SIGSEGV" in n for n in info.notes)
        assert engine._loaded is not None and engine._loaded.extra_bufts is False
        events = engine.generate([ChatMessage("user", "Hello")], SamplingParams.greedy(8))
        assert any(isinstance(e, Token) for e in events)
    finally:
        engine.unload()
    verdict = PathVerdicts(file, machine_key()).verdict(RiskyPath.EXTRA_BUFTS)
    assert verdict is not None and not verdict.ok and verdict.source == "probe"


# -- the CPU modules --------------------------------------------------------------


def test_the_best_cpu_module_for_this_processor_is_loaded() -> None:
    loaded = load_backends()
    variants = cpu_variants()
    if not variants:
        pytest.skip("this llama.cpp build has its CPU code linked in")
    assert loaded.cpu_variant in variants and not loaded.forced
    assert "x64" in variants or any(v.startswith("armv8") for v in variants)
    assert loaded.cpu_library == variants[loaded.cpu_variant]


def _child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def test_a_forced_baseline_module_runs_the_model(model_path: Path) -> None:
    """The baseline module (any x86-64 CPU: no AVX) loads and generates: what the frozen
    bundle's smoke test relies on to show it does not need the builder's CPU."""
    if "x64" not in cpu_variants():
        pytest.skip("no x86-64 baseline module in this build")
    code = (
        "from app.engine.native.libs import load_backends\n"
        "from tests.native import llama\n"
        "b = load_backends()\n"
        f"m = llama({str(model_path)!r}, n_ctx=128, n_threads=1, verbose=False)\n"
        "out = m.create_completion('The sky is', max_tokens=4, temperature=0)\n"
        "print(b.cpu_variant, b.forced, repr(out['choices'][0]['text']))\n"
    )
    done = _child(code, **{VARIANT_ENV: "x64"})
    assert done.returncode == 0, done.stderr[-3000:]
    variant, forced, text = done.stdout.strip().split(" ", 2)
    assert (variant, forced) == ("x64", "True") and len(text) > 2


def test_an_unknown_forced_module_is_refused_by_name() -> None:
    if not cpu_variants():
        pytest.skip("this llama.cpp build has its CPU code linked in")
    code = (
        "from app.engine.native.libs import load_backends, BackendLoadError\n"
        "try:\n    load_backends()\nexcept BackendLoadError as e:\n    print(e)\n"
    )
    done = _child(code, **{VARIANT_ENV: "pentium3"})
    assert "pentium3 names no CPU variant" in done.stdout and "x64" in done.stdout


def test_prepared_is_a_plain_record() -> None:
    p = Prepared(LoadConfig(), True, (), frozenset())
    assert p.extra_bufts and not p.off


def test_the_hardware_page_shows_what_is_off_and_can_check_again(
    qtbot: object, tmp_path: Path
) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QPushButton

    from app.engine.native.hardware import HardwareInfo
    from ui.perf.backend_page import BackendPage

    store = PathVerdicts(tmp_path / FILE_NAME, "m")
    store.record(RiskyPath.EXTRA_BUFTS, False, "a test run crashed (SIGSEGV)", "probe")
    hardware = HardwareInfo(
        False,
        cpu_name="Test Xeon",
        cpu_flags=("avx2", "avx512f", "amx_tile"),
        cpu_variant="sapphirerapids",
        cpu_variants=("x64", "haswell", "sapphirerapids"),
    )
    changed: list[bool] = []
    page = BackendPage(hardware, "", None, store, lambda: changed.append(True))
    qtbot.addWidget(page)  # type: ignore[attr-defined]
    assert "sapphirerapids" in page.cpu.text() and "Test Xeon" in page.cpu.text()
    assert page.paths.item(0, 1).text() == "OFF"
    assert "SIGSEGV" in page.paths.item(0, 2).text()
    assert "read more slowly" in page.paths_note.text()  # what being off costs
    button = page.paths.cellWidget(0, 3)
    assert isinstance(button, QPushButton) and button.text() == "Check again"
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)  # type: ignore[attr-defined]
    assert store.verdict(RiskyPath.EXTRA_BUFTS) is None and changed == [True]
    assert page.paths.item(0, 1).text().startswith("on")
    flash = page.paths.cellWidget(1, 3)
    assert isinstance(flash, QPushButton) and flash.text() == "Turn off"
    qtbot.mouseClick(flash, Qt.MouseButton.LeftButton)  # type: ignore[attr-defined]
    verdict = store.verdict(RiskyPath.FLASH_ATTN)
    assert verdict is not None and not verdict.ok and verdict.source == "user"
