"""Model → "Local API server…": turn the OpenAI-compatible server on or off and set it up.

The address, port, CORS origins, queue size and request size limit are saved with the
settings; the API key goes to the system keyring (``app.remote.keys``, id
``api-server``), never to a file. A setup the server would refuse (an address other
than loopback, or every web origin ``*``, without a key; a port in use) is not
applied: the dialog says why and keeps what was typed.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.api.config import MAX_BODY_MB
from app.config.api_settings import API_SPEC_BY_NAME, validate_api
from app.config.field_spec import SettingError
from app.config.setting_records import ApiSettings
from app.remote import keys
from ui.api.api_status import KEY_ID, ApiControl, api_config

ERROR_STYLE = "color: #c62828;"
OK_STYLE = "color: #2e7d32;"


def new_key() -> str:
    """A fresh random API key (32 bytes, URL-safe)."""
    return "lamplight-" + secrets.token_urlsafe(32)


class ApiDialog(QDialog):
    """The server's settings; Apply or OK (re)starts or stops it at once.

    ``save(settings)`` is called with the new ``ApiSettings`` once they are in effect.
    """

    def __init__(
        self,
        control: ApiControl,
        settings: ApiSettings,
        save: Callable[[ApiSettings], None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("apiDialog")
        self.setWindowTitle("Local API server")
        self._control = control
        self._settings = settings
        self._save = save

        intro = QLabel(
            "Let other programs (editors, scripts, agents) use the loaded model through an "
            "OpenAI-compatible API (GET /v1/models, POST /v1/chat/completions and "
            "/v1/completions) and, for coding agents, Anthropic's POST /v1/messages and "
            "OpenAI's POST /v1/responses. Requests wait in line with your chats.",
            self,
        )
        intro.setWordWrap(True)
        self.enabled_box = QCheckBox("Serve the API", self)
        self.enabled_box.setObjectName("apiEnabled")
        self.host_edit = QLineEdit(self)
        self.host_edit.setObjectName("apiHost")
        self.host_edit.setToolTip(
            "127.0.0.1: this computer only. 0.0.0.0 or a network address lets other "
            "computers connect, and then an API key is required."
        )
        self.port_box = QSpinBox(self)
        self.port_box.setObjectName("apiPort")
        self.port_box.setRange(0, 65535)
        self.port_box.setSpecialValueText("any free port")
        key_row = self._build_key_row()
        self._build_limits()

        form = QFormLayout()
        form.addRow(self.enabled_box)
        form.addRow("Address", self.host_edit)
        form.addRow("Port", self.port_box)
        form.addRow("API key", key_row)
        form.addRow("Allowed web origins", self.origins_edit)
        form.addRow("Queue size", self.queue_box)
        form.addRow("Largest request", self.body_box)
        form.addRow("Prompt cache", self._build_cache_row())
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok
            | QDialogButtonBox.StandardButton.Apply
            | QDialogButtonBox.StandardButton.Close,
            self,
        )
        self.buttons.accepted.connect(self._on_ok)
        self.buttons.rejected.connect(self.reject)
        apply = self.buttons.button(QDialogButtonBox.StandardButton.Apply)
        apply.clicked.connect(self.apply)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.keyring_note)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self.refresh(settings)

    def _build_key_row(self) -> QHBoxLayout:
        """The API key field and its Generate, Show and Copy buttons."""
        self.key_edit = QLineEdit(self)
        self.key_edit.setObjectName("apiKey")
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setMaxLength(keys.MAX_KEY_CHARS)
        self.key_edit.setPlaceholderText("none (allowed on 127.0.0.1 only)")
        self.key_edit.setToolTip(
            "Clients send it as 'Authorization: Bearer KEY' (Anthropic's: 'x-api-key: KEY'). "
            "Kept in the system keyring."
        )
        generate = QPushButton("Generate", self)
        generate.setObjectName("apiKeyGenerate")
        generate.clicked.connect(self._on_generate)
        self.show_button = QPushButton("Show", self)
        self.show_button.setObjectName("apiKeyShow")
        self.show_button.setCheckable(True)
        self.show_button.toggled.connect(self._on_show_toggled)
        copy = QPushButton("Copy", self)
        copy.setObjectName("apiKeyCopy")
        copy.clicked.connect(self._on_copy)
        key_row = QHBoxLayout()
        key_row.addWidget(self.key_edit, 1)
        for b in (generate, self.show_button, copy):
            key_row.addWidget(b)
        return key_row

    def _build_cache_row(self) -> QHBoxLayout:
        """What the prompt cache keeps on disk, and its Clear button."""
        self.cache_label = QLabel("", self)
        self.cache_label.setObjectName("apiPromptCache")
        self.cache_label.setToolTip(
            "Agents' long system prompts and tools, kept so the first request after a "
            "restart or a model switch does not read them again. Each API key sees only "
            "its own."
        )
        self.clear_cache = QPushButton("Clear", self)
        self.clear_cache.setObjectName("apiPromptCacheClear")
        self.clear_cache.clicked.connect(self._on_clear_cache)
        row = QHBoxLayout()
        row.addWidget(self.cache_label, 1)
        row.addWidget(self.clear_cache)
        return row

    def _show_cache(self) -> None:
        count, size = self._control.prompt_cache_usage()
        self.cache_label.setText(
            f"{count} saved prompt{'s' if count != 1 else ''}, {size / 2**20:,.0f} MB"
            if count
            else "empty"
        )
        self.clear_cache.setEnabled(count > 0)

    def _on_clear_cache(self) -> None:
        self._control.clear_prompt_cache()
        self.cache_label.setText("empty")
        self.clear_cache.setEnabled(False)

    def _build_limits(self) -> None:
        """The origins, queue and request size fields, and the status lines."""
        self.origins_edit = QLineEdit(self)
        self.origins_edit.setObjectName("apiOrigins")
        self.origins_edit.setPlaceholderText("none: browsers' cross-site requests are refused")
        self.origins_edit.setToolTip(
            "Web pages allowed to call the API from a browser, like "
            "http://localhost:3000, separated by spaces or commas. * (every page) "
            "needs an API key."
        )
        self.queue_box = QSpinBox(self)
        self.queue_box.setObjectName("apiQueue")
        spec = API_SPEC_BY_NAME["max_queue"]
        assert spec.minimum is not None and spec.maximum is not None
        self.queue_box.setRange(int(spec.minimum), int(spec.maximum))
        self.queue_box.setToolTip(spec.help)
        self.body_box = QSpinBox(self)
        self.body_box.setObjectName("apiMaxBody")
        self.body_box.setRange(1, MAX_BODY_MB)  # the server takes no more (ApiConfig)
        self.body_box.setSuffix(" MB")
        self.body_box.setToolTip(API_SPEC_BY_NAME["max_body_mb"].help)
        self.status = QLabel("", self)
        self.status.setObjectName("apiStatusLine")
        self.status.setWordWrap(True)
        self.keyring_note = QLabel(keys.keyring_problem(), self)
        self.keyring_note.setWordWrap(True)
        self.keyring_note.setVisible(bool(self.keyring_note.text()))

    def refresh(self, settings: ApiSettings) -> None:
        """Show ``settings``, the stored key and whether the server runs."""
        self._settings = settings
        self._fill(settings, keys.get_key(KEY_ID))

    def _fill(self, s: ApiSettings, key: str) -> None:
        self.enabled_box.setChecked(self._control.running)
        self.host_edit.setText(s.host)
        self.port_box.setValue(s.port)
        self.key_edit.setText(key)
        self.origins_edit.setText(" ".join(s.cors_origins))
        self.queue_box.setValue(s.max_queue)
        self.body_box.setValue(s.max_body_mb)  # one over the limit shows (and saves) as it
        self._show_state()
        self._show_cache()

    def _show_state(self) -> None:
        if self._control.running:
            self._say(f"Serving at {self._control.url}", OK_STYLE)
        elif self._control.error:
            self._say(f"Not serving: {self._control.error}", ERROR_STYLE)
        else:
            self._say("Not serving.", "")

    def _say(self, text: str, style: str) -> None:
        self.status.setText(text)
        self.status.setStyleSheet(style)

    def _on_generate(self) -> None:
        self.key_edit.setText(new_key())
        self.show_button.setChecked(True)

    def _on_show_toggled(self, shown: bool) -> None:
        mode = QLineEdit.EchoMode.Normal if shown else QLineEdit.EchoMode.Password
        self.key_edit.setEchoMode(mode)
        self.show_button.setText("Hide" if shown else "Show")

    def _on_copy(self) -> None:
        if self.key_edit.text():
            QGuiApplication.clipboard().setText(self.key_edit.text())
            self._say("The API key is on the clipboard.", "")

    def form_settings(self) -> tuple[ApiSettings, str]:
        """The settings and key in the form.

        Raises:
            SettingError, keys.BadApiKey: something in the form cannot be used.
        """
        origins = [o for o in self.origins_edit.text().replace(",", " ").split() if o]
        values = {
            "enabled": self.enabled_box.isChecked(),
            "host": self.host_edit.text().strip(),
            "port": self.port_box.value(),
            "cors_origins": origins,
            "max_queue": self.queue_box.value(),
            "max_body_mb": self.body_box.value(),
        }
        settings = validate_api(values, self._settings)
        key = keys.check_key(self.key_edit.text())
        problem = api_config(settings, key).problem()
        if problem:
            raise SettingError("host", problem)
        return settings, key

    def apply(self) -> bool:
        """Check the form, then save it and start, restart or stop the server.

        Returns whether everything took effect; if not, the dialog says why.
        """
        try:
            settings, key = self.form_settings()
        except (SettingError, keys.BadApiKey) as exc:
            self._say(str(exc), ERROR_STYLE)
            return False
        keys.set_key(KEY_ID, key)
        self.keyring_note.setText(keys.keyring_problem())
        self.keyring_note.setVisible(bool(self.keyring_note.text()))
        ok = True
        if settings.enabled:
            problem = self._control.start(settings)
            if problem:
                settings = replace(settings, enabled=False)
                self.enabled_box.setChecked(False)
                ok = False
        else:
            self._control.stop()
        self._settings = settings
        self._save(settings)
        if ok:
            self._show_state()
        else:
            self._say(f"The server did not start: {self._control.error}", ERROR_STYLE)
        return ok

    def _on_ok(self) -> None:
        if self.apply():
            self.accept()
