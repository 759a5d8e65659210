"""Secrets are redacted from log lines, crash records and error messages (issue 40).

``app.util.redact``: URLs lose their user name, password and query/fragment values;
secret-looking pairs and Bearer/Basic credentials are masked; the handlers of
``ui.startup.setup_logging`` redact every record (third-party loggers' too) and the
per-request HTTP/MCP loggers write only warnings. Fuzzed: no planted secret survives
whatever surrounds it, and the time stays linear on hostile text.
"""

from __future__ import annotations

import io
import json
import logging
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from app.chat.conversation import Conversation
from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.chat.transcript_markdown import to_markdown
from app.config.paths import DataDirs
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ToolCall
from app.engine.metrics import MessageMetrics
from app.mcp.connection import describe
from app.mcp.host import McpHost
from app.util import crash_record, crash_recorder, crash_report
from app.util.redact import QUIET_LOGGERS, RedactFilter, redact_text, redact_url, secure_logging
from tests.fakes.keyring import MemoryKeyring, use_keyring
from tests.hypothesis_budget import examples
from tests.server_fixture import free_port
from tests.unit.chat.test_tool_round import Link, View
from tests.unit.mcp.test_mcp_host import open_host, running_http_server, stdio
from ui.startup import setup_logging

SECRET = "PLANTEDs3cret"


@pytest.mark.parametrize(
    ("text", "kept", "gone"),
    [
        (
            'HTTP Request: POST http://127.0.0.1:8/mcp?api_key=PLANTEDs3cret&v=2 "HTTP/1.1 200 OK"',
            ["http://127.0.0.1:8/mcp?api_key=***&v=***", '"HTTP/1.1 200 OK"'],
            [SECRET],
        ),
        ("https://me:PLANTEDs3cret@host:9/p#access_token=x1", ["https://***@host:9/p#"], [SECRET]),
        ("{'Authorization': 'Bearer PLANTEDs3cret'}", ["'Authorization': '***'"], [SECRET]),
        ("authorization: Basic PLANTEDs3cret==", ["authorization: ***"], [SECRET]),
        ('{"X-Api-Key": "PLANTEDs3cret", "n": 1}', ['"X-Api-Key": "***"', '"n": 1'], [SECRET]),
        ("env MY_API_KEY=PLANTEDs3cret PLAIN=p", ["MY_API_KEY=***", "PLAIN=p"], [SECRET]),
        ("key sk-PLANTEDs3cretPLANTEDs3cret", ["key ***"], [SECRET]),
        (
            "max_tokens=256 n_ctx: 2048 token budget",
            ["max_tokens=256 n_ctx: 2048 token budget"],
            [],
        ),
        ("key: ${keyring}", ["key: ${keyring}"], []),
        ("/home/me/models/gemma.gguf (llama-server at 127.0.0.1:8080)", ["gemma.gguf"], []),
    ],
)
def test_examples(text: str, kept: list[str], gone: list[str]) -> None:
    out = redact_text(text)
    assert all(k in out for k in kept), out
    assert not any(g in out for g in gone), out
    assert redact_text(out) == out  # idempotent: redacting twice changes nothing more


def test_redact_url_keeps_where_it_goes() -> None:
    assert redact_url("http://u:p@h:1/a/b?x=1&y&z=#f=2") == "http://***@h:1/a/b?x=***&***&z=#f=***"
    assert redact_url("http://h/a") == "http://h/a"


_WORDS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_SECRETS = st.text("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz0123456789", min_size=8)
_NAMES = st.sampled_from(["api_key", "token", "X-Auth-Token", "password", "SESSION_ID", "apiKey"])


@st.composite
def _planted(draw: st.DrawFn) -> tuple[str, str]:
    secret = draw(_SECRETS)
    name = draw(_NAMES)
    form = draw(st.integers(0, 5))
    host = draw(st.sampled_from(["127.0.0.1:8", "example.com", "[::1]:9", "h"]))
    token = [
        f"https://{host}/mcp?{name}={secret}",
        f"http://user:{secret}@{host}/",
        f"wss://{host}/x?a=1&{name}={secret}#frag",
        f"{name}={secret}",
        f'"{name}": "{secret}"',
        f"Authorization: Bearer {secret}",
    ][form]
    before, after = draw(_WORDS), draw(_WORDS)
    assume(secret not in before + " " + after)  # only the planted one counts
    return f"{before} {token} {after}", secret


