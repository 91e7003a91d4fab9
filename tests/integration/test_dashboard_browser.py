"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright, against real daemons and
real Redis. Each page's numbers against what Redis holds, the live overview, a bulk requeue, a cancel that
stops a handler, read-only mode, the sign-in of a non-loopback dashboard, and payloads that try to run script.
Every page is saved at 1280 and 390 px wide in test-artifacts/dashboard/ (the README's screenshots are made by
tools/readme_screenshots.py)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from playwright.sync_api import Browser, ConsoleMessage, Page, Response, expect, sync_playwright

from jobcar.job import State
from tests.integration.conftest import StartDaemon
from tests.integration.daemon_harness import listen_url
from tests.integration.driver import QueueDriver
from tests.integration.test_cli_ops import talk_back
from tests.servers import wait_for

#: The same on every server (it tests the dashboard in a browser): not run again on the fallback server (Makefile).
pytestmark = pytest.mark.one_server

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
WIDTHS = (1280, 390)
TOKEN = "dashboard-t0ken"
XSS = ['<script>alert("p")</script>', '"><img src=x onerror=alert(1)>']


def chromium_path() -> str:
    """Debian's chromium (`make tools` installs it); no browser is downloaded."""
    found = os.environ.get("JOBCAR_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "the browser tests need chromium: `make tools` installs Debian's (apt-get install chromium)"
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context (no cookies), failing the test on any script error, CSP violation, dialog, or
    asset or script request that fails (a page itself may answer 4xx: a wrong token, a refused action)."""
    context = browser.new_context(viewport={"width": WIDTHS[0], "height": 900})
    tab = context.new_page()
    problems: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            problems.append(message.text)

    def response(answer: Response) -> None:
        if answer.status >= 400 and answer.request.resource_type != "document":
            problems.append(f"{answer.request.resource_type} {answer.url}: {answer.status}")

    tab.on("console", console)
    tab.on("response", response)
    tab.on("pageerror", lambda error: problems.append(str(error)))
    tab.on("dialog", lambda dialog: problems.append(f"a dialog opened: {dialog.message}"))
    yield tab
    context.close()
    assert not problems, problems


def save(page: Page, name: str) -> None:
    """The page at both widths, whole, as test artifacts."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=ARTIFACTS / f"{name}-{width}.png", full_page=True)
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{name} scrolls sideways at {width} px"
    page.set_viewport_size({"width": WIDTHS[0], "height": 900})


def cell(page: Page, queue: str, field: str) -> str:
    return page.locator(f'#queues tr[data-queue="{queue}"] [data-field="{field}"]').inner_text().strip()


def dashboard(start_daemon: StartDaemon, handlers: dict[str, object], **top: object) -> str:
    daemon = start_daemon(handlers, **top)
    return listen_url(daemon) + "/ui/"


def park_dead(r: redis.Redis, namespace: str, n: int, job_type: str = "t.broken", reason: str = "boom") -> list[str]:
    """Dead jobs in queue `parked`, which no daemon serves (a requeued job stays pending there)."""
    parked = QueueDriver(r, namespace, "parked")
    ids = []
    for i in range(n):
        info = parked.enqueue(job_type, {"n": i})
        leased = parked.lease_one()
        parked.kill(info.id, leased.token, reason)
        ids.append(info.id)
    return ids


def test_each_page_shows_what_redis_holds(
    page: Page, start_daemon: StartDaemon, q: QueueDriver, r: redis.Redis, namespace: str
) -> None:
    handlers = {"t.ok": {"command": ["true"]}, "t.fail": {"command": ["false"], "max_attempts": 1}}
    schedules = {"nightly": {"type": "t.ok", "cron": "0 3 * * *"}}
    base = dashboard(start_daemon, handlers, ui={"write": True}, queues={"default": 1}, schedules=schedules)
    failed = [q.enqueue("t.fail", {"n": n}).id for n in range(3)]
    later = [q.enqueue("t.ok", {"n": n}, delay=3600).id for n in range(4)]
    wait_for(lambda: all(q.where(i) is State.DEAD for i in failed), what="the failing jobs to die")
    dead = park_dead(r, namespace, 2)

    page.goto(base)
    expect(page.locator("h1")).to_have_text("Queues")
    assert (cell(page, "default", "scheduled"), cell(page, "default", "dead")) == ("4", "3")
    assert (cell(page, "parked", "dead"), cell(page, "parked", "pending")) == ("2", "0")
    expect(page.locator("#daemons tbody tr")).to_have_count(1)
    expect(page.locator("figure[data-chart] canvas")).to_have_count(2)  # uPlot drew both queues' charts
    save(page, "overview")

    page.get_by_role("link", name="default", exact=True).first.click()
    expect(page.locator("h1")).to_contain_text("Queue default")
    page.get_by_role("link", name="scheduled").click()
    expect(page.locator("table.jobs td.id")).to_have_count(4)
    assert sorted(page.locator("table.jobs td.id").all_inner_texts()) == sorted(later)
    save(page, "queue")

    page.goto(base + "queues/default/dead")
    expect(page.locator("table.jobs td.id")).to_have_count(3)
    expect(page.locator(".groups")).to_contain_text("t.fail")
    save(page, "dead")

    page.locator("table.jobs td.id a").first.click()
    expect(page.locator("h1")).to_contain_text("Job")
    expect(page.locator(".state")).to_have_text("dead")
    expect(page.locator("ol.errors")).to_contain_text("exit code 1")
    save(page, "job")

    page.goto(base + "schedules")
    expect(page.locator("table")).to_contain_text("nightly")
    save(page, "schedules")
    page.goto(base + "limits")
    expect(page.locator("h1")).to_have_text("Flow control")
    save(page, "limits")
    parked = QueueDriver(r, namespace, "parked")
    assert [parked.where(i) for i in dead] == [State.DEAD] * 2  # browsing acted on nothing


def test_the_overview_updates_without_a_reload(page: Page, start_daemon: StartDaemon, q: QueueDriver) -> None:
    base = dashboard(start_daemon, {"t.ok": {"command": ["true"]}})
    page.goto(base)
    expect(page.locator('#queues tr[data-queue="default"] [data-field="scheduled"]')).to_have_text("0")
    for n in range(7):
        q.enqueue("t.ok", {"n": n}, delay=3600)
    refreshed = page.evaluate("document.body.dataset.refreshed || ''")
    expect(page.locator('#queues tr[data-queue="default"] [data-field="scheduled"]')).to_have_text("7", timeout=15_000)
    assert page.evaluate("document.body.dataset.refreshed") != refreshed


def test_bulk_requeue_from_the_dead_letters_moves_exactly_the_selected(
    page: Page, start_daemon: StartDaemon, r: redis.Redis, namespace: str
) -> None:
    base = dashboard(start_daemon, {"t.ok": {"command": ["true"]}}, ui={"write": True})
    dead = park_dead(r, namespace, 5)
    page.goto(base + "queues/parked/dead")
    chosen = {dead[1], dead[3]}
    for job_id in chosen:
        page.get_by_label(f"Select job {job_id}").check()
    page.get_by_role("button", name="Requeue…").click()
    expect(page.locator("h1")).to_have_text("Requeue 2 dead jobs?")
    parked = QueueDriver(r, namespace, "parked")
    assert all(parked.where(i) is State.DEAD for i in dead), "nothing moves before the confirmation"
    page.get_by_role("button", name="Requeue 2").click()
    expect(page.get_by_role("status")).to_have_text("2 dead jobs requeued")
    assert {i for i in dead if parked.where(i) is State.PENDING} == chosen
    assert {i for i in dead if parked.where(i) is State.DEAD} == set(dead) - chosen


def test_a_job_canceled_from_its_page_stops_its_handler(
    page: Page, start_daemon: StartDaemon, q: QueueDriver, pids_file: Path
) -> None:
    # `$$$$`: the config reads `$$` as a dollar sign, so the shell sees `$$`, its own pid.
    slow = {"command": ["sh", "-c", f"echo $$$$ >> {pids_file}; exec sleep 60"], "timeout": "90s"}
    base = dashboard(start_daemon, {"t.slow": slow}, ui={"write": True})
    job_id = q.enqueue("t.slow").id
    wait_for(lambda: pids_file.exists() and pids_file.read_text().split(), what="the handler to start")
    (pid,) = [int(p) for p in pids_file.read_text().split()]
    page.goto(f"{base}job?queue=default&id={job_id}")
    expect(page.locator(".state")).to_have_text("active")
    page.get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("status")).to_contain_text("its daemon stops its handler")
    wait_for(lambda: q.job(job_id) is None, timeout=20, what="the job to end canceled")
    wait_for(lambda: not _alive(pid), timeout=20, what="the handler's process to be gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone: only its exit status is left to read
        return stat.read().split(") ")[-1][:1] != "Z"


def test_a_read_only_dashboard_has_no_buttons_and_refuses_every_action(
    page: Page, start_daemon: StartDaemon, r: redis.Redis, namespace: str
) -> None:
    base = dashboard(start_daemon, {"t.ok": {"command": ["true"]}}, schedules={"s": {"type": "t.ok", "every": "1h"}})
    (dead,) = park_dead(r, namespace, 1)
    for path in ("", "queues/parked", "queues/parked/dead", f"job?queue=parked&id={dead}", "schedules"):
        page.goto(base + path)
        expect(page.locator("header .mode")).to_have_text("read-only")
        expect(page.locator("form[method=post]")).to_have_count(0)
    for action, form in [
        ("job/requeue", {"queue": "parked", "id": dead}),
        ("job/delete", {"queue": "parked", "id": dead}),
        ("job/cancel", {"queue": "parked", "id": dead}),
        ("queues/parked/pause", {}),
        ("queues/parked/dead/apply", {"action": "delete", "scope": "filter"}),
        ("schedules/s/trigger", {}),
    ]:
        answer = page.request.post(base + action, form=form, headers={"Origin": base.split("/ui/")[0]})
        assert answer.status == 403, action
        assert "read-only" in answer.text(), action  # refused as read-only, not for a missing CSRF token
    assert QueueDriver(r, namespace, "parked").where(dead) is State.DEAD


def test_a_non_loopback_dashboard_asks_for_the_token(page: Page, start_daemon: StartDaemon) -> None:
    daemon = start_daemon({"t.ok": {"command": ["true"]}}, listen="0.0.0.0:0", api_token=TOKEN)
    port = re.search(r":(\d+)$", listen_url(daemon)).group(1)  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    page.goto(base + "/ui/queues/default")
    expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    assert page.request.get(base + "/v1/jobs/anything").status == 401
    page.get_by_label("API token").fill("wrong")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("That is not the API token.")
    page.get_by_label("API token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(base + "/ui/queues/default")
    expect(page.locator("h1")).to_contain_text("Queue default")
    assert TOKEN not in page.url
    cookie = next(c for c in page.context.cookies() if c["name"] == "jobcar_ui")
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"
    assert TOKEN not in cookie["value"]
    assert page.request.get(base + "/v1/jobs/anything").status == 401  # the cookie opens the pages, not the API
    save(page, "login-then-queue")


def test_a_read_token_signs_in_read_only_and_an_operate_token_acts(page: Page, start_daemon: StartDaemon,
                                                                  q: QueueDriver) -> None:  # fmt: skip
    """Tokens with roles (ADR 0026): a read token's session has no button and its actions are refused; an operate
    token's has them and acts; a produce token cannot sign in."""
    tokens = {"viewer": {"role": "read", "token": "v1ewer-t0ken"}, "ops": {"role": "operate", "token": "0ps-t0ken"},
              "shop": {"role": "produce", "token": "sh0p-t0ken"}}  # fmt: skip
    daemon = start_daemon({"t.ok": {"command": ["true"]}}, listen="0.0.0.0:0", api_tokens=tokens, ui={"write": True},
                          queues={"default": 1})  # fmt: skip
    port = re.search(r":(\d+)$", listen_url(daemon)).group(1)  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    parked = QueueDriver(q.redis, q.namespace, "parked")  # no daemon serves it: the job stays pending
    job = parked.enqueue("t.ok").id
    job_page = f"{base}/ui/job?queue=parked&id={job}"

    def sign_in(token: str) -> None:
        page.goto(job_page)
        expect(page).to_have_url(re.compile(r"/ui/login\?next="))
        page.get_by_label("API token").fill(token)
        page.get_by_role("button", name="Sign in").click()

    sign_in("sh0p-t0ken")  # produce: reads nothing, so no session
    expect(page.get_by_role("alert")).to_have_text(
        "Token shop has role produce: the dashboard needs a read or operate token."
    )
    page.get_by_label("API token").fill("v1ewer-t0ken")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(job_page)
    expect(page.locator("header .mode")).to_have_text("read-only")
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    expect(page.locator("form[method=post]:not([action='/ui/logout'])")).to_have_count(0)
    csrf = page.locator("form[action='/ui/logout'] input[name=csrf]").get_attribute("value")
    answer = page.request.post(f"{base}/ui/job/cancel", form={"queue": "parked", "id": job, "csrf": csrf or ""},
                               headers={"Origin": base})  # fmt: skip
    assert answer.status == 403
    assert "token viewer has role read" in answer.text()
    assert parked.where(job) is State.PENDING
    save(page, "job-read-token")

    page.get_by_role("button", name="Sign out").click()
    sign_in("0ps-t0ken")
    expect(page).to_have_url(job_page)
    expect(page.locator("header .mode")).to_have_text("read-write")
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator("h1")).to_have_text("Canceled")
    assert parked.where(job) is None
    daemon.wait_for_log(f"dashboard: cancel of job {job} in parked by ops: canceled")
    assert "dashboard: viewer (role read) signed in" in daemon.log_path.read_text()


def test_payloads_and_errors_that_try_to_run_script_render_as_text(
    page: Page, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    fail = {"command": ["sh", "-c", f"echo '{XSS[0]} {XSS[1]}' >&2; exit 3"], "max_attempts": 1}
    base = dashboard(start_daemon, {"t.fail": fail})
    job_id = q.enqueue("t.fail", {"html": XSS[0], "attr": XSS[1]}, meta={"who": XSS[1]}).id
    wait_for(lambda: q.where(job_id) is State.DEAD, what="the job to die")
    page.goto(f"{base}job?queue=default&id={job_id}")
    expect(page.locator("pre.payload").first).to_contain_text("<script>alert(")  # its quotes are JSON-escaped
    expect(page.locator("pre.payload").first).to_contain_text("<img src=x onerror=alert(1)>")
    expect(page.locator("ol.errors")).to_contain_text(XSS[1])
    expect(page.locator("dl.meta")).to_contain_text(XSS[1])
    assert page.locator("main img").count() == 0
    assert page.locator("main script").count() == 0
    page.goto(base + "queues/default/dead")
    expect(page.locator(".groups")).to_contain_text(XSS[0])
    assert page.locator("main img").count() == 0
    save(page, "escaped")


def test_a_running_jobs_page_follows_its_progress_and_log_as_text(
    page: Page, start_daemon: StartDaemon, r: redis.Redis, namespace: str
) -> None:
    base = dashboard(start_daemon, {"t.ok": {"command": ["true"]}})
    parked = QueueDriver(r, namespace, "parked")  # served by no daemon: the test is the job's handler
    job_id = parked.enqueue("t.long", {}).id
    leased = parked.lease_one()
    talk_back(parked.producer, leased, percent=10, message="starting", lines=("first line",))
    page.goto(f"{base}job?queue=parked&id={job_id}")
    expect(page.locator("#job-progress progress")).to_have_attribute("value", "10.0")
    expect(page.locator("#job-progress-text")).to_contain_text("10% starting")
    expect(page.locator("#job-log li")).to_have_count(1)
    expect(page.locator("#job-no-steps")).to_be_visible()

    talk_back(
        parked.producer, leased, percent=60, message=XSS[1], lines=(XSS[0], "last <b>line</b>"),
        steps={"fetch": b"x" * 5000}, children=(("parked", "kid"),),
    )  # fmt: skip
    expect(page.locator("#job-progress-text .percent")).to_have_text("60%", timeout=15_000)
    assert page.evaluate("document.querySelector('#job-progress progress').value") == 60
    expect(page.locator("#job-progress-text .message")).to_have_text(XSS[1])
    expect(page.locator("#job-log li")).to_have_count(3)
    expect(page.locator("#job-log li .line").nth(1)).to_have_text(XSS[0])
    expect(page.locator("#job-log li .line").nth(2)).to_have_text("last <b>line</b>")
    expect(page.locator("#job-steps tbody tr")).to_have_text(re.compile(r"fetch\s*4\.9 KiB"))
    expect(page.locator("#job-children a")).to_have_attribute("href", "/ui/job?queue=parked&id=kid")
    assert page.locator("main img").count() == 0
    assert page.locator("#job-live b, #job-live script").count() == 0
    save(page, "job-running")

    page.goto(f"{base}queues/parked?state=active")
    expect(page.locator("td.progress-cell")).to_contain_text("60%")
    expect(page.locator("td.progress-cell .message")).to_have_text(XSS[1])
    assert page.locator("main img").count() == 0

    page.goto(f"{base}job?queue=parked&id={job_id}")
    expect(page.locator("#job-state")).to_have_text("active")
    parked.ack(job_id, leased.token, retention_ms=60_000)
    expect(page.locator("#job-state")).to_have_text("done", timeout=15_000)  # and the script stops there


def tab_to(page: Page, label: str, backwards: bool = False) -> None:
    """Press Tab (or Shift+Tab) until the focused element's accessible label or text is `label`."""
    for _ in range(60):
        page.keyboard.press("Shift+Tab" if backwards else "Tab")
        focused = page.evaluate(
            "(() => { const e = document.activeElement;"
            " return (e.getAttribute('aria-label') || e.textContent || '').trim(); })()"
        )
        if focused == label:
            return
    raise AssertionError(f"{label!r} cannot be reached with the keyboard")


def test_a_bulk_requeue_works_from_the_keyboard_alone(
    page: Page, start_daemon: StartDaemon, r: redis.Redis, namespace: str
) -> None:
    base = dashboard(start_daemon, {"t.ok": {"command": ["true"]}}, ui={"write": True})
    first, second = park_dead(r, namespace, 2)
    page.goto(base + "queues/parked/dead")
    tab_to(page, f"Select job {second}")
    page.keyboard.press("Space")
    tab_to(page, "Requeue…", backwards=True)
    page.keyboard.press("Enter")
    expect(page.locator("h1")).to_have_text("Requeue 1 dead job?")
    tab_to(page, "Requeue 1")
    page.keyboard.press("Enter")
    expect(page.get_by_role("status")).to_have_text("1 dead job requeued")
    parked = QueueDriver(r, namespace, "parked")
    assert (parked.where(first), parked.where(second)) == (State.DEAD, State.PENDING)


def test_the_held_tab_lists_each_jobs_limit_group(
    page: Page, start_daemon: StartDaemon, r: redis.Redis, namespace: str
) -> None:
    base = dashboard(start_daemon, {"t.ok": {"command": ["true"]}})
    parked = QueueDriver(r, namespace, "parked")  # no daemon serves it: its jobs stay where they are
    limited = [parked.enqueue("a", {"n": n}).id for n in range(4)]
    assert len(parked.lease(limits='{"a": {"total": 1}}').jobs) == 1  # the other three are held
    page.goto(base)
    expect(page.locator('#queues tr[data-queue="parked"] [data-field="held"]')).to_have_text("3")
    page.locator('#queues tr[data-queue="parked"] [data-field="held"] a').click()
    expect(page.get_by_role("link", name="held", exact=True)).to_have_attribute("aria-current", "page")
    expect(page.locator("table.jobs td.id")).to_have_text(limited[1:])
    expect(page.locator("table.jobs td.held-by")).to_have_text(["a"] * 3)
    save(page, "queue-held")


def parked_bills(r: redis.Redis, namespace: str) -> tuple[QueueDriver, dict[int, str]]:
    """Six pending jobs in queue `parked`, which no daemon serves, payloads {"customer": n % 3, "note": <script>}."""
    parked = QueueDriver(r, namespace, "parked")
    return parked, {n: parked.enqueue("t.bill", {"customer": n % 3, "note": XSS[0]}).id for n in range(6)}


def test_the_search_box_finds_jobs_by_a_payload_field(
    page: Page, start_daemon: StartDaemon, r: redis.Redis, namespace: str
) -> None:
    base = dashboard(start_daemon, {"t.ok": {"command": ["true"]}})
    _, bills = parked_bills(r, namespace)
    page.goto(base + "queues/parked")
    page.get_by_label("Search").fill("payload.customer=1")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("table.jobs td.id")).to_have_text([bills[1], bills[4]])
    expect(page.locator("p.hint")).to_contain_text("Looked at 6 job(s)")
    expect(page.get_by_label("Search")).to_have_value("payload.customer=1")
    save(page, "queue-search")


def test_a_bulk_cancel_by_filter_asks_first_then_cancels_exactly_those(
    page: Page, start_daemon: StartDaemon, r: redis.Redis, namespace: str
) -> None:
    base = dashboard(start_daemon, {"t.ok": {"command": ["true"]}}, ui={"write": True})
    parked, bills = parked_bills(r, namespace)
    page.goto(base + "queues/parked?state=pending&where=payload.customer%3D1")
    page.get_by_role("button", name="Cancel the matching pending jobs…").click()
    expect(page.locator("h1")).to_have_text("Cancel 2 pending jobs?")
    assert all(parked.job(i) is not None for i in bills.values()), "nothing changes before the confirmation"
    save(page, "confirm-cancel")
    page.get_by_role("button", name="Cancel 2").click()
    expect(page.get_by_role("status")).to_have_text("2 pending jobs canceled")
    assert {n for n, i in bills.items() if parked.job(i) is None} == {1, 4}
