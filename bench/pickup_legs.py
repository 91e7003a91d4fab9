"""Where pickup latency goes: the legs from a producer's enqueue to the handler's first byte, and what a
bare round trip to Redis costs on this machine when the processes had been idle.

    .venv/bin/python bench/pickup_legs.py [--jobs 200]

The pickup figure of `make bench` (enqueue -> HTTP handler sees the request, jobs 10 ms apart on an idle
daemon) is split with Redis's own clock: a MONITOR connection records when each script ran, so every job
gives three legs:

- start -> enqueue ran: the producer's work and its request reaching Redis;
- enqueue ran -> lease ran: Redis ending the daemon's blocked wait and running the lease queued behind
  it (ADR 0005; before it, the wake reaching the daemon and its lease call reaching Redis);
- lease ran -> handler: the lease reply, the daemon's work and the HTTP request reaching the handler.

Beside them, PING round trips back to back and 10 ms apart: on a virtual machine a process that went
idle takes a while to wake, and every leg above wakes at least one process. MONITOR slows Redis a
little; the legs are for proportions, `make bench` gives the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
import redis.asyncio
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import RedisServer, find_server_binary

from daemon import PAYLOAD, recording_daemon  # bench/daemon.py
from jobcar import AsyncClient
from jobcar.scripts import script

GAP = 0.01  # seconds between jobs, as in make bench's pickup figure


class ScriptLog:
    """(Redis time, script SHA, command text) of every EVALSHA, from a MONITOR connection in a thread."""

    def __init__(self, url: str) -> None:
        self.entries: list[tuple[float, str, str]] = []
        self._client = redis.Redis.from_url(url)
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> ScriptLog:
        self._thread.start()
        time.sleep(0.2)  # MONITOR is on before the first job
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def _follow(self) -> None:
        # Closing the client from __exit__ ends listen() with a connection error: the expected way out.
        with contextlib.suppress(redis.ConnectionError, OSError, ValueError), self._client.monitor() as monitor:
            for entry in monitor.listen():
                parts = entry["command"].split(" ", 3)
                if parts[0] == "EVALSHA":
                    self.entries.append((float(entry["time"]), parts[1], entry["command"]))


async def pickups(server: RedisServer, tmp: Path, jobs: int) -> tuple[dict[str, float], dict[str, float]]:
    """({job id: enqueue start}, {job id: handler arrival}), both Unix time (as MONITOR's), jobs GAP apart."""
    async with (
        recording_daemon(server, tmp, clock=time.time) as (namespace, arrivals),
        AsyncClient.from_url(server.url, namespace=namespace) as client,
    ):
        await client.enqueue("lat", None)  # warm the connections
        await asyncio.sleep(0.5)
        sent: dict[str, float] = {}
        for _ in range(jobs):
            started = time.time()
            sent[(await client.enqueue("lat", PAYLOAD)).id] = started
            await asyncio.sleep(GAP)
        deadline = time.monotonic() + 30
        while not sent.keys() <= arrivals.keys() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    return sent, arrivals


async def ping_round_trips(url: str, gap: float, count: int = 200) -> list[float]:
    client = redis.asyncio.Redis.from_url(url)
    try:
        await client.ping()
        times = []
        for _ in range(count):
            started = time.perf_counter()
            await client.ping()
            times.append((time.perf_counter() - started) * 1000)
            if gap:
                await asyncio.sleep(gap)
        return times
    finally:
        await client.aclose()


def legs(
    sent: dict[str, float], arrivals: dict[str, float], scripts: list[tuple[float, str, str]]
) -> list[list[float]]:
    """Per job: [start -> enqueue ran, enqueue ran -> lease ran, lease ran -> handler, total], in ms. Scripts
    are told apart by their SHA; a job's lease is the first lease after its enqueue."""
    enqueue_sha, lease_sha = script("enqueue").sha, script("lease").sha
    enqueues = [(t, text) for t, sha, text in scripts if sha == enqueue_sha]
    leases = sorted(t for t, sha, _ in scripts if sha == lease_sha)
    rows = []
    for job_id, started in sent.items():
        enqueued = next((t for t, text in enqueues if f" {job_id} " in text), None)
        if enqueued is None or job_id not in arrivals:
            continue
        leased = next((t for t in leases if t > enqueued), None)
        if leased is None:
            continue
        arrived = arrivals[job_id]
        rows.append([(enqueued - started) * 1000, (leased - enqueued) * 1000, (arrived - leased) * 1000,
                     (arrived - started) * 1000])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        server = RedisServer(find_server_binary(), tmp / "redis").start()
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                busy = runner.run(ping_round_trips(server.url, 0))
                idle = runner.run(ping_round_trips(server.url, GAP))
                with ScriptLog(server.url) as log:
                    sent, arrivals = runner.run(pickups(server, tmp, args.jobs))
        finally:
            server.stop()
    rows = legs(sent, arrivals, log.entries)
    if not rows:
        raise SystemExit("no job could be matched to its scripts")
    names = ["start -> enqueue ran", "enqueue ran -> lease ran", "lease ran -> handler", "pickup (total)"]
    print(f"{len(rows)} of {args.jobs} jobs, {GAP * 1000:.0f} ms apart; medians / p90, ms (Redis clock for the legs)")
    for name, column in zip(names, zip(*rows, strict=True), strict=True):
        ordered = sorted(column)
        print(f"  {name:<26}{statistics.median(ordered):7.3f}{ordered[int(len(ordered) * 0.9)]:8.3f}")
    for name, times in (("PING back to back", busy), (f"PING {GAP * 1000:.0f} ms apart", idle)):
        ordered = sorted(times)
        print(f"  {name:<26}{statistics.median(ordered):7.3f}{ordered[int(len(ordered) * 0.9)]:8.3f}")


if __name__ == "__main__":
    main()
