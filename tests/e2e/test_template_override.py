"""Chat template override per model: the engine, the dialog's preview, the window, and
``model_prefs.json`` (read defensively, fuzzed from a real saved file)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.config.model_prefs import (
    FILE_NAME,
    SYSTEM_PROMPT_CHARS,
    TEMPLATE_CHARS,
    ModelPrefs,
    ModelPrefsStore,
    model_key,
    prefs_from_dict,
)
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished, ModelInfo
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.template_errors import ChatTemplateError
from app.engine.templates.override import AUTO, PLAIN, TemplateOverride, preview_prompt
from app.engine.templates.sandbox import MAX_SOURCE_CHARS
from app.remote.connection import Connection
from app.remote.llama_server.backend import LlamaServerBackend
from app.remote.openai.backend import CAPABILITIES as OPENAI_CAPABILITIES
from app.remote.openai.backend import WHY_NOT, OpenAIBackend
from app.util.errors import LamplightError
from tests.conftest import ROOT
from tests.fakes.engine import FakeEngine
from tests.fakes.window import fake_window
from tests.hypothesis_budget import examples
from tests.native import own_notes
from tests.real_window import close, evaluated, open_window, send
from tests.server_fixture import RunningServer
from tests.unit.config.test_data_limits import model_keys
from ui.chat.template_dialog import TemplateDialog

GREEDY = SamplingParams.greedy(4)
# A ChatML-like template with markers of its own, to see in the evaluated text.
MARKED = (
    "{% for m in messages %}[[{{ m.role }}]]{{ m.content }}[[/]]\n{% endfor %}"
    "{% if add_generation_prompt %}[[assistant]]{% endif %}"
)
LOOPS = (
    "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}"
)
HUGE = "{{ 'x' * 1000000000 }}{% for m in messages %}{{ m.content }}{% endfor %}"
RAISES_ON_ZZ = (
    "{% for m in messages %}{% if 'zz' in m.content %}{{ raise_exception('no zz here') }}"
    "{% endif %}<<{{ m.content }}>>{% endfor %}"
)
GEMMA_IT = (ROOT / "tests" / "data" / "templates" / "gemma-3-it.jinja").read_text()


@pytest.fixture()
def engine(one_engine: Engine) -> Iterator[Engine]:
    """The module's engine, empty, given back with its automatic template."""
    one_engine.reset()
    yield one_engine
    one_engine.set_template(AUTO)
    one_engine.reset()


# -- engine ------------------------------------------------------------------------------


def test_override_changes_the_evaluated_prompt_without_a_reload(engine: Engine) -> None:
    loads = engine.load_count
    info = engine.set_template(TemplateOverride("custom", source=MARKED))
    assert info.template == "your own (set for this model)" and own_notes(info.notes) == ()
    list(engine.generate([ChatMessage("system", "Be kind."), ChatMessage("user", "Hi")], GREEDY))
    assert engine.context_text.startswith("[[system]]Be kind.[[/]]\n[[user]]Hi[[/]]\n[[assistant]]")
    info = engine.set_template(TemplateOverride("builtin", "chatml"))
    assert info.template == "chatml (chosen for this model)"
    done = list(engine.generate([ChatMessage("user", "Hi")], GREEDY))[-1]
    assert engine.context_text.startswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert done.metrics.cached_tokens <= 1  # another template: read again from the start
    assert engine.load_count == loads  # the weights stayed


def test_broken_override_falls_back_with_a_message(engine: Engine) -> None:
    info = engine.set_template(TemplateOverride("custom", source="{% for m in messages %}"))
    assert engine.template is not None and engine.template.name == "gemma"
    (note,) = own_notes(info.notes)
    assert note.startswith("Your chat template for this model was not used: it does not compile")
    assert note.endswith("Using the built-in gemma template instead.")
    info = engine.set_template(TemplateOverride("builtin", "no-such-template"))
    assert "is not one Lamplight has" in own_notes(info.notes)[0]
    list(engine.generate([ChatMessage("user", "Hi")], GREEDY))
    assert engine.context_text.startswith("<start_of_turn>user\nHi<end_of_turn>")


def test_override_failing_on_a_conversation_falls_back_for_the_reply(engine: Engine) -> None:
    engine.set_template(TemplateOverride("custom", source=RAISES_ON_ZZ))
    list(engine.generate([ChatMessage("user", "Hi")], GREEDY))
    assert engine.context_text.startswith("<<Hi>>")
    done = list(engine.generate([ChatMessage("user", "say zz")], GREEDY))[-1]
    (note,) = done.metrics.notes
    assert note.startswith("Your chat template for this model failed on this conversation")
    assert "no zz here" in note and "built-in gemma" in note
    assert engine.context_text.startswith("<start_of_turn>user\nsay zz<end_of_turn>")
    assert engine.model is not None and engine.model.template == "gemma (for gemma3)"
    assert own_notes(engine.model.notes) == (note + ".",)


