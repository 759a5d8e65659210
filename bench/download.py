"""Download throughput: the app's downloader versus ``hf_hub_download``, in one run.

A local Hub-compatible server (tests/hub_server.py, in its own process) serves
the default model (253 MB). Each round downloads it once with
``FileFetcher`` (Range requests into a ``.part``, sha256 as it goes, verified
rename) and once with ``huggingface_hub.hf_hub_download``, alternating. The
app's peak RSS growth is sampled every 5 ms during its downloads, for the big
file and for a 10x smaller one, to show memory does not grow with file size.

Loopback figures are dominated by CPU (hashing, copying, the server's Python
loop), not by the link. A second server throttles every body to ``--rate``
(50 MB/s by default, a fast home or office connection), where both downloaders
should reach the link rate: that is the comparison a user would notice.

Prints one JSON object: app_mb_s, hf_mb_s, ratio (loopback), peak_rss_mb (the
app's peak resident memory during its downloads), the per-size growth figures,
and ``throttled`` with the same rates through the throttled server.
Usage: python bench/download.py [--rounds 3] [--rate 50e6] [--throttled-rounds 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.guarded import use_native_guard  # noqa: E402 (after the path above)

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


def serve(files: list[Path], rate: float | None = None) -> tuple[subprocess.Popen[str], str]:
    extra = ["--rate", str(rate)] if rate else []
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
            *extra,
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
    use_native_guard()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=50e6, help="throttled link, bytes/s")
    parser.add_argument("--throttled-rounds", type=int, default=2)
    args = parser.parse_args()

    from app.models.default_model import ensure_default_model

    model = ensure_default_model(ROOT / ".cache" / "test-models")
    work = Path(tempfile.mkdtemp(prefix="lamplight-dl-"))
    small = work / "small.gguf"
    with model.open("rb") as src:
        small.write_bytes(src.read(model.stat().st_size // 10))
    proc, url = serve([model, small])
    slow_proc, slow_url = serve([model], args.rate)
    os.environ.update(
        HF_ENDPOINT=url,
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HOME=str(work / "hf-home"),
    )
    try:
        from huggingface_hub import hf_hub_download

        from app.models.download_control import Control
        from app.models.downloader import FileFetcher

        sizes = {p.name: p.stat().st_size for p in (model, small)}
        shas = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (model, small)}

        def app_download(endpoint: str, name: str, dest: Path) -> float:
            t = time.perf_counter()
            FileFetcher(endpoint=endpoint).fetch(
                REPO, name, dest, sizes[name], shas[name], Control.new()
            )
            dt = time.perf_counter() - t
            dest.unlink()
            return sizes[name] / 1e6 / dt

        def hf_download(endpoint: str, cache: Path) -> float:
            t = time.perf_counter()
            path = hf_hub_download(REPO, model.name, endpoint=endpoint, cache_dir=str(cache))
            dt = time.perf_counter() - t
            Path(path).resolve().unlink()
            return sizes[model.name] / 1e6 / dt

        app_rates, hf_rates, growth = [], [], {"big": 0.0, "small": 0.0}
        peak_rss = 0.0
        for i in range(args.rounds):
            for label, name in (("big", model.name), ("small", small.name)):
                with PeakRss() as mem:
                    rate = app_download(url, name, work / f"app-{i}" / name)
                growth[label] = max(growth[label], mem.peak - mem.start)
                peak_rss = max(peak_rss, mem.peak)
                if label == "big":
                    app_rates.append(rate)
            hf_rates.append(hf_download(url, work / f"hf-{i}"))
        slow_app, slow_hf = [], []
        for i in range(args.throttled_rounds):
            slow_app.append(app_download(slow_url, model.name, work / f"slow-app-{i}" / model.name))
            slow_hf.append(hf_download(slow_url, work / f"slow-hf-{i}"))
        app = statistics.median(app_rates)
        hf = statistics.median(hf_rates)
        s_app, s_hf = statistics.median(slow_app), statistics.median(slow_hf)
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
                    "throttled": {
                        "link_mb_s": round(args.rate / 1e6, 1),
                        "app_mb_s": round(s_app, 1),
                        "hf_mb_s": round(s_hf, 1),
                        "ratio": round(s_app / s_hf, 3),
                        "rounds": args.throttled_rounds,
                        "app_rounds": [round(r, 1) for r in slow_app],
                        "hf_rounds": [round(r, 1) for r in slow_hf],
                    },
                    "verified": "sha256 while downloading (app); size only (hf_hub_download)",
                }
            )
        )
    finally:
        for p in (proc, slow_proc):
            p.terminate()
            p.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
