"""Tools (MCP servers): the settings page over a fake host (states, tools, token costs,
switches, consent, rules, pasted configs), the window's wiring, and one slow test with
the real host and the test server."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QApplication, QCheckBox, QLabel, QPushButton, QWidget
from pytestqt.qtbot import QtBot

from app.mcp.config import KEYRING, ServerConfig
from app.mcp.consent import consent_details
from app.mcp.tool_host import ServerStatus
from tests.fakes.engine import FakeEngine
from tests.fakes.mcp import FakeMcpHost, tool
from tests.fakes.window import WindowFactory, close_window
from tests.hypothesis_budget import examples
from ui.tools import mcp_control
from ui.tools.mcp_consent import consent_text, notice_text
from ui.tools.mcp_control import McpControl
from ui.tools.mcp_page import McpPage, prompt_cost, token_estimate
from ui.tools.mcp_paste import PasteDialog, PasteError, merge, parse_servers

FILES = ServerStatus(
    "files",
    "stdio",
    "npx -y @modelcontextprotocol/server-filesystem /tmp",
    True,
    "ready",
    tools=(
        tool("files", "read_file", "Read a <b>file</b> & more", path="string"),
        tool("files", "list_dir", "List a folder", path="string"),
    ),
    server_id="files-id",
)
WEB = ServerStatus(
    "web", "http", "https://example.invalid/mcp", True, "failed", "refused", server_id="web-id"
)
RUNNER_CONFIG = ServerConfig(
    "runner",
    "stdio",
    command="python",
    args=("tools.py", "--stdio"),
    cwd="/srv/t",
    env=(("ROOT_DIR", "/srv/data"), ("GITHUB_TOKEN", "ghp_s3cret"), ("API_KEY", KEYRING)),
)
RUNNER = ServerStatus(
    "runner",
    "stdio",
    RUNNER_CONFIG.display(),
    True,
    "consent",
    server_id=RUNNER_CONFIG.server_id(),
    details=consent_details(RUNNER_CONFIG),
)


@pytest.fixture()
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeMcpHost:
    host = FakeMcpHost([FILES, WEB, RUNNER], tmp_path)
    monkeypatch.setattr(mcp_control, "HOST_FACTORY", lambda _d: host)
    return host


@pytest.fixture()
def control(qtbot: QtBot, tmp_path: Path, fake_host: FakeMcpHost) -> Iterator[McpControl]:
    ctl = McpControl(tmp_path)
    yield ctl
    ctl.close()
    assert fake_host.closed


@pytest.fixture()
def page(qtbot: QtBot, control: McpControl) -> McpPage:
    control.host()
    p = McpPage(control)
    qtbot.addWidget(p)
    p.show()
    return p


def test_page_lists_servers_states_tools_and_token_costs(page: McpPage) -> None:
    assert list(page.boxes) == ["files", "web", "runner"]
    files = page.boxes["files"]
    assert files.switch.isChecked() and "ready" in files.state.text()
    assert "server-filesystem" in files.command.text()
    assert set(files.tool_switches) == {"read_file", "list_dir"}
    cost = token_estimate(FILES.tools[0])
    assert cost == round(len(json.dumps(FILES.tools[0].spec().openai())) / 4) > 10
    assert files.tool_tokens["read_file"].text() == f"≈ {cost} tokens"
    shown = [w for w in files.findChildren(QLabel) if "Read a" in w.text()]
    assert shown[0].text() == "Read a <b>file</b> & more"  # untrusted: shown as it is
    assert shown[0].textFormat() == Qt.TextFormat.PlainText
    web = page.boxes["web"]
    assert not web.error.isHidden() and web.error.text() == "refused"
    assert "#c62828" in web.dot.styleSheet()
    total, unknown = prompt_cost([FILES, WEB, RUNNER])
    assert unknown and total == sum(token_estimate(t) for t in FILES.tools)
    assert f"≈ {total} tokens to every prompt" in page.total.text()


def test_switches_go_to_the_host_and_the_page_follows(
    qtbot: QtBot, page: McpPage, fake_host: FakeMcpHost
) -> None:
    page.boxes["files"].tool_switches["list_dir"].click()
    assert fake_host.asked[-1] == ("tool", "files", "list_dir", False)
    only_read = token_estimate(FILES.tools[0])
    qtbot.waitUntil(lambda: f"≈ {only_read} tokens" in page.total.text())
    assert not page.boxes["files"].tool_switches["list_dir"].isChecked()
    page.boxes["files"].switch.click()
    assert fake_host.asked[-1] == ("server", "files", False)
    qtbot.waitUntil(lambda: "off" in page.boxes["files"].state.text())
    assert not page.boxes["files"].tool_switches["read_file"].isEnabled()
    page.boxes["web"].restart.click()
    assert fake_host.asked[-1] == ("restart", "web")
    qtbot.mouseClick(page.findChild(type(page.boxes["web"].restart), "mcpReload"), Qt.LeftButton)
    assert ("reload",) in fake_host.asked


def test_consent_shows_what_the_server_is_given_with_secrets_masked(
    qtbot: QtBot, page: McpPage, fake_host: FakeMcpHost
) -> None:
    panel = page.boxes["runner"].consent
    assert panel is not None
    text = panel.text.text()
    assert "wants to run this command:\npython tools.py --stdio  (in /srv/t)\n" in text
    assert "  ROOT_DIR=/srv/data" in text  # the values, not only the names
    assert "  GITHUB_TOKEN=•••••••• (hidden)" in text and "ghp_s3cret" not in text
    assert "  API_KEY=(kept in the keyring)" in text
    assert "of your own environment only: " in text and "PATH" in text
    assert panel.allow_button.text() == "Allow this command to run"
    panel.allow_button.click()  # names the configuration shown
    assert fake_host.asked[-1] == ("consent", "runner", RUNNER.server_id)
    qtbot.waitUntil(lambda: page.boxes["runner"].consent is None)
    assert "ready" in page.boxes["runner"].state.text()


def test_an_http_server_asks_too_and_an_edited_server_is_noticed_again(
    qtbot: QtBot, control: McpControl, fake_host: FakeMcpHost
) -> None:
    config = ServerConfig(
        "web", "http", url="https://example.invalid/mcp", headers=(("Authorization", "Bearer t0k"),)
    )
    web = replace(WEB, state="consent", error="", details=consent_details(config))
    text = consent_text(web)
    assert text.startswith("Tool server 'web' wants to connect to:\nhttps://example.invalid/mcp\n")
    assert "  Authorization: •••••••• (hidden)" in text and "t0k" not in text
    assert "wants to connect to: https://example.invalid/mcp" in notice_text(web)
    forged = replace(RUNNER, command="x\nIt runs in a sandbox.")  # a line break in mcp.json
    assert "\nIt runs in a sandbox." not in consent_text(forged)
    seen: list[list[ServerStatus]] = []
    control.consentNeeded.connect(seen.append)
    control.host()
    fake_host.servers = [web]
    control.proxy.tools(0.0)
    qtbot.waitUntil(lambda: len(seen) == 1)
    control.proxy.tools(0.0)  # the same server still waiting: no second note
    fake_host.servers = [replace(web, server_id="web-id-2")]  # edited in mcp.json
    control.proxy.tools(0.0)
    qtbot.waitUntil(lambda: len(seen) == 2)
    assert [batch[0].server_id for batch in seen] == ["web-id", "web-id-2"]


def test_forget_an_always_rule(qtbot: QtBot, page: McpPage, control: McpControl) -> None:
    control.approvals.remember("files", "files-id", "read_file", "always_tool")
    control.approvals.remember("web", "web-id", "*", "always_server")
    control.approvals.remember("web", "old-web-id", "*", "always_server")
    page.refresh()
    rows = [w for w in page.rules_box.findChildren(QLabel) if not w.isHidden()]
    texts = [w.text() for w in rows]
    assert "the tool read_file of files" in texts and "every tool of web" in texts
    assert "every tool of web (as configured before: it asks now)" in texts
    page.rules_box.findChildren(type(page.boxes["web"].restart), "mcpForget")[0].click()
    assert control.approvals.rules() == [("web", "web-id", "*"), ("web", "old-web-id", "*")]
    qtbot.waitUntil(lambda: len(page.rules_box.findChildren(QWidget, "mcpRule")) == 2)
    assert not control.approvals.allowed("files", "files-id", "read_file")


def test_open_mcp_json_names_the_file_where_nothing_opens_it(
    page: McpPage, control: McpControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "Open mcp.json" did nothing where no editor opens it (``openUrl`` False)
    and never said where the file is."""
    asked: list[QUrl] = []

    def nothing_opens(url: QUrl) -> bool:
        asked.append(url)
        return False

    monkeypatch.setattr(QDesktopServices, "openUrl", nothing_opens)
    page.findChild(QPushButton, "mcpOpenConfig").click()
    path = control.proxy.config_path
    assert path.is_file() and asked == [QUrl.fromLocalFile(str(path))]
    note = page.path_note
    assert note is not None and note.isVisible()
    assert "Nothing on this computer opened mcp.json" in note.text() and str(path) in note.text()
    QApplication.clipboard().clear()
    note.findChild(QPushButton, "copyPath").click()
    assert QApplication.clipboard().text() == str(path)
    note.close()
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda _url: True)
    page.findChild(QPushButton, "mcpOpenConfig").click()
    assert page.path_note is None


