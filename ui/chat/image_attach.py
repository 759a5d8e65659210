"""Pictures attached to the next message: the Attach button, paste, drag and drop, the
strip of chips above the input box, and what they cost in context tokens.

Reading an attached file (its size, a full defensive decode by ``ImageStore.put``, which
keeps it in the data folder, and a bounded thumbnail) runs in the background
(``run_in_background``), so a large photo never stalls the window. The
tokens each picture takes are asked of the backend on the engine thread, behind the
host's queue like every other engine call (``Backend.image_tokens``), never here.

A model without a vision projector takes no pictures: the Attach menu's Image… entry is
disabled and says why, and a dropped or pasted picture is refused with the same reason,
the typed text left as it was. Those decisions (and the warning when the pictures pass the
context) are ``app.chat.composer``'s, which the API shares.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from PySide6.QtCore import (
    QBuffer,
    QEvent,
    QIODevice,
    QMimeData,
    QObject,
    Qt,
    Signal,
)
from PySide6.QtGui import QAction, QDragEnterEvent, QDragMoveEvent, QDropEvent, QImage, QPixmap
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.composer import fit_warning, vision_refusal
from app.chat.image_store import ImageStore
from app.engine.backend import Backend, ModelInfo
from app.engine.chat_message import ImagePart
from app.engine.token_estimate import estimate_tokens
from app.util.errors import ImageError
from app.util.images import MAX_IMAGE_BYTES
from app.util.sysinfo import size_text
from ui.chat.chat_pane import ChatPane
from ui.chat.image_viewer import CHIP_SIDE, THUMB_SIDE, read_image
from ui.common.background import run_in_background
from ui.common.context import Context
from ui.common.qt_util import MenuToolButton, chip_row

log = logging.getLogger(__name__)

MAX_ATTACHMENTS = 8
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif", "image/bmp")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
FILE_FILTER = "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp);;All files (*)"
STATUS_MS = 8000


def image_urls(mime: QMimeData) -> list[Path]:
    """The local picture files a paste or drag carries (by their names)."""
    if not mime.hasUrls():
        return []
    return [
        Path(u.toLocalFile())
        for u in mime.urls()
        if u.isLocalFile() and Path(u.toLocalFile()).suffix.lower() in IMAGE_SUFFIXES
    ]


def tokens_text(counts: Sequence[int]) -> str:
    """ "This image uses 64 tokens" / "3 images use 192 tokens" ("" when unknown)."""
    if not counts or any(c <= 0 for c in counts):
        return ""
    total = sum(counts)
    if len(counts) == 1:
        return f"This image uses {total:,} tokens"
    return f"{len(counts)} images use {total:,} tokens"


@dataclass(frozen=True)
class Loaded:
    """An attachment read on the pool: the part and its transcript-sized thumbnail."""

    part: ImagePart
    thumb: QImage


class _Relay(QObject):
    """Carries the engine thread's answers to the GUI thread."""

    counted = Signal(int, object)  # generation, list of token counts or a reason (str)


def _encode_png(image: QImage) -> bytes:
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buf, b"PNG")
    return bytes(buf.data().data())


def load_attachment(store: ImageStore, source: Path | bytes | QImage, name: str) -> Loaded:
    """Read, check and keep one attachment (any thread).

    Raises:
        ImageError: unreadable, too large, not a picture.
    """
    if isinstance(source, Path):
        try:
            if source.stat().st_size > MAX_IMAGE_BYTES:
                raise ImageError(f"The image is too large (at most {MAX_IMAGE_BYTES >> 20} MB).")
            data = source.read_bytes()
        except OSError as exc:
            raise ImageError(f"The file could not be read ({exc.strerror or exc}).") from exc
    elif isinstance(source, QImage):
        data = _encode_png(source)
    else:
        data = source
    part = store.put(data, name)
    thumb = read_image(data, THUMB_SIDE)
    return Loaded(part, thumb)


def _load_or_why(store: ImageStore, source: Path | bytes | QImage, name: str) -> Loaded | str:
    """``load_attachment`` on the pool: the attachment, or why it was not attached."""
    try:
        return load_attachment(store, source, name)
    except ImageError as exc:
        return str(exc)
    except Exception as exc:  # any failure is this file's, never the window's
        log.exception("attaching %s", name)
        return f"It could not be read ({exc.__class__.__name__})."


