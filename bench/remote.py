"""Models on a llama-server: what Lamplight's remote backend costs, and what it saves.

Starts one real llama-server (``tests/server_fixture.running_llama_server``: the
binary built from the llama.cpp that llama-cpp-python vendors) on 127.0.0.1 with
the default model, n_ctx 4096, 2 threads, ``--swa-full``, ``--slot-save-path``,
flash attention off and batch 512 (the in-process engine's settings), and
``--cache-ram 0`` (no host-memory prompt cache, so an erased slot is really
empty). Three measurements, each against a baseline taken in the same run:

* ``ratio``: decode tok/s as Lamplight sees it through ``LlamaServerBackend``
  (``MessageMetrics.decode_tok_s``, from the arrival time of each streamed
  token) ÷ the server's own ``timings.predicted_per_second`` for the same reply
  (``metrics.native_decode_tok_s``). Greedy replies of ``--tokens``; the median
  of the per-reply ratios. Each reply is followed by the same one asked of the
  server plainly (same token ids, non-streamed): ``streamed_vs_alone`` is the
  client's rate ÷ that, the cost of streaming to a client on the same machine.
* ``resume_speedup``: a chat of about 2,000 tokens, saved with
  ``export_state(key)`` (the server writes the slot to its ``--slot-save-path``).
  Per round, alternately: (a) slot erased, a fresh backend connected (not
  timed), then from ``import_state`` (``/props`` check + ``/slots?action=restore``)
  to the first token of the reply to a new user turn; (b) slot erased, from
  ``generate`` on the same messages to the first token (the server evaluates the
  whole chat). The evaluated and cached token counts of both are reported.
* ``inprocess_vs_server``: the in-process app path (``MainWindow`` → ``EngineClient``
  worker thread → queued signals → transcript, offscreen Qt, as in
  ``bench/decode_overhead.py``) in a child process, versus the same llama-server
  on the same model, threads and context, sent the same prompt (the token ids
  the app's engine evaluated, recorded in the child) non-streamed; app tok/s (first to last token
  arrival on the GUI thread) ÷ server tok/s (its ``timings``). Rounds alternate,
  and the order within a round flips each round. Each side runs alone: the other
  one is idle (the child waits on its stdin with the model loaded, the server has
  no request), and the CPU time each idle side used during the other's rounds is
  read from ``/proc`` and reported (``idle_cpu_s``).

Prints one JSON object. Usage:
  python bench/remote.py [--quick] [--tokens 200] [--replies 6] [--rounds 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished, Token
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics
from app.models.default_model import ensure_default_model
from app.remote.connection import Connection
from app.remote.llama_server.backend import LlamaServerBackend
from app.remote.llama_server.wire import sampling_fields
from bench.guarded import use_native_guard

ROOT = Path(__file__).resolve().parent.parent
N_CTX = 4096
CONV_KEY = "bench-remote"
START_TIMEOUT_S = 120.0  # the app process: Qt, the window and the model
ROUND_TIMEOUT_S = 120.0  # one app reply
FOLLOW_UP = "Now say it again in one short sentence."
# The same prompt as bench/decode_overhead.py (the app side reuses its round).
PROMPT = "Write a long story about a lighthouse keeper and the sea."
SERVER_FLAGS = (
    "--flash-attn", "off",  # the in-process engine's default (LoadConfig.flash_attn)
    "--batch-size", "512",  # LoadConfig.n_batch, used as n_ubatch too
    "--ubatch-size", "512",
    "--cache-ram", "0",  # no host-memory prompt cache: an erased slot is empty
)  # fmt: skip


def post(url: str, path: str, body: Any, timeout: float = 600.0) -> Any:
    """A JSON POST with the standard library (the baseline uses no Lamplight code)."""
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def cpu_seconds(pid: int, tid: int = 0) -> float:
    """User + system CPU time of process ``pid`` (all its threads, or only thread ``tid``)
    so far; NaN without /proc."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(pid: int, quiet_s: float = 0.005, limit_s: float = 5.0) -> float:
    """Wait until process ``pid`` uses under ``quiet_s`` CPU in 100 ms (its threads
    done spinning, its saves written); returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        before = cpu_seconds(pid)
        time.sleep(0.1)
        used = cpu_seconds(pid) - before
        if not used > quiet_s:  # NaN (no /proc): nothing to wait for
            break
    return time.monotonic() - t0


def run_reply(
    backend: LlamaServerBackend, messages: list[ChatMessage], params: SamplingParams
) -> Finished:
    for event in backend.generate(messages, params):
        if isinstance(event, Finished):
            return event
    raise RuntimeError("no Finished event")


def first_token_ms(
    backend: LlamaServerBackend, messages: list[ChatMessage], params: SamplingParams, t0: float
) -> tuple[float, MessageMetrics]:
    """Milliseconds from ``t0`` to the first Token; the reply is read to its end."""
    first = 0.0
    for event in backend.generate(messages, params):
        if isinstance(event, Token) and not first:
            first = (time.perf_counter() - t0) * 1000
        elif isinstance(event, Finished):
            if not first:
                raise RuntimeError(f"the reply had no text ({event.metrics.stop_reason})")
            return first, event.metrics
    raise RuntimeError("no Finished event")


def connect(url: str) -> LlamaServerBackend:
    backend = LlamaServerBackend(Connection("bench", "bench server", "llama-server", url))
    backend.load("", LoadConfig())
    return backend


# -- ratio: the backend's decode rate vs the server's own --------------------------------


def decode_ratio(url: str, replies: int, tokens: int, prompt: list[int]) -> dict[str, Any]:
    """Streamed replies through the backend, each followed by the same reply asked of the
    server plainly (``prompt``: the same token ids, non-streamed, nobody reading)."""
    backend = connect(url)
    params = SamplingParams.greedy(tokens)
    run_reply(backend, [ChatMessage("user", "Hello.")], SamplingParams.greedy(4))  # warm-up
    client, native, ratios, alone, generated = [], [], [], [], []
    same_text = True
    for i in range(replies):
        backend.reset()
        done = run_reply(backend, [ChatMessage("user", PROMPT)], params)
        m = done.metrics
        if m.native_decode_tok_s <= 0 or m.decode_tok_s <= 0:
            raise RuntimeError(f"reply {i} has no rates: {m.summary()}")
        client.append(m.decode_tok_s)
        native.append(m.native_decode_tok_s)
        ratios.append(m.decode_tok_s / m.native_decode_tok_s)
        generated.append(m.generated_tokens)
        plain = server_round(url, prompt, params)
        alone.append(plain["tok_s"])
        same_text = same_text and plain["text"].strip() == done.text.strip()
    backend.unload()
    return {
        "ratio": round(statistics.median(ratios), 3),
        "client_tok_s": round(statistics.median(client), 2),
        "server_tok_s": round(statistics.median(native), 2),
        "streamed_vs_alone": round(statistics.median(client) / statistics.median(alone), 3),
        "server_plain_tok_s": round(statistics.median(alone), 2),
        "ratio_rounds": [round(r, 3) for r in ratios],
        "client_rounds": [round(r, 2) for r in client],
        "server_rounds": [round(r, 2) for r in native],
        "server_plain_rounds": [round(r, 2) for r in alone],
        "generated_tokens": generated,
        "ratio_same_text": same_text,
    }


# -- resume: slot snapshot vs evaluating the chat again ------------------------------------


def long_text(words: int) -> str:
    return " ".join(f"word{i % 97}" for i in range(words))


def build_chat(url: str, target: int) -> tuple[list[ChatMessage], Any, dict[str, Any]]:
    """A chat of about ``target`` tokens, replied to and saved as the app would."""
    backend = connect(url)
    words = 600
    for _ in range(3):  # aim the whole chat at ``target`` tokens
        n = len(post(url, "/tokenize", {"content": "Summarise this text. " + long_text(words)})[
            "tokens"
        ])  # fmt: skip
        words = max(1, round(words * (target - 40) / n))
    prompt = [ChatMessage("user", "Summarise this text. " + long_text(words))]
    done = run_reply(backend, prompt, SamplingParams.greedy(16))
    messages = [*prompt, ChatMessage("assistant", done.text)]
    # As the app does after each reply.
    prepared = backend.prewarm(prompt, ChatMessage("assistant", done.text))
    t0 = time.perf_counter()
    kv = backend.export_state(CONV_KEY)
    save_ms = (time.perf_counter() - t0) * 1000
    ref = json.loads(bytes(kv.state))
    info = {
        "n_tokens": len(kv.tokens),
        "prepared_tokens": prepared,
        "save_ms": round(save_ms, 1),
        "slot_file": ref["file"],
    }
    backend.unload()
    return messages, kv, info


def erase_slot(url: str) -> None:
    answer = post(url, "/slots/0?action=erase", {})
    if not isinstance(answer, dict) or "n_erased" not in answer:
        raise RuntimeError(f"the slot was not erased: {answer}")


def resume(url: str, slot_dir: Path, target: int, rounds: int) -> dict[str, Any]:
    messages, kv, info = build_chat(url, target)
    info["slot_file_bytes"] = (slot_dir / info.pop("slot_file")).stat().st_size
    follow = [*messages, ChatMessage("user", FOLLOW_UP)]
    params = SamplingParams.greedy(8)
    resumed_ms, reeval_ms, restore_ms = [], [], []
    resumed = evaluated = None
    for _ in range(rounds):
        erase_slot(url)
        backend = connect(url)  # reopening the chat later: a fresh connection, not timed
        t0 = time.perf_counter()
        backend.import_state(kv)
        restore_ms.append((time.perf_counter() - t0) * 1000)
        ms, resumed = first_token_ms(backend, follow, params, t0)
        resumed_ms.append(ms)

        erase_slot(url)
        backend.reset()
        t0 = time.perf_counter()
        ms, evaluated = first_token_ms(backend, follow, params, t0)
        reeval_ms.append(ms)
        backend.unload()
    assert resumed is not None and evaluated is not None
    resume_ms = statistics.median(resumed_ms)
    reprefill_ms = statistics.median(reeval_ms)
    return {
        "resume_speedup": round(reprefill_ms / resume_ms, 2),
        "resume_ms": round(resume_ms, 1),
        "reprefill_ms": round(reprefill_ms, 1),
        "restore_ms": round(statistics.median(restore_ms), 1),
        "resume_evaluated_tokens": resumed.evaluated_tokens,
        "resume_cached_tokens": resumed.cached_tokens,
        "reprefill_evaluated_tokens": evaluated.evaluated_tokens,
        "reprefill_cached_tokens": evaluated.cached_tokens,
        "resume_rounds": [round(v, 1) for v in resumed_ms],
        "reprefill_rounds": [round(v, 1) for v in reeval_ms],
        **info,
    }


# -- in-process app path vs the standalone server ---------------------------------------


def app_child(threads: int, tokens: int, data: Path) -> None:
    """The in-process side, in its own process: one app round per ``round`` on stdin."""
    sys.path.insert(0, str(ROOT / "bench"))
    from decode_overhead import PerfEngine, app_round

    prompts: list[list[int]] = []

    class PromptEngine(PerfEngine):
        """Also records the prompt's token ids, so the server is sent exactly these."""

        def generate(
            self,
            messages: Any,
            params: Any,
            stop: Any = None,
            end_thinking: Any = None,
            tools: Any = None,
        ) -> Any:
            if not prompts:  # on the engine's own thread, before the reply
                prompts.append(self.prompt_tokens(messages))
            return super().generate(messages, params, stop, end_thinking, tools)

    from PySide6.QtWidgets import QApplication

    from bench.app_window import open_app_window

    model = ensure_default_model(ROOT / ".cache" / "test-models")
    qt_app = QApplication([])
    window = open_app_window(
        data,
        model,
        LoadConfig(n_ctx=N_CTX, n_threads=threads),
        SamplingParams.greedy(tokens),
        PromptEngine,
    )
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        tok_s = app_round(window, tokens)
        n_eval, t_eval_ms = PerfEngine.perf[-1]
        print(
            json.dumps(
                {
                    "tok_s": tok_s,
                    "generated": window.reply_metrics[-1].generated_tokens,
                    "native_tok_s": n_eval * 1000.0 / t_eval_ms if t_eval_ms > 0 else 0.0,
                    "text": window.messages[-1].content,
                    "prompt": prompts[0],
                }
            ),
            flush=True,
        )
    window.close()  # stops the worker thread (EngineClient.shutdown)
    del window
    qt_app.quit()


