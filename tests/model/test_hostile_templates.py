"""Chat templates from model files as an attacker writes them, and streamed turn tokens.

A template is code from the GGUF file: whatever it does, loading falls back to
the built-in template with a note, and a reply fails with one typed error,
within the time budget; nothing else escapes, and no render thread is left.
The real Hugging Face templates in ``tests/data/templates`` keep working.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, Token
from app.engine.chat_format.native import available as native_available
from app.engine.chat_message import ChatMessage
from app.engine.local import engine as llama_module
from app.engine.local.engine import Engine
from app.engine.template_errors import ChatTemplateError
from app.engine.templates import guard as template_guard
from app.engine.templates import sandbox as template_sandbox
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.guard import GRACE_S
from app.engine.templates.jinja_template import choose_template, jinja_template
from app.engine.templates.sandbox import LOAD_BUDGET_S, RENDER_BUDGET_S, output_limit
from app.gguf.info import read_gguf_info
from tests.conftest import TEST_LOAD
from tests.hypothesis_budget import examples
from tests.native import own_notes

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
REAL = {p.name: p.read_text(encoding="utf-8") for p in sorted(TEMPLATES.glob("*.jinja"))}
CHAT = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Hi"),
    ChatMessage("assistant", "Hello!"),
    ChatMessage("user", "Bye"),
]
SLACK_S = 1.5  # scheduling noise on a shared two-core machine
FALLBACK = "This model's chat template was not used: it "


def every_token(_text: str) -> bool:
    return True


def template_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lamplight-template" and t.is_alive()]


def timed_choose(source: str, arch: str = "gemma3") -> tuple[ChatTemplate, float]:
    t0 = time.perf_counter()
    t = choose_template(source, arch, every_token, bos_token="<bos>", eos_token="<eos>")
    return t, time.perf_counter() - t0


@contextlib.contextmanager
def short_budgets(load_s: float = 0.3, render_s: float = 0.2) -> Iterator[None]:
    """The fuzzers' budgets: the same mechanism, a shorter wait per hostile case."""
    with (
        mock.patch.object(template_sandbox, "LOAD_BUDGET_S", load_s),
        mock.patch.object(template_sandbox, "RENDER_BUDGET_S", render_s),
    ):
        yield


# -- real Hugging Face templates --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_hf_templates_render_in_the_sandbox(name: str) -> None:
    t, _ = timed_choose(REAL[name], "llama")
    if name in ("gemma-2-it.jinja", "mistral-7b-instruct-v0.1.jinja"):
        # These raise on a system message. llama.cpp's chat layer sees the template takes
        # no system role and folds the system prompt into the first user turn, as
        # llama-server does; the sandbox alone could only use the built-in template.
        if t.native is None:
            assert t.name == "llama3" and t.note.startswith(FALLBACK)
            assert "System role not supported" in t.note or "must alternate" in t.note
            return
        assert t.name == "model's own" and not t.note
        assert all(m.content in t.render(CHAT) for m in CHAT if m.role != "assistant")
        return
    assert t.name == "model's own" and not t.note
    text = t.render(CHAT)
    for m in CHAT:
        assert m.content in text
    assert not text.startswith("<bos>")  # llama.cpp adds BOS itself
    assert text.rstrip().endswith(("assistant", "<|assistant|>", "model", "[/INST]", ">"))


