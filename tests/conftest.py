"""Shared fixtures. Tests run single-threaded: the machine has 2 shared cores, and torch's
default threads oversubscribe them when anything else runs.

The tests mirror the package (`tests/interp/test_run.py` tests `interp/run.py`, `tests/analyses/leakage/...`,
`tests/models/...`; cross-cutting suites in `tests/reliability/`). They are imported with
`--import-mode=importlib` (basenames may repeat across folders), and this folder is put on `sys.path` so
that the shared test-only modules (`leakzoo`, `own_models`) import by name.
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # child processes too: 2 xdist workers + a --workers 2 test on 2 cores
os.environ.pop("COLUMNS", None)  # module-scoped fixtures run before `_no_inherited_columns` (xdist workers set it)

import pytest  # noqa: E402
import torch  # noqa: E402

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# markers given by where a test lives (`make test-fast` leaves these tiers out; see the Makefile)
_FOLDER_MARKERS = {"notebooks": "notebook", "cli": "cli"}
# tests that must not run beside their own kind on another xdist worker: gloo process groups (`--workers`,
# `spawn_local`) start processes of their own; real models load hundreds of MB once per worker
_GROUP_BY_FILE = {"test_distributed.py": "gloo", "test_workers.py": "gloo"}
_GROUP_BY_MARKER = {"real": "real", "smollm2": "real"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(TESTS).parts
        for folder, marker in _FOLDER_MARKERS.items():
            if folder in parts[:-1]:
                item.add_marker(marker)
        if parts[-1] == "test_viewer_browser.py":
            item.add_marker("browser")
        group = _GROUP_BY_FILE.get(parts[-1])
        group = group or next((g for m, g in _GROUP_BY_MARKER.items() if item.get_closest_marker(m)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))

torch.set_num_threads(int(os.environ.get("INTERP_TEST_THREADS", "1")))


@pytest.fixture(scope="module")
def tiny_gpt():
    from interp.models import GPTConfig, HookedGPT

    return HookedGPT(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=64, seed=0)).eval()


@pytest.fixture(scope="module")
def tiny_encoder():
    from interp.models import EncoderConfig, HookedEncoder

    return HookedEncoder(EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=64, seed=0)).eval()


@pytest.fixture(autouse=True)
def _no_inherited_columns(monkeypatch):
    """$COLUMNS from the shell that runs pytest would fill the CLI's error lines (and size its tables): tests that
    want a width set it themselves (tests/interp/cli/test_tables.py), so messages matched by regex stay one line."""
    monkeypatch.delenv("COLUMNS", raising=False)
