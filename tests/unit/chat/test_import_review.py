"""An imported conversation reaches nothing outside itself on its own (issue 40, item 3):
its documents, collections, draft model and tool settings are held back by the import
and come back only when the user confirms them (``app.chat.import_review``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chat.conversation import Conversation, ConversationError
from app.chat.import_review import HeldBack, hold_back, restore
from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.config.params import validate_sampling
from app.config.setting_records import SamplingParams
from tests.gui.test_alternatives import StubLink, StubView
from tests.hypothesis_budget import examples

SECRET = "/home/someone/.config/gh/hosts.yml"


def shared_chat(**fields: Any) -> dict[str, Any]:
    """A chat file as someone else would share it."""
    data = Conversation(title="Shared").to_dict()
    data["messages"] = [
        {"role": "user", "content": "What is in my config?"},
        {"role": "assistant", "content": "Let me look."},
    ]
    data.update(fields)
    return data


HOSTILE = shared_chat(
    documents=[SECRET, "relative/notes.md"],
    collections=["work"],
    draft_path="/home/someone/models/draft.gguf",
    sampling={"temperature": 0.2, "tools": "required", "tool_rounds": 3},
)


def test_an_import_opens_without_what_it_names_on_this_computer(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "data")
    source = tmp_path / "shared.json"
    source.write_text(json.dumps(HOSTILE))
    conv, held = store.import_reviewed(source)
    for seen in (conv, store.load(conv.id)):  # in memory and as saved
        assert seen.documents == [] and seen.collections == [] and seen.draft_path == ""
        assert seen.sampling is not None
        params = validate_sampling(seen.sampling)
        assert params.tools == "off" and params.temperature == 0.2
    assert held.documents == (SECRET, "relative/notes.md")
    assert held.collections == ("work",)
    assert held.draft_path == "/home/someone/models/draft.gguf"
    lines = held.lines()
    assert f"Document: {SECRET}" in lines and "Collection of yours: work" in lines
    assert any("draft.gguf" in line for line in lines)
    assert any(line.startswith("Tools:") and "required" in line for line in lines)
    # Confirmed: everything comes back as the file had it.
    restore(conv, held)
    store.save(conv)
    back = store.load(conv.id)
    assert back.documents == [SECRET, "relative/notes.md"] and back.collections == ["work"]
    assert back.draft_path == "/home/someone/models/draft.gguf"
    assert back.sampling is not None
    params = validate_sampling(back.sampling)
    assert (params.tools, params.tool_rounds, params.temperature) == ("required", 3, 0.2)


def test_every_import_path_drops_them_and_the_session_never_sees_them(tmp_path: Path) -> None:
    """``import_json`` and ``import_file`` keep nothing back for later: the chat is opened
    (``ChatSession.open``, as the window does) with no documents, and tools off."""
    store = ConversationStore(tmp_path / "data")
    source = tmp_path / "shared.json"
    source.write_text(json.dumps(HOSTILE))
    session = ChatSession(store, StubLink(), StubView())
    for conv in (store.import_json(json.dumps(HOSTILE)), store.import_file(source)):
        session.open(conv.id)
        opened = session.conversation
        assert opened.id == conv.id
        assert (opened.documents, opened.collections, opened.draft_path) == ([], [], "")
        assert opened.sampling is not None and opened.sampling["tools"] == "off"


def test_nothing_is_held_when_there_is_nothing_to_hold(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "data")
    plain = shared_chat(sampling={"tools": "off", "tool_rounds": 2})
    source = tmp_path / "plain.json"
    source.write_text(json.dumps(plain))
    conv, held = store.import_reviewed(source)
    assert not held and held.lines() == []
    assert conv.sampling == {"tools": "off", "tool_rounds": 2}
    # No settings at all: the user's own are used, nothing to ask about.
    source.write_text(json.dumps(shared_chat()))
    assert not store.import_reviewed(source)[1]


def test_a_chat_without_a_tools_setting_gets_tools_off() -> None:
    """A missing ``tools`` reads as the default ("auto": tools offered), so it is held."""
    conv = Conversation.from_dict(shared_chat(sampling={"top_k": 5}))
    held = hold_back(conv)
    assert held.tools == {} and conv.sampling == {"top_k": 5, "tools": "off"}
    restore(conv, held)
    assert conv.sampling == {"top_k": 5}
    assert validate_sampling(conv.sampling).tools == SamplingParams().tools


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_PATHS = st.lists(st.sampled_from([SECRET, "~/.ssh/id_rsa", "C:\\Users\\x\\a.txt", ""]) | _VALUES)


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    documents=_PATHS | _VALUES,
    collections=_PATHS | _VALUES,
    draft=st.sampled_from(["/m/draft.gguf", ""]) | _VALUES,
    sampling=st.dictionaries(
        st.sampled_from(["tools", "tool_rounds", "tool_timeout_s", "top_k", "x"]),
        st.sampled_from(["off", "auto", "required", 3, -1]) | _VALUES,
        max_size=5,
    )
    | _VALUES,
)
def test_fuzz_imported_fields_never_reach_the_opened_chat(
    tmp_path_factory: pytest.TempPathFactory,
    documents: Any,
    collections: Any,
    draft: Any,
    sampling: Any,
) -> None:
    store = ConversationStore(tmp_path_factory.mktemp("data"))
    data = shared_chat(
        documents=documents, collections=collections, draft_path=draft, sampling=sampling
    )
    try:
        expected = Conversation.from_dict(json.loads(json.dumps(data)))
        conv = store.import_json(json.dumps(data))
    except ConversationError:
        return
    saved = store.load(conv.id)
    assert (saved.documents, saved.collections, saved.draft_path) == ([], [], "")
    if saved.sampling is not None:
        assert saved.sampling.get("tools") == "off"
    # What was held is what the file had, and restoring gives the file's values back.
    again = Conversation.from_dict(json.loads(json.dumps(data)))
    held = hold_back(again)
    assert isinstance(held, HeldBack)
    assert list(held.documents) == expected.documents
    assert list(held.collections) == expected.collections
    restore(again, held)
    assert again.documents == expected.documents and again.collections == expected.collections
    assert again.draft_path == expected.draft_path and again.sampling == expected.sampling
