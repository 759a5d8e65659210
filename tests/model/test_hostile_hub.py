"""Hostile Hub names, listings and downloads, damaged models folders (issue 13).

The real ``huggingface_hub`` client talks to tests/hub_server.py on 127.0.0.1.
Invariant throughout: a typed Lamplight error (or a clean fallback) in bounded
time; nothing written outside the models folder; no download lost.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.models.download_control import Control
from app.models.download_errors import DownloadCancelled, DownloadError
from app.models.downloader import FileFetcher
from app.models.downloads import DownloadQueue
from app.models.hub import HubClient, HubError
from app.models.library import Library
from app.models.names import (
    FORBIDDEN_CATEGORIES,
    UnsafeNameError,
    check_file_name,
    check_repo_id,
    destination,
    repo_dir_name,
    repo_id_of_dir,
)
from app.models.quant import GgufChoice, RepoFile
from app.util.errors import LamplightError
from tests.hub_server import HubServer, serving_hub
from tests.hypothesis_budget import examples

REPO = "google/gemma-3-270m-GGUF"
FILE = "gemma-3-270m-Q4_K_M.gguf"
FUZZ = settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def head(model_path: Path) -> bytes:
    """The first 3 MB of the real model: what the download tests fetch."""
    with model_path.open("rb") as fh:
        return fh.read(3 * 1024 * 1024 + 321)


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, head: bytes) -> Iterator[HubServer]:
    with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
        server.add_repo(REPO, {FILE: head, "Q8_0/gemma-00001-of-00002.gguf": head[:5000]})
        yield server


def fetcher(**kw: Any) -> FileFetcher:
    return FileFetcher(read_timeout=5.0, sleep=lambda s: None, **kw)


def _message_is_safe(exc: BaseException) -> None:
    """A refusal says why in one line, with no control or bidi character reaching the UI."""
    text = str(exc)
    assert text
    assert all(unicodedata.category(c) not in FORBIDDEN_CATEGORIES for c in text), ascii(text)


# -- names ---------------------------------------------------------------------------------

BAD_REPO_IDS = [
    "",
    ".",
    "..",
    "/",
    "../x",
    "x/..",
    "x/.",
    "./x",
    "a/b/c",
    "/a",
    "a/",
    "a",  # no owner: the folder name needs one
    "a\0b/c",
    "a/b\n",
    "ä/b",
    "a/b\u202e",
    "a--b/c",
    "a/b..c",
    "a/b.git",
    "a__x/b",  # owner__name would be ambiguous
    "a_/b",
    "CON.x/b",  # the folder CON.x__b is a device name on Windows
    "-a/b",
    "a" * 97 + "/b",
]


@pytest.mark.parametrize("repo_id", BAD_REPO_IDS)
def test_bad_repo_ids_are_refused_before_any_request_or_write(
    hub: HubServer, tmp_path: Path, repo_id: str
) -> None:
    models = tmp_path / "models"
    with pytest.raises(UnsafeNameError) as refused:
        check_repo_id(repo_id)
    _message_is_safe(refused.value)
    with pytest.raises(UnsafeNameError):
        HubClient().details(repo_id)
    queue = DownloadQueue(models, tmp_path / "downloads.json", fetcher())
    with pytest.raises(DownloadError, match="Refusing"):
        queue.add(repo_id, GgufChoice("m.gguf", "", (RepoFile("m.gguf", 10),)))
    assert queue.jobs == []
    assert hub.requests == []
    assert not models.exists() and not (tmp_path / "m.gguf").exists()


def test_good_repo_ids_round_trip() -> None:
    for repo_id in (REPO, "a/b", "A.b_c/d-e.f", "x/_y", "1/2"):
        assert check_repo_id(repo_id) == repo_id
        assert repo_id_of_dir(repo_dir_name(repo_id)) == repo_id
    assert repo_id_of_dir("no-separator") == ""


BAD_FILE_NAMES = [
    "",
    "a\nb.gguf",
    "a\rb.gguf",
    "a\x1b[31mb.gguf",
    "a\x7f.gguf",
    "a\x85.gguf",
    "evil\u202efug.gguf",  # right-to-left override
    "a\u2066b\u2069.gguf",  # isolates
    "a\u200bb.gguf",  # zero-width space (Cf)
    "a\ufeffb.gguf",
    "a\u2028b.gguf",
    "a\u3000b.gguf",
    "a\ud800.gguf",  # lone surrogate
    "a\ue000.gguf",  # private use
    "CON",
    "con.gguf",
    "Nul.tar.gz",
    "COM1.gguf",
    "lpt9",
    "COM¹.gguf",
    "aux .gguf",
    "CONOUT$.gguf",
    "a.gguf.",
    "a.gguf ",
    " a.gguf",
    ".hidden.gguf",
    "a<b.gguf",
    'a"b.gguf',
    "a|b.gguf",
    "a?b.gguf",
    "a*b.gguf",
    "a:b.gguf",
    "C:\\x.gguf",
    "a\\..\\b.gguf",
    "../x.gguf",
    "a/../../x.gguf",
    "./x.gguf",
    "/abs.gguf",
    "a//b.gguf",
    "a/",
    "x.gguf.part",
    "x" * 246 + ".gguf",  # 251 bytes: with .part it would not fit 255
    "é" * 128 + ".gguf",
    "/".join(["d"] * 9) + ".gguf",
]


@pytest.mark.parametrize("name", BAD_FILE_NAMES)
def test_bad_file_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafeNameError) as refused:
        destination(tmp_path / "models", REPO, name)
    _message_is_safe(refused.value)
    assert not (tmp_path / "models").exists()


def test_good_file_names_and_subfolders(tmp_path: Path) -> None:
    models = tmp_path / "models"
    for name in (
        FILE,
        "Q4_K_M/model-00001-of-00002.gguf",
        "model.Q4_K_M.gguf",
        "日本語モデル.gguf",
        "a b.gguf",
        "x" * 245 + ".gguf",  # 250 bytes, 255 with .part
        "CONSOLE.gguf",
        "COM10.gguf",
    ):
        path = destination(models, REPO, name)
        assert path.relative_to(models.resolve()).as_posix() == f"{repo_dir_name(REPO)}/{name}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_name(path.name + ".part").write_bytes(b"x")  # the longest name we create


def test_paths_stay_inside_the_models_dir(tmp_path: Path) -> None:
    models = tmp_path / "models"
    outside = tmp_path / "outside"
    outside.mkdir()
    models.mkdir()
    (models / repo_dir_name(REPO)).symlink_to(outside)  # planted link
    with pytest.raises(UnsafeNameError, match="outside"):
        destination(models, REPO, FILE)
    deep = tmp_path.joinpath(*["d" * 200] * 21)  # over PATH_MAX with the file name
    with pytest.raises(UnsafeNameError, match="longer than this system allows"):
        destination(deep, REPO, FILE)


# Pieces the fuzzers build names from: every class of nasty input, and real names.
_NASTY = [
    "..",
    ".",
    "/",
    "//",
    "\\",
    "\0",
    "\n",
    "\x1b",
    "\x7f",
    "\u202e",
    "\u2067",
    "\u200d",
    "\ud83d",
    " ",
    ":",
    "<",
    "*",
    "CON",
    "nul",
    "COM1",
    "LPT¹",
    "-",
    "_",
    "__",
    "--",
    ".git",
    ".part",
    ".gguf",
    "é",
    "日本",
    "x" * 60,
    "-00001-of-00002",
    "Q4_K_M",
    "google",
    "gemma-3-270m-GGUF",
]
_BENIGN = ["a", "Z", "7", "-", "_", ".", "", "GGUF", "Q4_0", "-v2", "日本"]
_REAL = [REPO, FILE, "Q8_0/gemma-00001-of-00002.gguf", "bartowski/Llama-3.2-1B-Instruct-GGUF"]


def _mutated(real: list[str], pieces: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A real name with ``pieces`` inserted, replaced or cut at random places."""

    @st.composite
    def build(draw: st.DrawFn) -> str:
        text = draw(st.sampled_from(real))
        for _ in range(draw(st.integers(0, 4))):
            i = draw(st.integers(0, len(text)))
            j = draw(st.integers(i, min(len(text), i + 3)))
            piece = draw(pieces)
            text = text[:i] + piece + text[j:]
        return text

    return build()


