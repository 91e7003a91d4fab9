"""What a producer that knows a config says of a job it enqueues: a type no handler of that config runs, or a
queue it does not serve. Another daemon of the fleet may run them, so by default it is a warning (the CLI's
note, the HTTP API's `Jobcar-Warning` header, a `TargetWarning` from `Client.from_config`); with the config's
`strict_enqueue` it is a refusal, before anything is written.

Standard library only: the producer client imports it.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from jobcar.errors import InvalidJob


class TargetRefused(InvalidJob):
    """Under `strict_enqueue`: jobs of a type no handler runs or to a queue not served, none written."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"{'; '.join(problems)}: nothing enqueued (strict_enqueue is on)")
        self.problems = problems


def did_you_mean(name: str, candidates: Collection[str]) -> str:
    """` (did you mean 'x'?)` for the closest of `candidates`, or "" when none is close."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


@functools.lru_cache(maxsize=1024)
def _suggestion(name: str, candidates: frozenset[str]) -> str:
    """`did_you_mean`, remembered: the HTTP API asks it of every request whose type or queue its config does not
    know (the jobs of other daemons of the fleet, often all of them), and difflib is a measurable share of a
    request. Bounded, so that names made up by a producer cannot grow it."""
    return did_you_mean(name, candidates)


@dataclass(frozen=True, slots=True)
class KnownTargets:
    """The job types and queues a config runs (`source` names the file)."""

    source: str
    types: frozenset[str]
    queues: frozenset[str]
    strict: bool = False
    #: The config's queue patterns (ADR 0027): a queue one matches is served.
    queue_patterns: tuple[str, ...] = ()

    def problems(self, jobs: Iterable[tuple[str, str]]) -> list[str]:
        """What is wrong with the (type, queue) pairs of `jobs`, each problem once, in their order."""
        found: dict[str, None] = {}
        for job_type, queue in jobs:
            if job_type not in self.types:
                found[f"{self.source} has no handler for type {job_type!r}{_suggestion(job_type, self.types)}"] = None
            if queue not in self.queues and not any(fnmatchcase(queue, p) for p in self.queue_patterns):
                found[f"queue {queue!r} is not in the queues of {self.source}{_suggestion(queue, self.queues)}"] = None
        return list(found)

    def check(self, jobs: Iterable[tuple[str, str]]) -> list[str]:
        """The problems of `jobs` (type, queue) to warn of; TargetRefused when `strict` and there are any."""
        problems = self.problems(jobs)
        if problems and self.strict:
            raise TargetRefused(problems)
        return problems
