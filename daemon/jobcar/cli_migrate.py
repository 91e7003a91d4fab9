"""`jobcar migrate`: bring the namespace's keys from an earlier key layout to this jobcar's (migrate.py,
ADR 0019), with every daemon of the namespace stopped. A second run, or a run on a namespace already at this
layout, changes nothing; a run that stopped part-way is finished by running it again."""

from __future__ import annotations

import argparse
import asyncio

from jobcar import migrate
from jobcar.cli_support import CommandFailed, connected, count, load, print_json
from jobcar.config_types import Config
from jobcar.exit_codes import EX_OK


def migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"namespace", "from", "to", "slot_sets", "slots_moved", "fields_rewritten", "queues_recounted"}',
    )


def cmd_migrate(args: argparse.Namespace) -> int:
    config = load(args)
    try:
        done = asyncio.run(_migrate(config))
    except migrate.LayoutError as exc:
        raise CommandFailed(str(exc)) from None
    if args.json:
        print_json(
            {
                "namespace": config.namespace,
                "from": done.from_version,
                "to": done.to_version,
                "slot_sets": done.slot_sets,
                "slots_moved": done.slots_moved,
                "fields_rewritten": done.fields_rewritten,
                "queues_recounted": done.queues_recounted,
            }
        )
    elif done.from_version == done.to_version:
        print(f"namespace {config.namespace!r} is at key layout {done.to_version} already: nothing to do")
    else:
        print(
            f"namespace {config.namespace!r} migrated from key layout {done.from_version} to {done.to_version}: "
            f"{count(done.slots_moved, 'slot')} moved from {count(done.slot_sets, 'slot SET')}, "
            f"{count(done.fields_rewritten, 'slots field')} rewritten from JSON, "
            f"pending jobs recounted in {count(done.queues_recounted, 'queue')}"
        )
    return EX_OK


async def _migrate(config: Config) -> migrate.Migrated:
    async with connected(config) as client:
        return await migrate.migrate(client, config.namespace)
