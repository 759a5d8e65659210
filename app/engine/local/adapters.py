"""LoRA adapters llama.cpp has loaded for one model, and the stack applied to its context."""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.native.handles import Native
from app.engine.native.llama_log import RECENT_PROBLEMS
from app.gguf.lora import (
    AdapterInfo,
    LoraError,
    LoraStack,
    ModelTensors,
    check_adapter,
    read_adapter,
    read_model_tensors,
)

MAX_IDLE_ADAPTERS = 4  # adapters kept loaded while out of the stack, for a quick re-add


@dataclass
class _LoadedAdapter:
    """An adapter llama.cpp has loaded for the current model."""

    handle: Any  # llama_adapter_lora * (a ctypes pointer)
    stamp: tuple[int, int]  # (size, mtime_ns) of the file when it was loaded
    info: AdapterInfo
    used: int  # when it was last in an applied stack, for freeing the idle ones


class AdapterSet:
    """The adapter handles for the model at ``model_path``, by resolved path, and the applied stack.

    llama.cpp frees every adapter with its model (``llama_model::~llama_model``), so
    the owner drops this object, never frees its handles, when the model goes.
    """

    def __init__(self, model_path: Path | None = None) -> None:
        self._model_path = model_path
        self._loaded: dict[str, _LoadedAdapter] = {}
        self._retired: list[Any] = []  # old versions of changed files, freed after the next set
        self._clock = itertools.count()
        self._tensors: ModelTensors | None = None
        self.stack = LoraStack()  # the applied stack, and its ``LoraStack.signature()``
        self.signature: list[dict[str, Any]] = []

    def __len__(self) -> int:
        """How many adapters llama.cpp holds for this model (applied or idle)."""
        return len(self._loaded)

    def check(self, path: str | Path) -> AdapterInfo:
        """Read ``path`` and check it against the model, without loading it.

        Raises:
            LoraError.
        """
        return check_adapter(read_adapter(path), self._model_tensors())

    def apply(self, llm: Any, stack: LoraStack) -> None:
        """Make ``stack`` the set of adapters applied to ``llm``'s context.

        Adapters loaded earlier for this model are reused (by path, size and mtime);
        a new one is checked against the model's tensors before llama.cpp sees it.
        ``llama_set_adapters_lora`` then replaces the whole set; disabled and scale-0
        entries are left out. On any error nothing changes.

        Raises:
            LoraError.
        """
        import llama_cpp

        stack = stack.copy()
        handles: dict[str, Any] = {}
        scales: dict[str, float] = {}
        for entry in stack.active():
            key = str(Path(entry.path).expanduser().resolve())
            handles[key] = self._adapter(llm, key, entry.path)
            # The same file twice: llama.cpp's map would keep one scale; the stack means the sum.
            scales[key] = scales.get(key, 0.0) + entry.scale
        try:
            signature = stack.signature()
        except OSError as exc:
            raise LoraError(f"A LoRA adapter could not be read: {exc}") from exc
        applied = [k for k, v in scales.items() if v != 0.0]
        n = len(applied)
        c_handles = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*(handles[k] for k in applied))
        c_scales = (ctypes.c_float * n)(*(scales[k] for k in applied))
        llama_cpp.llama_set_adapters_lora(Native(llm).ctx, c_handles, n, c_scales)
        self.stack, self.signature = stack, signature
        tick = next(self._clock)
        for key in applied:
            self._loaded[key].used = tick
        self._free_idle(set(applied))

    def _model_tensors(self) -> ModelTensors:
        if self._tensors is None:
            assert self._model_path is not None
            self._tensors = read_model_tensors(self._model_path)
        return self._tensors

    def _adapter(self, llm: Any, key: str, path: Path) -> Any:
        """llama.cpp's handle for the adapter at ``key``, loaded when new or changed on disk."""
        import llama_cpp

        try:
            st = Path(key).stat()
        except OSError as exc:
            raise LoraError(f"The LoRA adapter {Path(path).name} is missing ({path}).") from exc
        stamp = (st.st_size, st.st_mtime_ns)
        known = self._loaded.get(key)
        if known is not None and known.stamp == stamp:
            return known.handle
        # Refused here, never by llama.cpp: it reports failure only as a NULL pointer and a
        # log line, and some bad headers abort the process inside it.
        info = check_adapter(read_adapter(key), self._model_tensors())
        RECENT_PROBLEMS.clear()
        handle = llama_cpp.llama_adapter_lora_init(Native(llm).model, key.encode("utf-8"))
        if not handle:  # a NULL ctypes pointer is falsy (llama-cpp-python does not check)
            detail = "; ".join(RECENT_PROBLEMS)
            raise LoraError(f"llama.cpp could not load {info.path.name}: {detail or 'see the log'}")
        if known is not None:
            # The file changed: the old version may still be in the context's set.
            self._retired.append(known.handle)
        self._loaded[key] = _LoadedAdapter(handle, stamp, info, next(self._clock))
        return handle

    def _free_idle(self, applied: set[str]) -> None:
        """Free retired adapters and the least recently used idle ones beyond the limit.

        Only called right after ``llama_set_adapters_lora``: an adapter the context no
        longer references can then be freed safely.
        """
        import llama_cpp

        for handle in self._retired:
            llama_cpp.llama_adapter_lora_free(handle)
        self._retired.clear()
        idle = sorted((a.used, k) for k, a in self._loaded.items() if k not in applied)
        for _, key in idle[: max(0, len(idle) - MAX_IDLE_ADAPTERS)]:
            llama_cpp.llama_adapter_lora_free(self._loaded.pop(key).handle)
