# `make test` and `make train` set themselves up on a fresh machine: a .venv with the project installed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build that lies on disk on the development/CI machines; override for a CUDA machine,
# e.g. `make train TORCH=torch==2.13.0 TORCH_INDEX=--index-url=https://download.pytorch.org/whl/cu128`.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
CONFIG ?= configs/sst2.yaml

# Offline dataset copies beside the checkout (development and CI machines); the hub is used when absent.
SHARED_DATA := $(abspath ../shared/data)
ifneq ($(wildcard $(SHARED_DATA)),)
export ATTENTION_DATA_ROOT ?= $(SHARED_DATA)
endif

.PHONY: setup setup-dev test test-fast train tensorboard bench docs fonts browser clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_INDEX) "$(TORCH)"
	$(PY) -m pip install -q -e .
	touch $@

# The tests' extra (pytest, playwright, onnx, ...) on top: what `make test` needs and training does not.
$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

setup-dev: $(VENV)/.installed-dev

test: setup-dev
	$(PY) -m pytest

test-fast: setup-dev
	$(PY) -m pytest -m "not slow"

train: setup
	$(PY) train.py fit --config $(CONFIG)

tensorboard: setup
	$(VENV)/bin/tensorboard --logdir lightning_logs

bench: setup
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m bench.timing speed
	$(PY) -m bench.accuracy

# The docs' generated tables from the registries they describe: the README's attention kinds (model/kinds.py),
# docs/DOCTOR.md's verdicts (monitor/units.py) and planted bugs (bench/catalogue/); tests/test_docs.py compares.
docs: setup
	$(PY) -m scripts.docs

# Opt-in, needs root: a CJK font (Debian's fonts-wqy-microhei) so Chinese tokens in heatmaps render as glyphs.
# Without it heatmaps still work; Chinese labels show as boxes and the first heatmap logs one warning.
fonts: setup
	bash scripts/install_cjk_font.sh --install

# Needs root (CI runs it, .ci/run): Debian's chromium, so tests/test_report_browser.py (and test_serve.py's page)
# open the explanation page in a real headless browser (playwright, from the dev extra, drives it; it downloads no
# browser). Without it those tests skip and say why.
browser: setup-dev
	command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }

clean:
	rm -rf $(VENV) lightning_logs .cache
