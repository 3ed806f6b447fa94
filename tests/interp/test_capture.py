"""interp.capture: streaming correctness, mergeable accumulators, early stop, hook hygiene, bad input."""
import pytest
import torch
from torch import nn

from interp.capture import MomentAccumulator, PerPromptAccumulator, StopForward, stream
from interp.data import PromptSet, pad, random_tokens
from interp.hooks import live_hooks


def max_weight(pattern, ctx):
    return {"max": pattern.amax((-1, -2)), "sum_row0": pattern[:, :, 0].sum(-1)}  # (batch, head) each


def test_stream_matches_run_with_cache(tiny_gpt):
    prompts = random_tokens(7, 12, 40, seed=0)
    result = stream(tiny_gpt, prompts, max_weight, batch_size=3).result()
    _, cache = tiny_gpt.run_with_cache(prompts.tokens)
    expected = torch.stack([cache["pattern", layer].amax((-1, -2)) for layer in range(2)], dim=1)
    assert result["max"].shape == (7, 2, 4)
    torch.testing.assert_close(result["max"], expected)


def test_batch_size_does_not_change_results(tiny_gpt):
    prompts = random_tokens(9, 10, 40, seed=1)
    one = stream(tiny_gpt, prompts, max_weight, batch_size=9).result()
    many = stream(tiny_gpt, prompts, max_weight, batch_size=2).result()
    for key in one:
        torch.testing.assert_close(one[key], many[key])


def test_two_shards_merged_equal_one_pass(tiny_gpt):
    prompts = random_tokens(10, 12, 40, seed=2)
    whole = stream(tiny_gpt, prompts, max_weight, batch_size=4).result()
    first = stream(tiny_gpt, prompts[0:6], max_weight, batch_size=4)
    second = stream(tiny_gpt, prompts[6:10], max_weight, batch_size=4)
    merged = first.merge(second).result()
    for key in whole:
        torch.testing.assert_close(merged[key], whole[key])
    m_whole = stream(tiny_gpt, prompts, max_weight, accumulator=MomentAccumulator()).result()
    m_a = stream(tiny_gpt, prompts[0:3], max_weight, accumulator=MomentAccumulator())
    m_b = stream(tiny_gpt, prompts[3:10], max_weight, accumulator=MomentAccumulator())
    m_merged = m_a.merge(m_b).result()
    for key in m_whole:
        for stat in ("mean", "ci_low", "ci_high", "n"):
            torch.testing.assert_close(m_merged[key][stat], m_whole[key][stat])
    torch.testing.assert_close(m_whole["max"]["mean"].float(), whole["max"].mean(0))


def test_state_size_does_not_depend_on_prompts_or_length(tiny_gpt):
    small = stream(tiny_gpt, random_tokens(4, 8, 40), max_weight, accumulator=MomentAccumulator())
    large = stream(tiny_gpt, random_tokens(64, 48, 40), max_weight, accumulator=MomentAccumulator())
    assert small.state_numel() == large.state_numel() == 2 * 3 * 2 * 4  # metrics x (sum, sq, n) x layer x head
    per_short = stream(tiny_gpt, random_tokens(64, 8, 40), max_weight)
    per_long = stream(tiny_gpt, random_tokens(64, 48, 40), max_weight)
    # per-prompt state: one (layer, head) scalar per prompt and metric, never T x T
    assert per_short.state_numel() == per_long.state_numel() == 64 * 2 * 2 * 4


