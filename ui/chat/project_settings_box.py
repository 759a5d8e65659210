"""The part of the Projects dialog that says what a project's chats run with: a model
(or a server connection), a sampling preset, LoRA adapters and MCP tools.

The choices come from the window (``ProjectChoices``); each edit is made on the
project shown and reported with ``edited(note)``, and the dialog saves it at once, as
it saves the API switch.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any, Protocol

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QWidget,
)

from app.chat.projects import Project

NAME_ROLE = Qt.ItemDataRole.UserRole


class ProjectChoices(Protocol):
    """What the window offers a project."""

    def model_choices(self) -> list[tuple[str, dict[str, Any]]]:
        """(label, ``Project.model`` value) for each model that can be named now."""
        ...

    def preset_names(self) -> list[str]: ...

    def current_adapters(self) -> list[dict[str, Any]]:
        """The LoRA stack applied now, as ``LoraStack.signature()`` entries.

        Raises:
            OSError: an adapter's file cannot be read.
        """
        ...

    def tool_specs(self) -> list[dict[str, Any]]:
        """The MCP tools known now: {name (qualified), description, parameters} each."""
        ...


def model_label(model: dict[str, Any]) -> str:
    """How a project's model is named to the user ("" for none)."""
    if "connection" in model:
        return f"server connection {model['connection']}"
    return str(model.get("name") or PurePath(str(model.get("path", ""))).name)


