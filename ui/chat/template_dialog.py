"""Model → Chat template…: choose a model's template, or write one, with a live preview.

The preview renders a sample conversation (or the open chat) with the chosen
template in the same sandbox, with the same checks and limits, as a template
from a GGUF file (``app.engine.templates.override.preview_prompt``). That can take up to
the sandbox's load budget for a hostile template, so it runs in the background
(``run_in_background``), one at a time. A custom template that fails shows why and cannot be saved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.config.model_prefs import ModelPrefs
from app.engine.chat_message import ChatMessage
from app.engine.template_errors import ChatTemplateError
from app.engine.templates.builtin import BUILTIN
from app.engine.templates.guard import GRACE_S
from app.engine.templates.override import (
    AUTO,
    PLAIN,
    TemplateInputs,
    TemplateOverride,
    preview_prompt,
)
from app.engine.templates.sandbox import LOAD_BUDGET_S, RENDER_BUDGET_S
from ui.common.background import Job, run_in_background

PREVIEW_DELAY_MS = 250  # after the last keystroke
PREVIEW_CHARS = 100_000  # the preview shows the end of a longer prompt
JOIN_S = LOAD_BUDGET_S + RENDER_BUDGET_S + 2 * GRACE_S + 1.0  # the longest a preview can run

SAMPLE_CHAT = (
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "Hello! Who are you?"),
    ChatMessage("assistant", "Hi! I am an assistant. How can I help?"),
    ChatMessage("user", "What is the capital of France?"),
)
STARTER = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TemplateChoice:
    """What the dialog saved: the template, and continue-the-text mode."""

    override: TemplateOverride
    completion: bool


@dataclass(frozen=True)
class PreviewResult:
    text: str = ""
    note: str = ""
    error: str = ""


def _preview(
    override: TemplateOverride, inputs: TemplateInputs, messages: Sequence[ChatMessage]
) -> PreviewResult:
    try:
        text, note = preview_prompt(override, inputs, messages)
        return PreviewResult(text=text, note=note)
    except ChatTemplateError as exc:
        return PreviewResult(error=str(exc))
    except Exception as exc:  # the dialog must always get an answer
        return PreviewResult(error=f"failed: {exc}")


class TemplateDialog(QDialog):
    """Chooses the chat template (or continue-the-text mode) for one model."""

    def __init__(
        self,
        model_name: str,
        inputs: TemplateInputs,
        base_model: bool,
        prefs: ModelPrefs,
        chat: Sequence[ChatMessage],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("templateDialog")
        self.setWindowTitle(f"Chat template — {model_name}")
        self.resize(900, 640)
        self._inputs = inputs
        self._base_model = base_model
        self._chat = list(chat)
        self._custom = prefs.template_source or inputs.embedded or STARTER
        self._generation = 0
        self._job: Job | None = None  # the preview running
        self._pending = False
        self._result: PreviewResult | None = None
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(PREVIEW_DELAY_MS)
        self._timer.timeout.connect(self._start_preview)

        self._build_widgets(inputs)
        self._lay_out()

        self.kind.currentIndexChanged.connect(self._on_kind_changed)
        self.completion.toggled.connect(self._on_completion_toggled)
        self.editor.textChanged.connect(self._on_editor_changed)
        self.sample.currentIndexChanged.connect(self._schedule)
        self._select(prefs)
        self._on_kind_changed()

    def _build_widgets(self, inputs: TemplateInputs) -> None:
        self.kind = QComboBox(self)
        self.kind.setObjectName("templateKind")
        self.kind.setAccessibleName("Chat template")
        own = (
            "The model's own (from its file)"
            if inputs.embedded
            else f"Automatic: built-in {inputs.builtin} (the model has no template of its own)"
        )
        self.kind.addItem(own, AUTO)
        for name in BUILTIN:
            self.kind.addItem(f"Built-in: {name}", TemplateOverride("builtin", name))
        self.kind.addItem("Custom (Jinja, edit below)", TemplateOverride("custom"))
        self.completion = QCheckBox(
            "Continue-the-text mode: no chat turns; the model continues your text", self
        )
        self.completion.setObjectName("completionMode")
        self.completion.setToolTip(
            "For base (text-completion) models: the conversation is one document, sent as it "
            "is, and each reply continues it"
        )
        self.editor = QPlainTextEdit(self)
        self.editor.setObjectName("templateEditor")
        self.editor.setAccessibleName("Jinja template text")
        self.editor.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.editor.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.sample = QComboBox(self)
        self.sample.setObjectName("previewSource")
        self.sample.setAccessibleName("Conversation to preview")
        self.sample.addItem("A sample conversation")
        self.sample.addItem("This chat" if self._chat else "This chat (empty: the sample is shown)")
        self.preview = QPlainTextEdit(self)
        self.preview.setObjectName("templatePreview")
        self.preview.setAccessibleName("Rendered prompt")
        self.preview.setReadOnly(True)
        self.preview.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.status = QLabel(self)
        self.status.setObjectName("templateStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel, self
        )
        self.save_button = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        self.save_button.setObjectName("templateSave")
        self.reset_button = QPushButton("Reset to automatic", self)
        self.reset_button.setObjectName("templateReset")
        self.buttons.addButton(self.reset_button, QDialogButtonBox.ButtonRole.ResetRole)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.reset_button.clicked.connect(self.reset_to_automatic)

    def _lay_out(self) -> None:
        form = QFormLayout()
        form.addRow("Template:", self.kind)
        form.addRow("", self.completion)
        top = QWidget(self)
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addWidget(QLabel("Template text:", top))
        top_layout.addWidget(self.editor)
        bottom = QWidget(self)
        bottom_layout = QVBoxLayout(bottom)
        bottom_layout.setContentsMargins(0, 0, 0, 0)
        preview_form = QFormLayout()
        preview_form.addRow("Preview of:", self.sample)
        bottom_layout.addLayout(preview_form)
        bottom_layout.addWidget(self.preview)
        split = QSplitter(Qt.Orientation.Vertical, self)
        split.addWidget(top)
        split.addWidget(bottom)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(split, 1)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)

    # -- the choice ------------------------------------------------------------------------

    def choice(self) -> TemplateChoice:
        """What is chosen now (saved by the caller once the dialog is accepted)."""
        return TemplateChoice(self._override(), self.completion.isChecked())

    def _override(self) -> TemplateOverride:
        data: TemplateOverride = self.kind.currentData()
        if data.kind == "custom":
            return TemplateOverride("custom", source=self.editor.toPlainText())
        return data

    def _select(self, prefs: ModelPrefs) -> None:
        index = 0
        if prefs.template == "builtin":
            index = max(0, self.kind.findText(f"Built-in: {prefs.template_name}"))
        elif prefs.template == "custom":
            index = self.kind.count() - 1
        self.kind.setCurrentIndex(index)
        self.completion.setChecked(prefs.completion_on(self._base_model))

    def reset_to_automatic(self) -> None:
        self.kind.setCurrentIndex(0)
        self.completion.setChecked(self._base_model)

    # -- preview -----------------------------------------------------------------------------

    @property
    def preview_ready(self) -> bool:
        """The preview shows the current choice (or its error)."""
        return self._result is not None

    @property
    def error(self) -> str:
        return self._result.error if self._result is not None else ""

    def _messages(self) -> list[ChatMessage]:
        if self.sample.currentIndex() == 1 and self._chat:
            return self._chat
        return list(SAMPLE_CHAT)

    def _on_kind_changed(self) -> None:
        custom = self._override().kind == "custom"
        self.editor.blockSignals(True)
        try:
            if custom:
                self.editor.setPlainText(self._custom)
                self.editor.setPlaceholderText("Jinja, as in a model's tokenizer_config.json")
            elif self.kind.currentIndex() == 0 and self._inputs.embedded:
                self.editor.setPlainText(self._inputs.embedded)
            else:
                self.editor.clear()
                self.editor.setPlaceholderText(
                    "A built-in template is written in Python: the preview below shows its "
                    "text. Choose Custom to write one in Jinja."
                )
        finally:
            self.editor.blockSignals(False)
        self.editor.setReadOnly(not custom)
        self._schedule()

    def _on_completion_toggled(self, on: bool) -> None:
        self.kind.setEnabled(not on)
        self.editor.setEnabled(not on)
        self._schedule()

    def _on_editor_changed(self) -> None:
        if self._override().kind == "custom":
            self._custom = self.editor.toPlainText()
            self._schedule()

    def _schedule(self) -> None:
        self._generation += 1
        self._result = None
        self.status.setStyleSheet("")
        self.status.setText("Checking the template…")
        self._update_save()
        self._timer.start()

    def _start_preview(self) -> None:
        if self._job is not None:
            self._pending = True  # started again once the running one answers
            return
        override = PLAIN if self.completion.isChecked() else self._override()
        preview = partial(_preview, override, self._inputs, self._messages())
        done = partial(self._on_preview_done, self._generation)
        self._job = run_in_background(preview, done, owner=self)

    def _on_preview_done(self, generation: int, result: PreviewResult) -> None:
        self._job = None
        if self._pending:
            self._pending = False
            self._start_preview()
        if generation != self._generation:
            return
        self._result = result
        if result.error:
            self.preview.setPlainText("")
            why = result.error
            if not why.startswith("This template"):
                why = f"This template cannot be used: it {why}."
            self.status.setStyleSheet("color: #d1242f;")
            self.status.setText(why)
        else:
            text = result.text
            if len(text) > PREVIEW_CHARS:
                text = "…" + text[-PREVIEW_CHARS:]
            self.preview.setPlainText(text)
            self.status.setStyleSheet("")
            bos = self._inputs.bos_token
            bos = f" ({bos} is added before it)" if bos else ""
            self.status.setText(
                (result.note + " " if result.note else "")
                + f"This is the text the model reads{bos}; the reply follows it."
            )
        self._update_save()

    def _update_save(self) -> None:
        # A custom template is saved only once it is known to work.
        custom = not self.completion.isChecked() and self._override().kind == "custom"
        ok = self._result is not None and not self._result.error
        self.save_button.setEnabled(ok or not custom)
        self.save_button.setToolTip(
            "" if ok or not custom else "Fix the template first: the message above says why"
        )

    def done(self, result: int) -> None:
        """Close, once a running preview has ended (the sandbox bounds how long it runs)."""
        self._timer.stop()
        if self._job is not None:
            self._job.wait(JOIN_S)
            self._job = None
        self._pending = False
        super().done(result)
