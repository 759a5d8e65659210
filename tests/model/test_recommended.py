"""Recommended models: the curated list as data, fit badges, the first-run welcome card,
"Download and use" against the local Hub server down to a real model load, and alerts."""

from __future__ import annotations

import copy
import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QMessageBox, QScrollArea, QWidget
from pytestqt.qtbot import QtBot

from app.config.paths import data_dirs
from app.config.settings import AppSettings
from app.models.downloads import DownloadJob
from app.models.hub import HubClient
from app.models.names import check_file_name, check_repo_id
from app.models.quant import RepoFile, quant_of
from app.models.recommended import (
    FITS,
    MAX_BYTES,
    TIGHT,
    TOO_BIG,
    UNKNOWN,
    Recommended,
    RecommendedList,
    RecommendedListError,
    default_model_name,
    first_run_choices,
    fit_badge,
    fit_text,
    load_list,
    parse_entry,
    parse_list,
    set_welcome_dismissed,
    welcome_dismissed,
)
from tests.conftest import TEST_LOAD
from tests.fakes.window import close_window, hub_services
from tests.hub_server import HubServer, serving_hub
from tests.hypothesis_budget import examples
from tests.real_window import open_window
from ui.models import recommended_view
from ui.models.hub_workers import HubServices
from ui.models.model_manager import ModelManager
from ui.window.main_window import MainWindow

ROOT = Path(__file__).resolve().parents[2]
LIST_PATH = ROOT / "resources" / "recommended_models.json"
REAL_BYTES = LIST_PATH.read_bytes()
REAL = json.loads(REAL_BYTES)
FIELDS = tuple(REAL["models"][0])
FUZZ = settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TEST_REPO = "lamplight-test/tiny-chat-GGUF"
TEST_FILE = "tiny-chat-Q4_K_M.gguf"


def _entries() -> tuple[Recommended, ...]:
    listing = load_list(LIST_PATH)
    assert listing.problems == ()
    return listing.entries


def click(qtbot: QtBot, button: QWidget) -> None:
    """Click ``button`` once it is laid out where a click at its centre lands on it (QTest
    clicks go through the window, by position; a layout still pending sends them elsewhere)."""
    top = button.window()
    scroll = button.parentWidget()
    while scroll is not None and not isinstance(scroll, QScrollArea):
        scroll = scroll.parentWidget()

    def ready() -> bool:
        if scroll is not None:  # a row further down the list is scrolled to first
            scroll.ensureWidgetVisible(button)
        centre = button.mapTo(top, button.rect().center())
        return button.isVisible() and top.childAt(centre) is button

    qtbot.waitUntil(ready, timeout=5_000)
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


# -- the list as data ------------------------------------------------------------------------


def test_bundled_list_is_valid() -> None:
    entries = _entries()
    assert len(entries) == len(REAL["models"]) >= 8
    assert len({e.id for e in entries}) == len(entries)
    assert len({(e.repo.lower(), e.file) for e in entries}) == len(entries)
    for e in entries:
        assert check_repo_id(e.repo) == e.repo
        check_file_name(e.file)
        assert quant_of(e.file) == e.quant
        assert 100_000_000 < e.size < 4_000_000_000  # small models only
        assert e.params > 0 and e.context >= 4096
        # Weights plus a 4096-token cache plus buffers: more than the file, not absurdly so.
        assert e.size < e.ram_needed() < 2 * e.size + 1_000_000_000
    # The embedded base model is not recommended in its own place.
    assert default_model_name() not in {e.file for e in entries}


def test_the_list_offers_small_models_that_think() -> None:
    """At least one reasoning model, open (not gated, Apache-2.0) and laptop-sized; a
    ``thinks`` that is not true or false leaves its entry out."""
    thinkers = [e for e in _entries() if e.thinks]
    assert thinkers and all(e.license == "apache-2.0" for e in thinkers)
    assert min(e.ram_needed() for e in thinkers) < 2_000_000_000
    assert {e.repo for e in thinkers} >= {"Qwen/Qwen3-0.6B-GGUF"}
    data = copy.deepcopy(REAL)
    index = next(i for i, m in enumerate(data["models"]) if m.get("thinks"))
    data["models"][index]["thinks"] = "yes"
    listing = parse_list(data)
    assert len(listing.problems) == 1 and "'thinks' must be true or false" in listing.problems[0]


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
        yield server


