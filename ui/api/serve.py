"""``lamplight serve``: the local OpenAI-compatible API without a window.

The same engine worker as the GUI (``EngineClient`` on a ``QCoreApplication``, no
display needed) behind the same ``QtEngineGateway`` and ``ApiServer``. The server
binds before the model loads, so a busy port or an unsafe address is refused at once
(exit 2) and requests during the load get 503 ``model_loading``. Once the model is
loaded, exactly one JSON line goes to stdout::

    {"ready": true, "url": "http://127.0.0.1:1234/v1", "model": "gemma-3-270m-..."}

Each finished request is logged to stderr in one line. SIGINT / SIGTERM stop the
server, then the engine, and exit 0.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app import __version__
from app.config.params import SettingError, validate_api, validate_load
from app.config.paths import data_dirs
from app.config.settings import AppSettings
from app.util import crash_record
from app.util.datafiles import os_reason
from app.util.instance_lock import AlreadyRunning, acquire

if TYPE_CHECKING:
    from pathlib import Path

    from app.api.runner import ApiConfig, ApiServer
    from app.api.scheduler import Outcome
    from app.config.params import LoadConfig
    from app.engine.backend import ModelInfo

log = logging.getLogger("lamplight.serve")

TICK_MS = 200  # Python runs signal handlers only when the interpreter gets control
SMOKE_TIMEOUT_S = 300
SMOKE_PROMPT = "Say hello."
EXIT_USAGE = 2


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="lamplight serve",
        description="Serve the loaded model through an OpenAI-compatible HTTP API "
        "(GET /v1/models, POST /v1/chat/completions, POST /v1/completions).",
    )
    p.add_argument(
        "--host",
        default=None,
        help="address to listen on (default: the saved setting, else 127.0.0.1); "
        "any address other than loopback needs --api-key",
    )
    p.add_argument("--port", type=int, default=None, help="TCP port (default 1234; 0: any free)")
    p.add_argument("--model", metavar="PATH", help="GGUF model (default: the app's model)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (default: $LAMPLIGHT_API_KEY)",
    )
    p.add_argument("--data-dir", metavar="PATH", help="keep all state in PATH")
    p.add_argument("--n-ctx", type=int, default=None, help="context size in tokens")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for llama.cpp")
    p.add_argument(
        "--max-queue",
        type=int,
        default=None,
        help="requests running or waiting; more get 429 with Retry-After (default: the "
        "saved setting)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="allow browser calls from ORIGIN (https://host:port); repeatable; default: "
        "none; '*' (every web page) needs --api-key",
    )
    p.add_argument(
        "--max-body-mb",
        type=int,
        default=None,
        help="largest request body in MB, at most 8 (default: the saved setting)",
    )
    p.add_argument(
        "--smoke-test",
        action="store_true",
        help="serve, send one chat request to itself, print the result as JSON, exit",
    )
    p.add_argument("--version", action="version", version=f"Lamplight {__version__}")
    return p.parse_args(argv)


def fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"lamplight serve: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    from ui.main import choose_model, setup_logging
    from ui.window.single_instance import EXIT_HELD, held_message

    notes: list[str] = []
    try:
        dirs = data_dirs(args.data_dir, notes)
    except OSError as exc:
        return fail(f"the data folder cannot be used: {os_reason(exc)}")
    try:  # one Lamplight per data folder; the OS lets go when this process ends
        lock = acquire(dirs.root, "serve")
    except AlreadyRunning as exc:
        return fail(held_message(exc, "serve"), EXIT_HELD)
    for note in filter(None, [setup_logging(dirs), lock.note, *notes]):
        print(f"lamplight serve: {note}", file=sys.stderr)
    _log_to_stderr()
    settings, settings_notes = AppSettings.load_with_notes(dirs.settings_file)
    for note in settings_notes:
        print(f"lamplight serve: {note}", file=sys.stderr)

    from app.api.runner import ApiConfig

    given = {
        "host": args.host,
        "port": args.port,
        "cors_origins": args.cors_origin,
        "max_queue": args.max_queue,
        "max_body_mb": args.max_body_mb,
    }
    try:  # the saved settings, and what the command line changes, each in its range
        api = validate_api({k: v for k, v in given.items() if v is not None}, settings.api)
    except SettingError as exc:
        return fail(f"--{exc.field.replace('_', '-').removesuffix('s')}: {exc}")
    key = args.api_key if args.api_key is not None else os.environ.get("LAMPLIGHT_API_KEY", "")
    config = ApiConfig(
        host=api.host,
        port=api.port,
        api_key=key.strip(),
        cors_origins=api.cors_origins,
        max_queue=api.max_queue,
        max_body_bytes=api.max_body_mb * 2**20,
    )
    problem = config.problem()
    if problem:
        return fail(problem)
    overrides: dict[str, Any] = {}
    if args.n_ctx is not None:
        overrides["n_ctx"] = args.n_ctx
    if args.threads is not None:
        overrides["n_threads"] = args.threads
    try:
        load = validate_load(overrides, settings.load)
    except SettingError as exc:
        return fail(f"{'--n-ctx' if exc.field == 'n_ctx' else '--threads'}: {exc}")
    model, note = choose_model(args, settings)
    if note:
        print(f"lamplight serve: {note}", file=sys.stderr)
    with lock:
        crash, crashed = crash_record.begin(dirs.logs, __version__)  # after the lock
        if crashed is not None:
            print(f"lamplight serve: {crashed.console()}", file=sys.stderr)
        code = _serve(dirs.models, config, load, model, args.smoke_test, api.pool_mb)
        crash_record.end(crash)  # a clean exit (SIGINT/SIGTERM too): nothing to report
        return code


def _log_to_stderr() -> None:
    """Requests and the server's own lines, concisely, on stderr (the log file has all)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    for name in ("lamplight.serve", "app.api"):
        logging.getLogger(name).addHandler(handler)


