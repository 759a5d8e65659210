"""Vision projectors: reading and checking them, pairing with models, and the Hub."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config.setting_records import LoadConfig
from app.gguf.info import read_gguf_info
from app.gguf.projector import ProjectorInfo, check_fits, read_projector
from app.models.downloads import DownloadQueue
from app.models.hub import HubClient, ModelHit
from app.models.projectors import (
    ProjectorPairs,
    candidates,
    find_projector,
    load_config_for,
    model_shape,
    projector_for,
    rank,
)
from app.util.errors import ModelFileError, ProjectorError
from tests.hub_server import HubServer, serving_hub
from tests.hypothesis_budget import examples
from tests.vision_model import TEXT_WIDTH, projector_path


@pytest.fixture(scope="module")
def fits() -> Path:
    return projector_path()


@pytest.fixture(scope="module")
def too_wide() -> Path:
    return projector_path(width=1024)


# -- reading and checking ----------------------------------------------------------------


def test_the_test_projector_reads_and_fits_the_default_model(fits: Path, model_path: Path) -> None:
    info = read_projector(fits)
    assert (info.projector_type, info.n_embd_out) == ("gemma3", TEXT_WIDTH)
    assert (info.image_size, info.patch_size) == (64, 4)
    shape = model_shape(model_path)
    assert shape is not None and (shape.architecture, shape.n_embd) == ("gemma3", TEXT_WIDTH)
    assert read_gguf_info(model_path).n_embd == TEXT_WIDTH
    check_fits(info, shape.n_embd, shape.architecture)


def test_a_projector_of_another_width_is_refused_with_the_reason(too_wide: Path) -> None:
    info = read_projector(too_wide)
    with pytest.raises(ProjectorError, match="1024-wide embeddings; this model reads 640"):
        check_fits(info, 640, "gemma3")


def test_a_projector_for_another_architecture_is_refused(fits: Path) -> None:
    with pytest.raises(ProjectorError, match="made for gemma3 models, and the model is llama"):
        check_fits(read_projector(fits), 640, "llama")
    check_fits(ProjectorInfo(fits, "mlp", 4096, 336, 14), 4096, "llama")  # not checked


def test_a_model_as_projector_and_a_projector_as_model_say_so(fits: Path, model_path: Path) -> None:
    with pytest.raises(ProjectorError, match=r"is a model \(gemma3\), not a vision projector"):
        read_projector(model_path)
    with pytest.raises(ModelFileError, match=r"is a vision projector .*open the model"):
        read_gguf_info(fits)


def test_files_that_are_not_projectors_are_refused(tmp_path: Path) -> None:
    cases = {"empty.gguf": b"", "text.gguf": b"hello", "short.gguf": b"GGUF\x03\0\0"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ProjectorError):
            read_projector(tmp_path / name)
    with pytest.raises(ProjectorError, match="not found"):
        read_projector(tmp_path / "missing.gguf")
    with pytest.raises(ProjectorError, match="directory"):
        read_projector(tmp_path)


def _mutated(data: bytes, edits: list[tuple[int, bytes]], cut: int | None) -> bytes:
    out = bytearray(data)
    for at, raw in edits:
        at %= min(len(out), 4096)  # the header
        out[at : at + len(raw)] = raw
    return bytes(out[:cut] if cut is not None else out)


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8)), max_size=6
    ),
    cut=st.one_of(st.none(), st.integers(0, 8192)),
    word=st.sampled_from([0, 1, 7, 0xFFFFFFFF, 1 << 31]),
    at=st.integers(0, 4096),
)
def test_hostile_projector_headers_are_refused_in_words(
    fits: Path, tmp_path: Path, edits: list[tuple[int, bytes]], cut: int | None, word: int, at: int
) -> None:
    data = _mutated(fits.read_bytes(), [*edits, (at, struct.pack("<I", word))], cut)
    path = tmp_path / "hostile-mmproj.gguf"
    path.write_bytes(data)
    try:
        info = read_projector(path)
    except ProjectorError as exc:
        assert "unexpected" not in str(exc)
        return
    assert info.projector_type and 0 <= info.n_embd_out <= 1 << 32


# -- pairing -------------------------------------------------------------------------------


@pytest.fixture()
def folder(tmp_path: Path, model_path: Path, fits: Path, too_wide: Path) -> Path:
    (tmp_path / "gemma-3-270m-Q4_K_M.gguf").symlink_to(model_path)
    (tmp_path / "mmproj-gemma-3-270m-F16.gguf").symlink_to(too_wide)  # the better name
    (tmp_path / "mmproj-other-F32.gguf").symlink_to(fits)
    (tmp_path / "notes.txt").write_text("not a projector")
    return tmp_path


def test_projectors_are_ranked_by_name_then_precision() -> None:
    model = "Qwen2.5-VL-3B-Instruct-Q4_K_M.gguf"
    names = ["mmproj-other-F16.gguf", "mmproj-Qwen2.5-VL-3B-Instruct-f32.gguf"]
    names += ["mmproj-Qwen2.5-VL-3B-Instruct-f16.gguf", "mmproj-Qwen2.5-VL-3B-Instruct-Q8_0.gguf"]
    ranked = sorted(names, key=lambda n: rank(model, n))
    assert ranked[:3] == [names[2], names[3], names[1]]


def test_the_projector_that_fits_is_paired_automatically(folder: Path) -> None:
    model = folder / "gemma-3-270m-Q4_K_M.gguf"
    assert [p.name for p in candidates(model)] == [
        "mmproj-gemma-3-270m-F16.gguf",
        "mmproj-other-F32.gguf",
    ]
    found = find_projector(model)
    assert found is not None and found.name == "mmproj-other-F32.gguf"  # the F16 is 1024 wide
    config, note = load_config_for(model, LoadConfig(n_ctx=512), ProjectorPairs(folder / "p.json"))
    assert config.mmproj == str(found) and config.n_ctx == 512 and note == ""


def test_a_model_alone_loads_without_a_projector(tmp_path: Path, model_path: Path) -> None:
    (tmp_path / "m.gguf").symlink_to(model_path)
    config, note = load_config_for(
        tmp_path / "m.gguf", LoadConfig(), ProjectorPairs(tmp_path / "p")
    )
    assert config.mmproj == "" and note == ""


def test_pairing_by_hand_is_remembered_and_undone(folder: Path, fits: Path, too_wide: Path) -> None:
    model = folder / "gemma-3-270m-Q4_K_M.gguf"
    pairs = ProjectorPairs(folder / "projectors.json")
    assert pairs.get(model) is None
    pairs.set(model, "")
    assert projector_for(model, ProjectorPairs(pairs.path)) == ("", "")
    pairs.set(model, str(fits))
    assert projector_for(model, pairs) == (str(fits), "")
    pairs.set(model, str(too_wide))  # chosen by hand, then found not to fit: said, not loaded
    mmproj, note = projector_for(model, pairs)
    assert mmproj == "" and "1024-wide" in note
    pairs.set(model, None)
    assert pairs.get(model) is None
    assert json.loads(pairs.path.read_text())["models"] == {}


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"[]",
        b'{"version": 1, "models": []}',
        b'{"version": 9, "models": {}}',
        b"\xff" * 99,
        b'{"version": 1, "models": {"a": 5, "b": ["x"]}}',
        b"{" * 5000,
    ],
)
def test_a_damaged_pairing_file_means_automatic(folder: Path, content: bytes) -> None:
    (folder / "projectors.json").write_bytes(content)
    pairs = ProjectorPairs(folder / "projectors.json")
    assert pairs.get(folder / "gemma-3-270m-Q4_K_M.gguf") is None
    config, _ = load_config_for(folder / "gemma-3-270m-Q4_K_M.gguf", LoadConfig(), pairs)
    assert config.mmproj.endswith("mmproj-other-F32.gguf")


# -- the Hub ---------------------------------------------------------------------------------


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fits: Path) -> Iterator[HubServer]:
    with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
        server.add_repo(
            "acme/seer-GGUF",
            {
                "seer-Q4_K_M.gguf": b"GGUF" + os.urandom(2000),
                "mmproj-seer-F32.gguf": b"GGUF" + os.urandom(300),
                "mmproj-seer-F16.gguf": fits.read_bytes(),
            },
            tags=["image-text-to-text"],
            downloads=9,
        )
        server.add_repo("acme/text-GGUF", {"text-Q4_0.gguf": b"GGUF" + b"\0" * 100})
        yield server


def test_vision_repos_are_marked_and_bring_their_projector(hub: HubServer, tmp_path: Path) -> None:
    from app.models.downloader import FileFetcher

    client = HubClient()
    hits = {h.repo_id: h for h in client.page("", "downloads", 0, 10)}
    assert hits["acme/seer-GGUF"].vision and not hits["acme/text-GGUF"].vision
    details = client.details("acme/seer-GGUF")
    assert details.vision and not client.details("acme/text-GGUF").vision
    model = next(c for c in details.choices if c.kind == "model")
    projector = details.projector_for(model)
    assert projector is not None and projector.name == "mmproj-seer-F16.gguf"
    fetcher = FileFetcher(read_timeout=2.0, sleep=lambda s: None)
    queue = DownloadQueue(tmp_path / "models", tmp_path / "downloads.json", fetcher)
    jobs = [queue.add(details.repo_id, c, details.sha) for c in (model, projector)]
    while queue.run_next(lambda j: None, timeout=0.01) is not None:
        pass
    assert [j.state for j in jobs] == ["done", "done"]
    got = Path(jobs[1].result_path)
    assert got.parent == Path(jobs[0].result_path).parent
    assert hashlib.sha256(got.read_bytes()).hexdigest() == projector.files[0].sha256
    assert read_projector(got).n_embd_out == TEXT_WIDTH
    assert [p.name for p in candidates(Path(jobs[0].result_path))] == [got.name]


def test_search_tags_mark_vision_models() -> None:
    hit = ModelHit("a/b", 0, 0, None, False, ("gguf", "Image-Text-To-Text"))
    assert hit.vision and not ModelHit("a/b", 0, 0, None, False, ("gguf",)).vision


# -- the real engine -------------------------------------------------------------------------
def test_the_paired_projector_loads_with_the_real_model(folder: Path) -> None:
    from app.engine.local.engine import Engine
    from tests.conftest import TEST_LOAD

    model = folder / "gemma-3-270m-Q4_K_M.gguf"
    pairs = ProjectorPairs(folder / "projectors.json")
    engine = Engine()
    try:
        pairs.set(model, str(folder / "mmproj-gemma-3-270m-F16.gguf"))  # 1024 wide
        with pytest.raises(ProjectorError, match="1024-wide"):
            engine.load(model, replace(TEST_LOAD, mmproj=pairs.get(model) or ""))
        pairs.set(model, None)
        config, _note = load_config_for(model, TEST_LOAD, pairs)
        info = engine.load(model, config)
        assert info.projector == "mmproj-other-F32.gguf" and info.capabilities.vision
    finally:
        engine.unload()
