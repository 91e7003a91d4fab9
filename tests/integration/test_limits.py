"""Fleet-wide concurrency limits (ADR 0014) as transitions, on standalone and Cluster: the lease takes a
slot or holds the job, whatever takes a job out of active gives the slot back, and the reaper's pass is
the safety net."""

from __future__ import annotations

import hashlib
import json

import pytest
import redis

from jobcar import transitions
from jobcar.job import State
from jobcar.transitions import CancelResult, HoldBack, cancel_call, parse_cancel, parse_stats, retry_call, stats_call
from tests.integration.driver import QueueDriver
from tests.integration.layouts import migrate_layout
from tests.servers import wait_for


@pytest.fixture
def q(any_redis: redis.Redis | redis.RedisCluster, namespace: str) -> QueueDriver:
    return QueueDriver(any_redis, namespace)


def rules(**by_type: dict[str, object]) -> str:
    return json.dumps(by_type)


TOTAL_2 = rules(a={"total": 2})
PER_TENANT = rules(a={"per_key": 1, "key": "payload.tenant"})


def lease(q: QueueDriver, limits: str, count: int = 100) -> list[str]:
    return [leased.job.id for leased in q.lease(count=count, limits=limits).jobs]


def held(q: QueueDriver, group: str) -> list[str]:
    """The group's held jobs, oldest first."""
    return [i.decode() for i in reversed(q.redis.lrange(q.keys.held(group), 0, -1))]


def running(q: QueueDriver, group: str) -> set[str]:
    """The ids holding a slot of a concurrency group: every entry of its type's slot hash for a type's total,
    the entries with its key for a key's group."""
    job_type, _, key = group.partition("#")
    slots = q.redis.hgetall(q.keys.slots(job_type))
    return {i.decode() for i, taken_by in slots.items() if not key or taken_by.decode() == key}


def stats_held(q: QueueDriver) -> int:
    return parse_stats(q.keys, q.run(stats_call(q.keys))).held


def test_a_type_over_its_total_is_held_and_other_types_run_past_it(q: QueueDriver) -> None:
    a = [q.enqueue("a", n).id for n in range(5)]
    b = [q.enqueue("b", n).id for n in range(2)]
    assert lease(q, TOTAL_2) == [a[0], a[1], *b], "no head-of-line blocking: b runs past a's held jobs"
    assert held(q, "a") == a[2:]
    assert running(q, "a") == {a[0], a[1]}
    assert q.job(a[2]).state is State.HELD  # type: ignore[union-attr]
    assert q.job(a[2]).held_for == "a"  # type: ignore[union-attr]
    held_at = q.job(a[2]).held_at_ms  # type: ignore[union-attr]
    assert held_at is not None
    assert held_at <= q.now_ms()
    stats = parse_stats(q.keys, q.run(stats_call(q.keys)))
    assert (stats.held, stats.held_by_type) == (3, {"a": 3})
    assert lease(q, TOTAL_2) == [], "still full"

    assert q.ack(a[0], q.token(a[0])) == 1
    assert held(q, "a") == a[3:], "the slot given back lets the oldest held job go"
    assert q.where(a[2]) is State.PENDING
    assert q.redis.exists(q.keys.wake), "idle daemons are woken for it"
    [leased] = q.lease(count=100, limits=TOTAL_2).jobs
    assert leased.job.id == a[2]
    assert leased.job.held_at_ms == held_at, "the lease's reply says since when limits held it"
    assert running(q, "a") == {a[1], a[2]}
    assert q.job(a[2]).held_for is None  # type: ignore[union-attr]
    assert q.job(a[2]).held_at_ms is None  # type: ignore[union-attr]