def _serve(
    models_dir: Path,
    config: ApiConfig,
    load: LoadConfig,
    model: str | None,
    smoke: bool,
    pool_mb: int,
) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QCoreApplication, QObject, QTimer, Slot

    from app.api.gateway import model_id
    from app.api.runner import ApiConfigError, ApiServer
    from ui.engine.api_bridge import QtEngineGateway
    from ui.engine.worker import DEFAULT_MODEL, EngineClient

    app = QCoreApplication(sys.argv[:1])
    client = EngineClient(models_dir, pool_mb=pool_mb)
    gateway = QtEngineGateway(client)
    server = ApiServer(gateway, config)
    try:
        server.start()
    except ApiConfigError as exc:
        client.shutdown()
        return fail(str(exc))
    except OSError as exc:
        client.shutdown()
        return fail(bind_problem(config.host, config.port, exc))

    class Serve(QObject):
        """The main thread's side: the worker's load signals, the tick, the exit code."""

        def __init__(self) -> None:
            super().__init__()
            self.code = 0
            self.ready = False
            self.seen: set[str] = set()
            self.smoke: dict[str, Any] | None = None
            self.stop_requested = False

        @Slot(object)
        def on_loaded(self, info: ModelInfo) -> None:
            if self.ready:
                return
            self.ready = True
            ident = model_id(info)
            line = {"ready": True, "url": server.url, "model": ident}
            if not smoke:
                print(json.dumps(line), flush=True)
            log.info("serving %s at %s (%s)", info.name, server.url, info.backend)
            if smoke:
                threading.Thread(
                    target=self.run_smoke, args=(ident,), name="lamplight-smoke", daemon=True
                ).start()

        @Slot(str, bool)
        def on_load_failed(self, message: str, _still: bool) -> None:
            print(f"lamplight serve: the model could not be loaded: {message}", file=sys.stderr)
            if smoke:
                print(json.dumps({"ok": False, "error": message}), flush=True)
            self.code = 1
            app.exit(1)

        @Slot()
        def tick(self) -> None:
            self.log_outcomes(server)
            if self.stop_requested:
                app.exit(self.code)
            elif self.smoke is not None:
                print(json.dumps(self.smoke), flush=True)
                self.code = 0 if self.smoke.get("ok") else 1
                app.exit(self.code)

        def log_outcomes(self, server: ApiServer) -> None:
            for out in server.scheduler.recent():
                if out.id not in self.seen:
                    self.seen.add(out.id)
                    log.info("%s", outcome_line(out))
            if len(self.seen) > 1000:  # recent() holds 16; forget ids long gone
                self.seen = {o.id for o in server.scheduler.recent()}

        def run_smoke(self, ident: str) -> None:
            self.smoke = smoke_request(local_url(server.url), ident, config.api_key)

    run = Serve()
    client.worker.modelLoaded.connect(run.on_loaded)
    client.worker.loadFailed.connect(run.on_load_failed)

    def on_signal(signum: int, _frame: object) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        run.stop_requested = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    tick = QTimer()
    tick.setInterval(TICK_MS)
    tick.timeout.connect(run.tick)
    tick.start()
    if smoke:
        QTimer.singleShot(SMOKE_TIMEOUT_S * 1000, app.quit)
    client.load(DEFAULT_MODEL if model is None else model, load)
    code = app.exec()
    tick.stop()
    server.stop()  # before the engine: running jobs end, no new ones reach the worker
    run.log_outcomes(server)
    client.shutdown()
    for s, handler in previous.items():
        signal.signal(s, handler)
    if smoke and run.smoke is None and code == 0:
        print(json.dumps({"ok": False, "error": "timed out"}), flush=True)
        return 1
    return int(code)


