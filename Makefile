# Every target sets itself up from nothing: Debian data packages, .venv, pinned packages.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONDONTWRITEBYTECODE := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup debian test demo lint bench gpu-check clean

# Debian packages: Fashion-MNIST and the King James Bible are the embedded default data.
debian:
	@if [ ! -d /usr/share/datasets/fashion-mnist ] || ! command -v bible >/dev/null; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q dataset-fashion-mnist bible-kjv; \
	fi

$(STAMP): requirements.txt pyproject.toml
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	# torchattacks pins an old torch: install it without its dependencies (they are in requirements.txt).
	$(PY) -m pip install -q --no-deps torchattacks==3.5.1
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: debian $(STAMP)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider tests

demo: setup
	$(VENV)/bin/kpca-attention demo

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks

# Speed targets as ratios measured side by side (docs/benchmarks.md); each script prints PASS/FAIL.
bench: setup
	$(PY) benchmarks/bench_pap.py
	$(PY) benchmarks/bench_robust_pca.py
	$(PY) benchmarks/bench_models.py
	$(PY) benchmarks/bench_kpca.py

# GPU readiness (benchmarks/gpu_check.py): CUDA tests, pap/SDPA ratios (float32, bf16), torch.compile,
# model throughput with AMP, a 1-GPU torchrun run. Without a GPU it says so and exits 0.
gpu-check: setup
	$(PY) benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) runs .pytest_cache
