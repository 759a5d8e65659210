"""The Think button beside the input box: thinking Auto / On / Off and the effort.

It shows and edits two sampling fields of the open conversation (``thinking`` and
``reasoning_effort``); whoever owns ``SamplingParams`` applies the choice
(``ui.window.thinking_controls``), so it and the sampling panel always agree.
"""

from __future__ import annotations

from functools import partial

from PySide6.QtCore import Signal
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QMenu, QWidget

from app.config.setting_records import SamplingParams
from app.engine.backend import ModelInfo
from ui.common.qt_util import MenuToolButton

THINKING = {"auto": "Auto (the template's default)", "on": "On", "off": "Off"}
EFFORTS = {"auto": "Auto", "low": "Low", "medium": "Medium", "high": "High"}
LABELS = {"auto": "Think: auto", "on": "Think: on", "off": "Think: off"}
NO_SIGN = "This model shows no sign of thinking: its chat template has no thinking block."


def reasoning_tip(info: ModelInfo | None) -> tuple[bool, bool, str]:
    """(usable, effort usable, tooltip) for the model in use."""
    if info is None:
        return False, False, "No model is loaded."
    fmt = info.reasoning
    if fmt is None:
        if info.server:  # an OpenAI-compatible server may think and send it apart
            return (
                True,
                True,
                (
                    "Thinking on the server: Lamplight sends the choice as the template "
                    "variables enable_thinking and reasoning_effort; the server decides."
                ),
            )
        return False, False, NO_SIGN
    switch = (
        f"the template switches it with {fmt.switch}"
        if fmt.switch
        else "the template has no switch: Off closes an empty thinking block"
    )
    effort = "reads reasoning_effort" if fmt.effort else "reads no reasoning effort"
    return True, fmt.effort, f"Thinks ({fmt.name}): {switch}; it {effort}."


class ThinkButton(MenuToolButton):
    """Thinking Auto / On / Off, with an Effort submenu where the template reads one.

    Signals:
        chosen(str, str): a field (``thinking`` or ``reasoning_effort``) and its new value.
    """

    chosen = Signal(str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("thinkButton")
        self.setAccessibleName("Thinking")
        self.setText(LABELS["auto"])
        menu = QMenu(self)
        menu.setObjectName("thinkMenu")
        self.modes = self._group(menu, "thinking", THINKING)
        menu.addSeparator()
        self.effort_menu = menu.addMenu("Effort")
        self.effort_menu.setObjectName("effortMenu")
        self.efforts = self._group(self.effort_menu, "reasoning_effort", EFFORTS)
        self.setMenu(menu)
        self.set_model(None)

    def _group(self, menu: QMenu, name: str, choices: dict[str, str]) -> dict[str, QAction]:
        group = QActionGroup(menu)
        actions: dict[str, QAction] = {}
        for value, text in choices.items():
            action = menu.addAction(text)
            action.setObjectName(f"{name}_{value}")
            action.setCheckable(True)
            action.triggered.connect(partial(self.chosen.emit, name, value))
            group.addAction(action)
            actions[value] = action
        return actions

    def show_params(self, params: SamplingParams) -> None:
        """Show the conversation's settings (no signal)."""
        thinking = params.thinking if params.thinking in THINKING else "auto"
        effort = params.reasoning_effort if params.reasoning_effort in EFFORTS else "auto"
        self.modes[thinking].setChecked(True)
        self.efforts[effort].setChecked(True)
        label = LABELS[thinking]
        if effort != "auto" and thinking != "off":
            label += f" · {effort}"
        self.setText(label)

    def set_model(self, info: ModelInfo | None) -> None:
        """Enable what the model in use can honour, saying why not in the tooltip."""
        usable, effort, tip = reasoning_tip(info)
        self.setEnabled(usable)
        self.effort_menu.setEnabled(effort)
        self.effort_menu.setToolTip("" if effort else "This template reads no reasoning effort.")
        self.setToolTip(f"Thinking for this chat. {tip}" if usable else f"Not here: {tip}")
