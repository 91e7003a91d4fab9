"""The small text formats of the config file: `${VAR}` interpolation, durations and sizes.

Kept apart from config.py because the CLI (`--delay 10s`) and the enqueue API (`"delay": "10s"`) read
the same durations. Only the standard library is imported. Every function raises ValueError with a
message that reads well after a key path ("lease: invalid duration '3x': ...").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Final

# `$$` first so that `$${A}` is a literal `${A}`; the last alternative catches a `${` that never closes.
_REFERENCE: Final = re.compile(r"\$\$|\$\{(?P<body>[^}]*)\}|\$\{")
_EXPRESSION: Final = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|:\?)(?P<arg>.*))?", re.DOTALL)

_NUMBER: Final = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_PLAIN_NUMBER: Final = re.compile(rf"{_NUMBER}(?:[eE][-+]?[0-9]+)?")
_DURATION_PART: Final = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d)\s*")
_DURATION: Final = re.compile(rf"(?:{_DURATION_PART.pattern})+")
_DURATION_UNITS: Final = {
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
    "d": Fraction(86400),
}
_DURATION_HELP: Final = "use seconds or a number with a unit: 500ms, 30s, 2m, 1h, 1d, or combined like 1h30m"

_SIZE: Final = re.compile(rf"({_NUMBER})\s*([A-Za-z]*)")
# KB is 1000 and KiB 1024 (IEC); units are matched without regard to case, so "kb" and "MIB" work too.
_SIZE_UNITS: Final = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "kib": 2**10,
    "mb": 10**6,
    "mib": 2**20,
    "gb": 10**9,
    "gib": 2**30,
    "tb": 10**12,
    "tib": 2**40,
}
_SIZE_HELP: Final = "use bytes or a number with a unit: 512, 64KiB, 1MiB, 1GiB, 10KB (KB = 1000, KiB = 1024)"


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    """Expand `${VAR}`, `${VAR:-default}` and `${VAR:?message}` in `text` from `environ`; `$$` is a `$`.

    `${VAR}` requires VAR to be set (it may be empty). `${VAR:-default}` gives the default when VAR is
    unset or empty, `${VAR:?message}` fails with the message when it is unset or empty. A `$` not
    followed by `{` or `$` stays as it is. Substituted values are not expanded again. All problems of
    the text are reported together, separated by "; ".
    """
    if "$" not in text:
        return text
    problems: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "$$":
            return "$"
        body = match.group("body")
        if body is None:
            problems.append("unterminated '${' (missing '}'; write $$ for a literal $)")
            return token
        if "${" in body:
            problems.append(f"nested references are not supported: '{token}}}'")
            return ""
        expression = _EXPRESSION.fullmatch(body)
        if expression is None:
            problems.append(f"invalid reference '{token}': use ${{VAR}}, ${{VAR:-default}} or ${{VAR:?message}}")
            return ""
        name, op, arg = expression.group("name", "op", "arg")
        value = environ.get(name)
        if op is None:
            if value is None:
                problems.append(f"environment variable {name} is not set (write ${{{name}:-default}} for a default)")
                return ""
            return value
        if value:
            return value
        if op == ":-":
            return str(arg)
        problems.append(f"environment variable {name} is unset or empty" + (f": {arg}" if arg else ""))
        return ""

    result = _REFERENCE.sub(substitute, text)
    if problems:
        raise ValueError("; ".join(problems))
    return result


def parse_duration(value: str | float) -> float:
    """Seconds from a number of seconds or a string such as `500ms`, `30s`, `2m`, `1h`, `1d`, `1h30m`.

    A bare number in a string ("30", "1.5") is seconds too. Negative, infinite and NaN values are errors.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: {_DURATION_HELP}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"invalid duration {value!r}: must be a finite number of seconds")
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value!r}")
        return float(value)
    text = value.strip()
    negative = text.startswith("-")
    body = text[1:].lstrip() if text[:1] in ("-", "+") else text
    if _PLAIN_NUMBER.fullmatch(body):
        amount = Fraction(body)
    elif _DURATION.fullmatch(body):
        amount = sum(
            (Fraction(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(body)),
            Fraction(0),
        )
    else:
        raise ValueError(f"invalid duration {value!r}: {_DURATION_HELP}")
    if negative and amount:
        raise ValueError(f"duration must not be negative, got {value!r}")
    try:
        return float(amount)
    except OverflowError:
        raise ValueError(f"duration {value!r} is too large") from None


def parse_size(value: str | int) -> int:
    """Bytes from an int or a string such as `512`, `64KiB`, `1MiB`, `1GiB`, `10KB` (KB = 1000, KiB = 1024).

    A fraction is allowed when the result is a whole number of bytes ("1.5KiB" is 1536).
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}: {_SIZE_HELP}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value!r}")
        return value
    text = value.strip()
    negative = text.startswith("-")
    match = _SIZE.fullmatch(text[1:].lstrip() if text[:1] in ("-", "+") else text)
    if match is None or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"invalid size {value!r}: {_SIZE_HELP}")
    amount = Fraction(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if negative and amount:
        raise ValueError(f"size must not be negative, got {value!r}")
    if amount.denominator != 1:
        raise ValueError(f"size {value!r} is not a whole number of bytes")
    return int(amount)
