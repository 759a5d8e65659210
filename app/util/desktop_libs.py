"""Whether Qt can open a window here, checked before Qt tries (Linux).

Qt ends the process with ``abort()`` (exit 134, no Python traceback) when its
platform plugin cannot load: on a desktop Linux without the X11 helper libraries
Qt's xcb plugin links (``libxcb-cursor0``, ``libxcb-icccm4``, ...), or with no
display at all. ``window_problem`` says so first, with the packages to install for
this distribution, so the app can print it and exit with ``EXIT_NO_WINDOW``.

Standard library only: ``packaging/bootstrap.py`` loads this file by its path on
any Python 3.10+, before the environment (and Qt) is installed.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

EXIT_NO_WINDOW = 4  # the window cannot open here: the message said why

# Library (soname) -> package, per distribution family: what Qt's xcb and wayland
# plugins link, directly or through QtGui. "" where the family has no such package.
FAMILIES = ("debian", "fedora", "arch", "suse")
PACKAGES: dict[str, tuple[str, str, str, str]] = {
    "libxcb-cursor.so.0": (
        "libxcb-cursor0",
        "xcb-util-cursor",
        "xcb-util-cursor",
        "libxcb-cursor0",
    ),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm", "libxcb-icccm4"),
    "libxcb-keysyms.so.1": (
        "libxcb-keysyms1",
        "xcb-util-keysyms",
        "xcb-util-keysyms",
        "libxcb-keysyms1",
    ),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image", "libxcb-image0"),
    "libxcb-render-util.so.0": (
        "libxcb-render-util0",
        "xcb-util-renderutil",
        "xcb-util-renderutil",
        "libxcb-render-util0",
    ),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util", "xcb-util", "libxcb-util1"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb", "libxcb", "libxcb-randr0"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb", "libxcb", "libxcb-shm0"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb", "libxcb", "libxcb-sync1"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb", "libxcb", "libxcb-xfixes0"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb", "libxcb", "libxcb-render0"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb", "libxcb", "libxcb-shape0"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb", "libxcb", "libxcb-xkb1"),
    "libxcb.so.1": ("libxcb1", "libxcb", "libxcb", "libxcb1"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb", "libx11", "libX11-xcb1"),
    "libX11.so.6": ("libx11-6", "libX11", "libx11", "libX11-6"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon", "libxkbcommon", "libxkbcommon0"),
    "libxkbcommon-x11.so.0": (
        "libxkbcommon-x11-0",
        "libxkbcommon-x11",
        "libxkbcommon-x11",
        "libxkbcommon-x11-0",
    ),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig", "fontconfig", "libfontconfig1"),
    "libfreetype.so.6": ("libfreetype6", "freetype", "freetype2", "libfreetype6"),
    "libGL.so.1": ("libgl1", "libglvnd-glx", "libglvnd", "libGL1"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl", "libglvnd", "libEGL1"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl", "libglvnd", "libOpenGL0"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2", "glib2", "libglib-2_0-0"),
    "libgthread-2.0.so.0": ("libglib2.0-0", "glib2", "glib2", "libgthread-2_0-0"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs", "dbus", "libdbus-1-3"),
    "libwayland-client.so.0": (
        "libwayland-client0",
        "libwayland-client",
        "wayland",
        "libwayland-client0",
    ),
    "libwayland-cursor.so.0": (
        "libwayland-cursor0",
        "libwayland-cursor",
        "wayland",
        "libwayland-cursor0",
    ),
    "libwayland-egl.so.1": ("libwayland-egl1", "libwayland-egl", "wayland", "libwayland-egl1"),
}
# Checked where ldd cannot tell (no ldd, no plugin file yet): what the xcb plugin links.
XCB_SONAMES = tuple(n for n in PACKAGES if "wayland" not in n and n != "libOpenGL.so.0")
WAYLAND_SONAMES = (
    "libwayland-client.so.0",
    "libwayland-cursor.so.0",
    "libwayland-egl.so.1",
    "libxkbcommon.so.0",
)
INSTALL = {
    "debian": "sudo apt install",
    "fedora": "sudo dnf install",
    "arch": "sudo pacman -S --needed",
    "suse": "sudo zypper install",
}
FAMILY_NAMES = {
    "debian": "Debian, Ubuntu",
    "fedora": "Fedora, RHEL",
    "arch": "Arch",
    "suse": "openSUSE",
}
MAX_LDD_LINES = 2000  # a plugin links about 60 libraries
LDD_TIMEOUT_S = 10.0
X_CONNECT_TIMEOUT_S = 5.0  # a remote display that does not answer: let Qt try
_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$")


@dataclass(frozen=True)
class WindowProblem:
    """Why Qt could not open a window: ``missing`` libraries (sonames) of the platform
    plugin it would use, or ``no_display`` (``display``: DISPLAY, "" when unset, else
    it does not answer); ``message`` says what to do."""

    platform: str
    missing: tuple[str, ...]
    no_display: bool
    display: str = ""
    message: str = ""


def platforms_tried(env: Mapping[str, str]) -> list[str]:
    """The platform plugins Qt tries, in order (as ``QGuiApplication`` picks them)."""
    explicit = env.get("QT_QPA_PLATFORM", "").strip()
    if explicit:
        names = [p.split(":", 1)[0].strip() for p in explicit.split(";")]
        return [n for n in names if n][:8] or ["xcb"]
    session = env.get("XDG_SESSION_TYPE", "").strip().lower()
    if session == "wayland" or (session != "x11" and env.get("WAYLAND_DISPLAY", "").strip()):
        return ["wayland", "xcb"]  # wayland first, X11 (XWayland) as the fallback
    return ["xcb"]


def plugin_file(platform: str) -> Path | None:
    """Qt's plugin file for ``platform`` in the PySide6 this process would import
    (None when PySide6 is not installed: before the set-up, say)."""
    try:
        spec = importlib.util.find_spec("PySide6")
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(base) / "Qt" / "plugins" / "platforms" / f"libq{platform}.so"
        if path.is_file():
            return path
    return None


def parse_ldd(output: str) -> list[str]:
    """The libraries ldd reports as "not found", each once, in order."""
    out: list[str] = []
    for line in output.splitlines()[:MAX_LDD_LINES]:
        m = _LDD_LINE.match(line[:1000])
        if m and m.group(1) not in out:
            out.append(m.group(1))
    return out


def ldd_missing(plugin: Path) -> list[str] | None:
    """What ``plugin`` links (through every library it loads) that cannot be found;
    None when ldd cannot tell (not installed, failed)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    try:
        done = subprocess.run(
            [ldd, str(plugin)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=LDD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 and "=>" not in done.stdout:
        return None
    return parse_ldd(done.stdout)


def loadable(soname: str) -> bool:
    """Whether the dynamic loader finds ``soname`` (as it would for Qt's plugin)."""
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def missing_for(
    platform: str,
    ldd: Callable[[Path], list[str] | None] | None = None,
    load: Callable[[str], bool] | None = None,
    plugin: Callable[[str], Path | None] | None = None,
) -> list[str]:
    """The libraries ``platform``'s plugin needs that are missing: what ldd says of
    the installed plugin, else the known list tried one by one (``ldd``, ``load`` and
    ``plugin`` stand in for ``ldd_missing``, ``loadable`` and ``plugin_file``)."""
    path = (plugin or plugin_file)(platform)
    found = (ldd or ldd_missing)(path) if path is not None else None
    if found is not None:
        return found
    names = XCB_SONAMES if platform == "xcb" else WAYLAND_SONAMES
    return [n for n in names if not (load or loadable)(n)]


def x_answers(display: str) -> bool | None:
    """Whether the X server at ``display`` accepts a connection (as Qt's would be made:
    libxcb, with this user's authority); None when that cannot be told in time (no
    libxcb, a remote display that does not answer within ``X_CONNECT_TIMEOUT_S``)."""
    try:
        xcb = ctypes.CDLL("libxcb.so.1")
    except OSError:
        return None
    xcb.xcb_connect.restype = ctypes.c_void_p
    xcb.xcb_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    xcb.xcb_connection_has_error.argtypes = [ctypes.c_void_p]
    xcb.xcb_disconnect.argtypes = [ctypes.c_void_p]
    answer: list[bool] = []

    def attempt() -> None:
        conn = xcb.xcb_connect(display.encode(), None)
        answer.append(bool(conn) and xcb.xcb_connection_has_error(conn) == 0)
        if conn:
            xcb.xcb_disconnect(conn)

    worker = threading.Thread(target=attempt, name="x-display-check", daemon=True)
    worker.start()
    worker.join(X_CONNECT_TIMEOUT_S)
    return answer[0] if answer else None


def distro_family(os_release: str) -> str:
    """ "debian", "fedora", "arch" or "suse" from ``/etc/os-release``'s text; "" when
    none of them (or unknown)."""
    ids: list[str] = []
    for line in os_release.splitlines()[:200]:
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("ID", "ID_LIKE"):
            ids += value.strip().strip("\"'").lower().split()[:20]
    for word in ids:
        if word in ("debian", "ubuntu", "linuxmint", "pop", "raspbian", "elementary"):
            return "debian"
        if word in ("fedora", "rhel", "centos", "rocky", "almalinux", "nobara"):
            return "fedora"
        if word in ("arch", "manjaro", "endeavouros", "cachyos"):
            return "arch"
        if word.startswith("opensuse") or word in ("suse", "sles"):
            return "suse"
    return ""


def read_os_release() -> str:
    for name in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            with open(name, encoding="utf-8", errors="replace") as f:
                return f.read(20_000)
        except OSError:
            continue
    return ""


def packages_for(missing: Iterable[str], family: str) -> list[str]:
    """The packages that hold ``missing`` on ``family``, each once, in order (a
    library not in the table is named as it is)."""
    out: list[str] = []
    column = FAMILIES.index(family)
    for soname in missing:
        names = PACKAGES.get(soname)
        package = names[column] if names else soname
        if package and package not in out:
            out.append(package)
    return out


def install_lines(missing: Iterable[str], family: str) -> list[str]:
    """The command(s) that install what is missing: this distribution's, or each
    family's when it is not known."""
    missing = list(missing)
    if family:
        return [f"  {INSTALL[family]} {' '.join(packages_for(missing, family))}"]
    return [
        f"  {FAMILY_NAMES[f]}: {INSTALL[f]} {' '.join(packages_for(missing, f))}" for f in FAMILIES
    ]


def window_problem(
    env: Mapping[str, str] | None = None,
    missing: Callable[[str], list[str]] | None = None,
    os_release: Callable[[], str] | None = None,
    system: str = sys.platform,
    answers: Callable[[str], bool | None] | None = None,
) -> WindowProblem | None:
    """Why Qt would abort instead of opening a window here (None: nothing known to
    stop it). Only Linux's desktop platforms are checked; ``offscreen`` needs none.
    ``missing(platform)``, ``os_release()`` and ``answers(display)`` stand in for
    ``missing_for``, ``read_os_release`` and ``x_answers``."""
    if not system.startswith("linux"):
        return None
    env = os.environ if env is None else env
    problems: list[WindowProblem] = []
    for name in platforms_tried(env):
        if name not in ("xcb", "wayland"):
            return None  # offscreen, vnc, eglfs...: not a desktop's libraries
        lost = tuple((missing or missing_for)(name))
        display = env.get("DISPLAY", "").strip()
        no_display = (
            name == "xcb"
            and not lost
            and (not display or (answers or x_answers)(display[:200]) is False)
        )
        if not lost and not no_display:
            return None
        problems.append(WindowProblem(name, lost, no_display, display[:200]))
    # What to fix: X11's libraries first (the plugin most systems end up using).
    chosen = next((p for p in problems if p.missing and p.platform == "xcb"), problems[-1])
    return replace(chosen, message=_message(chosen, os_release))


HEADLESS = "Without a window: '--smoke-test' checks the engine, 'serve' runs the API server."


def _message(problem: WindowProblem, os_release: Callable[[], str] | None) -> str:
    if problem.no_display and not problem.display:
        return (
            "Lamplight cannot open its window: there is no display (DISPLAY is not set).\n"
            f"Run it from a desktop session. {HEADLESS}"
        )
    if problem.no_display:
        return (
            f"Lamplight cannot open its window: the X display {problem.display!r} (DISPLAY) "
            "does not accept a connection: no X server runs there, or it refuses this user.\n"
            f"Run it from a desktop session (over ssh: ssh -X). {HEADLESS}"
        )
    what = "X11" if problem.platform == "xcb" else "Wayland"
    return "\n".join(
        [
            f"Lamplight cannot open its window: Qt's {what} support needs system "
            "libraries that are missing here:",
            f"  {', '.join(problem.missing)}",
            "Install them with:",
            *install_lines(problem.missing, distro_family((os_release or read_os_release)())),
            f"Then start Lamplight again. {HEADLESS}",
        ]
    )


def summary(problem: WindowProblem | None) -> dict[str, object]:
    """The check as the smoke test reports it."""
    if problem is None:
        return {"ok": True}
    return {
        "ok": False,
        "platform": problem.platform,
        "missing": list(problem.missing),
        "no_display": problem.no_display,
        "display": problem.display,
        "message": problem.message,
    }
