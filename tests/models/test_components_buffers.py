"""`run_with_cache` reuses its attention tensors across calls (`BufferPool`): the same numbers as a
fresh computation, never a cache already returned overwritten, and no allocator tuning at import."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from interp.models import GPTConfig, HookedGPT
from interp.models.components import BufferPool, reuse_buffers
from interp.sdpa import hook_sdpa

CONFIGS = {
    "standard": dict(),
    "rotary, grouped": dict(positional_embedding_type="rotary", n_heads=4, n_key_value_heads=2),
    "attention only": dict(attn_only=True, normalization_type=None),
}


def _model(**overrides) -> HookedGPT:
    cfg = dict(n_layers=2, n_heads=4, d_model=32, d_vocab=50, n_ctx=16, seed=0) | overrides
    return HookedGPT(GPTConfig(**cfg)).eval()


def _tokens(seed: int, batch: int = 3, n_pos: int = 12) -> torch.Tensor:
    return torch.randint(0, 50, (batch, n_pos), generator=torch.Generator().manual_seed(seed))


def _attention_names(model) -> list[str]:
    return [name for name in model.hook_dict if ".attn.hook_" in name]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_pooled_cache_is_bitwise_the_fresh_one(name):
    """Without autograd (pooled) and with it (nothing pooled, today's kernels) the caches and logits are equal."""
    model = _model(**CONFIGS[name])
    tokens = _tokens(1)
    mask = torch.ones_like(tokens)
    mask[0, :4] = 0  # left padding: the key mask and the empty-row fill run too
    names = _attention_names(model)
    fresh_logits, fresh = model.run_with_cache(tokens, names_filter=names, attention_mask=mask)
    with torch.no_grad():
        for _ in range(3):  # the second and third calls write into the first one's tensors
            logits, cache = model.run_with_cache(tokens, names_filter=names, attention_mask=mask)
            assert torch.equal(logits, fresh_logits)
            for hook in names:
                assert torch.equal(cache[hook], fresh[hook]), hook
            del logits, cache
    assert model.buffer_pool()._kept  # the pool was used (else this test compares nothing new)


def test_two_live_caches_keep_their_own_numbers():
    """A cache still held is never written over by the next call; one dropped is reused."""
    model = _model()
    names = _attention_names(model)
    with torch.no_grad():
        _, first = model.run_with_cache(_tokens(1), names_filter=names)
        snapshot = {hook: first[hook].clone() for hook in names}
        _, second = model.run_with_cache(_tokens(2), names_filter=names)
        _, third = model.run_with_cache(_tokens(3), names_filter=names)
        for hook in names:
            assert torch.equal(first[hook], snapshot[hook]), hook
        pattern = "blocks.0.attn.hook_pattern"
        assert not torch.equal(first[pattern], second[pattern])
        pointers = {cache[pattern].data_ptr() for cache in (first, second, third)}
        assert len(pointers) == 3  # three live caches, three tensors
        reused = second[pattern].data_ptr()
        del second
        _, fourth = model.run_with_cache(_tokens(4), names_filter=names)
        assert fourth[pattern].data_ptr() == reused  # the dropped cache's memory came back
        for hook in names:
            assert torch.equal(first[hook], snapshot[hook]), hook


def test_a_tensor_taken_out_of_a_cache_keeps_its_memory():
    """Holding one tensor (or a view, a numpy array, its storage) of a dropped cache keeps it from reuse."""
    model = _model()
    names = _attention_names(model)
    pattern = "blocks.1.attn.hook_pattern"
    with torch.no_grad():
        for take in (lambda t: t, lambda t: t[:, 0], lambda t: t.numpy(), lambda t: t.untyped_storage()):
            _, cache = model.run_with_cache(_tokens(5), names_filter=names)
            held, want = take(cache[pattern]), cache[pattern].clone()
            del cache
            for seed in (6, 7):  # the pool keeps two per hook: both calls must avoid the held one
                model.run_with_cache(_tokens(seed), names_filter=names)
            got = held if isinstance(held, torch.Tensor) else None
            if isinstance(held, torch.UntypedStorage):
                got = torch.tensor([], dtype=want.dtype).set_(held).view(want.shape)
            elif got is None:
                got = torch.from_numpy(held)
            assert torch.equal(got, want if got.shape == want.shape else want[:, 0])


def test_pool_is_off_with_autograd_and_keeps_at_most_two():
    pool, owner, like = BufferPool(), object(), torch.empty(1)
    with torch.enable_grad(), reuse_buffers(pool, torch.device("cpu")):
        _model()(_tokens(1))
    assert not pool._kept
    held = [pool.empty(owner, "x", (2, 3), like) for _ in range(3)]
    assert len(pool._kept[(id(owner), "x")]) == 2 and len({t.data_ptr() for t in held}) == 3
    del held
    again = pool.empty(owner, "x", (2, 3), like)
    assert again.data_ptr() in {t.data_ptr() for t in pool._kept[(id(owner), "x")]}
    other = pool.empty(owner, "x", (4, 3), like)  # a new shape replaces a free tensor of another shape
    assert other.shape == (4, 3) and len(pool._kept[(id(owner), "x")]) == 2
    pool.clear()
    assert not pool._kept


class _SDPALayer(nn.Module):
    """One causal SDPA attention with its output projection, as nanoGPT writes it."""

    def __init__(self, width: int, n_head: int):
        super().__init__()
        self.qkv, self.proj, self.n_head = nn.Linear(width, 3 * width), nn.Linear(width, width), n_head

    def forward(self, x):
        batch, n_pos, width = x.shape
        q, k, v = (t.view(batch, n_pos, self.n_head, -1).transpose(1, 2) for t in self.qkv(x).split(width, dim=2))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, head, pos, d_head)
        return x + self.proj(z.transpose(1, 2).reshape(batch, n_pos, width))


