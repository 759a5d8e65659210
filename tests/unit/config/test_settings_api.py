"""The API server's settings group (``ApiSettings``): declared, checked, repaired, fuzzed."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.config import settings as settings_module
from app.config.api_settings import (
    API_SPEC_BY_NAME,
    check_api,
    is_host,
    is_loopback,
    is_origin,
    validate_api,
)
from app.config.field_spec import SettingError
from app.config.setting_records import ApiSettings
from app.config.settings import SETTINGS_VERSION, AppSettings
from tests.model.test_hostile_files import (
    FUZZ,
    check_set_aside_or_repaired,
    mutated,
    one_line,
    timed,
    tree,
)

CUSTOM = ApiSettings(
    enabled=True,
    host="localhost",
    port=8123,
    cors_origins=("http://localhost:3000", "https://app.example.org"),
    max_queue=3,
    max_body_mb=2,
    pool_mb=64,
)


def test_defaults_are_off_and_local() -> None:
    s = AppSettings().api
    assert (s.enabled, s.host, s.port, s.cors_origins) == (False, "127.0.0.1", 1234, ())
    assert (s.max_queue, s.max_body_mb) == (32, 48)
    assert is_loopback(s.host)
    for f in fields(ApiSettings):  # every field has a declaration that accepts its default
        check_api(API_SPEC_BY_NAME[f.name], getattr(s, f.name))


@pytest.mark.parametrize(
    ("host", "ok", "loopback"),
    [
        ("127.0.0.1", True, True),
        ("127.8.9.1", True, True),
        ("::1", True, True),
        ("localhost", True, True),
        ("0.0.0.0", True, False),
        ("192.168.1.20", True, False),
        ("my-box.local", True, False),
        ("", False, False),
        ("a..b", False, False),
        ("-bad.example", False, False),
        ("http://127.0.0.1", False, False),
        ("127.0.0.1 ", False, False),
        ("x" * 300, False, False),
    ],
)
def test_host_syntax(host: str, ok: bool, loopback: bool) -> None:
    assert is_host(host) == ok
    assert is_loopback(host) == loopback


@pytest.mark.parametrize(
    ("origin", "ok"),
    [
        ("http://localhost:3000", True),
        ("https://app.example.org", True),
        ("http://[::1]:8080", True),
        ("*", True),
        ("https://app.example.org/", False),
        ("ftp://x", False),
        ("localhost:3000", False),
        ("http://a:99999", False),
        ("http://a b", False),
    ],
)
def test_origin_syntax(origin: str, ok: bool) -> None:
    assert is_origin(origin) == ok


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"host": "not a host"}, "host"),
        ({"port": 70000}, "port"),
        ({"port": "1234"}, "port"),
        ({"max_queue": 0}, "max_queue"),
        ({"cors_origins": ["ftp://x"]}, "cors_origins"),
        ({"cors_origins": ["http://a"] * 17}, "cors_origins"),
        ({"enabled": 1}, "enabled"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_validate_names_the_bad_field(values: dict[str, object], field: str) -> None:
    with pytest.raises(SettingError) as caught:
        validate_api(values)
    assert caught.value.field == field
    one_line(str(caught.value))


def test_round_trip_through_the_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    AppSettings(api=CUSTOM).save(path)
    assert json.loads(path.read_text())["api"]["cors_origins"] == list(CUSTOM.cors_origins)
    assert AppSettings.load_with_notes(path) == (AppSettings(api=CUSTOM), [])


def test_bad_values_are_repaired_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    doc = json.loads(AppSettings(api=CUSTOM).to_json())
    doc["api"].update(host="0.0.0.0 ; rm", port=-1, max_queue=10**40, enabled="yes")
    path.write_text(json.dumps(doc))
    loaded, notes = AppSettings.load_with_notes(path)
    assert loaded.api == ApiSettings(
        enabled=False,  # never switched on by a damaged file
        host="127.0.0.1",
        port=1234,
        cors_origins=CUSTOM.cors_origins,
        max_queue=32,
        max_body_mb=2,
        pool_mb=64,
    )
    assert len(notes) == 5 and notes[-1].startswith("settings.json was repaired")
    for note in notes:
        one_line(note)
    assert AppSettings.load_with_notes(path) == (loaded, [])


@pytest.mark.parametrize("value", [[], "on", 5, None])
def test_an_api_group_that_is_not_an_object_gives_the_defaults(
    tmp_path: Path, value: object
) -> None:
    path = tmp_path / "settings.json"
    doc = json.loads(AppSettings(api=CUSTOM).to_json())
    doc["api"] = value
    path.write_text(json.dumps(doc))
    loaded, notes = AppSettings.load_with_notes(path)
    assert loaded.api == ApiSettings()
    assert notes and "api settings were not an object" in notes[0]


@pytest.fixture()
def api_dir(tmp_path: Path) -> Path:
    data = tmp_path / "base" / "data"
    data.mkdir(parents=True)
    return data


def api_file(api_json: bytes) -> bytes:
    """A settings file whose ``api`` group is ``api_json`` (which may not be JSON at all)."""
    rest = json.loads(AppSettings(system_prompt="Be kind.").to_json())
    del rest["api"]
    return json.dumps(rest).encode()[:-1] + b', "api": ' + api_json + b"}"


@FUZZ
@given(data=st.data())
def test_fuzz_api_settings(api_dir: Path, data: st.DataObject) -> None:
    """A damaged ``api`` group never yields a setting out of its declaration, never turns
    the server on by itself, and a repaired file reads back clean."""
    path = api_dir / "settings.json"
    for stray in api_dir.glob("*.bad"):
        stray.unlink()
    path.write_bytes(api_file(json.dumps(asdict(CUSTOM)).encode()))
    content = api_file(data.draw(mutated(json.dumps(asdict(CUSTOM)).encode())))
    path.write_bytes(content)
    before = tree(api_dir.parent)
    loaded, notes = timed(lambda: AppSettings.load_with_notes(path))
    for f in fields(ApiSettings):
        check_api(API_SPEC_BY_NAME[f.name], getattr(loaded.api, f.name))
    if loaded.api.enabled:
        assert json.loads(content)["api"]["enabled"] is True
    outcome = check_set_aside_or_repaired(api_dir, "settings.json", notes, content, before)
    if outcome == "set aside":
        assert loaded == AppSettings()
    elif outcome == "repaired":
        assert AppSettings.load_with_notes(path) == (loaded, [])
    assert AppSettings.from_dict(json.loads(loaded.to_json())) == loaded


def test_the_old_default_queue_size_is_upgraded(tmp_path: Path) -> None:
    """Version 1 wrote max_queue 8 into every file; it becomes the new default, 32."""
    path = tmp_path / "settings.json"
    doc = json.loads(AppSettings().to_json())
    doc["version"] = 1
    doc["api"]["max_queue"] = 8
    path.write_text(json.dumps(doc))
    loaded, notes = AppSettings.load_with_notes(path)
    assert loaded.api.max_queue == 32 and notes == []
    doc["api"]["max_queue"] = 5  # a choice stays
    path.write_text(json.dumps(doc))
    assert AppSettings.load_with_notes(path)[0].api.max_queue == 5


# -- versions -------------------------------------------------------------------------------


def test_there_is_one_migration_per_older_version() -> None:
    assert sorted(settings_module.MIGRATIONS) == list(range(1, SETTINGS_VERSION))


def test_migrations_run_in_order_from_the_files_version(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []

    def step(n: int) -> Callable[[dict[str, Any]], None]:
        def run(data: dict[str, Any]) -> None:
            ran.append(n)
            data["system_prompt"] = data.get("system_prompt", "") + str(n)

        return run

    monkeypatch.setattr(settings_module, "SETTINGS_VERSION", 5)
    monkeypatch.setattr(settings_module, "MIGRATIONS", {n: step(n) for n in range(1, 5)})
    assert AppSettings.from_dict({"version": 2}).system_prompt == "234"
    assert ran == [2, 3, 4]
    ran.clear()
    assert AppSettings.from_dict({"version": 5, "system_prompt": "x"}).system_prompt == "x"
    assert AppSettings.from_dict({"version": 7}).system_prompt == ""  # newer: none run
    assert ran == []


@pytest.mark.parametrize("version", ["2", None, 0, -3, 2.5, True])
def test_an_unusable_version_is_taken_as_version_1(version: object) -> None:
    notes: list[str] = []
    loaded = AppSettings.from_dict({"version": version, "api": {"max_queue": 8}}, notes)
    assert loaded.api.max_queue == 32  # the version 1 step ran
    assert len(notes) == 1 and "version 1 is assumed" in notes[0]


def newer_file(path: Path) -> bytes:
    """A settings file of a version after this one, with settings this one does not know
    and a value past this version's range."""
    doc = json.loads(AppSettings(system_prompt="Be kind.", api=CUSTOM).to_json())
    doc["version"] = SETTINGS_VERSION + 1
    doc["future_top"] = {"nested": [1, 2]}
    doc["api"]["max_queue"] = 500  # this version allows at most 64
    doc["api"]["future_api"] = "on"
    doc["sampling"]["future_sampler"] = 0.5
    content = json.dumps(doc, indent=2).encode()
    path.write_bytes(content)
    return content


