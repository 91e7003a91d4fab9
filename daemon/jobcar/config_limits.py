"""A handler's `limits` (fleet-wide concurrency and rates, per type and per key) and `batch` sections of
the config."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import yaml

from jobcar.config_types import BatchDelivery, Limits, Rate
from jobcar.config_values import boolean, choice, duration, integer, parse_int
from jobcar.units import parse_duration
from jobcar.yaml_reader import Converter, Invalid, KeyPath, Reader

#: Where a per-key limit reads a job's key: the producer's key=, a meta entry or a payload field.
_LIMIT_KEY: Final = re.compile(r"key|meta\.[A-Za-z0-9_.:-]{1,100}|payload\.[A-Za-z0-9_-]{1,100}")


def _limit_key(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    text = r.text(node, "a key source")
    if not _LIMIT_KEY.fullmatch(text):
        raise Invalid(f"must be key (the producer's key=), meta.<name> or payload.<field>, not {text!r}")
    return text


_RATE: Final = re.compile(r"\s*([0-9][0-9_]*)\s*/\s*(\S+)\s*")


def _rate(r: Reader, node: yaml.Node, path: KeyPath) -> Rate:
    """`<count>/<period>`: 100/s, 5/m, 1000/1h, 3/500ms."""
    text = r.text(node, "a rate")
    match = _RATE.fullmatch(text)
    try:
        if not match:
            raise ValueError
        count = parse_int(match[1], 1)
        unit = match[2]
        period = parse_duration(f"1{unit}" if unit.isalpha() else unit)
    except (ValueError, Invalid):
        raise Invalid(f"must be a count per period, like 100/s, 5/m or 3/500ms, not {text!r}") from None
    if not 0.001 <= period <= 86400 or count / period > 1_000_000:
        raise Invalid(f"must be from 1 per day to a million per second, with a period of 1ms to 1d, not {text!r}")
    return Rate(count, period)


LIMITS_FIELDS: Final[Mapping[str, Converter]] = {
    "concurrency": integer(1),
    "per_key": integer(1),
    "rate": _rate,
    "burst": integer(1),
    "per_key_rate": _rate,
    "per_key_burst": integer(1),
    "fair": boolean,
    "on_429": choice(("job", "type", "key")),
    "key": _limit_key,
}


def limits_section(r: Reader, node: yaml.Node, path: KeyPath) -> Limits:
    reported = len(r.problems)
    values = r.fields(r.entries(node, path, LIMITS_FIELDS), path, LIMITS_FIELDS)
    if len(r.problems) > reported:
        return Limits()  # the config is rejected anyway; a missing value was reported as wrong, not absent
    if not values.keys() & {"concurrency", "per_key", "rate", "per_key_rate", "on_429", "fair"}:
        raise Invalid("needs concurrency or rate (fleet-wide, for the type), per_key or per_key_rate (for each key), "
                      "or on_429")  # fmt: skip
    if values.get("fair") and "concurrency" not in values:
        raise Invalid("has fair but no concurrency: keys take turns for the type's concurrency slots")
    keyed = values.keys() & {"per_key", "per_key_rate"} or values.get("on_429") == "key" or values.get("fair")
    if "key" in values and not keyed:
        raise Invalid("has key but no per_key, per_key_rate, fair or on_429: key: the key only matters for a per-key "
                      "limit")  # fmt: skip
    for burst, rate in (("burst", "rate"), ("per_key_burst", "per_key_rate")):
        if burst in values and rate not in values:
            raise Invalid(f"has {burst} but no {rate}")
    limits: Limits = Limits(**values)
    return limits


BATCH_FIELDS: Final[Mapping[str, Converter]] = {
    "max_size": integer(1),
    "max_wait": duration(),
    "key": _limit_key,
}
#: Bounds a batch's request body and a command's stdin; larger batches gain nothing measurable.
MAX_BATCH_SIZE: Final = 1000
#: The longest a job may wait for its batch to fill: it holds its lease meanwhile.
MAX_BATCH_WAIT: Final = 60.0


def batch_section(r: Reader, node: yaml.Node, path: KeyPath) -> BatchDelivery:
    reported = len(r.problems)
    values = r.fields(r.entries(node, path, BATCH_FIELDS), path, BATCH_FIELDS)
    if len(r.problems) > reported:
        return BatchDelivery()  # the config is rejected anyway
    if values.get("max_size", 0) > MAX_BATCH_SIZE:
        raise Invalid(f"max_size must be at most {MAX_BATCH_SIZE}, not {values['max_size']}")
    if values.get("max_wait", 0) > MAX_BATCH_WAIT:
        raise Invalid(f"max_wait must be at most {MAX_BATCH_WAIT:g}s: a job holds its lease while it waits")
    batch: BatchDelivery = BatchDelivery(**values)
    return batch
