"""`jobcar jobs list`, `jobcar jobs show` and `jobcar jobs logs`: the jobs of a queue (or a job's children) as
a table, one job whole, one job's log."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from typing import Final

from jobcar.admin import Admin
from jobcar.cli_format import byte_size, printable, progress_text, span, table
from jobcar.cli_ops import add_json_option, add_queue_option
from jobcar.cli_support import ID_HELP, CommandFailed, count, load, positive_int, print_json, with_admin
from jobcar.errors import InvalidJob
from jobcar.exit_codes import EX_OK, EX_USAGE
from jobcar.job import FINISHED, Job, State
from jobcar.job_listing import JobListing, list_children, list_jobs
from jobcar.job_search import SCAN_BUDGET, Condition, JobFilter, find, parse_condition
from jobcar.job_view import JobView, LogEntry, LogRead, StepInfo
from jobcar.timestamps import rfc3339_ms

#: What `jobs list` lists without --state: every state a set or a limit group's lists hold.
SET_STATES: Final = (State.PENDING, State.HELD, State.SCHEDULED, State.ACTIVE, State.DEAD, State.WAITING)
#: What `jobs list --state` takes: those, and done jobs while their result is kept.
LISTABLE: Final = (*SET_STATES, State.DONE)
#: Longest last error shown in a `jobs list` table (--json gives it whole).
ERROR_COLUMN: Final = 60
#: How often `jobs logs --follow` reads the log again.
FOLLOW_POLL_SECONDS: Final = 0.5


def jobs_list_arguments(parser: argparse.ArgumentParser) -> None:
    add_queue_option(parser, "only this queue (default: every queue)")
    parser.add_argument(
        "--state",
        choices=[s.value for s in LISTABLE],
        help="only jobs in this state (default: all but done, and done when nothing else is found; done jobs are "
        "kept while result_ttl holds them)",
    )
    parser.add_argument("--type", dest="job_type", metavar="TYPE", help="only jobs of this type")
    parser.add_argument(
        "--parent",
        metavar="REF",
        help="only the children of this job, [QUEUE/]ID, oldest first (read from its children, not by a scan; "
        "--queue, --state and --type filter them)",
    )
    parser.add_argument(
        "--limit", type=positive_int, default=20, metavar="N", help="at most N jobs per queue and state (default: 20)"
    )
    parser.add_argument(
        "--where",
        action="append",
        type=_condition,
        default=[],
        metavar="COND",
        help="only jobs whose payload field or meta value is this: payload.FIELD=VALUE (a field of a JSON object "
        "payload; dots reach into nested objects) or meta.NAME=VALUE; repeat for all of several. A search looks at "
        "--scan jobs per queue and state at most, says how far it looked, and where to go on (--cursor)",
    )
    parser.add_argument(
        "--scan",
        type=positive_int,
        default=SCAN_BUDGET,
        metavar="N",
        help=f"with --where or --type: look at N jobs per queue and state at most (default: {SCAN_BUDGET})",
    )
    parser.add_argument(
        "--cursor",
        type=_position,
        metavar="N",
        help="go on from where a search stopped (with --queue and --state, as its note says)",
    )
    add_json_option(parser, "a list with one object per job")


def _condition(text: str) -> Condition:
    try:
        return parse_condition(text)
    except InvalidJob as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _position(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"a cursor is a position a search's note gave, not {text!r}")
    return int(text)


def _last_error_cell(error: str | None) -> str:
    if not error:
        return ""
    line = printable(error.strip().splitlines()[0] if error.strip() else "")
    return line if len(line) <= ERROR_COLUMN else line[: ERROR_COLUMN - 1] + "…"


def _check_search(args: argparse.Namespace) -> None:
    if args.parent is not None:
        raise CommandFailed("--where and --cursor search a state's jobs, not a job's children (--parent)", EX_USAGE)
    if args.state == State.DONE.value:
        raise CommandFailed("--where and --cursor search the states a set holds; done jobs are in none", EX_USAGE)
    if args.cursor is not None and (args.queue is None or args.state is None):
        raise CommandFailed("--cursor goes on in one queue and state: give --queue and --state", EX_USAGE)


async def _search(admin: Admin, args: argparse.Namespace, states: Sequence[State]) -> JobListing:
    """Each queue's and state's walk (job_search.find), bounded by --scan; how far each looked, on stderr."""
    job_filter = JobFilter(job_type=args.job_type or "", where=tuple(args.where))
    listing = JobListing()
    for queue in await admin.queues(args.queue):
        for state in states:
            start = args.cursor or 0
            found = await find(admin, queue, state, job_filter, start, args.limit, args.scan)
            listing.jobs += found.jobs
            listing.unreadable += found.unreadable
            listing.now_ms = max(listing.now_ms, found.now_ms)
            if not found.examined:
                continue
            looked = f"looked at {count(found.examined, 'job')} of {found.total} from position {start}"
            if found.next_start is None:
                listing.unreadable.append(f"{queue} {state.value}: {looked}, to the end")
            else:
                go_on = f"--queue {queue} --state {state.value} --cursor {found.next_start}"
                listing.unreadable.append(f"{queue} {state.value}: {looked}; more may match: {go_on} goes on")
    return listing


def _held_cell(job: Job, now_ms: int) -> str:
    if not job.held_for:
        return ""
    since = "" if job.held_at_ms is None else f" for {span(max(0, now_ms - job.held_at_ms) / 1000)}"
    return printable(job.held_for) + since


def cmd_jobs_list(args: argparse.Namespace) -> int:
    states = [State(args.state)] if args.state else list(SET_STATES)

    def kept(job: Job) -> bool:
        return (
            (args.queue is None or job.queue == args.queue)
            and (args.state is None or job.state.value == args.state)
            and (args.job_type is None or job.type == args.job_type)
        )

    searching = bool(args.where) or args.cursor is not None
    if searching:
        _check_search(args)

    async def read(admin: Admin) -> JobListing:
        if searching:
            return await _search(admin, args, states)
        if args.parent is not None:
            listing, total = await list_children(admin, args.parent, args.limit, kept)
            if total > len(listing.jobs) and len(listing.jobs) == args.limit:
                children = "1 child" if total == 1 else f"{total} children"
                listing.unreadable.append(f"the first {args.limit} of {children} shown (--limit N for more)")
            return listing
        queues = await admin.queues(args.queue)
        listing = await list_jobs(admin, queues, states, args.limit, args.job_type)
        if not args.state and not listing.jobs and not listing.unreadable:
            # Nothing waits or runs: show what finished lately (found by SCAN, so only then).
            listing = await list_jobs(admin, queues, [State.DONE], args.limit, args.job_type)
        return listing

    listing = with_admin(load(args), read)
    jobs, now_ms = listing.jobs, listing.now_ms  # Redis time, the clock every stored time was taken with
    if args.json:
        print_json(
            [
                {"id": job.id, "queue": job.queue, "state": job.state.value, "type": job.type,
                 "attempt": job.attempt, "max_attempts": job.max_attempts,
                 "created_at": rfc3339_ms(job.created_ms), "age_seconds": max(0, now_ms - job.created_ms) / 1000,
                 "run_at": rfc3339_ms(job.run_at_ms), "last_error": job.last_error,
                 **({"held_for": job.held_for, "held_since": rfc3339_ms(job.held_at_ms)} if job.held_for else {})}
                for job in jobs
            ]
        )  # fmt: skip
    elif jobs:
        header: tuple[str, ...] = ("QUEUE", "STATE", "ID", "TYPE", "ATTEMPT", "AGE", "LAST ERROR")
        rows: list[tuple[str, ...]] = [
            (job.queue, job.state.value, printable(job.id), job.type,
             f"{job.attempt}/{job.max_attempts}" if job.max_attempts else str(job.attempt),
             span((now_ms - job.created_ms) / 1000), _last_error_cell(job.last_error))
            for job in jobs
        ]  # fmt: skip
        if any(job.held_for for job in jobs):  # which limit group holds each held job, and for how long
            header = (*header[:6], "HELD BY", header[6])
            rows = [(*row[:6], _held_cell(job, now_ms), row[6]) for job, row in zip(jobs, rows, strict=True)]
        print("\n".join(table(header, rows, numeric={4, 5})))
    else:
        print("no jobs")
    for note in listing.unreadable:  # and, for --parent, how many children were left out
        print(f"jobcar: {note}", file=sys.stderr)
    for queue, state, shown, total in listing.partial:
        of = "more may match" if total < 0 else f"of {total} shown"
        print(f"jobcar: {queue} {state.value}: {shown} {of} (--limit N for more)", file=sys.stderr)
    return EX_OK


def jobs_show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help=ID_HELP)
    add_queue_option(parser, "the job's queue (default: search every queue)")
    add_json_option(parser, "every field")


def _bytes_text(value: bytes) -> str:
    try:
        return printable(value.decode("utf-8"))
    except UnicodeDecodeError:
        return f"<{count(len(value), 'byte')}, not UTF-8 text; --json gives them in base64>"


def _window(job: Job) -> str:
    return " (held for its whole window)" if job.unique_window else ""


def _job_lines(view: JobView) -> list[str]:
    job, lease_deadline_ms, now_ms = view.job, view.lease_deadline_ms, view.now_ms

    def when(ms: int | None) -> str | None:
        if ms is None:
            return None
        delta = (now_ms - ms) / 1000
        return f"{rfc3339_ms(ms)} ({span(delta)} ago)" if delta >= 0 else f"{rfc3339_ms(ms)} (in {span(-delta)})"

    fields: list[tuple[str, str | None]] = [
        ("id", printable(job.id)),
        ("queue", job.queue),
        ("type", job.type),
        ("state", job.state.value + (", cancel requested" if job.cancel_requested else "")),
        ("attempt", f"{job.attempt} of {job.max_attempts}" if job.max_attempts else str(job.attempt)),
        ("created", when(job.created_ms)),
        ("run at", when(job.run_at_ms)),
        ("started", when(job.started_ms)),
        ("finished", when(job.finished_ms)),
        ("lease expires", when(lease_deadline_ms)),
        (
            "progress",
            None
            if job.progress is None
            else printable(progress_text(job.progress))
            + f" (attempt {job.progress.attempt}, {when(job.progress.at_ms)})",
        ),
        ("parent", None if job.parent is None else printable(job.parent)),
        ("timeout", None if job.timeout_ms is None else span(job.timeout_ms / 1000)),
        ("content type", job.content_type),
        ("priority", str(job.priority) if job.priority else None),
        ("expires", when(job.expires_at_ms)),
        ("unique key", None if job.unique_key is None else printable(job.unique_key) + _window(job)),
        ("debounce key", None if job.debounce_key is None else printable(job.debounce_key)),
        ("key", None if job.limit_key is None else printable(job.limit_key)),
        ("held for", None if job.held_for is None else "a slot of limit group " + printable(job.held_for)),
        ("after", _refs_text(job.after, job.on_dependency_failure or "fail")),
        ("waiting for", _refs_text(view.waiting_for)),
        ("waited for by", _refs_text(view.dependents)),
        ("schedule", None if job.schedule is None else printable(job.schedule)),
        ("scheduled for", when(job.scheduled_at_ms)),
        ("traceparent", job.traceparent),
        ("batch", None if job.batch is None else printable(job.batch)),
        ("meta", printable(json.dumps(job.meta, ensure_ascii=False)) if job.meta else None),
        ("payload", _bytes_text(job.payload)),
        ("result", None if job.result is None else _bytes_text(job.result)),
        ("log", _log_text(view)),
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
            message = printable(e.error).replace("\n", "\n    ")
            lines.append(f"  attempt {e.attempt} at {rfc3339_ms(e.at_ms)}: {message}")
    if view.steps:
        lines.append(f"steps ({len(view.steps)}):")
        lines += [f"  {line}" for line in table(("NAME", "SIZE", "WRITTEN"), [_step_row(s, when) for s in view.steps])]
    if view.children_total:
        shown = len(view.children)
        more = f", the first {shown} shown" if shown < view.children_total else ""
        lines.append(f"children ({view.children_total}{more}, oldest first; jobs list --parent for more):")
        rows = [(printable(c.ref), "gone" if c.state is None else c.state.value) for c in view.children]
        lines += [f"  {line}" for line in table(("JOB", "STATE"), rows)]
    return lines


def _log_text(view: JobView) -> str | None:
    if not view.log_lines and not view.log_dropped:
        return None
    dropped = f", {count(view.log_dropped, 'older line')} dropped" if view.log_dropped else ""
    return f"{count(view.log_lines, 'line')} kept{dropped} (jobcar jobs logs {printable(view.job.id)})"


def _step_row(step: StepInfo, when: Callable[[int | None], str | None]) -> tuple[str, str, str]:
    return printable(step.name), byte_size(step.size), when(step.at_ms) or "?"


def _refs_text(refs: Sequence[str], on_failure: str | None = None) -> str | None:
    """Job references on one line; with `after`'s policy when a dependency fails."""
    if not refs:
        return None
    text = printable(" ".join(refs))
    return text if on_failure is None else f"{text} (if one fails: {on_failure})"


