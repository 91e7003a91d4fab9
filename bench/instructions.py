"""Instructions, not seconds: what an enqueue costs redis-server and the producer's Python at one or more commits,
counted by valgrind's callgrind, which gives the same count whatever else the machine is doing (on the server,
only what runs from a client's read on: its timers and idle loop do work in proportion to the run's length).

    .venv/bin/python bench/instructions.py [REV ...] [--python]

Each REV (default WORKTREE, this checkout as it is on disk) is measured as bench/ab.py measures a side: a
detached worktree, a child process with PYTHONPATH=<that commit>/daemon, and only jobcar's stable surface
(`from jobcar import Client`). Figures, each the difference of a short and a long run divided by the calls
between them, so that start-up and the script's load cancel out:
- single enqueue, redis-server instructions per call: `Client.enqueue` of bench/ab.py's payload, one call at a
  time, with the server under callgrind;
- enqueue_many, redis-server instructions per job: calls of 1,000 jobs;
- with --python, single enqueue, the producer's instructions per call: the same calls with the producer's
  Python under callgrind instead (about a minute per rev).

Use it where a change moves the cost of a call by a few percent: on a shared 2-core machine, bench/ab.py's
per-round ratios of the same figure range over a third.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

import redis
from tests.servers import free_port, wait_for

from ab import PAYLOAD, PYTHON, WORKTREE, Side, checkout  # bench/ab.py

CHILD = "_child"
#: (figure, calls of the short run, calls of the long run, jobs per call)
FIGURES = (("single enqueue", 300, 1300, 1), ("enqueue_many", 2, 12, 1000))
TOTALS = re.compile(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS|([\d,]+)\s+PROGRAM TOTALS")


def child(argv: list[str]) -> None:
    """`calls` calls of `per_call` jobs each, after one of each to load the script and register the queue."""
    port, calls, per_call = (int(a) for a in argv)
    from jobcar import Client

    producer = Client(redis.Redis(port=port), namespace="cg")
    for _ in range(calls + 1):
        if per_call == 1:
            producer.enqueue("email.welcome", PAYLOAD)
        else:
            producer.enqueue_many([("email.welcome", PAYLOAD)] * per_call)


def instructions(out: Path) -> int:
    report = subprocess.run(["callgrind_annotate", str(out)], check=True, capture_output=True, text=True).stdout
    found = TOTALS.search(report)
    if found is None:
        raise RuntimeError(f"no PROGRAM TOTALS in callgrind_annotate {out}")
    return int((found[1] or found[2]).replace(",", ""))


def grind(side: Side, tmp: Path, calls: int, per_call: int, *, python: bool) -> int:
    """Instructions of redis-server (or, with `python`, of the producer) over one run of `calls` calls."""
    port = free_port()
    out = tmp / f"{side.name}-{calls}-{per_call}-{'py' if python else 'srv'}.out"
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    # The server's own timers (serverCron, ten times a second) and idle loop do work in proportion to the run's
    # length, which the load on the machine sets: only what runs from a client's read on is counted.
    toggle = [] if python else ["--toggle-collect=readQueryFromClient"]
    server_cmd = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]
    server = subprocess.Popen(server_cmd if python else valgrind + toggle + server_cmd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for(lambda: _answers(port), timeout=120, what="redis-server to answer")
        producer = [str(PYTHON), __file__, CHILD, str(port), str(calls), str(per_call)]
        subprocess.run(valgrind + producer if python else producer, env=side.env(), check=True,
                       capture_output=True, timeout=900)  # fmt: skip
        with contextlib.suppress(redis.ConnectionError):
            redis.Redis(port=port).shutdown(nosave=True)
        server.wait(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
    return instructions(out)


def _answers(port: int) -> bool:
    with contextlib.suppress(redis.ConnectionError):
        return bool(redis.Redis(port=port).ping())
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="*", default=[WORKTREE])
    parser.add_argument("--python", action="store_true", help="also the producer's instructions per single enqueue")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobcar-instructions-") as scratch, contextlib.ExitStack() as stack:
        tmp = Path(scratch)
        sides = [checkout(stack, f"rev{n}", rev, tmp) for n, rev in enumerate(args.revs)]
        rows = [(f"{name}, redis-server per job", short, long, per_call, False)
                for name, short, long, per_call in FIGURES]  # fmt: skip
        if args.python:
            rows.append(("single enqueue, the producer per call", 300, 1300, 1, True))
        print("figure".ljust(42) + "".join(side.rev[:12].rjust(14) for side in sides))
        for label, short, long, per_call, python in rows:
            counts = []
            for side in sides:
                few = grind(side, tmp, short, per_call, python=python)
                many = grind(side, tmp, long, per_call, python=python)
                counts.append((many - few) / ((long - short) * per_call))
            print(label.ljust(42) + "".join(f"{count:14,.0f}" for count in counts), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:
        child(sys.argv[2:])
    else:
        main()
