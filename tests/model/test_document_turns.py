"""A user turn's passages when a send replaces it (issue 40, item 8): a message left
unanswered by a failed reply and merged with the next keeps the passages of both; an
edited message keeps the documents it had whole. On the session, then end to end with
the real document library and chat model."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.chat.doc_refs import given_whole
from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.chat.user_turn import merge_sources
from app.config.setting_records import SamplingParams
from app.documents.sources import MAX_SOURCES, Source, sources_from_list
from app.engine.metrics import MessageMetrics
from tests.hypothesis_budget import examples
from tests.unit.chat.test_image_transcript import Link, View

P = SamplingParams()


def whole(path: str, text: str) -> Source:
    return Source(1, path, Path(path).name, text, None, 1, 1, -1, True)


def passage(path: str, chunk: int, text: str) -> Source:
    return Source(1, path, Path(path).name, text, None, 1, 3, chunk, False, 0.5)


def keys(sources: list[dict[str, Any]]) -> list[tuple[str, int, bool]]:
    return [(s["path"], s["chunk"], s["whole"]) for s in sources]


@pytest.fixture()
def session(tmp_path: Path) -> ChatSession:
    return ChatSession(ConversationStore(tmp_path), Link(), View())  # type: ignore[arg-type]


def sent_text(session: ChatSession) -> str:
    link: Link = session._link  # type: ignore[assignment]
    return link.sent[-1][-1].content


def test_a_message_merged_after_a_failed_reply_keeps_the_passages_of_both(
    session: ChatSession,
) -> None:
    bread = whole("/docs/bread.md", "Bake at 240 degrees.")
    session.send("How hot is the oven?", P, sources=[bread])
    session.on_failed(session.request_id or 0, "The server closed the connection.")
    # The next message: the search knows bread.md is in the unanswered turn whole.
    assert given_whole(session.conversation.messages) == {"/docs/bread.md"}
    cat = passage("/docs/harbour.pdf", 4, "The cat is named Biscuit.")
    assert session.send("And the cat?", P, sources=[cat])
    msgs = session.conversation.messages
    assert len(msgs) == 1 and msgs[0].content == "How hot is the oven?\n\nAnd the cat?"
    assert keys(msgs[0].sources) == [("/docs/bread.md", -1, True), ("/docs/harbour.pdf", 4, False)]
    assert [s["n"] for s in msgs[0].sources] == [1, 2]
    text = sent_text(session)
    assert "Bake at 240 degrees." in text and "Biscuit" in text
    saved = session.store.load(session.conversation.id)
    assert saved.messages[0].sources == msgs[0].sources


def test_an_edited_message_keeps_the_documents_it_had_whole(session: ChatSession) -> None:
    bread = whole("/docs/bread.md", "Bake at 240 degrees.")
    old_hit = passage("/docs/harbour.pdf", 1, "Built in 1871.")
    session.send("When was it built?", P, sources=[bread, old_hit])
    session.on_finished(session.request_id or 0, "In 1871.", MessageMetrics())
    later = whole("/docs/later.md", "Given after the edited message.")
    session.send("Thanks.", P, sources=[later])
    session.on_finished(session.request_id or 0, "You're welcome.", MessageMetrics())
    assert session.begin_edit(0) == "When was it built?"
    # The search for the new text skips what the edited message holds whole, and gives
    # again what only the messages after it held.
    assert given_whole(session.conversation.messages, 0) == {"/docs/bread.md"}
    new_hit = passage("/docs/harbour.pdf", 4, "The cat is named Biscuit.")
    assert session.send("What is the cat called?", P, sources=[new_hit])
    text = sent_text(session)
    assert "Bake at 240 degrees." in text and "Biscuit" in text and "1871" not in text
    session.on_finished(session.request_id or 0, "Biscuit.", MessageMetrics())
    edited = session.conversation.messages[0]
    assert edited.content == "What is the cat called?"
    assert keys(edited.sources) == [("/docs/bread.md", -1, True), ("/docs/harbour.pdf", 4, False)]
    # With no new passages found, it keeps all it had (as before).
    assert session.begin_edit(0) is not None
    assert session.send("Again?", P)
    session.on_finished(session.request_id or 0, "Yes.", MessageMetrics())
    assert keys(session.conversation.messages[0].sources) == keys(edited.sources)


_SOURCE = st.builds(
    Source,
    n=st.integers(1, 16),
    path=st.sampled_from(["/a.md", "/b.pdf", "/c.txt"]),
    name=st.just("x"),
    text=st.text(max_size=5),
    chunk=st.integers(-1, 5),
    whole=st.booleans(),
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.lists(_SOURCE, max_size=12), max_size=3))
def test_merged_passages_are_unique_numbered_and_keep_every_whole_document(
    groups: list[list[Source]],
) -> None:
    dicts = [[s.to_dict() for s in g] for g in groups]
    merged = merge_sources(*dicts)
    back = sources_from_list(merged)
    assert len(back) == len(merged) <= MAX_SOURCES  # a transcript reads all of them back
    assert [s.n for s in back] == list(range(1, len(back) + 1))
    found = [(s.path, s.chunk, s.whole) for s in back]
    assert len(set(found)) == len(found)
    given_in = {
        (s.path, s.chunk, s.whole)
        for g in groups
        for s in sources_from_list([x.to_dict() for x in g])
    }
    whole_paths = {p for p, _c, w in given_in if w}
    assert {s.path for s in back if s.whole} == whole_paths or len(back) == MAX_SOURCES
    for key in given_in:  # each kept, or covered by its whole document, or over the cap
        assert key in found or key[0] in whole_paths or len(back) == MAX_SOURCES
    assert not any(not w and p in whole_paths for p, _c, w in found)


# -- end to end on the real engines --------------------------------------------------------


@pytest.fixture(scope="module")
def worker() -> Iterator[Any]:
    from app.engine.local.embed_worker import EmbedWorker
    from tests.embed_model import embedder_path

    w = EmbedWorker(embedder_path)
    yield w
    w.close()


def test_the_merged_turn_gives_the_model_both_documents(
    tmp_path: Path, worker: Any, engine: Any
) -> None:
    """Real library, real chat model: after a failed reply, the next message's turn holds
    the document given whole with the first and the passage found for the second."""
    from app.documents.library import DocumentLibrary
    from tests.document_files import write_pdf
    from tests.model.test_documents_real import BREAD, FACTS, ROOM, finish
    from tests.near_tie import token_text

    pdf, md = tmp_path / "harbour.pdf", tmp_path / "bread.md"
    write_pdf(pdf, FACTS)
    md.write_text(BREAD, encoding="utf-8")
    lib = DocumentLibrary(tmp_path / "data", worker)
    paths = [s.path for s in lib.add([pdf, md], lambda _p: None, threading.Event())]
    session = ChatSession(ConversationStore(tmp_path / "chats"), Link(), View())  # type: ignore[arg-type]

    q1 = "How hot is the oven?"
    first = lib.context_for(paths, q1, ROOM, given_whole(session.conversation.messages))
    assert any(s.whole and s.name == "bread.md" for s in first)
    session.send(q1, P, sources=first)
    session.on_failed(session.request_id or 0, "llama.cpp failed while generating.")
    q2 = "What is the keeper's cat called?"
    second = lib.context_for(paths, q2, ROOM, given_whole(session.conversation.messages))
    assert second and not any(s.whole and s.name == "bread.md" for s in second)
    assert session.send(q2, P, sources=second)
    turn = session.conversation.messages[-1]
    names = [(s.name, s.whole) for s in sources_from_list(turn.sources)]
    assert ("bread.md", True) in names and ("harbour.pdf", False) in names
    link: Link = session._link  # type: ignore[assignment]
    done = finish(engine, list(link.sent[-1]))
    assert done.metrics.prompt_tokens > 0
    read = token_text(engine, engine.cached_tokens)
    assert "240 degrees" in read and "Biscuit" in read