def test_every_entry_resolves_on_the_local_hub(hub: HubServer) -> None:
    """Each entry's repo and file, seeded in the local Hub beside other quantizations,
    is found by the app's own Hub code as a downloadable model with its checksum."""
    entries = _entries()
    for e in entries:
        other = e.file.replace(e.quant, "Q8_0" if e.quant != "Q8_0" else "Q4_K_M")
        hub.add_repo(
            e.repo,
            {e.file: b"GGUF" + e.id.encode(), other: b"GGUF other", "README.md": b"# card"},
        )
    client = HubClient()
    for e in entries:
        details = client.details(e.repo)
        found = [c for c in details.choices if c.first_file == e.file]
        assert len(found) == 1, (e.id, [c.name for c in details.choices])
        choice = found[0]
        assert choice.kind == "model" and choice.quant == e.quant and not choice.split
        assert choice.files[0].sha256 is not None and choice.size == len(b"GGUF" + e.id.encode())


# -- damaged and hostile lists -----------------------------------------------------------------


@st.composite
def damaged_bytes(draw: st.DrawFn) -> bytes:
    data = bytearray(REAL_BYTES)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "splice"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 64))]
        elif op == "truncate":
            del data[pos:]
        else:  # repeat a slice of the file elsewhere (duplicated keys, entries, brackets)
            start = draw(st.integers(0, max(0, len(data) - 1)))
            data[pos:pos] = data[start : start + draw(st.integers(1, 400))]
    return bytes(data)


