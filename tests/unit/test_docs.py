"""The docs cannot drift: docs/configuration.md lists exactly the keys of config/schema.json with the
schema's defaults, and every relative link in README.md and docs/ points at a file that exists."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "config" / "schema.json"
REFERENCE_PATH = ROOT / "docs" / "configuration.md"
#: What stands for a key the user chooses, by the path of the mapping that holds it.
PLACEHOLDERS = {"handlers": "<type>"}

# A reference row: | `key.path` | type | default | meaning |
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|([^|]*)\|([^|]*)\|")
# [text](target) and [text](<target>); images too. Targets with spaces are not used in these docs.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DOCS_PATH = re.compile(r"`(docs/[A-Za-z0-9_./-]+)`")


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/$defs/"), ref
        node = {**schema["$defs"][ref.removeprefix("#/$defs/")], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _object_variants(schema: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    """The object schemas a node may be (itself, or its oneOf/anyOf alternatives), $refs resolved."""
    node = _resolve(schema, node)
    variants = [node] if "properties" in node else []
    for key in ("oneOf", "anyOf"):
        for alternative in node.get(key, []):
            variants.extend(_object_variants(schema, alternative))
    return variants


def schema_keys(schema: dict[str, Any], node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every key path the schema accepts, with its default (or None): `redis.url`,
    `handlers.<type>.backoff.base`, ..."""
    for variant in _object_variants(schema, node):
        for name, child in variant["properties"].items():
            path = f"{prefix}{name}"
            child = _resolve(schema, child)
            yield path, child.get("default")
            yield from schema_keys(schema, child, f"{path}.")
    node = _resolve(schema, node)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and _object_variants(schema, extra):
        path = f"{prefix}{PLACEHOLDERS.get(prefix.rstrip('.'), '<name>')}"
        yield path, None
        yield from schema_keys(schema, extra, f"{path}.")


def documented_rows() -> dict[str, str]:
    """key path → its default cell, from every reference table row of docs/configuration.md."""
    rows: dict[str, str] = {}
    for line in REFERENCE_PATH.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            rows.setdefault(match.group(1), match.group(3).strip())
    return rows


