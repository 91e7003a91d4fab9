"""jobcar: a sidecar daemon that runs background jobs from Redis through HTTP and command handlers.

This package root stays lean on purpose: it imports only what producers need (the standard library
and redis-py), so `from jobcar import Client` works on a Spark executor or from a zip. The daemon's
modules (config, runner, executors, api, ...) are imported only by the daemon.
"""

from __future__ import annotations

from jobcar.client import AsyncClient, BatchSeal, BatchStatus, Client
from jobcar.errors import InvalidJob, JobcarError, PayloadTooLarge
from jobcar.job import EnqueueStatus, Job, JobInfo, State

__all__ = [
    "AsyncClient",
    "BatchSeal",
    "BatchStatus",
    "Client",
    "EnqueueStatus",
    "InvalidJob",
    "Job",
    "JobInfo",
    "JobcarError",
    "PayloadTooLarge",
    "State",
]
__version__ = "0.1.0"
