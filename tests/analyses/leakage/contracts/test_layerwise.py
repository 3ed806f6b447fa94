"""The window contract per layer (`contracts.layerwise`): known answers on constructed weights, the weights observed
at a hooked model's `hook_pattern` and through a Hugging Face model's `output_attentions` (eager only), and the reason
said where they cannot be observed; a zoo model whose window is wrong in one layer only is localised to that layer."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from interp.analyses.leakage.contracts.layerwise import (
    layer_findings,
    layer_words,
    observe_weights,
    outside_window,
    windows_of_layers,
)
from interp.analyses.leakage.contracts.windows import audit_windows
from interp.sdpa import hook_sdpa


def _windowed(n: int, size: int, heads: int = 2) -> torch.Tensor:
    """(head, query, key) weights uniform over each query's window of `size` keys."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    inside = ((j <= i) & (j > i - size)).double()
    return (inside / inside.sum(-1, keepdim=True)).expand(heads, n, n).clone()


def test_outside_window_is_later_keys_and_keys_w_or_more_back():
    later, before = outside_window(5, 5, 2)
    assert later.nonzero().tolist() == [[0, 1], [0, 2], [0, 3], [0, 4], [1, 2], [1, 3], [1, 4], [2, 3], [2, 4], [3, 4]]
    assert before.nonzero().tolist() == [[2, 0], [3, 0], [3, 1], [4, 0], [4, 1], [4, 2]]
    later, before = outside_window(1, 5, 2)  # one decoding query, the last of 5 keys
    assert not later.any() and before.nonzero().tolist() == [[0, 0], [0, 1], [0, 2]]


def test_a_weight_outside_one_layers_window_is_found_there_only():
    wide = _windowed(8, 4)
    wide[1, 6, 1] = 0.25  # layer 1, head 1: query 6 pays 0.25 to key 1, 5 back
    observed = [("blocks.0.attn", _windowed(8, 4)), ("blocks.1.attn", wide)]
    found, why = layer_findings(observed, [4, 4], "length 8")
    assert why is None
    hits = [f for f in found if f.influence > 0]
    assert [(f.kind, f.layer, f.head, f.query, f.key, f.influence) for f in hits] == [("window", 1, 1, 6, 1, 0.25)]
    assert len(found) == 2 * 2 * 2  # per layer and head: the largest weight on a later key and before the window
    assert layer_words(hits[0], observed, 4) == ("in layer 1 (blocks.1.attn), head 1, query 6 pays 0.25 of its attention "
                                                 "to key 1, outside its window of 4")
    assert "layer 1 head 1" in hits[0].words()


def test_a_full_layer_is_not_held_to_a_window_and_nan_is_infinite():
    broken = _windowed(6, 3)
    broken[0, 2, 4] = float("nan")
    found, _ = layer_findings([("a", broken), ("b", torch.ones(2, 6, 6))], [3, None], "length 6")
    assert {f.layer for f in found} == {0}
    assert max(f.influence for f in found if f.kind == "future") == float("inf")


def test_layer_counts_that_do_not_match_are_said():
    observed = [("a", _windowed(4, 2)), ("b", _windowed(4, 2)), ("c", _windowed(4, 2))]
    assert windows_of_layers(observed, [2]) == [2, 2, 2]  # the caller's one W for every layer
    assert windows_of_layers(observed, [2, None]) is None
    found, why = layer_findings(observed, [2, None], "length 4")
    assert found == [] and "3 attention layers observed, 2 declared" in why and "the output check decides" in why


def test_weights_at_the_hooks_of_a_hooked_model():
    from leakzoo import windows  # tests/ is on sys.path (tests/conftest.py)

    tokens = torch.arange(10)[None]
    observed, why = observe_weights(hook_sdpa(windows.hf_window()), tokens)
    assert why is None and [where for where, _ in observed] == ["layers.0.self_attn", "layers.1.self_attn"]
    for _, weights in observed:  # (head, query, key), rows of a softmax, zero outside the window of 4
        assert weights.shape == (4, 10, 10) and torch.allclose(weights.sum(-1), torch.ones(4, 10))
        assert all(float(weights[:, region].max()) == 0.0 for region in outside_window(10, 10, 4))


def test_weights_of_a_black_box_cannot_be_observed_and_say_so():
    observed, why = observe_weights(nn.Sequential(nn.Embedding(8, 4)), torch.arange(3)[None])
    assert observed is None and "neither hooked" in why and "the output check decides" in why


def test_hugging_face_weights_under_eager_only():
    pytest.importorskip("transformers")
    from leakzoo import measure_hf_contracts as measure

    tokens = torch.arange(9)[None] % measure.VOCAB
    observed, why = observe_weights(measure.build("mistral", "eager"), tokens)
    assert not why and [where for where, _ in observed] == ["layer 0", "layer 1"]
    assert all(float(w[:, region].max()) == 0.0 for _, w in observed for region in outside_window(9, 9, measure.WINDOW))
    observed, why = observe_weights(measure.build("mistral", "sdpa"), tokens)
    assert observed is None and "not observable under sdpa" in why and "--attn-impls eager,sdpa" in why


def test_a_window_wrong_in_one_layer_is_localised_to_that_layer():
    from leakzoo import marked_line, windows

    result = audit_windows(hook_sdpa(windows.one_layer_wide()), vocab=64)
    assert result.status == "leak" and result.found == ("window",)
    layered = [f for f in result.findings if f.layer is not None]
    assert layered and {f.layer for f in layered} == {1}
    assert {f.query - f.key for f in layered} <= {4, 5}  # W + 2 = 6 keys: 4 and 5 back are outside the window of 4
    assert "in layer 1 (layers.1.self_attn), head" in result.origin.detail
    lines = {marked_line(windows.__file__, "BUG", "one_layer_wide"), marked_line(windows.__file__, "SITE", "window-sdpa")}
    assert min(abs(result.origin.to_dict()["line"] - line) for line in lines) <= 2
    plain = audit_windows(windows.one_layer_wide(), vocab=64)  # not hooked: the outputs alone, no layer named
    assert plain.status == "leak" and all(f.layer is None for f in plain.findings)
    assert any("neither hooked" in note for note in plain.notes)


def test_a_full_layer_hides_the_window_from_the_outputs_but_not_from_the_weights():
    from leakzoo import windows

    assert audit_windows(windows.hf_mixed(), vocab=64).status == "not applicable"
    hooked = audit_windows(hook_sdpa(windows.hf_mixed()), vocab=64)
    assert hooked.status == "exact zero" and hooked.max_influence == 0.0