_benign = _mutated(_REAL, st.sampled_from(_BENIGN))
_names = st.one_of(
    _benign,
    _mutated(_REAL, st.sampled_from(_NASTY) | st.sampled_from(_BENIGN) | st.text(max_size=3)),
    st.lists(st.sampled_from([*_NASTY, "a", "b", "1"]), max_size=8).map("".join),
    st.text(max_size=40),
    st.text(st.characters(codec="ascii"), max_size=300),
)


def test_fuzz_names_accepted_means_inside_and_round_trips(tmp_path: Path) -> None:
    """Repo ids and file names, mutated from real ones: refused with a typed error, or a
    path inside the models dir that is created as given and round-trips."""
    from huggingface_hub.utils import validate_repo_id

    models = tmp_path / "work" / "models"
    models.mkdir(parents=True)
    before = set(tmp_path.rglob("*"))
    counts = {"accepted": 0, "refused": 0}

    @FUZZ
    @given(
        pair=st.one_of(
            st.tuples(st.just(REPO), _names),
            st.tuples(_names, st.just(FILE)),
            st.tuples(_names, _names),
            st.tuples(_benign, _benign),
        )
    )
    def check(pair: tuple[str, str]) -> None:
        repo_id, name = pair
        try:
            path = destination(models, repo_id, name)
        except UnsafeNameError as exc:
            _message_is_safe(exc)
            counts["refused"] += 1
            return
        counts["accepted"] += 1
        validate_repo_id(repo_id)
        assert repo_id_of_dir(repo_dir_name(repo_id)) == repo_id
        rel = path.relative_to(models.resolve())
        assert rel.as_posix() == f"{repo_dir_name(repo_id)}/{name}"
        assert check_file_name(name).as_posix() == name
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        part.write_bytes(b"")
        assert part.name in os.listdir(path.parent)
        part.unlink()

    check()
    made = set(tmp_path.rglob("*")) - before
    assert all(p.is_relative_to(models) for p in made), sorted(made - set(models.rglob("*")))
    assert counts["accepted"] > 20 and counts["refused"] > 20, counts


