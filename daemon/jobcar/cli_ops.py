"""The operators' commands: `stats`, `jobs list|show`, `dead requeue|purge`, `queue pause|resume`,
`cancel`, `fsck` and `health`. Each is one function taking the parsed arguments and returning the exit
code; cli.py registers them in its command table.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import ipaddress
import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from email.message import Message as HTTPMessage
from typing import IO, Final
from urllib.parse import urlsplit

from jobcar import admin, replies, scripts, transitions, transport
from jobcar.cli_support import (
    ID_DASH,
    ID_HELP,
    CommandFailed,
    connected,
    count,
    duration,
    load,
    positive_int,
    print_json,
)
from jobcar.client import check_name
from jobcar.config_types import Config
from jobcar.errors import InvalidJob
from jobcar.exit_codes import EX_FAILURE, EX_OK, EX_USAGE
from jobcar.job import STORED_IN_SETS, Job, State
from jobcar.keys import QueueKeys
from jobcar.transitions import BULK_LIMIT, CancelResult, QueueStats

# -- shared by the operators' commands -------------------------------------------------------------


def _queue_name(text: str) -> str:
    try:
        return check_name("queue name", text)
    except InvalidJob as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_queue_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--queue", "-q", type=_queue_name, metavar="Q", help=help)


def _add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def _queues(client: transport.SyncRedis, config: Config, only: str | None) -> list[str]:
    """`only`, else the config's queues in its order, then every other queue producers have used."""
    if only is not None:
        return [only]
    return list(dict.fromkeys([*config.queues, *admin.known_queues(client, config.namespace)]))


def _read_stats(client: transport.SyncRedis, config: Config, queues: Sequence[str]) -> list[QueueStats]:
    keys = [QueueKeys.of(config.namespace, queue) for queue in queues]
    replies = transport.execute(client, [transitions.stats_call(k) for k in keys])
    return [transitions.parse_stats(k, reply) for k, reply in zip(keys, replies, strict=True)]


def _reply_count(reply: object) -> int:
    if not isinstance(reply, int):
        raise TypeError(f"expected a count from a jobcar script, got {reply!r}")
    return reply


def _locate(client: transport.SyncRedis, config: Config, job_id: str, queue: str | None) -> tuple[str, str]:
    """(queue, state) of the job with this id, searched in `queue` or every queue."""
    found = admin.find_job(client, config.namespace, job_id, _queues(client, config, queue))
    if not found:
        raise CommandFailed(f"no such job {job_id}" + (f" in queue {queue}" if queue else ""))
    if len(found) > 1:
        where = ", ".join(f"{q} ({state})" for q, state in found.items())
        raise CommandFailed(
            f"there are jobs with id {job_id} in several queues: {where}; choose one with --queue", EX_USAGE
        )
    return next(iter(found.items()))


