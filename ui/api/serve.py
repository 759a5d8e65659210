"""``lamplight serve``: the local OpenAI-compatible API without a window.

The same engine host as the window (``app.host.EngineHost``), on a plain thread,
behind the same ``HostGateway`` and ``ApiServer``: Qt is never loaded. The server
binds before the model loads, so a busy port or an unsafe address is refused at once
(exit 2) and requests during the load get 503 ``model_loading``. ``POST /v1/embeddings``
is answered by an ``EmbedWorker`` over ``--embedder`` (else the app's chosen embedding
model), loaded on the first request and closed after the server stops. Once the model
is loaded, exactly one JSON line goes to stdout::

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
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import __version__
from app.config.api_settings import validate_api
from app.config.field_spec import SettingError
from app.config.params import validate_load
from app.config.paths import data_dirs
from app.config.settings import AppSettings
from app.host.listener import QuietListener
from app.util import crash_record
from app.util.datafiles import os_reason
from app.util.errors import ModelFileError, ProjectorError
from app.util.instance_lock import AlreadyRunning, acquire
from app.util.redact import secure_logging
from ui.api import serve_template

if TYPE_CHECKING:
    from app.api.config import ApiConfig
    from app.api.requests import Outcome
    from app.api.runner import ApiServer
    from app.config.setting_records import LoadConfig
    from app.engine.backend import ModelInfo
    from app.engine.local.embed_worker import EmbedWorker
    from app.host.host import EngineHost

log = logging.getLogger("lamplight.serve")

TICK_MS = 200  # Python runs signal handlers only when the interpreter gets control
HOST_JOIN_S = 10.0
SMOKE_TIMEOUT_S = 300
SMOKE_PROMPT = "Say hello."
EXIT_USAGE = 2
EXIT_HELD = 3  # as ``ui.window.single_instance.EXIT_HELD`` (which loads Qt to import)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="lamplight serve",
        description="Serve the loaded model through an OpenAI-compatible HTTP API "
        "(GET /v1/models, POST /v1/chat/completions, POST /v1/completions, "
        "POST /v1/embeddings, POST /v1/responses) and Anthropic's Messages API "
        "(POST /v1/messages).",
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
        "--mmproj",
        metavar="PATH",
        help="vision projector (mmproj GGUF) loaded with the model: requests may then "
        "send images as image_url parts with data: URLs",
    )
    serve_template.add_arguments(p)
    p.add_argument(
        "--embedder",
        metavar="PATH",
        help="embedding model (GGUF) for POST /v1/embeddings (default: the app's, "
        "loaded on the first request)",
    )
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
        help="largest request body in MB, at most 64 (default: the saved setting)",
    )
    p.add_argument(
        "--smoke-test",
        action="store_true",
        help="serve, send one chat request to itself, print the result as JSON, exit",
    )
    p.add_argument("--version", action="version", version=f"Lamplight {__version__}")
    return p.parse_args(argv)


def held_message(exc: AlreadyRunning) -> str:
    """Why serve cannot run on the held folder (``single_instance.held_message`` says it
    for the window; that module loads Qt)."""
    holder = exc.holder
    if holder.mode == "window":
        return (
            f"{exc} Use its local API server (Model → Local API server…), "
            "or give serve another --data-dir."
        )
    pid = f" (process {holder.pid})" if holder.pid else ""
    return f"{exc} Stop it{pid}, or give serve another --data-dir."


def fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"lamplight serve: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    from ui.startup import choose_model, setup_logging

    notes: list[str] = []
    try:
        dirs = data_dirs(args.data_dir, notes)
    except OSError as exc:
        return fail(f"the data folder cannot be used: {os_reason(exc)}")
    try:  # one Lamplight per data folder; the OS lets go when this process ends
        lock = acquire(dirs.root, "serve")
    except AlreadyRunning as exc:
        return fail(held_message(exc), EXIT_HELD)
    for note in filter(None, [setup_logging(dirs), lock.note, *notes]):
        print(f"lamplight serve: {note}", file=sys.stderr)
    _log_to_stderr()
    settings, settings_notes = AppSettings.load_with_notes(dirs.settings_file)
    for note in settings_notes:
        print(f"lamplight serve: {note}", file=sys.stderr)

    from app.api.config import ApiConfig

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
    try:
        load = load_config(args, settings.load)
    except UsageError as exc:
        return fail(str(exc))
    embedder: Path | None = None
    if args.embedder is not None:
        try:
            embedder = checked_embedder(args.embedder)
        except ModelFileError as exc:
            return fail(f"--embedder: {exc}")
    try:
        template = serve_template.chooser(args, dirs.root)
    except serve_template.TemplateArgError as exc:
        return fail(str(exc))
    model, note = choose_model(args, settings)
    if note:
        print(f"lamplight serve: {note}", file=sys.stderr)
    with lock:
        crash, crashed = crash_record.begin(dirs.logs, __version__)  # after the lock
        if crashed is not None:
            print(f"lamplight serve: {crashed.console()}", file=sys.stderr)
        code = _serve(
            dirs.root, config, load, model, args.smoke_test, api.pool_mb, embedder, template
        )
        crash_record.end(crash)  # a clean exit (SIGINT/SIGTERM too): nothing to report
        return code


class UsageError(ValueError):
    """A command-line value that cannot be used; the message names the option."""


def load_config(args: argparse.Namespace, saved: LoadConfig) -> LoadConfig:
    """The saved load settings with what the command line changes, each checked.

    Raises:
        UsageError: a value out of its range, or a projector that cannot be used.
    """
    overrides: dict[str, Any] = {}
    if args.n_ctx is not None:
        overrides["n_ctx"] = args.n_ctx
    if args.threads is not None:
        overrides["n_threads"] = args.threads
    try:
        load = validate_load(overrides, saved)
    except SettingError as exc:
        option = "--n-ctx" if exc.field == "n_ctx" else "--threads"
        raise UsageError(f"{option}: {exc}") from exc
    if args.mmproj is not None:
        try:
            load = replace(load, mmproj=checked_projector(args.mmproj))
        except ProjectorError as exc:
            raise UsageError(f"--mmproj: {exc}") from exc
    return load


def checked_projector(path: str) -> str:
    """``path`` as an absolute path, once its header says it is a vision projector (its
    fit to the model is checked when the model loads).

    Raises:
        ProjectorError: missing, unreadable, or not a vision projector.
    """
    from app.gguf.projector import read_projector

    if not path.strip():
        raise ProjectorError("the path is empty.")
    full = Path(path).expanduser().resolve()
    read_projector(full)
    return str(full)


def checked_embedder(path: str) -> Path:
    """``path`` as an absolute path, once its header says it is an embedding model.

    Raises:
        ModelFileError: missing, unreadable, or not an embedding model (EmbedderError).
    """
    from app.gguf.embedder import read_embedder_info

    if not path.strip():
        raise ModelFileError("the path is empty.")
    full = Path(path).expanduser().resolve()
    read_embedder_info(full)
    return full


def embed_worker(data_dir: Path, embedder: Path | None) -> EmbedWorker:
    """The worker for ``/v1/embeddings``: ``embedder``, else the app's chosen one (found,
    or made, when the first request comes)."""
    from app.engine.local.embed_worker import EmbedWorker
    from app.models.embedders import chosen_embedder

    if embedder is not None:
        path = embedder
        return EmbedWorker(lambda: path, n_threads=1)
    return EmbedWorker(lambda: chosen_embedder(data_dir), n_threads=1)


def _log_to_stderr() -> None:
    """Requests and the server's own lines, concisely, on stderr (the log file has all)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    secure_logging(handler)
    for name in ("lamplight.serve", "app.api"):
        logging.getLogger(name).addHandler(handler)


