"""The operators' commands that read or check whole queues: `stats`, `limits` and `fsck`, each on admin.Admin,
and the options the operators' commands share. Each command is one function taking the parsed arguments
and returning the exit code; cli.py registers them in its command table.
"""

from __future__ import annotations

import argparse

from jobcar.admin import Admin
from jobcar.cli_format import printable, span, table
from jobcar.cli_support import CommandFailed, load, print_json, with_admin
from jobcar.config_types import limit_rule_table
from jobcar.errors import InvalidJob
from jobcar.exit_codes import EX_FAILURE, EX_OK
from jobcar.history_calls import QueueHistory
from jobcar.limits_view import LimitGroup
from jobcar.names import check_name
from jobcar.recording import dead_letter_limits
from jobcar.stats_document import HOUR_MS, MINUTE_MS, stats_document
from jobcar.transitions import QueueStats

# -- shared by the operators' commands -------------------------------------------------------------


def queue_name(text: str) -> str:
    try:
        return check_name("queue name", text)
    except InvalidJob as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_queue_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--queue", "-q", type=queue_name, metavar="Q", help=help)


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")


# -- stats ----------------------------------------------------------------------------------------


def stats_arguments(parser: argparse.ArgumentParser) -> None:
    add_queue_option(parser, "only this queue (default: the config's queues and every queue producers used)")
    add_json_option(parser, "a list with one object per queue")


def cmd_stats(args: argparse.Namespace) -> int:
    config = load(args)

    async def read(admin: Admin) -> tuple[list[QueueStats], list[QueueHistory]]:
        queues = await admin.queues(args.queue)
        known = args.queue is None or args.queue in config.queues or args.queue in await admin.known_queues()
        if not known:
            raise CommandFailed(f"unknown queue {args.queue}: no producer used it, and it is not in {config.source}")
        return await admin.stats(queues), await admin.history(queues)

    stats, histories = with_admin(config, read)
    if args.json:
        print_json([stats_document(s, h) for s, h in zip(stats, histories, strict=True)])
        return EX_OK
    # processed = attempts that ended (done or failed), fleet-wide, over the last minute and hour of Redis time.
    counts = [(h.totals(MINUTE_MS), h.totals(HOUR_MS)) for h in histories]
    header = ("QUEUE", "PENDING", "SCHEDULED", "ACTIVE", "HELD", "WAITING", "DEAD", "PAUSED", "LATENCY", "DONE/1M",
              "FAILED/1M", "DONE/1H", "FAILED/1H", "MAX_PENDING", "REFUSED")  # fmt: skip
    rows = [
        (s.queue, str(s.pending), str(s.scheduled), str(s.active), str(s.held), str(s.waiting), str(s.dead),
         "yes" if s.paused else "no", "-" if s.oldest_ready_ms is None else span(s.latency_s),
         str(m["done"]), str(m["failed"]), str(h["done"]), str(h["failed"]),
         "-" if s.max_pending is None else str(s.max_pending), str(s.refused))
        for s, (m, h) in zip(stats, counts, strict=True)
    ]  # fmt: skip
    print("\n".join(table(header, rows, numeric={1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14})))
    # The types' bounds under the table, a line each: a column per type would not fit, and few types have one.
    for s in stats:
        for job_type, bound in sorted(s.max_pending_by_type.items()):
            print(f"{s.queue}: {printable(job_type)} {s.pending_counts.get(job_type, 0)} of max_pending {bound}")
    return EX_OK


# -- limits ----------------------------------------------------------------------------------------


def limits_arguments(parser: argparse.ArgumentParser) -> None:
    add_queue_option(parser, "only this queue (default: the config's queues and every queue producers used)")
    add_json_option(parser, "a list with one object per limit group")


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


# -- fsck -----------------------------------------------------------------------------------------


def fsck_arguments(parser: argparse.ArgumentParser) -> None:
    add_queue_option(parser, "only this queue (default: the config's queues and every queue producers used)")
    parser.add_argument(
        "--repair",
        action="store_true",
        help="repair what is found, each after an atomic re-check (safe while daemons run)",
    )
    add_json_option(parser, "a list with one object per finding")


def cmd_fsck(args: argparse.Namespace) -> int:
    from jobcar import fsck

    config = load(args)
    limits = dead_letter_limits(config)

    async def check(admin: Admin) -> list[fsck.Finding]:
        findings: list[fsck.Finding] = []
        for i, queue in enumerate(await admin.queues(args.queue)):
            keys = admin.keys(queue)
            # The namespace's own keys once, with the first queue, not once per queue.
            findings += await fsck.check_queue(
                admin.redis, keys, repair=args.repair, dead_limits=limits, namespace=i == 0
            )
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
