"""The fake Hub in tests/hub_server.py, exercised with the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import http.client
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder

from tests.hub_server import COMMIT_SHA, HubServer, serving_hub

TOKEN = "hf_test_valid_token"
SMALL = b"# tiny model card\n"
GGUF = b"GGUF" + bytes(range(256)) * 4  # small, but LFS by suffix
BIG = os.urandom(2 * 1024 * 1024 + 17)  # LFS by size
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(4 * 1024 * 1024):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
        server.valid_tokens.add(TOKEN)
        server.add_repo(
            "org/tiny-GGUF",
            {"README.md": SMALL, "tiny.Q4_K_M.gguf": GGUF, "weights/big.bin": BIG},
            downloads=50,
            extra={"gguf": {"total": 1000, "architecture": "gemma3", "context_length": 2048}},
        )
        yield server
        assert server.errors == []  # no handler raised unexpectedly


def open_url(url: str, timeout: float = 5.0, **headers: str) -> http.client.HTTPResponse:
    response = OPENER.open(urllib.request.Request(url, headers=headers), timeout=timeout)
    assert isinstance(response, http.client.HTTPResponse)
    return response


def test_recipe_points_the_client_at_the_server(hub: HubServer, tmp_path: Path) -> None:
    assert os.environ["HF_ENDPOINT"] == hub.url
    assert hub.url == constants.ENDPOINT
    assert HfApi().endpoint == hub.url
    assert huggingface_hub.hf_api.api.endpoint == hub.url  # behind huggingface_hub.list_models
    assert hf_hub_url("a/b", "c.gguf").startswith(f"{hub.url}/a/b/resolve/main/")
    assert constants.HF_HUB_CACHE.startswith(str(tmp_path))
    assert constants.HF_HUB_DISABLE_XET and constants.HF_HUB_DISABLE_TELEMETRY
    assert huggingface_hub.get_token() is None


def test_list_models_search_sort_and_link_pagination(hub: HubServer) -> None:
    hub.remove_repo("org/tiny-GGUF")
    for i, downloads in enumerate([30, 10, 50, 20, 40]):
        hub.add_repo(
            f"bartowski/Qwen-{i}-GGUF",
            {f"qwen-{i}.Q4_K_M.gguf": GGUF},
            downloads=downloads,
            likes=i,
            last_modified=f"2025-0{i + 1}-01T00:00:00Z",
        )
    hub.add_repo("other/qwen-safetensors", {"model.safetensors": b"x"}, downloads=99)
    hub.add_repo("secret/Qwen-private-GGUF", {"p.gguf": GGUF}, private=True, downloads=1)
    hub.page_size = 2

    found = list(huggingface_hub.list_models(search="qwen", filter="gguf", sort="downloads"))
    assert [m.downloads for m in found] == [50, 40, 30, 20, 10]
    assert all("gguf" in (m.tags or []) for m in found)
    pages = hub.requests_to("/api/models", "GET")
    assert len(pages) == 3
    assert "cursor=2" in pages[1].path and "cursor=4" in pages[2].path

    hub.clear_requests()
    api = HfApi(endpoint=hub.url)
    newest = list(api.list_models(filter="gguf", sort="last_modified", limit=3))
    assert [m.id for m in newest] == [f"bartowski/Qwen-{i}-GGUF" for i in (4, 3, 2)]
    assert "sort=lastModified" in hub.requests[0].path
    assert len(hub.requests_to("/api/models")) == 2  # stopped paging once it had 3

    expanded = next(iter(api.list_models(search="Qwen-0", expand=["gguf", "lastModified"])))
    assert expanded.last_modified is not None and expanded.downloads is None

    assert "secret/Qwen-private-GGUF" not in {m.id for m in api.list_models(search="private")}
    with_token = {m.id for m in api.list_models(search="private", token=TOKEN)}
    assert with_token == {"secret/Qwen-private-GGUF"}


def test_model_info_files_metadata(hub: HubServer) -> None:
    info = HfApi().model_info("org/tiny-GGUF", files_metadata=True)
    assert info.sha == COMMIT_SHA and info.downloads == 50 and info.gated is False
    assert info.gguf == {"total": 1000, "architecture": "gemma3", "context_length": 2048}
    siblings = {s.rfilename: s for s in info.siblings or []}
    assert set(siblings) == {"README.md", "tiny.Q4_K_M.gguf", "weights/big.bin"}
    readme, gguf, big = (siblings[p] for p in ("README.md", "tiny.Q4_K_M.gguf", "weights/big.bin"))
    assert readme.size == len(SMALL) and readme.lfs is None
    assert readme.blob_id == hashlib.sha1(b"blob %d\0" % len(SMALL) + SMALL).hexdigest()
    assert gguf.lfs is not None and gguf.lfs.sha256 == sha256(GGUF) and gguf.size == len(GGUF)
    assert big.lfs is not None and big.lfs.sha256 == sha256(BIG) and big.lfs.size == len(BIG)
    assert big.lfs.pointer_size > 0

    assert HfApi().model_info("org/tiny-GGUF", revision=COMMIT_SHA).sha == COMMIT_SHA
    assert HfApi().model_info("org/tiny-GGUF").siblings[0].size is None  # type: ignore[index]
    with pytest.raises(RevisionNotFoundError):
        HfApi().model_info("org/tiny-GGUF", revision="v9")
    paths = HfApi().get_paths_info("org/tiny-GGUF", ["tiny.Q4_K_M.gguf", "nope", "weights"])
    assert [type(p) for p in paths] == [RepoFile, RepoFolder]


def test_list_repo_tree(hub: HubServer) -> None:
    api = HfApi()
    entries = list(api.list_repo_tree("org/tiny-GGUF", recursive=True, expand=True))
    files = {e.path: e for e in entries if isinstance(e, RepoFile)}
    folders = [e.path for e in entries if isinstance(e, RepoFolder)]
    assert folders == ["weights"]
    assert files["weights/big.bin"].lfs is not None
    assert files["weights/big.bin"].lfs.sha256 == sha256(BIG)
    assert files["weights/big.bin"].size == len(BIG)
    assert files["README.md"].lfs is None
    assert files["README.md"].last_commit is not None
    assert files["README.md"].last_commit.oid == COMMIT_SHA

    top = [e.path for e in api.list_repo_tree("org/tiny-GGUF")]
    assert top == ["weights", "README.md", "tiny.Q4_K_M.gguf"]
    assert [e.path for e in api.list_repo_tree("org/tiny-GGUF", "weights")] == ["weights/big.bin"]
    with pytest.raises(RemoteEntryNotFoundError):
        list(api.list_repo_tree("org/tiny-GGUF", "missing"))

    hub.tree_page_size = 2
    hub.clear_requests()
    assert len(api.list_repo_files("org/tiny-GGUF")) == 3
    assert len(hub.requests_to("/tree/main")) == 2


def test_get_hf_file_metadata(hub: HubServer) -> None:
    lfs = get_hf_file_metadata(hf_hub_url("org/tiny-GGUF", "weights/big.bin"))
    assert (lfs.commit_hash, lfs.etag, lfs.size) == (COMMIT_SHA, sha256(BIG), len(BIG))
    assert lfs.location == f"{hub.url}/org/tiny-GGUF/resolve/main/weights/big.bin"
    assert lfs.xet_file_data is None

    small = get_hf_file_metadata(hf_hub_url("org/tiny-GGUF", "README.md", revision=COMMIT_SHA))
    assert small.size == len(SMALL)
    assert small.etag == hashlib.sha1(b"blob %d\0" % len(SMALL) + SMALL).hexdigest()
    assert hub.requests[-1].method == "HEAD"
    assert hub.requests[-1].headers["accept-encoding"] == "identity"


def test_hf_hub_download_small_file_and_cache(hub: HubServer, tmp_path: Path) -> None:
    path = Path(hf_hub_download("org/tiny-GGUF", "tiny.Q4_K_M.gguf"))
    assert path.read_bytes() == GGUF
    assert path.is_relative_to(tmp_path)  # the cache under the patched HF_HOME
    assert f"snapshots/{COMMIT_SHA}" in path.as_posix()
    methods = [r.method for r in hub.requests_to("/resolve/")]
    assert methods == ["HEAD", "GET"]
    assert "range" not in hub.requests[-1].headers

    hub.clear_requests()  # a pinned commit already in the cache needs no network at all
    again = hf_hub_download("org/tiny-GGUF", "tiny.Q4_K_M.gguf", revision=COMMIT_SHA)
    assert Path(again) == path and hub.requests == []

    local = hf_hub_download("org/tiny-GGUF", "README.md", local_dir=tmp_path / "models")
    assert Path(local) == tmp_path / "models" / "README.md"
    assert Path(local).read_bytes() == SMALL
    with pytest.raises(RemoteEntryNotFoundError) as err:
        hf_hub_download("org/tiny-GGUF", "missing.gguf")
    assert isinstance(err.value, EntryNotFoundError) and err.value.response.status_code == 404


def test_ranged_get(hub: HubServer) -> None:
    url = hf_hub_url("org/tiny-GGUF", "weights/big.bin")
    with open_url(url, Range="bytes=10-19") as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 10-19/{len(BIG)}"
        assert resp.read() == BIG[10:20]
    with open_url(url, Range="bytes=-5") as resp:
        assert resp.status == 206 and resp.read() == BIG[-5:]
    with open_url(url, Range=f"bytes={len(BIG) - 3}-") as resp:
        assert resp.read() == BIG[-3:]
    for bad in (f"bytes={len(BIG)}-", "bytes=9-2", "bytes=0-1,5-6", "items=0-1"):
        with pytest.raises(urllib.error.HTTPError) as err:
            open_url(url, Range=bad)
        assert err.value.code == 416, bad
        assert err.value.headers["Content-Range"] == f"bytes */{len(BIG)}"
    assert hub.requests_to("big.bin")[0].headers["range"] == "bytes=10-19"


def test_gated_and_private_repos(hub: HubServer) -> None:
    hub.add_repo("meta/gated-GGUF", {"g.gguf": GGUF}, gated=True)
    hub.add_repo("me/private-GGUF", {"p.gguf": GGUF}, private=True)
    api = HfApi()

    assert api.model_info("meta/gated-GGUF").gated == "manual"  # metadata is public
    with pytest.raises(GatedRepoError) as err:
        hf_hub_download("meta/gated-GGUF", "g.gguf")
    assert err.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as err:
        hf_hub_download("meta/gated-GGUF", "g.gguf", token="hf_wrong")
    assert err.value.response.status_code == 403
    assert Path(hf_hub_download("meta/gated-GGUF", "g.gguf", token=TOKEN)).read_bytes() == GGUF
    assert hub.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"

    for token, status in ((None, 401), ("hf_wrong", 403)):
        with pytest.raises(RepositoryNotFoundError) as repo_err:
            api.model_info("me/private-GGUF", token=token)
        assert not isinstance(repo_err.value, GatedRepoError)
        assert repo_err.value.response.status_code == status
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("me/private-GGUF", "p.gguf", token="hf_wrong")
    assert api.model_info("me/private-GGUF", token=TOKEN).private is True

    hub.reject_invalid_tokens = True  # the Hub's answer to an expired token, on any repo
    with pytest.raises(HfHubHTTPError) as http_err:
        api.model_info("org/tiny-GGUF", token="hf_expired")
    assert not isinstance(http_err.value, RepositoryNotFoundError)
    assert http_err.value.response.status_code == 401


def test_missing_repo_and_file(hub: HubServer) -> None:
    with pytest.raises(RepositoryNotFoundError) as err:
        HfApi().model_info("nobody/nothing")
    assert err.value.response.status_code == 404
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("nobody/nothing", "x.gguf")
    with pytest.raises(RepositoryNotFoundError):
        list(HfApi().list_repo_tree("nobody/nothing"))


def test_drop_after_ends_a_plain_read_early(hub: HubServer) -> None:
    hub.drop_after("weights/big.bin", 1000)
    url = hf_hub_url("org/tiny-GGUF", "weights/big.bin")
    with open_url(url) as resp, pytest.raises(http.client.IncompleteRead) as err:
        resp.read()
    assert err.value.partial == BIG[:1000]
    with open_url(url) as resp:  # times=1: the next GET is whole
        assert resp.read() == BIG


def test_hf_hub_download_retries_a_drop_within_the_call(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # http_get counts only bytes it wrote, and iter_bytes() hands over DOWNLOAD_CHUNK_SIZE
    # (10 MiB) at a time: a drop before the first full chunk restarts from 0, without Range.
    hub.drop_after("weights/big.bin", 300_000)
    path = hf_hub_download("org/tiny-GGUF", "weights/big.bin")
    assert sha256_file(Path(path)) == sha256(BIG)
    gets = hub.requests_to("weights/big.bin", "GET")
    assert len(gets) == 2 and not any("range" in g.headers for g in gets)

    # With smaller chunks it resumes with a Range from the last whole chunk it wrote.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    hub.drop_after("weights/big.bin", 300_000)
    hub.clear_requests()
    path = hf_hub_download("org/tiny-GGUF", "weights/big.bin", force_download=True)
    assert sha256_file(Path(path)) == sha256(BIG)
    gets = hub.requests_to("weights/big.bin", "GET")
    assert [g.headers.get("range") for g in gets] == [None, f"bytes={4 * 64 * 1024}-"]


def test_stall_is_cut_by_a_client_timeout(hub: HubServer) -> None:
    hub.stall("weights/big.bin", 20)
    started = time.monotonic()
    with open_url(hf_hub_url("org/tiny-GGUF", "weights/big.bin"), timeout=0.3) as resp:
        assert resp.status == 200  # headers came at once
        with pytest.raises(TimeoutError):
            resp.read()
    assert time.monotonic() - started < 3


def test_hf_hub_download_times_out_a_stall_and_resumes(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.3)
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    hub.stall("weights/big.bin", 20, times=1, after_bytes=2 * 64 * 1024)
    path = hf_hub_download("org/tiny-GGUF", "weights/big.bin")
    assert Path(path).read_bytes() == BIG
    gets = hub.requests_to("big.bin", "GET")
    assert [g.headers.get("range") for g in gets] == [None, f"bytes={2 * 64 * 1024}-"]


def test_corrupt_content_is_not_caught_by_the_client(hub: HubServer) -> None:
    hub.corrupt("weights/big.bin")
    path = Path(hf_hub_download("org/tiny-GGUF", "weights/big.bin"))
    info = HfApi().model_info("org/tiny-GGUF", files_metadata=True)
    expected = next(s for s in info.siblings or [] if s.rfilename == "weights/big.bin")
    assert expected.lfs is not None and expected.lfs.sha256 == sha256(BIG)
    assert path.stat().st_size == len(BIG)
    assert sha256_file(path) != expected.lfs.sha256  # hf_hub_download checks size only


def test_fail_and_throttle(hub: HubServer) -> None:
    url = hf_hub_url("org/tiny-GGUF", "README.md")
    hub.fail("README.md", 503)
    with pytest.raises(urllib.error.HTTPError) as err:
        open_url(url)
    assert err.value.code == 503
    with open_url(url) as resp:
        assert resp.read() == SMALL

    hub.fail("README.md", 403)  # a 403 without X-Error-Code on the HEAD: reported as "offline"
    with pytest.raises(LocalEntryNotFoundError) as local_err:
        hf_hub_download("org/tiny-GGUF", "README.md")
    assert isinstance(local_err.value.__cause__, HfHubHTTPError)
    assert local_err.value.__cause__.response.status_code == 403

    hub.throttle(1_000_000)
    started = time.monotonic()
    with open_url(hf_hub_url("org/tiny-GGUF", "weights/big.bin"), Range="bytes=0-399999") as r:
        assert len(r.read()) == 400_000
    assert time.monotonic() - started > 0.3


def test_cdn_redirect_drops_the_token_off_the_hub(hub: HubServer) -> None:
    hub.add_repo("meta/gated-GGUF", {"g.gguf": GGUF}, gated=True)
    hub.cdn_redirect = True
    meta = get_hf_file_metadata(hf_hub_url("meta/gated-GGUF", "g.gguf"), token=TOKEN)
    assert meta.location.startswith(f"http://localhost:{hub.port}/__cdn/{sha256(GGUF)}?")
    assert (meta.etag, meta.size, meta.commit_hash) == (sha256(GGUF), len(GGUF), COMMIT_SHA)

    path = hf_hub_download("meta/gated-GGUF", "g.gguf", token=TOKEN)
    assert Path(path).read_bytes() == GGUF
    cdn = hub.requests_to("/__cdn/", "GET")
    assert len(cdn) == 1 and "authorization" not in cdn[0].headers


def test_stop_is_prompt_with_idle_and_stalled_connections() -> None:
    server = HubServer().start()
    server.add_repo("org/x", {"big.bin": BIG})
    idle = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    stalled = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        idle.request("GET", "/api/models")
        assert idle.getresponse().read().startswith(b"[")  # kept alive, server thread waits
        server.stall("big.bin", 30)
        stalled.request("GET", "/org/x/resolve/main/big.bin")
        assert stalled.getresponse().status == 200
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 2
    finally:
        idle.close()
        stalled.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("hub-server")]
    assert server.errors == []
    server.stop()  # idempotent


def test_real_gguf_download_matches_lfs_sha256(
    hub: HubServer, model_path: Path, tmp_path: Path
) -> None:
    name = model_path.name
    hub.add_repo("lamplight/gemma-3-270m-GGUF", {name: model_path}, downloads=1234)
    info = HfApi().model_info("lamplight/gemma-3-270m-GGUF", files_metadata=True)
    (sibling,) = info.siblings or []
    assert sibling.lfs is not None and sibling.size == model_path.stat().st_size

    started = time.monotonic()
    path = hf_hub_download("lamplight/gemma-3-270m-GGUF", name, local_dir=tmp_path / "models")
    elapsed = time.monotonic() - started
    assert Path(path) == tmp_path / "models" / name
    assert sha256_file(Path(path)) == sibling.lfs.sha256
    assert elapsed < 20, f"{sibling.size / elapsed / 1e6:.0f} MB/s"
