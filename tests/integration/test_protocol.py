"""docs/protocol.md's promise: a producer in another language enqueues by calling the script itself."""

from __future__ import annotations

from pathlib import Path

import redis

import jobcar
from jobcar import State
from jobcar.client import Client

LUA = Path(jobcar.__file__).parent / "lua"


def documented_source(name: str) -> str:
    """Steps 1 and 2 of docs/protocol.md's assembly, without jobcar's own loader and without inlining the
    one-line helpers (step 3), which the protocol leaves out for a script that only has to run: each
    `--- @include "x"` line is replaced by includes/x.lua (its trailing line breaks removed) with its own
    includes replaced first; a file already inserted leaves an empty line."""
    inserted: set[str] = set()

    def expand(text: str) -> str:
        lines = []
        for line in text.split("\n"):
            if not line.startswith('--- @include "'):
                lines.append(line)
                continue
            helper = line.split('"')[1]
            if helper in inserted:
                lines.append("")
            else:
                inserted.add(helper)
                lines.append(expand((LUA / "includes" / f"{helper}.lua").read_text().rstrip("\n")))
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
