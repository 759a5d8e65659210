"""A new chat in a project starts warm, on the real engine (issue 44): the project's
opening (instructions with a pinned document, as its system turn) is read once and kept
in memory and on disk; the next new chat reads only its question, a change of the
instructions makes a new opening once, and after a restart the saved one is used."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.chat.conversation import new_id
from app.chat.snapshot import read_header
from app.chat.store import ConversationStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.host.host import EngineHost
from app.host.jobs import ReplyEvent, ReplyJob
from app.host.listener import QuietListener
from tests.arch_models import arch_model_path
from tests.model.test_recurrent_memory import PLAIN

GREEDY = SamplingParams.greedy(6)
PROJECT = new_id()
INSTRUCTIONS = (
    (
        "You are the harbour master's assistant. Answer in plain words, cite the tide table "
        "when it matters, and never guess a berth number. "
    )
    * 40
    + "\n\nPinned document, tides.md:\n"
    + "High water 06:12, low water 12:31. " * 30
)
SHORT = INSTRUCTIONS[:1200]  # where the size does not matter
QUESTION = " ".join(["When is the next high water at the north pier, and which berth"] * 6)


def ask(host: EngineHost, system: str, question: str, prefix: str = PROJECT) -> Finished:
    """A new chat in the project: its first reply."""
    events: list[ReplyEvent] = []
    messages = [ChatMessage("system", system), ChatMessage("user", question)]
    job = ReplyJob(new_id(), "gui", messages, GREEDY, events.append, conv_id=new_id())
    job.prefix = prefix
    host.run_here(job)
    done = events[-1]
    assert isinstance(done, Finished), done
    return done


@pytest.fixture()
def host(engine: Engine, tmp_path: Path) -> Iterator[EngineHost]:
    store = ConversationStore(tmp_path / "data")
    yield EngineHost(engine, tmp_path / "models", store, QuietListener())


@pytest.fixture()
def own_engine(model_path: Path) -> Iterator[Engine]:
    """An engine of its own for a host whose thread runs: closing the host frees the
    model (the session's engine must stay loaded for the other tests)."""
    from tests.conftest import TEST_LOAD

    engine = Engine()
    engine.load(model_path, TEST_LOAD)
    yield engine
    engine.unload()


def prefix_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "data" / "prefixes").glob("*.lpkv"))


def test_the_second_new_chat_reads_only_its_question(
    engine: Engine, host: EngineHost, tmp_path: Path
) -> None:
    first = ask(host, INSTRUCTIONS, QUESTION)
    stats = host._core.prefixes.stats
    assert stats.built == 1 and len(prefix_files(tmp_path)) == 1
    opening = first.metrics.cached_tokens  # the opening, read just before the question
    assert opening > 1500 and first.metrics.evaluated_tokens < 200
    engine.reset()  # another chat came between (the live cache is gone)
    second = ask(host, INSTRUCTIONS, QUESTION.replace("north", "south"))
    question = engine.count_tokens(QUESTION)
    assert stats.from_ram == 1 and second.metrics.cached_tokens == opening
    assert second.metrics.evaluated_tokens <= 1.1 * question, (second.metrics, question)
    # Changed instructions: a new opening, read once; the project's old file goes.
    changed = INSTRUCTIONS + "\nAlso give the water depth."
    engine.reset()
    ask(host, changed, QUESTION)
    assert stats.built == 2 and len(prefix_files(tmp_path)) == 1
    engine.reset()
    again = ask(host, changed, QUESTION)
    assert stats.built == 2 and again.metrics.evaluated_tokens <= 1.1 * question
    # A restart: a new host on the same data folder, nothing in memory.
    engine.reset()
    restarted = EngineHost(
        engine, tmp_path / "models", ConversationStore(tmp_path / "data"), QuietListener()
    )
    after = ask(restarted, changed, QUESTION)
    assert restarted._core.prefixes.stats.from_disk == 1
    assert after.metrics.evaluated_tokens <= 1.1 * question


