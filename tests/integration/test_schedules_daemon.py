"""Schedules fired by real daemons to a real HTTP handler: once per tick with daemons killed and restarted,
the catch-up policies after the whole fleet was down, overlap skip, and schedules changed and removed while
daemons run."""

from __future__ import annotations

import itertools
import json
import random
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from jobcar.client import Client
from tests.integration.daemon_harness import (
    DaemonProcess,
    HandlerServer,
    Received,
    answer_ok,
    write_config,
)
from tests.integration.driver import QueueDriver
from tests.integration.test_cli import cli
from tests.servers import RedisServer, wait_for


def tick_of(req: Received) -> int:
    return int(datetime.fromisoformat(req.headers["jobcar-scheduled-at"]).timestamp() * 1000)


def runs(handlers: HandlerServer, path: str) -> list[tuple[int, int]]:
    """(tick, attempt) of each request the handler got, in arrival order."""
    return [(tick_of(r), int(r.headers["jobcar-attempt"])) for r in handlers.requests_to(path)]


def schedule_config(
    tmp_path: Path, server: RedisServer, namespace: str, url: str, schedules: dict[str, Any], **top: Any
) -> Path:
    return write_config(tmp_path, server.url, namespace, {"tick": {"url": url}}, schedules=schedules, **top)


