"""Models the circuits tests share: the constructed circuits (edges known), toy-induction, converted families."""
import pytest
from factories import converted_hf

import interp
from interp.models import constructed


@pytest.fixture(scope="module")
def induction():
    return constructed.induction_circuit()


@pytest.fixture(scope="module")
def v_circuit():
    return constructed.v_composition_circuit()


@pytest.fixture(scope="module")
def unread():
    return constructed.unread_head_circuit()


@pytest.fixture(scope="module")
def toy():
    return interp.load("toy-induction")


@pytest.fixture(scope="module")
def gpt2():
    return converted_hf("gpt2")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def converted(request, gpt2):
    return gpt2 if request.param == "gpt2" else converted_hf("llama")
