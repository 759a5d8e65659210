"""McpHost with real MCP servers (tests/mcp_server.py) over stdio and streamable HTTP."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from app.mcp.connection import Limits
from app.mcp.host import McpHost
from tests.fakes.keyring import MemoryKeyring, use_keyring
from tests.server_fixture import free_port

pytestmark = pytest.mark.timeout(90)
SERVER = str(Path(__file__).resolve().parents[2] / "mcp_server.py")
FAST = Limits(start_timeout_s=20.0, backoff_s=0.2, backoff_cap_s=1.0, max_restarts=2)


def stdio(*flags: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [SERVER, "--stdio", *flags]}


def write_config(data_dir: Path, servers: dict[str, Any]) -> None:
    (data_dir / "mcp.json").write_text(json.dumps({"mcpServers": servers}))


def open_host(data_dir: Path, servers: dict[str, Any], consent: bool = True) -> McpHost:
    write_config(data_dir, servers)
    host = McpHost(data_dir, FAST)
    if consent:
        for name in servers:
            allow(host, name)
    return host


def allow(host: McpHost, name: str) -> None:
    """Consent to server ``name`` as the host has it configured now."""
    host.consent(name, next(s.server_id for s in host.statuses() if s.name == name))


@pytest.fixture()
def pair(tmp_path: Path) -> Iterator[McpHost]:
    """Two stdio servers with the same tools (a clash)."""
    host = open_host(tmp_path, {"a": stdio(), "b": stdio()})
    try:
        yield host
    finally:
        host.close()


def _state(host: McpHost, name: str) -> str:
    return next(s.state for s in host.statuses() if s.name == name)


def _wait(cond: Any, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_lists_tools_with_qualified_names_on_a_clash(pair: McpHost) -> None:
    tools = {t.qualified: t for t in pair.tools(30)}
    assert {"a__add", "b__add", "a__echo", "b__echo"} <= set(tools)
    assert tools["a__add"].name == "add" and tools["a__add"].server == "a"
    assert tools["a__add"].spec().parameters["required"] == ["a", "b"]
    assert [s.state for s in pair.statuses()] == ["ready", "ready"]
    ok = pair.call("a__add", {"a": 2, "b": 3}, 10)
    assert ok.text == "5" and not ok.is_error and ok.structured == {"result": 5} and ok.ms > 0
    err = pair.call("b__fail", {}, 10)
    assert err.is_error and "always fails" in err.text
    assert pair.call("a__structured", {}, 10).structured == {"answer": 42, "items": [1, 2]}
    assert "[image: image/png, 72 bytes]" in pair.call("a__image", {}, 10).text
    assert pair.call("nope", {}, 10).is_error
    bad = pair.call("a__add", {"a": "x"}, 10)
    assert bad.is_error


def test_timeout_and_cancel(pair: McpHost) -> None:
    pair.tools(30)
    out = pair.call("a__slow", {"seconds": 30}, 0.5)
    assert out.is_error and out.text == "The tool did not answer within 0.5 s."
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    start = time.monotonic()
    out = pair.call("b__slow", {"seconds": 30}, 30, cancel)
    assert out.is_error and out.text == "Cancelled."
    assert time.monotonic() - start < 0.3 + 0.5
    assert pair.call("a__echo", {"text": "still here"}, 10).text == "still here"


def test_switching_tools_and_servers_off(pair: McpHost) -> None:
    pair.tools(30)
    seen: list[int] = []
    pair.subscribe(lambda: seen.append(1))
    pair.set_tool_enabled("a", "echo", False)
    assert "a__echo" not in {t.qualified for t in pair.tools(5)}
    assert pair.call("a__echo", {"text": "x"}, 5).is_error
    pair.set_tool_enabled("a", "echo", True)
    pair.set_server_enabled("b", False)
    _wait(lambda: _state(pair, "b") == "off")
    assert not any(t.server == "b" for t in pair.tools(5))
    pair.set_server_enabled("b", True)
    assert any(t.server == "b" for t in pair.tools(30))
    assert seen


def test_consent_gates_stdio_servers_and_starts_lazily(tmp_path: Path) -> None:
    host = open_host(tmp_path, {"s": stdio()}, consent=False)
    try:
        assert _state(host, "s") == "consent"
        assert host.tools(0.5) == []
        assert not _our_servers()
        allow(host, "s")
        assert _state(host, "s") == "idle"  # lazily: nothing runs until tools are wanted
        assert host.tools(30) and _state(host, "s") == "ready"
        write_config(tmp_path, {"s": stdio("--prefix", "p_")})  # an edited command asks again
        host.reload()
        _wait(lambda: _state(host, "s") == "consent")
        allow(host, "s")
        assert {t.qualified for t in host.tools(30)} >= {"p_add", "p_echo"}
    finally:
        host.close()


def _our_servers() -> list[psutil.Process]:
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if SERVER in p.cmdline():
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_crash_mid_call_restarts_then_fails(tmp_path: Path) -> None:
    host = open_host(tmp_path, {"s": stdio()})
    try:
        host.tools(30)
        out = host.call("crash", {}, 20)
        assert (
            out.is_error and "failed during the call" in out.text and "about to crash" in out.text
        )
        assert host.call("add", {"a": 1, "b": 1}, 30).text == "2"  # restarted
        for _ in range(3):
            host.call("crash", {}, 30)
            host.tools(30)
        _wait(lambda: _state(host, "s") == "failed", 30)
        assert "about to crash" in next(s.error for s in host.statuses())
    finally:
        host.close()


def test_garbage_on_stdout_is_a_clear_error(tmp_path: Path) -> None:
    host = open_host(tmp_path, {"g": stdio("--garbage")})
    try:
        start = time.monotonic()
        assert host.tools(30) == []
        _wait(lambda: _state(host, "g") == "failed", 30)
        assert time.monotonic() - start < 20
        assert "not MCP" in next(s.error for s in host.statuses())
    finally:
        host.close()


def test_a_server_that_exits_shows_its_stderr(tmp_path: Path) -> None:
    host = open_host(tmp_path, {"x": stdio("--exit-at-start"), "y": {"command": "/no/such/cmd"}})
    try:
        host.tools(20)
        _wait(lambda: _state(host, "x") == "failed" and _state(host, "y") == "failed")
        errors = {s.name: s.error for s in host.statuses()}
        assert "no configuration" in errors["x"]
        assert "not found" in errors["y"]
    finally:
        host.close()


def test_close_ends_the_process_tree(tmp_path: Path) -> None:
    host = open_host(tmp_path, {"s": stdio()})
    try:
        host.tools(30)
        server = host.call("pid", {}, 10)
        child = host.call("spawn_child", {}, 10)
        pids = [int(server.text), int(child.text)]
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        host.close()
    _wait(lambda: not any(_running(p) for p in pids), 5)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture()
def http_server() -> Iterator[str]:
    with running_http_server() as url:
        yield url


@contextlib.contextmanager
def running_http_server(prefix: str = "h_", *flags: str) -> Iterator[str]:
    """The test server over streamable HTTP on 127.0.0.1 (its URL), with ``flags`` for
    it; stopped on exit."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, SERVER, "--http", str(port), "--prefix", prefix, *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        end = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < end, "server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_streamable_http_round_trip(tmp_path: Path, http_server: str) -> None:
    host = open_host(tmp_path, {"web": {"url": http_server, "headers": {"X-Test": "1"}}})
    try:
        assert _state(host, "web") == "idle"  # allowed by open_host
        tools = {t.qualified for t in host.tools(30)}
        assert {"h_add", "h_echo"} <= tools
        assert host.call("h_add", {"a": 20, "b": 22}, 10).text == "42"
        assert host.call("h_fail", {}, 10).is_error
        out = host.call("h_slow", {"seconds": 30}, 0.5)
        assert out.is_error and "did not answer" in out.text
    finally:
        host.close()


def test_secret_env_goes_to_the_keyring_and_back_to_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory_keyring = MemoryKeyring()
    with use_keyring(memory_keyring, monkeypatch):
        _secret_round_trip(tmp_path, memory_keyring)


def _secret_round_trip(tmp_path: Path, memory_keyring: MemoryKeyring) -> None:
    server = {**stdio(), "env": {"MY_API_KEY": "s3cret-value", "PLAIN": "p"}}
    host = open_host(tmp_path, {"s": server})
    try:
        assert "s3cret-value" not in (tmp_path / "mcp.json").read_text()
        assert memory_keyring.values[("Lamplight", "mcp:s:MY_API_KEY")] == "s3cret-value"
        host.tools(30)
        assert host.call("getenv", {"name": "MY_API_KEY"}, 10).text == "s3cret-value"
        assert host.call("getenv", {"name": "PLAIN"}, 10).text == "p"
    finally:
        host.close()
