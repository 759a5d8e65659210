"""A project's model, preset and adapters follow its chats (issue 44).

``ProjectSettings`` offers the Projects dialog its choices (``ProjectChoices``: the
model loaded now, the saved server connections, the library's and the recent models;
the presets; the LoRA stack applied now; the MCP tools the window knows now), and, as a
listener of each chat shown (``WindowView.conversation_listeners``), applies what the
project of that chat names, once per chat shown:

- a preset goes to the sampling panel, in use and not saved, for a chat without its
  own settings (a new one): a saved chat's own ``conv.sampling`` wins;
- adapters are applied hot (``set_lora_stack``) when every file is there, else a notice
  names the missing one;
- a model other than the one in use is offered with a question ("Load X for this
  project? The model reloads."), asked after the chat is shown, or once the load under
  way ends (a chat reopened at start-up, while the last model loads); Yes loads it as
  Open model does, or connects to the server.

Nothing goes back to the project: a chat may use another model, preset or adapters,
and only the dialog edits a project. The tools a project names are stored (with their
specs) by the dialog; offering only those to its chats is the chat session's
(``app.chat.project_chat.offered_tools``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QMessageBox

from app.chat.conversation import Conversation
from app.chat.projects import Project, ProjectError, ProjectStore
from app.config.presets import PresetError, PresetStore
from app.engine.tool_spec import ToolSpec
from app.gguf.lora import LoraStack
from app.models.library import LibraryEntry
from ui.chat.project_settings_box import model_label, same_model
from ui.common.context import Context
from ui.models.hub_workers import HubServices
from ui.remote.remote_control import RemoteControl
from ui.settings.lora_panel import LoraPanel
from ui.settings.sampling_panel import SamplingPanel
from ui.tools.mcp_control import McpControl
from ui.window.session_view import WindowView


class SettingsHost(Protocol):
    """What of the window this needs (the window itself)."""

    @property
    def ctx(self) -> Context: ...
    @property
    def presets(self) -> PresetStore: ...
    @property
    def sampling_panel(self) -> SamplingPanel: ...
    @property
    def lora_panel(self) -> LoraPanel: ...
    @property
    def remote(self) -> RemoteControl: ...
    @property
    def tools(self) -> McpControl: ...
    @property
    def services(self) -> HubServices | None: ...
    @property
    def session_view(self) -> WindowView: ...


def file_model(path: str | Path, name: str = "") -> dict[str, Any] | None:
    """``Project.model`` for the file at ``path`` (None when it is not there)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        return None
    return {"path": str(p), "name": name or p.name, "size": size}


