"""How the CLI shows things to people: short durations, aligned tables, and job data made safe for a
terminal."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Final


def span(seconds: float) -> str:
    """A short duration for people: 0.4s, 12s, 5m03s, 2h10m, 3d04h."""
    if seconds < 10:
        return f"{max(0.0, seconds):.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


# Job data is whatever producers and handlers wrote: keep their control characters (terminal escape
# sequences included) from reaching the terminal as they are. Newlines and tabs are kept.
CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Collection[int] = ()) -> list[str]:
    """Columns aligned on their widest cell, two spaces apart; `numeric` columns aligned right."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = []
    for row in (header, *rows):
        cells = [
            cell.rjust(w) if i in numeric else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines
