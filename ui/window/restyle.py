"""The transcript drawn again after a light/dark switch.

Its HTML has the colours baked in, so a palette change does not reach it by itself;
it is drawn again once no reply streams (a streaming reply keeps its frame).
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, SignalInstance
from PySide6.QtWidgets import QWidget

from ui.common import theme


class TranscriptRestyle(QObject):
    """Watches ``owner``'s palette; ``redraw()`` runs when it turned light or dark and
    ``blocked()`` is False (else after the next ``reply_ended``)."""

    def __init__(
        self,
        owner: QWidget,
        blocked: Callable[[], bool],
        redraw: Callable[[], None],
        reply_ended: SignalInstance,
    ) -> None:
        super().__init__(owner)
        self._owner = owner
        self._blocked = blocked
        self._redraw = redraw
        self._dark = theme.is_dark(owner.palette())
        self.pending = False
        reply_ended.connect(self._on_reply_ended)

    def palette_changed(self) -> None:
        dark = theme.is_dark(self._owner.palette())
        if dark != self._dark:
            self._dark = dark
            self.pending = True
            if not self._blocked():
                QTimer.singleShot(0, self._restyle)

    def _on_reply_ended(self, _how: str) -> None:
        if self.pending:
            QTimer.singleShot(0, self._restyle)

    def _restyle(self) -> None:
        if not self.pending or self._blocked():
            return
        self.pending = False
        self._redraw()
