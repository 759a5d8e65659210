"""The status bar's model corner: what is loaded, load progress and its Cancel button."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QLabel, QProgressBar, QPushButton, QStatusBar, QWidget

from app.engine.backend import ModelInfo


def vision_text(info: ModelInfo | None) -> str:
    """``sees images`` when the model in use takes images (a projector is loaded, or the
    server says so); "" otherwise."""
    if info is None:
        return ""
    return "sees images" if info.projector or info.capabilities.vision else ""


_MEMORY = {
    "attention": "a KV cache",
    "sliding-window": "a KV cache, with sliding-window layers",
    "hybrid": "recurrent layers with attention layers (hybrid)",
    "recurrent": "a recurrent state, no KV cache",
}


def memory_text(info: ModelInfo | None) -> str:
    """How the model in use remembers the conversation, and what that means for a
    rewind; for a server whose model is not known, that it is not known ("" with no
    model, or an in-process engine that does not say)."""
    if info is None:
        return ""
    caps = info.capabilities
    if not caps.memory:
        return "Memory: not known (the server does not report it)" if info.server else ""
    text = f"Memory: {_MEMORY.get(caps.memory, caps.memory)}"
    if caps.memory in ("hybrid", "recurrent"):
        if info.server:  # the server's checkpoints are its own (``why_not["checkpoints"]``)
            why = caps.why_not.get("checkpoints", "")
            return text + (f". {why}" if why else "")  # it starts "llama-server"
        text += ". Its state is kept at checkpoints: a rewind goes back to the nearest one"
    return text


class ModelStatus:
    """Widgets in ``bar`` that say which model is loaded, or how its load is going."""

    def __init__(self, parent: QWidget, bar: QStatusBar, cancel: Callable[[], None]) -> None:
        self.label = QLabel("No model", parent)
        self.label.setObjectName("statusModel")
        self.backend = QLabel("", parent)
        self.backend.setObjectName("statusBackend")
        self.progress = QProgressBar(parent)
        self.progress.setObjectName("loadProgress")
        self.progress.setRange(0, 100)
        self.progress.setMaximumWidth(180)
        self.progress.hide()
        self.cancel_button = QPushButton("Cancel", parent)
        self.cancel_button.setObjectName("cancelLoadButton")
        self.cancel_button.clicked.connect(cancel)
        self.cancel_button.hide()
        bar.addWidget(self.label, 1)
        bar.addPermanentWidget(self.progress)
        bar.addPermanentWidget(self.cancel_button)

    def loading(self, what: str = "Loading model…") -> None:
        self.progress.setValue(0)
        self.progress.show()
        self.cancel_button.show()
        self.label.setText(what)

    def advanced(self, value: float, what: str) -> None:
        self.progress.setValue(int(value * 100))
        self.label.setText(f"{what}… {value:.0%}")

    def loaded(self, info: ModelInfo) -> None:
        self._done()
        size = (
            f"{info.n_params / 1e6:.0f}M" if info.n_params < 1e9 else f"{info.n_params / 1e9:.1f}B"
        )
        vision = vision_text(info)
        self.label.setText(
            f"{info.name} · {size} · ctx {info.n_ctx} · template {info.template}"
            + (f" · {vision}" if vision else "")
        )
        where = f"\nVision projector: {info.projector}" if info.projector else ""
        memory = memory_text(info)
        self.label.setToolTip(f"{info.path}{where}" + (f"\n{memory}" if memory else ""))
        self.backend.setText(info.backend)

    def failed(self, still: ModelInfo | None) -> None:
        """A load failed; ``still`` is the model that stays loaded, if any."""
        self._done()
        if still is not None:
            self.label.setText(f"{still.name} (still loaded)")
        else:
            self.none("No model loaded: open one with Ctrl+O")

    def none(self, text: str = "No model loaded: open one with Ctrl+O or Ctrl+M") -> None:
        self.label.setText(text)
        self.backend.setText("")

    def _done(self) -> None:
        self.progress.hide()
        self.cancel_button.hide()