class _SDPAModel(nn.Module):
    def __init__(self, width: int = 32, n_head: int = 4, vocab: int = 50):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(_SDPALayer(width, n_head) for _ in range(2))
        self.unembed = nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.unembed(x)


def test_intercepted_cache_pooled_equals_fresh_and_survives():
    model = hook_sdpa(_SDPAModel().eval())
    names = [name for name in model.hook_dict if name.rsplit(".", 1)[-1].startswith("hook_")]
    assert any(name.endswith("hook_result") for name in names)
    tokens = _tokens(1)
    fresh_logits, fresh = model.run_with_cache(tokens, names_filter=names)
    with torch.no_grad():
        _, kept = model.run_with_cache(tokens, names_filter=names)
        for seed in (2, 3):
            model.run_with_cache(_tokens(seed), names_filter=names)
        for hook in names:
            assert torch.equal(kept[hook], fresh[hook]), hook  # held through two calls on other tokens
        logits, cache = model.run_with_cache(tokens, names_filter=names)  # into a reused tensor
        assert torch.equal(logits, fresh_logits)
        for hook in names:
            assert torch.equal(cache[hook], fresh[hook]), hook
    assert model.buffer_pool()._kept


@pytest.mark.heavy
def test_importing_and_caching_never_calls_mallopt():
    """The default allocator stays the user's: only the CLI tunes glibc (interp.launch.tune_allocator)."""
    code = (
        "import ctypes\n"
        "calls = []\n"
        "class Spy(ctypes.CDLL):\n"
        "    def __getattr__(self, name):\n"
        "        calls.append(name)\n"
        "        return super().__getattr__(name)\n"
        "ctypes.CDLL = Spy\n"
        "import torch, interp, interp.sdpa, interp.capture, interp.run\n"
        "from interp.models import GPTConfig, HookedGPT\n"
        "m = HookedGPT(GPTConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=10, n_ctx=8))\n"
        "with torch.no_grad():\n"
        "    m.run_with_cache(torch.zeros(1, 4, dtype=torch.long))\n"
        "from interp.launch import tune_allocator\n"
        "tuned = tune_allocator()\n"
        "print('mallopt' in calls, tuned)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("INTERP_DEFAULT_ALLOCATOR", None)
    before_cli = subprocess.run([sys.executable, "-c", code.replace("tuned = tune_allocator()", "tuned = None")],
                                capture_output=True, text=True, env=env, check=True)
    assert before_cli.stdout.split() == ["False", "None"]
    if sys.platform.startswith("linux"):  # the spy can see a call: the CLI's route is still there
        with_cli = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        assert with_cli.stdout.split()[0] == "True"


def test_inference_mode_and_no_grad_calls_share_a_model():
    """Inference tensors are kept apart from ordinary ones (an in-place write to one outside inference mode fails)."""
    model = _model()
    names = _attention_names(model)
    fresh_logits, _ = model.run_with_cache(_tokens(1), names_filter=names)
    for _ in range(2):
        with torch.inference_mode():
            logits, _ = model.run_with_cache(_tokens(1), names_filter=names)
        assert torch.equal(logits, fresh_logits)
        with torch.no_grad():
            logits, _ = model.run_with_cache(_tokens(1), names_filter=names)
        assert torch.equal(logits, fresh_logits)


def test_a_model_with_kept_tensors_still_copies_and_pickles():
    import copy
    import pickle

    model = _model()
    with torch.no_grad():
        model.run_with_cache(_tokens(1))
    assert model.buffer_pool()._kept
    twin = copy.deepcopy(model)
    assert not twin.buffer_pool()._kept  # the copy starts with a pool of its own
    assert pickle.loads(pickle.dumps(model)).cfg == model.cfg
