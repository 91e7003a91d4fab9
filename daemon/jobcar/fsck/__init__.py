"""`jobcar fsck`: check one queue's keys against the invariants of docs/protocol.md, and repair them.

The queue is read first (`reading`), then each check of the table (`checks.CHECKS`) finds its suspects in
what was read, in order, and with --repair each suspect is repaired at once where a safe repair exists
(`repairs`). The reads are plain commands, so under a running daemon they are not one instant: every repair
re-checks its condition atomically, and a finding whose condition was gone when its repair ran was a
passing view, not corruption, and is dropped from the result; a check whose findings a busy queue would make
up (the pending counts) confirms them atomically before they are reported. With --repair, a round that repaired anything
is followed by another read and round, so that one run converges: the result holds every repair made and
what the last round found and could not repair.
"""

from __future__ import annotations

from typing import Final

from jobcar.fsck.checks import CHECKS
from jobcar.fsck.findings import Finding, Kind
from jobcar.fsck.reading import read_queue
from jobcar.fsck.repairs import Target
from jobcar.keys import QueueKeys
from jobcar.transitions import DeadLetterLimits
from jobcar.transport import AsyncRedis

__all__ = ["Finding", "Kind", "check_queue"]

#: How many times a repairing run reads the queue again after a round that repaired something: a repair can
#: uncover what the first read could not see (a trimmed dead job still listed in another set has lost its
#: hash), and one run must leave a queue that a second finds clean.
MAX_ROUNDS: Final = 4


async def check_queue(
    client: AsyncRedis, keys: QueueKeys, *, repair: bool, dead_limits: DeadLetterLimits, namespace: bool = True
) -> list[Finding]:
    """Every inconsistency found in one queue's keys (with `namespace`, in the namespace's keys outside every
    queue too); with `repair`, each is repaired where a safe repair exists, and marked so. A finding whose
    condition was gone by the time its repair ran is left out."""
    target = Target(client, keys, dead_limits)
    repaired: list[Finding] = []
    reported: list[Finding] = []
    for _ in range(MAX_ROUNDS):
        seen = await read_queue(client, keys, dead_limits, namespace=namespace)
        reported = []
        made = len(repaired)
        for check in CHECKS:
            for found in check.find(seen):
                if not repair or check.repair is None:
                    suspect = found if check.confirm is None else await check.confirm(target, found)
                    if suspect is not None:
                        reported.append(Finding(keys.queue, check.kind, suspect.job_id, suspect.detail))
                elif (done := await check.repair(target, found)) is not None:
                    repaired.append(Finding(keys.queue, check.kind, done.job_id, done.detail, repaired=True))
        if len(repaired) == made:
            break
    return repaired + reported
