"""The enqueue options, defined once.

`EnqueueOptions` is what `Client.enqueue` takes as keyword arguments: mypy and editors check and complete
them. Each field carries, in its `Annotated` metadata, what the option is (an `Option`): its kind of value,
where a job keeps it, its CLI flag, whether schedules accept it. `OPTIONS` reads that metadata once, and
everything else that lists options derives from it: the record builder's type checks (records.py), the HTTP
API's fields (api.py), the CLI's flags (cli_options.py), the schedules' options (schedules.py, the config
loader, the schedule API and CLI); tests hold config/schema.json, the docs' tables and the enqueue script's
field table (lua/includes/store_jobs.lua) against it.

Adding an option: a field here, its rule in records.build_record when it has one beyond its kind, the Lua
that enforces it, its docs and its tests.

Standard library only: producers (a Spark executor with jobcar as a zip) import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Final, Literal, Protocol, TypedDict, Union, get_type_hints

from jobcar.dependencies import ON_DEPENDENCY_FAILURE
from jobcar.keys import MAX_PRIORITY

# Duration, Instant and JobRef are spelled with Union: _read_options evaluates them, which `X | Y` between
# types cannot do on a Python 3.9 Spark executor (spark_compat).
#: Seconds as a number or a timedelta, or text like "30s" or "1h30m".
Duration = Union[float, timedelta, str]  # noqa: UP007
#: A timezone-aware datetime, or seconds since the epoch.
Instant = Union[datetime, float]  # noqa: UP007


class Enqueued(Protocol):
    """What enqueue returned (a JobInfo), or a Job: anything with an id and a queue."""

    @property
    def id(self) -> str: ...
    @property
    def queue(self) -> str: ...


#: A job that another waits for: its id (in the same queue), a (queue, id) pair, or what enqueue returned.
JobRef = Union[str, tuple[str, str], Enqueued]  # noqa: UP007

UNIQUE_MODES: Final = ("until_done", "window")


class Kind(StrEnum):
    """What an option's value is: the HTTP API, the CLI and the config read text into it by kind."""

    DURATION = "duration"
    INSTANT = "instant"
    COUNT = "count"  # a whole number from `minimum` to `maximum`
    TEXT = "text"
    CHOICE = "choice"  # one of `choices`
    REFS = "refs"  # a list of job references
    STRINGS = "strings"  # a mapping of text to text


@dataclass(frozen=True, slots=True)
class Option:
    """What one enqueue option is, beside its Python type."""

    kind: Kind
    #: One line for `--help` and the schema.
    help: str
    #: The CLI flag; "" for an option the CLI does not offer (set where a flag makes no sense).
    flag: str = "-"  # "-": the option's name with dashes (`--max-attempts`)
    short: str | None = None
    metavar: str | None = None
    #: The field of POST /v1/jobs, when not the option's name.
    api_name: str | None = None
    #: Schedules accept it: each tick's job carries it.
    schedule: bool = False
    #: For the CLI: options of one group exclude each other.
    exclusive: str | None = None
    #: The optional field of the enqueue script's record that carries it (store_jobs.lua), if any: the
    #: record's fixed positions carry the others, or they only shape other fields.
    field: str | None = None
    #: A count's range, or a duration's least milliseconds (1: it must be positive).
    minimum: int = 0
    maximum: int | None = None
    #: How a count's range is said in an error, where the range alone says too little.
    range_text: str | None = None
    choices: tuple[str, ...] = ()


