# Two commands matter: `make run` and `make test`. Everything else is set up on demand.
PYTHON ?= python3.11
UV_VERSION := 0.13.9
UV := .tools/bin/uv
VENV := .venv/.synced
export UV_PYTHON_DOWNLOADS := never

.PHONY: setup run test unit bench schemas lint clean

setup: $(VENV)

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(VENV): pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --python $(PYTHON)
	@touch $@

run: $(VENV)
	.venv/bin/writ run

test: $(VENV)
	.venv/bin/pytest

unit: $(VENV)
	.venv/bin/pytest tests/unit

bench: $(VENV)
	.venv/bin/python -m bench

schemas: $(VENV)
	.venv/bin/writ schemas --write

lint: $(VENV)
	.venv/bin/ruff check .

clean:
	rm -rf .venv .tools .writ
