"""Vision projectors whose headers look right and still end llama.cpp's process.

Three layers keep such a file from killing Lamplight: the header checks
(``app/gguf/projector_shapes.py``: every value libmtmd asserts on, stated exactly),
a load in a child process before the app loads it (``app/engine/native/projector_guard.py``,
the verdict remembered by file fingerprint), and the crash notice, which sets aside
a projector that was loading when the app died. Bad projectors are built with
``tests/vision_model.py``; the slow tests load them through the real engine.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytestqt.qtbot import QtBot

from app.config.setting_records import LoadConfig
from app.engine.local.engine import Engine
from app.engine.local.vision import PROJECTOR_KEY, check_projector, open_projector
from app.engine.native.guard import STORE_ENV, NativeGuard
from app.engine.native.projector_guard import LEFT_OUT, ProjectorGuard
from app.engine.native.projector_probe import ProjectorProbe, run_projector_probe
from app.gguf import projector_checks
from app.gguf.info import read_gguf_info
from app.gguf.projector import read_projector
from app.gguf.projector_checks import ProjectorChecks
from app.models.projectors import ProjectorPairs, load_config_for, projector_for
from app.util import crash_record
from app.util.crash_recorder import MARKER_NAME
from app.util.errors import ProjectorError
from tests.conftest import TEST_LOAD
from tests.e2e.test_crash_recovery import crashed_data, fake_app, notice_of
from tests.fakes.engine import FakeEngine
from tests.hypothesis_budget import examples
from tests.vision_model import build_projector, projector_path

POSIX = pytest.mark.skipif(os.name != "posix", reason="the abort is named by its signal")
ENDS = re.escape("which would make llama.cpp end Lamplight")
POST_LN = {"v.post_ln.weight": (24,)}  # passes every header rule; llama.cpp aborts on it
# Header values that disagree with the test projector's weights, each of which ends
# llama.cpp's process (found by loading them in a child; see the canary test).
ABORTING = {
    "head count 3": {"clip.vision.attention.head_count": 3},
    "head count 0": {"clip.vision.attention.head_count": 0},
    "head count 64": {"clip.vision.attention.head_count": 64},
    "embedding width 48": {"clip.vision.embedding_length": 48},
    "embedding width 16": {"clip.vision.embedding_length": 16},
    "patch size 8": {"clip.vision.patch_size": 8},
    "patch size 3": {"clip.vision.patch_size": 3},
    "image size 60": {"clip.vision.image_size": 60},
    "pooling 3": {"clip.vision.projector.scale_factor": 3},
}


def _typed(kind: str, value: Any) -> tuple[Any, Any]:
    from gguf import GGUFValueType

    return (GGUFValueType[kind], value)


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    out = {
        n: build_projector(folder / f"mmproj-{i}.gguf", header=h)
        for i, (n, h) in enumerate(ABORTING.items())
    }
    out["post_ln"] = build_projector(folder / "mmproj-post-ln.gguf", shapes=POST_LN)
    return out


# -- the header rules ------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(ABORTING))
def test_header_values_llama_cpp_aborts_on_are_refused_in_words(
    bad: dict[str, Path], case: str
) -> None:
    with pytest.raises(ProjectorError, match=ENDS) as caught:
        read_projector(bad[case])
    assert bad[case].name in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "header",
    [
        {"clip.vision.attention.head_count": _typed("INT32", 2)},
        {"clip.vision.patch_size": _typed("FLOAT32", 4.0)},
        {"clip.vision.image_size": _typed("UINT64", 64)},
        {"clip.projector_type": _typed("UINT32", 1), "clip.vision.projector_type": "gemma3"},
        {"clip.use_gelu": _typed("UINT8", 1)},
        {"general.name": _typed("UINT32", 7)},
        {"clip.vision.attention.layer_norm_epsilon": math.nan},
        {"clip.vision.attention.layer_norm_epsilon": -1.0},
        {"clip.vision.block_count": 2},
        {"clip.vision.block_count": 2**31 - 1},
    ],
    ids=repr,
)
def test_keys_of_another_type_and_impossible_values_are_refused(
    tmp_path: Path, header: dict[str, Any]
) -> None:
    path = build_projector(tmp_path / "mmproj-typed.gguf", header=header)
    with pytest.raises(ProjectorError, match=r"^mmproj-typed\.gguf cannot be used: "):
        read_projector(path)


def test_headers_that_agree_with_their_weights_pass(tmp_path: Path) -> None:
    fits = read_projector(projector_path())
    assert fits.fingerprint and fits.fingerprint.endswith(f":{fits.path.stat().st_size}")
    four = build_projector(
        tmp_path / "mmproj-4.gguf", header={"clip.vision.attention.head_count": 4}
    )
    assert read_projector(four).projector_type == "gemma3"  # 32 = 4 x 8: a valid shape
    # The fingerprint is the header's (what libmtmd's asserts read), not the weights'.
    other_weights = build_projector(tmp_path / "m.gguf", seed=8)
    assert read_projector(other_weights).fingerprint == fits.fingerprint
    assert read_projector(four).fingerprint != fits.fingerprint


# -- the verdicts -----------------------------------------------------------------------------


def test_verdicts_follow_the_file_not_its_name_and_not_another_llama_cpp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = ProjectorChecks(tmp_path / "projector_checks.json")
    original = build_projector(tmp_path / "mmproj-a.gguf", shapes=POST_LN)
    info = read_projector(original)
    assert checks.get(info) is None and checks.refused(info) == ""
    checks.record(info, False, "llama.cpp ended a test process while loading it (SIGABRT)", "probe")
    moved = original.rename(tmp_path / "mmproj-renamed.gguf")
    refusal = checks.refused(read_projector(moved))
    assert refusal.startswith("mmproj-renamed.gguf cannot be used: llama.cpp ended a test process")
    assert checks.refused(read_projector(projector_path())) == ""
    monkeypatch.setattr(projector_checks, "llama_version", lambda: "9.9.9")
    assert checks.get(read_projector(moved)) is None  # a new llama.cpp is checked again


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    content=st.one_of(
        st.binary(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(st.text(max_size=8), inner, max_size=4)
            ),
            max_leaves=12,
        ).map(lambda v: json.dumps({"version": 1, "projectors": v}).encode()),
        st.dictionaries(
            st.text(max_size=30),
            st.fixed_dictionaries(
                {
                    "ok": st.one_of(st.booleans(), st.integers()),
                    "reason": st.text(max_size=600),
                    "source": st.sampled_from(["probe", "crash", "user", ""]),
                    "name": st.text(max_size=300),
                    "when": st.one_of(st.floats(), st.booleans(), st.text(max_size=3)),
                }
            ),
            max_size=3,
        ).map(lambda v: json.dumps({"version": 1, "projectors": v}).encode()),
    )
)
def test_a_damaged_or_hostile_verdict_file_never_refuses_a_projector_by_mistake(
    tmp_path: Path, content: bytes
) -> None:
    file = tmp_path / "projector_checks.json"
    file.write_bytes(content)
    checks = ProjectorChecks(file)
    info = read_projector(projector_path())
    assert checks.refused(info) == ""  # no key can be this file's fingerprint
    checks.record(info, True, "it loaded in a test process", "probe")
    assert checks.get(info) is not None and checks.refused(info) == ""
    for aside in tmp_path.glob("*.bad"):
        aside.unlink()


class FakeProbe:
    def __init__(self, result: ProjectorProbe) -> None:
        self.result = result
        self.calls: list[Path] = []

    def __call__(self, model: Path, projector: Path, threads: int, gpu: bool) -> ProjectorProbe:
        self.calls.append(projector)
        return self.result


@pytest.mark.parametrize(
    ("result", "left_out", "remembered"),
    [
        (
            ProjectorProbe(True, True, False, "llama.cpp ended a test process (SIGABRT)", 1),
            True,
            True,
        ),
        (ProjectorProbe(False, True, True, "it loaded in a test process", 1), False, True),
        (ProjectorProbe(False, True, False, "llama.cpp refused it (no vision)", 1), True, False),
        (ProjectorProbe(False, False, False, "the check took over 120 s", 120), False, False),
    ],
    ids=["crashed", "loaded", "refused cleanly", "inconclusive"],
)
def test_the_guard_checks_each_file_once_and_leaves_out_what_crashes(
    tmp_path: Path, result: ProjectorProbe, left_out: bool, remembered: bool
) -> None:
    probe = FakeProbe(result)
    guard = ProjectorGuard(ProjectorChecks(tmp_path / "projector_checks.json"), probe)
    config = replace(TEST_LOAD, mmproj=str(projector_path()))
    for _ in range(2):
        vetted, note = guard.vet(tmp_path / "model.gguf", config)
        assert (vetted.mmproj == "") == left_out and bool(note) == left_out
        if left_out:
            assert note.startswith(LEFT_OUT + "mmproj-test-v1-640.gguf cannot be used: ")
    assert len(probe.calls) == (1 if remembered else 2)
    assert guard.vet(tmp_path / "m.gguf", LoadConfig()) == (LoadConfig(), "")  # no projector


def test_pairing_passes_over_a_refused_projector_and_says_why(
    tmp_path: Path, model_path: Path
) -> None:
    model = tmp_path / "gemma-3-270m-Q4_K_M.gguf"
    model.symlink_to(model_path)
    projector = build_projector(tmp_path / "mmproj-gemma-3-270m-F16.gguf", shapes=POST_LN)
    pairs = ProjectorPairs(tmp_path / "projectors.json")
    assert projector_for(model, pairs) == (str(projector), "")  # not known to crash yet
    pairs.checks.record(read_projector(projector), False, "it ended llama.cpp (SIGABRT)", "probe")
    mmproj, note = projector_for(model, pairs)
    assert mmproj == "" and "mmproj-gemma-3-270m-F16.gguf cannot be used: it ended" in note
    pairs.set(model, str(projector))  # chosen by hand: still not loaded
    config, note = load_config_for(model, TEST_LOAD, pairs)
    assert config.mmproj == "" and "cannot be used: it ended llama.cpp" in note


# -- the crash record and the notice ------------------------------------------------------------


def test_the_crash_record_says_when_a_projector_is_loading(tmp_path: Path) -> None:
    rec, _report = crash_record.begin(tmp_path, "0.1.0", fault_handler=False)
    try:
        crash_record.set_step("decode", "/m.gguf", {"n_ctx": 512})
        crash_record.add_to_load(PROJECTOR_KEY, "/p/mmproj.gguf")  # not a load: left alone
        marker = json.loads((tmp_path / MARKER_NAME).read_text())
        assert PROJECTOR_KEY not in marker["load"]
        crash_record.set_step("load", "/m.gguf", {"n_ctx": 512})
        crash_record.add_to_load(PROJECTOR_KEY, "/p/mmproj.gguf")
        marker = json.loads((tmp_path / MARKER_NAME).read_text())
        assert marker["load"] == {"n_ctx": 512, PROJECTOR_KEY: "/p/mmproj.gguf"}
    finally:
        crash_record.end(rec)


def test_after_a_crash_while_a_projector_loaded_no_choice_loads_it_again(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "native_paths.json"))  # this test's verdicts
    (tmp_path / "models").mkdir()
    model = tmp_path / "models" / "model.gguf"
    model.write_bytes(b"fake model")
    projector = build_projector(tmp_path / "models" / "mmproj-model-F16.gguf", shapes=POST_LN)
    load = {"n_ctx": 2048, PROJECTOR_KEY: str(projector)}
    dirs, _conv = crashed_data(
        tmp_path, frame="/app/app/engine/vision.py", step="load", request={}, load=load
    )
    fake = FakeEngine()
    configs: list[LoadConfig] = []
    real_load = fake.load

    def load_and_note(path: str | Path, config: LoadConfig, progress: Any = None) -> Any:
        configs.append(config)
        return real_load(path, config, progress)

    fake.load = load_and_note  # type: ignore[method-assign]
    win, report, install = fake_app(qtbot, dirs, fake, model)
    try:
        assert report.in_native and report.load[PROJECTOR_KEY] == str(projector)
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            install()  # no waiting for a choice: the model loads at once, without it
        text = notice_of(win).label.text()
        assert (
            "It was loading the vision projector mmproj-model-F16.gguf, which is now set aside"
            in text
        )
        assert [c.mmproj for c in configs] == [""]
        verdict = ProjectorChecks(tmp_path / "projector_checks.json").get(read_projector(projector))
        assert verdict is not None and not verdict.ok and verdict.source == "crash"
        assert "Lamplight closed unexpectedly while loading it" in verdict.reason
    finally:
        win.close()


# -- the real engine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, Path]]:
    """An engine guarded as the app's is, with projector verdicts of its own."""
    checks = tmp_path_factory.mktemp("verdicts") / "projector_checks.json"
    guard = NativeGuard(
        Path(os.environ[STORE_ENV]), projectors=ProjectorGuard(ProjectorChecks(checks))
    )
    engine = Engine(guard=guard)
    engine.load(model_path, TEST_LOAD)
    yield engine, checks
    engine.unload()


