"""Randomized interleavings of everything a user can do to a conversation.

A Hypothesis state machine drives ``ChatSession`` and the real engine worker
thread (``EngineClient``) with random sequences of typing into the input box
(at any time), send, stop (before and after the first token), new chat, open
another, regenerate, edit, switching between versions, fork, delete, import
(of chats naming files, collections, a draft model and tool settings, confirmed
or not), messages with pictures and passages (whole documents and retrieved
ones), attached documents, replies with tool rounds, model reload, setting
changes (overflow policy, system prompt), generate failures before and part
way through a reply, save failures, quit-and-restart and crash-and-restart (the
worker dies without the session saving; a new session and worker read the same
data directory). Actions are taken while replies stream; invariants are checked
whenever the app has settled:

- what the session shows is what is on disk (unless a save was made to fail);
- roles alternate in every saved conversation;
- exactly one terminal event per request;
- a snapshot disappears only with its conversation;
- a conversation reopened after a restart equals what was shown before it,
  its other versions included;
- every word the user typed is in the input box or in a conversation that was
  not deleted (shown, saved, or kept as another version), after failures and
  crashes too;
- a message a conversation held is never dropped from it (regenerate and edit
  keep what they replace; a merged message keeps the text, pictures and passages
  it had; an edited message keeps the documents it had whole);
- every tool call has its result;
- an imported chat's documents, collections and draft model are used only once
  confirmed, and its tool settings are off until then.

The fake backend runs thousands of steps; the real model runs a short sequence.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from PySide6.QtCore import QCoreApplication, QObject, Signal, Slot
from PySide6.QtWidgets import QApplication

from app.chat.conversation import Conversation, Message
from app.chat.import_review import restore
from app.chat.session import ChatSession
from app.chat.store import UNDO_MARK, ConversationStore
from app.config.paths import data_dirs
from app.config.setting_records import LoadConfig, SamplingParams
from app.documents.sources import MAX_SOURCES, Source, sources_from_list
from app.engine.backend import Backend, ModelInfo
from app.engine.chat_message import ChatMessage, ImagePart, ToolCall
from app.engine.metrics import MessageMetrics
from app.engine.tool_spec import ToolRequest
from app.util.errors import DecodeError
from tests.conftest import TEST_LOAD
from tests.fakes.engine import VISION_CAPABILITIES, FakeEngine
from tests.fakes.mcp import CALL, as_tool_host, calc_host
from tests.hypothesis_budget import examples
from tests.unit.chat.test_image_transcript import picture
from ui.engine.worker import EngineClient

SETTLE_S = 30.0  # generous: the real model on two loaded cores
Key = tuple[str, int, bool]  # a passage: its file, its chunk, whether it is the whole file
STEPS = [0]  # steps run, for the closing report
CHECKED = {"fresh read": 0, "after a drop": 0}  # cache checks made on the real engine


class RecordingView:
    """A SessionView that remembers what a user would have seen."""

    def __init__(self) -> None:
        self.shown: list[Message] = []
        self.notices: list[str] = []

    def show_conversation(self, conv: Conversation, opened: bool, restoring: bool) -> None:
        self.shown = list(conv.messages)

    def reply_begun(self, shown: Sequence[Message], added_user: bool) -> None:
        self.shown = list(shown)

    def reply_ended(self, text: str, metrics: MessageMetrics | None, error: str) -> None:
        if metrics is not None:
            self.shown.append(Message("assistant", text))

    def open_failed(self, message: str) -> None:
        self.notices.append(message)

    def notice(self, text: str) -> None:
        self.notices.append(text)

    def row_saved(self, conv_id: str) -> None:
        pass

    def row_removed(self, conv_id: str) -> None:
        pass

    def tool_calls_changed(self, message: Message) -> None:
        pass


class Poster(QObject):
    """Runs a function on the session's (GUI) thread, from any thread: what the window's
    ``McpControl.post`` does for tool lists and calls."""

    posted = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.posted.connect(self._run)

    @Slot(object)
    def _run(self, fn: Callable[[], None]) -> None:
        fn()

    def post(self, fn: Callable[[], None]) -> None:
        self.posted.emit(fn)


class AllowAll:
    """Approvals that let every call run (the user chose "always" for the tool)."""

    def allowed(self, server: str, server_id: str, tool: str) -> bool:
        return True

    def remember(self, server: str, server_id: str, tool: str, decision: str) -> None:
        pass


class Link:
    """The EngineLink the session drives: the real client, with every request recorded."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self.issued: list[int] = []
        # What reached the engine's cache, in order: (what, request, the messages sent).
        self.ops: list[tuple[str, int, list[ChatMessage]]] = []

    def generate(
        self,
        conv_id: str,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None = None,
        compaction: str = "",
    ) -> int:
        request = self.client.generate(conv_id, messages, params, tools, compaction=compaction)
        self.issued.append(request)
        # A compaction's summary leaves the cache as it was (then ``settle`` reads anew).
        self.ops.append(("compact" if compaction else "generate", request, list(messages)))
        return request

    def settle(
        self,
        conv_id: str,
        messages: list[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None = None,
    ) -> None:
        self.ops.append(("settle", 0, list(messages)))
        self.client.settle(conv_id, messages, params, tools)

    def restore_undo(self, conv_id: str, summary_id: str) -> None:
        self.ops.append(("undo", 0, []))
        self.client.restore_undo(conv_id, summary_id)

    def stop(self) -> None:
        self.client.stop()

    def reset(self) -> None:
        self.ops.append(("reset", 0, []))
        self.client.reset()

    def restore_snapshot(self, conv_id: str) -> None:
        self.ops.append(("restore", 0, []))
        self.client.restore_snapshot(conv_id)

    def drop_snapshot(self, conv_id: str) -> None:
        self.client.drop_snapshot(conv_id)


class Harness(QObject):
    """One 'process': a worker thread, a session and the wiring the window would do."""

    def __init__(
        self, data: Path, backend: Callable[[], Backend], model: str, load: LoadConfig
    ) -> None:
        super().__init__()
        self.dirs = data_dirs(data)
        self.store = ConversationStore(self.dirs.root)
        self.store.drop_orphan_snapshots()  # as the app does at start
        self.client = EngineClient(self.dirs.models, engine_factory=backend, store=self.store)
        self.link = Link(self.client)
        self.view = RecordingView()
        self.tool_host = calc_host(self.dirs.root)
        self.poster = Poster()
        self.session = ChatSession(
            self.store,
            self.link,
            self.view,
            tool_host=as_tool_host(self.tool_host),
            approvals=AllowAll(),
            post=self.poster.post,
        )
        self.terminals: dict[int, int] = {}
        self.replies: dict[int, MessageMetrics] = {}  # finished requests
        self.model_path = model
        self.load_config = load
        self.loading = False
        self.dead = False  # crashed: nothing reaches the session any more
        w = self.client.worker
        w.tokens.connect(self._on_tokens)
        w.finished.connect(self._on_finished)
        w.cancelled.connect(self._on_cancelled)
        w.failed.connect(self._on_failed)
        w.modelLoaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)

    def _count(self, request: int) -> None:
        self.terminals[request] = self.terminals.get(request, 0) + 1

    @Slot(int, str)
    def _on_tokens(self, request: int, text: str) -> None:
        if not self.dead:
            self.session.on_tokens(request, text)

    @Slot(int, str, object, str, object)
    def _on_finished(
        self,
        request: int,
        text: str,
        metrics: MessageMetrics,
        reasoning: str,
        calls: Sequence[ToolCall],
    ) -> None:
        self._count(request)
        self.replies[request] = metrics
        if not self.dead:
            self.session.on_finished(request, text, metrics, reasoning, calls)

    @Slot(int, str, object)
    def _on_cancelled(self, request: int, text: str, metrics: MessageMetrics) -> None:
        self._count(request)
        if not self.dead:
            self.session.on_cancelled(request, text, metrics)

    @Slot(int, str)
    def _on_failed(self, request: int, message: str) -> None:
        self._count(request)
        if not self.dead:
            self.session.on_failed(request, message)

    @Slot(object)
    def _on_loaded(self, info: ModelInfo) -> None:
        self.loading = False
        self.session.model = info

    @Slot(str, bool)
    def _on_load_failed(self, _message: str, _still: bool) -> None:
        self.loading = False

    def load(self) -> None:
        self.link.ops.append(("load", 0, []))
        self.loading = True
        self.client.load(self.model_path, self.load_config)

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            QCoreApplication.processEvents()
            time.sleep(0.001)

    def settle(self) -> None:
        """Wait until no reply runs, no load is pending and the worker queue is empty."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            QCoreApplication.processEvents()
            if not self.session.busy and not self.loading:
                self.client.drain()
                QCoreApplication.processEvents()
                if not self.session.busy and not self.loading:
                    return
            time.sleep(0.002)
        raise AssertionError("the session did not settle")

    def quit(self) -> None:
        """What closing the window does: stop, wait for the reply to end, save, join."""
        self.session.stop()
        deadline = time.monotonic() + SETTLE_S
        while self.session.busy and time.monotonic() < deadline:
            QCoreApplication.processEvents()
            time.sleep(0.001)
        self.session.save()
        assert self.client.shutdown()
        QCoreApplication.processEvents()

    def crash(self) -> None:
        """The process dies wherever it is: no stop, no save; only the files remain."""
        self.dead = True
        assert self.client.shutdown()
        QCoreApplication.processEvents()


def roles_alternate(messages: Sequence[Message]) -> bool:
    """The turns alternate (a compaction's summary and the messages it holds are read in
    the system turn, not as turns)."""
    turns = [m for m in messages if not (m.summarised or m.summary_of)]
    return all(a.role != b.role for a, b in itertools.pairwise(turns))


def calls_answered(messages: Sequence[Message]) -> bool:
    """Each call of an assistant turn has its result among the tool messages after it."""
    for i, m in enumerate(messages):
        results = itertools.takewhile(lambda x: x.role == "tool", messages[i + 1 :])
        if m.role == "assistant" and {c["id"] for c in m.tool_calls} - {
            r.tool_call_id for r in results
        }:
            return False
    return True


def same_messages(a: Sequence[Message], b: Sequence[Message]) -> bool:
    return [(m.role, m.content) for m in a] == [(m.role, m.content) for m in b]


class Interleavings(RuleBasedStateMachine):
    """Random user actions against one data directory (see the module docstring)."""

    backend: Callable[[], Backend] = FakeEngine
    model_path = ""
    load_config = LoadConfig(n_ctx=2048, n_threads=1)
    params = SamplingParams(max_tokens=8, tools="off")  # the ``tools`` rule turns them on

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="lamplight-interleave-"))
        if not self.model_path:
            fake_model = self.tmp / "model.gguf"
            fake_model.write_bytes(b"fake model")  # the snapshot header fingerprints it
            self.model_path = str(fake_model)
        self.h = self._start()
        self.snapshots_seen: set[str] = set()
        self.deleted: set[str] = set()
        self.save_failure_armed = False
        self.refused: set[str] = set()  # conversations whose last writes failed at a quit
        self.box = ""  # the input box
        self.words = itertools.count()
        self.typed: dict[str, str] = {}  # each typed word -> the conversation it went to
        # conversation id -> {message id: its text}: what each conversation has held
        self.held: dict[str, dict[str, str]] = {}
        # conversation id -> {message id: (its passages, its pictures)}, likewise
        self.held_parts: dict[str, dict[str, tuple[set[Key], set[str]]]] = {}
        self.confirmed: set[str] = set()  # what imports named and the user confirmed

    def _start(self) -> Harness:
        h = Harness(self.tmp / "data", type(self).backend, self.model_path, self.load_config)
        h.load()
        h.settle()
        assert h.session.model is not None
        return h

    @property
    def s(self) -> ChatSession:
        return self.h.session

    @initialize()
    def start(self) -> None:
        pass

    # -- the input box ----------------------------------------------------------------

    @rule()
    def type_word(self) -> None:
        word = f"w{next(self.words)}x"
        self.typed[word] = ""
        self.box = f"{self.box} {word}".strip()

    def _submit(self, fallback: str) -> str:
        """What the user sends: the box's text (emptied once the session took it)."""
        return self.box or fallback

    def _taken(self, sent: bool, text: str) -> None:
        if sent and text == self.box:
            for word in text.split():
                if word in self.typed:
                    self.typed[word] = self.s.conversation.id
            self.box = ""

    # -- actions (taken with or without a reply streaming) ----------------------------

    @rule(text=st.sampled_from(["hi", "tell me more", "why?", "ok\n\nnext"]))
    def send(self, text: str) -> None:
        if not self.s.busy and self.s.model is not None:
            text = self._submit(text)
            self._taken(self.s.send(text, self.params), text)

    @rule(ms=st.integers(0, 40))
    def let_time_pass(self, ms: int) -> None:
        self.h.pump(ms / 1000)

    @rule()
    def stop(self) -> None:
        self.s.stop()

    @rule()
    def stop_after_first_token(self) -> None:
        deadline = time.monotonic() + 5
        while self.s.busy and not self.s.reply_started and time.monotonic() < deadline:
            self.h.pump(0.001)
        self.s.stop()

    @rule()
    def new_chat(self) -> None:
        self.s.new_chat()

    @rule(pick=st.integers(0, 50))
    def open_other(self, pick: int) -> None:
        rows = [r for r in self.h.store.list() if r.id != self.s.conversation.id]
        if rows:
            self.s.open(rows[pick % len(rows)].id)

    @rule(talk=st.booleans(), undo=st.booleans())
    def compact(self, talk: bool, undo: bool) -> None:
        """Compact (``talk``: after three more exchanges, so there is something to);
        ``undo``: then Undo at once, which brings back the cache from before."""
        if self.s.busy or self.s.model is None:
            return
        for turn in range(3 if talk else 0):
            if self.s.send(f"fact {turn} please", self.params):
                self.h.settle()
        if self.s.busy:
            return
        before = self._cache_tokens()
        if self.s.compact(self.params):
            return  # too little to compact
        CHECKED["compactions"] = CHECKED.get("compactions", 0) + 1
        if not undo:
            return
        self.h.settle()
        if self.s.undo_compaction():
            self.h.settle()
            CHECKED["undos"] = CHECKED.get("undos", 0) + 1
            if before and self.s.conversation.active_summary() is None:
                assert self._cache_tokens() == before, "Undo did not bring the cache back"
                CHECKED["undo cache"] = CHECKED.get("undo cache", 0) + 1

    def _cache_tokens(self) -> list[int]:
        """The real engine's cache ([] on the fake one)."""
        from app.engine.local.engine import Engine

        engine = self.h.client.host.engine
        if not isinstance(engine, Engine) or engine.model is None:
            return []
        return list(engine.cached_tokens)

    @rule()
    def undo_compaction(self) -> None:
        if self.s.undo_compaction():
            CHECKED["undos"] = CHECKED.get("undos", 0) + 1

    @rule()
    def regenerate(self) -> None:
        if self.s.model is not None:
            self.s.regenerate(self.params)

    @rule()
    def answer_pending(self) -> None:
        if self.s.model is not None:
            self.s.answer_pending(self.params)

    @rule(pick=st.integers(0, 50), text=st.sampled_from(["edited", "again?"]))
    def edit(self, pick: int, text: str) -> None:
        users = [i for i, m in enumerate(self.s.conversation.messages) if m.role == "user"]
        if users and not self.s.busy and self.s.model is not None:
            self.s.begin_edit(users[pick % len(users)])
            text = self._submit(text)
            self._taken(self.s.send(text, self.params), text)

    @rule(pick=st.integers(0, 50), step=st.sampled_from([-1, 1]))
    def switch_version(self, pick: int, step: int) -> None:
        msgs = self.s.conversation.messages
        with_versions = [i for i in range(len(msgs)) if self.s.conversation.version_of(i)[1] > 1]
        if with_versions:
            self.s.switch_version(with_versions[pick % len(with_versions)], step)

    @rule(pick=st.integers(0, 50))
    def fork(self, pick: int) -> None:
        msgs = self.s.conversation.messages
        if msgs:
            self.s.fork(pick % len(msgs))

    @rule(current=st.booleans(), pick=st.integers(0, 50))
    def delete(self, current: bool, pick: int) -> None:
        rows = self.h.store.list()
        if current and self.s.conversation.messages:
            target = self.s.conversation.id
        elif rows:
            target = rows[pick % len(rows)].id
        else:
            return
        self.deleted.add(target)
        self.s.delete(target)

    @rule(
        trailing_user=st.booleans(),
        then_regenerate=st.booleans(),
        confirm=st.sampled_from([None, False, True]),
    )
    def import_conversation(
        self, trailing_user: bool, then_regenerate: bool, confirm: bool | None
    ) -> None:
        """An exported chat comes back (a user turn left unanswered at its end, or not),
        naming a file, a collection and a draft model elsewhere and asking for tools;
        the review is answered (``confirm``) or not asked (``import_json``)."""
        data = self.s.conversation.to_dict()
        n = next(self.words)
        named = [f"/elsewhere/{n}/hosts.yml", f"shared-{n}", f"/elsewhere/{n}/draft.gguf"]
        data.update(documents=named[:1], collections=named[1:2], draft_path=named[2])
        data["sampling"] = {**(data.get("sampling") or {}), "tools": "required"}
        word = ""
        if trailing_user:
            word = f"w{next(self.words)}x"
            if data["messages"] and data["messages"][-1]["role"] == "user":
                data["messages"][-1]["content"] += f" {word}"
            else:
                data["messages"].append({"role": "user", "content": word})
        if not data["messages"]:
            return
        try:
            conv = self._import(data, confirm)
        except OSError:
            return  # a save made to fail: the word is still in the file
        assert conv.sampling is not None
        assert conv.sampling["tools"] == ("required" if confirm else "off")
        if word:
            self.typed[word] = conv.id
        self.s.open(conv.id)
        if then_regenerate and self.s.model is not None:
            self.s.when_idle(lambda: self.s.regenerate(self.params) and None)

    # -- pictures, passages, documents, tools -------------------------------------------

    def _sources(self, doc: str) -> list[Source]:
        """Passages as the window's search gives them: a whole document, a retrieved one."""
        n = next(self.words)
        out = []
        if doc in ("whole", "both"):
            path = f"/docs/d{n % 4}.md"
            out.append(Source(1, path, path[6:], f"whole {n}", None, 1, 1, -1, True))
        if doc in ("passage", "both"):
            path = f"/docs/p{n % 3}.pdf"
            out.append(Source(len(out) + 1, path, path[6:], f"passage {n}", 2, 1, 4, n % 5))
        return out

    def _picture(self, image: bool) -> list[ImagePart]:
        """A picture, on the fake backend only (the real test model has no projector)."""
        if not image or not isinstance(self.h.client.host.engine, FakeEngine):
            return []
        color = ("red", "green", "blue")[next(self.words) % 3]
        return [self.h.store.images.put(picture(color), f"{color}.png")]

    @rule(
        image=st.booleans(),
        doc=st.sampled_from(["", "whole", "passage", "both"]),
        text=st.sampled_from(["look", "read this"]),
    )
    def send_with_attachments(self, image: bool, doc: str, text: str) -> None:
        """A message with a picture and the passages found for it."""
        if not self.s.busy and self.s.model is not None:
            text = self._submit(text)
            sent = self.s.send(text, self.params, self._picture(image), self._sources(doc))
            self._taken(sent, text)

    @rule(pick=st.integers(0, 50), doc=st.sampled_from(["", "whole", "passage", "both"]))
    def edit_with_passages(self, pick: int, doc: str) -> None:
        """An edit whose new text finds other passages: the documents the message had
        whole stay with it."""
        msgs = self.s.conversation.messages
        users = [i for i, m in enumerate(msgs) if m.role == "user"]
        if not users or self.s.busy or self.s.model is None:
            return
        index = users[pick % len(users)]
        had = {s.path for s in sources_from_list(msgs[index].sources) if s.whole}
        self.s.begin_edit(index)
        text = self._submit("edited, with passages")
        sent = self.s.send(text, self.params, sources=self._sources(doc))
        self._taken(sent, text)
        if sent:
            now = sources_from_list(self.h.view.shown[-1].sources)
            kept = {s.path for s in now if s.whole}
            assert had <= kept or len(now) == MAX_SOURCES, (had, kept)

    @rule(n=st.integers(0, 3))
    def attach_documents(self, n: int) -> None:
        """Attach → Documents… (or remove them all): the next messages draw on them."""
        self.s.set_documents([f"/docs/d{i}.md" for i in range(n)], ["mine"] if n else [])

    @rule(on=st.booleans())
    def tools(self, on: bool) -> None:
        """Replies call a tool (then answer with its result), or not; the fake only."""
        fake = self.h.client.host.engine
        if isinstance(fake, FakeEngine):
            fake.tool_calls = (CALL,) if on else ()
            self.params = replace(self.params, tools="auto" if on else "off")

    def _import(self, data: dict[str, object], confirm: bool | None) -> Conversation:
        if confirm is None:
            return self.h.store.import_json(json.dumps(data))
        source = self.tmp / "import.json"
        source.write_text(json.dumps(data))
        conv, held = self.h.store.import_reviewed(source)
        assert held and held.documents == tuple(data["documents"])  # type: ignore[arg-type]
        if confirm:  # Attach: the window restores them and saves
            restore(conv, held)
            self.confirmed |= {*held.documents, *held.collections, held.draft_path}
            self.h.store.save(conv)
        return conv

    @rule()
    def reload_model(self) -> None:
        self.s.when_idle(self.h.load)

    @rule(
        temperature=st.sampled_from([0.0, 0.7]),
        compact=st.booleans(),
        overflow=st.sampled_from(["truncate_middle", "rolling", "stop"]),
        system=st.sampled_from(["", "Be brief."]),
    )
    def change_setting(self, temperature: float, compact: bool, overflow: str, system: str) -> None:
        self.params = replace(self.params, temperature=temperature, overflow=overflow)
        if not self.s.busy:
            self.s.set_system_prompt(system)
        if compact:  # a model setting: the model is loaded again
            self.h.load_config = replace(self.h.load_config, n_batch=256)
            self.s.when_idle(self.h.load)

    @rule(
        part_way=st.sampled_from([0, 2]),
        how=st.sampled_from(["send", "regen", "edit", "send with passages"]),
    )
    def generate_fails_once(self, part_way: int, how: str) -> None:
        """The engine or server fails before the first token or part way through."""
        fake = self.h.client.host.engine
        if not isinstance(fake, FakeEngine) or self.s.busy or self.s.model is None:
            return
        fake.fail_with = DecodeError("llama.cpp failed while generating (code -1).")
        fake.fail_after = part_way
        try:
            if how == "regen" and self.s.regenerate(self.params):
                pass
            elif how == "edit" and any(m.role == "user" for m in self.s.conversation.messages):
                self.edit(0, "edited")
            elif how == "send with passages":  # left unanswered, then merged with the next
                self.send_with_attachments(True, "both", "fail please")
            else:
                self.send("fail please")
            self.h.settle()
        finally:
            fake.fail_with = None
            fake.fail_after = 0

    @rule()
    def save_fails_once(self) -> None:
        store = self.h.store
        original = store.save

        def failing(conv: Conversation) -> int:
            store.save = original  # type: ignore[method-assign]
            raise OSError(28, "No space left on device")

        store.save = failing  # type: ignore[method-assign]
        self.save_failure_armed = True

    @rule()
    def quit_and_restart(self) -> None:
        self.h.quit()
        shown_id = self.s.conversation.id  # after quit: queued actions may have switched
        shown = list(self.s.conversation.every_message())
        unsaved = self.s.unsaved
        if unsaved:  # the disk refused the last writes: what they held went with the process
            self.refused.add(shown_id)
        self.h = self._start()
        if shown and not unsaved and shown_id not in self.deleted:
            self.s.open(shown_id, restore=True)
            self.h.settle()
            assert same_messages(self.s.conversation.every_message(), shown), "reopened != shown"

    @rule(ms=st.integers(0, 30))
    def crash_and_restart(self, ms: int) -> None:
        """The app dies at any point (mid-reply too); what is on disk must be whole."""
        if self.s.unsaved or self.save_failure_armed:
            return  # a write that failed is lost with the process; that is the disk's doing
        self.h.pump(ms / 1000)
        self.h.crash()
        self.h = self._start()
        for row in self.h.store.list():
            assert not row.error, row.error
        self.check_held(on_disk_only=True)

    @invariant()
    def count_step(self) -> None:
        STEPS[0] += 1

    @rule()
    def settle_and_check(self) -> None:
        self.h.settle()
        self.check_settled()

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def roles_alternate_in_memory(self) -> None:
        assert roles_alternate(self.s.conversation.messages)

    @invariant()
    def at_most_one_terminal(self) -> None:
        assert all(n == 1 for n in self.h.terminals.values()), self.h.terminals

    def check_settled(self) -> None:
        h = self.h
        assert not self.s.busy
        # Exactly one terminal event per request.
        assert sorted(h.terminals) == sorted(h.link.issued), (h.terminals, h.link.issued)
        # What is shown is on disk (a failed write is retried by the next action).
        conv = self.s.conversation
        if self.s.unsaved:
            self.s.save()  # what the next action does
        if conv.messages and conv.id not in self.deleted and not self.s.unsaved:
            on_disk = h.store.load(conv.id)
            assert same_messages(on_disk.messages, conv.messages)
            assert same_messages(on_disk.every_message(), conv.every_message())
            assert same_messages(h.view.shown, conv.messages)
        for row in h.store.list():
            saved = h.store.load(row.id)
            assert roles_alternate(saved.messages), [m.role for m in saved.messages]
        assert calls_answered(conv.messages)  # (a file read back is settled by its reader)
        # A snapshot disappears only with its conversation.
        now = {p.name.removesuffix(".lpkv") for p in h.store.snapshots_dir.glob("*.lpkv")}
        # An undo snapshot (<conv>u<summary>) goes with an Undo or the next compaction.
        lost = {c for c in self.snapshots_seen - now - self.deleted if UNDO_MARK not in c}
        assert not lost, f"snapshots deleted while their conversation lives: {lost}"
        unsaved = {conv.id} if self.s.unsaved else set()
        owners = {c: c.split(UNDO_MARK, 1)[0] for c in now}
        orphans = {c for c in now if not h.store.transcript_path(owners[c]).exists()}
        orphans -= {c for c in now if owners[c] in unsaved}
        assert not orphans, f"snapshots without a transcript: {orphans}"
        self.snapshots_seen = now
        if not self.s.unsaved:
            self.check_held()
        self.check_cache()

    def check_cache(self) -> None:
        """On the real engine: the cache starts with BOS, and after a reply (shifted or
        not) it holds what a fresh read of the messages still sent would, then the reply."""
        from app.engine.local.engine import Engine
        from tests.near_tie import token_text

        engine = self.h.client.host.engine
        if not isinstance(engine, Engine) or engine.model is None:
            return
        cache = engine.cached_tokens
        if cache:
            assert cache[0] == engine.llama.token_bos(), "the cache lost its BOS token"
        ops = self.h.link.ops
        if not ops or ops[-1][0] != "generate" or ops[-1][1] not in self.h.replies:
            return
        metrics = self.h.replies[ops[-1][1]]
        sent = list(ops[-1][2])
        if metrics.dropped_count:
            del sent[metrics.dropped_from : metrics.dropped_from + metrics.dropped_count]
        expected = token_text(engine, engine.prompt_tokens(sent))
        assert token_text(engine, cache).startswith(expected), "cache != a fresh read"
        CHECKED["fresh read"] += 1
        CHECKED["after a drop"] += metrics.dropped_count > 0

    def check_held(self, on_disk_only: bool = False) -> None:
        """No typed word and no message a conversation held is lost, nor a picture or
        passage a message held; nothing an import named is used unless confirmed."""
        texts: dict[str, dict[str, str]] = {}
        convs = [self.h.store.load(row.id) for row in self.h.store.list()]
        conv = self.s.conversation
        if not on_disk_only and conv.messages:
            convs.append(conv)
        for c in convs:
            texts[c.id] = {m.id: m.content for m in c.every_message()}
            self.check_parts(c)
            for name in [*c.documents, *c.collections, c.draft_path]:
                outside = name.startswith(("/elsewhere/", "shared-"))
                assert not outside or name in self.confirmed, f"{name} used unconfirmed"
        everything = " ".join(t for held in texts.values() for t in held.values())
        for word, where in self.typed.items():
            if where in self.deleted | self.refused or (
                where and where not in texts and on_disk_only
            ):
                continue
            assert word in self.box.split() or word in everything.split(), f"{word} lost"
        for conv_id, held in self.held.items():
            if conv_id in self.deleted or conv_id not in texts:
                continue
            now = texts[conv_id]
            for mid, text in held.items():
                assert mid in now, f"message {mid} dropped from {conv_id}"
                assert text in now[mid], f"message {mid} lost text"
        for conv_id, now in texts.items():
            self.held.setdefault(conv_id, {}).update(now)

    def check_parts(self, conv: Conversation) -> None:
        """Each message keeps the pictures and passages it held (a passage may give way to
        its whole document, or to the limit a message keeps)."""
        seen = self.held_parts.setdefault(conv.id, {})
        if conv.id in self.deleted:
            return
        for m in conv.every_message():
            found = sources_from_list(m.sources)
            keys = {(s.path, s.chunk, s.whole) for s in found}
            digests = {r["digest"] for r in m.images}
            before_keys, before_digests = seen.get(m.id, (set(), set()))
            whole = {p for p, _c, w in keys if w}
            for key in before_keys - keys:
                covered = not key[2] and key[0] in whole
                assert covered or len(found) == MAX_SOURCES, f"message {m.id} lost {key}"
            assert before_digests <= digests, f"message {m.id} lost a picture"
            seen[m.id] = (keys, digests)

    def teardown(self) -> None:
        try:
            self.h.settle()
            self.check_settled()
        finally:
            self.h.quit()
            shutil.rmtree(self.tmp, ignore_errors=True)


