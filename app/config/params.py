"""Every sampling and load setting, declared once: type, range, default, help, group.

The UI builds its controls from ``SPECS``; ``check`` is the only way a value
reaches llama.cpp: through ``validate_*`` for what the user enters (an error
names the field and the allowed range) and ``repair_*`` for what a file holds
(a bad value is clamped or reset, with a note). ``FILE_ONLY_SPECS`` are checked
the same way but have no control in the panel.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from app.util.errors import LamplightError


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
    # When the conversation outgrows the context: "stop", "truncate_middle" or "rolling".
    overflow: str = "truncate_middle"

    @classmethod
    def greedy(cls, max_tokens: int = 64) -> SamplingParams:
        """Deterministic argmax sampling, for tests and benchmarks."""
        return cls(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, max_tokens=max_tokens, seed=0)


GROUPS = ("basic", "advanced", "structured", "speculative", "model")
TEXT_CHARS = 100_000  # the longest schema or grammar a text field takes


class SettingError(LamplightError):
    """A value out of range or of the wrong kind; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class FieldSpec:
    """One setting as the panel shows it and the validator checks it."""

    name: str
    label: str
    kind: str  # "float", "int", "bool", "choice", "text", "list"
    group: str
    help: str
    minimum: float | None = None
    maximum: float | None = None
    step: float = 1.0
    decimals: int = 0
    choices: tuple[str, ...] = ()
    reload: bool = False  # takes effect only when the model is loaded again
    target: str = "sampling"  # "sampling" (SamplingParams) or "load" (LoadConfig)

    @property
    def default(self) -> Any:
        source: object = (
            LoadConfig()
            if self.target == "load"
            else ApiSettings()
            if self.target == "api"
            else SamplingParams()
        )
        return getattr(source, self.name)


SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "temperature",
        "Temperature",
        "float",
        "basic",
        "Randomness: 0 always picks the most likely token; higher is more varied.",
        0.0,
        5.0,
        0.05,
        2,
    ),
    FieldSpec(
        "top_k",
        "Top-k",
        "int",
        "basic",
        "Sample only from the k most likely tokens (0 turns it off).",
        0,
        1000,
    ),
    FieldSpec(
        "top_p",
        "Top-p",
        "float",
        "basic",
        "Sample from the smallest set of tokens whose probabilities add up to p.",
        0.0,
        1.0,
        0.01,
        2,
    ),
    FieldSpec(
        "min_p",
        "Min-p",
        "float",
        "basic",
        "Drop tokens less likely than min-p times the most likely one.",
        0.0,
        1.0,
        0.01,
        2,
    ),
    FieldSpec(
        "max_tokens",
        "Max new tokens",
        "int",
        "basic",
        "The longest reply, in tokens.",
        1,
        32768,
        16,
    ),
    FieldSpec(
        "seed",
        "Seed",
        "int",
        "basic",
        "-1 picks a new random seed per reply (shown under it); "
        "a fixed seed repeats a reply exactly.",
        -1,
        2**31 - 1,
    ),
    FieldSpec(
        "typical_p",
        "Typical-p",
        "float",
        "advanced",
        "Locally typical sampling; 1 turns it off.",
        0.0,
        1.0,
        0.01,
        2,
    ),
    FieldSpec(
        "repeat_penalty",
        "Repeat penalty",
        "float",
        "advanced",
        "Make recently used tokens less likely; 1 turns it off (llama.cpp needs more than 0).",
        0.01,
        3.0,
        0.01,
        2,
    ),
    FieldSpec(
        "repeat_last_n",
        "Penalty window",
        "int",
        "advanced",
        "How many recent tokens the penalties look at (0 off, -1 the whole context).",
        -1,
        32768,
        16,
    ),
    FieldSpec(
        "presence_penalty",
        "Presence penalty",
        "float",
        "advanced",
        "Penalize any token already present in the window.",
        -2.0,
        2.0,
        0.05,
        2,
    ),
    FieldSpec(
        "frequency_penalty",
        "Frequency penalty",
        "float",
        "advanced",
        "Penalize tokens by how often they appear in the window.",
        -2.0,
        2.0,
        0.05,
        2,
    ),
    FieldSpec(
        "overflow",
        "When the context is full",
        "choice",
        "basic",
        "What happens when the conversation no longer fits the context: stop and ask; "
        "drop the oldest turns after the first exchange (truncate middle); or drop the "
        "oldest turns (rolling). Dropped messages stay in the transcript; the model "
        "no longer sees them.",
        choices=("truncate_middle", "rolling", "stop"),
    ),
    FieldSpec(
        "mirostat",
        "Mirostat",
        "choice",
        "advanced",
        "Adaptive sampling that targets a constant surprise (replaces top-k/p/min-p).",
        choices=("off", "v1", "v2"),
    ),
    FieldSpec(
        "mirostat_tau",
        "Mirostat tau",
        "float",
        "advanced",
        "Target surprise: lower is more focused.",
        0.0,
        20.0,
        0.1,
        1,
    ),
    FieldSpec(
        "mirostat_eta",
        "Mirostat eta",
        "float",
        "advanced",
        "How fast mirostat adapts.",
        0.0,
        1.0,
        0.01,
        2,
    ),
    FieldSpec(
        "stop",
        "Stop strings",
        "list",
        "advanced",
        "The reply ends when it produces one of these (one per line).",
    ),
    FieldSpec(
        "output_format",
        "Output",
        "choice",
        "structured",
        "Free text, any JSON, JSON matching a schema, or a custom GBNF grammar.",
        choices=("text", "json", "json_schema", "gbnf"),
    ),
    FieldSpec(
        "json_schema",
        "JSON schema",
        "text",
        "structured",
        "A JSON Schema the reply must match (Output: JSON schema).",
        maximum=TEXT_CHARS,
    ),
    FieldSpec(
        "grammar",
        "GBNF grammar",
        "text",
        "structured",
        "A llama.cpp GBNF grammar with a `root` rule (Output: GBNF).",
        maximum=TEXT_CHARS,
    ),
    FieldSpec(
        "speculative",
        "Prompt-lookup drafting",
        "bool",
        "speculative",
        "Guess the next tokens from text already in the conversation and have the model "
        "check them in one batch: faster on replies that repeat their context. Sampled "
        "replies keep the model's distribution exactly. A greedy reply is the same as "
        "without drafting up to floating-point rounding: batched and one-token evaluation "
        "round differently, which can flip a near-tie and change the rest of the reply.",
    ),
    FieldSpec(
        "draft_model",
        "Use draft model",
        "bool",
        "speculative",
        "Draft with the draft model chosen above (before prompt lookup): it guesses the next "
        "tokens and the model checks them in one batch. Sampled replies keep the model's "
        "distribution exactly; a greedy reply is the same as without drafting up to "
        "floating-point rounding, which can flip a near-tie.",
    ),
    FieldSpec(
        "adaptive_draft",
        "Adaptive draft length",
        "bool",
        "speculative",
        "Guess more tokens at a time while guesses are kept and fewer, down to none (plain "
        "decoding, trying again now and then), while they fail, so where drafting does not "
        "help it costs a reply a few percent at most (a new draft model is first tried once "
        "the reply can afford it).",
    ),
    FieldSpec(
        "draft_len",
        "Maximum draft length",
        "int",
        "speculative",
        "The most tokens to guess at a time (the adaptive length guesses fewer, or none, "
        "while recent guesses fail).",
        1,
        16,
    ),
    FieldSpec(
        "n_ctx",
        "Context size",
        "int",
        "model",
        "Tokens the model can see at once; more uses more memory.",
        256,
        262144,
        256,
        reload=True,
        target="load",
    ),
    FieldSpec(
        "n_threads",
        "Threads",
        "int",
        "model",
        "CPU threads (0: automatic).",
        0,
        256,
        reload=True,
        target="load",
    ),
    FieldSpec(
        "n_gpu_layers",
        "GPU layers",
        "int",
        "model",
        "Layers to run on the GPU: -2 picks what fits the free GPU memory (0 without a GPU), "
        "-1 all of them.",
        -2,
        1024,
        reload=True,
        target="load",
    ),
    FieldSpec(
        "flash_attn",
        "Flash attention",
        "bool",
        "model",
        "Faster prompt reading (about 20% here); drafting (prompt lookup and the draft "
        "model) is then off, because its batched evaluation rounds differently.",
        reload=True,
        target="load",
    ),
)