class Chip(QFrame):
    """One attachment above the input box: thumbnail, name and size, and ×.

    Signals:
        removeRequested(): the × was clicked.
    """

    removeRequested = Signal()

    def __init__(self, part: ImagePart, thumb: QImage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("imageChip")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.part = part
        self.thumb = thumb  # the transcript's size: the sent message shows it at once
        self.ticket = 0  # its place among the attachments
        picture = QLabel(self)
        small = thumb.scaled(
            CHIP_SIDE,
            CHIP_SIDE,
            Qt.AspectRatioMode.KeepAspectRatio,
            Qt.TransformationMode.SmoothTransformation,
        )
        picture.setPixmap(QPixmap.fromImage(small))
        picture.setFixedSize(CHIP_SIDE, CHIP_SIDE)
        picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        name = part.name or "Pasted image"
        shown = name if len(name) <= 22 else name[:20] + "…"
        self.label = QLabel(
            f"{shown}\n{part.width}×{part.height} · {size_text(len(part.data))}", self
        )
        self.label.setStyleSheet("font-size: small;")
        self.remove_button = QToolButton(self)
        self.remove_button.setObjectName("removeImage")
        self.remove_button.setText("×")
        self.remove_button.setAutoRaise(True)
        self.remove_button.setToolTip(f"Remove {name}")
        self.remove_button.setAccessibleName(f"Remove {name}")
        self.remove_button.clicked.connect(self.removeRequested)
        self.setToolTip(name)
        row = QHBoxLayout(self)
        row.setContentsMargins(4, 4, 2, 4)
        row.addWidget(picture)
        row.addWidget(self.label)
        row.addWidget(self.remove_button, 0, Qt.AlignmentFlag.AlignTop)


class AttachmentStrip(QWidget):
    """The chips in a row, with the token count and any note below them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachmentStrip")
        self.row, self.area = chip_row(self, CHIP_SIDE + 26)
        self.tokens = QLabel(self)
        self.tokens.setObjectName("imageTokens")
        self.note = QLabel(self)
        self.note.setObjectName("imageNote")
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color: #d1242f;")
        self.note.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 2, 0, 2)
        layout.setSpacing(2)
        layout.addWidget(self.area)
        layout.addWidget(self.tokens)
        layout.addWidget(self.note)

    def show_note(self, text: str) -> None:
        self.note.setText(text)
        self.note.setVisible(bool(text))

    def follow(self, chips: bool) -> None:
        """Show only what has something in it: after a failed attach, the note without an
        empty chip row (it took its full height) and the strip hidden when all is empty."""
        self.area.setVisible(chips)
        self.tokens.setVisible(bool(self.tokens.text()))
        self.setVisible(chips or self.tokens.isVisibleTo(self) or bool(self.note.text()))


class ImageAttach(QObject):
    """The next message's pictures (see the module docstring).

    A sent picture's thumbnail goes to the transcript's cache: it shows at once.
    ``changed()`` is called whenever the attachments change (the Send button follows).
    """

    def __init__(self, ctx: Context, chat: ChatPane, changed: Callable[[], None]) -> None:
        super().__init__(ctx.parent)
        self._ctx = ctx
        self._chat = chat
        self._changed: Callable[[], None] = lambda: None  # not before it is made
        self._thumbs = chat.transcript.images.cache
        chat.transcript.images.source = ctx.store.images.path
        self._relay = _Relay(self)
        self._relay.counted.connect(self._on_counted)
        self.chips: list[Chip] = []
        self._pending: dict[int, str] = {}  # ticket -> name, files being read
        self._ticket = 0
        self._last_dir = ""  # where the file dialog found pictures last
        self._generation = 0  # of the token count asked for last
        self.counts: list[int] | None = None  # tokens per attachment (None: not known yet)
        self._notes: list[str] = []
        self.vision = False
        self._info: ModelInfo | None = None

        # The input box's corner: Attach, a menu (the documents add their entries).
        self.button = MenuToolButton(chat)
        self.button.setObjectName("attachButton")
        self.button.setText("Attach")
        self.button.setAccessibleName("Attach images or documents")
        self.button.setToolTip("Attach images or documents (or drop them on the message box)")
        self.menu = QMenu(self.button)
        self.menu.setToolTipsVisible(True)
        self.image_action = QAction("Image…", self)
        self.image_action.setObjectName("attachImage")
        self.image_action.triggered.connect(self.choose_files)
        self.menu.addAction(self.image_action)
        self.button.setMenu(self.menu)
        chat.chat_input.set_corner(self.button)
        self.strip = AttachmentStrip(chat)
        self.strip.hide()
        layout = chat.layout()
        assert isinstance(layout, QVBoxLayout)
        layout.insertWidget(layout.count() - 1, self.strip)  # just above the input row
        chat.chat_input.mime_hook = self.take_mime
        for w in (chat.chat_input.viewport(), chat.transcript.viewport(), self.strip):
            w.setAcceptDrops(True)
            w.installEventFilter(self)
        ctx.model.changed.connect(self._on_model)
        self._on_model(ctx.model.info)
        self._changed = changed

    # -- what is attached ----------------------------------------------------------------

    def parts(self) -> list[ImagePart]:
        return [c.part for c in self.chips]

    @property
    def busy(self) -> bool:
        """Files are still being read."""
        return bool(self._pending)

    def clear(self) -> None:
        """Forget every attachment (the message was sent)."""
        for chip in self.chips:
            self._thumbs_keep(chip)
            chip.deleteLater()
        self.chips = []
        self._pending.clear()
        self._notes = []
        self._update()

    def _thumbs_keep(self, chip: Chip) -> None:
        if not chip.thumb.isNull():
            self._thumbs.put(chip.part.digest, chip.thumb)

    def remove(self, chip: Chip) -> None:
        if chip in self.chips:
            self.chips.remove(chip)
            chip.deleteLater()
            self._notes = []
            self._update()

    def to_send(self) -> list[ImagePart] | None:
        """The pictures to send with the message; None: they cannot go now (a note says why)."""
        if not self.chips and not self._pending:
            return []
        if self._pending:
            self._ctx.status("The images are still being read; send again in a moment.", STATUS_MS)
            return None
        if not self.vision:
            self._say(vision_refusal(self._info))
            return None
        return self.parts()

    # -- adding ----------------------------------------------------------------------------

    def choose_files(self) -> None:
        """The Attach button: a file dialog for pictures."""
        # The folder pictures came from last, else the user's Pictures (never the app's).
        start = self._last_dir or next(
            (str(p) for p in (Path.home() / "Pictures", Path.home()) if p.is_dir()), ""
        )
        names, _ = QFileDialog.getOpenFileNames(
            self._ctx.parent, "Attach images", start, FILE_FILTER
        )
        if names:
            self._last_dir = str(Path(names[0]).parent)
        self.add_files([Path(n) for n in names])

    def add_files(self, paths: Sequence[Path]) -> None:
        for path in paths:
            self._add(path, path.name)

    def add_image(self, source: bytes | QImage, name: str = "") -> None:
        """A picture from the clipboard (encoded bytes, or pixels that are saved as PNG)."""
        self._add(source, name)

    def _add(self, source: Path | bytes | QImage, name: str) -> None:
        if not self.vision:
            self._say(vision_refusal(self._info))
            return
        if len(self.chips) + len(self._pending) >= MAX_ATTACHMENTS:
            self._say(
                f"{name or 'The image'} was not attached: a message takes at most "
                f"{MAX_ATTACHMENTS} images."
            )
            return
        self._ticket += 1
        self._pending[self._ticket] = name
        store = self._ctx.store.images
        load = partial(_load_or_why, store, source, name)
        run_in_background(load, partial(self._on_loaded, self._ticket), owner=self)
        self._update()

    def _on_loaded(self, ticket: int, result: object) -> None:
        name = self._pending.pop(ticket, None)
        if name is None:
            return  # cleared (sent) meanwhile
        if isinstance(result, Loaded):
            if any(c.part.digest == result.part.digest for c in self.chips):
                self._say(f"{name or 'This image'} is attached already.")
            else:
                chip = Chip(result.part, result.thumb, self.strip)
                chip.ticket = ticket
                chip.removeRequested.connect(partial(self.remove, chip))
                # In the order they were attached, whichever file was read first.
                at = sum(1 for c in self.chips if c.ticket < ticket)
                self.chips.insert(at, chip)
                self.strip.row.insertWidget(at, chip)
        else:
            self._say(f"{name or 'The pasted image'} was not attached: {result}")
        self._update()

    def _say(self, text: str) -> None:
        """A note under the chips (kept until the attachments change) and in the status bar."""
        self._notes = [*self._notes[-2:], text]
        self.strip.show_note("\n".join(self._notes))
        self.strip.follow(bool(self.chips))
        self._ctx.status(text, STATUS_MS)

    # -- paste and drop --------------------------------------------------------------------

    def take_mime(self, mime: QMimeData) -> bool:
        """Attach the pictures a paste or drop carries; False: none, the text box's own."""
        files = image_urls(mime)
        if files:
            self.add_files(files)
            return True
        encoded = [k for k in IMAGE_TYPES if mime.hasFormat(k)]
        if mime.hasImage() or encoded:
            if not self.vision:
                self._say(vision_refusal(self._info))
                return not mime.hasText()  # the text still pastes: never lose words
            if encoded:  # the file's own bytes: no re-encoding
                self.add_image(bytes(mime.data(encoded[0]).data()))
                return True
            image = mime.imageData()
            if isinstance(image, QImage) and not image.isNull():
                self.add_image(image)
                return True
        return False

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove):
            assert isinstance(event, (QDragEnterEvent, QDragMoveEvent))
            if not image_urls(event.mimeData()):
                return False
            event.acceptProposedAction()
            return True
        if kind == QEvent.Type.Drop:
            assert isinstance(event, QDropEvent)
            if not image_urls(event.mimeData()):
                return False
            event.acceptProposedAction()
            self.take_mime(event.mimeData())
            return True
        return False

    # -- the model and the tokens ------------------------------------------------------------

    def _on_model(self, info: ModelInfo | None) -> None:
        self._info = info
        self.vision = info is not None and info.capabilities.vision
        self.image_action.setEnabled(self.vision)
        if self.vision:
            self.image_action.setToolTip("Attach images (or paste or drop them on the message box)")
        else:
            self.image_action.setToolTip(vision_refusal(info))
        self._update()

    def _update(self) -> None:
        if not self._notes:
            self.strip.show_note("")
        self._count()
        self._changed()

    def _count(self) -> None:
        """Ask the engine thread what the attachments cost."""
        self._generation += 1
        self.counts = None
        parts = self.parts()
        self._show_tokens()
        if not parts or not self.vision:
            return
        generation = self._generation
        host = self._ctx.client.host
        relay = self._relay

        def task() -> None:
            result = count_tokens(host.engine, parts)
            with contextlib.suppress(RuntimeError):  # the window closed meanwhile
                relay.counted.emit(generation, result)

        if not host.post(task):
            self.counts = []

    def _on_counted(self, generation: int, result: object) -> None:
        if generation != self._generation:
            return  # the attachments changed since
        if isinstance(result, str):
            self.counts = []
            self._say(result)
            return
        self.counts = list(result) if isinstance(result, list) else []
        self._show_tokens()

    def _show_tokens(self) -> None:
        self._token_line()
        self.strip.follow(bool(self.chips))

    def _token_line(self) -> None:
        """What the attachments cost (or how many are still being read), and any warning."""
        label = self.strip.tokens
        pending = len(self._pending)
        if not self.chips:
            label.setText(f"Reading {pending} image(s)…" if pending else "")
            return
        if self.counts is None:
            label.setText("Counting the images' tokens…")
            return
        text = tokens_text(self.counts) or "The server counts these images' tokens"
        warning = self._fit_warning(sum(self.counts))
        label.setText(f"{text} · {warning}" if warning else text)
        label.setStyleSheet("color: #b35900;" if warning else "color: #888888;")

    def _fit_warning(self, image_tokens: int) -> str:
        """The composer's warning; the typed text estimated (redrawn as the user types,
        it cannot wait for the engine thread)."""
        messages = self._ctx.session.conversation.messages
        text_tokens = estimate_tokens(self._chat.text())
        return fit_warning(self._info, messages, image_tokens, text_tokens)


def count_tokens(engine: Backend, parts: Sequence[ImagePart]) -> list[int] | str:
    """Each picture's context tokens (engine thread); a reason when the model refuses."""
    try:
        return [engine.image_tokens(p) for p in parts]
    except ImageError as exc:
        return str(exc)
    except Exception:  # a backend without an answer: the count is unknown, not an error
        log.exception("image_tokens")
        return [0 for _ in parts]
