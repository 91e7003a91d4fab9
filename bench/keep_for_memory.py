"""What the producer's dedupe window (`keep_for`) costs in Redis memory per finished job.

    .venv/bin/python bench/keep_for_memory.py [--jobs 10000]

Enqueues `--jobs` jobs with ids as a Spark write gives them (`order-000001`, ...) and the README's 100-byte
JSON payload (bench/footprint.py's), leases them and acks them through the ack script as a daemon with
`result_ttl: 0` does, then measures the finished jobs' hashes: `MEMORY USAGE` of each (mean) and the
`used_memory` delta per job against an empty namespace (the hash plus its key, its TTL entry and allocator
slack). Four ways: kept by `keep_for` only (the hash slimmed: no payload, meta or errors) with a 12-byte
result and without one, kept by `result_ttl` whole (for comparison), and no retention at all (deleted).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import RedisServer, find_server_binary

from jobcar import Client, transitions, transport
from jobcar.keys import QueueKeys

PAYLOAD_100 = {"data": "x" * 89}  # {"data":"xxx…"} is exactly 100 bytes of JSON, as bench/footprint.py
RESULT = b'{"ok": true}'
CHUNK = 1000


def finished_jobs(server: RedisServer, jobs: int, *, keep_for: str | None, retention_ms: int, result: bytes) -> tuple[
    float, float
]:  # fmt: skip
    """(mean MEMORY USAGE of a finished job's hash, used_memory delta per job) once `jobs` jobs ended."""
    with server.client() as client:
        client.flushall()
        producer = Client(client, namespace="mem")
        keys = QueueKeys.of("mem", "default")
        producer.enqueue("warm", PAYLOAD_100)  # the queue's own keys exist before the measurement
        client.delete(keys.pending)
        before = int(client.info("memory")["used_memory"])
        options = {"keep_for": keep_for} if keep_for else {}
        for start in range(0, jobs, CHUNK):
            specs = [("bench", PAYLOAD_100, {"job_id": f"order-{n:06d}", "batch": "spark-1", **options})
                     for n in range(start, min(start + CHUNK, jobs))]  # fmt: skip
            producer.enqueue_many(specs)
            lease = transitions.lease_call(keys, CHUNK, 60_000, 3, "{}")
            leased = transitions.parse_lease(keys, transport.execute(client, [lease])[0]).jobs
            acks = [transitions.ack_call(keys, j.job.id, j.token, result=result, retention_ms=retention_ms)
                    for j in leased]  # fmt: skip
            transport.execute(client, [transitions.merge_acks(acks[i : i + 50]) for i in range(0, len(acks), 50)])
        delta = (int(client.info("memory")["used_memory"]) - before) / jobs
        sizes = [client.memory_usage(keys.job(f"order-{n:06d}"), samples=0) or 0 for n in range(0, jobs, 10)]
        return (sum(sizes) / len(sizes) if sizes else 0.0), delta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(find_server_binary(), Path(directory) / "redis").start()
        try:
            rows = (
                ("keep_for 24h, result_ttl 0, with a result", "24h", 0, RESULT),
                ("keep_for 24h, result_ttl 0, no result", "24h", 0, b""),
                ("no keep_for, result_ttl 24h (whole hash)", None, 86_400_000, RESULT),
                ("no keep_for, result_ttl 0 (deleted)", None, 0, b""),
            )
            print(f"{args.jobs:,} finished jobs, 100-byte payload, batch spark-1")
            print(f"{'':45} {'MEMORY USAGE':>13} {'used_memory/job':>16}")
            for label, keep_for, retention_ms, result in rows:
                usage, delta = finished_jobs(server, args.jobs, keep_for=keep_for, retention_ms=retention_ms,
                                             result=result)  # fmt: skip
                print(f"{label:45} {usage:13.0f} {delta:16.0f}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