def test_every_way_out_of_active_gives_the_slot_back(q: QueueDriver) -> None:
    a = [q.enqueue("a", n).id for n in range(6)]
    assert lease(q, TOTAL_2) == a[:2]
    assert q.retry(a[0], q.token(a[0]), delay_ms=60_000) == 1
    assert lease(q, TOTAL_2) == [a[2]]
    assert q.kill(a[1], q.token(a[1])) == 1
    assert lease(q, TOTAL_2) == [a[3]]
    assert running(q, "a") == {a[2], a[3]}

    # A lease that expires: the reaper gives its slot back with the job.
    q.redis.zadd(q.keys.active, {a[3]: 1})  # its daemon died long ago
    assert q.reap(limits=TOTAL_2) == {a[3]: "pending"}
    assert running(q, "a") == {a[2]}
    assert lease(q, TOTAL_2) == [a[4]], "the held job let go runs before the reaped one, back at pending's tail"
    assert held(q, "a") == [a[5], a[3]]
    assert q.redis.hget(q.keys.job(a[4]), "slots") == b"a"


def test_per_key_limits_hold_one_tenant_without_blocking_another(q: QueueDriver) -> None:
    jobs = [q.enqueue("a", {"tenant": t, "n": n}).id for n, t in enumerate("xxxyxy")]
    x, y = [jobs[0], jobs[1], jobs[2], jobs[4]], [jobs[3], jobs[5]]
    assert lease(q, PER_TENANT) == [x[0], y[0]]
    assert held(q, "a#x") == x[1:]
    assert held(q, "a#y") == y[1:]
    assert q.redis.smembers(q.keys.limit_groups) == {b"a#x", b"a#y"}
    assert q.ack(y[0], q.token(y[0])) == 1
    assert lease(q, PER_TENANT) == [y[1]]
    assert q.ack(y[1], q.token(y[1])) == 1
    assert q.reap(limits=PER_TENANT) == {}
    assert q.redis.smembers(q.keys.limit_groups) == {b"a#x"}, "the reaper's pass drops a group with nothing left"


def test_keys_come_from_the_producer_meta_or_payload_and_a_total_caps_them_all(q: QueueDriver) -> None:
    by_key = rules(a={"per_key": 1, "total": 3})
    k1, k1b, k2 = q.enqueue("a", 1, key="k1").id, q.enqueue("a", 2, key="k1").id, q.enqueue("a", 3, key="k2").id
    free = q.enqueue("a", 4).id  # no key: the total only
    over = q.enqueue("a", 5, key="k3").id
    assert lease(q, by_key) == [k1, k2, free]
    assert held(q, "a#k1") == [k1b]
    assert held(q, "a") == [over], "the type's total is full"
    assert q.redis.hget(q.keys.job(k1), "slots") == b"a\na#k1", "the groups whose slots it took, one per line"

    by_meta = rules(m={"per_key": 1, "key": "meta.tenant"})
    first = q.enqueue("m", 1, meta={"tenant": "t"}).id
    second = q.enqueue("m", 2, meta={"tenant": "t"}).id
    assert lease(q, by_meta) == [first]
    assert held(q, "m#t") == [second]

    long_key = "k" * 300
    by_payload = rules(p={"per_key": 1, "key": "payload.account"})
    one, two = (q.enqueue("p", {"account": long_key}).id for _ in range(2))
    assert lease(q, by_payload) == [one]
    (group,) = {g.decode() for g in q.redis.smembers(q.keys.limit_groups)} - {"a", "a#k1", "a#k2", "m#t"}
    assert group.startswith("p#sha1:"), "a long key is named by its digest"
    assert held(q, group) == [two]

    broken = "line\nbreak"
    by_lines = rules(n={"total": 5, "per_key": 1, "key": "payload.account"})
    three, four = (q.enqueue("n", {"account": broken}).id for _ in range(2))
    assert lease(q, by_lines) == [three]
    group = f"n#sha1:{hashlib.sha1(broken.encode()).hexdigest()}"
    assert q.redis.hget(q.keys.job(three), "slots") == f"n\n{group}".encode(), "a key with a line break: its digest"
    assert held(q, group) == [four]
    assert q.ack(three, q.token(three)) == 1
    assert running(q, "n") == running(q, group) == set(), "both slots given back"
    assert lease(q, by_lines) == [four]


