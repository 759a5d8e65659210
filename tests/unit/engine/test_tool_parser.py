"""Tool-call parsing per family (app/engine/tools/parser.py), streamed and fuzzed."""
# ruff: noqa: E501 - documented model outputs are quoted whole

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.tools.format import FAMILIES, detect_tool_format
from app.engine.tools.parser import MAX_CALLS, MAX_DEPTH, ToolCallParser, parse_calls
from tests.hypothesis_budget import examples

TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "templates"
NAMES = ["get_weather", "search"]

# (family, reply, shown text, [(name, arguments)])
DOCUMENTED = [
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "hermes",
        'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"q": "</tool_call> {"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
        "Let me look.\n",
        [("search", {"q": "</tool_call> {"}), ("get_weather", {})],
    ),
    (
        "generic",
        '<tool_call>{"name": "get_weather", "arguments": {"a": {"b": [1, {"c": "}"}]}}}</tool_call>',
        "",
        [("get_weather", {"a": {"b": [1, {"c": "}"}]}})],
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "",
        [("get_weather", {"city": "Paris", "days": 3})],
    ),
    (
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "llama3",
        '{"type": "function", "name": "search", "parameters": {"q": "x"}}',
        "",
        [("search", {"q": "x"})],
    ),
    (
        "llama3",
        '<|python_tag|>{"name": "search", "parameters": {"q": "x"}}',
        "",
        [("search", {"q": "x"})],
    ),
    ("llama3", '{"not": "a call"} but text', '{"not": "a call"} but text', []),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123def"}]',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]search[ARGS]{}',
        "",
        [("get_weather", {"city": "Paris"}), ("search", {})],
    ),
    (
        "gpt_oss",
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "gpt_oss",
        'commentary to=functions.search <|constrain|>json<|message|>{"q": "x"}',
        "",
        [("search", {"q": "x"})],
    ),
    (
        "deepseek",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "deepseek",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{"q": "x"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
        [("search", {"q": "x"})],
    ),
    ("hermes", "A plain answer with <tool", "A plain answer with <tool", []),
]


@pytest.mark.parametrize(("family", "reply", "shown", "calls"), DOCUMENTED)
def test_documented_formats(family: str, reply: str, shown: str, calls: list) -> None:
    text, got, problems = parse_calls(FAMILIES[family], reply, NAMES)
    assert problems == []
    assert text == shown
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert len({c.id for c in got}) == len(got)


def test_mistral_ids_kept_and_ids_unique() -> None:
    _, calls, _ = parse_calls(
        FAMILIES["mistral"],
        '[TOOL_CALLS][{"name": "a", "arguments": {}, "id": "abc123def"}, {"name": "b", "arguments": {}, "id": "abc123def"}]',
        NAMES,
    )
    assert calls[0].id == "abc123def" and calls[1].id != "abc123def"


def test_malformed_call_gives_problem_and_keeps_text() -> None:
    reply = 'Sure <tool_call>{"name": "get_weather", "arguments": {city: 1}}</tool_call> ok'
    text, calls, problems = parse_calls(FAMILIES["hermes"], reply, NAMES)
    assert calls == [] and text == reply
    assert "get_weather" in problems[0] and "JSON" in problems[0]


