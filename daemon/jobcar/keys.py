"""The Redis key layout (docs/protocol.md): every key of a queue, built in one place.

Only the standard library is imported: producers (a Spark executor with jobcar as a zip) use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

DEFAULT_NAMESPACE: Final = "jobcar"
DEFAULT_QUEUE: Final = "default"
#: Priorities run from 0 (the default, leased first) to this (leased last).
MAX_PRIORITY: Final = 9


def job_ref(queue: str, job_id: str) -> str:
    """How a job names another across queues (dependencies, ADR 0016): "<queue>/<id>". A queue name holds
    no "/", so the first one splits the two."""
    return f"{queue}/{job_id}"


def split_job_ref(ref: str) -> tuple[str, str]:
    """(queue, id) of a reference made by `job_ref`."""
    queue, _, job_id = ref.partition("/")
    return queue, job_id


def queues_key(namespace: str) -> str:
    """The SET of known queue names (written by producers outside the scripts: it crosses slots)."""
    return f"{namespace}:queues"


def daemons_key(namespace: str) -> str:
    """The HASH of the daemons that announced themselves: daemon id -> JSON (fleet.py)."""
    return f"{namespace}:daemons"


#: The version of this key layout. A namespace records the version of its keys in `layout_key`; a change that
#: daemons of the previous layout would misread or not keep up raises it, with a step in migrate.py to bring keys
#: to it.
LAYOUT_VERSION: Final = 3


def layout_key(namespace: str) -> str:
    """The STRING holding the version of the namespace's key layout (ADR 0019). Not under a hash tag: it is
    read and written on its own, at a daemon's start and by `jobcar migrate`."""
    return f"{namespace}:layout"


def all_earlier_slot_sets(namespace: str) -> str:
    """A SCAN pattern matching the slot SETs of layout 1, `<prefix>running:<group>`, of every queue, and maybe
    keys of other names, which `earlier_slot_set` tells apart."""
    return _glob_escape(f"{namespace}:{{") + "*}:running:*"


def earlier_slot_set(namespace: str, key: str) -> tuple[str, str] | None:
    """(queue, group) of a slot SET of layout 1, or None for a key of another name."""
    match = re.fullmatch(re.escape(f"{namespace}:{{") + r"([^{}]+)\}:running:(.+)", key, re.DOTALL)
    return (match[1], match[2]) if match else None


def all_pending_keys(namespace: str) -> str:
    """A SCAN pattern matching the pending lists, the pending counts and the held lists of every queue
    (`<prefix>pending*`, `<prefix>held:*`), and maybe keys of other names, which `queue_of_pending_key` tells
    apart: one walk of the keyspace finds every queue that may hold pending or held jobs, or counts of them."""
    return _glob_escape(f"{namespace}:{{") + "*}:[ph]e[nl]*"


def queue_of_pending_key(namespace: str, key: str) -> str | None:
    """The queue of a pending list, of the pending counts or of a held list, or None for a key of another name."""
    match = re.fullmatch(re.escape(f"{namespace}:{{") + r"([^{}]+)\}:.+", key, re.DOTALL)
    if match is None:
        return None
    keys = QueueKeys.of(namespace, match[1])
    if key in keys.pending_lists or key == keys.pending_counts or key.startswith(keys.held("")):
        return keys.queue
    return None


