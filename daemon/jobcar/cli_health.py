"""`jobcar health`: exit 0 when the daemon's /healthz answers 200, for a container's HEALTHCHECK or a
script. It reads the config only for the `listen` address, and asks over plain HTTP without a proxy."""

from __future__ import annotations

import argparse
import http.client
import urllib.error
import urllib.request
from email.message import Message as HTTPMessage
from typing import IO, Final
from urllib.parse import urlsplit

from jobcar.cli_format import printable
from jobcar.cli_support import CommandFailed, duration, load, print_json
from jobcar.exit_codes import EX_FAILURE, EX_OK, EX_USAGE
from jobcar.listen import local_url

HEALTH_PATH: Final = "/healthz"
#: Bytes of a failing answer's body read for the one-line reason.
HEALTH_BODY_LIMIT: Final = 4096


def health_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        metavar="URL",
        help=f"ask this URL (default: http://<listen of the config>{HEALTH_PATH}); reads no config",
    )
    parser.add_argument(
        "--timeout", type=duration, default=2.0, metavar="DURATION", help="give up after this long (default: 2s)"
    )
    parser.add_argument("--json", action="store_true", help='print {"url", "ok", "status", "reason"}')


def health_url(listen: str) -> str:
    """The /healthz URL of a daemon listening on `listen` (host:port, or [v6]:port as the config has it)."""
    return local_url(listen, HEALTH_PATH)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect is an answer other than 200, so a failure; following it could reach another server.
    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> None:
        return None


def _why_unreachable(exc: BaseException, timeout: float) -> str:
    reason: object = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout:g}s"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return str(reason) or type(reason).__name__


def _first_line(body: bytes) -> str:
    text = printable(body.decode("utf-8", "replace")).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= 200 else line[:199] + "…"


def cmd_health(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise CommandFailed("--timeout must be positive", EX_USAGE)
    if args.url is None:
        url = health_url(load(args).listen)
    else:
        url = args.url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise CommandFailed(f"--url must be an http:// or https:// URL, not {url!r}", EX_USAGE)
    status, reason = _ask(url, args.timeout)
    if args.json:
        print_json({"url": url, "ok": status == 200, "status": status, "reason": reason})
        return EX_OK if status == 200 else EX_FAILURE
    if status is None:
        raise CommandFailed(f"{url}: {reason}")
    if status != 200:
        raise CommandFailed(f"{url} answered HTTP {status}" + (f": {reason}" if reason else ""))
    print(f"ok: {url} answered 200")
    return EX_OK


def _ask(url: str, timeout: float) -> tuple[int | None, str]:
    """(the HTTP status, the first line of the body) or (None, why there was no answer)."""
    # No proxy: the daemon is local, and an HTTP_PROXY set for the app must not answer for it.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    try:
        try:
            with opener.open(url, timeout=timeout) as response:
                status: int = response.status
                body: bytes = response.read(HEALTH_BODY_LIMIT)
        except urllib.error.HTTPError as exc:
            with exc:
                status, body = exc.code, exc.read(HEALTH_BODY_LIMIT)
    except (OSError, http.client.HTTPException) as exc:  # refused, timed out, no such host, not HTTP
        return None, _why_unreachable(exc, timeout)
    return status, _first_line(body)
