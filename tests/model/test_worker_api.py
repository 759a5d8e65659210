"""API jobs on the real engine worker: one terminal event each, queued with the GUI's
replies and never interleaved with them, the window's template kept, the KV cache
shared fairly (``KvPool``), and jobs submitted from a plain thread."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Slot
from pytestqt.qtbot import QtBot

from app.api.config import api_party
from app.api.gateway import ApiEvent, ApiFailure, ApiJob, ApiKind, EngineGateway
from app.api.host_gateway import HostGateway, reply_job
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, ModelInfo, Token
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.templates.override import AUTO, PLAIN, TemplateOverride
from app.host.jobs import model_id
from tests.conftest import ONE_THREAD
from ui.engine.worker import EngineClient

GREEDY = SamplingParams.greedy(6)
WAIT_MS = 60_000
SYSTEM = (
    "You are a patient guide to the history of lighthouses, their keepers and the lamps "
    "they trimmed each night along the rocky northern coast, and you answer in detail. "
)


class Recorder(QObject):
    """Collects the worker's signals on the test's (GUI) thread, in arrival order."""

    def __init__(self, client: EngineClient) -> None:
        super().__init__()
        self.events: list[tuple[str, object]] = []
        self.text: dict[int, str] = {}
        self.ended: dict[int, tuple[str, object]] = {}
        self.templates = 0
        w = client.worker
        w.tokens.connect(self._on_tokens)
        w.finished.connect(self._on_finished)
        w.cancelled.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        w.apiStarted.connect(self._on_api_started)
        w.apiEnded.connect(self._on_api_ended)
        w.templateApplied.connect(self._on_template)

    @Slot(int, str)
    def _on_tokens(self, request: int, text: str) -> None:
        self.events.append(("gui-token", request))
        self.text[request] = self.text.get(request, "") + text

    @Slot(int, str, object)
    def _on_finished(self, request: int, text: str, metrics: object) -> None:
        self.events.append(("gui-end", request))
        self.ended[request] = (text, metrics)

    @Slot(int, str)
    def _on_failed(self, request: int, why: str) -> None:
        self.events.append(("gui-end", request))
        self.ended[request] = (why, None)

    @Slot(str, str)
    def _on_api_started(self, job_id: str, _client: str) -> None:
        self.events.append(("api-start", job_id))

    @Slot(str)
    def _on_api_ended(self, job_id: str) -> None:
        self.events.append(("api-end", job_id))

    @Slot(object)
    def _on_template(self, _info: object) -> None:
        self.templates += 1


class Sink:
    """An API job's events, as the server's queue would get them (any thread)."""

    def __init__(self) -> None:
        self.events: list[ApiEvent] = []
        self.lock = threading.Lock()
        self.first_token = threading.Event()

    def emit(self, event: ApiEvent) -> None:
        with self.lock:
            self.events.append(event)
        if isinstance(event, Token):
            self.first_token.set()

    @property
    def terminals(self) -> list[ApiEvent]:
        with self.lock:
            return [e for e in self.events if not isinstance(e, Token)]

    @property
    def done(self) -> bool:
        return bool(self.terminals)

    @property
    def text(self) -> str:
        with self.lock:
            return "".join(e.text for e in self.events if isinstance(e, Token))

    def finished(self) -> Finished:
        (end,) = self.terminals
        assert isinstance(end, Finished), end
        assert self.events[-1] is end  # nothing after the terminal event
        return end

    def failure(self) -> ApiFailure:
        (end,) = self.terminals
        assert isinstance(end, ApiFailure), end
        return end


def make_job(
    info: ModelInfo,
    text: str,
    *,
    kind: ApiKind = "chat",
    params: SamplingParams = GREEDY,
    messages: list[ChatMessage] | None = None,
    reuse: bool = True,
    model: str = "",
    key: str = "",
) -> tuple[ApiJob, Sink]:
    sink = Sink()
    job = ApiJob(
        id=f"chatcmpl-{uuid.uuid4().hex[:24]}",
        kind=kind,
        model_id=model or model_id(info),
        messages=messages or [ChatMessage("user", text)],
        params=replace(params, overflow="stop"),
        reuse=reuse,
        client="127.0.0.1:5000",
        emit=sink.emit,
        party=api_party(key),
    )
    return job, sink


@pytest.fixture()
def client(qtbot: QtBot, tmp_path: Path, model_path: Path) -> Iterator[EngineClient]:
    client = EngineClient(tmp_path / "models")
    try:
        yield client
    finally:
        assert client.shutdown()


@pytest.fixture()
def gateway(qtbot: QtBot, client: EngineClient, model_path: Path) -> HostGateway:
    gw = HostGateway(client.host)
    assert gw.model() is None and not gw.loading()
    client.load(model_path, ONE_THREAD)
    qtbot.waitUntil(lambda: gw.model() is not None, timeout=WAIT_MS)
    assert not gw.loading()
    return gw


def engine_of(client: EngineClient) -> Engine:
    """The worker's engine, for checks made while the worker is idle (after drain)."""
    engine = client.host.engine
    assert isinstance(engine, Engine)
    return engine


