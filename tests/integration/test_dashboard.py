"""The dashboard's routes (jobcar.ui) on the daemon's real listener and real Redis, driven over HTTP without a
browser: the numbers each page shows against what Redis holds, paging and filters, every action and its
fences, read-only mode, the login cookie, CSRF and the browser checks, escaping, and the fleet's entries.
The same pages in a real browser: test_dashboard_browser.py."""

from __future__ import annotations

import contextlib
import html
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
import redis

from jobcar.admin import Admin
from jobcar.client import AsyncClient
from jobcar.config_types import Config, UiSettings
from jobcar.fleet import FORGET_AFTER_MS, LIVE_FOR_MS, Announcer, live_daemons
from jobcar.job import State
from jobcar.job_listing import list_children
from jobcar.keys import daemons_key
from jobcar.redis_link import RedisLink
from jobcar.schedule_store import upsert
from jobcar.schedules import make_spec
from jobcar.transport import execute_async, run_async
from jobcar.ui import reads
from tests.integration.driver import QueueDriver
from tests.integration.test_api import TOKEN, running_api
from tests.integration.test_cli import ROOT, cli
from tests.integration.test_cli_ops import talk_back
from tests.servers import RedisServer, wait_for

CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')
XSS = ['<script>alert("type")</script>', '"><img src=x onerror=alert(1)>']


@dataclass
class Page:
    status: int
    text: str
    headers: Any

    @property
    def csrf(self) -> str:
        match = CSRF.search(self.text)
        assert match, "the page has no form with a CSRF token"
        return match.group(1)


@dataclass
class Ui:
    """A browser-like HTTP client of the dashboard (it keeps cookies), and a producer beside it."""

    http: aiohttp.ClientSession
    client: AsyncClient
    base: str

    async def get(self, path: str, **headers: str) -> Page:
        async with self.http.get(path, headers=headers, allow_redirects=False) as response:
            return Page(response.status, await response.text(), response.headers)

    async def post(self, path: str, form: dict[str, Any] | list[tuple[str, str]], **headers: str) -> Page:
        async with self.http.post(path, data=form, headers=headers, allow_redirects=False) as response:
            return Page(response.status, await response.text(), response.headers)

    async def act(self, page_path: str, action: str, form: dict[str, Any] | list[tuple[str, str]]) -> Page:
        """Submit a form the way the page would: with the CSRF token it carries."""
        token = (await self.get(page_path)).csrf
        fields = list(form.items()) if isinstance(form, dict) else list(form)
        return await self.post(action, [*fields, ("csrf", token)])


@contextlib.asynccontextmanager
async def running_ui(redis_url: str, namespace: str, *, token: str | None, write: bool, **settings: Any
                     ) -> AsyncIterator[Ui]:  # fmt: skip
    async with running_api(redis_url, namespace, token=token, ui=UiSettings(write=write), **settings) as api:
        base = f"http://127.0.0.1:{api.port}"
        # unsafe: keep cookies for an IP address host, as a browser does.
        async with aiohttp.ClientSession(base, cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            yield Ui(http, api.client, base)


@pytest.fixture
async def ui(redis_server: RedisServer, namespace: str) -> AsyncIterator[Ui]:
    """The dashboard on loopback without a token, read-write."""
    async with running_ui(redis_server.url, namespace, token=None, write=True) as dashboard:
        yield dashboard


@pytest.fixture
async def readonly(redis_server: RedisServer, namespace: str) -> AsyncIterator[Ui]:
    async with running_ui(redis_server.url, namespace, token=None, write=False) as dashboard:
        yield dashboard


def dead_jobs(q: QueueDriver, n: int, job_type: str = "t.dead", reason: str = "boom") -> list[str]:
    """n jobs killed into the dead-letter queue with `reason`, oldest first (with nothing else pending)."""
    ids = []
    for i in range(n):
        info = q.enqueue(job_type, {"n": i})
        leased = q.lease_one()
        assert leased.job.id == info.id
        q.kill(info.id, leased.token, reason)
        ids.append(info.id)
    return ids


def cells(page: Page, queue: str) -> dict[str, str]:
    """The overview's numbers of one queue, by field."""
    row = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    found = dict(re.findall(r'data-field="([a-z_]+)">(?:<a [^>]*>)?([^<]*)', row.group(1)))
    return found


def job_ids(page: Page) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'<td class="id"><a href="[^"]*">([^<]*)</a>', page.text)]


async def test_the_overview_shows_what_redis_holds(ui: Ui, q: QueueDriver, r: redis.Redis) -> None:
    dead_jobs(q, 2)
    for _ in range(7):
        q.enqueue("t.a")
    q.enqueue("t.a", delay=3600)
    q.lease_one()
    page = await ui.get("/ui/")
    assert page.status == 200
    assert cells(page, "default") == {
        "pending": "6", "held": "0", "scheduled": "1", "active": "1", "waiting": "0", "dead": "2",
        "latency_s": cells(page, "default")["latency_s"], "done_last_hour": "0", "failed_last_hour": "0",
        "paused": "running",
    }  # fmt: skip
    document = await (await ui.http.get("/ui/overview.json")).json()
    (default,) = [d for d in document["queues"] if d["queue"] == "default"]
    assert (default["pending"], default["scheduled"], default["active"], default["dead"]) == (6, 1, 1, 2)
    assert len(default["minutes"]) == len(default["done"]) == 60


