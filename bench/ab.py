"""A/B benchmark of two commits of jobcar on the figures a refactor must not move, interleaved in one run.

    .venv/bin/python bench/ab.py OLD_REV NEW_REV [--rounds 5] [--jobs 20000] [--enqueues 10000] [--concurrency 50]

Either rev may be `WORKTREE`: this checkout as it is on disk, uncommitted changes included. Any other rev
is checked out with `git worktree add --detach` under a temporary directory and removed at exit.

Figures, each measured once per side in every round; the order of the sides alternates (old then new,
new then old, ...) so that a slow spell of the machine hits both:
- nginx no-op, 1 daemon, jobs/s: --jobs jobs enqueued (`enqueue_many`) into a paused queue, one `jobcar run`
  (--concurrency) started and ready (`/readyz`), then the time from resuming the queue until its pending
  list and its active and scheduled sets are all empty, against nginx answering `return 204;`
  (bench/nginx.py). Then the daemon's `jobcar_jobs_finished_total{outcome="done"}` must read --jobs and no
  job may be dead. Beside it, the daemon's CPU time per job over the same window (every thread's user and
  system time, from /proc/<pid>/stat): steadier than the rate when the machine's speed wanders, and what a
  change to the per-job path moves first.
- single enqueue, jobs/s: --enqueues calls of `Client.enqueue`, one at a time, with bench/daemon.py's
  ~100-byte payload, after 100 untimed ones (the script load and the queue's registration).

Every measurement runs in a child process (this file's `_child` mode) with PYTHONPATH=<that commit>/daemon,
so that `jobcar` is that commit's, asserted from `jobcar.__file__` (and `jobcar.cli.__file__` once per side
before the rounds). The child uses only jobcar's stable surface, so this keeps working across module
splits: `from jobcar import Client`, the CLI (`jobcar run`, `jobcar queue pause`) and the documented Redis
key layout (docs/protocol.md). The resume is the one exception to the CLI: it lies inside the timed window,
where starting `jobcar queue resume` would add a third of a second of imports, so it is one script call of
its own doing what the protocol's `pause` script does on resume (docs/protocol.md, ADR 0002): delete
`<ns>:{<q>}:paused`, push one element into `<ns>:{<q>}:wake` if that list is empty. Not jobcar's own
lua/pause.lua: the layout of the lua files is the kind of thing a refactor changes.

One redis-server (the test harness's binary, a free loopback port) and one nginx serve the whole run;
Redis is flushed (keys and scripts) before every measurement. Prints each measurement as it lands (stderr),
then the table: figure | old median | new median | new/old, every round's values and ratio, one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

import redis
from tests.servers import RedisServer, find_server_binary, free_port, stop_process, wait_for

from nginx import Nginx, nginx_version  # bench/nginx.py

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
WORKTREE = "WORKTREE"
CHILD = "_child"  # argv[1] of a per-side measurement

#: bench/daemon.py's PAYLOAD (copied, not imported: that module imports jobcar's internals).
PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}
QUEUE = "default"
BACKLOG_TYPE = "bench"  # bench/daemon.py's job type for its backlogs
ENQUEUE_TYPE = "email.welcome"  # bench/enqueue.py's
WARMUP_ENQUEUES = 100
SETTLE = 0.3  # seconds between the daemon's /readyz and the resume: its start-up work is done
#: Seconds between two looks at a draining queue: coarse while more than NEAR jobs are pending, so that the
#: looking costs the daemon's cores little, then fine, so that the end is seen within a millisecond.
POLL_FAR, POLL_NEAR, NEAR = 0.01, 0.001, 1_000
DRAIN_TIMEOUT = 600.0
CHILD_TIMEOUT = 900.0
#: The protocol's `pause` script on resume (KEYS paused wake): 1 when the queue was paused, else 0.
RESUME = """
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('RPUSH', KEYS[2], '1') end
return 1
"""
FINISHED = re.compile(r"^jobcar_jobs_finished_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the child: one measurement of one side ----------------------------------------------------------


def write_config(tmp: Path, redis_url: str, namespace: str, nginx_url: str, concurrency: int, port: int) -> Path:
    """The daemon's config (JSON is YAML), as tests/integration/daemon_harness.py writes them."""
    config = {
        "redis": {"url": redis_url},
        "namespace": namespace,
        "queues": {QUEUE: 1},
        "concurrency": concurrency,
        "lease": "30s",
        "shutdown_timeout": "10s",
        "listen": f"127.0.0.1:{port}",
        "log_format": "json",
        "log_level": "info",
        "handlers": {BACKLOG_TYPE: {"url": nginx_url, "timeout": "10s"}},
    }
    path = tmp / f"jobcar-{namespace}.yaml"
    path.write_text(json.dumps(config, indent=2))
    return path


