"""A first run that explains itself: Qt's missing system libraries (or no display) are
found before Qt aborts, and named as this distribution's packages (issue 40, item 13).

No test here needs the libraries to be missing: a fake resolver says which are, and the
real subprocesses are started with no display or with ldd's answer replaced."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.util import desktop_libs
from app.util.desktop_libs import (
    EXIT_NO_WINDOW,
    WindowProblem,
    distro_family,
    missing_for,
    packages_for,
    parse_ldd,
    platforms_tried,
    window_problem,
)
from tests.conftest import ROOT
from tests.hypothesis_budget import examples

MISSING = ["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
UBUNTU = 'NAME="Ubuntu"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n'
ROCKY = 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\n'
MANJARO = "NAME=Manjaro\nID=manjaro\nID_LIKE=arch\n"
TUMBLEWEED = 'NAME="openSUSE Tumbleweed"\nID="opensuse-tumbleweed"\nID_LIKE="opensuse suse"\n'
LDD = """\tlinux-vdso.so.1 (0x00007ffd1a5f2000)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/plugins/platforms/../../lib/libQt6XcbQpa.so.6 (0x1)
\tlibxcb-cursor.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibxcb-util.so.1 => /lib/x86_64-linux-gnu/libxcb-util.so.1 (0x00007f0e4b7e2000)
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-cursor.so.0 => not found
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0e4b9ab000)
"""


def problem_with(
    env: dict[str, str],
    missing: dict[str, list[str]],
    release: str = UBUNTU,
    answers: bool | None = True,
) -> WindowProblem | None:
    return window_problem(
        env, lambda name: missing.get(name, []), lambda: release, "linux", lambda _d: answers
    )


def test_missing_xcb_libraries_are_named_as_packages_of_the_distribution() -> None:
    env = {"DISPLAY": ":0"}
    ubuntu = problem_with(env, {"xcb": MISSING})
    assert ubuntu is not None and ubuntu.platform == "xcb" and not ubuntu.no_display
    assert ubuntu.missing == tuple(MISSING)
    assert "sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1\n" in ubuntu.message
    assert "libxcb-cursor.so.0, libxcb-icccm.so.4, libxcb-keysyms.so.1" in ubuntu.message
    rocky = problem_with(env, {"xcb": MISSING}, ROCKY)
    assert rocky is not None
    assert "sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms\n" in rocky.message
    arch = problem_with(env, {"xcb": MISSING}, MANJARO)
    assert (
        arch is not None and "sudo pacman -S --needed xcb-util-cursor xcb-util-wm" in arch.message
    )
    suse = problem_with(env, {"xcb": MISSING}, TUMBLEWEED)
    assert suse is not None and "sudo zypper install libxcb-cursor0 libxcb-icccm4" in suse.message
    unknown = problem_with(env, {"xcb": MISSING}, "ID=gentoo\n")
    assert unknown is not None
    for line in ("Debian, Ubuntu: sudo apt install", "Fedora, RHEL: sudo dnf", "Arch: sudo"):
        assert line in unknown.message
    assert "--smoke-test" in unknown.message  # what works without a window


def test_nothing_missing_or_a_headless_platform_is_no_problem() -> None:
    assert problem_with({"DISPLAY": ":0"}, {}) is None
    for platform in ("offscreen", "minimal", "vnc", "offscreen;xcb"):
        env = {"QT_QPA_PLATFORM": platform}  # no display either: none is needed
        assert problem_with(env, {"xcb": MISSING}) is None, platform
    for system in ("win32", "darwin"):
        assert window_problem({}, lambda _n: MISSING, lambda: "", system) is None


def test_no_display_is_said_before_qt_aborts_on_it() -> None:
    problem = problem_with({"QT_QPA_PLATFORM": "xcb"}, {})
    assert problem is not None and problem.no_display and not problem.missing
    assert "no display" in problem.message and "DISPLAY" in problem.message
    # Missing libraries come first: installing them is the first step either way.
    both = problem_with({}, {"xcb": MISSING[:1]})
    assert both is not None and both.missing == (MISSING[0],) and not both.no_display
    # Set, but nothing answers there (ssh without -X, a stale DISPLAY): Qt aborts too.
    stale = problem_with({"DISPLAY": ":42"}, {}, answers=False)
    assert stale is not None and stale.no_display and stale.display == ":42"
    assert "':42'" in stale.message and "does not accept a connection" in stale.message
    # Whether it answers cannot be told in time (a remote display): Qt is left to try.
    assert problem_with({"DISPLAY": "far.example:0"}, {}, answers=None) is None


def test_wayland_first_then_xcb_as_qt_tries_them() -> None:
    wayland = {"XDG_SESSION_TYPE": "wayland", "WAYLAND_DISPLAY": "wayland-0"}
    assert platforms_tried(wayland) == ["wayland", "xcb"]
    assert platforms_tried({"WAYLAND_DISPLAY": "wayland-0"}) == ["wayland", "xcb"]
    assert platforms_tried({"XDG_SESSION_TYPE": "x11", "WAYLAND_DISPLAY": "w"}) == ["xcb"]
    assert platforms_tried({"QT_QPA_PLATFORM": "xcb:nograb;wayland"}) == ["xcb", "wayland"]
    assert platforms_tried({"QT_QPA_PLATFORM": " ; "}) == ["xcb"]
    # Wayland's plugin loads: X11's libraries do not matter.
    assert problem_with(wayland, {"xcb": MISSING}) is None
    # Wayland's does not, X11 (XWayland) works: still a window.
    assert (
        problem_with({**wayland, "DISPLAY": ":0"}, {"wayland": ["libwayland-cursor.so.0"]}) is None
    )
    # Neither: X11's libraries are named (most systems end up there).
    both = problem_with(wayland, {"wayland": ["libwayland-cursor.so.0"], "xcb": MISSING})
    assert both is not None and both.platform == "xcb" and both.missing == tuple(MISSING)
    only = problem_with(wayland, {"wayland": ["libwayland-cursor.so.0"]})
    assert only is not None and only.no_display  # XWayland without DISPLAY
    qt_wayland = problem_with(
        {"QT_QPA_PLATFORM": "wayland"}, {"wayland": ["libwayland-cursor.so.0"]}
    )
    assert qt_wayland is not None and "Wayland support" in qt_wayland.message
    assert "sudo apt install libwayland-cursor0" in qt_wayland.message


def test_ldd_is_believed_and_the_known_list_is_the_fallback(tmp_path: Path) -> None:
    plugin = tmp_path / "libqxcb.so"
    asked: list[str] = []

    def load(name: str) -> bool:
        asked.append(name)
        return name not in MISSING

    assert missing_for("xcb", lambda _p: MISSING[:1], load, lambda _n: plugin) == MISSING[:1]
    assert asked == []  # ldd answered
    assert missing_for("xcb", lambda _p: None, load, lambda _n: plugin) == MISSING
    assert missing_for("xcb", lambda _p: [], load, lambda _n: None) == MISSING  # no plugin yet
    assert set(asked) >= set(desktop_libs.XCB_SONAMES)
    assert parse_ldd(LDD) == MISSING


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Qt's xcb plugin: Linux")
def test_the_real_plugin_is_found_and_checked_with_ldd() -> None:
    """The PySide6 installed here: its xcb plugin is found, and ldd (where there is one)
    names what it cannot find, whatever that is on this machine."""
    plugin = desktop_libs.plugin_file("xcb")
    assert plugin is not None and plugin.name == "libqxcb.so"
    found = desktop_libs.ldd_missing(plugin)
    assert found is None or all(".so" in name for name in found), found
    assert desktop_libs.ldd_missing(plugin.parent / "no-such-plugin.so") in (None, [])


def test_distributions_are_told_apart() -> None:
    assert distro_family(UBUNTU) == "debian"
    assert distro_family('ID=linuxmint\nID_LIKE="ubuntu debian"\n') == "debian"
    assert distro_family(ROCKY) == "fedora"
    assert distro_family("ID=fedora\n") == "fedora"
    assert distro_family(MANJARO) == "arch"
    assert distro_family(TUMBLEWEED) == "suse"
    assert distro_family("ID=alpine\n") == ""
    assert distro_family("") == ""
    assert packages_for(["libxcb-shape.so.0", "libxcb-randr.so.0"], "fedora") == ["libxcb"]
    assert packages_for(["libweird.so.9"], "debian") == ["libweird.so.9"]


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=3000))
def test_hostile_ldd_output_and_os_release_never_raise(text: str) -> None:
    found = parse_ldd(text)
    assert len(found) == len(set(found)) and all(n in text and " " not in n for n in found)
    assert distro_family(text) in ("", "debian", "fedora", "arch", "suse")
    assert parse_ldd(LDD + text)[:3] == MISSING


def test_main_says_why_and_exits_without_making_a_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ui import main as ui_main

    monkeypatch.setattr(
        desktop_libs, "window_problem", lambda: problem_with({"DISPLAY": ":0"}, {"xcb": MISSING})
    )
    data = tmp_path / "data"
    assert ui_main.main(["--data-dir", str(data)]) == EXIT_NO_WINDOW
    err = capsys.readouterr().err
    assert "sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1" in err
    assert not data.exists()  # told before anything was set up


def _desktop_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "XDG_SESSION_TYPE", "QT_QPA_PLATFORM")
    }
    return {**env, **extra}


def start_app(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m ui`` on a data folder of its own, with ``env``, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "ui", "--data-dir", str(tmp_path / "data")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Qt's xcb plugin: Linux")
def test_a_real_start_without_a_display_explains_itself(tmp_path: Path) -> None:
    """Before: Qt's xcb plugin aborted the process (exit 134, SIGABRT) with no display;
    now the reason, and an exit code that is not a crash."""
    out = start_app(tmp_path, _desktop_env(QT_QPA_PLATFORM="xcb"))
    assert out.returncode == EXIT_NO_WINDOW, (out.returncode, out.stderr[-2000:])
    assert "Lamplight cannot open its window" in out.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Qt's xcb plugin: Linux")
def test_a_real_start_on_a_display_nobody_serves_explains_itself(tmp_path: Path) -> None:
    """DISPLAY is set, but no X server is there (ssh without -X): Qt aborted on it."""
    display = next(f":{n}" for n in range(4173, 4273) if not Path(f"/tmp/.X11-unix/X{n}").exists())
    out = start_app(tmp_path, _desktop_env(QT_QPA_PLATFORM="xcb", DISPLAY=display))
    assert out.returncode == EXIT_NO_WINDOW, (out.returncode, out.stderr[-2000:])
    assert "Lamplight cannot open its window" in out.stderr


def test_the_readme_names_packages_that_hold_what_qt_links() -> None:
    """The README's apt line for a desktop: each package is one the check would name."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("sudo apt install libxcb-cursor0")
    line = readme[start : readme.index("```", start)].replace("\\\n", " ")
    named = set(line.split()[3:])
    debian = {names[0] for names in desktop_libs.PACKAGES.values()}
    assert {"libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1"} <= named <= debian


