"""What tracing costs the daemon (issue 36): the nginx no-op backlog of bench/ab.py, interleaved in one run, for
three sides: a base commit (before tracing), a commit with tracing (HERE_REV, HEAD unless given; WORKTREE for
this checkout as it is on disk) with tracing off, and the same with tracing on.

    .venv/bin/python bench/tracing_cost.py BASE_REV [HERE_REV] [--rounds 5] [--jobs 20000] [--ratio 1.0]

Each measurement is bench/ab.py's `backlog` figure, run by ab.py's own child code (the backlog enqueued into a
paused queue, one `jobcar run` started and ready, then the time from the resume until the queue is empty,
against nginx's `return 204;`), in a child process whose PYTHONPATH is that side's daemon/. The side "on"
adds `tracing: {enabled: true, sampling_ratio: RATIO}` to the daemon's config, exporting over OTLP/HTTP to
the same nginx (`return 204;` takes the POSTs of /v1/traces, so the export's whole client side runs: the
SDK's batch processor, the protobuf encoding, the HTTP request). The backlog is enqueued by a producer that
does not trace (it loaded no OpenTelemetry SDK), so each job makes two spans in the daemon: its attempt's
consumer span and its handler call's client span. The side order rotates every round.

Besides jobs/s, the daemon's CPU per job (user + system of all its threads, /proc, from the resume to the
drained queue): on a loaded machine throughput swings with what else runs, the CPU a job costs much less.
Prints each measurement as it lands (stderr), then a table: side | median jobs/s | ratio to the base | median
CPU µs per job | the base's CPU / the side's (the throughput one core would give, relative to the base).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis

import ab  # bench/ab.py: its child does the measurement, its parent helpers the checkouts
from nginx import Nginx, nginx_version  # bench/nginx.py

CHILD = "_tracing_child"
#: The environment variable that tells the child to turn tracing on: the OTLP endpoint and the ratio.
TRACING_ENV = "JOBCAR_BENCH_TRACING"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and all its threads so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(argv: list[str]) -> None:
    """ab.py's backlog measurement, the daemon's config given a `tracing` section when TRACING_ENV is set; then
    the daemon's CPU (every thread of it: the span exporter's too) from the resume to the drained queue."""
    drained = ab.wait_drained
    spent: list[float] = []

    def timed(client: Any, prefix: str, daemon: subprocess.Popen[bytes], log: Path) -> None:
        before = _cpu_seconds(daemon.pid)
        drained(client, prefix, daemon, log)
        spent.append(_cpu_seconds(daemon.pid) - before)

    ab.wait_drained = timed
    wanted = os.environ.get(TRACING_ENV)
    if wanted:
        endpoint, ratio = wanted.rsplit(" ", 1)
        plain = ab.write_config

        def with_tracing(*args: Any) -> Path:
            path = plain(*args)
            config = json.loads(path.read_text())
            config["tracing"] = {"enabled": True, "endpoint": endpoint, "sampling_ratio": float(ratio)}
            path.write_text(json.dumps(config, indent=2))
            return path

        ab.write_config = with_tracing
    ab.child(argv)
    print(json.dumps({"daemon_cpu_s": spent[0]}))


def main() -> None:
    if sys.argv[1:2] == [CHILD]:
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", metavar="BASE_REV", help="the commit before tracing (a git rev)")
    parser.add_argument("here", metavar="HERE_REV", nargs="?", default="HEAD", help=f"a git rev or {ab.WORKTREE}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--ratio", type=float, default=1.0, help="sampling_ratio of the side with tracing on")
    args = parser.parse_args()
    args.enqueues = 1  # ab.measure's figure table reads it; the enqueue figure is not measured here
    figure = ab.FIGURES[0]
    assert figure.key == "backlog"
    values: dict[str, list[float]] = {"base": [], "off": [], "on": []}
    cpu: dict[str, list[float]] = {"base": [], "off": [], "on": []}  # the daemon's CPU µs per job
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="jobcar-tracing-")))
        base = ab.checkout(stack, "base", args.base, tmp)
        here = ab.checkout(stack, "here", args.here, tmp)
        for side in (base, here):
            ab.say(f"{side.describe()}: jobcar from {ab.check_import(side, tmp)}")
        server = ab.RedisServer(ab.find_server_binary(), tmp / "redis").start()
        stack.callback(server.stop)
        nginx_url = stack.enter_context(Nginx())
        control = stack.enter_context(contextlib.closing(server.client()))
        sides = {"base": (base, None), "off": (here, None), "on": (here, f"{nginx_url.rstrip('/')} {args.ratio}")}
        names = list(sides)
        for i in range(args.rounds):
            order = names[i % 3 :] + names[: i % 3]  # each side first in a round as often as the others
            for name in order:
                side, tracing = sides[name]
                control.flushall()
                control.script_flush()
                measured = ab.Side(side.name, side.rev, side.commit, side.note, side.daemon_dir)
                result = measure(measured, figure, args, server.url, nginx_url, tmp, tracing)
                values[name].append(result["jobs_per_s"])
                cpu[name].append(result["daemon_cpu_s"] / result["jobs"] * 1e6)
                ab.say(f"round {i + 1}/{args.rounds} {name}: {result['jobs_per_s']:,.0f} jobs/s "
                       f"({result['jobs']} in {result['seconds']:.3f}s), "
                       f"daemon CPU {cpu[name][-1]:.0f} µs/job")  # fmt: skip
        versions = {"python": platform.python_version(), "redis-py": redis.__version__, "nginx": nginx_version(),
                    "load average at the end": " ".join(f"{x:.2f}" for x in os.getloadavg())}  # fmt: skip
    base_median = statistics.median(values["base"])
    print(f"tracing cost: base = {base.describe()}, here = {here.describe()}")
    print(
        f"{args.rounds} rounds, order rotating, {args.jobs} backlog jobs at concurrency {args.concurrency}, "
        f"nginx no-op; on = sampling_ratio {args.ratio}; " + ", ".join(f"{k} {v}" for k, v in versions.items())
    )
    base_cpu = statistics.median(cpu["base"])
    print(f"{'side':<6}{'jobs/s':>9}{'/ base':>8}{'CPU µs/job':>12}{'base/it':>9}   every round (jobs/s; CPU µs/job)")
    for name in names:
        rounds = " ".join(f"{v:,.0f}" for v in values[name])
        cpus = " ".join(f"{v:.0f}" for v in cpu[name])
        median, median_cpu = statistics.median(values[name]), statistics.median(cpu[name])
        print(f"{name:<6}{median:>9,.0f}{median / base_median:>8.3f}{median_cpu:>12.0f}{base_cpu / median_cpu:>9.3f}"
              f"   {rounds}; {cpus}")  # fmt: skip
    print(json.dumps({"rounds": args.rounds, "jobs": args.jobs, "concurrency": args.concurrency, "ratio": args.ratio,
                      "base": base.commit, "values": values, "daemon_cpu_us_per_job": cpu,
                      "medians": {k: statistics.median(v) for k, v in values.items()}}))  # fmt: skip


def measure(side: ab.Side, figure: ab.Figure, args: argparse.Namespace, redis_url: str, nginx_url: str, tmp: Path,
            tracing: str | None) -> dict[str, Any]:  # fmt: skip
    """ab.measure, run through this file's child so that `tracing` (endpoint and ratio) reaches the config."""
    env = side.env()
    env.pop(TRACING_ENV, None)
    if tracing is not None:
        env[TRACING_ENV] = tracing
    argv = [str(ab.PYTHON), str(Path(__file__).resolve()), CHILD, figure.key, "--expect", str(side.daemon_dir),
            "--redis", redis_url, "--nginx", nginx_url, "--jobs", str(args.jobs),
            "--concurrency", str(args.concurrency), "--tmp", str(tmp)]  # fmt: skip
    process = subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=ab.CHILD_TIMEOUT)
    finally:
        if process.poll() is None:
            ab.end_group(process)
    if process.returncode != 0:
        raise RuntimeError(f"{side.describe()}: the measurement exited with {process.returncode}")
    *_, measured, cpu = out.strip().splitlines()
    result: dict[str, Any] = {**json.loads(measured), **json.loads(cpu)}
    return result


if __name__ == "__main__":
    main()
