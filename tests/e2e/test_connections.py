"""Saved server connections: the store, API keys in the keyring, and the Connections dialog."""

from __future__ import annotations

import contextlib
import json
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keyring.backends import fail
from pytestqt.qtbot import QtBot

from app.remote import keys
from app.remote.connection import Connection
from app.remote.connection_store import (
    FILE_NAME,
    BadConnection,
    ConnectionStore,
    load_connections,
    make_connection,
    parse_connections,
    save_connections,
)
from app.util.datafiles import DataFileError
from app.util.errors import LamplightError
from tests.fakes.keyring import LockedKeyring, MemoryKeyring, use_keyring
from tests.hypothesis_budget import examples
from tests.server_fixture import RunningServer, free_port, running_llama_server
from ui.remote.connections_dialog import ConnectionsDialog

SECRET = "sk-test-5f3a9c1e-never-in-a-file"


@pytest.fixture()
def memory_keyring(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryKeyring]:
    backend = MemoryKeyring()
    with use_keyring(backend, monkeypatch):
        yield backend


@pytest.fixture()
def no_keyring(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with use_keyring(fail.Keyring(), monkeypatch):
        yield


def sample_connections() -> list[Connection]:
    return [
        make_connection(
            id="a1b2c3d4e5f60708",
            name="Workstation",
            kind="llama-server",
            url="http://192.168.1.20:8080/",
            slot=2,
        ),
        make_connection(
            id="0f1e2d3c4b5a6978",
            name="vLLM node ✓",
            kind="openai",
            url="https://gpu.example.org/v1",
            model="Qwen/Qwen2.5-7B-Instruct",
        ),
        make_connection(
            id="deadbeefdeadbeef",
            name="Self-signed",
            kind="openai",
            url="https://10.0.0.5:8443",
            model="llama3.2",
            verify_tls=False,
        ),
    ]


# -- the store ---------------------------------------------------------------------------


def test_store_round_trip(tmp_path: Path, memory_keyring: MemoryKeyring) -> None:
    path = tmp_path / FILE_NAME
    store = ConnectionStore(path)
    assert store.connections == [] and store.active == "" and store.notes == []
    conns = sample_connections()
    for conn in conns:
        store.put(conn)
    store.set_active(conns[1].id)
    edited = make_connection(**{**asdict(conns[0]), "name": "Workstation (GPU)"})
    store.put(edited)  # replaces in place
    again = ConnectionStore(path)
    assert again.connections == [edited, conns[1], conns[2]]
    assert again.active == conns[1].id and again.active_connection == conns[1]
    assert again.notes == []
    assert conns[0].url == "http://192.168.1.20:8080"  # normalised
    again.remove(conns[1].id)
    third = ConnectionStore(path)
    assert [c.id for c in third.connections] == [conns[0].id, conns[2].id]
    assert third.active == ""  # the one in use was removed: this computer
    with pytest.raises(LamplightError, match="no longer in the list"):
        third.set_active(conns[1].id)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "  ", "Give the connection a name"),
        ("name", "x" * 81, "longer than 80"),
        ("name", "a\nb", "control character"),
        ("url", "ftp://host", "http:// or https://"),
        ("url", "", "Enter the server's address"),
        ("url", "http://[::1", "cannot be read"),  # urlsplit raises ValueError
        ("url", "http://user:pw@host:8080", "Leave the user name and password out"),
        ("url", "http://host:99999", "bad port"),
        ("url", "http://ho st", "spaces"),
        ("kind", "ollama", "Unknown server kind"),
        ("slot", -1, "slot must be"),
        ("slot", True, "slot must be"),
    ],
)
def test_bad_values_are_refused_with_a_reason(field: str, value: Any, message: str) -> None:
    good = asdict(sample_connections()[0])
    with pytest.raises(BadConnection, match=message) as err:
        make_connection(**{**good, field: value})
    assert err.value.field == field


def test_api_key_goes_to_the_keyring_and_never_into_the_file(
    tmp_path: Path, memory_keyring: MemoryKeyring
) -> None:
    store = ConnectionStore(tmp_path / FILE_NAME)
    conn = sample_connections()[1]
    store.put(conn)
    keys.set_key(conn.id, SECRET)
    store.set_active(conn.id)
    assert memory_keyring.values == {("Lamplight", conn.id): SECRET}
    assert keys.get_key(conn.id) == SECRET and keys.keyring_problem() == ""
    for f in tmp_path.iterdir():
        assert SECRET.encode() not in f.read_bytes(), f
    store.remove(conn.id)  # removing a connection forgets its key
    assert memory_keyring.values == {} and keys.get_key(conn.id) == ""
    keys.delete_key(conn.id)  # deleting twice is fine


