"""The tool calls of one reply round: approval, running them off the GUI thread, results.

A reply that ends asking for calls is a *round*: ``ChatSession`` records the assistant
turn with its calls and hands them to ``ToolLoop.begin``; each call is refused (an
unknown tool, no host), run at once (an "always" rule allows it) or put to the user
(state "ask", answered by ``decide``). Once every call has a result, ``done`` gets the
``tool`` messages in call order and the session asks for the next round.

Every method runs on the GUI thread; the tool list and the calls run on daemon threads
and come back through ``post``, tagged with their turn so that a late result of a turn
that was stopped changes nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from app.chat.conversation import Message
from app.chat.tool_records import (
    ARGUMENT_CHARS,
    CANCELLED_TEXT,
    MAX_CALLS,
    RESULT_CHARS,
    TOOL_NAME_CHARS,
    is_call_id,
)
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ToolCall
from app.engine.tool_spec import AUTO, NONE, REQUIRED, ToolRequest
from app.mcp.tool_host import McpTool, ToolHost, ToolResult

log = logging.getLogger(__name__)

Post = Callable[[Callable[[], None]], None]
Decision = Literal["once", "always_tool", "always_server", "deny"]  # app.mcp.approvals'
DECISIONS = ("once", "always_tool", "always_server", "deny")
TOOLS_WAIT_S = 10.0  # how long a reply waits for servers to start before going without
DENIED_TEXT = "The user denied this call."
NO_HOST_TEXT = "No tools are available here."
BAD_ARGUMENTS = "The arguments must be a JSON object."


class Approvals(Protocol):
    """What the loop uses of ``app.mcp.approvals.ApprovalStore`` (rules name the server's
    configuration, ``McpTool.server_id``, as well as its name)."""

    def allowed(self, server: str, server_id: str, tool: str) -> bool: ...

    def remember(self, server: str, server_id: str, tool: str, decision: Decision) -> None: ...


def rounds_notice(rounds: int) -> str:
    return f"Stopped calling tools after {rounds} rounds."


def tool_request(tools: Sequence[McpTool], rounds: int, params: SamplingParams) -> ToolRequest:
    """What round ``rounds + 1`` of a reply may call: after ``params.tool_rounds``
    rounds, nothing (the tools are still described, so the cached prefix holds); with
    ``tools`` "required", the first round must call one (the grammar makes it)."""
    if rounds >= params.tool_rounds:
        choice = NONE
    elif rounds == 0 and params.tools == "required":
        choice = REQUIRED
    else:
        choice = AUTO
    return ToolRequest(tuple(t.spec() for t in tools), choice, parallel=True)


@dataclass
class _Entry:
    call: dict[str, Any]  # the message's stored call (changed in place)
    tool: McpTool | None
    cancel: threading.Event = field(default_factory=threading.Event)
    result: Message | None = None


@dataclass
class _Turn:
    message: Message
    entries: list[_Entry]


class ToolLoop:
    """Runs the calls of one round at a time. ``changed(message)``: a call's state
    changed (save, redraw); ``done(results)``: every call has its result."""

    def __init__(
        self,
        host: ToolHost | None,
        approvals: Approvals | None,
        post: Post | None,
        changed: Callable[[Message], None],
        done: Callable[[list[Message]], None],
    ) -> None:
        self.host = host
        self.approvals = approvals
        self._post: Post = post or (lambda fn: fn())
        self._changed = changed
        self._done = done
        self._turn: _Turn | None = None
        self._tools: dict[str, McpTool] = {}
        self._refused: dict[str, str] = {}  # call id: why ``prepare`` refused its arguments
        self._timeout_s = 60.0

    @property
    def active(self) -> bool:
        """A round's calls are being asked or run."""
        return self._turn is not None

    def wanted(self, params: SamplingParams) -> bool:
        return self.host is not None and params.tools != "off"

    def fetch(self, then: Callable[[list[McpTool]], None]) -> None:
        """The host's enabled tools, listed off the GUI thread (servers may start), then
        ``then(tools)`` on the GUI thread ([] when the host failed)."""
        host = self.host

        def work() -> None:
            tools: list[McpTool] = []
            try:
                tools = list(host.tools(TOOLS_WAIT_S)) if host is not None else []
            except Exception:  # a host bug must not leave the reply waiting forever
                log.exception("listing tools failed")
            self._post(lambda: then(tools))

        threading.Thread(target=work, name="tool-list", daemon=True).start()

    def offer(self, tools: Sequence[McpTool]) -> None:
        """The tools the model was offered for this reply (what its calls may name)."""
        self._tools = {t.qualified: t for t in tools}

    def prepare(self, calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
        """The stored form of a round's calls, each "ask", "running" or "error" (no such
        tool, or arguments that cannot be run), with ids unique in the round; ``begin``
        runs them."""
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        self._refused = {}
        for n, c in enumerate(calls[:MAX_CALLS]):
            call_id = c.id if is_call_id(c.id) and c.id not in seen else ""
            call_id = call_id or f"call_{int(time.time() * 1000)}_{n}"
            seen.add(call_id)
            name = c.name[:TOOL_NAME_CHARS]
            tool = self._tools.get(name)
            refused = argument_problem(c.arguments)
            args = "{}" if refused else c.arguments  # too long to keep, or not an object
            state = "error" if tool is None or refused else "ask"
            if tool is not None and refused:
                self._refused[call_id] = refused
            elif tool is not None and self._allowed(tool):
                state = "running"
            server = tool.server if tool else ""
            out.append(
                {"id": call_id, "name": name, "arguments": args, "server": server, "state": state}
            )
        return out

    def begin(self, message: Message, params: SamplingParams) -> None:
        """Start the round of ``message`` (its calls from ``prepare``): refuse, run or ask.
        ``done`` may come before this returns (nothing to run or ask)."""
        self._timeout_s = float(params.tool_timeout_s)
        entries = [_Entry(c, self._tools.get(c["name"])) for c in message.tool_calls]
        turn = self._turn = _Turn(message, entries)
        refused, self._refused = self._refused, {}
        for e in entries:
            if e.tool is None:
                text = (
                    NO_HOST_TEXT
                    if self.host is None
                    else f"There is no tool named {e.call['name']}."
                )
                e.result = _result(e.call, text, True)
            elif e.call["id"] in refused:  # the tool is never called with other arguments
                e.result = _result(e.call, refused[e.call["id"]], True)
        for e in entries:
            if e.call["state"] == "running":
                self._run(turn, e)
        self._check(turn)

    def decide(self, call_id: str, decision: str, arguments: str | None = None) -> str:
        """The user's answer to a call in state "ask" (see ``ChatSession.decide``)."""
        turn = self._turn
        entry = next((e for e in turn.entries if e.call["id"] == call_id), None) if turn else None
        if turn is None or entry is None or entry.call["state"] != "ask":
            return "That call is not waiting for an answer."
        if decision not in DECISIONS:
            return f"Unknown decision {decision[:40]!r}."
        if arguments is not None and decision != "deny":
            if _object(arguments) is None:
                return BAD_ARGUMENTS
            entry.call["arguments"] = arguments.strip()
        if decision == "deny":
            entry.call["state"] = "denied"
            entry.result = _result(entry.call, DENIED_TEXT, True)
            self._changed(turn.message)
            self._check(turn)
            return ""
        if decision != "once" and self.approvals is not None and entry.tool is not None:
            try:
                tool = entry.tool
                self.approvals.remember(tool.server, tool.server_id, tool.name, decision)  # type: ignore[arg-type]
            except OSError as exc:  # still runs: the user allowed it
                log.warning("remembering an approval failed: %s", exc)
        entry.call["state"] = "running"
        self._changed(turn.message)
        self._run(turn, entry)
        return ""

    def cancel(self) -> tuple[Message, list[Message]] | None:
        """Stop the round: running calls are told to cancel, open ones end "cancelled".
        Returns its message and every call's result (None when no round is on)."""
        turn, self._turn = self._turn, None
        if turn is None:
            return None
        for e in turn.entries:
            if e.result is None:
                e.cancel.set()
                e.call["state"] = "cancelled"
                e.result = _result(e.call, CANCELLED_TEXT, True)
        return turn.message, [e.result for e in turn.entries if e.result is not None]

    # -- internals -----------------------------------------------------------------------

    def _allowed(self, tool: McpTool) -> bool:
        if self.approvals is None:
            return False
        try:
            return self.approvals.allowed(tool.server, tool.server_id, tool.name)
        except Exception:  # a damaged rules file asks, it does not allow
            log.exception("reading approvals failed")
            return False

    def _run(self, turn: _Turn, entry: _Entry) -> None:
        host, tool, timeout_s = self.host, entry.tool, self._timeout_s
        args = _object(entry.call["arguments"]) or {}
        if host is None or tool is None:  # pragma: no cover - refused in begin
            return

        def work() -> None:
            start = time.monotonic()
            try:
                # Bound to the server as offered: one edited since runs nothing.
                result = host.call(
                    tool.qualified, args, timeout_s, cancel=entry.cancel, server_id=tool.server_id
                )
            except Exception as exc:  # the host promises not to raise; a bug still ends it
                log.exception("tool call failed")
                result = ToolResult(f"The tool failed: {str(exc)[:500]}", is_error=True)
            ms = (time.monotonic() - start) * 1000
            timed_out = result.is_error and ms >= timeout_s * 1000 * 0.98
            self._post(lambda: self._finished(turn, entry, result, ms, timed_out))

        threading.Thread(target=work, name=f"tool-{tool.name[:40]}", daemon=True).start()

    def _finished(
        self, turn: _Turn, entry: _Entry, result: ToolResult, ms: float, timed_out: bool
    ) -> None:
        if self._turn is not turn or entry.result is not None:
            return  # stopped meanwhile: its result was recorded as cancelled
        text = result.text if isinstance(result.text, str) else str(result.text)
        state = "timeout" if timed_out else "error" if result.is_error else "done"
        entry.call["state"] = "cancelled" if entry.cancel.is_set() else state
        entry.call["ms"] = round(max(0.0, min(ms, 1e8)), 1)
        entry.result = _result(entry.call, text[:RESULT_CHARS], result.is_error)
        self._changed(turn.message)
        self._check(turn)

    def _check(self, turn: _Turn) -> None:
        """Hand the results on once every call of ``turn`` has one."""
        if self._turn is not turn or any(e.result is None for e in turn.entries):
            return
        self._turn = None
        self._done([e.result for e in turn.entries if e.result is not None])


def _result(call: dict[str, Any], text: str, is_error: bool) -> Message:
    return Message("tool", text, tool_call_id=call["id"], name=call["name"], is_error=is_error)


def argument_problem(text: str) -> str:
    """Why a call's arguments are not run ("" when they can be): over ``ARGUMENT_CHARS``
    (kept neither in the transcript nor run as something else) or not a JSON object."""
    if len(text) > ARGUMENT_CHARS:
        return (
            f"The arguments were {len(text):,} characters, over the limit of "
            f"{ARGUMENT_CHARS:,}; the call was not run."
        )
    if text.strip() and _object(text) is None:  # no arguments at all read as {}
        return "The arguments were not a JSON object; the call was not run."
    return ""


def _object(text: str) -> dict[str, Any] | None:
    """``text`` as a JSON object, or None (too long, not JSON, not an object)."""
    if len(text) > ARGUMENT_CHARS:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def chain_start(messages: Sequence[Message], last: int) -> int:
    """Where the reply that ends at message ``last`` began: its first assistant turn
    (a reply with tool rounds is assistant-with-calls, results, ..., assistant)."""
    while last > 0 and (
        messages[last - 1].role == "tool"
        or (messages[last - 1].role == "assistant" and messages[last - 1].tool_calls)
    ):
        last -= 1
    return last


def forget_together(messages: Sequence[Message]) -> None:
    """Keep calls and their results together in the model's memory: when either an
    assistant turn with calls or one of its results is forgotten, all of them are."""
    groups: list[list[Message]] = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            groups.append([m])
        elif m.role == "tool" and groups and _answers(groups[-1][0], m):
            groups[-1].append(m)
    for group in groups:
        if any(m.forgotten for m in group):
            for m in group:
                m.forgotten = True


def _answers(call_message: Message, result: Message) -> bool:
    return any(c["id"] == result.tool_call_id for c in call_message.tool_calls)


def parse_arguments(text: str) -> Mapping[str, Any] | None:
    """The arguments a card's edit holds, or None when they are not a JSON object."""
    return _object(text)
