"""`jobcar schedules`: list, show, set, pause, resume, trigger and remove periodic jobs (docs/schedules.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any, Final, TypeVar

from jobcar import schedule_store
from jobcar.cli_format import printable, table
from jobcar.cli_options import add_option_flags, given_options
from jobcar.cli_support import CommandFailed, connected, load, print_json
from jobcar.config_types import Config
from jobcar.errors import InvalidJob
from jobcar.exit_codes import EX_FAILURE, EX_OK, EX_USAGE
from jobcar.names import pattern_weight
from jobcar.options import SCHEDULE_OPTIONS
from jobcar.schedules import CATCHUP, OVERLAP, ScheduleState, make_spec
from jobcar.transport import Operation, run_async

T = TypeVar("T")
NAME_HELP: Final = "the schedule's name"


def _run(config: Config, operation: Operation[T]) -> T:
    async def main() -> T:
        async with connected(config) as client:
            return await run_async(client, operation)

    return asyncio.run(main())


def _when(rfc3339: str | None) -> str:
    return rfc3339 or "-"


# -- list / show ---------------------------------------------------------------------------------


def list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON array of the schedules")


def cmd_list(args: argparse.Namespace) -> int:
    config = load(args)
    states = _run(config, schedule_store.every_schedule(config.namespace))
    if args.json:
        print_json([s.document() for s in states])
        return EX_OK
    if not states:
        print("no schedules")
        return EX_OK
    rows = []
    for s in states:
        doc = s.document()
        when = s.spec.cron or f"every {doc['every_seconds']:g}s"
        status = "paused" if s.paused else "finished" if s.finished else "active"
        rows.append([printable(s.spec.name), s.spec.queue, printable(s.spec.type), when, s.spec.timezone, status,
                     _when(doc["next_tick"]), _when(doc["last_tick"]), str(s.fires), str(s.skipped)])  # fmt: skip
    header = ["SCHEDULE", "QUEUE", "TYPE", "WHEN", "ZONE", "STATUS", "NEXT", "LAST", "FIRES", "SKIPPED"]
    print("\n".join(table(header, rows, numeric={8, 9})))
    return EX_OK


def name_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help=NAME_HELP)
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")


def _state(config: Config, name: str) -> ScheduleState:
    state = _run(config, schedule_store.get(config.namespace, name))
    if state is None:
        raise CommandFailed(f"no schedule named {name!r}")
    return state


def cmd_show(args: argparse.Namespace) -> int:
    document = _state(load(args), args.name).document()
    if args.json:
        print_json(document)
    else:
        width = max(len(k) for k in document)
        for key, value in document.items():
            shown = json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value
            print(f"{key.ljust(width)}  {'-' if shown is None else printable(str(shown))}")
    return EX_OK


# -- set -------------------------------------------------------------------------------------------


def set_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help=NAME_HELP)
    parser.add_argument("--type", required=True, metavar="TYPE", help="the job type each tick enqueues")
    when = parser.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help='a cron expression, like "*/5 * * * *"')
    when.add_argument("--every", metavar="DURATION", help="a fixed interval, like 30s or 1h")
    parser.add_argument("--payload", metavar="JSON", help="the JSON payload of every job (default: null)")
    parser.add_argument("--queue", "-q", metavar="Q", help="the queue (default: default)")
    parser.add_argument("--timezone", metavar="ZONE", help="the cron expression's zone, like Europe/Berlin")
    parser.add_argument("--start", metavar="TIME", help="no tick before this RFC 3339 time")
    parser.add_argument("--end", metavar="TIME", help="no tick after this RFC 3339 time")
    parser.add_argument("--limit", type=int, metavar="N", help="stop after N fires")
    parser.add_argument("--catchup", choices=CATCHUP, help="what to fire of the ticks missed (default: latest)")
    parser.add_argument("--catchup-window", metavar="DURATION", help="ticks later than this are missed (5m)")
    parser.add_argument("--overlap", choices=OVERLAP, help="skip: no tick while the last job waits or runs")
    add_option_flags(parser, SCHEDULE_OPTIONS)  # the options of each job
    parser.add_argument("--json", action="store_true", help='print {"name", "result"}')


def cmd_set(args: argparse.Namespace) -> int:
    config = load(args)
    try:
        payload = None if args.payload is None else json.loads(args.payload)
    except ValueError as exc:
        raise CommandFailed(f"--payload is not JSON: {exc}", EX_USAGE) from None
    given: dict[str, Any] = {
        "queue": args.queue, "cron": args.cron, "every": args.every, "timezone": args.timezone, "start": args.start,
        "end": args.end, "limit": args.limit, "catchup": args.catchup, "catchup_window": args.catchup_window,
        "overlap": args.overlap, **given_options(args, SCHEDULE_OPTIONS),
    }  # fmt: skip
    options = {key: value for key, value in given.items() if value is not None}
    try:
        spec = make_spec(args.name, type=args.type, payload=payload, max_payload_bytes=config.max_payload_bytes,
                         **options)  # fmt: skip
    except InvalidJob as exc:
        raise CommandFailed(str(exc), EX_USAGE) from None
    result = _run(config, schedule_store.upsert(config.namespace, spec, "api"))
    if args.json:
        print_json({"name": spec.name, "result": result})
    else:
        print(f"schedule {spec.name} {result}")
    if spec.queue not in config.queues and pattern_weight(spec.queue, config.queue_patterns) is None:
        print(f"jobcar: note: queue {spec.queue!r} is not in the queues of {config.source}", file=sys.stderr)
    return EX_OK


# -- pause / resume / remove / trigger -------------------------------------------------------------

_DONE: Final = {"pause": "paused", "resume": "resumed", "remove": "removed"}
_ALREADY: Final = {"pause": "already paused", "resume": "not paused", "remove": "gone"}


def _change(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        config = load(args)
        result = _run(config, schedule_store.change(config.namespace, args.name, action))
        if result < 0:
            raise CommandFailed(f"no schedule named {args.name!r}")
        if args.json:
            print_json({"name": args.name, "changed": result == 1})
        else:
            print(f"schedule {args.name} {_DONE[action] if result == 1 else _ALREADY[action]}")
        return EX_OK

    return run


cmd_pause, cmd_resume, cmd_remove = _change("pause"), _change("resume"), _change("remove")


def cmd_trigger(args: argparse.Namespace) -> int:
    config = load(args)
    job_id = _run(config, schedule_store.trigger(config.namespace, args.name, config.max_payload_bytes))
    if job_id is None:
        raise CommandFailed(f"no schedule named {args.name!r}", EX_FAILURE)
    if args.json:
        print_json({"name": args.name, "job_id": job_id})
    else:
        print(job_id)
    return EX_OK
