"""Periodic jobs: a schedule's spec, its ticks, what to do with the ticks that are due, and the script calls
that store and fire schedules (docs/schedules.md). No I/O: the daemon's scheduler, the clients, the CLI and
the HTTP API send the calls.

A tick is a moment (ms since the epoch) at which the schedule makes a job. Every daemon computes the same
ticks from the same spec, and the `schedule_fire` script moves a schedule from one tick to the next only
if it is still at the tick the caller saw (compare and set), so any daemon may fire it and each tick fires
once, without a leader (ADR 0012). Time comes from Redis: the caller learns it from the scripts' replies.

Standard library only, but for the cron library, imported where a cron expression is read: producers (a
Spark executor with jobcar as a zip) import the client, which imports this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jobcar.cron import next_tick as cron_next_tick
from jobcar.enqueueing import EnqueueRecord
from jobcar.errors import InvalidJob
from jobcar.keys import DEFAULT_QUEUE, QueueKeys
from jobcar.names import check_name
from jobcar.options import SCHEDULE_OPTIONS
from jobcar.records import DEFAULT_MAX_PAYLOAD_BYTES, build_record, new_job_id
from jobcar.replies import as_int, as_list, as_text
from jobcar.scripts import Arg, Reply, ScriptCall, call
from jobcar.units import parse_duration

CATCHUP: Final = ("none", "latest", "all")
OVERLAP: Final = ("allow", "skip")
#: A schedule's own fields: make_spec's keyword arguments beside the options of its jobs.
SCHEDULE_FIELDS: Final = ("type", "payload", "queue", "cron", "every", "timezone", "start", "end", "limit", "catchup",
                          "catchup_window", "overlap")  # fmt: skip
#: Enqueue options a schedule may give its jobs.
JOB_OPTIONS: Final = frozenset(SCHEDULE_OPTIONS)
#: Everything a schedule is given as: the config's keys, the schedule API's fields.
SPEC_FIELDS: Final = (*SCHEDULE_FIELDS, *SCHEDULE_OPTIONS)
DEFAULT_CATCHUP_WINDOW_MS: Final = 300_000
#: Due ticks looked at in one round; beyond, the schedule moves straight to its next tick after now.
MAX_DUE: Final = 1000
#: Ticks of `catchup: all` fired per round (each its own call); the next round fires the rest.
MAX_FIRES_PER_ROUND: Final = 100


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a schedule makes and when: stored as JSON in the schedule's hash, the same on every daemon."""

    name: str
    type: str
    queue: str = DEFAULT_QUEUE
    payload: Any = None
    cron: str | None = None
    every_ms: int | None = None
    timezone: str = "UTC"
    start_ms: int | None = None
    end_ms: int | None = None
    limit: int | None = None
    catchup: str = "latest"
    catchup_window_ms: int = DEFAULT_CATCHUP_WINDOW_MS
    overlap: str = "allow"
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        """Changes with anything that changes the ticks or the jobs: a changed spec starts from a new tick."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:32]

    def next_tick(self, after_ms: int) -> int | None:
        """The first tick after `after_ms`, or None when the schedule has none left (past its `end`)."""
        if self.start_ms is not None and after_ms < self.start_ms:
            after_ms = self.start_ms - 1
        if self.every_ms is not None:
            anchor = self.start_ms or 0
            tick = anchor + ((after_ms - anchor) // self.every_ms + 1) * self.every_ms
        else:
            assert self.cron is not None
            tick = cron_next_tick(self.cron, _zone(self.timezone), after_ms)
        if self.end_ms is not None and tick > self.end_ms:
            return None
        return tick

    def record(self, tick_ms: int, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> EnqueueRecord:
        """The job this schedule makes for a tick; its id names both, so the same tick never makes two."""
        return build_record(self.type, self.payload, max_payload_bytes, queue=self.queue,
                            job_id=tick_job_id(self.name, tick_ms), **self.options)  # fmt: skip


def tick_job_id(name: str, tick_ms: int) -> str:
    return f"{name}@{tick_ms}"


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


# -- a spec from what a producer or the config gives ------------------------------------------------


def _ms(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidJob(f"{what} must be a duration: seconds, or text like 30s, 5m, 1h")
    try:
        return round(parse_duration(value) * 1000)  # round: 1.001 s is 1000.9999... ms as a float
    except ValueError as exc:
        raise InvalidJob(f"{what}: {exc}") from None


def _moment_ms(what: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidJob(f"{what} must be a timezone-aware datetime")
        return int(value.timestamp() * 1000)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidJob(f"{what} must be an RFC 3339 time like 2030-01-31T09:00:00Z, or epoch seconds") from None
        if moment.tzinfo is None:
            raise InvalidJob(f"{what} {value!r} needs a timezone, like {value}Z")
        return int(moment.timestamp() * 1000)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value * 1000)
    raise InvalidJob(f"{what} must be an RFC 3339 time or epoch seconds, not {value!r}")


def make_spec(
    name: str,
    *,
    type: str,
    payload: Any = None,
    queue: str | None = None,
    cron: str | None = None,
    every: str | float | None = None,
    timezone: str | None = None,
    start: object = None,
    end: object = None,
    limit: int | None = None,
    catchup: str | None = None,
    catchup_window: str | float | None = None,
    overlap: str | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    **options: Any,
) -> ScheduleSpec:
    """Check a schedule as a producer, the HTTP API, the CLI or the config gives it. Every problem is an
    InvalidJob naming it."""
    check_name("schedule name", name)
    if (cron is None) == (every is None):
        raise InvalidJob("give cron (a cron expression) or every (a duration), one of them")
    unknown = options.keys() - JOB_OPTIONS
    if unknown:
        raise InvalidJob(f"unknown schedule option(s): {', '.join(sorted(unknown))}")
    zone = timezone or "UTC"
    try:
        _zone(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidJob(f"unknown timezone {zone!r}: use an IANA name like Europe/Berlin") from None
    every_ms = None
    if every is not None:
        every_ms = _ms("every", every)
        if every_ms < 1000:
            raise InvalidJob("every must be at least 1s")
    if cron is not None:
        if not isinstance(cron, str):
            raise InvalidJob("cron must be a cron expression, like */5 * * * *")
        try:
            cron_next_tick(cron, _zone(zone), int(datetime.now(UTC).timestamp() * 1000))
        except Exception as exc:  # cronsim raises its own CronSimError for a bad expression; NoTick
            raise InvalidJob(f"cron {cron!r}: {exc}") from None
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidJob(f"limit must be a positive integer, got {limit!r}")
    if catchup is not None and catchup not in CATCHUP:
        raise InvalidJob(f"catchup must be one of {', '.join(CATCHUP)}, got {catchup!r}")
    if overlap is not None and overlap not in OVERLAP:
        raise InvalidJob(f"overlap must be one of {', '.join(OVERLAP)}, got {overlap!r}")
    window_ms = DEFAULT_CATCHUP_WINDOW_MS if catchup_window is None else _ms("catchup_window", catchup_window)
    if window_ms < 1000:
        raise InvalidJob("catchup_window must be at least 1s")
    start_ms, end_ms = _moment_ms("start", start), _moment_ms("end", end)
    if start_ms is not None and end_ms is not None and end_ms <= start_ms:
        raise InvalidJob("end must be after start")
    spec = ScheduleSpec(
        name=name, type=type, queue=queue or DEFAULT_QUEUE, payload=payload, cron=cron, every_ms=every_ms,
        timezone=zone, start_ms=start_ms, end_ms=end_ms, limit=limit, catchup=catchup or "latest",
        catchup_window_ms=window_ms, overlap=overlap or "allow", options=dict(options),
    )  # fmt: skip
    spec.record(0, max_payload_bytes)  # the job it makes must be valid: type, queue, payload, options
    return spec


def spec_from_json(text: str | bytes) -> ScheduleSpec:
    return ScheduleSpec(**json.loads(text))


# -- what to do with the due ticks --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """One `schedule_fire` call: from the schedule at `expected`, fire `fire_ms` (or none), count `skipped`
    ticks as missed, and move on to `next_ms` (None: no tick left)."""

    expected: int
    fire_ms: int | None
    skipped: int
    next_ms: int | None


def plan(spec: ScheduleSpec, next_ms: int, now_ms: int) -> list[Step]:
    """The steps that take a schedule waiting at `next_ms` past Redis time `now_ms`, by its catch-up policy.

    A tick due more than `catchup_window` ago is missed whatever the policy. Of the others, `all` fires
    every one, oldest first; `latest` fires the newest; `none` fires a tick only when it is the only one
    due (the fleet kept up), so that after a gap nothing of the gap runs."""
    due: list[int] = []
    tick: int | None = next_ms
    while tick is not None and tick <= now_ms and len(due) < MAX_DUE:
        due.append(tick)
        tick = spec.next_tick(tick)
    following = spec.next_tick(now_ms) if tick is not None and tick <= now_ms else tick
    if not due:
        return []
    on_time = [t for t in due if t >= now_ms - spec.catchup_window_ms]
    if spec.catchup == "all":
        fire = on_time[:MAX_FIRES_PER_ROUND]
    elif spec.catchup == "latest":
        fire = on_time[-1:]
    else:
        fire = on_time if len(due) == 1 else []
    if not fire:
        return [Step(next_ms, None, len(due), following)]
    steps = []
    expected, consumed = next_ms, 0  # due[:consumed] are counted in earlier steps
    for n, fire_ms in enumerate(fire):
        index = due.index(fire_ms)
        after: int | None
        if n + 1 < len(fire):
            after, skipped = fire[n + 1], index - consumed
        elif spec.catchup == "all" and len(on_time) > len(fire):
            # `all` stopped at MAX_FIRES_PER_ROUND: the schedule waits at the next due tick for the next round.
            after, skipped = due[index + 1], index - consumed
        else:
            # The last fire also passes over the due ticks after it (`latest`: none are on time but it).
            after, skipped = following, index - consumed + len(due) - index - 1
        steps.append(Step(expected, fire_ms, skipped, after))
        expected, consumed = after or 0, index + 1
    return steps


# -- the schedule's state, as stored -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A schedule as its hash holds it."""

    spec: ScheduleSpec
    origin: str  # "config" or "api"
    next_ms: int | None
    last_ms: int | None
    last_job: str | None
    last_fired_at_ms: int | None
    fires: int
    skipped: int
    paused: bool

    @property
    def finished(self) -> bool:
        """No tick left: past its `end`, or its `limit` reached."""
        return self.next_ms is None

    def document(self) -> dict[str, Any]:
        """The JSON form, the same from `jobcar schedules show --json` and `GET /v1/schedules/{name}`."""
        from jobcar.timestamps import rfc3339_ms

        s = self.spec
        return {
            "name": s.name, "queue": s.queue, "type": s.type, "payload": s.payload, "cron": s.cron,
            "every_seconds": None if s.every_ms is None else s.every_ms / 1000, "timezone": s.timezone,
            "start": rfc3339_ms(s.start_ms), "end": rfc3339_ms(s.end_ms), "limit": s.limit, "catchup": s.catchup,
            "catchup_window_seconds": s.catchup_window_ms / 1000, "overlap": s.overlap, "options": dict(s.options),
            "origin": self.origin, "paused": self.paused, "finished": self.finished,
            "next_tick": rfc3339_ms(self.next_ms), "last_tick": rfc3339_ms(self.last_ms), "last_job": self.last_job,
            "last_fired_at": rfc3339_ms(self.last_fired_at_ms), "fires": self.fires, "skipped": self.skipped,
        }  # fmt: skip