# Declared and checked like the others, but not in the settings panel: the batch size
# is for the settings file only, the KV type has its own menu item (compact cache).
FILE_ONLY_SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "n_batch",
        "Batch size",
        "int",
        "model",
        "Prompt tokens evaluated per llama.cpp batch.",
        1,
        8192,
        reload=True,
        target="load",
    ),
    FieldSpec(
        "kv_type",
        "KV cache type",
        "choice",
        "model",
        "f16, or q8_0 to halve the KV cache and its snapshots.",
        choices=("f16", "q8_0"),
        reload=True,
        target="load",
    ),
)

SPEC_BY_NAME = {s.name: s for s in (*SPECS, *FILE_ONLY_SPECS)}


def check(spec: FieldSpec, value: Any) -> Any:
    """``value`` converted to the field's type, or SettingError naming field and range."""
    where = spec.label
    if spec.kind in ("float", "int"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SettingError(spec.name, f"{where} must be a number (got {short_repr(value)}).")
        if isinstance(value, float) and not math.isfinite(value):
            raise SettingError(spec.name, f"{where} must be a finite number.")
        number: float | int
        if spec.kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise SettingError(spec.name, f"{where} must be a whole number (got {value}).")
            number = int(value)
        else:
            # A huge int would raise OverflowError in float(); it is out of range anyway.
            number = float(value) if abs(value) < 1e300 else math.copysign(math.inf, value)
        assert spec.minimum is not None and spec.maximum is not None
        if not spec.minimum <= number <= spec.maximum:
            raise SettingError(
                spec.name,
                f"{where} must be between {_bound(spec, spec.minimum)} and "
                f"{_bound(spec, spec.maximum)} (got {short_repr(value)}).",
            )
        return number
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise SettingError(spec.name, f"{where} must be on or off (got {short_repr(value)}).")
        return value
    if spec.kind == "choice":
        if not isinstance(value, str) or value not in spec.choices:
            raise SettingError(
                spec.name,
                f"{where} must be one of {', '.join(spec.choices)} (got {short_repr(value)}).",
            )
        return value
    if spec.kind == "text":
        if not isinstance(value, str):
            raise SettingError(spec.name, f"{where} must be text.")
        if spec.maximum is not None and len(value) > spec.maximum:
            raise SettingError(spec.name, f"{where}: at most {int(spec.maximum):,} characters.")
        return value
    if spec.kind == "list":
        items = list(value) if isinstance(value, list | tuple) else None
        if items is None or not all(isinstance(s, str) for s in items):
            raise SettingError(spec.name, f"{where} must be a list of text.")
        if any(not s for s in items) or len(items) > 16:
            raise SettingError(spec.name, f"{where}: up to 16, none empty.")
        return tuple(items)
    raise SettingError(spec.name, f"unknown kind {spec.kind}")


def repair(spec: FieldSpec, value: Any) -> tuple[Any, str]:
    """A valid value for ``spec`` from a stored one, and a note when it had to change.

    A sampling number above its range is clamped to the maximum (the bound is safe
    and keeps the intent: "a lot"). Everything else invalid takes the default: a
    sampling number below its range (the floor can be an extreme: a repeat penalty
    of 0.01 boosts repeats, where 0 was probably meant as "off"), any load setting
    out of range (a bound can still be too much for this machine: 262144 tokens of
    context, 256 threads; the default is known to load), a wrong type, NaN, an
    unknown choice.
    """
    try:
        return check(spec, value), ""
    except SettingError as exc:
        problem = str(exc)[:-1]  # without the full stop
    hi = spec.maximum
    number = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float)
        and math.isfinite(value)
        and (spec.kind == "float" or value.is_integer())
    )
    if (
        spec.target == "sampling"
        and spec.kind in ("float", "int")
        and hi is not None
        and number
        and value > hi
    ):
        return _bound(spec, hi), f"{problem}; set to {_bound(spec, hi)}."
    return spec.default, f"{problem}; using the default ({short_repr(spec.default)})."