async def test_the_overview_charts_count_the_fleet_history(ui: Ui, q: QueueDriver, r: redis.Redis) -> None:
    from jobcar.history_calls import count_call

    await execute_async(ui.client.redis, [count_call(q.keys, {("t.a", "done"): 40, ("t.a", "failed"): 3})])
    document = await (await ui.http.get("/ui/overview.json")).json()
    (default,) = [d for d in document["queues"] if d["queue"] == "default"]
    assert (default["done_last_hour"], default["failed_last_hour"]) == (40, 3)
    assert default["done"][-1] + default["done"][-2] == 40  # this minute, or the last one at a minute's turn
    page = await ui.get("/ui/")
    assert (cells(page, "default")["done_last_hour"], cells(page, "default")["failed_last_hour"]) == ("40", "3")
    await execute_async(ui.client.redis, [count_call(q.keys, {("t.b", "failed"): 2, ("t.b", "dead"): 2})])
    queue = await ui.get("/ui/queues/default")
    row = (r'<a href="[^"]*type=(t\.[ab])">t\.[ab]</a></td>\s*<td class="num">(\d+)</td>'
           r'<td class="num">(\d+)</td>\s*<td class="num">(?:<a [^>]*>)?(\d+)')  # fmt: skip
    rows = re.findall(row, queue.text)
    assert rows == [("t.a", "40", "3", "0"), ("t.b", "0", "2", "2")]


async def test_the_overview_lists_the_live_daemons_only(ui: Ui, namespace: str, r: redis.Redis) -> None:
    config = Config(source="t.yaml", namespace=namespace, queues={"default": 1, "mail": 2}, concurrency=7)
    announcer = Announcer(RedisLink(ui.client.redis, ui.client.redis), config, lambda: 3)
    announcer.sweep_interval = 3600.0  # the first announce sweeps; the next ones renew, until the test says
    await announcer.announce()
    gone = '{"host":"old","pid":1,"version":"0","queues":[],"concurrency":1,"in_flight":0,"started_ms":0,"seen_ms":1}'
    r.hset(daemons_key(namespace), mapping={"gone:1": gone, "garbage": "not json"})
    (daemon,) = await live_daemons(ui.client.redis, namespace)
    assert (daemon.id, daemon.queues, daemon.concurrency, daemon.in_flight) == (announcer.id, ("default", "mail"), 7, 3)
    # Both Redis time: of the first announce's sweep, and of the write just after it.
    first_now = r.time()
    assert daemon.started_ms <= daemon.seen_ms <= first_now[0] * 1000 + first_now[1] // 1000
    page = await ui.get("/ui/")
    assert f'<td>{daemon.host}</td><td class="num">{daemon.pid}</td>' in page.text
    # The announces between sweeps only write the daemon's own entry; the next sweep (once the last is
    # sweep_interval old) forgets what has been silent for FORGET_AFTER_MS (both entries above).
    assert FORGET_AFTER_MS > LIVE_FOR_MS
    for _ in range(11):
        await announcer.announce()
    assert set(r.hkeys(daemons_key(namespace))) == {announcer.id.encode(), b"gone:1", b"garbage"}
    # A renewal's time is the sweep's Redis time moved on by the daemon's clock: never past Redis's own.
    (between,) = await live_daemons(ui.client.redis, namespace)
    redis_now = r.time()
    assert daemon.seen_ms <= between.seen_ms <= redis_now[0] * 1000 + redis_now[1] // 1000
    assert (between.started_ms, between.in_flight, between.queues) == (daemon.started_ms, 3, ("default", "mail"))
    announcer.sweep_interval = 0.0
    await announcer.announce()
    assert set(r.hkeys(daemons_key(namespace))) == {announcer.id.encode()}
    (renewed,) = await live_daemons(ui.client.redis, namespace)
    assert renewed.started_ms == daemon.started_ms  # kept by every later announce
    assert renewed.seen_ms >= daemon.seen_ms
    await announcer.withdraw()
    assert await live_daemons(ui.client.redis, namespace) == []
    r.set(daemons_key(namespace), "not a hash")  # written by hand: the overview still shows the queues
    assert await live_daemons(ui.client.redis, namespace) == []
    assert (await ui.get("/ui/")).status == 200


async def test_a_queue_pages_in_lease_order_and_the_other_way(ui: Ui, q: QueueDriver) -> None:
    ids = [q.enqueue("t.a", {"n": n}).id for n in range(120)]
    first = await ui.get("/ui/queues/default")
    assert job_ids(first) == ids[:50]
    assert "120 pending job(s); showing 1–50." in first.text
    second = await ui.get("/ui/queues/default?state=pending&start=50")
    third = await ui.get("/ui/queues/default?state=pending&start=100")
    assert job_ids(second) == ids[50:100]
    assert job_ids(third) == ids[100:]
    assert 'rel="next"' in second.text
    assert 'rel="next"' not in third.text
    newest = await ui.get("/ui/queues/default?state=pending&order=newest")
    assert job_ids(newest) == ids[::-1][:50]


async def test_the_other_states_list_their_jobs(ui: Ui, q: QueueDriver, r: redis.Redis) -> None:
    (dead,) = dead_jobs(q, 1)
    later = q.enqueue("t.a", delay=600).id
    running = q.enqueue("t.a").id
    q.lease_one()
    assert job_ids(await ui.get("/ui/queues/default?state=scheduled")) == [later]
    assert job_ids(await ui.get("/ui/queues/default?state=active")) == [running]
    assert job_ids(await ui.get("/ui/queues/default?state=dead")) == [dead]
    assert (await ui.get("/ui/queues/default?state=nope")).status == 400


