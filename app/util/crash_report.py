"""What a process that closed unexpectedly was doing, and the fault faulthandler recorded."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.util.redact import redact_text

# What the engine thread can be doing. "start" and "idle" are no step of the engine.
STEPS = ("start", "load", "restore", "prefill", "decode", "prewarm", "save", "idle")
NATIVE_STEPS = frozenset({"load", "restore", "prefill", "decode", "prewarm", "save"})
_PHRASES = {
    "start": "starting",
    "load": "loading {model}",
    "restore": "restoring a conversation's saved cache",
    "prefill": "reading your message",
    "decode": "writing a reply",
    "prewarm": "getting ready for your next message",
    "save": "saving the conversation's cache",
    "idle": "",
}
_API_PHRASES = {
    "prefill": "reading a request to the local API",
    "decode": "writing a reply to the local API",
}
_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]{1,16})\b[^\n]*\(most recent call first\):", re.M
)
_FRAME = re.compile(r'^  File "([^"\n]{0,4096})", line \d+ in ', re.M)
_FATAL = re.compile(r"^Fatal Python error: ([^\n]{1,200})", re.M)
Scalar = str | int | float | bool


@dataclass(frozen=True)
class CrashReport:
    """What a process that closed unexpectedly was doing, read from its marker."""

    step: str  # one of STEPS
    since: float  # when the step began (seconds since the epoch)
    started: float  # when that process started
    pid: int
    version: str
    model: str = ""  # the model file in use (or being loaded)
    load: dict[str, Scalar] = field(default_factory=dict)  # the load settings
    paths: tuple[str, ...] = ()  # native risky paths in use (``RiskyPath`` values)
    request: dict[str, Scalar] = field(default_factory=dict)  # kind, conv, sampling
    fault: str = ""  # "Segmentation fault", when faulthandler wrote a record
    in_native: bool = False  # the fault was on the engine thread, inside llama.cpp
    log_file: Path | None = None  # the crash record (summary and thread stacks)

    @property
    def kind(self) -> str:
        """``chat`` (the window), ``api`` (the local API), or ''."""
        value = self.request.get("kind", "")
        return value if isinstance(value, str) else ""

    @property
    def conv_id(self) -> str:
        """The conversation being answered ('' when none)."""
        value = self.request.get("conv", "")
        return value if isinstance(value, str) else ""

    @property
    def mid_reply(self) -> bool:
        return self.step in ("prefill", "decode")

    @property
    def worth_telling(self) -> bool:
        """Something was under way, or a fault was recorded (a kill while idle is not)."""
        return self.step not in ("idle", "start") or bool(self.fault)

    def doing(self) -> str:
        """What Lamplight was doing, as words ('' when idle)."""
        if self.kind == "api" and self.step in _API_PHRASES:
            return _API_PHRASES[self.step]
        name = Path(self.model).name if self.model else "a model"
        return _PHRASES.get(self.step, "").format(model=name)

    def console(self) -> str:
        """The line for a terminal (``lamplight serve``, ``--smoke-test``): where the record is."""
        where = f" The crash record: {self.log_file}" if self.log_file else ""
        return self.line() + where

    def line(self, safe: bool | None = None) -> str:
        """The one-line notice; ``safe``: the conversation was verified on disk (True),
        found missing (False) or is not concerned (None)."""
        when = time.strftime("%a %d %b at %H:%M", time.localtime(self.since or self.started))
        doing = self.doing()
        text = f"Lamplight closed unexpectedly{' while ' + doing if doing else ''} on {when}."
        if safe is True:
            text += " Your conversation is safe."
        elif safe is False:
            text += " The message being answered was not saved."
        return text


@dataclass(frozen=True)
class Fault:
    """The parts of a faulthandler record that matter here."""

    error: str  # "Segmentation fault"
    current: int | None  # the thread that faulted
    top_frames: tuple[str, ...]  # its innermost Python frames' files, innermost first


def parse_fault(text: str) -> Fault | None:
    """The fault in faulthandler's output (None when it holds none)."""
    fatal = _FATAL.search(text)
    if fatal is None:
        return None
    current: int | None = None
    frames: tuple[str, ...] = ()
    for match in _THREAD.finditer(text):
        if match.group(1) == "Current thread":
            current = int(match.group(2), 16)
            rest = text[match.end() :]
            stop = re.search(r"^\S", rest, re.M)  # the next unindented line ends the stack
            block = rest[: stop.start()] if stop else rest
            frames = tuple(f.replace("\\", "/") for f in _FRAME.findall(block))[:8]
            break
    return Fault(fatal.group(1).strip(), current, frames)


def fault_in_native(fault: Fault, engine_thread: int, step: str) -> bool:
    """The fault happened inside llama.cpp: on the engine thread during a native step,
    or with llama-cpp-python or the engine's own modules innermost on the stack."""
    if fault.current is None:
        return False
    if engine_thread and fault.current == engine_thread and step in NATIVE_STEPS:
        return True
    top = fault.top_frames[:1]
    return any("/llama_cpp/" in f or "/app/engine/" in f for f in top)


def summary(report: CrashReport) -> str:
    """The crash record's head: what the process was doing, in plain lines."""

    def table(values: Mapping[str, Scalar]) -> str:
        return ", ".join(f"{k}={v}" for k, v in values.items()) or "-"

    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.started))
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.since))
    lines = [
        f"Lamplight {report.version} (pid {report.pid}, started {started}) closed unexpectedly.",
        f"Step: {report.step} ({report.doing() or 'nothing under way'}) since {since}",
        f"Model: {report.model or '-'}",
        f"Load settings: {table(report.load)}",
        f"Request: {table(report.request)}",
        f"Native paths in use: {', '.join(report.paths) or '-'}",
        f"Fault: {report.fault or 'none recorded (the process was killed, or lost power)'}",
        f"Inside llama.cpp: {'yes' if report.in_native else 'no'}",
    ]
    return redact_text("\n".join(lines)) + "\n"  # a marker from an older version, too
