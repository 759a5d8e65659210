"""Sending the message box: pictures checked, then, when the conversation has
documents, their passages found on the thread pool ("Searching your documents…",
Stop cancels it and keeps the typed text), then ``ChatSession.send``.

What the message takes (the room for passages) is ``app.chat.composer``'s decision; the
typed text and the whole documents are counted with the model's tokenizer, asked on the
engine thread from the search's background job (``engine_counter``).

Also makes the window's one embedder worker and document library (``make_documents``;
closed at quit after the engine stopped).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QLabel

from app.chat.composer import TokenCounter, compose
from app.chat.doc_refs import given_whole
from app.engine.chat_message import ImagePart
from app.engine.token_estimate import estimate_tokens
from app.host.host import EngineHost
from app.util.errors import DocumentCancelled, DocumentError, EmbedderError, LamplightError
from ui.api.api_status import ApiControl
from ui.chat.chat_pane import ChatPane
from ui.chat.document_attach import DocumentAttach
from ui.chat.image_attach import ImageAttach
from ui.common.background import run_in_background
from ui.common.context import Context

if TYPE_CHECKING:
    from app.documents.library import DocumentLibrary
    from app.engine.local.embed_worker import EmbedWorker

log = logging.getLogger(__name__)

STATUS_MS = 8000
SEARCHING = "Searching your documents…"
COUNT_WAIT_S = 2.0  # the engine busy longer (an API reply): the estimate stands in


def make_documents(data_dir: Path) -> tuple[EmbedWorker, DocumentLibrary]:
    """The embedder worker (the model is found and loaded on its first job) and the
    library over it; the tests put a stand-in here."""
    from app.documents.library import DocumentLibrary  # heavy: imported once, here
    from app.engine.local.embed_worker import EmbedWorker
    from app.models.embedders import chosen_embedder

    worker = EmbedWorker(locate=lambda: chosen_embedder(data_dir))
    return worker, DocumentLibrary(data_dir, worker)


def engine_counter(host: EngineHost, cancel: threading.Event) -> TokenCounter:
    """Counts text with the loaded model's tokenizer (``Backend.count_tokens``) on the
    engine thread, behind the host's queue; called off the GUI thread, it waits for the
    answer. The estimate stands in where the backend cannot count, or the engine does
    not answer within ``COUNT_WAIT_S`` (or ``cancel`` is set): then for the rest of the
    search, so that a busy engine delays it once."""
    busy = threading.Event()

    def count(text: str) -> int:
        answer: list[int] = []
        done = threading.Event()
        if busy.is_set():
            return estimate_tokens(text)

        def task() -> None:
            try:
                answer.append(host.engine.count_tokens(text))
            except LamplightError as exc:  # no model, a server gone: the estimate stands in
                log.debug("count_tokens: %s", exc)
            except Exception:  # a bug, shown in the log; the estimate stands in
                log.exception("count_tokens")
            finally:
                done.set()

        if host.post(task):
            until = time.monotonic() + COUNT_WAIT_S
            while not done.wait(0.05) and not cancel.is_set():
                if time.monotonic() > until:
                    busy.set()
                    break
        n = answer[0] if answer else 0
        return n if n > 0 else estimate_tokens(text)

    return count


class Closeable(Protocol):
    def close(self) -> None: ...


class SendHost(Protocol):
    """What sending reaches: the main window."""

    @property
    def ctx(self) -> Context: ...
    @property
    def chat(self) -> ChatPane: ...
    @property
    def images(self) -> ImageAttach: ...
    @property
    def documents(self) -> DocumentAttach: ...
    @property
    def api(self) -> ApiControl: ...
    @property
    def status_speed(self) -> QLabel: ...
    def update_buttons(self) -> None: ...


class SendFlow(QObject):
    """The window's Send and Stop while documents are searched (see the module docstring)."""

    def __init__(self, win: SendHost) -> None:
        super().__init__(win.ctx.parent)
        self._win = win
        self._ticket = 0
        self._cancel: threading.Event | None = None
        self._pending: tuple[str, list[ImagePart]] | None = None
        self._conv_id = ""  # the conversation the search is for

    @property
    def searching(self) -> bool:
        return self._cancel is not None

    def send(self) -> None:
        w, ctx = self._win, self._win.ctx
        images = w.images.to_send()  # None: they cannot go now (a note says why)
        has_message = images is not None and (w.chat.has_text() or bool(images))
        if not has_message or ctx.session.busy or not ctx.model.ready or self.searching:
            return
        conv = ctx.session.conversation
        max_tokens = ctx.settings.value.sampling.max_tokens
        message = compose(w.chat.text(), images or [], ctx.model.info, conv.messages, max_tokens)
        if isinstance(message, str):  # the pictures' note said so already
            ctx.status(message, STATUS_MS)
            return
        text, parts = message.text, list(message.images)
        docs = w.documents
        paths = docs.paths()  # its documents and its collections' files
        if not paths:
            self._send(text, parts, ())
            return
        if docs.busy:
            ctx.status(
                "The documents are still being read; send again when they are ready.", STATUS_MS
            )
            return
        whole = given_whole(conv.messages, ctx.session.edit_index)
        self._ticket += 1
        cancel, library, host = threading.Event(), docs.library, ctx.client.host
        self._cancel, self._pending, self._conv_id = cancel, (text, parts), conv.id

        def work() -> object:
            """list[Source], or a reason (str), or None (cancelled)."""
            try:
                count = engine_counter(host, cancel)  # the model's tokenizer
                room = message.room(count)
                return library.context_for(paths, text, room, whole, cancel, count=count)
            except DocumentCancelled:
                return None
            except (DocumentError, EmbedderError) as exc:
                return str(exc)
            except Exception as exc:  # a bug: the message stays, the reason is shown
                log.exception("searching documents")
                return f"The documents could not be searched ({exc.__class__.__name__})."

        w.status_speed.setText(SEARCHING)
        ctx.status(SEARCHING, 0)
        run_in_background(work, partial(self._on_found, self._ticket), owner=self)
        w.update_buttons()

    def _on_found(self, ticket: int, result: object) -> None:
        if ticket != self._ticket or self._pending is None:
            return  # stopped meanwhile
        text, images = self._pending
        cancelled = self._cancel is not None and self._cancel.is_set()
        self._cancel, self._pending = None, None
        w = self._win
        w.status_speed.setText("")
        w.ctx.status("", 0)
        if cancelled or result is None or w.ctx.session.conversation.id != self._conv_id:
            w.update_buttons()  # stopped, or another chat was opened: the text stays
            return
        if isinstance(result, str):
            w.ctx.notice(
                f"Your documents could not be searched: {result} Your message was not sent."
            )
            w.update_buttons()
            return
        assert isinstance(result, list)
        self._send(text, images, result)

    def _send(self, text: str, images: list[ImagePart], sources: Sequence[Any]) -> None:
        w, ctx = self._win, self._win.ctx
        if ctx.session.busy or not ctx.model.ready:
            w.update_buttons()
            return
        waiting = w.api.waiting_note()
        if waiting:
            w.chat.transcript.add_notice(waiting)
        # The box is emptied only once the message is the session's (nothing is dropped).
        if ctx.session.send(text, ctx.settings.value.sampling, images, sources):
            w.chat.clear_text()
            w.images.clear()
        if waiting:  # until the reply's first words replace it
            w.status_speed.setText("waiting for the API request…")
        w.update_buttons()

    def shutdown(self, embedder: Closeable) -> None:
        """At quit, after the engine stopped: the search and indexing cancelled, the
        library and then the embedder closed."""
        if self._cancel is not None:
            self._cancel.set()
        docs = self._win.documents
        docs.shutdown()
        docs.library.close()
        embedder.close()

    def stop(self) -> bool:
        """Stop a search under way (the typed text stays); False: none was."""
        if self._cancel is None:
            return False
        self._cancel.set()
        self._cancel, self._pending = None, None
        self._win.status_speed.setText("")
        self._win.ctx.status(
            "Stopped searching your documents; your message is still in the box.", STATUS_MS
        )
        self._win.update_buttons()
        return True
