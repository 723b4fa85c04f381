# caffe-py: the two commands a newcomer needs are `make train` and `make test`.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# torch is pinned to the CPU build that this Debian machine serves from a local wheel; a bare
# `pip install torch` would pull gigabytes of CUDA packages. A machine that already has a
# torch (e.g. a GPU image) keeps its own.
TORCH_PIN ?= torch==2.13.0
STAMP := .make

.PHONY: install data train test test-gpu lint typecheck bench clean help

help:
	@echo "make train   install, fetch and convert Fashion-MNIST, train LeNet on it (CPU)"
	@echo "make test    install and run the test suite"
	@echo "make data    fetch Fashion-MNIST and convert it to LMDB under data/fashion_mnist"
	@echo "make lint    ruff over the package, tests, benchmarks, data and oracle scripts"
	@echo "make typecheck  mypy over the package against .ci/mypy_baseline (settings in setup.cfg)"

install: $(STAMP)/installed

$(STAMP)/installed: setup.cfg pyproject.toml
	@mkdir -p $(STAMP)
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[dev]"
	@touch $@

data: install
	$(PYTHON) data/fashion_mnist.py

train: data
	$(PYTHON) cli.py train --solver configs/mnist.yaml

test: install
	$(PYTHON) -m pytest -q

test-gpu: install
	$(PYTHON) -m pytest -q -m gpu

lint: install
	$(PYTHON) -m ruff check caffe_py tests benchmarks data tools cli.py

# mypy over the package against a baseline count that may only fall (.ci/mypy_baseline; zero
# is the goal): more errors fail, fewer ask for the baseline to be lowered.
typecheck: install
	@$(PYTHON) -m mypy caffe_py > $(STAMP)/mypy.txt; tail -n 1 $(STAMP)/mypy.txt; \
	found=$$(sed -n 's/^Found \([0-9]*\) error.*/\1/p' $(STAMP)/mypy.txt); found=$${found:-0}; \
	limit=$$(cat .ci/mypy_baseline); \
	if [ "$$found" -gt "$$limit" ]; then grep ' error: ' $(STAMP)/mypy.txt; \
	  echo "mypy: $$found errors, more than the baseline of $$limit (.ci/mypy_baseline); fix the new ones"; exit 1; fi; \
	if [ "$$found" -lt "$$limit" ]; then \
	  echo "mypy: $$found errors, fewer than the baseline of $$limit: lower .ci/mypy_baseline to $$found"; fi

clean:
	rm -rf $(STAMP) build *.egg-info snapshots
