"""The API's ``compact`` field on the real engine (issue 45): a chat compacts, the
summary reads only its instruction (the history was in the cache), and the turns
after it, sent as the response said (its ``system`` message, then what stayed), read
only what is new; a summary stopped midway fails the request and leaves the cache as
it was; a project's chat sends the summary as its one system message; a chat with a
tool call (with its result) and thinking compacts with the call named and no thinking
in the summary."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from app.api.config import ApiConfig
from app.api.gateway import ApiJob
from app.api.host_gateway import HostGateway
from app.api.runner import ApiServer
from app.chat.conversation import SUMMARY_HEADING
from app.chat.projects import Project, ProjectStore
from app.chat.store import ConversationStore
from app.config.setting_records import LoadConfig
from app.engine.local.engine import Engine
from app.engine.templates.override import TemplateOverride
from app.host.host import EngineHost
from app.host.listener import QuietListener
from tests.tool_templates import WEATHER

SYSTEM = "You answer questions about the harbour in one short sentence."
TOPICS = ["tides", "berths", "lighthouses", "fishing boats", "harbour walls", "ferries"]
SHORT = {"max_tokens": 8, "temperature": 0}
COMPACT = {"compact": {"max_tokens": 40}}


class Recording(HostGateway):
    """The host's gateway, keeping the jobs it was given."""

    def __init__(self, host: EngineHost, projects: ProjectStore) -> None:
        super().__init__(host, projects)
        self.jobs: list[ApiJob] = []

    def join(self, job: ApiJob, limit: int) -> int:
        self.jobs.append(job)
        return super().join(job, limit)


class Rig:
    def __init__(self, engine: Engine, server: ApiServer, gateway: Recording) -> None:
        self.engine, self.server, self.gateway = engine, server, gateway
        self.client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=300)

    def ask(self, messages: list[dict[str, Any]], **extra: Any) -> Any:
        return self.client.chat.completions.create(
            model="m", messages=messages, **SHORT, extra_body=extra or None
        )

    def read(self, reply: Any) -> int:
        """The tokens a reply read (its prompt less what the cache held)."""
        details = reply.usage.prompt_tokens_details
        return int(reply.usage.prompt_tokens - (details.cached_tokens if details else 0))

    def new(self, text: str) -> int:
        return self.engine.count_tokens(text)


@contextlib.contextmanager
def rig_on(engine: Engine, root: Path, template: str = "") -> Iterator[Rig]:
    """An API server over a host on ``engine`` (its own thread), with a project "Harbour"
    shared with the API; everything stopped after."""
    if template:
        engine.set_template(TemplateOverride("custom", source=template))
    projects = ProjectStore(root / "data")
    projects.save(Project(name="Harbour", instructions=SYSTEM, api=True))
    host = EngineHost(engine, root / "models", ConversationStore(root / "data"), QuietListener())
    thread = host.start()
    gateway = Recording(host, projects)
    server = ApiServer(gateway, ApiConfig(port=0))
    server.start()
    try:
        yield Rig(engine, server, gateway)
    finally:
        server.stop()
        host.close()
        thread.join(10)


@pytest.fixture()
def rig(model_path: Path, tmp_path: Path) -> Iterator[Rig]:
    """A host thread needs an engine of its own (closing the host frees its model)."""
    from tests.conftest import TEST_LOAD

    engine = Engine()
    engine.load(model_path, LoadConfig(**{**TEST_LOAD.__dict__, "n_ctx": 2048}))
    try:
        with rig_on(engine, tmp_path) as made:
            yield made
    finally:
        engine.unload()


def question(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    facts = " ".join(f"Port {i}.{k} has {topic} and a {k}-metre berth." for k in range(3))
    return f"{facts} Tell me one short fact about the {topic} of port {i}."


def chat(rig: Rig, messages: list[dict[str, Any]], turns: int, **extra: Any) -> None:
    """``turns`` exchanges added to ``messages``, each its own request."""
    for i in range(turns):
        messages.append({"role": "user", "content": question(i)})
        reply = rig.ask(messages, **extra)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})


def go_on(rig: Rig, messages: list[dict[str, Any]], turns: int, **extra: Any) -> None:
    """``turns`` more exchanges, each reading only its own question (and framing)."""
    for i in range(turns):
        text = f"And the {TOPICS[i % len(TOPICS)]} of pier {i}?"
        messages.append({"role": "user", "content": text})
        reply = rig.ask(messages, **extra)
        assert rig.read(reply) <= 1.1 * rig.new(text) + 8, (i, reply.usage)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})


