# Every target sets itself up from nothing: Debian data packages, .venv, pinned packages.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONDONTWRITEBYTECODE := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup debian test demo lint bench cpu-check gpu-check clean timm-compat

# Debian packages: Fashion-MNIST and the King James Bible are the embedded default data.
debian:
	@if [ ! -d /usr/share/datasets/fashion-mnist ] || ! command -v bible >/dev/null; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q dataset-fashion-mnist bible-kjv; \
	fi

$(STAMP): requirements.txt pyproject.toml setup.py src/kpca_attention/pap/csrc/pap_kernels.cpp \
  src/kpca_attention/attention/csrc/rkde_kernels.cpp src/kpca_attention/attention/csrc/pid_kernels.cpp
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	# torchattacks pins an old torch: install it without its dependencies (they are in requirements.txt).
	$(PY) -m pip install -q --no-deps torchattacks==3.5.1
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: debian $(STAMP)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider -n auto --dist loadfile tests

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

# Every CPU speed target in one command (benchmarks/cpu_check.py): refuses a busy machine (exit 2), writes
# benchmarks/records/<date>-<cpu>-<commit>-cpu_check.json for docs/benchmarks.md's table of this kind of machine.
cpu-check: setup
	$(PY) benchmarks/cpu_check.py

# GPU readiness (benchmarks/gpu_check.py): CUDA tests, pap/SDPA ratios (float32, bf16), torch.compile,
# model throughput with AMP, a 1-GPU torchrun run. Without a GPU it says so and exits 0.
gpu-check: setup
	$(PY) benchmarks/gpu_check.py

# timm's own model tests (tests/test_models.py of the timm sdist matching the installed timm, fetched
# from PyPI; so not part of `make test`) on this package's vision models, with TORCH_BACKEND=kpca_attention
# so that timm's test module imports (and registers) them. Two runs (docs/benchmarks.md): the file as
# released, for information (its cfg test for models outside its hard-coded ViT name list expects CNN
# feature maps, and TorchScript is not supported); then with this package's families added to the two
# name lists timm uses for its own ViTs (NON_STD_FILTERS, FEAT_INTER_FILTERS), which must pass.
TIMM_COMPAT_DIR := build/timm-compat
# the robust-attention family's mechanisms (models/family.py) and FAN: <m>_vit_* and <m>_symvit_* join the
# lists (read from the package when the recipe runs, after setup: one list to keep)
TIMM_COMPAT_FAMILY = $(shell $(PY) -c 'from kpca_attention.models.family import FAMILY_MECHANISMS as m; print(*m, "fan")')
TIMM_COMPAT_K = (symvit or rpc_ or scaled_vit or vit_mini$(foreach m,$(TIMM_COMPAT_FAMILY), or $(m)_)) \
  and not small_ and not base_ and not segmenter
timm-compat: setup
	@set -e; py=$(abspath $(PY)); ver=$$($$py -c 'import timm; print(timm.__version__)'); \
	dir=$(TIMM_COMPAT_DIR)/$$ver; mkdir -p $$dir; \
	[ -f $$dir/timm-$$ver.tar.gz ] || $$py -m pip download -q --no-binary :all: --no-deps timm==$$ver -d $$dir; \
	for run in as-released vit-lists; do \
	  mkdir -p $$dir/$$run; \
	  tar -xzf $$dir/timm-$$ver.tar.gz -C $$dir/$$run --strip-components=1 timm-$$ver/pyproject.toml \
	    timm-$$ver/tests/__init__.py timm-$$ver/tests/conftest.py timm-$$ver/tests/test_models.py; \
	done; \
	sed -i -e "s/^NON_STD_FILTERS = \[/NON_STD_FILTERS = ['symvit_*', 'rpc_*', 'scaled_vit_*', $(foreach m,$(TIMM_COMPAT_FAMILY),'$(m)_*', )/" \
	  -e "s/^FEAT_INTER_FILTERS = \[/FEAT_INTER_FILTERS = ['vit', /" $$dir/vit-lists/tests/test_models.py; \
	[ $$(grep -c "^NON_STD_FILTERS = \['symvit_\*'\|^FEAT_INTER_FILTERS = \['vit'" \
	  $$dir/vit-lists/tests/test_models.py) = 2 ] || { echo "timm $$ver: name lists not found"; exit 1; }; \
	echo "== timm $$ver tests/test_models.py as released (for information)"; \
	(cd $$dir/as-released && TORCH_BACKEND=kpca_attention $$py -m pytest -q -p no:cacheprovider \
	  tests/test_models.py -k "$(TIMM_COMPAT_K)" -rf --tb=no) || true; \
	echo "== with this package's families in timm's ViT name lists, TorchScript deselected"; \
	cd $$dir/vit-lists && TORCH_BACKEND=kpca_attention $$py -m pytest -q -p no:cacheprovider \
	  tests/test_models.py -k "($(TIMM_COMPAT_K)) and not torchscript" --tb=short

clean:
	rm -rf $(VENV) runs .pytest_cache
