"""The names of the limit groups (ADR 0014), made and read here for the daemon, as
lua/includes/group_names.lua makes and reads them for the scripts (tests/unit/test_group_names.py holds the
two together):

- `<type>`: a type's total, and `<type>#<key>`: a key's slots of its type (concurrency groups);
- `@<type>` and `@<type>#<key>`: a rate group, of the type or of a key;
- `~<type>#<key>`: a key's turn for its type's total (`fair`; key "" for a job without one).

A job type has no "#", "@" or "~" (names.TYPE_PATTERN), so a name's first "#" ends its type; a key is any
text. Standard library only, like keys.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class GroupKind(StrEnum):
    CONCURRENCY = "concurrency"
    RATE = "rate"
    TURN = "turn"


_MARKS: Final = {GroupKind.CONCURRENCY: "", GroupKind.RATE: "@", GroupKind.TURN: "~"}
_KINDS: Final = {"@": GroupKind.RATE, "~": GroupKind.TURN}


@dataclass(frozen=True, slots=True)
class GroupName:
    kind: GroupKind
    job_type: str
    #: None for a group of the whole type.
    key: str | None = None

    def __str__(self) -> str:
        name = _MARKS[self.kind] + self.job_type
        return name if self.key is None else f"{name}#{self.key}"


def concurrency_group(job_type: str, key: str | None = None) -> str:
    return str(GroupName(GroupKind.CONCURRENCY, job_type, key))


def rate_group(job_type: str, key: str | None = None) -> str:
    return str(GroupName(GroupKind.RATE, job_type, key))


def turn_group(job_type: str, key: str) -> str:
    return str(GroupName(GroupKind.TURN, job_type, key))


def parse_group(name: str) -> GroupName:
    kind = _KINDS.get(name[:1], GroupKind.CONCURRENCY)
    job_type, hash_sign, key = name[len(_MARKS[kind]) :].partition("#")
    return GroupName(kind, job_type, key if hash_sign else None)
