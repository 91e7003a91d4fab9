"""What do fleet-wide limits cost when they do not bind, how fair are they, and how exact is a rate?

    .venv/bin/python bench/limits.py [--jobs 20000] [--runs 3]

Throughput: each round enqueues --jobs jobs of one type into a paused queue, spread over 100 tenants
(`meta.tenant`), starts a `jobcar run` (concurrency 50, the no-op HTTP app as its handler), resumes the
queue and times until every job is done. Once without `limits`, once with limits that never bind
(`concurrency: 100000, per_key: 100000, key: meta.tenant`: every job takes a slot of its type's and its
key's and gives it back). Rounds alternate; medians of --runs, and the median of each pair's ratio (a pair
runs back to back, so a slow spell of the machine weighs on both of its rounds). Which round of a pair goes
first alternates too: a second round that runs faster or slower than a first (a warm server, a growing heap)
favours neither. Each round also reads the CPU that the daemon, Redis and the handler spent per job
(bench/cpu_per_job.py): what limits add shows there as Redis's work, steadier than throughput on a shared
machine.

Fairness: tenant a enqueues 10,000 jobs, then tenant b 20, of a type with `per_key: 2`, then of one with
`concurrency: 10, fair: true`; a daemon runs them (results kept, so each job's `finished` time can be
read) until b's are done. Prints how many of a's jobs finished before b's last one (FIFO would be all
10,000).

Rate accuracy: three daemons share `rate: 50/s, burst: 5` for 20 s; prints the starts per second after the
burst and the most starts in any one second (GCRA allows at most 55), from the lease times in Redis.
"""

from __future__ import annotations

import argparse
import bisect
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, find_server_binary, wait_for

import jobcar
from cpu_per_job import measured_drain  # bench/cpu_per_job.py
from jobcar import Client, transitions, transport
from jobcar.keys import QueueKeys
from noop_app import serving

UNBINDING = {"concurrency": 100_000, "per_key": 100_000, "key": "meta.tenant"}
TENANTS = 100


#: The processes whose CPU per job a throughput round reads.
PROCESSES = ("daemon", "redis", "handler")


def throughput(
    server: RedisServer, tmp: Path, url: str, handler_pid: int, jobs: int, limits: dict[str, Any] | None
) -> tuple[float, dict[str, float]]:
    """Jobs/s of one round, and µs of CPU per job by process."""
    namespace = f"b{time.monotonic_ns()}"
    keys = QueueKeys.of(namespace, "default")
    handler: dict[str, Any] = {"url": url, **({"limits": limits} if limits else {})}
    config = write_config(tmp, server.url, namespace, {"bench": handler}, concurrency=50, log_level="info",
                          lease="30s")  # fmt: skip
    with server.client() as client:
        client.flushdb()
        transport.execute(client, [transitions.pause_call(keys, True)])
        Client(client, namespace=namespace).enqueue_many(
            [("bench", {"n": n}, {"meta": {"tenant": f"t{n % TENANTS}"}}) for n in range(jobs)]
        )
        daemon = DaemonProcess(config).start()
        assert server.process is not None
        pids = dict(zip(PROCESSES, (daemon.pid, server.process.pid, handler_pid), strict=True))
        try:
            elapsed, used = measured_drain(client, keys, pids, jobs)
        finally:
            daemon.stop()
        client.flushdb()
    return jobs / elapsed, used


#: The two ways to be fair: a cap per tenant, and tenants taking turns for the type's slots.
FAIRNESS = {"per_key 2": {"per_key": 2, "key": "meta.tenant"},
            "fair, concurrency 10": {"concurrency": 10, "fair": True, "key": "meta.tenant"}}  # fmt: skip


def fairness(server: RedisServer, tmp: Path, url: str, limits: dict[str, Any]) -> int:
    namespace = f"f{time.monotonic_ns()}"
    handler = {"url": url, "limits": limits}
    config = write_config(tmp, server.url, namespace, {"bench": handler}, concurrency=10, log_level="info",
                          result_ttl="1h")  # fmt: skip
    keys = QueueKeys.of(namespace, "default")
    with server.client() as client:
        client.flushdb()
        producer = Client(client, namespace=namespace)
        a = [i.id for i in producer.enqueue_many([("bench", n, {"meta": {"tenant": "a"}}) for n in range(10_000)])]
        b = [i.id for i in producer.enqueue_many([("bench", n, {"meta": {"tenant": "b"}}) for n in range(20)])]
        daemon = DaemonProcess(config).start()
        try:
            wait_for(lambda: all(client.hget(keys.job(i), "state") == b"done" for i in b), timeout=120, what="b")
        finally:
            daemon.stop()
        b_last = max(int(client.hget(keys.job(i), "finished")) for i in b)  # type: ignore[arg-type]
        pipe = client.pipeline(transaction=False)
        for job_id in a:
            pipe.hget(keys.job(job_id), "finished")
        a_before = sum(1 for f in pipe.execute() if f is not None and int(f) <= b_last)
        client.flushdb()
    return a_before