CUT = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "search", "argu',
    "generic": '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call><tool_call>{"name": "search", "arguments": {"q": "x',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parame",
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {}}, {"name": "search", "arguments": {"q',
}


@pytest.mark.parametrize("family", sorted(CUT))
def test_a_call_the_reply_ended_inside_is_reported_never_shown(family: str) -> None:
    """Stopped or cut at the token limit inside a call: the whole calls before it are
    made, the unfinished one is a problem, and none of its syntax is in the answer."""
    text, calls, problems = parse_calls(FAMILIES[family], "Checking. " + CUT[family], NAMES)
    assert text.strip() == "Checking."
    if family != "mistral":  # one JSON list: the reply ended inside all of it
        assert [c.name for c in calls] == ["get_weather"]
    assert len(problems) == 1 and "ended inside" in problems[0] and "not run" in problems[0]


def test_unknown_tool_is_still_a_call() -> None:
    _, calls, problems = parse_calls(
        FAMILIES["hermes"], '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', NAMES
    )
    assert [c.name for c in calls] == ["nope"] and problems == []


def test_qwen3_coder_string_parameter_stays_string_with_schema() -> None:
    schemas = {"f": {"type": "object", "properties": {"code": {"type": "string"}}}}
    reply = (
        "<tool_call>\n<function=f>\n<parameter=code>\n123\n</parameter>\n</function>\n</tool_call>"
    )
    _, calls, _ = parse_calls(FAMILIES["qwen3_coder"], reply, schemas)
    assert json.loads(calls[0].arguments) == {"code": "123"}


def test_limits_give_problems() -> None:
    deep = "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5)
    _, calls, problems = parse_calls(
        FAMILIES["hermes"],
        f'<tool_call>{{"name": "a", "arguments": {{"x": {deep}}}}}</tool_call>',
        NAMES,
    )
    assert calls == [] and "nests deeper" in problems[0]
    huge = '<tool_call>{"name": "a", "arguments": {"x": "' + "y" * 300_000 + '"}}</tool_call>'
    text, calls, problems = parse_calls(FAMILIES["hermes"], huge, NAMES)
    assert calls == [] and "KiB" in problems[0] and text == huge
    many = "".join(
        f'<tool_call>{{"name": "a", "arguments": {{"i": {i}}}}}</tool_call>'
        for i in range(MAX_CALLS + 3)
    )
    _, calls, problems = parse_calls(FAMILIES["hermes"], many, NAMES)
    assert len(calls) == MAX_CALLS and str(MAX_CALLS) in problems[0]


def test_a_repeated_call_runs_once() -> None:
    same = '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>'
    other = '<tool_call>{"name": "a", "arguments": {"x": 2}}</tool_call>'
    text, calls, problems = parse_calls(FAMILIES["hermes"], same * 3 + other + same, NAMES)
    assert [c.arguments for c in calls] == ['{"x": 1}', '{"x": 2}']
    assert text == "" and "repeated" in problems[0]


def test_streaming_holds_back_marker_and_hides_call() -> None:
    p = ToolCallParser(FAMILIES["hermes"], NAMES)
    assert p.feed("Hi <tool") == "Hi "
    assert not p.started
    assert p.feed("_call>{") == "" and p.started
    assert p.feed('"name": "search", "arguments": {}}</tool_call>') == ""
    assert p.finish() == "" and [c.name for c in p.calls] == ["search"]


def test_counter_ids() -> None:
    n = iter(range(100))
    p = ToolCallParser(FAMILIES["hermes"], NAMES, id_prefix="t", new_id=lambda: str(next(n)))
    p.feed(
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    p.finish()
    assert [c.id for c in p.calls] == ["t0", "t1"]


@pytest.mark.parametrize(
    ("template", "family"),
    [
        ("qwen2.5-instruct.jinja", "hermes"),
        ("qwen3.jinja", "hermes"),
        ("llama-3.1-instruct.jinja", "llama3"),
        ("mistral-7b-instruct-v0.3.jinja", "mistral"),
        ("gemma-3-it.jinja", "generic"),
        ("phi-3.5-mini-instruct.jinja", "generic"),
    ],
)
def test_detect_real_templates(template: str, family: str) -> None:
    fmt = detect_tool_format((TEMPLATES / template).read_text(), lambda t: t == "<tool_call>")
    assert fmt.family == family
    assert fmt.native == (family != "generic")


def test_detect_snippets() -> None:
    never = lambda t: False  # noqa: E731
    assert detect_tool_format("", never).family == "generic"
    assert (
        detect_tool_format("{% for t in tools %}<function={{t}}><parameter=x>", never).family
        == "qwen3_coder"
    )
    assert (
        detect_tool_format("{{tools}}<|channel|>commentary to=functions.x<|call|>", never).family
        == "gpt_oss"
    )
    assert detect_tool_format("{{tools}}<｜tool▁calls▁begin｜>", never).family == "deepseek"
    assert detect_tool_format(
        "{{tools}} something", lambda t: t in ("<tool_call>", "</tool_call>")
    ).marker_tokens == ("<tool_call>", "</tool_call>")

    def boom(t: str) -> bool:
        raise RuntimeError

    assert detect_tool_format("{{ tools }}", boom).family == "generic"


def _run(family: str, pieces: list[str]) -> tuple[str, list[tuple[str, str]], list[str]]:
    p = ToolCallParser(FAMILIES[family], NAMES)
    shown = "".join(p.feed(x) for x in pieces) + p.finish()
    return shown, [(c.name, c.arguments) for c in p.calls], p.problems


def _splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@settings(max_examples=examples(60), deadline=None)
@given(case=st.sampled_from(DOCUMENTED), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_split_anywhere_same_result(case: tuple, cuts: list[int]) -> None:
    family, reply = case[0], case[1]
    assert _run(family, _splits(reply, cuts)) == _run(family, [reply])


_ALPHABET = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        "[",
        "]",
        '"',
        "\\",
        ":",
        ",",
        " ",
        "\n",
        "a",
        "name",
        '"name"',
        '"arguments"',
        "<|python_tag|>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "<|channel|>",
        "commentary to=functions.",
        "<|message|>",
        "<|call|>",
        "<function=",
        "<parameter=",
        ">",
        "</parameter>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "é",
    ]
)


@settings(max_examples=examples(100), deadline=None)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    parts=st.lists(_ALPHABET, max_size=40),
    cuts=st.lists(st.integers(0, 300), max_size=8),
)
def test_garbage_never_raises_and_never_loses_text(
    family: str, parts: list[str], cuts: list[int]
) -> None:
    text = "".join(parts)
    shown, calls, problems = _run(family, _splits(text, cuts))
    assert (shown, calls, problems) == _run(family, [text])
    if not calls and family != "gpt_oss":  # gpt-oss drops a final channel's header
        if any("ended inside" in p for p in problems):
            assert text.startswith(shown)  # only the unfinished call at the end is held
        else:
            assert shown == text
    for _, args in calls:
        assert isinstance(json.loads(args), dict)