@POSIX
def test_the_headers_refused_here_do_end_llama_cpp(model_path: Path, bad: dict[str, Path]) -> None:
    """A canary: llama.cpp still aborts on these (drop a rule when it no longer does)."""
    for case in ("head count 3", "embedding width 48", "patch size 8"):
        result = run_projector_probe(model_path, bad[case])
        assert result.crashed and "SIGABRT: GGML_ASSERT(" in result.detail, (case, result)


def test_a_bad_header_through_the_real_load_is_a_sentence_and_the_model_stays(
    guarded: tuple[Engine, Path], model_path: Path, bad: dict[str, Path]
) -> None:
    engine, _checks = guarded
    for case in ("head count 3", "embedding width 48", "patch size 8"):
        with pytest.raises(ProjectorError, match=ENDS):
            engine.load(model_path, replace(TEST_LOAD, mmproj=str(bad[case])))
        assert engine.model is not None and engine.model.path == model_path  # still loaded


@POSIX
def test_a_projector_that_ends_llama_cpp_is_left_out_and_not_paired_again(
    guarded: tuple[Engine, Path], tmp_path: Path, model_path: Path
) -> None:
    engine, checks = guarded
    model = tmp_path / "gemma-3-270m-Q4_K_M.gguf"
    model.symlink_to(model_path)
    build_projector(tmp_path / "mmproj-gemma-3-270m-F16.gguf", shapes=POST_LN)
    pairs = ProjectorPairs(tmp_path / "projectors.json", checks)
    config, note = load_config_for(model, TEST_LOAD, pairs)
    assert config.mmproj and not note  # paired: its header is fine
    info = engine.load(model, config)  # the app's load: the projector is tried in a child
    assert info.projector == "" and not info.capabilities.vision
    said = (
        "The model is loaded without its vision projector: mmproj-gemma-3-270m-F16.gguf cannot "
        "be used: llama.cpp ended a test process while loading it (SIGABRT: "
        "GGML_ASSERT(ggml_can_repeat(b, a)) failed). It is not loaded again"
    )
    assert any(note.startswith(said) for note in info.notes), info.notes
    config, note = load_config_for(model, TEST_LOAD, pairs)  # the next start
    assert config.mmproj == "" and "ended a test process" in note


