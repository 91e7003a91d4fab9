"""The API's tokens with roles (api_tokens.py, ADR 0026) on the real listener and real Redis: every route of the
listener (api.py, api_schedules.py, api_jobs.py, the handler API, the dashboard's pages and actions) allowed or
refused for each role, from one table that every route must be in; then a real `jobcar run`: the tokens' names in
its log lines (never a token), a token rotated by a real SIGHUP, token_file and ${VAR}, a reload that would leave a
reachable listener open refused; and `GET /v1/stats`, the document of `jobcar stats --json`, for a read token."""

from __future__ import annotations

import json
import re
import signal
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from jobcar.api import ApiContext, build_app
from jobcar.api_tokens import Role
from jobcar.config_types import ApiTokenSetting, Config, UiSettings
from jobcar.job import State
from tests.integration.daemon_harness import DaemonProcess, listen_url
from tests.integration.daemon_harness import write_config as write_daemon_config
from tests.integration.driver import QueueDriver
from tests.integration.test_api import MAX_PAYLOAD, TOKEN, Api, running_api
from tests.integration.test_cli import cli
from tests.servers import RedisServer

#: role -> (name, token) of the in-process listener's `api_tokens`; `api_token` (TOKEN) is an operate token too.
TOKENS = {Role.READ: ("viewer", "r3ad-t0ken"), Role.PRODUCE: ("producer", "pr0duce-t0ken"),
          Role.OPERATE: ("ops", "0perate-t0ken")}  # fmt: skip
PUBLIC, ATTEMPT, DASHBOARD, SESSION = "public", "attempt", "dashboard", "session"

#: Every route of the listener (method, path as aiohttp names it; HEAD goes with GET) -> what it needs: a role, or
#: PUBLIC (the probes: no token), ATTEMPT (the handler API: the attempt's own token, never an API token),
#: DASHBOARD (the dashboard's bare path, a redirect), SESSION (signing in and out, the dashboard's assets). A route
#: added to the listener and missing here fails test_every_route_is_in_the_table: decide what it needs.
ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/metrics"): PUBLIC,
    ("POST", "/v1/jobs"): Role.PRODUCE,
    ("GET", "/v1/jobs"): Role.READ,
    ("POST", "/v1/jobs/cancel"): Role.OPERATE,
    ("GET", "/v1/jobs/{id}"): Role.READ,
    ("DELETE", "/v1/jobs/{id}"): Role.OPERATE,
    ("POST", "/v1/drain"): Role.OPERATE,
    ("GET", "/v1/limits"): Role.READ,
    ("GET", "/v1/stats"): Role.READ,
    ("GET", "/v1/schedules"): Role.READ,
    ("GET", "/v1/schedules/{name}"): Role.READ,
    ("PUT", "/v1/schedules/{name}"): Role.OPERATE,
    ("POST", "/v1/schedules/{name}/pause"): Role.OPERATE,
    ("POST", "/v1/schedules/{name}/resume"): Role.OPERATE,
    ("POST", "/v1/schedules/{name}/trigger"): Role.OPERATE,
    ("DELETE", "/v1/schedules/{name}"): Role.OPERATE,
    ("GET", "/v1/attempts/{id}"): ATTEMPT,
    ("POST", "/v1/attempts/{id}/progress"): ATTEMPT,
    ("POST", "/v1/attempts/{id}/log"): ATTEMPT,
    ("POST", "/v1/attempts/{id}/extend"): ATTEMPT,
    ("POST", "/v1/attempts/{id}/snooze"): ATTEMPT,
    ("POST", "/v1/attempts/{id}/children"): ATTEMPT,
    ("GET", "/v1/attempts/{id}/children"): ATTEMPT,
    ("POST", "/v1/attempts/{id}/await-children"): ATTEMPT,
    ("GET", "/v1/attempts/{id}/steps"): ATTEMPT,
    ("GET", "/v1/attempts/{id}/steps/{name}"): ATTEMPT,
    ("PUT", "/v1/attempts/{id}/steps/{name}"): ATTEMPT,
    ("GET", "/ui"): DASHBOARD,
    ("GET", "/ui/"): Role.READ,
    ("GET", "/ui/overview.json"): Role.READ,
    ("GET", "/ui/queues/{queue}"): Role.READ,
    ("GET", "/ui/queues/{queue}/dead"): Role.READ,
    ("GET", "/ui/job"): Role.READ,
    ("GET", "/ui/job.json"): Role.READ,
    ("GET", "/ui/job/payload"): Role.READ,
    ("GET", "/ui/schedules"): Role.READ,
    ("GET", "/ui/limits"): Role.READ,
    ("GET", "/ui/login"): SESSION,
    ("POST", "/ui/login"): SESSION,
    ("POST", "/ui/logout"): SESSION,
    ("GET", "/ui/static"): SESSION,
    ("POST", "/ui/job/{action}"): Role.OPERATE,
    ("POST", "/ui/queues/{queue}/{action}"): Role.OPERATE,
    ("POST", "/ui/queues/{queue}/dead/confirm"): Role.OPERATE,
    ("POST", "/ui/queues/{queue}/dead/apply"): Role.OPERATE,
    ("POST", "/ui/queues/{queue}/cancel/{step}"): Role.OPERATE,
    ("POST", "/ui/schedules/{name}/{action}"): Role.OPERATE,
}


