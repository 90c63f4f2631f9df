"""The cost of one run_once (claim + settle, the effect a no-op) from
Python: settle_local.LocalLedger in memory and on a directory, against
`settle serve` over HTTP on loopback (the same embedded engine).

    python sdk/python-local/bench.py [--pairs N] [--threads T]   # JSON on stdout

Needs settle-client and settle-local installed, and for the HTTP row the
binary ($SETTLE_BIN, else settle on PATH). Each mode runs T threads, each
doing N/T pairs on fresh keys, after a warm-up of 50 pairs."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from settle_client import Client, Done, run_once
from settle_client.testing import start_settle
from settle_local import LocalLedger


def measure(client: Client, pairs: int, threads: int) -> dict[str, Any]:
    def one() -> float:
        t0 = time.perf_counter()
        run_once(client, uuid.uuid4().hex, {"amount": 1}, lambda ctx: Done({"ok": True}), principal="bench")
        return time.perf_counter() - t0

    for _ in range(50):
        one()
    lat: list[float] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        mine = [one() for _ in range(n)]
        with lock:
            lat.extend(mine)

    per = pairs // threads
    ts = [threading.Thread(target=worker, args=(per,)) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    return {
        "pairs": len(lat),
        "threads": threads,
        "pairs_per_s": round(len(lat) / wall, 1),
        "p50_us": round(statistics.median(lat) * 1e6, 1),
        "p99_us": round(lat[int(len(lat) * 0.99) - 1] * 1e6, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    out: dict[str, Any] = {"language": "python", "python": platform.python_version(), "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        with LocalLedger() as mem:
            out["modes"]["local_memory"] = measure(mem, a.pairs, a.threads)
        with LocalLedger(data=str(Path(tmp) / "local")) as disk:
            out["modes"]["local_disk"] = measure(disk, a.pairs, a.threads)
        server = start_settle(Path(tmp) / "http")
        try:
            out["modes"]["http_disk"] = measure(server.client(), a.pairs, a.threads)
        finally:
            server.stop()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
