"""Four more hand-set circuits, written by the team to test circuit discovery and its metrics.

Built like `interp.models.constructed`'s (attention-only, no LayerNorm, one-hot subspaces, saturated
softmaxes; `HeadBuilder`), each a `HookedGPT` with `model.truth` (every head's pattern role) and
`model.metadata["edges"]`: the circuit's edges as `interp.paths` labels. As in `constructed`, the
edges by which a head's *pattern* reads positions (a previous-token head's query and key reading `pos`)
are not listed: they are the same on every prompt.

- `k_composition_distractors()`: induction across two layers (L0H0 -> L2H0 via k) beside distractors:
  a previous-token decoy whose output nothing reads, and a layer-1 head that K-composes with L0H0 exactly
  as the real receiver does but writes where nothing reads;
- `v_only_circuit()`: a three-layer chain whose every composition is through a value (the token three back);
- `redundant_induction()`: the induction circuit with two identical previous-token heads, each enough
  alone (zeroing one costs nothing, zeroing both everything);
- `positional_sender()`: a layer-0 head that writes *position* information (its value reads `pos`), read by
  a layer-1 head's key: a real K-composition that no resampled prompt of the same length can change.
  `metadata["position_only_edges"]` names the edges that carry only positions.

Prompts: `interp.data.repeated_tokens(n, prefix_len, d_vocab - 1, bos=d_vocab - 1, n_repeats=k)`, with the
`prefix_len` and `n_repeats` each factory's `metadata["prompts"]` states.
"""
from __future__ import annotations

import torch

from interp.models.constructed import HeadBuilder
from interp.models.gpt import HookedGPT

K_COMPOSITION_EDGES = ("embed -> L0H0 via v", "L0H0 -> L2H0 via k", "embed -> L2H0 via q", "embed -> L2H0 via v",
                       "L2H0 -> logits")
V_ONLY_EDGES = ("embed -> L0H0 via v", "L0H0 -> L1H0 via v", "L1H0 -> L2H0 via v", "L2H0 -> logits")
REDUNDANT_EDGES = ("embed -> L0H0 via v", "embed -> L0H1 via v", "L0H0 -> L1H0 via k", "L0H1 -> L1H0 via k",
                   "embed -> L1H0 via q", "embed -> L1H0 via v", "L1H0 -> logits")
POSITIONAL_EDGES = ("embed -> L0H0 via v", "L0H0 -> L1H0 via k", "embed -> L1H0 via v", "L1H0 -> logits")
POSITION_ONLY_EDGES = ("embed -> L0H0 via v", "L0H0 -> L1H0 via k")


def _prompts(prefix_len: int, n_repeats: int, d_vocab: int) -> str:
    return (f"interp.data.repeated_tokens(n, {prefix_len}, {d_vocab - 1}, bos={d_vocab - 1}, "
            f"n_repeats={n_repeats})")


def _copy_between(b: HeadBuilder, layer: int, head: int, source: str, dest: str) -> None:
    """OV circuit: the one-hot token held in `source` at the attended key is written to `dest` (BOS excluded)."""
    attn, real = b.model.blocks[layer].attn, torch.arange(b.d_vocab - 1)
    with torch.no_grad():
        attn.W_V[head].zero_(), attn.W_O[head].zero_()
        attn.W_V[head, b.dim(source, real), real] = 1.0
        attn.W_O[head, real, b.dim(dest, real)] = 1.0