def log_tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def jobs_done(port: int) -> float:
    """The daemon's jobcar_jobs_finished_total{outcome="done"} for QUEUE, over every job type."""
    total = 0.0
    for line in http_get(f"http://127.0.0.1:{port}/metrics").splitlines():
        found = FINISHED.match(line)
        if found and 'outcome="done"' in found["labels"] and f'queue="{QUEUE}"' in found["labels"]:
            total += float(found["value"])
    return total


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, every thread's user and system time (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_drained(client: redis.Redis, prefix: str, daemon: subprocess.Popen[bytes], log: Path) -> None:
    """Until the queue's pending list and active and scheduled sets are empty, read in one transaction."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while True:
        pipe = client.pipeline(transaction=True)
        pipe.llen(prefix + "pending")
        pipe.zcard(prefix + "active")
        pipe.zcard(prefix + "scheduled")
        pending, active, scheduled = pipe.execute()
        if not pending + active + scheduled:
            return
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon exited with {daemon.returncode} while draining:\n{log_tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the backlog did not drain in {DRAIN_TIMEOUT:.0f}s:\n{log_tail(log)}")
        time.sleep(POLL_FAR if pending > NEAR else POLL_NEAR)


def drain_backlog(redis_url: str, nginx_url: str, jobs: int, concurrency: int, tmp: Path) -> dict[str, Any]:
    from jobcar import Client

    namespace = f"ab{time.monotonic_ns()}"
    prefix = f"{namespace}:{{{QUEUE}}}:"  # docs/protocol.md: every key of a queue starts with <ns>:{<q>}:
    port = free_port()
    config = write_config(tmp, redis_url, namespace, nginx_url, concurrency, port)
    jobcar_cli = [sys.executable, "-m", "jobcar.cli"]
    paused = subprocess.run([*jobcar_cli, "queue", "pause", QUEUE, "-c", str(config)], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    if paused.returncode != 0:
        raise RuntimeError(f"`jobcar queue pause` exited with {paused.returncode}:\n{paused.stderr.strip()}")
    with (
        contextlib.closing(redis.Redis.from_url(redis_url)) as client,
        contextlib.closing(Client.from_url(redis_url, namespace=namespace)) as producer,
    ):
        if not client.exists(prefix + "paused"):
            raise RuntimeError(f"`jobcar queue pause` left no {prefix}paused")
        producer.enqueue_many([(BACKLOG_TYPE, PAYLOAD, {"queue": QUEUE})] * jobs)
        if (pending := client.llen(prefix + "pending")) != jobs:
            raise RuntimeError(f"{pending} jobs pending after enqueueing {jobs}")
        resume = client.script_load(RESUME)
        log = tmp / f"jobcar-{namespace}.log"
        with open(log, "wb") as out:
            daemon = subprocess.Popen([*jobcar_cli, "run", "-c", str(config)], stdout=out, stderr=subprocess.STDOUT)
        try:

            def ready() -> bool:
                if daemon.poll() is not None:
                    raise RuntimeError(f"the daemon exited with {daemon.returncode}:\n{log_tail(log)}")
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                    return bool(response.status == 200)

            wait_for(ready, timeout=30, what="the daemon's /readyz")
            time.sleep(SETTLE)
            started, cpu_before = time.perf_counter(), cpu_seconds(daemon.pid)
            if client.evalsha(resume, 2, prefix + "paused", prefix + "wake") != 1:
                raise RuntimeError("the resume found the queue not paused")
            wait_drained(client, prefix, daemon, log)
            elapsed, cpu = time.perf_counter() - started, cpu_seconds(daemon.pid) - cpu_before
            if dead := client.zcard(prefix + "dead"):
                raise RuntimeError(f"{dead} jobs died:\n{log_tail(log)}")
            try:
                wait_for(lambda: jobs_done(port) == jobs, timeout=10, what="jobs_finished_total to count them")
            except TimeoutError:
                raise RuntimeError(f"the daemon counts {jobs_done(port):.0f} jobs done of {jobs}") from None
        finally:
            stop_process(daemon, timeout=20)
    return {"jobs": jobs, "seconds": elapsed, "jobs_per_s": jobs / elapsed, CPU_KEY: cpu / jobs * 1e6}


def single_enqueue(redis_url: str, enqueues: int) -> dict[str, Any]:
    from jobcar import Client

    namespace = f"ab{time.monotonic_ns()}"
    prefix = f"{namespace}:{{{QUEUE}}}:"
    with (
        contextlib.closing(redis.Redis.from_url(redis_url)) as client,
        contextlib.closing(Client.from_url(redis_url, namespace=namespace)) as producer,
    ):
        for _ in range(WARMUP_ENQUEUES):
            producer.enqueue(ENQUEUE_TYPE, PAYLOAD, queue=QUEUE)
        started = time.perf_counter()
        for _ in range(enqueues):
            producer.enqueue(ENQUEUE_TYPE, PAYLOAD, queue=QUEUE)
        elapsed = time.perf_counter() - started
        if (pending := client.llen(prefix + "pending")) != WARMUP_ENQUEUES + enqueues:
            raise RuntimeError(f"{pending} jobs pending after {WARMUP_ENQUEUES} + {enqueues} enqueues")
    return {"jobs": enqueues, "seconds": elapsed, "jobs_per_s": enqueues / elapsed}


def child(argv: list[str]) -> None:
    """One measurement of the jobcar that PYTHONPATH names; prints its result as one JSON line."""
    parser = argparse.ArgumentParser(prog=f"ab.py {CHILD}")
    parser.add_argument("figure", choices=[figure.key for figure in FIGURES])
    parser.add_argument("--expect", type=Path, required=True, help="the daemon/ directory jobcar must come from")
    parser.add_argument("--redis", required=True)
    parser.add_argument("--nginx", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--tmp", type=Path, required=True)
    args = parser.parse_args(argv)
    import jobcar

    located = Path(jobcar.__file__).resolve()
    if not located.is_relative_to(args.expect.resolve()):
        raise SystemExit(f"jobcar comes from {located}, not from {args.expect}: PYTHONPATH lost")
    with tempfile.TemporaryDirectory(dir=args.tmp) as directory:
        if args.figure == "backlog":
            result = drain_backlog(args.redis, args.nginx, args.jobs, args.concurrency, Path(directory))
        else:
            result = single_enqueue(args.redis, args.jobs)
    print(json.dumps({"figure": args.figure, "jobcar": str(located), **result}))


# -- the parent: checkouts, servers, rounds, table ---------------------------------------------------


@dataclass(frozen=True)
class Figure:
    key: str  # the child's figure argument and the JSON key
    label: str
    jobs: Callable[[argparse.Namespace], int]


FIGURES = (
    Figure("backlog", "nginx no-op, 1 daemon, jobs/s", lambda args: int(args.jobs)),
    Figure("enqueue", "single enqueue, jobs/s", lambda args: int(args.enqueues)),
)
#: The backlog measurement's second value, a row of the table of its own (lower is better).
CPU_KEY = "daemon_cpu_us_per_job"
CPU_LABEL = "nginx no-op, daemon CPU µs/job"
#: Every row of the table: (key, label).
ROWS = (*((figure.key, figure.label) for figure in FIGURES), (CPU_KEY, CPU_LABEL))


@dataclass(frozen=True)
class Side:
    name: str  # "old" or "new"
    rev: str  # as given
    commit: str  # its commit (HEAD's for WORKTREE)
    note: str  # what else is measured: uncommitted changes of WORKTREE
    daemon_dir: Path  # first on the child's PYTHONPATH

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.daemon_dir)}

    def describe(self) -> str:
        return f"{self.name} = {self.rev} ({self.commit[:12]}{self.note})"


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True, timeout=120)
    return done.stdout.strip()


def remove_worktree(path: Path) -> None:
    done = subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    if done.returncode != 0:
        say(f"git worktree remove {path} failed: {done.stderr.strip()}")


def checkout(stack: contextlib.ExitStack, name: str, rev: str, tmp: Path) -> Side:
    """`rev` as a Side: this checkout for WORKTREE, else a detached worktree that `stack` removes."""
    if rev == WORKTREE:
        changed = git("status", "--porcelain", "--", "daemon").splitlines()
        note = f" + {len(changed)} uncommitted paths under daemon/" if changed else ", clean daemon/"
        return Side(name, rev, git("rev-parse", "HEAD"), note, ROOT / "daemon")
    commit = git("rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}")
    path = tmp / name
    git("worktree", "add", "--detach", str(path), commit)
    stack.callback(remove_worktree, path)
    return Side(name, rev, commit, "", path / "daemon")


def check_import(side: Side, cwd: Path) -> str:
    """Where `jobcar` and `jobcar.cli` come from under the side's PYTHONPATH; both must be its daemon/."""
    code = "import jobcar, jobcar.cli; print(jobcar.__file__); print(jobcar.cli.__file__)"
    done = subprocess.run([str(PYTHON), "-c", code], env=side.env(), cwd=cwd, check=True, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    paths = done.stdout.split()
    for path in paths:
        if not Path(path).resolve().is_relative_to(side.daemon_dir.resolve()):
            raise RuntimeError(f"{side.name}: {path} is not under {side.daemon_dir}: PYTHONPATH does not win")
    return paths[0]


def end_group(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the child's process group (the child and its daemon), SIGKILL to what is left after 20 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    with contextlib.suppress(ProcessLookupError):
        while time.monotonic() < deadline:
            os.killpg(process.pid, 0)
            process.poll()  # reap the child, or it stays in the group as a zombie
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def measure(side: Side, figure: Figure, args: argparse.Namespace, redis_url: str, nginx_url: str,
            tmp: Path) -> dict[str, Any]:  # fmt: skip
    """One measurement of one side, in a child process of its own process group."""
    argv = [str(PYTHON), str(Path(__file__).resolve()), CHILD, figure.key, "--expect", str(side.daemon_dir),
            "--redis", redis_url, "--nginx", nginx_url, "--jobs", str(figure.jobs(args)),
            "--concurrency", str(args.concurrency), "--tmp", str(tmp)]  # fmt: skip
    process = subprocess.Popen(argv, env=side.env(), cwd=tmp, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    try:
        out, _ = process.communicate(timeout=CHILD_TIMEOUT)
    finally:
        if process.poll() is None:
            end_group(process)
    if process.returncode != 0:
        raise RuntimeError(f"{side.describe()}: the {figure.key} measurement exited with {process.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if not Path(result["jobcar"]).is_relative_to(side.daemon_dir.resolve()):
        raise RuntimeError(f"{side.name} measured jobcar from {result['jobcar']}")
    return result


def median_ratio(old: list[float], new: list[float]) -> float:
    return statistics.median(new) / statistics.median(old)


def report(sides: list[Side], args: argparse.Namespace, values: dict[str, dict[str, list[float]]],
           versions: dict[str, str]) -> None:  # fmt: skip
    old, new = sides
    print(f"jobcar A/B: {old.describe()} vs {new.describe()}")
    print(f"{args.rounds} rounds, sides alternating, {args.jobs} backlog jobs at concurrency {args.concurrency}, "
          f"{args.enqueues} single enqueues; " + ", ".join(f"{k} {v}" for k, v in versions.items()))  # fmt: skip
    print(f"{'figure':<34}{'old median':>12}{'new median':>12}{'new/old':>9}")
    for key, label in ROWS:
        olds, news = values[key]["old"], values[key]["new"]
        print(f"{label:<34}{statistics.median(olds):>12,.1f}{statistics.median(news):>12,.1f}"
              f"{median_ratio(olds, news):>9.3f}")  # fmt: skip
    print("every round (* measured first in its round):")
    for key, label in ROWS:
        for i, (o, n) in enumerate(zip(values[key]["old"], values[key]["new"], strict=True)):
            first_old, first_new = ("*", " ") if i % 2 == 0 else (" ", "*")
            print(f"  {label:<34}round {i + 1}: old {o:>9,.1f}{first_old} new {n:>9,.1f}{first_new} "
                  f"new/old {n / o:.3f}")  # fmt: skip
    summary = {
        "sides": {side.name: {"rev": side.rev, "commit": side.commit, "note": side.note.strip(" ,+")}
                  for side in sides},
        "rounds": args.rounds,
        "first_in_round": ["old" if i % 2 == 0 else "new" for i in range(args.rounds)],
        "jobs": args.jobs,
        "enqueues": args.enqueues,
        "concurrency": args.concurrency,
        "figures": {
            key: {
                "label": label,
                "old": [round(v, 1) for v in values[key]["old"]],
                "new": [round(v, 1) for v in values[key]["new"]],
                "old_median": round(statistics.median(values[key]["old"]), 1),
                "new_median": round(statistics.median(values[key]["new"]), 1),
                "ratio": round(median_ratio(values[key]["old"], values[key]["new"]), 4),
                "round_ratios": [round(n / o, 4) for o, n in zip(values[key]["old"], values[key]["new"], strict=True)],
            }
            for key, label in ROWS
        },
        "versions": versions,
    }  # fmt: skip
    print(json.dumps(summary))


def main() -> None:
    if sys.argv[1:2] == [CHILD]:
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", metavar="OLD_REV", help=f"a git rev, or {WORKTREE} (this checkout as it is on disk)")
    parser.add_argument("new", metavar="NEW_REV", help=f"a git rev, or {WORKTREE}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=20_000, help="backlog drained per measurement")
    parser.add_argument("--enqueues", type=int, default=10_000, help="single enqueues timed per measurement")
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    if min(args.rounds, args.jobs, args.enqueues, args.concurrency) < 1:
        parser.error("--rounds, --jobs, --enqueues and --concurrency must be positive")

    values: dict[str, dict[str, list[float]]] = {key: {"old": [], "new": []} for key, _ in ROWS}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="jobcar-ab-")))
        sides = [checkout(stack, "old", args.old, tmp), checkout(stack, "new", args.new, tmp)]
        for side in sides:
            say(f"{side.describe()}: jobcar from {check_import(side, tmp)}")
        server = RedisServer(find_server_binary(), tmp / "redis").start()
        stack.callback(server.stop)
        nginx_url = stack.enter_context(Nginx())
        control = stack.enter_context(contextlib.closing(server.client()))
        versions = {
            "redis-server": f"{server.binary} {control.info('server')['redis_version']}",
            "nginx": nginx_version(),
            "python": platform.python_version(),
            "redis-py": redis.__version__,
        }
        for i in range(args.rounds):
            order = sides if i % 2 == 0 else sides[::-1]
            for figure in FIGURES:
                for side in order:
                    control.flushall()
                    control.script_flush()  # each side loads its scripts afresh, untimed
                    result = measure(side, figure, args, server.url, nginx_url, tmp)
                    values[figure.key][side.name].append(result["jobs_per_s"])
                    if CPU_KEY in result:
                        values[CPU_KEY][side.name].append(result[CPU_KEY])
                    say(f"round {i + 1}/{args.rounds} {figure.label} {side.name}: {result['jobs_per_s']:,.0f} "
                        f"({result['jobs']} in {result['seconds']:.3f}s, {result['jobcar']})")  # fmt: skip
    report(sides, args, values, versions)


if __name__ == "__main__":
    main()
