"""Models the QK attribution tests share: the constructed induction circuit and toy-induction (the converted
families are in tests/hf_families.py)."""
import pytest

import interp
from interp.models import constructed


@pytest.fixture(scope="module")
def induction():
    return constructed.induction_circuit()


@pytest.fixture(scope="module")
def toy():
    return interp.load("toy-induction")
