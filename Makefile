# byteps-thc: two commands for a newcomer, `make demo` and `make test`; everything else is a step.
# Every target installs what it needs from nothing (apt packages, .venv/), and is idempotent.
SHELL := /bin/bash
PY    := .venv/bin/python
PIP   := .venv/bin/pip
VENV  := .venv/.stamp
EXT   := byteps_thc/.ext-stamp

.PHONY: all venv ext byteps test test-unit test-cluster demo bench clean distclean help

all: ext

help:
	@echo "make demo   - set everything up, then train on a local cluster with THC"
	@echo "make test   - set everything up, then run the tests"
	@echo "make ext    - build the codec extension byteps_thc._C"
	@echo "make byteps - build and install the BytePS fork (pinned sdist + our patches)"
	@echo "make bench  - codec benchmark (scripts/bench_codec.py)"

venv: $(VENV)
$(VENV): requirements.txt
	@test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --disable-pip-version-check -r requirements.txt
	@touch $@

ext: $(EXT)
$(EXT): $(VENV) setup.py $(shell find csrc/thc csrc/python -type f 2>/dev/null)
	$(PY) setup.py -q build_ext --inplace
	@touch $@

test-unit: ext
	$(PY) -m pytest -q tests/unit

# The BytePS fork (scripts/build_byteps.sh: cached, rebuilds only when its inputs change).
byteps: $(VENV)
	@nice scripts/build_byteps.sh

test: ext byteps
	$(PY) -m pytest -q tests

demo: ext byteps
	$(PY) scripts/demo.py

bench: ext
	$(PY) scripts/bench_codec.py

clean:
	rm -rf build $(EXT) byteps_thc/_C*.so
distclean: clean
	rm -rf .venv .cache
