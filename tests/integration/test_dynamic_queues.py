"""Dynamic queues (ADR 0027): a daemon serves the queues its config's patterns match, found in
`<namespace>:queues` while it runs. The in-process Runner with its loops running (and `jobcar run` once),
against the session's real server; every wait is on a condition."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from jobcar.fleet import live_daemons
from jobcar.keys import queues_key
from jobcar.outcome import Outcome
from jobcar.runner import Runner
from tests.integration.conftest import StartDaemon
from tests.integration.daemon_harness import wait_gone, write_config
from tests.integration.driver import QueueDriver
from tests.integration.test_daemon_parts import (
    MakeParts,
    Returns,
    Target,
    any_target,
    eventually,
    make_parts,
    target,
)
from tests.integration.test_idle_loops import counted
from tests.integration.test_operations import jobcar

__all__ = ["any_target", "make_parts", "target"]  # the fixtures this module uses


@contextlib.asynccontextmanager
async def running(runner: Runner) -> AsyncIterator[Runner]:
    """The runner's loops running, as `jobcar run` runs them; drained at the end."""
    task = asyncio.create_task(runner.run())
    try:
        yield runner
    finally:
        runner.drain()
        await asyncio.wait_for(task, 10)


def weights(runner: Runner) -> dict[str, int]:
    return {q.keys.queue: q.weight for q in runner.leaser.queues}


@pytest.mark.asyncio
async def test_a_pattern_serves_a_queue_first_used_after_the_daemon_started(
    any_target: Target, make_parts: MakeParts
) -> None:
    target = any_target  # the standalone server, then the Cluster: SCARD and SMEMBERS of one key on either
    done = Returns(Outcome.success())
    parts = await make_parts(target, {"t": done}, queues={}, queue_patterns={"tenant-*": 2})
    async with running(parts.runner) as runner:
        await eventually(lambda: runner.discovery._size is not None, "the first look at the queues set")
        assert weights(runner) == {}
        tenant = target.driver("tenant-42").enqueue("t", {"n": 1})
        other = target.driver("other").enqueue("t", {"n": 2})
        await eventually(lambda: tenant.id in done.ran, "the job of the new tenant queue to run")
        await eventually(lambda: target.driver("tenant-42").job(tenant.id) is None, "its ack")
        assert weights(runner) == {"tenant-42": 2}  # the pattern's weight; "other" matches none
        assert other.id not in done.ran
        # Every part serves it: the reaper, scheduler, settler and history hold its keys too.
        assert [k.queue for k in runner.reaper.queues] == ["tenant-42"]
        assert [k.queue for k in runner.scheduler.queues] == ["tenant-42"]
        assert list(runner.settler.queues) == ["tenant-42"]
        assert runner.history.queues == ["tenant-42"]
        await runner.announcer.announce()  # the dashboard's live daemons list it
        [entry] = [d for d in await live_daemons(runner.link.client, target.namespace) if d.id == runner.announcer.id]
        assert entry.queues == ("tenant-42",)
        # A second tenant later: a queue added while others are served.
        later = target.driver("tenant-7").enqueue("t", {"n": 3})
        await eventually(lambda: later.id in done.ran, "the job of a tenant queue added later to run")
    assert target.redis.sismember(queues_key(target.namespace), "other")


@pytest.mark.asyncio
async def test_each_matched_queue_takes_its_patterns_weight_and_a_literal_wins(
    target: Target, make_parts: MakeParts
) -> None:
    done = Returns(Outcome.success())
    parts = await make_parts(
        target, {"t": done}, queues={"tenant-vip": 9}, queue_patterns={"tenant-*": 1, "batch-?": 3, "*": 5}
    )
    async with running(parts.runner) as runner:
        jobs = [target.driver(q).enqueue("t", {"q": q}) for q in ("tenant-vip", "tenant-a", "batch-x", "misc")]
        await eventually(lambda: all(j.id in done.ran for j in jobs), "a job of each queue to run")
        # The literal keeps its own weight; each other queue the first pattern (in the file's order) it matches.
        assert weights(runner) == {"tenant-vip": 9, "tenant-a": 1, "batch-x": 3, "misc": 5}
        assert runner.leaser.alive is None  # no lease behind a wait: the patterns may add queues (ADR 0005)


