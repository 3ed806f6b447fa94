"""Constructed models: HookedGPTs whose heads are set by hand, so every head's role is known exactly.

They are the ground truth the toolkit's analyses are tested against: a claim about a head of
one of these models has a right answer. Every factory returns a `HookedGPT` (so
`interp.load("interp.models.constructed:induction_circuit")` works) carrying two attributes:

- `model.truth`: the role of every head, e.g. `{"L0H0": "previous_token", "L1H0": "induction"}`
  (roles are the values of `HeadRole`);
- `model.metadata`: the task, the BOS token, how to make prompts, the expected losses, and
  groups of heads (`identical_heads`, `redundant_pairs`, `dispensable_heads`, `essential_heads`);
  the circuits (two layers) also name their true `edges` as `interp.paths` labels
  ("L0H0 -> L1H0 via k", "L1H0 -> logits"): exactly the edges whose path patch (a resampled
  sender, `interp.paths.EdgePatch`) changes the behaviour. Edges that carry only positions (a
  positional head's query and key read `pos`) are not listed: every prompt of one length has the
  same positions, so no resampling can change them.

The factories: `single_head(role)` (one head), `pattern_heads()` (one per positional role),
`redundant_pair()` (a redundant pair), `induction_circuit()` (K-composition),
`v_composition_circuit()` (V-composition: a head reads an earlier head's output through its value),
`unread_head_circuit()` (an induction circuit beside a previous-token head whose output nothing reads),
`fixed_offset_copier()` (a trap for induction claims).

How they are built (attention-only, no LayerNorm, so the residual stream is a sum of known
vectors). The residual stream is split into named one-hot subspaces:

    tok      d_vocab dims  token embedding, W_E[t] = e_t
    pos      n_ctx dims    position embedding, W_pos[i] = e_i
    prev     d_vocab dims  written by layer-0 previous-token heads: the previous token, one-hot
    out      d_vocab dims  read by the unembedding (W_U = `readout_gain` * identity)
    scratch  d_vocab dims  written by dispensable heads; nothing reads it

A positional head matches a query position to key positions with one-hot position vectors
(d_head >= n_ctx): W_Q sends query position i to the d_head basis vectors of the key positions
it should attend to, times `gain`, W_K sends key position j to e_j, so an allowed key scores
`score_gap` (default 40) and every other key 0; softmax then puts >= 1 - n_ctx * e^-40 of the
weight on the chosen keys (1.0 in float32). A copying OV circuit maps `tok` one-hot to a
destination subspace one-hot.

The BOS convention: token `d_vocab - 1` is BOS. Every OV circuit ignores it (its value is the
zero vector) and the unembedding gives it logit -score_gap, so a head that attends to BOS
writes nothing and BOS is never predicted. Make prompts with
`interp.data.repeated_tokens(n, prefix_len, model.cfg.d_vocab - 1, bos=model.cfg.d_vocab - 1)`:
tokens from the first d_vocab - 1 ids after a BOS. Without a BOS the patterns are unchanged
(they are exact for any tokens), but the losses quoted in `metadata` assume one.
"""
from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from interp.models.config import GPTConfig
from interp.models.gpt import HookedGPT

HeadRole = Literal[
    "previous_token",  # all weight on query - 1 (query 0: on itself, the only key)
    "first_token",  # all weight on position 0 (a sink head)
    "self_token",  # all weight on the query's own position
    "uniform",  # equal weight on every allowed key (scores all 0)
    "local_window",  # equal weight on positions query-2, query-1, query (those that exist)
    "induction",  # attends to the token after an earlier occurrence of the current token; else BOS
    "fixed_offset",  # all weight on query - offset (offset set per model); where that is before 0, on BOS
]
HEAD_ROLES: tuple[str, ...] = get_args(HeadRole)

