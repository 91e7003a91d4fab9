# Two commands on a fresh machine: `make run` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?= -n 2
# `make bench`: the peers (bench/requirements.txt) live in their own venv, never in .venv.
BENCH_PYTHON ?= python3.11
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_ARGS ?=

.PHONY: run test lint typecheck tools pytest bench bench-tools clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# The quickstart: an embedded Valkey (data in .jobcar-data/), the example HTTP handler on :8089 and the
# daemon in the foreground. Ctrl-C drains and stops all three.
run: $(STAMP)
	@echo "jobcar quickstart: enqueue from another terminal with"
	@echo "  $(BIN)/jobcar enqueue -c config/quickstart.yaml hello.shell '{\"name\": \"world\"}'"
	@echo "  $(BIN)/jobcar enqueue -c config/quickstart.yaml hello.http '{\"name\": \"world\"}'"
	@$(BIN)/python handlers/quickstart/hello_http.py & handler=$$!; \
	  trap 'kill $$handler 2>/dev/null' EXIT INT TERM; \
	  $(BIN)/jobcar run -c config/quickstart.yaml

test: lint typecheck tools pytest

# System tools some tests need beyond Python: systemd-analyze (packaging/jobcar.service is checked
# with `systemd-analyze verify`) and promtool (deploy/prometheus rules and config). The packages
# only install files here, they start nothing. Installed as root through apt when missing, else
# the tests say how.
tools:
	@missing=""; \
	  command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	  command -v promtool >/dev/null || missing="$$missing prometheus"; \
	  [ -z "$$missing" ] || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; }

lint: $(STAMP)
	$(BIN)/ruff check daemon tests bench
	$(BIN)/ruff format --check daemon tests bench

typecheck: $(STAMP)
	$(BIN)/mypy --strict daemon/jobcar

pytest: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# Every benchmark in one run, one table (bench/run.py): jobcar from .venv, the peers from .venv-bench, nginx as
# the no-op handler. BENCH_ARGS=--quick is a smoke test (minutes, not a measurement); also --skip-peers, --runs N.
bench: $(STAMP) $(BENCH_STAMP) bench-tools
	$(BIN)/python bench/run.py $(BENCH_ARGS)

$(BENCH_STAMP): pyproject.toml bench/requirements.txt
	test -x $(BENCH_VENV)/bin/python || $(BENCH_PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet -e '.[dev]' -r bench/requirements.txt
	touch $@

# nginx answers `return 204;` as the no-op HTTP handler (bench/nginx.py). Installed as root through apt when
# missing, like `tools`; otherwise bench/nginx.py says how.
bench-tools:
	@command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null; }

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis
