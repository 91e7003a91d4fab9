"""`make bench`: every benchmark scenario in one run, on one machine and one Redis server binary, as one table.

    .venv/bin/python bench/run.py [--runs 3] [--quick] [--skip-peers] [--concurrency 50]

jobcar's scenarios run in this interpreter (.venv) by calling the other bench modules' functions, on one
redis-server started here (the idle-commands figure starts its own, from the same binary); each round
measures every jobcar figure beside its limit, one after the other, then every peer once, as
`.venv-bench/bin/python bench/peers.py --runs 1` told to use the same server binary (JOBCAR_TEST_SERVER);
its JSON lines are parsed. The table shows medians over --runs rounds, the peers' too: interleaved, a
slow spell of the machine hits both sides of a ratio instead of one (in separate phases, single
enqueue vs Dramatiq read 1.07, 0.84 and 1.15 in three runs of the same code).

Table: figure | jobcar | limit or peer | ratio (jobcar ÷ limit or peer) | target (issue #7) | met?
Then one JSON line with every figure (medians and each run's), the sizes and the versions of everything.

--quick is a smoke test, not a measurement: small job counts, 1 round, a 100k backlog instead of 1M.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench modules by name, first: daemon.py is `daemon`

import aiohttp
import redis
from tests.servers import RedisServer, find_server_binary, free_port, stop_process, wait_for

import daemon as daemon_bench  # bench/daemon.py
import enqueue
import footprint
import idle  # bench/idle.py
import jobcar
import nginx
import scale

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PEERS_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
#: Peers that keep per-job state (a job record they can report on), per issue #7: single enqueue must beat these.
PER_JOB_STATE = ("arq", "saq", "rq", "celery", "dramatiq")
MB_PER_MIB = 1.048576
#: The idle-load figure's queue counts (issue #39: at most 2 commands/s per queue, per daemon).
IDLE_QUEUES = (1, 3, 20)


def idle_figure(queues: int) -> str:
    """The figure's name; 3 queues keeps the name of the earlier turns' figure."""
    return "idle commands/s per queue" if queues == 3 else f"idle commands/s per queue, {queues} queues"


@dataclass(frozen=True)
class Sizes:
    processing: int  # backlog drained per run, nginx and aiohttp handlers (and their bare loops)
    command: int  # /bin/true jobs per run (and bare spawns)
    enqueue: int  # bulk enqueue jobs per run; single-job scenarios take a tenth
    footprint: int  # pending jobs for bytes per job
    round_trips: int  # jobs drained while counting round trips
    in_flight: int  # jobs held in flight for the RSS figure
    shallow: int  # the small backlog of the scale figure
    deep: int  # the big one
    measured: int  # jobs timed from the head of each backlog, per run
    scale_rounds: int  # timed runs of each backlog, alternating (the scale figure's median)
    idle_seconds: float  # window for idle commands/s
    peer_jobs: int  # backlog per peer throughput run
    peer_footprint: int  # pending jobs for peers' bytes per job


FULL = Sizes(
    processing=20_000,
    command=2_000,
    enqueue=100_000,
    footprint=100_000,
    round_trips=20_000,
    in_flight=1_000,
    shallow=10_000,
    deep=1_000_000,
    measured=10_000,
    scale_rounds=7,
    idle_seconds=10,
    peer_jobs=20_000,
    peer_footprint=10_000,
)
QUICK = Sizes(
    processing=2_000,
    command=300,
    enqueue=10_000,
    footprint=10_000,
    round_trips=2_000,
    in_flight=1_000,
    shallow=10_000,
    deep=100_000,
    measured=2_000,
    scale_rounds=3,
    idle_seconds=3,
    peer_jobs=1_000,
    peer_footprint=1_000,
)


@dataclass
class Figures:
    """Each figure's value in every run; the table shows medians."""

    runs: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.runs.setdefault(name, []).append(value)
        say(f"  {name}: {value:,.2f}")

    def median(self, name: str) -> float:
        return statistics.median(self.runs[name])

    def medians(self) -> dict[str, float]:
        return {k: round(statistics.median(v), 4) for k, v in self.runs.items()}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- jobcar's scenarios ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    binary: str
    server: RedisServer
    tmp: Path
    nginx_url: str
    app_url: str  # the aiohttp no-op app's base URL (bench/noop_app.py)
    sizes: Sizes
    concurrency: int


