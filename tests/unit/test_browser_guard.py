"""browser_guard's rules on header values alone: which Host names an open API answers to, and which Origin and
Sec-Fetch-Site values mean a web page of another site. The API's tests send the same over real HTTP."""

from __future__ import annotations

import pytest

from jobcar.browser_guard import cross_site_problem, host_name, host_problem

ALLOWED = ("jobcar.internal",)


@pytest.mark.parametrize(
    "host",
    [
        None,  # not a browser: every browser sends Host
        "127.0.0.1:9321",
        "127.0.0.1",
        "127.8.9.10:1",
        "[::1]:9321",
        "[::1]",
        "[0:0:0:0:0:0:0:1]:9321",
        "10.1.2.3:9321",  # a pod's address: kubelet probes, Prometheus scrapes
        "[fd00::5]:9321",
        "localhost:9321",
        "LOCALHOST",
        "localhost:8080",  # the port is not compared: port forwards change it
        "app.localhost:9321",
        "a.b.localhost",
        "jobcar.internal:9321",
        "Jobcar.Internal",
    ],
)
def test_hosts_an_open_api_answers_to(host: str | None) -> None:
    assert host_problem(host, ALLOWED) is None


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:9321",
        "evil.example",
        "127.0.0.1.nip.io:9321",  # resolves to loopback, but it is a name someone else controls
        "localhost.evil.example",
        "xlocalhost",
        "localhost.",
        "x.jobcar.internal",
        "jobcar.internal.evil.example",
        "",
        ":9321",
        "127.0.0.1:http",
        "127.0.0.1:123456",
        "[::1",
        "[::1]9321",
        "[not-an-address]:9321",
        "a b",
        "evil.example:9321@127.0.0.1",
    ],
)
def test_hosts_an_open_api_refuses(host: str) -> None:
    problem = host_problem(host, ALLOWED)
    assert problem is not None
    assert "api_allowed_hosts" in problem


def test_host_name_takes_the_port_and_brackets_off() -> None:
    assert host_name("Jobcar.Internal:9321") == "jobcar.internal"
    assert host_name("[0:0::1]:9321") == "::1"
    assert host_name("[::1]") == "::1"
    assert host_name("[::1]:") is None
    assert host_name("localhost:") is None


@pytest.mark.parametrize(
    ("origin", "fetch_site", "host"),
    [
        (None, None, "127.0.0.1:9321"),  # a producer, curl, kubelet, Prometheus
        (None, None, None),
        (None, "none", "127.0.0.1:9321"),  # the user typed the URL
        (None, "same-origin", "127.0.0.1:9321"),
        (None, "Same-Origin", "127.0.0.1:9321"),
        ("http://127.0.0.1:9321", None, "127.0.0.1:9321"),
        ("http://127.0.0.1:9321", "same-origin", "127.0.0.1:9321"),
        ("https://jobcar.internal", None, "jobcar.internal"),  # behind a TLS terminator
        ("http://LOCALHOST:9321", None, "localhost:9321"),
    ],
)
def test_requests_that_are_not_from_another_site(origin: str | None, fetch_site: str | None, host: str | None) -> None:
    assert cross_site_problem(origin, fetch_site, host) is None


@pytest.mark.parametrize(
    ("origin", "fetch_site", "host"),
    [
        ("http://evil.example", None, "127.0.0.1:9321"),
        ("http://evil.example", "cross-site", "127.0.0.1:9321"),
        (None, "cross-site", "127.0.0.1:9321"),  # a browser that sent no Origin (a GET)
        (None, "same-site", "localhost:9321"),  # a page on localhost:3000
        (None, "something-new", "127.0.0.1:9321"),
        ("http://localhost:3000", None, "localhost:9321"),
        ("http://127.0.0.1:9321", None, "localhost:9321"),  # another origin, though the same machine
        ("null", None, "127.0.0.1:9321"),  # a sandboxed frame, a redirect
        ("http://127.0.0.1:9321", None, None),
        ("ftp://127.0.0.1:9321", None, "127.0.0.1:9321"),
        ("http://[::1", None, "[::1]:9321"),  # not even a URL
        ("http://127.0.0.1:9321", "cross-site", "127.0.0.1:9321"),  # either header is enough
    ],
)
def test_requests_from_another_site(origin: str | None, fetch_site: str | None, host: str | None) -> None:
    problem = cross_site_problem(origin, fetch_site, host)
    assert problem is not None
    assert "another site" in problem
