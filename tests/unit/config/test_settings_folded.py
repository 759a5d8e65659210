"""The sidebar's folded projects in the settings: ids, each once, tidied with a note."""

from __future__ import annotations

import json

from app.config.settings import AppSettings


def test_folded_projects_are_ids_each_once() -> None:
    notes: list[str] = []
    kept = AppSettings.from_dict({"folded_projects": ["a1", "a1", "../x", 5, "b2"]}, notes)
    assert kept.folded_projects == ["a1", "b2"]
    assert notes == ["folded_projects was not a short list of project ids; it was tidied."]
    assert AppSettings.from_dict({"folded_projects": "a1"}).folded_projects == []
    again = AppSettings.from_dict(json.loads(kept.to_json()))
    assert again.folded_projects == ["a1", "b2"]
