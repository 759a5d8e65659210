"""The draft model in the window: the chooser, its refusals, the per-reply figures, the
conversation that brings its draft back, and a server that takes none.

Fast tests drive the fake engine over real GGUF files (the default model, its test
draft, and a draft with another vocabulary), so the library check is the real one;
``test_real_model_draft_round_trip`` runs the real engine with the real draft.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import QCheckBox
from pytestqt.qtbot import QtBot

from app.chat.session_cache import RestoreResult
from app.chat.snapshot import read_header
from app.config.paths import DataDirs, data_dirs
from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from tests.fakes.engine import FAKE_CAPABILITIES, FakeEngine
from tests.fakes.window import WindowFactory, send
from tests.real_window import open_window
from ui.settings import draft_control
from ui.settings.draft_control import DraftControl
from ui.window.main_window import MainWindow

WAIT_MS = 20_000  # the first library check reads both headers (a second or two here)


@pytest.fixture(scope="module")
def other_vocab(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-block draft whose end-of-sequence token differs from the model's."""
    from tests.draft_model import read_gguf, vocab_variant

    eos = int(read_gguf(model_path).fields["tokenizer.ggml.eos_token_id"].contents())
    out = tmp_path_factory.mktemp("vocab") / "other-vocab.gguf"
    return vocab_variant(model_path, out, meta={"tokenizer.ggml.eos_token_id": eos + 1})


def control_of(win: MainWindow) -> DraftControl:
    """The window's draft chooser."""
    return win.draft_control


def library(dirs: DataDirs, *files: Path) -> None:
    """Put ``files`` in the models dir (as links: the drafts are 200 MB)."""
    dirs.models.mkdir(parents=True, exist_ok=True)
    for f in files:
        (dirs.models / f.name).symlink_to(f)


def draft_window(
    make_window: WindowFactory, dirs: DataDirs, fake: FakeEngine, model: Path
) -> tuple[MainWindow, DraftControl]:
    win = make_window(fake, dirs=dirs, model=model)
    return win, control_of(win)


@pytest.fixture()
def fake() -> FakeEngine:
    return FakeEngine(reply="one two three four five six seven eight nine ten")


@pytest.fixture()
def window(
    tmp_path: Path,
    make_window: WindowFactory,
    fake: FakeEngine,
    model_path: Path,
    draft_path: Path,
    other_vocab: Path,
) -> tuple[MainWindow, DraftControl]:
    dirs = data_dirs(tmp_path / "data")
    library(dirs, draft_path, other_vocab)
    return draft_window(make_window, dirs, fake, model_path)


def combo_rows(ctl: DraftControl) -> list[tuple[str, str, bool, str]]:
    """(text, path, enabled, tooltip) per combo row."""
    model = ctl.combo.model()
    assert isinstance(model, QStandardItemModel)
    return [
        (
            ctl.combo.itemText(i),
            str(ctl.combo.itemData(i) or ""),
            model.item(i).isEnabled(),
            str(ctl.combo.itemData(i, Qt.ItemDataRole.ToolTipRole) or ""),
        )
        for i in range(ctl.combo.count())
    ]


def listed(ctl: DraftControl, *names: str) -> bool:
    """Whether the combo lists files named ``names`` (the library check has answered)."""
    shown = {Path(str(ctl.combo.itemData(i) or "")).name for i in range(ctl.combo.count())}
    return set(names) <= shown


def named(ctl: DraftControl, name: str) -> str:
    """The path of the combo row for the file named ``name``."""
    paths = [str(ctl.combo.itemData(i) or "") for i in range(ctl.combo.count())]
    return next(p for p in paths if p and Path(p).name == name)


def pick(ctl: DraftControl, path: Path | str) -> None:
    """Choose ``path`` in the combo as a user does ("" for None)."""
    index = ctl.combo.findData(str(path))
    assert index >= 0, (path, combo_rows(ctl))
    ctl.combo.setCurrentIndex(index)
    ctl.combo.activated.emit(index)