@settings(max_examples=examples(200), deadline=None)
@given(_planted())
def test_no_planted_secret_survives(planted: tuple[str, str]) -> None:
    text, secret = planted
    assert secret not in redact_text(text)


@settings(max_examples=examples(100), deadline=None)
@given(_WORDS)
def test_any_text_redacts_without_error(text: str) -> None:
    assert redact_text(redact_text(text)) == redact_text(text)


@pytest.mark.parametrize(
    "hostile",
    [
        "a-" * 500_000,
        "x://" * 250_000,
        "k=v " * 250_000,
        "http://a?" + "&" * 1_000_000,
        "key:" * 250_000,
        "bearer" + " " * 1_000_000,
        ("a" * 127 + ":") * 8_000,
        "https://" + "@" * 1_000_000,
        "token=" * 200_000,
        "token:x, " * 120_000,
        "Request: " * 120_000,
    ],
)
def test_time_is_linear_on_hostile_text(hostile: str) -> None:
    start = time.monotonic()
    redact_text(hostile)
    assert time.monotonic() - start < 3.0


def test_the_filter_redacts_messages_arguments_and_tracebacks() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactFilter())
    logger = logging.getLogger("test_redact.filter")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("calling %s", f"http://h/mcp?api_key={SECRET}")
        try:
            raise ValueError(f"refused: Authorization: Bearer {SECRET}")
        except ValueError:
            logger.exception("failed")
        logger.error("broken %s %s", "one")  # a bad format still reaches the handler
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert "api_key=***" in written and "ValueError" in written
    assert SECRET not in written


