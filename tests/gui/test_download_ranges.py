"""One writer per download target, and resumes answered with another range than asked.

The real ``huggingface_hub`` client and our downloader talk to tests/hub_server.py,
which can answer the wrong range (``wrong_ranges``), as proxies and CDNs that align
ranges do. Invariant: the verified file, or one clear failure after a bounded number of
requests; never a corrupt file, and never a part another entry writes deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pytestqt.qtbot import QtBot

from app.models.download_control import Control
from app.models.download_errors import DownloadError
from app.models.downloader import FileFetcher
from app.models.downloads import DownloadJob, DownloadQueue
from app.models.names import FORBIDDEN_CATEGORIES, destination
from app.models.quant import GgufChoice, RepoFile
from tests.hub_server import HubServer, RangeAnswer, serving_hub
from tests.hypothesis_budget import examples

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
DATA = os.urandom(3 * 1024 * 1024 + 123)
SMALL = "small.gguf"
SMALL_DATA = os.urandom(200_000)
SHA = hashlib.sha256(DATA).hexdigest()
ATTEMPTS = 4  # failed tries in a row before giving up (the app uses 8)
TRIES = 40  # tries in all, per fetch call


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
        server.add_repo(REPO, {FILE: DATA, SMALL: SMALL_DATA, "other.gguf": DATA[:5000]})
        yield server


def fetcher() -> FileFetcher:
    return FileFetcher(
        read_timeout=5.0, max_attempts=ATTEMPTS, max_tries=TRIES, sleep=lambda s: None
    )


def choice(*names: str) -> GgufChoice:
    sizes = {FILE: len(DATA), SMALL: len(SMALL_DATA), "other.gguf": 5000}
    files = tuple(RepoFile(n, sizes[n], None) for n in names)
    return GgufChoice(names[0], "Q4_K_M", files)


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text
    assert all(unicodedata.category(c) not in FORBIDDEN_CATEGORIES for c in text), ascii(text)
    return text


# -- one writer per target -----------------------------------------------------------------


def test_the_same_file_queued_twice_is_one_download(hub: HubServer, tmp_path: Path) -> None:
    """Cancelling the entry that was not running deleted the running job's ``.part``."""
    models = tmp_path / "models"
    queue = DownloadQueue(models, tmp_path / "d.json", fetcher())
    # Hub ids are case-insensitive: on macOS and Windows these are one folder too.
    jobs = [queue.add(repo, choice(FILE)) for repo in (REPO, REPO, "ACME/Tiny-gguf")]
    hub.throttle(2 * 1024 * 1024)
    running = queue.wait_for_job(1)
    assert running is not None
    cancelled = threading.Event()

    def cancel_the_others(j: object) -> None:
        if running.done_bytes > 256 * 1024 and not cancelled.is_set():
            cancelled.set()
            for other in jobs:
                if other.id != running.id:
                    queue.cancel(other.id)

    queue.run(running, cancel_the_others)
    hub.throttle(None)
    assert running.state == "done", running.error
    assert Path(running.result_path).read_bytes() == DATA
    assert len({j.id for j in jobs}) == 1  # the second request joined the first
    assert [j.id for j in queue.jobs] == [running.id]


def test_a_paused_or_failed_download_is_resumed_not_duplicated(
    hub: HubServer, tmp_path: Path
) -> None:
    queue = DownloadQueue(tmp_path / "models", tmp_path / "d.json", fetcher())
    first = queue.add(REPO, choice(FILE))
    queue.pause(first.id)
    assert first.state == "paused"
    assert queue.add(REPO, choice(FILE)) is first and first.state == "queued"
    first.state, first.error = "failed", "network"
    assert queue.add(REPO, choice(FILE)) is first and first.state == "queued"
    assert len(queue.jobs) == 1


def test_a_different_request_for_a_file_being_downloaded_is_refused(
    hub: HubServer, tmp_path: Path
) -> None:
    queue = DownloadQueue(tmp_path / "models", tmp_path / "d.json", fetcher())
    queue.add(REPO, choice(FILE, SMALL))
    for repo, wanted, revision in (
        (REPO, choice(SMALL), "main"),  # a file of it
        (REPO, choice(FILE, SMALL), "0" * 40),  # the same files from another revision
        ("acme/TINY-gguf", choice("other.gguf", FILE), "main"),
    ):
        with pytest.raises(DownloadError, match="already being downloaded") as err:
            queue.add(repo, wanted, revision)
        one_line(err.value)
    assert len(queue.jobs) == 1
    assert queue.add(REPO, choice("other.gguf")).state == "queued"  # another file is fine


