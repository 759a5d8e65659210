"""Screenshots of the first run and of the recommended models, for the README.

Run under Xvfb (real fonts and a window manager-less X server)::

    xvfb-run -a -s "-screen 0 1400x1000x24" .venv/bin/python docs/first_run_shots.py

It starts the real window on a fresh data dir, loads the embedded default model,
waits for the welcome card, and saves ``docs/first-run.png``; then opens the model
manager on its Recommended tab and saves ``docs/recommended.png``. No network is
used: the list is the bundled one, and nothing is downloaded.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    from PySide6.QtWidgets import QApplication

    from app.config.paths import data_dirs
    from app.config.settings import AppSettings
    from ui.engine.worker import EngineClient
    from ui.main import hub_services, open_window, resources_dir

    app = QApplication(sys.argv[:1])
    app.setApplicationName("Lamplight")
    app.setStyleSheet((resources_dir() / "style.qss").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="lamplight-shots-") as tmp:
        dirs = data_dirs(Path(tmp))
        settings = AppSettings()
        clients: list[EngineClient] = []

        def make_client(store: object) -> EngineClient:
            clients.append(EngineClient(dirs.models, store=store))  # type: ignore[arg-type]
            return clients[0]

        win = open_window(dirs, settings, [], make_client, hub_services(dirs))
        win.resize(1280, 820)
        win.start_engine(None)

        def wait(condition: object, seconds: float) -> None:
            end = time.monotonic() + seconds
            while not condition() and time.monotonic() < end:  # type: ignore[operator]
                app.processEvents()
                time.sleep(0.02)
            if not condition():  # type: ignore[operator]
                raise SystemExit("timed out")

        wait(lambda: win.onboarding.card is not None, 120)
        for _ in range(20):
            app.processEvents()
            time.sleep(0.02)
        win.grab().save(str(ROOT / "docs" / "first-run.png"))
        win.onboarding.show_recommended()
        manager = win.model_manager
        assert manager is not None
        manager.resize(1000, 700)
        for _ in range(20):
            app.processEvents()
            time.sleep(0.02)
        manager.grab().save(str(ROOT / "docs" / "recommended.png"))
        win.close()
        clients[0].shutdown()
    print("saved docs/first-run.png and docs/recommended.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