def _timestamp(ms: int | float | None) -> str | None:
    """RFC 3339 in UTC with milliseconds, like 2030-01-31T09:00:00.000Z."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _span(seconds: float) -> str:
    """A short duration for people: 0.4s, 12s, 5m03s, 2h10m, 3d04h."""
    if seconds < 10:
        return f"{max(0.0, seconds):.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


# Job data is whatever producers and handlers wrote: keep their control characters (terminal escape
# sequences included) from reaching the terminal as they are. Newlines and tabs are kept.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Collection[int] = ()) -> list[str]:
    """Columns aligned on their widest cell, two spaces apart; `numeric` columns aligned right."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = []
    for row in (header, *rows):
        cells = [
            cell.rjust(w) if i in numeric else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _per_queue(counts: Mapping[str, int]) -> str:
    nonzero = [f"{queue}: {n}" for queue, n in counts.items() if n]
    return f" ({', '.join(nonzero)})" if nonzero else ""


def _parse_job(job_id: str, queue: str, fields: Mapping[bytes, bytes]) -> Job | str:
    """The job, or why its hash cannot be read (written around the enqueue script)."""
    try:
        return replies.parse_job(job_id, queue, fields)
    except (ValueError, KeyError, TypeError) as exc:
        return f"job {job_id} in queue {queue} cannot be read: {exc}"


# -- stats ----------------------------------------------------------------------------------------


def stats_arguments(parser: argparse.ArgumentParser) -> None:
    _add_queue_option(parser, "only this queue (default: the config's queues and every queue producers used)")
    _add_json_option(parser, "a list with one object per queue")


def cmd_stats(args: argparse.Namespace) -> int:
    config = load(args)
    with connected(config) as client:
        stats = _read_stats(client, config, _queues(client, config, args.queue))
    if args.json:
        print_json(
            [
                {
                    "queue": s.queue,
                    "pending": s.pending,
                    "scheduled": s.scheduled,
                    "active": s.active,
                    "dead": s.dead,
                    "paused": s.paused,
                    "latency_seconds": s.latency_s,
                }
                for s in stats
            ]
        )
        return EX_OK
    header = ("QUEUE", "PENDING", "SCHEDULED", "ACTIVE", "DEAD", "PAUSED", "LATENCY")
    rows = [
        (
            s.queue,
            str(s.pending),
            str(s.scheduled),
            str(s.active),
            str(s.dead),
            "yes" if s.paused else "no",
            "-" if s.oldest_ready_ms is None else _span(s.latency_s),
        )
        for s in stats
    ]
    print("\n".join(_table(header, rows, numeric={1, 2, 3, 4, 6})))
    return EX_OK


# -- jobs list / jobs show ------------------------------------------------------------------------

#: Longest last error shown in a `jobs list` table (--json gives it whole).
ERROR_COLUMN: Final = 60


def jobs_list_arguments(parser: argparse.ArgumentParser) -> None:
    _add_queue_option(parser, "only this queue (default: every queue)")
    parser.add_argument(
        "--state", choices=[s.value for s in STORED_IN_SETS], help="only jobs in this state (default: all four)"
    )
    parser.add_argument(
        "--limit", type=positive_int, default=20, metavar="N", help="at most N jobs per queue and state (default: 20)"
    )
    _add_json_option(parser, "a list with one object per job")


def _state_count(stats: QueueStats, state: State) -> int:
    counts = {
        State.PENDING: stats.pending,
        State.SCHEDULED: stats.scheduled,
        State.ACTIVE: stats.active,
        State.DEAD: stats.dead,
    }
    return counts[state]


def _last_error_cell(error: str | None) -> str:
    if not error:
        return ""
    line = _printable(error.strip().splitlines()[0] if error.strip() else "")
    return line if len(line) <= ERROR_COLUMN else line[: ERROR_COLUMN - 1] + "…"


def cmd_jobs_list(args: argparse.Namespace) -> int:
    config = load(args)
    states = [State(args.state)] if args.state else list(STORED_IN_SETS)
    jobs: list[Job] = []
    notes: list[str] = []
    with connected(config) as client:
        stats = _read_stats(client, config, _queues(client, config, args.queue))
        for queue_stats in stats:
            keys = QueueKeys.of(config.namespace, queue_stats.queue)
            for state in states:
                total = _state_count(queue_stats, state)
                if total == 0:
                    continue
                ids = admin.list_job_ids(client, keys, state, args.limit)
                for job_id, fields in zip(ids, admin.job_hashes(client, keys, ids), strict=True):
                    if not fields:
                        continue  # finished or deleted since the ids were read
                    job = _parse_job(job_id, keys.queue, fields)
                    if isinstance(job, str):
                        notes.append(job)
                    else:
                        jobs.append(job)
                if total > len(ids):
                    notes.append(f"{keys.queue} {state.value}: {len(ids)} of {total} shown (--limit N for more)")
    # Redis time, the clock every stored time was taken with.
    now_ms = max((s.now_ms for s in stats), default=0)
    if args.json:
        print_json(
            [
                {
                    "id": job.id,
                    "queue": job.queue,
                    "state": job.state.value,
                    "type": job.type,
                    "attempt": job.attempt,
                    "max_attempts": job.max_attempts,
                    "created": _timestamp(job.created_ms),
                    "age_seconds": max(0, now_ms - job.created_ms) / 1000,
                    "run_at": _timestamp(job.run_at_ms),
                    "last_error": job.last_error,
                }
                for job in jobs
            ]
        )
    elif jobs:
        header = ("QUEUE", "STATE", "ID", "TYPE", "ATTEMPT", "AGE", "LAST ERROR")
        rows = [
            (
                job.queue,
                job.state.value,
                _printable(job.id),
                job.type,
                f"{job.attempt}/{job.max_attempts}" if job.max_attempts else str(job.attempt),
                _span((now_ms - job.created_ms) / 1000),
                _last_error_cell(job.last_error),
            )
            for job in jobs
        ]
        print("\n".join(_table(header, rows, numeric={4, 5})))
    else:
        print("no jobs")
    for note in notes:
        print(f"jobcar: {note}", file=sys.stderr)
    return EX_OK


def jobs_show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help=ID_HELP)
    _add_queue_option(parser, "the job's queue (default: search every queue)")
    _add_json_option(parser, "every field")


