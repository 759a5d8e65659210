"""Entry point: ``lamplight [--data-dir PATH] [--model PATH] [--smoke-test]``."""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app import __version__
from app.config.params import SamplingParams
from app.config.paths import DataDirs, data_dirs
from app.config.settings import AppSettings

if TYPE_CHECKING:
    from ui.hub_workers import HubServices

log = logging.getLogger("lamplight")

SMOKE_TIMEOUT_MS = 300_000


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="lamplight", description="Chat with local language models, llama.cpp in-process."
    )
    parser.add_argument(
        "--data-dir",
        metavar="PATH",
        help="keep all state (models, settings, logs) in PATH instead of the user data directory",
    )
    parser.add_argument("--model", metavar="PATH", help="open this GGUF model")
    parser.add_argument(
        "model_file",
        nargs="?",
        metavar="MODEL.gguf",
        help='the same as --model (for "Open with" from a file manager)',
    )
    parser.add_argument(
        "--smoke-test",
        action="store_true",
        help="load the model, generate a "
        "few tokens without showing a window, print the metrics as JSON, exit",
    )
    parser.add_argument("--version", action="version", version=f"Lamplight {__version__}")
    return parser.parse_args(argv)


def setup_logging(dirs: DataDirs) -> None:
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    handler = logging.handlers.RotatingFileHandler(
        dirs.logs / "lamplight.log", maxBytes=2_000_000, backupCount=3, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    console = logging.StreamHandler()
    console.setLevel(logging.ERROR)
    root.addHandler(console)


def resources_dir() -> Path:
    """``resources/``: beside the packages in a checkout, or in the frozen bundle."""
    base = getattr(sys, "_MEIPASS", None)
    return (
        Path(base) / "resources" if base else Path(__file__).resolve().parent.parent / "resources"
    )


def choose_model(args: argparse.Namespace, settings: AppSettings) -> tuple[str | None, str]:
    """The model to open (None: the embedded default) and a note when a saved one is gone."""
    if args.model:
        return str(Path(args.model).expanduser()), ""
    if settings.model_path:
        if Path(settings.model_path).is_file():
            return settings.model_path, ""
        return None, f"The last model ({settings.model_path}) is gone; using the default model."
    return None, ""


def hub_services(dirs: DataDirs) -> HubServices:
    """Hub search, the library and the download queue (which resumes unfinished downloads)."""
    from app.models.downloader import FileFetcher
    from app.models.downloads import DownloadQueue
    from app.models.hub import HubClient
    from app.models.library import Library
    from ui.hub_workers import HubServices

    library = Library(dirs.models, dirs.root / "library.json")
    queue = DownloadQueue(dirs.models, dirs.root / "downloads.json", FileFetcher())
    return HubServices(HubClient(), library, queue)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    dirs = data_dirs(args.data_dir)
    setup_logging(dirs)
    log.info("Lamplight %s starting, data dir %s", __version__, dirs.root)
    settings = AppSettings.load_from(dirs.settings_file)
    model, note = choose_model(args, settings)
    if args.smoke_test:
        return smoke_test(dirs, settings, model)

    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from app.chat.store import ConversationStore
    from ui.main_window import MainWindow
    from ui.worker import EngineClient

    app = QApplication(sys.argv[:1])
    app.setApplicationName("Lamplight")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName("lamplight")
    app.setWindowIcon(QIcon(str(resources_dir() / "icons" / "lamplight.svg")))
    style = resources_dir() / "style.qss"
    if style.is_file():
        app.setStyleSheet(style.read_text(encoding="utf-8"))
    store = ConversationStore(dirs.root, settings.snapshot_budget_mb * 1024 * 1024)
    store.drop_orphan_snapshots()  # caches of transcripts that were never written
    client = EngineClient(dirs.models, store=store)
    services = hub_services(dirs)
    window = MainWindow(client, settings, dirs, store, services)
    window.show()
    if settings.last_conversation and store.transcript_path(settings.last_conversation).exists():
        # The transcript shows at once; its cache is restored when the model is ready.
        window.open_conversation(settings.last_conversation, restore=False)
    if note:
        window.transcript.add_notice(note)
    window.load_model(model)
    code = app.exec()
    client.shutdown()
    return int(code)


def smoke_test(dirs: DataDirs, settings: AppSettings, model: str | None) -> int:
    """Load, generate a few tokens through the worker thread, print metrics as JSON."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QCoreApplication, QObject, QTimer, Slot

    from app.engine.backend import ModelInfo
    from app.engine.metrics import MessageMetrics
    from app.engine.templates import ChatMessage
    from ui.worker import DEFAULT_MODEL, EngineClient

    app = QCoreApplication(sys.argv[:1])
    client = EngineClient(dirs.models)

    class SmokeRun(QObject):
        """Receives the worker's signals on this (the main) thread."""

        def __init__(self) -> None:
            super().__init__()
            self.result: dict[str, object] = {}

        def fail(self, message: str) -> None:
            print(json.dumps({"ok": False, "error": message}), flush=True)
            app.exit(1)

        @Slot(object)
        def on_loaded(self, info: ModelInfo) -> None:
            self.result["model"] = {
                "name": info.name,
                "path": str(info.path),
                "template": info.template,
                "backend": info.backend,
                "load_ms": round(info.load_ms, 1),
            }
            client.generate("", [ChatMessage("user", "Say hello.")], SamplingParams.greedy(16))

        @Slot(str, bool)
        def on_load_failed(self, message: str, _still_loaded: bool) -> None:
            self.fail(message)

        @Slot(int, str, object)
        def on_finished(self, _req: int, text: str, metrics: MessageMetrics) -> None:
            self.result.update(ok=True, text=text, metrics=metrics.summary())
            print(json.dumps(self.result), flush=True)
            app.exit(0 if metrics.generated_tokens > 0 else 1)

        @Slot(int, str, object)
        def on_cancelled(self, _req: int, _text: str, _metrics: MessageMetrics) -> None:
            self.fail("generation was cancelled")

        @Slot(int, str)
        def on_failed(self, _req: int, message: str) -> None:
            self.fail(message)

        @Slot()
        def on_timeout(self) -> None:
            self.fail("timed out")

    run = SmokeRun()
    client.worker.modelLoaded.connect(run.on_loaded)
    client.worker.loadFailed.connect(run.on_load_failed)
    client.worker.finished.connect(run.on_finished)
    client.worker.cancelled.connect(run.on_cancelled)
    client.worker.failed.connect(run.on_failed)
    QTimer.singleShot(SMOKE_TIMEOUT_MS, run.on_timeout)
    client.load(DEFAULT_MODEL if model is None else model, settings.load)
    code = app.exec()
    client.shutdown()
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
