"""Make the README's dashboard screenshots from a real run: a daemon on an embedded server, real command
handlers (some fail, some are slow), a producer that enqueues for a few minutes at a varying rate, then
Debian's chromium takes the overview and a queue page.

    .venv/bin/python tools/readme_screenshots.py [--minutes 4]   # writes docs/images/dashboard-*.png

Needs `make test`'s tools (chromium, Playwright); nothing else runs beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from jobcar import Client

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(directory: Path, port: int) -> Path:
    config = {
        "redis": {"url": "embedded", "data_dir": str(directory / "data")},
        "namespace": "shop",
        "queues": {"default": 3, "mail": 2, "reports": 1},
        "listen": f"127.0.0.1:{port}",
        "concurrency": 20,
        "result_ttl": "10m",
        "ui": {"write": True},
        "log_format": "json",
        "defaults": {"timeout": "30s", "max_attempts": 3, "backoff": {"base": "2s", "max": "10s"}},
        "handlers": {
            "image.resize": {"command": ["sh", "-c", "cat >/dev/null; sleep 0.2"]},
            "email.send": {"command": ["sh", "-c", "cat >/dev/null; sleep 0.1"]},
            "email.bounce": {
                "command": ["sh", "-c", "echo 'smtp 550: mailbox unavailable' >&2; exit 1"],
                "max_attempts": 2,
            },
            "report.build": {"command": ["sleep", "3"]},
        },
        "schedules": {
            "nightly-report": {"type": "report.build", "queue": "reports", "cron": "0 3 * * *"},
            "digest": {"type": "email.send", "queue": "mail", "every": "1h"},
        },
    }
    path = directory / "jobcar.yaml"
    path.write_text(json.dumps(config, indent=2))
    return path


def produce(client: Client, minutes: float) -> None:
    """Jobs at a rate that rises and falls, with a share that fails, for `minutes`."""
    start = time.monotonic()
    n = 0
    while (elapsed := time.monotonic() - start) < minutes * 60:
        rate = 20 + 15 * math.sin(elapsed / 40)
        jobs = []
        for _ in range(int(rate)):
            n += 1
            jobs.append(("image.resize", {"image": f"img-{n}.jpg", "width": 640}, {}))
            if n % 3 == 0:
                jobs.append(("email.send", {"to": f"user{n}@example.com"}, {"queue": "mail"}))
            if n % 17 == 0:
                jobs.append(("email.bounce", {"to": f"gone{n}@example.com"}, {"queue": "mail"}))
            if n % 60 == 0:
                jobs.append(("report.build", {"day": n}, {"queue": "reports", "delay": 900}))
        client.enqueue_many(jobs)
        time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=4, help="how long the producer runs (default 4)")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        print("needs Debian's chromium: `make tools`", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        port = free_port()
        config = write_config(directory, port)
        log = (directory / "daemon.log").open("wb")
        daemon = subprocess.Popen([sys.executable, "-m", "jobcar.cli", "run", "-c", str(config)], stdout=log,
                                  stderr=subprocess.STDOUT, cwd=directory)  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while b"jobcar running" not in (directory / "daemon.log").read_bytes():
                if time.monotonic() > deadline or daemon.poll() is not None:
                    print((directory / "daemon.log").read_text(), file=sys.stderr)
                    return 1
                time.sleep(0.1)
            with Client.from_config(config) as client:
                produce(client, args.minutes)
            time.sleep(6)  # the daemons' last counts reach the history (flushed every 5 s)
            base = f"http://127.0.0.1:{port}/ui/"
            IMAGES.mkdir(parents=True, exist_ok=True)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 800}, device_scale_factor=1)
                page.goto(base)
                page.wait_for_selector("figure[data-chart] canvas")
                page.screenshot(path=IMAGES / "dashboard-overview.png", full_page=True)
                page.goto(base + "queues/mail?state=dead")
                page.screenshot(path=IMAGES / "dashboard-queue.png")  # the first rows of 50
                browser.close()
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
            log.close()
    print(f"wrote {IMAGES / 'dashboard-overview.png'} and {IMAGES / 'dashboard-queue.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
