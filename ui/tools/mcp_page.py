"""Tools (MCP servers): each server's state, its tools and what they cost, switches for
both, consent to run a command or connect to an address, the config file, and the
"always allowed" rules.

The page reads the host (``McpControl``) and redraws on its ``changed`` signal, which
arrives on the GUI thread; every action goes to the host, which says what changed.
"""

from __future__ import annotations

import html
import json
from functools import partial

import shiboken6
from PySide6.QtCore import Qt
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.mcp.approvals import Rule
from app.mcp.tool_host import McpTool, ServerStatus
from app.util.atomic import atomic_write_text
from ui.common.background import run_in_background
from ui.common.open_path import open_path
from ui.tools.mcp_consent import ConsentPanel
from ui.tools.mcp_control import Host, McpControl
from ui.tools.mcp_paste import PasteDialog

STATE_COLOURS = {
    "ready": "#2e7d32",
    "starting": "#f9a825",
    "idle": "#9e9e9e",
    "consent": "#1565c0",
    "failed": "#c62828",
    "off": "#9e9e9e",
}
STATE_TEXT = {
    "ready": "ready",
    "starting": "starting…",
    "idle": "starts when tools are first needed",
    "consent": "waits for your OK",
    "failed": "failed",
    "off": "off",
}
MAX_DESCRIPTION = 300  # characters shown; the tooltip has the rest (up to a limit)


def token_estimate(tool: McpTool) -> int:
    """About how many prompt tokens the tool's definition costs (4 characters a token)."""
    return round(len(json.dumps(tool.spec().openai(), ensure_ascii=False)) / 4)


def prompt_cost(statuses: list[ServerStatus]) -> tuple[int, bool]:
    """Tokens the enabled tools add to every prompt, and whether enabled servers that
    have not listed their tools yet leave it an underestimate."""
    total, unknown = 0, False
    for s in statuses:
        if not s.enabled:
            continue
        if s.state != "ready" and not s.tools:
            unknown = True
        total += sum(token_estimate(t) for t in s.tools if t.enabled)
    return total, unknown


def _plain(text: str, parent: QWidget) -> QLabel:
    """A label that shows ``text`` as it is: servers' names, descriptions and errors are
    untrusted, and a QLabel would otherwise render what looks like HTML."""
    label = QLabel(text, parent)
    label.setTextFormat(Qt.TextFormat.PlainText)
    return label


def _tip(text: str, limit: int = 2000) -> str:
    """A tooltip showing untrusted ``text`` literally (Qt takes tooltips for HTML when
    they look like it; marked up and escaped, they always are, safely)."""
    return f"<p>{html.escape(_short(text, limit))}</p>" if text else ""


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


class ServerBox(QGroupBox):
    """One server: its switch, state, command, error, consent and tools."""

    def __init__(self, status: ServerStatus, page: McpPage) -> None:
        super().__init__(page.servers_widget)
        self.setObjectName("mcpServer")
        self.name = status.name
        layout = QVBoxLayout(self)
        head = QHBoxLayout()
        colour = STATE_COLOURS.get(status.state, "#9e9e9e")
        self.dot = QLabel("●", self)
        self.dot.setStyleSheet(f"color: {colour}")
        self.switch = QCheckBox(status.name, self)
        self.switch.setObjectName("mcpServerSwitch")
        self.switch.setChecked(status.enabled)
        self.switch.setStyleSheet("font-weight: bold")
        self.switch.toggled.connect(partial(page.set_server_enabled, status.name))
        self.state = _plain(f"{status.transport} · {STATE_TEXT.get(status.state, '')}", self)
        self.state.setObjectName("mcpServerState")
        self.restart = QPushButton("Restart", self)
        self.restart.setObjectName("mcpRestart")
        self.restart.setEnabled(status.enabled and status.state in ("ready", "failed"))
        self.restart.clicked.connect(partial(page.restart, status.name))
        for w in (self.dot, self.switch, self.state):
            head.addWidget(w)
        head.addStretch(1)
        head.addWidget(self.restart)
        layout.addLayout(head)
        self.command = _plain(_short(status.command, 500), self)
        self.command.setObjectName("mcpServerCommand")
        self.command.setToolTip(_tip(status.command))
        self.command.setWordWrap(True)
        self.command.setStyleSheet("font-family: monospace; color: palette(mid)")
        layout.addWidget(self.command)
        self.error = _plain(_short(status.error, 1000), self)
        self.error.setObjectName("mcpServerError")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #c62828")
        self.error.setVisible(bool(status.error))
        layout.addWidget(self.error)
        self.consent: ConsentPanel | None = None
        if status.state == "consent":
            self.consent = ConsentPanel(status, page.allow, self)
            layout.addWidget(self.consent)
        self.tool_switches: dict[str, QCheckBox] = {}
        self.tool_tokens: dict[str, QLabel] = {}
        self._add_tools(status, page, layout)

    def _add_tools(self, status: ServerStatus, page: McpPage, layout: QVBoxLayout) -> None:
        grid = QGridLayout()
        for row, tool in enumerate(status.tools):
            box = QCheckBox(tool.name, self)
            box.setObjectName("mcpToolSwitch")
            box.setChecked(tool.enabled)
            box.setEnabled(status.enabled)
            box.toggled.connect(partial(page.set_tool_enabled, status.name, tool.name))
            tokens = QLabel(f"≈ {token_estimate(tool)} tokens", self)
            tokens.setObjectName("mcpToolTokens")
            tokens.setVisible(not page.unused)  # not offered: it costs nothing
            about = _plain(_short(tool.description, MAX_DESCRIPTION), self)
            about.setWordWrap(True)
            about.setToolTip(_tip(tool.description))
            grid.addWidget(box, row, 0)
            grid.addWidget(tokens, row, 1)
            grid.addWidget(about, row, 2)
            self.tool_switches[tool.name] = box
            self.tool_tokens[tool.name] = tokens
        grid.setColumnStretch(2, 1)
        layout.addLayout(grid)


