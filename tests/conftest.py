"""Shared fixtures. Tests run single-threaded: the machine has 2 shared cores, and torch's
default threads oversubscribe them when anything else runs.

The tests mirror the package (`tests/interp/test_run.py` tests `interp/run.py`, `tests/analyses/leakage/...`,
`tests/models/...`; cross-cutting suites in `tests/reliability/`). They are imported with
`--import-mode=importlib` (basenames may repeat across folders), and this folder is put on `sys.path` so
that the shared test-only modules (`factories`, `leakzoo`, `own_models`) import by name.
"""
import os
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

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
