"""What the window's documents are connected to once it is built: the documents bar
follows the conversation shown, a clicked source opens
the viewer, the local API serves the same embedding model, a newly chosen embedding
model is used from the next job on, and notes about set-aside files are shown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from app.documents.sources import Source
from ui.api.api_status import ApiControl
from ui.chat.document_attach import DocumentAttach
from ui.chat.document_viewer import open_viewer
from ui.chat.transcript import TranscriptView
from ui.common.context import Context
from ui.models.hub_workers import HubServices
from ui.window.session_view import WindowView

if TYPE_CHECKING:
    from app.documents.library import DocumentLibrary
    from app.engine.local.embed_worker import EmbedWorker


class DocumentsHost(Protocol):
    """What of the window this needs (the window itself)."""

    @property
    def ctx(self) -> Context: ...
    @property
    def transcript(self) -> TranscriptView: ...
    @property
    def api(self) -> ApiControl: ...
    @property
    def services(self) -> HubServices | None: ...
    @property
    def embedder(self) -> EmbedWorker: ...
    @property
    def documents_library(self) -> DocumentLibrary: ...
    @property
    def documents(self) -> DocumentAttach: ...
    @property
    def session_view(self) -> WindowView: ...


def wire_documents(win: DocumentsHost) -> None:
    library, embedder = win.documents_library, win.embedder
    parent = win.ctx.parent

    def show(source: object) -> None:
        if isinstance(source, Source):
            open_viewer(parent, source, library.read_blocks)  # read on the thread pool

    win.session_view.conversation_listeners.append(win.documents.on_conversation)
    win.transcript.sourceActivated.connect(show)
    win.api.embedder = embedder
    if win.services is not None:
        win.services.installs.embedderChosen.connect(lambda _path: embedder.reload())
    for note in library.take_notes():
        win.ctx.notice(note)