# -- Hub listings --------------------------------------------------------------------------

_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["../../x.gguf", "a\nb.gguf", "CON.gguf", "x/../y", "\u202e.gguf"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.recursive(st.just([]), lambda inner: st.lists(inner, max_size=1), max_leaves=200),
)


@st.composite
def _mutated_json(draw: st.DrawFn, real: Any) -> bytes:
    """The real answer with some values swapped for junk, or its bytes cut or spoilt."""
    data = json.loads(json.dumps(real))
    for _ in range(draw(st.integers(1, 4))):
        node, parent, key = data, None, None
        while True:  # walk down to a random place
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            if not keys:
                break
            parent, key = node, draw(st.sampled_from(keys))
            child = node[key]
            if not isinstance(child, dict | list) or draw(st.booleans()):
                break
            node = child
        if parent is not None:
            parent[key] = draw(_JUNK)
    raw = json.dumps(data).encode()
    how = draw(st.sampled_from(["json", "json", "json", "cut", "bytes"]))
    if how == "cut":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif how == "bytes":
        i = draw(st.integers(0, max(0, len(raw) - 1)))
        raw = raw[:i] + draw(st.binary(min_size=1, max_size=4)) + raw[i + 1 :]
    return raw


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    started = time.monotonic()
    try:
        return call()
    finally:
        assert time.monotonic() - started < seconds


