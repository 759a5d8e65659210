"""Packaging: icons, the desktop entry, its installer, and (slow, opt-in) the frozen app."""

from __future__ import annotations

import configparser
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ICONS = ROOT / "resources" / "icons"
DESKTOP = ROOT / "resources" / "lamplight.desktop"
INSTALLER = ROOT / "packaging" / "install-desktop.sh"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
ICNS_SIZES = {b"icp4": 16, b"icp5": 32, b"ic11": 32, b"ic12": 64, b"ic07": 128}
ICNS_SIZES |= {b"ic13": 256, b"ic08": 256, b"ic14": 512, b"ic09": 512, b"ic10": 1024}

needs_sh = pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell script")


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, checking its signature and that it is 8-bit RGBA."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    assert (depth, color) == (8, 6), "expected 8-bit RGBA"
    return width, height


def read_ico(data: bytes) -> list[tuple[int, bytes]]:
    reserved, kind, count = struct.unpack("<HHH", data[:6])
    assert (reserved, kind) == (0, 1)
    entries = []
    for i in range(count):
        w, h, _, _, planes, bpp, size, offset = struct.unpack(
            "<BBBBHHII", data[6 + 16 * i : 22 + 16 * i]
        )
        assert w == h and (planes, bpp) == (1, 32)
        assert offset + size <= len(data)
        entries.append((w or 256, data[offset : offset + size]))
    return entries


def read_icns(data: bytes) -> dict[bytes, bytes]:
    magic, total = struct.unpack(">4sI", data[:8])
    assert magic == b"icns" and total == len(data)
    entries, pos = {}, 8
    while pos < total:
        kind, length = struct.unpack(">4sI", data[pos : pos + 8])
        assert length > 8 and pos + length <= total
        entries[kind] = data[pos + 8 : pos + length]
        pos += length
    return entries


