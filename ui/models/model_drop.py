"""Drag a ``.gguf`` onto the window: a model is loaded and listed in the library, a LoRA
adapter joins the adapter stack.

The drag is looked at by an event filter on the window and on the text boxes inside
it (a text box would otherwise take a dropped file as text and paste its path).
Drags that carry no files are left alone, so dragging text into the message box
works as usual. A drag is accepted only for exactly one local ``.gguf`` file;
anything else is refused while it is dragged, with the reason in the status bar.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path

from PySide6.QtCore import QEvent, QMimeData, QObject, QTimer
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import QWidget

from app.gguf.header import shown
from app.gguf.info import read_gguf_info
from app.util.errors import ModelFileError
from ui.common.context import Context
from ui.models.model_manager import ModelManager

log = logging.getLogger(__name__)

STATUS_MS = 6000
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")


def dropped_gguf(mime: QMimeData) -> tuple[Path | None, str]:
    """The one local ``.gguf`` file a drag carries, or None and why it is refused
    (an empty reason: not a drag of files at all, so not ours to judge)."""
    if not mime.hasUrls():
        return None, ""
    urls = mime.urls()
    if all(Path(u.toLocalFile()).suffix.lower() in IMAGE_SUFFIXES for u in urls):
        return None, ""  # pictures: the message's attachments (ui.chat.image_attach)
    if len(urls) != 1:
        return None, f"Drop one model file at a time ({len(urls)} items were dragged)."
    url = urls[0]
    if not url.isLocalFile():
        return None, "Only files on this computer can be opened; the Model manager downloads."
    path = Path(url.toLocalFile())
    if path.suffix.lower() != ".gguf":
        return None, (
            f"{shown(path.name)} is not a GGUF model (a .gguf file), nor a document "
            "Lamplight reads (text, Markdown, code, HTML, PDF or DOCX)."
        )
    return path, ""


class ModelDrop(QObject):
    """Takes ``.gguf`` drops for ``ctx.parent`` (see the module docstring).

    ``add_adapter(path)`` adds a dropped adapter to the LoRA stack (False: it was not
    added, the panel says why); ``manager()`` is the model manager, if it was opened.
    """

    def __init__(
        self,
        ctx: Context,
        add_adapter: Callable[[Path], bool],
        manager: Callable[[], ModelManager | None],
    ) -> None:
        super().__init__(ctx.parent)
        self._ctx = ctx
        self._add_adapter_to_stack = add_adapter
        self._manager = manager
        self._watched: set[int] = set()
        ctx.parent.setAcceptDrops(True)
        self.watch(ctx.parent)

    def watch(self, root: QWidget) -> None:
        """Filter ``root`` and every widget under it that takes drops itself."""
        for w in [root, *root.findChildren(QWidget)]:
            if (w is root or w.acceptDrops()) and id(w) not in self._watched:
                self._watched.add(id(w))
                w.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove):
            assert isinstance(event, (QDragEnterEvent, QDragMoveEvent))
            path, why = dropped_gguf(event.mimeData())
            if path is None and not why:
                return False  # text: the widget's own business
            if path is not None:
                event.acceptProposedAction()
            else:
                event.ignore()
                if kind == QEvent.Type.DragEnter:
                    self._ctx.status(why, STATUS_MS)
            return True
        if kind == QEvent.Type.Drop:
            assert isinstance(event, QDropEvent)
            path, why = dropped_gguf(event.mimeData())
            if path is None and not why:
                return False
            if path is None:
                event.ignore()
                self._ctx.status(why, STATUS_MS)
                return True
            event.acceptProposedAction()
            # After the drop returns: the file manager waits for it to finish.
            QTimer.singleShot(0, partial(self.open, path))
            return True
        return False

    def open(self, path: Path) -> None:
        """Load a dropped model (or add a dropped adapter), as Open model… would."""
        ctx = self._ctx
        try:
            info = read_gguf_info(path)
        except ModelFileError as exc:
            ctx.notice(f"Not opened: {exc}")
            return
        if info.general_type == "adapter":
            self._add_adapter(path)
            return
        if ctx.model.loading:
            ctx.status(
                f"A model is still loading; drop {shown(path.name)} again when it is ready.",
                STATUS_MS,
            )
            return
        self._import(path)
        ctx.open_model(path)
        ctx.status(f"Opening {shown(path.name)}…", STATUS_MS)

    def _add_adapter(self, path: Path) -> None:
        if self._add_adapter_to_stack(path):
            self._ctx.status(f"Added the LoRA adapter {shown(path.name)}.", STATUS_MS)
        else:
            self._ctx.status(
                f"The LoRA adapter {shown(path.name)} was not added: see the LoRA panel.",
                STATUS_MS,
            )

    def _import(self, path: Path) -> None:
        """List the file in the library where it is (no copy), as the manager's Import does."""
        try:
            if path.resolve().is_relative_to(self._ctx.dirs.models.resolve()):
                return  # already in the library's own folder
        except OSError:
            return
        manager = self._manager()
        if manager is not None:
            manager.import_paths([path])  # saves the list through libraryChanged
            return
        settings = self._ctx.settings
        if str(path) not in settings.value.imported_models:
            settings.update(imported_models=[*settings.value.imported_models, str(path)])
