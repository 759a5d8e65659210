"""A new chat in a project (issue 44): it starts from the project's instructions and
pinned documents, names the project, and its first reply asks the engine to start from
the project's opening; later replies and chats outside a project do not."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.chat.conversation import Conversation, Message
from app.chat.project_chat import system_text
from app.chat.projects import Project
from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics

P = SamplingParams(tools="off")


class Link:
    def __init__(self) -> None:
        self.calls: list[tuple[list[ChatMessage], dict[str, Any]]] = []

    def generate(
        self, conv_id: str, messages: Sequence[ChatMessage], params: SamplingParams, **kw: Any
    ) -> int:
        self.calls.append((list(messages), kw))
        return len(self.calls)

    def stop(self) -> None: ...
    def reset(self) -> None: ...
    def restore_snapshot(self, conv_id: str) -> None: ...
    def drop_snapshot(self, conv_id: str) -> None: ...


class View:
    def show_conversation(self, conv: Conversation, opened: bool, restoring: bool) -> None: ...
    def reply_begun(self, shown: Sequence[Message], added_user: bool) -> None: ...
    def reply_ended(self, text: str, metrics: MessageMetrics | None, error: str) -> None: ...
    def tool_calls_changed(self, message: Message) -> None: ...
    def open_failed(self, message: str) -> None: ...
    def notice(self, text: str) -> None: ...
    def row_saved(self, conv_id: str) -> None: ...
    def row_removed(self, conv_id: str) -> None: ...


PINNED = {
    "n": 1,
    "path": "/docs/tides.md",
    "name": "tides.md",
    "text": "High water 06:12.",
    "whole": True,
}
PROJECT = Project(name="Harbour", instructions="Answer as the harbour master.", pinned=[PINNED])


def test_a_new_chat_in_a_project_starts_from_it_and_its_opening(tmp_path: Path) -> None:
    link = Link()
    session = ChatSession(ConversationStore(tmp_path), link, View())
    session.new_chat(PROJECT)
    conv = session.conversation
    assert conv.project_id == PROJECT.id
    assert conv.system_prompt == system_text(PROJECT)
    assert "Answer as the harbour master." in conv.system_prompt
    assert "tides.md" in conv.system_prompt and "High water 06:12." in conv.system_prompt
    assert session.send("When is high water?", P)
    messages, kw = link.calls[-1]
    assert [m.role for m in messages] == ["system", "user"]
    assert kw.get("prefix") == PROJECT.id  # the first reply starts from the opening
    session.on_finished(1, "At six.", MessageMetrics(), "")
    assert session.send("And low water?", P)
    assert "prefix" not in link.calls[-1][1]  # later replies extend their own cache
    saved = session.store.load(conv.id)
    assert saved.project_id == PROJECT.id and saved.system_prompt == conv.system_prompt


def test_a_chat_outside_a_project_asks_as_before(tmp_path: Path) -> None:
    link = Link()
    session = ChatSession(ConversationStore(tmp_path), link, View())
    session.new_chat()
    assert session.conversation.project_id == ""
    assert session.send("Hi", P)
    assert link.calls[-1][1] == {}