def test_a_held_list_of_another_type_dead_letters_the_job_it_cannot_hold(q: QueueDriver) -> None:
    a = [q.enqueue("a", n).id for n in range(3)]
    b = q.enqueue("b", 0).id
    q.redis.set(q.keys.held("a"), "written by something else")
    result = q.lease(limits=TOTAL_2)
    assert [leased.job.id for leased in result.jobs] == [a[0], a[1], b], "the other jobs are leased as ever"
    assert [job_id for job_id, _ in result.dropped] == [a[2]]
    assert q.where(a[2]) is State.DEAD, "in the dead set with its reason, not left in no list"
    reason = q.job(a[2]).last_error  # type: ignore[union-attr]
    assert reason is not None
    assert f"{q.keys.held('a')} holds a string, not a list" in reason


@pytest.mark.parametrize("limits", [TOTAL_2, '{"a": {"per_key": 1, "key": "payload.k"}}'])
def test_a_slot_hash_of_another_type_dead_letters_the_jobs_it_cannot_count(q: QueueDriver, limits: str) -> None:
    """A limit never turns off unseen: a job whose type's slots cannot be counted is neither leased over
    its limit nor left in no list."""
    a = [q.enqueue("a", {"k": "x"}).id for _ in range(3)]
    b = q.enqueue("b", 0).id
    q.redis.set(q.keys.slots("a"), "written by something else")
    result = q.lease(limits=limits)
    assert [leased.job.id for leased in result.jobs] == [b], "the other types are leased as ever"
    assert sorted(job_id for job_id, _ in result.dropped) == sorted(a)
    for job_id in a:
        assert q.where(job_id) is State.DEAD
        reason = q.job(job_id).last_error  # type: ignore[union-attr]
        assert reason is not None
        assert f"{q.keys.slots('a')} holds a string, not a hash" in reason


@pytest.mark.parametrize("key", ["limit_groups", "throttled"])
def test_a_limit_key_of_another_type_refuses_the_lease_and_the_reap_before_they_write(q: QueueDriver, key: str) -> None:
    a = q.enqueue("a", 0).id
    q.redis.set(getattr(q.keys, key), "written by something else")
    before = q.snapshot()
    for refused in (lambda: q.lease(limits=TOTAL_2), lambda: q.reap(limits=TOTAL_2)):
        with pytest.raises(redis.ResponseError, match=r"WRONGTYPE jobcar: .* jobcar fsck finds it"):
            refused()
    assert q.snapshot() == before
    assert lease(q, "{}") == [a], "a lease without limits does not read them"


def test_a_held_job_can_be_canceled(q: QueueDriver) -> None:
    a = [q.enqueue("a", n).id for n in range(3)]
    assert lease(q, TOTAL_2) == a[:2]
    assert parse_cancel(q.run(cancel_call(q.keys, a[2]))) == (CancelResult.CANCELED, State.HELD)
    assert held(q, "a") == []
    assert q.job(a[2]) is None
    assert stats_held(q) == 0


def test_the_reapers_pass_lets_held_jobs_go_when_a_limit_is_raised_or_removed(q: QueueDriver) -> None:
    a = [q.enqueue("a", n).id for n in range(6)]
    assert lease(q, TOTAL_2) == a[:2]
    assert q.reap(limits=TOTAL_2) == {}
    assert held(q, "a") == a[2:], "within the limit: nothing moves"
    assert q.reap(limits=rules(a={"total": 3})) == {}
    assert held(q, "a") == a[3:], "raised to 3: one more may run"
    assert q.reap(limits="{}") == {}
    assert held(q, "a") == [], "no limit any more: every held job goes"
    assert [q.where(i) for i in a[2:]] == [State.PENDING] * 4


