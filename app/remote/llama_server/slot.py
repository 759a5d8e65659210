"""What a llama-server slot holds: its LoRA scales, and its snapshots (files in the
server's ``--slot-save-path``).

Every request sends every adapter the server loaded (``--lora``) with an explicit
scale (llama.cpp issue #28674); a changed stack makes the slot's cache stale.

Each connection and slot has a ring of ``SLOT_FILES`` file names on the server; a
conversation keeps its name while it is among the most recently saved, and each party
of the RAM pool (``KvPool``) has one file for its stashes. The Lamplight snapshot on
this machine keeps the compatibility header, the tokens and the text, and names the
server file (``KvState.state`` is a small JSON reference).

Whose tokens the slot holds (issue 40): ``reset`` erases the slot, and a request may
reuse the slot only when it keeps most of it (``reuses``); otherwise it goes with
``cache_prompt: false``. llama-server (since its RAM prompt cache, ``--cache-ram``, on by
default) saves a slot that a request would mostly discard and restores, for that
request, whichever saved prompt best matches it: another party's conversation included.
The cached count reported is never more than this client's own tokens in the slot.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
from collections.abc import Sequence
from typing import Any

from app.engine.backend import STASH, KvState
from app.engine.context_map import ContextMap, common_prefix
from app.engine.image_part import is_image_token
from app.engine.metrics import MessageMetrics
from app.engine.prompt.pipeline import Prompt
from app.gguf.lora import LoraError, LoraStack, stack_key
from app.remote.http import ServerError
from app.remote.image_wire import vision_of_props
from app.remote.llama_server.images import save_refused
from app.remote.llama_server.wire import (
    float_or,
    int_or,
    settings_of,
    signature,
    text_of,
)
from app.remote.server_link import ServerLink
from app.util.datafiles import DataFileError, parse_json
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

SLOT_FILES = 16  # slot files per connection and slot on the server (docs: the ring)
_FILE_NAME = re.compile(r"lamplight-[0-9a-f]{8,64}(-(\d{1,3}|pool(-[0-9a-f]{16})?))?\.bin")
_STATE_FORMAT = "lamplight-llama-server-slot"
LORA_CHANGED_NOTE = "the LoRA stack changed"


class Slot:
    """The server's slot this client uses (``Connection.slot``): what it holds (its
    ``ContextMap``), its LoRA scales and its snapshots. Owned by ``LlamaServerBackend``."""

    def __init__(self, link: ServerLink) -> None:
        self._link = link
        self._map = ContextMap()  # what this client believes the slot holds
        self._files: dict[str, str] = {}  # conversation key -> slot file, most recent last
        self._restored = ""  # the slot file last restored (its key is not known yet)
        # Each file this client wrote, with the id of its last save: an older save's
        # reference names the file but no longer its content.
        self._written: dict[str, str] = {}
        self._props: dict[str, Any] = {}  # the server's /props, to check a restore against
        self._adapters: list[dict[str, Any]] = []  # the server's: id, path, name
        self._stack = LoraStack()
        self._kv_lora: tuple[tuple[str, float], ...] = ()  # the stack the slot's cache used

    @property
    def map(self) -> ContextMap:
        """What this client believes the slot holds (the prompt driver marks it)."""
        return self._map

    def connect(self, props: dict[str, Any], adapters: list[dict[str, Any]]) -> None:
        """A (new) connection: the server's ``/props`` and adapters; nothing held yet."""
        self._props = props
        self._adapters = adapters
        self._stack = LoraStack()
        self._kv_lora = ()
        self._map.clear()
        self._files.clear()
        self._restored = ""

    def disconnect(self) -> None:
        self._files.clear()
        self._restored = ""
        self._map.clear()

    # -- what the slot holds after a request ---------------------------------------

    def prefilled(self, prompt: Prompt) -> None:
        """The server read the prompt: the slot now holds it (marks at message starts)."""
        self._map.tokens = list(prompt.tokens)
        self._map.text = self._map.text[: self._map.marks[-1][1]]
        for n, c in prompt.bounds:
            self._map.mark_at(n, c)
        self._map.mark(prompt.text)

    def after_reply(
        self,
        prompt: Prompt,
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
            answer = self._link.call("POST", "/detokenize", {"tokens": generated})
        except LamplightError:
            return
        if isinstance(answer, dict) and answer.get("content") == reply:
            self._map.mark(prompt.text + reply)

    def timings(
        self, final: dict[str, Any], metrics: MessageMetrics, first: bool, own: int
    ) -> None:
        """The server's figures; ``own``: the tokens of the slot this request could
        reuse (``reuses``). More cached than that came from elsewhere (a restored
        prompt of the server's RAM cache): it is counted as evaluated, never shown."""
        timings = final.get("timings")
        if not isinstance(timings, dict):
            return
        cached = max(0, int_or(timings.get("cache_n"), 0))
        hidden = max(0, cached - own)
        if first:
            metrics.cached_tokens = cached - hidden
            metrics.prefill_ms = float_or(timings.get("prompt_ms"), metrics.prefill_ms)
        metrics.evaluated_tokens += max(0, int_or(timings.get("prompt_n"), 0)) + hidden
        metrics.native_prefill_tok_s = float_or(timings.get("prompt_per_second"), 0.0)
        metrics.native_decode_tok_s = float_or(timings.get("predicted_per_second"), 0.0)
        metrics.kv_tokens = len(self._map.tokens)

    # -- whose tokens the slot holds -------------------------------------------------

    def reuses(self, tokens: Sequence[int]) -> int:
        """The tokens of the slot a request for ``tokens`` may reuse (its ``cache_prompt``
        when not 0): what it shares with the slot, if that is more than half of both, or
        all of ``tokens`` (the same request again).

        A request that keeps less makes llama-server save the slot to its RAM prompt
        cache and restore the saved prompt that best matches this one, whoever sent it
        (``get_available_slot``: kept under half the slot, or shared under
        ``--slot-prompt-similarity`` of the prompt; ``server_prompt_cache::load`` takes
        only a prompt that shares more than the slot does). Sent with
        ``cache_prompt: false``, it reuses nothing: at most as many tokens evaluated
        again as it brings anew.
        """
        held = self._map.tokens
        keep = common_prefix(held, tokens)
        inside = 0 < keep == len(tokens) < len(held)  # nothing can share more of it
        return keep if inside or 2 * keep > max(len(held), len(tokens)) else 0

    def erase(self) -> None:
        """Empty the slot on the server, so that nothing of it is reused or counted as
        cached for whoever asks next; without ``--slot-save-path`` the server refuses,
        and ``reuses`` alone keeps the next request from its tokens."""
        try:
            self._link.call("POST", f"/slots/{self._link.connection.slot}?action=erase", {})
        except LamplightError as exc:
            log.info("the server's slot was not erased: %s", exc)

    # -- LoRA --------------------------------------------------------------------

    @property
    def adapters(self) -> list[dict[str, Any]]:
        """The adapters the server loaded: ``id``, ``path``, ``name``."""
        return [dict(a) for a in self._adapters]

    @property
    def lora_stack(self) -> LoraStack:
        return self._stack.copy()

    def lora_signature(self) -> list[dict[str, Any]]:
        return signature(self._stack)

    def set_lora_stack(self, stack: LoraStack) -> bool:
        """Use ``stack`` from the next request on; every entry must be a server adapter.
        True when the slot's cache was computed with another stack.

        Raises:
            LoraError.
        """
        known = {a["path"] for a in self._adapters}
        for entry in stack:
            if str(entry.path) not in known:
                raise LoraError(
                    f"The server did not load {entry.path.name}: llama-server takes adapters "
                    "at start (--lora FILE); this app sets only their scales."
                )
        self._stack = stack.copy()
        return bool(self._map.tokens) and stack_key(signature(stack)) != self._kv_lora

    def lora_body(self) -> list[dict[str, Any]]:
        scales = {str(e.path): e.scale for e in self._stack if e.active}
        # Every adapter with an explicit scale: one left out would keep its last one.
        return [{"id": a["id"], "scale": scales.get(a["path"], 0.0)} for a in self._adapters]

    def sync_lora(self) -> str:
        """Before a request: forget the slot's cache if another stack computed it; the
        cache note ("" when nothing was forgotten)."""
        key = stack_key(signature(self._stack))
        if key == self._kv_lora:
            return ""
        self._kv_lora = key
        if not self._map.tokens:
            return ""
        self._map.clear()  # the slot's cache was computed with other adapters
        return LORA_CHANGED_NOTE

    # -- snapshots ---------------------------------------------------------------

    def cache_config(self, n_ctx: int) -> dict[str, Any]:
        return {
            "n_ctx": n_ctx,
            "server": self._link.connection.url,
            "slot": self._link.connection.slot,
            "lora": signature(self._stack),
        }

    def export_state(self, key: str = "") -> KvState:
        """Save the slot on the server (``--slot-save-path``) as this conversation's file.

        The file is one of ``SLOT_FILES`` names per connection and slot (``_file_name``),
        so the server keeps a bounded number of them, whatever is deleted here.

        Raises:
            LamplightError: the server could not save it, or holds other tokens.
        """
        if not self._map.tokens:
            return KvState(b"", [], "", [])
        name = self._file_name(key)
        try:
            answer = self._link.call(
                "POST", f"/slots/{self._link.connection.slot}?action=save", {"filename": name}
            )
        except ServerError as exc:
            raise save_refused(exc, self._map.tokens) from None
        n_saved = int_or(answer.get("n_saved") if isinstance(answer, dict) else None, -1)
        tokens = list(self._map.tokens)
        if n_saved < len(tokens) - 1:  # the last sampled token is never evaluated
            raise LamplightError(
                f"the server's slot holds {n_saved} tokens, not the {len(tokens)} of this "
                "conversation (another client used it)"
            )
        self._written[name] = save = secrets.token_hex(8)
        ref = {"format": _STATE_FORMAT, "file": name, "n_saved": n_saved, "save": save}
        return KvState(json.dumps(ref).encode(), tokens, self._map.text, list(self._map.marks))

    def import_state(self, kv: KvState, n_ctx: int) -> None:
        """Restore the conversation's file into the slot, after checking the server is the same.

        A file another conversation has since overwritten restores another token count
        and is refused here; were the counts equal, the server itself compares each
        prompt with the tokens its slot holds, so the reply is still right (it re-reads).

        Raises:
            LamplightError: a different server, model or context (``n_ctx`` then) now; a
                missing file.
        """
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
        if name in self._written and ref.get("save") != self._written[name]:
            # Another save took the file since (a stash of another conversation): the
            # count alone may not tell, and the slot would hold what this one never had.
            raise LamplightError("its file on the server has since been saved over")
        self._check_server(self._link.call("GET", "/props"), n_ctx, kv.tokens)
        try:
            answer = self._link.call(
                "POST", f"/slots/{self._link.connection.slot}?action=restore", {"filename": name}
            )
        except ServerError as exc:
            raise LamplightError(f"the server could not restore its copy ({exc})") from None
        restored = int_or(answer.get("n_restored") if isinstance(answer, dict) else None, -1)
        if restored != n_saved or restored < len(kv.tokens) - 1:
            raise LamplightError(f"the server restored {restored} tokens, not {n_saved}")
        self._map = ContextMap(list(kv.tokens), kv.text, list(kv.marks) or [(0, 0)])
        self._kv_lora = stack_key(signature(self._stack))
        self._restored = name

    def _check_server(self, props: Any, n_ctx: int, tokens: Sequence[int]) -> None:
        """Refuse a restore unless the server (``props``, now) runs what it ran when
        connected: the same model, build and context, and images if ``tokens`` hold any.

        Raises:
            LamplightError.
        """
        now = text_of(props.get("model_path"), 1000) if isinstance(props, dict) else ""
        if now != text_of(self._props.get("model_path"), 1000):
            raise LamplightError(f"the server now runs another model ({now or 'unknown'})")
        if not isinstance(props, dict) or props.get("build_info") != self._props.get("build_info"):
            raise LamplightError("the server now runs another llama.cpp build")
        now_ctx = int_or(settings_of(props).get("n_ctx"), 0)
        if now_ctx != n_ctx:
            raise LamplightError(f"the server's context size changed ({n_ctx} → {now_ctx})")
        if vision_of_props(props) is not True and any(is_image_token(t) for t in tokens):
            raise LamplightError(
                "the server now runs without a vision projector (--mmproj), and this "
                "chat's cache holds images"
            )

    def _file_name(self, key: str) -> str:
        """The slot file for conversation ``key``: one of a ring of ``SLOT_FILES`` names.

        A conversation keeps its name while it is among the ``SLOT_FILES`` most recently
        saved this session; a new one starts at the name its key hashes to (its own
        name in an earlier session, most likely) or takes the one just restored for it,
        else the first free name, else the least recently saved one. The RAM pool's
        stashes have a name per party (``STASH + party``; "" one of its own), so one
        party's stash never takes another's file.
        """
        conn = self._link.connection
        base = hashlib.sha256(f"{conn.id}\n{conn.slot}".encode())
        prefix = f"lamplight-{base.hexdigest()[:24]}"
        if not key:
            return f"{prefix}-pool.bin"
        if key.startswith(STASH):
            return f"{prefix}-pool-{hashlib.sha256(key.encode()).hexdigest()[:16]}.bin"
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
