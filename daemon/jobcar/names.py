"""What a namespace, queue, job type, job id or key may be: one rule each, for the producer client, the
config file, the CLI and the HTTP API. Standard library only (producers use it)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Final

from jobcar.errors import InvalidJob

#: Namespaces and queues: they appear in every key name.
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_RULE: Final = "use 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or digit"
TYPE_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
TYPE_RULE: Final = "use 1 to 200 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
#: Queue patterns (`queues: {"tenant-*": 1}`, ADR 0027): a queue name's characters with at least one `*` (any
#: run of characters, none too) or `?` (one character); no `[...]` classes.
QUEUE_PATTERN: Final = re.compile(r"(?=[^*?]*[*?])[A-Za-z0-9*?][A-Za-z0-9._*?-]{0,99}")
QUEUE_PATTERN_RULE: Final = (
    "a pattern uses 1 to 100 letters, digits, '.', '_', '-', '*' (any characters) or '?' (one character), "
    "starting with a letter, a digit, '*' or '?'"
)
#: Ids and unique keys end up in key names: any printable text without spaces, bounded.
ID_PATTERN: Final = re.compile(r"[\x21-\x7e\u00a0-\U0010ffff]{1,200}")


@lru_cache(maxsize=1024)
def _matches(pattern: re.Pattern[str], value: str) -> bool:
    # Producers reuse a handful of types and queues: remember the answers (a hot path in enqueue_many).
    return pattern.fullmatch(value) is not None


def check_name(what: str, value: object, pattern: re.Pattern[str] = NAME_PATTERN) -> str:
    """`value` when it is text matching `pattern`, else InvalidJob naming `what`."""
    if not isinstance(value, str) or not _matches(pattern, value):
        raise InvalidJob(f"invalid {what} {value!r}: expected text matching {pattern.pattern}")
    return value


def is_queue_pattern(text: str) -> bool:
    """Whether a key of the config's `queues` is a pattern (it holds `*` or `?`; `[`, refused, is taken for
    one too so the error says why) rather than a queue name."""
    return "*" in text or "?" in text or "[" in text


def pattern_weight(queue: str, patterns: Mapping[str, int]) -> int | None:
    """The weight of the first of `patterns` (in the config's order) that `queue` matches, None if none does
    (fnmatch's `*` and `?`, case-sensitive). A literal queue of the config wins over every pattern: the
    caller asks only for names it does not serve by name."""
    for pattern, weight in patterns.items():
        if fnmatchcase(queue, pattern):
            return weight
    return None
