"""The crash record: the activity marker, the fault file, reading both back after a crash,
the engine thread's steps, and the chat session's side (the message saved first, answered
after). The window's notice and a real SIGSEGV mid-reply: ``tests/e2e/test_crash_recovery.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.chat.conversation import Conversation, Message
from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.local.crash_steps import EngineSteps, active_paths
from app.engine.metrics import MessageMetrics
from app.engine.native.paths import RiskyPath
from app.util import crash_record, previous_crash
from app.util.crash_recorder import CRASH_NAME, KEEP_CRASH_FILES, MARKER_NAME, PAGE, CrashRecorder
from app.util.crash_report import STEPS, CrashReport, Scalar, fault_in_native, parse_fault, summary
from app.util.previous_crash import MAX_FAULT_BYTES, read_previous
from tests.conftest import ROOT
from tests.model.test_hostile_files import FUZZ, mutated

# A process with a Python "engine" thread that marks a step and faults there (``engine``)
# or on the main thread (``main``), as a native crash would: faulthandler writes the record.
CHILD = r"""
import ctypes, sys, threading
from pathlib import Path
from app.util import crash_record

logs, where = Path(sys.argv[1]), sys.argv[2]
recorder, _ = crash_record.begin(logs, "9.9")
marked = threading.Event()

def engine():
    crash_record.set_step(
        "decode", "/models/m.gguf", {"n_ctx": 2048}, ["extra_bufts", "flash_attn"],
        {"kind": "chat", "conv": "abc123"},
    )
    marked.set()
    if where == "engine":
        ctypes.string_at(0)  # a read of address 0: SIGSEGV inside a native call
    threading.Event().wait()

threading.Thread(target=engine, name="lamplight-engine", daemon=True).start()
marked.wait(30)
if where == "main":
    ctypes.string_at(0)
"""


def crash_child(logs: Path, where: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(logs), where],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode < 0, proc.stderr  # killed by the signal, after the record
    return proc


@pytest.fixture()
def logs(tmp_path: Path) -> Path:
    folder = tmp_path / "logs"
    folder.mkdir()
    return folder


@pytest.fixture()
def recorder(logs: Path) -> Iterator[CrashRecorder]:
    """This process's recorder (faulthandler left as pytest set it)."""
    rec, report = crash_record.begin(logs, "9.9", fault_handler=False)
    assert rec is not None and report is None
    yield rec
    crash_record.end(rec)


def marker(logs: Path) -> dict[str, object]:
    data = json.loads((logs / MARKER_NAME).read_text())
    assert isinstance(data, dict)
    return data


