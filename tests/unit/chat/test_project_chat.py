"""A new chat in a project (issue 44): it starts from the project's instructions and
pinned documents, names the project, and its first reply asks the engine to start from
the project's opening; later replies and chats outside a project do not."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.chat.conversation import Conversation, Message
from app.chat.project_chat import offered_tools, opening_request, stored_tools, system_text
from app.chat.projects import Project
from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.chat.tool_round import tool_request
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics
from app.mcp.tool_host import McpTool
from tests.fakes.mcp import FakeMcpHost, ready, tool

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


# -- the project's tools -------------------------------------------------------------

WEATHER = tool("sea", "weather", "Weather at sea.", place="string")
TIDES = tool("sea", "tides", "Tide table.", port="string")
MAIL = tool("post", "mail", "Sends mail.", to="string")
LISTED = [MAIL, WEATHER, TIDES]


def spec_of(t: McpTool) -> dict[str, Any]:
    s = t.spec()
    return {"name": s.name, "description": s.description, "parameters": dict(s.parameters)}


def chose(*tools: McpTool) -> Project:
    return Project(
        name="Harbour",
        instructions="Answer as the harbour master.",
        mcp_tools=[t.qualified for t in tools],
        tool_specs=[spec_of(t) for t in tools],
    )


def test_a_project_offers_only_its_tools_in_its_order() -> None:
    offered, missing = offered_tools(chose(TIDES, WEATHER), LISTED)
    assert [t.name for t in offered] == ["tides", "weather"] and missing == []
    offered, missing = offered_tools(chose(TIDES, tool("gone", "radar")), LISTED)
    assert [t.name for t in offered] == ["tides"] and missing == ["radar"]
    # None chosen: every listed tool, by name; no project: as listed.
    assert [t.name for t in offered_tools(chose(), LISTED)[0]] == ["mail", "tides", "weather"]
    assert offered_tools(None, LISTED) == (LISTED, [])


def test_the_opening_is_read_with_the_tools_its_first_round_offers() -> None:
    project = chose(TIDES, WEATHER)
    got = opening_request(project, [MAIL.spec()], SamplingParams())
    assert got == tool_request([TIDES, WEATHER], 0, SamplingParams())  # as the chat asks
    assert stored_tools(project) == (TIDES.spec(), WEATHER.spec())
    required = SamplingParams(tools="required")
    assert opening_request(project, [], required) == tool_request([TIDES, WEATHER], 0, required)
    assert opening_request(project, [], SamplingParams(tools="off")) is None
    app_tools = [WEATHER.spec(), MAIL.spec()]  # none chosen: the app's, by name
    assert opening_request(chose(), app_tools, SamplingParams()) == tool_request(
        [MAIL, WEATHER], 0, SamplingParams()
    )
    assert opening_request(chose(), [], SamplingParams()) is None


def asked(link: Link, n: int) -> None:
    """Wait for the ``n``-th reply to be asked for (the tools are listed on a thread)."""
    deadline = time.monotonic() + 10
    while len(link.calls) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(link.calls) == n


class Notices(View):
    def __init__(self) -> None:
        self.notices: list[str] = []

    def notice(self, text: str) -> None:
        self.notices.append(text)


def test_a_chat_in_a_project_is_offered_its_tools_and_told_of_missing_ones(
    tmp_path: Path,
) -> None:
    host = FakeMcpHost([ready("sea", WEATHER, TIDES), ready("post", MAIL)])
    link, view = Link(), Notices()
    session = ChatSession(ConversationStore(tmp_path), link, view, tool_host=host)
    project = chose(TIDES, tool("gone", "radar"))
    session.project_of = {project.id: project}.get
    session.new_chat(project)
    assert session.send("When is high water?", SamplingParams())
    asked(link, 1)
    kw = link.calls[-1][1]
    assert [t.name for t in kw["tools"].tools] == ["tides"]
    assert kw["prefix"] == project.id
    assert view.notices == [
        "Not offered now: radar of Harbour (switched off in Tools, or its server is not running)."
    ]
    session.on_finished(1, "At six.", MessageMetrics(), "")
    assert session.send("And tomorrow?", SamplingParams())
    asked(link, 2)
    assert [t.name for t in link.calls[-1][1]["tools"].tools] == ["tides"]
    assert len(view.notices) == 1  # said once per chat
    session.on_finished(2, "At seven.", MessageMetrics(), "")
    session.new_chat()  # outside the project: every tool switched on
    assert session.send("Hi", SamplingParams())
    asked(link, 3)
    assert [t.name for t in link.calls[-1][1]["tools"].tools] == ["weather", "tides", "mail"]
