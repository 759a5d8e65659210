"""Limits that loading and saving apply alike, and settings that are never changed silently.

model_prefs.json: with over 1,000 entries, a preference set afterwards was gone at the
next start (the load kept the first 1,000, the save wrote them all). settings.json:
every value the app does not use as written gets the note the README promises
("out-of-range values are repaired, the original kept as .bad").
"""

from __future__ import annotations

import copy
import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from app.config import model_prefs
from app.config.api_settings import API_SPEC_BY_NAME
from app.config.model_prefs import FILE_NAME, MAX_MODELS, ModelPrefs, ModelPrefsStore
from app.config.setting_records import ApiSettings, LoadConfig, SamplingParams
from app.config.setting_specs import SPEC_BY_NAME
from app.config.settings import AppSettings
from tests.hypothesis_budget import examples

FUZZ = settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- model_prefs.json ---------------------------------------------------------------------------


def model_keys(store: ModelPrefsStore) -> list[str]:
    """The models the store holds, least recently used first."""
    return list(store._prefs)


def write_models(path: Path, n: int) -> list[str]:
    keys = [f"m{i}.gguf:{i}" for i in range(n)]
    doc = {"version": 1, "models": {k: {"system_prompt": k} for k in keys}}
    path.write_text(json.dumps(doc))
    return keys


def test_a_preference_set_past_the_limit_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    keys = write_models(path, MAX_MODELS)
    store = ModelPrefsStore(path)
    assert store.notes == []
    store.set("new.gguf:1", ModelPrefs(system_prompt="keep me"))
    again = ModelPrefsStore(path)
    assert again.notes == []  # what was written loads whole
    assert again.get("new.gguf:1").system_prompt == "keep me"
    assert len(model_keys(again)) == MAX_MODELS
    assert keys[0] not in model_keys(again)  # the least recently used made room


def test_a_model_in_use_is_kept_over_one_unused(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    keys = write_models(path, MAX_MODELS)
    store = ModelPrefsStore(path)
    assert store.get(keys[0]).system_prompt == keys[0]  # used: now the most recent
    store.set("new.gguf:1", ModelPrefs(completion=True))
    kept = model_keys(ModelPrefsStore(path))
    assert keys[0] in kept and keys[1] not in kept


def test_a_longer_file_keeps_the_newest_entries_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    keys = write_models(path, MAX_MODELS + 250)
    original = path.read_bytes()
    store = ModelPrefsStore(path)
    assert model_keys(store) == keys[250:]
    assert "250 models' preferences were left out" in store.notes[0]
    assert store.notes[-1].endswith("the original is kept as model_prefs.json.bad.")
    assert (tmp_path / f"{FILE_NAME}.bad").read_bytes() == original
    assert ModelPrefsStore(path).notes == []


def test_the_file_never_grows_past_what_a_load_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_prefs, "MAX_BYTES", 200_000)
    path = tmp_path / FILE_NAME
    store = ModelPrefsStore(path)
    for i in range(40):  # each about 20 KB: ten fit
        store.set(f"m{i}.gguf:{i}", ModelPrefs(system_prompt=f"{i} " + "é" * 10_000))
        assert path.stat().st_size <= 200_000
    again = ModelPrefsStore(path)
    assert again.notes == [] and "m39.gguf:39" in model_keys(again)
    assert 5 <= len(model_keys(again)) < 40


class PrefsMachine(RuleBasedStateMachine):
    """Any mix of set, get and restart, with a small limit: the store keeps exactly the
    most recently used entries, and a restart changes nothing."""

    LIMIT = 4

    def __init__(self) -> None:
        super().__init__()
        self.model: OrderedDict[str, str] = OrderedDict()
        self.patch = pytest.MonkeyPatch()

    @initialize(where=st.integers(0, 10**9))
    def start(self, where: int) -> None:
        import tempfile

        self.patch.setattr(model_prefs, "MAX_MODELS", self.LIMIT)
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / FILE_NAME
        self.store = ModelPrefsStore(self.path)

    @rule(key=st.integers(0, 7), prompt=st.text(max_size=3))
    def set(self, key: int, prompt: str) -> None:
        name = f"k{key}"
        self.store.set(name, ModelPrefs(system_prompt=prompt))
        self.model.pop(name, None)
        self.model[name] = prompt
        while len(self.model) > self.LIMIT:
            self.model.popitem(last=False)

    @rule(key=st.integers(0, 7))
    def get(self, key: int) -> None:
        name = f"k{key}"
        want = self.model.get(name)
        assert self.store.get(name).system_prompt == want
        if want is not None:
            self.model.move_to_end(name)

    @rule(key=st.integers(0, 7))
    def reset(self, key: int) -> None:
        self.store.set(f"k{key}", ModelPrefs())
        self.model.pop(f"k{key}", None)

    @rule()
    def restart(self) -> None:
        # Only what was written survives: uses since the last write are forgotten.
        self.store = ModelPrefsStore(self.path)
        assert self.store.notes == []
        kept = model_keys(self.store)
        assert sorted(kept) == sorted(self.model)
        assert all(self.store._prefs[k].system_prompt == self.model[k] for k in kept)
        self.model = OrderedDict((k, self.model[k]) for k in kept)

    @invariant()
    def keeps_the_most_recent(self) -> None:
        if hasattr(self, "store"):
            assert model_keys(self.store) == list(self.model)

    def teardown(self) -> None:
        if hasattr(self, "dir"):
            self.dir.cleanup()
        self.patch.undo()


