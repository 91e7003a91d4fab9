"""Versioned key layouts (ADR 0019), on standalone and Cluster: a namespace records the layout of its keys, a
daemon refuses one it cannot run on, and `migrate` brings the keys of layout 1 (limit slots in a SET per group,
`slots` fields as JSON arrays) and of layout 2 (no pending counts) to the current one, idempotently and
resumably."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from jobcar import migrate
from jobcar.cli import main
from jobcar.job import State
from jobcar.keys import LAYOUT_VERSION, all_pending_keys, earlier_slot_set, layout_key, queue_of_pending_key
from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.integration.driver import QueueDriver
from tests.integration.layouts import as_layout_2, migrate_layout, run_async
from tests.integration.test_limits import held, lease, lease_as_earlier_jobcar, rules
from tests.servers import RedisServer

LIMITS = rules(a={"total": 2, "per_key": 1})


@pytest.fixture
def q(any_redis: redis.Redis | redis.RedisCluster, namespace: str) -> QueueDriver:
    return QueueDriver(any_redis, namespace)


def refusal(q: QueueDriver) -> str | None:
    return run_async(q.redis, lambda client: migrate.layout_refusal(client, q.namespace))


def recorded(q: QueueDriver) -> object:
    return q.redis.get(layout_key(q.namespace))


def lease_a_limited_job(q: QueueDriver) -> tuple[str, str]:
    """(a job leased with a slot of type `a` and of its key `k1`, a job of the same key that the limit holds)."""
    a, b = (q.enqueue("a", n, key="k1").id for n in range(2))
    assert lease(q, LIMITS) == [a]
    assert held(q, "a#k1") == [b]
    return a, b


def slot_hash(q: QueueDriver) -> dict[str, str]:
    return {i.decode(): key.decode() for i, key in q.redis.hgetall(q.keys.slots("a")).items()}


def pending_counts(q: QueueDriver) -> dict[str, str]:
    return {t.decode(): n.decode() for t, n in q.redis.hgetall(q.keys.pending_counts).items()}


def test_a_new_namespace_gets_the_current_layout_recorded(q: QueueDriver) -> None:
    q.enqueue("a", "a producer needs no migration")
    # A job stored by a producer of an earlier version, which kept no count: counted before the layout is recorded.
    q.enqueue("b", "uncounted")
    q.redis.hdel(q.keys.pending_counts, "b")
    assert recorded(q) is None, "a producer records no layout"
    assert refusal(q) is None
    assert recorded(q) == str(LAYOUT_VERSION).encode()
    assert pending_counts(q) == {"a": "1", "b": "1"}
    assert refusal(q) is None
    assert migrate_layout(q) == migrate.Migrated(LAYOUT_VERSION, LAYOUT_VERSION)


def test_keys_of_layout_1_are_refused_until_migrated_then_the_slot_is_in_its_types_hash(q: QueueDriver) -> None:
    a, b = lease_a_limited_job(q)
    sets = lease_as_earlier_jobcar(q, a, ["a", "a#k1"])
    q.redis.hset(q.keys.job(a), "slots", '["a#k1","a"]')  # as the first leases wrote it, here key first
    refused = refusal(q)
    assert refused is not None
    assert "layout 1" in refused
    assert f"({LAYOUT_VERSION})" in refused
    assert "jobcar migrate" in refused
    assert "running:a" in refused, "it names a key of the earlier layout"
    assert recorded(q) is None, "a refused start records nothing"

    q.redis.delete(q.keys.pending_counts)  # layout 1 kept none
    assert migrate_layout(q) == migrate.Migrated(
        1, LAYOUT_VERSION, slot_sets=2, slots_moved=2, fields_rewritten=1, queues_recounted=1
    )
    assert not q.redis.exists(*sets)
    assert pending_counts(q) == {"a": "1"}, "the held job"
    assert slot_hash(q) == {a: "k1"}, "one slot, counting in the type's total and its key's"
    assert q.redis.hget(q.keys.job(a), "slots") == b"a\na#k1", "one group per line, the type's total first"
    assert recorded(q) == str(LAYOUT_VERSION).encode()
    assert refusal(q) is None

    assert q.ack(a, q.token(a)) == 1
    assert slot_hash(q) == {}
    assert q.where(b) is State.PENDING, "the slot given back lets the held job go"


def test_a_migration_that_stopped_part_way_is_finished_by_running_it_again(q: QueueDriver) -> None:
    a, _ = lease_a_limited_job(q)
    ended = q.enqueue("a", "ended while its daemon was away", key="k2").id
    # As a run left them: layout 1 recorded, a's key SET already moved, its type's SET not yet.
    [total] = lease_as_earlier_jobcar(q, a, ["a"])
    q.redis.hset(q.keys.slots("a"), a, "k1")
    q.redis.set(layout_key(q.namespace), 1)
    q.redis.sadd(total, ended)  # a slot the earlier reaper had not swept yet: its job is not active
    assert refusal(q) is not None, "a daemon started meanwhile refuses"

    assert migrate_layout(q) == migrate.Migrated(1, LAYOUT_VERSION, slot_sets=1, slots_moved=1, queues_recounted=1)
    assert slot_hash(q) == {a: "k1"}, "the key's entry stays: one slot counts in both groups"
    assert not q.redis.exists(total)
    assert migrate_layout(q) == migrate.Migrated(LAYOUT_VERSION, LAYOUT_VERSION), "a second run changes nothing"
    assert slot_hash(q) == {a: "k1"}


def test_a_newer_layout_is_refused_and_never_migrated_back(q: QueueDriver) -> None:
    newer = LAYOUT_VERSION + 1
    q.redis.set(layout_key(q.namespace), newer)
    refused = refusal(q)
    assert refused is not None
    assert f"layout {newer}, newer than this jobcar's ({LAYOUT_VERSION})" in refused
    with pytest.raises(migrate.LayoutError, match=f"layout {newer}, newer"):
        migrate_layout(q)
    assert recorded(q) == str(newer).encode()

    q.redis.set(layout_key(q.namespace), "two")
    assert "not a key layout version" in (refusal(q) or "")


def test_a_namespace_at_layout_2_gets_its_pending_counts_recounted_once(q: QueueDriver) -> None:
    a = [q.enqueue("a", n, key="k1").id for n in range(3)]
    assert lease(q, LIMITS) == [a[0]]
    assert held(q, "a#k1") == a[1:]
    q.enqueue("b", 1)
    q.enqueue("b", 2, priority=5)
    q.enqueue("b", 3, delay=3600)  # scheduled: not counted
    # A queue with nothing pending left, whose counts a producer of this version wrote and a daemon of layout 2
    # did not count out when it leased the job.
    other = QueueDriver(q.redis, q.namespace, "other")
    other.enqueue("c")
    other.lease_one()
    other.redis.hset(other.keys.pending_counts, "c", 1)
    as_layout_2(q, "default")
    refused = refusal(q)
    assert refused is not None
    assert f"key layout 2, older than this jobcar's ({LAYOUT_VERSION})" in refused
    assert "jobcar migrate" in refused

    assert migrate_layout(q) == migrate.Migrated(2, LAYOUT_VERSION, queues_recounted=2)
    assert pending_counts(q) == {"a": "2", "b": "2"}
    assert not other.redis.exists(other.keys.pending_counts)
    assert recorded(q) == str(LAYOUT_VERSION).encode()
    assert refusal(q) is None
    before = q.snapshot()
    assert migrate_layout(q) == migrate.Migrated(LAYOUT_VERSION, LAYOUT_VERSION), "a second run changes nothing"
    assert q.snapshot() == before


def test_only_the_pending_lists_counts_and_held_lists_name_a_queue_to_recount() -> None:
    pattern = all_pending_keys("ns")
    assert pattern == "ns:{*}:[ph]e[nl]*"
    for key in ("ns:{q}:pending", "ns:{q}:pending:7", "ns:{q}:pending:released", "ns:{q}:pending_counts",
                "ns:{q}:held:a#k1", "ns:{q}:held:@a"):  # fmt: skip
        assert queue_of_pending_key("ns", key) == "q", key
    for key in ("ns:{q}:pendingx", "ns:{q}:pending:x", "ns:{q}:helder", "ns:{q}:job:x}:pending",
                "ns2:{q}:pending", "ns:{q}:job:x"):  # fmt: skip
        assert queue_of_pending_key("ns", key) is None, key


def test_jobcar_migrate_says_what_it_did(
    r: redis.Redis, namespace: str, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    q = QueueDriver(r, namespace)
    q.enqueue("a")
    as_layout_2(q, "default")
    assert main(["-c", str(config), "migrate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "namespace": namespace, "from": 2, "to": LAYOUT_VERSION, "slot_sets": 0, "slots_moved": 0,
        "fields_rewritten": 0, "queues_recounted": 1,
    }  # fmt: skip
    assert pending_counts(q) == {"a": "1"}
    assert main(["-c", str(config), "migrate"]) == 0
    already = f"namespace {namespace!r} is at key layout {LAYOUT_VERSION} already: nothing to do\n"
    assert capsys.readouterr().out == already
    as_layout_2(q, "default")
    assert main(["-c", str(config), "migrate"]) == 0
    assert capsys.readouterr().out == (
        f"namespace {namespace!r} migrated from key layout 2 to {LAYOUT_VERSION}: 0 slots moved from 0 slot SETs, "
        "0 slots fields rewritten from JSON, pending jobs recounted in 1 queue\n"
    )


def test_only_the_slot_sets_of_layout_1_are_taken_for_them() -> None:
    assert earlier_slot_set("ns", "ns:{q}:running:a#k1") == ("q", "a#k1")
    assert earlier_slot_set("ns", "ns:{q}:running:a") == ("q", "a")
    assert earlier_slot_set("ns", "ns:{q}:job:x}:running:a") is None, "a job id may hold '}:running:'"
    assert earlier_slot_set("ns", "ns2:{q}:running:a") is None
    assert earlier_slot_set("ns", "ns:{q}:slots:a") is None


def test_a_daemon_refuses_a_newer_layout_and_records_the_current_one_on_a_new_namespace(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, redis_server.url, namespace, {})
    with redis_server.client() as client:
        client.set(layout_key(namespace), LAYOUT_VERSION + 1)
        refused = DaemonProcess(config).start(wait_ready=False)
        assert refused.wait(timeout=30) == 78, "a restart would not help: systemd does not restart on 78"
        expected = f"key layout {LAYOUT_VERSION + 1}, newer than this jobcar's ({LAYOUT_VERSION})"
        assert any(expected in line.get("msg", "") for line in refused.lines())

        client.delete(layout_key(namespace))
        daemon = DaemonProcess(config).start()
        try:
            assert client.get(layout_key(namespace)) == str(LAYOUT_VERSION).encode()
        finally:
            daemon.stop()


def test_a_daemon_refuses_layout_2_until_migrated(redis_server: RedisServer, namespace: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, redis_server.url, namespace, {})
    with redis_server.client() as client:
        client.set(layout_key(namespace), 2)
        refused = DaemonProcess(config).start(wait_ready=False)
        assert refused.wait(timeout=30) == 78
        expected = f"key layout 2, older than this jobcar's ({LAYOUT_VERSION}): stop every daemon"
        assert any(expected in line.get("msg", "") and "jobcar migrate" in line["msg"] for line in refused.lines())
        assert client.get(layout_key(namespace)) == b"2", "a refused start records nothing"

        run_async(client, lambda twin: migrate.migrate(twin, namespace))
        daemon = DaemonProcess(config).start()
        daemon.stop()
        assert client.get(layout_key(namespace)) == str(LAYOUT_VERSION).encode()
