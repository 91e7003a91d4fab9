"""Tick lateness of a schedule fired by three daemons: from the tick to its job being stored, in Redis time.

    .venv/bin/python bench/schedules.py [--seconds 20] [--runs 3]

Each run starts three `jobcar run` processes on one config with an `every: 1s` schedule whose jobs run
/bin/true and are kept (`result_ttl`), so that each job's hash still holds `created` (Redis time when
`schedule_fire` stored it) and `scheduled_at` (the tick). Lateness is `created - scheduled_at`. Also
checks that every tick of the run fired once. Prints p50 and p99 per run, and their medians over the runs.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary

import jobcar
from jobcar.keys import QueueKeys


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def run(server: RedisServer, tmp: Path, seconds: float) -> list[float]:
    namespace = f"b{time.monotonic_ns()}"
    config = write_config(tmp, server.url, namespace, {"tick": {"command": ["/bin/true"]}}, log_level="info",
                          result_ttl="1h", schedules={"beat": {"every": "1s", "type": "tick"}})  # fmt: skip
    daemons = [DaemonProcess(config).start() for _ in range(3)]
    try:
        time.sleep(seconds)  # a benchmark's measuring period: the ticks come at their own pace
    finally:
        for daemon in daemons:
            daemon.stop()
    keys = QueueKeys.of(namespace, "default")
    lateness, ticks = [], []
    with server.client() as client:
        for key in client.scan_iter(match=keys.all_jobs()):
            created, tick = client.hmget(key, "created", "scheduled_at")
            if tick is not None:
                lateness.append(int(created) - int(tick))
                ticks.append(int(tick))
    ticks.sort()
    if ticks != list(range(ticks[0], ticks[-1] + 1000, 1000)):
        raise RuntimeError(f"ticks missing or fired twice: {ticks}")
    return lateness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    binary = find_server_binary()
    p50s, p99s = [], []
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        server = RedisServer(binary, tmp / "redis").start()
        try:
            for n in range(args.runs):
                lateness = run(server, tmp, args.seconds)
                p50s.append(percentile(lateness, 0.5))
                p99s.append(percentile(lateness, 0.99))
                print(f"  run {n + 1}: {len(lateness)} ticks, lateness p50 {p50s[-1]:.0f} ms, p99 {p99s[-1]:.0f} ms, "
                      f"max {max(lateness):.0f} ms", flush=True)  # fmt: skip
            with server.client() as c:
                version = c.info("server").get("redis_version")
        finally:
            server.stop()
    print(
        f"jobcar {jobcar.__version__}, server {binary} {version}, Python {platform.python_version()}, "
        f"3 daemons, every: 1s, {args.seconds:g} s per run, medians of {args.runs}"
    )
    print(f"tick lateness p50 {statistics.median(p50s):.0f} ms, p99 {statistics.median(p99s):.0f} ms")


if __name__ == "__main__":
    main()
