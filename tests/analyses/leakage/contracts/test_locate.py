"""Known answers for the contracts' origin search: what an attention op's mask lets through, and the op that hides a
key a document needs."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from interp.analyses.leakage.contracts.locate import origin_of_hidden, visibility


def test_visibility_of_sdpa_masks():
    n = 4
    causal = visibility(F.scaled_dot_product_attention, (None, None, None), {"is_causal": True}, n)
    assert torch.equal(causal, torch.ones(n, n, dtype=torch.bool).tril())
    additive = torch.zeros(1, 1, n, n).masked_fill(torch.eye(n, dtype=torch.bool), -1e9)
    assert not bool(visibility(F.scaled_dot_product_attention, (None, None, None, additive), {}, n).diagonal().any())
    assert visibility(F.scaled_dot_product_attention, (None, None, None, torch.ones(2, 3)), {}, n) is None


class Cut(nn.Module):
    """Attends causally, but position 2 starts a new block: keys 0..1 are hidden from queries 2..3."""

    def forward(self, tokens):
        x = tokens.float()[:, None, :, None].expand(-1, 1, -1, 2)
        allowed = torch.ones(4, 4, dtype=torch.bool).tril()
        allowed[2:, :2] = False
        return F.scaled_dot_product_attention(x, x, x, attn_mask=allowed)  # the line the origin names


def test_origin_of_hidden_names_the_op_applying_the_mask():
    origin = origin_of_hidden(Cut(), torch.tensor([[1, 2, 3, 4]]), 3, 0, kind="document", words="cut")
    assert origin is not None and origin.op == "scaled_dot_product_attention"
    assert origin.frame is not None and origin.frame.code.endswith("# the line the origin names")
    assert origin_of_hidden(Cut(), torch.tensor([[1, 2, 3, 4]]), 1, 0, kind="document", words="") is None