def load_listed(qtbot: QtBot, ctl: DraftControl, draft: Path, *others: Path) -> None:
    """Wait until the combo lists ``draft`` and ``others``, then choose ``draft`` and wait
    until it is loaded."""
    qtbot.waitUntil(lambda: listed(ctl, draft.name, *(o.name for o in others)), timeout=WAIT_MS)
    pick(ctl, named(ctl, draft.name))
    qtbot.waitUntil(lambda: ctl.loaded is not None, timeout=5000)


def field(win: MainWindow, name: str) -> QCheckBox:
    box = win.sampling_panel.findChild(QCheckBox, f"field_{name}")
    assert box is not None, name
    return box


def test_only_compatible_drafts_can_be_chosen_and_the_others_say_why(
    qtbot: QtBot,
    window: tuple[MainWindow, DraftControl],
    fake: FakeEngine,
    draft_path: Path,
    other_vocab: Path,
) -> None:
    win, ctl = window
    qtbot.waitUntil(lambda: listed(ctl, draft_path.name, other_vocab.name), timeout=WAIT_MS)
    rows = {Path(path).name: (enabled, tip) for _text, path, enabled, tip in combo_rows(ctl)}
    assert ctl.combo.itemText(0) == "None"
    assert rows[draft_path.name][0] is True
    enabled, why = rows[other_vocab.name]
    assert enabled is False and "end" in why.lower() and why.endswith(".")
    # The compatible one comes first, and the row sits in the speculative section.
    assert Path(str(ctl.combo.itemData(1))).name == draft_path.name
    assert win.sampling_panel.slot("draft_model").isAncestorOf(ctl.combo)
    assert "No draft model loaded" in ctl.status.text()

    pick(ctl, named(ctl, draft_path.name))
    qtbot.waitUntil(lambda: ctl.loaded is not None, timeout=5000)
    assert fake.draft_info is not None and fake.draft_info.path.name == draft_path.name
    assert "loaded" in ctl.status.text() and "Use draft model" in ctl.status.text()
    assert win.session.draft_path == str(ctl.loaded.path)

    pick(ctl, "")  # None unloads it
    qtbot.waitUntil(lambda: ctl.loaded is None and fake.draft_info is None, timeout=5000)
    assert fake.draft_loads[-1] is None


def test_a_refused_draft_says_why_and_keeps_the_loaded_one(
    qtbot: QtBot,
    window: tuple[MainWindow, DraftControl],
    fake: FakeEngine,
    tmp_path: Path,
    draft_path: Path,
    other_vocab: Path,
) -> None:
    win, ctl = window
    load_listed(qtbot, ctl, draft_path, other_vocab)
    kept = ctl.loaded
    bad = tmp_path / "incompatible-draft.gguf"
    bad.write_bytes(b"GGUF")
    ctl.choose(bad)  # as "…" does with a file chosen outside the library
    qtbot.waitUntil(lambda: "cannot draft" in ctl.status.text(), timeout=5000)
    assert "vocabulary has 32,000 tokens" in ctl.status.text()
    assert ctl.status.styleSheet() == draft_control.ERROR_STYLE
    assert "cannot draft" in win.statusBar().currentMessage()
    assert ctl.loaded == kept and fake.draft_info == kept
    assert ctl.combo.currentData() == str(kept.path)  # the combo shows what is loaded


