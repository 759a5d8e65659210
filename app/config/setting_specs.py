"""Every sampling and load setting, declared once: type, range, default, help, group.

The UI builds its controls from ``SPECS``, in this order; ``FILE_ONLY_SPECS`` are
checked the same way (``app.config.params``) but have no control in the panel.
"""

from __future__ import annotations

from app.config.field_spec import TEXT_CHARS, FieldSpec

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
        "drop the oldest turns after the first exchange (truncate middle); drop the "
        "oldest turns (rolling); or compact: when the context is nearly full, the model "
        "summarises the older turns and the chat goes on from the summary (Chat → Undo "
        "compaction brings them back). Dropped and summarised messages stay in the "
        "transcript.",
        choices=("truncate_middle", "rolling", "stop", "compact"),
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
        "thinking",
        "Thinking",
        "choice",
        "reasoning",
        "For models that think before they answer: the template's default (auto), or "
        "thinking switched on or off where the template can switch it. Off with a "
        "template that cannot switch it opens and closes an empty thinking block.",
        choices=("auto", "on", "off"),
    ),
    FieldSpec(
        "reasoning_effort",
        "Reasoning effort",
        "choice",
        "reasoning",
        "How hard the model thinks, for templates that read an effort (gpt-oss).",
        choices=("auto", "low", "medium", "high"),
    ),
    FieldSpec(
        "thinking_budget",
        "Thinking budget",
        "int",
        "reasoning",
        "The most tokens the model may think (0: no limit). At the limit the thinking "
        "block is closed for it, after the budget message, and the model answers.",
        0,
        131072,
    ),
    FieldSpec(
        "budget_message",
        "Budget message",
        "text",
        "reasoning",
        "Written into the thinking when the budget ends it, just before the block closes.",
        maximum=500,
    ),
    FieldSpec(
        "tools",
        "Tools",
        "choice",
        "tools",
        "Let the model call the tools of your MCP servers (auto: when some are on); "
        "required: each reply starts with a call; off: no tools.",
        choices=("auto", "required", "off"),
    ),
    FieldSpec(
        "tool_rounds",
        "Tool rounds",
        "int",
        "tools",
        "The most rounds of tool calls in one reply; then the model must answer.",
        1,
        100,
    ),
    FieldSpec(
        "tool_timeout_s",
        "Tool timeout (s)",
        "int",
        "tools",
        "How long one call may run before it ends with an error the model reads.",
        1,
        3600,
    ),
    FieldSpec(
        "tool_result_chars",
        "Tool result limit",
        "int",
        "tools",
        "The most characters of a result the model reads (the transcript keeps it all).",
        500,
        1_000_000,
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
        "mtp",
        "Draft with the model's next-token layers",
        "bool",
        "speculative",
        "Models that carry next-token (MTP) layers, such as Qwen3.5, guess the tokens "
        "after the next one themselves, and the model checks the guesses in one batch "
        "(before prompt lookup; a chosen draft model comes first). Only for such models; "
        "the adaptive length turns it down where it does not pay. Sampled replies keep "
        "the model's distribution exactly; a greedy reply is the same as without drafting "
        "up to floating-point rounding.",
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
    FieldSpec(
        "template_kwargs",
        "Template variables",
        "text",
        "reasoning",
        "More chat template variables, a JSON object (an API request's chat_template_kwargs).",
        maximum=10_000,
    ),
)

SPEC_BY_NAME = {s.name: s for s in (*SPECS, *FILE_ONLY_SPECS)}
