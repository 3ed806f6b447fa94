"""Known answers for the back-end contract's pieces: the switch, the implementations that cannot run."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from interp.analyses.leakage.contracts.backends import check_implementations, set_implementation, usable
from interp.errors import BadInput


class Switchable(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(attn_impl="sdpa", vocab_size=8)

    def forward(self, idx):
        if self.config.attn_impl == "flex_attention":
            raise NotImplementedError("no kernel here")
        return torch.zeros(*idx.shape, 8)


def test_the_switch_and_an_implementation_that_cannot_run():
    model = Switchable()
    set_implementation(model, "eager")
    assert model.config.attn_impl == "eager"
    ran, notes = usable(model, ["eager", "sdpa", "flex_attention"], torch.zeros(1, 3, dtype=torch.long))
    assert ran == ["eager", "sdpa"]
    assert len(notes) == 1 and "flex_attention cannot run" in notes[0] and "not audited" in notes[0]


def test_a_model_without_a_switch_or_an_unknown_implementation_is_refused():
    with pytest.raises(BadInput, match="no attention implementation switch"):
        check_implementations(nn.Linear(2, 2), "all")
    with pytest.raises(BadInput, match="among eager, sdpa, flex_attention"):
        check_implementations(Switchable(), ["eager", "fast"])
