"""The first run and download alerts, on the main window (``Onboarding``).

- A welcome card when the model loaded is the embedded default (a 270M *base*
  model with no chat template) and the library holds no other chat model: it
  says plainly what that model is, and offers the three recommended models that
  fit this machine best, one click each to download and switch, plus the model
  manager. It floats at the foot of the empty transcript (it takes no room from
  the conversation), scrolls where the transcript is shorter than it (a documents
  bar, image chips) and steps aside while the open chat has messages. Non-modal;
  closing it is remembered in ``onboarding.json`` in the data dir. Help →
  Recommended models… opens the full list at any time.
- "Download and use" (from the card or the model manager) loads the model once
  its download is done.
- A tray message (or, without a system tray, ``QApplication.alert``) when a
  download finishes or fails while no Lamplight window is active.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path

import shiboken6
from PySide6.QtCore import QEvent, QObject, QRect, Qt, QTimer, Signal, SignalInstance
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSystemTrayIcon,
    QTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.conversation import Conversation
from app.engine.backend import ModelInfo
from app.engine.local.offload import KV_BYTES
from app.models.downloads import DownloadJob
from app.models.library import LibraryEntry
from app.models.recommended import (
    Recommended,
    RecommendedListError,
    default_model_name,
    first_run_choices,
    set_welcome_dismissed,
    welcome_dismissed,
)
from app.util import sysinfo
from ui.common.context import Context
from ui.models import recommended_view
from ui.models.hub_workers import HubServices, RecommendedInstalls
from ui.models.model_manager import ModelManager
from ui.models.recommended_view import EntryRow

log = logging.getLogger(__name__)

ALERT_MS = 8000  # how long a tray message shows
FIRST_RUN_COUNT = 3
CARD_MAX_WIDTH = 760  # px: a readable line, centred in a wide transcript
CARD_MARGIN = 12  # px between the card and the transcript's edges
CARD_MIN_HEIGHT = 120  # px the card keeps at least (its first lines); the rest scrolls


def is_default_model(info: ModelInfo) -> bool:
    """Whether ``info`` is the embedded default model (loaded in-process)."""
    name = default_model_name()
    return bool(name) and not info.server and Path(info.path).name == name


def other_chat_models(entries: list[LibraryEntry]) -> list[LibraryEntry]:
    """Usable models in the library other than the embedded default."""
    default = default_model_name()
    return [e for e in entries if e.valid and not e.is_adapter and e.path.name != default]


class WelcomeCard(QFrame):
    """What the embedded model is, and three chat models to get instead.

    Signals:
        closed(): the user closed the card (for good).
        managerRequested(bool): open the model manager (True: on its Recommended tab).
    """

    closed = Signal()
    managerRequested = Signal(bool)

    def __init__(
        self,
        installs: RecommendedInstalls,
        choices: list[Recommended],
        free: int,
        n_ctx: int,
        kv_bytes: float,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("welcomeCard")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName("Welcome: get a chat model")
        close = QToolButton(self)
        close.setObjectName("welcomeClose")
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Close (Help → Recommended models… shows the list again)")
        close.setAccessibleName("Close the welcome")
        close.clicked.connect(self.closed)
        self.body = QLabel(
            "<b>Welcome to Lamplight.</b> The built-in Gemma 3 270M is a small text-completion "
            "model for trying things out: it continues text, it does not chat. For real "
            "conversations, get a chat model sized for this computer; one click downloads it "
            "and switches to it.",
            self,
        )
        self.body.setObjectName("welcomeBody")
        self.body.setTextFormat(Qt.TextFormat.RichText)
        self.body.setWordWrap(True)
        head = QHBoxLayout()
        head.addWidget(self.body, 1)
        head.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        self.memory = QLabel(recommended_view.memory_line(free, sysinfo.physical_memory()), self)
        self.memory.setObjectName("welcomeMemory")
        self.memory.setWordWrap(True)  # beside the buttons in a narrow transcript
        # Inside a scroll area: where the documents bar or image chips leave the empty
        # transcript less room than the card needs, it scrolls instead of being cut off.
        self.content = QWidget(self)
        self.content.setObjectName("welcomeContent")
        layout = QVBoxLayout(self.content)
        layout.setSpacing(4)
        layout.addLayout(head)
        self.rows: list[EntryRow] = []
        for entry in choices:
            row = EntryRow(entry, installs, n_ctx, kv_bytes, self.content, compact=True)
            row.set_free(free)
            self.rows.append(row)
            layout.addWidget(row)
        if not choices:
            none = QLabel(
                "None of the recommended models fits the memory free now; the model manager "
                "lists them all, and others.",
                self.content,
            )
            none.setWordWrap(True)
            layout.addWidget(none)
        buttons = QHBoxLayout()
        more = QPushButton("All recommended models…", self)
        more.setObjectName("welcomeMore")
        more.clicked.connect(partial(self.managerRequested.emit, True))
        manager = QPushButton("Open the model manager", self)
        manager.setObjectName("welcomeManager")
        manager.clicked.connect(partial(self.managerRequested.emit, False))
        buttons.addWidget(more)
        buttons.addWidget(manager)
        buttons.addStretch(1)
        buttons.addWidget(self.memory)
        layout.addLayout(buttons)
        self.scroll_area = self._scrolling(self.content)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)

    def _scrolling(self, content: QWidget) -> QScrollArea:
        """``content`` in a frameless scroll area that fills the card."""
        area = QScrollArea(self)
        area.setObjectName("welcomeScroll")
        area.setFrameShape(QFrame.Shape.NoFrame)
        area.setWidgetResizable(True)
        area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        area.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(area)
        # It floats over the transcript: its own background, not the text beneath.
        self.setAutoFillBackground(True)
        content.setAutoFillBackground(True)
        return area

    def least_width(self) -> int:
        """The narrowest the card reads well at (its buttons side by side)."""
        inner = self.content.minimumSizeHint().width()
        bar = self.scroll_area.verticalScrollBar().sizeHint().width()
        return inner + bar + 2 * self.frameWidth()

    def full_height(self, width: int) -> int:
        """The height that shows all of it, ``width`` wide (no scrolling)."""
        inner = max(1, width - 2 * self.frameWidth())
        layout = self.content.layout()
        assert layout is not None
        height = layout.totalHeightForWidth(inner) if layout.hasHeightForWidth() else -1
        if height < 0:
            height = layout.totalSizeHint().height()
        return height + 2 * self.frameWidth()


class Onboarding(QObject):
    """The window's first-run card, "Download and use" loading, and download alerts."""

    def __init__(
        self,
        ctx: Context,
        services: HubServices | None,
        transcript: QTextEdit,
        model_ready: SignalInstance,
        add_to_menu: Callable[[str, QAction], None],
        listen: Callable[[Callable[[Conversation], None]], None],
        show_manager: Callable[[], ModelManager | None],
    ) -> None:
        """``model_ready`` is emitted with each loaded model's info; ``add_to_menu(title,
        action)`` puts an action in a window menu; ``listen(f)`` calls ``f`` with each
        conversation shown; ``show_manager()`` shows the model manager (None: none)."""
        super().__init__(ctx.parent)
        self._ctx = ctx
        self._services = services
        self._transcript = transcript
        self._viewport = transcript.viewport()
        self._listen = listen
        self._show_manager = show_manager
        self.card: WelcomeCard | None = None
        self.alerts: list[tuple[str, str]] = []  # every alert shown (title, text)
        self._waiting_scan = False
        self._loaded: ModelInfo | None = None
        self._tray: QSystemTrayIcon | None = None
        self._watching = False  # the transcript's size and contents move the card
        self._placing = False
        model_ready.connect(self._on_model_ready)
        self.recommended_action = QAction("Recommended models…", ctx.parent)
        self.recommended_action.setObjectName("recommendedModelsAction")
        self.recommended_action.setToolTip("Small chat models that run well on this computer")
        self.recommended_action.triggered.connect(self.show_recommended)
        self.recommended_action.setEnabled(self._services is not None)
        add_to_menu("&Help", self.recommended_action)
        services = self._services
        if services is None:
            return
        services.hub.libraryDone.connect(self._on_library)
        services.installs.ready.connect(self._on_install_ready)
        services.installs.failed.connect(self._on_install_failed)
        services.downloads.jobEnded.connect(self._on_job_ended)

    # -- the welcome card ----------------------------------------------------------------

    def _on_model_ready(self, info: ModelInfo) -> None:
        self._loaded = info
        if not is_default_model(info):
            self.hide_card()
            return
        if self._services is None or self.card is not None:
            return
        if welcome_dismissed(self._ctx.dirs.root):
            return
        self._waiting_scan = True
        self._services.scan([Path(p) for p in self._ctx.settings.value.imported_models])

    def _on_library(self, entries: list[LibraryEntry]) -> None:
        if not self._waiting_scan:
            return
        self._waiting_scan = False
        loaded = self._loaded
        if loaded is not None and is_default_model(loaded) and not other_chat_models(entries):
            self.show_card()

    def show_card(self) -> WelcomeCard | None:
        """Show the welcome card over the foot of the empty transcript (None: it cannot be)."""
        if self._services is None:
            return None
        if self.card is not None:
            return self.card
        try:
            listing = recommended_view.bundled_list()
        except RecommendedListError as exc:
            log.warning("no welcome card: %s", exc)
            return None
        load = self._ctx.settings.value.load
        kv_bytes = KV_BYTES.get(load.kv_type, 2.0)
        free = sysinfo.available_memory()
        choices = first_run_choices(listing.entries, free, FIRST_RUN_COUNT, load.n_ctx, kv_bytes)
        transcript = self._transcript
        card = WelcomeCard(self._services.installs, choices, free, load.n_ctx, kv_bytes, transcript)
        card.closed.connect(self._on_card_closed)
        card.managerRequested.connect(self._on_manager_requested)
        self.card = card
        if not self._watching:
            self._watching = True
            transcript.installEventFilter(self)
            self._viewport.installEventFilter(self)
            transcript.document().contentsChanged.connect(self.place_card)
            self._listen(self._on_conversation)
        self.place_card()
        return card

    def hide_card(self) -> None:
        if self.card is not None:
            self.card.hide()
            self.card.setParent(None)
            self.card.deleteLater()
            self.card = None
            self._transcript.setMinimumSize(0, 0)

    def place_card(self) -> None:
        """Show the card at the foot of the transcript while the open chat is empty, as
        wide as reads well and as tall as it needs (at most the transcript's height)."""
        card = self.card
        if card is None or self._placing:
            return
        self._placing = True  # a minimum size set here resizes the transcript at once
        try:
            self._place(card)
        finally:
            self._placing = False

    def _place(self, card: WelcomeCard) -> None:
        transcript = self._transcript
        if self._ctx.session.conversation.messages:
            card.hide()
            transcript.setMinimumSize(0, 0)
            return
        # Room for its buttons side by side and its first lines (a small window grows that
        # much); what does not fit scrolls, so the window never outgrows a laptop's screen.
        least = card.least_width()
        frame = transcript.size() - transcript.viewport().size()
        transcript.setMinimumSize(
            least + 2 * CARD_MARGIN + frame.width(),
            min(card.full_height(least), CARD_MIN_HEIGHT) + 2 * CARD_MARGIN + frame.height(),
        )
        view = transcript.viewport().geometry()
        width = max(1, min(view.width() - 2 * CARD_MARGIN, CARD_MAX_WIDTH))
        height = max(1, min(card.full_height(width), view.height() - 2 * CARD_MARGIN))
        x = view.x() + (view.width() - width) // 2
        y = max(view.y(), view.y() + view.height() - CARD_MARGIN - height)
        card.setGeometry(QRect(x, y, width, height))
        card.raise_()
        card.show()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        # The viewport's resize, not the transcript's: that one comes before the viewport
        # has its new size, and a card placed for the old one was cut off (a chip or the
        # documents bar taking room).
        kind = event.type()
        resized = watched is self._viewport and kind == QEvent.Type.Resize
        shown = watched is self._transcript and kind == QEvent.Type.Show
        # Not while the window is torn down: its viewport still gets events then.
        if (resized or shown) and shiboken6.isValid(self._transcript):
            self.place_card()
        return False

    def _on_conversation(self, _conv: Conversation) -> None:
        self.place_card()

    def _on_card_closed(self) -> None:
        self.hide_card()
        try:
            set_welcome_dismissed(self._ctx.dirs.root)
        except OSError as exc:
            self._ctx.status(
                f"Could not remember that the welcome was closed: {exc.strerror or exc}", 8000
            )

    def _on_manager_requested(self, recommended: bool) -> None:
        if recommended:
            self.show_recommended()
        else:
            self._show_manager()

    def show_recommended(self) -> None:
        """Open the model manager on its Recommended tab."""
        manager = self._show_manager()
        if manager is not None:
            manager.show_recommended()

    # -- download and use ----------------------------------------------------------------

    def _on_install_ready(self, path: str) -> None:
        self._ctx.status(f"Loading {Path(path).name}…", 5000)
        self._ctx.open_model(path)

    def _on_install_failed(self, _entry_id: str, message: str) -> None:
        self._ctx.status(message, 10000)

    # -- alerts --------------------------------------------------------------------------

    def window_active(self) -> bool:
        """Whether the user is looking at Lamplight (one of its windows is active)."""
        return QApplication.activeWindow() is not None

    def _on_job_ended(self, job: DownloadJob) -> None:
        if job.state not in ("done", "failed") or self.window_active():
            return
        if job.state == "done":
            self.alert("Download finished", f"{job.name} is ready to use.")
        else:
            self.alert("Download failed", job.error or f"{job.name} could not be downloaded.")

    def alert(self, title: str, text: str) -> None:
        """Tell the user while they are elsewhere: a tray message where there is a tray,
        and the taskbar entry asks for attention."""
        self.alerts.append((title, text))
        icon = self._ctx.parent.windowIcon()
        if QSystemTrayIcon.isSystemTrayAvailable() and not icon.isNull():
            if self._tray is None:
                self._tray = QSystemTrayIcon(icon, self)
                self._tray.setToolTip("Lamplight")
                self._tray.messageClicked.connect(self._on_message_clicked)
            self._tray.show()
            self._tray.showMessage(title, text, QSystemTrayIcon.MessageIcon.Information, ALERT_MS)
            QTimer.singleShot(ALERT_MS + 2000, self._hide_tray)
        QApplication.alert(self._ctx.parent, 0)

    def _hide_tray(self) -> None:
        if self._tray is not None:
            self._tray.hide()

    def _on_message_clicked(self) -> None:
        if self._ctx.parent.isMinimized():
            self._ctx.parent.showNormal()
        self._ctx.parent.raise_()
        self._ctx.parent.activateWindow()
