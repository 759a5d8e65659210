"""Running a ``ReplyJob`` on the engine thread, to exactly one terminal event.

``run_reply`` ends every job with one, whatever happens: ``Finished``, or
``ReplyFailed`` with the exception (a refusal, an engine error, a stream that ended
without a result); the job's ``Relay`` drops whatever would come after it.

A window reply hears its ``Finished`` as soon as the stream ends (the window shows
it while the cache is saved); an API job hears it after the clean-up, so when the
client has its answer the engine is done with the job.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from app.engine.backend import EngineEvent, Finished, Token
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics
from app.engine.templates.override import AUTO
from app.host import compaction_steps, prompt_cache
from app.host.core import EngineCore, gui_key
from app.host.jobs import (
    ModelGone,
    NoResult,
    Relay,
    ReplyFailed,
    ReplyJob,
    TemplateUnavailable,
    model_id,
)
from app.host.kv_pool import GUI, LOCAL_API
from app.remote.http import ServerUnreachable
from app.util.errors import LamplightError, NoModelLoaded

log = logging.getLogger(__name__)


def run_reply(core: EngineCore, job: ReplyJob) -> None:
    """Run ``job`` to exactly one terminal event, between ``job_started`` and ``job_ended``."""
    relay = job.relay
    try:
        core.listener.job_started(job)
        with core.steps.during():
            core.steps.reply("chat" if job.origin == "gui" else "api", job.conv_id, job.params)
            _run(core, job, relay)
    except Exception as exc:  # one terminal event per job, whatever happens
        if not isinstance(exc, LamplightError):
            log.exception("a reply failed")
        relay.send(ReplyFailed(exc))
        if isinstance(exc, ServerUnreachable):
            core.listener.connection_state("lost", str(exc))
    finally:
        if not relay.ended:
            relay.send(ReplyFailed(NoResult()))
        core.listener.job_ended(job)


def _run(core: EngineCore, job: ReplyJob, relay: Relay) -> None:
    if job.model_id:  # a job checked against a model: refused unless that one is loaded
        if job.stop.is_set():  # stopped while it waited: the cache stays as it is
            relay.send(Finished("", MessageMetrics(stop_reason="cancelled")))
            return
        info = core.engine.model
        if info is None:
            raise NoModelLoaded("No model is loaded.")
        if job.model_id not in (model_id(info), info.name):
            raise ModelGone(job.model_id, model_id(info))
    caps = core.engine.capabilities
    want = core.chat_choice if job.template == "model" else job.template
    if want is not None and want.kind == "plain" and not caps.template_override:
        why = caps.why_not.get("template_override", "the server renders the prompt itself")
        raise TemplateUnavailable(f"Text completion is not available with this engine: {why}.")
    swapped = want is not None and caps.template_override and want != core.template_choice
    key = gui_key(job.conv_id) if job.conv_id else None
    party = job_party(job)
    warmed = prompt_cache.Warmed()
    try:
        if swapped:
            core.engine.set_template(want or AUTO)
        opens = job.messages[:1]
        if job.reuse and job.prefix and opens and opens[0].role == "system":
            # A new chat in a project: its opening is where it starts (another chat's
            # cache shares no more with it, and a restored one may not rewind that far).
            core.pool.start_empty(party)
            core.prefixes.apply(core.engine, job.prefix, opens, job.params, job.tools)
        elif job.reuse:
            served = core.pool.prepare(key, job.messages, party)
            if served == "none" and job.origin == "api":  # an agent's opening, saved?
                args = (core.engine, party, job.messages, job.params, job.tools)
                warmed = prompt_cache.warm(core.prompt_cache, *args)
        else:
            core.pool.start_empty(party)
        if job.compaction:
            summary = compaction_steps.summarise(core, job, lambda ev: _stream(core, relay, ev))
            if summary is None:
                raise NoResult()
            relay.send(summary)
            return
        events = core.engine.generate(
            job.messages, job.params, job.stop, job.end_thinking, tools=job.tools
        )
        with contextlib.closing(events) as ev:
            ended = _stream(core, relay, ev)
        if ended is None:
            raise NoResult()
        prompt_cache.account(ended.metrics, warmed)
        if job.origin == "gui":
            relay.send(ended)
        _after(core, job, key, party, ended)
    finally:
        if swapped:
            core.restore_template()
    relay.send(ended)  # an API job's answer: after the clean-up


def _stream(core: EngineCore, relay: Relay, events: Iterator[EngineEvent]) -> Finished | None:
    """Pass tokens and progress on; returns the ``Finished`` (None if none came)."""
    for event in events:
        if isinstance(event, Finished):
            return event
        if isinstance(event, Token):
            core.steps.decoding()  # a marker write on the first token only
        relay.send(event)
    return None


def job_party(job: ReplyJob) -> str:
    """Whose caches ``job`` may reuse (``KvPool``): the window's, or its API client's."""
    return GUI if job.origin == "gui" else job.party or LOCAL_API


def _after(core: EngineCore, job: ReplyJob, key: str | None, party: str, ended: Finished) -> None:
    """Name the cache's owner, prepare the next turn, save the snapshot; the reply
    stands whatever happens here."""
    metrics = ended.metrics
    try:
        reply = ChatMessage("assistant", ended.text, ended.reasoning, ended.tool_calls)
        core.pool.finish(key, job.messages, reply, party)
        if metrics.stop_reason == "connection_lost":
            core.listener.connection_state("lost", metrics.notes[-1] if metrics.notes else "")
            return
        if not job.next_turn:
            return
        if metrics.stop_reason != "cancelled":
            core.prewarm(job.messages, reply)
        if job.conv_id and (metrics.generated_tokens or metrics.stop_reason != "cancelled"):
            # A reply stopped before its first token leaves the saved cache as it was.
            core.save_snapshot(job.conv_id, frozenset({job.conv_id}))
    except Exception:
        log.exception("after a reply")
        core.pool.forget_live()
