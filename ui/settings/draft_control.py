"""The draft model chooser: a row in the sampling panel's speculative section.

The combo lists the library's models checked as drafts for the loaded model on the
engine's thread (``EngineClient.list_drafts``, header metadata only): the ones with
the same vocabulary and a smaller file can be chosen; the others are listed greyed
out, each with the reason as its tooltip. "…" takes any GGUF file, checked the same
way when it loads. The engine loads the draft (``EngineClient.set_draft``) and
answers with ``draftLoaded`` or ``draftFailed``; the status line under the combo
says what is loaded, what is loading, and why a choice was refused.

The draft belongs to the conversation: a reply that drafts with it records its path
(``ChatSession.draft_path`` into ``Conversation.draft_path``), and opening that
conversation loads it again. An engine that cannot use one (a server) greys the row
and the draft settings out with its reason.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.conversation import Conversation
from app.config.setting_records import SamplingParams
from app.engine.backend import DraftInfo, ModelInfo
from app.host.jobs import DraftCandidate
from app.util.sysinfo import size_text
from ui.common.context import Context
from ui.common.qt_util import blocked
from ui.settings.sampling_panel import SamplingPanel

PATH_ROLE = Qt.ItemDataRole.UserRole
ERROR_STYLE = "color: #c62828;"
MUTED_STYLE = "color: palette(mid);"
DRAFT_FIELDS = ("draft_model", "adaptive_draft")  # settings that mean nothing without one
COMBO_HELP = (
    "A smaller model with the same vocabulary guesses the next tokens, and the loaded "
    "model checks each guess in one batch, keeping those it would have chosen itself. "
    "Sampled replies keep the model's distribution exactly. A greedy reply is the same as "
    "without drafting up to floating-point rounding: batched and one-token evaluation "
    "round differently, which can flip a near-tie and change the rest of the reply. "
    "Greyed-out models cannot draft for this one; hover one to see why."
)


def params_text(n: int) -> str:
    """``270M`` or ``1.5B`` parameters."""
    return f"{n / 1e6:.0f}M" if n < 1e9 else f"{n / 1e9:.1f}B"


class DraftCombo(QComboBox):
    """A combo that asks for a fresh list each time it opens.

    Signals:
        aboutToOpen(): the popup is about to show.
    """

    aboutToOpen = Signal()

    def showPopup(self) -> None:
        self.aboutToOpen.emit()
        super().showPopup()


class DraftControl(QObject):
    """The chooser row, its status line, and the draft model's place in a conversation."""

    def __init__(self, ctx: Context, sampling: SamplingPanel) -> None:
        super().__init__(ctx.parent)
        self._ctx = ctx
        self._client = ctx.client
        self._sampling = sampling
        self.loaded: DraftInfo | None = None  # what the engine has loaded
        self.wanted = ""  # the path asked for last ("" none); the engine's answer follows
        self.candidates: list[DraftCandidate] = []
        self._target = ""  # the loaded model's path, for which the candidates were checked
        self._why_not = ""  # why the engine in use takes no draft ("" when it does)
        self._build(sampling.slot("draft_model"))
        ctx.model.loaded.connect(self._on_model_loaded)
        w = self._client.worker
        # Bound methods: queued to the GUI thread.
        w.draftLoaded.connect(self._on_draft_loaded)
        w.draftFailed.connect(self._on_draft_failed)
        w.draftCandidates.connect(self._on_candidates)
        sampling.samplingChanged.connect(self._on_sampling_changed)
        self._fill()
        self._show_state()

    def _build(self, slot: QWidget) -> None:
        box = slot.layout()
        assert isinstance(box, QVBoxLayout)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        self.caption = QLabel("Draft model", slot)
        self.combo = DraftCombo(slot)
        self.combo.setObjectName("draftModelCombo")
        self.combo.setAccessibleName("Draft model")
        self.combo.setToolTip(COMBO_HELP)
        self.combo.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.combo.setMinimumContentsLength(12)
        self.combo.activated.connect(self._on_activated)
        self.combo.aboutToOpen.connect(self.refresh)
        self.browse = QToolButton(slot)
        self.browse.setObjectName("draftBrowseButton")
        self.browse.setText("…")
        self.browse.setToolTip("Choose a GGUF file as the draft model")
        self.browse.setAccessibleName("Choose a draft model file")
        self.browse.clicked.connect(self._on_browse)
        row.addWidget(self.caption)
        row.addWidget(self.combo, 1)
        row.addWidget(self.browse)
        self.status = QLabel("", slot)
        self.status.setObjectName("draftStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        box.addLayout(row)
        box.addWidget(self.status)

    # -- commands --------------------------------------------------------------------

    def choose(self, path: str | Path | None) -> None:
        """Load ``path`` as the draft model (None or "" for none); the engine answers."""
        wanted = str(path) if path else ""
        if self._why_not and wanted:
            self._show_error(f"A draft model cannot be used: {self._why_not}.")
            return
        self.wanted = wanted
        self._client.set_draft(wanted or None)
        self._show_state(loading=True)

    def refresh(self) -> None:
        """Check the library again (the answer refills the combo)."""
        if self._ctx.model.info is not None and not self._why_not and self._target:
            self._client.list_drafts(
                self._target, self._ctx.dirs.library_file, self._ctx.settings.value.imported_models
            )

    # -- engine events ---------------------------------------------------------------

    def _on_model_loaded(self, info: ModelInfo) -> None:
        self.loaded = None  # a new model drops the draft; the worker loads the wanted one again
        self._ctx.session.draft_path = ""
        caps = info.capabilities
        self._why_not = (
            "" if caps.draft_model else caps.why_not.get("draft_model", "this engine takes none")
        )
        for w in (self.combo, self.browse):
            w.setEnabled(not self._why_not)
            w.setToolTip(self._why_not[:1].upper() + self._why_not[1:] if self._why_not else "")
        self.combo.setToolTip(f"Not available: {self._why_not}." if self._why_not else COMBO_HELP)
        reason = f"Not available: {self._why_not}." if self._why_not else ""
        unavailable = {name: reason for name in DRAFT_FIELDS} if reason else {}
        if not caps.mtp:  # the model's own next-token layers: only where it has them
            why = caps.why_not.get("mtp", "the model has no next-token (MTP) layers")
            unavailable["mtp"] = f"Not available: {why}."
        self._sampling.set_draft_unavailable(unavailable)
        self._target = "" if info.server else str(info.path)
        self.candidates = []
        self._fill()
        self.refresh()
        self._show_state(loading=bool(self.wanted) and not self._why_not)

    def _on_draft_loaded(self, info: DraftInfo | None) -> None:
        self.loaded = info
        self.wanted = str(info.path) if info is not None else ""
        self._ctx.session.draft_path = self.wanted
        self._fill()
        self._show_state()

    def _on_draft_failed(self, message: str) -> None:
        self.wanted = str(self.loaded.path) if self.loaded is not None else ""
        self._ctx.session.draft_path = self.wanted
        self._fill()
        self._show_error(message)
        self._ctx.status(message, 10000)

    def _on_candidates(self, target: str, found: list[DraftCandidate]) -> None:
        if target != self._target:
            return  # for a model no longer loaded
        self.candidates = list(found)
        self._fill()

    def _on_sampling_changed(self, _params: SamplingParams) -> None:
        if self.status.styleSheet() != ERROR_STYLE:
            self._show_state()

    def on_conversation(self, conv: Conversation) -> None:
        """An opened conversation brings back the draft model its replies used."""
        path = conv.draft_path
        if not path or path == self.wanted or self._why_not:
            return
        try:
            there = Path(path).is_file()
        except (OSError, ValueError):
            there = False
        if not there:
            self._ctx.notice(
                f"This conversation drafted with {Path(path).name}, which is no longer at "
                f"{path}; replies go on without that draft model."
            )
            return
        self.choose(path)

    # -- widgets ---------------------------------------------------------------------

    def _on_activated(self, index: int) -> None:
        path = str(self.combo.itemData(index, PATH_ROLE) or "")
        if path != self.wanted:
            self.choose(path)

    def _on_browse(self) -> None:
        start = str(self._ctx.dirs.models)
        path, _ = QFileDialog.getOpenFileName(
            self._ctx.parent, "Choose a draft model", start, "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.choose(path)

    def _fill(self) -> None:
        """The combo: None, the usable drafts, then the others greyed out with the reason."""
        combo = self.combo
        with blocked(combo):
            combo.clear()
            combo.addItem("None", "")
            paths = {str(c.path) for c in self.candidates}
            for c in self.candidates:
                label = f"{c.name} · {size_text(c.size)}"
                combo.addItem(label + (" — cannot draft" if c.problem else ""), str(c.path))
                i = combo.count() - 1
                combo.setItemData(i, c.problem or str(c.path), Qt.ItemDataRole.ToolTipRole)
                if c.problem:
                    model = combo.model()
                    assert isinstance(model, QStandardItemModel)
                    item = model.item(i)
                    item.setEnabled(False)
            for extra in (str(self.loaded.path) if self.loaded else "", self.wanted):
                if extra and extra not in paths:  # a file chosen with "…"
                    combo.addItem(Path(extra).name, extra)
                    combo.setItemData(combo.count() - 1, extra, Qt.ItemDataRole.ToolTipRole)
                    paths.add(extra)
            index = combo.findData(self.wanted, PATH_ROLE)
            combo.setCurrentIndex(max(0, index))

    def _show_state(self, loading: bool = False) -> None:
        params = self._sampling.params()
        if self._why_not:
            text = f"Not available: {self._why_not}."
        elif loading and self.wanted:
            text = f"Loading {Path(self.wanted).name} and checking its vocabulary…"
        elif loading:
            text = "Unloading the draft model…"
        elif self.loaded is not None:
            d = self.loaded
            text = f"{d.name} loaded ({params_text(d.n_params)} parameters, context {d.n_ctx})."
            if not params.draft_model:
                text += " Switch on “Use draft model” to draft with it."
        else:
            text = "No draft model loaded."
            if params.draft_model:
                text += " “Use draft model” has nothing to draft with: choose one here."
        self.status.setStyleSheet(MUTED_STYLE)
        self.status.setText(text)

    def _show_error(self, message: str) -> None:
        self.status.setStyleSheet(ERROR_STYLE)
        self.status.setText(message)
