"""Entry point: ``lamplight [--data-dir PATH] [--model PATH] [--smoke-test]``, and
``lamplight serve [...]`` for the API server without a window (``ui/api/serve.py``)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app import __version__
from app.config.paths import DataDirs, data_dirs
from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from app.util import crash_record, desktop_libs
from ui.startup import choose_model, setup_logging

if TYPE_CHECKING:
    from app.chat.store import ConversationStore
    from app.util.instance_lock import InstanceLock
    from ui.engine.worker import EngineClient
    from ui.models.hub_workers import HubServices
    from ui.window.main_window import MainWindow

log = logging.getLogger("lamplight")

SMOKE_TIMEOUT_MS = 300_000
MAX_NOTES = 10  # startup notes shown in the window; the log has them all


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="lamplight",
        description="Chat with local language models, llama.cpp in-process. "
        "'lamplight serve --help': the OpenAI-compatible API without a window.",
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
    args = parser.parse_args(argv)
    if args.model is None:
        args.model = args.model_file
    return args


def resources_dir() -> Path:
    """``resources/``: beside the packages in a checkout, or in the frozen bundle."""
    base = getattr(sys, "_MEIPASS", None)
    return (
        Path(base) / "resources" if base else Path(__file__).resolve().parent.parent / "resources"
    )


def show_startup_notes(window: MainWindow, notes: Sequence[str]) -> None:
    """What was wrong with the saved files (set aside, repaired), once the window is up:
    each line as a notice in the transcript, and a line in the status bar."""
    if not notes:
        return
    for note in notes[:MAX_NOTES]:
        window.transcript.add_notice(note)
    if len(notes) > MAX_NOTES:
        window.transcript.add_notice(f"… and {len(notes) - MAX_NOTES} more (see the log).")
    window.statusBar().showMessage(
        "Some saved files were damaged and have been set aside or repaired: see the notes.",
        15000,
    )


def hub_services(dirs: DataDirs) -> HubServices:
    """Hub search, the library and the download queue (which resumes unfinished downloads)."""
    from app.models.default_embedder import embedders_dir
    from app.models.downloader import FileFetcher
    from app.models.downloads import DownloadQueue
    from app.models.hub import HubClient
    from app.models.library import Library
    from ui.models.hub_workers import EMBEDDERS, HubServices

    library = Library(dirs.models, dirs.library_file)
    # Embedding models download beside the built-in one, never among the chat models.
    folders = {EMBEDDERS: embedders_dir(dirs.root)}
    queue = DownloadQueue(dirs.models, dirs.root / "downloads.json", FileFetcher(), folders)
    return HubServices(HubClient(), library, queue, dirs.root)


def _sub_command(argv: Sequence[str]) -> int | None:
    """Run ``argv``'s sub-command (``lamplight serve``, or one of the bounded child
    processes the frozen app starts itself); None for the app itself. The imports stay
    written out, so PyInstaller sees them."""
    command = argv[0] if argv else ""
    if command == "serve":
        from ui.api.serve import main as serve

        return serve(argv[1:])
    if command == "probe-native-path":  # the native-path check child
        from app.engine.native.path_probe import main as probe

        return probe(argv[1:])
    if command == "probe-projector":  # the projector check child
        from app.engine.native.projector_probe import main as probe_projector

        return probe_projector(argv[1:])
    if command == "chat-format-worker":  # llama.cpp's template child
        from app.engine.native.chat_worker import main as chat_format_worker

        return chat_format_worker(argv[1:])
    if command == "parse-document":  # the bounded document reader
        from app.documents.parse_child import main as parse_document

        return parse_document(argv[1:])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    code = _sub_command(argv)
    if code is not None:
        return code
    args = parse_args(argv)
    # Qt aborts (exit 134, no word why) when its platform plugin cannot load: say why first.
    if not args.smoke_test and (problem := desktop_libs.window_problem()) is not None:
        print(f"lamplight: {problem.message}", file=sys.stderr, flush=True)
        return desktop_libs.EXIT_NO_WINDOW
    notes: list[str] = []  # damaged files set aside or repaired, for the user
    dirs = data_dirs(args.data_dir, notes)
    lock = claim_data_dir(dirs, args)  # before anything reads or writes the folder
    if isinstance(lock, int):
        return lock  # another instance has it (and maybe took the request)
    notes += filter(None, [setup_logging(dirs), lock.note])
    log.info("Lamplight %s starting, data dir %s", __version__, dirs.root)
    for line in notes:
        log.warning("%s", line)
    settings, settings_notes = AppSettings.load_with_notes(dirs.settings_file)
    notes += settings_notes
    model, note = choose_model(args, settings)
    # After the lock: the marker a previous process left is this folder's, not a live one's.
    crash, crashed = crash_record.begin(dirs.logs, __version__)
    if args.smoke_test:
        with lock:
            if crashed is not None:
                print(f"lamplight: {crashed.console()}", file=sys.stderr)
            code = smoke_test(dirs, settings, model)
            crash_record.end(crash)
            return code

    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from ui.engine.worker import EngineClient
    from ui.window import crash_notice, single_instance

    app = QApplication(sys.argv[:1])
    app.setApplicationName("Lamplight")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName("lamplight")
    app.setWindowIcon(QIcon(str(resources_dir() / "icons" / "lamplight.svg")))
    style = resources_dir() / "style.qss"
    if style.is_file():
        app.setStyleSheet(style.read_text(encoding="utf-8"))
    clients: list[EngineClient] = []

    def make_client(store: ConversationStore) -> EngineClient:
        clients.append(EngineClient(dirs.models, store=store, pool_mb=settings.api.pool_mb))
        return clients[0]

    window = open_window(dirs, settings, notes, make_client, hub_services(dirs), note)
    later_launches = single_instance.InstanceServer(single_instance.server_name(dirs.root))
    single_instance.install(window, later_launches)
    later_launches.listen()
    # The previous process's crash, if any, then the model (held after a crash while loading).
    crash_notice.install(window, crashed, dirs, lambda: window.start_engine(model))
    code = app.exec()
    later_launches.close()
    clients[0].shutdown()
    crash_record.end(crash)  # a clean exit: no crash to report next time
    lock.release()
    return int(code)


def claim_data_dir(dirs: DataDirs, args: argparse.Namespace) -> InstanceLock | int:
    """The data folder's lock for this process; or, when another process holds it, the
    exit code after handing the window there this launch's model (``ui/single_instance``)."""
    from app.util.instance_lock import AlreadyRunning, acquire
    from ui.window import single_instance

    if not args.smoke_test:
        model = Path(os.path.abspath(Path(args.model).expanduser())) if args.model else None
        return single_instance.claim(dirs.root, model)
    try:
        return acquire(dirs.root, "smoke-test")
    except AlreadyRunning as exc:
        message = single_instance.held_message(exc, "smoke-test")
        print(json.dumps({"ok": False, "error": message}), flush=True)
        return single_instance.EXIT_HELD