SUBSPACES = ("tok", "pos", "prev", "out", "scratch")
SCORE_GAP = 40.0  # attention score of a chosen key minus that of every other key
READOUT_GAIN = 30.0  # logit of the copied token in the `out` subspace
LOCAL_WINDOW = 3  # width of the local_window role
# the circuits' dispensable heads 1-3 of a layer: patterns a scan would flag, outputs nothing reads
SCRATCH_FILLERS: tuple[tuple[int, HeadRole], ...] = ((1, "first_token"), (2, "self_token"), (3, "uniform"))


class _Builder:
    """Zeroed HookedGPT plus helpers that set one head's QK or OV circuit by role."""

    def __init__(self, n_layers: int, n_heads: int, d_vocab: int, n_ctx: int, name: str,
                 score_gap: float = SCORE_GAP, readout_gain: float = READOUT_GAIN, extra: tuple[str, ...] = ()):
        if d_vocab < 3:
            raise ValueError(f"d_vocab={d_vocab} is too small; need at least 3 (two tokens plus BOS).")
        if n_ctx < 2:
            raise ValueError(f"n_ctx={n_ctx} is too small; need at least 2 positions.")
        if score_gap <= 0 or readout_gain <= 0:
            raise ValueError(f"score_gap={score_gap} and readout_gain={readout_gain} must be positive.")
        self.d_vocab, self.n_ctx = d_vocab, n_ctx
        self.bos = d_vocab - 1
        # `extra`: further named subspaces after the five (d_vocab dims each; "posinfo" n_ctx dims), for models
        # that carry more than one intermediate (interp.models.handbuilt)
        sizes = {"tok": d_vocab, "pos": n_ctx, "prev": d_vocab, "out": d_vocab, "scratch": d_vocab}
        sizes.update({name_: n_ctx if name_ == "posinfo" else d_vocab for name_ in extra})
        self.slices, start = {}, 0
        for name_ in SUBSPACES + tuple(extra):
            self.slices[name_] = slice(start, start + sizes[name_])
            start += sizes[name_]
        self.d_head = max(n_ctx, d_vocab)
        self.cfg = GPTConfig(
            n_layers=n_layers, n_heads=n_heads, d_model=start, d_head=self.d_head, n_ctx=n_ctx,
            d_vocab=d_vocab, attn_only=True, normalization_type=None, seed=0, model_name=name,
        )
        self.model = HookedGPT(self.cfg)
        self.score_gap = score_gap
        # q.k is multiplied by 1/sqrt(d_head) before softmax; the gain undoes that
        self.gain = score_gap * math.sqrt(self.d_head)
        self.readout_gain = readout_gain
        with torch.no_grad():
            for param in self.model.parameters():
                param.zero_()
            self.model.embed.W_E[:, self.slices["tok"]] = torch.eye(d_vocab)
            self.model.pos_embed.W_pos[:, self.slices["pos"]] = torch.eye(n_ctx)
            out = self.slices["out"].start
            real = torch.arange(d_vocab - 1)
            self.model.unembed.W_U[out + real, real] = readout_gain
            self.model.unembed.b_U[self.bos] = -score_gap  # BOS is never predicted
        self.truth: dict[str, str] = {}

    def dim(self, subspace: str, index) -> torch.Tensor:
        return self.slices[subspace].start + torch.as_tensor(index)

    def fill_scratch(self, layers: tuple[int, ...], fillers: tuple[tuple[int, HeadRole], ...] = SCRATCH_FILLERS) -> None:
        """Dispensable heads: each (head, role) of `fillers` in every layer of `layers`, writing to `scratch`."""
        for layer in layers:
            for head, role in fillers:
                self.set_pattern(layer, head, role)
                self.set_copy(layer, head, "scratch")

    def set_pattern(self, layer: int, head: int, role: HeadRole, offset: int | None = None) -> None:
        """Set W_Q, W_K (and b_Q) of one head so its pattern is exactly the role's pattern."""
        if role not in HEAD_ROLES:
            raise ValueError(f"unknown head role {role!r}; expected one of {list(HEAD_ROLES)}.")
        attn = self.model.blocks[layer].attn
        n = self.n_ctx
        positions = torch.arange(n)
        with torch.no_grad():
            attn.W_Q[head].zero_(), attn.W_K[head].zero_(), attn.b_Q[head].zero_()
            if role in ("previous_token", "self_token", "local_window"):
                offsets = {"previous_token": [1], "self_token": [0], "local_window": range(LOCAL_WINDOW)}[role]
                # key position j is the d_head basis vector e_j
                attn.W_K[head, self.dim("pos", positions), positions] = 1.0
                for offset in offsets:
                    query = positions[offset:]
                    attn.W_Q[head, self.dim("pos", query), query - offset] = self.gain
            elif role == "fixed_offset":
                if offset is None or not 1 <= offset < n:
                    raise ValueError(f"fixed_offset needs 1 <= offset < n_ctx={n}, got offset={offset}.")
                attn.W_K[head, self.dim("pos", positions), positions] = 1.0
                query = positions[offset:]
                attn.W_Q[head, self.dim("pos", query), query - offset] = 2 * self.gain
                # queries with no key at query - offset fall back to position 0 (BOS), half as strong
                attn.b_Q[head, 0] += self.gain
            elif role == "first_token":
                attn.W_K[head, self.dim("pos", 0), 0] = 1.0
                attn.b_Q[head, 0] = self.gain  # every query scores key 0 alike
            elif role == "induction":
                # query token t meets key whose previous token (the `prev` subspace) is t
                real = torch.arange(self.d_vocab - 1)
                attn.W_Q[head, self.dim("tok", real), real] = 2 * self.gain
                attn.W_K[head, self.dim("prev", real), real] = 1.0
                # default: the BOS key at position 0 scores half a match, so a match beats it by
                # score_gap and it beats every non-matching key by score_gap
                sink = self.d_vocab - 1
                attn.W_K[head, self.dim("pos", 0), sink] = 1.0
                attn.b_Q[head, sink] = self.gain
            # "uniform": all scores 0
        self.truth[f"L{layer}H{head}"] = role  # interp.heads.head_label's format: models/ imports nothing above it

    def set_copy(self, layer: int, head: int, dest: str, gain: float = 1.0) -> None:
        """OV circuit: the attended token (one-hot in `tok`, BOS excluded) is written to `dest`."""
        attn = self.model.blocks[layer].attn
        real = torch.arange(self.d_vocab - 1)
        with torch.no_grad():
            attn.W_V[head].zero_(), attn.W_O[head].zero_()
            attn.W_V[head, self.dim("tok", real), real] = 1.0
            attn.W_O[head, real, self.dim(dest, real)] = gain

    def finish(self, **metadata) -> HookedGPT:
        model = self.model.eval()
        labels = [f"L{l}H{h}" for l in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]
        missing = [label for label in labels if label not in self.truth]
        if missing:
            raise RuntimeError(f"constructed model {self.cfg.model_name} leaves heads {missing} without a role.")
        model.truth = dict(self.truth)
        model.metadata = {
            "constructed": True,
            "bos_token": self.bos,
            "prompts": (f"interp.data.repeated_tokens(n, prefix_len, d_vocab={self.d_vocab - 1}, "
                        f"bos={self.bos}, n_repeats=...)"),
            "score_gap": self.score_gap,
            "readout_gain": self.readout_gain,
            "subspaces": {k: [s.start, s.stop] for k, s in self.slices.items()},
            **metadata,
        }
        return model


