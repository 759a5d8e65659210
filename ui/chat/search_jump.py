"""Full-text search hits and Copy in the main window: open a chat at a message."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.chat.search_index import query_terms

if TYPE_CHECKING:
    from app.chat.session_cache import RestoreResult
    from ui.window.main_window import MainWindow


class SearchJump:
    """Opens the chat of a search hit and scrolls to the message once it is shown
    (opening waits for a streaming reply to settle, so the jump waits with it)."""

    def __init__(self, win: MainWindow) -> None:
        self._win = win
        self._pending: tuple[str, int, str] | None = None
        win.sidebar.set_searcher(win._store.search)
        win.sidebar.openAtRequested.connect(self.open_at)
        win.conversationOpened.connect(self._on_opened)
        win.transcript.copied.connect(self._on_copied)

    def open_at(self, conv_id: str, index: int, text: str) -> None:
        win = self._win
        term = first_word(text)
        if conv_id == win.conversation.id and not win.session.busy:
            win.transcript.show_message(self._shown_index(index), term)
            return
        self._pending = (conv_id, index, term)
        win.open_conversation(conv_id)

    def _on_opened(self, result: RestoreResult) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == result.conv_id:
            self._win.transcript.show_message(self._shown_index(pending[1]), pending[2])

    def _shown_index(self, index: int) -> int:
        """A hit past the shown messages is in another version: show that version."""
        conv = self._win.conversation
        if index < len(conv.messages):
            return index
        every = conv.every_message()
        if index >= len(every):
            return index
        found = self._win.session.reveal(every[index].id)
        return index if found is None else found

    def _on_copied(self, what: str) -> None:
        self._win.statusBar().showMessage(f"Copied the {what} to the clipboard.", 3000)


def first_word(text: str) -> str:
    """The first searched word, to select in the message (as the index matched it)."""
    terms = query_terms(text)
    return terms[0] if terms else ""
