"""The glue between llama.cpp's chat layer and the engine: a request made from a render's
variables, a grammar armed the way llama.cpp's sampler arms it, and a model's own
template rendered by llama.cpp with the sandbox as its fallback."""

from __future__ import annotations

import re

from app.engine.chat_format.formatted import FormattedChat, Trigger, TriggerKind
from app.engine.chat_format.native import ChatRequest, NativeFormatter
from app.engine.chat_message import ChatMessage, ToolCall
from app.engine.native.chat_shim import ChatShim
from app.engine.templates.chat_template import PYTHON_NAME
from app.engine.templates.jinja_template import jinja_template
from app.engine.templates.native_template import native_request, openai_message
from app.engine.tools.format import detect_tool_format, template_tool_format
from app.engine.tools.grammar import native_grammar
from tests import llama_chat
from tests.tool_templates import TIME, WEATHER


def _formatted(**kw: object) -> FormattedChat:
    base = dict(
        format_id=1,
        format_name="peg-native",
        prompt="",
        generation_prompt="<|im_start|>assistant\n",
        grammar='root ::= "x"',
        grammar_lazy=True,
        triggers=(),
        preserved_tokens=(),
        stops=(),
        supports_thinking=False,
        thinking_start="",
        thinking_ends=(),
        parser_spec="",
    )
    base.update(kw)
    return FormattedChat(**base)  # type: ignore[arg-type]


def test_a_word_trigger_counts_only_after_thinking() -> None:
    f = _formatted(
        triggers=(Trigger(TriggerKind.WORD, "<tool_call>"),),
        thinking_start="<think>",
        thinking_ends=("</think>",),
    )
    g = native_grammar(f)
    assert g is not None and g.lazy and not g.tokens
    inside = "<think>I could <tool_call> here"
    after = "<think>Done.</think>\n<tool_call>"
    never = "Straight away <tool_call>"
    assert not any(re.search(p, inside) for p in g.patterns)
    assert any(re.search(p, after) for p in g.patterns)
    assert any(re.search(p, never) for p in g.patterns)


def test_a_call_that_ends_thinking_triggers_anywhere() -> None:
    f = _formatted(
        triggers=(Trigger(TriggerKind.WORD, "<tool_call>"),),
        thinking_start="<think>",
        thinking_ends=("</think>", "<tool_call>"),
    )
    g = native_grammar(f)
    assert g is not None and g.patterns == (re.escape("<tool_call>"),)


def test_full_patterns_are_anchored_and_an_eager_grammar_is_prefilled() -> None:
    f = _formatted(triggers=(Trigger(TriggerKind.PATTERN_FULL, "[\\s\\S]*?(<x>)"),))
    g = native_grammar(f)
    assert g is not None and g.patterns == ("^[\\s\\S]*?(<x>)$",)
    eager = native_grammar(_formatted(grammar_lazy=False))
    assert eager is not None and not eager.lazy and eager.prefill == "<|im_start|>assistant\n"
    assert native_grammar(_formatted(grammar="")) is None