# Every header field libmtmd reads from the test projector, and the tensors' shapes.
_U32_VALUES = [0, 1, 2, 3, 4, 5, 7, 8, 16, 24, 31, 32, 33, 48, 64, 65, 640, 1 << 16]
_U32_VALUES += [2**31 - 1, 2**31, 2**32 - 1]
_FIELDS = [
    "clip.vision.image_size",
    "clip.vision.patch_size",
    "clip.vision.embedding_length",
    "clip.vision.feed_forward_length",
    "clip.vision.block_count",
    "clip.vision.projection_dim",
    "clip.vision.attention.head_count",
    "clip.vision.attention.head_count_kv",
    "clip.vision.attention.head_dim",
    "clip.vision.projector.scale_factor",
]
_OTHER_FIELDS = [
    "clip.vision.attention.layer_norm_epsilon",
    "clip.vision.image_mean",
    "clip.vision.image_std",
    "clip.vision.feature_layer",
    "clip.vision.image_grid_pinpoints",
    "clip.projector_type",
    "clip.use_gelu",
    "clip.use_silu",
    "clip.has_vision_encoder",
    "general.name",
]
_TENSORS = [
    "v.patch_embd.weight",
    "v.patch_embd.bias",
    "v.position_embd.weight",
    "v.post_ln.weight",
    "mm.soft_emb_norm.weight",
    "mm.input_projection.weight",
    "v.blk.0.attn_q.weight",
    "v.blk.0.attn_out.weight",
    "v.blk.0.ffn_up.weight",
    "v.blk.0.ffn_down.weight",
    "v.blk.0.ln1.weight",
]
_ODD_VALUES = st.one_of(
    st.none(),
    st.sampled_from([math.nan, -1.0, math.inf, 0.0, 1e-6]),
    st.sampled_from(["gemma3", "", "mlp", "idefics3"]),
    st.booleans(),
    st.lists(st.sampled_from([0, 1, 2, 3, 64, -1]), min_size=1, max_size=4),
    st.lists(st.sampled_from([0.5, 0.0, -1.0]), min_size=1, max_size=4),
    st.sampled_from(["INT32", "INT8", "UINT64", "FLOAT32"]).flatmap(
        lambda t: st.sampled_from([0, 2, 4, 64]).map(
            lambda v: _typed(t, float(v) if t == "FLOAT32" else v)
        )
    ),
)
_MUTATION = st.one_of(
    st.tuples(st.just("key"), st.sampled_from(_FIELDS), st.sampled_from(_U32_VALUES)),
    st.tuples(st.just("key"), st.sampled_from(_FIELDS + _OTHER_FIELDS), _ODD_VALUES),
    st.tuples(
        st.just("shape"),
        st.sampled_from(_TENSORS),
        st.lists(st.sampled_from([1, 2, 3, 4, 16, 24, 32, 48, 64, 640]), min_size=1, max_size=4),
    ),
)