def test_fuzz_mutated_hub_listings_give_typed_errors(hub: HubServer, tmp_path: Path) -> None:
    """The server's own model_info and list_models answers, mutated: the client returns
    only safe names, or raises a Lamplight error; nothing else escapes."""
    repo = hub.repo(REPO)
    assert repo is not None
    info = repo.properties(blobs=True)
    listing = [{k: info[k] for k in ("_id", "id", "likes", "downloads", "tags", "createdAt")}]
    client = HubClient()
    models = tmp_path / "models"
    outcomes = {"ok": 0, "error": 0}

    @FUZZ
    @given(details=_mutated_json(info), search=_mutated_json(listing))
    def check(details: bytes, search: bytes) -> None:
        hub.raw_responses[f"/api/models/{REPO}"] = (200, details)
        hub.raw_responses["/api/models"] = (200, search)
        try:
            got = _within(5, lambda: client.details(REPO))
            for choice in got.choices:
                for f in choice.files:
                    destination(models, got.repo_id, f.path)
                    assert isinstance(f.size, int) and f.size >= 0
            hits = _within(5, lambda: client.page("", "downloads", 0, 10))
            assert all(check_repo_id(h.repo_id) for h in hits)
            outcomes["ok"] += 1
        except LamplightError as exc:
            assert str(exc)
            outcomes["error"] += 1

    check()
    assert outcomes["ok"] and outcomes["error"], outcomes
    assert not models.exists()


def test_huge_and_hostile_listings(hub: HubServer) -> None:
    siblings = [{"rfilename": f"m-{i}.gguf", "size": 1} for i in range(60_000)]
    hub.add_repo("acme/huge-GGUF", {"a.gguf": b"x"}, extra={"siblings": siblings})
    with pytest.raises(HubError, match="more than this app shows"):
        _within(20, lambda: HubClient().details("acme/huge-GGUF"))
    hostile = [
        {"rfilename": name, "size": 10}
        for name in ("../../evil.gguf", "a\nb.gguf", "CON.gguf", "ok.gguf", "\u202eok.gguf")
    ]
    hub.add_repo("acme/hostile-GGUF", {"a.gguf": b"x"}, extra={"siblings": hostile})
    details = HubClient().details("acme/hostile-GGUF")
    assert [c.name for c in details.choices] == ["ok.gguf"]
    assert len(details.refused) == 4
    hub.add_repo("acme/alias-GGUF", {"a.gguf": b"x"}, extra={"id": "../..", "sha": "../x"})
    details = HubClient().details("acme/alias-GGUF")
    assert details.repo_id == "acme/alias-GGUF" and details.sha == "main"
    for body in (b"[" * 100_000, b"<html>busy</html>", b"\xff\xfe{", b'{"siblings": 7}'):
        hub.raw_responses["/api/models/acme/raw-GGUF"] = (200, body)
        with pytest.raises(HubError):
            _within(5, lambda: HubClient().details("acme/raw-GGUF"))
    hub.add_repo("../..", {"a.gguf": b"x"})  # a listing that names a hostile repo
    assert "../.." not in [h.repo_id for h in HubClient().page("", "downloads", 0, 50)]


# -- resume --------------------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pause_after(control: Control, n: int) -> Callable[[int, int], None]:
    def progress(done: int, _total: int) -> None:
        if done >= n:
            control.pause.set()

    return progress


@pytest.mark.parametrize("same_fetcher", [True, False], ids=["kept-hash", "after-restart"])
def test_server_ignoring_range_restarts_with_a_fresh_hash(
    hub: HubServer, tmp_path: Path, head: bytes, same_fetcher: bool
) -> None:
    dest = tmp_path / "m.gguf"
    first = fetcher()
    control = Control.new()
    with pytest.raises(DownloadCancelled):
        first.fetch(REPO, FILE, dest, len(head), _sha(head), control, _pause_after(control, 1))
    part = dest.with_name("m.gguf.part")
    assert 0 < part.stat().st_size < len(head)
    hub.ignore_range = True
    hub.clear_requests()
    again = first if same_fetcher else fetcher()
    again.fetch(REPO, FILE, dest, len(head), _sha(head), Control.new())
    assert dest.read_bytes() == head and not part.exists()
    (get,) = hub.requests_to(FILE, "GET")
    assert get.headers.get("range", "").startswith("bytes=")  # asked; got a 200