def _bytes_json(name: str, value: bytes | None) -> dict[str, str | None]:
    """{name: text} for UTF-8 bytes, else {name_base64: ...}."""
    if value is None:
        return {name: None}
    try:
        return {name: value.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(value).decode("ascii")}


def _bytes_text(value: bytes) -> str:
    try:
        return _printable(value.decode("utf-8"))
    except UnicodeDecodeError:
        return f"<{count(len(value), 'byte')}, not UTF-8 text; --json gives them in base64>"


def _job_json(job: Job, lease_deadline_ms: int | None) -> dict[str, object]:
    return {
        "id": job.id,
        "queue": job.queue,
        "type": job.type,
        "state": job.state.value,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "created": _timestamp(job.created_ms),
        "run_at": _timestamp(job.run_at_ms),
        "started": _timestamp(job.started_ms),
        "finished": _timestamp(job.finished_ms),
        "lease_expires": _timestamp(lease_deadline_ms),
        "lease_token": job.token,
        "cancel_requested": job.cancel_requested,
        "timeout_seconds": None if job.timeout_ms is None else job.timeout_ms / 1000,
        "content_type": job.content_type,
        "unique_key": job.unique_key,
        "traceparent": job.traceparent,
        "batch": job.batch,
        "meta": job.meta,
        **_bytes_json("payload", job.payload),
        **_bytes_json("result", job.result),
        "errors": [{"attempt": e.attempt, "at": _timestamp(e.at_ms), "error": e.error} for e in job.errors],
    }


def _job_lines(job: Job, lease_deadline_ms: int | None, now_ms: int) -> list[str]:
    def when(ms: int | None) -> str | None:
        if ms is None:
            return None
        delta = (now_ms - ms) / 1000
        return f"{_timestamp(ms)} ({_span(delta)} ago)" if delta >= 0 else f"{_timestamp(ms)} (in {_span(-delta)})"

    fields: list[tuple[str, str | None]] = [
        ("id", _printable(job.id)),
        ("queue", job.queue),
        ("type", job.type),
        ("state", job.state.value + (", cancel requested" if job.cancel_requested else "")),
        ("attempt", f"{job.attempt} of {job.max_attempts}" if job.max_attempts else str(job.attempt)),
        ("created", when(job.created_ms)),
        ("run at", when(job.run_at_ms)),
        ("started", when(job.started_ms)),
        ("finished", when(job.finished_ms)),
        ("lease expires", when(lease_deadline_ms)),
        ("lease token", job.token),
        ("timeout", None if job.timeout_ms is None else _span(job.timeout_ms / 1000)),
        ("content type", job.content_type),
        ("unique key", None if job.unique_key is None else _printable(job.unique_key)),
        ("traceparent", job.traceparent),
        ("batch", None if job.batch is None else _printable(job.batch)),
        ("meta", _printable(json.dumps(job.meta, ensure_ascii=False)) if job.meta else None),
        ("payload", _bytes_text(job.payload)),
        ("result", None if job.result is None else _bytes_text(job.result)),
    ]
    width = max(len(label) for label, _ in fields)
    lines = []
    for label, value in fields:
        if value is None:
            continue
        first, *rest = value.split("\n")
        lines.append(f"{label.ljust(width)}  {first}".rstrip())
        lines += [f"{'':{width}}  {line}".rstrip() for line in rest]
    if job.errors:
        lines.append(f"errors ({len(job.errors)}, oldest first):")
        for e in job.errors:
            message = _printable(e.error).replace("\n", "\n    ")
            lines.append(f"  attempt {e.attempt} at {_timestamp(e.at_ms)}: {message}")
    return lines


def cmd_jobs_show(args: argparse.Namespace) -> int:
    config = load(args)
    with connected(config) as client:
        queue, _ = _locate(client, config, args.job_id, args.queue)
        keys = QueueKeys.of(config.namespace, queue)
        fields = admin.job_hashes(client, keys, [args.job_id])[0]
        deadline = client.zscore(keys.active, args.job_id)
        now_ms = _read_stats(client, config, [queue])[0].now_ms
    if not fields:
        raise CommandFailed(f"no such job {args.job_id} (it finished just now)")
    job = _parse_job(args.job_id, queue, fields)
    if isinstance(job, str):
        raise CommandFailed(job)
    lease_deadline_ms = None if deadline is None or job.state is not State.ACTIVE else int(deadline)
    if args.json:
        print_json(_job_json(job, lease_deadline_ms))
    else:
        print("\n".join(_job_lines(job, lease_deadline_ms, now_ms)))
    return EX_OK


