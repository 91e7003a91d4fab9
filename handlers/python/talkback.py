"""talkback.py: an example jobcar *HTTP* handler in Python that talks back to jobcar during its job
through the handler API (docs/handler-api.md): progress, log lines, durable steps and a snooze. Standard
library only.

    PORT=8080 python3 handlers/python/talkback.py    (PORT=0 picks a free port; either way the first line
                                                       on stdout is "listening on <port>")

Each request jobcar sends carries, beside the job's metadata, where its attempt's handler API is and the
token that proves the call comes from this attempt:

    Jobcar-Attempt-Url     http://127.0.0.1:9321/v1/attempts/<job id>
    Jobcar-Attempt-Token   a secret good for this one attempt while it runs: `Authorization: Bearer <it>`

Three job types, one route each:

    POST /report   {"items": 5, "seconds_per_item": 1}: a long job; logs a line and reports its progress
                   after each item.
    POST /steps    {"order": "A-17"}: reserve a seat, then charge for it, each step's result kept with the
                   job: a retry skips what an earlier attempt finished. Test hook: {"die_after_first_step":
                   true} fails the first attempt (500) right after the first step.
    POST /snooze   {"file": "/srv/exports/today.csv", "delay": "30s"}: while the file is missing, come back
                   later without spending an attempt.

WORK_LOG=<file> appends a line per side effect of /steps ("reserve <order> <attempt>", "charge <order>
<seat>"): it stands in for what must not happen twice.

Config:
    handlers:
      report.build:  {url: "http://127.0.0.1:8080/report"}
      order.place:   {url: "http://127.0.0.1:8080/steps"}
      export.publish: {url: "http://127.0.0.1:8080/snooze", max_snoozes: 100}
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from server import serve  # server.py beside this file: the same serving loop

WORK_LOG = os.environ.get("WORK_LOG", "")


class Refused(Exception):
    """The handler API refused a call: 409 when the job was canceled, this attempt lost its lease (another
    attempt may run the job now) or already answered, 401 for a wrong token. Stop working: this attempt's
    answer will not count."""


class Attempt:
    """This attempt's handler API, from the request's headers."""

    def __init__(self, headers: Any) -> None:
        self.url, self.token = headers.get("Jobcar-Attempt-Url"), headers.get("Jobcar-Attempt-Token")
        if not self.url or not self.token:
            raise ValueError("no Jobcar-Attempt-Url and Jobcar-Attempt-Token headers: not sent by jobcar")

    def call(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json",
             missing_ok: bool = False) -> bytes | None:  # fmt: skip
        """One call; its answer's body (None for a 404 when `missing_ok`)."""
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": content_type}
        request = urllib.request.Request(self.url + path, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                if exc.code == 404 and missing_ok:
                    return None
                why = f"{method} {path}: HTTP {exc.code} {exc.read().decode(errors='replace')}"
                raise (Refused if exc.code in (401, 409) else RuntimeError)(why) from None

    def post(self, path: str, document: dict[str, Any]) -> None:
        self.call("POST", path, json.dumps(document).encode())

    def log(self, line: str) -> None:
        self.post("/log", {"line": line})  # or {"lines": [...]}, or a text/plain body

    def progress(self, percent: float | None = None, message: str | None = None) -> None:
        self.post("/progress", {k: v for k, v in (("percent", percent), ("message", message)) if v is not None})

    def step(self, name: str, work: Callable[[], str]) -> str:
        """The step's result: read back if an earlier attempt of this job kept it, else `work()`'s, kept now."""
        kept = self.call("GET", f"/steps/{name}", missing_ok=True)
        if kept is not None:
            self.log(f"step {name}: kept by an earlier attempt, skipped")
            return kept.decode()
        result = work()
        self.call("PUT", f"/steps/{name}", result.encode(), "application/octet-stream")
        self.log(f"step {name}: done")
        return result


def report(attempt: Attempt, job: dict[str, str], payload: dict[str, Any]) -> tuple[int, Any]:
    items, pause = int(payload.get("items", 5)), float(payload.get("seconds_per_item", 1))
    for i in range(1, items + 1):
        time.sleep(pause)  # the work on one item
        attempt.log(f"item {i} of {items} done")
        attempt.progress(percent=i * 100 // items, message=f"{i} of {items} items")
    return 200, {"items": items}


def steps(attempt: Attempt, job: dict[str, str], payload: dict[str, Any]) -> tuple[int, Any]:
    order, number = str(payload.get("order", "unnamed")), job["attempt"]

    def reserve() -> str:
        effect(f"reserve {order} {number}")
        return f"seat-{order}-{number}"  # which attempt reserved it

    seat = attempt.step("reserve", reserve)
    if payload.get("die_after_first_step") and number == "1":
        return 500, "the test hook: a crash between the steps\n"

    def charge() -> str:
        effect(f"charge {order} {seat}")
        return f"paid-{seat}"

    receipt = attempt.step("charge", charge)
    return 200, {"order": order, "seat": seat, "receipt": receipt, "attempt": int(number)}


def snooze(attempt: Attempt, job: dict[str, str], payload: dict[str, Any]) -> tuple[int, Any]:
    path, delay = str(payload.get("file", "")), payload.get("delay", "30s")
    if not os.path.exists(path):
        # 202: the attempt is over, the job comes back after `delay` with its attempt count unchanged (up to
        # the handler's max_snoozes). What this request answers now is not used.
        attempt.post("/snooze", {"delay": delay})
        return 200, "snoozed\n"
    with open(path) as file:
        lines = sum(1 for _ in file)
    return 200, {"file": path, "lines": lines, "attempt": int(job["attempt"])}


def effect(line: str) -> None:
    if WORK_LOG:
        with open(WORK_LOG, "a") as log:
            log.write(line + "\n")


ROUTES = {"/report": report, "/steps": steps, "/snooze": snooze}


class JobHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: jobcar reuses its connections

    def reply(self, status: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        route = ROUTES.get(self.path)
        if route is None:
            self.reply(404, "no such route\n")
            return
        job = {"id": self.headers.get("Jobcar-Job-Id", ""), "attempt": self.headers.get("Jobcar-Attempt", "1")}
        try:
            payload = json.loads(body)
            status, answer = route(Attempt(self.headers), job, payload if isinstance(payload, dict) else {})
        except Refused as exc:
            status, answer = 409, f"stopped: {exc}\n"  # not used by jobcar: the attempt is over
        except (KeyError, ValueError, TypeError) as exc:
            status, answer = 422, f"cannot process this job: {exc!r}\n"  # a permanent failure
        except (RuntimeError, OSError) as exc:
            status, answer = 500, f"temporary failure: {exc}\n"  # retried with backoff
        self.reply(status, answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


if __name__ == "__main__":
    serve(JobHandler)
