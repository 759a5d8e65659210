"""What the host runs for a reply (``ReplyJob``) and what it sends back (``ReplyEvent``).

One job type for the window's replies and the API's requests (llama.cpp's
``server_task``): the fields say what a job asks for (a conversation's cache and
snapshot, a template of its own, a model it was checked against). Its ``sink`` gets
``Token``, ``PrefillProgress`` and ``CallProgress`` events, then exactly one terminal event:
``Finished`` or ``ReplyFailed``; ``Relay``, the job's own, is the one place that
guarantees it, whoever ends the job (the engine thread, a closed host, a wait given
up, the server stopping). A job refused by the host fails with one of the exceptions
below; what a client is told (an HTTP status, a line in the window) is the caller's
choice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from app.config.setting_records import SamplingParams
from app.engine.backend import CallProgress, Finished, ModelInfo, PrefillProgress, Token
from app.engine.chat_message import ChatMessage
from app.engine.templates.override import TemplateOverride
from app.engine.tool_spec import ToolRequest
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

Origin = Literal["gui", "api"]
# Who stopped a job: its client went away, the window's Stop, the server stopping.
StopCause = Literal["", "client", "operator", "shutdown"]


class ModelGone(LamplightError):
    """The job was checked against a model that is no longer the one loaded."""

    def __init__(self, wanted: str, loaded: str) -> None:
        super().__init__(f"The model '{wanted}' is no longer loaded; '{loaded}' is.")


class TemplateUnavailable(LamplightError):
    """The job needs a template of its own and the backend renders its prompt itself."""


class HostClosed(LamplightError):
    """The job came after the engine host was closed (the app is quitting)."""

    def __init__(self) -> None:
        super().__init__("Lamplight's engine is shutting down; the reply was not started.")


class NoResult(LamplightError):
    """The backend's stream ended without a ``Finished`` event."""

    def __init__(self) -> None:
        super().__init__("The engine ended the reply without a result.")


@dataclass(frozen=True)
class ReplyFailed:
    """Terminal event of a job that could not run, or failed part-way."""

    error: BaseException

    @property
    def message(self) -> str:
        """A line for the user: the error's own text, or what kind of failure it was."""
        if isinstance(self.error, LamplightError):
            return str(self.error)
        return f"Generation failed: {self.error}"


ReplyEvent = Token | PrefillProgress | CallProgress | Finished | ReplyFailed
ReplySink = Callable[[ReplyEvent], None]
Terminal = Finished | ReplyFailed
# Called with a job's terminal event before its sink hears it; what it returns (if
# anything) runs after the sink has (``ReplyLine`` moves on there).
EndWatch = Callable[[Terminal], Callable[[], None] | None]


class Relay:
    """A job's events to its sink, from any thread: tokens until the first terminal
    event, nothing after it; a sink that raises is logged and never reaches the sender.

    The one terminal-event guard of a reply: every path that ends a job sends through
    its relay. ``tokens`` counts the tokens passed (for the API's status).
    """

    def __init__(self, sink: ReplySink) -> None:
        self._sink = sink
        self._lock = threading.RLock()  # a sink may end another job; never this one twice
        self.ended = False
        self.tokens = 0
        self.watch: EndWatch | None = None  # set once, before the job is queued

    def send(self, event: ReplyEvent) -> None:
        then: Callable[[], None] | None = None
        with self._lock:
            if self.ended:
                return
            if isinstance(event, Finished | ReplyFailed):
                self.ended = True
                if self.watch is not None:
                    then = self.watch(event)
            elif isinstance(event, Token):
                self.tokens += 1
            try:
                self._sink(event)  # under the lock: nothing overtakes the terminal event
            except Exception:
                log.exception("a reply job's sink failed")
        if then is not None:
            then()


@dataclass
class ReplyJob:
    """One reply to run on the engine thread.

    ``conv_id``: the conversation whose cache it extends (its snapshot is saved after a
    reply that got going); "" for none. ``model_id``: refuse the job unless this model
    is loaded ("" accepts any, as the window's replies do). ``template``: the template
    for this job only (None: the window's choice; ``"model"``: the chat template
    chosen for the model, as the window's is outside continue-the-text mode).
    ``reuse``: False starts from an empty cache. ``next_turn``: prepare the next turn
    after a reply that ended.
    ``party``: whose cached conversations an API job may reuse ("" for the server's
    one keyless client; ``KvPool``); a window reply reuses only the window's.
    """

    id: str
    origin: Origin
    messages: list[ChatMessage]
    params: SamplingParams
    sink: ReplySink
    stop: threading.Event = field(default_factory=threading.Event)
    end_thinking: threading.Event = field(default_factory=threading.Event)  # Stop thinking
    conv_id: str = ""
    model_id: str = ""
    template: TemplateOverride | Literal["model"] | None = None
    reuse: bool = True
    next_turn: bool = True
    client: str = ""  # who asked: "127.0.0.1:54321", an API request's `user`
    tools: ToolRequest | None = None  # what the model may call in this reply
    party: str = ""
    # A new chat in this project (an id): it starts from the project's opening, read
    # once and kept (``app/host/prefixes.py``), when no cached conversation serves it.
    prefix: str = ""
    # A compaction's summary (its message's id): written on a fork of the cache, which is
    # as before afterwards (``app/host/compaction_steps.py``); the state before it is
    # kept for Undo. Nothing is prepared or saved after it.
    compaction: str = ""
    # Told who stopped the job (``halt``): an API request's own record of it.
    on_halt: Callable[[StopCause], None] | None = None
    relay: Relay = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.relay = Relay(self.sink)

    def halt(self, why: StopCause) -> None:
        """Stop the job: ``why`` ("client", "operator", "shutdown") goes to ``on_halt``."""
        if self.on_halt is not None:
            self.on_halt(why)
        self.stop.set()


@dataclass(frozen=True)
class DraftCandidate:
    """A library model as a draft for the loaded one: ``problem`` says why it cannot be
    one ("" when it can)."""

    path: Path
    name: str
    size: int
    problem: str


def model_id(info: ModelInfo) -> str:
    """The id ``/v1/models`` lists for a loaded model (and a job names)."""
    return info.path.stem if info.path.name else info.name
