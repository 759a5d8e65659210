"""Reasoning in the sampling panel (section, values, what the template allows, presets)
and in the performance panel (figures and chart series of replies that thought)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PySide6.QtWidgets import QComboBox, QPlainTextEdit, QSpinBox, QToolButton, QWidget
from pytestqt.qtbot import QtBot

from app.config.presets import PresetStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.config.setting_specs import SPECS
from app.engine.backend import Capabilities, ModelInfo
from app.engine.metrics import MessageMetrics
from app.engine.reasoning.format import ReasoningFormat
from ui.common.context import LoadedModel
from ui.perf.perf_panel import PerfPanel, first_token_text
from ui.settings.sampling_panel import SamplingPanel

REASONING = ("thinking", "reasoning_effort", "thinking_budget", "budget_message")
QWEN = ReasoningFormat("<think>", "</think>", "\n</think>\n\n", switch="enable_thinking")
R1 = ReasoningFormat("<think>", "</think>", prefilled=True)  # no switch: "off" = empty block
GPT_OSS = ReasoningFormat(
    "<|channel|>analysis<|message|>",
    "<|end|>",
    answer_lead="<|start|>assistant<|channel|>final<|message|>",
    effort=True,
)
CONTROL = Capabilities(thinking_control=True)


def info(fmt: ReasoningFormat | None, caps: Capabilities = CONTROL) -> ModelInfo:
    return ModelInfo(
        Path("m.gguf"), "Thinker", "qwen3", 1, 1, 4096, 4096, 2, 0, "", "CPU", 0.0,
        capabilities=caps, reasoning=fmt,
    )  # fmt: skip


@pytest.fixture()
def panel(qtbot: QtBot, tmp_path: Path) -> SamplingPanel:
    p = SamplingPanel(PresetStore(tmp_path / "presets.json"), SamplingParams(), LoadConfig())
    qtbot.addWidget(p)
    p.show()
    return p


def field(panel: SamplingPanel, name: str) -> Any:
    w = panel.findChild(QWidget, f"field_{name}")
    assert w is not None, name
    return w


def enabled(panel: SamplingPanel) -> dict[str, bool]:
    return {name: field(panel, name).isEnabled() for name in REASONING}


def test_reasoning_section_follows_advanced_with_controls_from_specs(
    panel: SamplingPanel,
) -> None:
    section = panel.findChild(QWidget, "section_reasoning")
    assert section is not None
    toggle = panel.findChild(QToolButton, "sectionToggle_reasoning")
    assert toggle is not None and toggle.text() == "Reasoning" and not toggle.isChecked()
    column = section.parentWidget().layout()
    order = [column.itemAt(i).widget() for i in range(column.count())]
    names = [w.objectName() for w in order if w is not None]
    assert names.index("section_reasoning") == names.index("section_advanced") + 1
    assert [s.name for s in SPECS if s.group == "reasoning"] == list(REASONING)
    assert isinstance(field(panel, "thinking"), QComboBox)
    assert isinstance(field(panel, "reasoning_effort"), QComboBox)
    assert isinstance(field(panel, "thinking_budget"), QSpinBox)
    assert isinstance(field(panel, "budget_message"), QPlainTextEdit)
    for name in REASONING:
        assert field(panel, name).parentWidget().parentWidget() is section
    # FILE_ONLY: saved with the conversation, set through the API, no control
    assert panel.findChild(QWidget, "field_template_kwargs") is None


def test_reasoning_values_round_trip(qtbot: QtBot, panel: SamplingPanel) -> None:
    out: list[SamplingParams] = []
    panel.samplingChanged.connect(out.append)
    thinking, effort = field(panel, "thinking"), field(panel, "reasoning_effort")
    thinking.setCurrentIndex(thinking.findData("off"))
    effort.setCurrentIndex(effort.findData("high"))
    field(panel, "thinking_budget").setValue(512)
    field(panel, "budget_message").setPlainText("Answer now.")
    params = panel.params()
    assert (params.thinking, params.reasoning_effort) == ("off", "high")
    assert (params.thinking_budget, params.budget_message) == (512, "Answer now.")
    assert out[-1] == params and len(out) == 4

    shown = SamplingParams(thinking="on", reasoning_effort="low", thinking_budget=64)
    panel.set_params(replace(shown, template_kwargs='{"x": 1}'))
    assert thinking.currentData() == "on" and effort.currentData() == "low"
    assert field(panel, "thinking_budget").value() == 64
    assert panel.params().template_kwargs == '{"x": 1}'  # kept though it has no control


def test_budget_zero_reads_no_limit(panel: SamplingPanel) -> None:
    spin = field(panel, "thinking_budget")
    assert spin.value() == 0 and spin.text() == "no limit"
    reset = panel.findChild(QToolButton, "reset_thinking_budget")
    assert reset is not None and "no limit" in reset.toolTip()
    spin.setValue(300)
    assert spin.text() == "300" and panel.params().thinking_budget == 300
    reset.click()
    assert spin.text() == "no limit" and panel.params().thinking_budget == 0


def test_what_the_template_cannot_do_is_disabled_saying_why(panel: SamplingPanel) -> None:
    model = LoadedModel()
    model.changed.connect(panel.set_model)  # as the window wires it (ui/window/docks.py)
    assert all(enabled(panel).values())  # no model: nothing to refuse

    model.set(info(None))
    assert not any(enabled(panel).values())
    assert "no thinking block" in field(panel, "thinking").toolTip()

    model.set(info(QWEN))  # a switch, no effort
    assert enabled(panel) == {
        "thinking": True, "reasoning_effort": False, "thinking_budget": True, "budget_message": True
    }  # fmt: skip
    assert "enable_thinking" in field(panel, "thinking").toolTip()
    assert "reads no reasoning effort" in field(panel, "reasoning_effort").toolTip()

    model.set(info(R1))  # no switch: "off" still works (an empty block)
    assert enabled(panel)["thinking"]
    assert "empty thinking block" in field(panel, "thinking").toolTip()

    model.set(info(GPT_OSS))  # no switch and no empty block, but an effort
    assert not enabled(panel)["thinking"] and enabled(panel)["reasoning_effort"]
    assert "cannot switch thinking off" in field(panel, "thinking").toolTip()
    assert field(panel, "reasoning_effort").toolTip() == next(
        s.help for s in SPECS if s.name == "reasoning_effort"
    )

    why = {"thinking_control": "This server thinks on its own."}
    model.set(info(QWEN, Capabilities(why_not=why)))
    assert not enabled(panel)["thinking_budget"] and not enabled(panel)["budget_message"]
    assert field(panel, "thinking_budget").toolTip() == why["thinking_control"]
    # The engine's own reasons (set by the window on load) do not clear these, nor they those.
    panel.set_unavailable({"grammar": "No grammar here."})
    assert not enabled(panel)["thinking_budget"] and not field(panel, "grammar").isEnabled()

    model.set(None)
    assert all(enabled(panel).values()) and not field(panel, "grammar").isEnabled()


def test_presets_keep_the_reasoning_fields(tmp_path: Path) -> None:
    path = tmp_path / "presets.json"
    store = PresetStore(path)
    params = SamplingParams(
        thinking="off", reasoning_effort="high", thinking_budget=256,
        budget_message="Enough.", template_kwargs='{"a": true}',
    )  # fmt: skip
    store.save("Think little", params)
    assert PresetStore(path).get("Think little") == params
    name = PresetStore(tmp_path / "other.json").import_preset(store.export_preset("Think little"))
    assert PresetStore(tmp_path / "other.json").get(name) == params

    # A file from before reasoning settings loads as it was, with the defaults added.
    old = {"version": 1, "presets": {"Old": {"temperature": 0.3, "top_k": 12}}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    loaded = PresetStore(tmp_path / "old.json")
    assert loaded.notes == []
    assert loaded.get("Old") == SamplingParams(temperature=0.3, top_k=12)


def test_picking_a_preset_sets_the_reasoning_fields(qtbot: QtBot, tmp_path: Path) -> None:
    store = PresetStore(tmp_path / "presets.json")
    store.save("No thinking", SamplingParams(thinking="off", thinking_budget=99))
    panel = SamplingPanel(store, SamplingParams(), LoadConfig())
    qtbot.addWidget(panel)
    panel.select_preset("No thinking")
    assert field(panel, "thinking").currentData() == "off"
    assert field(panel, "thinking_budget").value() == 99
    assert panel.params().thinking == "off" and not panel.presets_bar.modified()


# -- the performance panel -------------------------------------------------------------------


def reply(n: int, reasoning: int = 0, cut: str = "", step: float = 10.0) -> MessageMetrics:
    """``n`` tokens ``step`` ms apart from 100 ms, the first ``reasoning`` of them thinking."""
    times = [100.0 + i * step for i in range(n)]
    return MessageMetrics(
        prompt_tokens=20,
        evaluated_tokens=20,
        prefill_ms=50.0,
        generated_tokens=n,
        token_times_ms=times,
        stop_reason="eos",
        n_ctx=2048,
        reasoning_tokens=reasoning,
        first_answer_ms=times[reasoning] if 0 < reasoning < n else 0.0,
        thinking_cut=cut,
    )


def test_figures_name_thinking_time_tokens_and_a_cut() -> None:
    assert first_token_text(reply(10)) == "TTFT 100 ms"
    m = replace(reply(400, reasoning=380), first_answer_ms=4200.0)
    assert first_token_text(m) == "TTFT 100 ms · first answer 4.2 s · thought 4.1 s, 380 tokens"
    assert first_token_text(reply(50, 40, cut="budget")).endswith(
        "thought 400 ms, 40 tokens (cut at the budget)"
    )
    assert first_token_text(reply(50, 40, cut="user")).endswith("(stopped by you)")
    # All thinking, no answer (a stop while it thought): no "first answer".
    assert first_token_text(reply(30, 30, cut="user")) == (
        "TTFT 100 ms · thought 290 ms, 30 tokens (stopped by you)"
    )


def test_charts_show_first_answer_and_thinking_share(qtbot: QtBot) -> None:
    panel = PerfPanel()
    qtbot.addWidget(panel)
    panel.show()
    plain = reply(20)
    panel.set_history([plain])
    assert panel.ttft_answer.getData()[0] is None  # no reply thought: no series, no legend
    assert panel.ttft_legend.getLabel(panel.ttft_answer) is None

    thought = reply(40, reasoning=30, cut="budget")
    panel.end_reply(thought)
    panel._on_redraw()
    x, y = panel.ttft_answer.getData()
    assert list(x) == [1, 2] and np.isnan(y[0]) and y[1] == thought.first_answer_ms
    assert panel.ttft_legend.getLabel(panel.ttft_answer) is not None
    _, share = panel.drafts_thinking.getData()
    assert np.isnan(share[0]) and share[1] == pytest.approx(30 / 40)
    # The last reply's token latencies: its thinking tokens stacked under its answer's.
    thinking = panel.itl_thinking_bars.opts["height"]
    answer = panel.itl_bars.opts["height"]
    assert sum(thinking) == 29 and sum(answer) == 10  # 39 intervals, token 1.. are timed
    assert list(panel.itl_bars.opts["y0"]) == list(thinking)
    assert "first answer" in panel.summary.text() and "cut at the budget" in panel.summary.text()

    panel.set_history([plain])  # another conversation: the entry goes again
    assert panel.ttft_legend.getLabel(panel.ttft_answer) is None
    assert sum(panel.itl_thinking_bars.opts["height"]) == 0
    panel.set_history([thought])
    panel.set_history([])  # a new chat: no bars, and nothing left stacked on nothing
    panel.grab()  # draws them
    assert len(panel.itl_bars.opts["height"]) == 0 and panel.itl_bars.opts["y0"] is None
    panel.stop_timers()
