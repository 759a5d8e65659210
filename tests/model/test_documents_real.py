"""Documents end to end on the real engines: files written by the tests (PDF, DOCX,
Markdown, Python), indexed with the built-in embedding model, given to the default chat
model whole or as retrieved passages; what a follow-up, a reopened chat and a changed
file cost and show."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.chat.conversation import Conversation, Message
from app.chat.doc_refs import given_whole
from app.chat.store import ConversationStore
from app.config.setting_records import SamplingParams
from app.documents.library import DocumentLibrary, Progress
from app.documents.sources import Source, sources_from_list
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.embed_worker import EmbedWorker
from app.engine.local.engine import Engine
from tests.conftest import TEST_LOAD
from tests.document_files import write_docx, write_pdf
from tests.embed_model import embedder_path

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, seed=1)
ROOM = 2600  # tokens: two passages, and no whole document over about 3,900 characters


def filler(topic: str, n: int) -> list[str]:
    """Paragraphs long enough that a document must be searched, not given whole."""
    return [
        f"Log entry {i} about {topic}: the wind stayed westerly, the sea was calm, the "
        f"barometer steady, and nothing unusual was seen from the gallery that day."
        for i in range(n)
    ]


FACTS = [
    [
        "Harbour report.",
        "The lighthouse on Gull Point was built in 1871 of grey granite.",
        *filler("the weather", 9),
    ],
    [
        "Keepers.",
        "The keeper's cat at Gull Point is named Biscuit and hates fog horns.",
        *filler("the watch", 9),
    ],
    [
        "Supplies.",
        "Paraffin for the lamp arrives by boat every second Tuesday.",
        *filler("the stores", 9),
    ],
]
BREAD = """# Sourdough notes

Feed the starter with equal weights of rye flour and water every morning.