def compacted(
    rig: Rig, messages: list[dict[str, Any]], **extra: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Ask the next question with ``compact``; the history to send from now on (as the
    response says: its ``system``, what stayed, the answer) and the report."""
    messages = [*messages, {"role": "user", "content": "Which port came first?"}]
    reply = rig.ask(messages, **COMPACT, **extra)
    found = (reply.model_extra or {})["compaction"]
    assert "skipped" not in found, found
    _start, end = found["replaced"]
    after = [
        {"role": "system", "content": found["system"]},
        *messages[end:],
        {"role": "assistant", "content": reply.choices[0].message.content},
    ]
    return after, found


def test_an_api_chat_compacts_and_goes_on_reading_only_what_is_new(rig: Rig) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    chat(rig, messages, 5)
    history = rig.gateway.jobs[-1]
    after, found = compacted(rig, messages)
    summary_job, answer_job = rig.gateway.jobs[-2:]
    assert summary_job.compaction and found["summary"]
    assert found["replaced"] == [1, 7] and found["summarised"] == 6
    # The summary read only its instruction: the history was in the cache.
    instruction = summary_job.messages[-1].content
    assert found["read_tokens"] <= rig.new(instruction) + 10, found
    assert found["system"] == f"{SYSTEM}\n\n{SUMMARY_HEADING}\n{found['summary']}"
    assert answer_job.messages[0].content == found["system"]
    assert len(answer_job.messages) < len(history.messages)
    # The history it replaced took more than the summary and the kept turns.
    assert found["history_tokens"] > rig.engine.count_tokens(found["system"]) + 50
    go_on(rig, after, 4)


def test_a_summary_stopped_midway_fails_and_leaves_the_cache_as_it_was(rig: Rig) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    chat(rig, messages, 4)
    stopped = threading.Event()

    def stop_the_summary() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            running = rig.server.requests.running()
            if running is not None and running.id.startswith("compact-") and running.tokens:
                stopped.set()
                rig.server.requests.stop_running()  # the window's Stop
                return
            time.sleep(0.005)

    stopper = threading.Thread(target=stop_the_summary)
    stopper.start()
    try:
        asked = [*messages, {"role": "user", "content": "Which port came first?"}]
        with pytest.raises(openai.APIError):
            rig.client.chat.completions.create(
                model="m",
                messages=asked,  # type: ignore[arg-type]
                **SHORT,  # type: ignore[arg-type]
                extra_body={"compact": {"max_tokens": 400}},
            )
    finally:
        stopper.join(130)
    assert stopped.is_set()
    assert rig.gateway.jobs[-1].compaction  # no answer was asked for
    # The cache is as it was: the history as sent before, and the question read alone.
    go_on(rig, messages, 1)


def test_a_projects_chat_sends_the_summary_as_its_one_system_message(rig: Rig) -> None:
    messages: list[dict[str, Any]] = []
    chat(rig, messages, 4, project="Harbour")
    after, found = compacted(rig, messages, project="Harbour")
    assert found["replaced"] == [0, 4]  # the request had no system message of its own
    assert found["system"].startswith(SUMMARY_HEADING)
    assert rig.gateway.jobs[-1].messages[0].content == f"{SYSTEM}\n\n{found['system']}"
    go_on(rig, after, 2, project="Harbour")


def test_a_chat_with_a_call_and_thinking_compacts_naming_the_call_without_thinking(
    model_path: Path, tmp_path: Path
) -> None:
    """Qwen 2.5's tool template that opens a thinking block (as ``test_tools_engine``):
    the model calls the tool (forced), reads its result, thinks before each answer; the
    summary is asked over the call and its result, offered the tools (none callable)
    so it reads only its instruction, and none of the thinking is in it."""
    from tests.conftest import TEST_LOAD
    from tests.model.test_tools_engine import THINKING_TOOLS

    tools: Any = [WEATHER.openai()]
    thinks = {"thinking_budget_tokens": 6}
    engine = Engine()
    engine.load(model_path, TEST_LOAD)
    try:
        with rig_on(engine, tmp_path, THINKING_TOOLS) as rig:
            ask_with_a_call(rig, tools, thinks)
    finally:
        engine.unload()


def ask_with_a_call(rig: Rig, tools: Any, thinks: dict[str, Any]) -> None:
    """The chat with a call and thinking, then its compaction (see the test above)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]

    def create(choice: str, max_tokens: int, **extra: Any) -> Any:
        return rig.client.chat.completions.create(
            model="m",
            messages=messages,  # type: ignore[arg-type]
            tools=tools,
            tool_choice=choice,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0,
            extra_body={**thinks, **extra},
        )

    called = create("required", 120)
    call = called.choices[0].message.tool_calls[0]
    messages += [
        called.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear", "c": 21}'},
    ]
    for text in ["Thanks.", *(question(i) for i in range(3))]:
        if messages[-1]["role"] != "tool":
            messages.append({"role": "user", "content": text})
        said = create("none", 16).choices[0].message
        assert (said.model_extra or {}).get("reasoning_content"), said  # it thought
        messages.append({"role": "assistant", "content": said.content or ""})
    messages.append({"role": "user", "content": "Which city did we ask about?"})
    found = create("none", 16, **COMPACT).model_extra["compaction"]
    summary_job = rig.gateway.jobs[-2]
    roles = [m.role for m in summary_job.messages]
    assert "tool" in roles[: found["replaced"][1]]  # the call and its result summarised
    assert summary_job.messages[2].tool_calls[0].name == "get_weather"
    assert summary_job.tools is not None and summary_job.tools.choice == "none"
    instruction = summary_job.messages[-1].content
    # The instruction, and the last reply again: the template drops past thinking, so
    # the reply (16 tokens at most) is read as the history renders it, as any next
    # turn of this template does. Without the tools described it read the whole chat.
    assert found["read_tokens"] <= rig.new(instruction) + 10 + 16, found
    assert found["read_tokens"] < found["history_tokens"] / 3, found
    thought = [m.reasoning for m in summary_job.messages if m.reasoning]
    assert all(t.strip() not in found["summary"] for t in thought)
    assert "<think>" not in found["summary"] and "</think>" not in found["summary"]