def cmd_jobs_show(args: argparse.Namespace) -> int:
    async def read(admin: Admin) -> JobView:
        return await admin.job(args.job_id, args.queue)

    view = with_admin(load(args), read)
    if args.json:
        print_json(view.document())
    else:
        print("\n".join(_job_lines(view)))
    return EX_OK


def jobs_logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help=ID_HELP)
    add_queue_option(parser, "the job's queue (default: search every queue)")
    parser.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="print new lines as its handler writes them, until the job has finished or is gone",
    )
    add_json_option(parser, "each log line, an object {at, attempt, line} per output line,")


def _log_line(entry: LogEntry, as_json: bool) -> str:
    if as_json:
        return json.dumps({"at": rfc3339_ms(entry.at_ms), "attempt": entry.attempt, "line": entry.line},
                          ensure_ascii=False)  # fmt: skip
    # One output line per log line: a line's own newlines are shown escaped, as its other control characters.
    line = printable(entry.line).replace("\n", "\\n")
    return f"{rfc3339_ms(entry.at_ms) or '?'}  #{entry.attempt}  {line}"


def _print_log(read: LogRead, as_json: bool) -> None:
    if read.missed:  # on stderr: stdout holds only log lines, as text or JSON
        note = f"{count(read.missed, 'line')} dropped before these (the job's log keeps its newest lines)"
        print(f"jobcar: {note}", file=sys.stderr, flush=True)
    if read.entries:
        print("\n".join(_log_line(entry, as_json) for entry in read.entries), flush=True)


def cmd_jobs_logs(args: argparse.Namespace) -> int:
    """Print the job's log; with --follow, go on printing until it has finished (done, dead) or is gone."""

    async def read(admin: Admin) -> None:
        queue, _ = await admin.locate(args.job_id, args.queue)
        index = 0
        while True:
            got = await admin.log_since(args.job_id, queue, index)
            _print_log(got, args.json)
            index = got.next_index
            if not args.follow or got.state is None or got.state in FINISHED:
                return
            await asyncio.sleep(FOLLOW_POLL_SECONDS)

    with_admin(load(args), read)
    return EX_OK