def listener_routes(api: Api) -> set[tuple[str, str]]:
    """(method, path) of every route the listener serves, the dashboard's included (HEAD: with GET): those of an
    app built as the daemon builds it."""
    config = Config(source="test.yaml", api_token=TOKEN, max_payload_bytes=MAX_PAYLOAD, ui=UiSettings(write=True))
    app = build_app(ApiContext(config=config, client=api.client, readiness=api.probe.readiness,
                               drain=api.probe.drain, metrics=_no_metrics))  # fmt: skip
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }


async def _no_metrics() -> bytes:
    return b""


@pytest.fixture
async def api(redis_server: RedisServer, namespace: str) -> AsyncIterator[Api]:
    settings = tuple(ApiTokenSetting(name=name, role=role.value, token=token) for role, (name, token) in TOKENS.items())
    async with running_api(redis_server.url, namespace, api_tokens=settings, ui=UiSettings(write=True)) as running:
        yield running


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_every_route_is_in_the_table(api: Api) -> None:
    missing = sorted(listener_routes(api) - set(ROUTES))
    assert not missing, f"routes of the listener that ROUTES does not place (what does each need?): {missing}"


# -- the API: each route for each role --------------------------------------------------------------------------


async def test_each_api_route_is_allowed_or_refused_by_role(api: Api, q: QueueDriver, namespace: str) -> None:
    job = q.enqueue("t", {"n": 1}).id
    assert (await api.call("PUT", "/v1/schedules/s", json={"type": "t", "every": "1h"})).status == 200
    # A concrete request per route: (path, request arguments).
    concrete: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {
        ("POST", "/v1/jobs"): [("/v1/jobs", {"json": {"type": "t"}})],
        ("GET", "/v1/jobs"): [("/v1/jobs", {"params": {"state": "pending"}})],
        ("POST", "/v1/jobs/cancel"): [("/v1/jobs/cancel", {"json": {"state": "pending", "type": "nothing-of-this"}})],
        ("GET", "/v1/jobs/{id}"): [(f"/v1/jobs/{job}", {})],
        ("DELETE", "/v1/jobs/{id}"): [("/v1/jobs/no-such-job", {})],
        ("POST", "/v1/drain"): [("/v1/drain", {})],
        ("GET", "/v1/limits"): [("/v1/limits", {})],
        ("GET", "/v1/stats"): [("/v1/stats", {})],
        ("GET", "/v1/schedules"): [("/v1/schedules", {})],
        ("GET", "/v1/schedules/{name}"): [("/v1/schedules/s", {})],
        ("PUT", "/v1/schedules/{name}"): [("/v1/schedules/s", {"json": {"type": "t", "every": "2h"}})],
        ("POST", "/v1/schedules/{name}/pause"): [("/v1/schedules/s/pause", {})],
        ("POST", "/v1/schedules/{name}/resume"): [("/v1/schedules/s/resume", {})],
        ("POST", "/v1/schedules/{name}/trigger"): [("/v1/schedules/s/trigger", {})],
        ("DELETE", "/v1/schedules/{name}"): [("/v1/schedules/gone", {})],
    }
    served = listener_routes(api)
    api_routes = {key: needed for key, needed in ROUTES.items() if key[1].startswith("/v1/") and key in served}
    checked = 0
    for (method, canonical), needed in api_routes.items():
        if needed == ATTEMPT:
            continue  # test_the_handler_api_takes_no_api_token
        for path, kwargs in concrete[(method, canonical)]:
            anonymous = await api.call(method, path, anon=True, **kwargs)
            assert anonymous.status == 401, (method, path)
            for role, (name, token) in TOKENS.items():
                reply = await api.call(method, path, anon=True, headers=bearer(token), **kwargs)
                if role is Role.OPERATE or role == needed:
                    assert reply.status not in (401, 403), (method, path, role, reply.body)
                else:
                    assert reply.status == 403, (method, path, role, reply.body)
                    assert reply.body == {
                        "error": f"token {name} has role {role.value}: this route needs {needed}",
                        "role": role.value,
                        "needed": needed,
                    }
                checked += 1
            legacy = await api.call(method, path, anon=True, headers=bearer(TOKEN), **kwargs)  # api_token: operate
            assert legacy.status not in (401, 403), (method, path, legacy.body)
    assert checked == 3 * sum(len(concrete[key]) for key, needed in api_routes.items() if needed != ATTEMPT) >= 3 * 13
    # What the refusals kept from happening: one drain per operate call (ops, api_token), no job canceled.
    assert api.probe.drains == 2
    assert q.where(job) is State.PENDING
    for path in ("/healthz", "/readyz", "/metrics"):
        async with api.anon.get(path) as answer:
            assert answer.status == 200, path