class McpPage(QDialog):
    """Tools → Tools (MCP servers)…: one per window, kept until quit."""

    def __init__(self, control: McpControl, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("mcpPage")
        self.setWindowTitle("Tools (MCP servers)")
        self.resize(760, 620)
        self.control = control
        self.unused = ""  # why the model in use is offered no tools ("": it is)
        self.boxes: dict[str, ServerBox] = {}
        self.path_note: QMessageBox | None = None  # where nothing opened mcp.json
        layout = QVBoxLayout(self)
        self.problems = self._label("mcpProblems", "color: #c62828")
        self.total = self._label("mcpTokenTotal")
        self.note = self._label("mcpNote")
        self.message = self._label("mcpMessage")  # what the last action did
        self.message.hide()
        for w in (self.problems, self.total, self.note, self.message):
            layout.addWidget(w)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.servers_widget = QWidget(scroll)
        outer = QVBoxLayout(self.servers_widget)
        self.servers_layout = QVBoxLayout()
        outer.addLayout(self.servers_layout)
        outer.addStretch(1)
        scroll.setWidget(self.servers_widget)
        layout.addWidget(scroll, 1)
        self.rules_box = QGroupBox("Always allowed", self)
        self.rules_layout = QVBoxLayout(self.rules_box)
        layout.addWidget(self.rules_box)
        layout.addLayout(self._buttons())
        control.changed.connect(self.refresh)

    def _label(self, name: str, style: str = "") -> QLabel:
        label = _plain("", self)
        label.setObjectName(name)
        label.setWordWrap(True)
        if style:
            label.setStyleSheet(style)
        return label

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        for name, text, slot in (
            ("mcpOpenConfig", "Open mcp.json", self.open_config),
            ("mcpReload", "Reload", self.reload),
            ("mcpPaste", "Paste config…", self.paste_config),
        ):
            button = QPushButton(text, self)
            button.setObjectName(name)
            button.clicked.connect(slot)
            row.addWidget(button)
        row.addStretch(1)
        close = QPushButton("Close", self)
        close.clicked.connect(self.close)
        row.addWidget(close)
        return row

    @property
    def host(self) -> Host | None:
        return self.control.proxy.host

    def showEvent(self, event: QShowEvent) -> None:
        self.refresh()
        self.start_servers()
        super().showEvent(event)

    def start_servers(self) -> None:
        """Start the servers not started yet, so the page lists their tools: opening it
        is the user asking to see them (the chat starts them too, when it needs them).
        Off the GUI thread; the host's status reports redraw the page."""
        host = self.host
        if host is not None:
            run_in_background(partial(host.tools, 0.0))

    def set_unused(self, why: str) -> None:
        """The model in use is offered no tools, for this reason ("": it is): said in
        place of their cost, which is then none."""
        if why != self.unused:
            self.unused = why
            self.refresh()

    def refresh(self) -> None:
        """Redraw from the host's statuses and the approval rules."""
        host = self.host
        statuses = host.statuses() if host is not None else []
        problems = list(host.problems()) if host is not None else []
        if self.control.proxy.unavailable:
            problems.insert(0, f"Tools are unavailable: {self.control.proxy.unavailable}")
        self.problems.setText("\n".join(_short(p, 500) for p in problems[:20]))
        self.problems.setVisible(bool(problems))
        total, unknown = prompt_cost(statuses)
        more = " (servers not started yet are not counted)" if unknown else ""
        # Continue-the-text mode offers no tools: nothing is added to the prompt then.
        self.total.setText(self.unused or f"Tools add ≈ {total} tokens to every prompt{more}.")
        if not statuses:
            self.note.setText(
                "No tool servers yet: Paste config… adds the ones you use in another app, "
                "or Open mcp.json to write them."
            )
        self.note.setVisible(not statuses)
        self._show_servers(statuses)
        self._show_rules()

    def _show_servers(self, statuses: list[ServerStatus]) -> None:
        for box in self.boxes.values():
            # Now, on this thread: redraws are posted, never run inside a box's own signal.
            shiboken6.delete(box)
        self.boxes = {}
        for status in statuses:
            box = self.boxes[status.name] = ServerBox(status, self)
            self.servers_layout.addWidget(box)

    def _show_rules(self) -> None:
        while self.rules_layout.count():
            item = self.rules_layout.takeAt(0)
            w = item.widget() if item is not None else None
            if w is not None:
                shiboken6.delete(w)  # see _show_servers
        rules = self.control.approvals.rules()
        if not rules:
            self.rules_layout.addWidget(QLabel("No tool is allowed without asking.", self))
        host = self.host
        current = {(s.name, s.server_id) for s in host.statuses()} if host is not None else set()
        for rule in rules:
            row = QWidget(self.rules_box)
            row.setObjectName("mcpRule")
            line = QHBoxLayout(row)
            line.setContentsMargins(0, 0, 0, 0)
            what = "every tool" if rule.tool == "*" else f"the tool {rule.tool}"
            text = f"{what} of {rule.server}"
            if (rule.server, rule.server_id) not in current:
                text += " (as configured before: it asks now)"
            line.addWidget(_plain(text, row), 1)
            forget = QPushButton("Forget", row)
            forget.setObjectName("mcpForget")
            forget.clicked.connect(partial(self.forget, rule))
            line.addWidget(forget)
            self.rules_layout.addWidget(row)

    # -- actions -------------------------------------------------------------------------

    def _with_host(self) -> Host | None:
        host = self.control.host()  # makes it if need be
        if host is None:
            self.control.post(self.refresh)  # posted: a box's own switch may be asking
        return host

    def set_server_enabled(self, name: str, on: bool) -> None:
        host = self._with_host()
        if host is not None:
            host.set_server_enabled(name, on)

    def set_tool_enabled(self, server: str, tool: str, on: bool) -> None:
        host = self._with_host()
        if host is not None:
            host.set_tool_enabled(server, tool, on)

    def allow(self, name: str, server_id: str) -> None:
        host = self._with_host()
        if host is not None:
            host.consent(name, server_id)
            self.start_servers()

    def restart(self, name: str) -> None:
        host = self._with_host()
        if host is not None:
            host.restart(name)

    def reload(self) -> None:
        host = self._with_host()
        if host is not None:
            host.reload()
        self.refresh()

    def forget(self, rule: Rule) -> None:
        self.control.approvals.forget(rule)
        self.control.post(self._show_rules)  # posted: its Forget button is asking

    def open_config(self) -> None:
        """Open mcp.json in the user's editor (made with no servers if absent)."""
        path = self.control.proxy.config_path
        if not path.exists():
            try:
                atomic_write_text(path, '{\n  "mcpServers": {}\n}\n')
            except OSError as exc:
                self.message.setText(f"{path} could not be written: {exc.strerror or exc}")
                self.message.show()
                return
        self.path_note = open_path(self, path, "mcp.json")  # where nothing does: its path

    def paste_config(self) -> PasteDialog:
        dialog = PasteDialog(self.control.proxy.config_path, self._on_pasted, self)
        dialog.show()
        return dialog

    def _on_pasted(self, added: list[str], notes: list[str]) -> None:
        self.reload()
        text = f"Added: {', '.join(added)}." if added else "Those servers were already there."
        self.message.setText(" ".join([text, *notes]))
        self.message.show()
