"""One ggml CPU thread pool shared by the contexts of one process (target and draft).

llama-cpp-python 0.3.36 does not bind ``ggml_threadpool_*`` or
``llama_attach_threadpool``; the shared libraries it ships export them, so they
are bound here with ctypes. ``struct ggml_threadpool_params`` follows the
``ggml.h`` shipped with the same wheel (``include/ggml.h``)::

    struct ggml_threadpool_params {
        bool cpumask[GGML_MAX_N_THREADS];   // 512
        int n_threads;
        enum ggml_sched_priority prio;
        uint32_t poll;                      // 0: no polling, 100: aggressive
        bool strict_cpu;
        bool paused;
    };

The layout is checked at run time: ``ggml_threadpool_params_default(n)`` must
come back with ``n_threads == n``, the documented defaults (normal priority,
poll 50, not strict, not paused) and an all-false CPU mask, and
``ggml_threadpool_params_match`` must agree with a copy. Anything else, or a
missing symbol, makes :func:`unavailable_reason` say why, and
:class:`SharedThreadPool` refuses to start; the caller then decodes with
llama.cpp's own per-call threads, as before.

What sharing buys depends on the build. This wheel is built with OpenMP
(``llama_print_system_info``: ``OPENMP = 1``): ggml then runs every graph in an
``omp parallel`` region on libgomp's threads, which belong to the *calling*
thread; the pool contributes its thread count, priority and CPU placement, and
its ``poll`` setting and pause/resume are not used. Two contexts driven from
one thread (the engine's worker: target and draft) therefore already share
libgomp's threads; what costs time is libgomp's spin-wait after each graph
(:func:`quiet_idle_threads`; measured in ``bench/threadpool.py``). Without
OpenMP the pool owns its worker threads, which poll for new work (``poll``)
before sleeping, and one pool for both models keeps the idle model's threads
from spinning beside the busy one's.

Lifetime: a context must be detached (or the pool closed, which detaches every
context attached through it) before the context is freed, and the pool must
outlive every context it is attached to. All calls belong on the thread that
owns the contexts.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GGML_MAX_N_THREADS = 512  # ggml.h
DEFAULT_POLL = 50  # ggml_threadpool_params_default's polling level
_SYMBOLS = {
    "ggml-base": ("ggml_threadpool_params_default", "ggml_threadpool_params_match"),
    "ggml-cpu": ("ggml_threadpool_new", "ggml_threadpool_free"),
    "llama": ("llama_attach_threadpool", "llama_detach_threadpool"),
}


class ThreadPoolParams(ctypes.Structure):
    """``struct ggml_threadpool_params`` (ggml.h)."""

    _fields_ = (
        ("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),  # enum ggml_sched_priority: -1 low .. 3 realtime
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    )


class ThreadPoolUnavailable(RuntimeError):
    """This llama.cpp build cannot share a thread pool; the message says why."""


@dataclass(frozen=True)
class _Api:
    params_default: Any
    params_match: Any
    new: Any
    free: Any
    attach: Any
    detach: Any
    openmp: bool


_api: _Api | str | None = None  # bound once: the functions, or why not


def _lib_dir() -> Path:
    from llama_cpp import llama_cpp as lib  # the directory it loaded libllama from

    return Path(lib._base_path)


def _library(directory: Path, stem: str) -> Path:
    """The copy of ``lib<stem>`` in ``directory`` that llama.cpp uses; for the CPU code,
    the variant module that was loaded (a backend-module build has no ``libggml-cpu``)."""
    if stem == "ggml-cpu":
        from app.engine.native.libs import BackendLoadError, load_backends

        try:
            state = load_backends()
        except BackendLoadError as exc:
            raise ThreadPoolUnavailable(str(exc)) from exc
        if state.cpu_library is not None:
            return state.cpu_library
    from app.engine.native.libs import shared_library

    return shared_library(stem, directory)


def _bind(lib_dir: Path | None = None, symbols: dict[str, tuple[str, ...]] | None = None) -> _Api:
    """Bind the thread-pool functions from llama-cpp-python's shared libraries.

    Raises:
        ThreadPoolUnavailable: a library or a symbol is missing, or the struct
            layout does not match this module's.
    """
    import llama_cpp

    directory = lib_dir or _lib_dir()
    wanted = symbols or _SYMBOLS
    found: dict[str, Any] = {}
    for stem, names in wanted.items():
        path = _library(directory, stem)
        try:
            lib = ctypes.CDLL(str(path))  # already loaded by llama_cpp: the same handle
        except OSError as exc:
            raise ThreadPoolUnavailable(f"{path.name} cannot be opened ({exc}).") from exc
        for name in names:
            try:
                found[name] = getattr(lib, name)
            except AttributeError as exc:
                raise ThreadPoolUnavailable(
                    f"This llama.cpp build does not export {name} (looked in {path.name})."
                ) from exc
    default = found["ggml_threadpool_params_default"]
    default.argtypes, default.restype = [ctypes.c_int], ThreadPoolParams
    match = found["ggml_threadpool_params_match"]
    match.argtypes = [ctypes.POINTER(ThreadPoolParams)] * 2
    match.restype = ctypes.c_bool
    new = found["ggml_threadpool_new"]
    new.argtypes, new.restype = [ctypes.POINTER(ThreadPoolParams)], ctypes.c_void_p
    free = found["ggml_threadpool_free"]
    free.argtypes, free.restype = [ctypes.c_void_p], None
    attach = found["llama_attach_threadpool"]
    attach.argtypes, attach.restype = [ctypes.c_void_p] * 3, None
    detach = found["llama_detach_threadpool"]
    detach.argtypes, detach.restype = [ctypes.c_void_p], None

    _check_layout(default, match)
    info = llama_cpp.llama_print_system_info()
    openmp = b"OPENMP = 1" in (info if isinstance(info, bytes) else b"")
    return _Api(default, match, new, free, attach, detach, openmp)


def _check_layout(default: Any, match: Any) -> None:
    """The defaults ggml documents, read back through our struct."""
    for n in (1, 3):
        p = default(n)
        fields = (p.n_threads, p.prio, p.poll, p.strict_cpu, p.paused, any(p.cpumask))
        if fields != (n, 0, DEFAULT_POLL, False, False, False):
            raise ThreadPoolUnavailable(
                "ggml_threadpool_params does not have the layout this Lamplight expects "
                f"(defaults for {n} threads read back as {fields})."
            )
        copy = ThreadPoolParams.from_buffer_copy(p)
        other = default(n + 1)
        if not match(ctypes.byref(p), ctypes.byref(copy)) or match(
            ctypes.byref(p), ctypes.byref(other)
        ):
            raise ThreadPoolUnavailable(
                "ggml_threadpool_params_match disagrees with this Lamplight's struct layout."
            )


def _functions() -> _Api:
    global _api
    if _api is None:
        try:
            _api = _bind()
        except ThreadPoolUnavailable as exc:
            _api = str(exc)
            log.info("no shared thread pool: %s", exc)
    if isinstance(_api, str):
        raise ThreadPoolUnavailable(_api)
    return _api


def unavailable_reason() -> str:
    """ "" when a thread pool can be shared here, else why not (one sentence)."""
    try:
        _functions()
    except ThreadPoolUnavailable as exc:
        return str(exc)
    return ""


def quiet_idle_threads(policy: str = "passive") -> str:
    """Ask OpenMP to put idle worker threads to sleep at once instead of spinning.

    libgomp reads ``OMP_WAIT_POLICY`` once, when llama.cpp's CPU library is loaded
    (``import llama_cpp``), so this must run before that; a value the user set is
    kept. A trade, measured on two cores with two threads (bench/threadpool.py):
    on idle cores spinning is faster (94 tok/s spinning, 47 passive: every graph
    node ends in a barrier, and a sleeping thread wakes slowly); while other
    processes compete for the cores, spinning threads burn the slices the busy
    ones need (1-20 tok/s spinning, 35-70 passive). Spinning workers burn ~8-10 ms
    of CPU after each decode before they sleep. Not called by default.

    Returns:
        "" when set (or already set), else why not.
    """
    import sys

    if "OMP_WAIT_POLICY" in os.environ:
        return ""
    if "llama_cpp" in sys.modules:
        return "llama_cpp is already imported; OpenMP has read its settings."
    os.environ["OMP_WAIT_POLICY"] = policy
    return ""


def uses_openmp() -> bool:
    """Whether ggml runs graphs on OpenMP's threads in this build (see the module doc)."""
    try:
        return _functions().openmp
    except ThreadPoolUnavailable:
        return False