class AppSide:
    """The child process running the app path, driven one round at a time.

    Every wait is bounded: a child that does not answer in time is killed and the
    bench fails with the end of its log.
    """

    def __init__(self, threads: int, tokens: int, work: Path) -> None:
        log_path = work / "app.log"
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--app-child", str(work / "app-data"),
                 "--threads", str(threads), "--tokens", str(tokens)],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()
        try:
            self.pid = int(self._read(START_TIMEOUT_S)["pid"])
        except BaseException:
            self.close()
            raise

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")  # the child's stdout closed

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"the app process did not answer in {timeout:.0f} s:\n"
                                   f"{self._log_tail()}") from None  # fmt: skip
            if not line:
                raise RuntimeError(f"the app process ended:\n{self._log_tail()}")
            if line.startswith("{"):
                data: dict[str, Any] = json.loads(line)
                return data

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def round(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        return self._read(ROUND_TIMEOUT_S)

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=10)


def server_round(url: str, prompt: list[int], params: SamplingParams) -> dict[str, Any]:
    """One non-streamed greedy reply from the server, as a user of it alone would ask."""
    body = {
        "prompt": prompt,
        "n_predict": params.max_tokens,
        "cache_prompt": False,
        "id_slot": 0,
        # The backend's own mapping: both sides sample with the same settings.
        **sampling_fields(params, params.seed),
    }
    answer = post(url, "/completion", body)
    timings = answer["timings"]
    return {
        "tok_s": float(timings["predicted_per_second"]),
        "generated": int(timings["predicted_n"]),
        "text": str(answer.get("content", "")),
    }


