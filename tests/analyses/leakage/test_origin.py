"""Where a leak enters, truthfully (issue 39): the dependence set in the message is what was measured (one changed
position at a time); the origin names the line that built the wrong mask, followed back through the recorded ops,
or the buffer it was read from (its module attribute, and the line that built it when the factory ran under the
recorder); an op with no frame of model code gets no line, never the audit's own caller or a console script."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from interp.analyses import leakage
from interp.analyses.leakage.origin import _leaky, _spans, dependence_words, polarity, recording_construction

SOURCE = '''
import torch
from torch import nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, T=16, diagonal=0, corner=False, in_forward=False):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.diagonal, self.corner, self.in_forward = diagonal, corner, in_forward
        self.register_buffer("bias", torch.tril(torch.ones(T, T), diagonal=diagonal))  # BUFFER LINE

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        att = (q @ k.transpose(-2, -1)) / C ** 0.5
        if self.in_forward:
            mask = torch.tril(torch.ones(T, T), diagonal=1)  # FORWARD MASK LINE
            att = att.masked_fill(mask == 0, float("-inf"))
        elif self.corner:
            att = att.masked_fill(self.bias[-T:, :T] == 0, float("-inf"))  # CORNER LINE
        else:
            att = att.masked_fill(self.bias[:T, :T] == 0, float("-inf"))  # APPLY LINE
        return x + F.softmax(att, dim=-1) @ v  # SOFTMAX LINE


class LM(nn.Module):
    def __init__(self, **attn):
        super().__init__()
        self.block_size = 16
        self.wte, self.wpe = nn.Embedding(32, 16), nn.Embedding(16, 16)
        self.attn = Attn(**attn)
        self.head = nn.Linear(16, 32)

    def forward(self, idx):
        return self.head(self.attn(self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))))


def off_by_one():
    torch.manual_seed(0)
    return LM(diagonal=1).eval()


def opened():
    torch.manual_seed(0)
    model = LM().eval()
    model.attn.bias[2, 5] = 1.0  # OPENED LINE
    return model


def corner():
    torch.manual_seed(0)
    attn = LM(corner=True).eval()
    attn.attn.bias = torch.tril(torch.ones(20, 20))  # a larger buffer: its bottom corner lets row 0 see later keys
    return attn


def in_forward():
    torch.manual_seed(0)
    return LM(in_forward=True).eval()
'''


@pytest.fixture()
def usermod(tmp_path, monkeypatch):
    name = f"origin_models_{abs(hash(str(tmp_path))) % 10**8}"
    path = tmp_path / f"{name}.py"
    path.write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module(name), path, name
    sys.modules.pop(name, None)


def _line(path: Path, marker: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


def test_the_dependence_set_is_measured_one_position_at_a_time(usermod):
    module, _, _ = usermod
    origin = leakage.audit(module.off_by_one(), max_len=16).origins["future"]
    assert origin.detail == "row 0 now depends on position 1"  # not "positions 1..15": the others move it by 0
    opened = leakage.audit(module.opened(), max_len=16).origins["future"]
    assert opened.detail == "row 2 now depends on position 5"


def test_a_mask_built_in_the_forward_is_named_at_its_line(usermod):
    module, path, _ = usermod
    origin = leakage.audit(module.in_forward(), max_len=16).origins["future"]
    assert origin.location == origin.built and origin.built.line == _line(path, "FORWARD MASK LINE")
    assert origin.frame.line == _line(path, "SOFTMAX LINE") and origin.built_by == "tril"
    assert origin.to_dict()["line"] == origin.built.line and origin.to_dict()["op_frame"]["line"] == origin.frame.line


def test_a_wrong_slice_of_a_sound_buffer_is_named_at_the_slice(usermod):
    module, path, _ = usermod
    origin = leakage.audit(module.corner(), max_len=16).origins["future"]
    assert origin.built.line == _line(path, "CORNER LINE") and origin.built_by == "getitem"


def test_a_buffer_is_named_by_its_attribute_and_by_the_line_that_built_it_when_recorded(usermod):
    module, path, name = usermod
    plain = leakage.audit(module.off_by_one(), max_len=16).origins["future"]
    assert plain.built is None and plain.built_by == "buffer attn.bias" and "attn.bias" in str(plain)
    assert plain.location.line == _line(path, "SOFTMAX LINE")  # the op's own line, the best without a recording
    with recording_construction() as attach:
        recorded = attach(module.off_by_one())
    origin = leakage.audit(recorded, max_len=16).origins["future"]
    assert origin.built.line == _line(path, "BUFFER LINE") and origin.built_by == "buffer attn.bias"
    opened = leakage.audit(f"{name}:opened", max_len=16).origins["future"]  # a spec: recorded by the audit itself
    assert opened.built.line == _line(path, "OPENED LINE")


def test_a_leak_inside_torch_modules_has_no_line():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 16), nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True),
                          nn.Linear(16, 20)).eval()
    origin = leakage.audit(model, max_len=8).origins["future"]  # no frame of it is model code
    assert origin.frame is None and origin.location is None and origin.to_dict()["file"] is None
    assert str(origin).startswith("no line of model code")


@pytest.mark.parametrize("mask, reading, leaky", [
    (torch.ones(4, 4).tril(), "keep", False), (torch.ones(4, 4).tril(1), "keep", True),
    (torch.ones(4, 4, dtype=torch.bool).triu(1), "block", False), (torch.zeros(4, 4, dtype=torch.bool), "block", True),
    (torch.full((4, 4), float("-inf")).triu(1), "block", False), (torch.ones(4, 4).tril(), "block", True),
    (torch.ones(4, 4).tril(), "either", False), (torch.ones(4, 4), "either", True), (torch.ones(4, 4).tril(1), "either", True),
])
def test_a_mask_is_leaky_as_its_consumer_reads_it(mask, reading, leaky):
    assert _leaky(mask, reading) is leaky


def test_polarity_follows_the_consuming_op():
    assert polarity("masked_fill", torch.ones(2, 2, dtype=torch.bool)) == "block"
    assert polarity("scaled_dot_product_attention", torch.ones(2, 2, dtype=torch.bool)) == "keep"
    assert polarity("scaled_dot_product_attention", torch.zeros(2, 2)) == "block"
    assert polarity("softmax", torch.zeros(2, 2)) == "either"


def test_dependence_words():
    assert _spans([5, 1, 2, 3, 9]) == "1..3, 5, 9"
    assert dependence_words(0, [1], [1, 2, 3]) == "row 0 now depends on position 1"
    assert dependence_words(0, [], [1, 2]) == "row 0 now depends on positions 1..2 together (no single one of them moves it alone)"