def done_jobs(q: QueueDriver, n: int) -> list[str]:
    """n jobs run and acked with their result kept."""
    kept = []
    for _ in range(n):
        info = q.enqueue("t.a")
        leased = q.lease_one()
        q.ack(info.id, leased.token, retention_ms=600_000)
        kept.append(info.id)
    return kept


async def test_done_jobs_are_listed_while_their_results_are_kept(ui: Ui, q: QueueDriver) -> None:
    kept = done_jobs(q, 3)
    q.enqueue("t.a")  # pending: not listed as done
    assert sorted(job_ids(await ui.get("/ui/queues/default?state=done"))) == sorted(kept)


async def test_done_jobs_are_listed_newest_first(ui: Ui, q: QueueDriver) -> None:
    kept = []
    for _ in range(4):
        (job_id,) = done_jobs(q, 1)
        kept.append(job_id)
        finished = q.job(job_id).finished_ms  # type: ignore[union-attr]
        wait_for(lambda: q.now_ms() > finished, timeout=5, what="Redis time to move on")  # noqa: B023
    assert job_ids(await ui.get("/ui/queues/default?state=done")) == kept[::-1]


async def test_a_queue_page_opens_on_the_first_tab_holding_jobs_and_else_on_done(ui: Ui, q: QueueDriver) -> None:
    def current_tab(page: Page) -> str:
        tab = re.search(r'<a href="[^"]*"\s+aria-current="page">(\w+)</a>', page.text)
        assert tab is not None, page.text
        return tab.group(1)

    done_jobs(q, 1)
    assert current_tab(await ui.get("/ui/queues/default")) == "done", "nothing waits or runs: what finished"
    q.enqueue("t.a", delay=3600)
    assert current_tab(await ui.get("/ui/queues/default")) == "scheduled"
    q.enqueue("t.a")
    assert current_tab(await ui.get("/ui/queues/default")) == "pending"
    assert current_tab(await ui.get("/ui/queues/default?state=done")) == "done"


async def test_the_header_names_a_namespace_only_when_it_is_not_the_default(
    redis_server: RedisServer, namespace: str
) -> None:
    for shown, brand in (
        ("jobcar", "jobcar</a>"),
        (namespace, f'jobcar <span class="ns" title="namespace">{namespace}'),
    ):
        async with running_ui(redis_server.url, shown, token=None, write=False) as dashboard:
            page = await dashboard.get("/ui/")
            assert brand in page.text, page.text
            assert "jobcar jobcar" not in page.text


async def test_done_jobs_come_a_page_at_a_time_each_once(ui: Ui, q: QueueDriver) -> None:
    kept = done_jobs(q, 240)
    seen: list[str] = []
    link: str | None = "/ui/queues/default?state=done"
    pages = 0
    while link is not None:
        page = await ui.get(link)
        ids = job_ids(page)
        assert len(ids) <= reads.PAGE_SIZE
        seen += ids
        found = re.search(r'<a href="([^"]*)" rel="next">', page.text)
        link = html.unescape(found.group(1)) if found else None
        pages += 1
    assert sorted(seen) == sorted(kept)
    assert pages >= 3


async def test_done_jobs_among_many_other_keys_are_found_on_one_page(ui: Ui, q: QueueDriver, r: redis.Redis) -> None:
    kept = done_jobs(q, 3)
    with r.pipeline(transaction=False) as pipe:
        for n in range(20_000):
            pipe.set(f"unrelated:{n}", "x")
        pipe.execute()
    page = await ui.get("/ui/queues/default?state=done")
    assert sorted(job_ids(page)) == sorted(kept)
    assert 'rel="next"' not in page.text


async def test_a_key_of_another_type_hides_one_job_not_the_page(ui: Ui, q: QueueDriver, r: redis.Redis) -> None:
    """One bad key never stops a queue: the pages list the rest and name what they could not read."""
    bad, good = dead_jobs(q, 2)
    r.delete(q.keys.job(bad))
    r.set(q.keys.job(bad), "not a hash")
    r.set(q.keys.job("poison"), "not a hash")
    kept = done_jobs(q, 2)
    dead = await ui.get("/ui/queues/default/dead")
    assert dead.status == 200
    assert job_ids(dead) == [good]
    assert "1 job(s) could not be read" in dead.text
    assert "its key holds another type" in dead.text
    done = await ui.get("/ui/queues/default?state=done")
    assert done.status == 200
    assert sorted(job_ids(done)) == sorted(kept)
    filtered = await ui.get("/ui/queues/default?state=dead&type=t.dead")
    assert job_ids(filtered) == [good]


async def test_a_result_that_is_not_text_shows_its_size(ui: Ui, q: QueueDriver) -> None:
    info = q.enqueue("t.a")
    leased = q.lease_one()
    q.ack(info.id, leased.token, result=b"\xff\xfe\x00bin", retention_ms=600_000)
    page = await ui.get(f"/ui/job?queue=default&id={info.id}")
    assert page.status == 200
    assert "6 bytes that are not text." in page.text


