"""llama.cpp's ``llama-server`` as a ``Backend``: the same chat, cache and snapshots, remotely.

Lamplight renders the prompt itself (the same templates and sandbox as
in-process) and sends it to ``/completion`` as token ids, so the server's slot
holds exactly the tokens this client tracks in its ``ContextMap``: generated
tokens are never re-tokenized, and a restored snapshot continues without
re-reading. The server matches the prompt against its slot (``cache_prompt``)
and evaluates only what is new.

What lives where:

- the KV cache is in the server's slot ``Connection.slot``; snapshots are files
  in the server's ``--slot-save-path`` (a ring of ``SLOT_FILES`` per connection
  and slot, each conversation keeping its own while it is among the most recently
  saved), and the Lamplight snapshot on this machine keeps the compatibility
  header, the tokens and the text, and names the server file;
- LoRA adapters are the ones the server loaded at start (``--lora``); every
  request sends every adapter with an explicit scale (llama.cpp issue #28674).

A context overflow follows the in-process policies: whole turns are dropped
before sending (measured with ``/tokenize``); the server re-reads what follows
them, since it cannot shift a slot on request. A reply that fills the context
drops turns and continues in a new request.

The server is not trusted to stop: a reply is cut on this side at ``n_predict``
(+ ``TOKEN_SLACK``) tokens, at ``reply_byte_cap`` bytes and at its time bounds
(``app.remote.http.Limits``), and every field of every answer is type-checked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from app.config.params import LoadConfig, SamplingParams, SettingError, grammar_for
from app.engine.backend import (
    SERVER_ERROR,
    SIZE_LIMIT,
    TIME_LIMIT,
    Capabilities,
    DraftInfo,
    EngineEvent,
    Finished,
    KvState,
    LoadCancelled,
    ModelInfo,
    PrefillProgress,
    ProgressFn,
    Token,
    cut_to_bytes,
)
from app.engine.context_map import ContextMap, common_prefix
from app.engine.hardware import HardwareInfo
from app.engine.metrics import MessageMetrics
from app.engine.overflow import Overflow, message_starts, reply_budget
from app.engine.templates import (
    AUTO,
    TURN_MARKERS,
    ChatMessage,
    ChatTemplate,
    ChatTemplateError,
    TemplateInputs,
    TemplateOverride,
    build_template,
    clean_text,
    looks_like_base_model,
    render_or_fall_back,
    template_for_architecture,
)
from app.gguf.lora import LoraError, LoraStack, stack_key
from app.remote.connection import Connection
from app.remote.http import (
    DEFAULT_LIMITS,
    TOKEN_SLACK,
    Budget,
    EventStream,
    Limits,
    ServerError,
    ServerSilent,
    ServerUnreachable,
    call,
    cannot_connect,
    client_for,
    end_early,
    end_lost,
    make_client,
    make_clients,
    sentence,
    too_large,
    unfinished,
    where,
)
from app.util.datafiles import DataFileError, parse_json
from app.util.errors import (
    ApiKeyRefused,
    DecodeError,
    DraftError,
    LamplightError,
    ModelLoadError,
    NoModelLoaded,
    ServerOverflowError,
)

log = logging.getLogger(__name__)

LOAD_WAIT_S = 600.0  # a server still loading a big model answers 503 meanwhile
MAX_CONTINUATIONS = 8  # a reply that fills the context this many times ends there
MAX_COUNT = (1 << 31) - 1  # a count or token id beyond this from the server is not believed
SLOT_FILES = 16  # slot files per connection and slot on the server (docs: the ring)
_FILE_NAME = re.compile(r"lamplight-[0-9a-f]{8,64}(-(\d{1,3}|pool))?\.bin")
LORA_CHANGED_NOTE = "the LoRA stack changed"
_MIROSTAT = {"off": 0, "v1": 1, "v2": 2}
_STATE_FORMAT = "lamplight-llama-server-slot"
DRAFT_WHY_NOT = (
    "a draft model runs with the in-process engine only; llama-server drafts with the "
    "model given on its own command line (--model-draft FILE), if any"
)


@dataclass(frozen=True)
class _Prompt:
    """A request's prompt: its tokens, the text they encode, the cached tokens it
    reuses (``n_mark``) and the message starts in it (``bounds``: tokens, characters)."""

    tokens: list[int]
    text: str
    n_mark: int
    bounds: list[tuple[int, int]]


class LlamaServerBackend:
    """A ``Backend`` that drives one slot of a llama-server."""

    def __init__(
        self, connection: Connection, api_key: str = "", limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self.connection = connection
        self._api_key = api_key
        self._limits = limits
        self._client: Any = None  # JSON calls, on kept-alive connections
        self._streams: Any = None  # replies, a connection each (see app.remote.http)
        self._files: dict[str, str] = {}  # conversation key -> slot file, most recent last
        self._restored = ""  # the slot file last restored (its key is not known yet)
        self._info: ModelInfo | None = None
        self._props: dict[str, Any] = {}
        self._template: ChatTemplate | None = None
        self._inputs = TemplateInputs()
        self._map = ContextMap()  # what this client believes the slot holds
        self._adapters: list[dict[str, Any]] = []  # the server's: id, path, name
        self._stack = LoraStack()
        self._kv_lora: tuple[tuple[str, float], ...] = ()  # the stack the slot's cache used
        self._sent: tuple[list[ChatMessage], list[ChatMessage]] | None = None
        self._special: dict[str, bool] = {}  # which texts are one token of the vocabulary

    # -- connection and model ----------------------------------------------------

    @property
    def model(self) -> ModelInfo | None:
        return self._info

    @property
    def capabilities(self) -> Capabilities:
        why = {
            "token_latency": "the times between tokens are measured as they arrive over the "
            "network; the server's own decode rate is shown beside them",
            "gpu_offload": f"the model runs on the server at {where(self.connection.url)}; "
            "its GPU settings are the server's command line",
            "draft_model": DRAFT_WHY_NOT,
        }
        if not self._adapters:
            why["lora"] = (
                "the server loaded no LoRA adapters; start llama-server with --lora FILE "
                "(and --lora-init-without-apply) to stack them here"
            )
        return Capabilities(
            snapshots=True,
            lora=bool(self._adapters),
            grammar=True,
            prewarm=True,
            template_override=True,
            why_not=why,
        )

    def hardware(self) -> HardwareInfo:
        return HardwareInfo(False, ())

    def ping(self) -> str:
        try:
            with client_for(self._client, self.connection, self._api_key) as client:
                health = call(client, "GET", "/health", timeout=5.0)
        except LamplightError as exc:
            return str(exc)
        if isinstance(health, dict) and health.get("status") == "ok":
            return ""
        return f"The server at {where(self.connection.url)} is not ready."

    def load(
        self, path: str | Path, config: LoadConfig, progress: ProgressFn | None = None
    ) -> ModelInfo:
        """Connect: wait for the server's model, read its settings, template and adapters.

        ``path`` is ignored (a llama-server serves one model); ``config`` too: the
        context size and threads are the server's command line. Every wait is bounded
        (``Limits``); the model in use stays until the new one is ready.

        Raises:
            ModelLoadError: the server cannot be reached, is not a llama-server, or was
                not ready in time.
            LoadCancelled: ``progress`` returned False while waiting.
        """
        t0 = time.perf_counter()
        conn = self.connection
        try:
            client, streams = make_clients(conn.url, self._api_key, conn.verify_tls)
        except LamplightError as exc:
            raise ModelLoadError(cannot_connect(conn, exc)) from None
        try:
            self._wait_ready(client, progress)
            call_s = self._limits.call_s
            props = call(client, "GET", "/props", timeout=call_s)
            models = call(client, "GET", "/v1/models", timeout=call_s)
            adapters = call(client, "GET", "/lora-adapters", timeout=call_s)
            n_ctx = _check_props(props, conn)
        except BaseException as exc:
            client.close()
            streams.close()
            if isinstance(exc, ServerUnreachable | ServerError):
                raise ModelLoadError(cannot_connect(conn, exc)) from None
            raise
        old = (self._client, self._streams)
        self._client, self._streams = client, streams
        for each in old:
            if each is not None:
                each.close()
        self._props = props
        self._special = {}
        self._adapters = _adapters(adapters)
        self._stack = LoraStack()
        self._kv_lora = ()
        self._map.clear()
        self._files.clear()
        self._restored = ""
        self._inputs = self._template_inputs(props)
        template = build_template(AUTO, self._inputs, self._has_token)
        self._template = template
        meta = _model_meta(models)
        model_path = _text(props.get("model_path"), 1000) or _text(props.get("model_alias"), 1000)
        model_path = model_path or "model"
        name = PurePosixPath(model_path.replace("\\", "/")).name or model_path
        build = _text(props.get("build_info"), 100)
        size = _int(meta.get("size"), 0)
        n_params = _int(meta.get("n_params"), 0)
        ident = json.dumps([conn.url, model_path, size, n_params, build])
        notes = (template.note,) if template.note else ()
        self._info = ModelInfo(
            path=Path(model_path),
            name=name,
            architecture=(_text(meta.get("ftype"), 60) or _text(props.get("model_ftype"), 60)),
            n_params=n_params,
            file_size=size,
            n_ctx=n_ctx,
            n_ctx_train=_int(meta.get("n_ctx_train"), n_ctx),
            n_threads=0,
            n_gpu_layers=0,
            template=template.label,
            backend=f"llama-server at {where(conn.url)}",
            load_ms=(time.perf_counter() - t0) * 1000,
            notes=notes,
            capabilities=self.capabilities,
            server=conn.url,
            fingerprint={
                "name": name,
                "size": size,
                "sha256": "server:" + hashlib.sha256(ident.encode()).hexdigest(),
            },
            runtime={"llama_server": build},
            adapters=tuple(a["path"] for a in self._adapters),
            template_inputs=self._inputs,
            base_model=looks_like_base_model(
                (_text(props.get("model_alias"), 1000), name),
                has_template=bool(self._inputs.embedded),
            ),
        )
        log.info("connected to llama-server %s (%s, n_ctx %d)", where(conn.url), name, n_ctx)
        return self._info

    def _wait_ready(self, client: Any, progress: ProgressFn | None) -> None:
        """Wait while the server loads its model (503), at most ``Limits.ready_s``.

        Raises:
            ModelLoadError: a ``/health`` that is not llama-server's, or not ready in time.
            ServerUnreachable, ServerError, LoadCancelled.
        """
        limit = self._limits.ready_s
        deadline = time.monotonic() + limit
        host = where(self.connection.url)
        step = 0
        while True:
            try:
                health = call(client, "GET", "/health", timeout=min(10.0, self._limits.call_s))
            except ServerError as exc:
                if exc.status != 503:
                    raise
                if time.monotonic() > deadline:
                    raise ModelLoadError(
                        f"Could not connect to {self.connection.name}: the server at {host} "
                        f"was still loading its model after {limit:.0f} s ({exc})."
                    ) from None
            else:
                if isinstance(health, dict) and health.get("status") == "ok":
                    if progress is not None:
                        progress(1.0)
                    return
                # vLLM, a proxy's page, another server: 200, but not llama-server's answer.
                raise ModelLoadError(
                    f"Could not connect to {self.connection.name}: the server at {host} "
                    "answers /health but not as llama-server does (it said "
                    f"{_snippet(health)}). If it is another kind of server, add it as an "
                    "OpenAI-compatible server instead."
                )
            step += 1
            # The server does not say how far its load is: an honest creep, never 100 %.
            if progress is not None and not progress(min(0.9, step / (step + 20))):
                raise LoadCancelled("cancelled")
            time.sleep(0.25)

    def _template_inputs(self, props: dict[str, Any]) -> TemplateInputs:
        source = props.get("chat_template")
        source = source if isinstance(source, str) else ""
        bos = str(props.get("bos_token") or "")
        eos = str(props.get("eos_token") or "")
        # llama-server falls back to ChatML for a model without a template; its markers
        # are then no tokens of this vocabulary, and the built-in template for the
        # model's family (told by which turn markers are tokens) fits better.
        uses = [t for t in TURN_MARKERS if t in source]
        if uses and not any(self._has_token(t) for t in uses):
            source = ""
        arch = _family(self._has_token)
        builtin = template_for_architecture(arch, self._has_token).name
        return TemplateInputs(source, arch, builtin, bos, eos)

    def set_template(self, override: TemplateOverride) -> ModelInfo:
        """Render prompts with ``override`` from the next message on (this app renders them).

        Raises:
            NoModelLoaded.
        """
        self._require()
        self._use_template(build_template(override, self._inputs, self._has_token))
        assert self._info is not None
        return self._info

    def _use_template(self, template: ChatTemplate) -> None:
        assert self._info is not None
        self._template = template
        notes = (template.note,) if template.note else ()
        self._info = replace(self._info, template=template.label, notes=notes)

    def _render(self, messages: Sequence[ChatMessage]) -> tuple[str, str]:
        """The prompt text, and a note when a chosen template failed and its fallback took
        over (from now on)."""
        assert self._template is not None
        text, fallback = render_or_fall_back(self._template, messages)
        if fallback is None:
            return text, ""
        self._use_template(fallback)
        return text, fallback.note.rstrip(".")

    def _has_token(self, text: str) -> bool:
        if text not in self._special:
            try:
                ids = self._tokenize(text)
            except LamplightError:
                ids = []
            self._special[text] = len(ids) == 1
        return self._special[text]

    def unload(self) -> None:
        for client in (self._client, self._streams):
            if client is not None:
                client.close()
        self._client = self._streams = None
        self._files.clear()
        self._restored = ""
        self._info = None
        self._template = None
        self._inputs = TemplateInputs()
        self._map.clear()
        self._sent = None

    def reset(self) -> None:
        # The slot keeps its cache; the next prompt shares no prefix with what this
        # client tracks, so the server evaluates it afresh where it differs.
        self._map.clear()
        self._sent = None

    # -- LoRA --------------------------------------------------------------------

    @property
    def adapters(self) -> list[dict[str, Any]]:
        """The adapters the server loaded: ``id``, ``path``, ``name``."""
        return [dict(a) for a in self._adapters]

    @property
    def lora_stack(self) -> LoraStack:
        return self._stack.copy()

    @property
    def draft_info(self) -> DraftInfo | None:
        return None  # a draft the server was started with is the server's business

    def set_draft(self, path: str | Path | None, n_ctx: int = 0) -> DraftInfo | None:
        """Only "no draft" is accepted: this app cannot load a model on the server.

        Raises:
            DraftError.
        """
        if path:
            raise DraftError(f"Cannot use a draft model here: {DRAFT_WHY_NOT}.")
        return None

    def lora_signature(self) -> list[dict[str, Any]]:
        return _signature(self._stack)

    def set_lora_stack(self, stack: LoraStack) -> bool:
        """Use ``stack`` from the next request on; every entry must be a server adapter.

        Raises:
            NoModelLoaded, LoraError.
        """
        self._require()
        known = {a["path"] for a in self._adapters}
        for entry in stack:
            if str(entry.path) not in known:
                raise LoraError(
                    f"The server did not load {entry.path.name}: llama-server takes adapters "
                    "at start (--lora FILE); this app sets only their scales."
                )
        self._stack = stack.copy()
        return bool(self._map.tokens) and stack_key(_signature(stack)) != self._kv_lora

    def _lora_body(self) -> list[dict[str, Any]]:
        scales = {str(e.path): e.scale for e in self._stack if e.active}
        # Every adapter with an explicit scale: one left out would keep its last one.
        return [{"id": a["id"], "scale": scales.get(a["path"], 0.0)} for a in self._adapters]

    def _sync_lora(self) -> str:
        key = stack_key(_signature(self._stack))
        if key == self._kv_lora:
            return ""
        self._kv_lora = key
        if not self._map.tokens:
            return ""
        self._map.clear()  # the slot's cache was computed with other adapters
        return LORA_CHANGED_NOTE

    # -- snapshots ---------------------------------------------------------------

    def cache_config(self) -> dict[str, Any]:
        info = self._require()
        return {
            "n_ctx": info.n_ctx,
            "server": self.connection.url,
            "slot": self.connection.slot,
            "lora": _signature(self._stack),
        }

    def export_state(self, key: str = "") -> KvState:
        """Save the slot on the server (``--slot-save-path``) as this conversation's file.

        The file is one of ``SLOT_FILES`` names per connection and slot (``_file_name``),
        so the server keeps a bounded number of them, whatever is deleted here.

        Raises:
            LamplightError: the server could not save it, or holds other tokens.
        """
        self._require()
        if not self._map.tokens:
            return KvState(b"", [], "", [])
        name = self._file_name(key)
        answer = self._call(
            "POST", f"/slots/{self.connection.slot}?action=save", {"filename": name}
        )
        n_saved = _int(answer.get("n_saved") if isinstance(answer, dict) else None, -1)
        tokens = list(self._map.tokens)
        if n_saved < len(tokens) - 1:  # the last sampled token is never evaluated
            raise LamplightError(
                f"the server's slot holds {n_saved} tokens, not the {len(tokens)} of this "
                "conversation (another client used it)"
            )
        ref = {"format": _STATE_FORMAT, "file": name, "n_saved": n_saved}
        return KvState(json.dumps(ref).encode(), tokens, self._map.text, list(self._map.marks))

    def import_state(self, kv: KvState) -> None:
        """Restore the conversation's file into the slot, after checking the server is the same.

        A file another conversation has since overwritten restores another token count
        and is refused here; were the counts equal, the server itself compares each
        prompt with the tokens its slot holds, so the reply is still right (it re-reads).

        Raises:
            LamplightError: a different server, model or context now; a missing file.
        """
        info = self._require()
        self._map.clear()
        if not kv.tokens:
            return
        try:
            ref = parse_json(bytes(kv.state)[:4096], 4)
            name, n_saved = ref["file"], ref["n_saved"]
            if ref.get("format") != _STATE_FORMAT or not isinstance(n_saved, int):
                raise ValueError(ref.get("format"))
            if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
                raise ValueError(name)
        except (DataFileError, ValueError, KeyError, TypeError, AttributeError):
            raise LamplightError("it is not a llama-server slot snapshot") from None
        props = self._call("GET", "/props")
        now = _text(props.get("model_path"), 1000) if isinstance(props, dict) else ""
        if now != _text(self._props.get("model_path"), 1000):
            raise LamplightError(f"the server now runs another model ({now or 'unknown'})")
        if not isinstance(props, dict) or props.get("build_info") != self._props.get("build_info"):
            raise LamplightError("the server now runs another llama.cpp build")
        n_ctx = _int(_settings(props).get("n_ctx"), 0)
        if n_ctx != info.n_ctx:
            raise LamplightError(f"the server's context size changed ({info.n_ctx} → {n_ctx})")
        try:
            answer = self._call(
                "POST", f"/slots/{self.connection.slot}?action=restore", {"filename": name}
            )
        except ServerError as exc:
            raise LamplightError(f"the server could not restore its copy ({exc})") from None
        restored = _int(answer.get("n_restored") if isinstance(answer, dict) else None, -1)
        if restored != n_saved or restored < len(kv.tokens) - 1:
            raise LamplightError(f"the server restored {restored} tokens, not {n_saved}")
        self._map = ContextMap(list(kv.tokens), kv.text, list(kv.marks) or [(0, 0)])
        self._kv_lora = stack_key(_signature(self._stack))
        self._restored = name

    def _file_name(self, key: str) -> str:
        """The slot file for conversation ``key``: one of a ring of ``SLOT_FILES`` names.

        A conversation keeps its name while it is among the ``SLOT_FILES`` most recently
        saved this session; a new one starts at the name its key hashes to (its own
        name in an earlier session, most likely) or takes the one just restored for it,
        else the first free name, else the least recently saved one. ``key`` "" (the
        RAM pool's stashes) has a name of its own.
        """
        base = hashlib.sha256(f"{self.connection.id}\n{self.connection.slot}".encode())
        prefix = f"lamplight-{base.hexdigest()[:24]}"
        if not key:
            return f"{prefix}-pool.bin"
        name = self._files.pop(key, "")
        used = set(self._files.values())
        if not name:
            start = int(hashlib.sha256(key.encode()).hexdigest(), 16) % SLOT_FILES
            ring = [f"{prefix}-{(start + i) % SLOT_FILES:02d}.bin" for i in range(SLOT_FILES)]
            restored, self._restored = self._restored, ""
            free = [n for n in ring if n not in used]
            if restored in ring and restored not in used:
                name = restored
            elif free:
                name = free[0]
            else:
                oldest = next(iter(self._files))
                name = self._files.pop(oldest)
        self._files[key] = name  # now the most recent
        return name

    # -- generation --------------------------------------------------------------

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event | None = None,
    ) -> Generator[EngineEvent, None, None]:
        """Stream the reply from the server (see ``Backend.generate``).

        Once text has come, nothing ends the reply without it: a connection that drops
        (``connection_lost``), a server error (``server_error``), silence or the reply's
        time bound (``time_limit``), text past ``reply_byte_cap`` (``size_limit``) or
        tokens past ``n_predict`` (``max_tokens``) end it with the text so far and a note.

        Raises:
            NoModelLoaded, ChatTemplateError, SettingError, ContextOverflowError,
            ApiKeyRefused, DecodeError, ServerUnreachable (also silence before any text).
        """
        info = self._require()
        # A chosen template that fails on this conversation gives way to its fallback here.
        _, template_note = self._render(messages)
        template = self._template
        assert template is not None
        stop = stop if stop is not None else threading.Event()
        t0 = time.perf_counter()
        grammar = grammar_for(params)  # a bad schema fails before any request
        lora_note = self._sync_lora()
        n_ctx = info.n_ctx
        budget = reply_budget(params.max_tokens, n_ctx)
        overflow = Overflow(
            render=template.render,
            tokenize=self._tokenize,
            cmap=ContextMap(),  # the slot cannot shift on request: the server re-reads
            mem=None,
            can_shift=False,
            refill=lambda _t: True,
            policy=params.overflow,
            messages=list(messages),
        )
        prompt = self._prompt(overflow.messages)
        for _ in range(3):
            if params.overflow == "stop" or len(prompt.tokens) + budget <= n_ctx:
                break
            if not overflow.drop(len(prompt.tokens) + budget - n_ctx, keep_last=1):
                break
            prompt = self._prompt(overflow.messages)
        if len(prompt.tokens) >= n_ctx:
            raise ServerOverflowError(len(prompt.tokens) + 1, n_ctx)
        self._sent = (list(messages), overflow.messages)
        seed = params.seed if params.seed >= 0 else secrets.randbits(31)
        metrics = MessageMetrics(
            prompt_tokens=len(prompt.tokens),
            n_ctx=n_ctx,
            seed=seed,
            cache_note=lora_note,
            turn_offset=prompt.n_mark,
        )
        if template_note:
            metrics.notes.append(template_note)
        parts: list[str] = []
        bounds = self._limits.budget(params.max_tokens)
        shown = 0  # bytes of reply text so far
        for _ in range(MAX_CONTINUATIONS):
            try:
                body = self._body(prompt.tokens, params, grammar, seed, n_ctx, metrics)
                ended = yield from self._stream(
                    body, prompt, metrics, t0, stop, bounds, bounds.max_bytes - shown
                )
                parts.append(ended.text)
                shown += len(ended.text.encode("utf-8"))
                if (
                    metrics.stop_reason != "context_full"
                    or metrics.generated_tokens >= params.max_tokens
                ):
                    break
                # The reply filled the context: drop older turns, then go on in a new
                # request whose prompt ends with the reply so far.
                if params.overflow == "stop" or not overflow.drop(budget, keep_last=1):
                    break
                base = self._prompt(overflow.messages)
                reply = "".join(parts)
                prompt = replace(
                    base, tokens=base.tokens + self._tokenize(reply), text=base.text + reply
                )
            except LamplightError as exc:
                if not shown:
                    raise
                # A continuation failed: what the earlier requests sent is kept.
                if isinstance(exc, ServerSilent):
                    end_early(metrics, TIME_LIMIT, str(exc))
                elif isinstance(exc, ServerUnreachable):
                    end_lost(metrics, str(exc))
                else:
                    end_early(metrics, SERVER_ERROR, sentence(str(exc)))
                break
        reply = "".join(parts)
        if overflow.dropped_count:
            metrics.dropped_from = overflow.dropped_from
            metrics.dropped_count = overflow.dropped_count
            metrics.dropped_tokens = overflow.dropped_tokens
            metrics.notes.append(overflow.note())
        yield Finished(reply, metrics)

    def _prompt(self, messages: Sequence[ChatMessage]) -> _Prompt:
        """Token ids of the rendered chat: the tracked tokens up to the last matching mark,
        then the rest tokenized message by message (marks at each boundary)."""
        assert self._template is not None
        text = self._template.render(messages, True)
        if not text:
            raise ChatTemplateError(
                "The chat template rendered an empty prompt: there is nothing to send to the "
                "model. Edit the conversation, or start a new chat."
            )
        n_mark, c_mark = self._map.match(text)
        self._map.keep_marks(n_mark)
        starts = message_starts(self._template.render, messages, text, after=c_mark)
        cuts = sorted(c for c in starts.values() if c_mark < c < len(text))
        tokens = self._map.tokens[:n_mark]
        pos = c_mark
        bounds = []
        for cut in [*cuts, len(text)]:
            piece = text[pos:cut]
            if piece:
                tokens += self._tokenize(piece, bos=not tokens)
            if cut < len(text):
                bounds.append((len(tokens), cut))
            pos = cut
        return _Prompt(tokens, text, n_mark, bounds)

    def _body(
        self,
        prompt: list[int],
        params: SamplingParams,
        grammar: str,
        seed: int,
        n_ctx: int,
        metrics: MessageMetrics,
    ) -> dict[str, Any]:
        left = params.max_tokens - metrics.generated_tokens
        body: dict[str, Any] = {
            "prompt": prompt,
            "stream": True,
            "return_progress": True,
            "cache_prompt": True,
            "id_slot": self.connection.slot,
            # The context's end is this client's to handle (drop turns, go on).
            "n_predict": max(1, min(left, n_ctx - len(prompt))),
            "n_keep": 0,
            **sampling_fields(params, seed),
            "stop": [s for s in (*params.stop, *self._stop_strings()) if s],
            "lora": self._lora_body(),
        }
        if grammar:
            body["grammar"] = grammar
        return body

    def _stop_strings(self) -> tuple[str, ...]:
        return self._template.stop_strings if self._template is not None else ()

    def _stream(
        self,
        body: dict[str, Any],
        prompt: _Prompt,
        metrics: MessageMetrics,
        t0: float,
        stop: threading.Event,
        bounds: Budget,
        room: int,
    ) -> Generator[EngineEvent, None, Finished]:
        """One ``/completion`` stream; returns how it ended (``context_full`` when the
        reply reached the context's end). Updates the tracked tokens as they arrive.

        The stream is cut on this side when the server sends more than ``n_predict``
        (+ ``TOKEN_SLACK``) tokens, more than ``room`` bytes of text, or runs out of
        ``bounds``; an error after the first token ends it with the text so far.
        """
        assert self._streams is not None
        keep = common_prefix(self._map.tokens, prompt.tokens)
        parts: list[str] = []
        size = 0
        final: dict[str, Any] = {}
        first_request = not metrics.token_times_ms and not metrics.evaluated_tokens
        t_prefill = time.perf_counter()
        stream = EventStream(self._streams, "/completion", body, stop, bounds)
        generated: list[int] = []
        n_tokens = 0  # as the server counts them (ids), for a server that ignores n_predict
        most = int(body["n_predict"]) + TOKEN_SLACK
        prefilled = False
        cut = ""  # why this side ended the stream
        try:
            for event in _events(stream):
                progress = event.get("prompt_progress")
                if isinstance(progress, dict):
                    total = _int(progress.get("total"), 0) - _int(progress.get("cache"), 0)
                    done = _int(progress.get("processed"), 0) - _int(progress.get("cache"), 0)
                    if total > 0:
                        yield PrefillProgress(max(0, min(done, total)), total)
                    continue
                if event.get("stop"):
                    final = event
                    break
                if not prefilled:
                    prefilled = True
                    self._prefilled(prompt)
                    if first_request:
                        metrics.prefill_ms = (time.perf_counter() - t_prefill) * 1000
                piece = event.get("content")
                ids = event.get("tokens")
                ids = [i for i in ids if _int(i, -1) >= 0] if isinstance(ids, list) else []
                n_tokens += max(len(ids), 1 if isinstance(piece, str) and piece else 0)
                generated += ids[: max(0, most - len(generated))]
                if isinstance(piece, str) and piece:
                    piece = clean_text(piece)
                    n = len(piece.encode("utf-8"))
                    if size + n > room:
                        piece = cut_to_bytes(piece, room - size)
                        n = len(piece.encode("utf-8"))
                        cut = SIZE_LIMIT
                    if piece:
                        parts.append(piece)
                        size += n
                        metrics.token_times_ms.append((time.perf_counter() - t0) * 1000)
                        metrics.generated_tokens += 1
                        yield Token(piece)
                if cut or n_tokens > most:
                    cut = cut or "max_tokens"
                    break
        except ServerUnreachable as exc:
            self._after_reply(prompt, generated, "".join(parts), prefilled, keep)
            end_lost(metrics, str(exc))
            return Finished("".join(parts), metrics)
        except ServerError as exc:
            if not parts:
                self._map.truncate(keep)
                raise _generation_error(exc) from None
            self._after_reply(prompt, generated, "".join(parts), prefilled, keep)
            end_early(metrics, SERVER_ERROR, sentence(str(exc)))
            return Finished("".join(parts), metrics)
        finally:
            stream.close()
        reply = "".join(parts)
        if stream.stopped or stream.timed_out or cut:
            self._after_reply(prompt, generated, reply, prefilled, keep)
            if stream.timed_out and not reply and not stream.stopped:
                raise ServerSilent(stream.timed_out)  # nothing to keep: the reply failed
            if stream.stopped:
                metrics.stop_reason = "cancelled"
            elif stream.timed_out:
                end_early(metrics, TIME_LIMIT, stream.timed_out)
            elif cut == SIZE_LIMIT:
                end_early(metrics, SIZE_LIMIT, too_large(bounds.max_bytes))
            else:
                metrics.stop_reason = "max_tokens"
                metrics.notes.append(
                    f"the server sent more than the {body['n_predict']} tokens asked for; "
                    "the reply was cut off here"
                )
            return Finished(reply, metrics)
        if not final:
            self._after_reply(prompt, generated, reply, prefilled, keep)
            end_lost(metrics, unfinished(self.connection.url))
            return Finished(reply, metrics)
        if not prefilled:
            self._prefilled(prompt)
        self._after_reply(prompt, generated, reply, True, keep)
        self._timings(final, metrics, first_request)
        stop_type = final.get("stop_type")
        if final.get("truncated") or (
            stop_type == "limit"
            and len(prompt.tokens) + _int(final.get("tokens_predicted"), 0) >= metrics.n_ctx
        ):
            metrics.stop_reason = "context_full"
        elif stop_type == "limit":
            metrics.stop_reason = "max_tokens"
        elif stop_type == "word":
            metrics.stop_reason = "stop_string"
        else:
            metrics.stop_reason = "eos"
        return Finished(reply, metrics)

    def _prefilled(self, prompt: _Prompt) -> None:
        """The server read the prompt: the slot now holds it (marks at message starts)."""
        self._map.tokens = list(prompt.tokens)
        self._map.text = self._map.text[: self._map.marks[-1][1]]
        for n, c in prompt.bounds:
            self._map.mark_at(n, c)
        self._map.mark(prompt.text)

    def _after_reply(
        self,
        prompt: _Prompt,
        generated: list[int],
        reply: str,
        prefilled: bool,
        keep: int,
    ) -> None:
        """Track what the slot holds after a reply: the prompt and the reply's tokens.

        The server leaves the last sampled token unevaluated; the next request
        evaluates it with the new text. The reply's end is marked only when its
        tokens spell exactly the text shown (no held-back stop string, no end token),
        checked with ``/detokenize``: the next turn then reuses them as they are.
        """
        if not prefilled:
            self._map.truncate(keep)  # how far a stopped prompt evaluation got is unknown
            return
        if not generated:
            return
        self._map.tokens = [*prompt.tokens, *generated]
        self._map.keep_marks(len(prompt.tokens))
        try:
            answer = self._call("POST", "/detokenize", {"tokens": generated})
        except LamplightError:
            return
        if isinstance(answer, dict) and answer.get("content") == reply:
            self._map.mark(prompt.text + reply)

    def _timings(self, final: dict[str, Any], metrics: MessageMetrics, first: bool) -> None:
        timings = final.get("timings")
        if not isinstance(timings, dict):
            return
        if first:
            metrics.cached_tokens = _int(timings.get("cache_n"), 0)
            metrics.prefill_ms = _float(timings.get("prompt_ms"), metrics.prefill_ms)
        metrics.evaluated_tokens += _int(timings.get("prompt_n"), 0)
        metrics.native_prefill_tok_s = _float(timings.get("prompt_per_second"), 0.0)
        metrics.native_decode_tok_s = _float(timings.get("predicted_per_second"), 0.0)
        metrics.kv_tokens = len(self._map.tokens)

    def prewarm(self, messages: Sequence[ChatMessage], reply: str) -> int:
        """Have the server evaluate the next turn's opening (``n_predict`` 0)."""
        self._require()
        assert self._template is not None
        if self._template.completion:
            return 0  # continue-the-text mode opens no turn
        if self._sent is not None and self._sent[0] == list(messages):
            messages = self._sent[1]
        sentinel = "\ue000"
        history = [*messages, ChatMessage("assistant", reply), ChatMessage("user", sentinel)]
        try:
            rendered = self._template.render(history, False)
        except ChatTemplateError:
            return 0
        cut = rendered.find(sentinel)
        cached = self._map.text
        marks = self._map.marks
        if cut <= len(cached) or not rendered.startswith(cached):
            return 0
        if not marks or marks[-1][0] != len(self._map.tokens):
            return 0
        head = rendered[:cut]
        extra = self._tokenize(head[len(cached) :])
        tokens = [*self._map.tokens, *extra]
        if not extra or len(tokens) + 1 >= self._require().n_ctx:
            return 0
        body = {
            "prompt": tokens,
            "n_predict": 0,
            "cache_prompt": True,
            "id_slot": self.connection.slot,
            "lora": self._lora_body(),
        }
        try:
            self._call("POST", "/completion", body)
        except LamplightError as exc:
            log.info("prewarm on the server failed: %s", exc)
            return 0
        self._map.tokens = tokens
        self._map.mark(head)
        return len(extra)

    # -- helpers -----------------------------------------------------------------

    def _tokenize(self, text: str, bos: bool = False) -> list[int]:
        if not text:
            return []
        answer = self._call(
            "POST", "/tokenize", {"content": text, "add_special": bos, "parse_special": True}
        )
        ids = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(ids, list) or not all(_int(i, -1) >= 0 for i in ids):
            raise ServerError(0, "The server's /tokenize answer has no token list.")
        return [int(i) for i in ids]

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        if self._client is None:
            self._client = make_client(
                self.connection.url, self._api_key, self.connection.verify_tls
            )
        return call(self._client, method, path, body, timeout=self._limits.call_s)

    def _require(self) -> ModelInfo:
        if self._info is None:
            raise NoModelLoaded("Not connected to the server: connect first.")
        return self._info


def sampling_fields(params: SamplingParams, seed: int) -> dict[str, Any]:
    """The sampler settings of a ``/completion`` request."""
    return {
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "typical_p": params.typical_p,
        "repeat_penalty": params.repeat_penalty,
        "repeat_last_n": params.repeat_last_n,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "mirostat": _MIROSTAT.get(params.mirostat, 0),
        "mirostat_tau": params.mirostat_tau,
        "mirostat_eta": params.mirostat_eta,
        "seed": seed,
    }


def _events(stream: EventStream) -> Generator[dict[str, Any], None, None]:
    for event in stream:
        if isinstance(event, dict):
            if "error" in event:
                err = event["error"]
                msg = err.get("message") if isinstance(err, dict) else err
                raise ServerError(0, f"The server stopped the reply: {str(msg)[:300]}")
            yield event


def _generation_error(exc: ServerError) -> LamplightError:
    body = exc.body
    if exc.kind == "exceed_context_size_error":
        return ServerOverflowError(_int(body.get("n_prompt_tokens"), 0), _int(body.get("n_ctx"), 0))
    if exc.status in (401, 403):
        return ApiKeyRefused(str(exc))
    if "grammar" in str(exc).lower():
        return SettingError("grammar", f"The server refused the grammar: {exc}")
    return DecodeError(str(exc))


def _adapters(data: Any) -> list[dict[str, Any]]:
    out = []
    for item in data if isinstance(data, list) else []:
        if isinstance(item, dict) and isinstance(item.get("id"), int):
            path = str(item.get("path") or f"adapter {item['id']}")[:1000]
            out.append({"id": item["id"], "path": path, "name": PurePosixPath(path).name})
    return out[:64]


def _signature(stack: LoraStack) -> list[dict[str, Any]]:
    # Server adapters cannot be hashed from here: the server's path stands for the file.
    return [
        {
            "name": e.path.name,
            "path": str(e.path),
            "size": None,
            "sha256": "server:" + str(e.path),
            "scale": e.scale,
            "enabled": e.enabled,
        }
        for e in stack
    ]


def _model_meta(models: Any) -> dict[str, Any]:
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        meta = data[0].get("meta")
        if isinstance(meta, dict):
            return meta
    return {}


def _family(has_token: Any) -> str:
    """A model family for the built-in templates, told by which turn markers are tokens."""
    if has_token("<start_of_turn>"):
        return "gemma3"
    if has_token("<|im_start|>"):
        return "qwen2"
    if has_token("<|start_header_id|>") or has_token("[INST]"):
        return "llama"
    if has_token("<|user|>"):
        return "phi3"
    return ""


def _check_props(props: Any, connection: Connection) -> int:
    """The context size from llama-server's ``/props``.

    Raises:
        ModelLoadError: not llama-server's answer, or no context size in it.
    """
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if not isinstance(settings, dict):
        raise ModelLoadError(
            f"Could not connect to {connection.name}: the server at {where(connection.url)} "
            "does not look like llama-server (its /props has no generation settings). If it "
            "is another kind of server, add it as an OpenAI-compatible server instead."
        )
    n_ctx = _int(settings.get("n_ctx"), 0)
    if n_ctx <= 0:
        raise ModelLoadError(
            f"Could not connect to {connection.name}: the server did not say its context "
            "size (/props n_ctx)."
        )
    return n_ctx


def _settings(props: Any) -> dict[str, Any]:
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    return settings if isinstance(settings, dict) else {}


def _text(value: Any, limit: int) -> str:
    """``value`` if it is a string (cut to ``limit`` characters), else ""."""
    return clean_text(value[:limit]) if isinstance(value, str) else ""


def _snippet(value: Any) -> str:
    """What a server answered, short, for a message."""
    if value is None:
        return "nothing"
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join(text.split())
    return repr(text[:120] + ("…" if len(text) > 120 else ""))


def _int(value: Any, default: int) -> int:
    """``value`` if it is an int (not a bool) in ±MAX_COUNT, else ``default``."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_COUNT:
        return value
    return default


def _float(value: Any, default: float) -> float:
    """``value`` if it is a finite number (not a bool), else ``default``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    if isinstance(value, int) and abs(value) > MAX_COUNT:  # float() of a huge int raises
        return default
    return float(value) if math.isfinite(value) else default