@pytest.fixture()
def app_logging(tmp_path: Path) -> Iterator[Path]:
    """``setup_logging`` on a data folder; the root logger and levels restored after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    dirs = DataDirs(tmp_path / "data").create()
    assert setup_logging(dirs) == ""
    try:
        yield dirs.logs / "lamplight.log"
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, old in levels.items():
            logging.getLogger(name).setLevel(old)


def test_setup_logging_redacts_third_party_lines_and_quiets_request_logs(
    app_logging: Path,
) -> None:
    url = f"http://127.0.0.1:1/mcp?api_key={SECRET}"
    logging.getLogger("httpx2").info("HTTP Request: POST %s", url)  # per request: not written
    logging.getLogger("mcp.client.streamable_http").info("session at %s", url)
    logging.getLogger("httpx2").warning("retrying %s", url)
    logging.getLogger("app.mcp.connection").info("connected to %s", url)
    for handler in logging.getLogger().handlers:
        handler.flush()
    text = app_logging.read_text(encoding="utf-8")
    assert "HTTP Request" not in text and "session at" not in text
    assert "retrying http://127.0.0.1:1/mcp?api_key=***" in text
    assert "connected to http://127.0.0.1:1/mcp?api_key=***" in text
    assert SECRET not in text
    secure_logging()  # again: levels the user raised are kept, nothing doubles
    assert all(logging.getLogger(n).level >= logging.WARNING for n in QUIET_LOGGERS)


def test_describe_drops_the_url_secrets_of_http_errors() -> None:
    request = httpx2.Request("POST", f"https://me:pw@h/mcp?api_key={SECRET}")
    response = httpx2.Response(401, request=request)
    exc = httpx2.HTTPStatusError(
        "Client error '401' for url " + str(request.url), request=request, response=response
    )
    text = describe(exc)
    assert "HTTPStatusError" in text and "api_key=***" in text and SECRET not in text


def test_crash_records_keep_no_secret(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    recorder, _ = crash_record.begin(logs, "test", fault_handler=False)
    assert recorder is not None
    try:
        model = f"remote (OpenAI-compatible server at https://me:{SECRET}@h/v1?key={SECRET})"
        crash_record.set_step("prefill", model, {"n_ctx": 1}, (), {"conv": f"token={SECRET}"})
        marker = (logs / crash_recorder.MARKER_NAME).read_text(encoding="utf-8")
        assert "https://***@h/v1?key=***" in marker and SECRET not in marker
    finally:
        crash_record.end(recorder)
    old = crash_report.CrashReport(
        "decode", 1.0, 1.0, 7, "0", model=f"http://h/?api_key={SECRET}", request={"token": SECRET}
    )
    summary = crash_report.summary(old)  # a marker an older version wrote
    assert "api_key=***" in summary and "token=***" in summary and SECRET not in summary


# -- end to end: a data folder after real servers, calls, logs, a crash record, exports --

URL_KEY = "PLANTED-url-key-4f1"
HEADER_KEY = "PLANTED-header-9c2"
ENV_KEY = "PLANTED-env-7d3"


def test_planted_secrets_reach_no_file_in_the_data_folder(
    app_logging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = app_logging.parent.parent
    with use_keyring(MemoryKeyring(), monkeypatch), running_http_server() as url:
        web = f"{url}?api_key={URL_KEY}"
        servers = {
            "web": {"url": web, "headers": {"Authorization": f"Bearer {HEADER_KEY}"}},
            "local": {**stdio(), "env": {"MY_API_KEY": ENV_KEY}},
            "dead": {"url": f"http://127.0.0.1:{free_port()}/mcp?api_key={URL_KEY}"},
        }
        host = open_host(data, servers)
        recorder, _ = crash_record.begin(app_logging.parent, "test", fault_handler=False)
        try:
            crash_record.set_step("prefill", f"a model (server at {web})", {}, (), {"conv": "c"})
            conv = _two_calls_through_the_chat(data, host)
            exports = data / "exports"
            exports.mkdir()
            (exports / "chat.md").write_text(to_markdown(conv), encoding="utf-8")
            (exports / "chat.json").write_text(json.dumps(conv.to_dict()), encoding="utf-8")
            logging.getLogger("httpx2").warning("retrying %s", web)  # a third party's line
            for handler in logging.getLogger().handlers:
                handler.flush()
            assert "retrying " + url + "?api_key=***" in app_logging.read_text(encoding="utf-8")
            assert "failed" in next(s.error for s in host.statuses() if s.name == "dead")
            files = [p for p in data.rglob("*") if p.is_file() and p.name != "mcp.json"]
            assert {app_logging, exports / "chat.md"} <= set(files) and len(files) > 6
            for path in files:
                content = path.read_bytes()
                for secret in (URL_KEY, HEADER_KEY, ENV_KEY):
                    assert secret.encode() not in content, (path, secret)
            # mcp.json is the user's own file: its URL stays as written; the header and
            # the env var went to the keyring.
            config = (data / "mcp.json").read_text(encoding="utf-8")
            assert HEADER_KEY not in config and ENV_KEY not in config
        finally:
            crash_record.end(recorder)
            host.close()


def _two_calls_through_the_chat(data: Path, host: McpHost) -> Conversation:
    """A reply that calls a tool on each server, both allowed once, then answers."""
    posted: queue.Queue[Callable[[], None]] = queue.Queue()
    link, view = Link(), View()
    session = ChatSession(ConversationStore(data), link, view, tool_host=host, post=posted.put)

    def pump(until: Callable[[], bool]) -> None:
        end = time.monotonic() + 60
        while not until():
            posted.get(timeout=max(0.01, end - time.monotonic()))()

    assert session.send("Add twice.", SamplingParams())
    pump(lambda: len(link.calls) == 1)
    calls = [ToolCall("c1", "h_add", '{"a": 1, "b": 2}'), ToolCall("c2", "add", '{"a": 3, "b": 4}')]
    session.on_finished(1, "", MessageMetrics(), "", tool_calls=calls)
    assert session.decide("c1", "once") == "" and session.decide("c2", "once") == ""
    pump(lambda: len(link.calls) == 2)
    session.on_finished(2, "3 and 7.", MessageMetrics(), "")
    messages = session.conversation.messages
    assert [m.content for m in messages if m.role == "tool"] == ["3", "7"]
    return session.store.load(session.conversation.id)
