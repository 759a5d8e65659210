"""Prompt-lookup speculative decoding versus plain decoding, on the default model.

Each mode runs in its own fresh process (so peak RSS is that mode's alone),
twice, alternating: greedy replies to a prompt that repeats its context
("rewrite this paragraph with one word changed") and to an ordinary one.
Decode speed is llama.cpp-independent wall time from first to last token.

Prints one JSON object: plain_tok_s, spec_tok_s, ratio, acceptance,
plain_rss_mb, spec_rss_mb (peak), plus the ordinary prompt's figures
(ordinary_ratio, ordinary_acceptance) and whether the texts were identical.
Usage: python bench/speculative.py [--tokens 200] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PARAGRAPH = (
    "Lamplight keeps every conversation on disk together with its key-value cache, so a long "
    "chat reopens at once and the next reply starts without reading the whole history again. "
    "The cache is small because it stores only what the model needs, not the scores of every "
    "token, and each file carries a fingerprint of the model that made it."
)
PROMPTS = {
    "repetitive": f"Rewrite this paragraph with one word changed:\n\n{PARAGRAPH}",
    "ordinary": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def run_mode(speculative: bool, tokens: int, threads: int) -> dict[str, Any]:
    from app.config.params import LoadConfig, SamplingParams
    from app.engine.backend import Finished
    from app.engine.llama import Engine
    from app.engine.templates import ChatMessage
    from app.models.default_model import ensure_default_model

    engine = Engine()
    engine.load(
        ensure_default_model(ROOT / ".cache" / "test-models"),
        LoadConfig(n_ctx=4096, n_threads=threads),
    )
    out: dict[str, Any] = {}
    for name, prompt in PROMPTS.items():
        engine.reset()
        params = replace(SamplingParams.greedy(tokens), speculative=speculative)
        for event in engine.generate([ChatMessage("user", prompt)], params):
            if isinstance(event, Finished):
                m = event.metrics
                out[name] = {
                    "tok_s": m.decode_tok_s,
                    "acceptance": m.acceptance,
                    "tokens": m.generated_tokens,
                    "text": event.text,
                }
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    engine.unload()
    return out


def _common(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _common(a: str, b: str) -> int:
    """Characters the two texts share before they first differ."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mode", choices=("plain", "spec"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode == "spec", args.tokens, args.threads)))
        return

    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "spec": []}
    for _ in range(args.rounds):
        for mode in ("plain", "spec"):
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--mode",
                    mode,
                    "--tokens",
                    str(args.tokens),
                    "--threads",
                    str(args.threads),
                ],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            )
            runs[mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))

    def med(mode: str, prompt: str, key: str) -> float:
        return float(statistics.median(r[prompt][key] for r in runs[mode]))

    pairs = list(zip(runs["plain"], runs["spec"], strict=True))
    plain, spec = med("plain", "repetitive", "tok_s"), med("spec", "repetitive", "tok_s")
    o_plain, o_spec = med("plain", "ordinary", "tok_s"), med("spec", "ordinary", "tok_s")
    print(
        json.dumps(
            {
                "plain_tok_s": round(plain, 1),
                "spec_tok_s": round(spec, 1),
                "ratio": round(spec / plain, 3),
                "acceptance": round(med("spec", "repetitive", "acceptance"), 3),
                "plain_rss_mb": round(max(r["peak_rss_mb"] for r in runs["plain"]), 1),
                "spec_rss_mb": round(max(r["peak_rss_mb"] for r in runs["spec"]), 1),
                "ordinary_plain_tok_s": round(o_plain, 1),
                "ordinary_spec_tok_s": round(o_spec, 1),
                "ordinary_ratio": round(o_spec / o_plain, 3),
                "ordinary_acceptance": round(med("spec", "ordinary", "acceptance"), 3),
                # llama.cpp's CPU kernels round differently for other batch shapes, so a
                # near-tie (~0.2 logit here) can flip after enough tokens; docs/NOTES.md.
                "identical_text": {
                    k: all(p[k]["text"] == s[k]["text"] for p, s in pairs) for k in PROMPTS
                },
                "same_prefix_chars": {
                    k: min(_common(p[k]["text"], s[k]["text"]) for p, s in pairs) for k in PROMPTS
                },
                "tokens": args.tokens,
                "threads": args.threads,
                "rounds": args.rounds,
            }
        )
    )


if __name__ == "__main__":
    main()