def plain_mode(engine: Engine) -> bool:
    assert engine.template is not None
    return engine.template.completion


def run(qtbot: QtBot, client: EngineClient, job: ApiJob, sink: Sink) -> None:
    client.host.submit(reply_job(job))
    qtbot.waitUntil(lambda: sink.done, timeout=WAIT_MS)
    client.drain()


def test_every_job_ends_once(qtbot: QtBot, client: EngineClient, gateway: HostGateway) -> None:
    info = gateway.model()
    assert info is not None
    ok, ok_sink = make_job(info, SYSTEM + "Tell me about one.")
    early, early_sink = make_job(info, "Never runs.")
    early.stop.set()
    bad, bad_sink = make_job(
        info, "Hello", params=replace(GREEDY, output_format="gbnf", grammar="root ::= (((")
    )
    huge, huge_sink = make_job(info, "lighthouse " * 3000)
    other, other_sink = make_job(info, "Hello", model="some-other-model")
    long, long_sink = make_job(info, SYSTEM, params=replace(GREEDY, max_tokens=2000))
    for job in (ok, early, bad, huge, other, long):
        client.host.submit(reply_job(job))
    assert long_sink.first_token.wait(WAIT_MS / 1000)
    long.stop.set()  # the UI's Stop, or a client gone, mid-reply
    sinks = (ok_sink, early_sink, bad_sink, huge_sink, other_sink, long_sink)
    qtbot.waitUntil(lambda: all(s.done for s in sinks), timeout=WAIT_MS)
    client.drain()

    end = ok_sink.finished()
    assert end.text == ok_sink.text != "" and end.metrics.generated_tokens == 6
    assert early_sink.finished().metrics.stop_reason == "cancelled"
    assert early_sink.events == early_sink.terminals  # no token before a cancelled start
    fail = bad_sink.failure()
    assert (fail.status, fail.param) == (400, "grammar")
    fail = huge_sink.failure()
    assert (fail.status, fail.code) == (400, "context_length_exceeded")
    fail = other_sink.failure()
    assert (fail.status, fail.code, fail.param) == (404, "model_not_found", "model")
    stopped = long_sink.finished()
    assert stopped.metrics.stop_reason == "cancelled" and stopped.metrics.generated_tokens < 2000
    for sink in sinks:
        assert len(sink.terminals) == 1


def test_gui_and_api_replies_never_interleave(
    qtbot: QtBot, client: EngineClient, gateway: HostGateway
) -> None:
    info = gateway.model()
    assert info is not None
    rec = Recorder(client)
    gui_msgs = [ChatMessage("user", "Write about the sea at night.")]
    api_text = "Write about bread and ovens."
    # Each reply alone, from an empty cache (the same batch shapes as below).
    client.reset()
    solo_gui = client.generate("", gui_msgs, GREEDY)
    qtbot.waitUntil(lambda: solo_gui in rec.ended, timeout=WAIT_MS)
    job, solo_api = make_job(info, api_text, reuse=False)
    run(qtbot, client, job, solo_api)
    # apiEnded is queued to this thread after the sink's terminal event: wait for it.
    qtbot.waitUntil(lambda: ("api-end", job.id) in rec.events, timeout=WAIT_MS)
    rec.events.clear()

    gui_ids, sinks = [], []
    for _ in range(2):  # queued all at once: the worker takes them in order
        client.reset()
        gui_ids.append(client.generate("", gui_msgs, GREEDY))
        job, sink = make_job(info, api_text, reuse=False)
        client.host.submit(reply_job(job))
        sinks.append(sink)
    qtbot.waitUntil(
        lambda: (
            all(i in rec.ended for i in gui_ids)
            and all(s.done for s in sinks)
            and ("api-end", job.id) in rec.events
        ),  # the last job's signal, queued after its sink
        timeout=WAIT_MS,
    )
    client.drain()
    for i in gui_ids:
        assert rec.ended[i][0] == rec.text[i] == rec.text[solo_gui]
    for sink in sinks:
        assert sink.finished().text == sink.text == solo_api.text
    # In arrival order: a GUI reply's tokens then its end, then a whole API job, twice.
    kinds = [k for k, _ in rec.events if k != "gui-token"]
    assert kinds == ["gui-end", "api-start", "api-end"] * 2
    spans = [k for k, _ in rec.events]
    for start in (i for i, k in enumerate(spans) if k == "api-start"):
        assert spans[start + 1] == "api-end"  # no GUI token inside an API job


