"""The API's tokens (api_tokens.py, ADR 0026) as the config gives them: `api_tokens` with `token`, `${VAR}` and
`token_file`, every mistake reported at its place, what a command that runs no daemon tolerates, the exposure
rule; then a table's matching of a bearer header, the roles' rights and what each route needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobcar.api_tokens import ApiToken, Role, TokenTable, allows, required_role, token_table
from jobcar.config import ConfigError, load_config, parse_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "jobcar.yaml"
    path.write_text(text)
    return path


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "jobcar.yaml", environ or {})
    return caught.value.errors


def test_tokens_from_the_file_the_environment_and_a_token_file(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "ops").write_text("  0ps-t0ken\n")  # white space around it is not the token's
    text = (
        "listen: 0.0.0.0:9321\napi_token: legacy\napi_tokens:\n"
        "  viewer: {role: read, token: v1ew}\n"
        "  shop:\n    role: produce\n    token: ${SHOP_TOKEN}\n"
        "  ops: {role: operate, token_file: secrets/ops}\n"  # relative to the config file's folder
    )
    config = load_config(write(tmp_path, text), {"SHOP_TOKEN": "sh0p"})
    table = token_table(config)
    assert [(t.name, t.role, t.secret) for t in table.tokens] == [
        ("api_token", Role.OPERATE, "legacy"),
        ("viewer", Role.READ, "v1ew"),
        ("shop", Role.PRODUCE, "sh0p"),
        ("ops", Role.OPERATE, "0ps-t0ken"),
    ]
    assert table.names() == "api_token (operate), viewer (read), shop (produce), ops (operate)"
    for shown in (repr(config), repr(table), table.names()):
        for secret in ("v1ew", "sh0p", "0ps-t0ken"):
            assert secret not in shown


def test_api_token_alone_is_one_operate_token_and_none_is_an_open_api() -> None:
    assert token_table(parse_config("api_token: s3cret\n", "x.yaml", {})).tokens == (
        ApiToken("api_token", Role.OPERATE, "s3cret"),
    )
    open_api = token_table(parse_config("{}\n", "x.yaml", {}))
    assert not open_api.enabled
    assert open_api.names() == "none (the API is open)"


def test_each_mistake_is_reported_at_its_place(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    found = problems(
        "api_token: same\n"
        "api_tokens:\n"
        "  a: {role: reader, token: x1}\n"
        "  b: {token: x2}\n"
        "  c: {role: read}\n"
        "  d: {role: read, token: x4, token_file: f}\n"
        "  e: {role: read, token: ''}\n"
        f"  f: {{role: read, token_file: {tmp_path / 'missing'}}}\n"
        f"  g: {{role: read, token_file: {tmp_path / 'empty'}}}\n"
        "  h: {role: read, token: same}\n"
        "  api_token: {role: read, token: x9}\n"
        "  i: {role: read, token: x10, scope: all}\n"
        "  -bad: {role: read, token: x11}\n"
    )
    assert found == [
        "jobcar.yaml:3:13 api_tokens.a.role: must be one of read, produce, operate, not 'reader' "
        "(did you mean 'read'?)",
        "jobcar.yaml:4:6 api_tokens.b: role is required: one of read, produce, operate",
        "jobcar.yaml:5:6 api_tokens.c: give token (the value, or ${VAR}) or token_file (a file holding it), one",
        "jobcar.yaml:6:6 api_tokens.d: give token (the value, or ${VAR}) or token_file (a file holding it), one",
        "jobcar.yaml:7:26 api_tokens.e.token: must not be empty",
        f"jobcar.yaml:8:6 api_tokens.f.token_file: cannot read {tmp_path / 'missing'}: No such file or directory",
        f"jobcar.yaml:9:6 api_tokens.g.token_file: {tmp_path / 'empty'} is empty",
        "jobcar.yaml:10:3 api_tokens.h: the same token as api_token: give each name its own token",
        "jobcar.yaml:11:3 api_tokens.api_token: api_token is the name of the api_token setting's token: choose another",
        "jobcar.yaml:12:31 api_tokens.i.scope: unknown key",
        "jobcar.yaml:13:3 api_tokens.-bad: invalid token name: use 1 to 100 letters, digits, '.', '_' or '-', starting "
        "with a letter or digit",
    ]


def test_two_names_may_not_share_a_token() -> None:
    found = problems("api_tokens:\n  a: {role: read, token: t}\n  b: {role: operate, token: t}\n")
    assert found == ["jobcar.yaml:3:3 api_tokens.b: the same token as a: give each name its own token"]


def test_a_command_that_runs_no_daemon_passes_over_what_it_cannot_read(tmp_path: Path) -> None:
    text = (f"listen: 0.0.0.0:9321\napi_tokens:\n  f: {{role: read, token_file: {tmp_path / 'missing'}}}\n"
            "  v:\n    role: operate\n    token: ${UNSET_TOKEN}\n")  # fmt: skip
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, text), {})
    config = load_config(write(tmp_path, text), {}, secrets_needed=False)
    assert [(t.name, t.token) for t in config.api_tokens] == [("f", None), ("v", None)]
    assert not token_table(config).enabled  # no value: matches nothing...
    assert config.has_api_token  # ...but the listener is still not open: the exposure rule counts the names


def test_a_reachable_listener_needs_a_token_and_any_named_one_will_do() -> None:
    assert problems("listen: 0.0.0.0:9321\n")[0].startswith("jobcar.yaml:1:9 listen: is not a loopback address")
    config = parse_config("listen: 0.0.0.0:9321\napi_tokens: {ro: {role: read, token: r}}\n", "x.yaml", {})
    assert config.has_api_token


def test_a_bearer_header_matches_one_token_whole() -> None:
    table = TokenTable((ApiToken("a", Role.READ, "s3cret"), ApiToken("b", Role.OPERATE, "other")))
    assert table.bearer("Bearer s3cret") == table.tokens[0]
    assert table.bearer("bearer  other ") == table.tokens[1]
    for header in (None, "", "Bearer", "Bearer ", "Bearer s3cre", "Bearer s3crett", "Basic s3cret", "s3cret",
                   "Bearer s3cret other", "Bearer \ud800", "Bearer é"):  # fmt: skip
        assert table.bearer(header) is None, header
    assert table.named("b") == table.tokens[1]
    assert table.named("c") is None


def test_what_each_role_may_do_and_what_each_route_needs() -> None:
    assert {(r, n) for r in Role for n in Role if allows(r, n)} == {
        (Role.READ, Role.READ), (Role.PRODUCE, Role.PRODUCE),
        (Role.OPERATE, Role.READ), (Role.OPERATE, Role.PRODUCE), (Role.OPERATE, Role.OPERATE),
    }  # fmt: skip
    assert required_role("GET", "/v1/jobs/x") is Role.READ
    assert required_role("HEAD", "/v1/stats") is Role.READ
    assert required_role("POST", "/v1/jobs") is Role.PRODUCE
    # Every other write is an operator's, a route added later included.
    for method, path in [("POST", "/v1/jobs/cancel"), ("DELETE", "/v1/jobs/x"), ("POST", "/v1/drain"),
                         ("PUT", "/v1/schedules/s"), ("POST", "/v1/anything-new"), ("PATCH", "/v1/jobs")]:  # fmt: skip
        assert required_role(method, path) is Role.OPERATE, (method, path)
