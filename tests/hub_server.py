"""A local, Hub-compatible HTTP server for testing hub code with the real ``huggingface_hub``.

The server speaks the subset of the Hugging Face Hub API that ``huggingface_hub`` 2.x uses
for browsing and downloading models (verified against the installed 2.4.0 sources):

===========================================================  ==================================
``GET  /api/models?search=&author=&filter=&sort=&limit=``    ``HfApi.list_models`` (Link paging)
``GET  /api/models/{repo}[/revision/{rev}]?blobs=true``      ``HfApi.model_info`` / ``repo_info``
``GET  /api/models/{repo}/tree/{rev}[/{dir}]``               ``HfApi.list_repo_tree`` (paged)
``POST /api/models/{repo}/paths-info/{rev}``                 ``HfApi.get_paths_info``
``HEAD /{repo}/resolve/{rev}/{path}``                        ``get_hf_file_metadata``
``GET  /{repo}/resolve/{rev}/{path}`` (``Range`` → 206/416)  ``hf_hub_download`` / ``http_get``
``GET  /api/agent-harnesses``                                telemetry probe (empty registry)
===========================================================  ==================================

Only model repos exist. Revisions are ``main`` and the repo's fake commit (``COMMIT_SHA`` by
default). Files over 1 MiB and ``*.gguf``/``*.safetensors``/... are LFS: their metadata carries
``lfs {sha256|oid, size, pointerSize}``, their ETag is the sha256, and resolve responses carry
``X-Linked-Etag``/``X-Linked-Size`` like the Hub. Errors carry ``X-Error-Code`` /
``X-Error-Message`` plus a JSON ``{"error": ...}`` body, which the client maps as follows:

- unknown repo → 404 ``RepoNotFound`` → ``RepositoryNotFoundError``
- unknown revision → 404 ``RevisionNotFound`` → ``RevisionNotFoundError``
- unknown file → 404 ``EntryNotFound`` → ``RemoteEntryNotFoundError``
- gated repo, file access (metadata stays public, as on the Hub): no token → 401, token not in
  ``valid_tokens`` → 403, both with ``GatedRepo`` → ``GatedRepoError`` (``.response.status_code``)
- private repo, every endpoint (and hidden from listings): no token → 401, wrong token → 403,
  both with ``RepoNotFound`` → ``RepositoryNotFoundError``

Pointing ``huggingface_hub`` at the server
------------------------------------------
``huggingface_hub.constants`` reads ``HF_ENDPOINT``, ``HF_HOME``, the token path, and the
``HF_HUB_DISABLE_XET`` / ``HF_HUB_DISABLE_TELEMETRY`` / ``HF_HUB_OFFLINE`` flags **at import
time**, and the module-level ``huggingface_hub.list_models`` / ``model_info`` / ... are bound
methods of an ``HfApi()`` created at import, so setting env vars in a test is not enough.
``patch_huggingface_hub`` sets the env vars *and* patches those constants, that ``HfApi``
instance's ``endpoint``, the cache/token paths, and the agent-detection registry (with telemetry
on, building headers would fetch ``{ENDPOINT}/api/agent-harnesses``). ``HfApi(endpoint=...)``
and ``hf_hub_download(endpoint=...)`` then work with or without ``endpoint=``::

    from tests.hub_server import HubServer, serving_hub

    @pytest.fixture()
    def hub(monkeypatch, tmp_path):
        with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
            server.add_repo("org/tiny-GGUF", {"tiny.Q4_K_M.gguf": b"GGUF..."}, downloads=10)
            yield server

``serving_hub`` closes the client's shared ``httpx2`` session on exit, so no pooled keep-alive
connection outlives the server. ``patch_huggingface_hub`` also sets
``tqdm.tqdm.monitor_interval = 0``: tqdm starts its monitor thread in ``__new__`` even for a
disabled bar, and tests/conftest.py fails a test that leaves that thread behind.

What the 2.4.0 client does (pinned by tests/model/test_hub_server.py):

- ``hf_hub_download`` never resumes across calls: it writes ``<blob>.<uuid8>.incomplete`` (or
  ``.cache/huggingface/download/<hash>.<etag>.<uuid8>.incomplete`` for ``local_dir``) and deletes
  it on failure. Within one call ``http_get`` retries a dropped or timed-out body up to 5 times
  (1 s sleep each) with ``Range: bytes=N-``, where N counts only whole
  ``constants.DOWNLOAD_CHUNK_SIZE`` (10 MiB) chunks already written; below that it restarts at 0.
- It checks the size, never the sha256, of a plain HTTP download.
- On a HEAD that fails with a plain ``HfHubHTTPError`` other than 401 (a 403 without
  ``X-Error-Code``, a 5xx) it raises ``LocalEntryNotFoundError``, not the HTTP error.

Fault injection (per file path in the repo, optionally per repo): ``drop_after`` (close the
connection after N body bytes), ``stall`` (send headers, then sleep in small steps that end when
the server stops), ``corrupt`` (same size, one byte flipped: sha256 no longer matches the
metadata), ``fail`` (answer with an HTTP status), ``throttle`` (bytes/s per response),
``ignore_range`` (answer every GET with 200 and the whole file, as some proxies and mirrors do),
``wrong_ranges`` (answer GETs with another byte range than asked, as proxies and CDNs that align
ranges do, or with a missing, garbage, lying or wrong-total ``Content-Range``; see
``RangeAnswer``), and ``raw_responses`` (a canned status and body for one URL path, for
malformed API answers).
Every request is recorded in ``server.requests`` as ``(method, path, headers)`` with lower-case
header names.

``python -m tests.hub_server FILE.gguf ...`` serves local files as ``local/test-GGUF`` for manual
runs of the app (bounded by ``--seconds``; ``--rate`` throttles file bodies to bytes/s).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import socket
import socketserver
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

if TYPE_CHECKING:
    import pytest

COMMIT_SHA = "5e1a7c0ffee5eed0ba5eba11deadbeefcafe1234"
LFS_THRESHOLD = 1024 * 1024
LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".onnx", ".h5", ".zip", ".gz")
CHUNK = 1024 * 1024
DEFAULT_DATE = datetime(2025, 1, 1, tzinfo=timezone.utc)
_POLL = 0.05  # seconds: granularity of every sleep, so stop() is never kept waiting long

_SHA_CACHE: dict[tuple[str, int, int], str] = {}
_SHA_LOCK = threading.Lock()


def sha256_path(path: Path) -> str:
    """sha256 of a file on disk, cached per (path, size, mtime) for the whole process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _SHA_LOCK:
        if key in _SHA_CACHE:
            return _SHA_CACHE[key]
    digest = hashlib.sha256()
    buf = bytearray(4 * CHUNK)
    view = memoryview(buf)
    with path.open("rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            digest.update(view[:n])
    result = digest.hexdigest()
    with _SHA_LOCK:
        _SHA_CACHE[key] = result
    return result


def _git_blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{value.microsecond // 1000:03d}Z"
    )


def _as_datetime(value: datetime | str | None, default: datetime) -> datetime:
    if value is None:
        return default
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


class HubFile:
    """One file of a repo: bytes in memory or a path streamed from disk."""

    def __init__(self, path: str, content: bytes | os.PathLike[str]) -> None:
        self.path = path
        if isinstance(content, (bytes, bytearray, memoryview)):
            self.data: bytes | None = bytes(content)
            self.source: Path | None = None
            self.size = len(self.data)
        elif isinstance(content, os.PathLike):
            self.data = None
            self.source = Path(content)
            self.size = self.source.stat().st_size
        else:
            raise TypeError(f"{path}: content must be bytes or a path, not {type(content)}")
        self.lfs = path.lower().endswith(LFS_SUFFIXES) or self.size > LFS_THRESHOLD
        self._sha256: str | None = None
        self._oid: str | None = None

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            if self.data is not None:
                self._sha256 = hashlib.sha256(self.data).hexdigest()
            else:
                assert self.source is not None
                self._sha256 = sha256_path(self.source)
        return self._sha256

    @property
    def pointer(self) -> bytes:
        """The git-lfs pointer file that git stores in place of an LFS file."""
        return (
            "version https://git-lfs.github.com/spec/v1\n"
            f"oid sha256:{self.sha256}\nsize {self.size}\n"
        ).encode()

    @property
    def oid(self) -> str:
        """Git blob id: of the pointer for LFS files, of the content otherwise."""
        if self._oid is None:
            self._oid = _git_blob_oid(self.pointer if self.lfs else self.read(0, self.size))
        return self._oid

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.oid

    def lfs_json(self, sha_key: Literal["sha256", "oid"]) -> dict[str, Any]:
        return {sha_key: self.sha256, "size": self.size, "pointerSize": len(self.pointer)}

    def read(self, offset: int, size: int, fh: BinaryIO | None = None) -> bytes:
        if self.data is not None:
            return self.data[offset : offset + size]
        if fh is None:
            assert self.source is not None
            with self.source.open("rb") as own:
                own.seek(offset)
                return own.read(size)
        fh.seek(offset)
        return fh.read(size)


@dataclass
class HubRepo:
    """A model repo in the registry."""

    repo_id: str
    files: dict[str, HubFile]
    gated: Literal["auto", "manual", False] = False
    private: bool = False
    downloads: int = 0
    likes: int = 0
    last_modified: datetime = DEFAULT_DATE
    created_at: datetime = DEFAULT_DATE
    tags: list[str] = field(default_factory=list)
    sha: str = COMMIT_SHA
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def object_id(self) -> str:
        return hashlib.sha1(self.repo_id.encode()).hexdigest()[:24]

    def directories(self) -> set[str]:
        dirs: set[str] = set()
        for path in self.files:
            parts = path.split("/")[:-1]
            dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        return dirs

    def properties(self, *, blobs: bool = False) -> dict[str, Any]:
        """Every property ``model_info`` returns, Hub JSON names."""
        siblings = []
        for path in sorted(self.files):
            entry: dict[str, Any] = {"rfilename": path}
            if blobs:
                f = self.files[path]
                entry.update(blobId=f.oid, size=f.size)
                if f.lfs:
                    entry["lfs"] = f.lfs_json("sha256")
            siblings.append(entry)
        return {
            "_id": self.object_id,
            "id": self.repo_id,
            "modelId": self.repo_id,
            "author": self.repo_id.split("/")[0] if "/" in self.repo_id else None,
            "sha": self.sha,
            "lastModified": _iso(self.last_modified),
            "createdAt": _iso(self.created_at),
            "private": self.private,
            "disabled": False,
            "gated": self.gated,
            "downloads": self.downloads,
            "likes": self.likes,
            "trendingScore": 0,
            "tags": list(self.tags),
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(f.size for f in self.files.values()),
            **self.extra,
        }


class RecordedRequest(NamedTuple):
    """A request as the server saw it; ``headers`` keys are lower-case."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class _Fault:
    repo_id: str | None
    times: int | None  # None: every request
    drop_after: int | None = None
    stall: float | None = None
    stall_after: int = 0
    status: int | None = None


@dataclass(frozen=True)
class RangeAnswer:
    """How one file GET is answered by a server that does not serve the range asked.

    The range served starts ``shift`` bytes from the asked start (0 without a ``Range``
    header), clamped into the file, and holds at most ``length`` bytes (a CDN's chunk);
    ``whole`` answers 200 with the whole file instead. ``header`` says what
    ``Content-Range`` the 206 carries: ``honest`` (the range served), ``none``,
    ``raw`` (the text ``raw``), ``wrong_total`` (the range served, of a file one byte
    longer) or ``lie`` (the range asked, while the body is the range served).
    """

    shift: int = 0
    length: int | None = None
    whole: bool = False
    header: Literal["honest", "none", "raw", "wrong_total", "lie"] = "honest"
    raw: str = ""


@dataclass
class _RangeScript:
    answers: list[RangeAnswer]
    repeat_last: bool


@dataclass
class _Plan:
    """Faults that apply to one response."""

    drop_after: int | None = None
    stall: float | None = None
    stall_after: int = 0
    status: int | None = None
    corrupt: bool = False
    range_answer: RangeAnswer | None = None


class _Abort(Exception):
    """The server is stopping or the client went away: end this response."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # HubServer.stop() joins the connection threads, with a bound

    def __init__(self, address: tuple[str, int], hub: HubServer) -> None:
        self.hub = hub
        self.conn_lock = threading.Lock()
        self.conn_threads: list[threading.Thread] = []
        self.conns: set[socket.socket] = set()
        self._count = 0
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # skip HTTPServer's getfqdn() DNS lookup
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conn_lock:
            self._count += 1
            thread = threading.Thread(
                target=self.process_request_thread,
                args=(request, client_address),
                name=f"hub-server-conn-{self._count}",
                daemon=True,
            )
            self.conn_threads = [t for t in self.conn_threads if t.is_alive()]
            self.conn_threads.append(thread)
            self.conns.add(request)
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        with self.conn_lock:
            self.conns.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, _Abort)):
            return
        if exc is not None:
            self.hub.errors.append(exc)
        super().handle_error(request, client_address)


