"""A queue's pending counts rebuilt from its lists and job hashes (`lua/recount_pending.lua`): fsck's repair of a
count gone wrong, and `jobcar migrate`'s step to key layout 3, whose earlier daemons kept no counts."""

from __future__ import annotations

from dataclasses import dataclass

from jobcar.keys import QueueKeys
from jobcar.replies import as_int, as_list, as_text
from jobcar.scripts import Reply, ScriptCall, call
from jobcar.transport import AsyncRedis, execute_async


@dataclass(frozen=True, slots=True)
class Recount:
    """What a recount found: whether the stored counts were wrong (it wrote the true ones then), and the true
    counts, job type ("" for none) -> jobs pending or held, each at least 1."""

    changed: bool
    counts: dict[str, int]


def recount_call(keys: QueueKeys, *, write: bool = True) -> ScriptCall:
    """The recount; without `write`, only its answer: whether the counts are wrong, and the true ones."""
    return call("recount_pending", [keys.pending_counts], [keys.prefix] if write else [keys.prefix, "check"])


def parse_recount(reply: Reply) -> Recount:
    changed, *pairs = as_list(reply)
    counts = {as_text(job_type): as_int(n) for job_type, n in zip(pairs[::2], pairs[1::2], strict=True)}
    return Recount(as_int(changed) == 1, counts)


async def recount_pending(client: AsyncRedis, keys: QueueKeys, *, write: bool = True) -> Recount:
    """Recount the queue's pending counts, atomically (one script call, O(jobs pending and held)); without
    `write`, only compare them with the truth."""
    (reply,) = await execute_async(client, [recount_call(keys, write=write)])
    return parse_recount(reply)
