"""The Connections dialog: add, edit, remove and test servers, and pick where the model runs.

The list and the form beside it edit ``ConnectionStore``; API keys go to the
system keyring (``app.remote.keys``), never into the store's file. "Test" asks
the server who it is in the background (``ConnectionTest``; the GUI thread never
waits on the network) and fills the model list from its answer. Closing the
dialog cuts a test in flight short and waits for it.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent, QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.remote import keys
from app.remote.connection import KIND_LABELS, KINDS, Connection
from app.remote.connection_store import (
    MAX_SLOT,
    NAME_CHARS,
    URL_CHARS,
    BadConnection,
    ConnectionStore,
    Probe,
    make_connection,
    new_id,
)
from app.util.errors import LamplightError
from ui.common.background import Job, run_in_background
from ui.common.qt_util import blocked
from ui.remote.connection_test import ConnectionTest

log = logging.getLogger(__name__)

ROLE = Qt.ItemDataRole.UserRole
JOIN_MS = 10_000  # a test cut short ends at once; only a connect in progress waits (5 s)
ERROR_STYLE = "color: #c62828;"
OK_STYLE = "color: #2e7d32;"
WARNING_STYLE = "color: #b26a00;"
TLS_OFF = (
    "Certificates are not checked: anyone between you and the server could pose as it "
    "and read the API key and the conversation."
)
PLAIN_HTTP = (
    "This address is not encrypted (http://): the API key and the conversation travel "
    "in clear text. Use https:// for a server on another machine."
)
SLOT_TIP = (
    "The llama-server slot (0 … --parallel − 1) whose cache this app uses and saves. "
    "Give each app or user sharing a server its own slot."
)
SLOT_OFF_TIP = (
    "Only a llama.cpp server has slots; an OpenAI-compatible server schedules requests itself."
)
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


class ConnectionsDialog(QDialog):
    """Saved servers, a form to edit one, and the choice of where the model runs.

    Signals:
        connectRequested(object): the user chose a (saved) ``Connection`` to use.
        localRequested(): the user chose the in-process engine on this computer.
    """

    connectRequested = Signal(object)
    localRequested = Signal()

    def __init__(self, store: ConnectionStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("connectionsDialog")
        self.setWindowTitle("Connections")
        self.resize(820, 460)
        self._store = store
        self._editing: str | None = None  # id of the saved connection in the form
        self._new_id = new_id()  # id a new connection gets when saved
        self._request = 0
        self._tests: dict[int, tuple[ConnectionTest, Job]] = {}  # by request, in flight

        left = self._build_list()
        self._build_server_fields()
        self._build_model_fields()
        right = self._build_right()

        layout = QHBoxLayout(self)
        layout.addLayout(left, 2)
        layout.addLayout(right, 3)

        self.kind_box.currentIndexChanged.connect(lambda _i: self._on_kind_changed())
        self.tls_box.toggled.connect(lambda _on: self._update_warning())
        self.url_edit.textChanged.connect(lambda _t: self._update_warning())
        self._clear_form()
        # The connection in use, else the first saved one: a user opening this mostly
        # wants to connect to what is already there.
        active = store.active_connection or next(iter(store.connections), None)
        if active is not None:
            self._show(active)
        self.refresh()

    # -- construction helpers ------------------------------------------------------

    def _build_list(self) -> QVBoxLayout:
        """The saved servers and the buttons under them."""
        self.list = QListWidget(self)
        self.list.setObjectName("connectionList")
        self.list.setAccessibleName("Saved servers")
        self.list.setToolTip("The servers you added. Select one to edit, test or use it.")
        self.list.currentItemChanged.connect(self._on_selected)
        self.add_button = self._button("Add", "addConnection", "Add a new server.", self._on_add)
        self.remove_button = self._button(
            "Remove",
            "removeConnection",
            "Remove the selected server and forget its API key.",
            self._on_remove,
        )
        self.local_button = self._button(
            "Use this computer",
            "useLocal",
            "Run the model here, in Lamplight, with the model last used on this computer.",
            self._on_local,
        )
        left = QVBoxLayout()
        left.addWidget(self.list, 1)
        row = QHBoxLayout()
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        left.addLayout(row)
        left.addWidget(self.local_button)
        return left

    def _build_server_fields(self) -> None:
        """The form's fields that say which server and how to reach it."""
        self.name_edit = QLineEdit(self)
        self._field(self.name_edit, "connectionName", "Name", "A name to tell this server by.")
        self.name_edit.setMaxLength(NAME_CHARS)
        self.kind_box = QComboBox(self)
        self._field(
            self.kind_box,
            "connectionKind",
            "Kind of server",
            "llama.cpp server: llama.cpp's llama-server, with snapshots, LoRA and grammars.\n"
            "OpenAI-compatible: vLLM, Ollama, LM Studio, hosted services (/v1 API).",
        )
        for kind in KINDS:
            self.kind_box.addItem(KIND_LABELS[kind], kind)
        self.url_edit = QLineEdit(self)
        self._field(
            self.url_edit,
            "connectionUrl",
            "Server address",
            "The server's address, like http://127.0.0.1:8080 (llama-server), "
            "http://host:8000 (vLLM) or http://localhost:11434 (Ollama).",
        )
        self.url_edit.setMaxLength(URL_CHARS)
        self.url_edit.setPlaceholderText("http://127.0.0.1:8080")
        self.key_edit = QLineEdit(self)
        self._field(
            self.key_edit,
            "connectionKey",
            "API key",
            "The server's API key, if it needs one. It is kept in the system keyring, "
            "never in Lamplight's files.",
        )
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setMaxLength(keys.MAX_KEY_CHARS)
        self.key_edit.setPlaceholderText("none")
        self.tls_box = QCheckBox("Verify TLS certificates", self)
        self._field(
            self.tls_box,
            "verifyTls",
            "Verify TLS certificates",
            "Check that an https:// server is who it says it is. Switch this off only for "
            "a server with a self-signed certificate on a network you trust.",
        )
        self.tls_box.setChecked(True)
        self.warning = QLabel("", self)
        self.warning.setObjectName("tlsWarning")
        self.warning.setAccessibleName("Security warning")
        self.warning.setWordWrap(True)
        self.warning.setStyleSheet(WARNING_STYLE)
        self.warning.hide()

    def _build_model_fields(self) -> None:
        """The slot and model fields, the test, and the form's messages."""
        self.slot_box = QSpinBox(self)
        self._field(self.slot_box, "connectionSlot", "Slot", SLOT_TIP)
        self.slot_box.setRange(0, MAX_SLOT)
        self.model_box = QComboBox(self)
        self._field(self.model_box, "connectionModel", "Model", "")
        self.model_box.setMinimumContentsLength(24)
        self.test_button = self._button(
            "Test",
            "testConnection",
            "Ask the server who it is and which models it offers.",
            self._on_test,
        )
        self.test_result = QLabel("", self)
        self.test_result.setObjectName("testResult")
        self.test_result.setAccessibleName("Test result")
        self.test_result.setWordWrap(True)
        self.test_result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.form_error = QLabel("", self)
        self.form_error.setObjectName("formError")
        self.form_error.setAccessibleName("What is wrong with the form")
        self.form_error.setWordWrap(True)
        self.form_error.setStyleSheet(ERROR_STYLE)
        self.form_error.hide()
        self.keyring_note = QLabel("", self)
        self.keyring_note.setObjectName("keyringNote")
        self.keyring_note.setAccessibleName("Where API keys are kept")
        self.keyring_note.setWordWrap(True)
        self.keyring_note.setStyleSheet(WARNING_STYLE)

    def _build_right(self) -> QVBoxLayout:
        """The form and the dialog's buttons."""
        form = QFormLayout()
        form.addRow("&Name:", self.name_edit)
        form.addRow("&Kind:", self.kind_box)
        form.addRow("&Address:", self.url_edit)
        form.addRow("API &key:", self.key_edit)
        form.addRow("", self.tls_box)
        form.addRow("", self.warning)
        form.addRow("&Slot:", self.slot_box)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model_box, 1)
        model_row.addWidget(self.test_button)
        model_label = QLabel("&Model:", self)  # a layout row gets no buddy by itself
        model_label.setBuddy(self.model_box)
        form.addRow(model_label, model_row)
        form.addRow("", self.test_result)

        self.save_button = self._button(
            "Save", "saveConnection", "Save this server in the list.", self._on_save
        )
        self.connect_button = self._button(
            "Connect",
            "connectConnection",
            "Save this server and run the model on it.",
            self._on_connect,
        )
        self.close_button = self._button("Close", "closeConnections", "Close.", self.reject)
        self.save_button.setDefault(True)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.save_button)
        buttons.addWidget(self.connect_button)
        buttons.addWidget(self.close_button)
        right = QVBoxLayout()
        right.addLayout(form)
        right.addWidget(self.form_error)
        right.addWidget(self.keyring_note)
        right.addStretch(1)
        right.addLayout(buttons)
        return right

    def _button(self, text: str, name: str, tip: str, slot: Any) -> QPushButton:
        button = QPushButton(text, self)
        button.setObjectName(name)
        button.setToolTip(tip)
        button.setAccessibleName(text.replace("&", ""))
        button.setAutoDefault(False)
        button.clicked.connect(lambda _checked=False: slot())
        return button

    @staticmethod
    def _field(widget: QWidget, name: str, accessible: str, tip: str) -> None:
        widget.setObjectName(name)
        widget.setAccessibleName(accessible)
        widget.setToolTip(tip)

    # -- the list --------------------------------------------------------------------

    def refresh(self, select: str | None = None) -> None:
        """Fill the list from the store, selecting ``select`` (an id) if given."""
        select = self._editing if select is None else select
        with blocked(self.list):
            self.list.clear()
            for conn in self._store.connections:
                text = conn.label + ("  · in use" if conn.id == self._store.active else "")
                item = QListWidgetItem(text, self.list)
                item.setData(ROLE, conn.id)
                item.setToolTip(conn.url)
                if conn.id == select:
                    self.list.setCurrentItem(item)
        self.remove_button.setEnabled(self.list.currentRow() >= 0)
        self._update_keyring_note()

    def _on_selected(self, current: QListWidgetItem | None, _previous: object = None) -> None:
        self.remove_button.setEnabled(current is not None)
        conn = self._store.get(str(current.data(ROLE))) if current is not None else None
        if conn is None:
            return
        self._show(conn)

    def _on_add(self) -> None:
        with blocked(self.list):
            self.list.setCurrentRow(-1)
            self.list.clearSelection()
        self.remove_button.setEnabled(False)
        self._clear_form()
        self.name_edit.setFocus()

    def _on_remove(self) -> None:
        if self.list.currentRow() < 0:
            return
        conn_id = str(self.list.currentItem().data(ROLE))
        try:
            self._store.remove(conn_id)
        except LamplightError as exc:
            self._show_error(str(exc))
            return
        self.refresh(select="")
        self._clear_form()

    # -- the form --------------------------------------------------------------------

    def _clear_form(self) -> None:
        self._editing = None
        self._new_id = new_id()
        self.name_edit.clear()
        self.kind_box.setCurrentIndex(0)
        self.url_edit.clear()
        self.key_edit.clear()
        self.tls_box.setChecked(True)
        self.slot_box.setValue(0)
        self.model_box.clear()
        self._forget_test()
        self._show_error("")
        self._on_kind_changed()

    def _show(self, conn: Connection) -> None:
        self._editing = conn.id
        self.name_edit.setText(conn.name)
        self.kind_box.setCurrentIndex(max(0, self.kind_box.findData(conn.kind)))
        self.url_edit.setText(conn.url)
        self.key_edit.setText(keys.get_key(conn.id))
        self.tls_box.setChecked(conn.verify_tls)
        self.slot_box.setValue(conn.slot)
        self.model_box.clear()
        if conn.model:
            self.model_box.addItem(conn.model)
        self._forget_test()
        self._show_error("")
        self._on_kind_changed()
        self._update_keyring_note()

    def _kind(self) -> str:
        return str(self.kind_box.currentData() or KINDS[0])

    def _on_kind_changed(self) -> None:
        server = self._kind() == "llama-server"
        self.slot_box.setEnabled(server)
        if server:
            text = self.model_box.currentText()
            self.model_box.setEditable(False)
            if text and self.model_box.findText(text) < 0:
                self.model_box.addItem(text)
            self.model_box.setToolTip(
                "A llama.cpp server serves the model it was started with; Test shows which."
            )
        else:
            self.model_box.setEditable(True)
            self.model_box.setToolTip(
                "The model to chat with. Test fills the list from the server's /v1/models; "
                "you can also type a name."
            )
        self.slot_box.setToolTip(SLOT_TIP if server else SLOT_OFF_TIP)

    def _update_warning(self) -> None:
        lines = []
        if not self.tls_box.isChecked():
            lines.append(TLS_OFF)
        if _plain_http(self.url_edit.text()):
            lines.append(PLAIN_HTTP)
        self.warning.setText("\n".join(lines))
        self.warning.setVisible(bool(lines))

    def _update_keyring_note(self) -> None:
        note = keys.keyring_problem()
        self.keyring_note.setText(note)
        self.keyring_note.setVisible(bool(note))

    def _show_error(self, text: str) -> None:
        self.form_error.setText(text)
        self.form_error.setVisible(bool(text))

    def form_connection(self) -> tuple[Connection, str]:
        """The connection and API key in the form.

        Raises:
            BadConnection, keys.BadApiKey: something in the form cannot be used.
        """
        conn = make_connection(
            id=self._editing or self._new_id,
            name=self.name_edit.text(),
            kind=self._kind(),
            url=self.url_edit.text(),
            model=self.model_box.currentText(),
            verify_tls=self.tls_box.isChecked(),
            slot=self.slot_box.value() if self._kind() == "llama-server" else 0,
        )
        return conn, keys.check_key(self.key_edit.text())

    def _checked_form(self) -> tuple[Connection, str] | None:
        """``form_connection``, or None after showing what is wrong (the text stays)."""
        try:
            result = self.form_connection()
        except BadConnection as exc:
            self._show_error(str(exc))
            widget = {
                "name": self.name_edit,
                "url": self.url_edit,
                "model": self.model_box,
                "slot": self.slot_box,
                "kind": self.kind_box,
            }.get(exc.field)
            if widget is not None:
                widget.setFocus()
            return None
        except keys.BadApiKey as exc:
            self._show_error(str(exc))
            self.key_edit.setFocus()
            return None
        self._show_error("")
        return result

    def _on_save(self) -> Connection | None:
        checked = self._checked_form()
        if checked is None:
            return None
        conn, key = checked
        try:
            self._store.put(conn)
        except LamplightError as exc:
            self._show_error(str(exc))
            return None
        keys.set_key(conn.id, key)
        self._editing = conn.id
        self.refresh(select=conn.id)
        return conn

    def _on_connect(self) -> None:
        conn = self._on_save()
        if conn is None:
            return
        self.connectRequested.emit(conn)
        self.accept()

    def _on_local(self) -> None:
        self.localRequested.emit()
        self.accept()

    # -- testing -----------------------------------------------------------------------

    def _on_test(self) -> None:
        checked = self._checked_form()
        if checked is None:
            return
        conn, key = checked
        self._request += 1
        self.test_result.setStyleSheet("")
        self.test_result.setText(f"Testing {conn.url} …")
        test = ConnectionTest()
        done = partial(self._on_probed, self._request)
        self._tests[self._request] = (test, run_in_background(partial(test.run, conn, key), done))

    def _on_probed(self, request: int, result: Probe | None) -> None:
        self._tests.pop(request, None)
        if request != self._request or result is None:
            return  # an older test, or the form changed since
        self.test_result.setText(result.message)
        self.test_result.setStyleSheet(OK_STYLE if result.ok else ERROR_STYLE)
        if result.ok:
            self.model_box.clear()
            self.model_box.addItems(list(result.models))
            self.model_box.setCurrentIndex(max(0, self.model_box.findText(result.model)))

    def _forget_test(self) -> None:
        self._request += 1  # a result still on its way is for another form
        self.test_result.clear()
        self.test_result.setStyleSheet("")

    def shutdown(self) -> None:
        """Cut a test in flight short and wait for it (closing does this)."""
        self._request += 1
        tests, self._tests = list(self._tests.values()), {}
        for test, _job in tests:
            test.cancel()
        for _test, job in tests:
            if not job.wait(JOIN_MS / 1000):  # pragma: no cover - a socket that ignores close
                log.warning("the connection test did not stop in time")

    def showEvent(self, event: QShowEvent) -> None:
        self.refresh()  # the connection in use may have changed while hidden
        super().showEvent(event)

    def done(self, result: int) -> None:
        self.shutdown()
        super().done(result)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.shutdown()
        super().closeEvent(event)


def _plain_http(url: str) -> bool:
    """Whether ``url`` is http:// to another machine (a key would travel in clear)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
    except ValueError:
        return False
    return parts.scheme == "http" and bool(host) and host not in _LOOPBACK