Bake the loaf at 240 degrees for twenty minutes with the lid on, then uncover it.
"""
CODE = '''"""Tide tables."""


def high_tide(day: int) -> float:
    """Hours after midnight of the first high tide at Gull Point."""
    return (day * 0.84) % 12.4
'''


@pytest.fixture(scope="module")
def worker() -> Iterator[EmbedWorker]:
    w = EmbedWorker(embedder_path)
    yield w
    w.close()


@pytest.fixture(scope="module")
def chat(model_path: Path) -> Iterator[Engine]:
    engine = Engine()
    engine.load(model_path, TEST_LOAD)
    yield engine
    engine.unload()


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    docs = tmp_path / "docs"
    docs.mkdir()
    out = {
        "pdf": docs / "harbour.pdf",
        "docx": docs / "minutes.docx",
        "md": docs / "bread.md",
        "py": docs / "tides.py",
    }
    write_pdf(out["pdf"], FACTS)
    minutes = ["Minutes of the harbour board.", *filler("the board", 14)]
    write_docx(
        out["docx"],
        [*minutes, "The new pier will open in March.", *filler("the pier", 14), "Adjourned."],
        page_break_after=len(minutes),
    )
    out["md"].write_text(BREAD, encoding="utf-8")
    out["py"].write_text(CODE, encoding="utf-8")
    return out


def index_all(lib: DocumentLibrary, paths: list[Path]) -> list[str]:
    seen: list[Progress] = []
    statuses = lib.add(paths, seen.append, threading.Event())
    assert [s.state for s in statuses] == ["ready"] * len(statuses), statuses
    assert seen and seen[-1].total == len(statuses)
    return [s.path for s in statuses]


def finish(engine: Engine, messages: list[ChatMessage]) -> Finished:
    events = list(engine.generate(messages, GREEDY))
    last = events[-1]
    assert isinstance(last, Finished), last
    return last


def test_every_kind_is_indexed_with_its_positions(
    tmp_path: Path, worker: EmbedWorker, files: dict[str, Path]
) -> None:
    lib = DocumentLibrary(tmp_path / "data", worker)
    statuses = lib.add([files["pdf"].parent], lambda p: None, threading.Event())
    by_name = {s.name: s for s in statuses}
    assert set(by_name) == {"harbour.pdf", "minutes.docx", "bread.md", "tides.py"}
    assert all(s.state == "ready" for s in statuses)
    assert by_name["harbour.pdf"].pages == 3
    # Unchanged files are not read again.
    again = lib.add([files["pdf"].parent], lambda p: None, threading.Event())
    assert [s.state for s in again] == ["ready"] * 4


def test_retrieved_passage_names_its_page_and_opens_there(
    tmp_path: Path, worker: EmbedWorker, files: dict[str, Path]
) -> None:
    lib = DocumentLibrary(tmp_path / "data", worker)
    paths = index_all(lib, [files["pdf"], files["md"], files["py"]])
    # The small files go in whole; the long PDF is searched.
    found = lib.context_for(paths, "What is the keeper's cat called?", ROOM, set())
    assert {s.name for s in found if s.whole} == {"bread.md", "tides.py"}
    passages = [s for s in found if not s.whole]
    top = passages[0]
    assert top.name == "harbour.pdf" and top.page == 2 and "Biscuit" in top.text
    assert [s.n for s in found] == list(range(1, len(found) + 1))
    # The viewer's blocks hold the passage at the page and line the source names.
    blocks = lib.read_blocks(top.path)
    assert any(page == 2 and line >= top.line and "Biscuit" in text for page, line, text in blocks)


def test_small_documents_go_in_whole_once(
    tmp_path: Path, worker: EmbedWorker, chat: Engine, files: dict[str, Path]
) -> None:
    lib = DocumentLibrary(tmp_path / "data", worker)
    paths = index_all(lib, [files["md"], files["py"]])
    first = lib.context_for(paths, "How hot is the oven?", 3000, set())
    assert {s.name for s in first} == {"bread.md", "tides.py"} and all(s.whole for s in first)
    conv = Conversation()
    conv.messages.append(
        Message("user", "How hot is the oven?", sources=[s.to_dict() for s in first])
    )
    done = finish(chat, conv.chat())
    assert done.metrics.evaluated_tokens == done.metrics.prompt_tokens
    conv.messages.append(Message("assistant", done.text))
    chat.prewarm(conv.chat()[:-1], conv.chat()[-1])
    # The next message: the documents are in the cache already, so none are given again
    # and only the new words (and the turn's template text) are read.
    assert given_whole(conv.messages) == {str(files["md"]), str(files["py"])}
    later = lib.context_for(paths, "And the starter?", 3000, given_whole(conv.messages))
    assert later == []
    question = "And the starter?"
    conv.messages.append(Message("user", question))
    follow = finish(chat, conv.chat())
    own = len(chat.tokenize(question)) - 1
    assert follow.metrics.evaluated_tokens <= own + 5


def test_follow_up_reads_only_the_new_passages_and_reopens_cached(
    tmp_path: Path, worker: EmbedWorker, chat: Engine, files: dict[str, Path]
) -> None:
    lib = DocumentLibrary(tmp_path / "data", worker)
    paths = index_all(lib, [files["pdf"], files["docx"]])
    conv = Conversation()
    q1 = "When was the lighthouse built?"
    s1 = lib.context_for(paths, q1, ROOM, set())
    assert s1 and s1[0].name == "harbour.pdf" and s1[0].page == 1
    conv.messages.append(Message("user", q1, sources=[s.to_dict() for s in s1]))
    done = finish(chat, conv.chat())
    conv.messages.append(Message("assistant", done.text))
    chat.prewarm(conv.chat()[:-1], conv.chat()[-1])
    q2 = "When will the pier open?"
    s2 = lib.context_for(paths, q2, ROOM, set())
    assert s2 and s2[0].name == "minutes.docx"
    conv.messages.append(Message("user", q2, sources=[s.to_dict() for s in s2]))
    new_turn = conv.messages[-1].chat().content
    follow = finish(chat, conv.chat())
    # The new turn with its passages, and the template's few tokens: not the first
    # turn's passages again.
    assert follow.metrics.evaluated_tokens <= len(chat.tokenize(new_turn)) + 5
    assert follow.metrics.cached_tokens >= done.metrics.prompt_tokens
    # Saved and reopened: the same sources give the same prompt text, so the saved cache
    # serves the next turn (the app saves it after the next turn's head is read).
    reply = ChatMessage("assistant", follow.text)
    chat.prewarm(conv.chat(), reply)
    conv.messages.append(Message("assistant", follow.text))
    store = ConversationStore(tmp_path / "store")
    store.save(conv)
    reopened = store.load(conv.id)
    assert [m.chat().content for m in reopened.messages] == [
        m.chat().content for m in conv.messages
    ]
    saved = chat.export_state()
    chat.reset()
    chat.import_state(saved)
    q3 = "Thank you."
    again = finish(chat, [*reopened.chat(), ChatMessage("user", q3)])
    assert again.metrics.evaluated_tokens <= len(chat.tokenize(q3)) + 5


def test_a_changed_file_is_indexed_again_and_old_passages_stay(
    tmp_path: Path, worker: EmbedWorker, files: dict[str, Path]
) -> None:
    lib = DocumentLibrary(tmp_path / "data", worker)
    long_bread = BREAD + "\n\n".join(filler("the bakery", 30))
    files["md"].write_text(long_bread, encoding="utf-8")
    paths = index_all(lib, [files["md"]])
    before = lib.context_for(paths, "oven temperature", ROOM, set())
    assert before and not before[0].whole and "240 degrees" in before[0].text
    saved = [s.to_dict() for s in before]
    files["md"].write_text(long_bread.replace("240 degrees", "250 degrees"), encoding="utf-8")
    index_all(lib, [files["md"]])
    after = lib.context_for(paths, "oven temperature", ROOM, set())
    assert "250 degrees" in after[0].text
    # The message keeps the passage as it was given.
    kept: list[Source] = sources_from_list(saved)
    assert "240 degrees" in kept[0].text
