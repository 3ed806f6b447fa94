"""Why a head attends where it does: each pre-softmax score split exactly into source-pair terms.

A head's score at (query q, key k) is `s(q, k) = attn.scale * q_vec(q) . k_vec(k)`. In a pre-norm model the
query and key read the residual stream through the block's norm, and the stream is a sum of writes. With
the norm's per-position scale **frozen** at its clean-run value (as direct logit attribution does), the
norm is affine, so the query and the key are each a sum of one term per *source*, and the score is a sum of
one term per (query source, key source) pair: `s(q, k) = sum_a sum_b attn.scale * Q_a(q) . K_b(k)`, exactly.

Sources (`interp.analyses.qk.sources.Source`), on each side, in forward order:

    tok_embed, pos_embed   the token and learned position embeddings (`embed` where positions are rotary,
                           or where an encoder normalises its embeddings together; `type_embed` for
                           token types)
    L{l}H{h}               head h of an earlier layer l: z @ W_O[h] (`interp.paths`' writer)
    b_O{l}                 layer l's attention output bias (no head owns it)
    MLP{l}                 layer l's MLP output, its b_out included
    ln_bias                the norm's bias (LayerNorm), added after the norm
    b_Q / b_K              the head's query / key bias

Each residual-stream source is centred by the norm itself (its own mean removed, as LayerNorm removes the
stream's) and divided by the frozen scale; RMSNorm only scales; there is no separate centring source.
On rotary models each side's projected source is rotated at its own position before the product (position
enters by rotation, so there is no position source); the head's own `attn.scale` is used.

Two views of the same terms (`QKAttribution.frame(view=...)`):

- "difference" (the default, *pattern attribution*): the terms of s(q, k) - s(q, k') against a contrast key
  k' (default: the highest-scoring other key the query sees; `against=`). The softmax gives
  log p_k - log p_k' = s(q, k) - s(q, k') exactly, so these terms say why the head prefers k to k'. A term
  that adds the same amount to every key's score at the query cancels here (exactly 0): without rotary,
  every pair whose key side is `b_K` or `ln_bias`.
- "score": the terms of s(q, k) itself, with the rows that are constant across keys marked
  (`constant_across_keys`): part of the score, ignored by the softmax.

Exactness: rows summed in float64 equal the model's float32 score (`hook_attn_scores`) to float32 rounding;
the tests hold every converted family (GPT-2, GPT-NeoX incl. partial rotary and parallel blocks, Llama,
Mistral, Qwen2, Gemma, Phi-3 with grouped-query attention) and HookedGPT to 1e-5 x sum |rows| plus the
score's float32 rounding. The frozen scale is what makes it exact, and what it leaves out: removing a
source changes the norm's scale too. `QKAttribution.check(run)` measures both: it patches the top pairs'
sources out of only that side's input of the head (`check.SourceRemoval`, through `interp.Run`), reading
the head's score, once with the scale pinned at its clean value (the prediction must hold to float
rounding: a test of the arithmetic) and once live (the real check). The prediction is exact for the
score, not for anything downstream of it.

Scope: pre-norm models (post-norm blocks normalise between writers, so the stream is no sum of sources:
refused, as `interp.paths` and direct logit attribution refuse them); QK-norm, soft-capped scores and
ALiBi are refused. On a model hooked by interception (a user's own module) the same attribution runs where the query
and key projections are visible (`interp.analyses.qk.intercepted`: sources `rest`, earlier heads, `b_O{l}`,
`ln_bias`, `b_Q` / `b_K`); q or k rotated or normalised in the model's own code is refused, and `check` is (it needs
split q/k inputs). References: Elhage et al. 2021 (QK circuits), Kamath et al. 2025 (QK attributions
over features). The docs page "Why a head attends where it does" says more.
"""
from interp.analyses.qk.attribution import QKAttribution, attribute
from interp.analyses.qk.check import QKCheck, SourceRemoval, check, score_behaviour
from interp.analyses.qk.common import VIEWS, View
from interp.analyses.qk.sources import Source, sources

# what a user calls: the attribution, its check, the sources and the views
__all__ = [
    "attribute",
    "QKAttribution",
    "check",
    "QKCheck",
    "SourceRemoval",
    "score_behaviour",
    "sources",
    "Source",
    "View",
    "VIEWS",
]

# importable from here too, but no part of the surface (`name as name`: an explicit re-export): constants
from interp.analyses.qk.common import FROZEN_NORM as FROZEN_NORM
from interp.analyses.qk.common import UNIT as UNIT
from interp.analyses.qk.items import MAX_ROWS as MAX_ROWS
