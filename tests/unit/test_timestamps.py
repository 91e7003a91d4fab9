"""rfc3339: the timestamp form handlers receive (Jobcar-Enqueued-At, Jobcar-Deadline, JOBCAR_DEADLINE...)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from jobcar.timestamps import rfc3339


def test_known_instants() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_700_000_000.123) == "2023-11-14T22:13:20.123Z"
    assert rfc3339(1_700_000_000_999 / 1000) == "2023-11-14T22:13:20.999Z"
    assert rfc3339(1_699_999_999.9996) == "2023-11-14T22:13:20.000Z", "rounds to the nearest millisecond"


def test_every_millisecond_value_round_trips_exactly() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        ms = rng.randrange(0, 4_102_444_800_000)  # up to 2100
        text = rfc3339(ms / 1000)
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        assert parsed.utcoffset() == timedelta(0), text
        assert round(parsed.timestamp() * 1000) == ms, text
