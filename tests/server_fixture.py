"""A real llama-server on 127.0.0.1 for the remote-backend tests.

The binary is built once from the llama.cpp that llama-cpp-python vendors and
cached outside the checkout (``packaging/llama_server.py``); ``bootstrap.py
test`` builds it before pytest runs, so no test waits for a compiler. The
server always stops: ``running_llama_server`` terminates it (then kills it) on
the way out, whatever happened inside.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.native import extra_bufts_ok

if TYPE_CHECKING:
    from app.remote.llama_server.backend import LlamaServerBackend

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 90.0


def server_binary() -> Path:
    """The cached llama-server, built now if it is missing (minutes, once per machine)."""
    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import llama_server  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    return Path(llama_server.ensure_llama_server(log=False))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    url: str
    slot_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]

    def get(self, path: str) -> object:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@contextlib.contextmanager
def running_llama_server(
    model: Path,
    workdir: Path,
    *,
    n_ctx: int = 2048,
    loras: Sequence[Path] = (),
    threads: int = 2,
    extra: Sequence[str] = (),
    port: int = 0,
) -> Iterator[RunningServer]:
    """Start llama-server on a loopback port (a free one by default); stop it on the way out."""
    workdir.mkdir(parents=True, exist_ok=True)
    slot_dir = workdir / "slots"
    slot_dir.mkdir(exist_ok=True)
    log_path = workdir / "server.log"
    port = port or free_port()
    cmd = [
        str(server_binary()),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--model", str(model),
        "--ctx-size", str(n_ctx),
        "--threads", str(threads),
        "--threads-batch", str(threads),
        "--parallel", "1",
        "--swa-full",
        "--slot-save-path", str(slot_dir),
        "--no-webui",
        *[a for lora in loras for a in ("--lora", str(lora))],
        *(["--lora-init-without-apply"] if loras else []),
        # The repacked-weight kernels crash on some CPUs (AMX): the app's check decides.
        *([] if extra_bufts_ok(model) else ["--no-repack"]),
        *extra,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    server = RunningServer(f"http://127.0.0.1:{port}", slot_dir, log_path, process)
    try:
        _wait_ready(server)
        if loras:
            # --lora-init-without-apply still lists the adapters at scale 1 in this build,
            # and a request without a "lora" field (every /v1 one) would use them.
            scales = [{"id": i, "scale": 0.0} for i in range(len(loras))]
            request = urllib.request.Request(
                server.url + "/lora-adapters",
                data=json.dumps(scales).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as r:
                r.read()
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def _die_with_parent() -> None:
    """In the child, before exec: a test run that is killed takes its server with it."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _wait_ready(server: RunningServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"llama-server exited at start:\n{server.log_tail()}")
        try:
            health = server.get("/health")
            if isinstance(health, dict) and health.get("status") == "ok":
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"llama-server not ready in {START_TIMEOUT_S:.0f} s:\n{server.log_tail()}")


@contextlib.contextmanager
def connected_backend(url: str, name: str) -> Iterator[LlamaServerBackend]:
    """A ``LlamaServerBackend`` connected to the llama-server at ``url``; unloaded after."""
    from app.config.setting_records import LoadConfig
    from app.remote.connection import Connection
    from app.remote.llama_server.backend import LlamaServerBackend

    backend = LlamaServerBackend(Connection(name, f"{name} server", "llama-server", url))
    backend.load("", LoadConfig())
    try:
        yield backend
    finally:
        backend.unload()