def render_default(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@pytest.fixture(scope="module")
def schema_paths() -> dict[str, Any]:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    paths: dict[str, Any] = {}
    for path, default in schema_keys(schema, schema):
        if default is not None or path not in paths:
            paths[path] = default
    return paths


def test_the_walk_finds_top_level_nested_and_handler_keys(schema_paths: dict[str, Any]) -> None:
    for path in ("lease", "redis.url", "defaults.backoff.base", "dead_letter.max_age", "handlers.<type>",
                 "handlers.<type>.url", "handlers.<type>.command", "handlers.<type>.backoff.strategy"):  # fmt: skip
        assert path in schema_paths
    assert schema_paths["lease"] == "30s"
    assert schema_paths["handlers.<type>.kill_grace"] == "5s"


def test_every_schema_key_is_documented(schema_paths: dict[str, Any]) -> None:
    missing = sorted(set(schema_paths) - set(documented_rows()))
    assert not missing, f"keys in config/schema.json without a row in docs/configuration.md: {missing}"


def test_every_documented_key_is_in_the_schema(schema_paths: dict[str, Any]) -> None:
    unknown = sorted(set(documented_rows()) - set(schema_paths))
    assert not unknown, f"keys documented in docs/configuration.md that config/schema.json lacks: {unknown}"


def test_documented_defaults_are_the_schemas(schema_paths: dict[str, Any]) -> None:
    rows = documented_rows()
    wrong = {
        path: (rows[path], render_default(default))
        for path, default in schema_paths.items()
        if default is not None and path in rows and rows[path] != f"`{render_default(default)}`"
    }
    assert not wrong, f"defaults in docs/configuration.md (documented, schema): {wrong}"


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def local_targets(path: Path) -> Iterator[tuple[str, Path]]:
    """(as written, resolved path) of every relative link, and of every `docs/...` path in backticks."""
    text = path.read_text(encoding="utf-8")
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http:, https:, mailto: ... or an anchor in the same page
        yield target, (path.parent / target.split("#", 1)[0]).resolve()
    for match in DOCS_PATH.finditer(text):
        yield match.group(1), ROOT / match.group(1)


def test_the_link_check_sees_links_and_docs_paths(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[a](x.md#part) [b](https://example.com) [c](#top) ![d](<img/e.png>) `docs/f.md`\n")
    assert [written for written, _ in local_targets(page)] == ["x.md#part", "img/e.png", "docs/f.md"]


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_existing_files(page: Path) -> None:
    missing = sorted({written for written, target in local_targets(page) if not target.exists()})
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page: lower case, punctuation dropped, spaces to '-'."""
    found: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-"))
    return found


def test_anchors_are_computed_like_github(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Retries, backoff and `Retry-After`\n```sh\n# not a heading\n```\n## A handler in three\n")
    assert anchors(page) == {"retries-backoff-and-retry-after", "a-handler-in-three"}


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_to_a_section_name_an_existing_heading(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    broken = []
    for match in LINK.finditer(text):
        target, _, fragment = match.group(1).partition("#")
        if not fragment or re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        linked = (page.parent / target).resolve() if target else page
        if linked.suffix == ".md" and linked.is_file() and fragment not in anchors(linked):
            broken.append(match.group(1))
    assert not broken, f"{page.relative_to(ROOT)} links to sections that do not exist: {broken}"


def test_every_test_a_doc_names_exists() -> None:
    """The guarantee table (and any other doc) cites tests as `tests/...py::name`: each must exist."""
    cited = {
        (path, name)
        for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        for path, name in re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", doc.read_text())
    }
    assert len(cited) >= 30
    missing = [f"{path}::{name}" for path, name in sorted(cited)
               if not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.MULTILINE)]  # fmt: skip
    assert missing == []


def test_every_jobcar_command_the_docs_name_exists() -> None:
    """`jobcar <command>` and `jobcar <group> <action>` in backticks anywhere in the docs name a command of the
    CLI (test_cli_imports holds COMMAND_LINES to the CLI's table)."""
    from tests.unit.test_cli_imports import COMMAND_LINES

    groups = {line.split()[0] for line in COMMAND_LINES if " " in line}
    unknown = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for first, second in re.findall(r"`jobcar ([a-z]+)(?:\s+([a-z]+))?(?=[\s`\\|])", doc.read_text()):
            line = f"{first} {second}" if first in groups and second else first
            if line not in COMMAND_LINES and line not in groups:
                unknown.append(f"{doc.relative_to(ROOT)}: jobcar {line}")
    assert unknown == []


def test_the_docs_name_every_setting_a_reload_cannot_change() -> None:
    from jobcar.daemon import RESTART_ONLY

    operations = (ROOT / "docs" / "operations.md").read_text()
    row = next(line for line in operations.splitlines() if "(the daemon logs that they were not applied)" in line)
    assert set(re.findall(r"`(\w+)`", row.split("|")[2])) == set(RESTART_ONLY)
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    section = configuration[configuration.index("## What a reload changes") :].split("\n## ")[0]
    paragraph = section[section.index("Changes to") : section.index("The handlers and the other keys")]
    assert set(re.findall(r"`(\w+)`", paragraph)) == set(RESTART_ONLY)


def test_the_fields_of_jobcar_limits_json_are_documented() -> None:
    from jobcar.limits_view import LimitGroup

    fields = LimitGroup("q", "t", 0, 0, None, None).document().keys()
    limits = (ROOT / "docs" / "limits.md").read_text()
    table = limits[limits.index("`jobcar limits --json` prints") :].split("\n\n")[1]
    assert [re.match(r"\| `(\w+)` \|", line).group(1) for line in table.splitlines()[2:]] == list(fields)  # type: ignore[union-attr]