def rate_accuracy(server: RedisServer, tmp: Path, url: str, rate: int = 50, burst: int = 5,
                  seconds: int = 20) -> tuple[float, int]:  # fmt: skip
    """Three daemons under `rate: <rate>/s, burst: <burst>` for `seconds`: the starts per second after the
    burst, and the most starts in any one second, from the lease times in Redis."""
    namespace = f"r{time.monotonic_ns()}"
    handler = {"url": url, "limits": {"rate": f"{rate}/s", "burst": burst}}
    config = write_config(tmp, server.url, namespace, {"bench": handler}, log_level="info", result_ttl="1h")
    keys = QueueKeys.of(namespace, "default")
    with server.client() as client:
        client.flushdb()
        producer = Client(client, namespace=namespace)
        ids = [info.id for info in producer.enqueue_many([("bench", n) for n in range(rate * seconds * 2)])]
        daemons = [DaemonProcess(config).start() for _ in range(3)]
        try:
            clock = QueueDriver(client, namespace)
            first = clock.now_ms()
            wait_for(lambda: clock.now_ms() - first >= seconds * 1000, timeout=seconds + 60, what="the period")
        finally:
            for daemon in daemons:
                daemon.stop()
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(keys.job(job_id), "started")
        starts = sorted(int(s) for s in pipe.execute() if s is not None)
        client.flushdb()
    span = (starts[-1] - starts[0]) / 1000
    densest = max(bisect.bisect_left(starts, t + 1000) - n for n, t in enumerate(starts))
    return (len(starts) - burst) / span, densest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--limits", type=json.loads, default=UNBINDING, help="the handler's limits, as JSON")
    args = parser.parse_args()
    binary = find_server_binary()
    figures: dict[str, list[float]] = {"none": [], "unbinding": []}
    cpu: dict[str, list[dict[str, float]]] = {"none": [], "unbinding": []}
    with tempfile.TemporaryDirectory() as directory, serving() as app:
        tmp = Path(directory)
        server = RedisServer(binary, tmp / "redis").start()
        try:
            url = f"{app.url}/noop"
            modes: list[tuple[str, dict[str, Any] | None]] = [("none", None), ("unbinding", args.limits)]
            for run in range(args.runs):
                for name, limits in modes if run % 2 == 0 else modes[::-1]:
                    rate, used = throughput(server, tmp, url, app.pid, args.jobs, limits)
                    figures[name].append(rate)
                    cpu[name].append(used)
                    per_job = ", ".join(f"{process} {used[process]:.1f}" for process in PROCESSES)
                    print(f"  limits {name}: {rate:,.0f} jobs/s; CPU µs per job: {per_job}", flush=True)
            fair = {name: fairness(server, tmp, url, limits) for name, limits in FAIRNESS.items()}
            rated, densest = rate_accuracy(server, tmp, url)
            with server.client() as c:
                version = c.info("server").get("redis_version")
        finally:
            server.stop()
    print(
        f"jobcar {jobcar.__version__}, server {binary} {version}, Python {platform.python_version()}, "
        f"{args.jobs} jobs per round over {TENANTS} tenants, medians of {args.runs} (min-max)"
    )
    print(f"limits: {json.dumps(args.limits)}")
    for name, label in (("none", "no limits"), ("unbinding", "limits that never bind")):
        v = figures[name]
        print(f"{label:<26}{statistics.median(v):>10,.0f} jobs/s ({min(v):,.0f}-{max(v):,.0f})")
    ratio = statistics.median(figures["unbinding"]) / statistics.median(figures["none"])
    pairs = [u / n for u, n in zip(figures["unbinding"], figures["none"], strict=True)]
    print(f"{'ratio of the medians':<26}{ratio:>10.2f}")
    print(f"{'median ratio of a pair':<26}{statistics.median(pairs):>10.2f} ({min(pairs):.2f}-{max(pairs):.2f})")
    for name, label in (("none", "no limits"), ("unbinding", "limits that never bind")):
        medians = ", ".join(f"{p} {statistics.median(u[p] for u in cpu[name]):.1f}" for p in PROCESSES)
        print(f"CPU µs per job, {label} (medians): {medians}")
    for name, ran in fair.items():
        print(f"fairness ({name}): {ran} of tenant a's 10,000 jobs finished before tenant b's 20 had (FIFO: 10,000)")
    print(
        f"rate 50/s, burst 5, 3 daemons, 20 s: {rated:.1f} starts/s after the burst ({rated / 50:.3f}x), "
        f"{densest} in the densest second (bound 55)"
    )


if __name__ == "__main__":
    main()