@settings(
    max_examples=examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mutations=st.lists(_MUTATION, min_size=1, max_size=2))
def test_fuzzed_projector_headers_never_end_the_app(
    guarded: tuple[Engine, Path],
    model_path: Path,
    tmp_path: Path,
    mutations: list[tuple[str, str, Any]],
) -> None:
    """Each candidate goes the engine's way for a projector (``Engine.load`` without
    reloading the text model each time): the guard, the header checks, then libmtmd in
    this process. Surviving is the test; a crash here ends the test run."""
    engine, _checks = guarded
    header = {k: v for kind, k, v in mutations if kind == "key"}
    shapes = {k: tuple(v) for kind, k, v in mutations if kind == "shape"}
    try:
        path = build_projector(tmp_path / "mmproj-fuzz.gguf", header=header, shapes=shapes)
    except (ValueError, TypeError, OverflowError):
        return  # the gguf writer refuses to write it: nothing to load
    guard = engine._guard
    assert guard is not None
    config = replace(TEST_LOAD, mmproj=str(path))
    prepared = guard.prepare(model_path, config, gpu=False)
    try:
        info = check_projector(prepared.config, read_gguf_info(model_path))
    except ProjectorError as exc:  # refused with a sentence
        assert "\n" not in str(exc)
        return
    if info is None:  # left out: the child proved it ends llama.cpp
        assert any(n.startswith(LEFT_OUT) for n in prepared.notes)
        return
    try:
        projector = open_projector(prepared.config, engine.llama, info)
    except ProjectorError:  # llama.cpp refused it cleanly
        return
    assert projector is not None
    projector.close()