def inprocess_vs_server(
    url: str, server_pid: int, app: AppSide, prompt: list[int], rounds: int, tokens: int
) -> dict[str, Any]:
    params = SamplingParams.greedy(tokens)
    server_round(url, prompt, SamplingParams.greedy(8))  # warm-up
    app_rates, server_rates, native, app_n, server_n = [], [], [], [], []
    server_idle_cpu = app_idle_cpu = settled = 0.0
    app_wall = app_cpu = gui_cpu = 0.0  # the app's rounds: wall time, CPU, GUI thread's CPU
    same_text = True
    for i in range(rounds):
        order = ("app", "server") if i % 2 == 0 else ("server", "app")
        for side in order:
            if side == "app":
                settled += settle(server_pid)
                before = cpu_seconds(server_pid)
                gui_before, app_before = cpu_seconds(app.pid, app.pid), cpu_seconds(app.pid)
                t0 = time.perf_counter()
                got = app.round()
                app_wall += time.perf_counter() - t0
                gui_cpu += cpu_seconds(app.pid, app.pid) - gui_before
                app_cpu += cpu_seconds(app.pid) - app_before
                server_idle_cpu += cpu_seconds(server_pid) - before
                app_rates.append(got["tok_s"])
                native.append(got["native_tok_s"])
                app_n.append(got["generated"])
                app_text = got["text"]
            else:
                settled += settle(app.pid)
                before = cpu_seconds(app.pid)
                got = server_round(url, prompt, params)
                app_idle_cpu += cpu_seconds(app.pid) - before
                server_rates.append(got["tok_s"])
                server_n.append(got["generated"])
                server_text = got["text"]
        same_text = same_text and app_text.strip() == server_text.strip()
    app_tok_s = statistics.median(app_rates)
    server_tok_s = statistics.median(server_rates)
    # Each round's two sides ran back to back: their ratio cancels slower drift.
    paired = [a / b for a, b in zip(app_rates, server_rates, strict=True)]
    return {
        "inprocess_vs_server": round(app_tok_s / server_tok_s, 3),
        "inprocess_vs_server_paired": round(statistics.median(paired), 3),
        "inprocess_vs_server_best": round(max(app_rates) / max(server_rates), 3),
        "app_tok_s": round(app_tok_s, 2),
        "server_alone_tok_s": round(server_tok_s, 2),
        "inprocess_native_tok_s": round(statistics.median(native), 2),
        "app_rounds": [round(r, 2) for r in app_rates],
        "server_alone_rounds": [round(r, 2) for r in server_rates],
        "inprocess_native_rounds": [round(r, 2) for r in native],
        "app_generated": app_n,
        "server_generated": server_n,
        "same_text": same_text,
        "settle_s": round(settled, 2),
        # Cores busy in the app process during its rounds, and the GUI thread's part: on
        # 2 cores with 2 llama.cpp threads, the GUI thread's time is taken from them.
        "app_cores_busy": _round_or_none(app_cpu / app_wall),
        "app_gui_thread_cores": _round_or_none(gui_cpu / app_wall),
        "idle_cpu_s": {  # None: no /proc on this system
            "server_during_app_rounds": _round_or_none(server_idle_cpu),
            "app_during_server_rounds": _round_or_none(app_idle_cpu),
        },
    }