def test_tool_templates_get_hf_tojson() -> None:
    """Qwen 2.5 with tools: ``tojson`` as transformers defines it (no HTML escaping)."""
    tool = {"type": "function", "function": {"name": "weather", "description": "<b>&é"}}
    compiled = template_guard.run_bounded(
        lambda: template_sandbox.compile_template(REAL["qwen2.5-instruct.jinja"]), 2.0, 10**6
    )
    text = template_guard.run_bounded(
        lambda: compiled.render(messages=[{"role": "user", "content": "hi"}], tools=[tool]),
        2.0,
        10**6,
    )
    assert json.dumps(tool, ensure_ascii=False) in text
    src = (
        "{{ x|tojson }}|{{ x|tojson(indent=2) }}|{{ x|tojson(separators=(',', ':')) }}"
        "|{{ x|tojson(sort_keys=true) }}|{{ x|tojson(ensure_ascii=true) }}"
    )
    x = {"b": "<é>", "a": [1]}
    compiled = template_guard.run_bounded(lambda: template_sandbox.compile_template(src), 2, 10**6)
    out = template_guard.run_bounded(lambda: compiled.render(x=x), 2.0, 10**6).split("|")
    assert out == [
        json.dumps(x, ensure_ascii=False),
        json.dumps(x, ensure_ascii=False, indent=2),
        json.dumps(x, ensure_ascii=False, separators=(",", ":")),
        json.dumps(x, ensure_ascii=False, sort_keys=True),
        json.dumps(x),
    ]


def test_hf_extensions_work() -> None:
    src = (
        "{% for m in messages %}{% if m.content == 'STOP' %}{% break %}{% endif %}"
        "{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
        "{{ messages[-1].content.startswith('gone') }} {{ strftime_now('%Y') }}"
    )
    t = jinja_template(src, "", "")
    chat = [*CHAT, ChatMessage("assistant", "STOP"), ChatMessage("user", "gone")]
    assert t.render(chat) == f"[Hi][Hello!][Bye]True {time.strftime('%Y')}"
    t, _ = timed_choose("{{ raise_exception('no tools here') }}")
    assert "raised an error: no tools here" in t.note


# -- hostile templates -------------------------------------------------------------------

OUT = "{% for m in messages %}{{ m.content }}{% endfor %}"
HOSTILE = {
    "nested loops": OUT + "{% for a in range(99999) %}{% for b in range(99999) %}"
    "{% endfor %}{% endfor %}",
    "lipsum": OUT + "{% for i in range(99999) %}{{ lipsum(n=10**7) }}{% endfor %}",
    "string times": OUT + "{{ 'a' * 10**9 }}",
    "list times": OUT + "{{ ([1] * 1000000000)|length }}",
    "power": OUT + "{{ 2 ** 100000 }}",
    "squaring": OUT + "{% set ns = namespace(x=7) %}{% for i in range(64) %}"
    "{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x }}",
    "doubling ~": OUT + "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling +": OUT + "{% set ns = namespace(s=[1]) %}{% for i in range(64) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "billion laughs": OUT + "{% set a = ['x' * 1000] * 100 %}{% set b = [a] * 100 %}"
    "{% set c = [b] * 100 %}{{ c }}",
    "shared literals": OUT + "{% set ns = namespace(x=['lol']) %}{% for i in range(60) %}"
    "{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x == ns.x }}",
    "namespace laughs": OUT + "{% set ns = namespace(x=1) %}{% for i in range(60) %}"
    "{% set ns.x = namespace(a=ns.x, b=ns.x) %}{% endfor %}{{ ns.x }}",
    "deep tuple hash": OUT + "{% set ns = namespace(t=(1,)) %}{% for i in range(99999) %}"
    "{% set ns.t = (ns.t,) %}{% endfor %}{{ {ns.t: 1} }}",
    "sum of lists": OUT + "{{ (range(99999)|map('string')|map('list')|sum(start=[]))|length }}",
    "macro recursion": OUT + "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "self recursion": OUT + "{% block a %}{{ self.a() }}{% endblock %}",
    "recursive loop": OUT + "{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}",
    "caller recursion": OUT + "{% macro m() %}{{ caller() }}{% endmacro %}"
    "{% macro r() %}{% call m() %}{{ r() }}{% endcall %}{% endmacro %}{{ r() }}",
    "percent width": OUT + "{{ '%999999999d' % 1 }}",
    "percent star": OUT + "{{ '%*d' % (999999999, 1) }}",
    "format width": OUT + "{{ '{:>999999999}'.format('x') }}",
    "format nested": OUT + "{{ '{:>{w}}'.format('x', w=999999999) }}",
    "format filter": OUT + "{{ '%0999999999d'|format(1) }}",
    "center": OUT + "{{ 'a'.center(999999999) }}",
    "center filter": OUT + "{{ 'a'|center(999999999) }}",
    "indent": OUT + "{{ ('\\n' * 100000)|indent(99999) }}",
    "replace": OUT + "{{ ('a' * 100000).replace('a', 'b' * 100000) }}",
    "join": OUT + "{{ ('a' * 100000).join(['x'] * 100000) }}",
    "expandtabs": OUT + "{{ ('\\t' * 100000).expandtabs(100000) }}",
    "batch fill": OUT + "{{ [1]|batch(999999999, 'x')|list }}",
    "tojson indent": OUT + "{{ messages|tojson(indent=100000) }}",
    "deep literal": "{{ " + "[" * 5000 + "]" * 5000 + " }}",
    # Python refuses Jinja's code for it: "too many statically nested blocks" (SyntaxError).
    "static nesting": OUT
    + "".join(f"{{% for a{i} in [1] %}}" for i in range(25))
    + "{% endfor %}" * 25,
    "huge source": OUT + "x" * 300_000,
    "strftime": OUT + "{{ strftime_now('%c' * 100000) }}",
    "striptags regex": OUT + "{{ ('<!--' * 100000)|striptags }}",
    "empty": "{# nothing #}",
    "whitespace": "   \n  ",
    "drops messages": "{{ 'hello' }}",
    "system fails": "{% for m in messages %}{% if m.role == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}{{ m.content }}{% endfor %}",
    "python error": OUT + "{{ 1 / 0 }}",
    "undefined call": OUT + "{{ nothing() }}",
    "escape": OUT + "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "mutation": OUT + "{% set x = [] %}{{ x.append(1) }}",
    "include": OUT + "{% include 'x' %}",
    "import": OUT + "{% import 'x' as y %}",
    "extends": "{% extends 'x' %}",
    "syntax": "{% for %}",
    "unclosed": OUT + "{% if true %}",
    "unknown filter": OUT + "{{ 1|nope }}",
}


