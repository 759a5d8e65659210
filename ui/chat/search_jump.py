"""Full-text search hits and Copy in the main window: open a chat at a message."""

from __future__ import annotations

from PySide6.QtCore import SignalInstance

from app.chat.search_index import query_terms
from app.chat.session_cache import RestoreResult
from ui.chat.conversation_list import ConversationList
from ui.chat.transcript import TranscriptView
from ui.common.context import Context


class SearchJump:
    """Opens the chat of a search hit and scrolls to the message once it is shown
    (opening waits for a streaming reply to settle, so the jump waits with it).

    ``opened`` is emitted with the ``RestoreResult`` once an opened chat is ready.
    """

    def __init__(
        self,
        ctx: Context,
        sidebar: ConversationList,
        transcript: TranscriptView,
        opened: SignalInstance,
    ) -> None:
        self._ctx = ctx
        self._transcript = transcript
        self._pending: tuple[str, int, str] | None = None
        sidebar.set_searcher(ctx.store.search)
        sidebar.openAtRequested.connect(self.open_at)
        opened.connect(self._on_opened)
        transcript.copied.connect(self._on_copied)

    def open_at(self, conv_id: str, index: int, text: str) -> None:
        session = self._ctx.session
        term = first_word(text)
        if conv_id == session.conversation.id and not session.busy:
            self._transcript.show_message(self._shown_index(index), term)
            return
        self._pending = (conv_id, index, term)
        session.open(conv_id)

    def _on_opened(self, result: RestoreResult) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == result.conv_id:
            self._transcript.show_message(self._shown_index(pending[1]), pending[2])

    def _shown_index(self, index: int) -> int:
        """A hit past the shown messages is in another version: show that version."""
        conv = self._ctx.session.conversation
        if index < len(conv.messages):
            return index
        every = conv.every_message()
        if index >= len(every):
            return index
        found = self._ctx.session.reveal(every[index].id)
        return index if found is None else found

    def _on_copied(self, what: str) -> None:
        self._ctx.status(f"Copied the {what} to the clipboard.", 3000)


def first_word(text: str) -> str:
    """The first searched word, to select in the message (as the index matched it)."""
    terms = query_terms(text)
    return terms[0] if terms else ""