def dead_pid() -> tuple[int, float]:
    """The pid and start time of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = psutil.Process(proc.pid).create_time()
    proc.wait(30)
    return proc.pid, start


def write_marker(logs: Path, **fields: object) -> None:
    pid, start = dead_pid()
    doc: dict[str, object] = {
        "version": 1,
        "pid": pid,
        "proc_start": start,
        "app": "9.9",
        "started": time.time() - 60,
        "step": "decode",
        "since": time.time() - 5,
        "model": "/models/m.gguf",
        "request": {"kind": "chat", "conv": "abc123"},
    }
    doc.update(fields)
    (logs / MARKER_NAME).write_text(json.dumps(doc))


# -- the marker's life ---------------------------------------------------------------------


def test_marker_follows_the_steps_and_a_clean_exit_leaves_nothing(
    logs: Path, recorder: CrashRecorder
) -> None:
    first = marker(logs)
    assert first["step"] == "start" and first["pid"] == os.getpid()
    assert recorder.fault_path is not None and recorder.fault_path.exists()
    assert CRASH_NAME.fullmatch(recorder.fault_path.name)
    crash_record.set_step(
        "prefill", "/m.gguf", {"n_ctx": 512}, ["extra_bufts"], {"kind": "chat", "conv": "c1"}
    )
    now = marker(logs)
    assert now["step"] == "prefill" and now["model"] == "/m.gguf"
    assert now["paths"] == ["extra_bufts"] and now["request"] == {"kind": "chat", "conv": "c1"}
    assert now["fault_log"] == recorder.fault_path.name
    assert [p.name for p in logs.iterdir() if p.name.endswith(".tmp")] == []
    crash_record.end(recorder)
    assert list(logs.iterdir()) == []  # the marker, and the fault file while empty
    assert crash_record.current() is None
    crash_record.set_step("decode")  # no recorder: nothing happens
    assert list(logs.iterdir()) == []


def test_a_step_change_is_cheap(logs: Path, recorder: CrashRecorder) -> None:
    request: dict[str, Scalar] = {"kind": "chat", "conv": "c1", "top_k": 40}
    load: dict[str, Scalar] = {
        "n_ctx": 4096,
        "n_threads": 2,
        "n_gpu_layers": 0,
        "kv_type": "f16",
    }
    t0 = time.perf_counter()
    for i in range(200):
        crash_record.set_step(("prefill", "decode")[i % 2], "/m.gguf", load, ["x"], request)
    mean_ms = (time.perf_counter() - t0) / 200 * 1000
    # Typically 0.04 ms (the JSON; the write is 2 µs), four or five a reply, none per
    # token. A temp file and a rename took 1.2-4 ms on ext4.
    assert mean_ms < 0.5, mean_ms
    assert len((logs / MARKER_NAME).read_bytes()) % PAGE == 0


def test_a_clean_exit_keeps_a_fault_file_that_has_something(
    logs: Path, recorder: CrashRecorder
) -> None:
    assert recorder.fault_path is not None
    recorder.fault_path.write_text("Fatal Python error: Aborted\n")
    crash_record.end(recorder)
    assert [p.name for p in logs.iterdir()] == [recorder.fault_path.name]


def test_old_crash_records_are_pruned(logs: Path) -> None:
    names = [f"crash-202601{d:02d}-120000-{100 + d}.log" for d in range(1, 16)]
    for name in names:
        (logs / name).write_text("Lamplight x closed unexpectedly.\n")
    (logs / "lamplight.log").write_text("kept")
    rec, _ = crash_record.begin(logs, "9.9", fault_handler=False)
    assert rec is not None and rec.fault_path is not None
    try:
        left = sorted(p.name for p in logs.iterdir() if CRASH_NAME.fullmatch(p.name))
        assert left == sorted([*names[-KEEP_CRASH_FILES:], rec.fault_path.name])
        assert (logs / "lamplight.log").exists()
    finally:
        crash_record.end(rec)


# -- after a crash ---------------------------------------------------------------------------


def test_a_fault_on_the_engine_thread_is_inside_llama_cpp(logs: Path) -> None:
    crash_child(logs, "engine")
    report, live = read_previous(logs)
    assert not live and report is not None
    assert (report.step, report.model, report.kind, report.conv_id) == (
        "decode",
        "/models/m.gguf",
        "chat",
        "abc123",
    )
    assert report.paths == ("extra_bufts", "flash_attn") and report.load == {"n_ctx": 2048}
    assert report.fault == "Segmentation fault" and report.in_native
    assert report.version == "9.9"
    assert not (logs / MARKER_NAME).exists()
    assert report.log_file is not None
    text = report.log_file.read_text()
    assert text.startswith("Lamplight 9.9 (pid ")
    assert "Step: decode (writing a reply)" in text and "Inside llama.cpp: yes" in text
    assert "Native paths in use: extra_bufts, flash_attn" in text
    assert "Current thread 0x" in text and "most recent call first" in text
    assert "in engine" in text  # the engine thread's own stack
    line = report.line(safe=True)
    assert line.startswith("Lamplight closed unexpectedly while writing a reply on ")
    assert line.endswith(". Your conversation is safe.")
    assert read_previous(logs) == (None, False)  # told once


def test_a_fault_on_another_thread_is_not_blamed_on_llama_cpp(logs: Path) -> None:
    crash_child(logs, "main")
    report, _ = read_previous(logs)
    assert report is not None and report.fault == "Segmentation fault"
    assert report.step == "decode" and not report.in_native


def test_a_kill_while_idle_is_not_reported(logs: Path) -> None:
    write_marker(logs, step="idle", fault_log="crash-20260101-120000-42.log")
    (logs / "crash-20260101-120000-42.log").write_text("")
    assert read_previous(logs) == (None, False)
    assert list(logs.iterdir()) == []


def test_a_kill_mid_reply_is_reported_without_stacks(logs: Path) -> None:
    write_marker(logs, fault_log="crash-20260101-120000-42.log")
    (logs / "crash-20260101-120000-42.log").write_text("")
    report, _ = read_previous(logs)
    assert report is not None and report.fault == "" and not report.in_native
    assert report.log_file is not None
    assert "none recorded" in report.log_file.read_text()
    assert report.line().startswith("Lamplight closed unexpectedly while writing a reply")


def test_a_live_process_keeps_its_marker(logs: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = psutil.Process(child.pid).create_time()
        write_marker(logs, pid=child.pid, proc_start=start)
        assert read_previous(logs) == (None, True)
        assert (logs / MARKER_NAME).exists()
        rec, report = crash_record.begin(logs, "9.9", fault_handler=False)
        assert (rec, report) == (None, None)  # the other process's record is left alone
        assert marker(logs)["pid"] == child.pid
    finally:
        child.kill()
        child.wait(30)
    report, live = read_previous(logs)  # now it is gone: its marker is a crash
    assert not live and report is not None and report.step == "decode"


def test_a_marker_of_this_pid_is_from_an_earlier_process(logs: Path) -> None:
    write_marker(logs, pid=os.getpid(), proc_start=psutil.Process().create_time())
    report, live = read_previous(logs)
    assert not live and report is not None


def test_words_for_each_step() -> None:
    def line(step: str, **kw: object) -> str:
        return CrashReport(step, 1.7e9, 1.7e9, 1, "1", **kw).line()  # type: ignore[arg-type]

    assert "while loading big.gguf on " in line("load", model="/x/big.gguf")
    assert "while reading your message" in line("prefill")
    assert "while writing a reply to the local API" in line("decode", request={"kind": "api"})
    assert "while restoring a conversation's saved cache" in line("restore")
    assert "while starting on " in line("start")
    assert line("idle").startswith("Lamplight closed unexpectedly on ")
    assert "was not saved" in CrashReport("decode", 1.7e9, 1.7e9, 1, "1").line(safe=False)


def test_fault_text_is_parsed_defensively() -> None:
    text = (
        "Fatal Python error: Aborted\n\n"
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/x/threading.py", line 1 in wait\n\n'
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/venv/site-packages/llama_cpp/llama.py", line 9 in __init__\n'
        '  File "/app/app/engine/loader.py", line 3 in open_llama\n\n'
        "Extension modules: x (total: 1)\n"
    )
    fault = parse_fault(text)
    assert fault is not None and fault.error == "Aborted" and fault.current == 0x7F0000000002
    assert fault.top_frames == (
        "/venv/site-packages/llama_cpp/llama.py",
        "/app/app/engine/loader.py",
    )
    assert fault_in_native(fault, 0, "load")  # llama_cpp innermost
    assert fault_in_native(fault, 0x7F0000000002, "decode")
    assert not fault_in_native(parse_fault(text.replace("llama_cpp", "x")), 0, "")  # type: ignore[arg-type]
    assert parse_fault("nothing here") is None
    assert parse_fault("Fatal Python error: x\nCurrent thread 0xZZ") is not None


def test_a_huge_or_strange_fault_file_is_read_in_bounds(logs: Path) -> None:
    name = "crash-20260101-120000-42.log"
    big = b"Fatal Python error: Segmentation fault\n" + b"\x00\xff" * 3_000_000
    (logs / name).write_bytes(big)
    write_marker(logs, fault_log=name)
    t0 = time.monotonic()
    report, _ = read_previous(logs)
    assert time.monotonic() - t0 < 2.0
    assert report is not None and report.fault == "Segmentation fault"
    assert (logs / name).stat().st_size < MAX_FAULT_BYTES * 4


@pytest.mark.parametrize(
    "name", ["../settings.json", "/etc/passwd", "crash-1.log", "lamplight.log", 7, None]
)
def test_a_marker_never_points_outside_its_own_crash_files(logs: Path, name: object) -> None:
    (logs / "lamplight.log").write_text("a log")
    write_marker(logs, fault_log=name)
    report, _ = read_previous(logs)
    assert report is not None and report.log_file is None
    assert (logs / "lamplight.log").read_text() == "a log"


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b"[]", b'{"version": 2}', b"\xff\xfe{}", b"[" * 100_000, b" " * 70_000],
)
def test_a_damaged_marker_is_dropped(logs: Path, content: bytes) -> None:
    (logs / MARKER_NAME).write_bytes(content)
    assert read_previous(logs) == (None, False)
    assert not (logs / MARKER_NAME).exists()


def test_a_marker_that_is_a_fifo_or_a_folder_does_not_stop_the_start(logs: Path) -> None:
    os.mkfifo(logs / MARKER_NAME)
    rec, report = crash_record.begin(logs, "9.9", fault_handler=False)
    assert report is None and rec is not None
    crash_record.end(rec)
    (logs / MARKER_NAME).mkdir()
    rec, report = crash_record.begin(logs, "9.9", fault_handler=False)  # writes fail: logged
    assert report is None and rec is not None
    crash_record.end(rec)


def _real_marker() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        rec = CrashRecorder(logs, "9.9")
        rec.start(fault_handler=False)
        rec.set_step(
            "decode",
            "/models/m.gguf",
            {"n_ctx": 2048, "flash_attn": False, "kv_type": "f16"},
            ["extra_bufts"],
            {"kind": "chat", "conv": "abc123", "temperature": 0.7},
        )
        raw = (logs / MARKER_NAME).read_bytes()
        rec.close()
    doc = json.loads(raw)
    doc["pid"] = 2**31 - 7  # no such process
    return json.dumps(doc).encode()


REAL_MARKER = _real_marker()


@FUZZ
@given(data=st.data())
def test_fuzz_marker(data: st.DataObject) -> None:
    content = data.draw(mutated(REAL_MARKER))
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        (logs / MARKER_NAME).write_bytes(content)
        t0 = time.monotonic()
        report, live = read_previous(logs)
        assert time.monotonic() - t0 < 2.0
        assert not live
        assert not (logs / MARKER_NAME).exists()
        if report is not None:
            assert report.step in STEPS
            assert all(isinstance(v, (str, int, float, bool)) for v in report.request.values())
            assert all(previous_crash._PATH_NAME.fullmatch(p) for p in report.paths)
            assert report.log_file is None or report.log_file.parent == logs
            one = report.line(safe=True)
            assert "\n" not in one and len(one) < 1000
            summary(report)


# -- the engine thread's steps ----------------------------------------------------------------


def test_active_paths_follow_the_load_settings() -> None:
    cpu = LoadConfig()
    assert active_paths(cpu, gpu_build=False) == (RiskyPath.EXTRA_BUFTS,)
    flash = LoadConfig(kv_type="q8_0")
    assert RiskyPath.FLASH_ATTN in active_paths(flash, gpu_build=False)
    gpu = LoadConfig(n_gpu_layers=-1)
    assert RiskyPath.GPU_OFFLOAD in active_paths(gpu, gpu_build=True)
    assert RiskyPath.GPU_OFFLOAD not in active_paths(gpu, gpu_build=False)
    off = frozenset({RiskyPath.EXTRA_BUFTS})
    assert RiskyPath.EXTRA_BUFTS not in active_paths(cpu, False, off)


def test_a_reply_writes_a_few_steps_and_none_per_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, str, dict[str, object] | None]] = []

    def record(
        step: str, model: str = "", load: object = None, paths: object = (), request: object = None
    ) -> None:
        calls.append((step, model, dict(request) if isinstance(request, dict) else None))

    monkeypatch.setattr(crash_record, "set_step", record)
    steps = EngineSteps()
    from tests.fakes.engine import FakeEngine

    info = FakeEngine().load("/models/m.gguf", LoadConfig())
    steps.loading("/models/m.gguf", LoadConfig(), False)
    steps.loaded(info, LoadConfig(), False)
    with steps.during():
        steps.reply("chat", "c1", SamplingParams.greedy(8))
        for _ in range(50):
            steps.decoding()
        steps.mark("prewarm")
        with steps.during("save"):
            pass
    assert [c[0] for c in calls] == ["load", "prefill", "decode", "prewarm", "save", "idle"]
    assert all(c[1] == "/models/m.gguf" for c in calls)
    assert calls[2][2] is not None and calls[2][2]["conv"] == "c1"
    assert calls[2][2]["temperature"] == 0.0
    assert calls[-1][2] is None  # idle: no request


# -- the session: the message on disk first, answered later -----------------------------------


class Link:
    """An ``EngineLink`` that checks, when a reply is queued, what is on disk."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store
        self.on_disk: list[list[str]] = []
        self.sent: list[list[ChatMessage]] = []

    def generate(
        self, conv_id: str, messages: Sequence[ChatMessage], params: SamplingParams
    ) -> int:
        path = self.store.transcript_path(conv_id)
        self.on_disk.append(
            [m.content for m in self.store.load(conv_id).messages] if path.exists() else []
        )
        self.sent.append(list(messages))
        return len(self.sent)

    def stop(self) -> None: ...
    def reset(self) -> None: ...
    def restore_snapshot(self, conv_id: str) -> None: ...
    def drop_snapshot(self, conv_id: str) -> None: ...


