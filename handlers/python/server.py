"""server.py: an example jobcar *HTTP* handler in Python, standard library only (http.server).

    PORT=8080 python3 handlers/python/server.py    (PORT=0 picks a free port; either way the first line
                                                     on stdout is "listening on <port>")

Protocol (README "Handlers"): jobcar sends `POST <url>` with the payload bytes as the body and the job's
metadata in headers: Jobcar-Job-Id, Jobcar-Job-Type, Jobcar-Queue, Jobcar-Attempt (1-based),
Jobcar-Max-Attempts, Jobcar-Enqueued-At, Jobcar-Deadline (RFC 3339), traceparent. The answer decides:

    2xx                     success; the body (here a small JSON object) becomes the job's result
    429/503 + Retry-After   "not now": jobcar tries again after that many seconds, no attempt spent
    408, 425, 429, 5xx      temporary failure: retried with backoff, spending an attempt
    any other 4xx           permanent failure: the job goes to the dead-letter queue at once

With `signing_secret` in the handler config, jobcar adds Jobcar-Timestamp (unix seconds) and
Jobcar-Signature: v1=<hex HMAC-SHA256 of "<timestamp>." + body>. Set the same secret here in
JOBCAR_SIGNING_SECRET and unsigned, forged or stale (> 300 s) requests get 401 (→ dead-letter queue).

The work: POST /jobs/<type> with {"text": "..."} counts its words. Test hooks in the payload:
{"fail_attempts": N} answers 500 to attempts 1..N; {"busy_for": N} answers 503 + Retry-After: 2 to the
first N deliveries of the job. WORK_LOG=<file> appends "<job id> <attempt>" each time the work is really
done (it stands in for a side effect that must not happen twice: an email, a payment).

Config:
    handlers:
      text.count:
        url: http://127.0.0.1:8080/jobs/text.count
        signing_secret: ${JOBCAR_SIGNING_SECRET}
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SECRET = os.environ.get("JOBCAR_SIGNING_SECRET", "")
TOLERANCE_S = 300
MAX_BODY = 1024 * 1024
WORK_LOG = os.environ.get("WORK_LOG", "")
PATH = re.compile(r"/jobs/([A-Za-z0-9._:-]+)")

# Idempotency: job id -> the result sent back. Jobs are delivered at least once, so a redelivery of a
# completed job gets the same answer without the work being redone. In memory for the example; a real
# handler keeps this where its work lands (a table with a unique key on the job id), so it survives a
# restart. The lock makes check, work and record one step: requests arrive on several threads.
done: dict[str, dict[str, Any]] = {}
seen: dict[str, int] = {}  # deliveries per job id, only for the busy_for test hook
lock = threading.Lock()


def signature_valid(timestamp: str | None, signature: str | None, body: bytes) -> bool:
    """Check Jobcar-Timestamp and Jobcar-Signature against the raw body, before parsing it. The header may
    hold several comma-separated v1= values (during a secret rotation): one match is enough."""
    if not timestamp or not signature or not re.fullmatch(r"[0-9]{1,12}", timestamp):
        return False
    if abs(time.time() - int(timestamp)) > TOLERANCE_S:
        return False
    mac = hmac.new(SECRET.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    expected = f"v1={mac}".encode()
    return any(hmac.compare_digest(expected, part.strip().encode()) for part in signature.split(","))


class JobHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: jobcar reuses its connections

    def reply(self, status: int, body: str | dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.reply(405, "POST only\n", {"Allow": "POST"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.close_connection = True  # the body is left unread
            self.reply(413, "payload too large\n")  # a 4xx: the job goes to the dead-letter queue
            return
        body = self.rfile.read(length)
        match = PATH.fullmatch(self.path)
        if match is None:
            self.reply(404, "no such job type\n")
            return
        if SECRET and not signature_valid(
            self.headers.get("Jobcar-Timestamp"), self.headers.get("Jobcar-Signature"), body
        ):
            self.reply(401, "bad or missing Jobcar-Signature\n")
            return
        job_id = self.headers.get("Jobcar-Job-Id")
        if not job_id:
            self.reply(400, "missing Jobcar-Job-Id\n")
            return
        attempt = int(self.headers.get("Jobcar-Attempt") or 1)
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        with lock:
            status, answer, headers = self.run_job(job_id, match[1], attempt, payload)
        self.reply(status, answer, headers)

    def run_job(self, job_id: str, job_type: str, attempt: int, payload: Any) -> tuple[int, Any, dict[str, str]]:
        if job_id in done:
            return 200, done[job_id], {}  # a redelivery: the same answer, no work
        if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
            # 422: retrying cannot fix this payload, so jobcar moves the job to the dead-letter queue.
            return 422, 'cannot process payload: expected {"text": "<string>"}\n', {}
        seen[job_id] = deliveries = seen.get(job_id, 0) + 1
        if deliveries <= _number(payload.get("busy_for")):
            # Overloaded: ask for a later slot. With 429 or 503 + Retry-After, jobcar spends no attempt.
            return 503, "busy, come back later\n", {"Retry-After": "2"}
        if attempt <= _number(payload.get("fail_attempts")):
            # Something temporary went wrong (a dependency is down): 500 -> retried with backoff.
            return 500, f"temporary failure on attempt {attempt}\n", {}

        # The work, then the record of it, then the answer.
        result = {"job_id": job_id, "type": job_type, "attempt": attempt, "words": len(payload["text"].split())}
        if WORK_LOG:
            with open(WORK_LOG, "a") as log:
                log.write(f"{job_id} {attempt}\n")
        done[job_id] = result
        seen.pop(job_id, None)
        print(f"server.py: job {job_id} ({job_type}) done on attempt {attempt}", file=sys.stderr, flush=True)
        return 200, result, {}

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log; jobs are logged above


def _number(value: Any) -> int:
    return value if isinstance(value, int) else 0


def serve(handler: type[BaseHTTPRequestHandler]) -> None:
    """Serve `handler` on $HOST:$PORT until SIGTERM or Ctrl-C (talkback.py serves its own this way too)."""
    server = ThreadingHTTPServer((os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8080"))), handler)
    server.daemon_threads = True
    # SIGTERM (from a supervisor or a test) stops serving; shutdown() must run off the serving thread.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    # The only line on stdout: a test (or a supervisor) reads the port from it.
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    serve(JobHandler)