def test_without_a_keyring_keys_live_in_memory_only(tmp_path: Path, no_keyring: None) -> None:
    assert keys.keyring_problem() == keys.NO_KEYRING
    assert "kept only until Lamplight quits" in keys.NO_KEYRING
    keys.set_key("abc", SECRET)
    assert keys.get_key("abc") == SECRET
    keys.delete_key("abc")
    assert keys.get_key("abc") == ""


def test_a_keyring_that_refuses_falls_back_to_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = LockedKeyring()
    with use_keyring(backend, monkeypatch):
        assert keys.keyring_problem() == ""
        keys.set_key("abc", SECRET)
        assert keys.get_key("abc") == SECRET and backend.values == {}
        assert "the collection is locked" in keys.keyring_problem()
    assert "the collection is locked" not in keys.keyring_problem()  # another backend now


def test_bad_keys_are_refused() -> None:
    assert keys.check_key("  sk-1 ") == "sk-1"
    for bad in ("a\r\nX-Evil: 1", "k\x00", "x" * (keys.MAX_KEY_CHARS + 1), "clé"):
        with pytest.raises(keys.BadApiKey):
            keys.check_key(bad)


def test_damaged_file_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(b'{"connections": [{"id": "a", "name": "x"')  # cut short
    store = ConnectionStore(path)
    assert store.connections == []
    assert len(store.notes) == 1 and "set aside as connections.json.bad" in store.notes[0]
    assert not path.exists() and (tmp_path / "connections.json.bad").exists()
    path.mkdir()  # a directory in its place
    assert "is a directory" in ConnectionStore(path).notes[0]


def test_bad_entries_are_left_out_and_good_ones_kept(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    conns = sample_connections()
    save_connections(path, conns, conns[2].id)
    data = json.loads(path.read_text())
    entries = data["connections"]
    entries.insert(1, {"id": "zz", "name": "", "kind": "openai", "url": "http://h"})
    entries.insert(0, "not an entry")
    entries.append({**entries[1], "name": "Copy"})  # the id of an earlier one
    entries.append(
        {
            "id": ["x"],
            "name": "Mended",
            "kind": "openai",
            "url": "http://h:1",
            "slot": "two",
            "verify_tls": "no",
            "model": 5,
            "extra": {"a": 1},
        }
    )
    data["format"] = 7
    path.write_text(json.dumps(data))
    store = ConnectionStore(path)
    got = store.connections
    assert got[:3] == conns and store.active == conns[2].id
    copy, mended = got[3], got[4]
    assert copy.name == "Copy" and copy.id not in {c.id for c in conns}
    assert (mended.name, mended.slot, mended.verify_tls, mended.model) == ("Mended", 0, True, "")
    text = "\n".join(store.notes)
    for part in (
        "connection 1 is not an object",
        "was left out: Give the connection a name",
        "had the id of an earlier one",
        "certificate checks were switched back on",
        "format 7",
        "was repaired; the original is kept as connections.json.bad",
    ):
        assert part in text
    assert (tmp_path / "connections.json.bad").exists()
    again = ConnectionStore(path)  # the repaired file reads clean
    assert again.connections == got and again.notes == []


# -- fuzzing the reader ------------------------------------------------------------------

_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
_junk = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
_FIELDS = ("id", "name", "kind", "url", "model", "verify_tls", "slot")
_field_values = st.one_of(
    _junk,
    st.sampled_from(
        [
            "llama-server",
            "openai",
            "http://[::1",
            "https://u:p@h",
            "http://h:0",
            "x" * 100,
            "\ud800",
            "http://ok.example:80",
            "\x85",
        ]
    ),
)


@st.composite
def _damaged_entry(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """A real entry with fields replaced, dropped or added; its id never one of the good."""
    if draw(st.integers(0, 4)) == 0:
        return draw(_junk)
    entry = dict(base)
    entry["id"] = draw(st.one_of(_junk, st.text("xyz-", min_size=1, max_size=8)))
    for name in draw(st.lists(st.sampled_from(_FIELDS[1:]), max_size=4)):
        if draw(st.booleans()):
            entry[name] = draw(_field_values)
        else:
            entry.pop(name, None)
    if draw(st.booleans()):
        entry[draw(st.text(max_size=5))] = draw(_junk)
    return entry


@st.composite
def _file_with_junk(draw: st.DrawFn) -> tuple[dict[str, Any], list[Connection], str]:
    good = sample_connections()
    saved = json.loads(_real_file_text(good, good[1].id))
    real = saved["connections"]
    entries: list[Any] = list(real)
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(entries)))
        entries.insert(at, draw(_damaged_entry(draw(st.sampled_from(real)))))
    saved["connections"] = entries
    active = draw(st.sampled_from(["keep", "junk", "missing"]))
    if active == "junk":
        saved["active"] = draw(_junk)
    elif active == "missing":
        del saved["active"]
    for key in draw(st.lists(st.text(max_size=5), max_size=2)):
        saved[key] = draw(_junk)
    expected_active = good[1].id if saved.get("active") == good[1].id else ""
    return saved, good, expected_active