def test_a_slot_whose_job_hash_vanished_comes_back_on_the_reapers_pass(q: QueueDriver) -> None:
    a = [q.enqueue("a", n).id for n in range(3)]
    assert lease(q, TOTAL_2) == a[:2]
    q.redis.delete(q.keys.job(a[0]))  # an operator deleted a running job's hash
    assert q.reap(limits=TOTAL_2) == {}
    assert running(q, "a") == {a[1]}
    assert held(q, "a") == []
    assert lease(q, TOTAL_2) == [a[2]]


def test_without_limits_nothing_of_them_is_written(q: QueueDriver) -> None:
    job = q.enqueue("a", 1).id
    assert lease(q, "{}") == [job]
    assert q.redis.hget(q.keys.job(job), "slots") is None
    assert not q.redis.exists(q.keys.limit_groups)


# -- rate limits --------------------------------------------------------------------------------------

TEN_A_SECOND = rules(a={"rate": [10, 1000], "burst": 2})


def started_ms(q: QueueDriver, job_id: str) -> int:
    job = q.job(job_id)
    assert job is not None
    assert job.started_ms is not None
    return job.started_ms


def test_a_rate_limit_starts_a_burst_then_one_each_interval_and_holds_the_rest(q: QueueDriver) -> None:
    a = [q.enqueue("a", n).id for n in range(6)]
    result = q.lease(limits=TEN_A_SECOND)
    assert [leased.job.id for leased in result.jobs] == a[:2], "the burst"
    assert held(q, "@a") == a[2:]
    assert result.next_due_ms is not None, "the caller is told when to lease again"
    assert 0 < result.next_due_ms <= 100
    leased = a[:2]
    # A poll: the test can only ask until each next start is allowed.
    wait_for(lambda: leased.extend(lease(q, TEN_A_SECOND)) or len(leased) >= len(a), timeout=10, what="each start")
    assert leased == a, "FIFO"
    starts = [started_ms(q, i) for i in a]
    # GCRA keeps the schedule, not the gaps: the k-th start after the burst of 2 comes k intervals after the
    # first, at the earliest (a late start does not push the next one back). Whole ms: 1 ms of rounding.
    too_early = [k for k in range(2, len(a)) if starts[k] - starts[0] < (k - 1) * 100 - 1]
    assert too_early == [], f"one start per 100 ms after the burst: {starts}"
    assert not q.redis.exists(q.keys.held("@a"))


def test_a_key_over_its_rate_does_not_hold_another_key(q: QueueDriver) -> None:
    per_key = rules(a={"key_rate": [1, 60_000], "key": "key"})
    x = [q.enqueue("a", n, key="x").id for n in range(2)]
    y = [q.enqueue("a", n, key="y").id for n in range(2)]
    assert lease(q, per_key) == [x[0], y[0]]
    assert held(q, "@a#x") == [x[1]]
    assert held(q, "@a#y") == [y[1]]
    assert lease(q, per_key) == []
    assert stats_held(q) == 2


def test_the_reapers_pass_lets_rate_held_jobs_go_when_the_rate_is_removed_and_keeps_them_due(q: QueueDriver) -> None:
    slow = rules(a={"rate": [1, 60_000]})
    a = [q.enqueue("a", n).id for n in range(3)]
    assert lease(q, slow) == a[:1]
    q.redis.delete(q.keys.throttled)  # lost: the held jobs would wait for nothing
    assert q.reap(limits=slow) == {}
    assert q.redis.zscore(q.keys.throttled, "@a") is not None, "due again"
    assert lease(q, slow) == [], "still over the rate: held again"
    assert held(q, "@a") == a[1:]
    assert q.reap(limits="{}") == {}
    assert held(q, "@a") == []
    assert lease(q, "{}") == a[1:]


