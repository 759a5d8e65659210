"""mcp.json, the MCP state and approval files, names and results: no servers run here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keyring.backends import fail
from mcp import types

from app.mcp import config as mcp_config
from app.mcp.approvals import ApprovalStore
from app.mcp.config import KEYRING, load_config, move_secrets, parse_config, resolved
from app.mcp.results import (
    MAX_RESULT_CHARS,
    MAX_TOOLS,
    bounded_tools,
    qualify,
    sanitize,
    tool_result,
)
from app.mcp.state import McpState
from app.mcp.tool_host import McpTool
from tests.fakes.keyring import MemoryKeyring, use_keyring
from tests.hypothesis_budget import examples

pytestmark = pytest.mark.timeout(60)
VALID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@pytest.fixture()
def memory_keyring(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryKeyring]:
    backend = MemoryKeyring()
    with use_keyring(backend, monkeypatch):
        yield backend


@pytest.fixture()
def no_keyring(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with use_keyring(fail.Keyring(), monkeypatch):
        yield


GOOD = {
    "mcpServers": {
        "files": {"command": "npx", "args": ["-y", "server-fs", "/my dir"], "cwd": "/tmp"},
        "web": {"url": "https://example.com/mcp", "headers": {"X-Trace": "1"}},
        "off": {"command": "uvx", "args": ["thing"], "disabled": True},
        "typed": {"type": "streamable-http", "url": "http://127.0.0.1:9/mcp"},
    },
    "servers": {"vscode": {"type": "stdio", "command": "node", "args": ["x.js"]}},
}


def test_good_config_reads_every_kind() -> None:
    cfg = parse_config(json.dumps(GOOD))
    assert cfg.problems == ()
    by = {s.name: s for s in cfg.servers}
    assert list(by) == ["files", "web", "off", "typed", "vscode"]
    assert by["files"].transport == "stdio" and by["files"].args == ("-y", "server-fs", "/my dir")
    assert by["files"].display() == 'npx -y server-fs "/my dir"  (in /tmp)'
    assert by["web"].transport == "http" and by["web"].headers == (("X-Trace", "1"),)
    assert by["off"].disabled and by["typed"].transport == "http"
    assert by["vscode"].command == "node"


def test_bad_servers_each_give_a_problem_and_the_rest_load() -> None:
    servers: dict[str, Any] = {
        "ok": {"command": "node"},
        "sse": {"type": "sse", "url": "http://localhost/sse"},
        "ftp": {"url": "ftp://example.com"},
        "js": {"url": "javascript:alert(1)"},
        "argsbad": {"command": "x", "args": "not a list"},
        "nothing": {},
        "envbad": {"command": "x", "env": {"A=B": "1"}},
        "hdr": {"url": "https://x.org", "headers": {"X": "a\r\nInjected: 1"}},
        "long": {"command": "x" * 10_000},
        "nul": {"command": "a\x00b"},
        "\x1b[31mred": {"command": "x"},
        "notobj": 5,
        "dis": {"command": "x", "disabled": "yes"},
    }
    cfg = parse_config(json.dumps({"mcpServers": servers}))
    assert [s.name for s in cfg.servers] == ["ok"]
    assert len(cfg.problems) == len(servers) - 1
    text = "\n".join(cfg.problems)
    assert "only streamable HTTP" in text and "'sse'" in text
    assert "http:// or https://" in text and "'ftp'" in text
    assert "\x1b" not in text  # names are shown without control characters


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"\xff\xfe\x00garbage", b"[1, 2]", b'"text"', b"null", b"{}"],
)
def test_a_file_that_is_not_a_config_gives_one_problem_and_is_kept(
    tmp_path: Path, raw: bytes
) -> None:
    path = tmp_path / "mcp.json"
    path.write_bytes(raw)
    cfg = load_config(path)
    assert cfg.servers == () and len(cfg.problems) == 1
    assert move_secrets(path) == []
    assert path.read_bytes() == raw


def test_hostile_sizes_and_depth(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_bytes(b" " * (mcp_config.MAX_BYTES + 1))
    assert "larger" in load_config(path).problems[0] or load_config(path).problems
    deep = "[" * 5000 + "]" * 5000
    assert parse_config(deep).problems and parse_config(deep).servers == ()
    many = {"mcpServers": {f"s{i}": {"command": "x"} for i in range(500)}}
    cfg = parse_config(json.dumps(many))
    assert len(cfg.servers) == mcp_config.MAX_SERVERS and cfg.problems


def test_missing_file_is_no_servers_and_no_problem(tmp_path: Path) -> None:
    assert load_config(tmp_path / "mcp.json") == mcp_config.McpConfig()


def test_secrets_move_to_the_keyring(tmp_path: Path, memory_keyring: MemoryKeyring) -> None:
    path = tmp_path / "mcp.json"
    entry = {
        "stdio": {"command": "x", "env": {"GITHUB_TOKEN": "ghp_123", "LOG_LEVEL": "debug"}},
        "web": {"url": "https://x.org/mcp", "headers": {"Authorization": "Bearer abc"}},
        "ref": {"command": "x", "env": {"API_KEY": "${input:key}"}},
    }
    path.write_text(json.dumps({"mcpServers": entry}))
    notes = move_secrets(path)
    assert notes and "2 secret" in notes[0]
    on_disk = json.loads(path.read_text())["mcpServers"]
    assert on_disk["stdio"]["env"] == {"GITHUB_TOKEN": KEYRING, "LOG_LEVEL": "debug"}
    assert on_disk["web"]["headers"]["Authorization"] == KEYRING
    assert on_disk["ref"]["env"]["API_KEY"] == "${input:key}"
    assert "ghp_123" not in path.read_text() and "Bearer abc" not in path.read_text()
    cfg = load_config(path)
    env, missing = resolved("stdio", cfg.servers[0].env)
    assert env == {"GITHUB_TOKEN": "ghp_123", "LOG_LEVEL": "debug"} and missing == []
    assert resolved("web", cfg.servers[1].headers)[0] == {"Authorization": "Bearer abc"}
    assert move_secrets(path) == []  # nothing left to move
    memory_keyring.values.clear()
    assert resolved("stdio", cfg.servers[0].env)[1] == ["GITHUB_TOKEN"]


def test_without_a_keyring_the_file_stays_as_it_is(tmp_path: Path, no_keyring: None) -> None:
    path = tmp_path / "mcp.json"
    raw = json.dumps({"mcpServers": {"s": {"command": "x", "env": {"API_KEY": "k"}}}})
    path.write_text(raw)
    notes = move_secrets(path)
    assert len(notes) == 1 and "stay in the file, as no system keyring" in notes[0]
    # Not the API key's wording: the secrets are not "kept only until Lamplight quits".
    assert "API key" not in notes[0] and "quits" not in notes[0]
    assert path.read_text() == raw


def test_server_id_follows_what_runs_or_where_it_connects() -> None:
    def server_id(entry: dict[str, Any], name: str = "s") -> str:
        return parse_config(json.dumps({"mcpServers": {name: entry}})).servers[0].server_id()

    base = {"command": "x", "args": ["1"], "env": {"A": "1"}, "cwd": "/a"}
    assert server_id(base) == server_id(dict(base)) == server_id(base, "renamed")
    for change in ({"command": "y"}, {"args": ["2"]}, {"env": {"A": "2"}}, {"cwd": "/b"}):
        assert server_id({**base, **change}) != server_id(base), change
    web = {"url": "http://127.0.0.1:1/mcp", "headers": {"X": "1"}}
    assert server_id(web) == server_id({**web, "disabled": True})
    assert server_id(web) != server_id({**web, "url": "http://127.0.0.1:2/mcp"})
    assert server_id(web) != server_id({**web, "headers": {"X": "2"}})


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
_entry = st.dictionaries(
    st.sampled_from(["command", "args", "env", "cwd", "url", "headers", "type", "disabled"]),
    _json,
)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_json, st.dictionaries(st.sampled_from(["mcpServers", "servers"]), _json)))
def test_fuzz_random_json_trees(data: Any) -> None:
    cfg = parse_config(json.dumps(data))
    for s in cfg.servers:
        assert s.transport in ("stdio", "http")


_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]


@settings(max_examples=examples(40), deadline=None, suppress_health_check=_SLOW_OK)
@given(st.dictionaries(st.text(max_size=70), _entry, max_size=4))
def test_fuzz_server_entries(servers: dict[str, Any]) -> None:
    cfg = parse_config(json.dumps({"mcpServers": servers}))
    assert len(cfg.servers) + len(cfg.problems) >= len(servers)
    for s in cfg.servers:
        assert (s.transport == "http") == bool(s.url)
        assert s.transport == "http" or s.command.strip()


@settings(max_examples=examples(100), deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(raw: bytes) -> None:
    parse_config(raw)


def test_state_file_round_trip_and_damage(tmp_path: Path) -> None:
    path = tmp_path / "mcp_state.json"
    state = McpState(path)
    state.set_enabled("a", False)
    state.set_tool_enabled("a", "t", False)
    state.consent("a", "hash1")
    again = McpState(path)
    assert not again.enabled("a", True) and again.enabled("b", True)
    assert not again.tool_enabled("a", "t") and again.tool_enabled("a", "u")
    assert again.consented("a", "hash1") and not again.consented("a", "hash2")
    path.write_text("{damaged")
    fresh = McpState(path)
    assert fresh.enabled("a", True) and "set aside" in fresh.note
    assert (tmp_path / "mcp_state.json.bad").exists()


def test_approvals_round_trip_and_damage(tmp_path: Path) -> None:
    path = tmp_path / "mcp_approvals.json"
    store = ApprovalStore(path)
    store.remember("srv", "id1", "echo", "always_tool")
    store.remember("other", "id2", "x", "always_server")
    store.remember("srv", "id1", "add", "once")
    store.remember("srv", "id1", "add", "deny")
    store.remember("srv", "", "add", "always_tool")  # no configuration to name: not kept
    again = ApprovalStore(path)
    assert again.allowed("srv", "id1", "echo") and not again.allowed("srv", "id1", "add")
    assert again.allowed("other", "id2", "anything")
    assert not again.allowed("other", "id3", "anything")  # the name alone grants nothing
    assert again.rules() == [("srv", "id1", "echo"), ("other", "id2", "*")]
    again.forget(again.rules()[1])
    assert not ApprovalStore(path).allowed("other", "id2", "anything")
    path.write_bytes(b"\x00\xff not json")
    damaged = ApprovalStore(path)
    assert damaged.rules() == [] and damaged.note
    assert (tmp_path / "mcp_approvals.json.bad").exists()
    path.write_text('{"always": [["a"], ["a", 1, "t"], ["s", "i", "t"], "x"]}')
    assert ApprovalStore(path).rules() == [("s", "i", "t")]


def _tool(server: str, name: str) -> McpTool:
    return McpTool(server, name, name)


def test_qualified_names_on_a_clash() -> None:
    out = qualify(
        [
            ("a", [_tool("a", "echo"), _tool("a", "add")]),
            ("b b", [_tool("b b", "echo"), _tool("b b", "dots.in.name")]),
        ]
    )
    assert [t.qualified for t in out] == ["a__echo", "add", "b_b__echo", "dots_in_name"]


@settings(max_examples=examples(150), deadline=None)
@given(
    st.lists(
        st.tuples(st.text(min_size=1, max_size=80), st.lists(st.text(max_size=90), max_size=5)),
        max_size=5,
    )
)
def test_fuzz_qualified_names_are_unique_and_valid(spec: list[tuple[str, list[str]]]) -> None:
    lists = [(s, [_tool(s, n) for n in names]) for s, names in spec]
    out = qualify(lists)
    names = [t.qualified for t in out]
    assert len(names) == len(set(names))
    assert all(VALID.match(n) for n in names)
    assert VALID.match(sanitize(""))


def _listed(name: str, schema: dict[str, Any] | None = None) -> types.Tool:
    return types.Tool(name=name, input_schema=schema or {"type": "object"})


def test_tool_listing_is_bounded() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"x": deep}}
    huge = {"type": "object", "description": "y" * 100_000}
    listed = [_listed("ok"), _listed("deep", deep), _listed("huge", huge), _listed("ok")]
    tools, notes = bounded_tools("s", listed)
    assert [t.name for t in tools] == ["ok"]
    assert len(notes) == 3 and any("deep" in n for n in notes)
    many, notes = bounded_tools("s", [_listed(f"t{i}") for i in range(MAX_TOOLS + 10)])
    assert len(many) == MAX_TOOLS and notes


def test_results_become_bounded_text() -> None:
    big = types.CallToolResult(content=[types.TextContent(type="text", text="x" * (5 << 20))])
    out = tool_result(big, 1.0)
    assert len(out.text) < MAX_RESULT_CHARS + 100 and "more characters left out" in out.text
    img = types.ImageContent(type="image", data="A" * 16384, mime_type="image/png")
    out = tool_result(types.CallToolResult(content=[img], is_error=True), 1.0)
    assert out.text == "[image: image/png, 12 KB]" and out.is_error
    only = types.CallToolResult(content=[], structured_content={"a": 1})
    assert tool_result(only, 1.0).text == '{"a": 1}'
