"""The real app (``ui.main.main``), typing one message once its model is ready.

``python -m tests.crash_driver TEXT -- [lamplight arguments]`` (in the checkout) runs the app as
``lamplight`` would; the window it opens (through ``ui.main.open_window``, as
``main()`` does) gets ``TEXT`` typed into its message box and Enter pressed once the
model is ready. When the reply's first words reach the view, one JSON line goes to
stdout: ``{"streaming": true, "pid": ..., "conv": ...}``. ``tests/e2e/test_crash_recovery.py``
then kills the process.
"""

from __future__ import annotations

import json
import os
import sys

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

import ui.main as entry
from app.engine.backend import ModelInfo
from ui.window.main_window import MainWindow


def run(text: str, argv: list[str]) -> int:
    real_open = entry.open_window

    def open_and_type(*args: object, **kwargs: object) -> MainWindow:
        win = real_open(*args, **kwargs)  # type: ignore[arg-type]
        state = {"typed": False, "told": False}

        def on_ready(_info: ModelInfo) -> None:
            if not state["typed"]:
                state["typed"] = True
                QTest.keyClicks(win.chat_input, text)
                QTest.keyClick(win.chat_input, Qt.Key.Key_Return)

        def on_flushed(_n_tokens: int) -> None:  # on the GUI thread: the view has words
            if not state["told"] and win.session.reply_started:
                state["told"] = True
                line = {"streaming": True, "pid": os.getpid(), "conv": win.conversation.id}
                print(json.dumps(line), flush=True)

        win.modelReady.connect(on_ready)
        win.chat.flushed.connect(on_flushed)
        return win

    entry.open_window = open_and_type
    return entry.main(argv)


if __name__ == "__main__":
    split = sys.argv.index("--")
    sys.exit(run(" ".join(sys.argv[1:split]), sys.argv[split + 1 :]))
