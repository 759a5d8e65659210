"""Where Lamplight keeps its state: one data directory, overridable with --data-dir."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import platformdirs

from app.util.datafiles import ensure_directory

APP_NAME = "Lamplight"


@dataclass(frozen=True)
class DataDirs:
    """All on-disk locations, derived from one root."""

    root: Path

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def library_file(self) -> Path:
        """The model library's metadata cache (``app.models.library.Library``)."""
        return self.root / "library.json"

    @property
    def settings_file(self) -> Path:
        return self.root / "settings.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def create(self, notes: list[str] | None = None) -> DataDirs:
        """Make the folders. A file in place of ``models`` or ``logs`` is set aside as
        ``.bad`` (a line in ``notes`` says so); the root itself must be a folder.

        Raises:
            OSError: a folder cannot be made.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        for d in (self.models, self.logs):
            note = ensure_directory(d)
            if note and notes is not None:
                notes.append(note + ".")
        return self


def data_dirs(override: str | Path | None = None, notes: list[str] | None = None) -> DataDirs:
    """The data directories: ``override`` if given, else the platform's user data dir."""
    if override is not None:
        root = Path(override).expanduser().resolve()
    else:
        root = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    return DataDirs(root).create(notes)
