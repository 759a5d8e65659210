"""llama.cpp's native sampler chain for a set of ``SamplingParams``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from app.config.field_spec import SettingError
from app.config.params import grammar_for
from app.config.setting_records import SamplingParams
from app.engine.chat_format.schema import schema_grammar
from app.engine.native.chat_shim import load_shim
from app.engine.native.handles import Native
from app.engine.native.llama_log import RECENT_PROBLEMS

if TYPE_CHECKING:
    from app.engine.tools.grammar import ToolGrammar

log = logging.getLogger(__name__)


def build_sampler(
    llm: Any,
    params: SamplingParams,
    seed: int,
    context: Sequence[int],
    check_only: bool = False,
    tools: ToolGrammar | None = None,
) -> Any:
    """llama.cpp's native sampler chain for ``params``; caller frees it.

    ``llm`` is the loaded ``llama_cpp.Llama``; ``context`` the tokens in the KV
    cache, which the repetition penalties look back over. With ``check_only``,
    only the grammar is built and freed (None is returned). ``tools``: the reply's
    tool-call grammar (lazy: armed when a call begins), in place of an output format.

    Raises:
        SettingError: the grammar (or JSON schema) does not parse, or tools are asked
        for together with structured output.
    """
    import llama_cpp

    grammar = grammar_for(params, schema_grammar)
    if grammar and tools is not None:
        raise SettingError(
            "output_format", "Tools cannot be offered in a reply with structured output."
        )
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())

    def add(s: Any) -> None:
        llama_cpp.llama_sampler_chain_add(chain, s)

    tool_sampler = _tool_grammar(llm, tools) if tools is not None else None
    if tool_sampler is not None:
        add(tool_sampler)
        grammar = "tools"
    elif grammar:
        RECENT_PROBLEMS.clear()
        g = llama_cpp.llama_sampler_init_grammar(
            Native(llm).vocab, grammar.encode("utf-8"), b"root"
        )
        if not g:
            llama_cpp.llama_sampler_free(chain)
            detail = "; ".join(m for m in RECENT_PROBLEMS if "parse" in m or "error" in m)
            field = "grammar" if params.output_format == "gbnf" else "json_schema"
            raise SettingError(field, f"The grammar does not parse: {detail or 'see the log'}")
        add(g)
    if check_only:
        llama_cpp.llama_sampler_free(chain)
        return None
    penalize = (
        params.repeat_penalty != 1.0
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
    )
    if penalize and params.repeat_last_n != 0:
        last_n = params.repeat_last_n if params.repeat_last_n > 0 else llm.n_ctx()
        add(
            llama_cpp.llama_sampler_init_penalties(
                llm.n_vocab(),
                last_n,
                params.repeat_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            )
        )
    add_choice(add, llm.n_vocab(), params, seed)
    if penalize:
        # The penalties look back over the context; the grammar must not see the prompt.
        window = params.repeat_last_n if params.repeat_last_n > 0 else len(context)
        for tok in context[-window:]:
            if tok < 0:
                continue  # an image's pseudo-token: nothing the sampler can count
            llama_cpp.llama_sampler_accept(
                llama_cpp.llama_sampler_chain_get(chain, 1 if grammar else 0), tok
            )
    return chain


def _tool_grammar(llm: Any, tools: ToolGrammar) -> Any:
    """The native sampler for ``tools`` (lazy: its trigger patterns and tokens arm it);
    None when llama.cpp refuses it (an odd schema): calls are then parsed, not held to
    their schema, which is what the reply's parser and the chat's error results cover."""
    import ctypes

    import llama_cpp

    vocab = Native(llm).vocab
    RECENT_PROBLEMS.clear()
    if tools.lazy:
        ids = []
        for text in tools.tokens:
            toks = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            if len(toks) == 1:
                ids.append(toks[0])
        patterns = (ctypes.c_char_p * max(1, len(tools.patterns)))(
            *(p.encode("utf-8") for p in tools.patterns)
        )
        tok_arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        g = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
            vocab,
            tools.gbnf.encode("utf-8"),
            b"root",
            patterns,
            len(tools.patterns),
            tok_arr,
            len(ids),
        )
    else:
        g = llama_cpp.llama_sampler_init_grammar(vocab, tools.gbnf.encode("utf-8"), b"root")
        if g and tools.prefill and not _prefilled(g, vocab, tools.prefill):
            llama_cpp.llama_sampler_free(g)
            log.warning("the tools' grammar refused the prompt's end: calls are not constrained")
            return None
    if not g:
        detail = "; ".join(m for m in RECENT_PROBLEMS if "parse" in m or "error" in m)
        log.warning("the tools' grammar was refused (%s): calls are not constrained", detail)
        return None
    return g


def _prefilled(sampler: Any, vocab: Any, text: str) -> bool:
    """Feed ``sampler`` the prompt's end its grammar starts with (llama.cpp's chat formats
    put the generation prompt in an eager grammar); through the chat shim, which catches
    llama.cpp's exception for a refused token."""
    shim = load_shim()
    return shim is not None and shim.grammar_prefill(sampler, vocab, text)


def add_choice(add: Callable[[Any], None], n_vocab: int, params: SamplingParams, seed: int) -> None:
    """The samplers that pick the token (greedy, mirostat, or the truncations and a draw)."""
    import llama_cpp

    if params.temperature <= 0.0:
        add(llama_cpp.llama_sampler_init_greedy())
    elif params.mirostat != "off":
        add(llama_cpp.llama_sampler_init_temp(params.temperature))
        if params.mirostat == "v1":
            add(
                llama_cpp.llama_sampler_init_mirostat(
                    n_vocab, seed, params.mirostat_tau, params.mirostat_eta, 100
                )
            )
        else:
            add(
                llama_cpp.llama_sampler_init_mirostat_v2(
                    seed, params.mirostat_tau, params.mirostat_eta
                )
            )
    else:
        if params.top_k > 0:
            add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.typical_p < 1.0:
            add(llama_cpp.llama_sampler_init_typical(params.typical_p, 1))
        if params.top_p < 1.0:
            add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        add(llama_cpp.llama_sampler_init_temp(params.temperature))
        add(llama_cpp.llama_sampler_init_dist(seed))