# Templates jinja2 fails on for want of a feature (or by its own rule), not for breaking a
# limit: llama.cpp's Jinja engine renders them, as llama-server does (a system prompt folded
# into the first user turn, ``append`` on a list, a division by zero as infinity).
LLAMA_RENDERS = {"mutation", "python error", "system fails"}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_falls_back_within_budget(name: str) -> None:
    # One case runs with the real budget; the others with a short one (same mechanism).
    budgets = contextlib.nullcontext() if name == "nested loops" else short_budgets()
    with budgets:
        t, elapsed = timed_choose(HOSTILE[name])
        budget = template_sandbox.LOAD_BUDGET_S
    if name in LLAMA_RENDERS and native_available():
        assert t.native is not None and not t.note, t.note
        assert elapsed < budget + GRACE_S + SLACK_S, f"{name} took {elapsed:.1f} s"
        return
    assert t.name == "gemma" and t.note.startswith(FALLBACK), t.note
    assert elapsed < budget + GRACE_S + SLACK_S, f"{name} took {elapsed:.1f} s"
    # The fallback renders; the app keeps working.
    assert t.render(CHAT).endswith("<start_of_turn>model\n")
    assert not template_threads()


def test_reply_time_failures_are_typed_and_bounded() -> None:
    """A template that passes the load checks but fails on a later conversation."""
    src = (
        "{% for m in messages %}{% if 'boom' in m.content %}{{ raise_exception('boom!') }}"
        "{% elif 'slow' in m.content %}{% for a in range(99999) %}{% for b in range(99999) %}"
        "{% endfor %}{% endfor %}{% elif 'big' in m.content %}{{ m.content * 1000 }}"
        "{% endif %}{{ m.content }}{% endfor %}"
    )
    t = jinja_template(src, "", "")
    for word in ("boom", "slow", "big"):
        t0 = time.perf_counter()
        with pytest.raises(ChatTemplateError, match="failed on this conversation"):
            t.render([ChatMessage("user", f"a {word} message " * 200)])
        assert time.perf_counter() - t0 < RENDER_BUDGET_S + GRACE_S + SLACK_S
    assert t.render([ChatMessage("user", "fine")]) == "fine"
    assert not template_threads()


