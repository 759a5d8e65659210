"""One Lamplight per data folder: the folder lock, the hand-over of a later launch to the
window, ``serve`` and ``--smoke-test`` on a held folder, and (slow, real model) two
``lamplight`` launches on one folder keeping both launches' data."""

from __future__ import annotations

import importlib.util
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pytestqt.qtbot import QtBot

from app.chat.conversation import Conversation, Message
from app.chat.store import ConversationStore
from app.config.paths import data_dirs
from app.config.settings import AppSettings
from app.util.instance_lock import (
    LOCK_NAME,
    AlreadyRunning,
    Holder,
    acquire,
    channel_name,
    read_holder,
)
from tests.fakes.window import fake_window
from ui.window import single_instance
from ui.window.single_instance import (
    EXIT_HELD,
    Activation,
    InstanceServer,
    encode_request,
    parse_request,
)

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and sockets")

Holding = Callable[..., subprocess.Popen[str]]


@pytest.fixture()
def holding() -> Iterator[Holding]:
    """Start ``tests/instance_holder.py`` on a folder and wait until it holds it; every
    holder is killed at the end of the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(root: Path, mode: str, *extra: str) -> subprocess.Popen[str]:
        root.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.instance_holder", str(root), mode, *extra],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        procs.append(proc)
        line = read_line(proc, 30)
        assert json.loads(line) == {"held": proc.pid}, line
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next stdout line of ``proc`` within ``timeout`` s (AssertionError if none)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if sel.select(timeout):
            line = proc.stdout.readline()
            if line:
                return line
    proc.kill()
    _, err = proc.communicate(timeout=10)
    raise AssertionError(f"no line from pid {proc.pid} (exit {proc.returncode}): {err[-2000:]}")


def run_app(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m ui ARGS`` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "ui", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


# -- the lock ----------------------------------------------------------------------------


def test_a_second_lock_in_the_same_process_is_refused_until_released(tmp_path: Path) -> None:
    first = acquire(tmp_path, "window")
    assert first.held and not first.note
    with pytest.raises(AlreadyRunning) as caught:
        acquire(tmp_path, "serve")
    assert caught.value.holder == Holder(os.getpid(), "window", caught.value.holder.started)
    assert str(tmp_path) in str(caught.value) and "a window" in str(caught.value)
    first.release()
    first.release()  # twice: nothing
    with acquire(tmp_path, "serve") as again:
        assert again.held and read_holder(tmp_path).mode == "serve"
    assert (tmp_path / LOCK_NAME).exists()  # never deleted


def test_a_folder_held_by_another_process_is_refused_with_its_holder(
    tmp_path: Path, holding: Holding
) -> None:
    proc = holding(tmp_path, "serve")
    with pytest.raises(AlreadyRunning) as caught:
        acquire(tmp_path, "window")
    holder = caught.value.holder
    assert (holder.pid, holder.mode) == (proc.pid, "serve")
    assert holder.started is not None and abs(holder.started - time.time()) < 60
    assert f"lamplight serve, pid {proc.pid}" in str(caught.value)


@posix_only
def test_a_folder_held_by_a_killed_process_is_taken_over(tmp_path: Path, holding: Holding) -> None:
    proc = holding(tmp_path, "window")
    with pytest.raises(AlreadyRunning):
        acquire(tmp_path, "window")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert read_holder(tmp_path).pid == proc.pid  # the file still names the dead holder
    with acquire(tmp_path, "window") as lock:  # the OS let go of its lock: no guessing
        assert lock.held
        assert read_holder(tmp_path).pid == os.getpid()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\xff\xfe garbage",
        b"[1, 2]",
        b'{"pid": true, "mode": "window"}',
        b'{"pid": -4, "mode": "rm -rf", "started": "yesterday"}',
        b'{"pid": 99999999999, "mode": ["window"], "started": NaN}',
        b'{"pid": {"pid": {"pid": 1}}}',
        b'{"pid": 1, "mode": "window"' + b" " * 10_000 + b"}",
    ],
)
def test_a_damaged_lock_file_reads_as_an_unknown_holder(tmp_path: Path, content: bytes) -> None:
    (tmp_path / LOCK_NAME).write_bytes(content)
    holder = read_holder(tmp_path)
    assert holder.pid is None and holder.mode in ("", "window")
    assert holder.started is None
    assert "another Lamplight" in Holder().describe()
    with acquire(tmp_path, "window") as lock:  # and it does not stop a start
        assert lock.held and read_holder(tmp_path).pid == os.getpid()


@posix_only
@pytest.mark.parametrize("kind", ["folder", "fifo", "symlink"])
def test_a_lock_file_that_is_not_a_file_is_set_aside(tmp_path: Path, kind: str) -> None:
    path = tmp_path / LOCK_NAME
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(target)
    with acquire(tmp_path, "window") as lock:
        assert lock.held
        assert path.is_file() and not path.is_symlink()
        assert os.path.lexists(tmp_path / f"{LOCK_NAME}.bad")
    assert target.read_text() == "keep me"


def test_the_channel_name_is_per_folder_and_stable(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert channel_name(a) == channel_name(tmp_path / "b" / ".." / "a")
    assert channel_name(a) != channel_name(b)
    assert channel_name(a).startswith("lamplight-") and len(channel_name(a)) < 40


# -- the request -------------------------------------------------------------------------


def test_requests_round_trip(tmp_path: Path) -> None:
    model = tmp_path / "m o d é l.gguf"
    assert parse_request(encode_request(model).rstrip(b"\n")) == Activation(model)
    assert parse_request(encode_request(None).rstrip(b"\n")) == Activation(None)


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"hello",
        b"[]",
        b'{"activate": false}',
        b'{"activate": 1}',
        b'{"activate": true, "model": "relative.gguf"}',
        b'{"activate": true, "model": 7}',
        b'{"activate": true, "model": ""}',
        b'{"activate": true, "model": "/a\\u0000b.gguf"}',
        b'{"activate": true, "model": "/' + b"x" * 5000 + b'"}',
        b'{"activate": true, "model": {"a": {"b": {"c": 1}}}}',
        b"{" * 100_000,
    ],
)
def test_requests_that_are_not_understood(line: bytes) -> None:
    with pytest.raises(ValueError):
        parse_request(line)


@given(st.binary(max_size=300))
def test_any_bytes_give_a_request_or_value_error(raw: bytes) -> None:
    try:
        got = parse_request(raw)
    except ValueError:
        return
    assert got.model is None or got.model.is_absolute()


# -- the window's side, in process -------------------------------------------------------


def tiny_gguf(path: Path) -> Path:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "tiny")
    writer.add_name("Tiny")
    writer.add_tensor("token_embd.weight", np.zeros((3, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[InstanceServer]:
    srv = InstanceServer(channel_name(tmp_path / "server"))
    assert srv.listen() == ""
    yield srv
    srv.close()


HAND_OVER = """
import json, sys
from pathlib import Path
from app.util.instance_lock import Holder
from ui.window.single_instance import hand_over
model = Path(sys.argv[2]) if len(sys.argv) > 2 else None
print(json.dumps(hand_over(sys.argv[1], model, Holder())))
"""


def hand_over_from_a_process(qtbot: QtBot, name: str, model: Path | None) -> str | None:
    """``hand_over`` run by another process while this one's GUI thread serves; its result."""
    args = [sys.executable, "-c", HAND_OVER, name, *([str(model)] if model else [])]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        qtbot.waitUntil(lambda: proc.poll() is not None, timeout=30_000)
    finally:
        if proc.poll() is None:
            proc.kill()
        out, _ = proc.communicate(timeout=10)
    result: str | None = json.loads(out)
    return result