def waiter_ttl_ms(wait_seconds: float) -> int:
    """How long a waiter's mark lives: the wait, and a second more for the look that follows the job's end."""
    return int(wait_seconds * 1000) + 1000


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Every key of one queue. All carry the hash tag `{<queue>}`, so they live in one Cluster slot."""

    namespace: str
    queue: str
    prefix: str
    pending: str
    scheduled: str
    active: str
    dead: str
    wake: str
    paused: str

    @classmethod
    def of(cls, namespace: str, queue: str) -> QueueKeys:
        return _queue_keys(namespace, queue)

    @property
    def pending_lists(self) -> tuple[str, ...]:
        """The pending lists: `pending` holds priority 0 (the default), `pending:<p>` 1 to 9, and
        `pending:released` the jobs a concurrency limit held and let go, which the lease takes first."""
        return (self.pending, *(f"{self.pending}:{p}" for p in range(1, MAX_PRIORITY + 1)), self.released)

    @property
    def lease_order(self) -> tuple[str, ...]:
        """The pending lists in the order the lease takes them: the released jobs, then by priority."""
        return (self.released, *self.pending_lists[:-1])

    @property
    def released(self) -> str:
        """The jobs a concurrency limit held and let go, FIFO, leased before every other pending job."""
        return f"{self.pending}:released"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def waiter(self, job_id: str) -> str:
        """Set while someone waits for the job (for `waiter_ttl_ms`): its ack keeps it a while even without a
        kept result."""
        return f"{self.prefix}waiter:{job_id}"

    def log(self, job_id: str) -> str:
        """The LIST of the job's log lines, oldest first, each a JSON object {"at", "attempt", "line"}: written by
        its handlers through the handler API, bounded (the job hash's `log_bytes` and `log_dropped` count)."""
        return f"{self.prefix}log:{job_id}"

    def steps(self, job_id: str) -> str:
        """The HASH of the job's durable steps: name -> "<ms> <result bytes>", kept across its attempts."""
        return f"{self.prefix}steps:{job_id}"

    def children(self, job_id: str) -> str:
        """The ZSET of the references "<queue>/<id>" of the jobs its handlers made as its children, by creation ms."""
        return f"{self.prefix}children:{job_id}"

    def unique(self, unique_key: str) -> str:
        return f"{self.prefix}unique:{unique_key}"

    def window(self, unique_key: str) -> str:
        """A unique key held for its whole `unique_for`, whatever happens to the job that took it."""
        return f"{self.prefix}window:{unique_key}"

    def debounce(self, debounce_key: str) -> str:
        """The id of the job a debounce key's enqueues go into while it waits."""
        return f"{self.prefix}debounce:{debounce_key}"

    def schedule(self, name: str) -> str:
        """A schedule's hash: its spec, its next and last tick, its counts (docs/schedules.md)."""
        return f"{self.prefix}schedule:{name}"

    @property
    def schedules(self) -> str:
        """The ZSET of the queue's schedules by their next tick (ms): what the daemons fire."""
        return f"{self.prefix}schedules"

    @property
    def limit_groups(self) -> str:
        """The SET of the limit groups that held a job, until idle (ADR 0014)."""
        return f"{self.prefix}limit_groups"

    @property
    def throttled(self) -> str:
        """The ZSET of the rate groups holding jobs, by when their next job may start (ms): ADR 0014."""
        return f"{self.prefix}throttled"

    def slots(self, job_type: str) -> str:
        """The HASH of the ids holding a slot of a type's limits, each to the key whose slot it also holds ("" for
        none): its length is the type's slots taken, a key's are the entries with its key."""
        return f"{self.prefix}slots:{job_type}"

    def held(self, group: str) -> str:
        """The LIST of the jobs waiting for a slot of a limit group, oldest at the right."""
        return f"{self.prefix}held:{group}"

    def tat(self, group: str) -> str:
        """A rate group's theoretical arrival time (ms, GCRA), a STRING that expires once past."""
        return f"{self.prefix}tat:{group}"

    def turns(self, job_type: str) -> str:
        """The ZSET of the keys whose jobs wait for their turn of a fair type's total, next first."""
        return f"{self.prefix}turns:{job_type}"

    def all_limit_keys(self) -> str:
        """A SCAN pattern matching every limit key of the queue ("slots:", "held:", "tat:"), and a few other
        keys that the caller tells apart by name, but none of its jobs: one walk of the keyspace for all three."""
        return _glob_escape(self.prefix) + "[hst][ael]*"

    @property
    def settings(self) -> str:
        """The HASH of the queue's settings that producers' scripts read, written by the daemons serving the queue
        from their config at start and on reload: `max_pending` and `max_pending:<type>` (ADR 0024)."""
        return f"{self.prefix}settings"

    @property
    def pending_counts(self) -> str:
        """The HASH type -> how many of the queue's jobs of that type are pending or held (in its pending lists or
        a limit's held list): kept by every script that moves a job into or out of them, for the backpressure
        bounds (ADR 0024)."""
        return f"{self.prefix}pending_counts"

    @property
    def waiting(self) -> str:
        """The ZSET of jobs waiting for others (`after`) by creation time (ms): ADR 0016."""
        return f"{self.prefix}waiting"

    def deps(self, job_id: str) -> str:
        """The SET of a waiting job's dependencies that have not ended, as references "<queue>/<id>"."""
        return f"{self.prefix}deps:{job_id}"

    def dependents(self, job_id: str) -> str:
        """The SET of references "<queue>/<id>" of the jobs waiting for this one, until it ends."""
        return f"{self.prefix}dependents:{job_id}"

    @property
    def settled(self) -> str:
        """The LIST of the queue's ended jobs whose dependents the daemons have still to tell: JSON entries
        [[id, ...], outcome, [reference, ...]] (and a batch's counts, for its callbacks)."""
        return f"{self.prefix}settled"

    def batch(self, batch_id: str) -> str:
        return f"{self.prefix}batch:{batch_id}"

    @property
    def history(self) -> str:
        """The base of the queue's per-hour history hashes (`<prefix>history:<hour>`): names its slot."""
        return f"{self.prefix}history"

    def history_hour(self, hour: int) -> str:
        """The HASH of the queue's counts in one hour (hours since the epoch), written by the scripts."""
        return f"{self.history}:{hour}"

    def alive(self, daemon_id: str) -> str:
        return f"{self.prefix}alive:{daemon_id}"

    def all_jobs(self, id_prefix: str = "") -> str:
        """A SCAN pattern matching every job hash of the queue (and nothing else), or those whose id starts so."""
        return _glob_escape(self.job(id_prefix)) + "*"

    def all_unique_locks(self) -> str:
        """A SCAN pattern matching every unique lock of the queue."""
        return _glob_escape(self.unique("")) + "*"

    def all_windows(self) -> str:
        """A SCAN pattern matching every unique key of the queue held for a whole window."""
        return _glob_escape(self.window("")) + "*"

    def all_debounce_keys(self) -> str:
        """A SCAN pattern matching every debounce key of the queue."""
        return _glob_escape(self.debounce("")) + "*"

    def all_schedules(self) -> str:
        """A SCAN pattern matching every schedule hash of the queue."""
        return _glob_escape(self.schedule("")) + "*"

    def all_batches(self) -> str:
        """A SCAN pattern matching every batch's counters of the queue."""
        return _glob_escape(self.batch("")) + "*"


def all_starting(start: str) -> str:
    """A SCAN pattern matching every key whose name starts with `start` (e.g. a queue's `slots("")`)."""
    return _glob_escape(start) + "*"


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


@lru_cache(maxsize=4096)
def _queue_keys(namespace: str, queue: str) -> QueueKeys:
    # Producers and the daemon ask for the same few queues on every call; the keys never change.
    prefix = f"{namespace}:{{{queue}}}:"
    return QueueKeys(
        namespace=namespace,
        queue=queue,
        prefix=prefix,
        pending=prefix + "pending",
        scheduled=prefix + "scheduled",
        active=prefix + "active",
        dead=prefix + "dead",
        wake=prefix + "wake",
        paused=prefix + "paused",
    )