def parse_text(text: str | bytes) -> RecommendedList:
    """``load_list`` of a file holding ``text`` (the product reads the list from a file)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "recommended.json"
        path.write_bytes(raw)
        return load_list(path)


@FUZZ
@given(damaged_bytes())
def test_damaged_list_files_give_a_clear_error(raw: bytes) -> None:
    try:
        listing = parse_text(raw)
    except RecommendedListError as exc:
        assert str(exc).startswith("The list of recommended models")
        return
    for line in listing.problems:
        assert line.startswith("Recommended model ") and " left out: " in line
    assert len(listing.entries) + len(listing.problems) <= len(REAL["models"]) + 400


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=300)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
hostile_names = st.sampled_from(
    [
        "../evil.gguf",
        "a/../../b.gguf",
        "/etc/passwd.gguf",
        "CON.gguf",
        "nul",
        "model.gguf.part",
        "x\u202egguf.exe",
        "x\u200b.gguf",
        ".hidden.gguf",
        "a" * 300 + ".gguf",
        "model.safetensors",
        "owner/name",
        "owner/name/extra",
        "owner--x/name",
        "own\u0435r/name",
        "-owner/name",
        "",
        " ",
        "\n",
    ]
)
MISSING = object()


def _mentions(field: str, message: str) -> bool:
    words = {"repo": ("repo id",), "file": ("file name", ".gguf", "'file'", "'quant'")}
    return any(w in message for w in (f"'{field}'", *words.get(field, ())))


@FUZZ
@given(
    index=st.integers(0, len(REAL["models"]) - 1),
    field=st.sampled_from((*FIELDS, "extra")),
    value=json_values | hostile_names | st.just(MISSING),
)
def test_a_hostile_entry_is_left_out_by_name(index: int, field: str, value: Any) -> None:
    data = copy.deepcopy(REAL)
    entry = data["models"][index]
    if field in ("id", "repo", "file"):  # a duplicate is a different problem (tested below)
        assume(all(m.get(field) != value for m in data["models"]))
    if value is MISSING:
        entry.pop(field, None)
    else:
        entry[field] = value
    listing = parse_list(data)
    n = len(REAL["models"])
    if not listing.problems:
        assert len(listing.entries) == n  # the value happened to be valid (or "extra")
        return
    assert len(listing.problems) == 1 and len(listing.entries) == n - 1
    problem = listing.problems[0]
    assert problem.startswith(f"Recommended model {index + 1}")
    assert field == "id" or f"({REAL['models'][index]['id']})" in problem
    assert value is MISSING or _mentions(field, problem), problem
    assert all(e.id != REAL["models"][index]["id"] for e in listing.entries)


def test_duplicates_and_bad_headers_are_refused(tmp_path: Path) -> None:
    data = copy.deepcopy(REAL)
    data["models"].append(dict(data["models"][0]))
    data["models"].append({**data["models"][1], "id": "another"})
    listing = parse_list(data)
    assert [p.split(" left out: ")[1] for p in listing.problems] == [
        f"the id '{REAL['models'][0]['id']}' is used twice.",
        f"{REAL['models'][1]['repo']}/{REAL['models'][1]['file']} is listed twice.",
    ]
    for bad, words in (
        ([], "not a JSON object"),
        ({**REAL, "format": "other"}, "format"),
        ({**REAL, "version": 2}, "Update Lamplight"),
        ({**REAL, "version": True}, "no valid version"),
        ({**REAL, "models": {}}, "'models' array"),
        ({**REAL, "models": [REAL["models"][0]] * 101}, "the limit is 100"),
    ):
        with pytest.raises(RecommendedListError, match=words):
            parse_list(bad)
    with pytest.raises(RecommendedListError, match="nested too deeply"):
        parse_text(json.dumps({**REAL, "models": [[[[[1]]]]]}))
    with pytest.raises(RecommendedListError, match="too large"):
        parse_text(b" " * (MAX_BYTES + 1))
    with pytest.raises(RecommendedListError, match="missing"):
        load_list(tmp_path / "nothing.json")
    with pytest.raises(RecommendedListError, match="directory"):
        load_list(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(RecommendedListError, match="named pipe"):
        load_list(fifo)  # refused without blocking on the open


# -- fitting the machine -------------------------------------------------------------------------


def test_fit_badges_and_first_run_choices() -> None:
    assert fit_badge(800, 1000) == FITS
    assert fit_badge(801, 1000) == TIGHT and fit_badge(1000, 1000) == TIGHT
    assert fit_badge(1001, 1000) == TOO_BIG
    assert fit_badge(1, 0) == UNKNOWN and fit_badge(1, -5) == UNKNOWN
    entries = _entries()
    needs = {e.id: e.ram_needed() for e in entries}
    # Plenty of memory: the first three, in the list's order.
    assert first_run_choices(entries, 10**12) == list(entries[:3])
    # Unknown memory: the first three too, with no claim that they fit.
    assert first_run_choices(entries, 0) == list(entries[:3])
    # Little memory: only what fits, then what is tight; never what is too big.
    free = int(sorted(needs.values())[1] / 0.9)
    chosen = first_run_choices(entries, free)
    assert chosen and all(needs[e.id] <= free for e in chosen)
    assert [fit_badge(needs[e.id], free) for e in chosen] == sorted(
        (fit_badge(needs[e.id], free) for e in chosen), key=[FITS, TIGHT].index
    )
    assert first_run_choices(entries, 1000) == []
    # A larger context needs more memory; a q8_0 cache needs less than f16.
    e = entries[0]
    assert e.ram_needed(8192) > e.ram_needed(4096) > e.ram_needed(4096, 34 / 32)
    assert e.ram_needed(10**9) == e.ram_needed(e.context)  # capped at the trained context


def test_welcome_flag(tmp_path: Path) -> None:
    assert not welcome_dismissed(tmp_path)
    set_welcome_dismissed(tmp_path)
    assert welcome_dismissed(tmp_path)
    set_welcome_dismissed(tmp_path, False)
    assert not welcome_dismissed(tmp_path)
    flag = tmp_path / "onboarding.json"
    for damaged in (b"", b"{", b'{"welcome_dismissed": "yes"}', b"[true]", b"\xff" * 10):
        flag.write_bytes(damaged)
        assert not welcome_dismissed(tmp_path)
    flag.unlink()
    flag.mkdir()
    assert not welcome_dismissed(tmp_path)  # shows the card again; loses nothing


# -- the Recommended tab ---------------------------------------------------------------------------


def _services(tmp_path: Path) -> HubServices:
    return hub_services(data_dirs(tmp_path / "data"))


def test_tab_shows_fit_badges_from_the_memory_figure(
    qtbot: QtBot, tmp_path: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_id = {e.id: e for e in _entries()}
    small, middle, large = (
        by_id["qwen2.5-0.5b-instruct"],
        by_id["qwen2.5-1.5b-instruct"],
        by_id["gemma-3-4b-it"],
    )
    free = int(middle.ram_needed() / 0.9)  # the 1.5B model needs 90% of it: tight
    monkeypatch.setattr("app.util.sysinfo.available_memory", lambda: free)
    monkeypatch.setattr("app.util.sysinfo.physical_memory", lambda: 16_000_000_000)
    services = _services(tmp_path)
    m = ModelManager(services, None, 4096)
    qtbot.addWidget(m)
    try:
        m.show()
        m.show_recommended()
        view = m.recommended
        assert m.tabs.currentWidget() is view and m.tabs.tabText(3) == "Recommended"
        assert f"{free / 1e9:.1f} GB of 16.0 GB memory free now" in view.memory_label.text()
        assert list(view.rows) == [e.id for e in _entries()]
        for entry, badge in ((small, FITS), (middle, TIGHT), (large, TOO_BIG)):
            row = view.rows[entry.id]
            assert row.badge.text() == badge
            need = entry.ram_needed()
            assert row.badge.toolTip() == fit_text(need, free)
            assert f"{free / 1e9:.1f} GB free" in fit_text(need, free)
            assert row.badge.accessibleName() == f"Memory fit: {badge}"
            assert row.button.text() == "Download and use"
            assert row.button.accessibleName() == f"Download and use: {entry.name}"
        assert "MB" in view.rows[small.id].size_label.text()

        # Too big: asks first; "No" leaves everything as it was.
        asked: list[str] = []

        def answer_no(_parent: QWidget, _title: str, text: str) -> QMessageBox.StandardButton:
            asked.append(text)
            return QMessageBox.StandardButton.No

        monkeypatch.setattr(QMessageBox, "question", answer_no)
        click(qtbot, view.rows[large.id].button)
        assert asked and "may be very slow" in asked[0] and "GB free" in asked[0]
        assert not services.installs.busy(large.id) and not services.queue.jobs

        # One that fits, but whose repo is not on this Hub: a plain error in its row.
        row = view.rows[small.id]
        click(qtbot, row.button)
        assert row.button.text() == "Cancel"
        qtbot.waitUntil(lambda: "not found on the Hub" in row.status_text, timeout=10_000)
        assert row.button.text() == "Retry" and not services.queue.jobs
        assert m.discover_status.text() == ""  # not reported in the Discover tab too

        # The memory figure is read again when the tab is shown.
        monkeypatch.setattr("app.util.sysinfo.available_memory", lambda: 0)
        view.hide()
        view.show()
        assert view.rows[small.id].badge.text() == "?"
        assert "unknown" in view.memory_label.text()
    finally:
        m.close()
        services.shutdown()


def test_manager_opens_on_recommended_with_only_the_default_model(
    qtbot: QtBot, tmp_path: Path, hub: HubServer, model_path: Path
) -> None:
    other = tmp_path / "elsewhere" / "my-chat-Q4_K_M.gguf"
    other.parent.mkdir()
    other.symlink_to(model_path)
    services = _services(tmp_path)
    try:
        for imported, opens_on in (
            ([model_path], "Recommended"),
            ([other], "Discover"),  # another chat model (same bytes, another name)
        ):
            # As the window opens it: made, then told the imported models, then scanned.
            m = ModelManager(services, None, 4096)
            qtbot.addWidget(m)
            m.imported = list(imported)
            m.refresh_library()
            m.show()
            qtbot.waitUntil(lambda m=m: m._scanned, timeout=10_000)
            assert m.tabs.tabText(m.tabs.currentIndex()) == opens_on
            m.close()
    finally:
        services.shutdown()


def test_download_and_use_pauses_resumes_and_cancels(
    qtbot: QtBot, tmp_path: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row follows the shared download queue: paused in the Downloads tab it offers
    Resume, and Cancel deletes the partial file and offers the download again."""
    body = b"GGUF" + bytes(3 * 1024 * 1024)
    hub.add_repo(TEST_REPO, {TEST_FILE: body})
    hub.throttle(512 * 1024)
    monkeypatch.setattr(
        recommended_view, "bundled_list", lambda: RecommendedList((_test_entry(len(body)),))
    )
    services = _services(tmp_path)
    m = ModelManager(services, None, 4096)
    qtbot.addWidget(m)
    try:
        m.show()
        m.show_recommended()
        row = m.recommended.rows["test-chat"]
        click(qtbot, row.button)
        qtbot.waitUntil(lambda: "MB/s" in row.status_text, timeout=10_000)
        assert row.button.text() == "Cancel" and row.progress.isVisible()
        assert m.downloads_page.table.rowCount() == 1  # the same queue as every download
        m.tabs.setCurrentWidget(m.downloads_page)
        m.downloads_page.table.selectRow(0)
        click(qtbot, m.findChild(QWidget, "pauseButton"))
        qtbot.waitUntil(lambda: row.button.text() == "Resume", timeout=10_000)
        assert row.status_text == "Paused"
        m.show_recommended()
        part = services.queue.models_dir / "lamplight-test__tiny-chat-GGUF" / (TEST_FILE + ".part")
        assert 0 < part.stat().st_size < len(body)
        click(qtbot, row.button)
        qtbot.waitUntil(lambda: row.button.text() == "Cancel", timeout=10_000)
        qtbot.waitUntil(lambda: "MB/s" in row.status_text, timeout=10_000)
        assert len(services.queue.jobs) == 1  # resumed, not queued twice
        click(qtbot, row.button)
        qtbot.waitUntil(lambda: row.button.text() == "Download and use", timeout=10_000)
        assert row.status_text == "Cancelled" and not part.exists()
    finally:
        m.close()
        services.shutdown()


