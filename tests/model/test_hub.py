"""Hub search, downloads and the library, with the real huggingface_hub client against a
local Hub-compatible server (tests/hub_server.py)."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.models import hub as hub_module
from app.models.download_control import Control
from app.models.download_errors import DownloadCancelled, DownloadError
from app.models.downloader import FileFetcher
from app.models.downloads import DownloadQueue
from app.models.hub import HubClient, HubError
from app.models.library import Library
from app.models.names import repo_dir_name
from app.models.quant import GgufChoice, RepoFile
from tests.hub_server import HubServer, serving_hub

SMALL = os.urandom(3 * 1024 * 1024 + 123)


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
        server.add_repo(
            "acme/tiny-GGUF",
            {
                "tiny-Q4_K_M.gguf": SMALL,
                "tiny-Q8_0-00001-of-00002.gguf": SMALL[:1000],
                "tiny-Q8_0-00002-of-00002.gguf": SMALL[1000:2000],
                "README.md": b"# tiny",
            },
            downloads=500,
            likes=7,
        )
        server.add_repo("acme/other-GGUF", {"other-F16.gguf": b"GGUF" + b"\0" * 100}, downloads=50)
        server.add_repo("acme/gated-GGUF", {"gated-Q4_0.gguf": SMALL[:5000]}, gated="manual")
        server.add_repo("acme/hostile-GGUF", {"../../evil.gguf": b"x"})
        yield server


def fetcher(**kw: object) -> FileFetcher:
    return FileFetcher(read_timeout=2.0, sleep=lambda s: None, **kw)  # type: ignore[arg-type]


def test_search_sorts_and_lists_files(hub: HubServer) -> None:
    client = HubClient()
    hits = client.page("", "downloads", 0, 10)
    names = [h.repo_id for h in hits]
    assert names.index("acme/tiny-GGUF") < names.index("acme/other-GGUF")
    assert [h.repo_id for h in client.page("tiny", "downloads", 0, 10)] == ["acme/tiny-GGUF"]
    details = client.details("acme/tiny-GGUF")
    by_quant = {c.quant: c for c in details.choices}
    assert by_quant["Q4_K_M"].size == len(SMALL)
    assert by_quant["Q4_K_M"].files[0].sha256 == hashlib.sha256(SMALL).hexdigest()
    assert by_quant["Q8_0"].split and len(by_quant["Q8_0"].files) == 2
    assert all(c.first_file.endswith(".gguf") for c in details.choices)


def test_hub_errors_are_plain_words(hub: HubServer) -> None:
    client = HubClient()
    with pytest.raises(HubError, match="not found on the Hub"):
        client.details("acme/nope")


def _timed(call: Callable[[], object]) -> tuple[BaseException | None, float]:
    """What ``call`` raised and how long it took (on a thread: a hang fails the test)."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            out.append(None)
        except BaseException as exc:  # the test looks at it
            out.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert out, "still waiting after 60 s"
    return out[0], time.monotonic() - started