def _real_file_text(conns: list[Connection], active: str) -> str:
    with tempfile.TemporaryDirectory() as d:
        store = ConnectionStore(Path(d) / FILE_NAME)
        for conn in conns:
            store.put(conn)
        store.set_active(active)
        return (Path(d) / FILE_NAME).read_text(encoding="utf-8")


def _check_loaded(path: Path, loaded_conns: list[Connection]) -> None:
    for conn in loaded_conns:  # everything kept is a valid connection
        assert make_connection(**asdict(conn)) == conn
    assert len({c.id for c in loaded_conns}) == len(loaded_conns)
    again = load_connections(path)  # repaired or set aside: the next start reads it clean
    assert again.connections == loaded_conns and again.notes == []


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_file_with_junk())
def test_fuzz_reader_keeps_every_good_entry(
    case: tuple[dict[str, Any], list[Connection], str],
) -> None:
    data, good, active = case
    text = json.dumps(data)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / FILE_NAME
        path.write_text(text, encoding="utf-8")
        loaded = load_connections(path)  # never raises
        kept = [c for c in loaded.connections if c in good]
        assert kept == good, loaded.notes  # all of them, in order
        assert loaded.active == active
        if len(loaded.connections) < len(data["connections"]):
            assert loaded.notes, "a left-out entry is noted"
        _check_loaded(path, loaded.connections)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["flip", "insert", "delete", "cut"]),
            st.integers(0, 10**6),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_fuzz_reader_on_mutated_real_bytes(edits: list[tuple[str, int, int]]) -> None:
    good = sample_connections()
    raw = bytearray(_real_file_text(good, good[0].id).encode("utf-8"))
    for op, pos, byte in edits:
        at = pos % (len(raw) + 1)
        if op == "flip" and at < len(raw):
            raw[at] ^= byte or 1
        elif op == "insert":
            raw[at:at] = bytes([byte])
        elif op == "delete":
            del raw[at : at + 1 + byte % 8]
        elif op == "cut":
            del raw[at:]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / FILE_NAME
        path.write_bytes(bytes(raw))
        loaded = load_connections(path)  # never raises
        _check_loaded(path, loaded.connections)
        if loaded.notes and "set aside" in loaded.notes[0]:
            assert loaded.connections == [] and not path.exists()
    try:
        data = json.loads(bytes(raw))
    except ValueError:
        return
    with contextlib.suppress(DataFileError):  # the parser raises only its documented error
        parse_connections(data)


# -- the dialog ----------------------------------------------------------------------------


@pytest.fixture()
def store(tmp_path: Path) -> ConnectionStore:
    return ConnectionStore(tmp_path / FILE_NAME)


@pytest.fixture()
def dialog(
    qtbot: QtBot, store: ConnectionStore, memory_keyring: MemoryKeyring
) -> Iterator[ConnectionsDialog]:
    d = ConnectionsDialog(store)
    qtbot.addWidget(d)
    d.show()
    yield d
    d.close()


def fill(
    d: ConnectionsDialog, name: str, url: str, kind: str = "llama-server", key: str = ""
) -> None:
    d.name_edit.setText(name)
    d.kind_box.setCurrentIndex(d.kind_box.findData(kind))
    d.url_edit.setText(url)
    d.key_edit.setText(key)