def _opt_int(value: bytes | None) -> int | None:
    return None if value is None or value == b"" else int(value)


def parse_state(fields: Mapping[bytes, bytes]) -> ScheduleState | None:
    """A schedule's hash (HGETALL), or None for an empty one."""
    if not fields.get(b"spec"):
        return None
    return ScheduleState(
        spec=spec_from_json(fields[b"spec"]),
        origin=as_text(fields.get(b"origin", b"api")),
        next_ms=_opt_int(fields.get(b"next")),
        last_ms=_opt_int(fields.get(b"last")),
        last_job=None if fields.get(b"last_job") is None else as_text(fields[b"last_job"]),
        last_fired_at_ms=_opt_int(fields.get(b"last_fired_at")),
        fires=_opt_int(fields.get(b"fires")) or 0,
        skipped=_opt_int(fields.get(b"skipped")) or 0,
        paused=fields.get(b"paused") == b"1",
    )


# -- script calls ----------------------------------------------------------------------------------


def index_key(namespace: str) -> str:
    """The HASH of every schedule's name -> its queue: outside any slot, written outside the scripts."""
    return f"{namespace}:schedules"


def set_call(keys: QueueKeys, spec: ScheduleSpec, origin: str, next_ms: int | None) -> ScriptCall:
    return call("schedule_set", (keys.schedule(spec.name), keys.schedules),
                (keys.prefix, spec.name, spec.to_json(), spec.digest, origin, _opt(next_ms)))  # fmt: skip