def test_duplicate_entries_in_a_saved_list_share_nothing(hub: HubServer, tmp_path: Path) -> None:
    """A list written by an older version may hold two entries for one file: the later one
    is dropped with a note, and cancelling never deletes a part another entry writes."""
    models, state = tmp_path / "models", tmp_path / "d.json"
    queue = DownloadQueue(models, state, fetcher())
    job = queue.add(REPO, choice(FILE))
    dest = destination(models, REPO, FILE)
    dest.parent.mkdir(parents=True)
    part = dest.with_name(dest.name + ".part")
    part.write_bytes(DATA[:1000])
    doc = json.loads(state.read_text())
    twin = {**doc["jobs"][0], "id": "twin", "repo_id": "Acme/tiny-gguf", "state": "paused"}
    doc["jobs"].append(twin)
    state.write_text(json.dumps(doc))
    again = DownloadQueue(models, state, fetcher())
    assert [j.id for j in again.jobs] == [job.id]
    assert any("same file" in n for n in again.notes), again.notes
    # However a second entry got there, cancelling it leaves the first one's part alone.
    second = DownloadJob("Acme/Tiny-GGUF", "twin", [RepoFile(FILE, len(DATA), None)])
    second.state = "failed"
    again.jobs.append(second)
    again.cancel(second.id)
    assert second.state == "cancelled" and part.read_bytes() == DATA[:1000]
    again.cancel(job.id)
    assert not part.exists()


# -- resumes answered with another range -------------------------------------------------------


def fetch_with_part(hub: HubServer, tmp_path: Path, kept: int, name: str = FILE) -> Path:
    """Fetch ``name`` with the first ``kept`` bytes already in its part (a paused download)."""
    data = DATA if name == FILE else SMALL_DATA
    dest = tmp_path / "models" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if kept:
        dest.with_name(dest.name + ".part").write_bytes(data[:kept])
    sha = hashlib.sha256(data).hexdigest()
    return fetcher().fetch(REPO, name, dest, len(data), sha, Control.new())


@pytest.mark.parametrize("shift", [-1, -4096, -1_000_000, -(10**9)])
def test_a_range_that_starts_earlier_is_skipped_to_the_byte_asked(
    hub: HubServer, tmp_path: Path, shift: int
) -> None:
    """It used to overwrite the good part from byte 0 and fail the checksum."""
    hub.wrong_ranges(FILE, [RangeAnswer(shift=shift)], repeat_last=True)
    dest = fetch_with_part(hub, tmp_path, 2_000_000)
    assert dest.read_bytes() == DATA
    gets = hub.requests_to(FILE, "GET")
    assert [g.headers.get("range") for g in gets] == ["bytes=2000000-"]


def test_a_range_that_starts_later_is_fetched_again_whole(hub: HubServer, tmp_path: Path) -> None:
    hub.wrong_ranges(FILE, [RangeAnswer(shift=4096)])
    dest = fetch_with_part(hub, tmp_path, 2_000_000)
    assert dest.read_bytes() == DATA
    ranges = [g.headers.get("range") for g in hub.requests_to(FILE, "GET")]
    assert ranges == ["bytes=2000000-", None]  # then the whole file, the part skipped


def test_aligned_chunks_from_a_cdn_make_progress(hub: HubServer, tmp_path: Path) -> None:
    """A CDN that serves 64 KiB aligned chunks, each starting up to 4 KiB early."""
    hub.wrong_ranges(FILE, [RangeAnswer(shift=-4000, length=65536)], repeat_last=True)
    dest = fetch_with_part(hub, tmp_path, 1000, SMALL)
    assert dest.read_bytes() == SMALL_DATA


@pytest.mark.parametrize(
    "answer",
    [
        RangeAnswer(shift=2**40),  # the last byte only, whatever was asked
        RangeAnswer(header="none"),
        RangeAnswer(header="raw", raw="bytes 9-3/10"),
        RangeAnswer(header="raw", raw="bytes */1234"),
    ],
    ids=["later", "no-header", "backwards", "star"],
)
def test_a_server_that_never_answers_the_range_gives_up_clearly(
    hub: HubServer, tmp_path: Path, answer: RangeAnswer
) -> None:
    """The try counter used to restart with every try that wrote anything: it never ended."""
    hub.wrong_ranges(FILE, [answer], repeat_last=True)
    with pytest.raises(DownloadError, match="Gave up") as err:
        fetch_with_part(hub, tmp_path, 2_000_000)
    assert "range" in one_line(err.value).lower()
    assert len(hub.requests_to(FILE, "GET")) <= ATTEMPTS
    part = tmp_path / "models" / (FILE + ".part")
    assert part.read_bytes() == DATA[:2_000_000]  # what was downloaded is kept