def open_window(
    dirs: DataDirs,
    settings: AppSettings,
    notes: list[str],
    make_client: Callable[[ConversationStore], EngineClient],
    services: HubServices | None = None,
    model_note: str = "",
) -> MainWindow:
    """The main window on ``dirs``, shown, with the last conversation open and ``notes``
    (plus what the presets and conversations had wrong) shown; no model is loaded yet."""
    from app.chat.conversation import is_valid_id
    from app.chat.store import ConversationStore
    from ui.window.main_window import MainWindow

    store = ConversationStore(dirs.root, settings.snapshot_budget_mb * 1024 * 1024)
    store.drop_orphan_snapshots()  # caches of transcripts that were never written
    window = MainWindow(make_client(store), settings, dirs, store, services)  # lists them
    window.show()
    last = settings.last_conversation
    if last and is_valid_id(last) and store.transcript_path(last).exists():
        # The transcript shows at once; its cache is restored when the model is ready.
        window.open_conversation(last, restore=False)
    if model_note:
        window.transcript.add_notice(model_note)
    # What the saved download list had wrong (two entries for one file, say).
    downloads = [f"downloads.json: {n}" for n in services.queue.notes] if services else []
    more = [*window.presets.notes, *store.take_notes(), *downloads]
    for line in more:
        log.warning("%s", line)
    show_startup_notes(window, [*notes, *more])
    return window


def desktop_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as the window would see it: a headless platform (the tests' offscreen) is
    left out, so the window's own is checked."""
    platform = env.get("QT_QPA_PLATFORM", "")
    desktop = any(p in platform for p in ("xcb", "wayland"))
    return {k: v for k, v in env.items() if k != "QT_QPA_PLATFORM" or desktop}


def smoke_test(dirs: DataDirs, settings: AppSettings, model: str | None) -> int:
    """Load, generate a few tokens through the worker thread, print metrics as JSON (and
    whether a window could open here: ``window``)."""
    window = desktop_libs.summary(desktop_libs.window_problem(desktop_env(os.environ)))
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QCoreApplication, QObject, QTimer, Slot

    from app.engine.backend import ModelInfo
    from app.engine.chat_message import ChatMessage
    from app.engine.metrics import MessageMetrics
    from app.host.core import DEFAULT_MODEL
    from ui.engine.worker import EngineClient

    app = QCoreApplication(sys.argv[:1])
    client = EngineClient(dirs.models)

    class SmokeRun(QObject):
        """Receives the worker's signals on this (the main) thread."""

        def __init__(self) -> None:
            super().__init__()
            self.result: dict[str, object] = {"window": window}

        def fail(self, message: str) -> None:
            print(json.dumps({"ok": False, "error": message}), flush=True)
            app.exit(1)

        @Slot(object)
        def on_loaded(self, info: ModelInfo) -> None:
            from app.engine.native.libs import loaded

            backends = loaded()
            self.result["cpu_variant"] = backends.cpu_variant if backends else ""
            from app.engine.chat_format.native import self_check

            self.result["chat_format"] = self_check()
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
