"""How the model in a GGUF file remembers the conversation, without loading its weights.

A llama-server does not report its model's architecture, only the file's path
(``/props`` ``model_path``). When that file is here (a server on this machine),
:func:`file_memory_kind` asks llama.cpp what ``Native.memory_kind`` asks of a
loaded model, from the file's metadata. The file passes the loader's own header
checks first (``read_gguf_info``): one llama.cpp would crash on is refused before
llama.cpp sees it.

``vocab_only`` is not enough: llama.cpp then stops reading the hyperparameters
before the sliding window (``llama_model_n_swa`` is 0 for Gemma 3). The load is
``no_alloc`` instead (as llama.cpp's ``common/fit.cpp`` measures a model: metadata
and tensor shapes, no weights read), on no device, so no GPU is touched.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

from app.engine.native.handles import ATTENTION, HYBRID, RECURRENT, SLIDING_WINDOW
from app.gguf.info import read_gguf_info
from app.util.errors import ModelFileError

log = logging.getLogger(__name__)


def file_memory_kind(path: str | Path) -> str:
    """``RECURRENT``, ``HYBRID``, ``SLIDING_WINDOW`` or ``ATTENTION`` for the model file
    at ``path``; "" when it is missing, unreadable, not a sane GGUF model or refused
    by llama.cpp. Never raises."""
    try:
        read_gguf_info(path)
    except ModelFileError as exc:
        log.info("memory kind not read: %s", exc)
        return ""
    except Exception:  # the checks are total; a miss must still not end a connect
        log.exception("memory kind not read: the header check failed")
        return ""
    try:
        return _metadata_kind(Path(path))
    except Exception:  # a binding change, or a backend module that will not load
        log.exception("memory kind not read: llama.cpp failed")
        return ""


def _metadata_kind(path: str | Path) -> str:
    from app.engine.native.libs import load_backends

    load_backends()  # the CPU module llama.cpp builds the tensor table on
    import llama_cpp as lc

    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    no_devices = (ctypes.c_void_p * 1)()  # an empty NULL-terminated list: the CPU only
    params.devices = ctypes.addressof(no_devices)
    params.n_gpu_layers = 0
    params.no_alloc = True  # metadata and tensor shapes; no weights read or allocated
    params.load_mode = lc.LLAMA_LOAD_MODE_NONE  # llama.cpp asserts no mmap with no_alloc
    params.use_extra_bufts = False
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        log.info("memory kind not read: llama.cpp could not read %s", Path(path).name)
        return ""
    try:
        # As Native.memory_kind, on a model with no context.
        if lc.llama_model_is_recurrent(model):
            return RECURRENT
        if lc.llama_model_is_hybrid(model):
            return HYBRID
        return SLIDING_WINDOW if int(lc.llama_model_n_swa(model)) > 0 else ATTENTION
    finally:
        lc.llama_model_free(model)