TestPrefsMachine = PrefsMachine.TestCase
TestPrefsMachine.settings = settings(
    max_examples=examples(60), stateful_step_count=30, deadline=None
)


# -- settings.json ------------------------------------------------------------------------------

REAL = json.loads(
    AppSettings(
        model_path="/models/m.gguf",
        system_prompt="Be kind.",
        last_conversation="abc123",
        imported_models=["/a.gguf"],
        recent_models=["/a.gguf"],
        window_layout={"main": "AAAA"},
        theme="dark",
        load=LoadConfig(n_ctx=8192, n_threads=4),
        sampling=SamplingParams(temperature=0.2, stop=("END",)),
        api=ApiSettings(host="localhost", cors_origins=("http://localhost:3000",)),
    ).to_json()
)
REPAIRED = "settings.json was repaired; the original is kept as settings.json.bad."
LABELS = {s.name: s.label for s in (*SPEC_BY_NAME.values(), *API_SPEC_BY_NAME.values())}


def load(tmp_path: Path, doc: Any) -> tuple[AppSettings, list[str], str]:
    path = tmp_path / "settings.json"
    for old in tmp_path.glob("settings.json*"):
        old.unlink()
    text = json.dumps(doc)
    path.write_text(text)
    loaded, notes = AppSettings.load_with_notes(path)
    return loaded, notes, text


@pytest.mark.parametrize(
    "value", [10**9, 2**32 + 512, 1e9, 2.0**32 + 512, "4096", -1, 0, 255, 262145, None, True]
)
def test_an_impossible_context_size_is_said(tmp_path: Path, value: Any) -> None:
    doc = copy.deepcopy(REAL)
    doc["load"]["n_ctx"] = value
    loaded, notes, text = load(tmp_path, doc)
    assert loaded.load.n_ctx == 4096
    assert notes[0].startswith("settings.json: Context size must be"), notes
    assert notes[0].endswith("using the default (4096).") and notes[-1] == REPAIRED
    assert (tmp_path / "settings.json.bad").read_text() == text


@pytest.mark.parametrize("where", ["top", "sampling", "api"])
def test_a_setting_in_the_wrong_place_is_said(tmp_path: Path, where: str) -> None:
    """``{"n_ctx": 1000000000}`` at the top level was dropped without a word."""
    doc = copy.deepcopy(REAL)
    (doc if where == "top" else doc[where])["n_ctx"] = 10**9
    loaded, notes, _text = load(tmp_path, doc)
    assert loaded.load.n_ctx == 8192
    assert "n_ctx" in notes[0] and "belongs in the load settings" in notes[0], notes
    assert notes[-1] == REPAIRED


def value_at(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def leaves(doc: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in doc.items():
        out.append((*prefix, key))
        if isinstance(value, dict) and prefix == ():
            out += leaves(value, (key,))
    return out


# Values of every JSON type, with the edges that used to slip through (no lone surrogates:
# those are replaced by U+FFFD by design, see docs/notes/datafiles.md).
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([10**9, 2**32 + 512, 2**63, 2**64, -(2**63), 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=5,
)
STRUCTURED = {"output_format", "json_schema", "grammar"}  # checked together, one note


def same(before: Any, after: Any) -> bool:
    if isinstance(before, float) and math.isnan(before):
        return False
    return bool(type(before) is type(after) and before == after) or (
        isinstance(before, int | float)
        and isinstance(after, int | float)
        and not isinstance(before, bool)
        and not isinstance(after, bool)
        and before == after
    )


@FUZZ
@given(data=st.data())
def test_fuzz_no_setting_is_changed_without_a_note(tmp_path: Path, data: st.DataObject) -> None:
    doc = copy.deepcopy(REAL)
    path = data.draw(st.sampled_from(leaves(REAL)))
    value = data.draw(VALUES)
    parent = value_at(doc, path[:-1])
    parent[path[-1]] = value
    if data.draw(st.booleans()):  # and a known setting somewhere it does not belong
        group = data.draw(st.sampled_from(["", "load", "sampling", "api"]))
        key = data.draw(st.sampled_from(sorted(LABELS)))
        target = doc if not group else doc.get(group)
        if isinstance(target, dict):
            target.setdefault(key, copy.deepcopy(value))
    loaded, notes, text = load(tmp_path, doc)
    got = json.loads(loaded.to_json())
    try:
        after = value_at(got, path)
    except (KeyError, TypeError):
        after = "(gone)"
    untouched = (
        same(value, after)
        or (isinstance(value, list | dict) and value == after and path[-1] not in LABELS)
        # A group given as an object: what it lacks is the default, what it has is a leaf.
        or (path in (("load",), ("sampling",), ("api",)) and isinstance(value, dict))
    )
    if not untouched:
        names = {path[-1], LABELS.get(path[-1], path[-1]), *path}
        if path[-1] in STRUCTURED:
            names.add("output format")
        assert any(n in note for note in notes for n in names), (path, value, after, notes)
    # A file from a newer Lamplight is said but never repaired: a newer one may read it.
    newer = (
        path == ("version",)
        and type(value) is int
        and value > json.loads(AppSettings().to_json())["version"]
    )
    if notes and not newer:
        assert notes[-1] == REPAIRED, notes
        assert (tmp_path / "settings.json.bad").read_text() == text
        assert AppSettings.load_with_notes(tmp_path / "settings.json") == (loaded, [])
    else:
        assert not (tmp_path / "settings.json.bad").exists()
