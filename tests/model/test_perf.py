"""Performance data and charts: known timestamps, a real generation, resume, CSV."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.chat.conversation import Message
from app.chat.metrics_csv import COLUMNS, metrics_csv, read_metrics_csv
from app.chat.metrics_record import metrics_to_dict
from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from app.engine.metrics import MessageMetrics
from tests.conftest import TEST_LOAD
from tests.fakes.window import close_window
from tests.real_window import open_window
from ui.perf.perf_panel import PerfPanel
from ui.window.main_window import MainWindow


def synthetic(n: int = 5, start: float = 100.0, step: float = 20.0) -> MessageMetrics:
    return MessageMetrics(
        prompt_tokens=50,
        cached_tokens=10,
        evaluated_tokens=40,
        prefill_ms=80.0,
        generated_tokens=n,
        token_times_ms=[start + i * step for i in range(n)],
        stop_reason="eos",
        n_ctx=2048,
        drafted_tokens=10,
        accepted_tokens=7,
        native_prefill_tok_s=510.0,
        native_decode_tok_s=52.0,
        rss_mb=400.0,
    )


def test_metrics_from_known_timestamps() -> None:
    m = synthetic()
    assert m.decode_tok_s == pytest.approx(50.0)
    assert m.prefill_tok_s == pytest.approx(500.0)
    assert m.itl_max_ms == pytest.approx(20.0) and m.acceptance == pytest.approx(0.7)
    m.token_times_ms[3] += 15  # one slow token
    assert m.itl_max_ms == pytest.approx(35.0)
    assert m.itl_p50_ms == pytest.approx(20.0)


def test_live_points_bucket_arrivals(qtbot: QtBot) -> None:
    panel = PerfPanel()
    qtbot.addWidget(panel)
    panel.start_reply()
    base = panel._reply_start
    panel._arrivals = [base + 0.01 * i for i in range(200)]  # 100 tok/s for 2 s
    x, instant, average = panel.live_points()
    assert len(x) == len(instant) == len(average) == pytest.approx(8, abs=1)
    assert instant[1:-1] == pytest.approx(100.0, rel=0.15)
    assert average[-2] == pytest.approx(100.0, rel=0.15)
    panel.stop_timers()


def test_csv_round_trip() -> None:
    messages = [
        Message("user", "hi"),
        Message("assistant", "a", metrics=metrics_to_dict(synthetic())),
        Message("user", "more"),
        Message("assistant", "b", metrics=metrics_to_dict(synthetic(9, step=10.0))),
    ]
    rows = read_metrics_csv(metrics_csv(messages))
    assert [r["message"] for r in rows] == ["2", "4"]
    assert tuple(rows[0]) == COLUMNS
    assert float(rows[0]["decode_tok_s"]) == pytest.approx(50.0)
    assert float(rows[1]["decode_tok_s"]) == pytest.approx(100.0)
    assert float(rows[0]["native_decode_tok_s"]) == 52.0 and rows[0]["stop_reason"] == "eos"


@pytest.fixture()
def window(qtbot: QtBot, tmp_path: Path, model_path: Path) -> Iterator[MainWindow]:
    settings = AppSettings(load=TEST_LOAD, sampling=SamplingParams.greedy(120))
    win = open_window(qtbot, tmp_path / "data", model_path, settings, size=(1400, 900))
    win.perf_panel.show()  # the charts start closed
    yield win
    close_window(qtbot, win)


def points(panel: PerfPanel) -> int:
    x = panel.history_decode.getData()[0]
    return 0 if x is None else len(x)


def send(qtbot: QtBot, win: MainWindow, text: str) -> None:
    with qtbot.waitSignal(win.snapshotSaved, timeout=60_000):
        win.chat_input.setPlainText(text)
        qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)


def test_panel_follows_a_real_generation_and_survives_resume(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    panel = window.perf_panel
    panel.show()  # the charts start closed (View -> Performance)
    assert panel.isVisible()
    before = panel.redraws
    window.chat_input.setPlainText("Write a long story about the sea.")
    qtbot.keyClick(window.chat_input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(panel._arrivals) > 30, timeout=30_000)
    qtbot.waitUntil(lambda: panel.redraws > before + 1, timeout=5_000)
    x, _instant, _avg = panel.live_points()
    assert len(x) >= 1  # the live chart draws while the reply streams
    qtbot.waitSignal(window.snapshotSaved, timeout=60_000).wait()
    send(qtbot, window, "Go on.")
    qtbot.waitUntil(lambda: points(panel) == 2, timeout=2_000)  # next throttled redraw
    assert panel.context_bar.value() == window.reply_metrics[-1].context_used
    assert "llama.cpp" in panel.summary.text()
    last = window.reply_metrics[-1]
    assert last.native_decode_tok_s > 0 and last.rss_mb > 100
    # Within 25% of llama.cpp's own decode timer.
    assert last.decode_tok_s == pytest.approx(last.native_decode_tok_s, rel=0.25)

    conv_id = window.conversation.id
    window.new_chat()
    assert points(panel) == 0
    with qtbot.waitSignal(window.conversationOpened, timeout=30_000):
        window.open_conversation(conv_id)
    assert points(panel) == 2  # the charts survive a resume
    window.export_metrics(tmp_path / "m.csv")
    rows = read_metrics_csv((tmp_path / "m.csv").read_text())
    assert len(rows) == 2
    assert float(rows[1]["decode_tok_s"]) == pytest.approx(last.decode_tok_s, rel=0.01)
