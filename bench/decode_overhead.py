"""Decode speed through the whole app path versus bare llama-cpp-python, in one run.

App path: engine generator -> worker QThread -> queued signals -> MainWindow ->
transcript view, on a Qt event loop (offscreen). Raw: ``Llama.generate`` on a
second ``Llama`` of the same file, same prompt, greedy, same thread count.
Native: llama.cpp's own decode timer (``llama_perf_context``) during the app run.

Prints one JSON object: app_tok_s, raw_tok_s, ratio, native_tok_s, native_ratio.
Usage: python bench/decode_overhead.py [--tokens 256] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import EngineEvent
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.models.default_model import ensure_default_model
from bench.guarded import use_native_guard

PROMPT = "Write a long story about a lighthouse keeper and the sea."


class PerfEngine(Engine):
    """Records llama.cpp's own counters for each reply, on the engine thread."""

    perf: ClassVar[list[tuple[int, float]]] = []

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: Any = None,
        end_thinking: Any = None,
        tools: Any = None,
    ) -> Iterator[EngineEvent]:
        import llama_cpp

        ctx = self.native.ctx
        llama_cpp.llama_perf_context_reset(ctx)
        try:
            yield from super().generate(messages, params, stop, end_thinking, tools)
        finally:  # the worker closes the generator once it has the Finished event
            data = llama_cpp.llama_perf_context(ctx)
            PerfEngine.perf.append((int(data.n_eval), float(data.t_eval_ms)))


def app_round(window: Any, tokens: int) -> float:
    """Decode tok/s as seen by the GUI thread: first to last token arrival."""
    from PySide6.QtCore import QEventLoop, QObject, Slot

    class Arrivals(QObject):
        """Lives on the GUI thread, so the queued signal is timed where the view gets it."""

        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

        @Slot(int, str)
        def on_tokens(self, _req: int, _text: str) -> None:
            self.times.append(time.perf_counter())

    arrivals = Arrivals()
    window.client.worker.tokens.connect(arrivals.on_tokens)
    loop = QEventLoop()
    window.replyEnded.connect(loop.quit)
    window.new_chat()
    window.chat_input.setPlainText(PROMPT)
    window.send()
    loop.exec()
    window.replyEnded.disconnect(loop.quit)
    window.client.worker.tokens.disconnect(arrivals.on_tokens)
    generated = window.reply_metrics[-1].generated_tokens
    span = arrivals.times[-1] - arrivals.times[0]
    return (generated - 1) / span if span > 0 else 0.0


def raw_round(llm: Any, prompt_tokens: list[int], tokens: int) -> float:
    llm.reset()
    times: list[float] = []
    for _tok in llm.generate(
        prompt_tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
    ):
        times.append(time.perf_counter())
        if len(times) >= tokens:
            break
    return (len(times) - 1) / (times[-1] - times[0])


def main() -> None:
    use_native_guard()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from PySide6.QtWidgets import QApplication

    from bench.app_window import open_app_window

    model = ensure_default_model(Path(__file__).resolve().parent.parent / ".cache" / "test-models")
    load = LoadConfig(n_ctx=2048, n_threads=args.threads)
    qt_app = QApplication([])
    window = open_app_window(
        tempfile.mkdtemp(prefix="lamplight-bench-"),
        model,
        load,
        SamplingParams.greedy(args.tokens),
        PerfEngine,
    )

    from tests.native import llama  # the native guard's verdicts, as the app's engine

    llm = llama(
        model,
        n_ctx=2048,
        n_batch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    prompt_tokens = llm.tokenize(
        f"<start_of_turn>user\n{PROMPT}<end_of_turn>\n<start_of_turn>model\n".encode(),
        add_bos=True,
        special=True,
    )

    app_rates, raw_rates = [], []
    for _ in range(args.rounds):  # alternate, so drift hits both alike
        app_rates.append(app_round(window, args.tokens))
        raw_rates.append(raw_round(llm, prompt_tokens, args.tokens))
    native = [n * 1000.0 / ms for n, ms in PerfEngine.perf if ms > 0]
    llm.close()
    window.close()
    del window
    qt_app.shutdown() if hasattr(qt_app, "shutdown") else None

    app_tok_s = statistics.median(app_rates)
    raw_tok_s = statistics.median(raw_rates)
    native_tok_s = statistics.median(native)
    print(
        json.dumps(
            {
                "app_tok_s": round(app_tok_s, 2),
                "raw_tok_s": round(raw_tok_s, 2),
                "ratio": round(app_tok_s / raw_tok_s, 3),
                "native_tok_s": round(native_tok_s, 2),
                "native_ratio": round(app_tok_s / native_tok_s, 3),
                "tokens": args.tokens,
                "rounds": args.rounds,
                "threads": args.threads,
                "app_rounds": [round(r, 2) for r in app_rates],
                "raw_rounds": [round(r, 2) for r in raw_rates],
                "native_rounds": [round(r, 2) for r in native],
            }
        )
    )


if __name__ == "__main__":
    main()