@contextlib.contextmanager
def noop_app() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(BENCH / "noop_app.py"), str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: daemon_bench.on_uvloop(daemon_bench.bare_http_loop(f"{url}/noop", 1, 1)),
            timeout=30,
            what="the aiohttp no-op app",
        )
        yield url
    finally:
        stop_process(process)


def jobcar_round(s: Setup, figures: Figures, n: int) -> None:
    """One run of every jobcar figure, each beside its limit."""
    c, z = s.concurrency, s.sizes
    http_backlog = daemon_bench.run_daemon_backlog
    loop, spawn = daemon_bench.bare_http_loop, daemon_bench.bare_spawn_loop
    figures.add("nginx jobcar jobs/s", http_backlog(s.server, s.tmp, {"url": s.nginx_url}, z.processing, c))
    figures.add("nginx bare loop jobs/s", daemon_bench.on_uvloop(loop(s.nginx_url, z.processing, c)))
    two = http_backlog(s.server, s.tmp, {"url": s.nginx_url}, z.processing, c, daemons=2)
    figures.add("nginx jobcar 2 daemons jobs/s", two)
    app = f"{s.app_url}/noop"
    figures.add("aiohttp jobcar jobs/s", http_backlog(s.server, s.tmp, {"url": app}, z.processing, c))
    figures.add("aiohttp bare loop jobs/s", daemon_bench.on_uvloop(loop(app, z.processing, c)))
    figures.add("true jobcar jobs/s", http_backlog(s.server, s.tmp, {"command": ["/bin/true"]}, z.command, c))
    figures.add("true bare spawn jobs/s", daemon_bench.on_uvloop(spawn(["/bin/true"], z.command, c)))

    for name, value in enqueue.measure_round(s.server, s.tmp, z.enqueue).items():
        figures.add(f"enqueue {name} jobs/s", value)

    pickup, lateness = daemon_bench.on_uvloop_latency(s.server, s.tmp)
    pct = daemon_bench.percentile
    figures.add("pickup p50 ms", pct(pickup, 0.5))
    figures.add("pickup p99 ms", pct(pickup, 0.99))
    figures.add("delayed lateness p50 ms", pct(lateness, 0.5))
    figures.add("delayed lateness p99 ms", pct(lateness, 0.99))
    idle_dir = s.tmp / f"idle{n}"
    idle_dir.mkdir()
    for queues in IDLE_QUEUES:  # bench/idle.py: one daemon's fixed cost weighs most with one queue
        per_queue = idle.idle_commands_per_queue(s.binary, idle_dir, z.idle_seconds, queues=queues)
        figures.add(idle_figure(queues), per_queue)

    figures.add("bytes per pending job", footprint.bytes_per_pending_job(s.server, z.footprint))
    figures.add(
        "bytes per pending job listpack 1024",
        footprint.bytes_per_pending_job(s.server, z.footprint, listpack_value=1024),
    )
    trips = footprint.round_trips_per_job(s.server, s.tmp, s.nginx_url, z.round_trips, c)
    figures.add("round trips per job", trips.reads_per_job)
    figures.add("script calls per job", trips.scripts_per_job)
    rss = footprint.rss_with_jobs_in_flight(s.server, s.tmp, s.app_url, z.in_flight)
    figures.add("rss MB at in-flight", rss * MB_PER_MIB)


