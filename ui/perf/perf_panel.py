"""Live performance charts (pyqtgraph): tokens/s, per-reply history, latency, context, memory.

Token arrivals only append a timestamp; the charts redraw from a timer a few
times a second, and not at all while the panel is hidden, so streaming cost
does not depend on the charts.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QTimer, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QDockWidget,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.engine.metrics import MessageMetrics
from app.util.sysinfo import rss_bytes
from ui.common.draft_stats import draft_text, drafted, tokens_per_pass

REDRAW_MS = 250
RSS_SAMPLE_MS = 2000
LIVE_WINDOW_S = 1.0  # moving average window
RSS_POINTS = 600

BLUE, ORANGE, GREEN, PURPLE, RED = "#3b82f6", "#f59e0b", "#10b981", "#a855f7", "#ef4444"


class PerfPanel(QDockWidget):
    """The ``perfPanel`` dock.

    Signals:
        exportRequested(): the user asked for the metrics as CSV.
    """

    exportRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Performance", parent)
        self.setObjectName("perfPanel")
        pg.setConfigOptions(antialias=False)  # cheaper redraws
        body = QWidget(self)
        grid = QGridLayout()
        self._build_charts()
        # One row of small charts: the panel sits under the chat without crowding it.
        for col, (plot, stretch) in enumerate(
            (
                (self.live, 3),
                (self.history, 2),
                (self.ttft, 2),
                (self.drafts, 2),
                (self.itl, 2),
                (self.memory, 2),
            )
        ):
            grid.addWidget(plot, 0, col)
            grid.setColumnStretch(col, stretch)
        self.context_bar = QProgressBar(body)
        self.context_bar.setObjectName("contextGauge")
        self.context_bar.setAccessibleName("Context used")
        self.context_bar.setFormat("context %v / %m tokens")
        self.context_bar.setRange(0, 1)
        self.summary = QLabel("", body)
        self.summary.setObjectName("perfSummary")
        self.summary.setWordWrap(True)
        export = QPushButton("Export CSV…", body)
        export.setObjectName("exportMetricsButton")
        export.clicked.connect(self.exportRequested)
        bottom = QHBoxLayout()
        bottom.addWidget(self.context_bar, 1)
        bottom.addWidget(export)
        layout = QVBoxLayout(body)
        layout.setContentsMargins(4, 2, 4, 2)
        layout.addLayout(grid, 1)
        layout.addWidget(self.summary)
        layout.addLayout(bottom)
        self.setWidget(body)

        self._arrivals: list[float] = []  # token arrival times of the running reply
        self._reply_start = 0.0
        self._history: list[MessageMetrics] = []
        self._rss: deque[tuple[float, float]] = deque(maxlen=RSS_POINTS)
        self._t0 = time.monotonic()
        self._dirty = True  # the live chart
        self._history_dirty = True  # per-reply charts, summary
        self._rss_dirty = True
        self.redraws = 0
        self._timer = QTimer(self)
        self._timer.setInterval(REDRAW_MS)
        self._timer.timeout.connect(self._on_redraw)
        self._rss_timer = QTimer(self)
        self._rss_timer.setInterval(RSS_SAMPLE_MS)
        self._rss_timer.timeout.connect(self._on_rss_sample)
        self._rss_timer.start()
        self._timer.start()
        self._on_rss_sample()
        self.apply_palette()

    def _build_charts(self) -> None:
        self.live = self._plot("Live speed (tok/s)", ("time", "s"), ("speed", "tok/s"))
        self.live_instant = self.live.plot(pen=pg.mkPen(BLUE, width=1), name="instant")
        self.live_average = self.live.plot(pen=pg.mkPen(ORANGE, width=2), name="1 s average")
        self.history = self._plot("Speed per reply", ("reply", ""), ("speed", "tok/s"))
        self.history_decode = _points(self.history, BLUE, "o", name="decode")
        self.history_prefill = _points(self.history, GREEN, "t", name="prompt")
        self.ttft = self._plot("Time to first token", ("reply", ""), ("time", "ms"))
        self.ttft_legend = self.ttft.addLegend(offset=(2, 2), labelTextSize="7pt")
        self.ttft_curve = _points(self.ttft, PURPLE, "o", name="first token")
        # Replies that thought: when the first answer token came (a gap for the others).
        self.ttft_answer = _points(self.ttft, ORANGE, "t", name="first answer", connect="finite")
        self.ttft_legend.removeItem(self.ttft_answer)  # listed once a reply has thought
        # Speculative decoding: guesses kept, and reply tokens per forward pass of the model
        # (1.0 is plain decoding); replies without drafting leave a gap. Thinking: the
        # share of a reply's tokens that were thinking.
        self.drafts = self._plot("Drafting, thinking per reply", ("reply", ""), ("ratio", ""))
        self.drafts.addLegend(offset=(2, 2), labelTextSize="7pt")
        self.drafts_speedup = _points(
            self.drafts, RED, "o", name="tokens per pass", connect="finite"
        )
        self.drafts_acceptance = _points(
            self.drafts, GREEN, "t", name="guesses kept", connect="finite"
        )
        self.drafts_thinking = _points(
            self.drafts, ORANGE, "s", name="thinking share", connect="finite"
        )
        # Latency of the last reply's tokens: its thinking tokens (under) and answer tokens.
        self.itl = self._plot("Token latency, last reply", ("latency", "ms"), ("tokens", ""))
        self.itl_thinking_bars = pg.BarGraphItem(x=[], height=[], width=1.0, brush=ORANGE)
        self.itl_bars = pg.BarGraphItem(x=[], height=[], width=1.0, brush=BLUE)
        self.itl.addItem(self.itl_thinking_bars)
        self.itl.addItem(self.itl_bars)
        # Bytes with SI prefixes: the axis reads MB or GB as the figure grows.
        self.memory = self._plot("Memory", ("time", "s"), ("resident", "B"), si_y=True)
        self.memory_curve = self.memory.plot(pen=pg.mkPen(ORANGE, width=2))
        # A flat line (the first samples) would otherwise zoom into bytes: "148.2547204 MB".
        self.memory.getViewBox().setLimits(minYRange=16 * 1024 * 1024, minXRange=1.0, xMin=0.0)

    def _plot(
        self, title: str, x: tuple[str, str], y: tuple[str, str], si_y: bool = False
    ) -> pg.PlotWidget:
        """A small chart; ``x`` and ``y`` are (label, unit).

        pyqtgraph puts an SI prefix before a unit as values grow, which turns a value
        already in ms into "kms" and tok/s into "ktok/s": off, except where asked for
        (a figure in bytes).
        """
        w = pg.PlotWidget(title=title)
        w.setAccessibleName(f"{title} chart")
        for side, (text, unit), si in (("bottom", x, False), ("left", y, si_y)):
            axis = w.getAxis(side)
            axis.enableAutoSIPrefix(si)
            w.setLabel(side, text, units=unit or None)
        w.setMouseEnabled(x=False, y=False)
        w.hideButtons()
        w.setMinimumHeight(150)
        w.setMinimumWidth(96)  # six charts in a row still fit a 700-pixel window
        # No grid: pyqtgraph draws it into the axes' QPicture, and replaying that made
        # each redraw ~6x slower here (37 ms instead of 6.5 ms per update, offscreen).
        return w

    def changeEvent(self, event: QEvent) -> None:
        """Follow the palette (a light/dark switch) with the charts' own colours."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.apply_palette()

    def apply_palette(self) -> None:
        """Readable in light and dark themes: follow the window palette."""
        pal = self.palette()
        bg = pal.color(QPalette.ColorRole.Base)
        fg = pal.color(QPalette.ColorRole.Text)
        for w in (self.live, self.history, self.ttft, self.drafts, self.itl, self.memory):
            w.setBackground(bg)
            for axis in ("left", "bottom"):
                a = w.getAxis(axis)
                a.setPen(pg.mkPen(fg))
                a.setTextPen(pg.mkPen(fg))
            w.setTitle(w.plotItem.titleLabel.text, color=QColor(fg).name())

    # -- feeding -------------------------------------------------------------------------

    def start_reply(self) -> None:
        self._arrivals = []
        self._reply_start = time.monotonic()
        self._dirty = True

    def add_tokens(self, n: int = 1) -> None:
        """Tokens just arrived (O(1): the charts catch up on the next redraw)."""
        now = time.monotonic()
        self._arrivals.extend([now] * n)
        self._dirty = True

    def end_reply(self, metrics: MessageMetrics) -> None:
        self._history.append(metrics)
        self.set_context(metrics.context_used, metrics.n_ctx, self._dropped())
        self._history_dirty = True

    def set_history(self, history: Sequence[MessageMetrics]) -> None:
        """All replies of the conversation (on open or resume)."""
        self._history = list(history)
        self._arrivals = []
        last = self._history[-1] if self._history else None
        self.set_context(
            last.context_used if last else 0, last.n_ctx if last else 1, self._dropped()
        )
        self._dirty = self._history_dirty = True
        self._on_redraw()

    def _dropped(self) -> tuple[int, int]:
        """Messages and tokens the conversation's replies dropped from the model's memory."""
        return (
            sum(m.dropped_count for m in self._history),
            sum(m.dropped_tokens for m in self._history),
        )

    def set_context(self, used: int, n_ctx: int, dropped: tuple[int, int] = (0, 0)) -> None:
        """The gauge: tokens the model holds now, and what left its memory to make room."""
        self.context_bar.setRange(0, max(1, n_ctx))
        self.context_bar.setValue(min(used, max(1, n_ctx)))
        n, tokens = dropped
        extra = (
            f" · {n} earlier message{'s' if n != 1 else ''} dropped ({tokens} tokens)" if n else ""
        )
        self.context_bar.setFormat(f"context %v / %m tokens{extra}")

    # -- drawing -------------------------------------------------------------------------

    def live_points(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time s, instant tok/s, moving-average tok/s), one point per redraw bucket."""
        if len(self._arrivals) < 2:
            empty = np.zeros(0)
            return empty, empty, empty
        t = np.asarray(self._arrivals) - self._reply_start
        bucket = REDRAW_MS / 1000.0
        edges = np.arange(t[0], t[-1] + bucket, bucket)
        counts, _ = np.histogram(t, bins=edges) if len(edges) > 1 else (np.array([len(t)]), 0)
        x = edges[1:] if len(edges) > 1 else np.array([t[-1]])
        if len(x) > 1:
            # The last bucket reaches past the newest token: it would read as a slowdown.
            x, counts = x[:-1], counts[:-1]
        instant = counts / bucket
        k = max(1, round(LIVE_WINDOW_S / bucket))
        average = np.convolve(instant, np.ones(k) / k, mode="full")[: len(instant)]
        return x, instant, average

    def _on_redraw(self) -> None:
        """Redraw what changed: while a reply streams that is only the live chart."""
        if not self.isVisible() or not (self._dirty or self._history_dirty or self._rss_dirty):
            return
        self.redraws += 1
        if self._dirty:
            self._dirty = False
            x, instant, average = self.live_points()
            self.live_instant.setData(x, instant)
            self.live_average.setData(x, average)
        if self._history_dirty:
            self._history_dirty = False
            self._draw_history()
        if self._rss_dirty and self._rss:
            self._rss_dirty = False
            pts = np.asarray(self._rss)
            self.memory_curve.setData(pts[:, 0], pts[:, 1])

    def _draw_history(self) -> None:
        n = np.arange(1, len(self._history) + 1)
        self.history_decode.setData(n, [m.decode_tok_s for m in self._history])
        self.history_prefill.setData(n, [m.prefill_tok_s for m in self._history])
        self.ttft_curve.setData(n, [m.ttft_ms for m in self._history])
        first_answer, share = self.thinking_points()
        speedup, acceptance = self.draft_points()
        for curve, ys in (
            (self.drafts_speedup, speedup),
            (self.drafts_acceptance, acceptance),
            (self.drafts_thinking, share),
            (self.ttft_answer, first_answer),
        ):
            if np.isnan(ys).all():  # none drafted (thought): nothing to draw, no NaN bounds
                curve.setData([], [])
            else:
                curve.setData(n, ys)
        self._list_first_answer(not np.isnan(first_answer).all())
        if not self._history:
            for bars in (self.itl_bars, self.itl_thinking_bars):
                bars.setOpts(x=[], height=[], y0=None, width=1.0)  # y0: the last reply's
            self.summary.setText("")
            return
        last = self._history[-1]
        self._draw_itl(last)
        self.summary.setText(
            f"Last reply: {last.decode_tok_s:.1f} tok/s decode "
            f"(llama.cpp: {last.native_decode_tok_s:.1f}), prompt "
            f"{last.prefill_tok_s:.0f} tok/s (llama.cpp: {last.native_prefill_tok_s:.0f}), "
            f"{first_token_text(last)}, ITL p50 {last.itl_p50_ms:.1f} / p95 "
            f"{last.itl_p95_ms:.1f} / max {last.itl_max_ms:.1f} ms"
            + (f"; {draft_text(last)}" if drafted(last) else "")
        )

    def _draw_itl(self, last: MessageMetrics) -> None:
        """The last reply's token latencies; its thinking tokens' share stacked under."""
        itl = last.inter_token_ms
        if not itl:
            return
        # Thinking comes first: interval i is token i + 1's, thinking while i + 1 < R.
        split = max(0, min(len(itl), last.reasoning_tokens - 1))
        edges = np.histogram_bin_edges(itl, bins=min(30, max(5, len(itl) // 4)))
        thinking, _ = np.histogram(itl[:split], bins=edges)
        answer, _ = np.histogram(itl[split:], bins=edges)
        x, width = (edges[:-1] + edges[1:]) / 2, float(edges[1] - edges[0])
        self.itl_thinking_bars.setOpts(x=x, height=thinking, width=width)
        self.itl_bars.setOpts(x=x, height=answer, y0=thinking, width=width)

    def _list_first_answer(self, shown: bool) -> None:
        """The "first answer" legend entry, only while some reply has thought."""
        listed = self.ttft_legend.getLabel(self.ttft_answer) is not None
        if shown and not listed:
            self.ttft_legend.addItem(self.ttft_answer, "first answer")
        elif listed and not shown:
            self.ttft_legend.removeItem(self.ttft_answer)

    def thinking_points(self) -> tuple[np.ndarray, np.ndarray]:
        """Per reply: ms to the first answer token, and the share of its tokens that were
        thinking (NaN for a reply that did not think: a gap)."""
        first = [
            (m.first_answer_ms if m.reasoning_tokens else 0.0) or np.nan for m in self._history
        ]
        share = [m.reasoning_tokens / max(1, m.generated_tokens) or np.nan for m in self._history]
        return np.asarray(first, dtype=float), np.asarray(share, dtype=float)

    def draft_points(self) -> tuple[np.ndarray, np.ndarray]:
        """Per reply: tokens per forward pass and the fraction of guesses kept (NaN for a
        reply made without drafting, so the curves show a gap there)."""
        speedup = [tokens_per_pass(m) if drafted(m) else np.nan for m in self._history]
        kept = [m.acceptance if m.drafted_tokens else np.nan for m in self._history]
        return np.asarray(speedup, dtype=float), np.asarray(kept, dtype=float)

    def _on_rss_sample(self) -> None:
        self._rss.append((time.monotonic() - self._t0, float(rss_bytes())))
        self._rss_dirty = True

    def stop_timers(self) -> None:
        self._timer.stop()
        self._rss_timer.stop()


def _duration(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def first_token_text(m: MessageMetrics) -> str:
    """TTFT, and for a reply that thought when its answer began and what thinking took:
    "TTFT 120 ms · first answer 4.2 s · thought 4.0 s, 380 tokens (cut at the budget)"."""
    text = f"TTFT {m.ttft_ms:.0f} ms"
    if not m.reasoning_tokens:
        return text
    if m.first_answer_ms:
        text += f" · first answer {_duration(m.first_answer_ms)}"
    text += f" · thought {_duration(m.reasoning_ms)}, {m.reasoning_tokens} tokens"
    cut = {"budget": "cut at the budget", "user": "stopped by you"}.get(m.thinking_cut)
    return text + (f" ({cut})" if cut else "")


def _points(plot: pg.PlotWidget, color: str, symbol: str, **kwargs: Any) -> pg.PlotDataItem:
    """A per-reply curve on ``plot``: a line with a ``symbol`` at each reply."""
    return plot.plot(
        pen=pg.mkPen(color, width=2), symbol=symbol, symbolSize=5, symbolBrush=color, **kwargs
    )
