"""A fake inference server on 127.0.0.1 that misbehaves on cue, for the remote backends.

It speaks enough of llama-server's native API (``/health``, ``/props``,
``/tokenize``, ``/detokenize``, ``/completion``, ``/slots``) and of the OpenAI
API (``/v1/models``, ``/v1/chat/completions``) for both backends to connect and
stream, and each part can be told to go wrong: a stream that never ends, sends
huge events, trickles, falls silent (before or after its headers), sends damaged
JSON or SSE, claims gzip, drops the connection, or answers with the wrong
status or content type; a ``/health`` that answers 200 without ``"ok"``; a
``/props`` whose fields have the wrong types.

The tokenizer is one token per character (its code point), so token counts are
predictable. Every handler ends when the client goes away or the server closes:
``close()`` joins them all.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

STREAMS = (
    "normal",
    "endless",  # tokens forever: ignores n_predict / max_tokens
    "huge",  # events of ``piece_bytes`` each, ``tokens`` of them (ignores the limits)
    "slow",  # one token every ``delay`` seconds, forever
    "trickle",  # one byte of an event every ``delay`` seconds: never a whole event
    "silent_headers",  # headers, then nothing
    "silent_before_headers",  # reads the request, answers nothing
    "silent_after_tokens",  # ``tokens`` tokens, then nothing
    "malformed_json",  # tokens, then an event that is not JSON
    "non_object",  # events that are JSON but not objects, then a normal end
    "bad_sse",  # lines that are no SSE fields, an event over 1 MB
    "gzip_lie",  # Content-Encoding: gzip on a plain body
    "drop",  # tokens, then the connection closes mid-body
    "error_event",  # tokens, then an error event
    "wrong_type",  # 200 with application/json instead of an event stream
    "status_500",  # 500 with an HTML page
    "redirect",  # 302 to a login page
    "no_final",  # tokens, then a clean end without the final event
)
HEALTH = ("ok", "no_ok", "empty", "html", "loading", "gzip_lie")
PROPS = ("ok", "odd_settings", "odd_fields", "missing", "gzip_lie", "deep")
N_CTX = 4096


@dataclass
class Plan:
    """How the server behaves; the test sets it before each request."""

    health: str = "ok"
    props: str = "ok"
    models: str = "ok"  # "ok" or "gzip_lie"
    stream: str = "normal"
    tokens: int = 5  # tokens of a normal, huge or truncated stream
    piece: str = "hi "  # each token's text
    piece_bytes: int = 200_000  # "huge": characters of each event
    delay: float = 0.05  # "slow", "trickle": seconds between sends
    props_value: Any = None  # "odd_settings": what default_generation_settings is
    n_saved: int = 1_000_000  # what a slot save says it saved
    slot_files: dict[str, int] = field(default_factory=dict)  # saved: name -> n_saved
    requests: list[str] = field(default_factory=list)  # paths asked for, in order


class MisbehavingServer(ThreadingHTTPServer):
    """The fake server; use as a context manager (``url`` while it runs)."""

    daemon_threads = False
    block_on_close = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.plan = Plan()
        self.closing = threading.Event()
        self.conns: set[socket.socket] = set()
        self.lock = threading.Lock()
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="misbehaving-server"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> MisbehavingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and join every handler: each notices ``closing`` within 50 ms, and
        one blocked on its socket (an idle kept-alive connection) is woken by a shutdown."""
        self.closing.set()
        self.shutdown()
        with self.lock:
            conns = list(self.conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.server_close()
        self._thread.join(timeout=10)


class _Gone(Exception):
    """The client went away or the server is closing."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: MisbehavingServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without this, each answer waits
        # for the client's delayed ACK (40 ms).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.lock:
            self.server.conns.add(self.connection)

    def finish(self) -> None:
        with self.server.lock:
            self.server.conns.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    # -- dispatch ------------------------------------------------------------------

    def do_GET(self) -> None:
        self._handle(None)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        self._handle(body if isinstance(body, dict) else {})

    def _handle(self, body: dict[str, Any] | None) -> None:
        path = urlsplit(self.path).path
        plan = self.server.plan
        plan.requests.append(path)
        try:
            if path == "/health":
                self._health(plan)
            elif path == "/props":
                self._props(plan)
            elif path in ("/v1/models", "/models"):
                self._models(plan)
            elif path == "/lora-adapters":
                self._json(200, [])
            elif path == "/tokenize":
                text = str((body or {}).get("content", ""))
                bos = [2] if (body or {}).get("add_special") else []
                self._json(200, {"tokens": bos + [ord(c) for c in text]})
            elif path == "/detokenize":
                ids = (body or {}).get("tokens", [])
                text = "".join(chr(i) for i in ids if isinstance(i, int) and 31 < i < 0x110000)
                self._json(200, {"content": text})
            elif path.startswith("/slots/"):
                self._slots(plan, (body or {}).get("filename"))
            elif path == "/completion":
                self._completion(plan, body or {})
            elif path in ("/v1/chat/completions", "/chat/completions"):
                self._stream(plan, "openai", (body or {}).get("max_tokens"))
            else:
                self._json(404, {"error": {"code": 404, "message": "File Not Found"}})
        except (_Gone, OSError):
            self.close_connection = True

    # -- plain answers ---------------------------------------------------------------

    def _health(self, plan: Plan) -> None:
        kind = plan.health
        if kind == "ok":
            self._json(200, {"status": "ok"})
        elif kind == "no_ok":
            self._json(200, {"status": "healthy", "engine": "vllm"})
        elif kind == "empty":
            self._raw(200, b"", "application/json")
        elif kind == "html":
            self._raw(200, b"<html><body>Sign in to continue</body></html>", "text/html")
        elif kind == "loading":
            self._json(503, {"error": {"code": 503, "message": "Loading model"}})
        else:
            self._raw(200, b'{"status": "ok"}', "application/json", gzip_lie=True)

    def _props(self, plan: Plan) -> None:
        settings: Any = {"n_ctx": N_CTX, "params": {"n_predict": -1}}
        props: dict[str, Any] = {
            "default_generation_settings": settings,
            "model_path": "/models/fake-1b.gguf",
            "build_info": "b1-fake",
            "chat_template": "",
            "bos_token": "<bos>",
            "eos_token": "<eos>",
        }
        kind = plan.props
        if kind == "odd_settings":
            props["default_generation_settings"] = plan.props_value
        elif kind == "odd_fields":
            props.update(
                model_path={"a": [1, 2]},
                build_info=["x"] * 50,
                chat_template=12,
                bos_token=[None],
                model_alias=3.5,
            )
            settings["n_ctx"] = "4096"
        elif kind == "missing":
            props = {"status": "ok"}
        elif kind == "deep":
            deep: Any = 1
            for _ in range(200):
                deep = [deep]
            props["default_generation_settings"] = deep
        if kind == "gzip_lie":
            self._raw(200, json.dumps(props).encode(), "application/json", gzip_lie=True)
        else:
            self._json(200, props)

    def _slots(self, plan: Plan, name: Any) -> None:
        if "action=save" in self.path:
            plan.slot_files[str(name)] = plan.n_saved
            self._json(200, {"filename": name, "n_saved": plan.n_saved})
        elif str(name) in plan.slot_files:
            self._json(200, {"filename": name, "n_restored": plan.slot_files[str(name)]})
        else:
            self._json(400, {"error": {"code": 400, "message": "Unable to restore slot"}})

    def _models(self, plan: Plan) -> None:
        data = {
            "object": "list",
            "data": [{"id": "fake-1b", "max_model_len": N_CTX, "meta": {"n_ctx": N_CTX}}],
        }
        self._raw(200, json.dumps(data).encode(), "application/json", plan.models == "gzip_lie")

    def _json(self, status: int, data: Any) -> None:
        self._raw(status, json.dumps(data).encode(), "application/json")

    def _raw(self, status: int, body: bytes, ctype: str, gzip_lie: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if gzip_lie:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    # -- streams -----------------------------------------------------------------------

    def _completion(self, plan: Plan, body: dict[str, Any]) -> None:
        if not body.get("stream"):  # a prewarm (n_predict 0)
            self._json(200, {"content": "", "stop": True, "tokens_predicted": 0})
            return
        self._stream(plan, "native", body.get("n_predict"))

    def _stream(self, plan: Plan, api: str, limit: Any) -> None:
        kind = plan.stream
        if kind == "silent_before_headers":
            self._wait_gone()
        if kind == "status_500":
            self._raw(500, b"<html>Internal Server Error</html>", "text/html")
            return
        if kind == "redirect":
            self.send_response(302)
            self.send_header("Location", "/login")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        ctype = "application/json" if kind == "wrong_type" else "text/event-stream"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        if kind == "gzip_lie":
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.wfile.flush()
        if kind == "silent_headers":
            self._wait_gone()
        if kind == "trickle":
            for byte in b'data: {"content": "never ends':
                self._chunk(bytes([byte]))
                self._sleep(plan.delay)
            self._wait_gone()
        for part in _events(plan, api, limit):
            if part is _DROP:
                self.close_connection = True
                return  # the chunked body is never finished
            if part is _SILENCE:
                self._wait_gone()
            self._chunk(part)
            if kind == "slow":
                self._sleep(plan.delay)
            elif self.server.closing.is_set():
                raise _Gone
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _sleep(self, seconds: float) -> None:
        """Sleep, but end when the client goes away or the server closes."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._check_gone(min(0.05, max(0.0, end - time.monotonic())))

    def _wait_gone(self) -> None:
        """Say nothing until the client goes away or the server closes."""
        while True:
            self._check_gone(0.05)

    def _check_gone(self, timeout: float) -> None:
        if self.server.closing.is_set():
            raise _Gone
        ready, _, _ = select.select([self.connection], [], [], timeout)
        if ready:
            try:
                data = self.connection.recv(4096, socket.MSG_PEEK)
            except OSError:
                raise _Gone from None
            if not data:
                raise _Gone


_DROP = b"<drop>"
_SILENCE = b"<silence>"


def _sse(data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


def _token(api: str, text: str) -> dict[str, Any]:
    if api == "native":
        return {"content": text, "tokens": [ord(text[0]) if text else 0], "stop": False}
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


def _final(api: str, n: int) -> list[bytes]:
    if api == "native":
        timings = {"prompt_n": 3, "cache_n": 0, "predicted_per_second": 50.0}
        end = {"content": "", "stop": True, "stop_type": "eos", "tokens_predicted": n}
        return [_sse({**end, "timings": timings})]
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
    return [_sse(last), _sse(usage), b"data: [DONE]\n\n"]


def _events(plan: Plan, api: str, limit: Any) -> Iterator[bytes]:
    kind = plan.stream
    if api == "native":
        yield _sse({"prompt_progress": {"total": 3, "cache": 0, "processed": 3}})
    if kind in ("endless", "slow"):
        while True:
            yield _sse(_token(api, plan.piece))
    if kind == "huge":
        big = "x" * plan.piece_bytes
        for _ in range(plan.tokens):
            yield _sse(_token(api, big))
        yield from _final(api, plan.tokens)
        return
    if kind == "non_object":
        for value in ([1, 2], "text", 3, None, {"choices": "no"}, {"content": 5}):
            yield _sse(value)
    if kind == "bad_sse":
        yield b"no colon here\nretry: soon\nevent: x\n\n"
        yield b"data: " + b"y" * (1 << 20) + b"\n\n"
    n = max(0, plan.tokens)
    if isinstance(limit, int) and limit > 0 and kind == "normal":
        n = min(n, limit)
    for _ in range(n):
        yield _sse(_token(api, plan.piece))
    if kind == "silent_after_tokens":
        yield _SILENCE
    elif kind == "malformed_json":
        yield b"data: {not json\n\n"
    elif kind == "error_event":
        yield _sse({"error": {"code": 500, "message": "out of memory", "type": "server_error"}})
    elif kind == "drop":
        yield _DROP
    elif kind == "no_final":
        return
    elif kind == "gzip_lie":
        yield gzip.compress(b"not what it claims")[:5]
    yield from _final(api, n)
