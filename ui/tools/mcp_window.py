"""The MCP host as the main window shows it: the settings page (one, kept until quit),
a note and a status-bar button when a server waits for consent, and the config's
problems once, when the host first reads it."""

from __future__ import annotations

from PySide6.QtWidgets import QMainWindow, QPushButton

from app.engine.backend import ModelInfo
from app.mcp.tool_host import ServerStatus
from ui.common.context import Context
from ui.tools.mcp_consent import notice_text
from ui.tools.mcp_control import McpControl
from ui.tools.mcp_page import McpPage


def unused_reason(info: ModelInfo | None) -> str:
    """Why ``info`` is offered no tools ("" when it is): continue-the-text mode has no
    turns to call from, so the engine leaves the tools out."""
    if info is None or not info.continues_text:
        return ""
    return (
        f"Tools are used in chat mode; {info.name} is in continue-the-text mode, so its "
        "replies are offered no tools and they add nothing to the prompt. "
        "Use chat turns (the note above the chat, or Model → Chat template…) to use them."
    )


class McpWindow:
    """What the window has of the tools: ``show_page``, the consent prompt, notes."""

    def __init__(self, ctx: Context, control: McpControl) -> None:
        self._ctx = ctx
        self.control = control
        self.page: McpPage | None = None
        self._told_problems = False
        self.review = QPushButton("Review tool servers…", ctx.parent)
        self.review.setObjectName("mcpReview")
        self.review.setFlat(True)
        self.review.setToolTip("A tool server waits for your OK before it is used")
        self.review.clicked.connect(self.show_page)
        self.review.hide()
        if isinstance(ctx.parent, QMainWindow):
            ctx.parent.statusBar().addPermanentWidget(self.review)
        control.consentNeeded.connect(self._on_consent_needed)
        control.changed.connect(self._on_changed)
        ctx.model.changed.connect(self._on_model_changed)
        if control.approvals.note:
            ctx.notice(control.approvals.note)

    def show_page(self) -> McpPage:
        """Tools → Tools (MCP servers)…: the host is made now if it was not yet."""
        if self.page is None:
            self.page = McpPage(self.control, self._ctx.parent)
            self.page.set_unused(unused_reason(self._ctx.model.info))
        self.control.host()
        self.page.show()
        self.page.raise_()
        self.page.activateWindow()
        return self.page

    def _on_model_changed(self, info: ModelInfo | None) -> None:
        if self.page is not None:
            self.page.set_unused(unused_reason(info))

    def _on_consent_needed(self, waiting: list[ServerStatus]) -> None:
        for status in waiting:
            self._ctx.notice(notice_text(status))
        self.review.show()

    def _on_changed(self) -> None:
        host = self.control.proxy.host
        if host is None:
            if self.control.proxy.unavailable and not self._told_problems:
                self._told_problems = True
                self._ctx.notice(f"Tool servers are unavailable: {self.control.proxy.unavailable}")
            return
        statuses = host.statuses()
        if not any(s.enabled and s.state == "consent" for s in statuses):
            self.review.hide()
        if not self._told_problems:
            # Once, as the host first reads mcp.json: a broken file is a note, not a crash.
            self._told_problems = True
            for line in host.problems()[:5]:
                self._ctx.notice(f"Tool servers (mcp.json): {line}")