def jobcar_scale(s: Setup, figures: Figures) -> None:
    """Throughput from the head of a shallow and of a deep backlog, rounds alternating between them (scale.py)."""
    z = s.sizes
    say(f"scale: {z.shallow:,} and {z.deep:,} backlogs, {z.measured:,} jobs timed per run, {z.scale_rounds} rounds")
    started = time.monotonic()
    backlogs = {"shallow": z.shallow, "deep": z.deep}
    values = scale.throughput_by_backlog(s.server, s.tmp, s.nginx_url, backlogs, z.measured, z.scale_rounds,
                                         s.concurrency)  # fmt: skip
    for name, runs in values.items():
        for value in runs:
            figures.add(f"{name} backlog jobs/s", value)
    say(f"  ({time.monotonic() - started:.0f} s)")


def server_versions(binary: str, server: RedisServer) -> dict[str, str]:
    with server.client() as client:
        info = client.info("server")
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    versions = {"server_binary": binary, "server_version_output": done.stdout.strip()}
    for key in ("server_name", "redis_version", "valkey_version"):
        if key in info:
            versions[f"server_{key}"] = str(info[key])
    name = versions.get("server_server_name", "redis")
    versions["server"] = f"{name} {versions.get('server_valkey_version', versions['server_redis_version'])}"
    return versions


# -- peers -------------------------------------------------------------------------------------------


