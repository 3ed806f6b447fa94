"""The zoo's models do what their labels say, checked directly (without the audit)."""
import pytest
import torch

from interp.models.zoo import OFFSET, SINGLE_PAIR, ZOO, ZooEntry, build


def _future_change(model, cut: int, n_pos: int = 16, batch: int = 1, seed: int = 0) -> float:
    """Largest change of outputs at positions <= cut when every later token changes."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 13, (batch, n_pos), generator=generator)
    changed = tokens.clone()
    changed[:, cut + 1:] = (changed[:, cut + 1:] + 1) % 13
    with torch.no_grad():
        return float((model(tokens)[:, : cut + 1] - model(changed)[:, : cut + 1]).abs().max())


def test_registry_is_labelled():
    assert len(ZOO) >= 15
    for name, entry in ZOO.items():
        assert isinstance(entry, ZooEntry) and entry.name == name
        assert entry.causal == (entry.leak is None)
        assert (entry.first_leaking_site is None) == entry.causal
    leaky = {e.leak for e in ZOO.values() if e.leak}
    assert leaky == {"future", "batch", "padding"}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_models_are_seeded_and_shaped(name):
    tokens = torch.randint(0, 13, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first, again, other = build(name, 0)(tokens), build(name, 0)(tokens), build(name, 1)(tokens)
    assert first.shape == (3, 9, 13)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("name", [n for n, e in ZOO.items() if e.causal and not e.bidirectional and n != "mask_after_softmax_renorm"])
def test_correct_models_ignore_the_future_exactly(name):
    model = build(name, 0)
    assert all(_future_change(model, cut) == 0.0 for cut in (0, 7, 14))


MASK_ONLY = ("mask_fast_path", "masked_pooling")  # leak only when given an attention_mask
SMALL = ("single_pair", "tiny_leak", "offset_small_leak")


@pytest.mark.parametrize("name", [n for n, e in ZOO.items() if e.leak == "future" and n not in SMALL + MASK_ONLY])
def test_future_leaks_are_large(name):
    assert max(_future_change(build(name, 0), cut) for cut in (3, 8)) > 1e-2


def test_renormalised_mask_moves_only_by_rounding():
    change = _future_change(build("mask_after_softmax_renorm", 0), 8)
    assert 0.0 < change < 1e-5


def test_single_pair_leaks_only_from_its_source():
    query, source = SINGLE_PAIR
    model = build("single_pair", 0)
    tokens = torch.randint(0, 13, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = model(tokens)
        for position in range(query + 1, 12):
            changed = tokens.clone()
            changed[0, position] = (changed[0, position] + 1) % 13
            moved = (model(changed)[0, : query + 1] - base[0, : query + 1]).abs().amax(dim=-1)
            expected_leak = position == source
            assert (moved[query] > 0) == expected_leak
            assert moved[:query].max() == 0


def test_tiny_leak_is_tiny():
    model = build("tiny_leak", 0)
    with torch.no_grad():
        scale = float(model(torch.zeros(1, 16, dtype=torch.long)).pow(2).mean().sqrt())
    assert 1e-6 < _future_change(model, 8) / scale < 1e-3


def test_view_bug_mixes_only_batched_examples():
    model = build("batch_mixing", 0)
    assert _future_change(model, 7, batch=1) == 0.0
    tokens = torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[0] = (changed[0] + 1) % 13
    with torch.no_grad():
        assert (model(tokens)[1] - model(changed)[1]).abs().max() > 1e-3


def test_encoder_padding_bug_reads_pad_content():
    tokens = torch.randint(1, 13, (1, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(1, 9, dtype=torch.long)
    mask[0, 6:] = 0
    other = tokens.clone()
    other[0, 6:] = (other[0, 6:] + 1) % 13
    with torch.no_grad():
        good, bad = build("encoder", 0), build("encoder_padding_bug", 0)
        assert torch.equal(good(tokens, mask)[0, :6], good(other, mask)[0, :6])
        assert (bad(tokens, mask)[0, :6] - bad(other, mask)[0, :6]).abs().max() > 1e-3
        assert torch.isfinite(good(tokens, torch.zeros_like(mask))).all()


def test_unknown_names_are_refused():
    with pytest.raises(KeyError, match="no zoo model 'nope'"):
        build("nope")


@pytest.mark.parametrize("name", MASK_ONLY)
def test_mask_only_leaks_are_causal_without_a_mask_and_leak_with_ones(name):
    model = build(name, 0)
    assert _future_change(model, 7) == 0.0  # called without a mask: exactly causal
    tokens = torch.randint(0, 13, (1, 12), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[0, 6:] = (changed[0, 6:] + 1) % 13
    ones = torch.ones_like(tokens)
    with torch.no_grad():
        moved = (model(tokens, ones)[0, :6] - model(changed, ones)[0, :6]).abs().max()
    assert moved > 1e-3


def test_fast_path_keeps_the_causal_mask_when_something_is_padded():
    model = build("mask_fast_path", 0)
    tokens = torch.randint(1, 13, (1, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    mask[0, -1] = 0  # one pad: the slow, correct path
    changed = tokens.clone()
    changed[0, 6:11] = (changed[0, 6:11] + 1) % 13
    with torch.no_grad():
        assert torch.equal(model(tokens, mask)[0, :6], model(changed, mask)[0, :6])


def test_offset_models_share_a_large_offset_and_only_one_leaks():
    good, bad = build("offset_causal", 0), build("offset_small_leak", 0)
    tokens = torch.randint(0, 13, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = good(tokens)
    spread = float((logits - logits.mean(dim=(0, 1))).pow(2).mean().sqrt())
    assert abs(float(logits.mean()) - OFFSET) < 5 and spread < abs(OFFSET) / 100
    assert _future_change(good, 7) == 0.0
    relative = _future_change(bad, 7) / spread
    assert 2e-4 < relative < 2e-2  # about 2e-3 of the spread, 1e-5 of the offset