def test_a_later_launch_brings_the_window_forward_and_opens_its_model(
    qtbot: QtBot, tmp_path: Path, server: InstanceServer
) -> None:
    dirs = data_dirs(tmp_path / "data")
    win = fake_window(qtbot, tmp_path, dirs=dirs, shown=False, loaded=False)
    single_instance.install(win, server)
    win.showMinimized()
    first = tiny_gguf(tmp_path / "first.gguf")
    handed = tiny_gguf(tmp_path / "handed.gguf")
    with qtbot.waitSignal(win.modelReady, timeout=10_000):
        win.load_model(first)
    with qtbot.waitSignal(win.modelReady, timeout=10_000) as ready:
        assert hand_over_from_a_process(qtbot, server.name, handed) == ""
    assert ready.args[0].path == handed
    assert win.isVisible() and not win.isMinimized()
    saved = AppSettings.load_from(dirs.settings_file)
    assert saved.recent_models[:2] == [str(handed), str(first)]
    assert str(handed) in saved.imported_models
    # No model: only to the front.
    with qtbot.assertNotEmitted(win.modelReady, wait=300):
        assert hand_over_from_a_process(qtbot, server.name, None) == ""
    win.close()


def test_a_model_handed_over_during_a_load_opens_after_it(
    qtbot: QtBot, tmp_path: Path, server: InstanceServer
) -> None:
    dirs = data_dirs(tmp_path / "data")
    win = fake_window(qtbot, tmp_path, dirs=dirs, shown=False, loaded=False)
    single_instance.install(win, server)
    first = tiny_gguf(tmp_path / "first.gguf")
    handed = tiny_gguf(tmp_path / "handed.gguf")
    loaded: list[Path] = []
    win.modelReady.connect(lambda info: loaded.append(info.path))
    win.load_model(first)  # under way when the request comes
    server.activated.emit(Activation(handed))
    qtbot.waitUntil(lambda: loaded == [first, handed], timeout=10_000)
    win.close()


