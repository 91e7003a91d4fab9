"""`jobcar enqueue`: one job from the command line, its options the enqueue options' flags (cli_options.py),
its payload JSON text, a file or stdin, checked before anything is sent."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from jobcar.cli_options import add_option_flags, given_options
from jobcar.cli_support import CommandFailed, connected, load, print_json
from jobcar.errors import InvalidJob, PayloadTooLarge, QueueFull
from jobcar.exit_codes import EX_FAILURE, EX_OK, EX_TEMPFAIL, EX_USAGE
from jobcar.formats import loads_strict
from jobcar.job import DEFAULT_CONTENT_TYPE, EnqueueStatus, JobInfo
from jobcar.keys import DEFAULT_QUEUE
from jobcar.options import OPTIONS
from jobcar.records import encode_payload
from jobcar.targets import TargetRefused


def enqueue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("type", metavar="TYPE", help="the job type, which selects the handler")
    parser.add_argument(
        "payload",
        metavar="PAYLOAD|@file|-",
        nargs="?",
        help="JSON text, @file to read a file, - to read stdin (default: null). "
        "Checked as JSON unless --content-type is given",
    )
    add_option_flags(parser, OPTIONS)
    parser.add_argument("--json", action="store_true", help='print {"id", "queue", "state", "status"}')


def _read_payload(source: str | None, content_type: str | None, max_bytes: int) -> tuple[bytes | None, str | None]:
    """(payload, content type) for the client: None means JSON null; bytes are sent as they are."""
    if source is None:
        return (b"", content_type) if content_type else (None, None)
    if source == "-":
        body = sys.stdin.buffer.read()
    elif source.startswith("@"):
        try:
            body = Path(source[1:]).read_bytes()
        except OSError as exc:
            raise CommandFailed(f"cannot read the payload file {source[1:]}: {exc.strerror or exc}", EX_USAGE) from None
    else:
        body = os.fsencode(source)  # the argument's bytes exactly as the shell passed them
    # The size first: a payload over the limit is reported as such, without parsing it.
    encode_payload(body, content_type or DEFAULT_CONTENT_TYPE, max_bytes)
    if content_type is None:
        _check_json(body)
        content_type = DEFAULT_CONTENT_TYPE  # the text goes unchanged, not re-encoded
    return body, content_type


def _check_json(body: bytes) -> None:
    hint = "quote it for the shell, or give --content-type to send other bytes as they are"
    try:
        loads_strict(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise CommandFailed(f"the payload is not UTF-8 text, so not JSON; {hint}", EX_USAGE) from None
    except (ValueError, RecursionError) as exc:
        raise CommandFailed(f"the payload is not valid JSON ({exc}); {hint}", EX_USAGE) from None


def _report(info: JobInfo, as_json: bool) -> None:
    if as_json:
        print_json({"id": info.id, "queue": info.queue, "state": info.state.value, "status": info.status.value})
    else:
        print(info.id)
    # Not a failure: an idempotent producer that enqueues twice has done its job (exit 0).
    if info.status is EnqueueStatus.EXISTS:
        print(f"jobcar: job {info.id} already exists ({info.state.value}); nothing enqueued", file=sys.stderr)
    elif info.status is EnqueueStatus.DEBOUNCED:
        print(f"jobcar: debounced into waiting job {info.id}: it runs later, with this payload", file=sys.stderr)
    elif info.status is EnqueueStatus.DUPLICATE:
        print(
            f"jobcar: the unique key is held by job {info.id} ({info.state.value}); nothing enqueued", file=sys.stderr
        )


def cmd_enqueue(args: argparse.Namespace) -> int:
    # Here, not at the top: `jobcar enqueue --help` needs neither the event loop nor redis-py.
    import asyncio

    from jobcar.client import AsyncClient

    config = load(args)
    # The client's own rule, said here in the flags' names and before `-` reads stdin.
    if args.unique_key is not None and args.unique_for is None:
        raise CommandFailed("--unique-key needs --unique-for (how long the key is held)", EX_USAGE)

    async def enqueue(payload: bytes | None, options: dict[str, Any]) -> JobInfo:
        async with connected(config) as client:
            producer = AsyncClient(client, namespace=config.namespace, max_payload_bytes=config.max_payload_bytes)
            # The client checks the job before it sends anything (its connection opens at the first
            # command), so bad input is reported as such even while Redis is away.
            return await producer.enqueue(args.type, payload, **options)

    try:
        problems = config.known_targets().check([(args.type, args.queue or DEFAULT_QUEUE)])
    except TargetRefused as refused:
        lines = [f"jobcar: {problem}" for problem in refused.problems]
        raise CommandFailed("", EX_USAGE, lines=[*lines, "jobcar: nothing enqueued (strict_enqueue is on)"]) from None
    try:
        payload, content_type = _read_payload(args.payload, args.content_type, config.max_payload_bytes)
        options = {**given_options(args, OPTIONS), "queue": args.queue or DEFAULT_QUEUE, "content_type": content_type}
        info = asyncio.run(enqueue(payload, options))
    except PayloadTooLarge as exc:
        raise CommandFailed(str(exc), EX_FAILURE) from None
    except InvalidJob as exc:
        raise CommandFailed(str(exc), EX_USAGE) from None
    except QueueFull as exc:  # backpressure (ADR 0024): nothing was written; a script may try again later
        raise CommandFailed(str(exc), EX_TEMPFAIL) from None
    _report(info, args.json)
    # Said after the id, so a script reading stdout still gets it; these jobs would sit or die unrun.
    for problem in problems:
        print(f"jobcar: note: {problem}", file=sys.stderr)
    return EX_OK
