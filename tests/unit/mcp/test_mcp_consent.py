"""Consent and "always" approvals are bound to what the user allowed (the server's
command, arguments, folder and environment, or its URL and headers), never to its name;
a stdio server gets the basic environment and its own ``env`` only. Real servers
(tests/mcp_server.py) over stdio and streamable HTTP; the approval store under a
Hypothesis state machine."""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from app.chat.conversation import Message
from app.chat.tool_round import ToolLoop
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ToolCall
from app.mcp.approvals import ANY_TOOL, ApprovalStore, Decision
from app.mcp.config import KEYRING, ServerConfig
from app.mcp.consent import consent_details
from app.mcp.host import McpHost
from tests.hypothesis_budget import examples
from tests.unit.mcp.test_mcp_host import (
    _state,
    _wait,
    allow,
    open_host,
    running_http_server,
    stdio,
    write_config,
)

pytestmark = pytest.mark.timeout(120)
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "AUTH")


class Round:
    """The chat's tool loop on a real host and a real approval store."""

    def __init__(self, host: McpHost, data_dir: Path) -> None:
        self.host = host
        self.store = ApprovalStore(data_dir / "mcp_approvals.json")
        self.results: list[Message] = []
        self.done = threading.Event()
        self.loop = ToolLoop(host, self.store, None, lambda _m: None, self._done)

    def _done(self, results: list[Message]) -> None:
        self.results = results
        self.done.set()

    def prepare(self, tool: str) -> list[dict[str, Any]]:
        """A round with one call of ``tool`` as the model would ask it now."""
        self.loop.offer(self.host.tools(30))
        return self.loop.prepare([ToolCall("call_1", tool, '{"a": 2, "b": 3}')])

    def answer(self, tool: str, decision: str) -> str:
        """Ask for ``tool``, answer ``decision``, and wait for the call's result."""
        calls = self.prepare(tool)
        assert calls[0]["state"] == "ask"
        self.done.clear()
        self.loop.begin(Message("assistant", "", tool_calls=calls), SamplingParams())
        assert self.loop.decide("call_1", decision) == ""
        assert self.done.wait(30)
        return self.results[0].content


def test_always_for_a_stdio_server_asks_again_once_its_command_changes(tmp_path: Path) -> None:
    host = open_host(tmp_path, {"s": stdio()})
    try:
        chat = Round(host, tmp_path)
        assert chat.answer("add", "always_server") == "5"
        assert chat.prepare("add")[0]["state"] == "running"  # allowed: no question
        before = {t.name: t for t in host.tools(30)}
        old_id = next(s.server_id for s in host.statuses())
        # The same name, the same tools, another command line.
        write_config(tmp_path, {"s": stdio("--prefix", "")})
        host.reload()
        _wait(lambda: _state(host, "s") == "consent")
        host.consent("s", old_id)  # what the user saw before is not what runs now
        assert _state(host, "s") == "consent"
        allow(host, "s")
        assert chat.prepare("add")[0]["state"] == "ask"
        # A call offered before the edit does not run on the edited server either.
        stale = host.call("add", {"a": 1, "b": 1}, 10, server_id=before["add"].server_id)
        assert stale.is_error and "changed in mcp.json" in stale.text
        now = next(t for t in host.tools(30) if t.name == "add")
        assert host.call("add", {"a": 1, "b": 1}, 10, server_id=now.server_id).text == "2"
    finally:
        host.close()


def test_an_http_server_is_not_reached_before_consent(tmp_path: Path) -> None:
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen(4)
        url = f"http://127.0.0.1:{trap.getsockname()[1]}/mcp"
        host = open_host(tmp_path, {"web": {"url": url}}, consent=False)
        try:
            assert _state(host, "web") == "consent"
            assert host.tools(0.5) == []
            assert select.select([trap], [], [], 0.3)[0] == []  # nobody connected
        finally:
            host.close()


def test_always_for_an_http_server_asks_again_at_another_url(tmp_path: Path) -> None:
    with running_http_server() as first, running_http_server() as second:
        host = open_host(tmp_path, {"web": {"url": first}})
        try:
            chat = Round(host, tmp_path)
            assert chat.answer("h_add", "always_tool") == "5"
            assert chat.prepare("h_add")[0]["state"] == "running"
            write_config(tmp_path, {"web": {"url": second}})
            host.reload()
            _wait(lambda: _state(host, "web") == "consent")  # a new address asks first
            allow(host, "web")
            assert chat.prepare("h_add")[0]["state"] == "ask"
        finally:
            host.close()


def test_a_stdio_server_gets_the_basic_environment_and_its_own_env_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted")
    monkeypatch.setenv("HF_TOKEN", "hf_planted")
    monkeypatch.setenv("LAMPLIGHT_PLANTED", "planted")
    host = open_host(tmp_path, {"s": {**stdio(), "env": {"GIVEN": "from mcp.json"}}})
    try:
        host.tools(30)

        def env(name: str) -> str:
            return host.call("getenv", {"name": name}, 10).text

        for planted in ("OPENAI_API_KEY", "HF_TOKEN", "LAMPLIGHT_PLANTED"):
            assert env(planted) == "<unset>", planted
        assert env("GIVEN") == "from mcp.json"
        assert env("PATH") == os.environ["PATH"]
        details = next(s.details for s in host.statuses())
        assert "  GIVEN=from mcp.json" in details
        assert any(line.startswith("and of your own environment only:") for line in details)
    finally:
        host.close()


