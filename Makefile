# Common tasks. Every target that runs code first makes sure .venv exists and
# holds tpurun (editable) with its test tools, the TPU compiler (the tpu-compile
# extra, which `tpurun check --target` and its tests use) and TensorFlow Datasets
# (the tfds extra, tpurun.datasets) and the BERT converter's tokenizer (the text extra),
# so a fresh clone needs only Python 3.11.
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

.PHONY: install install-tpu-wheel demo test test-full-size test-fast test-tpu-wheel bench bench-resume lint docs clean

install: $(STAMP)

# uv installs what pip would (the same resolution: setup.cfg's floors pin it) in under
# half the time: 44 s against 103 s for a fresh venv on the 2-core machine, most of it
# downloading TensorFlow, jaxlib and libtpu, which uv does in parallel. pip remains the
# fallback where uv cannot reach the package index. --native-tls: the system's
# certificates, as pip uses them. --compile-bytecode, as pip does: where
# PYTHONDONTWRITEBYTECODE is set (this machine), nothing else writes the .pyc files,
# and every process would compile TensorFlow's modules again (14 s per import, not 4.5).
$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv
	$(BIN)/uv pip install --quiet --native-tls --compile-bytecode --python $(BIN)/python \
	  -e '.[test,tpu-compile,docs,tfds,text]' \
	  || $(BIN)/pip install --quiet -e '.[test,tpu-compile,docs,tfds,text]'
	touch $(STAMP)

# The TensorFlow a Cloud TPU VM runs: tensorflow-tpu 2.20 with its libtpu (requirements-tpu.txt,
# as docs/tpu.md installs it), in a second venv beside .venv. The test and docs tools come from
# setup.cfg's extras, with the CPU `tensorflow` wheel that install_requires names kept out
# (uv's --excludes: pip has no way to leave out one dependency, so there is no pip fallback
# here). The tfds extra too (tests/test_datasets.py). No tpu-compile extra: its libtpu 0.0.52 cannot share an environment with
# tensorflow-tpu, and the TPU compiler's tests skip here, saying so.
VENV_TPU := .venv-tpu
BIN_TPU := $(VENV_TPU)/bin
STAMP_TPU := $(VENV_TPU)/.installed

install-tpu-wheel: $(STAMP_TPU)

$(STAMP_TPU): setup.cfg pyproject.toml requirements-tpu.txt
	$(PYTHON) -m venv $(VENV_TPU)
	$(BIN_TPU)/pip install --quiet uv
	echo tensorflow > $(VENV_TPU)/excludes.txt
	$(BIN_TPU)/uv pip install --quiet --native-tls --compile-bytecode --python $(BIN_TPU)/python \
	  -r requirements-tpu.txt --excludes $(VENV_TPU)/excludes.txt -e '.[test,docs,tfds,text]'
	touch $(STAMP_TPU)

demo: install
	rm -rf $(DEMO_DIR)
	$(BIN)/tpurun train   --config=iris --use_tpu=false --model_dir=$(DEMO_DIR)
	$(BIN)/tpurun eval    --config=iris --use_tpu=false --model_dir=$(DEMO_DIR)
	$(BIN)/tpurun predict --config=iris --use_tpu=false --model_dir=$(DEMO_DIR)
	$(BIN)/tpurun export  --config=iris --use_tpu=false --model_dir=$(DEMO_DIR)

# Three pytest processes, each test file in one of them (a file's shared trainings are
# made once). Many tests wait on a process they started (a killed trainer, a worker, the
# GCS server, the TPU compiler): with two, a 2-core machine's cores idled meanwhile
# (whole suite 666 s with 2, 565 s with 3 on the same idle 2-core machine). Four were
# slower (626 s): the CPU-bound checks then took twice as long.
PYTEST_WORKERS ?= 3
# The files in conftest's order, the longest first (LONGEST_FILES): xdist's default
# reorders them by their number of tests, which started the few-test, long files (the
# GCS life, the GAN, the cluster) last, and the run waited on one worker at its end.
PYTEST_ORDER := --dist loadfile --no-loadscope-reorder

test: install lint
	$(BIN)/pytest -n $(PYTEST_WORKERS) $(PYTEST_ORDER) --durations=15 -m 'not full_size'

# Full-size models sized by the TPU compiler (resnet50 at 224, batch 1024 on a v5e-8):
# the train step's compile alone takes minutes on a 2-core machine, past make test's budget.
test-full-size: install
	$(BIN)/pytest --durations=0 -m full_size

# The suite on tensorflow-tpu 2.20 (the wheel every TPU VM runs) with TPU_LOAD_LIBRARY=0, as on
# worker 0 of a pod slice: TensorFlow computes on the CPU and never loads libtpu, which would
# otherwise ask the TPU VM metadata server what TPU it is on. The unit tests, and the end-to-end
# runs marked tpu_wheel (train -> eval -> predict -> export -> resume of a CNN and of the
# own-step GAN); not the rest of the slow runs, which test tpurun's code paths once, on 2.21.
test-tpu-wheel: $(STAMP_TPU)
	TPU_LOAD_LIBRARY=0 $(BIN_TPU)/pytest -n $(PYTEST_WORKERS) $(PYTEST_ORDER) --durations=15 \
	  -m '(not slow or tpu_wheel) and not full_size'

# The unit tests only: skips the end-to-end runs marked slow.
test-fast: install
	$(BIN)/pytest -n $(PYTEST_WORKERS) $(PYTEST_ORDER) -m 'not slow and not full_size'

bench: install
	$(BIN)/python scripts/bench_train_loop.py
	$(BIN)/python scripts/bench_mnist.py
	$(BIN)/python scripts/bench_storage.py
	$(BIN)/python scripts/bench_help.py
	$(BIN)/python scripts/bench_resnet.py

bench-resume: install
	$(BIN)/python scripts/bench_resume.py

lint: install
	$(BIN)/ruff check tpurun configs models scripts tests
	$(BIN)/ruff format --check tpurun configs models scripts tests
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

# The manual as a site in site/ (MkDocs, Material theme): strict, so a broken link,
# a broken anchor or a page the nav names that does not exist fails the build.
# NO_MKDOCS_2_WARNING: without the banner on Material's end of life (May 2027) at every build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) $(VENV_TPU) build site *.egg-info
