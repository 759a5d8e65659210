"""The settings records: what loads a model, what samples a reply, what the API serves.

Each field is declared once, with its range and help, in ``app.config.params``
(``SPECS``) and ``app.config.api_settings`` (``API_SPECS``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

API_PORT = 1234  # LM Studio's port: tools that know it find Lamplight there


def default_threads() -> int:
    """Threads for decoding: all cores up to 8 (more rarely helps a memory-bound decode)."""
    return max(1, min(os.cpu_count() or 1, 8))


@dataclass(frozen=True)
class LoadConfig:
    """Settings that take effect when a model is (re)loaded."""

    n_ctx: int = 4096
    n_threads: int = 0  # 0: default_threads()
    n_gpu_layers: int = -2  # -2: auto (what fits the GPU; 0 without one), -1: all layers
    n_batch: int = 512
    kv_type: str = "f16"  # "q8_0" halves the KV cache and its snapshots
    # ~20% faster prompt evaluation on CPU here, and needed for a q8_0 V cache; but its
    # batched kernels round differently, so prompt-lookup drafting is off with it.
    flash_attn: bool = False
    # A vision projector (mmproj GGUF) loaded with the model: it then sees images.
    mmproj: str = ""

    def threads(self) -> int:
        return self.n_threads if self.n_threads > 0 else default_threads()


@dataclass(frozen=True)
class SamplingParams:
    """Settings that apply to the next reply without a reload."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    mirostat: str = "off"  # "off", "v1", "v2"
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    max_tokens: int = 1024
    seed: int = -1  # -1: a fresh random seed per reply
    stop: tuple[str, ...] = ()
    output_format: str = "text"  # "text", "json", "json_schema", "gbnf"
    json_schema: str = ""
    grammar: str = ""
    speculative: bool = False  # prompt-lookup (n-gram) drafting
    draft_len: int = 16  # the most tokens drafted at a time (the adaptive length drafts fewer)
    draft_model: bool = False  # draft with the loaded draft model (before prompt lookup)
    adaptive_draft: bool = True  # draft fewer (down to none) when drafts are not kept
    # Draft with the model's own next-token (MTP) layers, where it has them (before
    # prompt lookup; a chosen draft model comes first).
    mtp: bool = True
    # When the conversation outgrows the context: "stop", "truncate_middle", "rolling" or
    # "compact" (the chat summarises its older turns first: ``app.chat.compaction``).
    overflow: str = "truncate_middle"
    # Reasoning models: thinking "auto" (the template's default), "on" or "off"; effort
    # "auto" (the template's default), "low", "medium" or "high"; a budget in thinking
    # tokens after which the engine ends the block (0: none), writing ``budget_message``
    # first; ``template_kwargs``: more template variables, a JSON object (the API's
    # ``chat_template_kwargs``).
    thinking: str = "auto"
    reasoning_effort: str = "auto"
    thinking_budget: int = 0
    budget_message: str = "Time is up, so I will answer now."
    template_kwargs: str = ""
    # Tools (MCP): "auto" offers the host's enabled tools when it has some, "required"
    # also makes the first round of each reply a call, "off" offers none;
    # at most ``tool_rounds`` rounds of calls per reply; a call's time limit; the longest
    # result the model reads (the transcript keeps it whole).
    tools: str = "auto"
    tool_rounds: int = 8
    tool_timeout_s: int = 60
    tool_result_chars: int = 16_000

    @classmethod
    def greedy(cls, max_tokens: int = 64) -> SamplingParams:
        """Deterministic argmax sampling, for tests and benchmarks."""
        return cls(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, max_tokens=max_tokens, seed=0)


@dataclass(frozen=True)
class ApiSettings:
    """The local OpenAI-compatible server: off until the user turns it on.

    The API key is not here: it lives in the keyring (``app.remote.keys``, id ``api-server``).
    """

    enabled: bool = False
    host: str = "127.0.0.1"  # loopback; any other address needs an API key
    port: int = API_PORT  # 0: any free port
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call it (none: CORS off)
    max_queue: int = 32  # requests waiting or running; more get 429 (waiting costs nothing)
    max_body_mb: int = 48  # a larger request body gets 413 (images: base64, +33 %)
    pool_mb: int = 256  # RAM for KV snapshots of recent API and chat prompts