CHILD = """
import sys
from pathlib import Path
from app.util import desktop_libs
# The plugin is there, but ldd says one of its libraries is not.
desktop_libs.ldd_missing = lambda _plugin: ["libxcb-cursor.so.0"]
desktop_libs.read_os_release = lambda: "ID=ubuntu\\nID_LIKE=debian\\n"
from ui.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Qt's xcb plugin: Linux")
def test_a_real_start_with_a_library_missing_names_its_package(tmp_path: Path) -> None:
    """A display is set (none listens there: without the check Qt aborts on it); one
    library is "missing": the app names its package and exits with its own code."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, "--data-dir", str(tmp_path / "data")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=_desktop_env(QT_QPA_PLATFORM="xcb", DISPLAY=":97"),
    )
    assert out.returncode == EXIT_NO_WINDOW, (out.returncode, out.stderr[-2000:])
    assert "  sudo apt install libxcb-cursor0\n" in out.stderr
    assert "Traceback" not in out.stderr


def _bootstrap():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "bootstrap_t", ROOT / "packaging" / "bootstrap.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Qt's xcb plugin: Linux")
def test_bootstrap_run_says_it_before_the_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bootstrap.py run`` checks before its 20-minute first set-up (standard library
    only), and not for the headless commands."""
    boot = _bootstrap()
    for key in ("DISPLAY", "WAYLAND_DISPLAY", "XDG_SESSION_TYPE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    said = boot.window_problem([])
    # No display here; a machine without Qt's X11 libraries hears of those first (what
    # to fix first: ``window_problem``), as a fresh CI machine does.
    assert said.startswith("Lamplight cannot open its window")
    assert "there is no display" in said or "needs system libraries" in said, said
    assert boot.window_problem(["--smoke-test"]) == ""
    assert boot.window_problem(["serve", "--port", "1"]) == ""
    monkeypatch.setattr(boot, "ensure_env", lambda: pytest.fail("the set-up ran"))
    assert boot.cmd_run([]) == boot.EXIT_NO_WINDOW == EXIT_NO_WINDOW


def test_smoke_test_reports_what_the_window_needs() -> None:
    from ui.main import desktop_env

    env = {"QT_QPA_PLATFORM": "offscreen", "DISPLAY": ":0"}
    assert desktop_env(env) == {"DISPLAY": ":0"}  # the tests' offscreen is not the window's
    assert desktop_env({"QT_QPA_PLATFORM": "wayland"}) == {"QT_QPA_PLATFORM": "wayland"}
    summary = desktop_libs.summary(problem_with({"DISPLAY": ":0"}, {"xcb": MISSING}))
    assert json.loads(json.dumps(summary))["missing"] == MISSING
    assert desktop_libs.summary(None) == {"ok": True}
