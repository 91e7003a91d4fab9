"""A producer in any language waits for a job's outcome: `GET /v1/jobs/{id}?wait=...` (a long poll on the
daemon's API) and `Client.wait`; and `Client.from_config` reaches the server a config names, the embedded
one included. Real `jobcar run` processes, real command handlers, the session's real Redis."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jobcar import Client, InvalidJob, State, TargetWarning
from jobcar.embedded import EmbeddedServer
from tests.factories import python_handler
from tests.integration.conftest import StartDaemon
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, free_port, wait_for

#: A command handler that runs until the file named in its payload exists, then prints "finished".
GATED = """\
import json, time
gate = json.load(sys.stdin)["gate"]
while not os.path.exists(gate):
    time.sleep(0.01)
print("finished")
"""


@pytest.fixture
def gated(tmp_path: Path) -> list[str]:
    return python_handler(tmp_path, "gated.py", GATED)


@pytest.fixture
def api(start_daemon: StartDaemon, gated: list[str]) -> str:
    listen = f"127.0.0.1:{free_port()}"
    handlers = {"gated": {"command": gated}, "fails": {"command": ["false"], "max_attempts": 1}}
    # A gated job some tests leave running is stopped at once when the test ends: no 10 s drain.
    start_daemon(handlers, listen=listen, result_ttl="60s", shutdown_timeout="0s")
    return f"http://{listen}"


def get(url: str) -> tuple[int, dict[str, str], dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), json.loads(exc.read())


def test_a_long_poll_answers_once_the_job_is_done_with_its_result(api: str, q: QueueDriver, tmp_path: Path) -> None:
    gate = tmp_path / "open"
    info = q.enqueue("gated", {"gate": str(gate)})
    wait_for(lambda: q.where(info.id) is State.ACTIVE, what="the handler to start")
    answers: list[tuple[int, dict[str, str], dict[str, object]]] = []
    poll = threading.Thread(target=lambda: answers.append(get(f"{api}/v1/jobs/{info.id}?wait=30s")))
    poll.start()  # asked while the job runs: the answer can only be "done" if the daemon waited for it
    gate.touch()
    poll.join(timeout=60)
    [(status, headers, job)] = answers
    assert status == 200
    assert headers["Jobcar-Wait"] == "finished"
    assert job["state"] == "done"
    assert job["result"] == "finished\n"


def test_a_long_poll_that_runs_out_answers_with_the_job_as_it_is(api: str, q: QueueDriver, tmp_path: Path) -> None:
    info = q.enqueue("gated", {"gate": str(tmp_path / "never")})
    wait_for(lambda: q.where(info.id) is State.ACTIVE, what="the handler to start")
    status, headers, job = get(f"{api}/v1/jobs/{info.id}?wait=200ms")
    assert status == 200
    assert headers["Jobcar-Wait"] == "timeout"
    assert job["state"] == "active"


def test_a_long_poll_is_bounded(api: str, q: QueueDriver, tmp_path: Path) -> None:
    info = q.enqueue("gated", {"gate": str(tmp_path / "never")})
    status, _, body = get(f"{api}/v1/jobs/{info.id}?wait=10m")
    assert status == 400
    assert body["error"] == "wait is at most 60s; ask again for longer"


def test_client_wait_returns_the_finished_job_or_none_once_it_is_gone(api: str, q: QueueDriver, tmp_path: Path) -> None:
    dead = q.enqueue("fails", {})
    job = q.producer.wait(dead.id, timeout=30)
    assert job is not None
    assert job.state is State.DEAD
    assert job.last_error is not None
    gate = tmp_path / "open"
    gate.touch()
    done = q.enqueue("gated", {"gate": str(gate)})
    job = q.producer.wait(done.id, timeout=30)
    assert job is not None
    assert job.state is State.DONE
    assert job.result == b"finished\n"
    assert q.producer.wait("no-such-job", timeout=1) is None


def test_client_wait_names_the_state_it_gave_up_in(api: str, q: QueueDriver, tmp_path: Path) -> None:
    info = q.enqueue("gated", {"gate": str(tmp_path / "never")})
    wait_for(lambda: q.where(info.id) is State.ACTIVE, what="the handler to start")
    with pytest.raises(TimeoutError, match=f"job {info.id} in queue default \\(active\\) still unfinished"):
        q.producer.wait(info.id, timeout=0.3)


def test_with_no_result_kept_a_waiter_still_learns_the_job_is_done(
    start_daemon: StartDaemon, gated: list[str], q: QueueDriver, tmp_path: Path
) -> None:
    """Under the default result_ttl 0 a job is deleted as it succeeds; one that someone waits for (a long poll,
    Client.wait) is kept a while for them, and one nobody waits for is still deleted at once."""
    listen = f"127.0.0.1:{free_port()}"
    start_daemon({"gated": {"command": gated}}, listen=listen, result_ttl="0s", shutdown_timeout="0s")
    gate = tmp_path / "open"
    # One job per kind of waiter, so that each waiter's own mark is what keeps its job.
    polled, awaited, alone = (q.enqueue("gated", {"gate": str(gate)}) for _ in range(3))
    wait_for(lambda: q.where(polled.id) is State.ACTIVE, what="the handler to start")
    answers: list[object] = []
    threads = [
        threading.Thread(target=lambda: answers.append(get(f"http://{listen}/v1/jobs/{polled.id}?wait=30s"))),
        threading.Thread(target=lambda: answers.append(q.producer.wait(awaited.id, timeout=30))),
    ]
    for thread in threads:
        thread.start()
    for waited in (polled, awaited):
        wait_for(lambda: q.redis.exists(q.keys.waiter(waited.id)), what="each waiter to say it waits")  # noqa: B023
    gate.touch()
    for thread in threads:
        thread.join(timeout=60)
    by_kind = {type(answer).__name__: answer for answer in answers}
    status, headers, document = by_kind["tuple"]  # type: ignore[misc]
    assert (status, headers["Jobcar-Wait"], document["state"]) == (200, "finished", "done")
    job = by_kind["Job"]
    assert job.state is State.DONE  # type: ignore[attr-defined]
    wait_for(lambda: q.job(alone.id) is None, what="the job nobody waited for to be deleted as it succeeded")


def test_from_config_reaches_the_configured_server(tmp_path: Path, redis_server: RedisServer, namespace: str) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_text(f'redis: {{url: "{redis_server.url}"}}\nnamespace: {namespace}\nmax_payload_bytes: 1KiB\n')
    with Client.from_config(path) as client:
        assert (client.namespace, client.max_payload_bytes) == (namespace, 1024)
        with pytest.warns(TargetWarning, match=f"{path} has no handler for type 't'"):
            info = client.enqueue("t", {"n": 1})
        assert client.get(info.id) is not None


def test_from_config_says_when_a_job_would_sit_unrun_and_with_strict_enqueue_refuses_it(
    tmp_path: Path, redis_server: RedisServer, namespace: str
) -> None:
    path = tmp_path / "jobcar.yaml"
    config = f'redis: {{url: "{redis_server.url}"}}\nnamespace: {namespace}\nqueues: {{default: 1, low: 1}}\n'
    path.write_text(config + "handlers:\n  email.welcome: {command: [cat]}\n")
    with Client.from_config(path) as client:
        client.enqueue("email.welcome", {}, queue="low")  # known: no warning (warnings are errors here)
        with pytest.warns(TargetWarning, match="type 'email.welcom' \\(did you mean 'email.welcome'\\?\\)"):
            client.enqueue("email.welcom", {})
        with pytest.warns(TargetWarning, match="queue 'lo' is not in the queues"):
            client.enqueue_many([("email.welcome", {}, {"queue": "lo"})])
    path.write_text(config + "strict_enqueue: true\nhandlers:\n  email.welcome: {command: [cat]}\n")
    with Client.from_config(path) as client:
        with pytest.raises(InvalidJob, match="nothing enqueued \\(strict_enqueue is on\\)"):
            client.enqueue("email.welcom", {}, job_id="typo")
        assert client.get("typo") is None


@pytest.mark.asyncio
async def test_from_config_reaches_a_running_embedded_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # data_dir is relative to the current directory, as for `jobcar run`
    path = tmp_path / "jobcar.yaml"
    path.write_text("redis: {url: embedded, data_dir: .data}\n")
    async with EmbeddedServer(tmp_path / ".data"):
        with Client.from_config(path) as client:
            with pytest.warns(TargetWarning, match="has no handler for type 't'"):
                info = client.enqueue("t", {"n": 1})
            assert client.get(info.id) is not None
