"""How the dashboard writes a duration: short, and never a 60 in a field that counts to 59."""

from __future__ import annotations

import pytest

from jobcar.ui.pages import duration_text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0.0s"),
        (9.96, "10.0s"),
        (10.4, "10s"),
        (59.9, "59s"),
        (60, "1m 00s"),
        (119.7, "1m 59s"),
        (3599.9, "59m 59s"),
        (3600, "1h 00m"),
        (86399.9, "23h 59m"),
        (90061, "1d 1h"),
    ],
)
def test_durations(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text
