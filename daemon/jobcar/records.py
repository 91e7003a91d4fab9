"""A job as the producer gives it, checked and encoded for the enqueue script: the options, the payload
(JSON or raw bytes), the job id. Every problem is an InvalidJob naming it, raised before anything is sent.

Standard library only: producers (a Spark executor with jobcar as a zip) build records here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final, Literal, TypeAlias, Unpack

from jobcar.dependencies import BATCH_REF_PREFIX, after_refs, on_dependency_failure
from jobcar.enqueueing import EnqueueRecord
from jobcar.errors import InvalidJob, PayloadTooLarge
from jobcar.job import DEFAULT_CONTENT_TYPE
from jobcar.keys import DEFAULT_QUEUE
from jobcar.names import ID_PATTERN, TYPE_PATTERN, check_name
from jobcar.options import OPTIONS, UNIQUE_MODES, EnqueueOptions, Kind, Option
from jobcar.units import parse_duration

#: A payload is either a JSON-serialisable value (sent as application/json) or raw bytes.
Payload: TypeAlias = Any
Seconds: TypeAlias = "float | timedelta"
#: An item of enqueue_many: (type, payload) or (type, payload, {option: value, ...}).
JobSpec: TypeAlias = "tuple[str, Payload] | tuple[str, Payload, Mapping[str, Any]]"

DEFAULT_MAX_PAYLOAD_BYTES: Final = 1024 * 1024
RAW_CONTENT_TYPE: Final = "application/octet-stream"

TRACEPARENT_PATTERN: Final = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_META_BYTES: Final = 4096

#: A job's key for its type's per-key limits (`key=`): a tenant, an account, a host.
MAX_LIMIT_KEY: Final = 200
LIMIT_KEY_PATTERN: Final = re.compile(rf"[^\x00-\x1f\x7f]{{1,{MAX_LIMIT_KEY}}}")


def _unserialisable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json_encoder() -> Callable[[object], str]:
    """Compact JSON, no NaN or infinity, non-ASCII kept. The C encoder called directly: what
    `JSONEncoder.encode` does on top (a new C encoder per call, a circular-reference table) costs as much
    as the encoding itself for a typical payload, paid per job by enqueue_many (ADR 0006).
    Without the table a circular payload ends in RecursionError, which encode_payload reports."""
    make_encoder: Callable[..., Callable[[object, int], list[str]]] | None
    make_encoder = getattr(json.encoder, "c_make_encoder", None)  # not in typeshed
    if make_encoder is None:  # an interpreter without the C accelerator
        return json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
    # markers, default, string encoder, indent, separators, sort_keys, skipkeys, allow_nan
    iterencode = make_encoder(None, _unserialisable, json.encoder.encode_basestring, None, ":", ",", False, False,
                              False)  # fmt: skip
    return lambda value: "".join(iterencode(value, 0))


_json_encode = _json_encoder()


#: Job ids are drawn this many at a time: one urandom call and one base64 pass instead of one each per id
#: (enqueue_many pays it per job: ADR 0006).
IDS_PER_DRAW: Final = 64
_ID_BYTES: Final = 15  # 120 random bits: 20 URL-safe base64 characters, no padding
_spare_ids: deque[str] = deque()
# A forked child (a Spark Python worker, a multiprocessing pool) must not hand out its parent's spare ids.
os.register_at_fork(after_in_child=_spare_ids.clear)


def new_job_id() -> str:
    """120 random bits as 20 URL-safe base64 characters: short (an id is stored several times per job).
    Never starting with "-", which a command line would take for an option (`jobcar cancel ID`).
    Thread-safe: deque's popleft and extend are atomic."""
    while True:
        try:
            job_id = _spare_ids.popleft()
        except IndexError:
            # base64 turns every 3 bytes into 4 characters on its own, so the text of 64 draws of 15
            # bytes is the 64 ids back to back.
            text = base64.urlsafe_b64encode(os.urandom(_ID_BYTES * IDS_PER_DRAW)).decode("ascii")
            _spare_ids.extend([text[i : i + 20] for i in range(0, len(text), 20)])
            continue
        if job_id[0] != "-":
            return job_id


#: Longer than anyone delays a job; beyond it a number is a mistake (milliseconds given as seconds, say).
MAX_SECONDS: Final = 100 * 365 * 86400.0
#: The last second of year 9999, the largest run-at an RFC 3339 time can name.
MAX_EPOCH_SECONDS: Final = 253_402_300_799.0