def bind_problem(host: str, port: int, exc: OSError) -> str:
    """A sentence for a socket that could not be bound (the CLI and the window say it)."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"Port {port} on {host} is already in use (another server, or Lamplight "
            "already serving). Choose another port."
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this computer."
    if exc.errno == errno.EACCES:
        return f"Not allowed to listen on port {port} ({os_reason(exc)}); try one above 1024."
    return f"Cannot listen on {host}:{port}: {os_reason(exc)}."


def local_url(url: str) -> str:
    """``url`` with an any-address host (0.0.0.0, ::) replaced by loopback, to call it here."""
    return url.replace("//0.0.0.0:", "//127.0.0.1:").replace("//[::]:", "//[::1]:")


def outcome_line(out: Outcome) -> str:
    """One stderr line per finished request."""
    cached = f", {out.cached_tokens} cached" if out.cached_tokens else ""
    return (
        f"{out.id} from {out.client or '?'}: {out.finish}, "
        f"{out.prompt_tokens} prompt tokens{cached}, {out.tokens} generated"
    )


def smoke_request(url: str, ident: str, key: str) -> dict[str, Any]:
    """One greedy chat request to ``url`` with the standard library; the result as a dict."""
    body = json.dumps(
        {
            "model": ident,
            "messages": [{"role": "user", "content": SMOKE_PROMPT}],
            "max_tokens": 16,
            "temperature": 0,
        }
    ).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{url}/chat/completions", body, headers, method="POST")
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=SMOKE_TIMEOUT_S) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return {
            "ok": False,
            "error": f"HTTP {exc.code}: {exc.read()[:500].decode(errors='replace')}",
        }
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        text = data["choices"][0]["message"]["content"]
        usage = data["usage"]
    except (KeyError, IndexError, TypeError):
        return {"ok": False, "error": f"unexpected response: {str(data)[:500]}"}
    return {
        "ok": bool(usage.get("completion_tokens")),
        "url": url,
        "model": ident,
        "text": text,
        "usage": usage,
        "ms": round((time.perf_counter() - t0) * 1000, 1),
    }
