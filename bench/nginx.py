"""nginx on loopback answering every request with `return 204;`: the cheapest real HTTP handler there is,
so a benchmark against it measures the caller, not the handler.

    with Nginx() as url:   # http://127.0.0.1:<port>/noop
        ...

`Nginx(batches=True)` also answers batched deliveries at `/batch` (every job done), in njs, nginx's own
JavaScript module (Debian: `apt-get install libnginx-mod-http-js`).

Needs the `nginx` binary (Debian: `apt-get install nginx-light`; `make bench` installs it as root).
It runs in the foreground with its own prefix directory, pid file and logs under a temporary
directory, so it never touches the system's nginx configuration or port 80.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from types import TracebackType

from tests.servers import free_port, stop_process, wait_for

CONFIG = """\
{load}
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body;
  client_body_buffer_size 4m;
  client_max_body_size 4m;
  {js_import}
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  server {{
    listen 127.0.0.1:{port};
    location / {{ return 204; }}
    {batch_location}
  }}
}}
"""


#: Answers a batch (a JSON array of jobs, read whole into memory) with every job done.
ANSWERS_JS = """\
function done(r) {
  const answers = JSON.parse(r.requestText).map((job) => ({ id: job.id, outcome: "done" }));
  r.headersOut["Content-Type"] = "application/json";
  r.return(200, JSON.stringify(answers));
}
export default { done };
"""
JS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
    if found is None:
        raise RuntimeError("nginx not found: apt-get install nginx-light (make bench does it as root)")
    return found


def nginx_version() -> str:
    done = subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True, check=True)
    return done.stderr.strip().removeprefix("nginx version: nginx/")


class Nginx:
    """One nginx master and one worker (a single core's worth, like the handler of a sidecar)."""

    def __init__(self, *, batches: bool = False) -> None:
        if batches and not JS_MODULE.exists():
            raise RuntimeError(f"{JS_MODULE} not found: apt-get install libnginx-mod-http-js")
        self.batches = batches
        self.port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="jobcar-nginx-")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/noop"

    def __enter__(self) -> str:
        prefix = Path(self._dir.name)
        js = {"load": "", "js_import": "", "batch_location": ""}
        if self.batches:
            (prefix / "answers.js").write_text(ANSWERS_JS)
            js = {
                "load": f"load_module {JS_MODULE};",
                "js_import": f"js_import answers from {prefix / 'answers.js'};",
                "batch_location": "location /batch { js_content answers.done; }",
            }
        (prefix / "nginx.conf").write_text(CONFIG.format(prefix=prefix, port=self.port, **js))
        self._process = subprocess.Popen(
            [nginx_binary(), "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "error.log")]
        )
        wait_for(self._answers, timeout=10, what="nginx to answer")
        return self.url

    def _answers(self) -> bool:
        assert self._process is not None
        if self._process.poll() is not None:
            raise RuntimeError(f"nginx exited with {self._process.returncode}")
        request = urllib.request.Request(self.url, data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=1) as response:
                return bool(response.status == 204)
        except OSError:
            return False

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is not None:
            stop_process(self._process)
        self._dir.cleanup()
