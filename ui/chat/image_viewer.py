"""Pictures in the window: bounded thumbnails, the viewer dialog, and a message's images
in the transcript.

Every decode here goes through ``QImageReader`` with limits: the file's size
(``MAX_IMAGE_BYTES``), its pixel count (``MAX_PIXELS``) and, for thumbnails, a scaled
size, so a JPEG is decoded at the small size directly and no picture costs more memory
than a bounded one would. The files themselves were checked with Pillow when they were
attached (``app.util.images``); these limits guard against a file in the data folder
that changed since.
"""

from __future__ import annotations

import html
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt, QUrl
from PySide6.QtGui import QColor, QImage, QImageReader, QPainter, QPixmap
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.util.atomic import atomic_write_bytes
from app.util.images import MAX_IMAGE_BYTES, MAX_PIXELS
from app.util.sysinfo import size_text

THUMB_SIDE = 220  # the longer side of a picture in the transcript
CHIP_SIDE = 64  # the longer side of an attachment's thumbnail above the input box
CACHE_SIZE = 96  # thumbnails kept (about 200 kB each at most)
RESOURCE_SCHEME = "lamplight-image"
MISSING = "This image is no longer in the data folder."
SUFFIXES = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif"}

Source = Path | bytes


def _reader(source: Source) -> tuple[QImageReader, QBuffer | None]:
    if isinstance(source, bytes):
        buf = QBuffer()
        buf.setData(QByteArray(source))
        buf.open(QIODevice.OpenModeFlag.ReadOnly)
        return QImageReader(buf), buf  # the buffer must outlive the reader's reads
    return QImageReader(str(source)), None


def read_image(source: Source, max_side: int = 0) -> QImage:
    """The picture in ``source`` (a file or its bytes), its longer side at most
    ``max_side`` (0: full size); a null image when it cannot be read within the limits."""
    try:
        if isinstance(source, Path) and source.stat().st_size > MAX_IMAGE_BYTES:
            return QImage()
    except OSError:
        return QImage()
    if isinstance(source, bytes) and len(source) > MAX_IMAGE_BYTES:
        return QImage()
    reader, buf = _reader(source)
    reader.setAutoTransform(True)  # a photo's EXIF orientation
    reader.setAllocationLimit(MAX_PIXELS * 4 >> 20)  # MB, RGBA
    size = reader.size()
    if not size.isValid() or size.width() * size.height() > MAX_PIXELS:
        return QImage()
    if max_side and max(size.width(), size.height()) > max_side:
        reader.setScaledSize(size.scaled(max_side, max_side, Qt.AspectRatioMode.KeepAspectRatio))
    image = reader.read()
    del buf
    return image