def test_the_gui_conversation_keeps_its_cache_across_an_api_job(
    qtbot: QtBot, client: EngineClient, gateway: HostGateway
) -> None:
    info = gateway.model()
    assert info is not None
    rec = Recorder(client)
    chat = [ChatMessage("user", SYSTEM * 2 + "Which light is the oldest?")]
    first = client.generate("c1", chat, GREEDY)
    qtbot.waitUntil(lambda: first in rec.ended, timeout=WAIT_MS)
    job, sink = make_job(info, "A different client asks about bread and ovens today.")
    client.host.submit(reply_job(job))
    reply = rec.ended[first][0]
    assert isinstance(reply, str)
    more = [*chat, ChatMessage("assistant", reply), ChatMessage("user", "Why?")]
    second = client.generate("c1", more, GREEDY)
    qtbot.waitUntil(lambda: second in rec.ended and sink.done, timeout=WAIT_MS)
    client.drain()
    m1, m2 = rec.ended[first][1], rec.ended[second][1]
    assert m1 is not None and m2 is not None
    assert m2.cached_tokens >= m1.prompt_tokens + m1.generated_tokens  # type: ignore[attr-defined]
    assert m2.evaluated_tokens <= 16  # type: ignore[attr-defined]
    assert client.host.pool.stats.restored == 1


def test_an_api_client_never_reuses_the_windows_cache_nor_another_keys(
    qtbot: QtBot, client: EngineClient, gateway: HostGateway
) -> None:
    """A client that sends the window's conversation word for word, or another key's,
    finds nothing cached: ``cached_tokens`` (and the time) cannot confirm a guess. Its
    own follow-up, and the window's, still read only their new tokens."""
    info = gateway.model()
    assert info is not None
    rec = Recorder(client)
    chat = [ChatMessage("user", SYSTEM * 2 + "Which light is the oldest?")]
    first = client.generate("c1", chat, GREEDY)
    qtbot.waitUntil(lambda: first in rec.ended, timeout=WAIT_MS)
    reply = rec.ended[first][0]
    assert isinstance(reply, str)
    guess = [*chat, ChatMessage("assistant", reply), ChatMessage("user", "Why?")]

    a1, s1 = make_job(info, "", messages=guess, key="key-a")
    run(qtbot, client, a1, s1)
    m1 = s1.finished().metrics
    assert m1.cached_tokens == 0 and m1.evaluated_tokens == m1.prompt_tokens
    more = [*guess, ChatMessage("assistant", s1.text), ChatMessage("user", "And then?")]
    a2, s2 = make_job(info, "", messages=more, key="key-a")
    run(qtbot, client, a2, s2)
    assert s2.finished().metrics.cached_tokens >= m1.prompt_tokens + m1.generated_tokens
    b, sb = make_job(info, "", messages=more, key="key-b")  # another key sees nothing
    run(qtbot, client, b, sb)
    assert sb.finished().metrics.cached_tokens == 0

    second = client.generate("c1", guess, GREEDY)  # the window's own follow-up
    qtbot.waitUntil(lambda: second in rec.ended, timeout=WAIT_MS)
    client.drain()
    g1, g2 = rec.ended[first][1], rec.ended[second][1]
    assert g1 is not None and g2 is not None
    assert g2.cached_tokens >= g1.prompt_tokens + g1.generated_tokens  # type: ignore[attr-defined]
    assert g2.evaluated_tokens <= 16  # type: ignore[attr-defined]


def use_template(
    qtbot: QtBot,
    client: EngineClient,
    rec: Recorder,
    override: TemplateOverride,
    chat: TemplateOverride | None = None,
) -> None:
    """The window's ``set_template``, once it is applied (``templateApplied``)."""
    applied = rec.templates + 1
    client.set_template(override, chat)
    qtbot.waitUntil(lambda: rec.templates == applied, timeout=WAIT_MS)