# The interrupt may land in the collector's callback, where Python prints and drops it;
# the sandbox raises it again until the thread ends.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_render_that_outlives_its_tracer_is_interrupted() -> None:
    """Garbage-collector callbacks run inside a render: the deadline never raises in
    them (the exception would be lost, and the tracer with it). Code the tracer does
    not stop is interrupted in its thread once the caller gives up on it."""

    class Ref:
        pass

    calls = [0]

    def collected(_ref: object) -> None:
        calls[0] += 1

    def spin() -> None:
        while True:
            o = Ref()
            r = weakref.ref(o, collected)
            del o, r

    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError, match=r"ran longer than 0\.2 s"):
        template_guard.run_bounded(spin, 0.2, 1000)
    assert time.perf_counter() - t0 < 0.2 + GRACE_S + SLACK_S
    deadline = time.monotonic() + 2
    while template_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not template_threads() and calls[0] > 0


def test_lone_surrogates_never_reach_the_tokenizer() -> None:
    own = jinja_template(OUT + "\ud800{{ '\udfff' }}", "", "")
    for t in (own, choose_template(None, "gemma3", every_token)):
        text = t.render([ChatMessage("user", "a\ud800b\udfffc")])
        assert "a\ufffdb\ufffdc" in text
        text.encode("utf-8")
    assert own.render([ChatMessage("user", "x")]) == "x\ufffd\ufffd"


# -- fuzzing -----------------------------------------------------------------------------

NAMES = ["messages", "m", "m.content", "m.role", "loop.index", "ns.x", "bos_token", "x", "u"]
WORDS = ["", "a", "<start_of_turn>", "{{", "%s", "{}", "\\n", "ü", "'", "\ud800"]


def _literal(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


INTS = st.sampled_from([0, 1, 2, -1, 7, 100, 99999, 10**6, 10**9, 2**63])


def expressions() -> st.SearchStrategy[str]:
    leaves = st.one_of(
        INTS.map(str),
        st.sampled_from(WORDS).map(_literal),
        st.sampled_from(NAMES),
        st.sampled_from(["true", "none", "[]", "{}", "range(10)", "lipsum(2)", "cycler(1,2)"]),
    )

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        binop = st.tuples(
            inner,
            st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "~", "and", "or", "==", "in"]),
            inner,
        ).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
        flt = st.tuples(
            inner,
            st.sampled_from(
                [
                    "length",
                    "list",
                    "join",
                    "tojson",
                    "string",
                    "upper",
                    "trim",
                    "first",
                    "sum",
                    "sort",
                    "unique",
                    "reverse",
                    "batch(3)",
                    "center(50)",
                    "indent(4)",
                    "replace('a', 'bb')",
                    "format(1)",
                    "default(1)",
                    "map('string')",
                    "selectattr('role')",
                    "items",
                    "striptags",
                    "int",
                ]
            ),
        ).map(lambda t: f"({t[0]}|{t[1]})")
        method = st.tuples(
            inner,
            st.sampled_from(
                ["upper()", "split()", "strip()", "startswith('a')", "items()", "format(1)"]
            ),
        ).map(lambda t: f"{t[0]}.{t[1]}")
        call = inner.map(lambda e: f"[{e}, {e}]") | inner.map(lambda e: f"({e},)")
        call |= inner.map(lambda e: f"{{'k': {e}}}") | inner.map(lambda e: f"namespace(x={e})")
        cond = st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})")
        sub = st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]")
        return st.one_of(binop, flt, method, call, cond, sub, inner.map(lambda e: f"(not {e})"))

    return st.recursive(leaves, extend, max_leaves=6)