def same_model(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """``a`` and ``b`` name the same model (the same connection, or the same file)."""
    if "connection" in a or "connection" in b:
        return a.get("connection") == b.get("connection")
    return bool(a) and bool(b) and a.get("path") == b.get("path")


class ProjectSettingsBox(QWidget):
    """Model, preset, adapters and tools of the project shown (``show_project``).

    Signals:
        edited(str): the project shown was changed (to be saved); what to tell the user.
        failed(str): an edit could not be made, saying why.
    """

    edited = Signal(str)
    failed = Signal(str)

    def __init__(self, choices: ProjectChoices, parent: QWidget) -> None:
        super().__init__(parent)
        self.choices = choices
        self.project: Project | None = None
        self.model_box = QComboBox(self)
        self.model_box.setObjectName("projectModel")
        self.model_box.setAccessibleName("Model of the project")
        self.model_box.activated.connect(self._on_model)
        self.preset_box = QComboBox(self)
        self.preset_box.setObjectName("projectPreset")
        self.preset_box.setAccessibleName("Sampling preset of the project")
        self.preset_box.activated.connect(self._on_preset)
        self.adapters = QLabel(self)
        self.adapters.setObjectName("projectAdapters")
        self.adapters.setWordWrap(True)
        self.use_adapters = QPushButton("Use the adapters applied now", self)
        self.use_adapters.setObjectName("projectUseAdapters")
        self.use_adapters.clicked.connect(self.take_adapters)
        self.no_adapters = QPushButton("None", self)
        self.no_adapters.setObjectName("projectNoAdapters")
        self.no_adapters.clicked.connect(self.clear_adapters)
        self.tools = QListWidget(self)
        self.tools.setObjectName("projectTools")
        self.tools.setAccessibleName("MCP tools of the project")
        self.tools.setMaximumHeight(90)
        self.tools.setToolTip(
            "Its chats are offered only the ticked tools; with none ticked, the tools "
            "switched on in Tools. A ticked tool switched off there is not offered."
        )
        self.tools.itemChanged.connect(self._on_tool)
        row = QHBoxLayout()
        row.addWidget(self.adapters, 1)
        row.addWidget(self.use_adapters)
        row.addWidget(self.no_adapters)
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Model:", self.model_box)
        form.addRow("Preset:", self.preset_box)
        form.addRow("Adapters:", row)
        form.addRow("Tools:", self.tools)

    def show_project(self, project: Project | None) -> None:
        """Show ``project``'s settings (None: nothing, disabled) with the choices of now."""
        self.project = project
        self.refresh()
        for w in (self.model_box, self.preset_box, self.use_adapters, self.tools):
            w.setEnabled(project is not None)

    def refresh(self) -> None:
        """List the choices again (the window's models, presets or tools changed)."""
        self._fill_models()
        self._fill_presets()
        self._show_adapters()
        self._fill_tools()

    def _show_adapters(self) -> None:
        lora = self.project.lora if self.project else []
        names = ", ".join(f"{e.get('name', '?')}×{e.get('scale', 1.0)}" for e in lora)
        self.adapters.setText(names or "none")
        self.no_adapters.setEnabled(bool(lora))

    def _fill_models(self) -> None:
        box, want = self.model_box, self.project.model if self.project else {}
        box.clear()
        box.addItem("None (the model in use)", {})
        for label, model in self.choices.model_choices():
            if not any(same_model(model, box.itemData(i)) for i in range(1, box.count())):
                box.addItem(label, model)
        found = next((i for i in range(1, box.count()) if same_model(want, box.itemData(i))), 0)
        if want and not found:
            box.addItem(model_label(want), want)
            found = box.count() - 1
        box.setCurrentIndex(found)

    def _fill_presets(self) -> None:
        box, want = self.preset_box, self.project.preset if self.project else ""
        box.clear()
        box.addItem("None (the chat's own)", "")
        for name in self.choices.preset_names():
            box.addItem(name, name)
        if want and box.findData(want) < 0:
            box.addItem(f"{want} (no longer saved)", want)
        box.setCurrentIndex(max(box.findData(want), 0))

    def _fill_tools(self) -> None:
        project = self.project
        chosen = set(project.mcp_tools) if project else set()
        names = [str(s["name"]) for s in self.choices.tool_specs()]
        names += [n for n in sorted(chosen) if n not in names]  # kept while a server is off
        self.tools.blockSignals(True)
        self.tools.clear()
        for name in names:
            item = QListWidgetItem(name, self.tools)
            item.setData(NAME_ROLE, name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            on = name in chosen
            item.setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
        if not names:
            item = QListWidgetItem("No MCP tools are known now.", self.tools)
            item.setFlags(Qt.ItemFlag.NoItemFlags)
        self.tools.blockSignals(False)

    # -- edits -------------------------------------------------------------------------

    def _on_model(self, index: int) -> None:
        project, model = self.project, self.model_box.itemData(index)
        if project is None or not isinstance(model, dict) or model == project.model:
            return
        project.model = dict(model)
        self.edited.emit(f"Its chats use {model_label(model)}." if model else "No model named.")

    def _on_preset(self, index: int) -> None:
        project, name = self.project, self.preset_box.itemData(index)
        if project is None or not isinstance(name, str) or name == project.preset:
            return
        project.preset = name
        self.edited.emit(f"Its new chats start with preset {name}." if name else "No preset.")

    def take_adapters(self) -> None:
        """The LoRA stack applied now becomes the project's."""
        project = self.project
        if project is None:
            return
        try:
            project.lora = self.choices.current_adapters()
        except OSError as exc:
            self.failed.emit(f"Not changed: an adapter cannot be read ({exc}).")
            return
        self._show_adapters()
        self.edited.emit("Its chats use these adapters." if project.lora else "No adapters.")

    def clear_adapters(self) -> None:
        project = self.project
        if project is None or not project.lora:
            return
        project.lora = []
        self._show_adapters()
        self.edited.emit("No adapters.")

    def _on_tool(self, item: QListWidgetItem) -> None:
        project, name = self.project, item.data(NAME_ROLE)
        if project is None or not isinstance(name, str):
            return
        on = item.checkState() == Qt.CheckState.Checked
        if on == (name in project.mcp_tools):
            return
        if on:
            project.mcp_tools = [*project.mcp_tools, name]
            known = {str(s["name"]): s for s in self.choices.tool_specs()}
            if name in known:
                specs = [s for s in project.tool_specs if s.get("name") != name]
                project.tool_specs = [*specs, dict(known[name])]
        else:
            project.mcp_tools = [n for n in project.mcp_tools if n != name]
            project.tool_specs = [s for s in project.tool_specs if s.get("name") != name]
        self.edited.emit(f"Tool {name} {'offered' if on else 'no longer offered'}.")