# -- first run, download and use, alerts -----------------------------------------------------------


@pytest.fixture()
def window(qtbot: QtBot, tmp_path: Path, hub: HubServer) -> Iterator[MainWindow]:
    services = _services(tmp_path)
    root = tmp_path / "data"
    win = open_window(qtbot, root, None, AppSettings(load=TEST_LOAD), services=services)
    yield win
    close_window(qtbot, win)


def _test_entry(size: int) -> Recommended:
    return parse_entry(
        {
            "id": "test-chat",
            "name": "Test Chat 270M",
            "description": "The test model under another name.",
            "repo": TEST_REPO,
            "file": TEST_FILE,
            "quant": "Q4_K_M",
            "params": 268_000_000,
            "size": size,
            "context": 32768,
            "license": "gemma",
            "layers": 18,
            "kv_dim": 256,
            "vocab": 262144,
        }
    )


def _deactivate() -> None:
    """No Lamplight window is active (the user went to another app)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        QApplication.setActiveWindow(None)  # type: ignore[arg-type]
    assert QApplication.activeWindow() is None


def test_first_run_card_downloads_and_switches_to_a_chat_model(
    qtbot: QtBot,
    window: MainWindow,
    hub: HubServer,
    model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The embedded base model loads; the card says what it is and offers chat models
    that fit; one click downloads one from the local Hub and the window switches to it."""
    size = model_path.stat().st_size
    hub.add_repo(TEST_REPO, {TEST_FILE: model_path, "tiny-chat-Q8_0.gguf": b"GGUF x"})
    real = _entries()
    monkeypatch.setattr(
        recommended_view, "bundled_list", lambda: RecommendedList((_test_entry(size), *real))
    )
    monkeypatch.setattr("app.util.sysinfo.available_memory", lambda: 4_000_000_000)
    alerted: list[object] = []
    monkeypatch.setattr(QApplication, "alert", lambda w, ms=0: alerted.append(w))
    onboarding = window.onboarding

    with qtbot.waitSignal(window.modelReady, timeout=60_000):
        window.load_model(model_path)  # the embedded default model (same file name)
    qtbot.waitUntil(lambda: onboarding.card is not None, timeout=10_000)
    card = onboarding.card
    assert card is not None and card.isVisible()
    assert "text-completion model" in card.body.text()
    assert "4.0 GB" in card.memory.text()
    # The three best that fit 4 GB: the test entry, then the list's first two.
    assert [r.entry.id for r in card.rows] == ["test-chat", real[0].id, real[1].id]
    assert all(r.badge.text() == FITS for r in card.rows)

    row = card.rows[0]
    assert row.button.text() == "Download and use"
    click(qtbot, row.button)
    _deactivate()
    # Down to a real load of the downloaded file; the card goes once a chat model is in.
    target = window.dirs.models / "lamplight-test__tiny-chat-GGUF" / TEST_FILE
    qtbot.waitUntil(lambda: window.loaded_model.local_path == str(target), timeout=120_000)
    assert target.stat().st_size == size
    assert window.settings.model_path == str(target)
    qtbot.waitUntil(lambda: onboarding.card is None, timeout=5_000)
    # The download ended while no window was active: the user was told.
    assert onboarding.alerts == [("Download finished", f"{TEST_FILE} is ready to use.")]
    assert alerted == [window]

    # The manager's Recommended tab now offers "Use" for it.
    window.onboarding.show_recommended()
    m = window.model_manager
    assert m is not None and m.tabs.currentWidget() is m.recommended
    assert m.recommended.rows["test-chat"].button.text() == "Use"