class HubServer:
    """A Hub-compatible server on loopback; ``with HubServer() as hub: ...``.

    Attributes tests may set: ``valid_tokens`` (tokens that may read gated/private repos),
    ``page_size`` (max models per ``list_models`` page), ``tree_page_size`` (max tree entries
    per page; the Hub uses 1000, or 50 with ``expand``), ``cdn_redirect`` (answer resolve of LFS
    files with a 302 to ``http://localhost:{port}/__cdn/...``, a different origin, like the
    Hub's CDN), ``reject_invalid_tokens`` (like the Hub, 401 on any endpoint for a token not in
    ``valid_tokens``), ``ignore_range`` (200 with the whole file whatever the ``Range``),
    ``raw_responses`` (URL path -> ``(status, body bytes)``, served as JSON before any routing).
    ``requests`` and ``errors`` (unexpected exceptions in handlers) are recorded.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._requested_port = port
        self.valid_tokens: set[str] = set()
        self.page_size = 1000
        self.tree_page_size: int | None = None
        self.cdn_redirect = False
        self.reject_invalid_tokens = False
        self.ignore_range = False
        self.raw_responses: dict[str, tuple[int, bytes]] = {}
        self.requests: list[RecordedRequest] = []
        self.errors: list[BaseException] = []
        self._repos: dict[str, HubRepo] = {}
        self._faults: dict[tuple[str | None, str], list[_Fault]] = {}
        self._corrupt: set[tuple[str | None, str]] = set()
        self._range_scripts: dict[tuple[str | None, str], _RangeScript] = {}
        self._bytes_per_sec: float | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> HubServer:
        """Bind and serve in a daemon thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError("HubServer already started")
        self._stopping.clear()
        self._httpd = _HTTPServer((self.host, self._requested_port), self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": _POLL},
            name="hub-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, cut open connections (stalls end too), and join every thread."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        self._stopping.set()
        httpd.shutdown()
        thread.join(timeout)
        with httpd.conn_lock:
            conns, threads = list(httpd.conns), list(httpd.conn_threads)
        for conn in conns:  # wake threads blocked on keep-alive reads or slow sends
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        httpd.server_close()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._httpd = self._thread = None
        alive = [t.name for t in [thread, *threads] if t.is_alive()]
        if alive:
            raise RuntimeError(f"HubServer threads still running after stop(): {alive}")

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("HubServer not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The endpoint, e.g. ``http://127.0.0.1:41234`` (use as ``HF_ENDPOINT``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # -- registry ----------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes | os.PathLike[str]],
        *,
        gated: bool | Literal["auto", "manual"] = False,
        private: bool = False,
        downloads: int = 0,
        likes: int = 0,
        last_modified: datetime | str | None = None,
        created_at: datetime | str | None = None,
        tags: Iterable[str] = (),
        sha: str = COMMIT_SHA,
        extra: Mapping[str, Any] | None = None,
    ) -> HubRepo:
        """Add (or replace) a model repo. ``extra`` adds Hub JSON fields (``gguf``, ...).

        Repos holding a ``*.gguf`` file get the ``gguf`` tag, as on the Hub. Sizes are read
        now; sha256 of path files is computed on first use and cached.
        """
        if not re.fullmatch(r"[0-9a-f]{40}", sha):
            raise ValueError("sha must be 40 lower-case hex digits")
        hub_files = {path.strip("/"): HubFile(path.strip("/"), c) for path, c in files.items()}
        tag_list = list(dict.fromkeys(tags))
        if any(p.lower().endswith(".gguf") for p in hub_files) and "gguf" not in tag_list:
            tag_list.append("gguf")
        modified = _as_datetime(last_modified, DEFAULT_DATE)
        repo = HubRepo(
            repo_id=repo_id,
            files=hub_files,
            gated=("manual" if gated is True else gated),
            private=private,
            downloads=downloads,
            likes=likes,
            last_modified=modified,
            created_at=_as_datetime(created_at, modified),
            tags=tag_list,
            sha=sha,
            extra=dict(extra or {}),
        )
        with self._lock:
            self._repos[repo_id] = repo
        return repo

    def remove_repo(self, repo_id: str) -> None:
        with self._lock:
            self._repos.pop(repo_id, None)

    def repo(self, repo_id: str) -> HubRepo | None:
        with self._lock:
            return self._repos.get(repo_id)

    def repos(self) -> list[HubRepo]:
        with self._lock:
            return list(self._repos.values())

    # -- faults ------------------------------------------------------------------------------

    def drop_after(
        self, path: str, n_bytes: int, times: int | None = 1, *, repo_id: str | None = None
    ) -> None:
        """Close the connection after ``n_bytes`` of body, for the next ``times`` GETs."""
        self._add_fault(path, _Fault(repo_id, times, drop_after=n_bytes))

    def stall(
        self,
        path: str,
        seconds: float,
        times: int | None = None,
        *,
        after_bytes: int = 0,
        repo_id: str | None = None,
    ) -> None:
        """Send headers (and ``after_bytes`` of body), then pause ``seconds`` before the rest.

        The pause sleeps in 50 ms steps and ends early when the server stops.
        """
        self._add_fault(path, _Fault(repo_id, times, stall=seconds, stall_after=after_bytes))

    def fail(
        self, path: str, status: int = 503, times: int | None = 1, *, repo_id: str | None = None
    ) -> None:
        """Answer the next ``times`` HEAD/GET of the file with ``status`` (JSON error body)."""
        self._add_fault(path, _Fault(repo_id, times, status=status))

    def corrupt(self, path: str, enabled: bool = True, *, repo_id: str | None = None) -> None:
        """Serve the file with its middle byte flipped; metadata keeps the true sha256."""
        with self._lock:
            (self._corrupt.add if enabled else self._corrupt.discard)((repo_id, path.strip("/")))

    def wrong_ranges(
        self,
        path: str,
        answers: Iterable[RangeAnswer],
        *,
        repeat_last: bool = False,
        repo_id: str | None = None,
    ) -> None:
        """Answer the next GETs of the file with ``answers``, one each, in order; then
        honestly, or with the last answer forever (``repeat_last``)."""
        script = _RangeScript(list(answers), repeat_last)
        with self._lock:
            self._range_scripts[(repo_id, path.strip("/"))] = script

    def throttle(self, bytes_per_sec: float | None) -> None:
        """Limit every file body to ``bytes_per_sec`` (``None``: unlimited)."""
        self._bytes_per_sec = bytes_per_sec

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._corrupt.clear()
            self._range_scripts.clear()
        self._bytes_per_sec = None

    def _add_fault(self, path: str, fault: _Fault) -> None:
        with self._lock:
            self._faults.setdefault((fault.repo_id, path.strip("/")), []).append(fault)

    def _plan(self, repo_id: str, path: str, method: str) -> _Plan:
        """The faults for this response; consumes one use of each counted fault."""
        plan = _Plan()
        with self._lock:
            for key in ((None, path), (repo_id, path)):
                plan.corrupt = plan.corrupt or key in self._corrupt
                script = self._range_scripts.get(key)
                if script is not None and script.answers and method == "GET":
                    last = len(script.answers) == 1 and script.repeat_last
                    plan.range_answer = script.answers[0] if last else script.answers.pop(0)
                faults = self._faults.get(key, [])
                for fault in list(faults):
                    applies = fault.status is not None or method == "GET"
                    if not applies:
                        continue
                    if fault.status is not None:
                        plan.status = fault.status
                    if fault.drop_after is not None:
                        plan.drop_after = fault.drop_after
                    if fault.stall is not None:
                        plan.stall, plan.stall_after = fault.stall, fault.stall_after
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            faults.remove(fault)
        return plan

    # -- recording ---------------------------------------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def requests_to(self, fragment: str, method: str | None = None) -> list[RecordedRequest]:
        """Recorded requests whose path contains ``fragment`` (and with ``method``)."""
        with self._lock:
            return [
                r
                for r in self.requests
                if fragment in unquote(r.path) and (method is None or r.method == method)
            ]

    def clear_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    def _sleep(self, seconds: float) -> None:
        """Sleep in small steps; raise _Abort as soon as the server stops."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._stopping.wait(min(_POLL, left)):
                raise _Abort


_RANGE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", re.IGNORECASE)
_RESOLVE = re.compile(r"/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<rev>[^/]+)/(?P<path>.+)")


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``(start, end_exclusive)`` for a single satisfiable byte range, else None."""
    match = _RANGE.fullmatch(header)
    if match is None:
        return None
    first, last = match.groups()
    if not first:
        if not last or int(last) == 0 or size == 0:
            return None
        return max(0, size - int(last)), size
    start = int(first)
    end = size if not last else min(size, int(last) + 1)
    if start >= size or (last and int(last) < start):
        return None
    return start, end


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "LamplightTestHub/1.0"
    # Headers and body go out in separate writes: with Nagle's algorithm and the client's
    # delayed ACK every small API answer waited 40 ms.
    disable_nagle_algorithm = True
    timeout = 30  # bounds an idle keep-alive connection; stop() cuts it sooner
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the record is server.requests

    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._handle("HEAD")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def hub(self) -> HubServer:
        return self.server.hub

    def _handle(self, method: str) -> None:
        self._sent_headers = False
        length = int(self.headers.get("Content-Length") or 0)
        self._body = self.rfile.read(length) if length > 0 else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.hub._record(RecordedRequest(method, self.path, headers))
        try:
            self._route(method)
        except (_Abort, ConnectionError, TimeoutError):
            self._abort()
        except Exception as exc:
            self.hub.errors.append(exc)
            if self._sent_headers:
                self._abort()
            else:
                self._error(500, f"test hub server error: {exc!r}")

    def end_headers(self) -> None:
        self._sent_headers = True
        super().end_headers()

    def _abort(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json; charset=utf-8",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Request-Id", str(uuid.uuid4()))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, obj: Any, headers: Mapping[str, str] | None = None) -> None:
        self._send(200, json.dumps(obj).encode(), headers)

    def _error(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        extra = {"X-Error-Message": message, **(headers or {})}
        if code is not None:
            extra["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), extra)

    def _query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.path).query, keep_blank_values=True)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def _authorized(self) -> bool:
        return self._token() in self.hub.valid_tokens

    def _next_link(self, offset: int) -> dict[str, str]:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        pairs = [(k, v) for k, vs in query.items() if k != "cursor" for v in vs]
        pairs.append(("cursor", str(offset)))
        url = f"http://{self.headers.get('Host') or self.hub.host}{parts.path}?{urlencode(pairs)}"
        return {"Link": f'<{url}>; rel="next"'}

    # -- routing -----------------------------------------------------------------------------

    def _route(self, method: str) -> None:
        hub = self.hub
        path = urlsplit(self.path).path
        if (raw := hub.raw_responses.get(unquote(path))) is not None:
            self._send(raw[0], raw[1])
            return
        if (
            hub.reject_invalid_tokens
            and self._token() is not None
            and not self._authorized()
            and not path.startswith("/__cdn/")
        ):
            self._error(401, "Invalid credentials in Authorization header")
            return
        if path == "/api/agent-harnesses" and method == "GET":
            self._json({"standardEnvVars": [], "harnesses": {}})
        elif path == "/api/models" and method == "GET":
            self._list_models()
        elif path.startswith("/api/models/"):
            self._model_api(method, path[len("/api/models/") :])
        elif path.startswith("/__cdn/") and method in ("GET", "HEAD"):
            self._cdn(method)
        elif (match := _RESOLVE.fullmatch(path)) and method in ("GET", "HEAD"):
            self._resolve(method, unquote(match["repo"]), unquote(match["rev"]), match["path"])
        else:
            self._error(404, f"Not found: {method} {path}")

    def _find_repo(self, rest: str) -> tuple[str, HubRepo | None, list[str]]:
        segments = [unquote(s) for s in rest.split("/")]
        for n in (2, 1):
            if len(segments) >= n and (repo := self.hub.repo("/".join(segments[:n]))):
                return repo.repo_id, repo, segments[n:]
        n = min(2, len(segments))
        return "/".join(segments[:n]), None, segments[n:]

    def _check_repo(self, repo_id: str, repo: HubRepo | None, *, file_access: bool) -> bool:
        """Send the Hub's error for a missing or inaccessible repo; True if access is fine."""
        if repo is None:
            self._error(404, "Repository not found", "RepoNotFound")
            return False
        if repo.private and not self._authorized():
            status = 401 if self._token() is None else 403
            self._error(status, "Repository not found", "RepoNotFound")
            return False
        if repo.gated and file_access and not self._authorized():
            if self._token() is None:
                message = (
                    f"Access to model {repo_id} is restricted. You must have access to it and be"
                    " authenticated to access it. Please log in."
                )
                self._error(401, message, "GatedRepo")
            else:
                message = (
                    f"Access to model {repo_id} is restricted and you are not in the authorized"
                    " list."
                )
                self._error(403, message, "GatedRepo")
            return False
        return True

    def _check_revision(self, repo: HubRepo, revision: str) -> bool:
        if revision in ("main", "refs/heads/main", repo.sha):
            return True
        self._error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return False

    # -- /api/models -------------------------------------------------------------------------

    def _list_models(self) -> None:
        q = self._query()

        def first(name: str) -> str | None:
            return q[name][0] if q.get(name) else None

        authorized = self._authorized()
        repos = [r for r in self.hub.repos() if authorized or not r.private]
        if search := first("search"):
            repos = [r for r in repos if search.lower() in r.repo_id.lower()]
        if author := first("author"):
            repos = [r for r in repos if r.repo_id.split("/")[0].lower() == author.lower()]
        for wanted in q.get("filter", []):
            repos = [r for r in repos if wanted.lower() in self._filter_terms(r)]
        if (gated := first("gated")) is not None:
            repos = [r for r in repos if bool(r.gated) == (gated.lower() == "true")]
        if pipeline_tag := first("pipeline_tag"):
            repos = [r for r in repos if r.extra.get("pipeline_tag") == pipeline_tag]
        if sort := first("sort"):
            keys = {
                "downloads": lambda r: r.downloads,
                "likes": lambda r: r.likes,
                "lastModified": lambda r: r.last_modified,
                "last_modified": lambda r: r.last_modified,
                "createdAt": lambda r: r.created_at,
                "created_at": lambda r: r.created_at,
                "trendingScore": lambda r: r.extra.get("trendingScore", 0),
            }
            if sort not in keys:
                self._error(400, f"Invalid sort parameter: {sort}")
                return
            repos.sort(key=keys[sort], reverse=first("direction") != "1")
        page_size = self.hub.page_size
        if limit := first("limit"):
            page_size = min(page_size, max(1, int(limit)))
        offset = int(first("cursor") or 0)
        page = repos[offset : offset + page_size]
        expand = q.get("expand") or q.get("expand[]")
        full = (first("full") or "").lower() == "true"
        items = [self._summary(r, expand, full, q) for r in page]
        more = offset + page_size < len(repos)
        self._json(items, self._next_link(offset + page_size) if more else None)

    @staticmethod
    def _filter_terms(repo: HubRepo) -> set[str]:
        terms = {t.lower() for t in repo.tags}
        for key in ("library_name", "pipeline_tag"):
            if isinstance(value := repo.extra.get(key), str):
                terms.add(value.lower())
        return terms

    @staticmethod
    def _summary(
        repo: HubRepo, expand: list[str] | None, full: bool, q: dict[str, list[str]]
    ) -> dict[str, Any]:
        props = repo.properties()
        if expand:
            return {k: v for k, v in props.items() if k in ("_id", "id", *expand)}
        keys = ["_id", "id", "likes", "trendingScore", "private", "downloads", "tags"]
        keys += ["pipeline_tag", "library_name", "createdAt", "modelId"]
        if full:
            keys += ["author", "sha", "lastModified", "gated", "disabled", "siblings"]
        if q.get("cardData"):
            keys.append("cardData")
        if q.get("config"):
            keys.append("config")
        return {k: props[k] for k in keys if k in props}

    def _model_api(self, method: str, rest: str) -> None:
        repo_id, repo, tail = self._find_repo(rest)
        if not self._check_repo(repo_id, repo, file_access=False):
            return
        assert repo is not None
        if method == "GET" and (not tail or (len(tail) == 2 and tail[0] == "revision")):
            if tail and not self._check_revision(repo, tail[1]):
                return
            self._model_info(repo)
        elif method == "GET" and len(tail) >= 2 and tail[0] == "tree":
            if self._check_revision(repo, tail[1]):
                self._tree(repo, "/".join(tail[2:]).strip("/"))
        elif method == "POST" and len(tail) == 2 and tail[0] == "paths-info":
            if self._check_revision(repo, tail[1]):
                self._paths_info(repo)
        else:
            self._error(404, f"Not found: {method} {self.path}")

    def _model_info(self, repo: HubRepo) -> None:
        q = self._query()
        props = repo.properties(blobs=(q.get("blobs") or [""])[0].lower() == "true")
        if expand := q.get("expand") or q.get("expand[]"):
            props = {k: v for k, v in props.items() if k in ("_id", "id", *expand)}
        self._json(props)

    def _entry(self, repo: HubRepo, path: str, expand: bool) -> dict[str, Any]:
        if path in repo.files:
            f = repo.files[path]
            entry: dict[str, Any] = {"type": "file", "oid": f.oid, "size": f.size, "path": path}
            if f.lfs:
                entry["lfs"] = f.lfs_json("oid")
        else:
            tree_oid = hashlib.sha1(f"tree {repo.repo_id} {path}".encode()).hexdigest()
            entry = {"type": "directory", "oid": tree_oid, "size": 0, "path": path}
        if expand:
            entry["lastCommit"] = {
                "id": repo.sha,
                "title": "Upload model",
                "date": _iso(repo.last_modified),
            }
            if entry["type"] == "file":
                entry["securityFileStatus"] = {
                    "status": "safe",
                    "avScan": {"virusFound": False, "virusNames": None},
                    "pickleImportScan": None,
                }
        return entry

    def _tree(self, repo: HubRepo, base: str) -> None:
        q = self._query()
        recursive = (q.get("recursive") or [""])[0].lower() == "true"
        expand = (q.get("expand") or [""])[0].lower() == "true"
        dirs = repo.directories()
        if base and base not in dirs:
            message = f"Entry not found: {base}"
            self._error(404, message, "EntryNotFound", {"X-Repo-Commit": repo.sha})
            return
        prefix = f"{base}/" if base else ""

        def wanted(path: str) -> bool:
            if not path.startswith(prefix):
                return False
            return recursive or "/" not in path[len(prefix) :]

        paths = sorted(d for d in dirs if wanted(d)) + sorted(p for p in repo.files if wanted(p))
        page_size = self.hub.tree_page_size or (50 if expand else 1000)
        offset = int((q.get("cursor") or ["0"])[0])
        page = [self._entry(repo, p, expand) for p in paths[offset : offset + page_size]]
        more = offset + page_size < len(paths)
        self._json(page, self._next_link(offset + page_size) if more else None)

    def _paths_info(self, repo: HubRepo) -> None:
        form = parse_qs(self._body.decode(), keep_blank_values=True)
        expand = (form.get("expand") or [""])[0].lower() == "true"
        dirs = repo.directories()
        paths = [p.strip("/") for p in form.get("paths", [])]
        self._json([self._entry(repo, p, expand) for p in paths if p in repo.files or p in dirs])

    # -- files -------------------------------------------------------------------------------

    def _resolve(self, method: str, repo_id: str, revision: str, raw_path: str) -> None:
        repo = self.hub.repo(repo_id)
        if not self._check_repo(repo_id, repo, file_access=True):
            return
        assert repo is not None
        if not self._check_revision(repo, revision):
            return
        path = unquote(raw_path)
        f = repo.files.get(path)
        if f is None:
            message = f"Entry not found: {path}"
            self._error(404, message, "EntryNotFound", {"X-Repo-Commit": repo.sha})
            return
        redirect = self.hub.cdn_redirect and f.lfs
        # A redirect sends no body: leave body faults (drop, stall) for the CDN request.
        plan = self.hub._plan(repo_id, path, "HEAD" if redirect else method)
        if plan.status is not None:
            self._error(plan.status, f"Injected failure {plan.status}")
            return
        linked = {"X-Repo-Commit": repo.sha}
        if f.lfs:
            linked.update({"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.size)})
        if redirect:
            query = urlencode({"repo": repo_id, "path": path, "Expires": "4102444800"})
            location = f"http://localhost:{self.hub.port}/__cdn/{f.sha256}?{query}"
            headers = {"Location": location, "ETag": f'"{f.oid}"', **linked}
            self._send(302, b"", headers, content_type="text/plain; charset=utf-8")
            return
        self._serve_file(method, f, plan, {"ETag": f'"{f.etag}"', **linked})

    def _cdn(self, method: str) -> None:
        q = self._query()
        repo = self.hub.repo((q.get("repo") or [""])[0])
        path = (q.get("path") or [""])[0]
        f = repo.files.get(path) if repo else None
        if repo is None or f is None or not self.path.startswith(f"/__cdn/{f.sha256}?"):
            self._send(403, b"<Error>AccessDenied</Error>", content_type="application/xml")
            return
        plan = self.hub._plan(repo.repo_id, path, method)
        if plan.status is not None:
            self._error(plan.status, f"Injected failure {plan.status}")
            return
        self._serve_file(method, f, plan, {"ETag": f'"{f.sha256}"'})

    def _serve_file(self, method: str, f: HubFile, plan: _Plan, headers: dict[str, str]) -> None:
        start, end, status = 0, f.size, 200
        range_header = None if self.hub.ignore_range else self.headers.get("Range")
        if plan.range_answer is not None and f.size:
            start, end, status = self._wrong_range(f, plan.range_answer, range_header, headers)
        elif range_header is not None:
            parsed = _parse_range(range_header, f.size)
            if parsed is None:
                message = f"Range Not Satisfiable: {range_header}"
                self._error(416, message, headers={"Content-Range": f"bytes */{f.size}"})
                return
            (start, end), status = parsed, 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
        name = f.path.rsplit("/", 1)[-1]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header(
            "Content-Disposition", f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\";"
        )
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if method == "GET":
            self._send_body(f, start, end, plan)

    def _wrong_range(
        self, f: HubFile, answer: RangeAnswer, range_header: str | None, headers: dict[str, str]
    ) -> tuple[int, int, int]:
        """``(start, end_exclusive, status)`` served for ``answer``; sets ``Content-Range``."""
        parsed = _parse_range(range_header, f.size) if range_header is not None else None
        asked = parsed[0] if parsed is not None else 0
        if answer.whole:
            return 0, f.size, 200
        start = min(max(0, asked + answer.shift), f.size - 1)
        end = f.size if answer.length is None else min(f.size, start + max(1, answer.length))
        claimed = {
            "honest": f"bytes {start}-{end - 1}/{f.size}",
            "wrong_total": f"bytes {start}-{end - 1}/{f.size + 1}",
            "lie": f"bytes {asked}-{asked + end - start - 1}/{f.size}",
            "raw": answer.raw,
        }.get(answer.header)
        if claimed is not None:
            headers["Content-Range"] = claimed
        return start, end, 206

    def _send_body(self, f: HubFile, start: int, end: int, plan: _Plan) -> None:
        hub = self.hub
        rate = hub._bytes_per_sec
        total = end - start
        faulty = plan.corrupt or rate or plan.stall is not None or plan.drop_after is not None
        if f.source is not None and not faulty:
            with f.source.open("rb") as whole:  # zero-copy: hundreds of MB/s on loopback
                self.connection.sendfile(whole, offset=start, count=total)
            return
        limit = total if plan.drop_after is None else min(total, plan.drop_after)
        chunk = CHUNK if not rate else max(1024, min(CHUNK, int(rate / 20)))
        stall_at = None if plan.stall is None else min(plan.stall_after, limit)
        flip = f.size // 2 if plan.corrupt and f.size else None
        sent = 0
        began = time.monotonic()
        with contextlib.ExitStack() as stack:
            fh: BinaryIO | None = None
            if f.source is not None:
                fh = stack.enter_context(f.source.open("rb"))
            while True:
                if hub.stopping:
                    raise _Abort
                if stall_at is not None and sent >= stall_at:
                    assert plan.stall is not None
                    hub._sleep(plan.stall)
                    stall_at = None
                if sent >= limit:
                    break
                n = min(chunk, limit - sent)
                if stall_at is not None:
                    n = min(n, stall_at - sent)
                data = f.read(start + sent, n, fh)
                if flip is not None and start + sent <= flip < start + sent + len(data):
                    mutable = bytearray(data)
                    mutable[flip - start - sent] ^= 0xFF
                    data = bytes(mutable)
                self.wfile.write(data)
                sent += len(data)
                if rate:
                    hub._sleep(began + sent / rate - time.monotonic())
        if limit < total:
            self._abort()


@contextlib.contextmanager
def serving_hub(
    monkeypatch: pytest.MonkeyPatch, hf_home: Path, *, server: HubServer | None = None
) -> Iterator[HubServer]:
    """Start a HubServer, point ``huggingface_hub`` at it, and clean up both on exit."""
    from huggingface_hub import close_session

    hub = server or HubServer()
    with hub:
        patch_huggingface_hub(monkeypatch, hub.url, hf_home)
        try:
            yield hub
        finally:
            close_session()  # drop pooled keep-alive connections before the server stops


def patch_huggingface_hub(monkeypatch: pytest.MonkeyPatch, endpoint: str, hf_home: Path) -> None:
    """Point an already imported ``huggingface_hub`` at ``endpoint`` with a private HF_HOME.

    No real token, cache or config is read; Xet and telemetry are off. Undone by monkeypatch.
    """
    import huggingface_hub.hf_api  # a lazy submodule: import it for its module-level HfApi()
    import tqdm  # type: ignore[import-untyped]
    from huggingface_hub import close_session, constants
    from huggingface_hub.utils import _detect_agent

    endpoint = endpoint.rstrip("/")
    home = Path(hf_home)
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN_PATH",
        "HF_OIDC_RESOURCE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HUGGINGFACE_CO_STAGING",
    ):
        monkeypatch.delenv(name, raising=False)

    hub_cache = str(home / "hub")
    values: dict[str, Any] = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_URL_HOSTS": constants.HF_URL_HOSTS | {urlsplit(endpoint).hostname or ""},
        "HF_HOME": str(home),
        "default_cache_path": hub_cache,
        "HF_HUB_CACHE": hub_cache,
        "HUGGINGFACE_HUB_CACHE": hub_cache,
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HUGGINGFACE_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "CHECK_FOR_UPDATE_DONE_PATH": str(home / ".check_for_update_done"),
        "CHECK_FOR_SKILL_UPDATE_DONE_PATH": str(home / ".check_for_skill_update_done"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_UPDATE_CHECK": True,
    }
    for name, value in values.items():
        monkeypatch.setattr(constants, name, value, raising=False)
    monkeypatch.setattr(huggingface_hub.hf_api.api, "endpoint", endpoint)
    monkeypatch.setattr(
        _detect_agent, "_registry", {"standardEnvVars": [], "harnesses": {}}, raising=False
    )
    for module, name in (
        ("huggingface_hub.utils._cache_manager", "HF_HUB_CACHE"),
        ("huggingface_hub.utils._cache_assets", "HF_ASSETS_CACHE"),
    ):
        if module in sys.modules:
            value = hub_cache if name == "HF_HUB_CACHE" else str(home / "assets")
            monkeypatch.setattr(sys.modules[module], name, value, raising=False)
    # tqdm starts a monitor thread in __new__, even for a disabled bar; it outlives the test.
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)
    close_session()  # a fresh httpx2 client, no connection pooled from an earlier server


def main(argv: list[str] | None = None) -> int:
    """Serve local files as one repo, for trying the app by hand against a fake Hub."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repo", default="local/test-GGUF")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=600.0, help="serve this long, then exit")
    parser.add_argument("--rate", type=float, default=None, help="throttle bodies to bytes/s")
    args = parser.parse_args(argv)
    with HubServer(port=args.port) as hub:
        hub.add_repo(args.repo, {p.name: p for p in args.files})
        hub.throttle(args.rate)
        print(f"HF_ENDPOINT={hub.url} HF_HUB_DISABLE_XET=1  repo: {args.repo}", flush=True)
        with contextlib.suppress(KeyboardInterrupt, _Abort):
            hub._sleep(args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
