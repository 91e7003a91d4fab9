"""The three Python 3.11 names the producer's modules import, backfilled on a Python 3.10 Spark executor.

jobcar itself needs Python 3.11, but many Spark platforms run their executors on 3.10. The producer's modules
(client, producer, records, options, job, ...) use the 3.10 language (`X | Y` unions at run time,
`zip(strict=)`, `dataclass(slots=)`) and import only three names that 3.11 added to the standard library:
`datetime.UTC`, `enum.StrEnum` and `typing.Unpack`. This module adds those three where they are missing, and
nothing else, so that `import jobcar.spark` (which imports this first) then `jobcar.client` work on 3.10. On
3.11 and later it changes nothing. Python 3.9 is refused here with a clear error: the language itself differs
there, which no backfill can fix.

Standard library only: it runs on the executors before anything else of jobcar.
"""

from __future__ import annotations

import datetime
import enum
import sys
import typing
from typing import Any, Final

#: The oldest Python whose executors can run the producer part (with the backfills below on 3.10).
OLDEST_EXECUTOR_PYTHON: Final = (3, 10)


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


def backfill() -> None:
    """Add the missing 3.11 names (idempotent); raise RuntimeError on a Python older than 3.10."""
    if sys.version_info < OLDEST_EXECUTOR_PYTHON:
        raise RuntimeError(
            f"jobcar's producer needs Python 3.10 or later on the Spark executors, this is "
            f"{sys.version.split()[0]} ({sys.executable}): set PYSPARK_PYTHON to a newer interpreter"
        )
    if not hasattr(datetime, "UTC"):
        setattr(datetime, "UTC", datetime.timezone.utc)  # noqa: B010, UP017 -- UTC is what is missing
    if not hasattr(enum, "StrEnum"):
        setattr(enum, "StrEnum", _StrEnum)  # noqa: B010
    if not hasattr(typing, "Unpack"):
        setattr(typing, "Unpack", _Unpack)  # noqa: B010


backfill()