def test_paste_config_merges_and_refuses_garbage(
    qtbot: QtBot, page: McpPage, tmp_path: Path, fake_host: FakeMcpHost
) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"a": {"command": "x"}}, "other": 1}))
    dialog = page.paste_config()
    assert isinstance(dialog, PasteDialog)
    dialog.editor.setPlainText("this is not json {")
    dialog.add_button.click()
    assert dialog.isVisible() and "not usable JSON" in dialog.error.text()
    dialog.editor.setPlainText('{"mcpServers": {"a": {"command": "y"}}}')
    dialog.add_button.click()
    assert "different definition: a" in dialog.error.text()
    dialog.editor.setPlainText('"b": {"url": "ftp://nope"}')
    dialog.add_button.click()
    assert "http://" in dialog.error.text()
    dialog.editor.setPlainText('"b": {"command": "uvx", "args": ["thing"]},')
    dialog.add_button.click()
    assert not dialog.isVisible()
    data = json.loads(config.read_text())
    assert data["other"] == 1 and data["mcpServers"]["b"] == {"command": "uvx", "args": ["thing"]}
    assert ("reload",) in fake_host.asked and "Added: b" in page.message.text()


def test_paste_accepts_each_apps_shape(tmp_path: Path) -> None:
    vscode = '{"servers": {"v": {"type": "http", "url": "http://127.0.0.1:9/mcp"}}}'
    bare = '{"c": {"command": "node", "args": ["s.js"]}}'
    path = tmp_path / "mcp.json"
    assert merge(path, parse_servers(vscode)) == ["v"]
    assert merge(path, parse_servers(bare)) == ["c"]
    assert merge(path, parse_servers(bare)) == []  # the same again: nothing to add
    assert set(json.loads(path.read_text())["mcpServers"]) == {"v", "c"}


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda kids: (
                st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
            ),
            max_leaves=30,
        ).map(json.dumps),
        st.integers(1, 5000).map(lambda n: "[" * n),
    )
)
def test_pasted_garbage_never_breaks_the_config(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = tmp_path_factory.mktemp("paste") / "mcp.json"
    path.write_text('{"mcpServers": {"keep": {"command": "x"}}}')
    try:
        merge(path, parse_servers(text))
    except PasteError as exc:
        assert str(exc)
    data = json.loads(path.read_text())
    assert data["mcpServers"]["keep"] == {"command": "x"}


def test_chat_asking_for_tools_raises_the_consent_notice(
    qtbot: QtBot, make_window: WindowFactory, fake_host: FakeMcpHost
) -> None:
    win = make_window(FakeEngine(reply="ok"))
    (win.dirs.root / "mcp.json").write_text('{"mcpServers": {}}')
    assert win.tools.proxy.host is None  # nothing made before it is needed
    assert win.actions_by_name["mcp"].text() == "Tools (MCP servers)…"
    found: list[object] = []
    worker = threading.Thread(target=lambda: found.append(win.tools.proxy.tools(1.0)))
    worker.start()
    worker.join(5)
    assert [t.name for t in found[0]] == ["read_file", "list_dir"]  # type: ignore[attr-defined]
    qtbot.waitUntil(lambda: win.mcp.review.isVisible())
    assert "Tool server 'runner' wants to run: python tools.py" in (win.transcript.toPlainText())
    win.mcp.review.click()
    page = win.mcp.page
    assert page is not None and page.isVisible() and page.boxes["runner"].consent
    page.boxes["runner"].consent.allow_button.click()
    qtbot.waitUntil(lambda: not win.mcp.review.isVisible())
    win.tools.proxy.tools(1.0)  # asked again: no second notice for the same server
    close_window(qtbot, win)
    assert fake_host.closed
    assert win.transcript.toPlainText().count("wants to run") == 1


def test_the_window_starts_when_the_host_cannot_be_made(
    qtbot: QtBot, tmp_path: Path, make_window: WindowFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_d: Path) -> FakeMcpHost:
        raise ImportError("No module named 'mcp'")

    monkeypatch.setattr(mcp_control, "HOST_FACTORY", broken)
    root = tmp_path / "data"
    root.mkdir()
    (root / "mcp.json").write_text("{broken")
    win = make_window(FakeEngine(reply="ok"))
    qtbot.waitUntil(lambda: "unavailable" in win.transcript.toPlainText())
    assert win.tools.proxy.tools(1.0) == []
    result = win.tools.proxy.call("x", {}, 1.0)
    assert result.is_error
    page = win.mcp.show_page()
    assert "No module named 'mcp'" in page.problems.text()


def test_a_damaged_mcp_json_is_a_note_with_the_real_host(
    qtbot: QtBot, tmp_path: Path, make_window: WindowFactory
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "mcp.json").write_text('{"mcpServers": {"x": {"command": ')
    win = make_window(FakeEngine(reply="ok"))
    try:  # made at start, off the GUI thread, since a config exists
        qtbot.waitUntil(lambda: "Tool servers (mcp.json)" in win.transcript.toPlainText())
        assert win.tools.proxy.tools(1.0) == []
        page = win.mcp.show_page()
        assert "mcp.json" in page.problems.text() and not page.boxes
    finally:
        win.close()
        qtbot.waitUntil(lambda: win.closed, timeout=15_000)


MCP_SERVER = Path(__file__).resolve().parents[1] / "mcp_server.py"


@pytest.mark.skipif(not MCP_SERVER.exists(), reason="tests/mcp_server.py not written yet")
def test_real_host_shows_the_test_servers_tools_after_consent(qtbot: QtBot, tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "test": {"command": sys.executable, "args": [str(MCP_SERVER), "--stdio"]}
                }
            }
        )
    )
    ctl = McpControl(tmp_path)
    page = McpPage(ctl)
    qtbot.addWidget(page)
    try:
        ctl.host()
        page.show()
        assert ctl.proxy.tools(5.0) == []  # not allowed to run yet
        qtbot.waitUntil(
            lambda: page.boxes.get("test") is not None and page.boxes["test"].consent is not None,
            timeout=10_000,
        )
        page.boxes["test"].consent.allow_button.click()  # type: ignore[union-attr]
        ctl.proxy.tools(30.0)
        qtbot.waitUntil(lambda: bool(page.boxes["test"].tool_switches), timeout=30_000)
        box = page.boxes["test"]
        assert "ready" in box.state.text()
        assert all(label.text().startswith("≈ ") for label in box.tool_tokens.values())
        assert isinstance(next(iter(box.tool_switches.values())), QCheckBox)
    finally:
        ctl.close()
