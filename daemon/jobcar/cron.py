"""When a cron expression fires in a time zone, as Debian's cron runs it across clock changes.

cronsim matches the five fields against local wall-clock times (naive datetimes: it never sees a zone).
This module maps each match to the instants at which it fires, by Debian's rules for a clock change (which
are its rules for any change under three hours, and every zone's DST change is one):

- A job at a fixed time (neither the minute nor the hour field starts with `*`, as `30 2 * * *`) whose
  time the clock skips fires once, at the moment the clock jumps past it; one whose time happens twice
  fires the first time only.
- A job with `*` starting its minute or hour field (`30 * * * *`, `*/15 2 * * *`, `@hourly`) follows the
  clock: a skipped time never happens, a repeated one fires both times (they are two different hours).

The answer is always after the instant asked about, and the work for one answer is bounded (MAX_MATCHES)
whatever the expression, the zone, or the library.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

#: No zone's clock change is larger: Debian's cron applies its rules to changes under three hours.
MAX_SHIFT: Final = timedelta(hours=3)
#: Matches looked at for one answer. A clock change hides at most MAX_SHIFT of matches of a job that
#: follows the clock (180 of `* * * * *`), and the search starts MAX_SHIFT before the instant asked about.
MAX_MATCHES: Final = 2000
_MINUTE: Final = timedelta(minutes=1)


class NoTick(ValueError):
    """The expression gives no tick within MAX_MATCHES matches of the instant asked about."""


def follows_the_clock(expression: str) -> bool:
    """Whether a job runs by the wall clock on a clock change (`*` starts its minute or hour field), or at
    fixed times, which Debian's cron neither skips nor repeats."""
    fields = expression.split()
    if fields and fields[0].startswith("@"):
        return fields[0].lower() == "@hourly"
    return len(fields) >= 2 and (fields[0].startswith("*") or fields[1].startswith("*"))


def next_tick(expression: str, zone: ZoneInfo, after_ms: int) -> int:
    """The first instant (ms since the epoch) after `after_ms` at which `expression` fires in `zone`."""
    from cronsim import CronSim

    clock = follows_the_clock(expression)
    after = datetime.fromtimestamp(after_ms / 1000, UTC)
    wall = _wall(after, zone)
    best: datetime | None = None
    # A match whose wall time is up to MAX_SHIFT before now can still come later: the second pass of a
    # repeated hour.
    matches = CronSim(expression, wall - MAX_SHIFT - _MINUTE)
    for _, local in zip(range(MAX_MATCHES), matches, strict=False):
        if best is not None and local > _wall(best, zone) + MAX_SHIFT:
            break  # a later match's instant is later than `best` (its offset differs by under MAX_SHIFT)
        for instant in _instants(local, zone, clock):
            if instant > after and (best is None or instant < best):
                best = instant
    if best is None:
        raise NoTick(f"cron {expression!r} gives no tick in {zone.key} after {after.isoformat()}")
    return int(best.timestamp() * 1000)


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    """The wall time at `instant`: through UTC, since astimezone keeps a time already in `zone` as it is,
    a time the clock skips included."""
    return instant.astimezone(UTC).astimezone(zone).replace(tzinfo=None)


def _instants(local: datetime, zone: ZoneInfo, clock: bool) -> Iterator[datetime]:
    """The instants at which a match at wall time `local` fires (none, one or two)."""
    first, second = local.replace(tzinfo=zone, fold=0), local.replace(tzinfo=zone, fold=1)
    first_exists, second_exists = _wall(first, zone) == local, _wall(second, zone) == local
    if first_exists and second_exists and first.utcoffset() != second.utcoffset():
        yield first.astimezone(UTC)  # a repeated time: the first pass, and the second if it follows the clock
        if clock:
            yield second.astimezone(UTC)
    elif first_exists or second_exists:
        yield (first if first_exists else second).astimezone(UTC)
    elif not clock:
        # A skipped time: read by the offset before the jump (fold 0) it is after the jump, by the one after
        # it (fold 1) before.
        yield _jump(second.astimezone(UTC), first.astimezone(UTC), zone)


def _jump(earliest: datetime, latest: datetime, zone: ZoneInfo) -> datetime:
    """The instant the clock jumps over a skipped wall time, between the two readings of that time
    (`earliest` by the offset after the jump, `latest` by the one before), to the minute: zones change
    their offsets on whole minutes."""
    offset_after = latest.astimezone(zone).utcoffset()
    low, high = 0, int((latest - earliest) / _MINUTE)  # the jump is at earliest + high minutes at the latest
    while low < high:
        middle = (low + high) // 2
        if (earliest + middle * _MINUTE).astimezone(zone).utcoffset() == offset_after:
            high = middle
        else:
            low = middle + 1
    return earliest + low * _MINUTE
