"""Shared fixtures: the real default model, one loaded engine, and thread hygiene."""

from __future__ import annotations

import errno
import gc
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# One verdict file on native paths that crash on this CPU (app/engine/native/guard.py) for
# every engine the suite makes, in this process and in the apps it starts: checked once.
os.environ.setdefault(
    "LAMPLIGHT_NATIVE_PATHS_FILE",
    str(Path(__file__).resolve().parent.parent / ".cache" / "native_paths.json"),
)

from app.api.config import ApiConfig
from app.api.runner import THREAD_NAME, ApiServer
from app.config import setting_records
from app.config.model_prefs import FILE_NAME, ModelPrefs, ModelPrefsStore, model_key
from app.config.setting_records import LoadConfig
from app.engine.local.engine import Engine
from app.models.default_model import ensure_default_model  # after the env var
from tests.fakes.gateway import FakeGateway
from tests.server_fixture import RunningServer, running_llama_server

# Hypothesis budgets (``tests/hypothesis_budget.py``): ``ci`` runs the same cases each run,
# ``dev`` a tenth of them for a fast loop, ``deep`` ten times as many, freshly random.
settings.register_profile(
    "ci",
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", settings.get_profile("ci"), max_examples=10)
settings.register_profile("deep", settings.get_profile("ci"), max_examples=1000, derandomize=False)
settings.load_profile("ci")  # ``--hypothesis-profile=NAME`` loads another before collection

ROOT = Path(__file__).resolve().parent.parent
# Kept between runs (git-ignored) so the 253 MB model is assembled once per checkout.
MODEL_CACHE = ROOT / ".cache" / "test-models"
TEST_CTX = 2048
# Under pytest-xdist ("gw0", "gw1", ...) each worker's llama.cpp gets one thread: two
# workers on two cores, each with two threads waiting on each other, measured far slower.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
TEST_LOAD = LoadConfig(n_ctx=TEST_CTX, n_threads=1 if WORKER else 2)
# One llama.cpp thread: short replies run no slower, and far steadier beside other work
# on two cores (two threads waiting on each other measured 15x slower under load).
ONE_THREAD = replace(TEST_LOAD, n_threads=1)


def chat_turns(data_root: Path, model: Path) -> None:
    """Have the default (base) model chat in turns in the data dir ``data_root``, as tests
    written for chat turns expect; it opens in continue-the-text mode otherwise."""
    ModelPrefsStore(data_root / FILE_NAME).set(
        model_key(model, model.stat().st_size), ModelPrefs(completion=False)
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under xdist the controller builds the shared model files once, before the workers
    would race to assemble the same file."""
    if WORKER is None and getattr(session.config.option, "numprocesses", None):
        from tests.draft_model import draft_model_path
        from tests.embed_model import embedder_path
        from tests.marked_model import marked_model_path

        ensure_default_model(MODEL_CACHE)
        draft_model_path()
        embedder_path()
        marked_model_path()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test ends with a full garbage collection (``_no_leftover_threads``). What
    exists by now (the imported modules, the collected tests) lives the whole run, so it
    is frozen out of those collections: each then walks only what the tests made."""
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def _one_thread_per_worker() -> Iterator[None]:
    """Windows and engines that take the default thread count use one per xdist worker."""
    if WORKER is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(setting_records, "default_threads", lambda: 1)
        yield


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The embedded default model (gemma 3 270m Q4_K_M), assembled from its package."""
    return ensure_default_model(MODEL_CACHE)


@pytest.fixture(scope="session")
def draft_path(model_path: Path) -> Path:
    """A real draft model for the default model: its first 4 blocks with the same
    vocabulary and head (``tests/draft_model.py``), built once per checkout (~12 s)."""
    from tests.draft_model import draft_model_path

    return draft_model_path()


@pytest.fixture(scope="session")
def loaded_engine(model_path: Path) -> Iterator[Engine]:
    engine = Engine()
    engine.load(model_path, TEST_LOAD)
    yield engine
    engine.unload()


@pytest.fixture()
def engine(loaded_engine: Engine) -> Engine:
    """The session's engine with an empty KV cache."""
    loaded_engine.reset()
    return loaded_engine


@pytest.fixture(scope="module")
def one_engine(model_path: Path) -> Iterator[Engine]:
    """The default model on one thread, for one module's engine tests (set_template, reset)."""
    engine = Engine()
    engine.load(model_path, ONE_THREAD)
    yield engine
    engine.unload()


@pytest.fixture(scope="session")
def server_lora(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter strong enough to change greedy output, for the server to load."""
    from tests.lora_factory import make_lora

    return make_lora(
        tmp_path_factory.mktemp("server-lora") / "test-lora.gguf", model_path, strength=0.5
    )


@pytest.fixture(scope="session")
def llama_server(
    model_path: Path, server_lora: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """A real llama-server on 127.0.0.1 with the default model, ``--swa-full``, a slot
    save path and ``server_lora`` (scale 0 until a request sets it); stopped at the end."""
    with running_llama_server(
        model_path, tmp_path_factory.mktemp("llama-server"), n_ctx=TEST_CTX, loras=[server_lora]
    ) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_leftover_threads() -> Iterator[None]:
    """Fail a test that leaves a thread running: a live QThread at exit aborts the run."""
    before = set(threading.enumerate())
    yield
    # Collect this test's widgets here, on the GUI thread. Left to a later automatic
    # collection, a worker thread (a download, the engine) can run it: a QWidget
    # destroyed there waits for a Qt lock the GUI thread holds while it waits for the
    # GIL (seen as a hung suite: QMenu::~QMenu inside gc on the download thread).
    gc.collect()
    from ui.engine.worker import live_engine_threads

    running = [t for t in live_engine_threads() if t.isRunning()]
    assert not running, f"test left {len(running)} engine QThread(s) running"
    # Python names foreign threads (QThreads, llama.cpp's) "Dummy" and never forgets
    # them; the QThread check above covers those.
    extra = [
        t
        for t in threading.enumerate()
        if t not in before and t.is_alive() and not isinstance(t, threading._DummyThread)
    ]
    assert not extra, f"test left threads running: {extra}"


def make_unreadable(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``path`` unreadable; as root, which reads anything, ``os.open`` says what
    the OS would say to anyone else."""
    if os.geteuid() != 0:
        path.chmod(0)
        return
    real_open = os.open

    def refusing_open(name: object, *args: object, **kwargs: object) -> int:
        if Path(str(name)) == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(name))
        return real_open(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing_open)


Serve = Callable[..., tuple[ApiServer, FakeGateway]]


@pytest.fixture()
def serve() -> Iterator[Serve]:
    """Start servers (``serve(**ApiConfig fields)``); all stopped and joined at the end."""
    started: list[tuple[ApiServer, FakeGateway]] = []

    def start(delay: float = 0.0, **fields: Any) -> tuple[ApiServer, FakeGateway]:
        gateway = FakeGateway(delay=delay)
        server = ApiServer(gateway, ApiConfig(**{"port": 0, **fields}))
        started.append((server, gateway))
        server.start()
        return server, gateway

    yield start
    for server, gateway in started:
        server.stop()
        gateway.close()
    # The server's threads (its body parser too) are all joined.
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]
