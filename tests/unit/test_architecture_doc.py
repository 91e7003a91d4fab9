"""docs/architecture.md is the code's map: it names every module of the package, and every module it
names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "daemon" / "jobcar"
MAP = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def modules() -> set[str]:
    top = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    dashboard = {f"ui/{p.name}" for p in (PACKAGE / "ui").glob("*.py") if p.name != "__init__.py"}
    return top | dashboard | {"executors/"}


def test_every_module_is_on_the_map() -> None:
    named = set(re.findall(r"`((?:ui/)?[a-z_]+\.py|executors/)`", MAP))
    missing = modules() - named
    assert not missing, f"add these to docs/architecture.md: {sorted(missing)}"


def test_every_module_on_the_map_exists() -> None:
    rows = [line for line in MAP.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`((?:ui/)?[a-z_]+\.py)`", row.split("|")[1])}
    gone = {name for name in named if not (PACKAGE / name).exists() and not (PACKAGE / "executors" / name).exists()}
    assert not gone, f"docs/architecture.md names modules that are gone: {sorted(gone)}"
