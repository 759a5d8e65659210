"""Opening a GGUF file as a ``llama_cpp.Llama``, with a load-progress hook that can cancel.

``Llama`` compiles every chat template in the file's metadata with an unbounded Jinja
as it loads (``tokenizer.chat_template`` and its named variants): a template nested
too deep fails the load with Python's ``SyntaxError`` ("too many statically nested
blocks"), a deep literal with ``RecursionError``, a huge one runs for long. Lamplight
never uses those chat handlers (``templates.py`` runs the template in its sandbox, and
falls back when it fails), so the load skips them (``_NoChatFormatter``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import Any

from app.config.field_spec import SettingError
from app.config.params import validate_load
from app.config.setting_records import LoadConfig
from app.engine.backend import LoadCancelled, ProgressFn
from app.gguf.info import GgufInfo
from app.util.errors import ModelLoadError

log = logging.getLogger(__name__)
_SWAP = threading.RLock()  # held while llama-cpp-python's load-time functions are swapped

KV_TYPES = {"f16": 1, "q8_0": 8}  # ggml_type ids: GGML_TYPE_F16, GGML_TYPE_Q8_0


def open_llama(
    gguf: GgufInfo, config: LoadConfig, progress: ProgressFn | None, extra_bufts: bool = True
) -> Any:
    """A ``llama_cpp.Llama`` for ``gguf`` with ``config`` (``config.n_gpu_layers`` resolved).

    ``extra_bufts`` False loads without llama.cpp's extra buffer types (the repacked
    weights, AMX among them): ``app/engine/native/guard.py`` decides, per machine.

    ``gguf`` comes from ``read_gguf_info``, which refused the header values that make
    llama.cpp abort the process; the settings are checked here against their one
    declaration (a negative batch segfaults llama.cpp, 100000 threads abort it).

    Raises:
        ModelLoadError: llama.cpp refused the file, or a setting is out of range.
        LoadCancelled: ``progress`` returned False.
    """
    try:
        # The projector is a file, checked by app.gguf.projector, not a setting.
        validate_load({k: v for k, v in dataclasses.asdict(config).items() if k != "mmproj"})
    except SettingError as exc:
        raise ModelLoadError(f"{gguf.path.name} was not loaded: {exc}") from exc
    import llama_cpp

    cancelled = [False]

    def on_progress(value: float) -> bool:
        keep_going = progress(value) if progress else True
        cancelled[0] = not keep_going
        return keep_going

    try:
        # Next-token (MTP) blocks are loaded where the file carries them (they draft).
        with load_progress(on_progress, extra_bufts, load_mtp=gguf.mtp_layers > 0):
            return llama_cpp.Llama(
                model_path=str(gguf.path),
                n_ctx=config.n_ctx,
                n_batch=config.n_batch,
                n_ubatch=config.n_batch,
                n_threads=config.threads(),
                n_threads_batch=config.threads(),
                n_gpu_layers=config.n_gpu_layers,
                # Full-size SWA cache: rewinding a sliding-window model's KV
                # (regenerate, edit, prefix reuse) needs positions outside the window.
                swa_full=True,
                # A quantized V cache needs flash attention in llama.cpp.
                flash_attn=config.flash_attn or config.kv_type != "f16",
                type_k=KV_TYPES[config.kv_type],
                type_v=KV_TYPES[config.kv_type],
                verbose=False,
            )
    except MemoryError as exc:  # llama-cpp-python sizes buffers from the header
        raise ModelLoadError(f"There is not enough memory to load {gguf.path.name}.") from exc
    except Exception as exc:  # whatever llama-cpp-python's Python side raises on a bad file
        if cancelled[0]:
            raise LoadCancelled(f"Loading {gguf.path.name} was cancelled.") from exc
        raise ModelLoadError(
            f"llama.cpp could not load {gguf.path.name}: {exc}. The file may be damaged "
            "or use an architecture this llama.cpp build does not support."
        ) from exc


class _NoChatFormatter:
    """Stands in for llama-cpp-python's ``Jinja2ChatFormatter`` while a model loads: the
    file's templates are not compiled there (see the module's docstring)."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def to_chat_handler(self) -> Any:
        return _no_chat_handler


def _no_chat_handler(*_args: Any, **_kwargs: Any) -> Any:
    raise ModelLoadError(
        "Lamplight renders chat templates itself (app/engine/templates/chat_template.py)."
    )


@contextlib.contextmanager
def load_progress(
    progress: ProgressFn | None, extra_bufts: bool = True, load_mtp: bool = False
) -> Iterator[None]:
    """Give llama.cpp's model loader a progress callback (and ``use_extra_bufts``,
    ``load_mtp``), and keep ``Llama`` from compiling the file's chat templates.

    ``Llama`` exposes neither option, but builds its params through
    ``llama_model_default_params`` and its chat handlers through
    ``llama_chat_format.Jinja2ChatFormatter`` at load time; we hand it params that carry
    our callback, and a formatter that compiles nothing. The chat engine and the
    embedding model load on threads of their own, so one load swaps at a time
    (``_SWAP``): overlapping swaps could restore each other's patched functions.
    """
    import llama_cpp.llama_chat_format as chat_format
    import llama_cpp.llama_cpp as lc

    with _SWAP:
        formatter = chat_format.Jinja2ChatFormatter
        chat_format.Jinja2ChatFormatter = _NoChatFormatter
        try:
            with _progress_params(lc, progress, extra_bufts, load_mtp):
                yield
        finally:
            chat_format.Jinja2ChatFormatter = formatter


@contextlib.contextmanager
def _progress_params(
    lc: Any, progress: ProgressFn | None, extra_bufts: bool, load_mtp: bool
) -> Iterator[None]:
    if progress is None and extra_bufts and not load_mtp:
        yield
        return

    original = lc.llama_model_default_params

    def on_progress(value: float, _user: Any) -> bool:
        try:
            return bool(progress(float(value))) if progress is not None else True
        except Exception:  # an exception must not unwind through C
            log.exception("load progress callback failed")
            return True

    c_callback = lc.llama_progress_callback(on_progress)

    def params_with_progress() -> Any:
        params = original()
        if progress is not None:
            params.progress_callback = c_callback
        params.use_extra_bufts = extra_bufts
        params.load_mtp = load_mtp
        return params

    lc.llama_model_default_params = params_with_progress
    try:
        yield
    finally:
        lc.llama_model_default_params = original