class SharedThreadPool:
    """A ggml CPU thread pool that several llama.cpp contexts use in turn.

    Args:
        n_threads: worker threads (the contexts' ``n_threads``).
        poll: 0 (sleep at once when idle) to 100 (spin longest); ``None`` keeps
            ggml's default of 50. Only builds without OpenMP use it.

    Raises:
        ThreadPoolUnavailable: this build cannot (see :func:`unavailable_reason`).
        ValueError: ``n_threads`` or ``poll`` out of range.
    """

    def __init__(self, n_threads: int, *, poll: int | None = None) -> None:
        if not 1 <= n_threads <= GGML_MAX_N_THREADS:
            raise ValueError(f"n_threads must be 1 to {GGML_MAX_N_THREADS}, not {n_threads}")
        if poll is not None and not 0 <= poll <= 100:
            raise ValueError(f"poll must be 0 to 100, not {poll}")
        api = _functions()
        params = api.params_default(n_threads)
        if poll is not None:
            params.poll = poll
        handle = api.new(ctypes.byref(params))
        if not handle:
            raise ThreadPoolUnavailable(f"ggml could not start a pool of {n_threads} threads.")
        self._api = api
        self._handle: int | None = handle
        self._attached: dict[int, Any] = {}  # context address -> context pointer
        self.n_threads = n_threads
        self.poll = params.poll

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def attached(self) -> int:
        """How many contexts use the pool now."""
        return len(self._attached)

    def attach(self, ctx: Any) -> None:
        """Make the context ``ctx`` (a ``llama_context *``) compute on this pool, for
        single tokens and batches alike. Attaching twice is harmless."""
        if self._handle is None:
            raise RuntimeError("the thread pool is closed")
        address = _address(ctx)
        self._api.attach(address, self._handle, self._handle)
        self._attached[address] = ctx

    def detach(self, ctx: Any) -> None:
        """Give ``ctx`` back its own per-call threads; a context not attached is ignored."""
        address = _address(ctx)
        if self._attached.pop(address, None) is not None:
            self._api.detach(address)

    def close(self) -> None:
        """Detach every context still attached, then free the pool; twice is harmless."""
        if self._handle is None:
            return
        for address in list(self._attached):
            self._api.detach(address)
        self._attached.clear()
        handle, self._handle = self._handle, None
        self._api.free(handle)

    def __enter__(self) -> SharedThreadPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _address(ctx: Any) -> int:
    """The address of a ``llama_context *`` given as a ctypes pointer or an int."""
    if isinstance(ctx, int):
        address = ctx
    elif isinstance(ctx, ctypes.c_void_p):
        address = ctx.value or 0
    else:
        address = ctypes.cast(ctx, ctypes.c_void_p).value or 0
    if not address:
        raise ValueError("a null llama_context")
    return address
