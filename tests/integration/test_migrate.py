"""Versioned key layouts (ADR 0019), on standalone and Cluster: a namespace records the layout of its keys, a
daemon refuses one it cannot run on, and `migrate` brings the keys of layout 1 (limit slots in a SET per group,
`slots` fields as JSON arrays) to the current one, idempotently and resumably."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from jobcar import migrate
from jobcar.job import State
from jobcar.keys import LAYOUT_VERSION, earlier_slot_set, layout_key
from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.integration.driver import QueueDriver
from tests.integration.layouts import migrate_layout, run_async
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


def test_a_new_namespace_gets_the_current_layout_recorded(q: QueueDriver) -> None:
    q.enqueue("a", "a producer needs no migration")
    assert recorded(q) is None, "a producer records no layout"
    assert refusal(q) is None
    assert recorded(q) == str(LAYOUT_VERSION).encode()
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

    assert migrate_layout(q) == migrate.Migrated(1, LAYOUT_VERSION, slot_sets=2, slots_moved=2, fields_rewritten=1)
    assert not q.redis.exists(*sets)
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

    assert migrate_layout(q) == migrate.Migrated(1, LAYOUT_VERSION, slot_sets=1, slots_moved=1)
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
