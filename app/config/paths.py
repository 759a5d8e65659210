"""Where Lamplight keeps its state: one data directory, overridable with --data-dir."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "Lamplight"


@dataclass(frozen=True)
class DataDirs:
    """All on-disk locations, derived from one root."""

    root: Path

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def settings_file(self) -> Path:
        return self.root / "settings.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def create(self) -> DataDirs:
        for d in (self.root, self.models, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        return self


def data_dirs(override: str | Path | None = None) -> DataDirs:
    """The data directories: ``override`` if given, else the platform's user data dir."""
    if override is not None:
        root = Path(override).expanduser().resolve()
    else:
        root = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    return DataDirs(root).create()
