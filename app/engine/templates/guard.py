"""The limits a chat template runs within: a deadline, an output size and a call depth.

``run_bounded`` runs a compile or a render on a fresh thread whose tracer
(``Guard``) ends it at its deadline or past the call depth; the sandbox
(``template_sandbox``) checks sizes against ``current_guard().limit``. A broken
limit is raised as ``Aborted``, a ``BaseException``, so no ``except Exception`` in
Jinja's own code can swallow it; the caller gets ``ChatTemplateError`` with a
one-line reason (``describe``).
"""

from __future__ import annotations

import ctypes
import inspect
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import jinja2
from jinja2 import TemplateSyntaxError

from app.engine.template_errors import ChatTemplateError, TemplateLimitError

T = TypeVar("T")

GRACE_S = 1.0  # how much longer the caller waits before abandoning the thread
MAX_CALL_DEPTH = 64  # nested template calls: macros, blocks, recursive loops
MAX_REASON_CHARS = 200
STACK_BYTES = 16 * 1024 * 1024
TEMPLATE_FILE = "<template>"  # the file name of Jinja's compiled code


# -- the limits, enforced on the render's thread --------------------------------------


class Aborted(BaseException):
    """Ends a render from inside; Jinja's ``except Exception`` clauses let it through."""

    def __init__(self, reason: str = "ran past its time limit") -> None:
        super().__init__(reason)
        self.reason = reason


class Raised(Exception):
    """The template called ``raise_exception``."""


class Rejected(Exception):
    """A caller's check refused what the template rendered; the message is the reason."""


class Guard:
    """A render's deadline, size limit and call depth, checked by its tracer."""

    __slots__ = ("budget_s", "deadline", "depth", "limit", "lines")

    def __init__(self, budget_s: float, limit: int) -> None:
        self.budget_s = budget_s
        self.deadline = time.monotonic() + budget_s
        self.limit = limit
        self.depth = 0
        self.lines = 0

    def expire(self) -> NoReturn:
        raise Aborted(f"ran longer than {self.budget_s:g} s")

    def on_call(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        """The global tracer: every new Python frame (and generator resume).

        The deadline raises only in the template's code, Jinja's and this
        module's, and not when a generator resumes: the garbage collector runs
        weakref callbacks, ``__del__`` and generator finalizers inside the render,
        and they would swallow the exception (Python then drops the tracer too).
        The template's own lines, and any function call, still see the deadline.
        """
        code = frame.f_code
        late = not code.co_flags & _RESUMABLE and time.monotonic() > self.deadline
        if code.co_filename != TEMPLATE_FILE:
            if late and code.co_filename.startswith(RENDER_CODE):
                self.expire()
            return None  # no line events in library code: its calls are enough
        if late:
            self.expire()
        self.depth += 1
        if self.depth > MAX_CALL_DEPTH:
            raise Aborted(f"nests macros or blocks more than {MAX_CALL_DEPTH} deep")
        return self.on_line

    def on_line(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        """The tracer of a template frame: its lines (loops) and its return."""
        if event == "line":
            self.lines += 1
            if not self.lines & 63 and time.monotonic() > self.deadline:
                self.expire()
        elif event == "return":
            self.depth -= 1
        return self.on_line


# Frames that a generator finalizer may resume.
_RESUMABLE = (
    inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)
# Where a render's own Python code lives: Jinja, this module and the sandbox's checks.
RENDER_CODE = (str(Path(jinja2.__file__).parent), __file__)
_STATE = threading.local()
_STACK_LOCK = threading.Lock()


def current_guard() -> Guard:
    guard: Guard | None = getattr(_STATE, "guard", None)
    if guard is None:  # a render outside run_bounded: refuse rather than run unlimited
        raise Aborted("was rendered without limits")
    return guard


def run_bounded(fn: Callable[[], T], budget_s: float, limit: int) -> T:
    """Run ``fn`` (a compile or a render) on a fresh thread, within the limits.

    Raises:
        ChatTemplateError: ``fn`` raised anything, broke a limit, or ran past
            ``budget_s`` plus a grace period (its thread is then abandoned).
    """
    box: list[tuple[bool, Any]] = []

    def target() -> None:
        guard = Guard(budget_s, limit)
        _STATE.guard = guard
        sys.settrace(guard.on_call)
        try:
            box.append((True, fn()))
        except BaseException as exc:  # every failure is reported to the caller
            box.append((False, exc))
        finally:
            sys.settrace(None)
            _STATE.guard = None

    try:
        thread = _start(target)
    except (RuntimeError, MemoryError) as exc:  # no thread to be had: the system's limit
        raise ChatTemplateError(f"could not be run: {describe(exc)}") from None
    thread.join(budget_s + GRACE_S)
    if not box:
        _interrupt(thread)
        raise TemplateLimitError(f"ran longer than {budget_s:g} s")
    ok, value = box[0]
    if ok:
        return value  # type: ignore[no-any-return]
    # Python's own compiler limits (blocks nested too deep) count as limits too.
    is_syntax = isinstance(value, SyntaxError) and not isinstance(value, TemplateSyntaxError)
    if isinstance(value, (Aborted, RecursionError, MemoryError)) or is_syntax:
        raise TemplateLimitError(describe(value)) from None
    raise ChatTemplateError(describe(value)) from None


INTERRUPT_TRIES = 50
INTERRUPT_PAUSE_S = 0.02


def _interrupt(thread: threading.Thread) -> None:
    """The backstop for a render that outlived its tracer: raise in its thread.

    Python raises the exception at the thread's next bytecode, so a loop in
    Python ends; one long call in C still runs to its end (the size checks keep
    those short), and the thread is abandoned meanwhile.
    """
    if thread.ident is None or not thread.is_alive():
        return
    ident = ctypes.c_ulong(thread.ident)
    # Raised again until the thread ends: an exception that lands in a garbage
    # collector callback is printed and dropped, and the loop would go on.
    for _ in range(INTERRUPT_TRIES):
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, ctypes.py_object(Aborted))
        thread.join(INTERRUPT_PAUSE_S)
        if not thread.is_alive():
            return


def _start(target: Callable[[], None]) -> threading.Thread:
    """A daemon thread with a stack deep enough for the nesting the limits allow."""
    thread = threading.Thread(target=target, name="lamplight-template", daemon=True)
    with _STACK_LOCK:
        try:
            old = threading.stack_size(STACK_BYTES)
        except (ValueError, RuntimeError):  # the platform keeps its default
            thread.start()
            return thread
        try:
            thread.start()
        finally:
            threading.stack_size(old)
    return thread


def describe(exc: BaseException) -> str:
    """One short line saying why a template failed."""
    if isinstance(exc, Aborted):
        text = exc.reason
    elif isinstance(exc, RecursionError):
        text = "recurses too deeply"
    elif isinstance(exc, MemoryError):
        text = "ran out of memory"
    elif isinstance(exc, TemplateSyntaxError):
        text = f"does not compile: {exc.message} (line {exc.lineno})"
    elif isinstance(exc, SyntaxError):  # Python refused Jinja's code: nested too deep
        text = f"does not compile: {exc.msg}"
    elif isinstance(exc, Raised):
        text = f"raised an error: {_safe_str(exc)}"
    elif isinstance(exc, Rejected):
        text = _safe_str(exc)
    else:
        text = f"failed with {type(exc).__name__}: {_safe_str(exc)}"
    text = " ".join(text.split())
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 1] + "…"
    return text


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)[: MAX_REASON_CHARS * 2]
    except Exception:  # an exception whose message cannot be made
        return type(exc).__name__