def _serve(
    data_dir: Path,
    config: ApiConfig,
    load: LoadConfig,
    model: str | None,
    smoke: bool,
    pool_mb: int,
    embedder: Path | None = None,
    template: serve_template.Chooser | None = None,
) -> int:
    from app.api.config import ApiConfigError
    from app.api.host_gateway import HostGateway
    from app.api.runner import ApiServer
    from app.chat.store import ConversationStore
    from app.host.core import DEFAULT_MODEL
    from app.host.host import EngineHost, guarded_engine

    models_dir = data_dir / "models"  # DataDirs.models
    listener = ServeListener()
    # The data folder's store: where agents' prompts (``prompt_cache``) and stored
    # responses are kept across restarts; no chat of the window is read or written.
    store = ConversationStore(data_dir)
    host = EngineHost(guarded_engine(models_dir), models_dir, store, listener, pool_mb)
    thread = host.start()
    cancel = threading.Event()
    embeds = embed_worker(data_dir, embedder)
    from app.chat.projects import ProjectStore

    # Projects shared with the API answer here too; their openings are kept in memory
    # (a headless server has no conversation store to save them beside).
    server = ApiServer(HostGateway(host, ProjectStore(data_dir)), config, embeds)
    try:
        server.start()
    except (ApiConfigError, OSError) as exc:
        embeds.close()
        _stop_host(host, thread, cancel)
        if isinstance(exc, ApiConfigError):
            return fail(str(exc))
        return fail(bind_problem(config.host, config.port, exc))

    def on_signal(signum: int, _frame: object) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        # Only a flag: the handler may run inside ``wake.wait`` holding the Event's
        # lock; the loop sees it within a tick.
        listener.stop_requested = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    outcomes = OutcomeLog()
    try:
        host.load(DEFAULT_MODEL if model is None else model, load, cancel)
        if template is not None:  # before any request: the host runs its tasks in order
            host.choose_template(template)
        code = _until_stopped(server, listener, outcomes, smoke, config.api_key)
    finally:
        server.stop()  # before the engine: running jobs end, no new ones reach the host
        embeds.close()
        outcomes.log_new(server)
        _stop_host(host, thread, cancel)
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code


