"""Known answers for the window contract's pieces: the composed reach, the declared windows, the lengths' rules."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from interp.analyses.leakage.contracts.windows import check_window, declared_windows, reach, same_chunk
from interp.errors import BadInput


def test_reach_of_two_windowed_layers_is_l_times_w_minus_1_back():
    reached = reach(12, [4, 4])
    distance = torch.arange(12)[:, None] - torch.arange(12)[None, :]
    assert torch.equal(reached, (distance >= 0) & (distance <= 6))


def test_a_full_layer_reaches_every_earlier_token():
    assert torch.equal(reach(8, [4, None]), torch.ones(8, 8, dtype=torch.bool).tril())


def test_declared_windows_read_hugging_face_and_nanogpt_configs_and_the_callers_w():
    hf = SimpleNamespace(config=SimpleNamespace(sliding_window=4, num_hidden_layers=2,
                                                layer_types=["sliding_attention", "full_attention"]))
    nano = SimpleNamespace(config=SimpleNamespace(window_size=3, n_layer=3))
    plain = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=2))
    assert declared_windows(hf) == [4, None]
    assert declared_windows(hf, 8) == [8, None]  # the caller's W for the layers declared sliding
    assert declared_windows(nano) == [3, 3, 3]
    assert declared_windows(plain) == [None, None]
    assert declared_windows(plain, 5) == [5, 5]  # no layer declared sliding: the caller's W for every layer


def test_same_chunk():
    assert same_chunk(4, 2).tolist() == [[True, True, False, False], [True, True, False, False],
                                          [False, False, True, True], [False, False, True, True]]
    assert bool(same_chunk(3, None).all())


@pytest.mark.parametrize("window", [0, -1, True, 2.5, "4"])
def test_a_window_below_one_or_not_whole_is_refused(window):
    with pytest.raises(BadInput, match="at least 1"):
        check_window(window)


def test_the_gradient_is_exactly_zero_out_of_reach_and_catches_a_wider_window():
    from leakzoo import windows  # tests/ is on sys.path (tests/conftest.py)

    from interp.analyses.leakage.contracts.windows import gradient_findings

    tokens = torch.arange(12) % 64
    reached = reach(12, [4, 4])
    clean, why = gradient_findings(windows.hf_window().double(), tokens, reached, "length 12", 64)
    assert why is None and clean and max(f.influence for f in clean) == 0.0
    wide, _ = gradient_findings(windows.off_by_one().double(), tokens, reached, "length 12", 64)
    assert {f.query - f.key for f in wide if f.influence > 1e-6} == {7, 8}
    none, why = gradient_findings(nn.Linear(2, 2), tokens, reached, "length 12", 64)
    assert none == [] and "no input embedding" in why
