"""Celery: the app for `celery -A peer_tasks.celery_tasks worker`; no result backend (Celery's default)."""

from __future__ import annotations

from celery import Celery

from peer_tasks import REDIS_URL, started

app = Celery("peers", broker=REDIS_URL)
app.conf.broker_connection_retry_on_startup = True  # silences a deprecation warning, changes nothing here


@app.task
def noop(payload: dict[str, object]) -> None:
    started(payload)