@posix_only
def test_the_server_lives_in_the_private_runtime_folder(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="xdg"))  # short: socket paths end at 107 bytes
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        name = single_instance.server_name(tmp_path)
        assert name == str(runtime / channel_name(tmp_path))
        srv = InstanceServer(name)
        got: list[object] = []
        srv.activated.connect(got.append)
        try:
            assert srv.listen() == ""
            assert (runtime / channel_name(tmp_path)).exists()
            assert hand_over_from_a_process(qtbot, name, None) == ""
            assert got == [Activation(None)]
        finally:
            srv.close()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert single_instance.server_name(tmp_path) == channel_name(tmp_path)


def test_a_closing_window_tells_the_launch_to_wait(
    qtbot: QtBot, tmp_path: Path, server: InstanceServer
) -> None:
    server.accepting = lambda: False
    with qtbot.assertNotEmitted(server.activated, wait=300):
        assert hand_over_from_a_process(qtbot, server.name, None) is None


@posix_only
def test_the_window_drops_garbage_and_silent_connections(
    qtbot: QtBot, server: InstanceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(single_instance, "READ_MS", 300)
    full = server._server.fullServerName()  # a socket file on POSIX
    got: list[object] = []
    server.activated.connect(got.append)

    def talk(data: bytes) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(full)
            s.setblocking(False)
            if data:
                s.sendall(data)
            reply = bytearray()

            def closed() -> bool:
                try:
                    chunk = s.recv(4096)
                except BlockingIOError:
                    return False
                reply.extend(chunk)
                return not chunk

            qtbot.waitUntil(closed, timeout=5000)
            return bytes(reply)

    assert json.loads(talk(b"not json\n")) == {"ok": False, "error": "not understood"}
    assert talk(b"x" * (single_instance.MAX_REQUEST + 10)) == b""  # too long: no answer
    assert talk(b"") == b""  # silent: dropped after READ_MS
    assert got == []
    assert json.loads(talk(encode_request(None))) == {"ok": True}
    assert got == [Activation(None)]


# -- launches on a held folder (subprocesses, no model) ----------------------------------


@posix_only
def test_a_second_launch_hands_its_model_to_the_window_and_exits(
    tmp_path: Path, holding: Holding
) -> None:
    data = tmp_path / "data"
    window = holding(data, "window", "--listen")
    model = tmp_path / "some model.gguf"
    t0 = time.monotonic()
    done = run_app("--data-dir", str(data), str(model))
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 < 30
    assert "already running" in done.stdout and str(model) in done.stdout
    assert json.loads(read_line(window, 10)) == {"model": str(model)}
    # Relative paths are made absolute where the launch ran; no model: only activation.
    done = subprocess.run(
        [sys.executable, "-m", "ui", "--data-dir", str(data), "--model", "rel.gguf"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**ENV, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(read_line(window, 10)) == {"model": str(tmp_path / "rel.gguf")}
    assert run_app("--data-dir", str(data)).returncode == 0
    assert json.loads(read_line(window, 10)) == {"model": None}
    # The launches wrote nothing in the folder: no log, no settings.
    assert sorted(p.name for p in data.iterdir()) == [LOCK_NAME, "logs", "models"]
    assert not any((data / "logs").iterdir())


def test_a_window_launch_on_a_folder_serve_holds_is_refused(
    tmp_path: Path, holding: Holding
) -> None:
    proc = holding(tmp_path / "data", "serve")
    t0 = time.monotonic()
    done = run_app("--data-dir", str(tmp_path / "data"), timeout=30)
    assert done.returncode == EXIT_HELD
    assert time.monotonic() - t0 < 20
    assert str(tmp_path / "data") in done.stderr
    assert f"lamplight serve, pid {proc.pid}" in done.stderr
    assert done.stdout == ""


def test_serve_on_a_folder_a_window_holds_is_refused(tmp_path: Path, holding: Holding) -> None:
    proc = holding(tmp_path / "data", "window")
    done = run_app("serve", "--data-dir", str(tmp_path / "data"), "--port", "0", timeout=30)
    assert done.returncode == EXIT_HELD
    assert done.stdout == ""  # no ready line
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("lamplight serve: Lamplight is already running on ")
    assert f"(a window, pid {proc.pid})" in line and "Local API server" in line


def test_smoke_test_on_a_held_folder_is_refused(tmp_path: Path, holding: Holding) -> None:
    holding(tmp_path / "data", "window")
    done = run_app("--smoke-test", "--data-dir", str(tmp_path / "data"), timeout=30)
    assert done.returncode == EXIT_HELD
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] is False and "already running" in result["error"]


def test_a_window_that_never_answers_is_reported(
    tmp_path: Path,
    holding: Holding,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proc = holding(tmp_path, "window")  # holds, but nothing listens
    monkeypatch.setattr(single_instance, "WAIT_S", 1.0)
    assert single_instance.claim(tmp_path, None) == EXIT_HELD
    err = capsys.readouterr().err
    assert f"a window, pid {proc.pid}" in err and "does not answer" in err


def test_a_launch_takes_the_folder_when_the_window_lets_go(
    tmp_path: Path, holding: Holding
) -> None:
    holding(tmp_path, "window", "--exit-after", "1.5")  # a window closing
    lock = single_instance.claim(tmp_path, None)
    assert not isinstance(lock, int)
    with lock:
        assert lock.held and read_holder(tmp_path).pid == os.getpid()


# -- two real launches on one folder (the real model) ------------------------------------


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def log_text(data: Path) -> str:
    path = data / "logs" / "lamplight.log"
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def saved(data: Path) -> AppSettings:
    try:
        return AppSettings.load_from(data / "settings.json")
    except Exception:  # being replaced, or not written yet
        return AppSettings()


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@posix_only
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama_cpp")
def test_a_second_lamplight_hands_over_and_both_launches_data_survive(
    tmp_path: Path, model_path: Path
) -> None:
    """The real app twice on one folder: the second opens no window, the first comes
    forward and opens the second's model; the first's conversation and settings and the
    second's model all end up saved. Then the first is killed, and a third launch takes
    the folder over (a crashed holder's socket name is reused)."""
    data = tmp_path / "data"
    dirs = data_dirs(data)
    store = ConversationStore(dirs.root)
    conv = Conversation(messages=[Message("user", "Keep me"), Message("assistant", "Kept.")])
    store.save(conv)
    transcript = store.transcript_path(conv.id).read_bytes()
    AppSettings(last_conversation=conv.id).save(dirs.settings_file)
    handed = tmp_path / "handed.gguf"
    handed.symlink_to(model_path)
    err = (tmp_path / "first.err").open("w")
    launch = [sys.executable, "-m", "ui", "--data-dir", str(data)]
    first = subprocess.Popen(
        [*launch, "--model", str(model_path)], cwd=ROOT, stderr=err, text=True, env=ENV
    )
    third: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: saved(data).model_path == str(model_path), 120, "the first window")
        assert "listening for later launches" in log_text(data)
        t0 = time.monotonic()
        second = run_app("--data-dir", str(data), str(handed))
        assert second.returncode == 0, second.stderr
        assert time.monotonic() - t0 < 30 and "already running" in second.stdout
        wait_for(lambda: saved(data).model_path == str(handed), 120, "the handed-over model")
        log = log_text(data)
        assert "a later launch on this data folder asked for the window" in log
        assert f"a later launch handed over the model {handed}" in log
        assert log.count("starting, data dir") == 1  # the second never started

        settings = saved(data)
        assert settings.recent_models[:2] == [str(handed), str(model_path)]
        assert settings.last_conversation == conv.id
        assert store.transcript_path(conv.id).read_bytes() == transcript
        assert first.poll() is None

        first.kill()  # a crash: the folder is taken over by the next launch
        first.wait(10)
        third = subprocess.Popen(launch, cwd=ROOT, stderr=err, text=True, env=ENV)
        wait_for(lambda: log_text(data).count("listening for later launches") == 2, 120, "third")
        assert third.poll() is None
    finally:
        stop(first)
        if third is not None:
            stop(third)
        err.close()
    assert saved(data).model_path == str(handed)
    assert store.transcript_path(conv.id).read_bytes() == transcript
