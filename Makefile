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
	@echo "make lint    ruff over the package, tests and scripts"
	@echo "make typecheck  mypy over the package (settings in setup.cfg)"

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
	$(PYTHON) -m ruff check caffe_py tests benchmarks data cli.py

typecheck: install
	$(PYTHON) -m mypy caffe_py

clean:
	rm -rf $(STAMP) build *.egg-info snapshots
