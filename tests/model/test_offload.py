"""Backends and GPU offload on this CPU-only machine, with simulated GPUs for the maths."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from app.config.setting_records import LoadConfig
from app.engine.local.engine import Engine
from app.engine.local.offload import (
    ALL,
    AUTO,
    _gpu_reason,
    accelerator_hint,
    auto_gpu_layers,
    fit_report,
    load_with_fallback,
)
from app.engine.native.hardware import Device, HardwareInfo, detect_hardware
from app.engine.native.libs import LoadedBackends
from app.gguf.info import read_gguf_info
from app.gguf.memory import estimate_ram
from app.util.errors import ModelLoadError
from tests.conftest import ROOT, TEST_LOAD

GB = 1024**3


def gpu(free: int) -> HardwareInfo:
    return HardwareInfo(
        True, (Device("CPU", "cpu", "CPU", 0, 0), Device("CUDA0", "Fake GPU", "GPU", free, free))
    )


def test_this_machine_reports_cpu_only() -> None:
    backend = detect_hardware()
    assert backend.label == "CPU"
    assert not backend.gpu_offload
    assert [d.kind for d in backend.devices] == ["CPU"]
    assert backend.devices[0].name == "CPU"


def test_auto_layers(model_path: Path) -> None:
    info = read_gguf_info(model_path)
    config = replace(TEST_LOAD, n_gpu_layers=AUTO)
    assert auto_gpu_layers(info, config, detect_hardware()) == 0  # no GPU here
    assert auto_gpu_layers(info, config, gpu(8 * GB)) == ALL  # a small model fits
    assert auto_gpu_layers(info, config, gpu(300 * 1024**2)) == 0  # less than the margin
    some = auto_gpu_layers(info, config, gpu(int(0.7 * GB)))
    assert 0 < some < (info.n_layers or 0)
    # A longer context leaves room for fewer layers.
    assert auto_gpu_layers(info, replace(config, n_ctx=32768), gpu(int(0.7 * GB))) <= some


def test_failed_gpu_load_falls_back_to_cpu(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine()
    monkeypatch.setattr(engine, "hardware", lambda: gpu(8 * GB))
    real_load = engine.load
    attempts: list[int] = []

    def load(path: object, config: LoadConfig, progress: object = None) -> object:
        attempts.append(config.n_gpu_layers)
        if config.n_gpu_layers != 0:
            raise ModelLoadError("llama.cpp could not load: CUDA error: out of memory")
        return real_load(path, config, progress)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "load", load)
    info, note = load_with_fallback(engine, model_path, replace(TEST_LOAD, n_gpu_layers=AUTO))
    try:
        assert attempts == [ALL, 0]
        assert info.n_gpu_layers == 0 and info.backend == "CPU"
        assert "GPU failed" in note and "not enough free GPU memory" in note and "CPU" in note
    finally:
        engine.unload()


def test_fit_report_warns_when_the_model_does_not_fit(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = fit_report(model_path, TEST_LOAD, detect_hardware())
    assert report.fits and report.warning("m") == ""
    monkeypatch.setattr("app.engine.local.offload.available_memory", lambda: 100 * 1024**2)
    tight = fit_report(model_path, TEST_LOAD, detect_hardware())
    assert not tight.fits and "needs about" in tight.warning("Gemma")


def test_accelerator_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = detect_hardware()
    monkeypatch.setattr("app.engine.local.offload._has_nvidia", lambda: True)
    monkeypatch.setattr("app.engine.local.offload.sys.platform", "linux")
    assert "GGML_CUDA=on" in accelerator_hint(cpu)
    assert accelerator_hint(gpu(GB)) == ""
    monkeypatch.setattr("app.engine.local.offload._has_nvidia", lambda: False)
    assert accelerator_hint(cpu) == ""
    # A CUDA build that finds no device (seen with CUDA_VISIBLE_DEVICES= on an H100): no
    # rebuild is suggested.
    cuda = LoadedBackends("haswell", None, False, ("haswell",), ("cuda",))
    monkeypatch.setattr("app.engine.native.libs._loaded", cuda)
    hint = accelerator_hint(cpu)
    assert "CUDA support but found no usable GPU" in hint and "rebuild" not in hint


def test_an_out_of_memory_gpu_load_is_said_so_not_blamed_on_the_file() -> None:
    """llama.cpp's error for any failed load says the file may be damaged; the log says
    what happened."""
    exc = ModelLoadError("llama.cpp could not load m.gguf: The file may be damaged")
    oom = [
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 2048 MiB on device 0: "
        "cudaMalloc failed: out of memory"
    ]
    assert _gpu_reason(exc, oom) == "not enough free GPU memory"
    assert _gpu_reason(exc, ["some other warning"]).startswith("llama.cpp could not load")


def test_ram_estimate_is_within_25_percent_of_the_measured_increase(model_path: Path) -> None:
    script = f"""
import json
from app.engine.local.engine import Engine
from app.config.setting_records import LoadConfig
from app.engine.chat_message import ChatMessage
from app.config.setting_records import SamplingParams
from app.util.sysinfo import rss_bytes
engine = Engine()
engine.hardware()  # llama.cpp's own libraries are loaded before the baseline
before = rss_bytes()
engine.load({str(model_path)!r}, LoadConfig(n_ctx=4096, n_threads=2, n_gpu_layers=0))
list(engine.generate([ChatMessage("user", "Hello there.")], SamplingParams.greedy(4)))
print(json.dumps({{"increase": rss_bytes() - before}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    increase = json.loads(out.stdout.strip().splitlines()[-1])["increase"]
    estimate = estimate_ram(read_gguf_info(model_path), 4096)
    assert estimate == pytest.approx(increase, rel=0.25), (estimate, increase)
