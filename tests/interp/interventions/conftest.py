"""The prompts the tests of interp.interventions share: six to intervene on, ten as the reference."""
import pytest

from interp.data import random_tokens


@pytest.fixture(scope="module")
def prompts(tiny_gpt):
    return random_tokens(6, 12, tiny_gpt.cfg.d_vocab, seed=1)


@pytest.fixture(scope="module")
def reference(tiny_gpt):
    return random_tokens(10, 12, tiny_gpt.cfg.d_vocab, seed=2)