class EnqueueOptions(TypedDict, total=False):
    """The keyword options of `Client.enqueue` (and of each item of `enqueue_many`), all optional."""

    queue: Annotated[str, Option(Kind.TEXT, "the queue (default: default)", short="-q", metavar="Q")]
    delay: Annotated[
        Duration, Option(Kind.DURATION, "run after this long, like 10s or 1h30m", metavar="DURATION", exclusive="when")
    ]
    run_at: Annotated[
        Instant,
        Option(Kind.INSTANT, "run at this time (RFC 3339 with zone, or epoch s)", flag="--at", metavar="TIME",
               exclusive="when"),
    ]  # fmt: skip
    max_attempts: Annotated[
        int,
        Option(Kind.COUNT, "attempts before the DLQ", metavar="N", schedule=True, field="max_attempts", minimum=1),
    ]
    unique_for: Annotated[
        Duration,
        Option(Kind.DURATION, "enqueue nothing while an equal job is held this long", metavar="DURATION", minimum=1),
    ]
    unique_key: Annotated[str, Option(Kind.TEXT, "the uniqueness key (default: type + payload hash)", metavar="K")]
    unique_mode: Annotated[
        Literal["until_done", "window"],
        Option(Kind.CHOICE, "until_done (default): the key is free when the job ends; window: held for all of "
               "--unique-for", field="unique_mode", choices=UNIQUE_MODES),
    ]  # fmt: skip
    job_id: Annotated[
        str, Option(Kind.TEXT, "the job id; an existing id enqueues nothing", flag="--id", metavar="ID", api_name="id")
    ]
    timeout: Annotated[
        Duration,
        Option(
            Kind.DURATION,
            "the handler's timeout for this job",
            metavar="DURATION",
            schedule=True,
            field="timeout",
            minimum=1,
        ),
    ]
    backoff: Annotated[
        Duration,
        Option(Kind.DURATION, "the first retry's delay, in place of the handler's backoff base (its strategy and "
               "max still apply)", metavar="DURATION", schedule=True, field="backoff", minimum=1),
    ]  # fmt: skip
    content_type: Annotated[
        str,
        Option(Kind.TEXT, "send the payload bytes as they are, with this Content-Type", metavar="T",
               field="content_type"),
    ]  # fmt: skip
    traceparent: Annotated[str, Option(Kind.TEXT, "a W3C trace context", flag="", field="traceparent")]
    meta: Annotated[Mapping[str, str], Option(Kind.STRINGS, "text metadata", flag="", schedule=True, field="meta")]
    batch: Annotated[str, Option(Kind.TEXT, "the batch the job belongs to", flag="", field="batch")]
    priority: Annotated[
        int,
        Option(Kind.COUNT, "0 (default) runs first, 9 last, within the queue", metavar="0-9", schedule=True,
               field="priority", maximum=MAX_PRIORITY,
               range_text=f"a whole number from 0 (first, the default) to {MAX_PRIORITY}"),
    ]  # fmt: skip
    expires_in: Annotated[
        Duration,
        Option(Kind.DURATION, "never run unless started by then", metavar="DURATION", schedule=True,
               exclusive="expiry", field="expires_in", minimum=1),
    ]  # fmt: skip
    expires_at: Annotated[
        Instant,
        Option(Kind.INSTANT, "never run unless started by this time", metavar="TIME", exclusive="expiry",
               field="expires_at"),
    ]  # fmt: skip
    debounce: Annotated[
        Duration,
        Option(Kind.DURATION, "wait this quiet period; an enqueue meanwhile replaces the payload and waits again",
               metavar="DURATION", field="debounce_ms", minimum=1),
    ]  # fmt: skip
    debounce_key: Annotated[
        str, Option(Kind.TEXT, "the debounced stream (default: the job type)", metavar="K", field="debounce_key")
    ]
    debounce_max_wait: Annotated[
        Duration,
        Option(
            Kind.DURATION,
            "run by then however many enqueues come",
            metavar="DURATION",
            field="debounce_max_ms",
            minimum=1,
        ),
    ]
    key: Annotated[
        str, Option(Kind.TEXT, "the job's key for its type's per-key limits (a tenant, ...)", metavar="K", field="key")
    ]
    after: Annotated[
        Iterable[JobRef],
        Option(Kind.REFS, "wait until this job is done (repeatable); an id in another queue, or holding '/', with "
               "its queue", metavar="[QUEUE/]ID", field="after"),
    ]  # fmt: skip
    on_dependency_failure: Annotated[
        Literal["fail", "run", "cancel"],
        Option(Kind.CHOICE, "when a job of --after dies or is canceled: fail (default, to the dead-letter queue), "
               "run, cancel", field="on_dependency_failure", choices=ON_DEPENDENCY_FAILURE),
    ]  # fmt: skip
    keep_for: Annotated[
        Duration,
        Option(Kind.DURATION, "keep the job's id (and result) this long after it ends, whatever the daemon's "
               "result_ttl: an enqueue of the same id meanwhile answers exists", metavar="DURATION",
               field="keep_for", minimum=1),
    ]  # fmt: skip


def _read_options() -> dict[str, Option]:
    hints = get_type_hints(EnqueueOptions, include_extras=True)
    return {name: next(m for m in hint.__metadata__ if isinstance(m, Option)) for name, hint in hints.items()}


#: Every enqueue option by name, in the order of EnqueueOptions.
OPTIONS: Final[Mapping[str, Option]] = _read_options()
#: The options a schedule may give each of its jobs.
SCHEDULE_OPTIONS: Final = tuple(name for name, option in OPTIONS.items() if option.schedule)


def api_name(name: str) -> str:
    """The field of POST /v1/jobs that carries option `name`."""
    return OPTIONS[name].api_name or name


def flag(name: str) -> str | None:
    """The CLI flag of option `name`, or None where the CLI offers none."""
    given = OPTIONS[name].flag
    if given == "-":
        return "--" + name.replace("_", "-")
    return given or None
