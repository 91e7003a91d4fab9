"""docs/protocol.md's promise: a producer in another language enqueues by calling the script itself."""

from __future__ import annotations

from pathlib import Path

import redis

import jobcar
from jobcar import State
from jobcar.client import Client

LUA = Path(jobcar.__file__).parent / "lua"


def documented_source(name: str) -> str:
    """The rule from docs/protocol.md, applied without jobcar's own loader: each `--- @include "x"` line is
    replaced by includes/x.lua with its own includes replaced first; a file already inserted is skipped."""
    inserted: set[str] = set()

    def expand(text: str) -> str:
        lines = []
        for line in text.split("\n"):
            if line.startswith('--- @include "'):
                helper = line.split('"')[1]
                if helper not in inserted:
                    inserted.add(helper)
                    lines.append(expand((LUA / "includes" / f"{helper}.lua").read_text()))
            else:
                lines.append(line)
        return "\n".join(lines)

    return expand((LUA / f"{name}.lua").read_text())


def test_the_documented_redis_cli_example_enqueues_a_job(r: redis.Redis, namespace: str) -> None:
    sha = r.script_load(documented_source("enqueue"))
    prefix = f"{namespace}:{{default}}:"
    r.sadd(f"{namespace}:queues", "default")
    reply = r.evalsha(
        sha, 3, prefix + "pending", prefix + "scheduled", prefix + "wake",
        prefix, "order-17", "order.ship", '{"order":17}', "0", "0", "", "0", "1", "max_attempts", "5",
    )  # fmt: skip
    assert reply == [b"pending"]
    again = r.evalsha(
        sha, 3, prefix + "pending", prefix + "scheduled", prefix + "wake",
        prefix, "order-17", "order.ship", "{}", "0", "0", "", "0", "0",
    )  # fmt: skip
    assert again == [[b"exists", b"order-17", b"pending"]]
    job = Client(r, namespace=namespace).get("order-17")
    assert job is not None
    assert (job.type, job.payload, job.max_attempts, job.state) == ("order.ship", b'{"order":17}', 5, State.PENDING)
