"""Retry delays. Jitter spreads retries of jobs that failed together (an outage) over time instead of
hammering the recovering handler in waves."""

from __future__ import annotations

import random

from jobcar.config_types import Backoff, BackoffStrategy


def retry_delay(policy: Backoff, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before the attempt after `attempt` (1-based, the one that just failed).

    exponential: full jitter, uniform in [0, min(max, base * 2^(attempt-1))] (the AWS "full jitter"
    scheme: the fewest collisions for the least total wait); linear: uniform in
    [0, min(max, base * attempt)]; constant: exactly base, capped at max.
    """
    uniform = (rng or random).uniform
    attempt = max(1, attempt)
    if policy.strategy is BackoffStrategy.CONSTANT:
        return min(policy.base, policy.max)
    if policy.strategy is BackoffStrategy.LINEAR:
        ceiling = policy.base * attempt
    else:
        # Cap the exponent: 2**1000 is a float overflow long before it matters.
        ceiling = policy.base * 2.0 ** min(attempt - 1, 64)
    return uniform(0, min(policy.max, ceiling))
