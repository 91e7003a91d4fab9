"""`jobcar fsck`: check one queue's keys against the invariants of docs/protocol.md, and repair them.

The queue is read first (`reading`), then each check of the table (`checks.CHECKS`) finds its suspects in
what was read, in order, and with --repair each suspect is repaired at once where a safe repair exists
(`repairs`). The reads are plain commands, so under a running daemon they are not one instant: every repair
re-checks its condition atomically, and a finding whose condition was gone when its repair ran was a
passing view, not corruption, and is dropped from the result.
"""

from __future__ import annotations

from jobcar.fsck.checks import CHECKS
from jobcar.fsck.findings import Finding, Kind
from jobcar.fsck.reading import read_queue
from jobcar.fsck.repairs import Target
from jobcar.keys import QueueKeys
from jobcar.transitions import DeadLetterLimits
from jobcar.transport import AsyncRedis

__all__ = ["Finding", "Kind", "check_queue"]


async def check_queue(
    client: AsyncRedis, keys: QueueKeys, *, repair: bool, dead_limits: DeadLetterLimits
) -> list[Finding]:
    """Every inconsistency found in one queue's keys; with `repair`, each is repaired where a safe repair
    exists, and marked so. A finding whose condition was gone by the time its repair ran is left out."""
    seen = await read_queue(client, keys, dead_limits)
    target = Target(client, keys, dead_limits)
    findings: list[Finding] = []
    for check in CHECKS:
        for suspect in check.find(seen):
            if not repair or check.repair is None:
                findings.append(Finding(keys.queue, check.kind, suspect.job_id, suspect.detail))
            elif (repaired := await check.repair(target, suspect)) is not None:
                findings.append(Finding(keys.queue, check.kind, repaired.job_id, repaired.detail, repaired=True))
    return findings