def test_dialog_add_edit_remove(
    dialog: ConnectionsDialog, store: ConnectionStore, memory_keyring: MemoryKeyring
) -> None:
    d = dialog
    for w in (
        d.name_edit,
        d.kind_box,
        d.url_edit,
        d.key_edit,
        d.tls_box,
        d.slot_box,
        d.model_box,
        d.test_button,
        d.save_button,
        d.connect_button,
        d.local_button,
        d.add_button,
        d.remove_button,
        d.list,
    ):
        assert w.accessibleName() and w.toolTip(), w.objectName()
    assert d.key_edit.echoMode() == d.key_edit.EchoMode.Password
    assert d.tls_box.isChecked() and not d.keyring_note.isVisibleTo(d)

    d.add_button.click()
    fill(d, "Box", "http://127.0.0.1:8080/", key=SECRET)
    d.slot_box.setValue(3)
    d.save_button.click()
    assert not d.form_error.isVisibleTo(d)
    [conn] = store.connections
    assert (conn.name, conn.url, conn.slot, conn.kind) == (
        "Box",
        "http://127.0.0.1:8080",
        3,
        "llama-server",
    )
    assert memory_keyring.values == {("Lamplight", conn.id): SECRET}
    assert SECRET not in store.path.read_text()
    assert d.list.count() == 1 and d.list.currentRow() == 0

    d.add_button.click()  # a second one, OpenAI-compatible: no slot, a typed model
    assert d.name_edit.text() == "" and d.url_edit.text() == ""
    fill(d, "Ollama", "http://localhost:11434", kind="openai")
    assert not d.slot_box.isEnabled() and d.model_box.isEditable()
    d.model_box.setEditText("llama3.2")
    d.save_button.click()
    assert [c.name for c in store.connections] == ["Box", "Ollama"]
    assert store.connections[1].model == "llama3.2"

    d.list.setCurrentRow(0)  # edit the first
    assert d.name_edit.text() == "Box" and d.key_edit.text() == SECRET and d.slot_box.value() == 3
    d.name_edit.setText("Box 2")
    d.key_edit.clear()
    d.save_button.click()
    assert store.connections[0].name == "Box 2" and store.connections[0].id == conn.id
    assert memory_keyring.values == {}  # an emptied key is deleted
    assert d.list.item(0).text().startswith("Box 2")

    d.remove_button.click()
    assert [c.name for c in store.connections] == ["Ollama"] and d.list.count() == 1
    assert ConnectionStore(store.path).connections == store.connections


def test_dialog_bad_input_keeps_what_was_typed(
    dialog: ConnectionsDialog, store: ConnectionStore
) -> None:
    d = dialog
    d.add_button.click()
    fill(d, "", "ftp://somewhere")
    d.save_button.click()
    assert d.form_error.isVisibleTo(d) and "name" in d.form_error.text()
    assert d.url_edit.text() == "ftp://somewhere" and store.connections == []
    d.name_edit.setText("Named")
    d.save_button.click()
    assert "http:// or https://" in d.form_error.text() and d.url_edit.text() == "ftp://somewhere"
    d.url_edit.setText("https://me:pw@host")
    d.test_button.click()  # Test checks the form too
    assert "Leave the user name and password out" in d.form_error.text()
    d.url_edit.setText("https://host")
    d.key_edit.setText("a\tb")
    d.save_button.click()
    assert "control character" in d.form_error.text() and store.connections == []
    d.key_edit.setText("")
    d.save_button.click()
    assert not d.form_error.isVisibleTo(d) and [c.name for c in store.connections] == ["Named"]


def test_dialog_tls_warning_and_keyring_note(
    qtbot: QtBot, store: ConnectionStore, no_keyring: None
) -> None:
    d = ConnectionsDialog(store)
    qtbot.addWidget(d)
    d.show()
    assert (
        d.keyring_note.isVisibleTo(d) and "kept only until Lamplight quits" in d.keyring_note.text()
    )
    d.url_edit.setText("https://gpu.example.org")
    assert not d.warning.isVisibleTo(d)
    d.tls_box.setChecked(False)
    assert d.warning.isVisibleTo(d) and "not checked" in d.warning.text()
    d.tls_box.setChecked(True)
    d.url_edit.setText("http://gpu.example.org:8000")
    assert d.warning.isVisibleTo(d) and "clear text" in d.warning.text()
    d.url_edit.setText("http://127.0.0.1:8080")
    assert not d.warning.isVisibleTo(d)
    d.close()