def test_reply_shows_acceptance_and_speedup_and_the_chat_brings_its_draft_back(
    qtbot: QtBot,
    window: tuple[MainWindow, DraftControl],
    fake: FakeEngine,
    draft_path: Path,
    other_vocab: Path,
) -> None:
    win, ctl = window
    load_listed(qtbot, ctl, draft_path, other_vocab)
    assert ctl.loaded is not None
    chosen = str(ctl.loaded.path)
    win.perf_panel.show()  # the charts start closed
    field(win, "draft_model").click()  # "Use draft model"
    assert win.settings.sampling.draft_model
    assert "Switch on" not in ctl.status.text()
    with qtbot.waitSignal(win.replyEnded, timeout=5000):
        send(qtbot, win, "Count")
    m = win.reply_metrics[-1]
    assert m.draft_kind == "model" and m.drafted_tokens == 9 and m.accepted_tokens == 5
    text = win.transcript.toPlainText()
    assert "draft model: 5/9 guesses kept (56%), 2.00 tokens per pass" in text
    assert "2.00 tokens/pass" in win.status_speed.text()
    speedup, kept = win.perf_panel.draft_points()
    assert list(speedup) == [2.0] and list(kept) == [pytest.approx(5 / 9)]
    assert "draft model: 5/9" in win.perf_panel.summary.text()
    first = win.conversation.id
    assert win.conversation.draft_path == chosen
    assert win.store.load(first).draft_path == chosen  # saved with the conversation

    win.new_chat()
    pick(ctl, "")
    qtbot.waitUntil(lambda: fake.draft_info is None, timeout=5000)
    with qtbot.waitSignal(win.conversationOpened, timeout=5000) as opened:
        win.open_conversation(first)
    qtbot.waitUntil(lambda: fake.draft_info is not None, timeout=5000)
    assert fake.draft_info is not None and str(fake.draft_info.path) == chosen
    qtbot.waitUntil(lambda: ctl.combo.currentData() == chosen, timeout=5000)
    result = opened.args[0]
    assert isinstance(result, RestoreResult) and result.restored, result.note


def test_a_missing_draft_of_an_opened_chat_is_a_notice(
    qtbot: QtBot, window: tuple[MainWindow, DraftControl], fake: FakeEngine, tmp_path: Path
) -> None:
    win, _ctl = window
    with qtbot.waitSignal(win.replyEnded, timeout=5000):
        send(qtbot, win, "Hi")
    conv = win.conversation
    conv.draft_path = str(tmp_path / "gone-draft.gguf")
    win.store.save(conv)
    win.new_chat()
    win.open_conversation(conv.id)
    assert "no longer at" in win.transcript.toPlainText()
    assert fake.draft_info is None


def test_an_engine_without_drafts_greys_the_controls_out_with_its_reason(
    qtbot: QtBot, tmp_path: Path, make_window: WindowFactory, model_path: Path
) -> None:
    why = "a draft model runs with the in-process engine only"
    fake = FakeEngine()
    fake.caps = replace(
        FAKE_CAPABILITIES,
        draft_model=False,
        why_not={**FAKE_CAPABILITIES.why_not, "draft_model": why},
    )
    dirs = data_dirs(tmp_path / "data")
    win, ctl = draft_window(make_window, dirs, fake, model_path)
    try:
        assert not ctl.combo.isEnabled() and not ctl.browse.isEnabled()
        assert why in ctl.combo.toolTip() and why in ctl.status.text()
        for name in ("draft_model", "adaptive_draft"):
            box = field(win, name)
            assert not box.isEnabled() and why in box.toolTip(), name
        ctl.choose(model_path)
        assert "cannot be used" in ctl.status.text() and fake.draft_loads == []
        # The worker refuses too, with the reason, if asked directly.
        win.client.set_draft(model_path)
        qtbot.waitUntil(lambda: "cannot be used" in win.statusBar().currentMessage(), timeout=5000)
        assert why in win.statusBar().currentMessage()
    finally:
        win.close()


def test_the_draft_waits_for_a_model_and_follows_a_reload(
    qtbot: QtBot, make_window: WindowFactory, model_path: Path, draft_path: Path
) -> None:
    fake = FakeEngine()
    win = make_window(fake, shown=False, loaded=False)
    client = win.client
    ctl = control_of(win)
    try:
        ctl.choose(draft_path)  # no model yet: remembered
        client.drain()
        assert fake.draft_loads == []
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            win.load_model(model_path)
        qtbot.waitUntil(lambda: ctl.loaded is not None, timeout=5000)
        assert fake.draft_info is not None and fake.draft_info.path == draft_path
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            win.load_model(model_path)  # a reload drops the draft; the worker loads it again
        qtbot.waitUntil(lambda: fake.draft_info is not None, timeout=5000)
        assert fake.draft_loads == [draft_path, draft_path]
    finally:
        win.close()