def test_a_chat_outside_a_project_or_without_instructions_reads_as_before(
    engine: Engine, host: EngineHost, tmp_path: Path
) -> None:
    plain = ask(host, SHORT, QUESTION, prefix="")
    assert plain.metrics.cached_tokens == 0 and not prefix_files(tmp_path)
    assert host._core.prefixes.stats.built == 0


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_a_hybrid_models_opening_carries_its_checkpoint(arch: str, tmp_path: Path) -> None:
    tiny = Engine()
    tiny.load(arch_model_path(arch), LoadConfig(n_ctx=1024, n_threads=1))
    tiny.set_template(PLAIN)
    try:
        host = EngineHost(
            tiny, tmp_path / "models", ConversationStore(tmp_path / "data"), QuietListener()
        )
        system = "Rules of the harbour. " * 20
        ask(host, system, "When?")
        (path,) = prefix_files(tmp_path)
        _header, head, _ = read_header(path)
        n = head["n_tokens"]
        assert [c[0] for c in head["checkpoints"]][-1] == n  # a checkpoint at its end
        tiny.reset()
        warm = ask(host, system, "Where is it?")
        assert warm.metrics.cached_tokens == n
        assert warm.metrics.evaluated_tokens <= len(tiny.tokenize("Where is it?\n<|assistant|>"))
    finally:
        tiny.unload()


def test_a_damaged_saved_opening_is_read_again_never_used(
    engine: Engine, host: EngineHost, tmp_path: Path
) -> None:
    ask(host, SHORT, QUESTION)
    (path,) = prefix_files(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the state: its checksum fails
    path.write_bytes(bytes(data))
    engine.reset()
    store = ConversationStore(tmp_path / "data")
    restarted = EngineHost(engine, tmp_path / "models", store, QuietListener())
    done = ask(restarted, SHORT, QUESTION)
    stats = restarted._core.prefixes.stats
    assert stats.from_disk == 0 and stats.built == 1  # refused, read again, saved again
    assert done.metrics.evaluated_tokens < 200 and len(prefix_files(tmp_path)) == 1
    restarted._core.prefixes.forget(PROJECT)  # the project was deleted
    assert not prefix_files(tmp_path)


def test_an_api_request_naming_a_project_starts_from_its_opening(
    own_engine: Engine, tmp_path: Path
) -> None:
    engine = own_engine
    import openai

    from app.api.config import ApiConfig
    from app.api.host_gateway import HostGateway
    from app.api.runner import ApiServer
    from app.chat.projects import Project, ProjectStore

    projects = ProjectStore(tmp_path / "data")
    project = Project(name="Harbour", instructions=SHORT, api=True)
    projects.save(project)
    store = ConversationStore(tmp_path / "data")
    host = EngineHost(engine, tmp_path / "models", store, QuietListener())
    thread = host.start()
    server = ApiServer(HostGateway(host, projects), ApiConfig(port=0))
    server.start()
    try:
        c = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120)
        extra = {"project": "Harbour"}
        question = [{"role": "user", "content": QUESTION}]
        first = c.chat.completions.create(
            model="m", messages=question, max_tokens=4, temperature=0, extra_body=extra
        )
        second = c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": QUESTION.replace("north", "south")}],
            max_tokens=4,
            temperature=0,
            extra_body=extra,
        )
        assert first.usage is not None and second.usage is not None
        cached = second.usage.prompt_tokens_details
        assert cached is not None and cached.cached_tokens
        # Only the question (and its turn's framing) was read.
        assert second.usage.prompt_tokens - cached.cached_tokens <= 1.1 * engine.count_tokens(
            QUESTION
        )
        assert len(prefix_files(tmp_path)) == 1
    finally:
        server.stop()
        host.close()
        thread.join(10)


def test_a_changed_project_is_read_ahead_and_gives_way_to_a_reply(
    own_engine: Engine, engine: Engine, tmp_path: Path
) -> None:
    session_engine, engine = engine, own_engine

    store = ConversationStore(tmp_path / "data")
    host = EngineHost(engine, tmp_path / "models", store, QuietListener())
    system = [ChatMessage("system", SHORT)]
    prefixes = host._core.prefixes
    # Stopped before it ends (a reply was queued): nothing kept, the cache emptied.
    stop = threading.Event()
    stop.set()
    got = prefixes.prebuild(engine, host._core.pool, PROJECT, system, GREEDY, None, stop)
    assert got == "stopped" and not prefix_files(tmp_path) and not engine.cached_tokens
    thread = host.start()
    try:
        host.build_prefix(PROJECT, system, GREEDY)  # read ahead, in the background
        events: list[ReplyEvent] = []
        host.submit(ReplyJob(new_id(), "gui", [ChatMessage("user", "Hi")], GREEDY, events.append))
        assert host.drain(120)
        assert isinstance(events[-1], Finished)  # the reply ran, the read went on after it
        # A read the reply stopped queued itself again while the first drain waited, so
        # behind it: drain once more for that one (at most the build's ``tries``).
        for _ in range(3):
            if prefixes.stats.built:
                break
            assert host.drain(120)
        assert prefixes.stats.built == 1 and len(prefix_files(tmp_path)) == 1
        again = prefixes.prebuild(engine, host._core.pool, PROJECT, system, GREEDY, None, stop)
        assert again == "kept"
    finally:
        host.close()
        thread.join(10)
    # The next new chat (another process, the same model) starts from what was read ahead.
    restarted = EngineHost(session_engine, tmp_path / "models", store, QuietListener())
    warm = ask(restarted, SHORT, QUESTION)
    assert warm.metrics.cached_tokens > 0 and restarted._core.prefixes.stats.from_disk == 1