def _round_or_none(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 2)


def main() -> None:
    use_native_guard()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a ~1 minute smoke run")
    parser.add_argument("--tokens", type=int, default=200, help="reply length (ratio)")
    parser.add_argument("--replies", type=int, default=6, help="replies for the ratio")
    parser.add_argument("--chat-tokens", type=int, default=2000, help="chat length (resume)")
    parser.add_argument("--resume-rounds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7, help="in-process vs server rounds")
    parser.add_argument("--app-tokens", type=int, default=256, help="reply length (vs server)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--app-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.app_child is not None:
        app_child(args.threads, args.tokens, args.app_child)
        return
    if args.quick:  # smaller defaults; figures given on the command line still win
        parser.set_defaults(replies=2, tokens=100, resume_rounds=2, rounds=2, app_tokens=128)
        args = parser.parse_args()

    from tests.server_fixture import running_llama_server

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    model = ensure_default_model(ROOT / ".cache" / "test-models")
    with (
        tempfile.TemporaryDirectory(prefix="lamplight-bench-remote-") as tmp,
        running_llama_server(
            model, Path(tmp), n_ctx=N_CTX, threads=args.threads, extra=SERVER_FLAGS
        ) as server,
    ):
        # Started first and left idle: loading its model must not overlap any timing.
        app = AppSide(args.threads, args.app_tokens, Path(tmp))
        try:
            # A warm-up app round, which also gives the prompt's token ids as the app's
            # engine rendered them: the server's plain baselines are sent exactly these.
            prompt = app.round()["prompt"]
            ratio = decode_ratio(server.url, args.replies, args.tokens, prompt)
            resumed = resume(server.url, server.slot_dir, args.chat_tokens, args.resume_rounds)
            versus = inprocess_vs_server(
                server.url, server.process.pid, app, prompt, args.rounds, args.app_tokens
            )
        finally:
            app.close()
    notes = [
        "ratio: client rate = (tokens - 1) / (last - first arrival) of the streamed tokens; "
        "server rate = predicted_n - 1 decode steps over the same span on the server "
        "(llama.cpp's n_gen_steps), so both count the same steps. streamed_vs_alone: the "
        "same client rate ÷ the server's rate for the same prompt asked plainly "
        "(non-streamed, no client reading) right after: what streaming to Lamplight on the "
        "same machine costs the server",
        "resume: the slot is erased before each side; 'resume_ms' runs from import_state "
        "(a /props check and /slots restore from the server's disk, page-cached here) to the "
        "first token; the server runs with --cache-ram 0 so re-evaluation is not served "
        "from its host-memory prompt cache",
        "inprocess_vs_server: both sides on one machine, never at once; the idle side's "
        "CPU use during the other's rounds is in idle_cpu_s. inprocess_native_tok_s "
        "(llama.cpp's own timer in the app process) separates the app path's cost from "
        "llama.cpp's; app_gui_thread_cores is the GUI thread's share of the cores during "
        "app rounds, time taken from llama.cpp's threads when they use every core",
        "each in-process or server round starts once the other side has used no CPU for "
        "100 ms (settle_s in all)",
        "other processes on this machine were not stopped: see loadavg",
    ]
    print(
        json.dumps(
            {
                "ratio": ratio.pop("ratio"),
                "resume_speedup": resumed.pop("resume_speedup"),
                "inprocess_vs_server": versus.pop("inprocess_vs_server"),
                **ratio,
                **resumed,
                **versus,
                "tokens": args.tokens,
                "replies": args.replies,
                "app_tokens": args.app_tokens,
                "rounds": args.rounds,
                "resume_rounds_n": args.resume_rounds,
                "n_ctx": N_CTX,
                "threads": args.threads,
                "server_flags": list(SERVER_FLAGS),
                "quick": args.quick,
                "loadavg": [round(v, 2) for v in (*load_before, *os.getloadavg())],
                "wall_s": round(time.perf_counter() - t_start, 1),
                "notes": notes,
            }
        )
    )


if __name__ == "__main__":
    main()
