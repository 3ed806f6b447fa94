"""Known-answer tests for the hand-set models in models/constructed.py: every claimed pattern,
the induction circuit's losses, and the redundancy / dispensability properties."""
import json
import math

import pytest
import torch

from interp.models.constructed import (
    HEAD_ROLES,
    LOCAL_WINDOW,
    fixed_offset_copier,
    induction_circuit,
    pattern_heads,
    redundant_pair,
    single_head,
)

V, N = 64, 128
BOS = V - 1


@pytest.fixture(scope="module")
def patterns_model():
    return pattern_heads(d_vocab=V, n_ctx=N)


@pytest.fixture(scope="module")
def redundant():
    return redundant_pair(d_vocab=V, n_ctx=N)


@pytest.fixture(scope="module")
def induction():
    return induction_circuit(d_vocab=V, n_ctx=N)


def random_tokens(n, n_pos, seed=0, bos=True):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V - 1 if bos else V, (n, n_pos), generator=g)
    if bos:
        tokens[:, 0] = BOS
    return tokens


def period_two(n, n_pos, seed=0):
    """BOS then a b a b ... (a != b)."""
    g = torch.Generator().manual_seed(seed)
    ab = torch.stack([torch.randperm(V - 1, generator=g)[:2] for _ in range(n)])  # (prompt, 2)
    body = ab.repeat(1, (n_pos - 1 + 1) // 2)[:, : n_pos - 1]
    return torch.cat([torch.full((n, 1), BOS), body], dim=1)


def repeated_distinct(n, prefix_len, seed=0, junk=0):
    """BOS, `junk` distinct filler tokens, then a prefix of other distinct tokens twice."""
    g = torch.Generator().manual_seed(seed)
    draws = torch.stack([torch.randperm(V - 1, generator=g)[: prefix_len + junk] for _ in range(n)])
    prefix, filler = draws[:, :prefix_len], draws[:, prefix_len:]
    return torch.cat([torch.full((n, 1), BOS), filler, prefix, prefix], dim=1)


def patterns(model, tokens, layer):
    _, cache = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.attn.hook_pattern")
    return cache[f"blocks.{layer}.attn.hook_pattern"]  # (batch, head, query, key)


def ideal(role, n_pos):
    """The exact pattern a role describes, (query, key)."""
    q = torch.arange(n_pos)
    if role == "previous_token":
        out = torch.zeros(n_pos, n_pos)
        out[q[1:], q[1:] - 1] = 1.0
        out[0, 0] = 1.0
    elif role == "first_token":
        out = torch.zeros(n_pos, n_pos)
        out[:, 0] = 1.0
    elif role == "self_token":
        out = torch.eye(n_pos)
    elif role == "uniform":
        out = torch.ones(n_pos, n_pos).tril()
        out = out / out.sum(-1, keepdim=True)
    elif role == "local_window":
        out = torch.ones(n_pos, n_pos).tril() - torch.ones(n_pos, n_pos).tril(-LOCAL_WINDOW)
        out = out / out.sum(-1, keepdim=True)
    return out


def zero_heads(*labels):
    """fwd_hooks that zero-ablate heads given as L{l}H{h} at hook_z."""
    by_layer = {}
    for label in labels:
        layer, head = (int(x) for x in label[1:].split("H"))
        by_layer.setdefault(layer, []).append(head)

    def make(heads):
        def hook(z, hook):
            z = z.clone()
            z[:, :, heads] = 0.0
            return z
        return hook

    return [(f"blocks.{layer}.attn.hook_z", make(heads)) for layer, heads in by_layer.items()]


def mean_heads(model, tokens, *labels):
    """fwd_hooks that replace heads' z by its mean over prompts and positions of `tokens`."""
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_z"))
    hooks = []
    for label in labels:
        layer, head = (int(x) for x in label[1:].split("H"))
        mean = cache[f"blocks.{layer}.attn.hook_z"][:, :, head].mean(dim=(0, 1))

        def hook(z, hook, head=head, mean=mean):
            z = z.clone()
            z[:, :, head] = mean
            return z
        hooks.append((f"blocks.{layer}.attn.hook_z", hook))
    return hooks


def loss_from(model, tokens, start, hooks=()):
    per = model.run_with_hooks(tokens, return_type="loss", loss_per_token=True, fwd_hooks=list(hooks))
    return per[:, start:].mean().item()


# ---------------------------------------------------------------- patterns


@pytest.mark.parametrize("bos", [True, False])
def test_pattern_heads_are_exact(patterns_model, bos):
    tokens = random_tokens(8, N, seed=1, bos=bos)
    pattern = patterns(patterns_model, tokens, 0)
    for label, role in patterns_model.truth.items():
        head = int(label.split("H")[1])
        torch.testing.assert_close(pattern[:, head], ideal(role, N).expand(8, N, N), atol=1e-6, rtol=0)


def test_previous_token_mass_at_least_0999(patterns_model):
    pattern = patterns(patterns_model, random_tokens(4, N, seed=2), 0)[:, 0]  # (batch, query, key)
    mass = pattern.diagonal(offset=-1, dim1=-2, dim2=-1)  # (batch, query - 1): weight on query-1
    assert mass.min().item() >= 0.999


def test_first_self_uniform_masses(patterns_model):
    pattern = patterns(patterns_model, random_tokens(4, N, seed=3), 0)
    assert pattern[:, 1, :, 0].min().item() >= 0.999  # first_token head on position 0
    assert pattern[:, 2].diagonal(dim1=-2, dim2=-1).min().item() >= 0.999  # self head
    counts = torch.arange(1, N + 1, dtype=torch.float32)
    torch.testing.assert_close(pattern[:, 3].amax(-1), (1 / counts).expand(4, N))  # uniform


def test_patterns_do_not_depend_on_content(patterns_model):
    a, b = random_tokens(2, 40, seed=4), random_tokens(2, 40, seed=5)
    torch.testing.assert_close(patterns(patterns_model, a, 0), patterns(patterns_model, b, 0), atol=0, rtol=0)


def test_identical_heads_share_weights_and_behaviour(patterns_model):
    attn = patterns_model.blocks[0].attn
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
        weight = getattr(attn, name)
        assert torch.equal(weight[4], weight[5]), name
    tokens = random_tokens(3, 50, seed=6)
    _, cache = patterns_model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_result")))
    assert torch.equal(cache["blocks.0.attn.hook_pattern"][:, 4], cache["blocks.0.attn.hook_pattern"][:, 5])
    assert torch.equal(cache["blocks.0.attn.hook_result"][:, :, 4], cache["blocks.0.attn.hook_result"][:, :, 5])
    assert patterns_model.metadata["identical_heads"] == [["L0H4", "L0H5"]]


@pytest.mark.parametrize("role", [r for r in HEAD_ROLES if r not in ("induction", "fixed_offset")])
def test_single_head_models(role):
    model = single_head(role, d_vocab=16, n_ctx=24)
    assert model.truth == {"L0H0": role}
    tokens = torch.randint(0, 15, (2, 24), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(patterns(model, tokens, 0)[:, 0], ideal(role, 24).expand(2, 24, 24), atol=1e-6, rtol=0)


def test_single_head_rejects_unknown_and_induction_roles():
    with pytest.raises(ValueError, match="'diagonal'.*expected one of"):
        single_head("diagonal")
    with pytest.raises(ValueError, match="induction_circuit"):
        single_head("induction")


def test_fast_path_matches_explicit_path(induction):
    tokens = repeated_distinct(4, 20, seed=7)
    fast = induction(tokens)
    explicit = induction.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_pattern", lambda p, hook: p)])
    torch.testing.assert_close(fast, explicit, atol=1e-4, rtol=1e-5)


def test_truth_covers_every_head_and_metadata_is_json(patterns_model, redundant, induction):
    for model in (patterns_model, redundant, induction):
        labels = {f"L{l}H{h}" for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)}
        assert set(model.truth) == labels
        assert set(model.truth.values()) <= set(HEAD_ROLES)
        json.dumps(model.metadata)
        assert model.metadata["bos_token"] == model.cfg.d_vocab - 1


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="d_vocab=2"):
        pattern_heads(d_vocab=2)


