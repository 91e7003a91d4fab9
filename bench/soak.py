"""Soak test (guarantee #16 of docs/delivery-semantics.md): a fixed enqueue rate through fault proxies, for a long time.

    .venv/bin/python bench/soak.py [--duration 10m] [--rate 200] [--report-every 30s]

The default duration is 10 minutes; criterion 16 asks for one hour: `--duration 1h`. Durations are
read like the config's (`90s`, `10m`, `1h`, `1h30m`).

What runs, each in its own process unless said otherwise:
- redis-server with AOF on (`appendfsync everysec`) and `maxmemory-policy noeviction`;
- an HTTP handler (a small aiohttp app, this file with `--serve-handler PORT`) that answers 204 and
  counts the runs of each job id, and checks that the body belongs to the id it came with;
- a real `jobcar run` daemon, whose Redis and whose handler are both reached through a FaultProxy
  (tests/faultproxy.py, threads of this process) with latency and jitter always on, a reset() of
  every open connection at random intervals (20-60 s, each proxy on its own clock) and, unless
  `--no-blackhole`, a 2 s blackhole of one of the two now and then (every 60-180 s);
- a producer (this process) enqueueing at `--rate` jobs/s straight to Redis (not through a proxy)
  with the async Client and caller-chosen ids, remembering every acknowledged id.

Every `--report-every` one line: elapsed time; enqueued (acknowledged); done (left the queue without
dying, as Redis counts: enqueued - pending - active - scheduled - dead); pending/active/scheduled/dead;
in-flight (pending + active + scheduled: the most that could still be lost, since loss is only known
at the end); lost>= (done - ids the handler ever saw: a job that left the queue without running,
a lower bound on loss that is never positive without a loss); duplicates (ids run more than once);
the daemon's RSS (VmRSS of /proc/<pid>/status); Redis `used_memory`; the number of keys; faults so far.

At the end production stops, fault injection stops (latency stays), and the queue gets `--settle` to
drain. Then every acknowledged id is checked: done (its hash is gone and the handler saw it), dead (in
the dead-letter set; reasons listed), or lost (its hash gone without a handler run, or still pending,
active or scheduled after the deadline). Memory is compared between warm-up (the median of the samples
taken between 20% and 30% of the run) and the end (the median of the last 10% of the load): flat means
less than 10% growth. A slope over every sample after warm-up is printed too, to extrapolate (it is
noise on short runs). Last come the daemon's log lines by level and its commonest warnings and errors;
`--dir DIR` keeps the whole log (and Redis's data and log) for a closer look, and `--seed N` repeats a
fault schedule.

Exit status: 0 when no acknowledged job was lost, 1 otherwise (or when a process died); 130 on Ctrl-C,
which reaches redis-server too (it shares the terminal's process group), so it aborts without a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp
import redis
import redis.asyncio
import uvloop
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faultproxy import FaultProxy
from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary, free_port, stop_process, wait_for

import jobcar
from jobcar import AsyncClient, replies, transitions, transport
from jobcar.enqueueing import ENQUEUE_CHUNK
from jobcar.job import Job, State
from jobcar.keys import QueueKeys
from jobcar.units import parse_duration

NAMESPACE: Final = "soak"
JOB_TYPE: Final = "soak"
ID_PREFIX: Final = "s"  # job ids are "s<n>", n = 0, 1, 2...: the handler counts runs in a bytearray by n
PAD: Final = "x" * 48  # a payload of about 100 bytes, like a small real job

# Faults. Latency + jitter is per chunk, in each direction (so a Redis round trip costs 2-6 ms more).
REDIS_LATENCY, REDIS_JITTER = 0.001, 0.002
HTTP_LATENCY, HTTP_JITTER = 0.003, 0.007
RESET_EVERY: Final = (20.0, 60.0)
BLACKHOLE_EVERY: Final = (60.0, 180.0)
BLACKHOLE_FOR: Final = 2.0

SAMPLE_EVERY: Final = 2.0
WARMUP: Final = (0.20, 0.30)  # fractions of the run whose samples make the warm-up baseline
END_WINDOW: Final = 0.10  # the last fraction of the load whose samples make the end figure
FLAT_GROWTH: Final = 0.10

# The daemon: realistic lease and defaults, but a handler timeout short enough that a request lost
# in a blackhole is retried within the settle deadline.
DAEMON_SETTINGS: Final = {
    "lease": "30s",
    "log_level": "info",
    "concurrency": 20,
    "defaults": {"timeout": "10s", "max_attempts": 10, "backoff": {"base": "200ms", "max": "5s"}},
}


def duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive, got {text!r}")
    return seconds


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}MiB"


# --------------------------------------------------------------------------------------------------
# The HTTP handler (its own process)


@dataclass
class Tally:
    counts: bytearray = field(default_factory=bytearray)  # runs per n, saturating at 255
    distinct: int = 0
    runs: int = 0
    duplicate_ids: int = 0
    foreign: int = 0  # ids that are not "s<n>"
    mismatched: int = 0  # a body that is not the one enqueued with this id

    def record(self, job_id: str, body: bytes) -> None:
        self.runs += 1
        try:
            n = int(job_id.removeprefix(ID_PREFIX)) if job_id.startswith(ID_PREFIX) else -1
        except ValueError:
            n = -1
        if n < 0:
            self.foreign += 1
            return
        with contextlib.suppress(ValueError, TypeError, KeyError):
            if json.loads(body)["n"] != n:
                self.mismatched += 1
        if n >= len(self.counts):
            self.counts.extend(bytes(max(n + 1 - len(self.counts), 65536)))
        runs = self.counts[n]
        if runs == 0:
            self.distinct += 1
        elif runs == 1:
            self.duplicate_ids += 1
        self.counts[n] = min(255, runs + 1)

    def stats(self) -> dict[str, int]:
        return {
            "distinct": self.distinct,
            "runs": self.runs,
            "duplicate_ids": self.duplicate_ids,
            "foreign": self.foreign,
            "mismatched": self.mismatched,
        }


def serve_handler(port: int) -> None:
    tally = Tally()

    async def job(request: web.Request) -> web.Response:
        body = await request.read()
        # Counted once the whole request is in: a request cut by a reset mid-body never reached the app.
        tally.record(request.headers.get("Jobcar-Job-Id", ""), body)
        return web.Response(status=204)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(tally.stats())

    async def counts(request: web.Request) -> web.Response:
        return web.Response(body=bytes(tally.counts), content_type="application/octet-stream")

    app = web.Application()
    app.router.add_post("/job", job)
    app.router.add_get("/stats", stats)
    app.router.add_get("/counts", counts)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, handle_signals=True)


# --------------------------------------------------------------------------------------------------
# The soak itself (this process)


@dataclass
class Sample:
    at: float  # seconds since the load started
    rss: int
    used_memory: int
    keys: int


@dataclass
class Soak:
    duration: float
    rate: float
    report_every: float
    settle: float
    blackholes: bool
    seed: int | None
    server: RedisServer
    daemon: DaemonProcess
    handler: subprocess.Popen[bytes]
    handler_url: str
    proxies: dict[str, FaultProxy]
    # Per n: 0 not sent, 1 acknowledged, 2 uncertain (the enqueue raised: it may or may not be stored).
    sent: bytearray = field(default_factory=bytearray)
    acked: int = 0
    uncertain: int = 0
    samples: list[Sample] = field(default_factory=list)
    resets: Counter[str] = field(default_factory=Counter)  # reset() calls per proxy
    cut: Counter[str] = field(default_factory=Counter)  # connections they cut
    blackholed: Counter[str] = field(default_factory=Counter)
    load_seconds: float = 0.0
    settle_seconds: float = 0.0
    settled: bool = False
    stop_load: asyncio.Event = field(default_factory=asyncio.Event)
    stop_faults: asyncio.Event = field(default_factory=asyncio.Event)
    started: float = 0.0

    @property
    def keys(self) -> QueueKeys:
        return QueueKeys.of(NAMESPACE, "default")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def daemon_rss(self) -> int:
        try:
            for line in Path(f"/proc/{self.daemon.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def check_alive(self) -> None:
        assert self.daemon.process is not None
        if self.daemon.process.poll() is not None:
            raise RuntimeError(f"the daemon exited with {self.daemon.process.returncode}:\n{self.daemon.log_tail()}")
        if self.handler.poll() is not None:
            raise RuntimeError(f"the handler exited with {self.handler.returncode}")

    # --- producer ----------------------------------------------------------------------------------

    async def produce(self, client: AsyncClient) -> None:
        """The n-th job is due at n / rate seconds: a late producer catches up in batches, never bursts
        ahead, so the rate is fixed over the run whatever one enqueue costs."""
        start = self.started
        try:
            await self._produce(client, start)
        finally:
            self.load_seconds = time.monotonic() - start

    async def _produce(self, client: AsyncClient, start: float) -> None:
        while not self.stop_load.is_set():
            now = time.monotonic()
            if now - start >= self.duration:
                break
            due = min(math.floor((now - start) * self.rate) + 1, len(self.sent) + ENQUEUE_CHUNK)
            first = len(self.sent)
            if due <= first:
                await asyncio.sleep(start + first / self.rate - now)
                continue
            numbers = range(first, due)
            self.sent.extend(bytes(len(numbers)))
            specs = [(JOB_TYPE, {"n": n, "user": 1234567, "pad": PAD}, {"job_id": f"{ID_PREFIX}{n}"}) for n in numbers]
            try:
                infos = await client.enqueue_many(specs)
            except (redis.RedisError, OSError) as exc:
                print(f"  enqueue of {len(numbers)} job(s) failed, counted as uncertain: {exc!r}", flush=True)
                for n in numbers:
                    self.sent[n] = 2
                self.uncertain += len(numbers)
                await asyncio.sleep(0.1)
                continue
            for n, info in zip(numbers, infos, strict=True):
                if not info.created:
                    raise RuntimeError(f"job {info.id} was not created: {info.status}")
                self.sent[n] = 1
            self.acked += len(numbers)

    # --- faults ------------------------------------------------------------------------------------

    async def reset_now_and_then(self, name: str) -> None:
        proxy, rng = self.proxies[name], self.rng(f"reset {name}")
        while not self.stop_faults.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_faults.wait(), rng.uniform(*RESET_EVERY))
                return
            self.cut[name] += await asyncio.to_thread(proxy.reset)
            self.resets[name] += 1

    async def blackhole_now_and_then(self) -> None:
        rng = self.rng("blackhole")
        while not self.stop_faults.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_faults.wait(), rng.uniform(*BLACKHOLE_EVERY))
                return
            name = rng.choice(sorted(self.proxies))
            self.proxies[name].blackhole = True
            try:
                await asyncio.sleep(BLACKHOLE_FOR)
            finally:
                self.proxies[name].blackhole = False
            self.blackholed[name] += 1

    def rng(self, purpose: str) -> random.Random:
        # One generator per fault loop: the proxies' jitter draws from `random` in their own threads, and
        # the loops interleave by timing, so only separate streams make `--seed` repeat a schedule.
        return random.Random(None if self.seed is None else f"{self.seed}:{purpose}")

    def faults_text(self) -> str:
        return "/".join(str(self.resets[n]) for n in ("redis", "http")) + "/" + str(sum(self.blackholed.values()))

    # --- observation -------------------------------------------------------------------------------

    async def sample(self, probe: redis.asyncio.Redis) -> Sample:
        info = await probe.info("memory")
        sample = Sample(self.elapsed(), self.daemon_rss(), int(info["used_memory"]), int(await probe.dbsize()))
        self.samples.append(sample)
        return sample

    async def queue_stats(self, probe: redis.asyncio.Redis) -> transitions.QueueStats:
        reply = (await transport.execute_async(probe, [transitions.stats_call(self.keys)]))[0]
        return transitions.parse_stats(self.keys, reply)

    async def handler_stats(self, session: aiohttp.ClientSession) -> dict[str, int]:
        async with session.get(f"{self.handler_url}/stats") as resp:
            stats: dict[str, int] = await resp.json()
            return stats

    async def report(self, probe: redis.asyncio.Redis, session: aiohttp.ClientSession, sample: Sample) -> None:
        # Read the acknowledged count first: a job stored after this read shows up in the queue, never
        # in `done`, so `done` can only be underestimated and `lost>=` never reports a loss that is not.
        enqueued = self.acked
        stats = await self.queue_stats(probe)
        seen = await self.handler_stats(session)
        in_flight = stats.pending + stats.active + stats.scheduled
        done = max(0, enqueued - in_flight - stats.dead)
        print(
            f"{sample.at:>7.0f}s {enqueued:>9} {done:>9} {stats.pending:>7} {stats.active:>6} {stats.scheduled:>5} "
            f"{stats.dead:>5} {in_flight:>9} {max(0, done - seen['distinct']):>6} {seen['duplicate_ids']:>5} "
            f"{mib(sample.rss):>9} {mib(sample.used_memory):>9} {sample.keys:>6} {self.faults_text():>8}",
            flush=True,
        )

    async def observe(self, probe: redis.asyncio.Redis, session: aiohttp.ClientSession) -> None:
        print(
            f"{'elapsed':>8} {'enqueued':>9} {'done':>9} {'pending':>7} {'active':>6} {'sched':>5} {'dead':>5} "
            f"{'in-flight':>9} {'lost>=':>6} {'dups':>5} {'RSS':>9} {'used_mem':>9} {'keys':>6} "
            f"{'r/r/bh':>8}",
            flush=True,
        )
        next_sample, next_report = SAMPLE_EVERY, self.report_every
        while not self.stop_load.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_load.wait(), max(0.0, min(next_sample, next_report) - self.elapsed()))
            self.check_alive()
            sample = await self.sample(probe)
            next_sample = sample.at + SAMPLE_EVERY
            if sample.at >= next_report - 0.01 or self.stop_load.is_set():
                await self.report(probe, session, sample)
                next_report += self.report_every

    async def run(self) -> None:
        probe = redis.asyncio.Redis(host="127.0.0.1", port=self.server.port)
        async with (
            AsyncClient.from_url(self.server.url, namespace=NAMESPACE) as client,
            aiohttp.ClientSession() as session,
        ):
            self.started = time.monotonic()
            faults = [asyncio.create_task(self.reset_now_and_then(n), name=f"reset {n}") for n in self.proxies]
            if self.blackholes:
                faults.append(asyncio.create_task(self.blackhole_now_and_then(), name="blackhole"))
            observer = asyncio.create_task(self.observe(probe, session), name="observer")
            producer = asyncio.create_task(self.produce(client), name="producer")
            try:
                await asyncio.wait([producer, observer], return_when=asyncio.FIRST_COMPLETED)
                self.stop_load.set()
                await asyncio.gather(producer, observer)
            finally:
                self.stop_load.set()
                self.stop_faults.set()
                for task in (producer, observer, *faults):
                    if not task.done():
                        task.cancel()
                await asyncio.gather(producer, observer, *faults, return_exceptions=True)
            for proxy in self.proxies.values():
                proxy.blackhole = False
            print(
                f"  load ended after {self.load_seconds:.0f} s; faults stopped (latency stays); settling...", flush=True
            )
            settle_start = time.monotonic()
            deadline = settle_start + self.settle
            while time.monotonic() < deadline:
                self.check_alive()
                stats = await self.queue_stats(probe)
                if stats.pending + stats.active + stats.scheduled == 0:
                    self.settled = True
                    break
                await asyncio.sleep(0.5)
            self.settle_seconds = time.monotonic() - settle_start
            await self.report(probe, session, await self.sample(probe))
        await probe.aclose()


# --------------------------------------------------------------------------------------------------
# The verdict


@dataclass
class Audit:
    done: int = 0
    vanished: list[str] = field(default_factory=list)  # hash gone, never ran: lost
    unsettled: dict[str, str] = field(default_factory=dict)  # id -> state, still in the queue: lost
    dead: dict[str, str] = field(default_factory=dict)  # id -> last error
    duplicate_ids: int = 0
    extra_runs: int = 0
    phantoms: int = 0  # the handler ran an id that was never acknowledged nor uncertain
    uncertain_ran: int = 0

    @property
    def lost(self) -> int:
        return len(self.vanished) + len(self.unsettled)


def chunks(n: int, size: int) -> Iterator[range]:
    for first in range(0, n, size):
        yield range(first, min(n, first + size))


def audit(soak: Soak, counts: bytes) -> Audit:
    result = Audit()
    keys = soak.keys
    with soak.server.client() as client:
        for part in chunks(len(soak.sent), 2000):
            acked = [n for n in part if soak.sent[n] == 1]
            pipe = client.pipeline(transaction=False)
            for n in acked:
                pipe.hget(keys.job(f"{ID_PREFIX}{n}"), "state")
            for n, state in zip(acked, pipe.execute(), strict=True):
                job_id, runs = f"{ID_PREFIX}{n}", counts[n] if n < len(counts) else 0
                if state is None:
                    if runs:
                        result.done += 1
                    else:
                        result.vanished.append(job_id)
                elif state.decode() == State.DEAD.value:
                    job = replies.parse_job(job_id, keys.queue, client.hgetall(keys.job(job_id)))
                    result.dead[job_id] = _reason(job)
                else:
                    result.unsettled[job_id] = state.decode()
    for n, runs in enumerate(counts):
        if runs > 1:
            result.duplicate_ids += 1
            result.extra_runs += runs - 1
        if runs and (n >= len(soak.sent) or soak.sent[n] == 0):
            result.phantoms += 1
        elif runs and soak.sent[n] == 2:
            result.uncertain_ran += 1
    return result


def _reason(job: Job) -> str:
    return (job.last_error or "no error recorded")[:120]


def growth(samples: list[Sample], attr: str, load_seconds: float) -> tuple[float, float, float, float] | None:
    """(warm-up median, end median, growth fraction, slope per hour after warm-up), None if too few samples."""
    warm = [getattr(s, attr) for s in samples if WARMUP[0] * load_seconds <= s.at < WARMUP[1] * load_seconds]
    end = [getattr(s, attr) for s in samples if (1 - END_WINDOW) * load_seconds <= s.at <= load_seconds]
    after = [s for s in samples if WARMUP[0] * load_seconds <= s.at <= load_seconds]
    if not warm or not end or len(after) < 2:
        return None
    base, last = statistics.median(warm), statistics.median(end)
    slope = statistics.linear_regression([s.at for s in after], [float(getattr(s, attr)) for s in after]).slope
    return base, last, (last - base) / base if base else 0.0, slope * 3600


_ADDRESS: Final = re.compile(r"0x[0-9a-f]+")


def _gist(text: str) -> str:
    """The last line of a message or traceback, with object addresses blanked so repeats group together."""
    lines = text.strip().splitlines() or [""]
    return _ADDRESS.sub("0x…", lines[-1].strip())[:150]


_BLOCK_HEADERS: Final = ("Task exception was never retrieved", "Future exception was never retrieved",
                         "Exception in callback")  # fmt: skip
_CHAINED: Final = ("During handling of the above exception", "The above exception was the direct cause", "future:")


def _starts_block(text: str, block: list[str]) -> bool:
    """Whether a non-JSON line starts a new report (asyncio's headers; a traceback after a finished one)."""
    if text.startswith(_BLOCK_HEADERS):
        return True
    previous = block[-1]
    return text.startswith("Traceback (") and not previous.startswith(_CHAINED + _BLOCK_HEADERS)


def daemon_log_summary(daemon: DaemonProcess) -> list[str]:
    """Counts per level and the commonest warnings and errors. Lines that are not JSON (a traceback that
    reached stderr, such as asyncio's "Task exception was never retrieved") count once per block, named by
    their first and last lines."""
    blocks: Counter[str] = Counter()
    messages: Counter[str] = Counter()
    raw: list[str] = []

    def end_block() -> None:
        if raw:
            blocks["stderr"] += 1
            messages[f"stderr: {raw[0][:60]} … {_gist(raw[-1])}"] += 1
            raw.clear()

    for line in daemon.lines():
        level = str(line.get("level", "?"))
        if level == "raw":
            text = str(line.get("msg", ""))
            if raw and _starts_block(text, raw):
                end_block()
            if text.strip():
                raw.append(text)
            continue
        end_block()
        blocks[level] += 1
        if level in ("warning", "error", "critical"):
            error = f": {_gist(str(line['error']))}" if "error" in line else ""
            messages[f"{level}: {str(line.get('msg', ''))[:120]}{error}"] += 1
    end_block()
    counts = ", ".join(f"{k} {v}" for k, v in sorted(blocks.items())) or "none"
    out = [f"daemon log: {counts} (stderr: blocks of non-JSON lines)"]
    out += [f"  {count:>6} x {msg}" for msg, count in messages.most_common(10)]
    return out


def memory_line(label: str, figures: tuple[float, float, float, float] | None, unit: str) -> str:
    if figures is None:
        return f"  {label:<24} too few samples for a verdict"
    base, last, frac, slope = figures

    def fmt(value: float) -> str:
        return mib(value) if unit == "MiB" else f"{value:.0f}"

    verdict = "" if unit != "MiB" else ("flat; " if frac < FLAT_GROWTH else "NOT flat; ")
    sign = "+" if slope >= 0 else "-"
    return f"  {label:<24} warm-up {fmt(base)}, end {fmt(last)}: {frac:+.1%} ({verdict}slope {sign}{fmt(abs(slope))}/h)"


def summary(soak: Soak, result: Audit, seen: dict[str, int], daemon_exit: int | None) -> list[str]:
    settled = f"in {soak.settle_seconds:.1f} s" if soak.settled else f"NOT within {soak.settle:.0f} s"
    if not soak.settled and soak.settle_seconds == 0:
        settled = "never (the run failed before the settle phase)"
    uncertain = f"  (+{soak.uncertain} uncertain enqueues)" if soak.uncertain else ""
    lost_detail = f"  ({len(result.vanished)} gone without running, {len(result.unsettled)} still queued)"
    lines = [
        "",
        f"summary: {soak.load_seconds:.0f} s of load at {soak.rate:g} jobs/s, settled {settled}",
        f"  enqueued (acknowledged)  {soak.acked}{uncertain}",
        f"  completed                {result.done}",
        f"  lost                     {result.lost}{lost_detail if result.lost else ''}",
        f"  dead                     {len(result.dead)}",
        f"  duplicates               {result.duplicate_ids} ids ran more than once ({result.extra_runs} extra runs, "
        f"{seen['runs']} handler runs in all)",
        "    at-least-once allows them: a reset that cuts the handler's response or the ack to Redis makes the job",
        "    run again; the handler must be idempotent by Jobcar-Job-Id.",
        f"  integrity                {seen['mismatched']} bodies not matching their id, {result.phantoms} ids run "
        f"that were never enqueued, {seen['foreign']} foreign ids",
    ]
    if result.uncertain_ran:
        lines.append(f"  uncertain enqueues that ran anyway: {result.uncertain_ran}")
    lines += [f"    still queued: {job_id} ({state})" for job_id, state in list(result.unsettled.items())[:10]]
    lines += [f"    gone without running: {job_id}" for job_id in result.vanished[:10]]
    lines += [f"    dead x{count}: {reason}" for reason, count in Counter(result.dead.values()).most_common(10)]
    for name in soak.proxies:
        lines.append(
            f"  faults, {name + ' proxy':<15} {soak.resets[name]} resets cutting {soak.cut[name]} connections, "
            f"{soak.blackholed[name]} blackholes of {BLACKHOLE_FOR:g} s"
        )
    rss = growth(soak.samples, "rss", soak.load_seconds)
    used = growth(soak.samples, "used_memory", soak.load_seconds)
    lines.append(memory_line("daemon RSS", rss, "MiB"))
    lines.append(memory_line("Redis used_memory", used, "MiB"))
    lines.append(memory_line("Redis keys", growth(soak.samples, "keys", soak.load_seconds), "keys"))
    flat = all(f is not None and f[2] < FLAT_GROWTH for f in (rss, used))
    memory = "unknown" if rss is None or used is None else "flat" if flat else "NOT flat"
    peak = max((s.rss for s in soak.samples), default=0)
    lines.append(f"  daemon RSS peak          {mib(peak)}; daemon exit status {daemon_exit}")
    lines += ["  " + line for line in daemon_log_summary(soak.daemon)]
    verdict = "PASS" if result.lost == 0 and flat and daemon_exit == 0 else "FAIL"
    lines.append(f"criterion 16: {verdict} ({result.lost} lost, memory {memory})")
    return lines


# --------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=duration, default=600.0, help="load phase (default 10m; criterion: 1h)")
    parser.add_argument("--rate", type=float, default=200.0, help="jobs enqueued per second (default 200)")
    parser.add_argument("--report-every", type=duration, default=30.0, help="default 30s")
    parser.add_argument("--settle", type=duration, default=180.0, help="deadline to drain after the load (3m)")
    parser.add_argument(
        "--blackhole",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"blackhole one proxy for {BLACKHOLE_FOR:g} s every 60-180 s (default on)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault schedule")
    parser.add_argument("--dir", type=Path, default=None, help="keep the server's data and the daemon's log here")
    parser.add_argument("--serve-handler", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_handler is not None:
        serve_handler(args.serve_handler)
        return 0
    if args.rate <= 0:
        parser.error("--rate must be positive")
    binary = find_server_binary()
    with contextlib.ExitStack() as stack:
        if args.dir is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="jobcar-soak-")))
        else:
            tmp = args.dir.resolve()
            tmp.mkdir(parents=True, exist_ok=True)
        server = RedisServer(binary, tmp / "redis", extra_args=("--appendonly", "yes", "--appendfsync", "everysec"))
        server.start()
        stack.callback(server.stop)
        handler_port = free_port()
        handler = subprocess.Popen(
            [sys.executable, __file__, "--serve-handler", str(handler_port)], start_new_session=True
        )
        stack.callback(stop_process, handler)
        handler_url = f"http://127.0.0.1:{handler_port}"
        wait_for(
            lambda: urllib.request.urlopen(f"{handler_url}/stats", timeout=1).status == 200,
            timeout=20,
            what="the soak handler",
        )
        proxies = {"redis": FaultProxy("127.0.0.1", server.port), "http": FaultProxy("127.0.0.1", handler_port)}
        for proxy in proxies.values():
            proxy.start()
            stack.callback(proxy.stop)
        proxies["redis"].latency, proxies["redis"].jitter = REDIS_LATENCY, REDIS_JITTER
        proxies["http"].latency, proxies["http"].jitter = HTTP_LATENCY, HTTP_JITTER
        config = write_config(
            tmp,
            proxies["redis"].url_for_redis(),
            NAMESPACE,
            {JOB_TYPE: {"url": f"http://127.0.0.1:{proxies['http'].port}/job"}},
            **DAEMON_SETTINGS,
        )
        daemon = DaemonProcess(config).start()
        stack.callback(daemon.stop)
        with server.client() as c:
            version = c.info("server").get("redis_version")
        redis_ms = f"{REDIS_LATENCY * 1000:g}-{(REDIS_LATENCY + REDIS_JITTER) * 1000:g}"
        http_ms = f"{HTTP_LATENCY * 1000:g}-{(HTTP_LATENCY + HTTP_JITTER) * 1000:g}"
        print(
            f"jobcar {jobcar.__version__} soak: {args.duration:g} s at {args.rate:g} jobs/s; {binary} {version} "
            f"(AOF everysec, noeviction); daemon pid {daemon.pid}, lease 30s, concurrency 20; proxies add "
            f"{redis_ms} ms (Redis) and {http_ms} ms (HTTP) per chunk, reset every {RESET_EVERY[0]:g}-"
            f"{RESET_EVERY[1]:g} s each, blackholes {'on' if args.blackhole else 'off'}; work dir {tmp}",
            flush=True,
        )
        print("  columns: r/r/bh = Redis proxy resets / HTTP proxy resets / blackholes so far", flush=True)
        soak = Soak(
            args.duration,
            args.rate,
            args.report_every,
            args.settle,
            args.blackhole,
            args.seed,
            server,
            daemon,
            handler,
            handler_url,
            proxies,
        )
        failure: BaseException | None = None
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(soak.run())
        except KeyboardInterrupt:
            print("aborted", flush=True)
            return 130
        except RuntimeError as exc:  # a process died: say so, then audit what we have
            failure = exc
            print(f"FAILED: {exc}", flush=True)
            if handler.poll() is not None:
                return 1  # its counts died with it: no audit is possible
        with urllib.request.urlopen(f"{handler_url}/counts", timeout=60) as resp:
            counts = resp.read()
        with urllib.request.urlopen(f"{handler_url}/stats", timeout=10) as resp:
            seen = json.loads(resp.read())
        result = audit(soak, counts)
        daemon.stop()
        daemon_exit = daemon.process.returncode if daemon.process is not None else None
        for line in summary(soak, result, seen, daemon_exit):
            print(line, flush=True)
        return 1 if result.lost or failure is not None else 0


if __name__ == "__main__":
    sys.exit(main())
