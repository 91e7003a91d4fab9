"""What the producer's modules use of Python 3.10 and 3.11, backfilled on an older Spark executor (3.9 or 3.10).

jobcar itself needs Python 3.11, but many Spark platforms run their executors on 3.9 or 3.10. The producer's
modules (client, producer, records, options, job, ...) are written so that nothing of 3.10's language runs on
the executors: no `X | Y` between types outside annotations (every module has `from __future__ import
annotations`, and the few unions evaluated at run time are spelled `Union`), no `match`. What they use of the
newer standard library is added here where it is missing, and nothing else:

- 3.11's names `datetime.UTC`, `enum.StrEnum` and `typing.Unpack`;
- 3.10's names `typing.TypeAlias` and `itertools.pairwise`;
- 3.10's keyword arguments `zip(strict=True)` and `dataclass(slots=True)`: on 3.9, `builtins.zip` and
  `dataclasses.dataclass` become wrappers that accept them (strict is checked; slots is left out, which only
  costs memory) and otherwise call the originals, so every call that worked before behaves as before.

`import jobcar.spark` (which imports this first) then `jobcar.client` work on 3.9 and 3.10. On 3.11 and later
this changes nothing. Python 3.8 is refused with a clear error.

Standard library only: it runs on the executors before anything else of jobcar.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime
import enum
import itertools
import sys
import typing
from collections.abc import Iterable, Iterator
from typing import Any, Final

#: The oldest Python whose executors can run the producer part (with the backfills below).
OLDEST_EXECUTOR_PYTHON: Final = (3, 9)


class _StrEnum(str, enum.Enum):  # noqa: UP042 -- it stands in for enum.StrEnum, missing here
    """3.11's enum.StrEnum as far as jobcar uses it: members are str, and str() or format() give the value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return str(self.value).__format__(spec)


class _Unpack:
    """typing.Unpack, for `**options: Unpack[EnqueueOptions]`: only subscripted, in annotations never evaluated
    at run time (every jobcar module has `from __future__ import annotations`)."""

    def __class_getitem__(cls, item: Any) -> Any:
        return item


#: The interpreter's own zip and dataclass, which the 3.9 wrappers below call.
_zip: Final = builtins.zip
_dataclass: Final = dataclasses.dataclass


def _pairwise(iterable: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """3.10's itertools.pairwise: (a, b), (b, c), ..."""
    first, second = itertools.tee(iterable)
    next(second, None)
    return _zip(first, second)


def _strict_zip(iterables: tuple[Iterable[Any], ...]) -> Iterator[tuple[Any, ...]]:
    ended = object()
    for items in itertools.zip_longest(*iterables, fillvalue=ended):
        if any(item is ended for item in items):
            raise ValueError("zip() arguments differ in length (strict=True)")
        yield items


def _zip_taking_strict(*iterables: Iterable[Any], strict: bool = False) -> Iterator[tuple[Any, ...]]:
    """3.9's zip, taking 3.10's `strict`: with strict=True, a ValueError when the iterables differ in length."""
    return _strict_zip(iterables) if strict else _zip(*iterables)


def _dataclass_taking_slots(cls: Any = None, /, *, slots: bool = False, **options: Any) -> Any:
    """3.9's dataclass, taking 3.10's `slots`: left out (the class gets a __dict__ and works the same)."""
    del slots
    return _dataclass(**options) if cls is None else _dataclass(cls, **options)


def backfill() -> None:
    """Add what is missing (idempotent); raise RuntimeError on a Python older than OLDEST_EXECUTOR_PYTHON."""
    if sys.version_info < OLDEST_EXECUTOR_PYTHON:
        oldest = ".".join(map(str, OLDEST_EXECUTOR_PYTHON))
        raise RuntimeError(
            f"jobcar's producer needs Python {oldest} or later on the Spark executors, this is "
            f"{sys.version.split()[0]} ({sys.executable}): set PYSPARK_PYTHON to a newer interpreter"
        )
    if not hasattr(datetime, "UTC"):
        setattr(datetime, "UTC", datetime.timezone.utc)  # noqa: B010, UP017 -- UTC is what is missing
    if not hasattr(enum, "StrEnum"):
        setattr(enum, "StrEnum", _StrEnum)  # noqa: B010
    if not hasattr(typing, "Unpack"):
        setattr(typing, "Unpack", _Unpack)  # noqa: B010
    if not hasattr(typing, "TypeAlias"):
        # Only in annotations (`Arg: TypeAlias = ...`), never evaluated: any object serves.
        setattr(typing, "TypeAlias", object())  # noqa: B010
    if not hasattr(itertools, "pairwise"):
        setattr(itertools, "pairwise", _pairwise)  # noqa: B010
    try:
        builtins.zip((), strict=True)
    except TypeError:  # 3.9
        setattr(builtins, "zip", _zip_taking_strict)  # noqa: B010 -- mypy refuses an assignment to a type
    try:
        dataclasses.dataclass(slots=True)
    except TypeError:  # 3.9
        dataclasses.dataclass = _dataclass_taking_slots


backfill()