@pytest.mark.cluster
async def test_done_jobs_are_found_on_the_queues_node_of_a_cluster(
    redis_cluster: list[RedisServer], namespace: str
) -> None:
    sync = redis.RedisCluster(host="127.0.0.1", port=redis_cluster[0].port)
    client = AsyncClient.from_url(f"redis://127.0.0.1:{redis_cluster[0].port}", namespace=namespace, cluster=True)
    try:
        q = QueueDriver(sync, namespace)
        kept = done_jobs(q, 5)
        admin = Admin(client.redis, namespace, ["default"])
        (stats,) = await admin.stats(["default"])
        page = await reads.browse(admin, stats, State.DONE, 0, reads.Filters(), newest_first=False)
        assert sorted(job.id for job in page.jobs) == sorted(kept)
        assert page.next_start is None
    finally:
        await client.close()
        sync.close()


@pytest.mark.cluster
async def test_what_a_handler_wrote_is_read_on_a_cluster(redis_cluster: list[RedisServer], namespace: str) -> None:
    """The job's own keys on its queue's node, its children's states from theirs (other queues, other slots)."""
    sync = redis.RedisCluster(host="127.0.0.1", port=redis_cluster[0].port)
    client = AsyncClient.from_url(f"redis://127.0.0.1:{redis_cluster[0].port}", namespace=namespace, cluster=True)
    try:
        q = QueueDriver(sync, namespace)
        info = q.enqueue("t.x", {})
        leased = q.lease_one()
        children = (("low", "a"), ("other", "b"), ("default", "c"))
        talk_back(q.producer, leased, percent=5, lines=("x", "y", "z"), max_lines=2, steps={"s": b"123"},
                  children=children)  # fmt: skip
        admin = Admin(client.redis, namespace, ["default"])
        view = await admin.job(info.id, "default")
        assert view.job.progress is not None
        assert view.job.progress.percent == 5
        assert (view.log_lines, view.log_dropped, view.children_total) == (2, 1, 3)
        assert [(s.name, s.size) for s in view.steps] == [("s", 3)]
        assert [(c.ref, c.state) for c in view.children] == [
            ("default/c", State.PENDING), ("low/a", State.PENDING), ("other/b", State.PENDING)
        ]  # fmt: skip
        log = await admin.log_since(info.id, "default", 0)
        assert ([e.line for e in log.entries], log.missed, log.next_index) == (["y", "z"], 1, 3)
        listing, total = await list_children(admin, f"default/{info.id}", 10)
        assert ([job.id for job in listing.jobs], total) == (["c", "a", "b"], 3)
    finally:
        await client.close()
        sync.close()


async def test_filters_by_type_error_text_and_id_prefix(ui: Ui, q: QueueDriver) -> None:
    timeouts = dead_jobs(q, 3, "t.mail", "timeout after 10s")
    crashes = dead_jobs(q, 2, "t.pdf", "exit code 3")
    page = await ui.get("/ui/queues/default?state=dead&type=t.pdf")
    assert sorted(job_ids(page)) == sorted(crashes)
    page = await ui.get("/ui/queues/default?state=dead&error=TIMEOUT")
    assert sorted(job_ids(page)) == sorted(timeouts)
    page = await ui.get(f"/ui/queues/default?state=dead&id={timeouts[1][:12]}")
    assert job_ids(page) == [timeouts[1]]
    assert "Looked at 5 job(s)" in page.text


async def test_a_filter_stops_at_its_budget_and_goes_on_from_there(
    ui: Ui, q: QueueDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "SCAN_BUDGET", 40)
    monkeypatch.setattr(reads, "CHUNK", 10)
    ids = [q.enqueue("t.a" if n % 30 else "t.rare").id for n in range(90)]
    first = await ui.get("/ui/queues/default?type=t.rare")
    assert job_ids(first) == [ids[0], ids[30]]
    next_link = html.unescape(re.search(r'<a href="([^"]*)" rel="next">', first.text).group(1))  # type: ignore[union-attr]
    assert "start=40" in next_link
    second = await ui.get(next_link)
    assert job_ids(second) == [ids[60]]


async def test_a_job_page_shows_everything_escaped(ui: Ui, q: QueueDriver) -> None:
    # Types and queue names cannot hold markup (names.py); payloads, meta and error texts can.
    info = await ui.client.enqueue("t.x", {"html": XSS[0], "attr": XSS[1]}, meta={"who": XSS[1]})
    leased = q.lease_one()
    q.kill(info.id, leased.token, XSS[0] + " " + XSS[1])
    for path in ("/ui/", f"/ui/job?queue=default&id={info.id}", "/ui/queues/default/dead",
                 "/ui/queues/default?state=dead"):  # fmt: skip
        page = await ui.get(path)
        assert page.status == 200, path
        assert "<script>alert" not in page.text, path
        assert "<img src=x" not in page.text, path
    page = await ui.get(f"/ui/job?queue=default&id={info.id}")
    assert "&lt;script&gt;alert(&#34;type&#34;)&lt;/script&gt;" in page.text
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in page.text
    assert page.headers["Content-Security-Policy"].startswith("default-src 'none'; script-src 'self'")
    raw = await ui.http.get(f"/ui/job/payload?queue=default&id={info.id}")
    assert raw.headers["Content-Type"] == "application/octet-stream"
    assert raw.headers["Content-Disposition"].startswith("attachment")
    assert b"<script>" in await raw.read()


async def test_a_job_page_shows_the_jobs_own_timeout_and_backoff(ui: Ui) -> None:
    info = await ui.client.enqueue("t.x", timeout="2m", backoff="1m30s")
    page = await ui.get(f"/ui/job?queue=default&id={info.id}")
    assert "<dt>Timeout</dt><dd>2m00s</dd>" in page.text
    assert "<dt>Backoff</dt><dd>1m30s</dd>" in page.text
    plain = await ui.get(f"/ui/job?queue=default&id={(await ui.client.enqueue('t.x')).id}")
    assert "<dt>Backoff</dt>" not in plain.text


