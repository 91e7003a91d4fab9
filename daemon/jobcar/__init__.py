"""jobcar: a sidecar daemon that runs background jobs from Redis through HTTP and command handlers.

This package root stays lean on purpose: its names (`from jobcar import Client`) are imported at first
use, and need only the standard library and redis-py, so `from jobcar import Client` works on a Spark
executor or from a zip, and `import jobcar.cli` for `jobcar --version` loads none of them. The daemon's
modules (config, runner, executors, api, ...) are imported only by the daemon.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from jobcar.client import AsyncClient, BatchSeal, BatchStatus, Client
    from jobcar.errors import InvalidJob, JobcarError, PayloadTooLarge, QueueFull, TargetWarning
    from jobcar.job import EnqueueStatus, Job, JobInfo, State
    from jobcar.options import EnqueueOptions

__all__ = [
    "AsyncClient",
    "BatchSeal",
    "BatchStatus",
    "Client",
    "EnqueueOptions",
    "EnqueueStatus",
    "InvalidJob",
    "Job",
    "JobInfo",
    "JobcarError",
    "PayloadTooLarge",
    "QueueFull",
    "State",
    "TargetWarning",
]
__version__ = "0.1.0"

#: The module each public name comes from.
_HOMES: Final = {
    "AsyncClient": "jobcar.client",
    "BatchSeal": "jobcar.client",
    "BatchStatus": "jobcar.client",
    "Client": "jobcar.client",
    "InvalidJob": "jobcar.errors",
    "JobcarError": "jobcar.errors",
    "PayloadTooLarge": "jobcar.errors",
    "QueueFull": "jobcar.errors",
    "TargetWarning": "jobcar.errors",
    "EnqueueOptions": "jobcar.options",
    "EnqueueStatus": "jobcar.job",
    "Job": "jobcar.job",
    "JobInfo": "jobcar.job",
    "State": "jobcar.job",
}

# Only at run time: to a type checker the names are the imports above, and an unknown name an error.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # found at once from now on
        return value