# ---------------------------------------------------------------- induction circuit


def test_induction_circuit_patterns(induction):
    prefix_len = 25
    tokens = repeated_distinct(6, prefix_len, seed=8)
    p0, p1 = patterns(induction, tokens, 0), patterns(induction, tokens, 1)
    assert p0[:, 0].diagonal(offset=-1, dim1=-2, dim2=-1).min().item() >= 0.999
    second = torch.arange(1 + prefix_len, 1 + 2 * prefix_len)  # queries in the second copy
    # the token after the earlier occurrence of the current token
    assert p1[:, 0, second, second - prefix_len + 1].min().item() >= 0.999
    first = torch.arange(0, 1 + prefix_len)  # no earlier occurrence: the BOS sink
    assert p1[:, 0, first, 0].min().item() >= 0.999


@pytest.mark.parametrize("prefix_len,junk", [(5, 0), (20, 0), (31, 3), (40, 17), (62, 0)])
def test_induction_circuit_loss_on_any_length_and_offset(induction, prefix_len, junk):
    tokens = repeated_distinct(6, prefix_len, seed=prefix_len, junk=junk)
    per = induction(tokens, return_type="loss", loss_per_token=True)  # (batch, pos - 1)
    start = 1 + junk + prefix_len  # from here on, each prediction is a token of the second copy after its first
    first_copy = per[:, junk + 1 : start].mean().item()  # predicting x_1 .. x_{L-1}, then x_0 again
    second_copy = per[:, start:].mean().item()
    assert first_copy == pytest.approx(math.log(V - 1), abs=1e-4)
    assert second_copy < 1e-6


