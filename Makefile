# Set-up is two commands on a fresh machine: `make demo`, `make test`.
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp

.PHONY: demo test test-slow test-all bench notebooks clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)  ## the main job on the embedded default model
	$(PY) -m interp.cli demo

test: $(STAMP)  ## the type check, then the default suite (slow tests excluded), notebooks included
	$(PY) -m mypy
	$(PY) -m pytest -m "not slow" -q

test-slow: $(STAMP)
	$(PY) -m pytest -m slow -q

test-all: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)  ## speed ratios against references measured in the same run
	$(PY) -m benchmarks

notebooks: $(STAMP)  ## regenerate and execute the notebooks, storing their outputs (commit the result)
	OMP_NUM_THREADS=1 PYTHONHASHSEED=0 $(PY) notebooks/make_notebooks.py --execute

clean:
	rm -rf $(VENV) reports build *.egg-info