def test_help_text_in_the_panel_makes_the_honest_claim(
    window: tuple[MainWindow, DraftControl],
) -> None:
    win, ctl = window
    tips = [field(win, "speculative").toolTip(), ctl.combo.toolTip()]
    for tip in tips:
        assert "never changes" not in tip
        assert "distribution exactly" in tip and "floating-point" in tip and "near-tie" in tip


def test_real_model_draft_round_trip(
    qtbot: QtBot, tmp_path: Path, model_path: Path, draft_path: Path
) -> None:
    """The real engine with the real draft: choose it, send (acceptance shown), stop
    mid-reply, regenerate, then reopen the saved chat: the draft and the cache return."""
    from tests.conftest import ONE_THREAD

    dirs = data_dirs(tmp_path / "data")
    library(dirs, draft_path)
    sampling = replace(SamplingParams.greedy(24), draft_model=True)
    settings = AppSettings(load=ONE_THREAD, sampling=sampling)
    win = open_window(qtbot, dirs.root, model_path, settings, turns_saved=True)
    ctl = control_of(win)
    try:
        qtbot.waitUntil(
            lambda: ctl.combo.findData(str(dirs.models / draft_path.name)) > 0, timeout=60_000
        )
        pick(ctl, dirs.models / draft_path.name)
        qtbot.waitUntil(lambda: ctl.loaded is not None, timeout=60_000)
        assert "loaded" in ctl.status.text()

        with qtbot.waitSignal(win.replyEnded, timeout=60_000) as ended:
            send(qtbot, win, "List the days of the week.")
        assert ended.args == ["finished"]
        m = win.reply_metrics[-1]
        assert m.draft_kind == "model" and m.generated_tokens > 0
        assert 0 <= m.accepted_tokens <= m.drafted_tokens
        assert "draft model:" in win.transcript.toPlainText()

        win.settings.sampling = replace(sampling, max_tokens=400)
        send(qtbot, win, "Now count from one to two hundred.")
        qtbot.waitUntil(lambda: win.session.reply_started, timeout=60_000)
        with qtbot.waitSignal(win.replyEnded, timeout=10_000) as ended:
            win.stop()
        assert ended.args == ["cancelled"]

        win.settings.sampling = sampling
        with qtbot.waitSignal(win.replyEnded, timeout=60_000) as ended:
            win.regenerate()
        assert ended.args == ["finished"]
        assert win.reply_metrics[-1].draft_kind == "model"
        first = win.conversation.id
        assert ctl.loaded is not None
        chosen = str(ctl.loaded.path)
        assert win.store.load(first).draft_path == chosen
        header, _, _ = read_header(win.store.snapshot_path(first))
        assert header.draft["path"] == chosen  # recorded, and (below) no reason to refuse

        win.new_chat()
        pick(ctl, "")
        qtbot.waitUntil(lambda: ctl.loaded is None, timeout=30_000)
        with qtbot.waitSignal(win.conversationOpened, timeout=60_000) as opened:
            win.open_conversation(first)
        assert opened.args[0].restored, opened.args[0].note
        qtbot.waitUntil(lambda: ctl.loaded is not None, timeout=60_000)
        with qtbot.waitSignal(win.replyEnded, timeout=60_000) as ended:
            send(qtbot, win, "And the months?")
        assert ended.args == ["finished"]
        m = win.reply_metrics[-1]
        assert m.draft_kind == "model" and m.evaluated_tokens < 40  # the cache was resumed
    finally:
        win.close()
    assert not win.client.engine_thread.isRunning()


def test_the_next_token_layers_switch_is_on_only_for_a_model_that_has_them(
    qtbot: QtBot, make_window: WindowFactory, model_path: Path
) -> None:
    fake = FakeEngine()
    win = make_window(fake, model=model_path)
    try:
        box = field(win, "mtp")  # the fake's model has none: greyed out, saying why
        assert not box.isEnabled() and "no next-token (MTP) layers" in box.toolTip()
        assert box.isChecked()  # on by default, for the models that have them
        fake.caps = replace(FAKE_CAPABILITIES, mtp=True)
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            win.load_model(model_path)
        assert field(win, "mtp").isEnabled()
    finally:
        win.close()