def desktop_entry(path: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(path, encoding="utf-8")
    return dict(parser["Desktop Entry"])


def exec_argv(value: str) -> list[str]:
    """An Exec= value split as the Desktop Entry spec says (string escapes, then quoting)."""
    escapes = {"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
    text, i = "", 0
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value) and value[i + 1] in escapes:
            text += escapes[value[i + 1]]
            i += 2
        else:
            text += value[i]
            i += 1
    argv, arg, quoted, i = [], None, False, 0
    while i < len(text):
        c = text[i]
        if quoted and c == "\\" and text[i + 1] in '"`$\\':
            arg, i = (arg or "") + text[i + 1], i + 2
            continue
        if c == '"':
            quoted, arg = not quoted, arg or ""
        elif c == " " and not quoted:
            if arg is not None:
                argv.append(arg)
            arg = None
        else:
            arg = (arg or "") + c
        i += 1
    assert not quoted, f"unbalanced quotes in {value!r}"
    if arg is not None:
        argv.append(arg)
    return [a.replace("%%", "%") for a in argv]


def test_png_icons_at_every_size() -> None:
    for size in PNG_SIZES:
        assert png_size((ICONS / f"lamplight-{size}.png").read_bytes()) == (size, size)


def test_png_icon_is_a_real_render(qapp: object) -> None:
    from PySide6.QtGui import QImage

    image = QImage(str(ICONS / "lamplight-512.png"))
    assert image.width() == 512
    assert image.pixelColor(0, 0).alpha() == 0  # outside the rounded square
    assert image.pixelColor(256, 256).alpha() == 255  # the flame


def test_ico_holds_png_entries_up_to_256(qapp: object) -> None:
    from PySide6.QtGui import QImageReader

    entries = read_ico((ICONS / "lamplight.ico").read_bytes())
    assert sorted(size for size, _ in entries) == list(ICO_SIZES)
    for size, png in entries:
        assert png_size(png) == (size, size)
    reader = QImageReader(str(ICONS / "lamplight.ico"))  # Qt's own .ico reader agrees
    assert reader.imageCount() == len(ICO_SIZES)
    assert not reader.read().isNull()


def test_icns_holds_png_entries(qapp: object) -> None:
    from PySide6.QtGui import QImageReader

    entries = read_icns((ICONS / "lamplight.icns").read_bytes())
    assert set(entries) == set(ICNS_SIZES)
    for kind, png in entries.items():
        assert png_size(png) == (ICNS_SIZES[kind],) * 2, kind
    reader = QImageReader(str(ICONS / "lamplight.icns"))
    assert reader.format().data() == b"icns"
    assert not reader.read().isNull()


def test_desktop_file_has_the_required_keys() -> None:
    entry = desktop_entry(DESKTOP)
    assert entry["Type"] == "Application"
    assert entry["Name"] == "Lamplight"
    assert entry["Icon"] == "lamplight"  # the name install-desktop.sh installs under
    assert entry["Terminal"] == "false"
    assert entry["StartupWMClass"] == "lamplight"  # ui.main sets the desktop file name
    assert entry["Categories"].endswith(";")
    assert exec_argv(entry["Exec"])[0] == "lamplight"
    validate = shutil.which("desktop-file-validate")
    if validate:
        subprocess.run([validate, str(DESKTOP)], check=True, capture_output=True)


def run_installer(script: Path, data_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(data_home), "HOME": str(data_home.parent)}
    return subprocess.run(
        ["sh", str(script), *args], env=env, capture_output=True, text=True, timeout=30
    )


def installed_files(data_home: Path) -> set[str]:
    return {p.relative_to(data_home).as_posix() for p in data_home.rglob("*") if p.is_file()}


def fake_app(folder: Path) -> Path:
    folder.mkdir(parents=True)
    exe = folder / "lamplight"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe


@needs_sh
def test_install_desktop_installs_and_uninstalls(tmp_path: Path) -> None:
    data_home = tmp_path / "xdg data"
    # A path the Exec line has to quote and escape.
    exe = fake_app(tmp_path / 'odd $dir "100%" \\ name')
    done = run_installer(INSTALLER, data_home, "--exec", str(exe))
    assert done.returncode == 0, done.stderr

    expected = {"applications/lamplight.desktop", "icons/hicolor/scalable/apps/lamplight.svg"}
    expected |= {f"icons/hicolor/{s}x{s}/apps/lamplight.png" for s in PNG_SIZES}
    assert installed_files(data_home) == expected
    for size in PNG_SIZES:
        png = data_home / f"icons/hicolor/{size}x{size}/apps/lamplight.png"
        assert png_size(png.read_bytes()) == (size, size)
    desktop = data_home / "applications" / "lamplight.desktop"
    entry, shipped = desktop_entry(desktop), desktop_entry(DESKTOP)
    assert exec_argv(entry["Exec"]) == [str(exe), *exec_argv(shipped["Exec"])[1:]]
    assert entry["TryExec"].replace("\\\\", "\\") == str(exe)
    del entry["Exec"], entry["TryExec"], shipped["Exec"]
    assert entry == shipped  # everything else as shipped
    validate = shutil.which("desktop-file-validate")
    if validate:
        subprocess.run([validate, str(desktop)], check=True, capture_output=True)

    done = run_installer(INSTALLER, data_home, "--uninstall")
    assert done.returncode == 0, done.stderr
    assert installed_files(data_home) == set()


@needs_sh
def test_install_desktop_from_a_bundle_points_at_the_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "lamplight"
    exe = fake_app(bundle)
    shutil.copytree(ROOT / "resources", bundle / "_internal" / "resources")
    shutil.copy2(INSTALLER, bundle / "install-desktop.sh")
    done = run_installer(bundle / "install-desktop.sh", tmp_path / "share")
    assert done.returncode == 0, done.stderr
    entry = desktop_entry(tmp_path / "share" / "applications" / "lamplight.desktop")
    assert exec_argv(entry["Exec"])[0] == str(exe)


@needs_sh
def test_install_desktop_refuses_a_missing_program(tmp_path: Path) -> None:
    done = run_installer(INSTALLER, tmp_path / "share", "--exec", str(tmp_path / "nothing"))
    assert done.returncode != 0
    assert "not an executable" in done.stderr
    assert not (tmp_path / "share").exists() or installed_files(tmp_path / "share") == set()


@pytest.mark.timeout(1800)
@pytest.mark.skipif(
    os.environ.get("LAMPLIGHT_BUILD_BUNDLE") != "1", reason="set LAMPLIGHT_BUILD_BUNDLE=1"
)
def test_frozen_app_builds_and_passes_its_smoke_test(tmp_path: Path) -> None:
    """PyInstaller build, then the frozen app on a fresh data dir, offline where possible."""
    cmd = [sys.executable, str(ROOT / "packaging" / "build.py"), "--smoke"]
    cmd += ["--dist", str(tmp_path / "dist"), "--work", str(tmp_path / "work")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"]
    assert summary["smoke"]["generated_tokens"] > 0
    assert summary["smoke"]["model"]["backend"]
    # llama.cpp's chat layer is bundled, and its template child (`lamplight
    # chat-format-worker`) starts from the frozen app.
    assert summary["smoke"]["chat_format"] == "llama.cpp", summary["smoke"]
    # The bundle carries every CPU module and runs on the baseline one (no AVX at all on
    # x86-64): it does not need the builder's CPU.
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert summary["smoke"]["cpu_variant"] not in ("", "built-in"), summary["smoke"]
        assert summary["smoke_baseline"]["cpu_variant"] == "x64"
        assert summary["smoke_baseline"]["generated_tokens"] > 0
        # The frozen app ran its native-path check child (`lamplight probe-native-path`).
        checks = summary["smoke"]["native_checks"]
        assert checks and all("separate process" in why for why in checks.values()), checks
    assert summary["serve"]["completion_tokens"] > 0  # `serve --smoke-test` on 127.0.0.1


def test_the_portable_build_is_keyed_by_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """packaging/llama_build.py: every CPU module, installed in the wheel, and a cached
    wheel is never reused for other CMAKE_ARGS (pip's own cache would be)."""
    import importlib.metadata

    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import llama_build  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    assert importlib.metadata.version("llama-cpp-python") == llama_build.VERSION
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    plain = llama_build.build_key()
    if sys.platform != "darwin":
        assert "-DGGML_CPU_ALL_VARIANTS=ON" in llama_build.flags()
        # A PATH given with -D would be made absolute (the temporary source folder).
        assert "-DGGML_BACKEND_DIR:STRING=llama_cpp/lib" in llama_build.flags()
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_CUDA=on")
    assert llama_build.flags()[-1] == "-DGGML_CUDA=on"
    assert llama_build.build_key() != plain
    assert llama_build.wheel_dir().name.endswith(llama_build.build_key())
