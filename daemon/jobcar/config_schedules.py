"""The config's `schedules` section: periodic jobs, each checked by `schedules.make_spec`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import yaml

from jobcar.config_settings import valid_name
from jobcar.config_values import choice, integer, parse_int
from jobcar.errors import InvalidJob
from jobcar.options import OPTIONS, SCHEDULE_OPTIONS, Kind, Option
from jobcar.schedules import CATCHUP, OVERLAP, ScheduleSpec, make_spec
from jobcar.yaml_reader import Converter, Invalid, KeyPath, Reader


def _text(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    return r.text(node, "text")


def _positive(r: Reader, node: yaml.Node, path: KeyPath) -> int:
    return parse_int(r.text(node, "a whole number"), 1)


def _value(r: Reader, node: yaml.Node, path: KeyPath) -> Any:
    """Any YAML value, as YAML means it (a schedule's payload: a mapping, a list, a number...)."""
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


def _string_map(r: Reader, node: yaml.Node, path: KeyPath) -> dict[str, str]:
    return {name: r.text(entry.value, "text") for name, entry in r.entries(node, path).items()}


#: How the config reads each kind of job option a schedule may give; make_spec checks the values.
_OPTION_READERS: Final[Mapping[Kind, Callable[[Option], Converter]]] = {
    Kind.DURATION: lambda _: _text,
    Kind.TEXT: lambda _: _text,
    Kind.COUNT: lambda option: _positive if option.minimum == 1 else integer(option.minimum),
    Kind.CHOICE: lambda option: choice(option.choices),
    Kind.STRINGS: lambda _: _string_map,
}

SCHEDULE_FIELDS: Final[Mapping[str, Converter]] = {
    "type": _text,
    "payload": _value,
    "queue": valid_name,
    "cron": _text,
    "every": _text,
    "timezone": _text,
    "start": _text,
    "end": _text,
    "limit": _positive,
    "catchup": choice(CATCHUP),
    "catchup_window": _text,
    "overlap": choice(OVERLAP),
    **{name: _OPTION_READERS[OPTIONS[name].kind](OPTIONS[name]) for name in SCHEDULE_OPTIONS},
}


def schedules_section(r: Reader, node: yaml.Node, path: KeyPath) -> tuple[ScheduleSpec, ...]:
    specs = []
    for name, entry in r.entries(node, path, what="a mapping of schedule names to schedules").items():
        where = (*path, name)
        try:
            values = r.fields(r.entries(entry.value, where, SCHEDULE_FIELDS), where, SCHEDULE_FIELDS)
        except Invalid as exc:
            r.error(entry.value, where, exc.message)
            continue
        if "type" not in values:
            r.error(entry.value, where, "needs type: the job type each tick enqueues")
            continue
        try:
            specs.append(make_spec(name, **values))
        except InvalidJob as exc:
            r.error(entry.value, where, str(exc))
    return tuple(specs)