class ServeListener(QuietListener):
    """The host's reports that ``serve`` needs: the load's outcome (engine thread);
    ``wake`` tells the main thread to look."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.info: ModelInfo | None = None
        self.failure: str | None = None
        self.smoke: dict[str, Any] | None = None
        self.stop_requested = False

    def model_loaded(self, info: ModelInfo) -> None:
        if self.info is None:
            self.info = info
            self.wake.set()

    def load_failed(self, message: str, still_loaded: bool) -> None:
        self.failure = message
        self.wake.set()

    def load_note(self, message: str) -> None:
        print(f"lamplight serve: {message}", file=sys.stderr, flush=True)

    def template_applied(self, info: ModelInfo) -> None:
        log.info("chat template: %s", info.template)
        shown = self.info.notes if self.info is not None else ()  # the load said those
        for note in info.notes:
            if note not in shown:
                self.load_note(note)


class OutcomeLog:
    """One stderr line per finished request, each once."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def log_new(self, server: ApiServer) -> None:
        for out in server.requests.recent():
            if out.id not in self.seen:
                self.seen.add(out.id)
                log.info("%s", outcome_line(out))
        if len(self.seen) > 1000:  # recent() holds 16; forget ids long gone
            self.seen = {o.id for o in server.requests.recent()}


def _until_stopped(
    server: ApiServer, run: ServeListener, outcomes: OutcomeLog, smoke: bool, key: str
) -> int:
    """The main thread's loop: the ready line, the smoke request, SIGINT / SIGTERM; the
    exit code."""
    from app.host.jobs import model_id

    deadline = time.monotonic() + SMOKE_TIMEOUT_S
    ready = False
    while True:
        # Python runs signal handlers only when the interpreter gets control: the tick.
        run.wake.wait(TICK_MS / 1000)
        run.wake.clear()
        outcomes.log_new(server)
        if run.stop_requested:
            return 0
        if run.failure is not None and not ready:
            message = run.failure
            print(f"lamplight serve: the model could not be loaded: {message}", file=sys.stderr)
            if smoke:
                print(json.dumps({"ok": False, "error": message}), flush=True)
            return 1
        if run.info is not None and not ready:
            ready, info, ident = True, run.info, model_id(run.info)
            if not smoke:
                print(json.dumps({"ready": True, "url": server.url, "model": ident}), flush=True)
            log.info("serving %s at %s (%s)", info.name, server.url, info.backend)
            if smoke:
                threading.Thread(
                    target=_smoke,
                    args=(run, local_url(server.url), ident, key),
                    name="lamplight-smoke",
                    daemon=True,
                ).start()
        if run.smoke is not None:
            print(json.dumps(run.smoke), flush=True)
            return 0 if run.smoke.get("ok") else 1
        if smoke and time.monotonic() > deadline:
            print(json.dumps({"ok": False, "error": "timed out"}), flush=True)
            return 1


def _smoke(run: ServeListener, url: str, ident: str, key: str) -> None:
    run.smoke = smoke_request(url, ident, key)
    run.wake.set()


def _stop_host(host: EngineHost, thread: threading.Thread, cancel: threading.Event) -> None:
    """Stop a load in progress, let queued requests end, free the model, join."""
    cancel.set()
    host.quitting.set()
    host.close()
    thread.join(HOST_JOIN_S)
    if thread.is_alive():
        log.warning("the engine thread did not stop in %.0f s", HOST_JOIN_S)


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