def api_reply(
    qtbot: QtBot, client: EngineClient, info: ModelInfo, text: str, kind: ApiKind = "chat"
) -> str:
    """An API job for ``text`` run to its end on ``info``'s model: the cache as text."""
    job, sink = make_job(info, text, kind=kind)
    run(qtbot, client, job, sink)
    assert sink.finished().metrics.generated_tokens > 0
    return engine_of(client).context_text


def test_api_jobs_use_their_template_and_put_the_windows_back(
    qtbot: QtBot, client: EngineClient, gateway: HostGateway
) -> None:
    info = gateway.model()
    assert info is not None and info.base_model
    rec = Recorder(client)
    # The default base model opens in continue-the-text mode.
    use_template(qtbot, client, rec, PLAIN)
    engine = engine_of(client)

    said = api_reply(qtbot, client, info, "Name a lighthouse.")
    assert "<start_of_turn>user\nName a lighthouse.<end_of_turn>" in said
    assert plain_mode(engine)  # the window's template again

    use_template(qtbot, client, rec, AUTO)
    said = api_reply(qtbot, client, info, "Once upon a time, a keeper", kind="completion")
    assert said.startswith("Once upon a time, a keeper")  # the prompt as is
    assert not plain_mode(engine)
    assert rec.templates == 2  # the swaps were the worker's own: no templateApplied


def test_api_chats_use_the_chat_template_chosen_for_the_model(
    qtbot: QtBot, client: EngineClient, gateway: HostGateway
) -> None:
    """The window's chat template choice is the API's too, also while the window is in
    continue-the-text mode (its other choice, which API chats never take)."""
    info = gateway.model()
    assert info is not None
    rec = Recorder(client)
    chatml = TemplateOverride("builtin", name="chatml")
    use_template(qtbot, client, rec, PLAIN, chatml)  # the dialog: ChatML, continue-the-text
    said = api_reply(qtbot, client, info, "Name a lighthouse.")
    assert "<|im_start|>user\nName a lighthouse.<|im_end|>" in said
    assert plain_mode(engine_of(client))  # the window's mode again
    use_template(qtbot, client, rec, AUTO)  # the model's own again
    said = api_reply(qtbot, client, info, "Name a harbour.")
    assert "<start_of_turn>user\nName a harbour.<end_of_turn>" in said


def test_a_job_for_a_model_no_longer_loaded_is_404(
    qtbot: QtBot,
    client: EngineClient,
    gateway: HostGateway,
    model_path: Path,
    tmp_path: Path,
) -> None:
    old = gateway.model()
    assert old is not None
    other = tmp_path / "another-model.gguf"
    other.symlink_to(model_path)
    job, sink = make_job(old, "Hello")
    client.load(other, ONE_THREAD)  # queued first: the job runs after the switch
    client.host.submit(reply_job(job))
    qtbot.waitUntil(lambda: sink.done, timeout=WAIT_MS)
    new = gateway.model()
    assert new is not None and model_id(new) == "another-model" != model_id(old)
    fail = sink.failure()
    assert (fail.status, fail.code) == (404, "model_not_found")
    assert "another-model" in fail.message


def test_a_job_submitted_from_a_plain_thread_runs(
    qtbot: QtBot, client: EngineClient, gateway: HostGateway
) -> None:
    gw: EngineGateway = gateway  # the protocol the server codes against
    results: list[tuple[ModelInfo | None, bool]] = []
    sinks: list[Sink] = []

    def server_thread() -> None:  # as uvicorn's thread would: no Qt event loop here
        info = gw.model()
        results.append((info, gw.loading()))
        assert info is not None
        for text in ("First question about lamps?", "Second question about ships?"):
            job, sink = make_job(info, text)
            sinks.append(sink)
            gw.join(job, 32)

    t = threading.Thread(target=server_thread, name="fake-api")
    t.start()
    t.join(10)
    assert not t.is_alive() and len(sinks) == 2
    qtbot.waitUntil(lambda: all(s.done for s in sinks), timeout=WAIT_MS)
    client.drain()
    assert results[0][0] is not None and results[0][1] is False
    for sink in sinks:
        assert sink.finished().metrics.generated_tokens > 0


def test_no_model_is_503(qtbot: QtBot, client: EngineClient) -> None:
    gw = HostGateway(client.host)
    info = ModelInfo(Path("x.gguf"), "x", "gemma3", 0, 0, 0, 0, 1, 0, "", "CPU", 0.0)
    job, sink = make_job(info, "Hello")
    gw.join(job, 32)
    qtbot.waitUntil(lambda: sink.done, timeout=WAIT_MS)
    fail = sink.failure()
    assert (fail.status, fail.code) == (503, "model_not_loaded")
