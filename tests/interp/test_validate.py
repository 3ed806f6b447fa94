"""interp.validate's number helpers: `as_real` (numbers, numpy scalars, 0-d tensors) and `check_fraction` ([0, 1))."""
import math
import re

import numpy as np
import pytest
import torch

from interp.errors import BadInput, BadType
from interp.validate import as_real, check_fraction


@pytest.mark.parametrize("value, expected", [
    (0.25, 0.25), (1, 1.0), (np.float32(0.5), 0.5), (np.int64(3), 3.0), (torch.tensor(0.125), 0.125),
    (np.array(0.75), 0.75), (float("nan"), math.nan), (float("inf"), math.inf),
])
def test_as_real_takes_real_numbers_and_0d_tensors(value, expected):
    got = as_real(value, "x", "f")
    assert math.isnan(got) if math.isnan(expected) else got == expected


@pytest.mark.parametrize("value", ["0.5", True, None, b"1", torch.tensor([0.1, 0.2]), [0.5], 1 + 2j])
def test_as_real_refuses_everything_else_naming_it(value):
    with pytest.raises(BadType, match=r"^f: x=.* is not a number; expected a real number"):
        as_real(value, "x", "f")


def test_check_fraction_is_half_open():
    assert check_fraction(0, "t", "f") == 0.0 and check_fraction(torch.tensor(0.5), "t", "f") == 0.5
    for bad in (1, 1.0, -1e-9, float("nan"), float("inf"), 1e300):
        with pytest.raises(BadInput, match=rf"^f: t={re.escape(repr(bad))}; expected a fraction in \[0, 1\), e.g. 0.01"):
            check_fraction(bad, "t", "f")
