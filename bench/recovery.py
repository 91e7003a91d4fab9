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

from tests.faults.test_crash_recovery import expired_lease_deadline, one_running_job, redis_ms
from tests.integration.daemon_harness import DaemonProcess
from tests.servers import RedisServer, find_server_binary, wait_for

from jobcar.units import parse_duration


def one_round(directory: Path, server: RedisServer, lease: str, n: int) -> tuple[int, int]:
    """(ms from the kill to the reap, ms from the lease's expiry to the reap)."""
    namespace = f"recovery-{lease}-{n}"
    (directory / namespace).mkdir()
    with one_running_job(server, namespace, directory / namespace, 600, lease=lease, result_ttl="1h") as job:
        b = DaemonProcess(job.config)
        try:
            b.start().wait_for_log("jobcar running")
            killed_at = redis_ms(job.client)
            job.daemon.signal(signal.SIGKILL)
            job.daemon.wait()
            deadline = expired_lease_deadline(job.client, job.q, job.job_id)
            reaped = job.q.keys.job(job.job_id)
            wait_for(lambda: job.client.hget(reaped, "run_at") is not None, timeout=120, what="the reap")
            run_at = int(job.client.hget(reaped, "run_at") or 0)  # set by the reap, in Redis time
            return run_at - killed_at, run_at - deadline
        finally:
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
