"""Hostile templates in the chat-format worker: a hang or a crash ends only the child,
the template is refused from then on (the Python path formats it), and the next
template is served by a fresh child."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from app.engine.native.chat_shim import ChatShim, ShimError, library_path
from app.engine.native.chat_worker import ChatWorker, TemplateRefused
from tests import llama_chat

USER = {"messages": [{"role": "user", "content": "hi"}]}
HANGS = "{% for i in range(10000000000) %}{{ i }}{% endfor %}"
CRASHES = "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"  # the stack runs out


@pytest.fixture
def quick(shim: ChatShim) -> Iterator[ChatWorker]:
    made = ChatWorker(lib=llama_chat.shim_path() or library_path(), deadline_s=1.5)
    yield made
    made.close()


def test_a_template_that_hangs_is_stopped_and_refused(quick: ChatWorker) -> None:
    good = quick.template(llama_chat.template_source("Qwen3-Coder.jinja"))
    plain = quick.template("{{ 'x' }}")
    start = time.monotonic()
    with pytest.raises(TemplateRefused, match="took more than"):
        quick.apply(quick.template(HANGS), USER)
    assert time.monotonic() - start < 10
    with pytest.raises(TemplateRefused):  # never sent again
        quick.template(HANGS)
    assert "hi" in quick.apply(good, USER)["prompt"]  # a fresh child, the template re-read
    assert quick.apply(plain, USER)["prompt"] == "x"


def test_a_template_that_crashes_the_worker_is_refused(quick: ChatWorker) -> None:
    with pytest.raises(TemplateRefused, match="crashed"):
        quick.apply(quick.template(CRASHES), USER)
    good = quick.template(llama_chat.template_source("Qwen3.5-4B.jinja"))
    assert quick.apply(good, USER)["format_name"] == "peg-native"


def test_a_template_with_a_syntax_error_is_an_error_not_a_refusal(quick: ChatWorker) -> None:
    with pytest.raises(ShimError) as caught:
        quick.template("{{ foo(")
    assert not isinstance(caught.value, TemplateRefused)
    assert "hi" in quick.apply(quick.template("{{ messages[0].content }}"), USER)["prompt"]


def test_a_request_llama_cpp_refuses_is_an_error(quick: ChatWorker) -> None:
    tmpl = quick.template(llama_chat.template_source("Qwen3.5-4B.jinja"))
    with pytest.raises(ShimError, match="user"):  # the template raises: no user query
        quick.apply(tmpl, {"messages": [{"role": "system", "content": "x"}]})
