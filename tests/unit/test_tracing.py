"""tracing.py's promise: with tracing off, no OpenTelemetry module is ever imported (not by the daemon's modules,
not by a producer's enqueue), and the facade's small pure parts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobcar import tracing

ROOT = Path(__file__).resolve().parents[2]

_LOAD_EVERYTHING = textwrap.dedent(
    """\
    import importlib, pkgutil, sys, traceback
    BLOCK = sys.argv[1] == "block"

    class Watch:
        \"\"\"Notes each import of an opentelemetry module made from jobcar's own code; with BLOCK, refuses
        every one (as an install without the packages would) so that nothing else loads them either.\"\"\"
        by_jobcar = []

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] != "opentelemetry":
                return None
            frames = [f.filename for f in traceback.extract_stack()[:-1]]
            if any("/jobcar/" in f and "importlib" not in f for f in frames):
                self.by_jobcar.append(name)
            if BLOCK:
                raise ImportError(name)
            return None

    sys.meta_path.insert(0, Watch())
    import redis  # redis-py 7+ loads OpenTelemetry's metrics SDK by itself where it is installed
    by_redis = {name for name in sys.modules if name.split(".")[0] == "opentelemetry"}
    import jobcar
    # Every module of the package but the one that is OpenTelemetry's (loaded only when tracing is on) and the
    # Spark ones (they need pyspark, and a Spark executor is another process anyway).
    for module in pkgutil.walk_packages(jobcar.__path__, "jobcar."):
        if module.name != "jobcar.tracing_otel" and not module.name.startswith("jobcar.spark"):
            importlib.import_module(module.name)
    from jobcar import tracing
    from jobcar.config import parse_config
    from jobcar.daemon import Daemon
    config = parse_config("handlers: {t: {command: [cat]}}", "jobcar.yaml", {})
    assert not config.tracing.enabled
    Daemon(config)
    assert tracing.setup(config.tracing) is None and tracing.active is None
    assert tracing.for_producer() is None  # what every enqueue asks
    loaded = {name for name in sys.modules if name.split(".")[0] == "opentelemetry"}
    print(sorted(Watch.by_jobcar), sorted(loaded - by_redis), "opentelemetry" in sys.modules)
    """
)


def test_tracing_off_imports_no_opentelemetry_module() -> None:
    """As on an install without the `otel` extra: nothing loads OpenTelemetry, and no jobcar module tries to."""
    result = subprocess.run([sys.executable, "-c", _LOAD_EVERYTHING, "block"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] [] False"


def test_tracing_off_with_the_otel_extra_installed_adds_no_opentelemetry_module() -> None:
    """With the packages installed, redis-py loads OpenTelemetry's metrics SDK on its own (inert until
    configured); jobcar's modules and a daemon with tracing off load nothing more, and never ask for any."""
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is what this case is about")
    result = subprocess.run([sys.executable, "-c", _LOAD_EVERYTHING, "watch"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    by_jobcar, added, _ = result.stdout.strip().split(" ", 2)
    assert (by_jobcar, added) == ("[]", "[]")


def test_a_producer_in_an_app_that_uses_opentelemetry_gets_a_tracer_over_the_apps_provider() -> None:
    pytest.importorskip("opentelemetry.sdk")
    code = "import opentelemetry.sdk.trace\nfrom jobcar import tracing\nprint(type(tracing.for_producer()).__name__)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Tracer"


@pytest.mark.parametrize(
    ("traceparent", "trace_id"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_trace_id_of(traceparent: str | None, trace_id: str | None) -> None:
    assert tracing.trace_id_of(traceparent) == trace_id


def test_traceparents_round_trip() -> None:
    tracing_otel = pytest.importorskip("jobcar.tracing_otel")
    text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    context = tracing_otel.parse_traceparent(text)
    assert context is not None
    assert tracing_otel.format_traceparent(context) == text
    assert tracing_otel.parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01") is None
    assert tracing_otel.parse_traceparent("00-xyz") is None
