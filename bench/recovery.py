"""Recovery time after a `kill -9`: how long a job whose daemon died waits before it runs again.

    .venv/bin/python bench/recovery.py [--leases 30s,3s] [--rounds 3]

For each lease length: one redis-server, two real `jobcar run` daemons (A, then B once A runs the job), one
command handler that sleeps through its first attempt. A is killed with SIGKILL while it runs the job. The
figures, in Redis time, per round: from the kill to the reap that put the job back in pending (the job's
`run_at`, which the reap script sets), and from the lease's expiry (its deadline in the active set, read
after the kill) to that reap. The reaper wakes when the earliest lease in Redis expires (docs/operations.md,
"Sizing the lease"), so the second figure is a few ms and the first is at most the lease. Prints every
round and the medians.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary, wait_for

from jobcar import Client
from jobcar.keys import QueueKeys
from jobcar.units import parse_duration

HANDLER = """\
import os, time
with open(os.environ["RUNS"], "a") as f:
    f.write(os.environ["JOBCAR_ATTEMPT"] + "\\n")
if os.environ["JOBCAR_ATTEMPT"] == "1":
    time.sleep(600)
"""


def redis_ms(client: object) -> int:
    seconds, microseconds = client.time()  # type: ignore[attr-defined]
    return int(seconds) * 1000 + int(microseconds) // 1000


def one_round(directory: Path, server: RedisServer, lease: str, n: int) -> tuple[int, int]:
    """(ms from the kill to the reap, ms from the lease's expiry to the reap)."""
    namespace = f"recovery-{lease}-{n}"
    runs = directory / f"runs-{n}"
    handler = directory / "handler.py"
    handler.write_text(HANDLER)
    command = {"command": [sys.executable, str(handler)], "env": {"RUNS": str(runs)}, "timeout": "15m"}
    config = write_config(directory, server.url, namespace, {"work": command}, lease=lease, result_ttl="1h")
    keys = QueueKeys.of(namespace, "default")
    with server.client() as client:
        a = DaemonProcess(config).start()
        b = DaemonProcess(config)
        try:
            with Client(client, namespace=namespace) as producer:
                job_id = producer.enqueue("work", None).id
            try:
                wait_for(lambda: runs.exists() and runs.read_text() == "1\n", timeout=30, what="A to run the job")
            except TimeoutError:
                raise SystemExit(f"A did not run the job:\n{a.log_tail(30)}") from None
            b.start().wait_for_log("jobcar running")
            killed_at = redis_ms(client)
            a.signal(signal.SIGKILL)
            a.wait()
            deadline = client.zscore(keys.active, job_id)
            assert deadline is not None
            wait_for(lambda: client.hget(keys.job(job_id), "run_at") is not None, timeout=120, what="the reap")
            run_at = int(client.hget(keys.job(job_id), "run_at") or 0)
            return run_at - killed_at, run_at - int(deadline)
        finally:
            a.stop()
            b.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", default="30s,3s", help="lease lengths, comma-separated (default 30s,3s)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobcar-recovery-") as tmp:
        server = RedisServer(find_server_binary(), Path(tmp) / "redis").start()
        try:
            for lease in args.leases.split(","):
                after_kill, after_expiry = [], []
                for n in range(args.rounds):
                    since_kill, since_expiry = one_round(Path(tmp), server, lease, n)
                    after_kill.append(since_kill)
                    after_expiry.append(since_expiry)
                    print(f"lease {lease}: reaped {since_kill} ms after the kill, {since_expiry} ms after the lease "
                          f"expired", flush=True)  # fmt: skip
                print(f"lease {lease} ({parse_duration(lease):g} s), median of {args.rounds}: "
                      f"{statistics.median(after_kill):.0f} ms after the kill, "
                      f"{statistics.median(after_expiry):.0f} ms after the lease expired", flush=True)  # fmt: skip
        finally:
            server.stop()


if __name__ == "__main__":
    main()
