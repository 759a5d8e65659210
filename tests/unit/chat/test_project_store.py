"""Projects on disk (issue 44): round trips, repairs, damaged files set aside with a note,
hostile files fuzzed; and a chat's link to its project (``Conversation.project_id``)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chat import projects as projects_module
from app.chat.conversation import Conversation, ConversationError, Message, new_id
from app.chat.doc_refs import MAX_COLLECTIONS
from app.chat.projects import (
    DESCRIPTION_MAX,
    INSTRUCTIONS_MAX,
    MAX_DEPTH,
    MAX_PINNED,
    MAX_TOOLS,
    NAME_MAX,
    SCHEMA_DEPTH_MAX,
    UNNAMED,
    Project,
    ProjectError,
    ProjectStore,
    name_problem,
)
from app.chat.snapshot import MAX_LORA, is_lora
from app.chat.store import ConversationStore
from app.chat.stored_fields import LATEST_TIME
from app.config.presets import NAME_CHARS
from app.documents.sources import Source, source_from_dict
from app.util.datafiles import parse_json
from tests.conftest import make_unreadable
from tests.hostile_json import VALUES, mutated, one_line, timed, tree
from tests.hypothesis_budget import examples

FUZZ = settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
NOTES = "Résumé of the plan — “ünïcode” 😀\n\nLine two."


def pinned(path: str = "/docs/plan.md", text: str = NOTES, n: int = 1) -> dict[str, Any]:
    source = Source(n, path, Path(path).name, text, whole=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return {
        **source.to_dict(),
        "stamp": [len(text.encode()), 1_700_000_000_123_456_789],
        "sha256": digest,
    }


def full_project(name: str = "Tax 2025") -> Project:
    """A project with every field set, as the app would write it."""
    return Project(
        name=name,
        instructions="You help with taxes.\nBe exact.",
        pinned=[pinned(), pinned("/docs/rules.txt", "Rule 1.", 2)],
        collections=["Receipts", "Letters"],
        model={"path": "/models/tiny.gguf", "name": "tiny.gguf", "size": 123_456},
        preset="Precise",
        lora=[
            {
                "name": "style.gguf",
                "path": "/loras/style.gguf",
                "size": 1000,
                "sha256": "ab" * 32,
                "scale": 0.8,
                "enabled": True,
            }
        ],
        mcp_tools=["read_file", "files__search"],
        tool_specs=[
            {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string", "enum": ["a", "b"]}},
                    "required": ["path"],
                },
            }
        ],
        api=True,
    )


@pytest.fixture()
def store(tmp_path: Path) -> ProjectStore:
    return ProjectStore(tmp_path / "data")


# -- records ---------------------------------------------------------------------------------


def test_a_project_round_trips_through_json() -> None:
    project = full_project()
    data = json.loads(json.dumps(project.to_dict()))
    assert data["format"] == 1
    assert Project.from_dict(data) == project


def test_a_file_without_the_optional_fields_loads_with_their_defaults() -> None:
    project = Project.from_dict({"format": 1, "id": "abc123", "name": "Bare"}, fallback_time=5.0)
    assert project == Project(id="abc123", name="Bare", created=5.0, updated=5.0)


def test_unknown_fields_are_ignored() -> None:
    project = full_project()
    assert Project.from_dict({**project.to_dict(), "later": {"x": 1}}) == project


@pytest.mark.parametrize(
    ("data", "damaged"),
    [
        ([], True),
        ({"id": "abc"}, True),  # no format
        ({"format": 1, "id": "../x"}, True),
        ({"format": 1}, True),
        ({"format": True, "id": "abc"}, True),
        ({"format": 2, "id": "abc"}, False),  # a newer Lamplight's: kept as it is
    ],
)
def test_structure_is_refused(data: Any, damaged: bool) -> None:
    with pytest.raises(ProjectError) as caught:
        Project.from_dict(data, where="p.json")
    assert caught.value.damaged is damaged
    assert str(caught.value).startswith("p.json: ")
    one_line(str(caught.value))


def test_odd_values_are_repaired_or_dropped() -> None:
    deep: Any = {"type": "object"}
    for _ in range(SCHEMA_DEPTH_MAX):
        deep = {"properties": deep}
    spec = full_project().tool_specs[0]
    data = {
        "format": 1,
        "id": "abc",
        "name": "Tax\x00 \n 2025" + "x" * 200,
        "created": math.nan,
        "updated": 1e20,
        "instructions": "i" * (INSTRUCTIONS_MAX + 5),
        "pinned": [
            pinned(),
            pinned(),  # the same file again
            {**pinned("/docs/part.md"), "whole": False},  # a passage, not a document
            {**pinned("/docs/odd.md"), "stamp": [-1, 2], "sha256": "XYZ"},
            "not a source",
        ],
        "collections": ["ok", 3, "", "ok"],
        "model": {"path": "/m.gguf", "size": 10},
        "preset": "Pre\x07cise",
        "lora": [
            full_project().lora[0],
            {"path": "", "scale": 1.0},
            {"path": "/a", "scale": math.inf},
        ],
        "mcp_tools": ["ok", "ok", "bad name", "", 5, "x" * 65],
        "tool_specs": [
            spec,
            spec,  # the same name again
            {**spec, "name": "deep", "parameters": deep},
            {**spec, "name": "nan", "parameters": {"default": math.nan}},
            {**spec, "name": "big", "parameters": {"d": "x" * 70_000}},
            {**spec, "name": "list", "parameters": []},
            {"name": "bare", "parameters": {}, "description": 3},
            {**spec, "name": "long", "description": "d" * (DESCRIPTION_MAX + 1)},
        ],
        "api": "yes",
    }
    project = Project.from_dict(data, fallback_time=100.0)
    assert project.name == "Tax 2025" + "x" * (NAME_MAX - 8) and not name_problem(project.name)
    assert project.created == 100.0 and project.updated == 100.0
    assert len(project.instructions) == INSTRUCTIONS_MAX
    assert [p["path"] for p in project.pinned] == ["/docs/plan.md", "/docs/odd.md"]
    assert [p["n"] for p in project.pinned] == [1, 2]
    assert project.pinned[1]["stamp"] == [] and project.pinned[1]["sha256"] == ""
    assert project.pinned[0]["stamp"] == pinned()["stamp"]
    assert project.collections == ["ok"]
    assert project.model == {"path": "/m.gguf", "name": "m.gguf", "size": 10}
    assert project.preset == ""
    assert project.lora == full_project().lora
    assert project.mcp_tools == ["ok"]
    assert [s["name"] for s in project.tool_specs] == ["read_file", "bare", "long"]
    assert project.tool_specs[1] == {"name": "bare", "description": "", "parameters": {}}
    assert len(project.tool_specs[2]["description"]) == DESCRIPTION_MAX
    assert project.api is False


@pytest.mark.parametrize(
    ("name", "read"),
    [
        (None, UNNAMED),
        (7, UNNAMED),
        ("", UNNAMED),
        ("\x01\t", UNNAMED),
        ("  Spaced  out ", "  Spaced  out "),
    ],
)
def test_a_name_is_kept_when_usable_else_cleaned(name: Any, read: str) -> None:
    assert Project.from_dict({"format": 1, "id": "abc", "name": name}).name == read


def test_a_schema_at_the_depth_limit_is_kept() -> None:
    deep: Any = {}
    for _ in range(SCHEMA_DEPTH_MAX - 1):
        deep = {"p": deep}
    spec = {"name": "t", "description": "", "parameters": deep}
    data = {"format": 1, "id": "abc", "name": "n", "tool_specs": [spec]}
    assert Project.from_dict(data).tool_specs == [spec]


@pytest.mark.parametrize(
    ("model", "kept"),
    [
        ({"connection": "home-server_1"}, {"connection": "home-server_1"}),
        ({"connection": "bad id!"}, {}),
        (
            {"path": "C:\\models\\m.gguf", "size": 5},
            {"path": "C:\\models\\m.gguf", "name": "m.gguf", "size": 5},
        ),
        ({"path": "/m.gguf", "size": -1}, {}),
        ({"path": "/m.gguf", "size": True}, {}),
        ({"path": "/m\x00.gguf", "size": 1}, {}),
        ({"name": "m.gguf", "size": 1}, {}),
        ([], {}),
    ],
)
def test_the_model_is_a_file_with_its_size_or_a_connection(model: Any, kept: Any) -> None:
    data = {"format": 1, "id": "abc", "name": "n", "model": model}
    assert Project.from_dict(data).model == kept


def test_lists_are_bounded() -> None:
    many = [pinned(f"/d/{i}.md") for i in range(MAX_PINNED + 3)]
    data = {
        "format": 1,
        "id": "abc",
        "name": "n",
        "pinned": many,
        "mcp_tools": [f"t{i}" for i in range(MAX_TOOLS + 3)],
        "lora": [{**full_project().lora[0], "path": f"/l{i}"} for i in range(MAX_LORA + 3)],
    }
    project = Project.from_dict(data)
    assert len(project.pinned) == MAX_PINNED
    assert len(project.mcp_tools) == MAX_TOOLS
    assert len(project.lora) == MAX_LORA


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("Tax", True),
        ("", False),
        ("   ", False),
        ("x" * 81, False),
        ("a\tb", False),
        ("x" * 80, True),
    ],
)
def test_name_problem(name: str, ok: bool) -> None:
    assert (name_problem(name) == "") is ok


# -- the store -------------------------------------------------------------------------------


def test_save_list_load_delete(store: ProjectStore) -> None:
    b, a, c = full_project("beta"), full_project("Alpha"), full_project("gamma")
    for p in (b, a, c):
        store.save(p)
    assert store.path(a.id) == store.folder / f"{a.id}.json"
    assert [r.name for r in store.list()] == ["Alpha", "beta", "gamma"]
    assert all(r.api and r.error == "" for r in store.list())
    loaded = store.load(a.id)
    assert loaded == a
    loaded.pinned.clear()  # a copy: the store's is unchanged
    assert store.load(a.id) == a
    store.delete(b.id)
    store.delete(b.id)  # twice: nothing to do
    assert [r.id for r in store.list()] == [a.id, c.id]
    with pytest.raises(ProjectError, match="no such project") as caught:
        store.load(b.id)
    assert not caught.value.damaged
    assert store.take_notes() == []


def test_save_refuses_what_it_could_not_read_back(store: ProjectStore) -> None:
    with pytest.raises(ProjectError, match="needs a name"):
        store.save(Project(name=" "))
    with pytest.raises(ProjectError, match="invalid project id"):
        store.save(Project(id="../evil", name="x"))
    with pytest.raises(ProjectError, match="as JSON"):
        store.save(Project(name="x", tool_specs=[{"parameters": {"a": math.nan}}]))
    assert list(store.folder.iterdir()) == []


def test_save_stamps_the_time_and_a_changed_file_is_read_again(store: ProjectStore) -> None:
    project = full_project()
    project.updated = 0.0
    store.save(project)
    assert project.updated > 0 and store.load(project.id).updated == project.updated
    data = json.loads(store.path(project.id).read_text())
    data["name"] = "Renamed elsewhere"
    store.path(project.id).write_text(json.dumps(data) + " " * 7)  # another size
    assert [r.name for r in store.list()] == ["Renamed elsewhere"]


def test_rows_are_read_again_only_when_the_file_changed(
    store: ProjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = full_project()
    store.save(project)
    store.list()
    reads: list[Path] = []
    real = projects_module._read

    def counting(path: Path, project_id: str) -> Project:
        reads.append(path)
        return real(path, project_id)

    monkeypatch.setattr(projects_module, "_read", counting)
    store.list()
    store.load(project.id)
    assert reads == []
    stat = store.path(project.id).stat()
    os.utime(store.path(project.id), ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    store.list()
    assert reads == [store.path(project.id)]


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b"[]", b'{"format": 1, "id": "0"}', "\ufeff{".encode(), b"\xff\xfe{"],
    ids=["empty", "cut", "list", "other id", "bom", "utf16"],
)
def test_a_damaged_file_is_set_aside_with_a_note(store: ProjectStore, content: bytes) -> None:
    good = full_project()
    store.save(good)
    bad = store.folder / "abc123.json"
    bad.write_bytes(content)
    assert [r.id for r in store.list()] == [good.id]
    [note] = store.take_notes()
    one_line(note)
    assert note.startswith("abc123.json") and "set aside as abc123.json.bad" in note
    assert (store.folder / "abc123.json.bad").read_bytes() == content and not bad.exists()
    assert [r.id for r in store.list()] == [good.id] and store.take_notes() == []


def test_a_file_that_may_be_fine_stays_and_is_listed_with_the_reason(
    store: ProjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    newer = store.folder / "newer1.json"
    newer.write_text(json.dumps({"format": 9, "id": "newer1", "name": "Later"}))
    locked = full_project("Locked")
    store.save(locked)
    make_unreadable(store.path(locked.id), monkeypatch)
    rows = {r.id: r for r in store.list()}
    assert "newer Lamplight" in rows["newer1"].error
    assert "could not be read" in rows[locked.id].error
    for row in rows.values():
        one_line(row.error)
    assert store.take_notes() == [] and newer.exists() and store.path(locked.id).exists()
    with pytest.raises(ProjectError) as caught:
        store.load("newer1")
    assert not caught.value.damaged


def test_a_file_that_cannot_be_set_aside_is_listed_once_with_the_reason(
    store: ProjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    (store.folder / "abc.json").write_text("{")

    def refuse(path: Path, copy: bool = False) -> Path:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("app.chat.stored_files.set_aside", refuse)
    [row] = store.list()
    assert row.id == "abc" and "not valid JSON" in row.error
    [note] = store.take_notes()
    assert "could not be set aside (permission denied)" in note
    assert [r.id for r in store.list()] == ["abc"] and store.take_notes() == []


def test_strays_are_not_projects(store: ProjectStore) -> None:
    (store.folder / "not-an-id.json").write_text("{")
    (store.folder / "abc.txt").write_text("{")
    (store.folder / "dir1.json").mkdir()
    assert store.list() == []
    [note] = store.take_notes()  # a folder where a project belongs is damaged
    assert note.startswith("dir1.json")


def test_a_file_in_the_projects_folders_place_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / "projects").write_text("a file")
    store = ProjectStore(tmp_path)
    assert store.folder.is_dir() and (tmp_path / "projects.bad").read_text() == "a file"
    assert len(store.take_notes()) == 1


# -- chats in projects -----------------------------------------------------------------------


def old_transcript() -> dict[str, Any]:
    """A transcript as Lamplight wrote it before projects."""
    conv = Conversation(title="Old", system_prompt="Be brief.")
    conv.messages = [Message("user", "hi"), Message("assistant", "hello")]
    data = conv.to_dict()
    assert "project_id" not in data
    return data


def test_an_old_transcript_loads_unchanged() -> None:
    data = old_transcript()
    conv = Conversation.from_dict(json.loads(json.dumps(data)))
    assert conv.project_id == "" and conv.to_dict() == data


@pytest.mark.parametrize("value", ["", "../x", 5, None, ["a"], "x" * 129])
def test_a_bad_project_link_is_dropped(value: Any) -> None:
    conv = Conversation.from_dict({**old_transcript(), "project_id": value})
    assert conv.project_id == "" and "project_id" not in conv.to_dict()


def test_set_project_round_trip(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "data")
    conv = Conversation(messages=[Message("user", "hi")])
    store.save(conv)
    project_id = new_id()
    moved = store.set_project(conv.id, project_id)
    assert moved.project_id == project_id and store.load(conv.id).project_id == project_id
    assert store.summary(conv.id).project_id == project_id
    store._summaries.clear()  # read back from the file
    assert [r.project_id for r in store.list()] == [project_id]
    store.set_project(conv.id, "")
    assert store.load(conv.id).project_id == "" and store.summary(conv.id).project_id == ""
    assert "project_id" not in json.loads(store.transcript_path(conv.id).read_text())
    with pytest.raises(ConversationError, match="invalid project id"):
        store.set_project(conv.id, "../x")
    with pytest.raises(ConversationError, match="no such conversation"):
        store.set_project(new_id(), project_id)


def test_an_imported_chat_joins_no_project(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "data")
    shared = {**old_transcript(), "project_id": new_id()}
    assert store.import_json(json.dumps(shared)).project_id == ""
    [row] = store.list()
    assert row.project_id == "" and store.load(row.id).project_id == ""


# -- hostile files ---------------------------------------------------------------------------


def sane(project: Project) -> None:
    """Every value is within its bounds, and reading it again changes nothing."""
    assert name_problem(project.name) == ""
    for when in (project.created, project.updated):
        assert 0 <= when <= LATEST_TIME
    assert len(project.instructions) <= INSTRUCTIONS_MAX
    assert len(project.pinned) <= MAX_PINNED
    for entry in project.pinned:
        source = source_from_dict(entry)
        assert source is not None and source.whole
    assert len(project.collections) <= MAX_COLLECTIONS
    assert set(project.model) in (set(), {"connection"}, {"path", "name", "size"})
    assert len(project.preset) <= NAME_CHARS
    assert len(project.lora) <= MAX_LORA and all(map(is_lora, project.lora))
    assert len(project.mcp_tools) <= MAX_TOOLS and len(project.tool_specs) <= MAX_TOOLS
    assert isinstance(project.api, bool)
    text = json.dumps(project.to_dict(), ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")  # no lone surrogates
    assert Project.from_dict(json.loads(text)) == project


@pytest.fixture()
def project_dir(tmp_path: Path) -> tuple[ProjectStore, list[Project], Path]:
    """A data dir with three saved projects, and a file outside it."""
    base = tmp_path / "base"
    store = ProjectStore(base / "data")
    projects = [full_project(f"Project {i}") for i in range(3)]
    for project in projects:
        store.save(project)
    (base / "outside").mkdir()
    (base / "outside" / "keep.txt").write_text("not the app's")
    return store, projects, base


@FUZZ
@given(data=st.data())
def test_fuzz_project_files(
    project_dir: tuple[ProjectStore, list[Project], Path], data: st.DataObject
) -> None:
    """A mutated project file loads with sane values, is listed with a reason, or is set
    aside with a one-line note; the others load unchanged and nothing else moves."""
    store, projects, base = project_dir
    target = store.path(projects[0].id)
    for stray in target.parent.glob("*.bad"):
        stray.unlink()
    target.write_bytes(data.draw(mutated(json.dumps(projects[0].to_dict(), indent=1).encode())))
    store._read.clear()  # a rewrite within one clock tick keeps the stamp
    before = tree(base)
    rows = {r.id: r for r in timed(store.list)}
    notes = store.take_notes()
    after = tree(base)
    for other in projects[1:]:
        assert rows[other.id].error == "" and store.load(other.id) == other
    rel = str(target.relative_to(base))
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    row = rows.get(target.stem)
    if row is None:
        [note] = notes
        one_line(note)
        assert changed == {rel, rel + ".bad"}
    else:
        assert notes == [] and changed == set()
        if row.error:
            one_line(row.error)
        else:
            sane(store.load(target.stem))
    assert sorted(os.listdir(base)) == ["data", "outside"]


@FUZZ
@given(value=VALUES, key=st.sampled_from(["format", *sorted(Project.__dataclass_fields__)]))
def test_fuzz_project_fields(value: Any, key: str) -> None:
    """Any JSON value in any field: a sane project, or refused in one line (read as a
    file is: lone surrogates are gone before ``from_dict``)."""
    data = parse_json(json.dumps({**full_project().to_dict(), key: value}), MAX_DEPTH)
    try:
        project = Project.from_dict(data, where="p.json")
    except ProjectError as exc:
        one_line(str(exc))
        assert key in ("format", "id")
    else:
        sane(project)
