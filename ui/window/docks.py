"""The main window's dock panels: sampling, LoRA adapters (tabbed with it) and charts.

The conversation is the biggest thing in the window: the sampling and LoRA panels share
one tabbed column on the right, and the charts (a row the width of the window) start
closed, under the chat when opened (View → Performance, Ctrl+Shift+P). The status bar
shows the reply speed meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMainWindow

from app.config.presets import PresetStore
from app.config.setting_records import LoadConfig, SamplingParams
from ui.chat import conversation_files
from ui.common.context import Context
from ui.perf.perf_panel import PerfPanel
from ui.settings.lora_panel import LoraPanel
from ui.settings.sampling_panel import SamplingPanel

SIDE_WIDTH = 380  # px: the sampling / LoRA column
PERF_HEIGHT = 250  # px: the charts, once opened


def build(
    win: QMainWindow,
    ctx: Context,
    presets: PresetStore,
    sampling_changed: Callable[[SamplingParams], None],
    reload_requested: Callable[[LoadConfig], None],
) -> tuple[SamplingPanel, PerfPanel, LoraPanel]:
    """Create the docks, wire them (``sampling_changed``: new sampling settings;
    ``reload_requested``: load settings that need a reload) and lay them out."""
    settings = ctx.settings.value
    sampling = SamplingPanel(presets, settings.sampling, settings.load, win)
    sampling.samplingChanged.connect(sampling_changed)
    sampling.reloadRequested.connect(reload_requested)
    ctx.model.changed.connect(sampling.set_model)  # reasoning settings the template can use
    win.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, sampling)
    perf = PerfPanel(win)
    perf.exportRequested.connect(
        lambda: conversation_files.ask_export_metrics(ctx, ctx.session.conversation)
    )
    win.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, perf)
    lora = LoraPanel(win)
    lora.stackChanged.connect(ctx.client.set_lora_stack)
    win.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, lora)
    win.tabifyDockWidget(sampling, lora)
    sampling.raise_()
    win.resizeDocks([perf], [PERF_HEIGHT], Qt.Orientation.Vertical)
    win.resizeDocks([sampling], [SIDE_WIDTH], Qt.Orientation.Horizontal)
    perf.hide()  # a saved layout in which the user opened it opens it again
    return sampling, perf, lora