def test_preview_runs_in_the_sandbox_with_its_limits(one_engine: Engine) -> None:
    assert one_engine.model is not None
    inputs = one_engine.model.template_inputs
    assert inputs is not None and inputs.builtin == "gemma" and inputs.bos_token == "<bos>"
    chat = [ChatMessage("user", "Hi")]
    text, note = preview_prompt(AUTO, inputs, chat)
    assert (text, note) == ("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "")
    with pytest.raises(ChatTemplateError, match="repeated value longer than"):
        preview_prompt(TemplateOverride("custom", source=HUGE), inputs, chat)
    broken = replace(inputs, embedded="{{ raise_exception('nope') }}")
    text, note = preview_prompt(AUTO, broken, chat)
    assert text.startswith("<start_of_turn>user") and "nope" in note


# -- the dialog ---------------------------------------------------------------------------


def test_dialog_preview_shows_the_sandbox_error_and_refuses_to_save(
    qtbot: QtBot, one_engine: Engine
) -> None:
    info = one_engine.model
    assert info is not None and info.template_inputs is not None
    chat = [ChatMessage("user", "What is in this chat?")]
    dialog = TemplateDialog(
        info.name, info.template_inputs, info.base_model, ModelPrefs(completion=False), chat
    )
    qtbot.addWidget(dialog)
    dialog.show()
    try:
        qtbot.waitUntil(lambda: dialog.preview_ready, timeout=10_000)
        assert dialog.preview.toPlainText().startswith(
            "<start_of_turn>user\nYou are a helpful assistant.\n\nHello! Who are you?"
        )
        dialog.kind.setCurrentIndex(dialog.kind.count() - 1)  # Custom
        for source, why in ((LOOPS, "ran longer than 2 s"), (HUGE, "repeated value longer")):
            dialog.editor.setPlainText(source)
            assert not dialog.save_button.isEnabled()  # not while it is being checked
            qtbot.waitUntil(lambda: dialog.preview_ready, timeout=15_000)
            assert why in dialog.status.text()
            assert dialog.status.text().startswith("This template cannot be used: it")
            assert not dialog.save_button.isEnabled() and dialog.preview.toPlainText() == ""
        dialog.editor.setPlainText(MARKED)
        dialog.sample.setCurrentIndex(1)  # this chat
        qtbot.waitUntil(lambda: dialog.preview_ready, timeout=10_000)
        assert dialog.preview.toPlainText() == ("[[user]]What is in this chat?[[/]]\n[[assistant]]")
        assert dialog.save_button.isEnabled()
        assert dialog.choice().override == TemplateOverride("custom", source=MARKED)
        dialog.completion.setChecked(True)
        qtbot.waitUntil(lambda: dialog.preview_ready, timeout=10_000)
        assert dialog.preview.toPlainText() == "What is in this chat?"
    finally:
        dialog.reject()


# -- the window on the real model ---------------------------------------------------------


def test_template_dialog_saves_and_applies_per_model(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    win = open_window(qtbot, tmp_path / "data", model_path)
    try:
        controls = win.prompt_controls
        controls.set_completion(False)  # chat turns, so the template is used
        qtbot.waitUntil(lambda: "template gemma" in win.status_model.text(), timeout=10_000)
        assert controls.template_action.isEnabled()
        controls.template_action.trigger()
        dialog = controls.dialog
        assert dialog is not None
        dialog.kind.setCurrentIndex(dialog.kind.count() - 1)
        dialog.editor.setPlainText(MARKED)
        qtbot.waitUntil(lambda: dialog.preview_ready and dialog.save_button.isEnabled())
        qtbot.mouseClick(dialog.save_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: "your own" in win.status_model.text(), timeout=10_000)
        send(qtbot, win, "Hello")
        assert evaluated(win).startswith("[[user]]Hello[[/]]\n[[assistant]]")
        key = model_key(model_path, model_path.stat().st_size)
        saved = json.loads((tmp_path / "data" / FILE_NAME).read_text())["models"][key]
        assert saved == {
            "template": {"kind": "custom", "name": "", "source": MARKED},
            "completion": False,
        }
    finally:
        close(win)
    # The next start applies it as soon as the model is loaded.
    win = open_window(qtbot, tmp_path / "data", model_path)
    try:
        qtbot.waitUntil(lambda: "your own" in win.status_model.text(), timeout=10_000)
        send(qtbot, win, "Again")
        assert evaluated(win).startswith("[[user]]Again[[/]]")
    finally:
        close(win)


def test_broken_saved_override_falls_back_with_a_notice(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    root = tmp_path / "data"
    store = ModelPrefsStore(root / FILE_NAME)
    key = model_key(model_path, model_path.stat().st_size)
    store.set(key, ModelPrefs(template="custom", template_source=LOOPS, completion=False))
    win = open_window(qtbot, root, model_path)
    try:
        text = "Your chat template for this model was not used: it ran longer than 2 s"
        qtbot.waitUntil(lambda: text in win.transcript.toPlainText(), timeout=15_000)
        assert "template gemma" in win.status_model.text()
        send(qtbot, win, "Hi")
        assert evaluated(win).startswith("<start_of_turn>user\nHi")
    finally:
        close(win)


# -- servers that render the chat themselves ----------------------------------------------


def test_openai_servers_disable_the_choice_with_a_reason(qtbot: QtBot, tmp_path: Path) -> None:
    assert not OPENAI_CAPABILITIES.template_override
    assert "renders the chat with its own template" in WHY_NOT["template_override"]
    fake = FakeEngine()
    win = fake_window(qtbot, tmp_path, fake, shown=False, loaded=False)
    try:
        model = tmp_path / "model.gguf"
        model.write_bytes(b"fake model")
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            win.load_model(model)
        controls = win.prompt_controls
        assert controls.template_action.isEnabled()
        info: ModelInfo = replace(
            win.session.model,  # type: ignore[arg-type]
            server="http://127.0.0.1:1",
            capabilities=OPENAI_CAPABILITIES,
            base_model=True,
        )
        controls._on_model_ready(info)
        assert not controls.template_action.isEnabled()
        assert WHY_NOT["template_override"] in controls.template_action.toolTip()
        assert controls.notice.isHidden() and not controls.completion
        controls.show_template_dialog()
        assert controls.dialog is None
    finally:
        close(win)


# -- model_prefs.json -----------------------------------------------------------------------


def test_prefs_round_trip_and_limits(tmp_path: Path) -> None:
    assert TEMPLATE_CHARS == MAX_SOURCE_CHARS
    path = tmp_path / FILE_NAME
    store = ModelPrefsStore(path)
    store.set("a.gguf:1", ModelPrefs(system_prompt="Be brief. \ud800", completion=True))
    store.update("b.gguf:2", template="builtin", template_name="chatml")
    store.update("c.gguf:3", template="custom", template_source=GEMMA_IT)
    store.update("d.gguf:4", system_prompt="x")
    store.set("d.gguf:4", ModelPrefs())  # back to the defaults: no entry
    with pytest.raises(ValueError):
        store.set("e.gguf:5", ModelPrefs(system_prompt="x" * (SYSTEM_PROMPT_CHARS + 1)))
    with pytest.raises(ValueError):
        store.set("e.gguf:5", ModelPrefs(template="custom", template_source=""))
    again = ModelPrefsStore(path)
    assert again.notes == [] and sorted(model_keys(again)) == ["a.gguf:1", "b.gguf:2", "c.gguf:3"]
    assert again.get("a.gguf:1").system_prompt == "Be brief. \ufffd"
    assert again.get("c.gguf:3").template_source == GEMMA_IT
    assert again.get("zzz") == ModelPrefs()
    assert model_key("/models/x/Qwen.gguf", 42) == "Qwen.gguf:42"
    assert model_key("C:\\m\\Qwen.gguf", 42, "http://h:1") == "http://h:1 Qwen.gguf:42"


def test_prefs_bad_values_are_repaired_and_the_original_kept(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "models": {
                    "ok.gguf:1": {"system_prompt": "fine", "completion": "yes"},
                    "bad.gguf:2": {"template": {"kind": "custom", "source": 7}},
                    "": {"completion": True},
                    "list.gguf:3": [1, 2],
                },
            }
        )
    )
    store = ModelPrefsStore(path)
    assert store.get("ok.gguf:1") == ModelPrefs(system_prompt="fine")
    assert model_keys(store) == ["ok.gguf:1"]
    assert any("text-completion setting was not usable" in n for n in store.notes)
    assert store.notes[-1].endswith("the original is kept as model_prefs.json.bad.")
    assert (tmp_path / f"{FILE_NAME}.bad").exists()
    assert ModelPrefsStore(path).notes == []
    path.write_text("[1, 2")
    store = ModelPrefsStore(path)
    assert model_keys(store) == [] and "is not valid JSON" in store.notes[0]
    assert not path.exists() and (tmp_path / f"{FILE_NAME}.2.bad").exists()


def _real_prefs_file() -> bytes:
    """A model_prefs.json as the app writes it, with every kind of entry."""
    with tempfile.TemporaryDirectory() as d:
        store = ModelPrefsStore(Path(d) / FILE_NAME)
        store.set("gemma-3-270m-q4_k_m.gguf:253104000", ModelPrefs(completion=True))
        store.set("Qwen2.5-1.5B-Instruct-Q4_K_M.gguf:1117320736", ModelPrefs("Be brief."))
        store.update("Llama-3.2-3B.gguf:2019377696", template="builtin", template_name="llama3")
        store.update(
            "http://127.0.0.1:8080 gemma-3-1b-it.gguf:806058272",
            template="custom",
            template_source=GEMMA_IT,
            completion=False,
        )
        return (Path(d) / FILE_NAME).read_bytes()


REAL_PREFS = _real_prefs_file()
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


def _replace_somewhere(data: Any, path: list[int], value: Any) -> Any:
    """``data`` with the node reached by following ``path`` (indices into each level's
    items) replaced by ``value``."""
    if not path or not isinstance(data, dict | list) or not data:
        return value
    items = list(data.items()) if isinstance(data, dict) else list(enumerate(data))
    k, v = items[path[0] % len(items)]
    new = _replace_somewhere(v, path[1:], value)
    if isinstance(data, dict):
        return {**data, k: new}
    return [new if i == k else x for i, x in enumerate(data)]


@st.composite
def mutated_prefs(draw: st.DrawFn) -> bytes:
    """The real file, damaged: bytes flipped, cut or inserted, or a JSON node replaced."""
    how = draw(st.sampled_from(["bytes", "cut", "node", "node", "node"]))
    raw = bytearray(REAL_PREFS)
    if how == "bytes":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] = draw(st.integers(0, 255))
        return bytes(raw)
    if how == "cut":
        return bytes(raw[: draw(st.integers(0, len(raw)))])
    data = json.loads(REAL_PREFS)
    path = draw(st.lists(st.integers(0, 10), max_size=4))
    return json.dumps(_replace_somewhere(data, path, draw(JSON_VALUES))).encode()


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(raw=mutated_prefs())
def test_fuzz_prefs_file(raw: bytes) -> None:
    """Any damage: the store loads, keeps only valid preferences, says what it did, and
    leaves a file that loads cleanly with the same preferences."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / FILE_NAME
        path.write_bytes(raw)
        store = ModelPrefsStore(path)
        for key in model_keys(store):
            prefs = store.get(key)
            problems: list[str] = []
            assert prefs_from_dict(prefs.to_dict(), problems) == prefs and not problems
            assert not prefs.is_default and 0 < len(key) <= 1000
        if store.notes:
            assert any(p.name.endswith(".bad") for p in Path(d).iterdir())
        again = ModelPrefsStore(path)
        assert again.notes == []
        kept = {k: store.get(k) for k in model_keys(store)}
        assert {k: again.get(k) for k in model_keys(again)} == kept


# -- servers -------------------------------------------------------------------------------


def test_llama_server_backend_renders_the_override(llama_server: RunningServer) -> None:
    """llama-server is given the prompt this app renders: the override applies there too."""
    backend = LlamaServerBackend(Connection("tpl", "test server", "llama-server", llama_server.url))
    backend.load("", LoadConfig())
    try:
        assert backend.capabilities.template_override
        info = backend.set_template(TemplateOverride("custom", source=MARKED))
        assert info.template == "your own (set for this model)"
        list(backend.generate([ChatMessage("user", "Hi")], GREEDY))
        assert backend._slot.map.text.startswith("[[user]]Hi[[/]]\n[[assistant]]")
        backend.set_template(PLAIN)
        story = "Once upon a time, in a small village"
        done = list(backend.generate([ChatMessage("user", story)], GREEDY))[-1]
        assert isinstance(done, Finished) and backend._slot.map.text == story + done.text
        assert (
            backend.prewarm([ChatMessage("user", story)], ChatMessage("assistant", done.text)) == 0
        )
    finally:
        backend.unload()
    openai = OpenAIBackend(Connection("tpl-oai", "test openai", "openai", llama_server.url))
    openai.load("", LoadConfig())
    try:
        assert openai.set_template(AUTO) is openai.model
        with pytest.raises(LamplightError, match="renders the chat with its own template"):
            openai.set_template(PLAIN)
    finally:
        openai.unload()