async def test_a_job_page_links_what_it_waits_for_and_what_waits_for_it(ui: Ui) -> None:
    first = await ui.client.enqueue("t.a", {})
    second = await ui.client.enqueue("t.a", {}, after=[first.id])
    page = await ui.get(f"/ui/job?queue=default&id={second.id}")
    assert f'href="/ui/job?queue=default&amp;id={first.id}"' in page.text
    assert "Still waits for" in page.text
    page = await ui.get(f"/ui/job?queue=default&id={first.id}")
    assert "Waited for by" in page.text
    assert second.id in page.text
    missing = await ui.get("/ui/job?queue=default&id=nope")
    assert missing.status == 404
    assert "no such job" in missing.text


async def test_a_job_page_shows_what_its_handler_writes_escaped(ui: Ui, q: QueueDriver) -> None:
    info = await ui.client.enqueue("t.x", {}, job_id="parent")
    leased = q.lease_one()
    talk_back(q.producer, leased, lines=("oldest", "older", "old"), max_lines=2)  # one dropped
    talk_back(
        q.producer, leased, percent=30, message=XSS[0], lines=(*(f"line {n}" for n in range(200)), XSS[1]),
        steps={"<b>step</b>": b"x" * 3000}, children=(("default", "kid<i>"),),
    )  # fmt: skip
    page = await ui.get(f"/ui/job?queue=default&id={info.id}")
    assert page.status == 200
    assert "<script>alert" not in page.text
    assert "<img src=x" not in page.text
    assert "<b>step" not in page.text
    assert '<progress max="100" value="30.0"' in page.text
    assert '<span class="percent">30%</span>' in page.text
    assert '<span class="message">&lt;script&gt;alert(&#34;type&#34;)&lt;/script&gt;</span>' in page.text
    log = re.search(r'<ol class="log" id="job-log">(.*?)</ol>', page.text, re.S)
    assert log
    lines = re.findall(r'<span class="line">([^<]*)</span>', log.group(1))
    assert len(lines) == 200  # the newest
    assert (lines[0], lines[-1]) == ("line 1", "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;")
    assert "203 line(s) kept, 1 older dropped; the last 200 shown" in page.text
    assert re.search(r"<tr><td>&lt;b&gt;step&lt;/b&gt;</td><td class=\"num\">2\.9 KiB</td><td>\d{4}-", page.text)
    assert 'href="/ui/job?queue=default&amp;id=kid%3Ci%3E">default/kid&lt;i&gt;</a>' in page.text
    assert 'data-live="/ui/job.json?queue=default&amp;id=parent"' in page.text

    live = await ui.http.get("/ui/job.json?queue=default&id=parent")
    assert live.headers["Cache-Control"] == "no-store"
    job = await live.json()
    assert (job["state"], job["finished"], job["progress"]["message"]) == ("active", False, XSS[0])
    assert (job["progress"]["percent"], job["progress"]["percent_text"]) == (30, "30%")
    assert (job["log"]["lines"], job["log"]["dropped"], len(job["log"]["lines_read"])) == (203, 1, 200)
    assert job["log"]["lines_read"][-1]["line"] == XSS[1]
    assert [(s["name"], s["bytes"], s["size"]) for s in job["steps"]] == [("<b>step</b>", 3000, "2.9 KiB")]
    assert [(c["ref"], c["state"], c["link"]) for c in job["children"]] == [
        ("default/kid<i>", "pending", "/ui/job?queue=default&id=kid%3Ci%3E")
    ]

    child = await ui.get("/ui/job?queue=default&id=kid%3Ci%3E")
    assert 'child of <a href="/ui/job?queue=default&amp;id=parent" id="job-parent">default/parent</a>' in child.text
    assert "None reported." in child.text

    queue = await ui.get("/ui/queues/default?state=active")
    assert '<th scope="col">Progress</th>' in queue.text
    assert '<progress max="100" value="30.0" aria-label="Progress of job parent"></progress>' in queue.text
    assert "&lt;script&gt;alert" in queue.text
    assert "<script>alert" not in queue.text
    pending = await ui.get("/ui/queues/default?state=pending")
    assert '<th scope="col">Progress</th>' not in pending.text

    q.ack(info.id, leased.token, retention_ms=60_000)
    done = await ui.get(f"/ui/job?queue=default&id={info.id}")
    assert "data-live" not in done.text, "a finished job's page does not update"


async def test_cancel_requeue_and_delete_from_a_job_page(ui: Ui, q: QueueDriver) -> None:
    waiting = q.enqueue("t.a").id
    page = await ui.act(f"/ui/job?queue=default&id={waiting}", "/ui/job/cancel", {"queue": "default", "id": waiting})
    assert page.status == 200
    assert "it is canceled and gone" in page.text
    assert q.job(waiting) is None
    again = await ui.act("/ui/queues/default", "/ui/job/cancel", {"queue": "default", "id": waiting})
    assert again.status == 404
    one, two = dead_jobs(q, 2)
    page = await ui.act(f"/ui/job?queue=default&id={one}", "/ui/job/requeue", {"queue": "default", "id": one})
    assert "is pending again" in page.text
    assert q.where(one) is State.PENDING
    page = await ui.act(f"/ui/job?queue=default&id={two}", "/ui/job/delete", {"queue": "default", "id": two})
    assert "deleted for good" in page.text
    assert q.job(two) is None
    not_dead = await ui.act("/ui/queues/default", "/ui/job/delete", {"queue": "default", "id": one})
    assert not_dead.status == 409
    assert "is not dead" in not_dead.text
    assert q.where(one) is State.PENDING


