"""Compaction through the remote backends (issue 45), on a real llama-server. Its own: the
summary is written on a fork (the slot saved to a file of its own and restored after),
the compacted chat goes on (read once, then only new turns), and Undo restores the slot
from the undo snapshot: the next message reads only itself. As an OpenAI-compatible
server: the same steps, the server keeping its cache."""

from __future__ import annotations

from pathlib import Path

from app.config.setting_records import LoadConfig
from app.remote.connection import Connection
from app.remote.llama_server.backend import LlamaServerBackend
from app.remote.openai.backend import OpenAIBackend
from tests.model.test_compaction_real import GREEDY, say, session_on
from tests.server_fixture import RunningServer


def test_a_chat_on_llama_server_compacts_and_undoes(
    llama_server: RunningServer, tmp_path: Path
) -> None:
    backend = LlamaServerBackend(Connection("c45", "test server", "llama-server", llama_server.url))
    backend.load("", LoadConfig())
    try:
        session, link, view = session_on(backend, tmp_path)
        for i in range(4):
            say(session, link, f"Port {i} has a red lighthouse and a ferry. Tell me about it.")
        before = list(backend._slot.map.tokens)
        assert session.compact(GREEDY) == "", view.notices
        link.deliver()
        assert session.conversation.active_summary() is not None, view.notices
        assert "failed" not in " ".join(view.notices)
        # The server reads the compacted chat once (with the next message: it shares only
        # the system prompt's start with the slot), then each turn reads only itself.
        say(session, link, "And the ferry?")
        done = say(session, link, "And the lighthouse?")
        assert done.metrics.cached_tokens > 0 and done.metrics.evaluated_tokens <= 24, done
        assert session.undo_compaction() and link.undone
        assert list(backend._slot.map.tokens) == before
        after = say(session, link, "Which port was first?")
        assert after.metrics.cached_tokens >= len(before) - 1, after.metrics
    finally:
        backend.unload()


def test_a_chat_on_an_openai_compatible_server_compacts_and_undoes(
    llama_server: RunningServer, tmp_path: Path
) -> None:
    """The server keeps its own cache: the summary is asked for like a reply, the chat
    compacts, Undo brings the messages back (the server reads them again)."""
    backend = OpenAIBackend(Connection("c45o", "test /v1", "openai", llama_server.url))
    backend.load("", LoadConfig())
    try:
        session, link, view = session_on(backend, tmp_path)
        for i in range(4):
            say(session, link, f"Port {i} has a red lighthouse and a ferry. Tell me about it.")
        ids = [m.id for m in session.conversation.messages]
        assert session.compact(GREEDY) == "", view.notices
        link.deliver()
        assert session.conversation.active_summary() is not None, view.notices
        sent = link.jobs[-1].messages
        assert sent[-1].role == "user" and "summary" in sent[-1].content.lower()
        done = say(session, link, "And the ferry?")
        assert "Summary of the earlier conversation" in link.jobs[-1].messages[0].content
        assert done.text is not None
        assert session.undo_compaction() and not link.undone  # nothing of the cache to load
        assert [m.id for m in session.conversation.messages][: len(ids)] == ids
    finally:
        backend.unload()