def placeholder(text: str, side: int = THUMB_SIDE) -> QImage:
    """A grey box saying ``text``, where a picture cannot be shown."""
    image = QImage(side, side * 2 // 3, QImage.Format.Format_RGB32)
    image.fill(QColor("#d0d4da"))
    painter = QPainter(image)
    painter.setPen(QColor("#4a5160"))
    painter.drawText(
        image.rect().adjusted(8, 8, -8, -8),
        Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
        text,
    )
    painter.end()
    return image


class ThumbCache:
    """Thumbnails by image digest, the least recently used dropped first."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._images: OrderedDict[str, QImage] = OrderedDict()

    def get(self, digest: str) -> QImage | None:
        image = self._images.get(digest)
        if image is not None:
            self._images.move_to_end(digest)
        return image

    def put(self, digest: str, image: QImage) -> None:
        self._images[digest] = image
        self._images.move_to_end(digest)
        while len(self._images) > self._size:
            self._images.popitem(last=False)


def image_label(meta: Mapping[str, Any]) -> str:
    """ "photo.jpg · 1024×768" for an image's stored description."""
    name = str(meta.get("name") or "pasted image")
    w, h = meta.get("width"), meta.get("height")
    return f"{name} · {w}×{h}" if isinstance(w, int) and isinstance(h, int) and w > 0 else name


class MessageImages:
    """The pictures of the transcript's user messages: thumbnails above the text, each a
    link (``<href>/<index>/<n>``) that opens the viewer.

    ``source(digest)`` finds an image's file (None: not there); the window sets it.
    """

    def __init__(self, view: QTextEdit, href: str) -> None:
        self._view = view
        self._href = href
        self.source: Callable[[str], Path | None] = lambda _digest: None
        self.cache = ThumbCache()
        self._shown: dict[int, list[Mapping[str, Any]]] = {}  # message index -> its images
        self.viewer: ImageViewer | None = None

    def clear(self) -> None:
        self._shown = {}

    def html(self, index: int, images: Sequence[Mapping[str, Any]]) -> str:
        """The thumbnails of message ``index`` as HTML (its resources added)."""
        from PySide6.QtGui import QTextDocument

        if not images:
            return ""
        self._shown[index] = list(images)
        parts = []
        for n, meta in enumerate(images):
            digest = str(meta.get("digest", ""))
            thumb, found = self._thumb(digest)
            url = QUrl(f"{RESOURCE_SCHEME}:{digest or 'none'}")
            self._view.document().addResource(QTextDocument.ResourceType.ImageResource, url, thumb)
            tip = html.escape(image_label(meta) if found else MISSING, quote=True)
            parts.append(
                f'<a href="{self._href}/{index}/{n}"><img src="{url.toString()}" '
                f'width="{thumb.width()}" height="{thumb.height()}" title="{tip}"></a> '
            )
        return "<p>" + "".join(parts) + "</p>"

    def _thumb(self, digest: str) -> tuple[QImage, bool]:
        cached = self.cache.get(digest)
        if cached is not None:
            return cached, True
        path = self.source(digest) if digest else None
        image = read_image(path, THUMB_SIDE) if path is not None else QImage()
        if image.isNull():
            return placeholder(MISSING), False  # not cached: the file may come back
        self.cache.put(digest, image)
        return image, True

    def activate(self, index: int, n: int) -> bool:
        """Open picture ``n`` of message ``index`` in the viewer."""
        images = self._shown.get(index, [])
        if not 0 <= n < len(images):
            return False
        meta = images[n]
        path = self.source(str(meta.get("digest", "")))
        if self.viewer is not None:
            self.viewer.close()
        self.viewer = ImageViewer(path, image_label(meta), str(meta.get("name", "")), self._view)
        self.viewer.finished.connect(self._on_viewer_closed)
        self.viewer.open()
        return True

    def _on_viewer_closed(self, _result: int) -> None:
        if self.viewer is not None:
            self.viewer.deleteLater()
            self.viewer = None


class ImageViewer(QDialog):
    """One picture, fitted to the window or at 100 %, with Copy image and Save as…."""

    def __init__(
        self, path: Path | None, title: str, name: str = "", parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setObjectName("imageViewer")
        self.setWindowTitle(title or "Image")
        self._path = path
        self._name = name
        self.image = read_image(path) if path is not None else QImage()
        self.fitted = True
        self.label = QLabel(self)
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.label.setAccessibleName(title or "Image")
        self.area = QScrollArea(self)
        self.area.setWidget(self.label)
        self.area.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.area.setWidgetResizable(True)
        self.zoom_button = QPushButton("100 %", self)
        self.zoom_button.setToolTip("Show the picture at its own size (or fitted)")
        self.zoom_button.clicked.connect(self.toggle_zoom)
        self.copy_button = QPushButton("Copy image", self)
        self.copy_button.clicked.connect(self.copy_image)
        self.save_button = QPushButton("Save as…", self)
        self.save_button.clicked.connect(self.save_as)
        self.info = QLabel(self)
        self.info.setStyleSheet("color: #888888;")
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        close.rejected.connect(self.reject)
        row = QHBoxLayout()
        for w in (self.zoom_button, self.copy_button, self.save_button):
            row.addWidget(w)
        row.addWidget(self.info, 1)
        row.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.area, 1)
        layout.addLayout(row)
        ok = not self.image.isNull()
        for b in (self.zoom_button, self.copy_button, self.save_button):
            b.setEnabled(ok)
        if ok:
            size = path.stat().st_size if path is not None and path.exists() else 0
            self.info.setText(f"{self.image.width()}×{self.image.height()} · {size_text(size)}")
        else:
            self.label.setText(MISSING if path is None else "This image could not be read.")
        self.resize(900, 700)

    def showEvent(self, event: Any) -> None:  # Qt's name
        super().showEvent(event)
        self._show()

    def resizeEvent(self, event: Any) -> None:  # Qt's name
        super().resizeEvent(event)
        if self.fitted:
            self._show()

    def _show(self) -> None:
        if self.image.isNull():
            return
        pixmap = QPixmap.fromImage(self.image)
        if self.fitted:
            room = self.area.viewport().size() - QSize(4, 4)
            if pixmap.width() > room.width() or pixmap.height() > room.height():
                pixmap = pixmap.scaled(
                    room,
                    Qt.AspectRatioMode.KeepAspectRatio,
                    Qt.TransformationMode.SmoothTransformation,
                )
        self.label.setPixmap(pixmap)

    def toggle_zoom(self) -> None:
        """Switch between fitted and 100 %."""
        self.fitted = not self.fitted
        self.area.setWidgetResizable(self.fitted)
        self.zoom_button.setText("100 %" if self.fitted else "Fit")
        self._show()
        if not self.fitted:
            self.label.adjustSize()

    def copy_image(self) -> None:
        if not self.image.isNull():
            QApplication.clipboard().setImage(self.image)

    def save_as(self) -> None:
        """Save the stored file itself (not a re-encoding) under a chosen name."""
        if self._path is None:
            return
        suggested = self._name or f"image.{self._path.suffix.lstrip('.') or 'png'}"
        target, _ = QFileDialog.getSaveFileName(self, "Save image as", suggested)
        if not target:
            return
        try:
            atomic_write_bytes(Path(target), self._path.read_bytes())
        except OSError as exc:
            self.info.setText(f"Not saved: {exc.strerror or exc}")
        else:
            self.info.setText(f"Saved as {Path(target).name}.")
