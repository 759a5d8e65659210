"""Documents a conversation reads from: the Attach menu's Documents…, Folder… and
Collection… entries, drops and pastes of files, and the documents bar.

Which files and collections a conversation uses is the session's
(``ChatSession.set_documents``); this keeps the bar in step with it. Expanding
folders and indexing (``DocumentLibrary.add``, blocking) run one job at a time in the
background (``run_in_background``); progress comes back to the GUI thread as queued
signals, and Cancel sets the job's ``threading.Event``. A dropped picture still goes
to the image attachments; a file of a kind that cannot be read gets a note naming it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QEvent, QMimeData, QObject, Signal
from PySide6.QtGui import QAction, QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import QDialog, QFileDialog, QVBoxLayout, QWidget

from app.util.errors import DocumentCancelled, DocumentError, EmbedderError
from ui.chat.chat_pane import ChatPane
from ui.chat.collections_dialog import CollectionsDialog
from ui.chat.document_bar import ChipState, DocumentBar
from ui.chat.image_attach import IMAGE_SUFFIXES, ImageAttach
from ui.common.background import run_in_background
from ui.common.context import Context

if TYPE_CHECKING:
    from app.documents.library import DocumentLibrary

log = logging.getLogger(__name__)

STATUS_MS = 8000
MODEL_SUFFIXES = (".gguf",)  # the model drop's (ui.models.model_drop)


def supported_suffixes() -> frozenset[str]:
    from app.documents.parse import SUPPORTED  # the parsers load only when used

    return frozenset(s.lower() for s in SUPPORTED)


def file_filter() -> str:
    patterns = " ".join(f"*{s}" for s in sorted(supported_suffixes()))
    return f"Documents ({patterns});;All files (*)"


@dataclass
class Split:
    """A drop's or paste's local files, by where they go."""

    documents: list[Path] = field(default_factory=list)  # files and folders
    images: list[Path] = field(default_factory=list)
    unsupported: list[Path] = field(default_factory=list)
    models: list[Path] = field(default_factory=list)


def split_urls(mime: QMimeData) -> Split:
    out = Split()
    if not mime.hasUrls():
        return out
    suffixes = supported_suffixes()
    for url in mime.urls():
        if not url.isLocalFile():
            continue
        path = Path(url.toLocalFile())
        suffix = path.suffix.lower()
        if suffix in IMAGE_SUFFIXES:
            out.images.append(path)
        elif suffix in MODEL_SUFFIXES:
            out.models.append(path)
        elif path.is_dir() or suffix in suffixes:
            out.documents.append(path)
        else:
            out.unsupported.append(path)
    return out


def unsupported_note(paths: Sequence[Path]) -> str:
    names = ", ".join(p.name for p in paths[:5]) + (" …" if len(paths) > 5 else "")
    return (
        f"Not attached: {names}. Lamplight reads PDF, Word (.docx), HTML, Markdown, "
        "text and code files."
    )


class _Relay(QObject):
    """Carries a job's progress from the pool to the GUI thread."""

    expanded = Signal(int, object)  # job, list[Path]
    progress = Signal(int, object)  # job, Progress