def k_composition_distractors(*, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """Induction across two layers: L0H0 (previous token -> `prev`) feeds L2H0's key; L2H0 copies to the logits.

    Distractors: L0H1 has L0H0's pattern and copies as strongly, into `scratch`; L1H0 is an induction head
    whose key reads L0H0's `prev` exactly as L2H0's does, but it writes `scratch`, so its composition with
    L0H0 carries nothing; the other heads are fillers writing `scratch`. Prompts: repeated random tokens
    (prefix 10, two copies); the loss on the second copy is ~0.
    """
    b = HeadBuilder(3, 3, d_vocab, n_ctx, "handbuilt-k-composition")
    b.set_pattern(0, 0, "previous_token")
    b.set_copy(0, 0, "prev")
    b.set_pattern(0, 1, "previous_token")
    b.set_copy(0, 1, "scratch")
    b.set_pattern(1, 0, "induction")
    b.set_copy(1, 0, "scratch")
    b.set_pattern(2, 0, "induction")
    b.set_copy(2, 0, "out")
    b.fill_scratch((0,), ((2, "self_token"),))
    b.fill_scratch((1,), ((1, "uniform"), (2, "first_token")))
    b.fill_scratch((2,), ((1, "self_token"), (2, "uniform")))
    return b.finish(
        task="repeated random tokens after BOS: induction from layer 2, its key reading layer 0",
        prompts=_prompts(10, 2, d_vocab),
        essential_heads=["L0H0", "L2H0"],
        dispensable_heads=["L0H1", "L0H2", "L1H0", "L1H1", "L1H2", "L2H1", "L2H2"],
        distractor_heads=["L0H1", "L1H0"],
        identical_heads=[], redundant_pairs=[], induction_heads=["L1H0", "L2H0"],
        previous_token_heads=["L0H0", "L0H1"],
        edges=list(K_COMPOSITION_EDGES),
    )


def v_only_circuit(*, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """Three previous-token heads chained through their values: the model predicts the token three back.

    L0H0 copies the previous token into `prev`; L1H0 (attending to the previous position) copies that
    position's `prev` into `prev2`; L2H0 copies the previous position's `prev2` to the logits. Every
    composition is via v (every query and key reads positions only). L1H1 is a decoy with L1H0's pattern
    reading `prev` through its value too, into `scratch`; L0H1 and L2H1 are fillers. Prompts: period 4
    (prefix 4, six copies); the loss from the second copy on is ~0.
    """
    b = HeadBuilder(3, 2, d_vocab, n_ctx, "handbuilt-v-only", extra=("prev2",))
    b.set_pattern(0, 0, "previous_token")
    b.set_copy(0, 0, "prev")
    b.set_pattern(1, 0, "previous_token")
    _copy_between(b, 1, 0, "prev", "prev2")
    b.set_pattern(1, 1, "previous_token")
    _copy_between(b, 1, 1, "prev", "scratch")
    b.set_pattern(2, 0, "previous_token")
    _copy_between(b, 2, 0, "prev2", "out")
    b.fill_scratch((0,), ((1, "first_token"),))
    b.fill_scratch((2,), ((1, "uniform"),))
    return b.finish(
        task="period-4 sequences after BOS: predict next token = the token three back (values only)",
        prompts=_prompts(4, 6, d_vocab),
        essential_heads=["L0H0", "L1H0", "L2H0"],
        dispensable_heads=["L0H1", "L1H1", "L2H1"],
        distractor_heads=["L1H1"],
        identical_heads=[], redundant_pairs=[],
        previous_token_heads=["L0H0", "L1H0", "L1H1", "L2H0"],
        edges=list(V_ONLY_EDGES),
    )


def redundant_induction(*, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """The induction circuit with two identical previous-token senders, each enough alone.

    L0H0 and L0H1 both copy the previous token into `prev`, so a matching key holds 2 there and scores
    twice what one sender gives; one sender gives a match a score still `score_gap` above the BOS default,
    so zeroing either costs ~0 and zeroing both costs ln(d_vocab - 1) per prediction of the second copy.
    Resampled, a sender is not silent but wrong: a key whose resampled previous token equals the query's
    token ties with the true match, so each sender's edges have effects (smaller than the circuit's, as many
    as there are such collisions). L0H2, L1H1 and L1H2 are fillers. Prompts: repeated random tokens (prefix 10).
    """
    b = HeadBuilder(2, 3, d_vocab, n_ctx, "handbuilt-redundant-induction")
    for head in (0, 1):
        b.set_pattern(0, head, "previous_token")
        b.set_copy(0, head, "prev")
    b.set_pattern(1, 0, "induction")
    b.set_copy(1, 0, "out")
    b.fill_scratch((0,), ((2, "uniform"),))
    b.fill_scratch((1,), ((1, "first_token"), (2, "self_token")))
    return b.finish(
        task="repeated random tokens after BOS: induction whose key reads two redundant previous-token heads",
        prompts=_prompts(10, 2, d_vocab),
        essential_heads=["L1H0"],
        dispensable_heads=["L0H2", "L1H1", "L1H2"],
        identical_heads=[["L0H0", "L0H1"]],
        redundant_pairs=[["L0H0", "L0H1"]],
        induction_heads=["L1H0"],
        previous_token_heads=["L0H0", "L0H1"],
        edges=list(REDUNDANT_EDGES),
    )


def positional_sender(*, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """A real K-composition that carries only positions.

    L0H0 attends to its own position and its value reads `pos`: it writes the query's position, one-hot,
    into `posinfo`. L1H0's query maps position i to position i - 1 and its key reads `posinfo` (not `pos`),
    so its previous-token pattern exists only through L0H0; it copies the attended token to the logits
    (next token = previous token, right on period-2 prompts). Zeroing L0H0 leaves L1H0 attending uniformly
    (about ln 2 nats lost per prediction); but L0H0's write is the same on every prompt of one length, so
    patching it from another prompt changes nothing: `metadata["position_only_edges"]`. L0H1 (previous
    token) and L1H1 (first token) are fillers writing `scratch`. Prompts: period 2 (prefix 2, ten copies).
    """
    b = HeadBuilder(2, 2, d_vocab, n_ctx, "handbuilt-positional-sender", extra=("posinfo",))
    positions = torch.arange(n_ctx)
    b.set_pattern(0, 0, "self_token")
    attn0, attn1 = b.model.blocks[0].attn, b.model.blocks[1].attn
    with torch.no_grad():
        attn0.W_V[0].zero_(), attn0.W_O[0].zero_()
        attn0.W_V[0, b.dim("pos", positions), positions] = 1.0  # (d_model -> d_head): the position, one-hot
        attn0.W_O[0, positions, b.dim("posinfo", positions)] = 1.0
        attn1.W_Q[0].zero_(), attn1.W_K[0].zero_(), attn1.b_Q[0].zero_()
        attn1.W_K[0, b.dim("posinfo", positions), positions] = 1.0  # the key's position as L0H0 wrote it
        attn1.W_Q[0, b.dim("pos", positions[1:]), positions[:-1]] = b.gain  # query i looks for key i - 1
    b.truth["L1H0"] = "previous_token"
    b.set_copy(1, 0, "out")
    b.fill_scratch((0,), ((1, "previous_token"),))
    b.fill_scratch((1,), ((1, "first_token"),))
    return b.finish(
        task="period-2 sequences after BOS: predict next token = previous token, the pattern built from L0H0's "
             "position write",
        prompts=_prompts(2, 10, d_vocab),
        essential_heads=["L0H0", "L1H0"],
        dispensable_heads=["L0H1", "L1H1"],
        identical_heads=[], redundant_pairs=[],
        previous_token_heads=["L0H1", "L1H0"],
        edges=list(POSITIONAL_EDGES),
        position_only_edges=list(POSITION_ONLY_EDGES),
    )


FACTORIES = {  # name -> factory; every one accepts d_vocab= and n_ctx=
    "k_composition_distractors": k_composition_distractors,
    "v_only_circuit": v_only_circuit,
    "redundant_induction": redundant_induction,
    "positional_sender": positional_sender,
}
