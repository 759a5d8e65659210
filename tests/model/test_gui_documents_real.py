"""Documents from the window, end to end on the real chat model and the built-in
embedding model (issue 31): files attached and indexed, a message given the small file
whole and passages of the long one, the Sources in the message opening the viewer at
the passage, and the follow-up and the reopened chat reading only what is new."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.config.setting_records import SamplingParams
from app.documents.sources import sources_from_list
from tests.document_files import write_pdf
from tests.embed_model import embedder_path
from tests.model.test_documents_real import BREAD, FACTS
from tests.model.test_gui_real import reopen_and_send, send
from tests.real_window import real_window
from ui.chat.document_viewer import DocumentViewer


def test_documents_are_cited_and_stay_in_the_cache(
    qtbot: QtBot, tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embedding model built once for the tests, not again in this data folder.
    monkeypatch.setattr("app.models.embedders.chosen_embedder", lambda _root: embedder_path())
    pdf, md = tmp_path / "harbour.pdf", tmp_path / "bread.md"
    write_pdf(pdf, FACTS)
    md.write_text(BREAD, encoding="utf-8")
    with real_window(qtbot, tmp_path, model_path, SamplingParams.greedy(8)) as win:
        docs = win.documents
        docs.add_paths([pdf, md])
        qtbot.waitUntil(lambda: not docs.busy, timeout=120_000)
        assert sorted(win.session.conversation.documents) == sorted([str(pdf), str(md)])
        states = win.documents_library.status(docs.paths())
        assert [s.state for s in states] == ["ready", "ready"]
        assert docs.bar.isVisible()

        with qtbot.waitSignal(win.replyEnded, timeout=180_000):
            send(qtbot, win, "What is the keeper's cat called?")
        first_user = win.session.conversation.messages[-2]
        given = sources_from_list(first_user.sources)
        assert [s.name for s in given if s.whole] == ["bread.md"]
        passages = [s for s in given if not s.whole]
        assert passages and passages[0].name == "harbour.pdf" and passages[0].page == 2
        shown = win.transcript.toPlainText()
        assert "Sources" in shown and "harbour.pdf, page 2" in shown
        first = win.session.conversation.messages[-1].message_metrics()
        assert first is not None

        # A click on the passage opens the viewer there.
        index = len(win.session.conversation.messages) - 2
        n = next(i for i, s in enumerate(given) if not s.whole)
        assert win.transcript.sources.activate(index, n)
        viewer = next(iter(win.findChildren(DocumentViewer)))
        qtbot.waitUntil(lambda: viewer.loaded, timeout=30_000)
        marks = viewer.view.extraSelections()
        assert marks and "Biscuit" in marks[0].cursor.selectedText()
        assert viewer.header.text().startswith("page 2")
        viewer.close()

        # The follow-up: the first turn, the whole file and its passages included, comes
        # from the cache; the small file is not given again.
        with qtbot.waitSignal(win.replyEnded, timeout=180_000):
            send(qtbot, win, "When does the paraffin arrive?")
        second_user = win.session.conversation.messages[-2]
        assert not any(s.whole for s in sources_from_list(second_user.sources))
        follow = win.session.conversation.messages[-1].message_metrics()
        assert follow is not None
        assert follow.cached_tokens >= first.prompt_tokens
        assert follow.evaluated_tokens < follow.prompt_tokens - first.prompt_tokens + 16

        # Reopened from its snapshot, the chat goes on reading only the new turn.
        again = reopen_and_send(qtbot, win, "Thanks.")
        assert again.cached_tokens >= follow.prompt_tokens