def test_dialog_connect_and_local_signals(
    qtbot: QtBot, dialog: ConnectionsDialog, store: ConnectionStore
) -> None:
    d = dialog
    d.add_button.click()
    fill(d, "Box", "http://127.0.0.1:9")
    with qtbot.waitSignal(d.connectRequested, timeout=1000) as blocker:
        d.connect_button.click()
    [conn] = store.connections
    assert blocker.args == [conn] and not d.isVisible()
    assert store.active == ""  # the window makes it active once it connected
    store.set_active(conn.id)
    d.show()
    assert d.list.item(0).text().endswith("in use")
    with qtbot.waitSignal(d.localRequested, timeout=1000):
        d.local_button.click()
    again = ConnectionsDialog(store)  # opens on the connection in use
    qtbot.addWidget(again)
    assert again.list.currentRow() == 0 and again.name_edit.text() == "Box"


def test_dialog_test_against_real_llama_server(
    qtbot: QtBot, dialog: ConnectionsDialog, llama_server: RunningServer
) -> None:
    d = dialog
    d.add_button.click()
    fill(d, "Local server", llama_server.url)
    d.test_button.click()
    assert d.test_result.text().startswith("Testing")
    qtbot.waitUntil(
        lambda: d.test_result.text().startswith(("Connected", "Cannot")), timeout=20_000
    )
    text = d.test_result.text()
    assert text.startswith("Connected: llama-server"), text
    assert "gemma-3-270m" in text and "(context 2048)" in text
    assert "gemma-3-270m" in d.model_box.currentText()
    qtbot.waitUntil(lambda: not d._tests, timeout=5000)  # idle: no test left in flight

    d.kind_box.setCurrentIndex(d.kind_box.findData("openai"))  # its /v1 API lists the model
    d.test_button.click()
    qtbot.waitUntil(
        lambda: d.test_result.text().startswith(("Connected", "Cannot", "The")), timeout=20_000
    )
    assert d.test_result.text().startswith("Connected: OpenAI-compatible"), d.test_result.text()
    assert d.model_box.count() >= 1 and d.model_box.currentText()


def test_dialog_test_refused_port_shows_the_error(qtbot: QtBot, dialog: ConnectionsDialog) -> None:
    d = dialog
    d.add_button.click()
    fill(d, "Nothing", f"http://127.0.0.1:{free_port()}")
    d.test_button.click()
    qtbot.waitUntil(lambda: not d.test_result.text().startswith("Testing"), timeout=10_000)
    assert d.test_result.text().startswith("Cannot reach the server at 127.0.0.1"), (
        d.test_result.text()
    )
    assert d.model_box.count() == 0


@pytest.mark.parametrize("kind", ["llama-server", "openai"])
def test_close_during_a_test_joins_the_thread_at_once(
    qtbot: QtBot, dialog: ConnectionsDialog, kind: str
) -> None:
    """A server that accepts and never answers: closing cuts the test short and waits
    for it."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        d = dialog
        d.add_button.click()
        fill(d, "Silent", f"http://127.0.0.1:{silent.getsockname()[1]}", kind=kind)
        d.test_button.click()
        [(_test, job)] = d._tests.values()
        qtbot.wait(300)  # connected and waiting for an answer
        assert job.running and d.test_result.text().startswith("Testing")
        t0 = time.monotonic()
        d.close()
        assert time.monotonic() - t0 < 2.0
        assert not job.running and not d._tests


def test_dialog_test_sends_the_api_key(
    qtbot: QtBot, dialog: ConnectionsDialog, model_path: Path, tmp_path: Path
) -> None:
    with running_llama_server(
        model_path, tmp_path / "srv", n_ctx=512, extra=["--api-key", SECRET]
    ) as server:
        d = dialog
        d.add_button.click()
        fill(d, "Keyed", server.url, key="wrong")
        d.test_button.click()
        qtbot.waitUntil(lambda: not d.test_result.text().startswith("Testing"), timeout=20_000)
        assert "refused the API key" in d.test_result.text(), d.test_result.text()
        d.key_edit.setText(SECRET)
        d.test_button.click()
        qtbot.waitUntil(lambda: not d.test_result.text().startswith("Testing"), timeout=20_000)
        assert d.test_result.text().startswith("Connected: llama-server"), d.test_result.text()
