"""The enqueue options as CLI flags, derived from their definitions (options.py): `jobcar enqueue` takes every
option that has a flag, `jobcar schedules set` every one a schedule takes. Each flag's value is read by the
option's kind; the client checks the rest, as for every other producer."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Final

from jobcar.cli_support import duration
from jobcar.options import OPTIONS, Kind, Option, flag

_EPOCH: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def moment(text: str) -> datetime | float:
    """RFC 3339 / ISO 8601 with a timezone, or epoch seconds."""
    if _EPOCH.fullmatch(text):
        return float(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: use RFC 3339 like 2030-01-31T09:00:00Z or 2030-01-31T10:00:00+01:00, "
            "or epoch seconds"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"time {text!r} needs a timezone, like {text}Z or {text}+01:00")
    return when


def _count(option: Option) -> Callable[[str], int]:
    top = option.maximum

    def read(text: str) -> int:
        if not text.isdigit() or int(text) < option.minimum or (top is not None and int(text) > top):
            # The one bounded count is a priority, whose smallest number runs first.
            expected = f"a whole number from {option.minimum} (first) to {top}" if top is not None else (
                "a positive integer" if option.minimum == 1 else "a whole number")  # fmt: skip
            raise argparse.ArgumentTypeError(f"must be {expected}, not {text!r}")
        return int(text)

    return read


def job_ref(text: str) -> str | tuple[str, str]:
    """An --after value: an id, or "QUEUE/ID" (the first "/" ends the queue's name)."""
    queue, slash, job_id = text.partition("/")
    return (queue, job_id) if slash else text


def _flag_arguments(option: Option) -> dict[str, Any]:
    """add_argument's keywords that read a value of the option's kind."""
    if option.kind is Kind.DURATION:
        return {"type": duration}
    if option.kind is Kind.INSTANT:
        return {"type": moment}
    if option.kind is Kind.COUNT:
        return {"type": _count(option)}
    if option.kind is Kind.CHOICE:
        return {"choices": option.choices}
    if option.kind is Kind.REFS:
        return {"type": job_ref, "action": "append"}
    return {}


def add_option_flags(parser: argparse.ArgumentParser, names: Iterable[str]) -> list[str]:
    """A flag for each option of `names` that has one, each stored under the option's name; options of one
    `exclusive` group exclude each other. Returns the names of the options given flags."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    added = []
    for name in names:
        option, given = OPTIONS[name], flag(name)
        if given is None:
            continue
        target: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup = parser
        if option.exclusive is not None:
            if option.exclusive not in groups:
                groups[option.exclusive] = parser.add_mutually_exclusive_group()
            target = groups[option.exclusive]
        flags = [given] if option.short is None else [given, option.short]
        target.add_argument(*flags, dest=name, metavar=option.metavar, help=option.help, **_flag_arguments(option))
        added.append(name)
    return added


def given_options(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The options of `names` that the command line gave, by name."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
