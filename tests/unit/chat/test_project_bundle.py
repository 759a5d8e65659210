"""A project exported with its chats and imported back (issue 44, item 5): Markdown to
read, JSON to come back in as a new project whose paths, model, adapters, tools and API
reach wait for the user's yes; hostile bundles are refused with a sentence, never an
exception of another kind, and save nothing."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chat.conversation import Conversation, ConversationError, Message
from app.chat.project_bundle import export_json, export_markdown, import_bundle, restore_project
from app.chat.projects import Project, ProjectError, ProjectStore
from app.chat.store import ConversationStore
from tests.hostile_json import mutated
from tests.hypothesis_budget import examples

PINNED = {
    "n": 1,
    "path": "/home/me/tides.md",
    "name": "tides.md",
    "text": "High water 06:12.",
    "chunk": -1,
    "whole": True,  # pinned documents are given whole
    "stamp": [],
    "sha256": "",
}
PROJECT = Project(
    name="Harbour",
    instructions="Answer as the harbour master.",
    pinned=[PINNED],
    model={"path": "/models/gemma.gguf", "name": "gemma.gguf", "size": 1234},
    mcp_tools=["files_read"],
    api=True,
)


def chats() -> list[Conversation]:
    conv = Conversation(title="Tides", system_prompt="Answer as the harbour master.")
    conv.messages = [Message("user", "When is high water?"), Message("assistant", "At six.")]
    conv.documents = ["/home/me/secret.txt"]
    return [conv]


def stores(tmp_path: Path) -> tuple[ProjectStore, ConversationStore]:
    return ProjectStore(tmp_path), ConversationStore(tmp_path)


def test_export_and_import_give_a_new_project_that_waits_for_a_yes(tmp_path: Path) -> None:
    projects, store = stores(tmp_path)
    projects.save(Project(name="Harbour"))  # the name is taken here
    text = export_json(PROJECT, chats())
    got = import_bundle(text, projects, store)
    project = got.project
    assert project.id != PROJECT.id and project.name == "Harbour (2)"
    # Nothing that reaches outside: no paths, model, tools, API until confirmed.
    assert (project.pinned, project.model, project.mcp_tools, project.api) == ([], {}, [], False)
    lines = got.held.lines()
    assert "Pinned document: /home/me/tides.md" in lines
    assert "Model file: /models/gemma.gguf" in lines and any("files_read" in x for x in lines)
    assert "Reachable through the local API server" in lines
    ((conv, held),) = got.chats
    assert conv.project_id == project.id and conv.documents == []
    assert held.documents == ("/home/me/secret.txt",)
    assert store.load(conv.id).project_id == project.id
    assert projects.load(project.id).api is False  # saved without
    restore_project(project, got.held)
    assert [p["path"] for p in project.pinned] == [PINNED["path"]]
    assert project.api and project.model["size"] == 1234


def test_markdown_is_for_reading() -> None:
    text = export_markdown(PROJECT, chats())
    assert text.startswith("# Project: Harbour")
    assert "Answer as the harbour master." in text and "When is high water?" in text
    assert "tides.md" in text and "/home/me" not in text  # names, not paths


def test_what_is_not_a_project_export_is_refused(tmp_path: Path) -> None:
    projects, store = stores(tmp_path)
    for text in ("", "[]", json.dumps({"lamplight_project": 2}), json.dumps(chats()[0].to_dict())):
        try:
            import_bundle(text, projects, store)
        except ProjectError as exc:
            assert "\n" not in str(exc)
        else:
            raise AssertionError(text)
    assert projects.list() == [] and store.list() == []


RAW = export_json(PROJECT, chats()).encode("utf-8")  # once: its ids and times are fixed


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_hostile_bundles_import_or_are_refused(tmp_path: Path, data: st.DataObject) -> None:
    text = data.draw(mutated(RAW)).decode("utf-8", "replace")
    folder = tmp_path / str(data.draw(st.integers(0, 10**9)))
    projects, store = stores(folder)
    try:
        got = import_bundle(text, projects, store)
    except (ProjectError, ConversationError) as exc:
        assert "\n" not in str(exc)
        return
    assert not got.project.api and not got.project.pinned and not got.project.mcp_tools
    for conv, _held in got.chats:
        assert conv.project_id == got.project.id and not conv.documents
