"""Where a single enqueue's time goes: the producer's CPU and Redis's, beside a bare LPUSH and the floor script.

    .venv/bin/python bench/enqueue_cost.py [--jobs 10000] [--runs 2]

Runs the three one-call-at-a-time scenarios of bench/enqueue.py (jobcar's `enqueue`, the floor script
doing only HSET + LPUSH, a bare LPUSH) in alternation and prints, per call: wall time, the producer's
CPU (`time.process_time`, system calls included) and Redis's time in commands (`INFO commandstats`,
reset before each scenario; a script's total includes the commands it calls).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import RedisServer, find_server_binary

from enqueue import single_enqueue, single_floor_script, single_lpush  # bench/enqueue.py

_SCENARIOS = (("jobcar enqueue", single_enqueue), ("floor script", single_floor_script), ("LPUSH", single_lpush))
_HOUSEKEEPING = {"cmdstat_flushall", "cmdstat_config|resetstat", "cmdstat_info"}


def redis_usec(client: redis.Redis) -> tuple[float, dict[str, float]]:
    """Total µs Redis spent in commands since the last reset, and each command's µs per call."""
    stats = {name: value for name, value in client.info("commandstats").items() if name not in _HOUSEKEEPING}
    per_call = {name.removeprefix("cmdstat_"): value["usec_per_call"] for name, value in stats.items()}
    return sum(value["usec"] for value in stats.values()), per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(find_server_binary(), Path(directory) / "redis").start()
        try:
            with server.client() as client:
                for run in range(1, args.runs + 1):
                    for name, scenario in _SCENARIOS:
                        client.flushall()
                        client.config_resetstat()
                        wall, cpu = time.perf_counter(), time.process_time()
                        scenario(client, args.jobs)
                        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                        total, per_call = redis_usec(client)
                        commands = ", ".join(f"{command} {usec:.1f}" for command, usec in sorted(per_call.items()))
                        print(f"run {run}, {name}: wall {wall / args.jobs * 1e6:.1f} µs, producer CPU "
                              f"{cpu / args.jobs * 1e6:.1f} µs, Redis {total / args.jobs:.1f} µs "
                              f"(µs per call: {commands})", flush=True)  # fmt: skip
        finally:
            server.stop()


if __name__ == "__main__":
    main()