# -- dead requeue / dead purge --------------------------------------------------------------------


def dead_requeue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_ids", metavar="ID", nargs="*", help=f"ids of dead jobs to run again ({ID_DASH})")
    parser.add_argument("--all", action="store_true", help="requeue every dead job (of --queue, else of every queue)")
    _add_queue_option(parser, "the queue (default: every queue)")


def _drain_dead(client: transport.SyncRedis, keys: QueueKeys, bulk: Callable[..., scripts.ScriptCall]) -> int:
    """Call `bulk` (requeue_call or purge_call) on the oldest dead jobs until those dead now are done."""
    # Bounded by the count taken first: jobs that die meanwhile stay. Otherwise a requeued job that
    # fails again at once, under a running daemon, could keep this loop going.
    remaining = int(client.zcard(keys.dead))
    done = 0
    while remaining > 0:
        moved = _reply_count(transport.execute(client, [bulk(keys, (), min(BULK_LIMIT, remaining))])[0])
        if moved == 0:
            break
        done += moved
        remaining -= moved
    return done


def _requeue_ids(
    client: transport.SyncRedis, config: Config, queues: Sequence[str], job_ids: Sequence[str]
) -> tuple[dict[str, int], list[str]]:
    """(jobs moved per queue, why some ids were not moved)."""
    by_queue: dict[str, list[str]] = {}
    problems = []
    for job_id in dict.fromkeys(job_ids):
        found = admin.find_job(client, config.namespace, job_id, queues)
        dead = [queue for queue, state in found.items() if state == State.DEAD]
        if dead:
            for queue in dead:
                by_queue.setdefault(queue, []).append(job_id)
        elif found:
            where = ", ".join(f"{state} in {queue}" for queue, state in found.items())
            problems.append(f"job {job_id} is not dead ({where})")
        else:
            problems.append(f"no such job {job_id}")
    moved = {}
    for queue, ids in by_queue.items():
        keys = QueueKeys.of(config.namespace, queue)
        calls = [transitions.requeue_call(keys, ids[i : i + BULK_LIMIT]) for i in range(0, len(ids), BULK_LIMIT)]
        moved[queue] = sum(_reply_count(reply) for reply in transport.execute(client, calls))
    return moved, problems


def cmd_dead_requeue(args: argparse.Namespace) -> int:
    if bool(args.job_ids) == args.all:
        raise CommandFailed("give the ids of the dead jobs to requeue, or --all (not both)", EX_USAGE)
    config = load(args)
    with connected(config) as client:
        queues = _queues(client, config, args.queue)
        if args.all:
            moved = {
                queue: _drain_dead(client, QueueKeys.of(config.namespace, queue), transitions.requeue_call)
                for queue in queues
            }
            problems: list[str] = []
        else:
            moved, problems = _requeue_ids(client, config, queues, args.job_ids)
    print(f"requeued {count(sum(moved.values()), 'job')}{_per_queue(moved)}")
    for problem in problems:
        print(f"jobcar: {problem}", file=sys.stderr)
    return EX_FAILURE if problems else EX_OK


def dead_purge_arguments(parser: argparse.ArgumentParser) -> None:
    _add_queue_option(parser, "the queue (default: every queue)")
    parser.add_argument("--yes", action="store_true", help="really delete them: required, as nothing brings them back")


def cmd_dead_purge(args: argparse.Namespace) -> int:
    if not args.yes:
        where = f"queue {args.queue}" if args.queue else "every queue"
        raise CommandFailed(f"dead purge deletes the dead jobs of {where} for good; add --yes to do it", EX_USAGE)
    config = load(args)
    with connected(config) as client:
        queues = _queues(client, config, args.queue)
        deleted = {
            queue: _drain_dead(client, QueueKeys.of(config.namespace, queue), transitions.purge_call)
            for queue in queues
        }
    print(f"deleted {count(sum(deleted.values()), 'dead job')}{_per_queue(deleted)}")
    return EX_OK


# -- queue pause / queue resume -------------------------------------------------------------------


def queue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="Q", type=_queue_name, help="the queue")


