"""The operators' commands that change state: `dead requeue|purge`, `queue pause|resume`, `cancel` and `jobs
cancel` (by filter), each an action of admin.Admin."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from jobcar.admin import CANCELABLE, Admin, BulkCancel, CancelReply
from jobcar.cli_format import table
from jobcar.cli_ops import add_json_option, add_queue_option, queue_name
from jobcar.cli_support import ID_DASH, ID_HELP, CommandFailed, count, duration, load, print_json, with_admin
from jobcar.errors import InvalidJob
from jobcar.exit_codes import EX_FAILURE, EX_OK, EX_USAGE
from jobcar.job import State
from jobcar.job_search import JobFilter, parse_condition
from jobcar.transitions import CancelResult


def _per_queue(counts: Mapping[str, int]) -> str:
    nonzero = [f"{queue}: {n}" for queue, n in counts.items() if n]
    return f" ({', '.join(nonzero)})" if nonzero else ""


# -- dead requeue / dead purge --------------------------------------------------------------------


def dead_requeue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_ids", metavar="ID", nargs="*", help=f"ids of dead jobs to run again ({ID_DASH})")
    parser.add_argument("--all", action="store_true", help="requeue every dead job (of --queue, else of every queue)")
    add_queue_option(parser, "the queue (default: every queue)")
    add_json_option(parser, '{"requeued": {queue: count}, "problems": [...]}')


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
    add_queue_option(parser, "the queue (default: every queue)")
    parser.add_argument("--yes", action="store_true", help="without ids: really delete every dead job (required)")
    add_json_option(parser, '{"deleted": {queue: count}, "problems": [...]}')


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
    parser.add_argument("queue", metavar="Q", type=queue_name, help="the queue")
    add_json_option(parser, '{"queue", "paused", "changed"}')


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
    add_queue_option(parser, "the job's queue (default: search every queue)")
    add_json_option(parser, '{"id", "queue", "result", "state"} (as DELETE /v1/jobs/{id})')


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


# -- jobs cancel (by filter) ----------------------------------------------------------------------


def jobs_cancel_arguments(parser: argparse.ArgumentParser) -> None:
    add_queue_option(parser, "only this queue (default: every queue)")
    parser.add_argument(
        "--state",
        action="append",
        choices=[s.value for s in CANCELABLE],
        help="only jobs in this state; repeat for several (default: pending, held, scheduled and waiting; a running "
        "job is never canceled by a bulk cancel: `jobcar cancel ID` asks its daemon to stop it)",
    )
    parser.add_argument("--type", dest="job_type", default="", metavar="TYPE", help="only jobs of this type")
    parser.add_argument("--key", default="", metavar="KEY", help="only jobs enqueued with this limit key (key=)")
    parser.add_argument("--id-prefix", default="", metavar="P", help="only jobs whose id starts with P")
    parser.add_argument(
        "--older-than", type=duration, metavar="AGE", help="only jobs enqueued at least this long ago (30s, 2h, 1d)"
    )
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="COND",
        help="only jobs whose payload field or meta value is this: payload.FIELD=VALUE or meta.NAME=VALUE; repeat "
        "for all of several (as in jobs list --where)",
    )
    parser.add_argument("--all", action="store_true", help="with no filter: cancel every job of those states")
    parser.add_argument("--dry-run", "-n", action="store_true", help="count the jobs it would cancel; change nothing")
    add_json_option(parser, '{"dry_run", "examined", "matched", "canceled", "left", "by_queue": [...]}')


def cmd_jobs_cancel(args: argparse.Namespace) -> int:
    try:
        job_filter = JobFilter(
            job_type=args.job_type, key=args.key, id_prefix=args.id_prefix,
            older_than_ms=int((args.older_than or 0) * 1000), where=tuple(parse_condition(c) for c in args.where),
        )  # fmt: skip
    except InvalidJob as exc:
        raise CommandFailed(str(exc), EX_USAGE) from None
    if not job_filter.any and not args.all:
        raise CommandFailed("give a filter (--type, --key, --id-prefix, --older-than, --where), or --all", EX_USAGE)
    states = [State(s) for s in dict.fromkeys(args.state)] if args.state else list(CANCELABLE)

    async def cancel(admin: Admin) -> list[BulkCancel]:
        return await admin.cancel_matching(await admin.queues(args.queue), states, job_filter, args.dry_run)

    tallies = with_admin(load(args), cancel)
    matched, canceled, left = (sum(getattr(t, name) for t in tallies) for name in ("matched", "canceled", "left"))
    if args.json:
        print_json({"dry_run": args.dry_run, "examined": sum(t.examined for t in tallies), "matched": matched,
                    "canceled": canceled, "left": left,
                    "by_queue": [t.document() for t in tallies if t.examined]})  # fmt: skip
        return EX_OK
    rows = [(t.queue, t.state.value, str(t.examined), str(t.matched), str(t.canceled), str(t.left))
            for t in tallies if t.matched]  # fmt: skip
    if rows:
        print("\n".join(table(("QUEUE", "STATE", "EXAMINED", "MATCHED", "CANCELED", "LEFT"), rows, {2, 3, 4, 5})))
    what = job_filter.describe()
    if args.dry_run:
        print(f"dry run: would cancel {count(matched, 'job')} ({what}); nothing changed")
    else:
        gone = f"; {left} had left their state meanwhile (started, or moved on): left as they are" if left else ""
        print(f"canceled {count(canceled, 'job')} ({what}){gone}")
    return EX_OK