async def test_a_running_jobs_cancel_is_requested(ui: Ui, q: QueueDriver) -> None:
    running = q.enqueue("t.a").id
    q.lease_one()
    page = await ui.act("/ui/queues/default", "/ui/job/cancel", {"queue": "default", "id": running})
    assert "Cancel requested" in page.text
    job = q.job(running)
    assert job is not None
    assert job.cancel_requested


async def test_dead_letter_groups_and_bulk_requeue_of_a_selection(ui: Ui, q: QueueDriver) -> None:
    mail = dead_jobs(q, 4, "t.mail", "smtp refused")
    pdf = dead_jobs(q, 2, "t.pdf", "exit code 3")
    page = await ui.get("/ui/queues/default/dead")
    assert re.search(r">t\.mail</a></td><td class=\"num\">4<", page.text)
    assert re.search(r">smtp refused</a></td><td class=\"num\">4<", page.text)
    chosen = [mail[0], pdf[1]]
    form = [("action", "requeue"), ("scope", "selection"), *[("id", i) for i in chosen]]
    confirm = await ui.act("/ui/queues/default/dead", "/ui/queues/default/dead/confirm", form)
    assert "Requeue 2 dead jobs?" in confirm.text
    assert all(q.where(i) is State.DEAD for i in mail + pdf), "nothing moves before the confirmation"
    fields = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', confirm.text)
    done = await ui.post("/ui/queues/default/dead/apply", fields)
    assert "2 dead jobs requeued" in done.text
    assert [q.where(i) for i in mail + pdf] == [State.PENDING, State.DEAD, State.DEAD, State.DEAD,
                                                 State.DEAD, State.PENDING]  # fmt: skip


async def test_dead_letter_bulk_delete_by_filter_shows_the_count_first(ui: Ui, q: QueueDriver) -> None:
    mail = dead_jobs(q, 3, "t.mail", "smtp refused")
    pdf = dead_jobs(q, 2, "t.pdf", "exit code 3")
    form = {"action": "delete", "scope": "filter", "type": "t.mail", "error": ""}
    confirm = await ui.act("/ui/queues/default/dead?type=t.mail", "/ui/queues/default/dead/confirm", form)
    assert "Delete 3 dead jobs?" in confirm.text
    fields = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', confirm.text)
    done = await ui.post("/ui/queues/default/dead/apply", fields)
    assert "3 dead jobs deleted" in done.text
    assert [q.job(i) for i in mail] == [None] * 3
    assert all(q.where(i) is State.DEAD for i in pdf)
    nothing = await ui.act("/ui/queues/default/dead", "/ui/queues/default/dead/confirm",
                           {"action": "delete", "scope": "filter", "type": "t.none", "error": ""})  # fmt: skip
    assert "Nothing selected" in nothing.text


async def test_pause_and_resume_a_queue(ui: Ui, q: QueueDriver, r: redis.Redis) -> None:
    page = await ui.act("/ui/queues/default", "/ui/queues/default/pause", {})
    assert "queue default is paused" in page.text
    assert r.exists(q.keys.paused)
    page = await ui.act("/ui/queues/default", "/ui/queues/default/pause", {})
    assert "was already paused" in page.text
    assert "paused" in (await ui.get("/ui/queues/default")).text
    page = await ui.act("/ui/queues/default", "/ui/queues/default/resume", {})
    assert "queue default is resumed" in page.text
    assert not r.exists(q.keys.paused)


async def test_schedules_pause_resume_and_trigger(ui: Ui, namespace: str, q: QueueDriver) -> None:
    spec = make_spec("nightly", type="t.report", cron="0 3 * * *", queue="default")
    await run_async(ui.client.redis, upsert(namespace, spec, "api"))
    page = await ui.get("/ui/schedules")
    assert "<td>nightly</td>" in page.text
    assert "<code>0 3 * * *</code>" in page.text
    page = await ui.act("/ui/schedules", "/ui/schedules/nightly/pause", {})
    assert "schedule nightly is paused" in page.text
    page = await ui.act("/ui/schedules", "/ui/schedules/nightly/resume", {})
    assert "schedule nightly is resumed" in page.text
    page = await ui.act("/ui/schedules", "/ui/schedules/nightly/trigger", {})
    job_id = re.search(r"enqueued job (\S+)</p>", page.text).group(1)  # type: ignore[union-attr]
    assert q.where(html.unescape(job_id)) is State.PENDING
    missing = await ui.act("/ui/schedules", "/ui/schedules/nope/trigger", {})
    assert missing.status == 404


async def test_the_limits_page_shows_held_jobs(redis_server: RedisServer, namespace: str, q: QueueDriver) -> None:
    async with running_ui(redis_server.url, namespace, token=None, write=False) as ui:
        rules = '{"t.lim":{"total":1}}'
        q.enqueue("t.lim")
        q.enqueue("t.lim")
        q.lease(count=2, limits=rules)
        page = await ui.get("/ui/limits")
        row = r"<td>t\.lim</td><td>concurrency</td>\s*<td class=\"num\">1</td><td class=\"num\">1</td>"
        assert re.search(row, page.text), page.text