def test_rate_held_jobs_stay_due_when_the_job_let_go_is_held_by_a_slot_instead(q: QueueDriver) -> None:
    both = rules(a={"per_key": 1, "key": "key", "rate": [1, 60_000]})  # one per key at once; one start a minute
    throttled, tat = q.keys.throttled, f"{q.keys.prefix}tat:@a"
    first = q.enqueue("a", 0, key="k2").id
    assert lease(q, both) == [first]
    j1, j2 = (q.enqueue("a", n, key="k1").id for n in (1, 2))
    assert lease(q, both) == []
    assert held(q, "@a") == [j1, j2], "k1 has a free slot; the rate holds both"
    q.redis.delete(tat)  # a minute passes (the test cannot wait for it)
    j3 = q.enqueue("a", 3, key="k1").id
    assert lease(q, both) == [j3], "takes the minute's start and k1's slot"
    q.redis.delete(tat)  # another minute
    q.redis.zadd(throttled, {"@a": 0})
    assert lease(q, both) == [], "j1 is let go, but k1's slot is taken: held for the slot"
    assert held(q, "a#k1") == [j1]
    assert held(q, "@a") == [j2]
    assert q.redis.zscore(throttled, "@a") is not None, "j2 is due at the next start, not at the reaper's pass"


# -- a handler's 429 holding a type or a key back -------------------------------------------------------


def retry_busy(q: QueueDriver, job_id: str, delay_ms: int, scope: str, key_source: str = "key") -> None:
    """Record a 429 with Retry-After as the daemon does under `limits.on_429: <scope>`."""
    hold = HoldBack(scope, key_source, 0)
    call = retry_call(q.keys, job_id, q.token(job_id), delay_ms=delay_ms, error="HTTP 429", spend_attempt=False,
                      hold=hold)  # fmt: skip
    assert q.run(call) == 1


def test_a_429_holds_the_whole_type_back_until_its_retry_after(q: QueueDriver) -> None:
    hold_type = rules(a={"hold": "type"})
    first = q.enqueue("a", 0).id
    assert lease(q, hold_type) == [first]
    retry_busy(q, first, 60_000, "type")
    later, other = q.enqueue("a", 1).id, q.enqueue("b", 1).id
    assert lease(q, hold_type) == [other], "other types run; the held-back type waits"
    assert held(q, "@a") == [later]
    due = q.redis.zscore(q.keys.throttled, "@a")
    assert due is not None
    assert 59_000 < due - q.now_ms() <= 60_000, "due when the Retry-After has passed"


def test_a_429_holds_only_its_key_back_and_ends_when_the_retry_after_passes(q: QueueDriver) -> None:
    hold_key = rules(a={"hold": "key", "key": "payload.tenant"})
    x0 = q.enqueue("a", {"tenant": "x"}).id
    assert lease(q, hold_key) == [x0]
    held_back = q.now_ms()  # before the retry: the hold runs from the retry's own Redis time
    retry_busy(q, x0, 300, "key", "payload.tenant")
    x1, y1 = q.enqueue("a", {"tenant": "x"}).id, q.enqueue("a", {"tenant": "y"}).id
    assert lease(q, hold_key) == [y1]
    assert held(q, "@a#x") == [x1]
    leased: list[str] = []
    wait_for(lambda: leased.extend(lease(q, hold_key)) or x1 in leased, timeout=10, what="x1 after the Retry-After")
    assert started_ms(q, x1) >= held_back + 300 - 1, "not before the Retry-After"


FAIR_1 = rules(t={"total": 1, "fair": True, "key": "key"})


def run_one(q: QueueDriver, limits: str) -> str:
    """Lease the one job the total lets run, ack it (which hands the slot to the next turn), return its id."""
    [job_id] = lease(q, limits)
    assert q.ack(job_id, q.token(job_id)) == 1
    return job_id