def statements() -> st.SearchStrategy[str]:
    expr = expressions()
    leaves = st.one_of(
        expr.map(lambda e: "{{ " + e + " }}"),
        expr.map(lambda e: "{% set ns.x = " + e + " %}"),
        expr.map(lambda e: "{% set x = " + e + " %}"),
        st.sampled_from(["text ", "<start_of_turn>", "{% break %}", "{% continue %}", "{# c #}"]),
        st.sampled_from(["{{ m(1) }}", "{{ self.b() }}", "{{ raise_exception('r') }}"]),
        st.text(alphabet="{}%#-+ab", max_size=8),  # broken syntax
    )

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        body = st.lists(inner, min_size=1, max_size=3).map("".join)
        return st.one_of(
            st.tuples(expr, body).map(lambda t: f"{{% if {t[0]} %}}{t[1]}{{% endif %}}"),
            st.tuples(expr, body).map(lambda t: f"{{% for u in {t[0]} %}}{t[1]}{{% endfor %}}"),
            body.map(lambda b: f"{{% for u in range(99999) %}}{b}{{% endfor %}}"),
            body.map(lambda b: f"{{% macro m(a) %}}{b}{{% endmacro %}}"),
            body.map(lambda b: f"{{% block b %}}{b}{{% endblock %}}"),
            body.map(lambda b: f"{{% filter upper %}}{b}{{% endfilter %}}"),
            body.map(lambda b: f"{{% generation %}}{b}{{% endgeneration %}}"),
            body.map(
                lambda b: f"{{% for u in [1] recursive %}}{b}{{{{ loop([1]) }}}}{{% endfor %}}"
            ),
        )

    return st.recursive(leaves, extend, max_leaves=8)


# Statements whose cost or failure depends on the conversation: they pass the checks
# at load and meet long or odd messages at reply time.
PER_MESSAGE = [
    "{% if m.content|length > 1000 %}{{ raise_exception('too long') }}{% endif %}",
    "{{ m.content * 5 }}",
    "{{ m.content ~ m.content ~ m.content }}",
    "{% for c in m.content %}{{ c * 3 }}{% endfor %}",
    "{{ m.content|list|sort|join }}",
    "{{ m.content.split()|tojson(indent=2) }}",
    "{{ m.content.replace('a', 'aaaa') }}",
    "{{ '%s|%s' % (m.content, m.role) }}",
    "{{ m.content|indent(8) }}",
]


@st.composite
def generated_templates(draw: st.DrawFn) -> str:
    parts = ["{% set ns = namespace(x=1) %}"] if draw(st.booleans()) else []
    parts += draw(st.lists(statements(), max_size=4))
    if draw(st.booleans()):  # a message loop, so that some pass the checks at load
        inner = draw(st.lists(statements() | st.sampled_from(PER_MESSAGE), max_size=2))
        inner = "".join(inner)
        parts.append("{% for m in messages %}{{ m.content }}" + inner + "{% endfor %}")
    draw(st.randoms()).shuffle(parts)
    return "".join(parts)


MUTATIONS = [
    "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
    "{{ 'x' * 10**8 }}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{{ raise_exception('mutant') }}",
    "{% endfor %}",
    "{%- if",
    "}}",
    "{{ messages|tojson }}",
    "{% break %}",
]


@st.composite
def mutated_real_templates(draw: st.DrawFn) -> str:
    src = REAL[draw(st.sampled_from(sorted(REAL)))]
    for _ in range(draw(st.integers(1, 4))):
        n = len(src)
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 200)))
        kind = draw(st.sampled_from(["delete", "duplicate", "insert", "swap", "text"]))
        if kind == "delete":
            src = src[:i] + src[j:]
        elif kind == "duplicate":
            src = src[:j] + src[i:j] + src[j:]
        elif kind == "insert":
            src = src[:i] + draw(st.sampled_from(MUTATIONS)) + src[i:]
        elif kind == "swap":
            k = draw(st.integers(0, n))
            a, b = sorted((j, k))
            src = src[:i] + src[a:b] + src[j:a] + src[i:j] + src[b:]
        else:
            src = src[:i] + draw(st.text(max_size=5)) + src[j:]
    return src


