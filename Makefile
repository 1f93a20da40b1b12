# Two commands on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
EXTRAS ?=   # e.g. `make train EXTRAS=cuda` on an NVIDIA GPU machine, EXTRAS=tpu on a TPU VM
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed$(if $(strip $(EXTRAS)),-$(strip $(EXTRAS)))
DEV_STAMP := $(VENV)/.installed-dev
# POGEMA (for the MAPF conformance test and benchmark) pins gymnasium, numpy and pydantic below ours: own venv.
POGEMA_VENV := .venv-pogema
POGEMA_STAMP := $(POGEMA_VENV)/.installed
POGEMA_PINS := pogema==1.4.0 gymnasium==0.28.1 numpy==1.26.4 pydantic==1.9.1

.PHONY: train test test-all bench pogema clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".$(if $(strip $(EXTRAS)),[$(strip $(EXTRAS))])"
	touch $@

$(DEV_STAMP): pyproject.toml $(STAMP)
	$(BIN)/pip install --quiet -e ".[dev,brax,marl]"
	touch $@

train: $(STAMP)  ## create .venv, install, train the default experiment
	$(BIN)/python -m rlx.train +exp=ppo_cartpole

$(POGEMA_STAMP):
	$(PYTHON) -m venv $(POGEMA_VENV)
	$(POGEMA_VENV)/bin/pip install --quiet $(POGEMA_PINS)
	touch $@

pogema: $(POGEMA_STAMP)  ## the POGEMA venv alone

# One pytest worker per core (pytest-xdist), each test file on one worker so that a file's
# module fixtures and cached compiled programs are built once; TEST_WORKERS=0 runs in-process.
TEST_WORKERS ?= auto

test: $(DEV_STAMP) $(POGEMA_STAMP)  ## install with dev extras and run the fast suite
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

test-all: $(DEV_STAMP) $(POGEMA_STAMP)  ## every test, the slow ones included
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile tests

bench: $(STAMP)  ## speed comparison with rejax and Stable-Baselines3 (builds their venvs in .bench/)
	$(BIN)/python scripts/bench_ppo.py

clean:
	rm -rf $(VENV) $(POGEMA_VENV) .bench .pytest_cache runs outputs
