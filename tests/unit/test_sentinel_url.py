"""The Sentinel URL: one parser (`redis_url.parse_sentinel_url`) for `jobcar check`, the daemon, the CLI, the
client and the Spark helper; what each part becomes in redis-py's clients; what messages show of it."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import SSLConnection as AsyncSSLConnection
from redis.asyncio.sentinel import SentinelManagedSSLConnection as AsyncSentinelSSLConnection
from redis.sentinel import SentinelManagedConnection

from jobcar import Client
from jobcar.config import ConfigError, parse_config
from jobcar.redis_url import SentinelURL, parse_sentinel_url, redis_url_problem, shown_url
from jobcar.sentinel import async_sentinel_client, replica_wait_of, sentinel_client
from jobcar.transport import ReplicaWait


def test_every_part_of_a_sentinel_url_is_read() -> None:
    url = (
        "redis+sentinel://app:s%40cret@10.0.0.1:26380,[::1],sentinel-3.internal:26381/orders/2"
        "?sentinel_username=watcher&sentinel_password=w%26tch&wait_replicas=2&wait_timeout_ms=250"
    )
    assert parse_sentinel_url(url) == SentinelURL(
        sentinels=(("10.0.0.1", 26380), ("::1", 26379), ("sentinel-3.internal", 26381)),
        service_name="orders",
        db=2,
        username="app",
        password="s@cret",
        sentinel_username="watcher",
        sentinel_password="w&tch",
        wait_replicas=2,
        wait_timeout_ms=250,
    )


def test_the_defaults_of_a_short_sentinel_url() -> None:
    parsed = parse_sentinel_url("redis+sentinel://:pw@sentinel/mymaster")
    assert (parsed.sentinels, parsed.service_name, parsed.db) == ((("sentinel", 26379),), "mymaster", 0)
    assert (parsed.username, parsed.password, parsed.sentinel_password) == (None, "pw", None)
    assert (parsed.tls, parsed.wait_replicas, parsed.wait_timeout_ms) == (False, 1, 1000)


def test_rediss_sentinel_carries_its_tls_options() -> None:
    parsed = parse_sentinel_url(
        "rediss+sentinel://h:26379/m?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required&ssl_check_hostname=false"
    )
    assert parsed.tls
    assert parsed.tls_options == {
        "ssl_ca_certs": "/etc/ca.pem",
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": False,
    }


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+sentinel:///mymaster", "no sentinel host in ''"),
        ("redis+sentinel://h1,,h2/mymaster", "no sentinel host in ''"),
        ("redis+sentinel://h1:0/mymaster", "port from 1 to 65535"),
        ("redis+sentinel://h1:65536/mymaster", "port from 1 to 65535"),
        ("redis+sentinel://h1:x/mymaster", "must be host:port"),
        ("redis+sentinel://h1", "no service name"),
        ("redis+sentinel://h1/", "no service name"),
        ("redis+sentinel://h1/mymaster/zero", "db a number"),
        ("redis+sentinel://h1/mymaster/0/extra", "db a number"),
        ("redis+sentinel://h1/my%20master", "invalid service name"),
        ("redis+sentinel://h1/m?wait_replicas=two", "wait_replicas must be a whole number >= 0"),
        ("redis+sentinel://h1/m?wait_timeout_ms=0", "wait_timeout_ms must be a whole number of milliseconds"),
        ("redis+sentinel://h1/m?wait_timeout_ms=5001", "from 1 to 5000"),
        ("redis+sentinel://h1/m?ssl=true", "unknown option 'ssl'"),
        ("redis+sentinel://h1/m?wait_replicas=1&wait_replicas=2", "given twice"),
        ("redis+sentinel://h1/m?sentinel_password=", "needs a password"),
        ("redis+sentinel://h1/m?justaword", "name=value pairs"),
        ("redis+sentinel://h1/m?ssl_ca_certs=/ca.pem", "need TLS: use rediss+sentinel://"),
        ("rediss+sentinel://h1/m?ssl_cert_reqs=maybe", "ssl_cert_reqs must be none, optional or required"),
        ("rediss+sentinel://h1/m?ssl_check_hostname=yes", "ssl_check_hostname must be true or false"),
        ("redis+sentinel://h1/m#part", "#fragment"),
        ("redis+sentinel://h1/m ", "white space"),
    ],
)
def test_a_bad_sentinel_url_says_what_is_wrong(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match="invalid Redis Sentinel URL") as caught:
        parse_sentinel_url(url)
    assert reason in str(caught.value)
    assert redis_url_problem(url) == str(caught.value)  # what `jobcar check` says is what run meets


def test_messages_show_no_password_of_a_sentinel_url() -> None:
    url = "redis+sentinel://app:hunter2@h1,h2/m?sentinel_password=s3cret&sentinel_pasword=typo&wait_replicas=x"
    problem = redis_url_problem(url)
    assert problem is not None
    assert "unknown option 'sentinel_pasword'" in problem
    for secret in ("hunter2", "s3cret", "typo"):
        assert secret not in problem
    assert shown_url(url) == ("redis+sentinel://***@h1,h2/m?sentinel_password=***&sentinel_pasword=***&wait_replicas=x")


def test_the_url_becomes_the_clients_connection_options() -> None:
    url = "redis+sentinel://app:pw@127.0.0.1:1,127.0.0.1:2/orders/3?sentinel_password=spw&wait_replicas=2"
    client = sentinel_client(url, socket_timeout=4.0, health_check_interval=30)
    try:
        pool = client.connection_pool
        assert pool.connection_class is SentinelManagedConnection
        kwargs = pool.connection_kwargs
        assert (kwargs["db"], kwargs["username"], kwargs["password"], kwargs["socket_timeout"]) == (3, "app", "pw", 4.0)
        assert client.sentinel_group is not None
        nodes = [s.connection_pool.connection_kwargs for s in client.sentinel_group.sentinels]
        assert [(n["port"], n["password"], n["socket_timeout"]) for n in nodes] == [(1, "spw", 4.0), (2, "spw", 4.0)]
        assert (
            nodes[0]["health_check_interval"] == 0
        )  # redis-py's default: only socket, retry and protocol options pass
        assert replica_wait_of(client) == ReplicaWait(2, 1000)
    finally:
        client.close()


async def test_the_async_client_speaks_tls_to_the_sentinels_and_the_servers() -> None:
    url = "rediss+sentinel://127.0.0.1:1/orders?ssl_ca_certs=/ca.pem&wait_replicas=0"
    client = async_sentinel_client(url, socket_timeout=4.0)
    try:
        assert client.connection_pool.connection_class is AsyncSentinelSSLConnection
        assert client.connection_pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
        assert client.sentinel_group is not None
        [node] = client.sentinel_group.sentinels
        assert node.connection_pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
        assert node.connection_pool.connection_class is AsyncSSLConnection
        assert replica_wait_of(client) is None  # wait_replicas=0: no WAIT
    finally:
        await client.aclose()


def test_a_client_refuses_cluster_with_a_sentinel_url() -> None:
    with pytest.raises(ValueError, match="not found through Sentinel"):
        Client.from_url("redis+sentinel://127.0.0.1/m", cluster=True)


def test_a_config_with_cluster_and_a_sentinel_url_is_refused() -> None:
    text = 'redis: {url: "redis+sentinel://127.0.0.1/m", cluster: true}\nhandlers: {t: {command: [cat]}}\n'
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "jobcar.yaml", {})
    [error] = caught.value.errors
    assert error.startswith("jobcar.yaml:1:8 redis: cluster is true but url is a Sentinel URL")