def test_fair_keys_take_turns_for_the_total_and_a_key_alone_gets_every_slot(q: QueueDriver) -> None:
    a = [q.enqueue("t", n, key="a").id for n in range(5)]
    b = [q.enqueue("t", n, key="b").id for n in range(2)]
    keyless = q.enqueue("t", "none").id
    order = [run_one(q, FAIR_1) for _ in range(8)]
    # a's first job ran before any was held; then the keys in the order they were first held, in turns.
    assert order == [a[0], a[1], b[0], keyless, a[2], b[1], a[3], a[4]]
    assert lease(q, FAIR_1) == []
    assert not q.redis.exists(q.keys.turns("t"))
    # A key alone runs as many at once as the total allows: fairness never caps it.
    alone = [q.enqueue("t", n, key="a").id for n in range(3)]
    assert lease(q, rules(t={"total": 3, "fair": True, "key": "key"})) == alone


def test_fair_turns_show_as_held_and_a_released_job_another_limit_holds_passes_the_turn_on(q: QueueDriver) -> None:
    both = rules(t={"total": 1, "per_key": 1, "fair": True, "key": "key"})
    a = [q.enqueue("t", n, key="a").id for n in range(3)]
    b = q.enqueue("t", "b", key="b").id
    assert lease(q, both) == [a[0]]
    stats = parse_stats(q.keys, q.run(stats_call(q.keys)))
    assert (stats.held, stats.held_by_type) == (3, {"t": 3})
    assert q.job(b).held_for == "~t#b"  # type: ignore[union-attr]
    # a's job goes back (its slots too) but not through its key's turn: a[1] is let go for a's turn and
    # leased; then b's turn comes when a[1] ends.
    assert q.retry(a[0], q.token(a[0]), delay_ms=60_000) == 1
    assert lease(q, both) == [a[1]]
    assert q.ack(a[1], q.token(a[1])) == 1
    assert lease(q, both) == [b]


def test_the_reapers_pass_puts_a_lost_turn_back_and_lets_turns_go_when_fair_is_removed(q: QueueDriver) -> None:
    a = [q.enqueue("t", n, key="a").id for n in range(3)]
    assert lease(q, FAIR_1) == [a[0]]
    q.redis.delete(q.keys.turns("t"))  # lost: a's jobs would wait for the next pass
    assert q.reap(limits=FAIR_1) == {}
    assert q.redis.zrange(q.keys.turns("t"), 0, -1) == [b"a"]
    assert q.ack(a[0], q.token(a[0])) == 1
    assert lease(q, FAIR_1) == [a[1]]
    assert q.reap(limits=rules(t={"total": 5})) == {}, "no longer fair: what waits for a turn goes"
    assert lease(q, rules(t={"total": 5})) == [a[2]]


def test_a_lease_with_no_slot_left_holds_the_full_limits_jobs_ahead_and_stops_at_one_it_would_lease(
    q: QueueDriver,
) -> None:
    a = [q.enqueue("a", n).id for n in range(4)]
    b = q.enqueue("b", "runs").id
    later = q.enqueue("a", "behind b").id
    assert lease(q, rules(a={"total": 1}), count=1) == [a[0]]
    assert held(q, "a") == [], "no limit has held a job yet: a lease holds nothing ahead (it costs a read)"
    q.redis.sadd(q.keys.limit_groups, "a")  # as after any hold: the limit binds
    assert lease(q, rules(a={"total": 1}), count=0) == []
    assert held(q, "a") == a[1:], "held ahead: they no longer stand in front of b"
    assert q.where(b) is State.PENDING
    assert q.where(later) is State.PENDING, "behind a job that would be leased: left for the next lease"
    assert lease(q, rules(a={"total": 1}), count=1) == [b]


def test_a_turn_whose_list_is_not_a_list_leaves_the_turns_instead_of_stopping_the_ack(q: QueueDriver) -> None:
    a = q.enqueue("t", "a", key="a").id
    assert lease(q, FAIR_1) == [a]
    q.redis.set(q.keys.held("~t#x"), "not a list")  # written by hand
    q.redis.zadd(q.keys.turns("t"), {"x": 1})
    q.redis.sadd(q.keys.limit_groups, "t", "~t#x")  # as after the hold that made the turn
    assert q.ack(a, q.token(a)) == 1
    assert not q.redis.exists(q.keys.turns("t"))