async def test_a_read_only_dashboard_shows_no_buttons_and_refuses_every_action(
    readonly: Ui, q: QueueDriver, namespace: str
) -> None:
    (dead,) = dead_jobs(q, 1)
    pending = q.enqueue("t.a").id
    await run_async(readonly.client.redis, upsert(namespace, make_spec("s", type="t.a", every="1h"), "api"))
    for path in ("/ui/", "/ui/queues/default", "/ui/queues/default/dead", f"/ui/job?queue=default&id={dead}",
                 f"/ui/job?queue=default&id={pending}", "/ui/schedules"):  # fmt: skip
        page = await readonly.get(path)
        assert page.status == 200
        assert "read-only" in page.text
        assert '<form method="post"' not in page.text, path
    actions = [
        ("/ui/job/cancel", {"queue": "default", "id": pending}),
        ("/ui/job/requeue", {"queue": "default", "id": dead}),
        ("/ui/job/delete", {"queue": "default", "id": dead}),
        ("/ui/queues/default/pause", {}),
        ("/ui/queues/default/dead/confirm", {"action": "requeue", "scope": "filter"}),
        ("/ui/queues/default/dead/apply", {"action": "requeue", "scope": "filter"}),
        ("/ui/schedules/s/pause", {}),
        ("/ui/schedules/s/trigger", {}),
    ]
    for path, form in actions:  # what a crafted request would send: a read-only page has no form to take
        page = await readonly.post(path, form)
        assert page.status == 403, path
        assert "read-only" in page.text, path
    assert q.where(pending) is State.PENDING
    assert q.where(dead) is State.DEAD


