"""What a run_once (claim + settle, the effect a no-op, fresh keys, one
caller) costs from Python, with the baselines its targets are set against,
measured in the same run (docs/performance.md, "What an SDK call costs"):

- ``local_memory``: ``settle_local.LocalLedger()`` (target: >= 10,000
  pairs/s and p50 <= 100 us);
- ``local_disk``: ``LocalLedger(data=DIR)``, against ``settle_bench_disk``:
  ``settle bench --data DIR --connections 1`` (the same engine and segment
  size, no Python), in alternating rounds, each on a new directory
  (target: within 1.3x); ``local_disk_floor``: the same two calls with
  hand-made bodies straight into the native ledger (no SDK), in the same
  rounds: what any Python caller pays at least;
- ``http``: ``run_once`` on a ``Client`` to ``settle serve`` on loopback,
  against ``http_raw``: the same two requests (the same bodies) sent by the
  same HTTP client (httpx) to the same server, in alternating rounds
  (target: within 1.3x).

    python sdk/python-local/bench.py [--pairs N] [--rounds R]   # JSON on stdout

Each mode runs R rounds of N pairs after a warm-up of 200 pairs and
reports the median round. Needs settle-client and settle-local installed,
and the settle binary ($SETTLE_BIN, else settle on PATH)."""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from settle_client import Binding, Client, Done, fingerprint, new_claim_id, run_once
from settle_client.testing import settle_binary, start_settle
from settle_local import LocalLedger

REQUEST = {"amount": 1}
RESULT = {"ok": True}
SEGMENT_BYTES = 4 * 1024 * 1024  # LocalLedger's default


def round_of(pair: Callable[[str], None], pairs: int) -> dict[str, float]:
    lat: list[float] = []
    t0 = time.perf_counter()
    for _ in range(pairs):
        t = time.perf_counter()
        pair(uuid.uuid4().hex)
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    lat.sort()
    return {
        "pairs_per_s": round(pairs / wall, 1),
        "p50_us": round(lat[len(lat) // 2] * 1e6, 1),
        "p99_us": round(lat[int(len(lat) * 0.99) - 1] * 1e6, 1),
    }


def median_round(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """The round with the median pairs/s, and every round's figure."""
    best = sorted(rounds, key=lambda r: r["pairs_per_s"])[len(rounds) // 2]
    return {**best, "rounds_pairs_per_s": [r["pairs_per_s"] for r in rounds]}


def sdk_pair(client: Client) -> Callable[[str], None]:
    def pair(key: str) -> None:
        run_once(client, key, REQUEST, lambda ctx: Done(RESULT), principal="bench")

    return pair


def hand_made_pair(send: Callable[[str, bytes], tuple[int, bytes]]) -> Callable[[str], None]:
    """The two calls run_once makes, with the same bodies made by hand;
    ``send(path, body)`` answers ``(status, body)``."""
    fp = fingerprint(REQUEST)
    binding = Binding("bench").to_json()
    outcome = {
        "status": "completed",
        "result": RESULT,
        "response_sha256": hashlib.sha256(b'{"ok":true}').hexdigest(),
    }

    def pair(key: str) -> None:
        claim = {"fingerprint": fp, "binding": binding, "claim_id": new_claim_id()}
        _, body = send(f"/v1/operations/{key}/claim", json.dumps(claim, separators=(",", ":")).encode())
        settle = {"fence": json.loads(body)["fence"], "fingerprint": fp, "binding": binding, "outcome": outcome}
        status, body = send(f"/v1/operations/{key}/settle", json.dumps(settle, separators=(",", ":")).encode())
        assert status == 200, body

    return pair


def raw_pair(url: str) -> tuple[Callable[[str], None], httpx.Client]:
    """The two requests run_once sends, with the same bodies, by httpx."""
    http = httpx.Client(base_url=url, headers={"content-type": "application/json", "accept": "application/json"})

    def send(path: str, body: bytes) -> tuple[int, bytes]:
        r = http.post(path, content=body)
        return r.status_code, r.content

    return hand_made_pair(send), http


def floor_pair(ledger: LocalLedger) -> Callable[[str], None]:
    """The same two calls straight into the native ledger (no SDK): what
    any Python caller of local mode pays at least."""
    native = ledger._native

    def send(path: str, body: bytes) -> tuple[int, bytes]:
        status, answer, _ = native.exchange("POST", path, [], body)
        return status, answer

    return hand_made_pair(send)


def measure(pair: Callable[[str], None], pairs: int, rounds: int) -> dict[str, Any]:
    for _ in range(200):
        pair(uuid.uuid4().hex)
    return median_round([round_of(pair, pairs) for _ in range(rounds)])


def settle_bench_round(data: Path, seconds: float) -> dict[str, float]:
    """One run of ``settle bench --data`` on a new directory."""
    out = subprocess.run(
        [settle_binary(), "bench", "--data", str(data), "--connections", "1"]
        + ["--duration", str(seconds), "--segment-bytes", str(SEGMENT_BYTES), "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"pairs_per_s": round(r["pairs_per_s"], 1), "p50_us": round(r["p50_ms"] * 1000, 1), "p99_us": round(r["p99_ms"] * 1000, 1)}


def disk_rounds(tmp: Path, pairs: int, rounds: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``local_disk``, ``local_disk_floor`` and ``settle_bench_disk`` in
    alternating rounds, each on a new directory (the same starting state for both, and drift in the
    disk's fsync rate hits both)."""
    local, floor, bench = [], [], []
    for i in range(rounds):
        with LocalLedger(data=str(tmp / f"local{i}")) as disk:
            pair = sdk_pair(disk)
            for _ in range(200):
                pair(uuid.uuid4().hex)
            local.append(round_of(pair, pairs))
        with LocalLedger(data=str(tmp / f"floor{i}")) as disk:
            pair = floor_pair(disk)
            for _ in range(200):
                pair(uuid.uuid4().hex)
            floor.append(round_of(pair, pairs))
        # As long as the local round took.
        seconds = max(1.0, pairs / max(local[-1]["pairs_per_s"], 1.0))
        bench.append(settle_bench_round(tmp / f"bench{i}", round(seconds, 1)))
    return median_round(local), median_round(floor), median_round(bench)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3000, help="pairs per round (default 3000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per mode; the median is reported (default 3)")
    a = ap.parse_args()
    out: dict[str, Any] = {"language": "python", "python": platform.python_version(), "pairs": a.pairs, "rounds": a.rounds}
    modes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with LocalLedger() as mem:
            modes["local_memory"] = measure(sdk_pair(mem), a.pairs, a.rounds)
        modes["local_disk"], modes["local_disk_floor"], modes["settle_bench_disk"] = disk_rounds(
            Path(tmp), a.pairs, a.rounds
        )
        server = start_settle(Path(tmp) / "http")
        try:
            client = server.client()
            raw, http = raw_pair(server.url)
            sdk = sdk_pair(client)
            for _ in range(200):
                sdk(uuid.uuid4().hex)
                raw(uuid.uuid4().hex)
            sdk_rounds, raw_rounds = [], []
            for _ in range(a.rounds):  # alternating, so that drift hits both
                raw_rounds.append(round_of(raw, a.pairs))
                sdk_rounds.append(round_of(sdk, a.pairs))
            modes["http"] = median_round(sdk_rounds)
            modes["http_raw"] = median_round(raw_rounds)
            http.close()
        finally:
            server.stop()
    mem_r, disk_r, http_r = modes["local_memory"], modes["local_disk"], modes["http"]
    disk_ratio = modes["settle_bench_disk"]["pairs_per_s"] / disk_r["pairs_per_s"]
    http_ratio = modes["http_raw"]["pairs_per_s"] / http_r["pairs_per_s"]
    out["modes"] = modes
    out["targets"] = {
        "local_memory_pairs_per_s>=10000": mem_r["pairs_per_s"] >= 10_000,
        "local_memory_p50_us<=100": mem_r["p50_us"] <= 100,
        "local_disk_within_1.3x_of_settle_bench": round(disk_ratio, 2) <= 1.3,
        "http_within_1.3x_of_raw": round(http_ratio, 2) <= 1.3,
    }
    out["ratios"] = {
        "settle_bench_disk/local_disk": round(disk_ratio, 2),
        "settle_bench_disk/local_disk_floor": round(
            modes["settle_bench_disk"]["pairs_per_s"] / modes["local_disk_floor"]["pairs_per_s"], 2
        ),
        "http_raw/http": round(http_ratio, 2),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