async def test_the_handler_api_takes_no_api_token(api: Api) -> None:
    """The handler API's routes answer an API token of any role exactly as they answer none: the attempt's own
    token is their credential (handler_api.py)."""
    paths = {"{id}": "no-such-attempt", "{name}": "step"}
    for (method, canonical), needed in ROUTES.items():
        if needed != ATTEMPT:
            continue
        path = canonical
        for field, value in paths.items():
            path = path.replace(field, value)
        kwargs: dict[str, Any] = {"json": {}} if method in ("POST", "PUT") else {}
        async with api.anon.request(method, path, **kwargs) as answer:
            without = (answer.status, await answer.read())
        for _, token in TOKENS.values():
            async with api.anon.request(method, path, headers=bearer(token), **kwargs) as answer:
                assert (answer.status, await answer.read()) == without, (method, path)


async def test_a_bearer_token_is_matched_whole(api: Api) -> None:
    _, read = TOKENS[Role.READ]
    for header in (f"Bearer {read}x", f"Bearer {read[:-1]}", f"Basic {read}", read, "Bearer ", f"Bearer {read}{read}"):
        reply = await api.call("GET", "/v1/stats", anon=True, headers={"Authorization": header})
        assert reply.status == 401, header


# -- the dashboard: each page and action for each role ---------------------------------------------------------


CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


