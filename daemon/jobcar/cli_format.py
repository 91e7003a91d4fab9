"""How the CLI shows things to people: short durations, aligned tables, and job data made safe for a
terminal."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Final

from jobcar.job import Progress


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


def byte_size(n: int) -> str:
    """A size for people: 512 B, 1.5 KiB, 2.0 MiB."""
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


def percent_text(percent: float) -> str:
    """42%, 12.5%: a handler's percentage without a trailing .0."""
    return f"{percent:.1f}".removesuffix(".0") + "%"


def progress_text(progress: Progress) -> str:
    """What a handler last reported: "42%", "copying", "42%: copying" (the message is the handler's text: the
    caller makes it printable or escapes it)."""
    parts = [percent_text(progress.percent)] if progress.percent is not None else []
    if progress.message is not None:
        parts.append(progress.message)
    return ": ".join(parts) or "reported"


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
