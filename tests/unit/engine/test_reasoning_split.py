"""The reasoning splitter and format detection, fast and without a model (issue 28):
markers split at every position, stray markers, prefilled blocks, the families."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.reasoning.format import ReasoningFormat
from app.engine.reasoning.splitter import ReasoningSplitter, split_text
from app.engine.templates.builtin import template_for_architecture
from app.engine.templates.jinja_template import jinja_template
from tests.hypothesis_budget import examples
from tests.reasoning_templates import GPT_OSS, MAGISTRAL, QWEN3, R1

THINK = ReasoningFormat("<think>", "</think>", "\n</think>\n\n")
OSS = ReasoningFormat(
    "<|channel|>analysis<|message|>",
    "<|end|>",
    "<|end|>",
    answer_lead="<|start|>assistant<|channel|>final<|message|>",
)
TEXT = st.text(alphabet="ab <>/|think\n", max_size=40)


def stream(fmt: ReasoningFormat, pieces: list[str], inside: bool = False) -> tuple[str, str]:
    s = ReasoningSplitter(fmt, inside=inside)
    parts = [p for piece in pieces for p in s.feed(piece)] + s.flush()
    return "".join(t for r, t in parts if r), "".join(t for r, t in parts if not r)


def cuts(text: str, points: list[int]) -> list[str]:
    at = sorted({min(p, len(text)) for p in points})
    return [text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)]


@settings(max_examples=examples(300), deadline=None)
@given(
    thought=TEXT.filter(lambda t: "</think>" not in t),
    answer=TEXT.filter(lambda t: "</think>" not in t and "<think>" not in t),
    points=st.lists(st.integers(0, 120), max_size=12),
    prefilled=st.booleans(),
)
def test_any_split_gives_the_same_thinking_and_answer(
    thought: str, answer: str, points: list[int], prefilled: bool
) -> None:
    text = ("" if prefilled else "<think>") + thought + "</think>" + answer
    r, a = stream(THINK, cuts(text, points), inside=prefilled)
    assert r == thought
    assert a == answer.lstrip()


@settings(max_examples=examples(200), deadline=None)
@given(
    answer=TEXT.filter(lambda t: "<think>" not in t),
    points=st.lists(st.integers(0, 80), max_size=8),
)
def test_stray_close_markers_are_never_shown(answer: str, points: list[int]) -> None:
    r, a = stream(THINK, cuts(answer, points))
    assert "</think>" not in a and r == ""
    assert a == answer.replace("</think>", "") or "</think>" in answer.replace("</think>", "")


def test_every_position_of_a_channel_reply() -> None:
    text = OSS.open + "let me see" + OSS.close + OSS.answer_lead + "Yes."
    for i in range(len(text) + 1):
        assert stream(OSS, [text[:i], text[i:]]) == ("let me see", "Yes.")


def test_a_reply_that_never_closes_is_all_thinking() -> None:
    assert stream(THINK, ["<think>", "\nhmm, well"]) == ("\nhmm, well", "")
    assert split_text(THINK, "hmm", inside=True) == ("hmm", "")


def test_an_open_marker_after_the_answer_began_is_text() -> None:
    assert stream(THINK, ["Use <think> tags."]) == ("", "Use <think> tags.")


def test_marker_tokens_only_end_the_block_as_tokens() -> None:
    s = ReasoningSplitter(THINK, inside=True, marker_tokens=True)
    parts = s.feed("I will write </think> literally") + s.feed("</think>", marker=True)
    parts += s.feed("Done.")
    assert [t for r, t in parts if r] == ["I will write </think> literally"]
    assert [t for r, t in parts if not r] == ["Done."]


def test_stop_thinking_gives_held_text_back_as_thinking() -> None:
    s = ReasoningSplitter(THINK, inside=True)
    parts = s.feed("almost </thi")
    assert s.end_thinking() == [(True, "</thi")]
    assert parts == [(True, "almost ")]
    assert s.feed("Answer") == [(False, "Answer")]


def test_families_are_recognised_from_their_templates() -> None:
    qwen = jinja_template(QWEN3, "", "").reasoning
    assert qwen is not None and qwen.switch == "enable_thinking" and not qwen.keeps_past
    assert (qwen.open, qwen.close, qwen.closing()) == ("<think>", "</think>", "\n</think>\n\n")
    r1 = jinja_template(R1, "", "").reasoning
    assert r1 is not None and r1.prefilled and not r1.switch
    oss = jinja_template(GPT_OSS, "", "").reasoning
    assert oss is not None and oss.effort and oss.answer_lead.endswith("<|message|>")
    mag = jinja_template(MAGISTRAL, "", "").reasoning
    assert mag is not None and (mag.open, mag.close) == ("[THINK]", "[/THINK]") and mag.keeps_past
    plain = jinja_template("{% for m in messages %}{{ m.content }}{% endfor %}", "", "")
    assert plain.reasoning is None


def test_a_built_in_template_thinks_when_the_vocabulary_has_the_markers() -> None:
    """A Qwen3 GGUF whose own template cannot be used falls back to built-in chatml:
    its vocabulary's ``<think>`` tokens still make the thinking show apart."""
    tokens = {"<think>", "</think>", "<|im_start|>", "<|im_end|>"}
    qwen = template_for_architecture("qwen3", tokens.__contains__)
    assert qwen.name == "chatml" and qwen.reasoning is not None
    assert (qwen.reasoning.open, qwen.reasoning.source) == ("<think>", "vocab")
    assert template_for_architecture("gemma3", lambda _t: False).reasoning is None


def test_a_header_that_is_not_the_answer_lead_is_kept() -> None:
    """gpt-oss: after the thinking, a call's header starts like the final answer's lead
    (``<|start|>assistant<|channel|>``) and then names the commentary channel: the
    pieces held while it looked like the lead are answer text, not lost."""
    fmt = jinja_template(GPT_OSS, "", "").reasoning
    assert fmt is not None
    pieces = [
        "<|channel|>analysis<|message|>",
        "Need weather.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "commentary to=functions.get_weather <|constrain|>json<|message|>",
        '{"city": "Paris"}',
    ]
    splitter = ReasoningSplitter(fmt)
    parts = [p for piece in pieces for p in splitter.feed(piece)] + splitter.flush()
    answer = "".join(t for thought, t in parts if not thought)
    assert answer.startswith("<|start|>assistant<|channel|>commentary to=functions.get_weather")
    assert answer.endswith('{"city": "Paris"}')
