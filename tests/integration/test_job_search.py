"""Jobs found by a filter in bounded steps (job_search.py) on every surface, against the session's real Redis:
held jobs listed with the limit group holding them and since when (`jobs list --state held`, GET /v1/jobs,
the dashboard's held tab and counts).

Jobs are made with the producer's script and leased with the daemon's own (the limits of a real config), so
every state is one a running daemon would leave. The same pages in a real browser: test_dashboard_browser.py.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import pytest
import redis

from jobcar import transitions
from jobcar.job import State
from tests.integration.driver import QueueDriver
from tests.integration.test_api import Api, running_api
from tests.integration.test_cli_ops import Run
from tests.integration.test_cli_ops import run as run  # the `run` fixture
from tests.integration.test_dashboard import Ui, cells, done_jobs, job_ids, running_ui
from tests.servers import RedisServer

#: A type whose jobs run one at a time fleet-wide: the lease holds the others in group "a".
ONE_AT_A_TIME = '{"a": {"total": 1}}'


def hold(q: QueueDriver, n: int, job_type: str = "a") -> tuple[str, list[str]]:
    """n + 1 jobs of `job_type` enqueued and a lease under a total of 1: (the one leased, the n held, oldest
    first)."""
    ids = [q.enqueue(job_type, {"n": i}).id for i in range(n + 1)]
    leased = q.lease(limits=json.dumps({job_type: {"total": 1}})).jobs
    assert [job.job.id for job in leased] == ids[:1]
    assert [job.state for i in ids[1:] if (job := q.job(i))] == [State.HELD] * n
    return ids[0], ids[1:]


@pytest.fixture
async def api(redis_server: RedisServer, namespace: str) -> AsyncIterator[Api]:
    async with running_api(redis_server.url, namespace) as listener:
        yield listener


@pytest.fixture
async def ui(redis_server: RedisServer, namespace: str) -> AsyncIterator[Ui]:
    async with running_ui(redis_server.url, namespace, token=None, write=True) as dashboard:
        yield dashboard


# -- held jobs in view -----------------------------------------------------------------------------------


def test_jobs_list_state_held_names_each_jobs_group_and_since_when(run: Run, q: QueueDriver) -> None:
    _, held = hold(q, 3)
    _, other = hold(q, 1, "b")
    code, out, err = run("jobs", "list", "--state", "held")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split()[:7] == ["QUEUE", "STATE", "ID", "TYPE", "ATTEMPT", "AGE", "HELD"]
    # Group by group (by name), each in the order its slot lets them go: the oldest first.
    assert [row.split()[2] for row in rows] == [*held, *other]
    assert [row.split()[6] for row in rows] == ["a", "a", "a", "b"]
    assert all(re.search(r" for \d+\.\ds", row) for row in rows), out
    listed = json.loads(run("jobs", "list", "--state", "held", "--json")[1])
    assert [(j["id"], j["state"], j["held_for"]) for j in listed] == [
        *((i, "held", "a") for i in held),
        (other[0], "held", "b"),
    ]
    assert all(j["held_since"].endswith("Z") for j in listed)
    # Without --state held jobs are listed too, after the pending ones, and a page of them says what it left.
    code, out, err = run("jobs", "list", "--limit", "2")
    assert [row.split()[2] for row in out.splitlines()[1:] if row.split()[1] == "held"] == held[:2]
    assert "default held: 2 of 4 shown" in err


async def test_get_v1_jobs_pages_a_state_with_a_cursor(api: Api, q: QueueDriver) -> None:
    leased, held = hold(q, 3)
    reply = await api.call("GET", "/v1/jobs", params={"state": "held", "limit": "2"})
    assert reply.status == 200, reply.body
    body = reply.body
    assert (body["queue"], body["state"], body["total"], body["examined"], body["cursor"]) == (
        "default",
        "held",
        3,
        2,
        "2",
    )
    assert [(j["id"], j["state"], j["held_for"]) for j in body["jobs"]] == [(i, "held", "a") for i in held[:2]]
    assert all(j["held_since"].endswith("Z") and j["payload"] == {"n": n + 1} for n, j in enumerate(body["jobs"]))
    rest = (await api.call("GET", "/v1/jobs", params={"state": "held", "cursor": body["cursor"]})).body
    assert ([j["id"] for j in rest["jobs"]], rest["cursor"]) == (held[2:], None)
    active = (await api.call("GET", "/v1/jobs", params={"state": "active", "queue": "default"})).body
    assert [(j["id"], j["held_for"], j["held_since"]) for j in active["jobs"]] == [(leased, None, None)]
    assert (await api.call("GET", "/v1/jobs", params={"state": "pending"})).body["jobs"] == []


async def test_get_v1_jobs_filters_by_type_within_its_scan(api: Api, q: QueueDriver) -> None:
    ids = [q.enqueue("t.rare" if n % 4 == 0 else "t.common", n).id for n in range(10)]
    page = (await api.call("GET", "/v1/jobs", params={"state": "pending", "type": "t.rare", "scan": "5"})).body
    assert ([j["id"] for j in page["jobs"]], page["examined"], page["cursor"]) == ([ids[0], ids[4]], 5, "5")
    more = {"state": "pending", "type": "t.rare", "scan": "5", "cursor": page["cursor"]}
    page = (await api.call("GET", "/v1/jobs", params=more)).body
    assert ([j["id"] for j in page["jobs"]], page["examined"], page["cursor"]) == ([ids[8]], 5, None)


async def test_get_v1_jobs_lists_done_jobs_a_page_at_a_time_each_once(api: Api, q: QueueDriver) -> None:
    kept = done_jobs(q, 7)
    q.enqueue("t.a")  # pending: not a done job
    seen: list[str] = []
    pages: list[list[str]] = []
    query = {"state": "done", "limit": "3"}
    while True:
        page = (await api.call("GET", "/v1/jobs", params=query)).body
        assert page["total"] is None
        assert all(j["state"] == "done" for j in page["jobs"])
        pages.append([j["id"] for j in page["jobs"]])
        seen += pages[-1]
        if page["cursor"] is None:
            break
        query = {**query, "cursor": page["cursor"]}
    assert sorted(seen) == sorted(kept)
    assert len(seen) == 7  # each once, whatever the SCAN steps (they depend on every key of the server)
    assert all(len(page) <= 3 for page in pages)


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ({}, "state is required"),
        ({"state": "canceled"}, "state must be one of pending, held, scheduled, active, waiting, dead, done"),
        ({"state": "pending", "cursor": "5.2"}, "cursor must be one a page of this state gave"),
        ({"state": "done", "cursor": "5.x"}, "cursor must be one a page of this state gave"),
        ({"state": "pending", "limit": "0"}, "limit must be a whole number from 1 to 1000"),
        ({"state": "pending", "cursor": "-1"}, "cursor must be one a page of this state gave"),
        ({"state": "pending", "queue": "no such/queue"}, "queue name"),
        ({"state": "pending", "colour": "red"}, "unknown parameter(s): colour"),
    ],
)
async def test_get_v1_jobs_refuses_a_bad_parameter(api: Api, query: dict[str, str], error: str) -> None:
    reply = await api.call("GET", "/v1/jobs", params=query)
    assert reply.status == 400, reply.body
    assert error in reply.body["error"]


async def test_get_v1_jobs_needs_the_token(api: Api) -> None:
    assert (await api.call("GET", "/v1/jobs", params={"state": "held"}, anon=True)).status == 401


async def test_the_dashboard_counts_and_lists_held_jobs(ui: Ui, q: QueueDriver, r: redis.Redis) -> None:
    _, held = hold(q, 2)
    overview = await ui.get("/ui/")
    assert cells(overview, "default")["held"] == "2"
    assert '<a href="/ui/queues/default?state=held">2</a>' in overview.text
    page = await ui.get("/ui/queues/default?state=held")
    assert page.status == 200, page.text
    assert job_ids(page) == held
    assert "2 held" in page.text
    assert '<th scope="col">Held by</th>' in page.text
    assert page.text.count('<td class="held-by">a</td>') == 2
    assert 'aria-current="page">held</a>' in page.text
    assert json.loads((await ui.get("/ui/overview.json")).text)["queues"][0]["held"] == 2
    assert html.unescape(page.text).count("Held since") == 1


# -- search by a payload field or a meta value ------------------------------------------------------------


def customers(q: QueueDriver) -> dict[str, str]:
    """Pending jobs of several payloads and metas: name -> id, in enqueue order."""
    made = {
        "c42": q.enqueue("t.bill", {"customer": 42, "address": {"city": "Lyon"}}, meta={"tenant": "acme"}),
        "c42s": q.enqueue("t.bill", {"customer": "42"}, meta={"tenant": "other"}),
        "c7": q.enqueue("t.bill", {"customer": 7, "address": {"city": "Lyon"}}),
        "list": q.enqueue("t.bill", [{"customer": 42}]),  # not an object: never matches a field
        "text": q.enqueue("t.mail", b'{"customer": 42}', content_type="text/plain"),  # not JSON: never matches
        "c42b": q.enqueue("t.mail", {"customer": 42.0, "tags": ["a", "b"]}),
    }
    return {name: info.id for name, info in made.items()}


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        (["payload.customer=42"], ["c42", "c42s", "c42b"]),
        (["payload.customer=42", "meta.tenant=acme"], ["c42"]),
        (["payload.address.city=Lyon"], ["c42", "c7"]),
        (['payload.tags=["a","b"]'], ["c42b"]),
        (["meta.tenant=other"], ["c42s"]),
        (["payload.nothing=1"], []),
    ],
)
def test_jobs_list_where_finds_jobs_by_payload_field_or_meta(
    run: Run, q: QueueDriver, conditions: list[str], expected: list[str]
) -> None:
    ids = customers(q)
    where = [arg for c in conditions for arg in ("--where", c)]
    code, out, err = run("jobs", "list", "--state", "pending", *where, "--json")
    assert code == 0, err
    assert [j["id"] for j in json.loads(out)] == [ids[name] for name in expected]
    assert "default pending: looked at 6 jobs of 6 from position 0, to the end" in err


def test_a_search_stops_at_its_scan_and_goes_on_from_its_cursor(run: Run, q: QueueDriver) -> None:
    ids = [q.enqueue("t", {"customer": 42 if n % 4 == 0 else n}).id for n in range(10)]
    code, out, err = run("jobs", "list", "-q", "default", "--state", "pending", "--where", "payload.customer=42",
                         "--scan", "5", "--json")  # fmt: skip
    assert code == 0, err
    assert [j["id"] for j in json.loads(out)] == [ids[0], ids[4]]
    assert "looked at 5 jobs of 10 from position 0; more may match: --queue default --state pending --cursor 5" in err
    code, out, err = run("jobs", "list", "-q", "default", "--state", "pending", "--where", "payload.customer=42",
                         "--scan", "5", "--cursor", "5", "--json")  # fmt: skip
    assert [j["id"] for j in json.loads(out)] == [ids[8]]
    assert "looked at 5 jobs of 10 from position 5, to the end" in err


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--where", "customer=42"], "a condition is payload.<field>=<value> or meta.<name>=<value>"),
        (["--where", "meta.a.b=1"], "meta is flat"),
        (["--cursor", "5", "--state", "pending"], "--cursor goes on in one queue and state: give --queue and --state"),
        (["--where", "payload.a=1", "--state", "done"], "done jobs are in none"),
    ],
)
def test_a_search_refuses_what_it_cannot_do(run: Run, args: list[str], error: str) -> None:
    code, _, err = run("jobs", "list", *args)
    assert code == 2
    assert error in err


async def test_get_v1_jobs_searches_by_payload_and_meta(api: Api, q: QueueDriver) -> None:
    ids = customers(q)
    query = [("state", "pending"), ("where", "payload.customer=42"), ("where", "meta.tenant=acme")]
    page = (await api.call("GET", "/v1/jobs", params=query)).body
    assert ([j["id"] for j in page["jobs"]], page["examined"], page["cursor"]) == ([ids["c42"]], 6, None)
    query = [("state", "pending"), ("where", "payload.address.city=Lyon"), ("type", "t.bill"), ("limit", "1")]
    page = (await api.call("GET", "/v1/jobs", params=query)).body
    assert ([j["id"] for j in page["jobs"]], page["cursor"]) == ([ids["c42"]], "1")
    bad = await api.call("GET", "/v1/jobs", params={"state": "pending", "where": "tenant=acme"})
    assert bad.status == 400
    assert "payload.<field>=<value>" in bad.body["error"]


async def test_the_queue_pages_search_box_finds_and_escapes(ui: Ui, q: QueueDriver) -> None:
    ids = customers(q)
    page = await ui.get("/ui/queues/default?state=pending&where=payload.customer%3D42")
    assert job_ids(page) == [ids["c42"], ids["c42s"], ids["c42b"]]
    assert 'name="where" value="payload.customer=42"' in page.text
    assert "Looked at 6 job(s) from position 0 for this page." in page.text
    hostile = '<script>alert("x")</script>'
    page = await ui.get("/ui/queues/default?" + urlencode({"state": "pending", "where": f"payload.customer={hostile}"}))
    assert page.status == 200
    assert hostile not in page.text
    assert 'value="payload.customer=&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"' in page.text
    assert (await ui.get("/ui/queues/default?where=customer")).status == 400


# -- bulk cancel by filter ----------------------------------------------------------------------------------


def states_of(q: QueueDriver, ids: list[str]) -> list[State | None]:
    return [None if (job := q.job(i)) is None else job.state for i in ids]


def test_jobs_cancel_dry_run_counts_and_changes_nothing_then_cancels_exactly_those(
    run: Run, q: QueueDriver, r: redis.Redis
) -> None:
    bills = [q.enqueue("t.bill", {"customer": 42}, key="acme").id for _ in range(3)]
    later = q.enqueue("t.bill", {"customer": 42}, key="acme", delay=3600).id
    others = [q.enqueue("t.bill", {"customer": 7}, key="acme").id, q.enqueue("t.mail", {"customer": 42}).id]
    code, out, err = run("jobs", "cancel", "--type", "t.bill", "--where", "payload.customer=42", "--dry-run")
    assert code == 0, err
    assert out.splitlines()[-1] == (
        "dry run: would cancel 4 jobs (of type t.bill, where payload.customer=42); nothing changed"
    )
    assert states_of(q, [*bills, later, *others]) == [State.PENDING] * 3 + [State.SCHEDULED] + [State.PENDING] * 2
    code, out, err = run("jobs", "cancel", "--type", "t.bill", "--where", "payload.customer=42", "--json")
    assert code == 0, err
    done = json.loads(out)
    assert (done["dry_run"], done["matched"], done["canceled"], done["left"]) == (False, 4, 4, 0)
    assert {(d["queue"], d["state"], d["canceled"]) for d in done["by_queue"]} == {
        ("default", "pending", 3),
        ("default", "scheduled", 1),
    }
    assert states_of(q, [*bills, later, *others]) == [None] * 4 + [State.PENDING] * 2
    assert r.llen(q.keys.pending) == 2


def test_jobs_cancel_by_key_id_prefix_and_age_leaves_running_jobs_alone(
    run: Run, q: QueueDriver, r: redis.Redis
) -> None:
    running = q.enqueue("t", job_id="old-running").id
    assert q.lease_one().job.id == running
    old = [q.enqueue("t", job_id=f"old-{n}", key="k1").id for n in range(3)]
    new = q.enqueue("t", job_id="new-0", key="k1").id
    other_key = q.enqueue("t", job_id="old-9", key="k2").id
    for job_id in [running, *old, other_key]:  # enqueued two hours ago, as Redis's clock counts
        r.hset(q.keys.job(job_id), "created", q.now_ms() - 2 * 3_600_000)
    code, out, err = run("jobs", "cancel", "--key", "k1", "--id-prefix", "old-", "--older-than", "1h")
    assert code == 0, err
    assert "canceled 3 jobs (with key k1, whose id starts with old-, enqueued over 3600s ago)" in out
    assert states_of(q, [*old, new, other_key, running]) == [None] * 3 + [State.PENDING] * 2 + [State.ACTIVE]
    code, _, err = run("jobs", "cancel", "--id-prefix", "old-")
    assert code == 0, err
    assert states_of(q, [other_key, running]) == [None, State.ACTIVE]  # a bulk cancel never stops a running job


def test_jobs_cancel_needs_a_filter_or_all(run: Run, q: QueueDriver) -> None:
    ids = [q.enqueue("t").id for _ in range(3)]
    code, _, err = run("jobs", "cancel")
    assert code == 2
    assert "give a filter" in err
    code, out, _ = run("jobs", "cancel", "--all", "--state", "pending", "-q", "default")
    assert code == 0
    assert "canceled 3 jobs (every job)" in out
    assert states_of(q, ids) == [None] * 3


def test_a_bulk_cancel_of_held_and_waiting_jobs_leaves_their_lists_and_releases_their_keys(
    run: Run, q: QueueDriver, r: redis.Redis
) -> None:
    _, held = hold(q, 3)
    parent = q.enqueue("t.parent", delay=3600).id
    waiting = q.enqueue("t.child", after=[parent], unique_for=3600, unique_key="once").id
    assert states_of(q, [waiting]) == [State.WAITING]
    code, _, err = run("jobs", "cancel", "--type", "a", "--state", "held")
    assert code == 0, err
    assert states_of(q, held) == [None] * 3
    assert r.exists(q.keys.held("a")) == 0
    assert q.keys.held("a") not in {k.decode() for k in r.keys(q.keys.prefix + "*")}
    code, _, err = run("jobs", "cancel", "--type", "t.child")
    assert code == 0, err
    assert states_of(q, [waiting, parent]) == [None, State.SCHEDULED]
    assert r.zcard(q.keys.waiting) == 0
    assert q.enqueue("t.child", unique_for=3600, unique_key="once").status.value == "created"  # the key was let go


def test_cancel_many_leaves_a_job_that_left_its_state(q: QueueDriver, r: redis.Redis) -> None:
    """The step a bulk pass sends: a job found pending that a daemon leased meanwhile is not canceled."""
    ids = [q.enqueue("t").id for _ in range(3)]
    assert q.lease_one().job.id == ids[0]  # leased after the pass read it as pending
    # ids[1]'s index is right (2 pending, ids[2] the newest at 0), ids[2]'s wrong: it is looked for.
    located = [(ids[0], 2), (ids[1], 1), (ids[2], 5), ("gone", -1)]
    reply = q.run(transitions.cancel_many_call(q.keys, State.PENDING, located))
    assert transitions.parse_cancel_many(reply) == (2, 2)
    assert states_of(q, ids) == [State.ACTIVE, None, None]
    assert r.llen(q.keys.pending) == 0


async def test_post_v1_jobs_cancel_counts_then_cancels(api: Api, q: QueueDriver) -> None:
    ids = customers(q)
    body = {"where": ["payload.customer=42"], "states": ["pending"], "dry_run": True}
    reply = await api.call("POST", "/v1/jobs/cancel", json=body)
    assert reply.status == 200, reply.body
    assert (reply.body["matched"], reply.body["canceled"], reply.body["examined"]) == (3, 0, 6)
    assert q.job(ids["c42"]) is not None
    reply = await api.call("POST", "/v1/jobs/cancel", json={**body, "dry_run": False, "queue": "default"})
    assert (reply.body["matched"], reply.body["canceled"], reply.body["left"]) == (3, 3, 0)
    assert reply.body["by_queue"] == [
        {"queue": "default", "state": "pending", "examined": 6, "matched": 3, "canceled": 3, "left": 0}
    ]
    assert [name for name, i in ids.items() if q.job(i) is not None] == ["c7", "list", "text"]


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({}, 400, 'give a filter (type, key, id_prefix, older_than, where), or "all": true'),
        ({"type": "t", "states": ["active"]}, 400, "a bulk cancel takes pending, held, scheduled, waiting jobs"),
        ({"type": "t", "older_than": "soon"}, 400, "older_than"),
        ({"type": "t", "where": "payload.a=1"}, 400, "where must be a list"),
        ({"type": "t", "colour": "red"}, 400, "unknown field(s): colour"),
    ],
)
async def test_post_v1_jobs_cancel_refuses_a_bad_filter(
    api: Api, body: dict[str, object], status: int, error: str
) -> None:
    reply = await api.call("POST", "/v1/jobs/cancel", json=body)
    assert reply.status == status, reply.body
    assert error in reply.body["error"]


async def test_post_v1_jobs_cancel_needs_json_and_the_token(api: Api) -> None:
    reply = await api.call("POST", "/v1/jobs/cancel", data=b"type=t")
    assert reply.status == 415
    assert (await api.call("POST", "/v1/jobs/cancel", json={"all": True}, anon=True)).status == 401


async def test_the_dashboard_cancels_what_a_filter_matches_after_a_confirmation(ui: Ui, q: QueueDriver) -> None:
    ids = customers(q)
    page_path = "/ui/queues/default?state=pending&where=payload.customer%3D42"
    page = await ui.get(page_path)
    assert "Cancel the matching pending jobs…" in page.text
    form = {"state": "pending", "where": "payload.customer=42", "type": "", "key": "", "id": "", "older": "",
            "error": ""}  # fmt: skip
    confirm = await ui.act(page_path, "/ui/queues/default/cancel/confirm", form)
    assert confirm.status == 200, confirm.text
    assert "<h1>Cancel 3 pending jobs?</h1>" in confirm.text
    assert all(q.job(i) is not None for i in ids.values()), "nothing changes before the confirmation"
    done = await ui.act(page_path, "/ui/queues/default/cancel/apply", form)
    assert "3 pending jobs canceled" in done.text
    assert [name for name, i in ids.items() if q.job(i) is not None] == ["c7", "list", "text"]
    # Without the CSRF token, nothing.
    assert (await ui.post("/ui/queues/default/cancel/apply", {"state": "pending"})).status == 403
    assert [name for name, i in ids.items() if q.job(i) is not None] == ["c7", "list", "text"]


def test_a_bulk_cancel_takes_exactly_the_matching_jobs_of_each_priority(
    run: Run, q: QueueDriver, r: redis.Redis
) -> None:
    jobs = [(q.enqueue("t", {"n": n}, priority=(n % 3) * 3).id, n) for n in range(30)]
    code, out, err = run("jobs", "cancel", "--where", "payload.n=7", "--where", "payload.n=7")
    assert code == 0, err
    assert out.splitlines()[-1] == "canceled 1 job (where payload.n=7, where payload.n=7)"
    code, _, err = run("jobs", "cancel", "--id-prefix", "", "--type", "t", "--where", "payload.n=8")
    assert code == 0, err
    gone = {n for job_id, n in jobs if q.job(job_id) is None}
    assert gone == {7, 8}
    listed = [job["id"] for job in json.loads(run("jobs", "list", "--state", "pending", "--limit", "50", "--json")[1])]
    assert listed == [job_id for job_id, n in sorted(jobs, key=lambda j: (j[1] % 3, j[1])) if n not in (7, 8)]
    assert sum(r.llen(key) for key in q.keys.pending_lists) == 28
