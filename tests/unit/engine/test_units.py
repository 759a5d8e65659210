"""Qt-free pieces on known inputs: templates, metrics, stop strings, Markdown, settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.config.setting_records import LoadConfig, SamplingParams
from app.config.settings import AppSettings
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics, percentile
from app.engine.stopping import StopStringFilter
from app.engine.templates.builtin import template_for_architecture
from app.engine.templates.jinja_template import choose_template, jinja_template

CHAT = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Hi"),
    ChatMessage("assistant", "Hello!"),
    ChatMessage("user", "Bye"),
]


def no_tokens(_text: str) -> bool:
    return False


def test_gemma_template_folds_the_system_prompt() -> None:
    t = template_for_architecture("gemma3", no_tokens)
    assert t.label == "gemma (for gemma3)"
    assert t.render(CHAT) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


@pytest.mark.parametrize(
    ("arch", "tokens", "name", "expected_start"),
    [
        ("qwen2", set(), "chatml", "<|im_start|>system\nBe brief.<|im_end|>\n"),
        (
            "llama",
            {"<|start_header_id|>"},
            "llama3",
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>",
        ),
        ("llama", {"[INST]"}, "mistral", "[INST] Be brief.\n\nHi [/INST] Hello!</s>"),
        ("llama", set(), "llama2", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"),
        ("phi3", set(), "phi3", "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>"),
        ("mistral", set(), "mistral", "[INST] Be brief.\n\nHi [/INST]"),
        ("mystery", set(), "chatml", "<|im_start|>system"),
    ],
)
def test_templates_by_architecture(
    arch: str, tokens: set[str], name: str, expected_start: str
) -> None:
    t = template_for_architecture(arch, tokens.__contains__)
    assert t.name == name
    assert t.render(CHAT).startswith(expected_start)
    if arch == "mystery":
        assert "fallback" in t.label


def test_generation_prompt_ends_each_format() -> None:
    ends = {
        "gemma3": "<start_of_turn>model\n",
        "qwen3": "<|im_start|>assistant\n",
        "phi3": "<|assistant|>\n",
        "mistral": "[/INST]",
    }
    for arch, end in ends.items():
        assert template_for_architecture(arch, no_tokens).render(CHAT).endswith(end)


def test_the_models_own_template_wins_and_bos_is_not_doubled() -> None:
    src = (
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    t = choose_template(src, "gemma3", no_tokens, bos_token="<s>", eos_token="</s>")
    assert t.name == "model's own"
    assert t.render(CHAT[1:2]) == "<user>Hi</s><assistant>"
    assert "</s>" in t.stop_strings


def test_a_broken_embedded_template_falls_back_with_the_reason() -> None:
    t = choose_template("{% for %}", "qwen2", no_tokens)
    assert t.name == "chatml" and "does not compile" in t.reason
    t = choose_template("{{ raise_exception('no system role') }}", "gemma3", no_tokens)
    assert t.name == "gemma" and "no system role" in t.reason


def test_embedded_templates_run_sandboxed() -> None:
    with pytest.raises(ValueError):
        jinja_template("{{ ''.__class__.__mro__[1].__subclasses__() }}", "", "")


def test_percentile_interpolates() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([5.0], 95) == 5.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 95) == 95


def test_metrics_from_known_timestamps() -> None:
    m = MessageMetrics(
        prompt_tokens=100,
        cached_tokens=60,
        evaluated_tokens=40,
        prefill_ms=200.0,
        generated_tokens=5,
        token_times_ms=[250.0, 260.0, 270.0, 290.0, 300.0],
        stop_reason="eos",
    )
    assert m.prefill_tok_s == pytest.approx(200.0)
    assert m.ttft_ms == 250.0
    assert m.inter_token_ms == [10.0, 10.0, 20.0, 10.0]
    assert m.decode_ms == 50.0
    assert m.decode_tok_s == pytest.approx(80.0)
    assert m.itl_p50_ms == 10.0
    assert m.itl_p95_ms == pytest.approx(18.5)
    assert m.context_used == 105
    data = m.summary()
    assert data["decode_tok_s"] == 80.0 and "token_times_ms" not in data
    json.dumps(data)
    assert "5 tokens" in m.short_text() and "40/100 evaluated" in m.short_text()


def test_stop_strings_split_across_pieces_never_show() -> None:
    f = StopStringFilter(["<end_of_turn>", "STOP"])
    out = [f.feed(p) for p in ["Hello ", "wor", "ld <end", "_of", "_turn> tail"]]
    assert "".join(out) == "Hello world "
    assert f.hit


def test_a_false_start_of_a_stop_string_is_released() -> None:
    f = StopStringFilter(["STOP"])
    assert f.feed("ST") == ""
    assert f.feed("ART") == "START"
    assert f.feed(" ST") == " "
    assert f.flush() == "ST"
    assert not f.hit


def test_settings_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    s = AppSettings(
        model_path="/m.gguf",
        system_prompt="Be kind.",
        load=LoadConfig(n_ctx=8192, n_threads=4),
        sampling=SamplingParams(temperature=0.2, stop=("END",)),
    )
    s.save(path)
    assert AppSettings.load_from(path) == s


def test_corrupt_settings_give_defaults_and_are_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text("{not json")
    assert AppSettings.load_from(path) == AppSettings()
    assert (tmp_path / "settings.json.bad").read_text() == "{not json"


def test_settings_ignore_wrong_types_and_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(
        json.dumps(
            {
                "load": {"n_ctx": "huge", "n_threads": 3, "bogus": 1},
                "sampling": {"temperature": 1, "top_k": True},
            }
        )
    )
    s = AppSettings.load_from(path)
    assert s.load.n_ctx == LoadConfig().n_ctx and s.load.n_threads == 3
    assert s.sampling.temperature == 1.0 and s.sampling.top_k == SamplingParams().top_k


def test_markdown_escapes_html_and_renders_no_images() -> None:
    from app.chat.markdown_render import render_markdown

    out = render_markdown(
        "<script>alert(1)</script> ![x](http://e.com/a.png) **b** "
        "[ok](https://e.com) [bad](javascript:alert(1))"
    )
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "<img" not in out
    assert "<strong>b</strong>" in out
    assert 'href="https://e.com"' in out
    assert 'href="javascript' not in out  # left as text


def test_markdown_highlights_code_blocks() -> None:
    from app.chat.markdown_render import render_markdown

    out = render_markdown("```python\ndef f(x):\n    return '<b>'\n```")
    assert "<table" in out and "style=" in out
    assert "&lt;b&gt;" in out and "<b>" not in out
    assert ">python<" in out
