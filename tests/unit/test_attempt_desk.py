"""The attempt desk: which call finds a running attempt, and what a refused one hears (attempt_desk.py)."""

from __future__ import annotations

import base64

import pytest

from jobcar.attempt_desk import ANSWERED, CANCELED, AttemptDesk, LiveAttempt, Refused
from jobcar.job import Job, State
from jobcar.keys import QueueKeys
from jobcar.transitions import LeasedJob

KEYS = QueueKeys.of("jobcar", "default")


def attempt(job_id: str) -> LiveAttempt:
    job = Job(id=job_id, queue="default", type="t", payload=b"{}", state=State.ACTIVE, attempt=1)
    return LiveAttempt(LeasedJob(job, f"lease-of-{job_id}"), KEYS)


def opened(desk: AttemptDesk, job_id: str) -> LiveAttempt:
    """An attempt opened as the attempts open one: in their table, which the desk looks through."""
    live = attempt(job_id)
    desk.open(live, 100.0, 160.0)
    running = dict(desk.running)
    running[("default", job_id)] = live
    desk.running = running
    return live


def left(desk: AttemptDesk, live: LiveAttempt) -> None:
    """The attempt leaves the attempts' table (its handler returned, or a stopped one ended)."""
    desk.running = {key: other for key, other in desk.running.items() if other is not live}


def refusal(desk: AttemptDesk, job_id: str, token: str | None) -> tuple[int, str]:
    with pytest.raises(Refused) as refused:
        desk.find(job_id, token)
    return refused.value.status, refused.value.reason


def test_a_running_attempt_is_found_by_its_own_token_only() -> None:
    desk = AttemptDesk()
    one, two = opened(desk, "one"), opened(desk, "two")
    assert desk.find("one", one.token) is one
    assert refusal(desk, "one", two.token)[0] == 401  # another job's token
    assert refusal(desk, "one", None)[0] == 401
    assert refusal(desk, "one", one.token[:-1] + "x")[0] == 401
    assert refusal(desk, "three", one.token)[0] == 401


def test_tokens_are_192_bits_each_its_own_past_a_refill() -> None:
    desk = AttemptDesk()
    tokens = [opened(desk, f"job-{n}").token for n in range(1000)]  # several of the desk's refills
    assert len(set(tokens)) == 1000
    assert all(len(token) == 32 and len(base64.urlsafe_b64decode(token)) == 24 for token in tokens)


def test_the_url_quotes_a_job_id_only_where_it_must() -> None:
    desk = AttemptDesk()
    desk.base_url = "http://127.0.0.1:8080"
    assert opened(desk, "order-42_a.b~c").url == "http://127.0.0.1:8080/v1/attempts/order-42_a.b~c"
    assert opened(desk, "a/b c?d").url == "http://127.0.0.1:8080/v1/attempts/a%2Fb%20c%3Fd"


def test_a_deadline_never_before_it_started() -> None:
    desk = AttemptDesk()
    live = attempt("one")
    desk.open(live, 100.0, 50.0)
    assert (live.deadline, live.latest, live.extendable) == (100.0, 100.0, False)
    assert opened(desk, "two").extendable


def test_an_answered_attempt_is_a_409_while_its_handler_still_runs() -> None:
    desk = AttemptDesk()
    live = opened(desk, "one")
    live.answered = True
    assert refusal(desk, "one", live.token) == (409, ANSWERED)


def test_a_stopped_attempt_says_why_and_a_returned_one_is_gone() -> None:
    desk = AttemptDesk()
    stopped, returned = opened(desk, "stopped"), opened(desk, "returned")
    desk.stop(stopped, CANCELED)
    assert refusal(desk, "stopped", stopped.token) == (409, CANCELED)  # while its task winds down
    left(desk, stopped)
    left(desk, returned)
    assert refusal(desk, "stopped", stopped.token) == (409, CANCELED)  # and after
    assert refusal(desk, "stopped", returned.token)[0] == 401
    assert refusal(desk, "returned", returned.token)[0] == 401


def test_a_job_leased_again_is_the_new_attempt_s() -> None:
    desk = AttemptDesk()
    old = opened(desk, "one")
    desk.stop(old, CANCELED)
    new = opened(desk, "one")  # the job leased again (the attempts' table holds the new attempt)
    assert desk.find("one", new.token) is new
    assert refusal(desk, "one", old.token) == (409, CANCELED)