ANY_CHAR = st.characters(exclude_categories=())  # surrogates included


@st.composite
def conversations(draw: st.DrawFn) -> list[ChatMessage]:
    turns = draw(st.integers(1, 5))
    out = (
        [ChatMessage("system", draw(st.text(ANY_CHAR, max_size=20)))] if draw(st.booleans()) else []
    )
    for i in range(turns):
        content = draw(st.text(ANY_CHAR, max_size=30))
        if draw(st.integers(0, 9)) == 0:
            content += draw(st.sampled_from(["a", "\n", "<start_of_turn>", "{{"])) * draw(
                st.integers(1000, 300_000)
            )
        out.append(ChatMessage("assistant" if i % 2 else "user", content))
    if out[-1].role == "assistant":
        out.append(ChatMessage("user", "?"))
    return out


FUZZ_STATS = {"templates": 0, "own": 0, "fallback": 0, "renders": 0, "render_errors": 0}


def check_template_pipeline(source: str, messages: list[ChatMessage]) -> None:
    """The invariant: a template or a fallback with a note, then text within limits or a
    ``ChatTemplateError``, each within its budget; nothing else, and no thread left."""
    FUZZ_STATS["templates"] += 1
    t, elapsed = timed_choose(source)
    assert elapsed < template_sandbox.LOAD_BUDGET_S + GRACE_S + SLACK_S
    if not source:  # no template in the file: the built-in one, nothing to say
        assert t.name == "gemma" and not t.note
    elif t.note:
        FUZZ_STATS["fallback"] += 1
        assert t.name == "gemma" and t.note.startswith(FALLBACK)
    else:
        FUZZ_STATS["own"] += 1
        assert t.name == "model's own"
    for gen in (True, False):
        t0 = time.perf_counter()
        try:
            text = t.render(messages, gen)
        except ChatTemplateError as exc:
            FUZZ_STATS["render_errors"] += 1
            assert str(exc) and t.name == "model's own"
        else:
            FUZZ_STATS["renders"] += 1
            assert len(text) <= output_limit(sum(len(m.content) for m in messages)) or (
                t.name == "gemma"
            )
            text.encode("utf-8")
        assert time.perf_counter() - t0 < template_sandbox.RENDER_BUDGET_S + GRACE_S + SLACK_S
    deadline = time.monotonic() + GRACE_S
    while template_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not template_threads()


# Per-run example counts (``--hypothesis-profile=deep`` for a longer hunt).
FUZZ = settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(source=generated_templates(), messages=conversations())
def test_fuzz_generated_templates(source: str, messages: list[ChatMessage]) -> None:
    with short_budgets():
        check_template_pipeline(source, messages)


@settings(FUZZ, max_examples=examples(80))
@given(source=mutated_real_templates(), messages=conversations())
def test_fuzz_mutated_real_templates(source: str, messages: list[ChatMessage]) -> None:
    with short_budgets():
        check_template_pipeline(source, messages)


@settings(FUZZ, max_examples=examples(60))
@given(name=st.sampled_from(sorted(REAL)), messages=conversations())
def test_fuzz_messages_on_real_templates(name: str, messages: list[ChatMessage]) -> None:
    check_template_pipeline(REAL[name], messages)


def test_fuzz_report() -> None:
    """Prints what the fuzzers above ran (run with -s to see it)."""
    print(f"template fuzz cases: {FUZZ_STATS}")


# -- the real model -------------------------------------------------------------------------

FORCE_TURN = SamplingParams.greedy(20)


@pytest.mark.parametrize("speculative", [False, True])
def test_a_new_turn_token_ends_the_reply(engine: Engine, speculative: bool) -> None:
    """``<start_of_turn>`` detokenizes to "": the reply must stop on its id, so no
    made-up user turn streams into it. A grammar makes the model emit it."""
    params = replace(
        FORCE_TURN,
        output_format="gbnf",
        grammar='root ::= "Sure" <start_of_turn> "user" [a-z ]*',
        speculative=speculative,
    )
    events = list(engine.generate([ChatMessage("user", "hi")], params))
    done = events[-1]
    assert isinstance(done, Finished)
    shown = "".join(e.text for e in events if isinstance(e, Token))
    assert shown == done.text == "Sure"
    assert done.metrics.stop_reason == "stop_string"