def _fake() -> Backend:
    fake = FakeEngine(reply="one two three four five six", delay=0.002, prefill_delay=0.004)
    fake.caps = VISION_CAPABILITIES  # it sees the pictures sent to it
    return fake


class FakeInterleavings(Interleavings):
    backend = staticmethod(_fake)


FAKE_EXAMPLES = examples(100)  # the deep profile runs ten times as many
FAKE_STEPS = 50


def test_interleavings_fake_backend(qapp: QApplication) -> None:
    """Thousands of steps (examples x steps) on the fake backend."""
    run_state_machine_as_test(
        FakeInterleavings,
        settings=settings(
            max_examples=FAKE_EXAMPLES,
            stateful_step_count=FAKE_STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    print(f"interleaving steps run on the fake backend: {STEPS[0]}, {CHECKED}")
    assert STEPS[0] >= FAKE_EXAMPLES * 10


@pytest.mark.parametrize("system", ["", "Answer in one line."])
def test_interleavings_real_engine_overflowing(
    qapp: QApplication, model_path: Path, system: str
) -> None:
    """A small context on the real model: replies overflow under either policy, with and
    without a system prompt; after each, the cache equals a fresh read of what is kept."""
    from app.engine.local.engine import Engine

    class Overflowing(Interleavings):
        backend = Engine
        load_config = replace(TEST_LOAD, n_ctx=256)
        params = SamplingParams(max_tokens=36, temperature=0.0, overflow="rolling", tools="off")

        @initialize()
        def start(self) -> None:
            self.s.system_prompt = system
            self.s.conversation.system_prompt = system
            # Enough turns to overflow 256 tokens, each checked, then random actions.
            for turn in range(6):
                self.s.send(f"Tell me fact number {turn} about the sea.", self.params)
                self.h.settle()
                self.check_cache()

        @rule()
        def converse(self) -> None:
            if not self.s.busy and self.s.model is not None:
                self.s.send("And another one?", self.params)
                self.h.settle()
                self.check_cache()

    Overflowing.model_path = str(model_path)
    CHECKED.update({"fresh read": 0, "after a drop": 0})
    run_state_machine_as_test(
        Overflowing,
        settings=settings(
            max_examples=examples(3),
            stateful_step_count=10,  # after the six turns above, which overflow already
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    print(f"cache checks on the real engine: {CHECKED}")
    assert CHECKED["after a drop"] > 0


def test_interleavings_real_engine(qapp: QApplication, model_path: Path) -> None:
    """A short run on the real model: the same invariants with llama.cpp underneath."""
    from app.engine.local.engine import Engine

    class RealInterleavings(Interleavings):
        backend = Engine
        load_config = TEST_LOAD
        params = SamplingParams(max_tokens=6, temperature=0.0, tools="off")

    RealInterleavings.model_path = str(model_path)
    CHECKED.update({"compactions": 0, "undo cache": 0})
    run_state_machine_as_test(
        RealInterleavings,
        settings=settings(
            max_examples=examples(3),
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    print(f"on the real engine: {CHECKED}")


def test_interleavings_real_engine_compacting(qapp: QApplication, model_path: Path) -> None:
    """Compact and Undo among the other actions on the real model, in a context with room
    for a summary: Undo brings back the very cache from before the compaction."""
    from app.engine.local.engine import Engine

    class Compacting(Interleavings):
        backend = Engine
        load_config = replace(TEST_LOAD, n_ctx=1024)
        params = SamplingParams(max_tokens=8, temperature=0.0, tools="off")

        @initialize(undo=st.booleans())
        def start(self, undo: bool) -> None:
            for turn in range(4):
                self.s.send(f"Tell me fact number {turn} about the sea.", self.params)
                self.h.settle()
            self.compact(talk=False, undo=undo)  # at least one, then random actions

        @rule(undo=st.booleans())
        def talk_and_compact(self, undo: bool) -> None:
            self.compact(talk=True, undo=undo)

    Compacting.model_path = str(model_path)
    CHECKED.update({"compactions": 0, "undos": 0, "undo cache": 0})
    run_state_machine_as_test(
        Compacting,
        settings=settings(
            max_examples=examples(3),
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    print(f"compaction on the real engine: {CHECKED}")
    assert CHECKED["compactions"] > 0
