"""The app's main window with the default model loaded, for the benches that time it.

The benches compare the app with llama.cpp on the same chat prompt, so the window
keeps the default model in chat turns: left alone it would open that base model in
continue-the-text mode (``ui.chat.prompt_controls``), whose prompt has no turn markers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.chat.store import ConversationStore
from app.config.model_prefs import FILE_NAME, ModelPrefs, ModelPrefsStore, model_key
from app.config.paths import data_dirs
from app.config.setting_records import LoadConfig, SamplingParams
from app.config.settings import AppSettings
from app.engine.local.engine import Engine


def open_app_window(
    data: Path | str,
    model: Path,
    load: LoadConfig,
    sampling: SamplingParams,
    engine_factory: Callable[[], Any] = Engine,
    store: bool = False,
) -> Any:
    """A shown ``MainWindow`` on a data dir at ``data`` with ``model`` loaded (waits for it).

    ``store``: save conversations (a ``ConversationStore`` in the data dir). Needs a
    ``QApplication``.
    """
    from PySide6.QtCore import QEventLoop

    from ui.engine.worker import EngineClient
    from ui.window.main_window import MainWindow

    dirs = data_dirs(data)
    ModelPrefsStore(dirs.root / FILE_NAME).set(
        model_key(model, model.stat().st_size), ModelPrefs(completion=False)
    )
    conversations = ConversationStore(dirs.root) if store else None
    client = EngineClient(dirs.models, engine_factory, conversations)
    window = MainWindow(client, AppSettings(load=load, sampling=sampling), dirs, conversations)
    window.show()
    loop = QEventLoop()
    window.modelReady.connect(loop.quit)
    window.load_model(model)
    loop.exec()
    return window
