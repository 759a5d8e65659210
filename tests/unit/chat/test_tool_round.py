"""The chat's tool loop (``ChatSession`` with ``app.chat.tool_round``), Qt-free: a fake
engine link, a fake MCP host, calls run on real threads and posted back to the test."""

from __future__ import annotations

import json
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from app.chat.conversation import Conversation, Message
from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.chat.tool_round import DENIED_TEXT, chain_start, forget_together
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage, ToolCall
from app.engine.metrics import MessageMetrics
from app.engine.tool_spec import AUTO, NONE, ToolRequest
from app.mcp.tool_host import McpTool
from tests.fakes.mcp import FakeMcpHost, ready
from tests.hypothesis_budget import examples

P = SamplingParams()
TOOLS = [
    McpTool("files", "read", "read", "Read a file", {"type": "object"}),
    McpTool("web", "fetch", "fetch", "Fetch a page"),
    McpTool("web", "slow", "slow"),
]


class Link:
    def __init__(self) -> None:
        self.calls: list[tuple[list[ChatMessage], ToolRequest | None]] = []
        self.stops = 0

    def generate(
        self,
        conv_id: str,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None = None,
    ) -> int:
        self.calls.append((list(messages), tools))
        return len(self.calls)

    def stop(self) -> None:
        self.stops += 1

    def reset(self) -> None: ...
    def restore_snapshot(self, conv_id: str) -> None: ...
    def drop_snapshot(self, conv_id: str) -> None: ...


class View:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.notices: list[str] = []

    def show_conversation(self, conv: Conversation, opened: bool, restoring: bool) -> None:
        self.events.append("shown")

    def reply_begun(self, shown: Sequence[Message], added_user: bool) -> None:
        self.events.append("begun")

    def reply_ended(self, text: str, metrics: MessageMetrics | None, error: str) -> None:
        self.events.append("ended")

    def tool_calls_changed(self, message: Message) -> None:
        self.events.append("calls:" + ",".join(c["state"] for c in message.tool_calls))

    def open_failed(self, message: str) -> None: ...
    def notice(self, text: str) -> None:
        self.notices.append(text)

    def row_saved(self, conv_id: str) -> None: ...
    def row_removed(self, conv_id: str) -> None: ...


def tool_host() -> FakeMcpHost:
    """Servers "files" (read) and "web" (fetch, slow): ``read`` and ``fetch`` answer with
    their arguments; ``slow`` waits for its cancel or its timeout."""
    host = FakeMcpHost([ready("files", TOOLS[0]), ready("web", *TOOLS[1:])])
    host.hanging.add("slow")
    return host


class Rules:
    def __init__(self, allow: set[tuple[str, str]] | None = None) -> None:
        self.rules = set(allow or ())
        self.remembered: list[tuple[str, str, str]] = []

    def allowed(self, server: str, server_id: str, tool: str) -> bool:
        return (server, tool) in self.rules or (server, "*") in self.rules

    def remember(self, server: str, server_id: str, tool: str, decision: str) -> None:
        self.remembered.append((server, tool, decision))
        if decision != "once" and decision != "deny":
            self.rules.add((server, tool if decision == "always_tool" else "*"))


RIGS: list[Rig] = []


@pytest.fixture(autouse=True)
def _close_rigs() -> Iterator[None]:
    """End each test's calls and threads (a test must not leave threads running)."""
    yield
    while RIGS:
        rig = RIGS.pop()
        rig.session.stop()
        rig.host.close()
        for t in threading.enumerate():
            if t.name.startswith("tool-"):
                t.join(5)