def _full_disk_after(limit: int, short: int) -> Callable[[Any, memoryview], int | None]:
    """A writer that first writes only half of one block, then fills up at ``limit``."""
    written = [0, 0]

    def write(fh: Any, data: memoryview) -> int | None:
        written[1] += 1
        if written[1] == short:
            data = data[: max(1, len(data) // 2)]
        if written[0] + len(data) > limit:
            room = limit - written[0]
            if room <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            data = data[:room]
        n = fh.write(data)
        written[0] += n or 0
        return n

    return write


@pytest.mark.parametrize("same_fetcher", [True, False], ids=["kept-hash", "after-restart"])
def test_disk_full_keeps_the_part_and_resumes_to_the_right_file(
    hub: HubServer,
    tmp_path: Path,
    head: bytes,
    monkeypatch: pytest.MonkeyPatch,
    same_fetcher: bool,
) -> None:
    models = tmp_path / "models"
    state = tmp_path / "downloads.json"
    full = fetcher()
    full._write = _full_disk_after(1_234_567, short=3)  # type: ignore[method-assign]
    queue = DownloadQueue(models, state, full)
    choice = next(c for c in HubClient().details(REPO).choices if c.name == FILE)
    job = queue.add(REPO, choice)
    started = time.monotonic()
    assert queue.run_next(lambda j: None, timeout=1) is job
    assert time.monotonic() - started < 5  # "disk full" at once, no retries
    assert job.state == "failed" and "Disk full" in job.error and "kept" in job.error
    assert len(hub.requests_to(FILE, "GET")) == 1
    part = destination(models, REPO, FILE).with_name(FILE + ".part")
    kept = part.read_bytes()
    assert kept == head[: len(kept)] and 0 < len(kept) <= 1_234_567
    if same_fetcher:  # the state it kept has hashed exactly the bytes on disk
        kept_state = full._states[part]
        assert kept_state.done == len(kept)
        assert kept_state.hasher.hexdigest() == _sha(kept)
    del full._write  # space was freed
    if not same_fetcher:
        queue = DownloadQueue(models, state, fetcher())  # the app restarted
    queue.resume(job.id)
    hub.clear_requests()
    done = queue.run_next(lambda j: None, timeout=1)
    assert done is not None and done.state == "done", done and done.error
    assert Path(done.result_path).read_bytes() == head
    (get,) = hub.requests_to(FILE, "GET")
    assert get.headers.get("range") == f"bytes={len(kept)}-"


def test_disk_full_in_fsync_and_other_disk_errors_are_final(
    hub: HubServer, tmp_path: Path, head: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "m.gguf"
    f = fetcher()

    def no_fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:  # not monkeypatch.undo(): that unpoints the client
        patch.setattr(os, "fsync", no_fsync)
        with pytest.raises(DownloadError, match="Disk full"):
            f.fetch(REPO, FILE, dest, len(head), _sha(head), Control.new())
    f.fetch(REPO, FILE, dest, len(head), _sha(head), Control.new())  # re-hashes the disk
    assert dest.read_bytes() == head
    readonly = fetcher()

    def read_only(fh: Any, data: memoryview) -> int:
        raise OSError(errno.EROFS, "Read-only file system")

    readonly._write = read_only  # type: ignore[method-assign]
    with pytest.raises(DownloadError, match="Could not write"):
        readonly.fetch(REPO, FILE, tmp_path / "r.gguf", len(head), None, Control.new())
    assert len(hub.requests_to(FILE, "GET")) == 2  # no retry for a local error


def test_something_else_where_the_part_belongs_is_refused(hub: HubServer, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "m.gguf.part")
    with pytest.raises(DownloadError, match="not a regular file"):
        _within(
            5, lambda: fetcher().fetch(REPO, FILE, tmp_path / "m.gguf", 10, None, Control.new())
        )
    assert hub.requests == []


def test_a_server_that_keeps_ending_early_is_given_up(hub: HubServer, tmp_path: Path) -> None:
    hub.drop_after(FILE, 0, times=None)  # headers, then nothing, forever
    with pytest.raises(DownloadError, match="Gave up"):
        _within(
            10,
            lambda: fetcher(max_attempts=2).fetch(
                REPO, FILE, tmp_path / "m.gguf", 3_000_000, None, Control.new()
            ),
        )


# -- quit path ------------------------------------------------------------------------------


def test_pause_cuts_a_stalled_read_at_once(hub: HubServer, tmp_path: Path, head: bytes) -> None:
    hub.stall(FILE, 60, after_bytes=300_000)
    control = Control.new()
    errors: list[BaseException] = []
    f = FileFetcher()  # the real 30 s read timeout

    def run() -> None:
        try:
            f.fetch(REPO, FILE, tmp_path / "m.gguf", len(head), _sha(head), control)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    part = tmp_path / "m.gguf.part"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not part.exists() or part.stat().st_size < 300_000):
        time.sleep(0.02)
    time.sleep(0.2)  # now blocked in recv()
    started = time.monotonic()
    control.request_pause()
    worker.join(5)
    assert not worker.is_alive()
    assert time.monotonic() - started < 2
    assert len(errors) == 1 and isinstance(errors[0], DownloadCancelled)
    assert part.stat().st_size == 300_000


def test_closing_the_download_manager_joins_its_thread_promptly(
    qapp: Any, hub: HubServer, tmp_path: Path, head: bytes
) -> None:
    from ui.models.hub_workers import HubServices

    models = tmp_path / "models"
    queue = DownloadQueue(models, tmp_path / "downloads.json", FileFetcher())
    library = Library(models, tmp_path / "library.json", hf_cache=False)
    services = HubServices(HubClient(), library, queue)
    hub.stall(FILE, 60, after_bytes=200_000)
    choice = next(c for c in HubClient().details(REPO).choices if c.name == FILE)
    job = queue.add(REPO, choice)
    part = destination(models, REPO, FILE).with_name(FILE + ".part")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not part.exists() or part.stat().st_size < 200_000):
        time.sleep(0.02)
    time.sleep(0.2)
    started = time.monotonic()
    services.shutdown()
    assert time.monotonic() - started < 3
    assert services.download_thread.isFinished() and services.hub_thread.isFinished()
    assert job.state == "paused" and part.stat().st_size == 200_000
    hub.clear_faults()
    again = DownloadQueue(models, tmp_path / "downloads.json", fetcher())
    again.resume(job.id)
    finished = again.run_next(lambda j: None, timeout=1)
    assert finished is not None and finished.state == "done"
    assert Path(finished.result_path).read_bytes() == head


# -- the library ----------------------------------------------------------------------------


def _scan(lib: Library) -> list[Any]:
    """``lib.scan()`` on a thread, so a scan that blocks (on a FIFO) fails instead of hanging."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(lib.scan()), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "library scan hung"
    return list(out[0])


def test_split_models_are_one_entry_and_incomplete_ones_are_not_loadable(
    tmp_path: Path, model_path: Path
) -> None:
    models = tmp_path / "models"
    folder = models / repo_dir_name(REPO) / "Q8_0"
    folder.mkdir(parents=True)
    os.link(model_path, folder / "big-00001-of-00003.gguf")
    (folder / "big-00002-of-00003.gguf.part").write_bytes(b"half")
    os.link(model_path, folder / "other-00002-of-00002.gguf")  # part 1 never arrived
    lib = Library(models, tmp_path / "library.json", hf_cache=False)
    entries = _scan(lib)
    assert sorted(e.path.name for e in entries) == [
        "big-00001-of-00003.gguf",
        "other-00001-of-00002.gguf",
    ]
    assert not any(e.valid for e in entries)
    assert all("incomplete split model" in e.error for e in entries)
    big = next(e for e in entries if e.path.name.startswith("big"))
    assert "2, 3 of 3" in big.error and big.repo_id == REPO
    (folder / "big-00002-of-00003.gguf.part").rename(folder / "big-00002-of-00003.gguf")
    (folder / "big-00003-of-00003.gguf").write_bytes(b"x" * 10)
    entries = [e for e in _scan(lib) if e.path.name.startswith("big")]
    assert len(entries) == 1 and entries[0].valid, entries
    assert entries[0].size == model_path.stat().st_size + 4 + 10
    assert [p.name for p in entries[0].files] == [f"big-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


def test_one_bad_file_never_hides_the_others(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.models.library as library_module

    models = tmp_path / "models"
    models.mkdir()
    os.link(model_path, models / "good.gguf")
    (models / "garbage.gguf").write_bytes(os.urandom(4096))
    os.mkfifo(models / "fifo.gguf")
    (models / "loop-a.gguf").symlink_to(models / "loop-b.gguf")
    (models / "loop-b.gguf").symlink_to(models / "loop-a.gguf")
    (models / "dangling.gguf").symlink_to(tmp_path / "nowhere.gguf")
    (models / "folder.gguf").mkdir()
    (models / "self").symlink_to(models)  # a folder loop
    (models / ("n" * 250 + ".gguf")).write_bytes(b"GGUF")
    (models / "unreadable.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    deep = models.joinpath(*["d"] * 12)
    deep.mkdir(parents=True)
    os.link(model_path, deep / "too-deep.gguf")
    real_read = library_module.read_gguf_info

    def read(path: Path) -> Any:
        if Path(path).name == "unreadable.gguf":
            raise PermissionError(errno.EACCES, "Permission denied")
        if Path(path).name.startswith("n" * 10):
            raise RecursionError("a reader bug")
        return real_read(path)

    monkeypatch.setattr(library_module, "read_gguf_info", read)
    cache = tmp_path / "library.json"
    cache.write_text("[" * 100_000)  # a damaged cache is rebuilt
    entries = {e.path.name: e for e in _scan(Library(models, cache, hf_cache=False))}
    assert entries["good.gguf"].valid
    assert set(entries) == {"good.gguf", "garbage.gguf", "n" * 250 + ".gguf", "unreadable.gguf"}
    assert not entries["garbage.gguf"].valid and not entries["unreadable.gguf"].valid
    assert "could not be read" in entries["n" * 250 + ".gguf"].error
    assert json.loads(cache.read_text())["version"]


def test_fuzz_damaged_library_cache(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real library.json after a scan of the real model, mutated: the scan lists the
    model (from the cache when it is sound, else read again) and never raises."""
    import app.models.library as library_module

    real_read = library_module.read_gguf_info
    read_once: dict[Path, Any] = {}  # the real header, read once (0.2 s) for every example

    def read(path: Path) -> Any:
        if path not in read_once:
            read_once[path] = real_read(path)
        return read_once[path]

    monkeypatch.setattr(library_module, "read_gguf_info", read)
    models = tmp_path / "models"
    models.mkdir()
    os.link(model_path, models / "good.gguf")
    cache = tmp_path / "library.json"
    first = Library(models, cache, hf_cache=False).scan()
    real = json.loads(cache.read_text())

    @settings(FUZZ, max_examples=examples(150))
    @given(raw=_mutated_json(real))
    def check(raw: bytes) -> None:
        cache.write_bytes(raw)
        entries = Library(models, cache, hf_cache=False).scan()
        assert [e.path.name for e in entries] == ["good.gguf"]
        e = entries[0]
        if e.info is not None:
            assert isinstance(e.info.n_params, int) and isinstance(e.info.architecture, str)
        else:
            assert e.error

    check()
    assert first[0].valid


def test_fuzz_damaged_download_list(tmp_path: Path) -> None:
    """downloads.json as the queue wrote it, mutated: the queue starts with the sound jobs
    only (names checked again), a damaged file is set aside, nothing else is touched."""
    models = tmp_path / "models"
    state = tmp_path / "downloads.json"
    queue = DownloadQueue(models, state, fetcher())
    queue.add(REPO, GgufChoice(FILE, "Q4_K_M", (RepoFile(FILE, 100, "a" * 64),)))
    queue.add(REPO, GgufChoice("s", "", (RepoFile("Q8_0/s-00001-of-00002.gguf", 5),)))
    real = json.loads(state.read_text())

    @FUZZ
    @given(raw=_mutated_json(real))
    def check(raw: bytes) -> None:
        for p in tmp_path.glob("downloads.json*"):
            p.unlink()
        state.write_bytes(raw)
        jobs = DownloadQueue(models, state, fetcher()).jobs
        for job in jobs:
            for f in job.files:
                destination(models, job.repo_id, f.path)
        assert set(os.listdir(tmp_path)) <= {"downloads.json", "downloads.json.bad", "hf-home"}
        assert not models.exists()

    check()
