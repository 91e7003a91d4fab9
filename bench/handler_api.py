"""What one handler API call costs the daemon: µs of its CPU and Redis round trips per progress call and per
step write, measured on a real `jobcar run` whose command handler makes the calls.

    .venv/bin/python bench/handler_api.py [--calls 3000] [--runs 3]

Each run starts one daemon on a private Redis and runs one job whose handler (Python, one keep-alive
connection) makes `--calls` calls of each kind in turn. Around each kind's calls (the handler waits for a file
to start them, and writes one when done) it reads the daemon's user + system CPU (/proc) and Redis's
`INFO commandstats`: the scripts called (the daemon's round trips) and every command run, those inside the
scripts too. A first kind of call that writes nothing (GET of the attempt) gives the HTTP request's own cost.
Medians over the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary, wait_for

from cpu_per_job import cpu_seconds  # bench/cpu_per_job.py
from jobcar import Client

KINDS = ("read", "progress", "step")

HANDLER = textwrap.dedent(
    """
    import http.client, json, os, sys, time, urllib.parse
    job = json.load(sys.stdin)
    url = urllib.parse.urlsplit(os.environ["JOBCAR_ATTEMPT_URL"])
    headers = {"Authorization": "Bearer " + os.environ["JOBCAR_ATTEMPT_TOKEN"], "Content-Type": "application/json"}
    connection = http.client.HTTPConnection(url.hostname, url.port)
    def call(method, path, body):
        connection.request(method, url.path + path, body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        assert response.status < 300, response.status
    calls = {"read": ("GET", "", None), "progress": ("POST", "/progress", b'{"percent": 50, "message": "half"}'),
             "step": ("PUT", "/steps/s", b"x" * 100)}
    for kind in job["kinds"]:
        while not os.path.exists(os.path.join(job["dir"], "go-" + kind)):
            time.sleep(0.01)
        method, path, body = calls[kind]
        for _ in range(job["calls"]):
            call(method, path, body)
        open(os.path.join(job["dir"], "done-" + kind), "w").close()
    """
)


def commands(client: redis.Redis) -> tuple[int, int]:
    """(scripts called: the daemon's round trips for these calls, every command run: those inside scripts too),
    INFO's own left out."""
    stats = client.info("commandstats")
    scripts = sum(int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_evalsha", "cmdstat_eval"))
    return scripts, sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def one_run(server: RedisServer, tmp: Path, calls: int) -> dict[str, tuple[float, float, float]]:
    handler = tmp / "handler.py"
    handler.write_text(HANDLER)
    namespace = f"hapi{time.monotonic_ns()}"
    handlers = {"talk": {"command": [sys.executable, str(handler)], "timeout": "10m"}}
    config = write_config(tmp, server.url, namespace, handlers, log_level="info", lease="30s")
    daemon = DaemonProcess(config).start()
    client = server.client()
    work = tmp / namespace
    work.mkdir()
    try:
        payload = json.dumps({"kinds": list(KINDS), "calls": calls, "dir": str(work)})
        Client(client, namespace=namespace).enqueue("talk", json.loads(payload))
        figures = {}
        for kind in KINDS:
            cpu, (scripts, every) = cpu_seconds(daemon.pid), commands(client)
            (work / f"go-{kind}").write_text("")
            wait_for((work / f"done-{kind}").exists, timeout=600, what=f"{kind} calls")
            after = commands(client)
            figures[kind] = ((cpu_seconds(daemon.pid) - cpu) / calls * 1e6, (after[0] - scripts) / calls,
                             (after[1] - every) / calls)  # fmt: skip
        return figures
    finally:
        daemon.stop()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        (tmp / "redis").mkdir()
        server = RedisServer(find_server_binary(), tmp / "redis").start()
        try:
            runs = [one_run(server, tmp, args.calls) for _ in range(args.runs)]
        finally:
            server.stop()
    read_cpu = statistics.median(r["read"][0] for r in runs)
    print(f"{args.calls} calls of each kind, {args.runs} runs, medians: daemon CPU per call, Redis commands per call")
    print(f"{'call':<12}{'CPU µs':>10}{'beyond a GET':>14}{'round trips':>13}{'commands run':>14}")
    for kind in KINDS:
        cpu, trips, every = (statistics.median(r[kind][i] for r in runs) for i in range(3))
        print(f"{kind:<12}{cpu:>10.0f}{cpu - read_cpu:>14.0f}{trips:>13.2f}{every:>14.2f}")


if __name__ == "__main__":
    main()