@dataclass
class Job:
    """One attach: files and folders to expand and index, for one conversation."""

    ident: int
    conv_id: str
    paths: list[Path]
    collection: str = ""  # attaching a saved collection
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class DocumentAttach(QObject):
    """The conversation's documents (see the module docstring)."""

    def __init__(
        self,
        ctx: Context,
        chat: ChatPane,
        images: ImageAttach,
        library: DocumentLibrary,
    ) -> None:
        super().__init__(ctx.parent)
        self._ctx = ctx
        self._chat = chat
        self._images = images
        self.library = library
        self._relay = _Relay(self)
        self._relay.expanded.connect(self._on_expanded)
        self._relay.progress.connect(self._on_progress)
        self._states: dict[str, Any] = {}  # path -> DocumentStatus (or the fake's)
        self._missing: set[str] = set()  # files not there when last asked
        self._live: dict[str, str] = {}  # path -> stage, the file being indexed now
        self._jobs: list[Job] = []  # the first runs; the others wait
        self._ident = 0
        self._generation = 0  # of the status asked for last
        self._last_dir = ""
        self.bar = DocumentBar(chat)
        self.bar.cancelRequested.connect(self.cancel)
        self.bar.removeRequested.connect(self.remove)
        layout = chat.layout()
        assert isinstance(layout, QVBoxLayout)
        layout.insertWidget(layout.count() - 2, self.bar)  # above the pictures and the input
        menu = images.menu
        self.documents_action = QAction("Documents…", self)
        self.folder_action = QAction("Folder…", self)
        self.collection_action = QAction("Collection…", self)
        for action, slot in (
            (self.documents_action, self.choose_files),
            (self.folder_action, self.choose_folder),
            (self.collection_action, self.choose_collection),
        ):
            action.triggered.connect(slot)
            menu.addAction(action)
        self._previous_hook = chat.chat_input.mime_hook
        chat.chat_input.mime_hook = self.take_mime
        self._drop_targets: list[QWidget] = [
            chat.chat_input.viewport(),
            chat.transcript.viewport(),
            self.bar,
        ]
        self.watch_drops()

    # -- what the conversation has ---------------------------------------------------------

    @property
    def documents(self) -> list[str]:
        return list(self._ctx.session.conversation.documents)

    @property
    def collections(self) -> list[str]:
        return list(self._ctx.session.conversation.collections)

    def paths(self) -> list[str]:
        """Every file the conversation reads: its documents and its collections' (once each)."""
        out = dict.fromkeys(self.documents)
        for name in self.collections:
            out.update(dict.fromkeys(self.library.collections.paths(name)))
        return list(out)

    @property
    def busy(self) -> bool:
        """Documents are still being read."""
        return bool(self._jobs)

    # -- adding ------------------------------------------------------------------------------

    def _start_dir(self) -> str:
        return self._last_dir or next(
            (str(p) for p in (Path.home() / "Documents", Path.home()) if p.is_dir()), ""
        )

    def choose_files(self) -> None:
        names, _ = QFileDialog.getOpenFileNames(
            self._ctx.parent, "Attach documents", self._start_dir(), file_filter()
        )
        if names:
            self._last_dir = str(Path(names[0]).parent)
            self.add_paths([Path(n) for n in names])

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self._ctx.parent, "Attach a folder of documents", self._start_dir()
        )
        if folder:
            self._last_dir = folder
            self.add_paths([Path(folder)])

    def choose_collection(self) -> None:
        dialog = CollectionsDialog(self.library.collections, self.documents, self._ctx.parent)
        if dialog.exec() == QDialog.DialogCode.Accepted and dialog.chosen:
            self.attach_collection(dialog.chosen)
        self.refresh()  # a collection may have been renamed or deleted

    def attach_collection(self, name: str) -> None:
        if name in self.collections:
            self._ctx.status(f"The collection {name} is in use already.", STATUS_MS)
            return
        paths = self.library.collections.paths(name)
        self._ctx.session.set_documents(self.documents, [*self.collections, name])
        self._start(Job(0, "", [Path(p) for p in paths], name))

    def add_paths(self, paths: Sequence[Path]) -> None:
        """Attach files and folders (folders are expanded on the pool)."""
        if paths:
            self._start(Job(0, "", list(paths)))

    def _start(self, job: Job) -> None:
        self._ident += 1
        job.ident = self._ident
        job.conv_id = self._ctx.session.conversation.id
        self._jobs.append(job)
        self.bar.show_note("")
        if len(self._jobs) == 1:
            self._run(job)
        self._show_progress_waiting()

    def _run(self, job: Job) -> None:
        relay, library = self._relay, self.library

        def work() -> object:
            """list[DocumentStatus], or a reason (str), or None (cancelled)."""
            try:
                files = library.expand(job.paths)
                relay.expanded.emit(job.ident, files)
                return library.add(files, lambda p: relay.progress.emit(job.ident, p), job.cancel)
            except DocumentCancelled:
                return None
            except (DocumentError, EmbedderError) as exc:
                return str(exc)
            except Exception as exc:  # a bug or an I/O failure: this job's, not the window's
                log.exception("indexing documents")
                return f"The documents could not be read ({exc.__class__.__name__})."
            finally:
                job.done.set()

        run_in_background(work, partial(self._on_finished, job.ident), owner=self)

    def _job(self, ident: int) -> Job | None:
        return next((j for j in self._jobs if j.ident == ident), None)

    def _mine(self, job: Job) -> bool:
        return job.conv_id == self._ctx.session.conversation.id

    def _on_expanded(self, ident: int, files: object) -> None:
        job = self._job(ident)
        if job is None or not isinstance(files, list):
            return
        if not files:
            self._say("No documents Lamplight can read were found there.")
        if job.collection or not self._mine(job):
            self.refresh(ask=False)
            return
        added = [str(f) for f in files if str(f) not in self.documents]
        if added:
            self._ctx.session.set_documents([*self.documents, *added], self.collections)
        self.refresh(ask=False)

    def _on_progress(self, ident: int, progress: Any) -> None:
        job = self._job(ident)
        if job is None or job.cancel.is_set():
            return
        total, done = int(progress.total), int(progress.done)
        if done < total:
            text = f"Indexing {done + 1} of {total} · {progress.current}"
            self.bar.show_progress(text, float(progress.fraction))
            stage = "embedding" if progress.stage == "embedding" else "reading"
            self._live = {p: stage for p in self.documents if Path(p).name == progress.current}
            self.refresh(ask=False)

    def _on_finished(self, ident: int, result: object) -> None:
        job = self._job(ident)
        if job is None:
            return
        self._jobs.remove(job)
        self._live = {}
        if isinstance(result, list):
            for status in result:
                self._states[str(status.path)] = status
            failed = [s for s in result if s.state == "error"]
            if failed:
                self._say(f"{len(failed)} document(s) could not be read: see their tooltips.")
        elif isinstance(result, str):
            self._say(result)
        else:
            self._ctx.status("Indexing was cancelled.", STATUS_MS)
        if self._jobs:
            self._run(self._jobs[0])
            self._show_progress_waiting()
        else:
            self.bar.hide_progress()
        self.refresh(ask=result is None)

    def _show_progress_waiting(self) -> None:
        waiting = len(self._jobs) - 1
        more = f" ({waiting} more waiting)" if waiting > 0 else ""
        if self.bar.progress_row.isHidden():
            self.bar.show_progress(f"Looking for documents…{more}", 0.0)

    def cancel(self) -> None:
        """Cancel: the running job stops at its next check; waiting ones are dropped."""
        for job in self._jobs:
            job.cancel.set()
        self.bar.cancel_button.setEnabled(False)
        self.bar.progress_label.setText("Cancelling…")

    def remove(self, key: str) -> None:
        """A chip's ×: the conversation stops using that document or collection."""
        docs = [d for d in self.documents if d != key]
        cols = [c for c in self.collections if c != key]
        self._ctx.session.set_documents(docs, cols)
        self.refresh(ask=False)

    def _say(self, text: str) -> None:
        self.bar.show_note(text)
        self._ctx.status(text, STATUS_MS)

    # -- the bar -----------------------------------------------------------------------------

    def on_conversation(self, _conv: object = None) -> None:
        """Another conversation is shown: its documents, their state asked off the GUI thread."""
        self.bar.show_note("")
        self.refresh(ask=True)

    def refresh(self, ask: bool = False) -> None:
        items = [self._chip(p) for p in self.documents]
        for name in self.collections:
            n = len(self.library.collections.paths(name))
            items.append(ChipState(name, name, "collection", collection=True, n_documents=n))
        self.bar.set_items(items)
        if ask and self.documents:
            self._ask_status(self.documents)

    def _chip(self, path: str) -> ChipState:
        status = self._states.get(path)
        name = Path(path).name
        if path in self._live:
            return ChipState(path, name, self._live[path])
        if status is None:
            return ChipState(path, name, "queued")
        state, error = str(status.state), str(status.error)
        if path in self._missing:
            state = "missing"
            error = error or f"{name} is missing: it was moved or deleted."
        return ChipState(path, name, state, error, int(status.n_chunks), status.pages)

    def _ask_status(self, paths: list[str]) -> None:
        self._generation += 1
        library = self.library

        def work() -> object:
            try:
                return library.status(paths), {p for p in paths if not Path(p).is_file()}
            except Exception:  # the bar keeps what it showed
                log.exception("document status")
                return None

        run_in_background(work, partial(self._on_statuses, self._generation), owner=self)

    def _on_statuses(self, generation: int, answer: object) -> None:
        if generation != self._generation or not isinstance(answer, tuple):
            return
        result, gone = answer
        running = {str(p) for j in self._jobs for p in j.paths}
        for status in result:
            path = str(status.path)
            if path in gone:
                self._missing.add(path)
            else:
                self._missing.discard(path)
            if path not in running:
                self._states[path] = status
        self.refresh(ask=False)

    # -- paste and drop -------------------------------------------------------------------------

    def take_mime(self, mime: QMimeData) -> bool:
        """Attach the files a paste or drop carries (pictures to the images); False: none."""
        split = split_urls(mime)
        if not (split.documents or split.unsupported):
            hook = self._previous_hook
            return hook(mime) if hook is not None else False
        if split.images:
            self._images.add_files(split.images)
        self.add_paths(split.documents)
        if split.unsupported:  # after: a new job clears the note
            self._say(unsupported_note(split.unsupported))
        return True

    def watch_drops(self) -> None:
        """(Re)install the drop filter so it runs before the model drop's, which the
        window installs when first shown (the last installed filter runs first)."""
        for w in self._drop_targets:
            w.setAcceptDrops(True)
            w.removeEventFilter(self)
            w.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind not in (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop):
            return False
        assert isinstance(event, (QDragEnterEvent, QDragMoveEvent, QDropEvent))
        split = split_urls(event.mimeData())
        if not split.documents or split.models:
            # Pictures alone: the images'; a model, or only files nobody reads: the
            # model drop's (it says why).
            return False
        event.acceptProposedAction()
        if kind == QEvent.Type.Drop:
            self.take_mime(event.mimeData())
        return True

    # -- shutdown ------------------------------------------------------------------------------

    def shutdown(self, wait_s: float = 3.0) -> None:
        """Cancel the jobs and wait (a little) for the running one to end."""
        for job in self._jobs:
            job.cancel.set()
        if self._jobs:
            with contextlib.suppress(Exception):
                self._jobs[0].done.wait(wait_s)
