"""Download throughput: the app's downloader versus ``hf_hub_download``, in one run.

A local Hub-compatible server (tests/hub_server.py, in its own process) serves
the default model (253 MB). Each round downloads it once with
``FileFetcher`` (Range requests into a ``.part``, sha256 as it goes, verified
rename) and once with ``huggingface_hub.hf_hub_download``, alternating. The
app's peak RSS growth is sampled every 5 ms during its downloads, for the big
file and for a 10x smaller one, to show memory does not grow with file size.

Prints one JSON object: app_mb_s, hf_mb_s, ratio, peak_rss_mb (the app's peak
resident memory during its downloads) and the per-size growth figures.
Usage: python bench/download.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REPO = "local/test-GGUF"


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


class PeakRss:
    """Samples this process's RSS in a thread while the block runs."""

    def __enter__(self) -> PeakRss:
        self.start = rss_mb()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def serve(files: list[Path]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.hub_server",
            *map(str, files),
            "--repo",
            REPO,
            "--seconds",
            "900",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    url = line.split()[0].removeprefix("HF_ENDPOINT=")
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from app.models.default_model import ensure_default_model

    model = ensure_default_model(ROOT / ".cache" / "test-models")
    work = Path(tempfile.mkdtemp(prefix="lamplight-dl-"))
    small = work / "small.gguf"
    with model.open("rb") as src:
        small.write_bytes(src.read(model.stat().st_size // 10))
    proc, url = serve([model, small])
    os.environ.update(
        HF_ENDPOINT=url,
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HOME=str(work / "hf-home"),
    )
    try:
        from huggingface_hub import hf_hub_download

        from app.models.downloader import Control, FileFetcher

        sizes = {p.name: p.stat().st_size for p in (model, small)}
        shas = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (model, small)}
        app_rates, hf_rates, growth = [], [], {"big": 0.0, "small": 0.0}
        peak_rss = 0.0
        for i in range(args.rounds):
            for label, name in (("big", model.name), ("small", small.name)):
                dest = work / f"app-{i}" / name
                with PeakRss() as mem:
                    t = time.perf_counter()
                    FileFetcher(endpoint=url).fetch(
                        REPO, name, dest, sizes[name], shas[name], Control.new()
                    )
                    dt = time.perf_counter() - t
                growth[label] = max(growth[label], mem.peak - mem.start)
                peak_rss = max(peak_rss, mem.peak)
                if label == "big":
                    app_rates.append(sizes[name] / 1e6 / dt)
                dest.unlink()
            t = time.perf_counter()
            path = hf_hub_download(REPO, model.name, endpoint=url, cache_dir=str(work / f"hf-{i}"))
            hf_rates.append(sizes[model.name] / 1e6 / (time.perf_counter() - t))
            Path(path).resolve().unlink()
        app = statistics.median(app_rates)
        hf = statistics.median(hf_rates)
        print(
            json.dumps(
                {
                    "app_mb_s": round(app, 1),
                    "hf_mb_s": round(hf, 1),
                    "ratio": round(app / hf, 3),
                    "peak_rss_mb": round(peak_rss, 1),
                    "rss_growth_mb_253mb_file": round(growth["big"], 1),
                    "rss_growth_mb_25mb_file": round(growth["small"], 1),
                    "file_mb": round(sizes[model.name] / 1e6, 1),
                    "rounds": args.rounds,
                    "app_rounds": [round(r, 1) for r in app_rates],
                    "hf_rounds": [round(r, 1) for r in hf_rates],
                    "verified": "sha256 while downloading (app); size only (hf_hub_download)",
                }
            )
        )
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
