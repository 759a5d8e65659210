"""A tool call from the chat, end to end on the real engine and a real MCP server
(issue 29): the default model is made to call (``tools`` "required": the grammar),
the card asks, Allow once runs the tool over stdio, and the follow-up reads only the
result before the model answers."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.chat.conversation import Message
from app.config.setting_records import SamplingParams
from app.mcp.host import McpHost
from tests.model.test_gui_real import reopen_and_send, send
from tests.real_window import real_window

SERVER = Path(__file__).resolve().parents[1] / "mcp_server.py"
# Integers keep the call short: a string's length is the model's to choose, and a base
# model of this size rambles on inside one.
OTHERS = ("echo", "slow", "crash", "spawn_child", "pid", "big", "structured", "fail", "image")


def allowed_echo_server(root: Path) -> None:
    """mcp.json with the test server, its command allowed, only ``add`` switched on."""
    root.mkdir(parents=True, exist_ok=True)
    command = {"command": sys.executable, "args": [str(SERVER), "--stdio"]}
    (root / "mcp.json").write_text(json.dumps({"mcpServers": {"test": command}}))
    host = McpHost(root)
    try:
        host.statuses()  # reads the config
        host.consent("test", host.statuses()[0].server_id)
        for name in (*OTHERS, "getenv"):
            host.set_tool_enabled("test", name, False)
    finally:
        host.close()


def calls(messages: list[Message], state: str) -> list[dict[str, object]]:
    return [c for m in messages for c in (m.tool_calls or []) if c.get("state") == state]


def test_the_model_calls_an_mcp_tool_from_the_chat(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    allowed_echo_server(tmp_path / "data")
    sampling = replace(SamplingParams.greedy(48), tools="required", tool_rounds=1)
    with real_window(qtbot, tmp_path, model_path, sampling) as win:
        session = win.session
        send(qtbot, win, "What is 2 plus 3? Use the add tool.")
        qtbot.waitUntil(lambda: bool(calls(session.conversation.messages, "ask")), timeout=120_000)
        call = calls(session.conversation.messages, "ask")[0]
        assert call["name"] == "add" and call["server"] == "test"
        args = json.loads(str(call["arguments"]))
        total = str(args["a"] + args["b"])
        assert session.decide(str(call["id"]), "once") == ""
        qtbot.waitUntil(lambda: not session.busy, timeout=120_000)
        messages = session.conversation.messages
        result = next(m for m in messages if m.role == "tool")
        assert result.content == total and not result.is_error
        assert calls(messages, "done")
        answer = messages[-1]
        assert answer.role == "assistant" and not answer.tool_calls
        metrics = answer.message_metrics()
        assert metrics is not None
        # Only the result (and the template text around it) was read for the answer.
        assert metrics.evaluated_tokens <= 40, metrics
        assert metrics.cached_tokens > 200

        # Reopened, the chat with its call and result resumes from its snapshot: the
        # next message reads only its own words.
        follow = reopen_and_send(qtbot, win, "Thanks.")
        assert follow.evaluated_tokens <= 20, follow
