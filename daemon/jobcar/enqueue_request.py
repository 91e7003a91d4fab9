"""What a POST /v1/jobs body asks for (a job, or {"jobs": [...]}): its jobs as the enqueue specs
AsyncClient.enqueue_many takes, every field read and checked by the one table of enqueue options (options.py).
The HTTP API and the handler API's children read their bodies here.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
from datetime import datetime
from typing import Any, Final, TypeAlias

from aiohttp import web

from jobcar.api_fields import duration_field, reject_unknown
from jobcar.errors import InvalidJob
from jobcar.formats import loads_strict
from jobcar.job import DEFAULT_CONTENT_TYPE
from jobcar.options import OPTIONS, Kind, api_name
from jobcar.records import Payload

#: Jobs per POST /v1/jobs batch; more is a 413.
MAX_BATCH_JOBS: Final = 1000

#: Request field -> the enqueue option it carries ("id" is job_id). Durations and instants are read from their JSON
#: text here; the client validates every value.
_OPTION_FIELDS: Final = {api_name(name): name for name in OPTIONS if name != "content_type"}
JOB_FIELDS: Final = frozenset({"type", "payload", "payload_base64", "content_type", *_OPTION_FIELDS})
# The content type becomes a header of the handler's request: printable ASCII only.
_CONTENT_TYPE: Final = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,199}")

#: One job of a request: (type, payload, enqueue options), as AsyncClient.enqueue takes them.
RequestedJob: TypeAlias = tuple[str, Payload, dict[str, Any]]


def parse_enqueue_request(body: bytes) -> tuple[list[RequestedJob], bool]:
    """The jobs a POST /v1/jobs body asks for, as enqueue_many specs, and whether it was a batch."""
    try:
        document = loads_strict(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise InvalidJob(f"request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidJob('request body must be a JSON object: a job, or {"jobs": [...]}')
    if "jobs" not in document:
        return [job_spec(document)], False
    reject_unknown(document, frozenset({"jobs"}))
    items = document["jobs"]
    if not isinstance(items, list):
        raise InvalidJob("jobs must be a list of jobs")
    if len(items) > MAX_BATCH_JOBS:
        text = f"a batch holds at most {MAX_BATCH_JOBS} jobs, got {len(items)}"
        raise web.HTTPRequestEntityTooLarge(MAX_BATCH_JOBS, len(items), text=text)
    specs = []
    for n, item in enumerate(items):
        try:
            specs.append(job_spec(item))
        except InvalidJob as exc:
            raise InvalidJob(f"job #{n}: {exc}") from None
    return specs, True


def job_spec(item: object) -> RequestedJob:
    """One job of a request as (type, payload, options) for enqueue_many, which validates the rest."""
    if not isinstance(item, dict):
        raise InvalidJob("a job must be a JSON object")
    reject_unknown(item, JOB_FIELDS)
    if not isinstance(item.get("type"), str):
        raise InvalidJob("type is required: the job type, a string")
    options: dict[str, Any] = {}
    for field, name in _OPTION_FIELDS.items():
        value = item.get(field)
        if value is None:
            continue
        kind = OPTIONS[name].kind
        if kind is Kind.DURATION:
            options[name] = duration_field(field, value)
        elif kind is Kind.INSTANT:
            options[name] = _moment(field, value)
        elif isinstance(value, bool):  # true would pass for max_attempts or priority 1
            raise InvalidJob(f"{field} must not be true or false")
        else:
            options[name] = value
    content_type = item.get("content_type")
    if content_type is not None and (not isinstance(content_type, str) or not _CONTENT_TYPE.fullmatch(content_type)):
        raise InvalidJob("content_type must be a media type in printable ASCII, like application/octet-stream")
    encoded = item.get("payload_base64")
    if encoded is None:
        if content_type not in (None, DEFAULT_CONTENT_TYPE):
            raise InvalidJob(f"content_type {content_type} needs payload_base64 (a payload is stored as JSON)")
        return item["type"], item.get("payload"), options  # the client encodes it as JSON
    if "payload" in item:
        raise InvalidJob("give payload or payload_base64, not both")
    try:
        payload = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise InvalidJob("payload_base64 is not a base64 string") from None
    return item["type"], payload, {**options, "content_type": content_type}


def _moment(name: str, value: object) -> datetime | float:
    """Epoch seconds (the client checks the range) or a timezone-aware datetime from RFC 3339 text."""
    with contextlib.suppress(ValueError, OverflowError):  # float(10**400) overflows
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
        if when is not None and when.tzinfo is not None:
            return when
    raise InvalidJob(f"{name} must be epoch seconds or an RFC 3339 time with an offset, like 2026-01-02T03:04:05Z")
