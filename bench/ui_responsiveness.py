"""Does the window stay responsive while the real model streams, with every chart on?

The real MainWindow (offscreen) streams long greedy replies from the default
model. A 1 ms precise QTimer on the GUI thread records how late each tick
fires while tokens stream; the lateness is the event-loop stall. Replies run
alternately with the performance panel shown (charts on) and hidden (charts
off), so decode speed can be compared in the same run.

Prints one JSON object: stall_p99_ms, stall_max_ms (charts on), charts_on_tok_s,
charts_off_tok_s, ratio (on/off), plus the charts-off stall figures.
Usage: python bench/ui_responsiveness.py [--tokens 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.guarded import use_native_guard  # noqa: E402 (after the path above)


def percentile(values: list[float], q: float) -> float:
    from app.engine.metrics import percentile as pct

    return pct(values, q)


def main() -> None:
    use_native_guard()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from PySide6.QtCore import QEventLoop, QObject, Qt, QTimer, Slot
    from PySide6.QtWidgets import QApplication

    from app.config.setting_records import LoadConfig, SamplingParams
    from app.models.default_model import ensure_default_model
    from bench.app_window import open_app_window

    app = QApplication([])
    window = open_app_window(
        tempfile.mkdtemp(prefix="lamplight-ui-bench-"),
        ensure_default_model(ROOT / ".cache" / "test-models"),
        LoadConfig(n_ctx=4096, n_threads=args.threads),
        SamplingParams.greedy(args.tokens),
        store=True,
    )
    window.resize(1500, 950)

    class Probe(QObject):
        """Ticks every millisecond; records lateness while tokens stream."""

        def __init__(self) -> None:
            super().__init__()
            self.timer = QTimer(self)
            self.timer.setTimerType(Qt.TimerType.PreciseTimer)
            self.timer.setInterval(1)
            self.timer.timeout.connect(self.tick)
            self.last = 0.0
            self.stalls: list[float] = []
            self.streaming = False

        @Slot()
        def tick(self) -> None:
            now = time.perf_counter()
            if self.streaming and self.last:
                self.stalls.append(max(0.0, (now - self.last) * 1000 - 1.0))
            self.last = now

        @Slot(int, str)
        def on_tokens(self, _req: int, _text: str) -> None:
            self.streaming = True

    def one_reply(charts: bool) -> dict[str, Any]:
        window.perf_panel.setVisible(charts)
        window.new_chat()
        probe = Probe()
        window.client.worker.tokens.connect(probe.on_tokens)
        done = QEventLoop()
        window.replyEnded.connect(done.quit)
        # Stop sampling stalls before the reply's one-off Markdown render at the end.
        window.client.worker.finished.connect(lambda *_: setattr(probe, "streaming", False))
        probe.timer.start()
        window.chat_input.setPlainText("Write a very long story about the sea and a lighthouse.")
        window.send()
        done.exec()
        probe.timer.stop()
        window.replyEnded.disconnect(done.quit)
        window.client.worker.tokens.disconnect(probe.on_tokens)
        m = window.reply_metrics[-1]
        return {"tok_s": m.decode_tok_s, "stalls": probe.stalls}

    on: list[dict[str, Any]] = []
    off: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        on.append(one_reply(True))
        off.append(one_reply(False))
    window.close()

    stalls_on = [s for r in on for s in r["stalls"]]
    stalls_off = [s for r in off for s in r["stalls"]]
    on_tok_s = statistics.median(r["tok_s"] for r in on)
    off_tok_s = statistics.median(r["tok_s"] for r in off)
    print(
        json.dumps(
            {
                "stall_p99_ms": round(percentile(stalls_on, 99), 2),
                "stall_max_ms": round(max(stalls_on, default=0.0), 2),
                "charts_on_tok_s": round(on_tok_s, 2),
                "charts_off_tok_s": round(off_tok_s, 2),
                "ratio": round(on_tok_s / off_tok_s, 3),
                "charts_off_stall_p99_ms": round(percentile(stalls_off, 99), 2),
                "charts_off_stall_max_ms": round(max(stalls_off, default=0.0), 2),
                "ticks_measured": len(stalls_on),
                "tokens": args.tokens,
                "rounds": args.rounds,
            }
        )
    )
    del app


if __name__ == "__main__":
    main()