def test_a_consent_or_approval_of_an_older_lamplight_grants_nothing(tmp_path: Path) -> None:
    entry = stdio()
    # What the older Lamplight stored: a hash of the command alone, rules by name alone.
    old_hash = json.dumps([entry["command"], entry["args"], "", []])
    old_consent = {"consent": {"s": hashlib.sha256(old_hash.encode()).hexdigest()[:32]}}
    (tmp_path / "mcp_state.json").write_text(json.dumps(old_consent))
    approvals = tmp_path / "mcp_approvals.json"
    approvals.write_text(json.dumps({"always": [["s", "*"], ["s", "add"]]}))
    host = open_host(tmp_path, {"s": entry}, consent=False)
    try:
        assert _state(host, "s") == "consent"
        server_id = next(s.server_id for s in host.statuses())
        store = ApprovalStore(approvals)
        assert store.rules() == [] and "older Lamplight" in store.note
        assert not store.allowed("s", server_id, "add")
        assert json.loads(approvals.read_text()) == {"always": []}
        assert ApprovalStore(approvals).note == ""  # said once
    finally:
        host.close()


# -- what the consent shows ------------------------------------------------------------

_ENV_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)


@settings(max_examples=examples(60), deadline=None)
@given(
    st.sampled_from(["stdio", "http"]),
    st.lists(st.tuples(_ENV_NAME, st.text(max_size=300) | st.just(KEYRING)), max_size=80),
)
def test_the_consent_lists_each_name_with_secrets_masked(
    transport: str, pairs: list[tuple[str, str]]
) -> None:
    given_pairs = tuple(pairs)
    if transport == "http":
        config = ServerConfig("s", "http", url="http://127.0.0.1:1/mcp", headers=given_pairs)
    else:
        config = ServerConfig("s", "stdio", command="x", env=given_pairs)
    lines = consent_details(config)
    assert all(line.isprintable() for line in lines)  # no line can pass for another
    listed = [line for line in lines if line.startswith("  ") and not line.startswith("  …")]
    assert len(listed) == min(len(pairs), 64)
    sep = ": " if transport == "http" else "="
    for (key, value), line in zip(pairs[:64], listed, strict=True):
        assert line.startswith(f"  {key}{sep}")
        shown = line[len(key) + 2 + len(sep) :]
        if value == KEYRING:
            assert shown == "(kept in the keyring)"
        elif value and (
            any(w in key.upper() for w in SECRET_WORDS)
            or value.lower().startswith(("bearer ", "basic "))
        ):
            assert shown == "•••••••• (hidden)"
        else:
            assert len(shown) <= 201
    own = [line for line in lines if line.startswith("and of your own environment only:")]
    assert own == (list(lines[-1:]) if transport == "stdio" else [])


# -- the approval store's invariant ----------------------------------------------------

NAMES = st.sampled_from(["files", "web"])
IDS = st.sampled_from(["id-a", "id-b", "id-c"])
TOOLS = st.sampled_from(["add", "echo", ANY_TOOL])
DECISIONS = st.sampled_from(["once", "always_tool", "always_server", "deny"])


class ApprovalMachine(RuleBasedStateMachine):
    """Servers are configured and reconfigured (name -> identity); calls are answered
    under the identity configured then; the store is reopened, forgets, and meets rules
    of an older Lamplight. A call runs unasked only under a rule that names exactly its
    server's identity now."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.path = self.dir / "mcp_approvals.json"
        self.store = ApprovalStore(self.path)
        self.config: dict[str, str] = {}  # server name -> its configuration's id now
        self.granted: set[tuple[str, str, str]] = set()  # the model of the rules

    @rule(name=NAMES, server_id=IDS)
    def configure(self, name: str, server_id: str) -> None:
        self.config[name] = server_id

    @rule(name=NAMES)
    def remove(self, name: str) -> None:
        self.config.pop(name, None)

    @rule(name=NAMES, tool=TOOLS, decision=DECISIONS)
    def answer(self, name: str, tool: str, decision: Decision) -> None:
        server_id = self.config.get(name, "")  # a call of a server not configured: no id
        self.store.remember(name, server_id, tool, decision)
        if not server_id:
            return
        if decision == "always_server":
            self.granted.add((name, server_id, ANY_TOOL))
        elif decision == "always_tool" and tool != ANY_TOOL:
            self.granted.add((name, server_id, tool))

    @precondition(lambda self: bool(self.granted))
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        rule_ = data.draw(st.sampled_from(self.store.rules()))
        self.store.forget(rule_)
        self.granted.discard((rule_.server, rule_.server_id, rule_.tool))

    @rule()
    def reopen(self) -> None:
        self.store = ApprovalStore(self.path)

    @rule(name=NAMES, tool=TOOLS)
    def older_rule(self, name: str, tool: str) -> None:
        """A rule by name alone, as an older Lamplight wrote it, then the store reopened."""
        rules = [list(r) for r in self.store.rules()] + [[name, tool]]
        self.path.write_text(json.dumps({"always": rules}))
        self.store = ApprovalStore(self.path)

    @invariant()
    def calls_run_only_under_their_own_identity(self) -> None:
        for name in ("files", "web", "other"):
            server_id = self.config.get(name, "")
            for tool in ("add", "echo", ANY_TOOL):
                expected = bool(server_id) and bool(
                    {(name, server_id, tool), (name, server_id, ANY_TOOL)} & self.granted
                )
                assert self.store.allowed(name, server_id, tool) == expected
                for other in ("id-a", "id-b", "id-c", ""):
                    if other != server_id and self.store.allowed(name, other, tool):
                        assert {(name, other, tool), (name, other, ANY_TOOL)} & self.granted

    @invariant()
    def every_rule_names_an_identity(self) -> None:
        assert {tuple(r) for r in self.store.rules()} == self.granted
        assert all(r.server_id for r in self.store.rules())

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


ApprovalMachine.TestCase.settings = settings(
    max_examples=examples(30), stateful_step_count=20, deadline=None
)
test_approval_machine = ApprovalMachine.TestCase
