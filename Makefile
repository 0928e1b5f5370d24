# Both targets build .venv from nothing on a fresh machine, then run.
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# A CPU build of torch==2.13.0 lies in /opt/wheels on these machines; elsewhere PyPI's is taken.
# uv resolves the same versions as pip and installs them in ~50 s, 45 s of it compiling every
# package's bytecode on both cores. Compiled instead by the first process that imports each
# module, the install takes ~20 s and pytest ~20 s more (its four workers and their first
# tests' stacks import the same modules at once, each compiling them), and a test's first
# seconds then depend on what ran before it: the suite runs on compiled packages. The targets
# let Python write what is still missing (the package's own modules) where
# PYTHONDONTWRITEBYTECODE is set.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test bench lint clean chromium chaos soak docs

$(STAMP): pyproject.toml
	python3 -m venv $(VENV) || (apt-get update && apt-get install -y python3-venv && python3 -m venv $(VENV))
	$(PY) -m pip install -q uv
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) $(FIND_LINKS) -e '.[demo,dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/metricbus demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The dashboard tests drive a real browser: Debian's chromium (Playwright drives it, no download).
CHROMIUM := $(shell command -v chromium 2>/dev/null)

chromium:
ifeq ($(CHROMIUM),)
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
endif

# Four workers on two cores: the integration tests mostly wait (group joins, flush intervals);
# each worker starts its own embedded broker and every test has its own topics (five or six
# workers were no faster). Each worker starts with its share of the long tests (tests/conftest.py);
# with work stealing, one that runs out takes short tests queued behind another's. The 15
# longest are listed at the end. mypy checks meanwhile; its errors, if any, come last.
test: $(STAMP) chromium
	$(VENV)/bin/ruff check .
	@$(VENV)/bin/mypy > .mypy.out 2>&1 & mypy=$$!; \
	$(VENV)/bin/pytest -q -ra -n 4 --dist worksteal --durations=15; tests=$$?; \
	wait $$mypy; typed=$$?; \
	if [ $$typed -ne 0 ]; then cat .mypy.out; echo "mypy failed (above)"; fi; \
	rm -f .mypy.out; [ $$tests -eq 0 ] && [ $$typed -eq 0 ]

docs: $(STAMP)
	$(PY) -m tests.docs_reference
	$(VENV)/bin/mkdocs build --strict

# The fault suite: crashes and 10,000 hostile records against `metricbus up` (a few minutes).
chaos: $(STAMP)
	$(PY) tests/chaos.py

soak: $(STAMP)
	$(PY) bench/soak.py

bench: $(STAMP)
	$(PY) bench/producer_overhead.py
	$(PY) bench/sustained.py
	$(PY) bench/broker_memory.py
	$(PY) bench/archive_size.py
	$(PY) bench/stream_throughput.py
	$(PY) bench/replay.py
	$(PY) bench/sinks.py
	$(PY) bench/media.py
	$(PY) bench/report.py
	$(PY) bench/ops_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