class View:
    def __getattr__(self, name: str) -> object:
        return lambda *a, **k: None


def test_the_message_is_on_disk_before_the_reply_is_queued(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    link = Link(store)
    session = ChatSession(store, link, View())  # type: ignore[arg-type]
    assert session.send("Is this saved?", SamplingParams())
    assert link.on_disk == [["Is this saved?"]]


def test_a_message_left_unanswered_is_answered_not_dropped(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = Conversation()
    conv.messages = [
        Message("user", "First?"),
        Message("assistant", "First."),
        Message("user", "Second?"),  # the app closed while this was answered
    ]
    store.save(conv)
    link = Link(store)
    session = ChatSession(store, link, View())  # type: ignore[arg-type]
    session.open(conv.id, restore=False)
    # Regenerate would answer "First?" again and drop "Second?": it answers "Second?".
    assert session.regenerate(SamplingParams())
    assert [m.content for m in link.sent[-1]] == ["First?", "First.", "Second?"]
    session.on_cancelled(1, "", MessageMetrics(stop_reason="cancelled"))  # before a token
    assert [m.content for m in session.conversation.messages] == ["First?", "First.", "Second?"]
    assert session.answer_pending(SamplingParams())
    session.on_tokens(2, "Second.")
    session.on_finished(2, "Second.", MessageMetrics(stop_reason="eos"))
    saved = [(m.role, m.content) for m in store.load(conv.id).messages]
    assert saved[-2:] == [("user", "Second?"), ("assistant", "Second.")]
    assert not session.answer_pending(SamplingParams())  # nothing left unanswered


def test_a_new_message_after_an_unanswered_one_keeps_both(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = Conversation()
    conv.messages = [Message("user", "Lost?")]
    store.save(conv)
    link = Link(store)
    session = ChatSession(store, link, View())  # type: ignore[arg-type]
    session.open(conv.id, restore=False)
    assert session.send("And this.", SamplingParams())
    assert [m.content for m in link.sent[-1]] == ["Lost?\n\nAnd this."]
    assert link.on_disk[-1] == ["Lost?\n\nAnd this."]
