"""Start-up shared by the window and ``lamplight serve``, Qt-free: the log and the model
to open."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
from pathlib import Path

from app.config.paths import DataDirs
from app.config.settings import AppSettings
from app.util.datafiles import os_reason
from app.util.redact import secure_logging


def setup_logging(dirs: DataDirs) -> str:
    """Log to ``logs/lamplight.log`` (and errors to the console); a note if the file cannot
    be. Every line is redacted (``app.util.redact``: no URL query, credential or key)."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler()
    console.setLevel(logging.ERROR)
    secure_logging(console)
    root.addHandler(console)
    try:
        handler = logging.handlers.RotatingFileHandler(
            dirs.logs / "lamplight.log", maxBytes=2_000_000, backupCount=3, encoding="utf-8"
        )
    except OSError as exc:
        return f"The log file cannot be written ({os_reason(exc)}); nothing is logged."
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    secure_logging(handler)
    root.addHandler(handler)
    return ""


def choose_model(args: argparse.Namespace, settings: AppSettings) -> tuple[str | None, str]:
    """The model to open (None: the embedded default) and a note when a saved one is gone."""
    if args.model:
        return str(Path(args.model).expanduser()), ""
    if settings.model_path:
        if _is_file(settings.model_path):
            return settings.model_path, ""
        return None, f"The last model ({settings.model_path}) is gone; using the default model."
    return None, ""


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # a name too long, a NUL in it
        return False