class ProjectSettings(QObject):
    """The choices the Projects dialog offers, and a project's settings applied to its
    chats as they are shown (see the module docstring).

    Signals:
        choicesChanged(): the library's models were listed (again).
    """

    choicesChanged = Signal()

    def __init__(self, win: SettingsHost, store: ProjectStore) -> None:
        super().__init__(win.ctx.parent)
        self.ctx, self.store, self._win = win.ctx, store, win
        self.library: list[LibraryEntry] = []  # the library's models, as last scanned
        self.shown = ""  # the chat whose project's settings were applied last
        # A chat shown while a load was under way (at start-up, the last model): its
        # project's model is offered once the load ends (``_after_load``).
        self._waiting: tuple[str, Project] | None = None
        win.ctx.model.loadingChanged.connect(self._after_load)
        # First: the other listeners (the Think button, the draft model) see the preset.
        win.session_view.conversation_listeners.insert(0, self.on_conversation)
        if win.services is not None:  # a GUI-thread slot: the scan answers from its thread
            win.services.hub.libraryDone.connect(self._on_library)

    # -- the choices (``ProjectChoices``) ------------------------------------------------

    def scan_library(self) -> None:
        """Ask for the library's models (the dialog lists them when they come)."""
        services = self._win.services
        if services is not None:
            services.scan([Path(p) for p in self.ctx.settings.value.imported_models])

    def _on_library(self, entries: list[LibraryEntry]) -> None:
        self.library = [e for e in entries if e.valid and not e.is_adapter]
        self.choicesChanged.emit()

    def model_choices(self) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        current = self.current_model()
        conns = {c.id: c.name for c in self._win.remote.store.connections}
        if current:
            label = conns.get(current.get("connection", ""), model_label(current))
            out.append((f"{label} (in use now)", current))
        out += [(f"Server: {name}", {"connection": conn_id}) for conn_id, name in conns.items()]
        for e in self.library:
            out.append((e.name, {"path": str(e.path), "name": e.name, "size": e.size}))
        for path in self.ctx.settings.value.recent_models:
            model = file_model(path)
            if model is not None:
                out.append((f"{model['name']} (recent)", model))
        return out

    def current_model(self) -> dict[str, Any]:
        """The model in use as ``Project.model`` names it ({} for none)."""
        info = self.ctx.model.info
        if info is None:
            return {}
        if info.server:
            conn = self._win.remote.current
            return {"connection": conn.id} if conn is not None else {}
        on_disk = file_model(info.path)  # its size as the library and the dialog read it
        return on_disk or {"path": str(info.path), "name": info.path.name, "size": info.file_size}

    def preset_names(self) -> list[str]:
        return self._win.presets.names()

    def current_adapters(self) -> list[dict[str, Any]]:
        return self._win.lora_panel.stack().signature()

    def tool_specs(self) -> list[dict[str, Any]]:
        specs: list[dict[str, Any]] = []
        for status in self._win.tools.proxy.statuses():
            for tool in status.tools:
                spec = tool.spec()
                specs.append(
                    {
                        "name": spec.name,
                        "description": spec.description,
                        "parameters": dict(spec.parameters),
                    }
                )
        return specs

    def app_tools(self) -> list[ToolSpec]:
        """The tools a chat is offered now when its project chose none (switched on,
        servers ready), without waiting for a server."""
        return [
            tool.spec()
            for status in self._win.tools.proxy.statuses()
            if status.state == "ready"
            for tool in status.tools
            if tool.enabled
        ]

    # -- a project's chat shown --------------------------------------------------------

    def on_conversation(self, conv: Conversation) -> None:
        """A chat is shown: the settings its project names are applied (once per chat)."""
        if conv.id == self.shown:
            return  # shown again (redrawn): what the user changed since stays
        self.shown = conv.id
        if not conv.project_id:
            return
        try:
            project = self.store.load(conv.project_id)
        except ProjectError:
            return  # shown ungrouped; the sidebar says why
        if project.preset and not conv.sampling:
            self.apply_preset(project.preset)
        if project.lora:
            self.apply_adapters(project)
        if project.model and not same_model(project.model, self.current_model()):
            # Asked once the chat is shown, not from inside the session's call.
            QTimer.singleShot(0, self, lambda: self._offer_model(conv.id, project))

    def apply_preset(self, name: str) -> None:
        """Preset ``name`` is in use for this chat (not saved as the app's settings)."""
        try:
            params = self._win.presets.get(name)
        except PresetError:
            self.ctx.notice(f"The project's preset {name} is not saved any more.")
            return
        self.ctx.settings.value.sampling = params
        panel = self._win.sampling_panel
        panel.presets_bar.choose(name)
        panel.set_params(params)

    def apply_adapters(self, project: Project) -> None:
        """The project's adapters, applied hot, when every file is there."""
        paths = [str(e.get("path", "")) for e in project.lora]
        missing = [p for p in paths if not Path(p).is_file()]
        if missing:
            self.ctx.notice(
                f"The adapters of {project.name} were not applied: {missing[0]} is missing."
            )
            return
        try:
            stack = LoraStack.from_signature(project.lora)
        except (KeyError, TypeError, ValueError) as exc:
            self.ctx.notice(f"The adapters of {project.name} were not applied: {exc}")
            return
        if stack == self._win.lora_panel.stack():
            return
        self._win.lora_panel.set_stack(stack)
        self.ctx.client.set_lora_stack(stack)

    def _after_load(self, loading: bool) -> None:
        waiting, self._waiting = self._waiting, None
        if not loading and waiting is not None:
            self._offer_model(*waiting)

    def _offer_model(self, conv_id: str, project: Project) -> None:
        model = project.model
        if self.ctx.session.conversation.id != conv_id:
            return  # another chat was shown meanwhile
        if self.ctx.model.loading:
            self._waiting = (conv_id, project)  # asked once the load ends
            return
        if same_model(model, self.current_model()):
            return
        conn = self._win.remote.store.get(model["connection"]) if "connection" in model else None
        if "connection" in model and conn is None:
            self.ctx.notice(f"The server connection of {project.name} is no longer saved.")
            return
        if conn is None and not Path(str(model.get("path", ""))).is_file():
            self.ctx.notice(f"The model of {project.name} is not at {model.get('path')}.")
            return
        name = conn.name if conn is not None else model_label(model)
        answer = QMessageBox.question(
            self.ctx.parent,
            "The project's model",
            f"Load {name} for this project? The model reloads.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.Yes,
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        if conn is not None:
            remote = self._win.remote
            self.ctx.session.when_idle(lambda: remote.connect_to(conn))
        else:
            self.ctx.open_model(str(model["path"]))