@pytest.mark.soak
@pytest.mark.timeout(240)
def test_three_daemons_killed_and_restarted_for_two_minutes_fire_every_tick_once(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    url = handlers.url("/tick", answer_ok)
    config = schedule_config(tmp_path, redis_server, namespace, url, {"beat": {"every": "1s", "type": "tick"}})
    daemons = [DaemonProcess(config).start() for _ in range(3)]
    picks = random.Random(18)
    end = time.monotonic() + 120
    kills = 0
    for n in itertools.count():
        if time.monotonic() >= end:
            break
        victim = daemons[n % 3]
        time.sleep(picks.uniform(2.0, 4.0))
        victim.signal(signal.SIGKILL)
        victim.wait()
        kills += 1
        time.sleep(picks.uniform(0.2, 1.5))
        daemons[n % 3] = DaemonProcess(config).start()
    with redis_server.client() as r:
        state = Client(r, namespace=namespace).schedule("beat")
    assert state is not None
    assert state.last_ms is not None
    last = state.last_ms
    try:
        wait_for(lambda: set(range(last - 1000 * (state.fires - 1), last + 1, 1000)) <= {t for t, _ in runs(handlers,
                 "/tick")}, timeout=30, what="every tick fired so far to run")  # fmt: skip
    finally:
        for daemon in daemons:
            daemon.stop()
    seen = [(t, attempt) for t, attempt in runs(handlers, "/tick") if t <= last]
    ticks = sorted({t for t, _ in seen})
    print(f"{len(ticks)} ticks, {kills} kills: {[datetime.fromtimestamp(t / 1000).time().isoformat() for t in ticks]}")
    assert ticks == list(range(ticks[0], last + 1, 1000)), "a tick was missed"
    assert state.fires == len(ticks), "each tick fired once (the schedule's own count)"
    assert state.skipped == 0
    assert len(ticks) >= 100
    for tick in ticks:
        # A job whose daemon was killed runs again (attempt 2, ...); a tick fired twice would be a second job,
        # whose first attempt would come again.
        attempts = [attempt for t, attempt in seen if t == tick]
        assert len(attempts) == len(set(attempts)), f"tick {tick} was fired twice: attempts {attempts}"


def test_after_the_whole_fleet_was_down_none_latest_and_all_do_as_documented(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    paths = {policy: handlers.url(f"/{policy}", answer_ok) for policy in ("none", "latest", "all")}
    schedules = {policy: {"every": "1s", "type": policy, "catchup": policy, "catchup_window": "1h"}
                 for policy in paths}  # fmt: skip
    config = write_config(tmp_path, redis_server.url, namespace, {p: {"url": u} for p, u in paths.items()},
                          schedules=schedules)  # fmt: skip
    daemon = DaemonProcess(config).start()
    wait_for(lambda: all(len(handlers.requests_to(f"/{p}")) >= 2 for p in paths), timeout=20, what="ticks")
    daemon.signal(signal.SIGKILL)
    daemon.wait()
    with redis_server.client() as r:
        q = QueueDriver(r, namespace)
        client = Client(r, namespace=namespace)
        down_from = {p: client.schedule(p).next_ms for p in paths}  # type: ignore[union-attr]
        time.sleep(6)  # the fleet is down for six ticks: nothing can fire them, the test can only wait
        back = q.now_ms()
        missed = list(range(down_from["all"], back + 1, 1000))  # type: ignore[arg-type]

        def gap() -> dict[str, list[int]]:
            return {p: [t for t, _ in runs(handlers, f"/{p}") if down_from[p] <= t <= back] for p in paths}

        def latest_runs() -> list[int]:
            # The newest missed tick is the newest at the restarted daemon's first round, which may come a
            # tick or two after `back` on a slow start: every tick from the gap on counts.
            return sorted(t for t, _ in runs(handlers, "/latest") if t >= down_from["latest"])

        def none_runs() -> list[int]:
            return sorted(t for t, _ in runs(handlers, "/none") if t >= down_from["none"])

        def caught_up() -> bool:
            # Past the gap, and the jobs fired for it have reached the handler (a drain does not start them).
            fired = all(client.schedule(p).next_ms > back for p in paths)  # type: ignore[union-attr]
            return fired and bool(latest_runs()) and bool(none_runs()) and len(gap()["all"]) >= len(missed)

        daemon = DaemonProcess(config).start()
        try:
            wait_for(caught_up, timeout=20, what=f"every schedule past the gap\n{daemon.log_tail()}")
        finally:
            daemon.stop()
    seen = gap()
    latest = latest_runs()
    assert len(missed) >= 5
    assert seen["none"] == [], "none fires nothing of the gap"
    assert latest[0] >= back - 1000, f"latest fires the newest missed tick only, none older: {latest}"
    assert latest == list(range(latest[0], latest[0] + 1000 * len(latest), 1000)), "then every tick, once"
    assert latest[0] < none_runs()[0], "a missed tick: none's first after the restart is a later one"
    assert sorted(seen["all"]) == [t for t in missed if t >= down_from["all"]], "all fires every tick of the gap"


def test_overlap_skip_never_runs_two_at_once(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    def slow(req: Received) -> tuple[int, dict[str, str], bytes]:
        time.sleep(2.5)
        return 200, {}, b"ok"

    url = handlers.url("/slow", slow)
    config = schedule_config(tmp_path, redis_server, namespace, url,
                             {"slow": {"every": "1s", "type": "tick", "overlap": "skip"}})  # fmt: skip
    daemon = DaemonProcess(config).start()
    try:
        wait_for(lambda: len(handlers.requests_to("/slow")) >= 3, timeout=30, what="three runs")
    finally:
        daemon.stop()
    starts = [r.at for r in handlers.requests_to("/slow")]
    assert all(b - a >= 2.4 for a, b in itertools.pairwise(starts)), f"runs overlapped: {starts}"
    with redis_server.client() as r:
        state = Client(r, namespace=namespace).schedule("slow")
        assert state is not None
        assert state.skipped >= 2


def test_a_schedule_changed_then_removed_while_daemons_run(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    url = handlers.url("/tick", answer_ok)
    config = write_config(tmp_path, redis_server.url, namespace, {"tick": {"url": url}})
    daemons = [DaemonProcess(config).start() for _ in range(2)]
    with redis_server.client() as r:
        client = Client(r, namespace=namespace)
        client.upsert_schedule("live", type="tick", every="1s", payload={"v": 1})

        def bodies() -> list[Any]:
            return [json.loads(req.body) for req in handlers.requests_to("/tick")]

        wait_for(lambda: {"v": 1} in bodies(), timeout=20, what="the first version to run")
        client.upsert_schedule("live", type="tick", every="1s", payload={"v": 2})
        wait_for(lambda: {"v": 2} in bodies(), timeout=20, what="the changed payload to run")
        client.change_schedule("live", "remove")
        removed_at = q_now(r)
        count = len(handlers.requests_to("/tick"))
        wait_for(lambda: q_now(r) > removed_at + 2500, timeout=10)
        late = [req for req in handlers.requests_to("/tick")[count:] if tick_of(req) > removed_at]
        assert late == [], "no tick after the removal"
    for daemon in daemons:
        daemon.stop()
    seen = bodies()
    assert seen.index({"v": 2}) > max(i for i, b in enumerate(seen) if b == {"v": 1})


def q_now(r: Any) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_schedule_hash_of_another_type_is_logged_and_fires_again_after_fsck_repairs_it(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    """Not stopped silently: the daemon names the key once; after `fsck --repair` deleted it, the daemon writes
    the config's schedule again (no reload) and it fires."""
    url = handlers.url("/tick", answer_ok)
    config = schedule_config(tmp_path, redis_server, namespace, url, {"beat": {"every": "1s", "type": "tick"}})
    daemon = DaemonProcess(config).start()
    keys = QueueDriver(redis_server.client(), namespace).keys
    try:
        wait_for(lambda: handlers.requests_to("/tick"), timeout=20, what="the schedule to fire")
        with redis_server.client() as r:
            r.delete(keys.schedule("beat"))
            r.set(keys.schedule("beat"), "written by something else")
            broken_at = q_now(r)
            daemon.wait_for_log(f"WRONGTYPE jobcar: {keys.schedule('beat')} holds a string, not a hash")
            done = cli("fsck", "--repair", "--json", "-c", str(config))
            assert done.returncode == 0, (done.stdout, done.stderr)
            assert keys.schedule("beat") in done.stdout
            repaired_at = q_now(r)
            wait_for(
                lambda: any(tick_of(req) > repaired_at for req in handlers.requests_to("/tick")),
                timeout=20,
                what="the schedule to fire again after the repair",
            )
        assert not [req for req in handlers.requests_to("/tick") if broken_at + 1000 < tick_of(req) < repaired_at]
    finally:
        daemon.stop()