def repair_fields(kind: type, values: Any) -> tuple[dict[str, Any], list[str]]:
    """The known fields of dataclass ``kind`` in ``values``, each made valid (see ``repair``).

    Unknown keys are ignored without a note (a newer version may have written them).
    """
    if not isinstance(values, dict):
        return {}, []
    out: dict[str, Any] = {}
    notes = []
    for f in fields(kind):
        if f.name not in values:
            continue
        spec = SPEC_BY_NAME.get(f.name)
        if spec is None:  # pragma: no cover - every field has a declaration
            continue
        out[f.name], note = repair(spec, values[f.name])
        if note:
            notes.append(note)
    return out, notes


def repair_sampling(values: Any) -> tuple[SamplingParams, list[str]]:
    """SamplingParams from stored values: bad fields repaired, a bad schema or grammar
    switches the output format back to free text (the text itself is kept)."""
    out, notes = repair_fields(SamplingParams, values)
    params = SamplingParams(**out)
    try:
        check_structured(params)
    except SettingError as exc:
        notes.append(f"{exc}; the output format is back to free text.")
        params = replace(params, output_format="text")
    return params, notes


def repair_load(values: Any) -> tuple[LoadConfig, list[str]]:
    """LoadConfig from stored values: every field in its declared range (see ``repair``)."""
    out, notes = repair_fields(LoadConfig, values)
    return LoadConfig(**out), notes


def _bound(spec: FieldSpec, value: float) -> float | int:
    return int(value) if spec.kind == "int" else value


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to one short line (a stored value can be anything)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "a huge number"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def validate_sampling(values: dict[str, Any], base: SamplingParams | None = None) -> SamplingParams:
    """SamplingParams from ``values`` (missing fields from ``base``); every field checked.

    Raises:
        SettingError: the first bad field, by name, with its range.
    """
    base = base or SamplingParams()
    known = {f.name for f in fields(SamplingParams)}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in known:
            raise SettingError(name, f"Unknown setting {name!r}.")
        spec = SPEC_BY_NAME.get(name)
        out[name] = check(spec, value) if spec is not None else value
    params = replace(base, **out)
    check_structured(params)
    return params


def validate_load(values: dict[str, Any], base: LoadConfig | None = None) -> LoadConfig:
    base = base or LoadConfig()
    out = {}
    for name, value in values.items():
        spec = SPEC_BY_NAME.get(name)
        if spec is None or spec.target != "load":
            raise SettingError(name, f"Unknown model setting {name!r}.")
        out[name] = check(spec, value)
    return replace(base, **out)


def check_structured(params: SamplingParams) -> None:
    """The schema or grammar must be usable before any generation starts."""
    if params.output_format == "json_schema":
        grammar_for(params)
    elif params.output_format == "gbnf" and "root" not in params.grammar:
        raise SettingError("grammar", "The GBNF grammar needs a `root ::= ...` rule.")


def grammar_for(params: SamplingParams) -> str:
    """The GBNF text for the output format ('' for free text).

    Raises:
        SettingError: the JSON schema is not valid JSON or cannot be turned into a grammar.
    """
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    if params.output_format == "json":
        return str(JSON_GBNF)
    if params.output_format == "gbnf":
        return params.grammar
    if params.output_format == "json_schema":
        try:
            schema = json.loads(params.json_schema)
        except RecursionError as exc:
            raise SettingError("json_schema", "The JSON schema is nested too deeply.") from exc
        except ValueError as exc:
            raise SettingError("json_schema", f"The JSON schema is not valid JSON: {exc}") from exc
        if not isinstance(schema, dict):
            raise SettingError("json_schema", "The JSON schema must be a JSON object.")
        try:
            return str(json_schema_to_gbnf(json.dumps(schema)))
        except Exception as exc:  # the converter raises many types on odd schemas
            raise SettingError("json_schema", f"The JSON schema cannot be used: {exc}") from exc
    return ""


def sampling_to_dict(params: SamplingParams) -> dict[str, Any]:
    data = {f.name: getattr(params, f.name) for f in fields(SamplingParams)}
    data["stop"] = list(params.stop)
    return data


