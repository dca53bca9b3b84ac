# Set-up and the two jobs of the README. Every target is idempotent: a second
# run reuses .venv and skips what is installed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.emmy-installed

.PHONY: setup run test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first, pinned: 2.13.0 is the CPU wheel on our machines, and installing
# the project before it would let pip pick a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

# On a machine with a GPU, the workloads are then checked and timed there too.
run: setup
	$(BIN)/emmy suite --ir cuda
	@if nvidia-smi -L >/dev/null 2>&1; then $(BIN)/python benchmarks/gpu_session.py; \
	else echo "no GPU here: nothing timed (benchmarks/gpu_session.py checks and times every workload on one)"; fi

# In parallel: a worker per core (the suite is mostly compiler and simulator runs); the slowest tests are
# listed at the end, so a CI log shows where the time goes.
test: setup
	$(BIN)/python -m pytest -q -n auto --durations=25

bench: setup
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build dist *.egg-info
