"""Rows to jobs for the Spark producers: each row's job (type, id, payload and enqueue options from the
write's options or the row's columns), a partition sent through one client in pipelined chunks, the
Redis connection options a Spark write passes to its executors, and the driver's check of Redis.

Shared by `enqueue_dataframe` (spark.py) and the `jobcar` data source (spark_source.py). pyspark is not
imported here: this runs on the executors with the standard library and redis-py (rows are read by name,
as both pyspark's Row and a mapping allow).
"""

from __future__ import annotations

from jobcar import spark_compat  # noqa: F401 -- first: what the modules below use of 3.10 and 3.11, on 3.9

# isort: split

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, Final

import redis

from jobcar import tracing
from jobcar.client import Client
from jobcar.enqueueing import ENQUEUE_CHUNK
from jobcar.errors import InvalidJob
from jobcar.job import EnqueueStatus
from jobcar.keys import DEFAULT_NAMESPACE
from jobcar.names import ID_PATTERN, TYPE_PATTERN, check_name
from jobcar.options import OPTIONS, Kind
from jobcar.records import DEFAULT_MAX_PAYLOAD_BYTES, JobSpec, build_callbacks, build_record
from jobcar.redis_url import shown_url

#: Options the rows' jobs take from elsewhere: the id from its own option (a column, or derived), the
#: batch is one per write.
ROW_RESERVED: Final = frozenset({"job_id"})
#: Redis connection options a Spark write passes to every executor's client, read from text by these.
#: TLS: a `rediss://` URL, with the `ssl_*` options where the defaults (the system's CAs, hostname checked)
#: do not fit.
REDIS_OPTIONS: Final[Mapping[str, Callable[[str], object]]] = {
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": lambda text: _one_of("ssl_cert_reqs", text, ("required", "optional", "none")),
    "ssl_check_hostname": lambda text: _boolean("ssl_check_hostname", text),
    "username": str,
    "password": str,
}
#: A task must never wait forever on a Redis that accepted the connection and never answers (redis-py
#: has no timeout by default): a chunk of 500 jobs takes milliseconds, so a minute is a dead server.
DEFAULT_REDIS_OPTIONS: Final[Mapping[str, object]] = {"socket_timeout": 60.0, "socket_connect_timeout": 10.0}


def _one_of(name: str, text: str, choices: tuple[str, ...]) -> str:
    if text.lower() not in choices:
        raise InvalidJob(f"{name} must be one of {', '.join(choices)}, got {text!r}")
    return text.lower()


