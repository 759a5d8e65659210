"""The shared ggml thread pool (``app/engine/native/threadpool.py``) on the real model."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.engine.native import threadpool
from app.engine.native.threadpool import (
    SharedThreadPool,
    ThreadPoolParams,
    ThreadPoolUnavailable,
    unavailable_reason,
)

PROMPT = b"The capital of France is"


def _llama(path: Path) -> Any:
    from tests.native import llama

    return llama(path, n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)


@pytest.fixture(scope="module")
def target(model_path: Path) -> Iterator[Any]:
    m = _llama(model_path)
    yield m
    m.close()


@pytest.fixture(scope="module")
def draft(draft_path: Path) -> Iterator[Any]:
    m = _llama(draft_path)
    yield m
    m.close()


def _greedy(m: Any, n: int = 12) -> list[int]:
    import llama_cpp

    m.reset()
    m.eval(m.tokenize(PROMPT))
    out: list[int] = []
    for _ in range(n):
        logits = llama_cpp.llama_get_logits_ith(m.ctx, -1)
        out.append(int(np.argmax(np.ctypeslib.as_array(logits, shape=(m.n_vocab(),)))))
        m.eval([out[-1]])
    return out


def test_this_build_can_share_a_pool() -> None:
    assert unavailable_reason() == ""
    assert ctypes.sizeof(ThreadPoolParams) == 528  # bool[512], int, enum, uint32, 2 x bool


def test_params_read_back_as_ggml_documents() -> None:
    api = threadpool._functions()
    p = api.params_default(7)
    assert (p.n_threads, p.prio, p.poll, p.strict_cpu, p.paused) == (7, 0, 50, False, False)
    assert not any(p.cpumask)


def test_attach_detach_round_trip_keeps_greedy_text(target: Any) -> None:
    plain = _greedy(target)
    with SharedThreadPool(1) as pool:
        pool.attach(target.ctx)
        pool.attach(target.ctx)  # twice: harmless
        assert pool.attached == 1
        assert _greedy(target) == plain
        pool.detach(target.ctx)
        assert pool.attached == 0
        assert _greedy(target) == plain
        pool.attach(target.ctx)
    assert pool.closed and pool.attached == 0  # close() detached it
    assert _greedy(target) == plain  # the context runs on its own threads again
    assert target.detokenize(plain).strip()


def test_target_and_draft_share_one_pool(target: Any, draft: Any) -> None:
    alone = (_greedy(target, 8), _greedy(draft, 8))
    pool = SharedThreadPool(1, poll=0)
    try:
        pool.attach(target.ctx)
        pool.attach(draft.ctx)
        assert pool.attached == 2 and pool.poll == 0
        for _ in range(2):  # in turns, as a draft loop runs them
            assert (_greedy(target, 8), _greedy(draft, 8)) == alone
    finally:
        pool.close()
    assert (_greedy(target, 8), _greedy(draft, 8)) == alone


def test_close_is_safe(target: Any) -> None:
    pool = SharedThreadPool(2)
    pool.detach(target.ctx)  # never attached: ignored
    pool.close()
    pool.close()
    pool.detach(target.ctx)
    with pytest.raises(RuntimeError, match="closed"):
        pool.attach(target.ctx)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_threads": 0}, "n_threads must be 1 to 512"),
        ({"n_threads": 513}, "n_threads must be 1 to 512"),
        ({"n_threads": 1, "poll": 101}, "poll must be 0 to 100"),
        ({"n_threads": 1, "poll": -1}, "poll must be 0 to 100"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SharedThreadPool(**kwargs)


def test_a_null_context_is_refused() -> None:
    with SharedThreadPool(1) as pool, pytest.raises(ValueError, match="null"):
        pool.attach(ctypes.c_void_p(None))


def test_missing_symbol_says_which() -> None:
    with pytest.raises(ThreadPoolUnavailable, match="does not export ggml_threadpool_nope"):
        threadpool._bind(symbols={"ggml-cpu": ("ggml_threadpool_nope",)})


def test_missing_library_says_which(tmp_path: Path) -> None:
    with pytest.raises(ThreadPoolUnavailable, match=r"libggml-base\.so cannot be opened"):
        threadpool._bind(lib_dir=tmp_path)


def test_without_the_symbols_the_pool_refuses_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reason = "This llama.cpp build does not export llama_attach_threadpool (looked in x)."
    monkeypatch.setattr(threadpool, "_api", reason)
    assert unavailable_reason() == reason
    assert not threadpool.uses_openmp()
    with pytest.raises(ThreadPoolUnavailable, match="does not export llama_attach_threadpool"):
        SharedThreadPool(2)


def _python(code: str, **env: str) -> str:
    import os

    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_quiet_idle_threads_sets_the_policy_before_llama_cpp_loads() -> None:
    code = (
        "import os; from app.engine.native.threadpool import quiet_idle_threads as q; "
        "print(repr(q()), os.environ.get('OMP_WAIT_POLICY'))"
    )
    assert _python(code) == "'' passive"
    assert _python(code, OMP_WAIT_POLICY="active") == "'' active"  # the user's choice stays
    late = (
        "import os, llama_cpp; from app.engine.native.threadpool import quiet_idle_threads as q; "
        "print(q(), os.environ.get('OMP_WAIT_POLICY'))"
    )
    assert _python(late) == "llama_cpp is already imported; OpenMP has read its settings. None"
