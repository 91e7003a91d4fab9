"""How the CLI and the dashboard write a duration (cli_format.span): short, and never a 60 in a field that
counts to 59."""

from __future__ import annotations

import pytest

from jobcar.cli_format import span


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0.0s"),
        (9.96, "10.0s"),
        (10.4, "10s"),
        (59.9, "59s"),
        (60, "1m00s"),
        (119.7, "1m59s"),
        (3599.9, "59m59s"),
        (3600, "1h00m"),
        (86399.9, "23h59m"),
        (90061, "1d01h"),
    ],
)
def test_durations(seconds: float, text: str) -> None:
    assert span(seconds) == text