def test_moment_accumulator_skips_nan_and_gives_normal_ci():
    acc = MomentAccumulator()
    values = torch.tensor([[1.0, float("nan")], [3.0, 2.0], [5.0, float("nan")]])
    acc.update({"x": values[:2]})
    acc.update({"x": values[2:]})
    out = acc.result(confidence=0.95)["x"]
    torch.testing.assert_close(out["mean"], torch.tensor([3.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(out["n"], torch.tensor([3.0, 1.0], dtype=torch.float64))
    half = 1.959964 * 2.0 / 3 ** 0.5  # sd 2 over 3 values
    assert out["ci_high"][0].item() == pytest.approx(3 + half, rel=1e-5)
    assert out["ci_low"][1] == out["ci_high"][1] == 2.0


@pytest.mark.parametrize("early_stop", ["stop_at_layer", "exception"])
def test_later_layers_never_run(tiny_gpt, early_stop):
    fired = []
    handle = tiny_gpt.blocks[1].attn.hook_z.register_forward_hook(lambda *args: fired.append(1))
    try:
        result = stream(tiny_gpt, random_tokens(5, 8, 40), max_weight, layers=[0], batch_size=2,
                        early_stop=early_stop).result()
    finally:
        handle.remove()
    assert fired == [] and result["max"].shape == (5, 1, 4)
    assert live_hooks(tiny_gpt) == []


def test_full_forward_runs_later_layers(tiny_gpt):
    fired = []
    handle = tiny_gpt.blocks[1].attn.hook_z.register_forward_hook(lambda *args: fired.append(1))
    try:
        stream(tiny_gpt, random_tokens(4, 8, 40), max_weight, layers=[0], batch_size=2, early_stop="none")
    finally:
        handle.remove()
    assert len(fired) == 2  # one per batch: the control for the test above


def test_only_needed_sites_are_hooked(tiny_gpt):
    seen = []

    def spy(pattern, ctx):
        seen.append((live_hooks(tiny_gpt), tiny_gpt.blocks[0].attn.explicit_needed()))
        return max_weight(pattern, ctx)

    stream(tiny_gpt, random_tokens(3, 8, 40), spy, layers=[1])
    assert seen == [(["blocks.1.attn.hook_pattern"], False)]  # layer 0 kept its fast path


def test_a_failing_reducer_leaves_no_hook(tiny_gpt):
    def broken(pattern, ctx):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        stream(tiny_gpt, random_tokens(3, 8, 40), broken)
    assert live_hooks(tiny_gpt) == []


def test_context_masks_on_padded_encoder(tiny_encoder):
    prompts = pad([torch.arange(1, 6), torch.arange(1, 4)], padding_side="left")
    contexts = []

    def keep(pattern, ctx):
        contexts.append(ctx)
        return max_weight(pattern, ctx)

    stream(tiny_encoder, prompts, keep, layers=[0])
    ctx = contexts[0]
    assert not ctx.causal and ctx.first_real.tolist() == [0, 2]
    assert ctx.allowed.shape == (2, 1, 5, 5)
    assert ctx.allowed[1, 0].sum() == 9 and not ctx.allowed[1, 0, :, :2].any() and not ctx.allowed[1, 0, :2].any()


class TinyMHA(nn.Module):
    """A plain nn.MultiheadAttention model: no stop_at_layer, so early stop goes by StopForward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(20, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.calls = 0

    def forward(self, tokens):
        self.calls += 1
        return self.encoder(self.embed(tokens))


def test_works_on_hooked_multihead_attention():
    from interp.mha import hook_attention

    model = hook_attention(TinyMHA().eval())
    fired = []
    last = model.encoder.layers[1].linear2.register_forward_hook(lambda *args: fired.append(1))
    try:
        result = stream(model, random_tokens(4, 6, 20), max_weight, layers=[0], batch_size=2).result()
    finally:
        last.remove()
    assert result["max"].shape == (4, 1, 2) and fired == []
    full = stream(model, random_tokens(4, 6, 20), max_weight, batch_size=4).result()
    assert full["max"].shape == (4, 2, 2)
    with pytest.raises(ValueError, match="stop_at_layer"):
        stream(model, random_tokens(4, 6, 20), max_weight, early_stop="stop_at_layer")


def test_stop_forward_is_internal():
    assert issubclass(StopForward, Exception) and not issubclass(StopForward, ValueError)


def test_bad_input(tiny_gpt):
    with pytest.raises(ValueError, match="prompt set is empty"):
        stream(tiny_gpt, PromptSet(torch.zeros(0, 5, dtype=torch.long)), max_weight)
    with pytest.raises(ValueError, match="n_ctx=64"):
        stream(tiny_gpt, random_tokens(2, 70, 40), max_weight)
    with pytest.raises(ValueError, match="batch_size=0"):
        stream(tiny_gpt, random_tokens(2, 8, 40), max_weight, batch_size=0)
    with pytest.raises(ValueError, match="early_stop='sometimes'"):
        stream(tiny_gpt, random_tokens(2, 8, 40), max_weight, early_stop="sometimes")
    with pytest.raises(ValueError, match="layers \\[2\\] do not exist.*\\[0, 1\\]"):
        stream(tiny_gpt, random_tokens(2, 8, 40), max_weight, layers=[2])
    with pytest.raises(KeyError, match="no 'nonsense' hook"):
        stream(tiny_gpt, random_tokens(2, 8, 40), max_weight, role="nonsense")
    with pytest.raises(TypeError, match="expected a PromptSet"):
        stream(tiny_gpt, torch.zeros(2, 8, dtype=torch.long), max_weight)


def test_accumulator_errors():
    with pytest.raises(ValueError, match="empty"):
        PerPromptAccumulator().result()
    with pytest.raises(ValueError, match="empty"):
        MomentAccumulator().result()
    acc = PerPromptAccumulator()
    acc.update({"a": torch.zeros(2, 1, 1)})
    with pytest.raises(ValueError, match="metrics"):
        acc.update({"b": torch.zeros(2, 1, 1)})
    with pytest.raises(ValueError, match="batch size"):
        PerPromptAccumulator().update({"a": torch.zeros(2, 1), "b": torch.zeros(3, 1)})


def test_moment_merge_refuses_mismatched_shapes():
    a, b = MomentAccumulator(), MomentAccumulator()
    a.update({"m": torch.ones(4, 2, 3)})
    b.update({"m": torch.ones(4, 1, 3)})
    with pytest.raises(ValueError, match="cannot merge metric 'm'"):
        a.merge(b)


def test_causality_is_inferred_only_from_patterns():
    from interp.capture import _infer_causal

    z = torch.randn(2, 5, 3, 4)  # (batch, pos, head, d_head): no diagonal to read
    with pytest.raises(ValueError, match="role='pattern'"):
        _infer_causal(z, "z")
    assert _infer_causal(torch.ones(1, 2, 3, 3).tril(), "pattern")