def test_induction_circuit_needs_both_heads_and_no_other(induction):
    prefix_len = 30
    tokens = repeated_distinct(8, prefix_len, seed=9)
    start = 1 + prefix_len
    clean = loss_from(induction, tokens, start)
    for label in induction.metadata["essential_heads"]:
        assert loss_from(induction, tokens, start, zero_heads(label)) == pytest.approx(math.log(V - 1), abs=1e-3)
    for label in induction.metadata["dispensable_heads"]:
        assert loss_from(induction, tokens, start, zero_heads(label)) == pytest.approx(clean, abs=1e-7)


def test_fixed_offset_copier_copies_only_at_its_period():
    model = fixed_offset_copier(20, d_vocab=V, n_ctx=N)
    assert model.truth == {"L0H0": "fixed_offset", "L0H1": "uniform"}
    losses = {}
    for prefix_len in (20, 13, 30):
        tokens = repeated_distinct(6, prefix_len, seed=prefix_len)
        per = model(tokens, return_type="loss", loss_per_token=True)
        losses[prefix_len] = per[:, 1 + prefix_len :].mean().item()
        pattern = patterns(model, tokens, 0)[:, 0]
        q = torch.arange(19, tokens.shape[1])
        assert pattern[:, q, q - 19].min().item() >= 0.999  # always offset 19, whatever the period
    assert losses[20] < 1e-6
    assert losses[13] > 3.0 and losses[30] > 3.0  # fails on periods it was not built for
    with pytest.raises(ValueError, match="period=1"):
        fixed_offset_copier(1)


# ---------------------------------------------------------------- redundancy


def test_redundant_pair_each_alone_cheap_both_costly(redundant):
    tokens = period_two(16, 64, seed=10)
    start = 2  # predictions from position 2 on can be right
    clean = loss_from(redundant, tokens, start)
    one = [loss_from(redundant, tokens, start, zero_heads(label)) for label in ("L0H0", "L0H1")]
    both = loss_from(redundant, tokens, start, zero_heads("L0H0", "L0H1"))
    assert clean < 1e-9
    expected_one = math.log1p((V - 2) * math.exp(-15.0))
    for value in one:
        assert value == pytest.approx(expected_one, rel=2e-2)  # float32 log-softmax near 0
        assert value < 1e-4
    assert both == pytest.approx(math.log(V - 1), abs=1e-4)
    # redundancy: the pair matters together far more than the sum of each apart
    assert (both - clean) > 1000 * ((one[0] - clean) + (one[1] - clean))


def test_redundant_pair_under_mean_ablation(redundant):
    tokens = period_two(16, 64, seed=11)
    clean = loss_from(redundant, tokens, 2)
    one = loss_from(redundant, tokens, 2, mean_heads(redundant, tokens, "L0H0"))
    both = loss_from(redundant, tokens, 2, mean_heads(redundant, tokens, "L0H0", "L0H1"))
    assert one - clean < 1e-3
    assert both - clean > 3.0


def test_redundant_pair_whole_sequence_ablation_never_helps(redundant):
    """Positions 0 and 1 are unpredictable but unaffected, so ablation effects are >= 0 everywhere."""
    tokens = period_two(8, 64, seed=12)
    clean = redundant(tokens, return_type="loss", loss_per_token=True)
    ablated = redundant.run_with_hooks(tokens, return_type="loss", loss_per_token=True, fwd_hooks=zero_heads("L0H0"))
    assert (ablated - clean).min().item() >= -1e-7
    torch.testing.assert_close(clean[:, :2], ablated[:, :2])


def test_dispensable_heads_change_loss_by_zero(redundant, patterns_model):
    tokens = period_two(8, 64, seed=13)
    for model in (redundant, patterns_model):
        clean = loss_from(model, tokens, 0)
        for label in model.metadata["dispensable_heads"]:
            assert loss_from(model, tokens, 0, zero_heads(label)) == clean
            assert loss_from(model, tokens, 0, mean_heads(model, tokens, label)) == clean
        # and the heads do write something: they are dispensable, not dead
        _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_result")
        head = int(model.metadata["dispensable_heads"][0].split("H")[1])
        assert cache["blocks.0.attn.hook_result"][:, :, head].abs().sum() > 0


def test_pattern_heads_previous_token_head_is_essential(patterns_model):
    tokens = period_two(8, 64, seed=14)
    assert loss_from(patterns_model, tokens, 2) < 1e-9
    assert loss_from(patterns_model, tokens, 2, zero_heads("L0H0")) == pytest.approx(math.log(V - 1), abs=1e-4)
