# Two commands a newcomer runs: `make demo` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_WAIT_POLICY := PASSIVE
export RAY_AUTH_MODE := disabled
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-fast bench install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Reinstall only when the dependency lists change.
$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m hybridflow.demo

test: $(STAMP)
	$(PY) -m pytest -q -rs --durations=25

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -x

bench: $(STAMP)
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) .pytest_cache outputs