@pytest.mark.asyncio
async def test_a_reload_adds_a_pattern_and_changes_its_weight(target: Target, make_parts: MakeParts) -> None:
    done = Returns(Outcome.success())
    parts = await make_parts(target, {"t": done})  # queues {"default": 1}, no pattern
    async with running(parts.runner) as runner:
        late = target.driver("late-1").enqueue("t", {"n": 1})
        first = target.driver().enqueue("t", {"n": 0})
        await eventually(lambda: first.id in done.ran, "the default queue's job")
        assert not runner.discovery._enabled.is_set()  # no pattern: the discovery sends nothing
        runner.apply(dataclasses.replace(runner.config, queue_patterns={"late-*": 2}), {"t": done})
        await eventually(lambda: late.id in done.ran, "the job of the queue the reloaded pattern matches")
        assert weights(runner) == {"default": 1, "late-1": 2}
        # The one-queue daemon's lease behind its wait stops: it serves two queues now.
        assert runner.leaser._lease_on_wake_count(runner.leaser.queues[0]) == 0
        runner.apply(dataclasses.replace(runner.config, queue_patterns={"late-*": 4}), {"t": done})
        assert weights(runner) == {"default": 1, "late-1": 4}
        # A reload without the pattern keeps serving what it matched, until a restart.
        runner.apply(dataclasses.replace(runner.config, queue_patterns={}), {"t": done})
        again = target.driver("late-1").enqueue("t", {"n": 2})
        await eventually(lambda: again.id in done.ran, "a job of the queue matched before the reload")


def test_jobcar_run_with_only_a_pattern_serves_a_new_queue(start_daemon: StartDaemon, target: Target) -> None:
    daemon = start_daemon({"t": {"command": ["true"]}}, queues={"tenant-*": 1})
    q = QueueDriver(target.redis, target.namespace, "tenant-9")
    info = q.enqueue("t", {"n": 1})
    wait_gone(q, info.id, daemon)


@pytest.mark.asyncio
async def test_a_look_at_an_unchanged_queues_set_is_one_scard(target: Target, make_parts: MakeParts) -> None:
    parts = await make_parts(target, queues={}, queue_patterns={"tenant-*": 1})
    discovery = parts.runner.discovery
    sent = counted(parts)
    assert await discovery.look() == []
    assert sent.commands == ["SMEMBERS"], "the first look reads the names"
    sent.clear()
    assert await discovery.look() == []
    assert sent.commands == ["SCARD"], "then the size alone while it does not change"
    target.redis.sadd(queues_key(target.namespace), "tenant-1", "unmatched")
    sent.clear()
    assert await discovery.look() == ["tenant-1"]
    assert sent.commands == ["SCARD", "SMEMBERS"]
    assert discovery.found == {"tenant-1": 1}


@pytest.mark.asyncio
async def test_without_a_pattern_the_discovery_never_looks(target: Target, make_parts: MakeParts) -> None:
    parts = await make_parts(target)
    assert not parts.runner.discovery._enabled.is_set()  # its loop waits on this event: no command, ever


def test_a_reload_of_jobcar_run_adds_a_pattern_and_the_cli_lists_the_queue(
    start_daemon: StartDaemon, target: Target
) -> None:
    daemon = start_daemon({"t": {"command": ["true"]}})  # queues: the default one
    late = QueueDriver(target.redis, target.namespace, "late-1")
    info = late.enqueue("t", {"n": 1})
    config = json.loads(daemon.config_path.read_text())
    config["queues"] = {"default": 1, "late-*": 3}
    daemon.config_path.write_text(json.dumps(config))
    check = jobcar(daemon.config_path, "check")
    assert check.returncode == 0, check
    assert "1 queue, 1 queue pattern" in check.stdout
    daemon.signal(signal.SIGHUP)
    daemon.wait_for_log("reloaded")
    wait_gone(late, info.id, daemon)
    served = daemon.wait_for_log("serving a queue its pattern matches")
    assert served["queue"] == "late-1"
    assert "weight 3" in served["msg"]
    stats = jobcar(daemon.config_path, "stats", "--json")
    assert stats.returncode == 0, stats
    assert "late-1" in stats.stdout


def test_a_schedule_set_on_a_queue_a_pattern_matches_is_served_so_no_note(target: Target, tmp_path: Path) -> None:
    config = write_config(tmp_path, target.url, target.namespace, {"t": {"command": ["true"]}},
                          queues={"default": 1, "late-*": 1})  # fmt: skip
    matched = jobcar(config, "schedules", "set", "a", "--type", "t", "--every", "1h", "--queue", "late-2")
    assert matched.returncode == 0, matched
    assert "is not in the queues" not in matched.stderr
    other = jobcar(config, "schedules", "set", "b", "--type", "t", "--every", "1h", "--queue", "other")
    assert other.returncode == 0, other
    assert "queue 'other' is not in the queues" in other.stderr
