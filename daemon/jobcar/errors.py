"""Exceptions a producer may catch. Standard library only (the client imports this)."""

from __future__ import annotations


class JobcarError(Exception):
    """Base of jobcar's own errors."""


class InvalidJob(JobcarError, ValueError):
    """The job cannot be enqueued as given (bad type or queue name, bad option, bad payload)."""


class PayloadTooLarge(InvalidJob):
    """The encoded payload is over the client's `max_payload_bytes`."""


class TargetWarning(UserWarning):
    """A client made with `from_config` enqueued a job of a type no handler of that config runs, or to a queue
    it does not serve (with the config's `strict_enqueue`, an InvalidJob instead)."""