def test_a_user_stop_string_that_is_a_control_token_stops_too(engine: Engine) -> None:
    assert engine._loaded is not None
    vocab = engine._loaded.vocab
    bos = vocab.control_token("<bos>")
    assert bos is not None and vocab.control_token("hello") is None
    assert vocab.stop_tokens(["<start_of_turn>", "<end_of_turn>", "x", ""]) == frozenset({105, 106})


def test_a_template_failing_at_reply_time_is_one_typed_error(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = "{% for m in messages %}{% if 'boom' in m.content %}{{ raise_exception('boom') }}"
    src += "{% endif %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
    monkeypatch.setattr(engine._chat, "template", jinja_template(src, "<bos>", "<eos>"))
    events = []
    with pytest.raises(ChatTemplateError, match="boom"):
        for event in engine.generate([ChatMessage("user", "boom")], SamplingParams.greedy(4)):
            events.append(event)
    assert events == []
    # An empty render never reaches llama.cpp (an empty batch aborts the process).
    empty = ChatTemplate("empty", "test", (), lambda _m, _g, _x: "")
    monkeypatch.setattr(engine._chat, "template", empty)
    with pytest.raises(ChatTemplateError, match="empty prompt"):
        list(engine.generate([ChatMessage("user", "hi")], SamplingParams.greedy(4)))
    monkeypatch.undo()
    assert isinstance(list(engine.generate(CHAT, SamplingParams.greedy(2)))[-1], Finished)


def test_hostile_templates_in_the_model_file_fall_back_at_load(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Engine.load`` with the GGUF's template replaced: a hostile one falls back within
    the budget with a note; the real Gemma 3 template is used, stopping on its turn ids."""
    info = read_gguf_info(model_path)
    engine = Engine()
    try:
        for source, own in ((HOSTILE["nested loops"], False), (REAL["gemma-3-it.jinja"], True)):
            monkeypatch.setattr(
                llama_module, "read_gguf_info", lambda _p, s=source: replace(info, chat_template=s)
            )
            t0 = time.perf_counter()
            loaded = engine.load(model_path, TEST_LOAD)
            elapsed = time.perf_counter() - t0
            assert engine.template is not None
            if own:
                assert loaded.template.startswith("model's own (from the GGUF")
                assert own_notes(engine.load_notes) == ()
                assert engine._chat.stop_ids == {1, 105, 106}
            else:
                assert elapsed < 10 + LOAD_BUDGET_S + GRACE_S
                assert engine.template.name == "gemma"
                (note,) = own_notes(engine.load_notes)
                assert note.startswith(FALLBACK) and "ran longer than" in note
            done = list(engine.generate([ChatMessage("user", "Hi")], SamplingParams.greedy(3)))
            assert isinstance(done[-1], Finished)
    finally:
        engine.unload()


def test_worker_reports_one_terminal_signal_for_a_template_failure(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, qtbot: object
) -> None:
    from ui.engine.worker import EngineWorker, GenerateJob

    src = "{% for m in messages %}{% if 'zz' in m.content %}{{ raise_exception('x') }}"
    src += "{% endif %}{{ m.content }}{% endfor %}"
    monkeypatch.setattr(engine._chat, "template", jinja_template(src, "", ""))
    worker = EngineWorker(engine, Path("."), None)
    seen: list[str] = []
    worker.finished.connect(lambda *a: seen.append("finished"))
    worker.cancelled.connect(lambda *a: seen.append("cancelled"))
    worker.failed.connect(lambda _r, msg: seen.append(f"failed: {msg}"))
    job = GenerateJob(
        1, "", [ChatMessage("user", "zz")], SamplingParams.greedy(2), threading.Event()
    )
    worker.generate(job)
    assert len(seen) == 1 and seen[0].startswith("failed: The model's chat template failed")