def _seconds(what: str, value: object, maximum: float = MAX_SECONDS, *, text: bool = True) -> float:
    """Seconds from a number, a timedelta or (with `text`) a duration like "30s" or "1h30m", as the CLI
    and the HTTP API take them."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if text and isinstance(value, str):
        try:
            value = parse_duration(value)
        except ValueError as exc:
            raise InvalidJob(f"{what}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kinds = 'seconds (a number), a duration like "30s" or a timedelta' if text else "seconds (a number)"
        raise InvalidJob(f"{what} must be {kinds}, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or value > maximum:
        raise InvalidJob(f"{what} must be a finite number of seconds from 0 to {maximum:.0f}, got {value}")
    return float(value)


def _epoch_ms(value: object, what: str = "run_at") -> int:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidJob(f"{what} must be a timezone-aware datetime (or epoch seconds)")
        return int(value.timestamp() * 1000)
    return int(_seconds(what, value, MAX_EPOCH_SECONDS, text=False) * 1000)


def _count(name: str, option: Option, value: object) -> int:
    top = option.maximum
    if isinstance(value, bool) or not isinstance(value, int) or value < option.minimum or (top and value > top):
        expected = option.range_text or (f"a whole number from {option.minimum} to {top}" if top else
                                         "a positive integer" if option.minimum == 1 else "a whole number")  # fmt: skip
        raise InvalidJob(f"{name} must be {expected}, got {value!r}")
    return value


def _duration_ms(name: str, option: Option, value: object) -> int:
    ms = round(_seconds(name, value) * 1000)  # round: 1.001 s is 1000.9999... ms as a float
    if ms < option.minimum:
        raise InvalidJob(f"{name} must be positive")
    return ms


def _choice(name: str, option: Option, value: object) -> str:
    if value not in option.choices:
        raise InvalidJob(f"{name} must be one of {', '.join(option.choices)}, got {value!r}")
    return str(value)


#: Each kind's check: a duration becomes milliseconds, an instant epoch milliseconds. Text, references
#: and mappings are checked by build_record's rules, which know what each one names.
_CHECKS: Final[Mapping[Kind, Callable[[str, Option, Any], Any]]] = {
    Kind.DURATION: _duration_ms,
    Kind.INSTANT: lambda name, _, value: _epoch_ms(value, name),
    Kind.COUNT: _count,
    Kind.CHOICE: _choice,
}


def checked(options: Mapping[str, object]) -> dict[str, Any]:
    """The options given (None counts as not given), each checked for its kind: durations in ms, instants
    in epoch ms. Every problem is an InvalidJob."""
    unknown = options.keys() - OPTIONS.keys()
    if unknown:
        raise InvalidJob(f"unknown enqueue option(s): {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for name, value in options.items():
        if value is not None:
            option = OPTIONS[name]
            check = _CHECKS.get(option.kind)
            values[name] = value if check is None else check(name, option, value)
    return values


def _expiry(values: Mapping[str, Any], delay_ms: int) -> tuple[int | None, int | None]:
    """(expires_at_ms, expires_in_ms) from the options `expires_at` and `expires_in`, at most one given."""
    expires_in_ms, expires_at_ms = values.get("expires_in"), values.get("expires_at")
    if expires_in_ms is not None and expires_at_ms is not None:
        raise InvalidJob("give expires_in or expires_at, not both")
    if expires_in_ms is not None and delay_ms and expires_in_ms <= delay_ms:
        raise InvalidJob("expires_in must be longer than delay: the job would expire before it may run")
    return expires_at_ms, expires_in_ms


def _debounce(values: Mapping[str, Any], job_type: str) -> tuple[str | None, int | None, int | None]:
    """(key, period ms, max wait ms) from the options `debounce`, `debounce_key` and `debounce_max_wait`."""
    period_ms, key, max_wait_ms = values.get("debounce"), values.get("debounce_key"), values.get("debounce_max_wait")
    if period_ms is None:
        if key is not None or max_wait_ms is not None:
            raise InvalidJob("debounce_key and debounce_max_wait need debounce (the quiet period)")
        return None, None, None
    for clash in ("delay", "run_at", "unique_for"):
        if values.get(clash) is not None:
            raise InvalidJob(f"debounce sets when the job runs and which job it is: give it without {clash}")
    if max_wait_ms is not None and max_wait_ms < period_ms:
        raise InvalidJob("debounce_max_wait must be at least debounce")
    # Without a key every job of the type in the queue is one stream: the common case (refresh a cache).
    return check_name("debounce_key", key or job_type, ID_PATTERN), period_ms, max_wait_ms


def encode_payload(payload: Payload, content_type: str | None, max_bytes: int) -> tuple[bytes, str | None]:
    """Bytes go as they are; anything else is encoded as JSON. Returns (body, content type to store),
    where None stands for the default, application/json."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        body = bytes(payload)
        ctype = content_type or RAW_CONTENT_TYPE
    else:
        if content_type not in (None, DEFAULT_CONTENT_TYPE):
            raise InvalidJob(f"content_type {content_type!r} needs a bytes payload; other values are sent as JSON")
        try:
            body = _json_encode(payload).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None
        except RecursionError:
            raise InvalidJob("payload is not JSON-serialisable: it refers to itself or nests too deeply") from None
        ctype = DEFAULT_CONTENT_TYPE
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"payload is {len(body)} bytes, over the limit of {max_bytes} bytes")
    return body, None if ctype == DEFAULT_CONTENT_TYPE else ctype


