"""An HTTP handler for the quickstart, standard library only: `python3 handlers/quickstart/hello_http.py`.

jobcar POSTs each job's payload as the request body, with its metadata in `Jobcar-*` headers. A 2xx
answer is success; 429/503 (with Retry-After), 408, 425 and 5xx are retried; any other 4xx sends the
job straight to the dead-letter queue.
"""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HelloHandler(BaseHTTPRequestHandler):
    server_version = "hello-handler/1"

    def do_POST(self) -> None:
        if self.path != "/jobs/hello":
            self.send_error(404)
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        job_id = self.headers.get("Jobcar-Job-Id", "?")
        attempt = self.headers.get("Jobcar-Attempt", "?")
        print(f"hello_http: job {job_id}, attempt {attempt}: {body.decode(errors='replace')}", flush=True)
        answer = json.dumps({"hello": job_id}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:
        # The default access log goes to stderr; jobs are already printed above.
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    args = parser.parse_args()
    with ThreadingHTTPServer((args.host, args.port), HelloHandler) as server:
        print(f"hello_http: listening on http://{args.host}:{server.server_port}/jobs/hello", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            sys.exit(0)


if __name__ == "__main__":
    main()
