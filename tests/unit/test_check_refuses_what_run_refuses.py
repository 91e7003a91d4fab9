"""`jobcar check` refuses everything `jobcar run` refuses, by the same code: an exposed listener without a
token, and Redis URLs the daemon cannot connect with; and the commands that run no handler do not need
the handlers' secrets."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from jobcar.api import check_exposure
from jobcar.cli import main
from jobcar.config import ConfigError, load_config, parse_config
from jobcar.config_types import Config
from jobcar.redis_url import redis_url_problem

HANDLERS = "handlers: {t: {command: [cat]}}\n"


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(textwrap.dedent(text), "jobcar.yaml", {})
    return caught.value.errors


def test_an_exposed_listener_without_a_token_is_a_config_error_at_its_line() -> None:
    [error] = errors_of("listen: 0.0.0.0:9433\n" + HANDLERS)
    assert error.startswith("jobcar.yaml:1:9 listen: is not a loopback address and api_token is not set")


def test_an_exposed_listener_with_a_token_passes_and_run_agrees() -> None:
    config = parse_config("listen: 0.0.0.0:9433\napi_token: s3cret\n" + HANDLERS, "jobcar.yaml", {})
    assert check_exposure(config) is None
    # What run checks is the same rule: a Config built without the loader is refused the same way.
    refused = check_exposure(Config(source="jobcar.yaml", listen="0.0.0.0:9433"))
    assert refused is not None
    assert "is not a loopback address and api_token is not set" in refused


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:notaport/0", "Port could not be cast to integer value"),
        ("redis://127.0.0.1:70000/0", "out of range"),
        ("http://127.0.0.1:6379", "is not a Redis URL"),
        ("redis://127.0.0.1:6379/notadb", "the database must be a number"),
        ("redis+sentinel://127.0.0.1:26379", "no service name"),
        ("redis+sentinel://127.0.0.1:26379,127.0.0.1:0/primary", "a port from 1 to 65535"),
        ("redis:///0", "no host"),
    ],
)
def test_a_redis_url_the_daemon_cannot_use_is_a_config_error(url: str, message: str) -> None:
    [error] = errors_of(f'redis: {{url: "{url}"}}\n' + HANDLERS)
    assert error.startswith("jobcar.yaml:1:14 redis.url: ")
    assert message in error


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://:pw@cache.internal:6380/2",
        "unix:///run/redis.sock",
        "embedded",
        "redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3/primary/0?sentinel_password=spw",
        "rediss+sentinel://sentinel.internal/primary?ssl_ca_certs=/etc/ca.pem",
    ],
)
def test_redis_urls_the_daemon_connects_with_pass(url: str) -> None:
    assert redis_url_problem(url) is None


def test_a_refused_url_is_shown_without_its_password() -> None:
    problem = redis_url_problem("http://user:hunter2@cache:6379/0")
    assert problem is not None
    assert "hunter2" not in problem


@pytest.mark.parametrize("argv", [["check"], ["run"]])
def test_check_and_run_refuse_the_same_exposed_listener(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_text("listen: 0.0.0.0:9433\n" + HANDLERS)
    assert main([*argv, "-c", str(path)]) == 78
    assert "listen: is not a loopback address and api_token is not set" in capsys.readouterr().err


SECRETS = """\
handlers:
  t:
    url: http://127.0.0.1:8080/jobs
    signing_secret: ${JOBCAR_TEST_UNSET_SECRET}
    headers: {Authorization: "Bearer ${JOBCAR_TEST_UNSET_TOKEN:?the app's token}"}
  c:
    command: [cat]
    env: {API_KEY: "${JOBCAR_TEST_UNSET_KEY}"}
"""


def test_commands_that_run_no_handler_do_not_need_the_handlers_secrets(tmp_path: Path) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_text(SECRETS)
    config = load_config(path, {}, secrets_needed=False)
    assert set(config.handlers) == {"t", "c"}
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert len(caught.value.errors) == 3
    assert all("JOBCAR_TEST_UNSET_" in error for error in caught.value.errors)


def test_check_still_needs_the_secrets_and_never_prints_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_text(SECRETS.replace("${JOBCAR_TEST_UNSET_KEY}", "k3y-value"))
    assert main(["check", "-c", str(path)]) == 78
    out, err = capsys.readouterr()
    assert "JOBCAR_TEST_UNSET_SECRET is not set" in err
    assert "k3y-value" not in out + err
