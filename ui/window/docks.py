"""The main window's dock panels: sampling, LoRA adapters (tabbed with it) and charts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt

from ui.chat import conversation_files
from ui.perf.perf_panel import PerfPanel
from ui.settings.lora_panel import LoraPanel
from ui.settings.sampling_panel import SamplingPanel

if TYPE_CHECKING:
    from ui.window.main_window import MainWindow


def build(win: MainWindow) -> tuple[SamplingPanel, PerfPanel, LoraPanel]:
    """Create the docks, wire them to ``win`` and lay them out."""
    settings = win._settings
    sampling = SamplingPanel(win.presets, settings.sampling, settings.load, win)
    sampling.samplingChanged.connect(win._on_sampling_changed)
    sampling.reloadRequested.connect(win._on_reload_requested)
    win.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, sampling)
    perf = PerfPanel(win)
    perf.exportRequested.connect(
        lambda: conversation_files.ask_export_metrics(win, win.conversation)
    )
    win.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, perf)
    lora = LoraPanel(win)
    lora.stackChanged.connect(win._client.set_lora_stack)
    win.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, lora)
    win.tabifyDockWidget(sampling, lora)
    sampling.raise_()
    win.resizeDocks([perf], [250], Qt.Orientation.Vertical)
    win.resizeDocks([sampling], [380], Qt.Orientation.Horizontal)
    return sampling, perf, lora