def _boolean(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise InvalidJob(f"{name} must be true or false, got {text!r}")
    return lowered == "true"


def redis_options(given: Mapping[str, object]) -> dict[str, object]:
    """The redis-py options for the executors' clients: the defaults, then those given (text is read)."""
    unknown = sorted(given.keys() - REDIS_OPTIONS.keys())
    if unknown:
        raise InvalidJob(f"unknown Redis option(s) {', '.join(unknown)}; known: {', '.join(REDIS_OPTIONS)}")
    options = dict(DEFAULT_REDIS_OPTIONS)
    for name, value in given.items():
        try:
            options[name] = REDIS_OPTIONS[name](value) if isinstance(value, str) else value
        except ValueError:
            raise InvalidJob(f"Redis option {name}: cannot read {value!r}") from None
    return options


@dataclass(frozen=True)
class Connection:
    """Where the jobs go, as every executor connects: pickled into each task."""

    url: str
    namespace: str = DEFAULT_NAMESPACE
    cluster: bool = False
    options: Mapping[str, object] = field(default_factory=lambda: dict(DEFAULT_REDIS_OPTIONS))

    def client(self) -> Client:
        options: dict[str, Any] = dict(self.options)
        return Client.from_url(self.url, namespace=self.namespace, cluster=self.cluster, **options)

    def check(self) -> None:
        """On the driver, before any task starts: Redis answers a PING, else a ConnectionError that says
        where and why, instead of every task failing its retries one after the other."""
        try:
            with self.client() as client:
                client.redis.ping()
        except (redis.RedisError, OSError, ValueError) as exc:
            raise ConnectionError(
                f"jobcar: Redis at {shown_url(self.url)} does not answer from the Spark driver ({exc}); no task "
                "was started. The executors connect to the same URL: check it, the server, and the network."
            ) from exc


# -- option values from text (a write's options) and from columns (a row's values) -----------------------


def _instant(name: str, value: object) -> object:
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        try:
            # 3.9's and 3.10's fromisoformat read no "Z": the executors may be either (spark_compat).
            value = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        except ValueError:
            raise InvalidJob(f"{name}: {text!r} is not RFC 3339 with a zone nor epoch seconds") from None
    if isinstance(value, datetime) and value.tzinfo is None:
        # pyspark hands timestamps over as naive local times (the session's zone on the executor).
        return value.astimezone()
    return value


def _count(name: str, value: object) -> object:
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise InvalidJob(f"{name} must be a whole number, got {value!r}") from None
    return value


def _refs(name: str, value: object) -> object:
    if isinstance(value, str):
        text = value.strip()
        items = _json(name, text) if text.startswith("[") else [text]
        # "[QUEUE/]ID", as the CLI's --after reads it: the first "/" ends the queue's name.
        return [tuple(i.split("/", 1)) if isinstance(i, str) and "/" in i else i for i in items]
    return value


def _strings(name: str, value: object) -> object:
    if isinstance(value, str):
        return _json(name, value)
    to_dict = getattr(value, "asDict", None)  # a struct column arrives as a Row
    return to_dict() if callable(to_dict) else value


def _json(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidJob(f"{name}: not JSON ({exc})") from None


def _duration(name: str, value: object) -> object:
    return value  # numbers, timedeltas (Spark's day-time intervals) and "30s"-like text: build_record reads all


#: How each kind of option is read from a write's text or a column's value; build_record checks the rest.
_READ: Final[Mapping[Kind, Callable[[str, object], object]]] = {
    Kind.DURATION: _duration,
    Kind.INSTANT: _instant,
    Kind.COUNT: _count,
    Kind.TEXT: lambda _, value: value,
    Kind.CHOICE: lambda _, value: value,
    Kind.REFS: _refs,
    Kind.STRINGS: _strings,
}


def read_option(name: str, value: object) -> object:
    """An enqueue option's value from text or a column, by the option's kind (options.OPTIONS)."""
    return _READ[OPTIONS[name].kind](name, value)


#: The types JSON carries as they are: most of a row's values, so they are tried first (a row costs a type
#: lookup per value, not the isinstance chain below: bench/spark_profile.py).
_PLAIN: Final = frozenset({str, int, float, bool, type(None)})


def jsonable(value: Any) -> Any:
    """Spark's values as JSON can carry them: structs (nested Rows) as objects, timestamps and dates as ISO
    8601, decimals as text."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, dict):
        return {k: v if type(v) in _PLAIN else jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "__fields__"):  # a Row: a struct column
        return jsonable(as_dict(value))
    if isinstance(value, (list, tuple)):
        return [v if type(v) in _PLAIN else jsonable(v) for v in value]
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def as_dict(row: Any) -> dict[str, Any]:
    """A row's columns by name, one level: `jsonable` turns nested Rows into objects as it meets them
    (pyspark's `asDict(recursive=True)` walks every value through three Python calls: a third of a flat
    row's cost)."""
    fields = getattr(row, "__fields__", None)
    if fields is not None:
        return dict(zip(fields, row, strict=True))
    return dict(row.asDict()) if hasattr(row, "asDict") else dict(row)


# -- a row's job ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowJobs:
    """How each row becomes a job. The id comes from `id_column`, or (streaming, with `id_prefix`) from the
    micro-batch and the row's content; options are constants (`options`) or columns (`columns`: option name to
    column); the payload is `payload_column`'s value, or the row as JSON without the option columns."""

    type: str | None
    type_column: str | None
    id_column: str | None
    id_prefix: str | None
    payload_column: str | None
    options: Mapping[str, object]
    columns: Mapping[str, str]
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    def check(self, columns: Iterable[str]) -> None:
        """On the driver: the columns named exist, the constant options are valid (one job built), so that
        no task starts with a mistake every row would repeat."""
        have = list(columns)
        named = {"type_column": self.type_column, "id": self.id_column, "payload": self.payload_column}
        named.update({f"{option}_column": column for option, column in self.columns.items()})
        for what, column in named.items():
            if column is not None and column not in have:
                raise InvalidJob(f"{what} names column {column!r}, which is not in the DataFrame: {', '.join(have)}")
        if (self.type is None) == (self.type_column is None):
            raise InvalidJob("give the job type: the option type, or type_column (a column of types)")
        if self.type is not None:
            check_name("job type", self.type, TYPE_PATTERN)
        if (self.id_column is None) == (self.id_prefix is None):
            raise InvalidJob(
                "give the jobs' ids: id, a column of ids (a business key), so that a retried or speculative task "
                "finds its rows' jobs and adds none (on a stream, id_prefix derives them from the micro-batch)"
            )
        if self.id_prefix is not None:
            check_name("id_prefix", self.id_prefix, ID_PATTERN)
        build_record(self.type or "check", None, self.max_payload_bytes, job_id="check", **self.options)  # type: ignore[arg-type]

    def specs(self, rows: Iterable[Any], epoch: str | None = None) -> Iterator[JobSpec]:
        """Each row's (type, payload, options); `epoch` (the micro-batch) for ids derived by `id_prefix`."""
        seen: dict[str, int] = {}
        for row in rows:
            yield self.spec(row, epoch, seen)

    def spec(self, row: Any, epoch: str | None = None, seen: dict[str, int] | None = None) -> JobSpec:
        options = dict(self.options)
        for option, column in self.columns.items():
            value = row[column]
            if value is not None:
                options[option] = read_option(option, value)
        if self.payload_column is not None:
            value = row[self.payload_column]
            body: object = value if isinstance(value, (bytes, bytearray)) else jsonable(value)
        else:
            values = as_dict(row)
            for column in self.columns.values():
                values.pop(column, None)
            if self.type_column is not None:
                values.pop(self.type_column, None)
            body = jsonable(values)
        job_type: str = self.type if self.type is not None else row[self.type_column]
        options["job_id"] = self._id(row, body, epoch, seen if seen is not None else {})
        return (job_type, body, options)

    def _id(self, row: Any, body: object, epoch: str | None, seen: dict[str, int]) -> str:
        if self.id_column is not None:
            key = row[self.id_column]
            if key is None:
                raise InvalidJob(f"row has no {self.id_column} (null), needed as its job id: {row!r}")
            return key if isinstance(key, str) else str(key)
        # <prefix>.<micro-batch>.<digest of the payload>.<n>: a replay of the micro-batch gives its rows the
        # same ids; n tells apart equal rows of one partition (in the order they come).
        blob = body if isinstance(body, (bytes, bytearray)) else json.dumps(body, sort_keys=True, default=str).encode()
        digest = hashlib.sha256(bytes(blob)).hexdigest()[:24]
        seen[digest] = n = seen.get(digest, 0) + 1
        return f"{self.id_prefix}.{epoch}.{digest}.{n}"


@dataclass
class Sent:
    """What one partition's enqueue did, counted by the enqueue's answer."""

    rows: int = 0
    created: int = 0
    existed: int = 0
    duplicate: int = 0
    debounced: int = 0

    def add(self, other: Sent) -> None:
        for name in ("rows", "created", "existed", "duplicate", "debounced"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


_COUNTED: Final = {
    EnqueueStatus.CREATED: "created",
    EnqueueStatus.EXISTS: "existed",
    EnqueueStatus.DUPLICATE: "duplicate",
    EnqueueStatus.DEBOUNCED: "debounced",
}


def send(client: Client, specs: Iterable[JobSpec], chunk: int = ENQUEUE_CHUNK) -> Sent:
    """Enqueue the jobs in chunks of `chunk`, one pipelined round trip each (enqueue_many); where the executor
    traces, inside one producer span for them all (tracing.partition_span)."""
    tracer = tracing.for_producer()
    if tracer is not None:
        return tracing.partition_span(tracer, specs, lambda traced: _send(client, traced, chunk), lambda s: s.rows)
    return _send(client, specs, chunk)


def _send(client: Client, specs: Iterable[JobSpec], chunk: int) -> Sent:
    sent = Sent()
    batch: list[JobSpec] = []
    for spec in specs:
        batch.append(spec)
        if len(batch) == chunk:
            _send_chunk(client, batch, sent)
            batch = []
    if batch:
        _send_chunk(client, batch, sent)
    return sent


def _send_chunk(client: Client, chunk: list[JobSpec], sent: Sent) -> None:
    infos = client.enqueue_many(chunk)
    sent.rows += len(chunk)
    for info in infos:
        name = _COUNTED[info.status]
        setattr(sent, name, getattr(sent, name) + 1)


# -- a batch's callbacks from text ------------------------------------------------------------------------


def callback_spec(name: str, text: str) -> JobSpec:
    """A batch callback from a write's option: JSON {"type": ..., "data": ..., "options": {...}}."""
    value = _json(name, text)
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("type"), str)
        or value.keys() - {"type", "data", "options"}
    ):
        raise InvalidJob(f'{name} must be JSON like {{"type": "report.send", "data": {{...}}, "options": {{...}}}}')
    options = value.get("options") or {}
    if not isinstance(options, dict):
        raise InvalidJob(f"{name}: options must be a JSON object")
    return (value["type"], value.get("data"), options)


def check_callbacks(batch: str | None, queue: str, callbacks: Mapping[str, JobSpec | None]) -> None:
    if any(spec is not None for spec in callbacks.values()):
        if batch is None:
            raise InvalidJob("on_complete and on_success need a batch: give the option batch")
        build_callbacks(batch, queue, callbacks, DEFAULT_MAX_PAYLOAD_BYTES)


def utc(ms: int | None) -> datetime | None:
    """Epoch milliseconds as a UTC datetime (Spark shows it in the session's zone)."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)