def test_a_read_ahead_waits_when_the_open_chat_could_not_be_set_aside(
    engine: Engine, tmp_path: Path
) -> None:

    store = ConversationStore(tmp_path / "data")
    # A pool of 1 MiB: the chat's cache (some 2 MB) cannot be set aside in it.
    host = EngineHost(engine, tmp_path / "models", store, QuietListener(), pool_mb=1)
    events: list[ReplyEvent] = []
    chat = [ChatMessage("user", QUESTION)]
    host.run_here(ReplyJob(new_id(), "gui", chat, GREEDY, events.append, conv_id=new_id()))
    held = list(engine.cached_tokens)
    system = [ChatMessage("system", SHORT)]
    got = host._core.prefixes.prebuild(
        engine, host._core.pool, PROJECT, system, GREEDY, None, threading.Event()
    )
    assert got == "deferred" and engine.cached_tokens == held  # the chat's cache stays


def test_a_read_ahead_with_the_projects_tools_is_the_opening_its_chat_uses(
    own_engine: Engine, tmp_path: Path
) -> None:
    """The read-ahead words the tools as the chat's first round does (issue 44): the
    first new chat after it restores it, and a read without the tools is another one."""
    from app.chat.project_chat import offered_tools, opening_request
    from app.chat.projects import Project
    from app.chat.tool_round import tool_request
    from app.engine.templates.override import TemplateOverride
    from tests import llama_chat
    from tests.fakes.mcp import tool

    engine = own_engine
    source = llama_chat.template_source("Qwen-Qwen2.5-7B-Instruct.jinja")
    engine.set_template(TemplateOverride("custom", source=source))
    listed = [tool("sea", "weather", "Weather at sea.", place="string")]
    listed.append(tool("sea", "tides", "Tide table.", port="string"))
    specs = [
        {"name": t.qualified, "description": t.description, "parameters": dict(t.input_schema)}
        for t in listed
    ]
    project = Project(instructions=SHORT, mcp_tools=["tides", "weather"], tool_specs=specs[::-1])
    store = ConversationStore(tmp_path / "data")
    host = EngineHost(engine, tmp_path / "models", store, QuietListener())
    prefixes, pool = host._core.prefixes, host._core.pool
    system = [ChatMessage("system", SHORT)]
    ahead = opening_request(project, [], GREEDY)
    assert ahead is not None
    stop = threading.Event()
    assert prefixes.prebuild(engine, pool, project.id, system, GREEDY, ahead, stop) == "built"
    opening = len(engine.cached_tokens)
    assert prefixes.prebuild(engine, pool, project.id, system, GREEDY, None, stop) == "built"
    assert len(engine.cached_tokens) < opening  # without the tools: a shorter opening
    engine.reset()
    events: list[ReplyEvent] = []
    offered, _ = offered_tools(project, listed)
    job = ReplyJob(
        new_id(),
        "gui",
        [*system, ChatMessage("user", QUESTION)],
        GREEDY,
        events.append,
        conv_id=new_id(),
        tools=tool_request(offered, 0, GREEDY),
    )
    job.prefix = project.id
    host.run_here(job)
    done = events[-1]
    assert isinstance(done, Finished), done
    assert prefixes.stats.from_ram == 1 and prefixes.stats.built == 2
    assert done.metrics.cached_tokens == opening
    assert done.metrics.evaluated_tokens <= 1.1 * engine.count_tokens(QUESTION) + 8
