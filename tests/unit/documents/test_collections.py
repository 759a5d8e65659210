"""Collections: round trip, names, and a hostile collections.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.documents.collections import MAX_COLLECTIONS, Collections
from app.util.errors import DocumentError
from tests.hypothesis_budget import examples


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "collections.json"
    c = Collections(path)
    assert c.names() == [] and c.paths("none") == []
    c.save("Tax 2025", ["/a/x.pdf", "/a/y.txt", "/a/x.pdf"])
    c.save("notes", ["/b/n.md"])
    again = Collections(path)
    assert again.names() == ["notes", "Tax 2025"]
    assert again.paths("Tax 2025") == ["/a/x.pdf", "/a/y.txt"]
    again.rename("notes", "Notes 2")
    again.delete("Tax 2025")
    again.delete("missing")
    third = Collections(path)
    assert third.names() == ["Notes 2"] and third.paths("Notes 2") == ["/b/n.md"]
    assert json.loads(path.read_text())["version"] == 1
    assert third.take_notes() == []


@pytest.mark.parametrize("name", ["", "   ", "x" * 81, "bad\nname", "tab\there"])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    c = Collections(tmp_path / "collections.json")
    with pytest.raises(DocumentError):
        c.save(name, [])
    c.save("ok", [])
    with pytest.raises(DocumentError):
        c.rename("ok", name)


def test_rename_conflicts_and_limits(tmp_path: Path) -> None:
    c = Collections(tmp_path / "collections.json")
    c.save("a", [])
    c.save("b", [])
    with pytest.raises(DocumentError):
        c.rename("a", "b")
    with pytest.raises(DocumentError):
        c.rename("zzz", "c")
    for i in range(MAX_COLLECTIONS - 2):
        c.save(f"c{i}", [])
    with pytest.raises(DocumentError):
        c.save("one too many", [])
    c.save("a", ["/replaced"])  # replacing is fine at the limit


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xff garbage",
        b"[]",
        b'{"version": 2, "collections": {}}',
        b'{"version": 1}',
        b"[" * 5000,
    ],
)
def test_a_bad_file_is_set_aside_with_a_note(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "collections.json"
    path.write_bytes(content)
    c = Collections(path)
    assert c.names() == []
    notes = c.take_notes()
    assert len(notes) == 1 and "set aside" in notes[0]
    assert (tmp_path / "collections.json.bad").read_bytes() == content
    c.save("fresh", [])
    assert Collections(path).names() == ["fresh"]


def test_a_directory_in_its_place_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / "collections.json").mkdir()
    c = Collections(tmp_path / "collections.json")
    assert c.take_notes() and (tmp_path / "collections.json.bad").is_dir()


def test_bad_entries_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "collections.json"
    data = {
        "version": 1,
        "collections": {
            "good": ["/p", 3, None, "/q", "/p"],
            "bad\u0007": ["/x"],
            "notlist": "/y",
            "": [],
        },
    }
    path.write_text(json.dumps(data))
    c = Collections(path)
    assert c.names() == ["good"] and c.paths("good") == ["/p", "/q"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(_json)
def test_hostile_json_never_raises(tmp_path: Path, value: object) -> None:
    path = tmp_path / "collections.json"
    for wrapped in (value, {"version": 1, "collections": value}):
        path.write_text(json.dumps(wrapped))
        c = Collections(path)
        for name in c.names():
            assert all(isinstance(p, str) for p in c.paths(name))
        for bad in tmp_path.glob("*.bad"):
            bad.unlink()