def test_a_key_whose_last_held_job_is_canceled_leaves_the_turns(q: QueueDriver) -> None:
    a, b = q.enqueue("t", "a", key="a").id, q.enqueue("t", "b", key="b").id
    assert lease(q, FAIR_1) == [a]
    assert held(q, "~t#b") == [b]
    assert parse_cancel(q.run(cancel_call(q.keys, b))) == (CancelResult.CANCELED, State.HELD)
    assert q.redis.smembers(q.keys.limit_groups) == {b"t"}, "the key's turn group is forgotten"
    assert not q.redis.exists(q.keys.turns("t")), "left there, the key would later take its old place in the turns"
    assert q.ack(a, q.token(a)) == 1
    assert q.reap(limits=FAIR_1) == {}
    assert not q.redis.exists(q.keys.limit_groups), "nothing is indexed: an ending script looks no further"
    assert not q.redis.exists(q.keys.turns("t"))


def lease_as_earlier_jobcar(q: QueueDriver, job_id: str, groups: list[str]) -> list[str]:
    """Move a leased job's slot to where an earlier lease kept it, a SET per group; the SETs' names."""
    job_type = groups[0].partition("#")[0]
    assert q.redis.hdel(q.keys.slots(job_type), job_id) == 1
    earlier = [f"{q.keys.prefix}running:{group}" for group in groups]
    for key in earlier:
        q.redis.sadd(key, job_id)
    return earlier


@pytest.mark.parametrize("slots", [None, '["a","a#k1"]'], ids=["slots by line", "slots as json"])
def test_slots_an_earlier_lease_took_in_a_set_per_group_are_given_back_once_migrated(
    q: QueueDriver, slots: str | None
) -> None:
    limits = rules(a={"total": 2, "per_key": 1})
    a, b = (q.enqueue("a", n, key="k1").id for n in range(2))
    assert lease(q, limits) == [a]
    assert held(q, "a#k1") == [b]
    earlier = lease_as_earlier_jobcar(q, a, ["a", "a#k1"])  # a job leased before the upgrade, ended after it
    if slots is not None:  # an earlier lease still wrote its groups as a JSON array
        q.redis.hset(q.keys.job(a), "slots", slots)
    migrate_layout(q)  # with the daemons stopped, before the new ones start
    assert not q.redis.exists(*earlier)
    assert running(q, "a") == running(q, "a#k1") == {a}
    assert q.redis.hget(q.keys.job(a), "slots") == b"a\na#k1"
    assert q.ack(a, q.token(a)) == 1
    assert running(q, "a") == set()
    assert q.where(b) is State.PENDING, "the slot given back lets the held job go"
    assert lease(q, limits) == [b]


def test_one_ack_of_several_jobs_gives_back_every_slot_of_each_group(q: QueueDriver) -> None:
    limits = rules(a={"total": 3, "per_key": 2})
    jobs = [q.enqueue("a", n, key=k).id for n, k in enumerate(["k1", "k1", "k2", "k1", "k2"])]
    assert lease(q, limits) == jobs[:3]
    assert running(q, "a#k1") == {jobs[0], jobs[1]}, "one lease takes two slots of a key"
    assert held(q, "a") == jobs[3:]
    acks = [transitions.ack_call(q.keys, job_id, q.token(job_id)) for job_id in jobs[:3]]
    assert transitions.parse_ack(q.run(transitions.merge_acks(acks))) == [1, 1, 1]
    assert running(q, "a") == running(q, "a#k1") == running(q, "a#k2") == set()
    assert held(q, "a") == [], "three slots given back let both held jobs go"
    assert lease(q, limits) == jobs[3:]