class Rig:
    def __init__(self, tmp_path: Path, host: FakeMcpHost | None = None, rules: Rules | None = None):
        RIGS.append(self)
        self.q: queue.Queue[Callable[[], None]] = queue.Queue()
        self.link, self.view = Link(), View()
        self.host = tool_host() if host is None else host
        self.rules = rules
        self.store = ConversationStore(tmp_path)
        self.session = ChatSession(
            self.store,
            self.link,
            self.view,
            tool_host=self.host,
            approvals=self.rules,
            post=self.q.put,
        )

    def pump(self, until: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            self.q.get(timeout=max(0.01, deadline - time.monotonic()))()

    def send(self, text: str = "hi", params: SamplingParams = P) -> None:
        n = len(self.link.calls)
        assert self.session.send(text, params)
        self.pump(lambda: len(self.link.calls) > n)

    def finish(self, text: str = "", calls: Sequence[ToolCall] = ()) -> None:
        rid = self.session.request_id
        assert rid is not None and rid > 0
        self.session.on_finished(rid, text, MessageMetrics(), "", tool_calls=calls)

    def wait_round(self, n: int) -> None:
        self.pump(lambda: len(self.link.calls) >= n)

    @property
    def messages(self) -> list[Message]:
        return self.session.conversation.messages


def call(name: str, args: str = "{}", cid: str = "") -> ToolCall:
    return ToolCall(cid or f"id_{name}", name, args)


def test_allow_once_runs_the_call_and_the_next_round_reads_its_result(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.send()
    first_tools = rig.link.calls[0][1]
    assert first_tools is not None and first_tools.choice == AUTO
    assert [t.name for t in first_tools.tools] == ["read", "fetch", "slow"]
    rig.finish("Let me look.", [call("read", '{"path": "a"}')])
    assert rig.messages[-1].tool_calls[0]["state"] == "ask"
    assert rig.session.busy and rig.view.events[-2:] == ["ended", "calls:ask"]
    assert rig.session.decide("id_read", "once") == ""
    rig.wait_round(2)
    assert rig.host.calls == [("read", {"path": "a"})]
    sent, tools = rig.link.calls[1]
    assert tools == first_tools  # the same prefix: only the result is new
    assert sent[-1].role == "tool" and sent[-1].tool_call_id == "id_read"
    assert sent[-2].tool_calls == (ToolCall("id_read", "read", '{"path": "a"}'),)
    rig.finish("It says a.")
    assert not rig.session.busy
    assert [m.role for m in rig.messages] == ["user", "assistant", "tool", "assistant"]
    done = rig.messages[1].tool_calls[0]
    assert done["state"] == "done" and done["server"] == "files" and done["ms"] >= 0
    assert rig.rules is None  # no approvals: every call asked
    assert rig.view.events.count("begun") == rig.view.events.count("ended") == 2
    # All of it on disk, as shown.
    saved = rig.store.load(rig.session.conversation.id)
    assert [m.role for m in saved.messages] == ["user", "assistant", "tool", "assistant"]
    assert saved.messages[1].tool_calls == rig.messages[1].tool_calls


@pytest.mark.parametrize("decision", ["always_tool", "always_server"])
def test_always_is_remembered_and_the_next_call_runs_unasked(tmp_path: Path, decision: str) -> None:
    rig = Rig(tmp_path, rules=Rules())
    rig.send()
    rig.finish("", [call("fetch", cid="a")])
    assert rig.session.decide("a", decision) == ""  # type: ignore[arg-type]
    rig.wait_round(2)
    assert rig.rules is not None and rig.rules.remembered == [("web", "fetch", decision)]
    rig.finish("", [call("fetch", cid="b"), call("slow", '{"n": 1}', cid="c")])
    states = {c["id"]: c["state"] for c in rig.messages[-1].tool_calls}
    # always_server allows the server's other tools too; always_tool only that one.
    assert states["b"] == "running"
    assert states["c"] == ("running" if decision == "always_server" else "ask")


def test_edited_arguments_run_and_are_kept(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.send()
    rig.finish("", [call("read", '{"path": "a"}')])
    assert rig.session.decide("id_read", "once", ' {"path": "b"} ') == ""
    rig.wait_round(2)
    assert rig.host.calls == [("read", {"path": "b"})]
    assert rig.messages[1].tool_calls[0]["arguments"] == '{"path": "b"}'
    assert rig.link.calls[1][0][-2].tool_calls[0].arguments == '{"path": "b"}'


@pytest.mark.parametrize("bad", ["", "[1]", '{"a": ', "null", '"x"', "{" * 5000, " " * 200_001])
def test_invalid_edited_arguments_change_nothing(tmp_path: Path, bad: str) -> None:
    rig = Rig(tmp_path)
    rig.send()
    rig.finish("", [call("read", '{"path": "a"}')])
    assert rig.session.decide("id_read", "once", bad) == "The arguments must be a JSON object."
    assert rig.messages[1].tool_calls[0] == {
        "id": "id_read",
        "name": "read",
        "arguments": '{"path": "a"}',
        "server": "files",
        "state": "ask",
    }
    assert rig.host.calls == [] and len(rig.link.calls) == 1
    assert rig.session.decide("nope", "once") != ""
    assert rig.session.decide("id_read", "maybe") != ""  # type: ignore[arg-type]


def test_deny_sends_the_model_an_error_result(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.send()
    rig.finish("", [call("read")])
    assert rig.session.decide("id_read", "deny") == ""
    rig.wait_round(2)
    assert rig.host.calls == []
    assert rig.messages[1].tool_calls[0]["state"] == "denied"
    assert rig.messages[2].content == DENIED_TEXT and rig.messages[2].is_error
    assert rig.link.calls[1][0][-1].content == DENIED_TEXT
    assert rig.session.decide("id_read", "once") != ""  # answered already


def test_a_timeout_goes_back_to_the_model(tmp_path: Path) -> None:
    rig = Rig(tmp_path, rules=Rules({("web", "*")}))
    rig.send(params=SamplingParams(tool_timeout_s=1))
    rig.finish("", [call("slow")])
    rig.wait_round(2)
    assert rig.messages[1].tool_calls[0]["state"] == "timeout"
    assert rig.messages[2].is_error and "Timed out" in rig.messages[2].content


def test_stop_cancels_running_calls_and_open_cards(tmp_path: Path) -> None:
    rig = Rig(tmp_path, rules=Rules({("web", "slow")}))
    rig.send()
    rig.finish("", [call("read"), call("slow")])
    assert [c["state"] for c in rig.messages[1].tool_calls] == ["ask", "running"]
    rig.pump(lambda: bool(rig.host.calls))
    idle: list[int] = []
    rig.session.on_idle = lambda: idle.append(1)
    rig.session.stop()
    assert not rig.session.busy and idle == [1]
    assert [c["state"] for c in rig.messages[1].tool_calls] == ["cancelled", "cancelled"]
    assert [m.role for m in rig.messages] == ["user", "assistant", "tool", "tool"]
    assert all(m.is_error for m in rig.messages[2:])
    assert rig.view.events[-1] == "shown" and rig.link.stops == 0
    time.sleep(0.1)  # the cancelled call's late result changes nothing
    while not rig.q.empty():
        rig.q.get()()
    assert len(rig.link.calls) == 1 and rig.messages[-1].role == "tool"
    assert rig.view.events.count("begun") == rig.view.events.count("ended") == 1
    saved = rig.store.load(rig.session.conversation.id)
    assert [c["state"] for c in saved.messages[1].tool_calls] == ["cancelled", "cancelled"]
    # The conversation goes on: the next message follows the results.
    rig.send("and now?")
    assert [m.role for m in rig.link.calls[-1][0]] == ["user", "assistant", "tool", "tool", "user"]


def test_stop_while_the_tools_are_listed_ends_the_reply_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.host.listing.clear()
    assert rig.session.send("hi", P)
    assert rig.session.busy and rig.link.calls == []
    rig.session.stop()
    assert not rig.session.busy
    rig.host.listing.set()
    time.sleep(0.05)
    while not rig.q.empty():
        rig.q.get(timeout=1)()
    assert rig.link.calls == []  # the late tool list asks for nothing
    # Shown again with its (empty) reply recorded: the reply has no metrics to end with.
    assert rig.view.events == ["begun", "shown", "ended"]
    assert [m.role for m in rig.messages] == ["user", "assistant"]


def test_the_rounds_limit_switches_calls_off_with_a_notice(tmp_path: Path) -> None:
    rig = Rig(tmp_path, rules=Rules({("files", "*")}))
    rig.send(params=SamplingParams(tool_rounds=2))
    for n in range(2):
        rig.finish("", [call("read", cid=f"c{n}")])
        rig.wait_round(n + 2)
    last = rig.link.calls[-1][1]
    assert last is not None and last.choice == NONE and last.tools
    assert rig.view.notices[-1] == "Stopped calling tools after 2 rounds."
    rig.finish("", [call("read", cid="c9")])  # a model that calls anyway: ignored
    assert not rig.session.busy and rig.messages[-1].tool_calls == []
    assert len(rig.host.calls) == 2


def test_parallel_calls_run_together_and_answer_in_call_order(tmp_path: Path) -> None:
    rig = Rig(tmp_path, rules=Rules({("files", "*"), ("web", "*")}))
    rig.host.held.add("fetch")  # fetch waits until read has finished: they overlap
    rig.send()
    rig.finish("", [call("fetch", '{"u": 1}'), call("read", '{"p": 2}')])
    rig.pump(lambda: rig.messages[1].tool_calls[1]["state"] == "done")
    assert rig.messages[1].tool_calls[0]["state"] == "running"
    rig.host.release.set()
    rig.wait_round(2)
    assert [m.tool_call_id for m in rig.messages[2:4]] == ["id_fetch", "id_read"]


def test_an_unknown_tool_and_repeated_ids_get_error_results(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.send()
    rig.finish("", [call("nope", cid="x"), call("gone", cid="x")])
    rig.wait_round(2)
    calls = rig.messages[1].tool_calls
    assert [c["state"] for c in calls] == ["error", "error"]
    assert calls[0]["id"] != calls[1]["id"]
    assert rig.messages[2].content == "There is no tool named nope."
    assert rig.messages[3].tool_call_id == calls[1]["id"]


@pytest.mark.parametrize("allowed", [True, False])
def test_arguments_too_long_or_not_an_object_are_refused_and_never_run(
    tmp_path: Path, allowed: bool
) -> None:
    # Over 100,000 characters the arguments used to be replaced by {} and the call run
    # (a write_file wrote an empty file); text that is not an object ran with {} too.
    rig = Rig(tmp_path, rules=Rules({("files", "*")}) if allowed else None)
    rig.send()
    huge = json.dumps({"path": "a", "text": "x" * 100_000})
    rig.finish("", [call("read", huge, cid="a"), call("read", "[1, 2]", cid="b")])
    rig.wait_round(2)
    assert rig.host.calls == []
    calls = rig.messages[1].tool_calls
    assert [c["state"] for c in calls] == ["error", "error"]
    assert calls[0]["arguments"] == "{}"  # the transcript keeps no 100 KB of arguments
    first, second = rig.messages[2], rig.messages[3]
    assert first.is_error and first.content == (
        f"The arguments were {len(huge):,} characters, over the limit of 100,000; "
        "the call was not run."
    )
    assert second.is_error and "not a JSON object" in second.content
    assert rig.link.calls[1][0][-2].content == first.content  # what the model reads next


def test_calls_without_a_tool_host_get_error_results(tmp_path: Path) -> None:
    link, view = Link(), View()
    session = ChatSession(ConversationStore(tmp_path), link, view)
    assert session.send("hi", P) and link.calls[0][1] is None
    session.on_finished(1, "", MessageMetrics(), "", tool_calls=[call("read")])
    assert len(link.calls) == 2 and link.calls[1][1] is None
    msgs = session.conversation.messages
    assert msgs[2].role == "tool" and msgs[2].is_error and "No tools" in msgs[2].content


def test_tools_off_offers_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.session.send("hi", SamplingParams(tools="off"))
    assert rig.link.calls[0][1] is None


def test_regenerate_and_edit_replace_the_whole_chain(tmp_path: Path) -> None:
    rig = Rig(tmp_path, rules=Rules({("files", "*")}))
    rig.send()
    rig.finish("", [call("read")])
    rig.wait_round(2)
    rig.finish("answer one")
    chain = list(rig.messages[1:])
    assert rig.session.regenerate(P)
    rig.wait_round(3)
    assert [m.role for m in rig.link.calls[2][0]] == ["user"]
    rig.session.on_tokens(3, "answer two")
    rig.finish("answer two")
    assert [m.content for m in rig.messages] == ["hi", "answer two"]
    assert rig.session.conversation.version_of(1) == (2, 2)
    assert rig.session.conversation.alternatives[0].messages == chain
    assert rig.session.switch_version(1, -1)
    assert rig.messages[1:] == chain
    # Editing the question keeps the chain with its version too.
    assert rig.session.begin_edit(0) == "hi"
    rig.send("hello")
    rig.session.on_tokens(rig.session.request_id or 0, "x")
    rig.finish("x")
    assert rig.session.conversation.version_of(0) == (2, 2)


def test_chain_start_and_forgetting_keep_calls_with_results() -> None:
    msgs = [
        Message("user", "q"),
        Message("assistant", "", tool_calls=[{"id": "a", "name": "t", "arguments": "{}"}]),
        Message("tool", "r1", tool_call_id="a"),
        Message("assistant", "", tool_calls=[{"id": "b", "name": "t", "arguments": "{}"}]),
        Message("tool", "r2", tool_call_id="b"),
        Message("assistant", "done"),
    ]
    assert chain_start(msgs, 5) == 1
    msgs[2].forgotten = True
    forget_together(msgs)
    assert [m.forgotten for m in msgs] == [False, True, True, False, False, False]
    msgs[3].forgotten = True
    forget_together(msgs)
    assert msgs[4].forgotten


def test_the_overflow_forgets_a_call_with_its_result(tmp_path: Path) -> None:
    rig = Rig(tmp_path, rules=Rules({("files", "*")}))
    rig.send()
    rig.finish("", [call("read")])
    rig.wait_round(2)
    # The engine dropped the user message and the call, but not its result.
    dropped = MessageMetrics(dropped_from=0, dropped_count=2)
    rig.session.on_finished(2, "fine", dropped, "")
    assert [m.forgotten for m in rig.messages] == [True, True, True, False]


def test_a_chat_reopened_mid_call_shows_it_cancelled(tmp_path: Path) -> None:
    rig = Rig(tmp_path, rules=Rules({("web", "slow")}))
    rig.send()
    rig.finish("", [call("read"), call("slow")])
    assert rig.session.save()  # the app quits here
    conv = rig.store.load(rig.session.conversation.id)
    assert [c["state"] for c in conv.messages[1].tool_calls] == ["cancelled", "cancelled"]
    assert [(m.role, m.tool_call_id) for m in conv.messages[2:]] == [
        ("tool", "id_read"),
        ("tool", "id_slow"),
    ]
    assert all(m.is_error for m in conv.messages[2:])
    rig.session.stop()


class ToolLoopMachine(RuleBasedStateMachine):
    """Any order of send / finish / decide / stop: each round begun ends once, nothing
    shown is lost, and an idle session has no call left open or unanswered."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.rig = Rig(Path(self.tmp.name))
        self.seen: list[str] = []  # ids of every message recorded so far

    def streaming(self) -> bool:
        s = self.rig.session
        return s.busy and not s._reply.rounds.active and (s.request_id or 0) > 0

    def settle(self) -> None:
        """Run what the threads posted until no call is running."""
        msgs = self.rig.messages

        def quiet() -> bool:
            running = [c for m in msgs[-3:] for c in m.tool_calls if c["state"] == "running"]
            return not running or not self.rig.session.busy

        self.rig.pump(quiet)
        self.rig.pump(lambda: not self.rig.session.busy or self.streaming() or self.asking())

    def asking(self) -> bool:
        return self.rig.session._reply.rounds.active

    @rule(text=st.sampled_from(["a", "b"]))
    def send(self, text: str) -> None:
        if not self.rig.session.busy:
            self.rig.send(text)

    @rule(names=st.lists(st.sampled_from(["read", "nope", "fetch"]), max_size=3))
    def finish(self, names: list[str]) -> None:
        if self.streaming():
            self.rig.finish(
                "r", [call(n, cid=f"{n}{i}{len(self.seen)}") for i, n in enumerate(names)]
            )
            self.settle()

    @rule(choice=st.sampled_from(["once", "deny", "always_tool"]), edit=st.booleans())
    def decide(self, choice: str, edit: bool) -> None:
        last = self.rig.messages[-1:] or [Message("user", "")]
        asked = [c for c in last[0].tool_calls if c["state"] == "ask"]
        if asked and self.asking():
            args = '{"e": 1}' if edit else None
            assert self.rig.session.decide(asked[0]["id"], choice, args) == ""  # type: ignore[arg-type]
            self.settle()

    @rule()
    def stop(self) -> None:
        if self.streaming():
            rid = self.rig.session.request_id or 0
            self.rig.session.on_cancelled(rid, "", MessageMetrics(), "")
        else:
            self.rig.session.stop()

    @invariant()
    def consistent(self) -> None:
        ev = self.rig.view.events
        begun, ended = ev.count("begun"), ev.count("ended")
        assert begun - ended == (1 if self.streaming() else 0)
        ids = [m.id for m in self.rig.messages]
        assert all(i in ids for i in self.seen)
        self.seen = ids
        if not self.rig.session.busy:
            pending = {c["id"] for m in self.rig.messages for c in m.tool_calls}
            answered = {m.tool_call_id for m in self.rig.messages if m.role == "tool"}
            assert pending == answered
            states = {c["state"] for m in self.rig.messages for c in m.tool_calls}
            assert not states & {"ask", "running"}

    def teardown(self) -> None:
        self.rig.session.stop()
        for t in threading.enumerate():
            if t.name.startswith("tool-"):
                t.join(5)
        RIGS.remove(self.rig)
        self.tmp.cleanup()


ToolLoopMachine.TestCase.settings = settings(
    max_examples=examples(25), stateful_step_count=15, deadline=None
)
test_tool_loop_machine = ToolLoopMachine.TestCase
