"""Light and dark: follow the OS colour scheme live, or the one chosen in View -> Appearance.

Qt (6.5+) reports the OS scheme through ``QStyleHints.colorScheme`` and its
``colorSchemeChanged`` signal, and on most platforms switches the application
palette itself. Where it does not (a platform theme without dark support, the
Windows "windowsvista" style), the palette is set here, so the colours always
match the scheme. Widgets that paint with fixed colours (the charts, the
transcript's HTML) listen to ``Theme.changed`` or to their palette-change events.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

CHOICES = ("system", "light", "dark")
NATIVE_LIGHT_ONLY = ("windowsvista", "windows")  # styles that draw light whatever the palette

_SCHEMES = {"light": Qt.ColorScheme.Light, "dark": Qt.ColorScheme.Dark}


def is_dark(palette: QPalette) -> bool:
    """Whether ``palette`` is a dark one (light text on a dark window)."""
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def dark_palette() -> QPalette:
    """A dark palette for when the platform has none."""
    p = QPalette()
    base, window, text = QColor("#1e1f22"), QColor("#2b2d30"), QColor("#e6e6e6")
    disabled = QColor("#7f8389")
    for role, color in (
        (QPalette.ColorRole.Window, window),
        (QPalette.ColorRole.WindowText, text),
        (QPalette.ColorRole.Base, base),
        (QPalette.ColorRole.AlternateBase, QColor("#26282b")),
        (QPalette.ColorRole.ToolTipBase, QColor("#3c3f41")),
        (QPalette.ColorRole.ToolTipText, text),
        (QPalette.ColorRole.PlaceholderText, disabled),
        (QPalette.ColorRole.Text, text),
        (QPalette.ColorRole.Button, window),
        (QPalette.ColorRole.ButtonText, text),
        (QPalette.ColorRole.BrightText, QColor("#ff6b6b")),
        (QPalette.ColorRole.Light, QColor("#3c3f41")),
        (QPalette.ColorRole.Midlight, QColor("#34373a")),
        (QPalette.ColorRole.Mid, QColor("#4a4d50")),
        (QPalette.ColorRole.Dark, QColor("#151617")),
        (QPalette.ColorRole.Shadow, QColor("#000000")),
        (QPalette.ColorRole.Highlight, QColor("#3d6fb4")),
        (QPalette.ColorRole.HighlightedText, QColor("#ffffff")),
        (QPalette.ColorRole.Link, QColor("#7aa7ff")),
        (QPalette.ColorRole.LinkVisited, QColor("#b69cff")),
    ):
        p.setColor(role, color)
    for role in (
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
    ):
        p.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return p


def light_palette() -> QPalette:
    """A light palette for when the platform's own is dark and light was asked for."""
    p = QPalette(QColor("#efefef"))  # Qt derives the other roles from the button colour
    p.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.Text, QColor("#1b1b1b"))
    p.setColor(QPalette.ColorRole.WindowText, QColor("#1b1b1b"))
    p.setColor(QPalette.ColorRole.Highlight, QColor("#3574f0"))
    p.setColor(QPalette.ColorRole.HighlightedText, QColor("#ffffff"))
    return p


class Theme(QObject):
    """The application's colour scheme (one per ``QApplication``: see ``theme_for``).

    Signals:
        changed(bool): the scheme changed; True when it is now dark.
    """

    changed = Signal(bool)

    def __init__(self, app: QApplication, choice: str = "system") -> None:
        super().__init__(app)
        self.setObjectName("lamplightTheme")
        self._app = app
        self.choice = choice if choice in CHOICES else "system"
        self._own_palette = False
        self._os_scheme = app.styleHints().colorScheme()
        self._last_dark = self.dark
        app.styleHints().colorSchemeChanged.connect(self._on_color_scheme_changed)
        self._request_scheme()
        self._apply()

    @property
    def dark(self) -> bool:
        return is_dark(self._app.palette())

    def set_choice(self, choice: str) -> None:
        """``system`` (follow the OS), ``light`` or ``dark``."""
        if choice not in CHOICES or choice == self.choice:
            return
        self.choice = choice
        self._request_scheme()
        self._apply()

    def wanted_dark(self) -> bool | None:
        """Dark or light as chosen or as the OS says; None when the OS does not say."""
        if self.choice != "system":
            return self.choice == "dark"
        if self._os_scheme == Qt.ColorScheme.Dark:
            return True
        if self._os_scheme == Qt.ColorScheme.Light:
            return False
        return None

    def _request_scheme(self) -> None:
        """Ask the platform for the chosen scheme (where it can switch, it does)."""
        hints = self._app.styleHints()
        if self.choice == "system":
            hints.unsetColorScheme()
        else:
            hints.setColorScheme(_SCHEMES[self.choice])

    def _on_color_scheme_changed(self, scheme: Qt.ColorScheme) -> None:
        if self.choice == "system":
            self._os_scheme = scheme
        self._apply()

    def _apply(self) -> None:
        """Use the platform's palette if it matches the wanted scheme, else our own."""
        if self._own_palette:
            self._app.setPalette(QPalette())  # back to the platform's (it may have followed)
            self._own_palette = False
        want = self.wanted_dark()
        if want is not None and want != self.dark:
            if want and self._app.style().name().lower() in NATIVE_LIGHT_ONLY:
                self._app.setStyle("Fusion")
            self._app.setPalette(dark_palette() if want else light_palette())
            self._own_palette = True
        if self.dark != self._last_dark:
            self._last_dark = self.dark
            sheet = self._app.styleSheet()
            if sheet:
                # A style sheet reads palette(...) once: set it again to read the new one.
                self._app.setStyleSheet(sheet)
            self.changed.emit(self.dark)


def theme_for(app: QApplication, choice: str = "system") -> Theme:
    """The application's ``Theme``, made on first use (the window asks; so do tests)."""
    found = app.findChild(Theme, "lamplightTheme")
    if isinstance(found, Theme):
        return found
    return Theme(app, choice)