def _set_paused(args: argparse.Namespace, paused: bool) -> int:
    config = load(args)
    queue = args.queue
    with connected(config) as client:
        changed = _reply_count(
            transport.execute(client, [transitions.pause_call(QueueKeys.of(config.namespace, queue), paused)])[0]
        )
        known = queue in config.queues or queue in admin.known_queues(client, config.namespace)
    if paused:
        print(
            f"queue {queue} paused: its jobs wait until `jobcar queue resume {queue}`"
            if changed
            else f"queue {queue} was already paused"
        )
    else:
        print(f"queue {queue} resumed" if changed else f"queue {queue} was not paused")
    if not known:
        print(f"jobcar: note: no producer has used queue {queue!r}, and it is not in {config.source}", file=sys.stderr)
    return EX_OK


def cmd_queue_pause(args: argparse.Namespace) -> int:
    return _set_paused(args, True)


def cmd_queue_resume(args: argparse.Namespace) -> int:
    return _set_paused(args, False)


# -- cancel ---------------------------------------------------------------------------------------


def cancel_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help=ID_HELP)
    _add_queue_option(parser, "the job's queue (default: search every queue)")


def cmd_cancel(args: argparse.Namespace) -> int:
    config = load(args)
    with connected(config) as client:
        queue, _ = _locate(client, config, args.job_id, args.queue)
        reply = transport.execute(
            client, [transitions.cancel_call(QueueKeys.of(config.namespace, queue), args.job_id)]
        )[0]
    result, state = transitions.parse_cancel(reply)
    if result is CancelResult.CANCELED:
        print(f"canceled job {args.job_id} ({state} in queue {queue}): it is deleted and will not run")
    elif result is CancelResult.CANCEL_REQUESTED:
        print(
            f"cancel requested for job {args.job_id}: it is running, "
            "and the daemon running it stops it at its next heartbeat"
        )
    elif result is CancelResult.NOT_CANCELABLE:
        raise CommandFailed(f"job {args.job_id} in queue {queue} is already {state}: nothing to cancel")
    else:
        raise CommandFailed(f"no such job {args.job_id} in queue {queue} (it finished just now)")
    return EX_OK


# -- fsck -----------------------------------------------------------------------------------------


def fsck_arguments(parser: argparse.ArgumentParser) -> None:
    _add_queue_option(parser, "only this queue (default: the config's queues and every queue producers used)")
    parser.add_argument(
        "--repair",
        action="store_true",
        help="repair what is found, each after an atomic re-check (safe while daemons run)",
    )
    _add_json_option(parser, "a list with one object per finding")


def cmd_fsck(args: argparse.Namespace) -> int:
    from jobcar import fsck

    config = load(args)
    limits = transitions.DeadLetterLimits(config.dead_letter.max_jobs, int(config.dead_letter.max_age * 1000))
    findings: list[fsck.Finding] = []
    with connected(config) as client:
        for queue in _queues(client, config, args.queue):
            keys = QueueKeys.of(config.namespace, queue)
            findings += fsck.check_queue(client, keys, repair=args.repair, dead_limits=limits)
    if args.json:
        print_json([finding.as_json() for finding in findings])
    else:
        for finding in findings:
            print(_printable(finding.line()))
    return EX_FAILURE if any(not finding.repaired for finding in findings) else EX_OK


# -- health ---------------------------------------------------------------------------------------

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


def health_url(listen: str) -> str:
    """The /healthz URL of a daemon listening on `listen` (host:port, or [v6]:port as the config has it)."""
    host, _, port = listen.rpartition(":")
    try:
        address = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        address = None  # a host name
    if address is not None and address.is_unspecified:
        # A daemon listening on every address is reached on loopback.
        host = "127.0.0.1" if address.version == 4 else "[::1]"
    return f"http://{host}:{port}{HEALTH_PATH}"


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
    text = _printable(body.decode("utf-8", "replace")).strip()
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
    # No proxy: the daemon is local, and an HTTP_PROXY set for the app must not answer for it.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    try:
        try:
            with opener.open(url, timeout=args.timeout) as response:
                status: int = response.status
                body: bytes = response.read(HEALTH_BODY_LIMIT)
        except urllib.error.HTTPError as exc:
            with exc:
                status, body = exc.code, exc.read(HEALTH_BODY_LIMIT)
    except (OSError, http.client.HTTPException) as exc:  # refused, timed out, no such host, not HTTP
        raise CommandFailed(f"{url}: {_why_unreachable(exc, args.timeout)}") from None
    if status != 200:
        reason = _first_line(body)
        raise CommandFailed(f"{url} answered HTTP {status}" + (f": {reason}" if reason else ""))
    print(f"ok: {url} answered 200")
    return EX_OK
