# Common tasks. Every target that runs code first makes sure .venv exists and
# holds tpurun (editable) with its test tools and the TPU compiler (the tpu-compile
# extra, which `tpurun check --target` and its tests use), so a fresh clone needs
# only Python 3.11.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= /tmp/tpurun-demo/iris
# No test, demo or benchmark may talk to Google's metadata server or APIs.
export NO_GCE_CHECK := true
export GCE_METADATA_HOST := 127.0.0.1:1
export GCE_METADATA_IP := 127.0.0.1:1
export GCS_RETRY_CONFIG_MAX_RETRIES := 0

.PHONY: install demo test test-fast bench bench-resume lint clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,tpu-compile]'
	touch $(STAMP)

demo: install
	rm -rf $(DEMO_DIR)
	$(BIN)/tpurun train   --config=iris --use_tpu=false --model_dir=$(DEMO_DIR)
	$(BIN)/tpurun eval    --config=iris --use_tpu=false --model_dir=$(DEMO_DIR)
	$(BIN)/tpurun predict --config=iris --use_tpu=false --model_dir=$(DEMO_DIR)
	$(BIN)/tpurun export  --config=iris --use_tpu=false --model_dir=$(DEMO_DIR)

# Two pytest processes, each test file in one of them (a file's shared trainings are
# made once): TensorFlow keeps one core busy per process for most of a test.
PYTEST_WORKERS ?= 2

test: install lint
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=15

# The unit tests only: skips the end-to-end runs marked slow.
test-fast: install
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile -m 'not slow'

bench: install
	$(BIN)/python scripts/bench_train_loop.py
	$(BIN)/python scripts/bench_mnist.py
	$(BIN)/python scripts/bench_storage.py
	$(BIN)/python scripts/bench_help.py

bench-resume: install
	$(BIN)/python scripts/bench_resume.py

lint: install
	$(BIN)/ruff check tpurun configs models scripts tests
	$(BIN)/ruff format --check tpurun configs models scripts tests
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

clean:
	rm -rf $(VENV) build *.egg-info
