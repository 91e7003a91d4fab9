"""A schedule's ticks (cron with time zones and DST, `every`, start, end) and what a daemon does with the
ticks that are due (catch-up), as pure functions: the cron library's answers are the reference."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from jobcar.errors import InvalidJob
from jobcar.schedules import ScheduleSpec, Step, make_spec, plan, spec_from_json, tick_job_id

BERLIN = ZoneInfo("Europe/Berlin")


def ms(*args: int, tz: ZoneInfo = BERLIN) -> int:
    return int(datetime(*args, tzinfo=tz).timestamp() * 1000)  # type: ignore[misc]


def ticks(spec: ScheduleSpec, after: int, n: int) -> list[str]:
    out = []
    for _ in range(n):
        tick = spec.next_tick(after)
        assert tick is not None
        out.append(datetime.fromtimestamp(tick / 1000, BERLIN).isoformat())
        after = tick
    return out


def test_a_0230_schedule_fires_once_on_the_spring_forward_day_at_0300() -> None:
    spec = make_spec("nightly", type="t", cron="30 2 * * *", timezone="Europe/Berlin")
    assert ticks(spec, ms(2026, 3, 27, 12, 0), 4) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that day: once, when the clock jumps past it
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]


def test_a_0230_schedule_fires_once_on_the_fall_back_day() -> None:
    spec = make_spec("nightly", type="t", cron="30 2 * * *", timezone="Europe/Berlin")
    assert ticks(spec, ms(2026, 10, 24, 12, 0), 3) == [
        "2026-10-25T02:30:00+02:00",  # 02:30 happens twice that day: the first one only
        "2026-10-26T02:30:00+01:00",
        "2026-10-27T02:30:00+01:00",
    ]


def test_an_hourly_schedule_follows_the_clock_changes() -> None:
    hourly = make_spec("hourly", type="t", cron="0 * * * *", timezone="Europe/Berlin")
    assert ticks(hourly, ms(2026, 3, 29, 0, 30), 3) == [
        "2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T04:00:00+02:00",
    ]  # fmt: skip
    # Two different hours both read 02:00 on the fall-back day: both fire.
    assert ticks(hourly, ms(2026, 10, 25, 0, 30), 4) == [
        "2026-10-25T01:00:00+02:00", "2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]  # fmt: skip


def test_every_counts_real_time_from_its_start_whatever_the_zone_or_clock_change() -> None:
    spec = make_spec("often", type="t", every="90m", timezone="Europe/Berlin", start=ms(2026, 3, 29, 0, 0) / 1000)
    got = [spec.next_tick(ms(2026, 3, 29, 0, 0) + n * 5_400_000) for n in range(3)]
    assert got == [ms(2026, 3, 29, 0, 0) + (n + 1) * 5_400_000 for n in range(3)]
    assert spec.next_tick(0) == ms(2026, 3, 29, 0, 0), "nothing before start: the first tick is start itself"
    anchored = make_spec("epoch", type="t", every="30s")
    assert anchored.next_tick(1_000) == 30_000, "without a start, ticks count from the epoch: the same on every host"


def test_no_tick_after_the_end() -> None:
    spec = make_spec("short", type="t", every="10s", start=0, end=25)
    assert [spec.next_tick(t) for t in (0, 10_000, 20_000)] == [10_000, 20_000, None]


def test_a_spec_round_trips_through_its_json_and_its_digest_follows_its_content() -> None:
    spec = make_spec("r", type="t", payload={"a": [1]}, cron="*/5 * * * *", priority=3, meta={"k": "v"})
    assert spec_from_json(spec.to_json()) == spec
    assert (
        make_spec("r", type="t", payload={"a": [1]}, cron="*/5 * * * *", priority=3, meta={"k": "v"}).digest
        == spec.digest
    )
    assert make_spec("r", type="t", payload={"a": [2]}, cron="*/5 * * * *").digest != spec.digest
    record = spec.record(1_700_000_000_000)
    assert (record.id, record.priority, record.type) == (tick_job_id("r", 1_700_000_000_000), 3, "t")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"type": "t"}, "give cron (a cron expression) or every (a duration), one of them"),
        ({"type": "t", "cron": "* * * * *", "every": "1m"}, "give cron"),
        ({"type": "t", "cron": "61 * * * *"}, "cron '61 * * * *'"),
        ({"type": "t", "every": "500ms"}, "every must be at least 1s"),
        ({"type": "t", "every": "1m", "timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
        ({"type": "t", "every": "1m", "catchup": "some"}, "catchup must be one of none, latest, all"),
        ({"type": "t", "every": "1m", "overlap": "queue"}, "overlap must be one of allow, skip"),
        ({"type": "t", "every": "1m", "limit": 0}, "limit must be a positive integer"),
        ({"type": "t", "every": "1m", "start": 100, "end": 50}, "end must be after start"),
        ({"type": "t", "every": "1m", "delay": 5}, "unknown schedule option(s): delay"),
        ({"type": "t", "every": "1m", "priority": 12}, "priority must be a whole number"),
        ({"type": "bad type!", "every": "1m"}, "job type"),
    ],
)
def test_bad_specs_are_refused_with_a_clear_message(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidJob, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        make_spec("s", **kwargs)  # type: ignore[arg-type]


# -- catch-up ---------------------------------------------------------------------------------------

SECOND = 1000


def every_second(catchup: str, window: str = "10s") -> ScheduleSpec:
    return make_spec("s", type="t", every="1s", catchup=catchup, catchup_window=window)


def test_on_time_every_policy_fires_the_one_due_tick() -> None:
    for catchup in ("none", "latest", "all"):
        assert plan(every_second(catchup), 5 * SECOND, 5 * SECOND + 300) == [Step(5000, 5000, 0, 6000)]


def test_nothing_is_due_before_the_tick() -> None:
    assert plan(every_second("all"), 5 * SECOND, 5 * SECOND - 1) == []


def test_after_a_gap_none_fires_nothing_of_it_latest_the_newest_all_each_within_the_window() -> None:
    # The fleet was down from tick 5 s to 30.4 s: ticks 5..30 are due; the window (10 s) reaches back to 20.4.
    now = 30 * SECOND + 400
    assert plan(every_second("none"), 5 * SECOND, now) == [Step(5000, None, 26, 31000)]
    assert plan(every_second("latest"), 5 * SECOND, now) == [Step(5000, 30000, 25, 31000)]
    steps = plan(every_second("all"), 5 * SECOND, now)
    assert [s.fire_ms for s in steps] == [t * SECOND for t in range(21, 31)]
    assert steps[0] == Step(5000, 21000, 16, 22000), "the ticks older than the window are passed over"
    assert all(s.skipped == 0 for s in steps[1:])
    assert [s.expected for s in steps[1:]] == [s.next_ms for s in steps[:-1]], "each step starts where the last ended"
    assert steps[-1].next_ms == 31000


def test_all_fires_a_bounded_number_per_round_and_waits_at_the_next_due_tick() -> None:
    steps = plan(every_second("all", window="1h"), 0, 500 * SECOND)
    assert len(steps) == 100
    assert steps[-1].next_ms == 100 * SECOND
    assert plan(every_second("all", window="1h"), 100 * SECOND, 500 * SECOND)[0].fire_ms == 100 * SECOND


def test_a_very_long_gap_jumps_to_the_next_tick_after_now() -> None:
    (step,) = plan(every_second("latest"), 0, 100_000 * SECOND + 5)
    assert step.next_ms == 100_001 * SECOND
    assert step.fire_ms is None, "the newest tick it looked at is far outside the window"
