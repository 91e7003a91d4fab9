"""From an attempt's Outcome to the transition that records it, and from that transition's reply to what
became of the job. Pure: no I/O.

    success      ack   -> done (or canceled: a job canceled before it ran)
    fail         kill  -> dead
    retry        retry -> retried, or dead when its attempts are spent
    given back   retry (no attempt spent) -> returned
    any, when the lease was lost meanwhile -> lease_lost (nothing changed)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from jobcar.backoff import retry_delay
from jobcar.config_types import DEFAULT_MAX_SNOOZES, Config, Limits
from jobcar.job import State
from jobcar.keys import QueueKeys
from jobcar.outcome import Outcome, OutcomeKind
from jobcar.scripts import Reply, ScriptCall
from jobcar.transitions import (
    ENDED_AND_TELLS,
    DeadLetterLimits,
    HoldBack,
    LeasedJob,
    RetryResult,
    ack_call,
    kill_call,
    retry_call,
)


class Recorded(StrEnum):
    """What recording an outcome made of the job: the `outcome` label of jobcar_jobs_finished_total."""

    DONE = "done"
    CANCELED = "canceled"
    RETRIED = "retried"
    RETURNED = "returned"
    DEAD = "dead"
    LEASE_LOST = "lease_lost"


@dataclass(slots=True)  # not frozen: one is made per finished job, and frozen fields cost a setattr each
class OutcomeCall:
    """The transition that records one outcome, and what its success makes of the job."""

    call: ScriptCall
    #: What the job became when the script did the transition (a retry that spent the last attempt: dead).
    becomes: Recorded
    #: For a retry: seconds until the next attempt.
    retry_in: float | None = None
    #: The script's reply when the job ended and jobs in other queues wait for it (an entry for the settler):
    #: an ack's or kill's 2, a retry's 3 (its 2 already says "moved to dead").
    tells_at: int = ENDED_AND_TELLS

    def recorded(self, reply: Reply) -> Recorded:
        """What the job became, from the script's reply for this job (0: the lease was lost, nothing
        changed). For an ack that is its per-job value: the batcher sends acks merged, and
        `transitions.split_reply` hands each its own."""
        if reply == 0:
            return Recorded.LEASE_LOST
        if self.becomes in (Recorded.RETRIED, Recorded.RETURNED) and reply in _DIED:
            return Recorded.DEAD
        return self.becomes

    def tells_dependents(self, reply: Reply) -> bool:
        """Whether the transition left an entry for the settler: jobs in other queues waited for this one."""
        return reply == self.tells_at


#: A retry's replies for a job that spent its last attempt.
_DIED: Final = frozenset({RetryResult.DEAD, RetryResult.DEAD_AND_TELLS})


def dead_letter_limits(config: Config) -> DeadLetterLimits:
    return DeadLetterLimits(config.dead_letter.max_jobs, int(config.dead_letter.max_age * 1000))


def outcome_call(
    config: Config,
    keys: QueueKeys,
    leased: LeasedJob,
    outcome: Outcome,
    *,
    final: State = State.DONE,
    give_back: bool = False,
) -> OutcomeCall:
    """The call recording `outcome` of the attempt that holds `leased`. `final`: done, or canceled for a
    success that was a cancel. `give_back`: the attempt is returned unspent (a drain, an unhealthy app)."""
    job = leased.job
    if outcome.kind is OutcomeKind.SUCCESS:
        retention_ms = int(config.result_ttl * 1000)
        # A job the producer keeps (keep_for) keeps its result with its id, whatever result_ttl is (ack.lua).
        result = outcome.result if retention_ms or job.keep_for_ms else None
        call = ack_call(keys, job.id, leased.token, result=result, retention_ms=retention_ms, final=final)
        return OutcomeCall(call, Recorded.CANCELED if final is State.CANCELED else Recorded.DONE)
    if outcome.kind is OutcomeKind.FAIL:
        call = kill_call(keys, job.id, leased.token, outcome.error or "failed", dead_letter_limits(config))
        return OutcomeCall(call, Recorded.DEAD)
    handler = config.handlers.get(job.type)
    delay = outcome.retry_after
    if delay is None:
        policy = handler.backoff if handler else config.defaults.backoff
        if job.backoff_ms is not None:
            policy = replace(policy, base=job.backoff_ms / 1000)
        delay = retry_delay(policy, job.attempt)
    limits = handler.limits if handler else None
    max_snoozes = handler.max_snoozes if handler else DEFAULT_MAX_SNOOZES
    hold = hold_back(limits) if outcome.busy and limits is not None and limits.on_429 != "job" else None
    call = retry_call(
        keys,
        job.id,
        leased.token,
        delay_ms=int(delay * 1000),
        error=outcome.error or "retry",
        # A handler allowed no snooze spends its attempt on every one.
        spend_attempt=outcome.spend_attempt or (max_snoozes == 0 and not give_back),
        # A drain gives attempts back without limit: a restart must never cost a job its attempts.
        max_free_retries=0 if give_back else max_snoozes,
        dead=dead_letter_limits(config),
        hold=hold,
    )
    becomes = Recorded.RETURNED if give_back else Recorded.RETRIED
    return OutcomeCall(call, becomes, retry_in=delay, tells_at=RetryResult.DEAD_AND_TELLS)


def hold_back(limits: Limits) -> HoldBack:
    """What a handler's 429 holds back under `limits.on_429`: the type or the key, and for a group with a
    rate its burst's worth of intervals, so that no start of the group comes before the Retry-After."""
    rate, burst = (limits.per_key_rate, limits.per_key_burst) if limits.on_429 == "key" else (limits.rate, limits.burst)
    burst_ms = 0 if rate is None else round(rate.period * 1000 / rate.count * (burst - 1))
    return HoldBack(limits.on_429, limits.key, burst_ms)
