"""Shared fixtures. Tests run single-threaded: the machine has 2 shared cores, and torch's
default threads oversubscribe them when anything else runs."""
import os

import pytest
import torch

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
    want a width set it themselves (tests/test_cli_width.py), so messages matched by regex stay one line."""
    monkeypatch.delenv("COLUMNS", raising=False)