def test_closing_the_card_is_remembered(
    qtbot: QtBot, window: MainWindow, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    onboarding = window.onboarding
    card = onboarding.show_card()
    assert card is not None and card.parent() is window.transcript and card.isVisible()
    # "All recommended models…" opens the manager on that tab.
    click(qtbot, card.findChild(QWidget, "welcomeMore"))
    m = window.model_manager
    assert m is not None and m.isVisible() and m.tabs.currentWidget() is m.recommended
    m.hide()
    assert onboarding.recommended_action.text() == "Recommended models…"
    assert onboarding.recommended_action in _help_actions(window)
    click(qtbot, card.findChild(QWidget, "welcomeClose"))
    assert onboarding.card is None
    assert welcome_dismissed(window.dirs.root)
    # Loading the default model again does not bring it back.
    monkeypatch.setattr(window.services, "scan", lambda *_a: pytest.fail("no scan needed"))
    with qtbot.waitSignal(window.modelReady, timeout=60_000):
        window.load_model(model_path)
    assert onboarding.card is None


def _help_actions(win: MainWindow) -> list[object]:
    menus = [a.menu() for a in win.menuBar().actions() if a.text().replace("&", "") == "Help"]
    return [a for m in menus if m is not None for a in m.actions()]  # type: ignore[attr-defined]


def test_no_card_when_another_chat_model_is_there(
    qtbot: QtBot, window: MainWindow, model_path: Path
) -> None:
    other = window.dirs.models / "someone__chat-GGUF" / "chat-Q4_K_M.gguf"
    other.parent.mkdir(parents=True)
    other.symlink_to(model_path)
    with qtbot.waitSignal(window.modelReady, timeout=60_000):
        window.load_model(model_path)
    assert window.onboarding._waiting_scan  # the library is being looked at
    qtbot.waitUntil(lambda: not window.onboarding._waiting_scan, timeout=10_000)
    assert window.onboarding.card is None


def test_download_alerts_only_in_the_background(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    alerted: list[object] = []
    monkeypatch.setattr(QApplication, "alert", lambda w, ms=0: alerted.append(w))
    onboarding = window.onboarding
    files = [RepoFile("a-Q4_K_M.gguf", 10)]
    done = DownloadJob("o/a-GGUF", "a-Q4_K_M.gguf", files, state="done")
    failed = DownloadJob(
        "o/a-GGUF", "a-Q4_K_M.gguf", files, state="failed", error="Disk full while writing."
    )
    paused = DownloadJob("o/a-GGUF", "a-Q4_K_M.gguf", files, state="paused")
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=5_000)
    window.services.downloads.jobEnded.emit(done)
    assert onboarding.alerts == [] and alerted == []  # the user is looking at it
    _deactivate()
    for job in (done, failed, paused):
        window.services.downloads.jobEnded.emit(job)
    assert onboarding.alerts == [
        ("Download finished", "a-Q4_K_M.gguf is ready to use."),
        ("Download failed", "Disk full while writing."),
    ]
    assert alerted == [window, window]