def state_call(keys: QueueKeys, name: str, action: str, next_ms: int | None = None) -> ScriptCall:
    """`action`: pause, resume (at `next_ms`) or remove."""
    return call("schedule_state", (keys.schedule(name), keys.schedules), (keys.prefix, name, action, _opt(next_ms)))


def due_call(keys: QueueKeys, limit: int = 100) -> ScriptCall:
    return call("schedules_due", (keys.schedules,), (keys.prefix, limit))


@dataclass(frozen=True, slots=True)
class DueSchedule:
    spec: ScheduleSpec
    next_ms: int


@dataclass(frozen=True, slots=True)
class Due:
    now_ms: int
    #: How long until the earliest tick of a schedule not yet due (None: no schedule waits).
    next_in_ms: int | None
    schedules: list[DueSchedule]
    #: The due schedules whose hash holds another type: (name, key, the type it holds). They cannot fire.
    broken: list[tuple[str, str, str]] = field(default_factory=list)


def parse_due(reply: Reply) -> Due:
    now, next_in, entries, *rest = as_list(reply)
    broken = [tuple(as_text(part) for part in as_list(b)) for r in rest for b in as_list(r)]
    schedules = []
    for entry in as_list(entries):
        spec, next_ms = as_list(entry)
        schedules.append(DueSchedule(spec_from_json(spec), as_int(next_ms)))  # type: ignore[arg-type]
    wait = as_int(next_in)
    return Due(as_int(now), None if wait < 0 else wait, schedules, broken)  # type: ignore[arg-type]