async def signed_in(base: str, token: str) -> aiohttp.ClientSession:
    """A browser-like session (cookies kept) after the login form took `token`."""
    session = aiohttp.ClientSession(base, cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with session.post("/ui/login", data={"token": token, "next": "/ui/"}, allow_redirects=False) as answer:
        assert answer.status in (303, 401, 403)  # signed in; not the token; a role that cannot read
    return session


async def test_each_dashboard_page_and_action_by_role(api: Api, q: QueueDriver, r: redis.Redis, namespace: str) -> None:
    base = f"http://127.0.0.1:{api.port}"
    await api.call("PUT", "/v1/schedules/s", json={"type": "t", "every": "1h"})
    info = q.enqueue("t.dead")
    q.kill(info.id, q.lease_one().token, "boom")
    pending = q.enqueue("t", {"n": 1}).id
    pages = {
        "/ui/": "/ui/",
        "/ui/overview.json": "/ui/overview.json",
        "/ui/queues/{queue}": "/ui/queues/default",
        "/ui/queues/{queue}/dead": "/ui/queues/default/dead",
        "/ui/job": f"/ui/job?queue=default&id={pending}",
        "/ui/job.json": f"/ui/job.json?queue=default&id={pending}",
        "/ui/job/payload": f"/ui/job/payload?queue=default&id={pending}",
        "/ui/schedules": "/ui/schedules",
        "/ui/limits": "/ui/limits",
    }
    actions = {
        "/ui/job/{action}": [("/ui/job/requeue", {"queue": "default", "id": info.id}),
                             ("/ui/job/delete", {"queue": "default", "id": "no-such-job"}),
                             ("/ui/job/cancel", {"queue": "default", "id": pending})],
        "/ui/queues/{queue}/{action}": [("/ui/queues/default/pause", {}), ("/ui/queues/default/resume", {})],
        "/ui/queues/{queue}/dead/confirm": [("/ui/queues/default/dead/confirm", {"action": "requeue",
                                                                                 "scope": "filter"})],
        "/ui/queues/{queue}/dead/apply": [("/ui/queues/default/dead/apply", {"action": "delete", "scope": "filter",
                                                                             "type": "nothing-of-this"})],
        "/ui/queues/{queue}/cancel/{step}": [(f"/ui/queues/default/cancel/{step}", {"state": "pending",
                                              "type": "nothing-of-this"}) for step in ("confirm", "apply")],
        "/ui/schedules/{name}/{action}": [("/ui/schedules/s/pause", {}), ("/ui/schedules/s/resume", {}),
                                          ("/ui/schedules/s/trigger", {})],
    }  # fmt: skip
    served = listener_routes(api)
    dashboard = {key: needed for key, needed in ROUTES.items() if key[1].startswith("/ui/") and key in served}
    assert {c for (m, c), n in dashboard.items() if m == "GET" and n == Role.READ} <= set(pages)
    assert {c for (m, c), n in dashboard.items() if m == "POST" and n == Role.OPERATE} <= set(actions)
    for role, (name, token) in [(Role.READ, TOKENS[Role.READ]), (Role.OPERATE, TOKENS[Role.OPERATE])]:
        async with await signed_in(base, token) as browser:
            for canonical, path in pages.items():
                async with browser.get(path, allow_redirects=False) as answer:
                    assert answer.status == 200, (role, path)
                    text = await answer.text()
                if canonical in ("/ui/queues/{queue}/dead", "/ui/job", "/ui/schedules"):
                    forms = set(re.findall(r'<form method="post" action="([^"]+)"', text)) - {"/ui/logout"}
                    assert bool(forms) is (role is Role.OPERATE), (role, path, forms)
            async with browser.get("/ui/queues/default") as page:
                csrf = CSRF.findall(await page.text())[0]
            for requests in actions.values():
                for path, form in requests:
                    async with browser.post(path, data={**form, "csrf": csrf}, allow_redirects=False) as answer:
                        text = await answer.text()
                        if role is Role.OPERATE:
                            assert answer.status not in (401, 403), (path, text)
                        else:
                            assert answer.status == 403, (path, text)
                            assert text == f"read-only: token {name} has role read; acting needs operate\n"
        if role is Role.READ:  # nothing a refused action would have done
            assert q.where(info.id) is State.DEAD
            assert q.where(pending) is State.PENDING
    assert q.where(pending) is State.CANCELED or q.where(pending) is None
    # A produce token cannot sign in, nor read a page with its bearer header; anonymous is sent to sign in.
    _, produce = TOKENS[Role.PRODUCE]
    async with await signed_in(base, produce) as browser, browser.get("/ui/", allow_redirects=False) as answer:
        assert answer.status == 303  # no session was made
        assert answer.headers["Location"].startswith("/ui/login")
    async with aiohttp.ClientSession(base) as script:
        async with script.get("/ui/overview.json", headers=bearer(produce)) as answer:
            assert answer.status == 403
            assert "role produce" in await answer.text()
        async with script.get("/ui/overview.json", headers=bearer(TOKENS[Role.READ][1])) as answer:
            assert answer.status == 200


async def test_an_operate_token_on_a_read_only_dashboard_has_no_buttons(
    redis_server: RedisServer, namespace: str, q: QueueDriver
) -> None:
    settings = (ApiTokenSetting(name="ops", role="operate", token="0ps"),)
    async with running_api(redis_server.url, namespace, token=None, api_tokens=settings, ui=UiSettings(write=False)
                           ) as api:  # fmt: skip
        job = q.enqueue("t").id
        async with await signed_in(f"http://127.0.0.1:{api.port}", "0ps") as browser:
            async with browser.get(f"/ui/job?queue=default&id={job}") as page:
                text = await page.text()
                assert "read-only" in text
                assert not set(re.findall(r'<form method="post" action="([^"]+)"', text)) - {"/ui/logout"}
                csrf = CSRF.findall(text)[0]
            async with browser.post("/ui/job/cancel", data={"queue": "default", "id": job, "csrf": csrf}) as answer:
                assert answer.status == 403
        assert q.where(job) is State.PENDING


# -- a real `jobcar run`: names in the log, reload, token_file, ${VAR}, /v1/stats ---------------------------------


def call(base: str, method: str, path: str, token: str | None, body: object = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **(bearer(token) if token else {})}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_a_daemons_tokens_log_by_name_rotate_on_reload_and_come_from_files_and_the_environment(
    redis_server: RedisServer, namespace: str, tmp_path: Path, r: redis.Redis
) -> None:
    token_file = tmp_path / "ops.token"
    token_file.write_text("ops-first-t0ken\n")  # as a secret store mounts it: the newline is not the token's
    tokens = {
        "ops": {"role": "operate", "token_file": token_file.name},  # relative to the config file's folder
        "grafana": {"role": "read", "token": "${GRAFANA_TOKEN}"},
        "shop": {"role": "produce", "token": "sh0p-t0ken"},
    }
    config = write_daemon_config(tmp_path, redis_server.url, namespace, {"t": {"command": ["true"]}},
                                 listen="0.0.0.0:0", api_tokens=tokens)  # fmt: skip
    daemon = DaemonProcess(config, env={"GRAFANA_TOKEN": "graf-t0ken"}).start()
    port = re.search(r":(\d+)$", listen_url(daemon)).group(1)  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    secrets = ["ops-first-t0ken", "graf-t0ken", "sh0p-t0ken"]
    parked = QueueDriver(r, namespace, "parked")  # no daemon serves it: what is there stays
    daemon.wait_for_log("the API's tokens: ops (operate), grafana (read), shop (produce)")

    # Each role, and the names in the log lines of what each did.
    status, created = call(base, "POST", "/v1/jobs", "sh0p-t0ken", {"type": "t", "queue": "parked"})
    assert status == 201
    daemon.wait_for_log(f"enqueued by shop: {created['id']} in parked (created)")
    assert call(base, "GET", f"/v1/jobs/{created['id']}", "sh0p-t0ken")[0] == 403  # produce reads nothing
    assert call(base, "GET", f"/v1/jobs/{created['id']}", "graf-t0ken")[0] == 200
    victim = parked.enqueue("t").id
    assert call(base, "DELETE", f"/v1/jobs/{victim}?queue=parked", "graf-t0ken")[0] == 403
    refusal = daemon.wait_for_log(f"DELETE /v1/jobs/{victim} refused")["msg"]  # logged, with the name
    assert refusal.endswith("refused: token grafana (role read) is not allowed to operate")
    assert call(base, "DELETE", f"/v1/jobs/{victim}?queue=parked", "ops-first-t0ken")[0] == 200
    daemon.wait_for_log(f"job {victim} in parked: canceled by ops (was pending)")
    assert call(base, "PUT", "/v1/schedules/nightly", "ops-first-t0ken", {"type": "t", "every": "1h",
                                                                         "queue": "parked"})[0] == 200  # fmt: skip
    daemon.wait_for_log("schedule nightly set by ops: created")
    assert call(base, "POST", "/v1/schedules/nightly/pause", "ops-first-t0ken")[0] == 200
    daemon.wait_for_log("schedule nightly: pause by ops")

    # GET /v1/stats for the read token: the document of `jobcar stats --json`, one definition.
    status, stats = call(base, "GET", "/v1/stats", "graf-t0ken")
    assert status == 200
    printed = cli("stats", "-c", str(config), "--json")
    assert printed.returncode == 0, printed.stderr
    cli_stats = json.loads(printed.stdout)
    assert [row["queue"] for row in stats] == [row["queue"] for row in cli_stats]
    for api_row, cli_row in zip(stats, cli_stats, strict=True):
        assert set(api_row) == set(cli_row)
        assert {k: v for k, v in api_row.items() if k != "latency_seconds"} == {
            k: v for k, v in cli_row.items() if k != "latency_seconds"
        }
    (parked_row,) = [row for row in stats if row["queue"] == "parked"]
    assert set(parked_row) >= {"pending", "scheduled", "active", "held", "waiting", "dead", "paused"}
    status, only = call(base, "GET", "/v1/stats?queue=parked", "graf-t0ken")
    assert (status, [row["queue"] for row in only]) == (200, ["parked"])
    assert call(base, "GET", "/v1/stats?queue=never-used", "graf-t0ken")[0] == 404
    assert call(base, "GET", "/v1/stats", "sh0p-t0ken")[0] == 403

    # Rotation: a new token in the file, a SIGHUP; the old one is refused at once, the new one works.
    token_file.write_text("ops-second-t0ken")
    secrets.append("ops-second-t0ken")
    daemon.signal(signal.SIGHUP)
    daemon.wait_for_log("reload: the API's tokens are now ops (operate), grafana (read), shop (produce)")
    assert call(base, "POST", "/v1/schedules/nightly/resume", "ops-first-t0ken")[0] == 401
    assert call(base, "POST", "/v1/schedules/nightly/resume", "ops-second-t0ken")[0] == 200
    daemon.wait_for_log("schedule nightly: resume by ops")

    # A token taken out of the file is refused after a reload; one that would leave 0.0.0.0 open is not applied.
    text = json.loads(config.read_text())
    config.write_text(json.dumps({**text, "api_tokens": {k: v for k, v in tokens.items() if k != "shop"}}))
    daemon.signal(signal.SIGHUP)
    daemon.wait_for_log("reload: the API's tokens are now ops (operate), grafana (read)")
    assert call(base, "POST", "/v1/jobs", "sh0p-t0ken", {"type": "t"})[0] == 401
    config.write_text(json.dumps({**{k: v for k, v in text.items() if k != "api_tokens"}, "listen": "127.0.0.1:0"}))
    daemon.signal(signal.SIGHUP)
    daemon.wait_for_log("reload failed; keeping the running config")
    assert call(base, "GET", "/v1/stats", None)[0] == 401
    assert call(base, "GET", "/v1/stats", "graf-t0ken")[0] == 200

    assert call(base, "POST", "/v1/drain", "ops-second-t0ken")[0] == 202
    daemon.wait_for_log("drain requested over HTTP by ops")
    log = daemon.log_path.read_text()
    for secret in secrets:
        assert secret not in log, "a token is in the daemon's log"
    daemon.stop()


def test_a_token_file_the_daemon_cannot_read_stops_it_at_start(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    tokens = {"ops": {"role": "operate", "token_file": str(tmp_path / "missing")}}
    config = write_daemon_config(tmp_path, redis_server.url, namespace, {"t": {"command": ["true"]}}, api_tokens=tokens)
    done = cli("check", "-c", str(config))
    assert done.returncode != 0
    assert "api_tokens.ops.token_file: cannot read" in done.stderr
    # A command that runs no daemon passes over it (the token matches nothing there).
    assert cli("stats", "-c", str(config), "--json").returncode == 0
