"""Accessible names for the main window's controls, for screen readers.

A control is named by its text (buttons), by the label whose buddy it is (form
fields), or here. ``name_controls`` fills in the controls that have neither:
the window's own lists and views by object name, and each sampling slider after
the label of the field it moves. ``unnamed`` lists what is still missing (the test
walks the window with it).
"""

from __future__ import annotations

from PySide6.QtGui import QAccessible
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractSlider,
    QAbstractSpinBox,
    QComboBox,
    QLabel,
    QLineEdit,
    QMainWindow,
    QPlainTextEdit,
    QScrollBar,
    QTabBar,
    QTextEdit,
    QWidget,
)

INTERACTIVE = (
    QAbstractButton,
    QAbstractItemView,
    QAbstractSlider,
    QAbstractSpinBox,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QTabBar,
    QTextEdit,
)

# objectName -> (name, description), for controls whose owner leaves them unnamed.
NAMES = {
    "conversationList": ("Conversations", "Saved chats, newest first"),
    "conversationSearch": ("Search conversations", "Filters titles and finds messages"),
    "sidebarNewChat": ("New chat", "Start a new conversation"),
    "newChatButton": ("New chat", "Start a new conversation (Ctrl+N)"),
    "loraAddButton": ("Add LoRA adapter", ""),
}


def name_controls(win: QMainWindow) -> None:
    """Give every interactive control of ``win`` that has no name one."""
    buddies = _buddy_labels(win)
    for w in win.findChildren(QWidget):
        if w.accessibleName() or not isinstance(w, INTERACTIVE):
            continue
        known = NAMES.get(w.objectName())
        if known is not None:
            w.setAccessibleName(known[0])
            if known[1] and not w.accessibleDescription():
                w.setAccessibleDescription(known[1])
            continue
        key = w.objectName().removeprefix("slider_")
        if isinstance(w, QAbstractSlider) and key != w.objectName():
            field = win.findChild(QWidget, f"field_{key}")
            label = buddies.get(field) if field is not None else None
            if label:
                w.setAccessibleName(f"{label} slider")


def unnamed(win: QMainWindow) -> list[QWidget]:
    """Controls on show that a screen reader would announce without a name (scroll bars
    and Qt's own inner parts, named ``qt_*``, are left out)."""
    missing: list[QWidget] = []
    for w in win.findChildren(QWidget):
        if not isinstance(w, INTERACTIVE) or isinstance(w, QScrollBar):
            continue
        if not w.isVisibleTo(win):
            continue
        if w.objectName().startswith("qt_") or _inside_qt_part(w, win):
            continue
        iface = QAccessible.queryAccessibleInterface(w)
        if iface is None or not iface.text(QAccessible.Text.Name).strip():
            missing.append(w)
    return missing


def _inside_qt_part(w: QWidget, win: QWidget) -> bool:
    """A widget Qt made inside another (a spin box's line edit, a combo box's list, a
    line edit's clear button)."""
    parent = w.parentWidget()
    while parent is not None and parent is not win:
        if parent.objectName().startswith("qt_") or isinstance(
            parent, (QAbstractSpinBox, QComboBox, QLineEdit)
        ):
            return True
        parent = parent.parentWidget()
    return False


def _buddy_labels(win: QMainWindow) -> dict[QWidget, str]:
    found: dict[QWidget, str] = {}
    for label in win.findChildren(QLabel):
        buddy = label.buddy()
        if buddy is not None and label.text():
            found[buddy] = label.text().replace("&", "").rstrip(":")
    return found