def test_a_render_request_takes_tools_switches_and_variables_apart() -> None:
    call = ToolCall("call_1", "weather", '{"city": "Oslo"}')
    messages = [
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "", "Looking.", (call,)),
        ChatMessage("tool", "Sunny", tool_call_id="call_1", name="weather"),
    ]
    extra = {
        "tools": [{"type": "function", "function": {"name": "weather"}}],
        "tool_choice": "required",
        "parallel_tool_calls": True,
        "enable_thinking": False,
        "reasoning_effort": "auto",
        "custom": 3,
    }
    req = native_request(messages, True, extra)
    assert req.tool_choice == "required" and req.parallel_tool_calls
    assert req.enable_thinking is False and len(req.tools) == 1
    assert req.template_kwargs == {"custom": 3}  # "auto" effort: the template's default
    assert openai_message(messages[1])["reasoning_content"] == "Looking."
    assert (
        openai_message(messages[1])["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    )
    assert openai_message(messages[2])["tool_call_id"] == "call_1"


def test_a_model_s_template_renders_through_llama_cpp_with_the_sandbox_behind(
    shim: ChatShim,
) -> None:
    source = llama_chat.template_source("Qwen3.5-4B.jinja")
    t = jinja_template(source, "", "<|im_end|>")
    assert t.native is not None and t.reason.endswith("read by llama.cpp")
    assert t.fallback is not None and t.fallback.name == PYTHON_NAME
    assert t.reasoning is not None and t.reasoning.open == "<think>"
    prompt = t.render([ChatMessage("user", "hi")], True)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    assert t.native.formatted_for(prompt) is not None


def test_a_reply_s_apply_is_not_replaced_by_a_render_of_the_same_text_without_one(
    shim: ChatShim,
) -> None:
    # Mistral Small 3.2 has no generation prompt: a history render (no generation prompt,
    # for the overflow and the next turn's prewarm) gives the very text of the reply's
    # prompt, and must not replace the reply's apply.
    source = llama_chat.template_source("Mistral-Small-3.2-24B-Instruct-2506.jinja")
    t = jinja_template(source, "<s>", "</s>")
    assert t.native is not None
    messages = [ChatMessage("user", "hi")]
    prompt = t.render(messages, True)
    assert t.render(messages, False) == prompt
    found = t.native.formatted_for(prompt)
    assert found is not None and t.native._recent[prompt][1].add_generation_prompt


def test_tools_in_a_list_and_mapped_render_where_the_sandbox_refused(shim: ChatShim) -> None:
    # Templates that want a ``tools`` list and map over it (Command R+ tool_use):
    # the sandbox refuses them; llama.cpp renders them.
    source = llama_chat.template_source("CohereForAI-c4ai-command-r-plus-tool_use.jinja")
    t = jinja_template(source, "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>")
    assert t.native is not None
    assert "hi" in t.render([ChatMessage("user", "hi")], True)


# Templates whose sources never say "tools" the way the word test looks for, or say it in
# a shape of their own: llama.cpp finds that they take tools by rendering them.
TAKES_TOOLS = (
    "deepseek-ai-DeepSeek-V3.1.jinja",
    "google-gemma-4-31B-it.jinja",
    "moonshotai-Kimi-K2.jinja",
    "MiniMax-M2.jinja",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
    "LFM2.5-8B-A1B.jinja",
    # These list tools but write past calls as text (no supports_tool_calls): llama.cpp
    # has its own handler for them, and its call grammar says it reads their calls.
    "LFM2-8B-A1B.jinja",
    "LFM2.5-Instruct.jinja",
)


def test_llama_cpp_says_which_templates_take_tools(shim: ChatShim) -> None:
    del shim  # the build has the chat layer
    for name in TAKES_TOOLS:
        template = jinja_template(llama_chat.template_source(name), "", "")
        assert template.native is not None
        assert detect_tool_format(template.source, lambda _t: False).family == "generic"
        fmt = template_tool_format(template, lambda _t: False)
        assert fmt.native, name  # the tools go to the template, not the generic prompt
        assert fmt.label == "llama.cpp"  # what the model's info says reads the calls
    deepseek = jinja_template(llama_chat.template_source(TAKES_TOOLS[0]), "", "")
    assert template_tool_format(deepseek, lambda _t: False).family == "deepseek"
    # A template llama.cpp finds takes no tools gets the generic form.
    gemma2 = jinja_template(llama_chat.template_source("google-gemma-2-2b-it.jinja"), "", "")
    assert not template_tool_format(gemma2, lambda _t: False).native
    assert template_tool_format(gemma2, lambda _t: False).label == "generic"


def test_one_call_block_when_calls_are_not_parallel(shim: ChatShim) -> None:
    """llama.cpp's Hermes-shaped grammars repeat the call block even with
    ``parallel_tool_calls`` false; not parallel, the grammar takes one block."""
    del shim
    fmt = NativeFormatter(llama_chat.template_source("Qwen-Qwen2.5-7B-Instruct.jinja"))
    request = ChatRequest(
        messages=[{"role": "user", "content": "hi"}],
        tools=[WEATHER.openai(), TIME.openai()],
        tool_choice="required",
    )
    formatted = fmt.apply(request)
    assert "tool-calls ::= (tool-call space)+" in formatted.grammar.splitlines()
    one = native_grammar(formatted, forced=True, parallel=False)
    many = native_grammar(formatted, forced=True, parallel=True)
    assert one is not None and many is not None
    assert "tool-calls ::= tool-call space" in one.gbnf.splitlines()
    assert "tool-calls ::= (tool-call space)+" in many.gbnf.splitlines()