def test_an_unreachable_or_silent_hub_fails_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, the search said "Searching…" for about a minute: ``list_models`` retried
    a failed connection five times over 23 s of back-off (and DNS failures took longer),
    with no timeout at all for a Hub that connected and then said nothing."""
    with HubServer() as stopped:
        url = stopped.url
    error, took = _timed(lambda: HubClient(endpoint=url).page("gemma", "downloads", 0, 30))
    assert isinstance(error, HubError) and "could not reach the Hub" in str(error), error
    assert took < 3, took
    error, took = _timed(lambda: HubClient(endpoint=url).details("acme/tiny-GGUF"))
    assert isinstance(error, HubError) and took < 3, (error, took)

    monkeypatch.setattr(hub_module, "READ_S", 1.0)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # connects, never answers
        port = silent.getsockname()[1]
        client = HubClient(endpoint=f"http://127.0.0.1:{port}")
        error, took = _timed(lambda: client.page("", "downloads", 0, 30))
    assert isinstance(error, HubError) and "did not answer in time" in str(error), error
    assert took < 5, took


def test_download_verifies_and_appears(hub: HubServer, tmp_path: Path) -> None:
    dest = tmp_path / "models" / "tiny.gguf"
    seen: list[int] = []
    fetcher().fetch(
        "acme/tiny-GGUF",
        "tiny-Q4_K_M.gguf",
        dest,
        len(SMALL),
        hashlib.sha256(SMALL).hexdigest(),
        Control.new(),
        lambda done, total: seen.append(done),
    )
    assert dest.read_bytes() == SMALL
    assert seen[-1] == len(SMALL)
    assert not dest.with_name("tiny.gguf.part").exists()


def test_dropped_connection_resumes_from_the_byte_reached(hub: HubServer, tmp_path: Path) -> None:
    hub.drop_after("tiny-Q4_K_M.gguf", 1_000_000, times=2)
    dest = tmp_path / "tiny.gguf"
    fetcher().fetch(
        "acme/tiny-GGUF",
        "tiny-Q4_K_M.gguf",
        dest,
        len(SMALL),
        hashlib.sha256(SMALL).hexdigest(),
        Control.new(),
    )
    assert dest.read_bytes() == SMALL
    ranges = [r.headers.get("range") for r in hub.requests_to("tiny-Q4_K_M.gguf", "GET")]
    assert ranges[0] is None
    assert len(ranges) == 3, ranges
    # Each retry asks for exactly what is missing.
    assert all(r is not None and r.startswith("bytes=") for r in ranges[1:])
    first_resume = int(ranges[1].removeprefix("bytes=").rstrip("-"))  # type: ignore[union-attr]
    assert 900_000 <= first_resume <= 1_000_000


def test_restart_mid_download_resumes_with_range(hub: HubServer, tmp_path: Path) -> None:
    dest = tmp_path / "tiny.gguf"
    control = Control.new()
    sha = hashlib.sha256(SMALL).hexdigest()

    def pause_early(done: int, _total: int) -> None:
        if done >= 1024 * 1024:
            control.pause.set()

    with pytest.raises(DownloadCancelled):
        fetcher().fetch(
            "acme/tiny-GGUF", "tiny-Q4_K_M.gguf", dest, len(SMALL), sha, control, pause_early
        )
    part = dest.with_name("tiny.gguf.part")
    kept = part.stat().st_size
    assert 0 < kept < len(SMALL)
    hub.clear_requests()
    # A new fetcher, as after an app restart: it hashes the part, then asks for the rest.
    fetcher().fetch("acme/tiny-GGUF", "tiny-Q4_K_M.gguf", dest, len(SMALL), sha, Control.new())
    assert dest.read_bytes() == SMALL
    gets = hub.requests_to("tiny-Q4_K_M.gguf", "GET")
    assert gets[0].headers.get("range") == f"bytes={kept}-"


def test_wrong_checksum_is_rejected(hub: HubServer, tmp_path: Path) -> None:
    hub.corrupt("tiny-Q4_K_M.gguf")
    models = tmp_path / "models"
    dest = models / repo_dir_name("acme/tiny-GGUF") / "tiny-Q4_K_M.gguf"
    with pytest.raises(DownloadError, match="did not match the Hub's checksum"):
        fetcher().fetch(
            "acme/tiny-GGUF",
            "tiny-Q4_K_M.gguf",
            dest,
            len(SMALL),
            hashlib.sha256(SMALL).hexdigest(),
            Control.new(),
        )
    assert not dest.exists() and not dest.with_name(dest.name + ".part").exists()
    assert Library(models, tmp_path / "lib.json", hf_cache=False).scan() == []


def test_not_found_gated_and_stalled_give_clear_errors(hub: HubServer, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="not found"):
        fetcher().fetch(
            "acme/tiny-GGUF", "missing.gguf", tmp_path / "m.gguf", 10, None, Control.new()
        )
    with pytest.raises(DownloadError, match="gated or private"):
        fetcher().fetch(
            "acme/gated-GGUF", "gated-Q4_0.gguf", tmp_path / "g.gguf", 5000, None, Control.new()
        )
    hub.stall("tiny-Q4_K_M.gguf", 30)
    with pytest.raises(DownloadError, match="Gave up"):
        FileFetcher(read_timeout=0.3, max_attempts=2, sleep=lambda s: None).fetch(
            "acme/tiny-GGUF",
            "tiny-Q4_K_M.gguf",
            tmp_path / "s.gguf",
            len(SMALL),
            None,
            Control.new(),
        )


def test_hostile_names_and_full_disks_are_refused_up_front(hub: HubServer, tmp_path: Path) -> None:
    queue = DownloadQueue(tmp_path / "models", tmp_path / "downloads.json", fetcher())
    evil = GgufChoice("evil.gguf", "", (RepoFile("../../evil.gguf", 1),))
    with pytest.raises(DownloadError, match="Refusing the file name"):
        queue.add("acme/hostile-GGUF", evil)
    for name in ("/etc/passwd.gguf", "a/../../b.gguf", "C:\\x.gguf", "a\\..\\b.gguf"):
        with pytest.raises(DownloadError):
            queue.add("acme/hostile-GGUF", GgufChoice(name, "", (RepoFile(name, 1),)))
    tiny = fetcher(free_space=lambda _p: 1024)
    with pytest.raises(DownloadError, match="Not enough disk space"):
        tiny.fetch(
            "acme/tiny-GGUF",
            "tiny-Q4_K_M.gguf",
            tmp_path / "t.gguf",
            len(SMALL),
            None,
            Control.new(),
        )
    assert hub.requests_to("tiny-Q4_K_M.gguf", "GET") == []


def test_queue_survives_a_restart(hub: HubServer, tmp_path: Path) -> None:
    models, state = tmp_path / "models", tmp_path / "downloads.json"
    choice = HubClient().details("acme/tiny-GGUF").choices
    q4 = next(c for c in choice if c.quant == "Q4_K_M")
    queue = DownloadQueue(models, state, fetcher())
    job = queue.add("acme/tiny-GGUF", q4)
    hub.throttle(2 * 1024 * 1024)
    started = threading.Event()

    def progress(j: object) -> None:
        started.set()
        queue.close()  # the app quits mid-download

    assert queue.wait_for_job(1) is job
    queue.run(job, progress)
    assert job.state == "paused" and 0 < job.done_bytes < len(SMALL)
    hub.throttle(None)

    again = DownloadQueue(models, state, fetcher())  # next start
    assert [j.state for j in again.jobs] == ["paused"]
    again.resume(job.id)
    ran = again.run_next(lambda j: None, timeout=1)
    assert ran is not None and ran.state == "done", ran and ran.error
    assert Path(ran.result_path).read_bytes() == SMALL


def test_split_models_download_all_parts(hub: HubServer, tmp_path: Path) -> None:
    details = HubClient().details("acme/tiny-GGUF")
    split = next(c for c in details.choices if c.split)
    queue = DownloadQueue(tmp_path / "models", tmp_path / "d.json", fetcher())
    queue.add("acme/tiny-GGUF", split)
    job = queue.run_next(lambda j: None, timeout=1)
    assert job is not None and job.state == "done" and job.done_bytes == 2000
    folder = tmp_path / "models" / "acme__tiny-GGUF"
    assert sorted(p.name for p in folder.iterdir()) == [
        "tiny-Q8_0-00001-of-00002.gguf",
        "tiny-Q8_0-00002-of-00002.gguf",
    ]


def test_library_lists_valid_and_invalid_files(tmp_path: Path, model_path: Path) -> None:
    models = tmp_path / "models"
    (models / "acme__tiny").mkdir(parents=True)
    os.link(model_path, models / "acme__tiny" / "gemma.gguf")
    (models / "broken.gguf").write_bytes(b"not a gguf at all")
    (models / "half.gguf.part").write_bytes(b"GGUF")
    elsewhere = tmp_path / "elsewhere.gguf"
    elsewhere.write_bytes(b"")
    lib = Library(models, tmp_path / "library.json", hf_cache=False)
    lib.imported = [elsewhere]
    entries = {e.path.name: e for e in lib.scan()}
    assert set(entries) == {"gemma.gguf", "broken.gguf", "elsewhere.gguf"}
    gemma = entries["gemma.gguf"]
    assert gemma.valid and gemma.repo_id == "acme/tiny" and gemma.source == "models"
    assert gemma.info is not None and gemma.info.architecture == "gemma3"
    assert gemma.info.file_type == "Q4_K_M" and gemma.info.context_length == 32768
    assert gemma.info.chat_template is None
    assert 250e6 < gemma.info.n_params < 300e6
    assert 300e6 < gemma.ram_estimate(4096) < 700e6
    assert not entries["broken.gguf"].valid and "not a GGUF" in entries["broken.gguf"].error
    assert entries["elsewhere.gguf"].source == "imported"
    assert "empty" in entries["elsewhere.gguf"].error
    # The second scan reads metadata from the cache (same size and mtime).
    again = Library(models, tmp_path / "library.json", hf_cache=False)
    assert again._cache and {e.path.name for e in again.scan()} == {"gemma.gguf", "broken.gguf"}


def test_download_and_load_the_default_model_through_the_hub(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model_path: Path
) -> None:
    from app.config.setting_records import SamplingParams
    from app.engine.backend import Finished
    from app.engine.chat_message import ChatMessage
    from app.engine.local.engine import Engine
    from tests.conftest import TEST_LOAD

    with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
        server.add_repo("google/gemma-3-270m-GGUF", {"gemma-3-270m-Q4_K_M.gguf": model_path})
        details = HubClient().details("google/gemma-3-270m-GGUF")
        choice = details.choices[0]
        assert choice.size == model_path.stat().st_size
        queue = DownloadQueue(tmp_path / "models", tmp_path / "d.json", FileFetcher())
        queue.add(details.repo_id, choice)
        job = queue.run_next(lambda j: None, timeout=1)
    assert job is not None and job.state == "done", job and job.error
    entries = Library(tmp_path / "models", tmp_path / "lib.json", hf_cache=False).scan()
    assert [e.repo_id for e in entries] == ["google/gemma-3-270m-GGUF"]
    engine = Engine()
    engine.load(entries[0].path, TEST_LOAD)
    try:
        events = list(engine.generate([ChatMessage("user", "Hi")], SamplingParams.greedy(4)))
        assert isinstance(events[-1], Finished) and events[-1].metrics.generated_tokens > 0
    finally:
        engine.unload()


def test_gated_repos_use_the_stored_token(hub: HubServer, tmp_path: Path) -> None:
    from huggingface_hub import constants

    hub.valid_tokens.add("hf_good")
    token_file = Path(constants.HF_TOKEN_PATH)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text("hf_wrong")
    with pytest.raises(DownloadError, match="does not give access"):
        fetcher().fetch(
            "acme/gated-GGUF", "gated-Q4_0.gguf", tmp_path / "g.gguf", 5000, None, Control.new()
        )
    token_file.write_text("hf_good")  # what `hf auth login` stores
    dest = tmp_path / "g.gguf"
    fetcher().fetch(
        "acme/gated-GGUF",
        "gated-Q4_0.gguf",
        dest,
        5000,
        hashlib.sha256(SMALL[:5000]).hexdigest(),
        Control.new(),
    )
    assert dest.read_bytes() == SMALL[:5000]


def test_cancel_deletes_the_partial_file(hub: HubServer, tmp_path: Path) -> None:
    models = tmp_path / "models"
    queue = DownloadQueue(models, tmp_path / "d.json", fetcher())
    q4 = next(c for c in HubClient().details("acme/tiny-GGUF").choices if c.quant == "Q4_K_M")
    job = queue.add("acme/tiny-GGUF", q4)
    hub.throttle(1024 * 1024)

    def cancel_midway(j: object) -> None:
        queue.cancel(job.id)

    assert queue.wait_for_job(1) is job
    queue.run(job, cancel_midway)
    hub.throttle(None)
    assert job.state == "cancelled"
    assert list(models.rglob("*.part")) == [] and list(models.rglob("*.gguf")) == []
    assert DownloadQueue(models, tmp_path / "d.json", fetcher()).jobs == []


def test_library_finds_models_in_the_hugging_face_cache(
    hub: HubServer, tmp_path: Path, model_path: Path
) -> None:
    from huggingface_hub import hf_hub_download

    hub.add_repo("google/gemma-3-270m-GGUF", {"gemma-3-270m-Q4_K_M.gguf": model_path})
    cached = hf_hub_download("google/gemma-3-270m-GGUF", "gemma-3-270m-Q4_K_M.gguf")
    entries = Library(tmp_path / "models", tmp_path / "lib.json").scan()
    assert [(e.source, e.repo_id) for e in entries] == [("hf-cache", "google/gemma-3-270m-GGUF")]
    assert entries[0].valid and Path(cached).resolve() == entries[0].path.resolve()