def test_a_range_of_another_file_size_stops_with_a_clear_message(
    hub: HubServer, tmp_path: Path
) -> None:
    hub.wrong_ranges(FILE, [RangeAnswer(header="wrong_total")], repeat_last=True)
    with pytest.raises(DownloadError, match="changed") as err:
        fetch_with_part(hub, tmp_path, 2_000_000)
    one_line(err.value)
    assert len(hub.requests_to(FILE, "GET")) == 1


def test_progress_cannot_keep_a_hopeless_download_going(hub: HubServer, tmp_path: Path) -> None:
    """A server that always starts 1 KiB early and drops after a little more: every try
    ends longer than it began, which used to reset the counter forever."""
    hub.wrong_ranges(SMALL, [RangeAnswer(shift=-1024, length=1030)], repeat_last=True)
    with pytest.raises(DownloadError, match="Gave up") as err:
        fetch_with_part(hub, tmp_path, 0, SMALL)
    one_line(err.value)
    assert len(hub.requests_to(SMALL, "GET")) == TRIES
    part = (tmp_path / "models" / (SMALL + ".part")).read_bytes()
    assert SMALL_DATA.startswith(part) and len(part) >= TRIES * 6


ANSWERS = st.builds(
    RangeAnswer,
    shift=st.one_of(
        st.just(0),
        st.integers(-300_000, 300_000),
        st.sampled_from([-1, 1, -(2**40), 2**40, -65536, 65536]),
    ),
    length=st.one_of(st.none(), st.integers(1, 250_000)),
    whole=st.booleans(),
    header=st.sampled_from(["honest", "honest", "honest", "none", "raw", "wrong_total", "lie"]),
    raw=st.sampled_from(
        ["", "bytes", "bytes 0-0/0", "bytes 5-2/200000", "bytes 0-199999/200000", "x 1-2/3"]
    ),
)


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kept=st.integers(0, len(SMALL_DATA) - 1),
    answers=st.lists(ANSWERS, min_size=1, max_size=6),
    repeat_last=st.booleans(),
    drop=st.one_of(st.none(), st.integers(0, 100_000)),
)
def test_any_range_answers_end_in_the_file_or_one_clear_failure(
    hub: HubServer,
    tmp_path_factory: pytest.TempPathFactory,
    kept: int,
    answers: list[RangeAnswer],
    repeat_last: bool,
    drop: int | None,
) -> None:
    hub.clear_faults()
    hub.clear_requests()
    hub.wrong_ranges(SMALL, answers, repeat_last=repeat_last)
    if drop is not None:
        hub.drop_after(SMALL, drop, times=2)
    where = tmp_path_factory.mktemp("ranges")
    dest = where / "models" / SMALL
    part = dest.with_name(SMALL + ".part")
    try:
        fetch_with_part(hub, where, kept, SMALL)
    except DownloadError as exc:
        event(one_line(exc).split(" ", 2)[0])
        assert not dest.exists()
        lied = any(a.header == "lie" for a in answers)
        if part.exists() and not lied:  # an honest server never leaves a wrong part
            assert SMALL_DATA.startswith(part.read_bytes())
    else:
        event("verified file")
        assert dest.read_bytes() == SMALL_DATA and not part.exists()
    assert len(hub.requests_to(SMALL, "GET")) <= TRIES


def test_the_window_says_what_the_saved_list_had_wrong(
    qtbot: QtBot, hub: HubServer, tmp_path: Path
) -> None:
    """A note of the queue (a second entry for one file) is shown at start, not only logged."""
    from app.config.paths import data_dirs
    from app.config.settings import AppSettings
    from tests.fakes.engine import FakeEngine
    from ui.engine.worker import EngineClient
    from ui.main import hub_services, open_window

    dirs = data_dirs(tmp_path / "data")
    state = dirs.root / "downloads.json"
    queue = DownloadQueue(dirs.models, state, fetcher())
    queue.pause(queue.add(REPO, choice(FILE)).id)
    doc = json.loads(state.read_text())
    doc["jobs"].append({**doc["jobs"][0], "id": "twin", "repo_id": "Acme/tiny-gguf"})
    state.write_text(json.dumps(doc))
    fake = FakeEngine()
    win = open_window(
        dirs,
        AppSettings(),
        [],
        lambda s: EngineClient(dirs.models, engine_factory=lambda: fake, store=s),
        hub_services(dirs),
    )
    qtbot.addWidget(win)
    try:
        assert "downloads.json: The download" in win.transcript.toPlainText()
    finally:
        win.close()