def test_a_newer_file_is_read_as_well_as_possible_and_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    content = newer_file(path)
    loaded, notes = AppSettings.load_with_notes(path)
    assert loaded.system_prompt == "Be kind." and loaded.api.port == CUSTOM.port
    assert loaded.api.max_queue == ApiSettings().max_queue  # usable here
    assert any("newer Lamplight" in n for n in notes)
    assert any("Queue size" in n for n in notes)
    assert path.read_bytes() == content  # not repaired on disk
    assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]  # nothing set aside


def test_saving_over_a_newer_file_keeps_its_version_and_what_was_not_changed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "settings.json"
    newer_file(path)
    loaded, _ = AppSettings.load_with_notes(path)
    loaded.system_prompt = "Be brief."  # changed here: written
    loaded.api = replace(loaded.api, port=9000)
    loaded.save(path)
    doc = json.loads(path.read_text())
    assert doc["version"] == SETTINGS_VERSION + 1  # never downgraded
    assert doc["future_top"] == {"nested": [1, 2]}
    assert doc["api"]["future_api"] == "on" and doc["sampling"]["future_sampler"] == 0.5
    assert doc["api"]["max_queue"] == 500  # not changed here: the newer version's value
    assert doc["system_prompt"] == "Be brief." and doc["api"]["port"] == 9000
    again, _ = AppSettings.load_with_notes(path)
    assert again == loaded


def test_a_file_of_this_version_is_written_with_it(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    doc = json.loads(AppSettings().to_json())
    doc["version"] = 1
    path.write_text(json.dumps(doc))
    loaded, _ = AppSettings.load_with_notes(path)
    loaded.save(path)
    assert json.loads(path.read_text())["version"] == SETTINGS_VERSION
