"""The `jobcar` command line: `run` the daemon and `check` a config here; `enqueue` a job (cli_enqueue.py),
the operators' commands (`stats`, `limits`, `fsck` in cli_ops.py; `jobs list|show|logs` in cli_jobs.py; `dead
requeue|purge`, `queue pause|resume`, `cancel` in cli_actions.py; `schedules ...` in cli_schedules.py;
`migrate`, `health`, `ui` in cli_migrate.py, cli_health.py, cli_ui.py); what all commands share is in
cli_support.py.

Each command is one function taking the parsed arguments and returning the exit code, registered
with its arguments in COMMANDS (a command with actions, like `jobs`, is a group of such entries);
`main` builds the parser from that table. A command's module, and what it imports (redis-py, the config
loader, aiohttp for `ui`), is loaded only when that command is parsed: `jobcar --version` and scripts
calling one command in a loop pay for no other. Every command takes `-c/--config` (default
`$JOBCAR_CONFIG`, else `./jobcar.yaml`); the read commands take `--json`.

Exit codes (exit_codes.py): 0 ok, 1 failure, 2 usage (including bad input such as invalid JSON),
69 Redis unreachable (EX_UNAVAILABLE), 78 bad config (EX_CONFIG). A user's mistake is reported in
one line on stderr, never as a traceback; only a bug in jobcar shows one.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from jobcar import __version__
from jobcar.cli_support import (
    CONFIG_HELP,
    CommandFailed,
    config_path,
    count,
    load,
    print_json,
)
from jobcar.exit_codes import EX_CONFIG, EX_FAILURE, EX_OK, EX_UNAVAILABLE, EX_USAGE

if TYPE_CHECKING:
    pass

__all__ = ["COMMANDS", "Command", "CommandFailed", "build_parser", "main"]


class _CommandParser(argparse.ArgumentParser):
    """Takes positionals after options (`enqueue TYPE --delay 10s PAYLOAD`), which plain argparse refuses
    for an optional positional that follows an option (bpo-15112)."""

    _intermixing = False
    #: The command's own arguments, added when the command is parsed rather than when the parser is built:
    #: adding them imports the command's module, which the other commands do without.
    _add_arguments: Callable[[argparse.ArgumentParser], None] | None = None

    def deferred(self, add_arguments: Callable[[argparse.ArgumentParser], None] | None) -> None:
        self._add_arguments = add_arguments

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        add_arguments, self._add_arguments = self._add_arguments, None
        if add_arguments is not None:
            add_arguments(self)
        # parse_known_intermixed_args calls back here for its two passes, refuses a parser with actions, and
        # (Python 3.11) loses the positionals after `--`, which plain parsing takes: `cancel -- -id`.
        if self._intermixing or self._subparsers is not None or (args is not None and "--" in args):
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    #: Adds the command's own arguments (every command takes -c/--config); None: it has none. Called only
    #: when the command is parsed.
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None


def _later(function: str) -> Callable[[Any], Any]:
    """The function named "module:name", imported at its first call: the module of a command (a `run` or an
    `add_arguments`), and what it imports, loads only when that command is parsed."""
    module, _, name = function.partition(":")

    def call(arg: Any) -> Any:
        return getattr(importlib.import_module(module), name)(arg)

    return call


def main(argv: list[str] | None = None) -> int:
    """Run the `jobcar` command line with `argv` (default `sys.argv[1:]`); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(_negative_values_attached(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help (0) or a usage error (2), which argparse has already printed
        return exc.code if isinstance(exc.code, int) else EX_USAGE
    command: Command = args.command
    try:
        return command.run(args)
    except CommandFailed as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 128 + 2  # the shell's convention for death by SIGINT
    except BrokenPipeError:
        # The reader went away (`jobcar enqueue ... | head -0`): nothing to report to it. Point stdout at
        # /dev/null so the interpreter's final flush does not fail a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EX_FAILURE


_SIGNED: Final = re.compile(r"-[0-9.]")


@functools.cache
def _duration_flags() -> frozenset[str]:
    """The flags whose value may look like an option: `--delay -5s` is a negative duration (refused with a
    clear message), not a missing value. Read from the options' definitions only when a value looks so."""
    from jobcar.options import OPTIONS, Kind, flag

    return frozenset(f for name, option in OPTIONS.items() if option.kind is Kind.DURATION and (f := flag(name)))


def _negative_values_attached(argv: Sequence[str]) -> list[str]:
    """`--delay -5s` as `--delay=-5s`, so that argparse hands the value to the option's own check."""
    out: list[str] = []
    at = 0
    while at < len(argv):
        arg = argv[at]
        if arg == "--":
            return out + list(argv[at:])
        value = argv[at + 1] if at + 1 < len(argv) else None
        if value is not None and _SIGNED.match(value) and arg in _duration_flags():
            out.append(f"{arg}={value}")
            at += 2
        else:
            out.append(arg)
            at += 1
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jobcar",
        description="Run background jobs from Redis through HTTP and command handlers.",
        epilog="exit codes: 0 ok, 1 failure, 2 usage, 69 Redis unreachable, 78 bad config",
    )
    # Also accepted before the command (`jobcar -c FILE check`); the command's own -c wins.
    parser.add_argument("-c", "--config", dest="global_config", metavar="FILE", help=CONFIG_HELP)
    parser.add_argument("--version", action="version", version=f"jobcar {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True, parser_class=_CommandParser)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        sub.add_argument("-c", "--config", metavar="FILE", help=CONFIG_HELP)
        sub.deferred(command.add_arguments)
        sub.set_defaults(command=command)
    return parser


# -- run ------------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    config = load(args, secrets_needed=True)
    # Imported here: the daemon pulls in aiohttp, uvloop and prometheus_client, which the other
    # commands (and producers on a Spark executor) do without.
    from jobcar import daemon
    from jobcar.embedded import EmbeddedServerError

    try:
        return daemon.run(config)
    except EmbeddedServerError as exc:
        raise CommandFailed(str(exc), EX_UNAVAILABLE) from None


# -- check ----------------------------------------------------------------------------------------


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help='print {"config", "ok", "errors", "handlers", "queues"}')


def cmd_check(args: argparse.Namespace) -> int:
    path = config_path(args)
    try:
        config = load(args, secrets_needed=True)
    except CommandFailed as exc:
        if not args.json or exc.code != EX_CONFIG:
            raise
        print_json({"config": path, "ok": False, "errors": exc.lines})
        return exc.code
    if args.json:
        patterns = {"queue_patterns": list(config.queue_patterns)} if config.queue_patterns else {}
        print_json({"config": path, "ok": True, "errors": [], "handlers": sorted(config.handlers),
                    "queues": list(config.queues), **patterns})  # fmt: skip
    else:
        also = f", {count(len(config.queue_patterns), 'queue pattern')}" if config.queue_patterns else ""
        print(f"{path}: ok ({count(len(config.handlers), 'handler')}, {count(len(config.queues), 'queue')}{also})")
    return EX_OK


# -- command groups -------------------------------------------------------------------------------


def _group(name: str, help: str, actions: Sequence[Command]) -> Command:
    """A command with actions of its own (`jobcar jobs list`), each taking -c/--config too."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        subparsers = parser.add_subparsers(
            title="actions", metavar="ACTION", required=True, parser_class=_CommandParser
        )
        for action in actions:
            sub = subparsers.add_parser(action.name, help=action.help, description=action.help)
            # Its own dest: a subparser's defaults overwrite the parent's values (`jobs -c F list`).
            sub.add_argument("-c", "--config", dest="action_config", metavar="FILE", help=CONFIG_HELP)
            sub.deferred(action.add_arguments)
            sub.set_defaults(action=action)

    def run(args: argparse.Namespace) -> int:
        action: Command = args.action
        return action.run(args)

    return Command(name, help, run, add_arguments)


_OPS: Final = "jobcar.cli_ops"
_SCHEDULES: Final = "jobcar.cli_schedules"

COMMANDS: Final[tuple[Command, ...]] = (
    Command("run", "run the daemon", cmd_run),
    Command("check", "validate the config; print every error with its line", cmd_check, _check_arguments),
    Command(
        "enqueue",
        "enqueue a job and print its id",
        _later("jobcar.cli_enqueue:cmd_enqueue"),
        _later("jobcar.cli_enqueue:enqueue_arguments"),
    ),
    Command(
        "stats",
        "per queue: pending, scheduled, active, dead, paused, latency",
        _later(f"{_OPS}:cmd_stats"),
        _later(f"{_OPS}:stats_arguments"),
    ),
    Command(
        "limits",
        "per limit group: running, held, the limit, a rate's next start",
        _later(f"{_OPS}:cmd_limits"),
        _later(f"{_OPS}:limits_arguments"),
    ),
    _group(
        "jobs",
        "list and inspect jobs",
        (
            Command(
                "list",
                "list jobs with their state, attempts, age and last error",
                _later("jobcar.cli_jobs:cmd_jobs_list"),
                _later("jobcar.cli_jobs:jobs_list_arguments"),
            ),
            Command(
                "show",
                "show every field of a job and its error history",
                _later("jobcar.cli_jobs:cmd_jobs_show"),
                _later("jobcar.cli_jobs:jobs_show_arguments"),
            ),
            Command(
                "logs",
                "print a job's log lines; --follow prints new ones until it has finished",
                _later("jobcar.cli_jobs:cmd_jobs_logs"),
                _later("jobcar.cli_jobs:jobs_logs_arguments"),
            ),
            Command(
                "cancel",
                "cancel the pending, held, scheduled or waiting jobs a filter matches (--dry-run counts them)",
                _later("jobcar.cli_actions:cmd_jobs_cancel"),
                _later("jobcar.cli_actions:jobs_cancel_arguments"),
            ),
        ),
    ),
    _group(
        "dead",
        "the dead-letter queue",
        (
            Command(
                "requeue",
                "run dead jobs again, attempts reset",
                _later("jobcar.cli_actions:cmd_dead_requeue"),
                _later("jobcar.cli_actions:dead_requeue_arguments"),
            ),
            Command(
                "purge",
                "delete dead jobs for good",
                _later("jobcar.cli_actions:cmd_dead_purge"),
                _later("jobcar.cli_actions:dead_purge_arguments"),
            ),
        ),
    ),
    _group(
        "queue",
        "pause or resume leasing from a queue",
        (
            Command(
                "pause",
                "stop leasing jobs from a queue (enqueues go on)",
                _later("jobcar.cli_actions:cmd_queue_pause"),
                _later("jobcar.cli_actions:queue_arguments"),
            ),
            Command(
                "resume",
                "lease jobs from a paused queue again",
                _later("jobcar.cli_actions:cmd_queue_resume"),
                _later("jobcar.cli_actions:queue_arguments"),
            ),
        ),
    ),
    _group(
        "schedules",
        "periodic jobs, fired once per tick by the fleet",
        (
            Command(
                "list",
                "every schedule with its next and last tick",
                _later(f"{_SCHEDULES}:cmd_list"),
                _later(f"{_SCHEDULES}:list_arguments"),
            ),
            Command(
                "show",
                "one schedule in full",
                _later(f"{_SCHEDULES}:cmd_show"),
                _later(f"{_SCHEDULES}:name_arguments"),
            ),
            Command(
                "set",
                "create or change a schedule",
                _later(f"{_SCHEDULES}:cmd_set"),
                _later(f"{_SCHEDULES}:set_arguments"),
            ),
            Command(
                "pause",
                "fire no tick until resumed",
                _later(f"{_SCHEDULES}:cmd_pause"),
                _later(f"{_SCHEDULES}:name_arguments"),
            ),
            Command(
                "resume",
                "fire again from the next tick",
                _later(f"{_SCHEDULES}:cmd_resume"),
                _later(f"{_SCHEDULES}:name_arguments"),
            ),
            Command(
                "trigger",
                "enqueue one job of the schedule now",
                _later(f"{_SCHEDULES}:cmd_trigger"),
                _later(f"{_SCHEDULES}:name_arguments"),
            ),
            Command(
                "remove",
                "delete a schedule",
                _later(f"{_SCHEDULES}:cmd_remove"),
                _later(f"{_SCHEDULES}:name_arguments"),
            ),
        ),
    ),
    Command(
        "cancel",
        "cancel a waiting job, or stop a running one",
        _later("jobcar.cli_actions:cmd_cancel"),
        _later("jobcar.cli_actions:cancel_arguments"),
    ),
    Command(
        "fsck",
        "check queues against the protocol's invariants (--repair fixes)",
        _later(f"{_OPS}:cmd_fsck"),
        _later(f"{_OPS}:fsck_arguments"),
    ),
    Command(
        "migrate",
        "bring the namespace's keys to this version's key layout (with its daemons stopped)",
        _later("jobcar.cli_migrate:cmd_migrate"),
        _later("jobcar.cli_migrate:migrate_arguments"),
    ),
    Command(
        "health",
        "exit 0 when the daemon's /healthz answers 200 (for HEALTHCHECK)",
        _later("jobcar.cli_health:cmd_health"),
        _later("jobcar.cli_health:health_arguments"),
    ),
    Command(
        "ui",
        "serve the web dashboard (runs no jobs)",
        _later("jobcar.cli_ui:cmd_ui"),
        _later("jobcar.cli_ui:ui_arguments"),
    ),
)

if __name__ == "__main__":
    raise SystemExit(main())
