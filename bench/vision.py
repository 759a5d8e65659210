"""Images on the real engine: the default model with the tiny test projector
(``tests/vision_model.py``, a random Gemma 3 projector: 64 image tokens per picture).

Prints one JSON object:

- ``image_eval_ms``: an image (and the ~15 text tokens around it) read into an empty
  cache by this app's engine (libmtmd encode, then its embeddings decoded), median of
  ``--rounds``; ``server_image_eval_ms`` the same prompt and picture through llama.cpp's
  own ``llama-server --mmproj`` (``timings.prompt_ms``, prompt cache off), same model,
  projector and threads, in the same run; ``speed_vs_llama_cpp`` = server ÷ ours
  (goal ≥ 0.95);
- ``followup_evaluated_ratio``: tokens a follow-up turn after an image evaluates ÷ the
  new message's own tokens with its turn's template text (goal 1.0);
  ``stock_followup_evaluated_ratio`` the same for llama-cpp-python's stock
  ``MTMDChatHandler``, which clears the cache and evaluates every chunk, the image
  included, on every call (``llama_chat_format.py``: ``llama.reset()``,
  ``kv_cache_clear()``), reproduced here by emptying the cache before the turn;
- ``followup_ms`` / ``stock_followup_ms``: that turn's prompt time both ways;
- ``resume_ms``: a saved chat with an image restored from its snapshot and the next
  message's prompt read, against ``reread_ms``: the same chat read again from its
  stored image and text (what a resume without a snapshot costs).

    .venv/bin/python bench/vision.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.models.default_model import ensure_default_model
from bench.guarded import use_native_guard
from tests.vision_model import MODEL_CACHE, image_part, projector_path

PARAMS = SamplingParams.greedy(1)
CONFIG = LoadConfig(n_ctx=2048, n_threads=2)


def reply(engine: Engine, messages: list[ChatMessage]) -> Finished:
    for event in engine.generate(messages, PARAMS):
        if isinstance(event, Finished):
            return event
    raise AssertionError("no reply")


def ours(engine: Engine, rounds: int) -> dict[str, float]:
    image = image_part((90, 160, 40), "green.png")
    first = [ChatMessage("user", "Describe this picture.", images=(image,))]
    evals, follow, stock, resume, reread = [], [], [], [], []
    own = ratio = stock_ratio = 0.0
    for _ in range(rounds):
        engine.reset()
        done = reply(engine, first)
        evals.append(done.metrics.prefill_ms)
        answer = ChatMessage("assistant", "A green square.")
        engine.prewarm(first, answer)
        turn = [*first, answer, ChatMessage("user", "What colour is it exactly?")]
        saved = engine.export_state()
        t = reply(engine, turn)
        follow.append(t.metrics.prefill_ms)
        # The new message's own tokens with its turn's template text: what a cache that
        # kept everything else must evaluate.
        own = float(t.metrics.prompt_tokens - len(saved.tokens))
        ratio = t.metrics.evaluated_tokens / own
        engine.reset()
        s = reply(engine, turn)
        stock.append(s.metrics.prefill_ms)
        stock_ratio = s.metrics.evaluated_tokens / own
        engine.reset()
        t0 = time.perf_counter()
        engine.import_state(saved)
        r = reply(engine, turn)
        resume.append((time.perf_counter() - t0) * 1000 - r.metrics.decode_ms)
        engine.reset()
        t0 = time.perf_counter()
        x = reply(engine, turn)
        reread.append((time.perf_counter() - t0) * 1000 - x.metrics.decode_ms)
    med = statistics.median
    return {
        "image_eval_ms": round(med(evals), 1),
        "followup_evaluated_ratio": round(ratio, 3),
        "stock_followup_evaluated_ratio": round(stock_ratio, 3),
        "followup_ms": round(med(follow), 1),
        "stock_followup_ms": round(med(stock), 1),
        "resume_ms": round(med(resume), 1),
        "reread_ms": round(med(reread), 1),
    }


def server(model: Path, rounds: int) -> float:
    """llama-server's prompt time for the same picture and text (its own mtmd path)."""
    from tests.server_fixture import running_llama_server

    image = image_part((90, 160, 40), "green.png")
    text = "<start_of_turn>user\n{}Describe this picture.<end_of_turn>\n<start_of_turn>model\n"
    body = {
        "prompt": {
            "prompt_string": "",
            "multimodal_data": [base64.b64encode(image.data).decode()],
        },
        "n_predict": 1,
        "cache_prompt": False,
        "temperature": 0,
    }
    times = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_llama_server(model, Path(tmp), extra=["--mmproj", str(projector_path())]) as srv,
    ):
        # The server's media marker is its own (random per start): /props says it.
        props = srv.get("/props")
        assert isinstance(props, dict)
        body["prompt"]["prompt_string"] = text.format(props["media_marker"])  # type: ignore[index]
        for _ in range(rounds + 1):
            req = urllib.request.Request(
                srv.url + "/completion",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    times.append(float(json.loads(r.read())["timings"]["prompt_ms"]))
            except urllib.error.HTTPError as exc:
                raise SystemExit(f"llama-server refused the prompt: {exc.read()[:300]!r}") from exc
    return statistics.median(times[1:])  # the first warms the server up


def main() -> None:
    use_native_guard()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    model = ensure_default_model(MODEL_CACHE)
    engine = Engine()
    engine.load(model, replace(CONFIG, mmproj=str(projector_path())))
    reply(engine, [ChatMessage("user", "warm up")])
    out: dict[str, object] = {"bench": "vision", "rounds": args.rounds}
    out.update(ours(engine, args.rounds))
    engine.unload()
    srv = server(model, args.rounds)
    out["server_image_eval_ms"] = round(srv, 1)
    out["speed_vs_llama_cpp"] = round(srv / float(out["image_eval_ms"]), 3)  # type: ignore[arg-type]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
