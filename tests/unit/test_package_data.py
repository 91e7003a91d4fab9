"""Every file the package reads at run time (Lua scripts, the dashboard's templates and assets) is named by
pyproject.toml's package-data, so it ships in the wheel: the tests run from the source tree, where a file
the wheel leaves out would still be found."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "daemon" / "jobcar"


def test_every_data_file_of_the_package_ships_in_the_wheel() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["jobcar"]
    data = [
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert any(name.startswith("ui/static/") for name in data)
    # As setuptools reads them: `*` stays within one folder.
    patterns = [re.compile(re.escape(glob).replace(r"\*", "[^/]*")) for glob in globs]
    left_out = [name for name in data if not any(p.fullmatch(name) for p in patterns)]
    assert not left_out, f"add these to [tool.setuptools.package-data] in pyproject.toml: {left_out}"
