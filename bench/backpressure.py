"""What the backpressure check (max_pending, ADR 0024) costs a single enqueue, before and after, interleaved.

    .venv/bin/python bench/backpressure.py BEFORE_REV [AFTER_REV] [--rounds 7] [--enqueues 10000]
                                           [--mode processes|fine|both]

Three sides:
- before: jobcar at BEFORE_REV (the commit before the check), no bound;
- unbounded: jobcar at AFTER_REV (default: HEAD), the queue without `max_pending` (every producer's case unless an
  operator sets one): the check is one HGET;
- bounded: AFTER_REV with `max_pending` 1,000,000,000 in `<ns>:{<q>}:settings` (what a daemon writes): the check
  counts the pending lists on every call and never refuses.

Each is --enqueues calls of `Client.enqueue`, one at a time, with bench/daemon.py's ~100-byte payload, measured in
two ways per round (--mode both, the default):
- processes: one child process per side, whose PYTHONPATH is that commit's daemon/ (asserted from
  `jobcar.__file__`), after 200 untimed calls; the sides' order rotated every round. Each commit's Python and
  script, but a slow spell of a shared machine during one side's second moves its figure.
- fine: one child on AFTER_REV's code, the three sides' calls in blocks of 100 taken in turn (two untimed rounds
  first); `before` sends BEFORE_REV's enqueue script, assembled by BEFORE_REV's own loader from its own includes
  (what the check costs includes what AFTER_REV's includes add for it, such as counting the jobs a call makes
  pending). The script's cost alone (the Python around it is the same), with load drifts spread over all three
  sides alike.

The revs are checked out with `git worktree add --detach` under a temporary directory, removed at exit. One
redis-server (the test harness's binary) serves the run, flushed (keys and scripts) before every measurement.
Prints each measurement (stderr), then each side's median jobs/s and the median of its ratios to `before` in
the same round, and one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

import redis
from tests.servers import RedisServer, find_server_binary

ROOT = Path(__file__).resolve().parents[1]
CHILD = "--child"
FINE = "--fine-child"
QUEUE = "default"
WARMUP = 200
PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}
#: The bound of the `bounded` side: far above what a run enqueues, so the check counts and never refuses.
NEVER_REACHED = 1_000_000_000


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def child(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog=f"backpressure.py {CHILD}")
    parser.add_argument("--expect", type=Path, required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--enqueues", type=int, required=True)
    parser.add_argument("--bound", type=int, default=0)
    args = parser.parse_args(argv)
    import jobcar
    from jobcar import Client

    located = Path(jobcar.__file__).resolve()
    if not located.is_relative_to(args.expect.resolve()):
        raise SystemExit(f"jobcar comes from {located}, not from {args.expect}: PYTHONPATH lost")
    namespace = f"bp{time.monotonic_ns()}"
    with contextlib.closing(redis.Redis.from_url(args.redis)) as client:
        if args.bound:
            client.hset(f"{namespace}:{{{QUEUE}}}:settings", "max_pending", args.bound)
        producer = Client(client, namespace=namespace)
        for _ in range(WARMUP):
            producer.enqueue("email.welcome", PAYLOAD)
        started = time.perf_counter()
        for _ in range(args.enqueues):
            producer.enqueue("email.welcome", PAYLOAD)
        elapsed = time.perf_counter() - started
        if (pending := client.llen(f"{namespace}:{{{QUEUE}}}:pending")) != WARMUP + args.enqueues:
            raise RuntimeError(f"{pending} jobs pending after {WARMUP} + {args.enqueues} enqueues")
    print(json.dumps({"jobcar": str(located), "seconds": elapsed, "jobs_per_s": args.enqueues / elapsed}))


def fine(argv: list[str]) -> None:
    """The three sides in one process on AFTER_REV's code, in blocks of --block calls taken in turn: the old
    side sends BEFORE_REV's enqueue.lua (its body, assembled by this loader) through the same client code."""
    parser = argparse.ArgumentParser(prog=f"backpressure.py {FINE}")
    parser.add_argument("--expect", type=Path, required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--old-source", type=Path, required=True)
    parser.add_argument("--enqueues", type=int, required=True)
    parser.add_argument("--block", type=int, default=100)
    args = parser.parse_args(argv)
    import hashlib

    import jobcar
    from jobcar import Client, scripts

    located = Path(jobcar.__file__).resolve()
    if not located.is_relative_to(args.expect.resolve()):
        raise SystemExit(f"jobcar comes from {located}, not from {args.expect}: PYTHONPATH lost")
    source = args.old_source.read_text()
    old = scripts.Script("enqueue", source, hashlib.sha1(source.encode()).hexdigest())
    new = scripts.script("enqueue")
    if "max_pending" in old.source or "max_pending" not in new.source:
        raise SystemExit("BEFORE_REV's enqueue.lua must be without the check, AFTER_REV's with it")
    real = scripts.script
    with contextlib.closing(redis.Redis.from_url(args.redis)) as client:
        sides = []
        for name, script, bound in (("before", old, 0), ("unbounded", new, 0), ("bounded", new, NEVER_REACHED)):
            namespace = f"bp{name}{time.monotonic_ns()}"
            if bound:
                client.hset(f"{namespace}:{{{QUEUE}}}:settings", "max_pending", bound)
            sides.append((name, script, Client(client, namespace=namespace)))
        seconds = dict.fromkeys([name for name, _, _ in sides], 0.0)
        blocks = args.enqueues // args.block
        for i in range(-2, blocks):  # two untimed rounds first: the scripts' loads, the queues' registration
            for name, script, producer in sides[i % 3 :] + sides[: i % 3]:
                scripts.script = lambda n, s=script: s if n == "enqueue" else real(n)  # type: ignore[misc]
                started = time.perf_counter()
                for _ in range(args.block):
                    producer.enqueue("email.welcome", PAYLOAD)
                if i >= 0:
                    seconds[name] += time.perf_counter() - started
        scripts.script = real  # type: ignore[misc]
    print(json.dumps({"jobcar": str(located), **{n: blocks * args.block / s for n, s in seconds.items()}}))


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def checkout(stack: contextlib.ExitStack, rev: str, tmp: Path) -> Path:
    """A detached worktree of `rev`; its daemon/ directory."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    path = tmp / commit[:12]
    if not path.exists():
        git("worktree", "add", "--detach", str(path), commit)
        stack.callback(lambda: git("worktree", "remove", "--force", str(path)))
    return path / "daemon"


def measure(daemon: Path, redis_url: str, enqueues: int, bound: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, CHILD, "--expect", str(daemon), "--redis", redis_url, "--enqueues", str(enqueues),
         "--bound", str(bound)],
        env={"PYTHONPATH": str(daemon), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the child exited with {done.returncode}:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def report(title: str, values: dict[str, list[float]]) -> dict[str, float]:
    """Each side's median jobs/s, and the median of its ratios to `before` measured in the same round (a round's
    sides share the machine's state); the latter returned."""
    ratios = {name: statistics.median(v / b for v, b in zip(values[name], values["before"], strict=True))
              for name in values}  # fmt: skip
    say(title)
    for name, v in values.items():
        each = ", ".join(f"{x:,.0f}" for x in v)
        say(f"{name:>10}: median {statistics.median(v):,.0f} jobs/s, ratio to before {ratios[name]:.3f} ({each})")
    return ratios


def main() -> None:
    if sys.argv[1:2] == [CHILD]:
        child(sys.argv[2:])
        return
    if sys.argv[1:2] == [FINE]:
        fine(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", metavar="BEFORE_REV")
    parser.add_argument("after", metavar="AFTER_REV", nargs="?", default="HEAD")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--enqueues", type=int, default=10_000)
    parser.add_argument("--mode", choices=["processes", "fine", "both"], default="both")
    args = parser.parse_args()
    names = ["before", "unbounded", "bounded"]
    per_process: dict[str, list[float]] = {name: [] for name in names}
    fine_values: dict[str, list[float]] = {name: [] for name in names}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="jobcar-bp-")))
        before, after = checkout(stack, args.before, tmp), checkout(stack, args.after, tmp)
        old_source = tmp / "enqueue-before.lua"
        assembled = subprocess.run(
            [sys.executable, "-c", "from jobcar import scripts; print(scripts.script('enqueue').source, end='')"],
            env={"PYTHONPATH": str(before), "PATH": "/usr/bin:/bin"}, check=True, capture_output=True, text=True,
        )  # fmt: skip
        old_source.write_text(assembled.stdout)
        sides = [("before", before, 0), ("unbounded", after, 0), ("bounded", after, NEVER_REACHED)]
        server = RedisServer(find_server_binary(), tmp / "redis").start()
        stack.callback(server.stop)
        control = stack.enter_context(contextlib.closing(server.client()))
        version = control.info("server")["redis_version"]
        for i in range(args.rounds):
            if args.mode != "fine":
                for name, daemon, bound in sides[i % 3 :] + sides[: i % 3]:
                    control.flushall()
                    control.script_flush()
                    result = measure(daemon, server.url, args.enqueues, bound)
                    per_process[name].append(result["jobs_per_s"])
                    say(f"round {i + 1}/{args.rounds} processes {name}: {result['jobs_per_s']:,.0f} jobs/s")
            if args.mode != "processes":
                control.flushall()
                control.script_flush()
                command = [sys.executable, __file__, FINE, "--expect", str(after), "--redis", server.url,
                           "--old-source", str(old_source), "--enqueues", str(args.enqueues)]  # fmt: skip
                done = subprocess.run(command, env={"PYTHONPATH": str(after), "PATH": "/usr/bin:/bin"},
                                      capture_output=True, text=True, timeout=1200)  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeError(f"the child exited with {done.returncode}:\n{done.stderr}")
                result = json.loads(done.stdout.splitlines()[-1])
                for name in names:
                    fine_values[name].append(result[name])
                say(f"round {i + 1}/{args.rounds} fine: " + ", ".join(f"{n} {result[n]:,.0f}" for n in names))
    say(f"\n{args.enqueues} single enqueues per side and measurement, {args.rounds} rounds; redis-server {version}, "
        f"python {platform.python_version()}, redis-py {redis.__version__}; "
        f"before {args.before}, after {args.after}")  # fmt: skip
    out: dict[str, object] = {}
    if args.mode != "fine":
        ratios = report("one process per measurement (each commit's Python and script):", per_process)
        out["processes"] = {"values": per_process, "ratios": ratios}
    if args.mode != "processes":
        ratios = report("one process, blocks of 100 calls in turn (AFTER's Python, each side's script):", fine_values)
        out["fine"] = {"values": fine_values, "ratios": ratios}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