async def test_a_token_dashboard_asks_to_sign_in_and_keeps_a_signed_cookie(
    redis_server: RedisServer, namespace: str, q: QueueDriver
) -> None:
    async with running_ui(redis_server.url, namespace, token=TOKEN, write=True) as ui:
        page = await ui.get("/ui/queues/default?state=dead")
        assert page.status == 303
        location = urlsplit(page.headers["Location"])
        assert location.path == "/ui/login"
        assert parse_qs(location.query) == {"next": ["/ui/queues/default?state=dead"]}
        assert (await ui.get("/ui/overview.json")).status == 401
        async with ui.http.get("/v1/jobs/x") as api:  # the API wants its bearer token, cookie or not
            assert api.status == 401
        wrong = await ui.post("/ui/login", {"token": "nope", "next": "/ui/queues/default"})
        assert wrong.status == 401
        assert "not the API token" in wrong.text
        right = await ui.post("/ui/login", {"token": TOKEN, "next": "/ui/queues/default?state=dead"})
        assert right.status == 303
        assert right.headers["Location"] == "/ui/queues/default?state=dead"
        cookie = right.headers["Set-Cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert "Path=/ui" in cookie
        assert TOKEN not in cookie
        assert (await ui.get("/ui/queues/default?state=dead")).status == 200
        assert (await ui.get("/ui/overview.json")).status == 200
        async with ui.http.get("/v1/jobs/x") as api:
            assert api.status == 401
        # A bearer header serves scripts without a cookie.
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(ui.base) as script, script.get("/ui/overview.json", headers=bearer) as answer:
            assert answer.status == 200
        # Signing in sends the user only to a dashboard path.
        elsewhere = await ui.post("/ui/login", {"token": TOKEN, "next": "//evil.example/ui"})
        assert elsewhere.headers["Location"] == "/ui/"
        # Signing out drops the browser's cookie (a copy kept elsewhere stays valid until it expires: ADR 0017).
        out = await ui.act("/ui/queues/default", "/ui/logout", {})
        assert out.status == 303
        assert (await ui.get("/ui/")).status == 303


async def test_a_forged_or_tampered_cookie_is_refused(redis_server: RedisServer, namespace: str) -> None:
    """Another site on the same host can set a cookie for it: whatever it holds, the answer is a sign-in."""
    async with running_ui(redis_server.url, namespace, token=TOKEN, write=True) as ui:
        forged = (
            "",
            "9999999999.",
            "9999999999." + "0" * 64,
            "1." + "0" * 64,
            "².x",
            "9999999999.é",
            "9" * 5000 + ".x",
        )
        for value in forged:
            async with aiohttp.ClientSession(ui.base) as browser:
                headers = {"Cookie": f"jobcar_ui={value}"}
                async with browser.get("/ui/", headers=headers, allow_redirects=False) as page:
                    assert page.status == 303, value
                async with browser.get("/ui/login", headers=headers) as page:
                    assert page.status == 200, value
        signed_in = await ui.post("/ui/login", {"token": TOKEN})
        assert signed_in.status == 303
        bad_csrf = await ui.post("/ui/queues/default/pause", {"csrf": "é"})
        assert bad_csrf.status == 403


async def test_a_token_dashboard_redirects_its_bare_path(redis_server: RedisServer, namespace: str) -> None:
    async with running_ui(redis_server.url, namespace, token=TOKEN, write=False) as ui:
        page = await ui.get("/ui")
        assert page.status == 308
        assert page.headers["Location"] == "/ui/"


async def test_every_post_needs_the_forms_csrf_token_and_the_dashboards_origin(ui: Ui, q: QueueDriver) -> None:
    job = q.enqueue("t.a").id
    form = {"queue": "default", "id": job}
    missing = await ui.post("/ui/job/cancel", form)
    assert missing.status == 403
    assert "out of date" in missing.text
    wrong = await ui.post("/ui/job/cancel", {**form, "csrf": "0" * 64})
    assert wrong.status == 403
    token = (await ui.get("/ui/queues/default")).csrf
    other_site = await ui.post("/ui/job/cancel", {**form, "csrf": token}, Origin="http://evil.example")
    assert other_site.status == 403
    cross = await ui.post("/ui/job/cancel", {**form, "csrf": token}, **{"Sec-Fetch-Site": "cross-site"})
    assert cross.status == 403
    assert q.where(job) is State.PENDING
    ok = await ui.post("/ui/job/cancel", {**form, "csrf": token}, Origin=ui.base, **{"Sec-Fetch-Site": "same-origin"})
    assert ok.status == 200
    assert q.job(job) is None


async def test_gets_from_other_sites_are_served_only_as_a_followed_link(ui: Ui) -> None:
    probe = await ui.get("/ui/job?queue=default&id=x", **{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors",
                                                          "Sec-Fetch-Dest": "image"})  # fmt: skip
    assert probe.status == 403
    link = await ui.get("/ui/", **{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate",
                                   "Sec-Fetch-Dest": "document"})  # fmt: skip
    assert link.status == 200


async def test_an_open_dashboard_answers_only_its_own_host_names(ui: Ui) -> None:
    rebound = await ui.get("/ui/", Host="attacker.example")
    assert rebound.status == 421
    assert (await ui.get("/ui/", Host="localhost:9321")).status == 200


async def test_every_page_is_sent_with_the_security_headers(ui: Ui) -> None:
    error_pages = ("/ui/job?queue=default&id=nosuch", "/ui/queues/bad%20name", "/ui/queues/default?start=x",
                   "/ui/nosuch", "/ui/queues/default/dead/apply")  # fmt: skip
    for path in ("/ui/", "/ui/schedules", "/ui/limits", "/ui/queues/default", "/ui/login", *error_pages):
        page = await ui.get(path)
        assert page.headers["X-Frame-Options"] == "DENY", path
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        assert page.headers["Cache-Control"] == "no-store"
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    asset = await ui.http.get("/ui/static/uPlot.iife.min.js")
    assert asset.status == 200
    assert asset.content_type in ("application/javascript", "text/javascript")


async def test_bad_names_and_a_dashboard_turned_off(redis_server: RedisServer, namespace: str, ui: Ui) -> None:
    assert (await ui.get("/ui/queues/bad%20name")).status == 400
    for start in ("-1", "x", str(2**64), "１"):
        assert (await ui.get(f"/ui/queues/default?start={start}")).status == 400, start
    assert (await ui.get("/ui")).status == 308
    async with (
        running_api(redis_server.url, namespace, token=None, ui=UiSettings(enabled=False)) as api,
        api.anon.get("/ui/") as page,
    ):
        assert page.status == 404


async def test_paging_reads_a_bounded_number_of_jobs(ui: Ui, q: QueueDriver, namespace: str) -> None:
    """A page of a big queue reads its 50 jobs, not the queue: counted by the commands Redis ran."""
    q.producer.enqueue_many([("t.a", {"n": n}, {}) for n in range(3000)])
    admin = Admin(ui.client.redis, namespace, ["default"])

    def hgetalls(info: dict[str, Any]) -> int:
        return int(info.get("cmdstat_hgetall", {"calls": 0})["calls"])

    # The page's walk reads the queue's stats once (a few small hashes of its own): counted apart.
    before = hgetalls(await ui.client.redis.info("commandstats"))
    (stats,) = await admin.stats(["default"])
    stats_reads = hgetalls(await ui.client.redis.info("commandstats")) - before
    before = hgetalls(await ui.client.redis.info("commandstats"))
    page = await reads.browse(admin, stats, State.PENDING, 2500, reads.Filters(), newest_first=False)
    after = hgetalls(await ui.client.redis.info("commandstats"))
    assert len(page.jobs) == 50
    assert page.next_start == 2550
    assert after - before == 50 + stats_reads


def test_jobcar_ui_serves_the_dashboard_alone_until_stopped(config: Path, q: QueueDriver) -> None:
    """`jobcar ui` as an operator runs it: its own listener, no jobs run, SIGTERM ends it with 0."""
    job = q.enqueue("t.echo", {}).id
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "daemon"),
                                                                          os.environ.get("PYTHONPATH")]))}  # fmt: skip
    command = [sys.executable, "-m", "jobcar.cli", "ui", "-c", str(config), "--listen", "127.0.0.1:0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ) as process:
        _serves_until_stopped(process, job, q)


def _serves_until_stopped(process: subprocess.Popen[str], job: str, q: QueueDriver) -> None:
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "jobcar dashboard (read-only) on http://127.0.0.1:" in line, line + (process.stderr.read() or "")
        base = line.split(" on ", 1)[1].strip()
        with urllib.request.urlopen(base, timeout=10) as page:
            assert page.status == 200
            assert f">{job}</a>" not in page.read().decode()  # the overview lists queues, not jobs
        with urllib.request.urlopen(f"{base}queues/default", timeout=10) as page:
            assert f">{job}</a>" in page.read().decode()
        assert q.where(job) is State.PENDING  # nothing runs it
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


def test_jobcar_ui_refuses_a_reachable_address_without_a_token(config: Path) -> None:
    done = cli("ui", "-c", str(config), "--listen", "0.0.0.0:0")
    assert done.returncode == 78
    assert "not a loopback address and api_token is not set" in done.stderr