def run_peer_round(python: Path, sizes: Sizes, binary: str) -> dict[str, Any]:
    """One run of every peer: bench/peers.py's JSON record, or {"error": ...}. Its progress goes to stderr;
    its own table is dropped."""
    if not python.exists():
        return {"error": f"{python} is missing (make bench creates .venv-bench)"}
    singles = max(1, sizes.enqueue // 10)  # as many single enqueues as jobcar's own figure times
    argv = [str(python), str(BENCH / "peers.py"), "--jobs", str(sizes.peer_jobs), "--runs", "1",
            "--footprint-jobs", str(sizes.peer_footprint), "--enqueue-jobs", str(singles)]  # fmt: skip
    say(f"peers: {' '.join(argv[1:])}")
    done = subprocess.run(
        argv, cwd=ROOT, env={**os.environ, "JOBCAR_TEST_SERVER": binary}, stdout=subprocess.PIPE, text=True, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = " | ".join(done.stdout.strip().splitlines()[-3:])
        return {"error": f"bench/peers.py exited with {done.returncode}: {tail}"}
    record: dict[str, Any] = json.loads(lines[-1])
    return record


#: The figures of a peers.py record that the table reads, each a median over the rounds that measured it.
PEER_FIGURES = ("jobs_per_s", "enqueue_jobs_per_s", "pickup_p50_ms", "pickup_p99_ms", "redis_bytes_per_pending_job")


def merge_peer_rounds(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One peers.py record from the records of single-run rounds: each peer's figures become medians over
    the rounds (each round's value kept under `<figure>_rounds`); a peer's first error is kept."""
    measured = [r for r in records if not r.get("error")]
    if not measured:
        return records[-1] if records else {}
    peers: dict[str, dict[str, Any]] = {}
    for record in measured:
        for name, entry in record["peers"].items():
            merged = peers.setdefault(
                name, {"version": entry.get("version"), "setup": entry.get("setup"), "error": None}
            )
            merged["error"] = merged["error"] or entry.get("error")
            for key in PEER_FIGURES:
                if entry.get(key) is not None:
                    merged.setdefault(f"{key}_rounds", []).append(entry[key])
    for merged in peers.values():
        for key in PEER_FIGURES:
            if f"{key}_rounds" in merged:
                merged[key] = round(statistics.median(merged[f"{key}_rounds"]), 3)
    return {**measured[0], "runs": len(measured), "peers": peers}


# -- the table ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    figure: str
    jobcar: str = ""
    other: str = "-"
    ratio: str = "-"
    target: str = "-"
    met: str = "-"


def met(value: float, op: str, bound: float) -> str:
    ok = value >= bound if op == "≥" else value > bound if op == ">" else value <= bound
    return "yes" if ok else "NO"


def rate(value: float) -> str:
    return f"{value:,.0f}"


def ms(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:,.0f}"


def whole(value: float) -> str:
    return f"{value:,.0f}"


Target = tuple[str, float]  # ("≥", 1.5): the comparison and the bound


def versus(figure: str, mine: float, label: str, other: float, fmt: Callable[[float], str] = rate,
           on_ratio: Target | None = None, on_value: Target | None = None) -> Row:  # fmt: skip
    """A row comparing jobcar with a limit or peer; the target is on the ratio or on jobcar's own value."""
    r = mine / other if other else None
    row = Row(figure, fmt(mine), f"{label} {fmt(other)}".strip(), f"{r:.2f}" if r is not None else "-")
    if on_ratio:
        return replace(row, target=f"{on_ratio[0]} {on_ratio[1]:g}×", met=met(r, *on_ratio) if r else "n/a")
    if on_value:
        return replace(row, target=f"{on_value[0]} {on_value[1]:g}", met=met(mine, *on_value))
    return row


def alone(figure: str, mine: float, fmt: Callable[[float], str], other: str = "-", target: Target | None = None) -> Row:
    """A row with no figure to compare with (`other` says why, or names a peer figure's absence)."""
    if target is None:
        return Row(figure, fmt(mine), other)
    return Row(figure, fmt(mine), other, target=f"{target[0]} {target[1]:g}", met=met(mine, *target))


def shorten(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


Peers = dict[str, dict[str, Any]]


def sub(label: str, other: str, ratio: str = "") -> Row:
    """An indented row under a figure: one peer's value, nothing to meet."""
    return Row(f"  {label}", "", other, ratio, "", "")


def peer_rows(peers: Peers, key: str, mine: float, fmt: Callable[[float], str], setup: bool = False) -> list[Row]:
    """One indented row per peer for its figure `key`, ratio jobcar ÷ peer."""
    rows = []
    for name, entry in peers.items():
        label = f"{name} {entry.get('version', '?')}" + (f" ({entry.get('setup', '')})" if setup else "")
        if entry.get(key):
            rows.append(sub(label, fmt(entry[key]), f"{mine / entry[key]:.2f}"))
        else:
            rows.append(sub(label, f"error: {shorten(str(entry['error']))}" if entry.get("error") else "-"))
    return rows


def best_peer(peers: Peers, key: str, pick: Callable[..., Any]) -> tuple[str, float] | None:
    found = {name: e[key] for name, e in peers.items() if e.get(key) is not None}
    if not found:
        return None
    name = pick(found, key=found.__getitem__)
    return name, found[name]


def build_rows(f: Figures, peers_record: dict[str, Any], sizes: Sizes, skipped: bool) -> list[Row]:
    m = f.median
    peers: Peers = peers_record.get("peers", {})
    if skipped:
        no_peers = "peers skipped (--skip-peers)"
    elif peers_record.get("error"):
        no_peers = f"peers failed: {shorten(peers_record['error'])}"
    else:
        no_peers = "no peer figure"
    rows: list[Row] = []

    # Processing: nginx against the fastest peer and against the bare loop; aiohttp app; /bin/true.
    title = f"nginx no-op handler, jobs/s ({sizes.processing:,})"
    nginx_rate = m("nginx jobcar jobs/s")
    fastest = best_peer(peers, "jobs_per_s", max)
    if fastest:
        rows.append(versus(title, nginx_rate, f"fastest peer {fastest[0]}", fastest[1], on_ratio=("≥", 1.5)))
        rows += peer_rows(peers, "jobs_per_s", nginx_rate, rate, setup=True)
    else:
        rows.append(Row(title, rate(nginx_rate), no_peers, target="≥ 1.5×", met="n/a"))
    rows.append(versus(title, nginx_rate, "bare aiohttp loop", m("nginx bare loop jobs/s")))
    # The peers run two worker processes on 2 cores; so do two jobcar daemons (replicas, template units).
    title = f"nginx no-op handler, 2 daemons, jobs/s ({sizes.processing:,})"
    two = m("nginx jobcar 2 daemons jobs/s")
    if fastest:
        rows.append(versus(title, two, f"fastest peer {fastest[0]}", fastest[1], on_ratio=("≥", 1.5)))
    else:
        rows.append(Row(title, rate(two), no_peers, target="≥ 1.5×", met="n/a"))
    rows.append(versus(f"aiohttp no-op app, jobs/s ({sizes.processing:,})", m("aiohttp jobcar jobs/s"),
                       "bare aiohttp loop", m("aiohttp bare loop jobs/s"), on_ratio=("≥", 0.8)))  # fmt: skip
    rows.append(versus(f"/bin/true command, jobs/s ({sizes.command:,})", m("true jobcar jobs/s"), "bare spawn loop",
                       m("true bare spawn jobs/s"), on_ratio=("≥", 0.8)))  # fmt: skip

    # Enqueue.
    bulk, single = sizes.enqueue, max(1, sizes.enqueue // 10)
    pipelined, lpush = m("enqueue pipelined LPUSH jobs/s"), m("enqueue single LPUSH jobs/s")
    one = m("enqueue single enqueue jobs/s")
    rows.append(versus(f"enqueue_many, jobs/s ({bulk:,})", m("enqueue enqueue_many jobs/s"), "pipelined LPUSH",
                       pipelined, on_ratio=("≥", 0.5)))  # fmt: skip
    rows.append(versus(f"single enqueue, jobs/s ({single:,})", one, "single LPUSH", lpush, on_ratio=("≥", 0.8)))
    floor = m("enqueue floor script jobs/s")
    rows.append(versus(f"  floor: a script doing only HSET + LPUSH ({single:,})", floor, "single LPUSH", lpush))
    stateful = {n: e for n, e in peers.items() if n in PER_JOB_STATE}
    fastest_enqueue = best_peer(stateful, "enqueue_jobs_per_s", max)
    title = "single enqueue vs peers with per-job state"
    if fastest_enqueue:
        rows.append(versus(title, one, f"fastest {fastest_enqueue[0]}", fastest_enqueue[1], on_ratio=(">", 1)))
        rows += peer_rows(peers, "enqueue_jobs_per_s", one, rate)
    else:
        why = "not measured: peers.py reports no enqueue rate" if peers else no_peers
        rows.append(Row(title, rate(one), why, target="> 1×", met="n/a"))
    rows.append(versus(f"HTTP /v1/jobs batches of {enqueue.HTTP_BATCH}, jobs/s ({bulk:,})",
                       m("enqueue HTTP batch jobs/s"), "pipelined LPUSH", pipelined))  # fmt: skip
    # One producer at a time (bench/enqueue.py's first concurrency) against one LPUSH round trip at a time.
    rows.append(versus(f"HTTP /v1/jobs single, jobs/s ({single:,})", m("enqueue HTTP single x1 jobs/s"),
                       "single LPUSH", lpush))  # fmt: skip
    # Concurrent producers, one job per request, against the HTTP stack's own limit: the target is at 64.
    for clients in enqueue.HTTP_CLIENTS:
        rows.append(versus(f"  HTTP single from {clients} concurrent clients ({single:,})",
                           m(f"enqueue HTTP single x{clients} jobs/s"), "bare aiohttp server",
                           m(f"enqueue bare aiohttp x{clients} jobs/s"),
                           on_ratio=("≥", 0.5) if clients == max(enqueue.HTTP_CLIENTS) else None))  # fmt: skip

    # Latency.
    for pct, bound in (("p50", 1.0), ("p99", 5.0)):
        title = f"pickup latency {pct}, ms (500 jobs 10 ms apart)"
        best = best_peer(peers, f"pickup_{pct}_ms", min)
        if best:
            rows.append(
                versus(title, m(f"pickup {pct} ms"), f"best peer {best[0]}", best[1], ms, on_value=("≤", bound))
            )
        else:
            rows.append(alone(title, m(f"pickup {pct} ms"), ms, no_peers, ("≤", bound)))
    for name, entry in peers.items():
        p50, p99 = entry.get("pickup_p50_ms"), entry.get("pickup_p99_ms")
        other = (
            f"{ms(p50)} / {ms(p99)}" if p50 is not None and p99 is not None else "error" if entry.get("error") else "-"
        )
        rows.append(sub(f"{name} {entry.get('version', '?')} p50 / p99", other))
    rows.append(alone("delayed-job lateness p50, ms (200 jobs, 0.2-2 s)", m("delayed lateness p50 ms"), ms))
    rows.append(alone("delayed-job lateness p99, ms", m("delayed lateness p99 ms"), ms, target=("≤", 50)))

    # Footprint.
    title = f"Redis bytes per pending job, server defaults ({sizes.footprint:,})"
    per_job = m("bytes per pending job")
    smallest = best_peer(peers, "redis_bytes_per_pending_job", min)
    if smallest:
        rows.append(versus(title, per_job, f"smallest peer {smallest[0]}", smallest[1], whole, on_value=("≤", 300)))
        rows += peer_rows(peers, "redis_bytes_per_pending_job", per_job, whole)
    else:
        rows.append(alone(title, per_job, whole, no_peers, ("≤", 300)))
    listpack = m("bytes per pending job listpack 1024")
    rows.append(alone("Redis bytes per pending job, hash-max-listpack-value 1024", listpack, whole, target=("≤", 300)))
    for queues in IDLE_QUEUES:
        rows.append(alone(f"idle Redis commands/s per queue ({queues} idle queue{'s' * (queues > 1)})",
                          m(idle_figure(queues)), lambda v: f"{v:.2f}", target=("≤", 2)))  # fmt: skip
    rows.append(alone(f"daemon RSS, {sizes.in_flight:,} jobs in flight, MB", m("rss MB at in-flight"),
                      lambda v: f"{v:.1f}", target=("≤", 80)))  # fmt: skip
    three = "{:.3f}".format
    rows.append(alone("Redis round trips per job (read events, nginx)", m("round trips per job"), three))
    rows.append(alone("Redis script calls per job", m("script calls per job"), three))

    # Scale.
    rows.append(versus(f"{sizes.deep:,} backlog, jobs/s (nginx, {sizes.measured:,} timed, {sizes.scale_rounds} rounds)",
                       m("deep backlog jobs/s"),
                       f"{sizes.shallow:,} backlog", m("shallow backlog jobs/s"), on_ratio=("≥", 0.9)))  # fmt: skip
    return rows


def render(rows: list[Row]) -> str:
    header = Row("figure", "jobcar", "limit or peer", "ratio", "target", "met?")
    cells = [astuple_row(r) for r in [header, *rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(6)]
    right = {1, 3}  # numbers
    lines = []
    for n, c in enumerate(cells):
        line = "  ".join(c[i].rjust(widths[i]) if i in right else c[i].ljust(widths[i]) for i in range(6))
        lines.append(line.rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def astuple_row(r: Row) -> tuple[str, str, str, str, str, str]:
    return r.figure, r.jobcar, r.other, r.ratio, r.target, r.met


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def version_of(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "-"


# -- main --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="rounds per figure, medians shown (default 3; 1 quick)")
    parser.add_argument("--quick", action="store_true", help="smoke test: small job counts, 1 run, 100k backlog")
    parser.add_argument("--skip-peers", action="store_true", help="do not run bench/peers.py")
    parser.add_argument("--concurrency", type=int, default=50, help="daemon concurrency = bare loops' concurrency")
    parser.add_argument("--peers-python", type=Path, default=PEERS_PYTHON, help="the interpreter with the peers")
    args = parser.parse_args()
    runs = args.runs if args.runs is not None else 1 if args.quick else 3
    if runs < 1:
        parser.error("--runs must be at least 1")
    sizes = QUICK if args.quick else FULL
    started = time.monotonic()

    binary = find_server_binary()
    os.environ["JOBCAR_TEST_SERVER"] = binary  # every server started from here on, the peers' too
    figures = Figures()
    peer_rounds: list[dict[str, Any]] = []
    peers_seconds = 0.0
    with tempfile.TemporaryDirectory(prefix="jobcar-bench-") as directory:
        tmp = Path(directory)
        server = RedisServer(binary, tmp / "redis").start()
        try:
            versions = server_versions(binary, server)
            with nginx.Nginx() as nginx_url, noop_app() as app_url:
                setup = Setup(binary, server, tmp, nginx_url, app_url, sizes, args.concurrency)
                for n in range(runs):
                    say(f"jobcar round {n + 1}/{runs} ({time.monotonic() - started:.0f} s)")
                    jobcar_round(setup, figures, n)
                    if not args.skip_peers:
                        began = time.monotonic()
                        peer_rounds.append(run_peer_round(args.peers_python, sizes, binary))
                        peers_seconds += time.monotonic() - began
                jobcar_scale(setup, figures)
        finally:
            server.stop()
    peers_record = merge_peer_rounds(peer_rounds)
    peers: dict[str, dict[str, Any]] = peers_record.get("peers", {})
    total = time.monotonic() - started

    versions |= {
        "jobcar": jobcar.__version__,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "redis-py": redis.__version__,
        "hiredis": version_of("hiredis"),
        "httptools": version_of("httptools"),
        "aiohttp": aiohttp.__version__,
        "uvloop": version_of("uvloop"),
        "nginx": nginx.nginx_version(),
        "peers_python": peers_record.get("python", "-"),
        "peers_redis-py": peers_record.get("redis", "-"),
        "peers_hiredis": peers_record.get("hiredis", "-"),
        "peers_kombu": peers_record.get("kombu", "-"),
        "peers_server": peers_record.get("server", "-"),
        **{name: entry.get("version", "-") for name, entry in peers.items()},
    }
    machine = {"cores": os.cpu_count(), "cpu": cpu_model(), "platform": platform.platform()}
    rows = build_rows(figures, peers_record, sizes, args.skip_peers)

    mode = "QUICK SMOKE TEST (not a measurement), " if args.quick else ""
    print(
        f"jobcar {jobcar.__version__} bench: {mode}medians of {runs} run{'s' if runs > 1 else ''}; "
        f"{machine['cores']} cores ({machine['cpu']}); {versions['server']} ({binary}); Python "
        f"{platform.python_version()}, redis-py {redis.__version__}, httptools {versions['httptools']}, "
        f"aiohttp {aiohttp.__version__}, uvloop "
        f"{versions['uvloop']}, nginx {versions['nginx']}; concurrency {args.concurrency}; ratio = jobcar ÷ limit "
        f"or peer; {total / 60:.1f} min"
    )
    print(render(rows))
    record = {
        "quick": args.quick,
        "runs": runs,
        "concurrency": args.concurrency,
        "sizes": asdict(sizes),
        "machine": machine,
        "versions": versions,
        "figures": figures.medians(),
        "figures_each_run": {k: [round(v, 4) for v in vs] for k, vs in figures.runs.items()},
        "targets": {r.figure: r.met for r in rows if r.met not in ("-", "")},
        "peers": peers_record,
        "seconds": {"jobcar": round(total - peers_seconds), "peers": round(peers_seconds), "total": round(total)},
    }
    print(json.dumps(record, separators=(",", ":"), ensure_ascii=False))


if __name__ == "__main__":
    main()
