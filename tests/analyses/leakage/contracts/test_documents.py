"""Known answers for the documents contract's pieces: the layout, the conventions, the call patterns."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from interp.analyses.leakage.contracts.documents import (
    Layout,
    check_doc_sep,
    document_convention,
    document_runs,
    layout_for,
)
from interp.errors import BadInput


class Varlen(nn.Module):
    def forward(self, input_ids, cu_seqlens=None, document_ids=None):
        return input_ids


class PositionsAndMask(nn.Module):
    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return input_ids


class Plain(nn.Module):
    def forward(self, idx, targets=None):
        return idx


def test_layout_documents_separators_and_conventions():
    layout = Layout((2, 3), doc_sep=9)
    assert layout.documents().tolist() == [0, 0, 0, 1, 1, 1]  # the separator belongs to the document it ends
    assert layout.separators().tolist() == [False, False, True, False, False, False]
    plain = Layout((2, 3))
    assert plain.convention_kwargs("position_ids")["position_ids"].tolist() == [[0, 1, 0, 1, 2]]
    assert plain.convention_kwargs("cu_seqlens")["cu_seqlens"].tolist() == [0, 2, 5]
    assert plain.convention_kwargs("segment_ids")["segment_ids"].tolist() == [[0, 0, 1, 1, 1]]
    tokens = Layout((5, 4, 7), inner_eos=(12,), eos=1).tokens(64, torch.Generator().manual_seed(0))
    assert tokens[12] == 1 and int((tokens == 1).sum()) == 1  # the EOS only where planted


def test_the_first_convention_the_forward_takes_wins():
    assert document_convention(Varlen()) == "cu_seqlens"
    assert document_convention(PositionsAndMask()) == "position_ids"
    with pytest.raises(BadInput, match="--doc-sep"):
        document_convention(Plain())


def test_call_patterns_follow_what_the_forward_takes():
    layout = Layout()
    assert list(document_runs(PositionsAndMask(), layout, "position_ids")) == [
        "default", "use_cache=False", "attention_mask=ones", "use_cache=True"]
    assert list(document_runs(Varlen(), layout, "cu_seqlens")) == ["default"]


def test_doc_sep_must_be_in_the_vocabulary():
    with pytest.raises(BadInput, match=r"0\.\.63"):
        check_doc_sep(64, 64)
    check_doc_sep(63, 64)
    assert layout_for(Plain(), 64, 5).doc_sep == 5
    assert layout_for(Plain(), 64, None).inner_eos == ()  # no EOS declared: none planted


def test_a_packed_row_is_split_at_its_separators():
    layout = Layout.of_row([4, 5, 1, 6, 1, 1, 7], doc_sep=1)
    assert layout.lengths == (2, 1, 0, 1)
    assert layout.documents().tolist() == [0, 0, 0, 1, 1, 2, 3]
    assert layout.separators().nonzero().flatten().tolist() == [2, 4, 5]
    assert layout.tokens(64, torch.Generator()).tolist() == [4, 5, 1, 6, 1, 1, 7]  # the row itself, never redrawn


def test_the_first_packed_prompt_holding_the_separator_is_audited():
    prompts = [[3, 4, 5], [6, 7, 2, 8, 9], [2, 2]]
    assert layout_for(Plain(), 64, 2, prompts).given == (6, 7, 2, 8, 9)
    assert layout_for(Plain(), 64, 2, prompts, max_len=2).given == (2, 2)  # the second row's separator is cropped away


@pytest.mark.parametrize("prompts, doc_sep, max_len, words", [
    ([[3, 4, 5], [6, 7]], 2, None, "token 2 is absent from the packed prompts (no row of the 2 holds it)"),
    ([[3, 4, 5, 2]], 2, 3, "no row of the 1 holds it within its first 3 tokens (--max-len)"),
    ([[3, 4, 64]], 2, None, "row 0, position 2 holds token id 64"),
    ([[3, 2]], None, None, "give it with --doc-sep TOKEN"),
])
def test_packed_prompts_without_the_separator_are_refused(prompts, doc_sep, max_len, words):
    with pytest.raises(BadInput) as raised:
        check_doc_sep(doc_sep, 64, prompts, max_len)
    assert words in str(raised.value)
    if "absent" in words:
        assert "give prompts in which documents are packed with token 2 between them" in str(raised.value)
        assert "or the separator your data really uses (--doc-sep TOKEN" in str(raised.value)
