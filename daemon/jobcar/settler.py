"""Dependencies (ADR 0016): carry how a job ended to the jobs waiting for it.

The script that ends a job others wait for leaves an entry in its queue's `settled` list: [[id, ...], outcome,
[reference, ...]] (the jobs one call ended the same way for the same waiting jobs), and wakes the queue with a
settled wake (leasing.SETTLED_WAKE). The settler tells each waiting job (the settle script, on that job's own slot,
which on a Cluster may be another node's), then removes the entry. A queue is settled at once when this daemon's
ack, kill or retry left an entry, and when its watcher was woken by a settled wake (an entry another process left:
a CLI's cancel, a Spark driver's seal_batch, another daemon's reap). Every daemon also looks at the queues it
serves every PASS_INTERVAL: the backstop for what no wake reached (a crash between the two steps, a queue busy
enough that its watcher was not waiting). That look is one EXISTS over every served queue's list, and reads the
lists only when one exists (ADR 0022). Telling a job twice changes nothing, so two daemons carrying the same entry
are harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import time
from typing import Final

from jobcar.config_types import Config
from jobcar.dependency_calls import settle_call
from jobcar.keys import QueueKeys, job_ref, split_job_ref
from jobcar.leasing import IDLE_WAIT_MAX
from jobcar.loops import any_exists
from jobcar.recording import dead_letter_limits
from jobcar.redis_link import RedisLink, naming_key
from jobcar.scripts import Arg, ScriptCall
from jobcar.transitions import DeadLetterLimits

log = logging.getLogger("jobcar.settler")

#: The longest a queue's ended dependencies wait for a look when no wake announced them: the watchers' own
#: longest wait, which is how long a lost wake may hold up a job too.
PASS_INTERVAL: Final = IDLE_WAIT_MAX
#: Entries read per queue and look; a queue with more is looked at again at once.
ENTRIES_PER_LOOK: Final = 500
OUTCOMES: Final = frozenset({"done", "dead", "canceled"})
#: Refused settles remembered (job id -> the refusal), so that one kept at every pass is logged once.
REFUSALS_REMEMBERED: Final = 1000


class Settler:
    def __init__(self, queues: list[QueueKeys], link: RedisLink, config: Config) -> None:
        self.queues = {keys.queue: keys for keys in queues}
        self.link = link
        self.config = config
        self._due: set[str] = set()
        self._woken = asyncio.Event()
        self.pass_interval = PASS_INTERVAL
        self._full_pass_at = -math.inf  # monotonic time of the last look at every queue: the first is due at once
        self._refusals: dict[Arg, str] = {}

    def apply(self, config: Config) -> None:
        self.config = config

    def wake(self, queue: str) -> None:
        """The queue's settled list may hold an entry (this daemon's outcome left one, or its watcher had a
        settled wake): look at it now."""
        if queue in self.queues:
            self._due.add(queue)
            self._woken.set()

    async def step(self) -> None:
        """The queues a wake announced as soon as it did, and every queue each pass_interval, however busy
        the announced ones keep it (a fan-in's acks must not hold up the deaths and cancels of the others)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, self._full_pass_at + self.pass_interval - time.monotonic())):
                await self._woken.wait()
        self._woken.clear()
        due, self._due = self._due, set()
        queues = [self.queues[queue] for queue in sorted(due)]
        try:
            if time.monotonic() >= self._full_pass_at + self.pass_interval:
                self._full_pass_at = time.monotonic()
                # The pass first asks whether any of the other queues' settled lists exists, in one command:
                # an idle daemon's pass is that one EXISTS, not one LRANGE per queue (ADR 0022). A list of
                # another type exists too, so its refusal is still logged (the look names the key).
                others = [keys for queue, keys in sorted(self.queues.items()) if queue not in due]
                if await any_exists(self.link, [keys.settled for keys in others]):
                    queues = [self.queues[queue] for queue in sorted(self.queues)]
            while queues:  # again for the queues whose look was full: they may hold more
                looks, outage = await self._look(queues)
                carried = [await self._carry(keys, entries) if entries else 0
                           for keys, entries in zip(queues, looks, strict=True)]  # fmt: skip
                if outage is not None:
                    raise outage  # after the queues that answered were carried; counted by the loop
                # A full look that carried none (every entry kept by a refusal) waits for the next pass.
                queues = [k for k, entries, n in zip(queues, looks, carried, strict=True)
                          if len(entries) == ENTRIES_PER_LOOK and n]  # fmt: skip
        finally:
            # On a failure this round's queues are due again (carrying an entry twice changes nothing).
            self._due.update(keys.queue for keys in queues)

    async def _look(self, queues: list[QueueKeys]) -> tuple[list[list[bytes | str]], BaseException | None]:
        """Up to ENTRIES_PER_LOOK entries of each queue's settled list, in one round trip, and the first error
        among them that is an outage. A list of another type (fsck reports it) holds none, and nor does a
        queue whose node failed to answer."""
        pipe = self.link.client.pipeline(transaction=False)
        for keys in queues:
            pipe.lrange(keys.settled, 0, ENTRIES_PER_LOOK - 1)
        replies = await self.link.call(functools.partial(pipe.execute, raise_on_error=False))
        replies = [naming_key(reply, keys.settled, "list") for keys, reply in zip(queues, replies, strict=True)]
        outage = self.link.note_refusals(replies)
        return [reply if isinstance(reply, list) else [] for reply in replies], outage

    async def _carry(self, keys: QueueKeys, entries: list[bytes | str]) -> int:
        """Tell the waiting jobs of these entries, then remove them: how many were removed."""
        # Every waiting job of these entries told in one round trip, then the entries removed in another: a
        # fan-in of 10,000 jobs is 10,000 entries, and one round trip each would make the settler its pace.
        dead = dead_letter_limits(self.config)
        calls_of = [settle_calls_of(keys, entry, dead) for entry in entries]
        calls = [c for entry_calls in calls_of for c in entry_calls]
        replies = await self.link.scripts(calls, each_its_own=True) if calls else []
        for c, reply in zip(calls, replies, strict=True):
            if isinstance(reply, Exception):  # a refusal (a key of another type), for fsck to report
                self._log_refusal(c, reply)
        # An entry with a refused settle stays, to be carried again at a later pass: a waiting job whose own
        # dependents could not be told (its queue's settled list holds another type) is told once fsck
        # repaired that key, rather than never. Telling the others twice changes nothing.
        told = iter(not isinstance(reply, Exception) for reply in replies)
        done = [entry for entry, entry_calls in zip(entries, calls_of, strict=True)
                if all([next(told) for _ in entry_calls])]  # fmt: skip
        if not done:
            return 0
        pipe = self.link.client.pipeline(transaction=False)
        for entry in done:
            pipe.lrem(keys.settled, 1, entry)  # type: ignore[arg-type]
        await self.link.call(pipe.execute)
        return len(done)

    def _log_refusal(self, c: ScriptCall, refusal: Exception) -> None:
        """Log a refused settle once, not at every pass that carries its entry again."""
        if self._refusals.get(c.args[1]) == str(refusal):
            return
        log.error("could not settle a dependency: %s", refusal, extra={"job_id": c.args[1]})
        if len(self._refusals) >= REFUSALS_REMEMBERED:
            self._refusals.clear()
        self._refusals[c.args[1]] = str(refusal)


def settle_calls_of(keys: QueueKeys, entry: bytes | str, dead: DeadLetterLimits) -> list[ScriptCall]:
    """The settle calls an entry of `keys.settled` asks for, one per waiting job; none for an entry that is
    not one (logged)."""
    try:
        ended, outcome, refs, *counts = json.loads(entry)
        well_formed = (
            isinstance(ended, list) and all(isinstance(i, str) for i in ended) and outcome in OUTCOMES
            and all(isinstance(r, str) for r in refs) and (not counts or isinstance(counts[0], dict))
        )  # fmt: skip
        if not well_formed:
            raise ValueError(entry)
    except (ValueError, TypeError):
        log.error("dropped a malformed entry of %s: %r", keys.settled, entry[:200])
        return []
    dependencies = [job_ref(keys.queue, job_id) for job_id in ended]
    # A batch's counts (its callbacks' entry), as the callbacks' payloads carry them.
    # ("queue" is in the counts the scripts write; entries left by older scripts lack it.)
    batch_counts = json.dumps({"queue": keys.queue, **counts[0]}, separators=(",", ":")) if counts else ""
    calls = []
    for ref in refs:
        queue, waiting_id = split_job_ref(ref)
        waiting_keys = QueueKeys.of(keys.namespace, queue)
        calls.append(settle_call(waiting_keys, waiting_id, dependencies, outcome, dead, batch_counts))
    return calls
