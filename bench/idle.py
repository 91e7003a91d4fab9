"""Idle Redis load: commands per second per queue of one daemon that serves idle queues.

    .venv/bin/python bench/idle.py [--queues 1 5 20] [--seconds 30] [--by-script] [--pattern]

For each queue count, a private redis-server (from the same binary the tests use) and one `jobcar run`
serving that many empty queues, with a schedule on none of them; after a warm-up, the deltas of `INFO
commandstats` over the window. Every command counts, the ones a script runs inside Redis too (what the
server does for the daemon), except INFO itself (this bench's own). The figure is the total divided by
the queue count: a daemon's fixed cost (its announce, its alive key) weighs most with one queue.

--by-script also counts, through MONITOR in the same window, the script calls (EVALSHA) by script name
and the commands sent outside scripts: which loop sends what. MONITOR slows Redis a little; the
commandstats figure is taken in the same window either way.

--pattern serves the same queues through one pattern (`queues: {"q*": 1}`, ADR 0027), their names
registered in `<namespace>:queues` before the daemon starts, as a producer would have: what a dynamic
queue costs against a named one.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis
from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary

from jobcar import scripts
from jobcar.keys import queues_key

#: Before the window: the daemon's start-up (its first reap, schedule sync, announce) is not idle load.
WARM_UP = 2.0
#: The lease of the bench's daemon: the default one (the heartbeat's alive key and the reaper follow it).
LEASE = "30s"


def command_counts(probe: redis.Redis) -> Counter[str]:
    """Calls per command since the server started, INFO's left out."""
    stats = probe.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if "info" not in k})


def script_names() -> dict[str, str]:
    """sha1 -> script name, for every script of the daemon's lua directory."""
    lua = Path(scripts.__file__).parent / "lua"
    names = {}
    for path in lua.glob("*.lua"):
        names[scripts.script(path.stem).sha] = path.stem
    return names


class Monitor:
    """MONITOR in a thread: what the daemon sends (not what scripts run inside), by command or script."""

    def __init__(self, server: RedisServer) -> None:
        self.client = redis.Redis.from_url(server.url)
        self.sent: Counter[str] = Counter()
        self.counting = False
        self._names = script_names()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with contextlib.suppress(redis.ConnectionError), self.client.monitor() as monitor:
            for event in monitor.listen():
                if not self.counting:
                    continue
                if "lua" in str(event.get("client_type", "")) or "lua" in str(event.get("client_address", "")):
                    continue  # run by a script: commandstats counts those
                words = str(event.get("command", "")).split()
                if not words:
                    continue
                name = words[0].upper()
                if name == "INFO":
                    continue
                if name == "EVALSHA" and len(words) > 1:
                    name = f"EVALSHA {self._names.get(words[1], words[1][:8])}"
                self.sent[name] += 1

    def start(self) -> Monitor:
        self._thread.start()
        return self


def idle_load(
    binary: str, tmp: Path, queues: int, seconds: float, by_script: bool = False, pattern: bool = False
) -> dict[str, object]:
    """One daemon serving `queues` idle queues (by name, or by one pattern): commands/s per queue, and the
    counts behind it."""
    server = RedisServer(binary, tmp / f"idle{queues}").start()
    names = {f"q{n}": 1 for n in range(queues)}
    if pattern:
        with server.client() as seeding:
            seeding.sadd(queues_key(f"idle{queues}"), *names)
    config = write_config(tmp, server.url, f"idle{queues}", {"x": {"url": "http://127.0.0.1:9/"}},
                          log_level="info", queues={"q*": 1} if pattern else names, lease=LEASE)  # fmt: skip
    daemon = DaemonProcess(config).start()
    monitor = Monitor(server).start() if by_script else None
    try:
        with server.client() as probe:
            time.sleep(WARM_UP)
            before = command_counts(probe)
            if monitor is not None:
                monitor.counting = True
            time.sleep(seconds)
            if monitor is not None:
                monitor.counting = False
            delta = command_counts(probe) - before
    finally:
        daemon.stop()
        server.stop()
    total = sum(delta.values())
    return {
        "queues": queues,
        "per_queue": total / seconds / queues,
        "per_second": total / seconds,
        "commands": dict(delta.most_common()),
        "sent": dict(monitor.sent.most_common()) if monitor is not None else {},
    }


def idle_commands_per_queue(binary: str, tmp: Path, seconds: float = 10, queues: int = 3) -> float:
    """The table's figure (bench/run.py, bench/daemon.py)."""
    return float(idle_load(binary, tmp, queues, seconds)["per_queue"])  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 5, 20])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--by-script", action="store_true")
    parser.add_argument("--pattern", action="store_true", help="serve the queues through one pattern, q*")
    args = parser.parse_args()
    binary = find_server_binary()
    with tempfile.TemporaryDirectory() as directory:
        for queues in args.queues:
            result = idle_load(binary, Path(directory), queues, args.seconds, args.by_script, args.pattern)
            print(f"{queues:>3} queues: {result['per_queue']:.2f} commands/s per queue "
                  f"({result['per_second']:.2f}/s in all, {args.seconds:g} s)")  # fmt: skip
            seconds = args.seconds
            counts = result["commands"]
            assert isinstance(counts, dict)
            print("     commandstats/s: " + ", ".join(f"{k} {v / seconds:.2f}" for k, v in counts.items()))
            sent = result["sent"]
            assert isinstance(sent, dict)
            if sent:
                print("     sent/s:         " + ", ".join(f"{k} {v / seconds:.2f}" for k, v in sent.items()))


if __name__ == "__main__":
    main()