# -- the local API server (issue 17) ---------------------------------------------------------

API_PORT = 1234  # LM Studio's port: tools that know it find Lamplight there
HOST_CHARS = 253
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_ORIGIN = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253})(:[0-9]{1,5})?")


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
    max_body_mb: int = 8  # a larger request body gets 413
    pool_mb: int = 256  # RAM for KV snapshots of recent API and chat prompts


API_SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "enabled", "Serve the API", "bool", "api", "Start the server with the app.", target="api"
    ),
    FieldSpec(
        "host",
        "Address",
        "text",
        "api",
        "The address to listen on: 127.0.0.1 for this computer only.",
        maximum=HOST_CHARS,
        target="api",
    ),
    FieldSpec("port", "Port", "int", "api", "TCP port (0: any free one).", 0, 65535, target="api"),
    FieldSpec(
        "cors_origins",
        "Allowed web origins",
        "list",
        "api",
        "Web pages (https://host:port) allowed to call the API from a browser.",
        target="api",
    ),
    FieldSpec(
        "max_queue",
        "Queue size",
        "int",
        "api",
        "Requests running or waiting; more are refused with 429.",
        1,
        64,
        target="api",
    ),
    FieldSpec(
        "max_body_mb",
        "Largest request (MB)",
        "int",
        "api",
        "Larger request bodies are refused with 413.",
        1,
        8,
        target="api",
    ),
    FieldSpec(
        "pool_mb",
        "Prompt cache (MB)",
        "int",
        "api",
        "RAM for KV snapshots of recent prompts (0: off).",
        0,
        16384,
        target="api",
    ),
)
API_SPEC_BY_NAME = {s.name: s for s in API_SPECS}


def is_host(value: str) -> bool:
    """An IP address or a DNS host name (``localhost`` included)."""
    if not value or len(value) > HOST_CHARS:
        return False
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        pass
    name = value[:-1] if value.endswith(".") else value
    return all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


LOCALHOST_NAMES = ("localhost", "localhost.")


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address: reachable from this computer only."""
    if host.lower() in LOCALHOST_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_origin(value: str) -> bool:
    """``*`` or a web origin: ``http(s)://host[:port]``, no path."""
    if value == "*":
        return True
    m = _ORIGIN.fullmatch(value)
    return m is not None and (m.group(2) is None or 0 < int(m.group(2)[1:]) <= 65535)


def check_api(spec: FieldSpec, value: Any) -> Any:
    """``check`` plus the address and origin syntax."""
    value = check(spec, value)
    if spec.name == "host" and not is_host(value):
        raise SettingError(
            "host", f"Address must be an IP address or a host name (got {short_repr(value)})."
        )
    if spec.name == "cors_origins":
        bad = [o for o in value if not is_origin(o)]
        if bad:
            raise SettingError(
                "cors_origins",
                f"Allowed web origins must look like https://host:port (got {short_repr(bad[0])}).",
            )
    return value


def validate_api(values: dict[str, Any], base: ApiSettings | None = None) -> ApiSettings:
    """ApiSettings from ``values`` (missing fields from ``base``); every field checked.

    Raises:
        SettingError: the first bad field, by name, with what it must be.
    """
    out = {}
    for name, value in values.items():
        spec = API_SPEC_BY_NAME.get(name)
        if spec is None:
            raise SettingError(name, f"Unknown server setting {name!r}.")
        out[name] = check_api(spec, value)
    return replace(base or ApiSettings(), **out)


def repair_api(values: Any) -> tuple[ApiSettings, list[str]]:
    """ApiSettings from stored values: a bad field takes its default, with a note."""
    if not isinstance(values, dict):
        return ApiSettings(), []
    out: dict[str, Any] = {}
    notes = []
    for f in fields(ApiSettings):
        if f.name not in values:
            continue
        spec = API_SPEC_BY_NAME[f.name]
        try:
            out[f.name] = check_api(spec, values[f.name])
        except SettingError as exc:
            out[f.name] = spec.default
            notes.append(f"{str(exc)[:-1]}; using the default ({short_repr(spec.default)}).")
    return ApiSettings(**out), notes