def build_record(
    job_type: str, payload: Payload, max_payload_bytes: int, **options: Unpack[EnqueueOptions]
) -> EnqueueRecord:
    """Validate one job and encode it for the enqueue script. Every problem is an InvalidJob."""
    check_name("job type", job_type, TYPE_PATTERN)
    if not options:
        # The common case of enqueue_many, kept cheap: every option at its default (EnqueueRecord's).
        body, content_type = encode_payload(payload, None, max_payload_bytes)
        return EnqueueRecord(new_job_id(), DEFAULT_QUEUE, job_type, body, content_type=content_type)
    values = checked(options)
    queue = check_name("queue name", values.get("queue") or DEFAULT_QUEUE)
    body, content_type = encode_payload(payload, values.get("content_type"), max_payload_bytes)

    if "delay" in values and "run_at" in values:
        raise InvalidJob("give delay or run_at, not both")
    delay_ms, run_at_ms = values.get("delay", 0), values.get("run_at", 0)

    job_id = values.get("job_id")
    job_id = new_job_id() if job_id is None else check_name("job_id", job_id, ID_PATTERN)
    if job_id.startswith(BATCH_REF_PREFIX):
        raise InvalidJob(f"a job id may not start with {BATCH_REF_PREFIX!r}: that names a batch its callbacks wait for")

    unique_key, unique_ttl_ms = values.get("unique_key"), values.get("unique_for", 0)
    unique_mode = values.get("unique_mode")
    if unique_mode is not None and not unique_ttl_ms:
        raise InvalidJob(f"unique_mode must be one of {', '.join(UNIQUE_MODES)}, with unique_for; got {unique_mode!r}")
    if unique_key is not None and not unique_ttl_ms:
        raise InvalidJob("unique_key needs unique_for: the lock's lifetime, so a crash never leaves it forever")
    if unique_ttl_ms:
        if unique_key is None:
            # Same type and payload in the same queue = the same job.
            unique_key = f"{job_type}:{hashlib.sha256(body).hexdigest()[:32]}"
        else:
            check_name("unique_key", unique_key, ID_PATTERN)

    traceparent = values.get("traceparent")
    if traceparent is not None and not TRACEPARENT_PATTERN.fullmatch(str(traceparent)):
        raise InvalidJob(f"traceparent {traceparent!r} is not a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)")
    meta = values.get("meta") or {}
    if meta:
        if not isinstance(meta, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise InvalidJob("meta must be a mapping of strings to strings")
        if len(_json_encode(dict(meta))) > MAX_META_BYTES:
            raise InvalidJob(f"meta is over {MAX_META_BYTES} bytes")
    batch = values.get("batch")
    if batch is not None:
        check_name("batch id", batch, ID_PATTERN)
    expires_at_ms, expires_in_ms = _expiry(values, delay_ms)
    debounce_key, debounce_ms, debounce_max_ms = _debounce(values, job_type)
    key = values.get("key")
    if key is not None and not (isinstance(key, str) and LIMIT_KEY_PATTERN.fullmatch(key)):
        raise InvalidJob(f"key must be 1 to {MAX_LIMIT_KEY} characters without control characters, got {key!r}")

    after = () if values.get("after") is None else after_refs(values["after"], queue)
    if after and (delay_ms or run_at_ms or debounce_key):
        raise InvalidJob("a job with after runs once the jobs it waits for are done: no delay, run_at or debounce")
    failure_policy = on_dependency_failure(values.get("on_dependency_failure"))
    if failure_policy and not after:
        raise InvalidJob("on_dependency_failure needs after: the jobs to wait for")

    return EnqueueRecord(
        id=job_id,
        queue=queue,
        type=job_type,
        payload=body,
        content_type=content_type,
        run_at_ms=run_at_ms,
        delay_ms=delay_ms,
        unique_key=unique_key,
        unique_ttl_ms=unique_ttl_ms,
        max_attempts=values.get("max_attempts"),
        timeout_ms=values.get("timeout"),
        backoff_ms=values.get("backoff"),
        traceparent=traceparent,
        meta=meta,
        batch=batch,
        priority=values.get("priority", 0),
        expires_at_ms=expires_at_ms,
        expires_in_ms=expires_in_ms,
        unique_window=unique_mode == "window",
        keep_for_ms=values.get("keep_for"),
        debounce_key=debounce_key,
        debounce_ms=debounce_ms,
        debounce_max_ms=debounce_max_ms,
        key=key,
        after=after,
        on_dependency_failure=failure_policy,
    )


def build_records(specs: Iterable[JobSpec], max_payload_bytes: int) -> list[EnqueueRecord]:
    records = []
    for n, spec in enumerate(specs):
        if not isinstance(spec, tuple) or len(spec) not in (2, 3):
            raise InvalidJob(f"job #{n}: expected (type, payload) or (type, payload, options), got {spec!r}")
        options = spec[2] if len(spec) == 3 else {}
        try:
            records.append(build_record(spec[0], spec[1], max_payload_bytes, **options))
        except InvalidJob as exc:
            raise type(exc)(f"job #{n}: {exc}") from None
    return records


#: A batch's callbacks and what each does when a job of the batch did not end done (ADR 0016): on_complete
#: runs whatever the outcome, on_success is canceled.
CALLBACK_POLICIES: Final[Mapping[str, Literal["run", "cancel"]]] = {"on_complete": "run", "on_success": "cancel"}
#: Options a callback may not set: it waits for its batch, and its payload gets the counts around it.
CALLBACK_RESERVED: Final = frozenset({"after", "on_dependency_failure", "delay", "run_at", "debounce"})


def build_callbacks(
    batch_id: str, queue: str, callbacks: Mapping[str, JobSpec | None], max_payload_bytes: int
) -> list[EnqueueRecord]:
    """The callback jobs of a batch (`on_complete`, `on_success`: each a (type, data) or (type, data,
    options) like an item of enqueue_many), waiting for the batch. Their job id is "<batch>.<kind>" unless
    the options give one, so that sealing the batch again stores none twice."""
    check_name("batch id", batch_id, ID_PATTERN)
    check_name("queue name", queue)
    records = []
    for kind, spec in callbacks.items():
        if spec is None:
            continue
        if kind not in CALLBACK_POLICIES:
            raise InvalidJob(f"a batch's callbacks are {', '.join(CALLBACK_POLICIES)}, not {kind}")
        if not isinstance(spec, tuple) or len(spec) not in (2, 3):
            raise InvalidJob(f"{kind}: expected (type, data) or (type, data, options), got {spec!r}")
        options = dict(spec[2]) if len(spec) == 3 else {}
        if isinstance(spec[1], (bytes, bytearray, memoryview)) or options.get("content_type") is not None:
            raise InvalidJob(f"{kind}: its data must be JSON: the job gets it with the batch's counts around it")
        clash = sorted(CALLBACK_RESERVED & set(options))
        if clash:
            raise InvalidJob(f"{kind}: a callback runs when its batch has ended, so it takes no {', '.join(clash)}")
        options = {"queue": queue, "job_id": f"{batch_id}.{kind}", **options}
        waits: EnqueueOptions = {"after": [(queue, BATCH_REF_PREFIX + batch_id)]}
        waits["on_dependency_failure"] = CALLBACK_POLICIES[kind]
        try:
            records.append(build_record(spec[0], spec[1], max_payload_bytes, **options, **waits))
        except InvalidJob as exc:
            raise type(exc)(f"{kind}: {exc}") from None
    return records
