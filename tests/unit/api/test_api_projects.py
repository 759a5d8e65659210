"""The API's ``project`` field (issue 44) over the scripted gateway (fast): a request
naming a project shared with the API is answered with the project's system turn and
starts from its opening; a name not shared is a 404, a request with its own system
message a 400, a bad value a 400 naming the field."""

from __future__ import annotations

import dataclasses
from typing import Any

import openai
import pytest

from app.api.errors import ApiError
from app.api.gateway import ProjectView
from app.api.host_gateway import HostGateway
from app.api.schema import parse_chat
from app.chat.projects import Project, ProjectStore
from app.engine.backend import Capabilities
from app.engine.tool_spec import ToolRequest, ToolSpec
from tests.conftest import Serve

MODEL = "gemma-3-270m-it-Q4_K_M"
USER: Any = [{"role": "user", "content": "When is high water?"}]
VIEW = ProjectView("p1", "Answer as the harbour master.")


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=10)


def test_a_named_project_gives_its_system_turn_and_opening(serve: Serve) -> None:
    server, gw = serve()
    gw.projects = {"p1": VIEW, "Harbour": VIEW}
    c = client(server.url)
    c.chat.completions.create(model=MODEL, messages=USER, extra_body={"project": "Harbour"})
    job = gw.submitted[-1]
    assert [(m.role, m.content) for m in job.messages] == [
        ("system", VIEW.system_text),
        ("user", "When is high water?"),
    ]
    assert job.prefix == "p1"  # a first question: it starts from the project's opening
    follow = [
        *USER,
        {"role": "assistant", "content": "At six."},
        {"role": "user", "content": "And?"},
    ]
    c.chat.completions.create(model=MODEL, messages=follow, extra_body={"project": "p1"})
    assert gw.submitted[-1].prefix == ""  # a later turn extends its own cache
    c.chat.completions.create(model=MODEL, messages=USER)
    assert gw.submitted[-1].prefix == "" and gw.submitted[-1].messages[0].role == "user"


def test_a_project_not_shared_or_in_conflict_is_refused(serve: Serve) -> None:
    server, gw = serve()
    gw.projects = {"p1": VIEW}
    c = client(server.url)
    with pytest.raises(openai.NotFoundError) as missing:
        c.chat.completions.create(model=MODEL, messages=USER, extra_body={"project": "secret"})
    assert missing.value.code == "project_not_found"
    own = [{"role": "system", "content": "Be brief."}, *USER]
    with pytest.raises(openai.BadRequestError) as conflict:
        c.chat.completions.create(model=MODEL, messages=own, extra_body={"project": "p1"})
    assert conflict.value.code == "project_conflict"
    assert len(gw.submitted) == 0


@pytest.mark.parametrize("value", [5, ["p1"], "x" * 129, {"id": "p1"}])
def test_a_bad_project_value_names_the_field(value: object) -> None:
    with pytest.raises(ApiError) as err:
        parse_chat({"messages": USER, "project": value})
    assert err.value.param == "project" and err.value.status == 400


def test_the_host_gateway_reaches_only_projects_shared_with_the_api(tmp_path: Any) -> None:
    store = ProjectStore(tmp_path)
    shared = Project(name="Harbour", instructions="Tides first.", api=True)
    private = Project(name="Diary", instructions="Private.")
    store.save(shared)
    store.save(private)
    gateway = HostGateway(host=None, projects=store)  # type: ignore[arg-type]
    view = gateway.project("Harbour")
    assert view is not None and view.id == shared.id and "Tides first." in view.system_text
    assert gateway.project(shared.id) == view
    assert gateway.project("Diary") is None and gateway.project(private.id) is None
    assert HostGateway(host=None).project("Harbour") is None  # type: ignore[arg-type]


TIDES = ToolSpec("tides", "Tide table.", {"type": "object", "properties": {"port": {}}})


def test_a_project_offers_its_tools_unless_the_request_has_its_own(serve: Serve) -> None:
    server, gw = serve()
    view = ProjectView("p1", "Answer as the harbour master.", (TIDES,))
    gw.projects = {"p1": view}
    c = client(server.url)
    c.chat.completions.create(model=MODEL, messages=USER, extra_body={"project": "p1"})
    assert gw.submitted[-1].tools is None  # a model without tool calling: left out
    assert gw.info is not None
    gw.info = dataclasses.replace(gw.info, capabilities=Capabilities(tools=True))
    c.chat.completions.create(model=MODEL, messages=USER, extra_body={"project": "p1"})
    assert gw.submitted[-1].tools == ToolRequest((TIDES,), "auto", parallel=True)
    own = [{"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}]
    c.chat.completions.create(
        model=MODEL, messages=USER, tools=own, tool_choice="none", extra_body={"project": "p1"}
    )
    got = gw.submitted[-1].tools
    assert got is not None and [t.name for t in got.tools] == ["clock"] and got.choice == "none"
    c.chat.completions.create(model=MODEL, messages=USER)
    assert gw.submitted[-1].tools is None  # no project, no tools


def test_the_host_gateway_gives_a_shared_project_its_stored_tools(tmp_path: Any) -> None:
    store = ProjectStore(tmp_path)
    spec = {"name": "tides", "description": "Tide table.", "parameters": {"type": "object"}}
    shared = Project(name="Harbour", api=True, mcp_tools=["tides"], tool_specs=[spec])
    store.save(shared)
    view = HostGateway(host=None, projects=store).project("Harbour")  # type: ignore[arg-type]
    assert view is not None and view.tools == (
        ToolSpec("tides", "Tide table.", {"type": "object"}),
    )
