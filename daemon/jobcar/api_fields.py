"""How the daemon's HTTP routes read a request's fields and say what is wrong with them: one wording for the
enqueue API, the handler API and the rest. A bad field is an `InvalidJob`, which the listener answers 400."""

from __future__ import annotations

from collections.abc import Mapping, Set

from jobcar.errors import InvalidJob
from jobcar.units import parse_duration


def reject_unknown(document: Mapping[str, object], known: Set[str]) -> None:
    unknown = sorted(set(document) - known)
    if unknown:
        raise InvalidJob(f"unknown field(s): {', '.join(unknown)}")


def duration_field(name: str, value: object) -> float:
    """Seconds from a field given as a number of seconds or a duration string (`30s`, `5m`, `1h30m`)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidJob(f"{name} must be a duration: seconds, or a string like 10s, 5m, 1h")
    try:
        return parse_duration(value)
    except (ValueError, OverflowError) as exc:
        raise InvalidJob(f"{name}: {exc}") from None