def fire_call(
    keys: QueueKeys, spec: ScheduleSpec, step: Step, max_payload_bytes: int, traceparent: str | None = None
) -> ScriptCall:
    """One step of the schedule (`plan`): the job of its tick, if it fires one, and the schedule moved on.
    `traceparent`: the fire's span (tracing on), which the job carries unless its options give one."""
    args: list[Arg] = [keys.prefix, spec.name, step.expected, step.fire_ms or 0, step.skipped, _opt(step.next_ms),
                       spec.overlap, spec.limit or 0]  # fmt: skip
    if step.fire_ms is not None:
        record = spec.record(step.fire_ms, max_payload_bytes)
        if record.traceparent is None:
            record.traceparent = traceparent
        args += record.args()
    return _fire(keys, spec.name, args)


def trigger_call(keys: QueueKeys, spec: ScheduleSpec, max_payload_bytes: int) -> ScriptCall:
    """One job of the schedule now, its ticks unmoved: the job's `scheduled_at` is the script's Redis time."""
    record = spec.record(0, max_payload_bytes)
    record = dataclasses.replace(record, id=f"{spec.name}@manual-{new_job_id()}")
    return _fire(keys, spec.name, [keys.prefix, spec.name, "", 0, 0, "", "allow", 0, *record.args()])


def _fire(keys: QueueKeys, name: str, args: list[Arg]) -> ScriptCall:
    return call("schedule_fire", (keys.schedule(name), keys.schedules, keys.pending, keys.scheduled, keys.wake), args)


@dataclass(frozen=True, slots=True)
class Fired:
    """What a `schedule_fire` call did: `fired`, `overlap` (skipped: the last run is still going),
    `advanced` (no job to make), `exists` (the tick's job was made already), or, changing nothing, `moved`
    (another daemon took the step), `early` (not due yet by Redis time), `paused`, `missing`."""

    outcome: str
    job_id: str | None
    now_ms: int


def parse_fire(reply: Reply) -> Fired:
    outcome, job_id, now = as_list(reply)
    text = as_text(job_id)
    return Fired(as_text(outcome), text or None, as_int(now))


def _opt(value: int | None) -> Arg:
    return "" if value is None else value
