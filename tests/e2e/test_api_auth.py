"""``lamplight serve``'s safe defaults end to end: refused setups exit 2 before any model
is loaded; with an API key, no key or a wrong one is 401. All traffic goes to 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.serve_fixture import ROOT, Served, running, serve_command, stop

KEY = "lamplight-test-key-7f3e"


def run_serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``serve`` expecting it to exit by itself; (exit code, stderr), and how long."""
    done = subprocess.run(
        serve_command(tmp_path / "data", args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen", **(env or {})},
    )
    assert done.stdout == "", done.stdout  # no ready line
    return done.returncode, done.stderr


def test_a_network_address_without_a_key_exits_2_before_loading(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.gguf"  # would fail to load, if it ever got that far
    env = {"LAMPLIGHT_API_KEY": ""}
    t0 = time.monotonic()
    code, err = run_serve(tmp_path, "--host", "0.0.0.0", "--model", str(missing), env=env)
    assert code == 2, err
    assert "key" in err.lower() and "0.0.0.0" in err
    assert "could not be loaded" not in err and "nowhere.gguf" not in err
    assert time.monotonic() - t0 < 20
    assert not (tmp_path / "data" / "models").exists() or not any(
        (tmp_path / "data" / "models").iterdir()
    )


def test_a_busy_port_exits_2_before_loading(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = run_serve(
            tmp_path, "--port", str(port), "--model", str(tmp_path / "nowhere.gguf")
        )
    assert code == 2, err
    assert f"Port {port}" in err and "in use" in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--cors-origin", "*"], "any web page"),  # every page could read the replies
        (["--max-body-mb", "65"], "between 1 and 64"),
    ],
)
def test_unsafe_or_oversized_setups_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    missing = str(tmp_path / "nowhere.gguf")
    env = {"LAMPLIGHT_API_KEY": ""}
    code, err = run_serve(tmp_path, "--port", "0", *args, "--model", missing, env=env)
    assert code == 2 and said in err, err
    assert "could not be loaded" not in err


def test_bad_load_values_exit_2(tmp_path: Path) -> None:
    code, err = run_serve(tmp_path, "--port", "0", "--n-ctx", "-5")
    assert code == 2, err
    assert "must be between" in err


@pytest.fixture(scope="module")
def keyed(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    args = ["--port", "0", "--threads", "1", "--n-ctx", "1024", "--model", str(model_path)]
    with running(tmp_path_factory.mktemp("keyed"), [*args, "--api-key", KEY]) as served:
        yield served


@pytest.mark.parametrize("key", ["wrong", KEY + "x", KEY[:-1], KEY.upper()])
def test_a_wrong_key_is_401(keyed: Served, key: str) -> None:
    c = openai.OpenAI(base_url=keyed.url, api_key=key, max_retries=0)
    with c, pytest.raises(openai.AuthenticationError) as caught:
        c.models.list()
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"
    assert caught.value.response.headers.get("www-authenticate", "").startswith("Bearer")


@pytest.mark.parametrize("path", ["/v1/models", "/lamplight/status"])
def test_no_key_is_401(keyed: Served, path: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(keyed.root + path, timeout=10)
    assert caught.value.code == 401
    body = json.loads(caught.value.read())
    assert body["error"]["code"] == "invalid_api_key"


def test_the_right_key_works(keyed: Served) -> None:
    with openai.OpenAI(base_url=keyed.url, api_key=KEY, max_retries=0) as c:
        assert [m.id for m in c.models.list()] == [keyed.model]
        r = c.chat.completions.create(
            model=keyed.model,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            temperature=0,
        )
        assert r.usage is not None and r.usage.completion_tokens == 4


def test_the_key_can_come_from_the_environment(model_path: Path, tmp_path: Path) -> None:
    args = ["--port", "0", "--threads", "1", "--n-ctx", "512", "--model", str(model_path)]
    args += ["--host", "localhost", "--cors-origin", "*"]  # `*` is allowed with a key
    with running(tmp_path / "data", args, env={"LAMPLIGHT_API_KEY": KEY}) as served:
        # The address bound, not a name that may resolve elsewhere (::1 first).
        assert served.url.startswith("http://127.0.0.1:"), served.url
        c = openai.OpenAI(base_url=served.url, api_key="nope", max_retries=0)
        with c, pytest.raises(openai.AuthenticationError):
            c.models.list()
        with openai.OpenAI(base_url=served.url, api_key=KEY, max_retries=0) as c:
            assert [m.id for m in c.models.list()] == [served.model]
        assert stop(served.proc) == 0  # SIGTERM: a clean exit
    assert "SIGTERM: stopping" in served.stderr()
