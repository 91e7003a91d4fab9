"""The operators' commands: `stats`, `jobs list|show`, `dead requeue|purge`, `queue pause|resume`,
`cancel` and `fsck`, each on admin.Admin. Each is one function taking the parsed arguments and returning the exit
code; cli.py registers them in its command table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Final

from jobcar.admin import Admin, CancelReply
from jobcar.admin_reads import JobListing, JobView
from jobcar.cli_format import printable, span, table
from jobcar.cli_support import (
    ID_DASH,
    ID_HELP,
    CommandFailed,
    count,
    load,
    positive_int,
    print_json,
    with_admin,
)
from jobcar.config_types import limit_rule_table
from jobcar.errors import InvalidJob
from jobcar.exit_codes import EX_FAILURE, EX_OK, EX_USAGE
from jobcar.job import STORED_IN_SETS, Job, State
from jobcar.limits_view import LimitGroup
from jobcar.names import check_name
from jobcar.recording import dead_letter_limits
from jobcar.timestamps import rfc3339_ms
from jobcar.transitions import CancelResult, QueueHistory, QueueStats

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


def _per_queue(counts: Mapping[str, int]) -> str:
    nonzero = [f"{queue}: {n}" for queue, n in counts.items() if n]
    return f" ({', '.join(nonzero)})" if nonzero else ""


MINUTE_MS: Final = 60_000
HOUR_MS: Final = 3_600_000
#: What `jobs list --state` takes: the state sets, and done jobs while their result is kept.
LISTABLE: Final = (*STORED_IN_SETS, State.DONE)


# -- stats ----------------------------------------------------------------------------------------


def stats_arguments(parser: argparse.ArgumentParser) -> None:
    _add_queue_option(parser, "only this queue (default: the config's queues and every queue producers used)")
    _add_json_option(parser, "a list with one object per queue")


def cmd_stats(args: argparse.Namespace) -> int:
    config = load(args)

    async def read(admin: Admin) -> tuple[list[QueueStats], list[QueueHistory]]:
        queues = await admin.queues(args.queue)
        known = args.queue is None or args.queue in config.queues or args.queue in await admin.known_queues()
        if not known:
            raise CommandFailed(f"unknown queue {args.queue}: no producer used it, and it is not in {config.source}")
        return await admin.stats(queues), await admin.history(queues)

    stats, histories = with_admin(config, read)
    # processed = attempts that ended (done or failed), fleet-wide, over the last minute and hour of Redis time.
    counts = [(h.totals(MINUTE_MS), h.totals(HOUR_MS)) for h in histories]
    if args.json:
        print_json(
            [
                {"queue": s.queue, "pending": s.pending, "scheduled": s.scheduled, "active": s.active,
                 "held": s.held, "waiting": s.waiting, "dead": s.dead, "paused": s.paused,
                 "latency_seconds": s.latency_s,
                 "processed_last_minute": m["done"] + m["failed"], "failed_last_minute": m["failed"],
                 "processed_last_hour": h["done"] + h["failed"], "failed_last_hour": h["failed"]}
                for s, (m, h) in zip(stats, counts, strict=True)
            ]
        )  # fmt: skip
        return EX_OK
    header = ("QUEUE", "PENDING", "SCHEDULED", "ACTIVE", "HELD", "WAITING", "DEAD", "PAUSED", "LATENCY", "DONE/1M",
              "FAILED/1M", "DONE/1H", "FAILED/1H")  # fmt: skip
    rows = [
        (s.queue, str(s.pending), str(s.scheduled), str(s.active), str(s.held), str(s.waiting), str(s.dead),
         "yes" if s.paused else "no", "-" if s.oldest_ready_ms is None else span(s.latency_s),
         str(m["done"]), str(m["failed"]), str(h["done"]), str(h["failed"]))
        for s, (m, h) in zip(stats, counts, strict=True)
    ]  # fmt: skip
    print("\n".join(table(header, rows, numeric={1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12})))
    return EX_OK


# -- limits ----------------------------------------------------------------------------------------


def limits_arguments(parser: argparse.ArgumentParser) -> None:
    _add_queue_option(parser, "only this queue (default: the config's queues and every queue producers used)")
    _add_json_option(parser, "a list with one object per limit group")


def cmd_limits(args: argparse.Namespace) -> int:
    config = load(args)
    rules = limit_rule_table(config)

    async def read(admin: Admin) -> list[LimitGroup]:
        return await admin.limits(rules, args.queue)

    groups = with_admin(config, read)
    if args.json:
        print_json([g.document() for g in groups])
        return EX_OK
    if not groups:
        print("no limit group has a job running, held or rated")
        return EX_OK
    header = ("QUEUE", "GROUP", "KIND", "RUNNING", "HELD", "LIMIT", "NEXT START")
    rows = [
        (g.queue, printable(g.group), g.kind, str(g.running), str(g.held), g.limit or "none (no rule)",
         "-" if g.next_start_in_ms is None else span(g.next_start_in_ms / 1000))
        for g in groups
    ]  # fmt: skip
    print("\n".join(table(header, rows, numeric={3, 4})))
    return EX_OK


# -- jobs list / jobs show ------------------------------------------------------------------------

#: Longest last error shown in a `jobs list` table (--json gives it whole).
ERROR_COLUMN: Final = 60


def jobs_list_arguments(parser: argparse.ArgumentParser) -> None:
    _add_queue_option(parser, "only this queue (default: every queue)")
    parser.add_argument(
        "--state",
        choices=[s.value for s in LISTABLE],
        help="only jobs in this state (default: all but done; done jobs are kept while result_ttl holds them)",
    )
    parser.add_argument("--type", dest="job_type", metavar="TYPE", help="only jobs of this type")
    parser.add_argument(
        "--limit", type=positive_int, default=20, metavar="N", help="at most N jobs per queue and state (default: 20)"
    )
    _add_json_option(parser, "a list with one object per job")


def _last_error_cell(error: str | None) -> str:
    if not error:
        return ""
    line = printable(error.strip().splitlines()[0] if error.strip() else "")
    return line if len(line) <= ERROR_COLUMN else line[: ERROR_COLUMN - 1] + "…"


def cmd_jobs_list(args: argparse.Namespace) -> int:
    states = [State(args.state)] if args.state else list(STORED_IN_SETS)

    async def read(admin: Admin) -> JobListing:
        return await admin.list_jobs(await admin.queues(args.queue), states, args.limit, args.job_type)

    listing = with_admin(load(args), read)
    jobs, now_ms = listing.jobs, listing.now_ms  # Redis time, the clock every stored time was taken with
    if args.json:
        print_json(
            [
                {"id": job.id, "queue": job.queue, "state": job.state.value, "type": job.type,
                 "attempt": job.attempt, "max_attempts": job.max_attempts,
                 "created_at": rfc3339_ms(job.created_ms), "age_seconds": max(0, now_ms - job.created_ms) / 1000,
                 "run_at": rfc3339_ms(job.run_at_ms), "last_error": job.last_error}
                for job in jobs
            ]
        )  # fmt: skip
    elif jobs:
        header = ("QUEUE", "STATE", "ID", "TYPE", "ATTEMPT", "AGE", "LAST ERROR")
        rows = [
            (job.queue, job.state.value, printable(job.id), job.type,
             f"{job.attempt}/{job.max_attempts}" if job.max_attempts else str(job.attempt),
             span((now_ms - job.created_ms) / 1000), _last_error_cell(job.last_error))
            for job in jobs
        ]  # fmt: skip
        print("\n".join(table(header, rows, numeric={4, 5})))
    else:
        print("no jobs")
    for note in listing.unreadable:
        print(f"jobcar: {note}", file=sys.stderr)
    for queue, state, shown, total in listing.partial:
        of = "more may match" if total < 0 else f"of {total} shown"
        print(f"jobcar: {queue} {state.value}: {shown} {of} (--limit N for more)", file=sys.stderr)
    return EX_OK


def jobs_show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help=ID_HELP)
    _add_queue_option(parser, "the job's queue (default: search every queue)")
    _add_json_option(parser, "every field")


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
        ("lease token", job.token),
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
    return lines


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


# -- dead requeue / dead purge --------------------------------------------------------------------


def dead_requeue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_ids", metavar="ID", nargs="*", help=f"ids of dead jobs to run again ({ID_DASH})")
    parser.add_argument("--all", action="store_true", help="requeue every dead job (of --queue, else of every queue)")
    _add_queue_option(parser, "the queue (default: every queue)")
    _add_json_option(parser, '{"requeued": {queue: count}, "problems": [...]}')


def cmd_dead_requeue(args: argparse.Namespace) -> int:
    if bool(args.job_ids) == args.all:
        raise CommandFailed("give the ids of the dead jobs to requeue, or --all (not both)", EX_USAGE)

    async def requeue(admin: Admin) -> tuple[dict[str, int], list[str]]:
        queues = await admin.queues(args.queue)
        if args.all:
            return {queue: await admin.requeue_all_dead(queue) for queue in queues}, []
        return await admin.requeue_dead(queues, args.job_ids)

    moved, problems = with_admin(load(args), requeue)
    return _bulk_done(args, "requeued", moved, problems, count(sum(moved.values()), "job"))


def dead_purge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_ids", metavar="ID", nargs="*", help=f"ids of dead jobs to delete ({ID_DASH})")
    _add_queue_option(parser, "the queue (default: every queue)")
    parser.add_argument("--yes", action="store_true", help="without ids: really delete every dead job (required)")
    _add_json_option(parser, '{"deleted": {queue: count}, "problems": [...]}')


def cmd_dead_purge(args: argparse.Namespace) -> int:
    if not args.job_ids and not args.yes:
        where = f"queue {args.queue}" if args.queue else "every queue"
        raise CommandFailed(f"dead purge deletes the dead jobs of {where} for good; add --yes to do it", EX_USAGE)

    async def purge(admin: Admin) -> tuple[dict[str, int], list[str]]:
        queues = await admin.queues(args.queue)
        if args.job_ids:
            return await admin.purge_dead(queues, args.job_ids)
        return {queue: await admin.purge_all_dead(queue) for queue in queues}, []

    deleted, problems = with_admin(load(args), purge)
    return _bulk_done(args, "deleted", deleted, problems, count(sum(deleted.values()), "dead job"))


def _bulk_done(args: argparse.Namespace, verb: str, per_queue: dict[str, int], problems: list[str], what: str) -> int:
    """Say what a bulk action on dead jobs did (`{verb: per_queue, "problems": ...}` with --json)."""
    if args.json:
        print_json({verb: per_queue, "problems": problems})
    else:
        print(f"{verb} {what}{_per_queue(per_queue)}")
    for problem in problems:
        print(f"jobcar: {problem}", file=sys.stderr)
    return EX_FAILURE if problems else EX_OK


# -- queue pause / queue resume -------------------------------------------------------------------


def queue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="Q", type=_queue_name, help="the queue")
    _add_json_option(parser, '{"queue", "paused", "changed"}')


def _set_paused(args: argparse.Namespace, paused: bool) -> int:
    config = load(args)
    queue = args.queue

    async def pause(admin: Admin) -> tuple[bool, bool]:
        changed = await admin.set_paused(queue, paused)
        return changed, queue in config.queues or queue in await admin.known_queues()

    changed, known = with_admin(config, pause)
    if args.json:
        print_json({"queue": queue, "paused": paused, "changed": changed})
    elif paused:
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
    _add_json_option(parser, '{"id", "queue", "result", "state"} (as DELETE /v1/jobs/{id})')


def cmd_cancel(args: argparse.Namespace) -> int:
    async def cancel(admin: Admin) -> CancelReply:
        return await admin.cancel(args.job_id, args.queue)

    reply = with_admin(load(args), cancel)
    queue, state = reply.queue, reply.before
    if args.json and state is not None and reply.result in (CancelResult.CANCELED, CancelResult.CANCEL_REQUESTED):
        now = State.CANCELED if reply.result is CancelResult.CANCELED else state
        print_json({"id": args.job_id, "queue": queue, "result": reply.result.value, "state": now.value})
    elif reply.result is CancelResult.CANCELED:
        print(f"canceled job {args.job_id} ({state} in queue {queue}): it is deleted and will not run")
    elif reply.result is CancelResult.CANCEL_REQUESTED:
        print(
            f"cancel requested for job {args.job_id}: it is running, "
            "and the daemon running it stops it at its next heartbeat"
        )
    elif reply.result is CancelResult.NOT_CANCELABLE:
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
    limits = dead_letter_limits(config)

    async def check(admin: Admin) -> list[fsck.Finding]:
        findings: list[fsck.Finding] = []
        for queue in await admin.queues(args.queue):
            findings += await fsck.check_queue(admin.redis, admin.keys(queue), repair=args.repair, dead_limits=limits)
        return findings

    findings = with_admin(config, check)
    if args.json:
        print_json([finding.as_json() for finding in findings])
    elif not findings:
        print("clean: every queue checked holds to the protocol's invariants")
    else:
        for finding in findings:
            print(printable(finding.line()))
    return EX_FAILURE if any(not finding.repaired for finding in findings) else EX_OK