HeadBuilder = _Builder  # public name for building further hand-set models (tests/analyses/redundancy/test_redundancy.py uses it)


def single_head(role: HeadRole, *, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """One layer, one head with the exact pattern `role`; its OV copies the attended token to the logits.

    So the model predicts "the next token is the attended token": for `previous_token` that is
    right on period-2 sequences (`repeated_tokens(n, 2, ..., n_repeats=k)`).
    """
    if role not in HEAD_ROLES or role in ("induction", "fixed_offset"):
        allowed = [r for r in HEAD_ROLES if r not in ("induction", "fixed_offset")]
        raise ValueError(f"single_head role {role!r} is not supported; expected one of {allowed} "
                         "(an induction head needs two layers: use induction_circuit(); "
                         "for fixed_offset use fixed_offset_copier()).")
    b = _Builder(1, 1, d_vocab, n_ctx, f"constructed-single-{role}")
    b.set_pattern(0, 0, role)
    b.set_copy(0, 0, "out")
    return b.finish(task=f"predict that the next token is the token the {role} head attends to",
                    essential_heads=["L0H0"], dispensable_heads=[], identical_heads=[], redundant_pairs=[])


def pattern_heads(*, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """One layer of six heads, one per positional role, plus an identical pair.

    L0H0 previous_token (read by the unembedding: the model predicts next = previous token,
    right on period-2 sequences), L0H1 first_token, L0H2 self_token, L0H3 uniform, L0H4 and
    L0H5 identical local_window heads (same W_Q, W_K, W_V, W_O). L0H1..L0H5 write to the
    `scratch` subspace, which nothing reads: each is dispensable (ablating it changes the loss
    by exactly 0), and L0H0 is essential. L0H4 and L0H5 are identical but *not* redundant:
    ablating both is as cheap as ablating one (a trap for redundancy claims read off similarity).
    """
    b = _Builder(1, 6, d_vocab, n_ctx, "constructed-pattern-heads")
    roles: list[HeadRole] = ["previous_token", "first_token", "self_token", "uniform", "local_window", "local_window"]
    for head, role in enumerate(roles):
        b.set_pattern(0, head, role)
        b.set_copy(0, head, "out" if head == 0 else "scratch")
    return b.finish(
        task="period-2 sequences after BOS: predict next token = previous token",
        identical_heads=[["L0H4", "L0H5"]],
        essential_heads=["L0H0"],
        dispensable_heads=["L0H1", "L0H2", "L0H3", "L0H4", "L0H5"],
        redundant_pairs=[],
    )


def redundant_pair(*, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """Two exactly duplicated previous-token heads whose *sum* the task needs, and two dispensable heads.

    L0H0 and L0H1 are identical previous-token heads, each writing half the readout
    (logit `readout_gain / 2` = 15 for the copied token). On period-2 sequences after a BOS the
    softmax saturates: with both heads the correct token leads by 30 logits, with one by 15
    (loss still ~(d_vocab - 2) e^-15 ~ 2e-5 per position), with neither by 0 (loss
    ln(d_vocab - 1)). So each alone is cheap to ablate and both together are costly: a
    redundant pair. L0H2 (first_token) and L0H3 (uniform) write to `scratch`, which nothing
    reads: dispensable, ablating either changes the loss by exactly 0.
    Prompts: `repeated_tokens(n, 2, d_vocab - 1, bos=d_vocab - 1, n_repeats=k)`; the
    predictions of positions 0 and 1 (next token after BOS, after the first token) cannot be
    right and cost ln(d_vocab - 1) whatever is ablated.
    """
    b = _Builder(1, 4, d_vocab, n_ctx, "constructed-redundant-pair")
    for head in (0, 1):
        b.set_pattern(0, head, "previous_token")
        b.set_copy(0, head, "out", gain=0.5)
    b.set_pattern(0, 2, "first_token")
    b.set_copy(0, 2, "scratch")
    b.set_pattern(0, 3, "uniform")
    b.set_copy(0, 3, "scratch")
    return b.finish(
        task="period-2 sequences after BOS: predict next token = previous token",
        identical_heads=[["L0H0", "L0H1"]],
        redundant_pairs=[["L0H0", "L0H1"]],
        essential_heads=[],
        dispensable_heads=["L0H2", "L0H3"],
        expected_loss_per_position={
            "intact": f"(d_vocab-2)*exp(-{READOUT_GAIN})", "one_of_pair_ablated": f"(d_vocab-2)*exp(-{READOUT_GAIN / 2})",
            "pair_ablated": "ln(d_vocab-1)",
        },
    )


# the edges (interp.paths labels) that carry the induction circuit's behaviour: L0H0 copies each token into
# the next position's `prev` (its value reads the embedding); L1H0's key reads that `prev`, its query the
# current token, its value the attended token, and it writes the logits
INDUCTION_EDGES = ("embed -> L0H0 via v", "L0H0 -> L1H0 via k", "embed -> L1H0 via q", "embed -> L1H0 via v",
                   "L1H0 -> logits")


def induction_circuit(*, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """A 2-layer attention-only induction circuit, set by hand (Olsson et al. 2022, written out).

    L0H0 previous_token: copies the previous token into the `prev` subspace (K-composition).
    L1H0 induction: the query (current token t, from `tok`) matches keys whose `prev` is t,
    i.e. the position after an earlier occurrence of t, and its OV copies that key's token to
    the logits. With no earlier occurrence it attends to the BOS at position 0 and writes
    nothing. The other heads are dispensable (they write to `scratch`): L0H1 first_token,
    L0H2 self_token, L0H3 uniform, L1H1 first_token, L1H2 self_token, L1H3 uniform
    (L0Hk and L1Hk, k = 1..3, have identical weights and write identical outputs, yet are
    not redundant: removing both costs nothing).

    On `repeated_tokens(n, L, d_vocab - 1, bos=d_vocab - 1)` whose prefix has no repeated token,
    the loss is ln(d_vocab - 1) on the first copy and ~0 on the second (all but the first
    token of the second copy, which has no earlier occurrence to copy from); repeats inside
    a prefix make some predictions split between the candidates, as real induction does.
    """
    b = _Builder(2, 4, d_vocab, n_ctx, "constructed-induction-circuit")
    b.set_pattern(0, 0, "previous_token")
    b.set_copy(0, 0, "prev")
    b.set_pattern(1, 0, "induction")
    b.set_copy(1, 0, "out")
    b.fill_scratch(layers=(0, 1))
    return b.finish(
        task="repeated random tokens after BOS: predict the second copy by induction",
        essential_heads=["L0H0", "L1H0"],
        dispensable_heads=["L0H1", "L0H2", "L0H3", "L1H1", "L1H2", "L1H3"],
        identical_heads=[["L0H1", "L1H1"], ["L0H2", "L1H2"], ["L0H3", "L1H3"]],
        redundant_pairs=[],
        induction_heads=["L1H0"],
        previous_token_heads=["L0H0"],
        edges=list(INDUCTION_EDGES),
    )


V_COMPOSITION_EDGES = ("embed -> L0H0 via v", "L0H0 -> L1H0 via v", "L1H0 -> logits")


def v_composition_circuit(*, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """A 2-layer V-composition circuit: the token two back, read through a value.

    L0H0 previous_token: copies the previous token into `prev`. L1H0 previous_token too, but its
    OV reads `prev` (not `tok`) and writes the logits: at query i it attends to i - 1, whose `prev`
    holds token i - 2, so the model predicts "next token = the token two back", right on period-3
    sequences (`repeated_tokens(n, 3, d_vocab - 1, bos=d_vocab - 1, n_repeats=k)`). Neither head
    alone does it: the behaviour flows L0H0 -> L1H0 *via v* (L1H0's query and key read positions
    only). The other heads are dispensable (they write to `scratch`): L0H1 first_token, L0H2
    self_token, L0H3 uniform and the same in layer 1. On period-3 prompts after a BOS the
    predictions of queries 0..2 have nothing to copy (ln(d_vocab - 1)); the rest cost
    ~(d_vocab - 2) e^-readout_gain.
    """
    b = _Builder(2, 4, d_vocab, n_ctx, "constructed-v-composition")
    b.set_pattern(0, 0, "previous_token")
    b.set_copy(0, 0, "prev")
    b.set_pattern(1, 0, "previous_token")
    attn, real = b.model.blocks[1].attn, torch.arange(d_vocab - 1)
    with torch.no_grad():  # OV: `prev` one-hot (BOS never written there) -> `out` one-hot
        attn.W_V[0, b.dim("prev", real), real] = 1.0
        attn.W_O[0, real, b.dim("out", real)] = 1.0
    b.fill_scratch(layers=(0, 1))
    return b.finish(
        task="period-3 sequences after BOS: predict next token = the token two back (V-composition)",
        essential_heads=["L0H0", "L1H0"],
        dispensable_heads=["L0H1", "L0H2", "L0H3", "L1H1", "L1H2", "L1H3"],
        identical_heads=[["L0H1", "L1H1"], ["L0H2", "L1H2"], ["L0H3", "L1H3"]],
        redundant_pairs=[],
        previous_token_heads=["L0H0", "L1H0"],
        edges=list(V_COMPOSITION_EDGES),
    )


def unread_head_circuit(*, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """The induction circuit beside a decoy: a previous-token head whose output nothing reads.

    L0H0 previous_token -> `prev`, L1H0 induction -> logits, exactly as `induction_circuit`. L0H1 has
    the same previous-token pattern and copies the previous token as strongly, but into `scratch`,
    which no later head and not the unembedding reads: it composes with nothing, has no direct
    effect, and ablating it changes the loss by exactly 0, whatever its pattern says (a trap for a
    claim read off a pattern). L1H1 (uniform, to `scratch`) is dispensable too. Prompts and losses
    as `induction_circuit`.
    """
    b = _Builder(2, 2, d_vocab, n_ctx, "constructed-unread-head")
    b.set_pattern(0, 0, "previous_token")
    b.set_copy(0, 0, "prev")
    b.set_pattern(0, 1, "previous_token")
    b.set_copy(0, 1, "scratch")
    b.set_pattern(1, 0, "induction")
    b.set_copy(1, 0, "out")
    b.set_pattern(1, 1, "uniform")
    b.set_copy(1, 1, "scratch")
    return b.finish(
        task="repeated random tokens after BOS: predict the second copy by induction; L0H1 is read by nothing",
        essential_heads=["L0H0", "L1H0"],
        dispensable_heads=["L0H1", "L1H1"],
        unread_heads=["L0H1"],
        identical_heads=[],
        redundant_pairs=[],
        induction_heads=["L1H0"],
        previous_token_heads=["L0H0", "L0H1"],
        edges=list(INDUCTION_EDGES),
    )


def fixed_offset_copier(period: int = 20, *, d_vocab: int = 64, n_ctx: int = 128) -> HookedGPT:
    """A trap for induction claims: one head that copies from a fixed offset, not by matching tokens.

    L0H0 attends from query i to key i - (period - 1) and copies that token to the logits
    (falling back to BOS where that key does not exist). On repeated tokens whose prefix has
    exactly `period` tokens it predicts the second copy perfectly and its pattern looks like an
    induction head's; on any other period it fails. This is what a 2-layer model trained on one
    fixed repeat length can learn instead of induction. L0H1 (uniform) is dispensable.
    """
    if not 2 <= period <= n_ctx - 1:
        raise ValueError(f"period={period} must be between 2 and n_ctx - 1 = {n_ctx - 1}.")
    b = _Builder(1, 2, d_vocab, n_ctx, f"constructed-fixed-offset-{period}")
    b.set_pattern(0, 0, "fixed_offset", offset=period - 1)
    b.set_copy(0, 0, "out")
    b.set_pattern(0, 1, "uniform")
    b.set_copy(0, 1, "scratch")
    return b.finish(
        task=f"repeated tokens with prefix length {period} only: copy from offset {period - 1}",
        offset=period - 1,
        essential_heads=["L0H0"], dispensable_heads=["L0H1"], identical_heads=[], redundant_pairs=[],
        induction_heads=[],
    )


FACTORIES = {  # name -> factory, for listing; every one accepts d_vocab= and n_ctx=
    "fixed_offset_copier": fixed_offset_copier,
    "pattern_heads": pattern_heads,
    "redundant_pair": redundant_pair,
    "induction_circuit": induction_circuit,
    "v_composition_circuit": v_composition_circuit,
    "unread_head_circuit": unread_head_circuit,
}
