"""Orphans (guarantee #9 of docs/delivery-semantics.md): an active job whose lease entry vanished is recovered,
by its own daemon while it runs, by the reaper when its token vanished, and by `jobcar fsck --repair` when
its daemon is gone too."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from jobcar import State
from tests.faults.test_crash_recovery import one_running_job, recording_handler, runs_of
from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.integration.driver import QueueDriver
from tests.integration.test_cli import cli
from tests.servers import RedisServer, wait_for

LEASE = 3.0
REAP_INTERVAL = LEASE / 2  # slack for a heartbeat or a reaper's pass to come round, and a handler to start


def test_a_vanished_deadline_entry_is_restored_by_the_running_daemon(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    # The first attempt outlives two leases, so it only finishes once if its lease survives the loss.
    with one_running_job(redis_server, namespace, tmp_path, 2 * LEASE) as job:
        client, q = job.client, job.q
        assert client.zrem(q.keys.active, job.job_id) == 1
        vanished = time.monotonic()
        wait_for(lambda: client.zscore(q.keys.active, job.job_id) is not None, timeout=2 * REAP_INTERVAL,
                 what="the heartbeat to restore the deadline entry")  # fmt: skip
        restored_after = time.monotonic() - vanished
        wait_for(lambda: q.job(job.job_id) is None, timeout=30, what="the job to finish")
        assert [attempt for _, attempt, _ in runs_of(job.runs)] == [1], "finished by its first attempt, run once"
        assert restored_after <= 2 * REAP_INTERVAL
        assert not [line for line in job.daemon.lines() if "lease lost" in line.get("msg", "")]


def test_a_vanished_token_makes_the_daemon_let_go_and_the_reaper_recover_the_job(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    with one_running_job(redis_server, namespace, tmp_path, 120) as job:
        q = job.q
        assert job.client.hdel(q.keys.job(job.job_id), "token") == 1
        vanished = time.monotonic()
        wait_for(lambda: len(runs_of(job.runs)) == 2, timeout=LEASE + 2 * REAP_INTERVAL + 5,
                 what="the reaper to give the job a second attempt")  # fmt: skip
        recovered_after = time.monotonic() - vanished
        wait_for(lambda: q.job(job.job_id) is None, timeout=30, what="the second attempt to finish")
        assert [attempt for _, attempt, _ in runs_of(job.runs)] == [1, 2]
        # Its deadline stood (nobody could renew it), so recovery takes at most the rest of the lease
        # and two reap ticks; a scheduling margin covers the loaded CI machine.
        assert recovered_after <= LEASE + 2 * REAP_INTERVAL + 2
        messages = [line.get("msg", "") for line in job.daemon.lines()]
        assert any("lease lost" in m for m in messages), "the heartbeat noticed and abandoned attempt 1"
        assert any("recovered an expired lease" in m for m in messages)


def test_an_orphan_left_by_a_dead_daemon_is_repaired_by_fsck(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    handler = {"command": [sys.executable, recording_handler(tmp_path, runs, 120)]}
    config = write_config(tmp_path, redis_server.url, namespace, {"work": handler}, lease="3s")
    first = DaemonProcess(config).start()
    with redis_server.client() as client:
        q = QueueDriver(client, namespace)
        job_id = q.producer.enqueue("work", {}).id
        wait_for(lambda: len(runs_of(runs)) == 1, what="the handler to start")
        first.signal(signal.SIGKILL)
        first.wait()
        # The job's only index entry vanishes with its daemon gone: nothing points at the hash anymore,
        # so no reaper can find it. fsck walks the hashes and does.
        assert client.zrem(q.keys.active, job_id) == 1
        orphan = q.job(job_id)
        assert orphan is not None
        assert orphan.state is State.ACTIVE
        repair = cli("fsck", "--repair", "--json", "-c", str(config))
        findings = [(f["kind"], f["id"], f["repaired"]) for f in json.loads(repair.stdout)]
        assert findings == [("active_without_lease", job_id, True)], repair
        second = DaemonProcess(config).start()
        try:
            wait_for(lambda: q.job(job_id) is None, timeout=30, what="the repaired job to finish")
        finally:
            second.stop()
    assert Counter(attempt for _, attempt, _ in runs_of(runs)) == {1: 1, 2: 1}
    clean = cli("fsck", "--json", "-c", str(config))
    assert (clean.returncode, json.loads(clean.stdout)) == (0, []), clean
