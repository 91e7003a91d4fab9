"""A cron schedule's ticks across clock changes, in zones whose offset or change is not a whole hour, held
against an oracle that walks the clock minute by minute and applies Debian's rules as its man page says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

from jobcar.cron import MAX_SHIFT, next_tick
from jobcar.schedules import make_spec

MINUTE_MS = 60_000
ZONES = ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Pacific/Chatham", "Europe/Dublin",
         "America/Santiago", "Asia/Kolkata")  # fmt: skip
EXPRESSIONS = ("30 2 * * *", "15 2 * * *", "45 2 * * *", "0 3 * * *", "45 1 * * *", "0 * * * *", "30 * * * *",
               "*/15 * * * *", "* 2 * * *", "50 */3 * * *", "9,22,37 */11 * * *", "0,30 1-3 * * *", "5 0 * * *",
               "*/7 1-4 * * *", "59 23 * * *", "30 2 * * 0")  # fmt: skip


def at(text: str) -> int:
    """ms of an RFC 3339 time with its offset."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def shown(tick_ms: int, zone: str) -> str:
    return datetime.fromtimestamp(tick_ms / 1000, ZoneInfo(zone)).isoformat()


def ticks(expression: str, zone: str, after: str, n: int) -> list[str]:
    out, after_ms = [], at(after)
    for _ in range(n):
        after_ms = next_tick(expression, ZoneInfo(zone), after_ms)
        out.append(shown(after_ms, zone))
    return out


def oracle(expression: str, zone: ZoneInfo, after_ms: int) -> int:
    """Walk the clock a minute at a time from `after_ms`. A wall time matching the expression fires; a job
    at fixed times (no `*` starting its minute or hour field) fires only the first of a repeated time, and
    fires once at the minute the clock jumps over skipped times that match."""
    fields = expression.split()
    clock = fields[0].startswith("*") or fields[1].startswith("*")
    start = datetime.fromtimestamp(after_ms / 1000, zone).replace(tzinfo=None)
    matching = set()
    for match in CronSim(expression, start - MAX_SHIFT - timedelta(minutes=1)):
        if match > start + timedelta(days=8):
            break
        matching.add(match)
    t = (after_ms // MINUTE_MS + 1) * MINUTE_MS
    previous = datetime.fromtimestamp((t - MINUTE_MS) / 1000, zone).replace(tzinfo=None)
    for _ in range(8 * 24 * 60):
        local = datetime.fromtimestamp(t / 1000, zone)
        wall = local.replace(tzinfo=None, fold=0)
        skipped = [previous + timedelta(minutes=m) for m in range(1, int((wall - previous) / timedelta(minutes=1)))]
        if not clock and any(w in matching for w in skipped):
            return t
        if wall in matching and (clock or local.fold == 0):
            return t
        previous, t = wall, t + MINUTE_MS
    raise AssertionError("no tick within eight days")


@lru_cache
def transitions(zone: str) -> tuple[int, ...]:
    """The instants (ms) at which the zone's offset changes in 2026 and 2027."""
    tz, found = ZoneInfo(zone), []
    t = datetime(2026, 1, 1, tzinfo=UTC)
    while t.year < 2028:
        step = t + timedelta(minutes=15)
        if t.astimezone(tz).utcoffset() != step.astimezone(tz).utcoffset():
            found.append(int(step.timestamp() * 1000))
        t = step
    return tuple(found)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    expression=st.sampled_from(EXPRESSIONS),
    zone=st.sampled_from(ZONES),
    which=st.integers(min_value=0, max_value=3),
    offset_minutes=st.integers(min_value=-6 * 60, max_value=6 * 60),
    extra_ms=st.sampled_from([0, 1, 29_999, 59_999]),
)
def test_every_tick_near_a_clock_change_is_the_oracles(
    expression: str, zone: str, which: int, offset_minutes: int, extra_ms: int
) -> None:
    changes = transitions(zone) or (at("2026-03-29T01:00:00+00:00"),)  # a zone without DST: any day
    after_ms = changes[which % len(changes)] + offset_minutes * MINUTE_MS + extra_ms
    tz = ZoneInfo(zone)
    got = next_tick(expression, tz, after_ms)
    assert got > after_ms
    assert got == oracle(expression, tz, after_ms), (shown(after_ms, zone), shown(got, zone))


def test_a_30_minute_change_neither_loses_nor_merges_an_hour() -> None:
    # Lord Howe goes from +10:30 to +11:00 at 02:00 (to 02:30) and back at 02:00 (to 01:30).
    assert ticks("30 * * * *", "Australia/Lord_Howe", "2026-10-04T00:45:00+10:30", 3) == [
        "2026-10-04T01:30:00+10:30", "2026-10-04T02:30:00+11:00", "2026-10-04T03:30:00+11:00",
    ]  # fmt: skip
    assert ticks("30 * * * *", "Australia/Lord_Howe", "2026-04-05T00:45:00+11:00", 3) == [
        "2026-04-05T01:30:00+11:00", "2026-04-05T01:30:00+10:30", "2026-04-05T02:30:00+10:30",
    ]  # fmt: skip
    # The minutes under 30 of a later hour are not lost after the jump.
    assert ticks("9,22,37 */11 * * *", "Australia/Lord_Howe", "2026-10-04T01:00:00+10:30", 4) == [
        "2026-10-04T11:09:00+11:00", "2026-10-04T11:22:00+11:00", "2026-10-04T11:37:00+11:00",
        "2026-10-04T22:09:00+11:00",
    ]  # fmt: skip


def test_a_fixed_time_in_a_repeated_hour_asked_from_its_second_pass_waits_for_the_next_day() -> None:
    assert ticks("30 2 * * *", "Europe/Berlin", "2026-10-25T02:00:00+01:00", 2) == [
        "2026-10-26T02:30:00+01:00", "2026-10-27T02:30:00+01:00",
    ]  # fmt: skip


def test_chathams_45_minute_offset_gives_an_answer_and_ticks_only_forward() -> None:
    after = at("2026-04-05T00:50:00+13:45")
    seen = ticks("50 */3 * * *", "Pacific/Chatham", "2026-04-05T00:50:00+13:45", 12)
    instants = [at(t) for t in seen]
    assert instants[0] > after
    assert instants == sorted(set(instants)), seen


def test_a_start_inside_a_repeated_hour_gives_no_tick_before_it() -> None:
    start = at("2026-10-25T02:10:00+01:00")  # the second 02:10 in Berlin
    spec = make_spec("s", type="t", cron="30 2 * * *", timezone="Europe/Berlin", start=start / 1000)
    first = spec.next_tick(0)
    assert first is not None
    assert first >= start
    assert shown(first, "Europe/Berlin") == "2026-10-26T02:30:00+01:00"


@pytest.mark.parametrize(("every", "ms"), [("1001ms", 1001), ("1.001s", 1001), ("20999ms", 20_999), (1.001, 1001)])
def test_every_keeps_its_milliseconds(every: str | float, ms: int) -> None:
    assert make_spec("s", type="t", every=every).every_ms == ms
