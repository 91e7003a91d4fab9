"""Single-enqueue throughput with and without the per-job options (priority, start deadline, unique window,
debounce), and the plain path beside the same path before those options existed.

    .venv/bin/python bench/enqueue_options.py [--jobs 5000] [--runs 3] [--base 83b6af7]

Each scenario runs in a fresh process of its own, one `Client.enqueue` round trip at a time, against one
server; scenarios alternate within each run. The `before` scenario runs the same plain enqueue from a
checkout of --base (a `git worktree` made and removed here, put first on PYTHONPATH), so its client and
its enqueue script are the old ones. Prints the median jobs/s of each and its ratio to `plain`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}

#: scenario -> the enqueue options of its n-th job (fresh keys where a key would dedupe).
SCENARIOS = {
    "plain": lambda n: {},
    "priority=5": lambda n: {"priority": 5},
    "expires_in=1h": lambda n: {"expires_in": 3600},
    "unique window": lambda n: {"unique_for": 60, "unique_key": f"k{n}", "unique_mode": "window"},
    "debounce, new key": lambda n: {"debounce": 5, "debounce_key": f"k{n}"},
    "debounce, one key": lambda n: {"debounce": 5, "debounce_key": "same"},
}


def worker(scenario: str, url: str, jobs: int) -> None:
    """In the child: enqueue `jobs` jobs one at a time; print jobs/s."""
    import redis

    from jobcar import Client

    options = SCENARIOS["plain" if scenario == "before" else scenario]
    with redis.Redis.from_url(url) as client:
        producer = Client(client, namespace=f"b{uuid.uuid4().hex[:8]}")
        producer.enqueue("warm.up", PAYLOAD)
        started = time.perf_counter()
        for n in range(jobs):
            producer.enqueue("email.welcome", PAYLOAD, **options(n))
        print(jobs / (time.perf_counter() - started))


def measure(scenario: str, url: str, jobs: int, base: Path) -> float:
    env = dict(os.environ)
    if scenario == "before":
        env["PYTHONPATH"] = str(base / "daemon")
    argv = [sys.executable, __file__, "--worker", scenario, url, str(jobs)]
    return float(subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    from tests.servers import RedisServer, find_server_binary

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base", default="83b6af7", help="the commit before the options")
    args = parser.parse_args()
    binary = find_server_binary()
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        base = tmp / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base], check=True)
        server = RedisServer(binary, tmp / "redis").start()
        try:
            for _ in range(args.runs):
                for scenario in ("before", *SCENARIOS):
                    figures.setdefault(scenario, []).append(measure(scenario, server.url, args.jobs, base))
            with server.client() as c:
                version = c.info("server").get("redis_version")
        finally:
            server.stop()
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True)
    plain = statistics.median(figures["plain"])
    print(f"server {binary} {version}, Python {platform.python_version()}, {args.jobs} single enqueues per "
          f"scenario and run, medians of {args.runs} (min-max); before = {args.base}")  # fmt: skip
    print(f"{'scenario':<22}{'jobs/s':>24}{'vs plain':>10}")
    for scenario, values in figures.items():
        median = statistics.median(values)
        cell = f"{median:,.0f} ({min(values):,.0f}-{max(values):,.0f})"
        print(f"{scenario:<22}{cell:>24}{median / plain:>10.2f}")


if __name__ == "__main__":
    main()
