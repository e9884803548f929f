# Every target does its own set-up: a fresh machine needs only python3, java 17+ and maven.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.weir-installed
BENCH_STAMP := $(VENV)/.weir-bench-installed
DOCS_STAMP := $(VENV)/.weir-docs-installed
PYTEST_ARGS ?=
# Most broker tests wait on the broker (rebalances, session timeouts), not on a core: make test
# runs them on several pytest-xdist workers, each with its own embedded broker; the secured
# broker, the cluster and PostgreSQL are started by one worker only (tests/conftest.py). Four
# were no faster than three on this 2-core machine once the grouping worked (7:52 against 7:29
# in fresh clones): the suite is then bound by the cores, and timing-bound tests fail under it.
TEST_WORKERS ?= 3
XDIST := -n $(TEST_WORKERS) --dist loadgroup

.PHONY: demo test suite lint typecheck unit integration chaos netns-tools bench broker dist docs api-check promtool clean

# A line per step instead of the commands: the installers run quietly, and a first install takes
# a while, which must not look like a hang. uv installs the same packages as pip in under half
# its time (20 s against 49 s on a fresh venv here), which make test's eight minutes need.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { \
	  echo "creating the virtualenv $(VENV) ($(PYTHON) -m venv)..."; $(PYTHON) -m venv $(VENV); }
	@echo "installing kafka-weir and its dependencies into $(VENV) with uv" \
	  "(half a minute or so the first time)..."
	@$(BIN)/python -m pip install -q uv
	@$(BIN)/python -m uv pip install -q --python $(BIN)/python \
	  -e '.[test,cli,prometheus,dev,postgres,avro,json-schema,protobuf]'
	@touch $(STAMP)
	@echo "installed: $(BIN)/python, $(BIN)/weir"

demo: $(STAMP)
	@echo "running the orders demo (examples/orders/README.md; Ctrl-C stops it)..."
	@$(BIN)/python -m examples.orders

test: lint typecheck suite

suite: $(STAMP)
	@echo "running the tests on $(TEST_WORKERS) workers, each with its own embedded Kafka broker" \
	  "(TEST_WORKERS=1 for one; the slowest are listed at the end)..."
	$(BIN)/python -m pytest -m "not slow" $(XDIST) --durations=15 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks tools
	$(BIN)/ruff format --check src tests examples benchmarks tools

# Then every Python block of README.md and docs/ that is not marked title="fragment", in one
# mypy --strict run (tools/check_doc_examples.py).
typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/python tools/check_doc_examples.py

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit tests/property $(PYTEST_ARGS)

integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration $(XDIST) $(PYTEST_ARGS)

# The kill/restart and network-fault scenarios (short and long runs; make test runs none of them),
# then the engine state machine at ten times make test's examples and its mutants' slow tier (the
# planted bugs it finds only after hundreds of examples). The network faults need root and
# iproute2 (`ip`), installed here with apt-get when missing; without them those tests skip.
chaos: $(STAMP) netns-tools
	$(BIN)/python -m pytest tests/chaos -m "chaos" $(PYTEST_ARGS)
	WEIR_MACHINE_EXAMPLES=400 $(BIN)/python -m pytest tests/property/test_engine_machine.py \
	  tests/property/test_engine_machine_mutations.py $(PYTEST_ARGS)

# A failed install does not stop make chaos: the network-fault tests then skip, saying why.
netns-tools:
	@command -v ip >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || { \
	  echo "installing iproute2 for the network-fault tests (apt-get)..."; \
	  apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 >/dev/null; } || true
	@command -v ip >/dev/null || echo "no iproute2 (ip): the network-fault tests will skip"

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	touch $(BENCH_STAMP)

# Breaking changes of the public API since the last release (api/README.md): each must be listed
# in api/breaking.txt (and said in CHANGELOG.md).
api-check: $(STAMP)
	$(BIN)/python tools/api_check.py

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

# The site into site/ (mkdocs.yml): --strict, so a broken link, a name missing from the reference
# or a docstring warning fails. NO_MKDOCS_2_WARNING: Material's banner about its successor.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/backpressure.py
	$(BIN)/python benchmarks/bulk_sink.py

broker: $(STAMP)
	$(BIN)/weir broker start

# The sdist and the wheel into dist/, checked (twine, check-wheel-contents), then the wheel alone in
# a clean virtualenv runs the quick start and the CLI against an embedded broker (tools/check-dist).
dist: $(STAMP)
	WEIR_DIST_PYTHON=$(PYTHON) tools/check-dist $(BIN)/python

# promtool, Prometheus' rule checker, for tests/integration/test_ops_promtool.py (which skip
# without it): built with the machine's Go from the Go module proxy into ~/.cache/weir (kept
# across clones, as the Kafka jars are), half an hour the first time on two busy cores, under a
# minute with Go's build cache. Prometheus' Go module versions are v0.3XX.Y for its 3.XX.Y.
PROMTOOL_VERSION ?= v0.316.0
TOOLS := $(HOME)/.cache/weir/tools/$(PROMTOOL_VERSION)
promtool: $(TOOLS)/promtool

$(TOOLS)/promtool:
	@command -v go >/dev/null || { echo "make promtool needs Go (apt-get install golang-go)"; exit 1; }
	@echo "building promtool $(PROMTOOL_VERSION) into $(TOOLS) with go install" \
	  "(up to half an hour the first time)..."
	@GOBIN=$(TOOLS) go install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION)
	@echo "built: $(TOOLS)/promtool"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist site src/*.egg-info
