"""Text rules shared by every surface: strict JSON (no NaN or Infinity, which other languages cannot read)
and URLs shown without their credentials. Standard library only."""

from __future__ import annotations

import json
import re
from typing import Any, Final

_CREDENTIALS: Final = re.compile(r"(?<=://)[^\s/@]*@")


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def loads_strict(text: str | bytes) -> Any:
    """json.loads, refusing NaN, Infinity and -Infinity (a ValueError, like any other bad JSON)."""
    return json.loads(text, parse_constant=_no_constant)


def redact(text: str) -> str:
    """`text` without the credentials of any URL in it: redis://user:pass@host -> redis://***@host."""
    return _CREDENTIALS.sub("***@", text)
