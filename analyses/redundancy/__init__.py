"""Head redundancy: which heads do the same work, which back each other up, which can go.

Questions and entry points (each returns a tidy DataFrame; per-prompt values are reduced to a
mean and a percentile-bootstrap CI over prompts, the prompt being the unit of statistics):

- `pattern_similarity`: Jensen-Shannon divergence (bits, in [0, 1]) between two heads'
  attention distributions at the same query, averaged over queries and prompts, for every
  pair of heads within and across layers. Streaming: one batch's patterns alive at a time.
- `output_similarity`: how alike two heads' writes to the residual stream (`hook_result`)
  are: mean per-position cosine, and linear CKA over positions (Kornblith et al. 2019).
- `importance`: the loss change when a head alone is ablated (zero / mean / resample), for
  every head, and the first-order head-mask estimate of it (Michel et al. 2019), with the
  Spearman rank correlation between estimate and truth in `frame.attrs`.
- `joint_ablation`: loss change of ablating two heads together against the sum of each alone;
  `interaction = delta_both - delta_a - delta_b` > 0 means the pair matters together more
  than apart (redundancy / backup). Pairs given, or suggested by `suggest_pairs`.
- `compensation`: per head the direct effect (only its direct path to the output removed, later
  layers frozen) vs its total effect (ablated everywhere): self-repair = direct - total (the hydra
  effect, McGrath et al. 2023); and the compensation matrix: how much each later head's direct
  contribution rises when an earlier head is ablated, measured on one baseline (the ablated run),
  and what fraction of the ablated head's cost that recovers (backup heads, Wang et al. 2022).
- `pruning_curve`: loss as heads are removed, least important first vs in random order, ordered
  on one half of the prompts and scored on the other; how many can go before the loss rises by `margin`.

Modules: `similarity` (pattern_similarity, output_similarity, to_matrix, suggest_pairs),
`importance` (gradient_importance, importance, second_order, pruning_curve), `interaction`
(joint_ablation, compensation), `common` (what they share). The claims built on these
(`redundant_claim`, `dispensable_claim`, `backup_claim`, `redundancy_claims`) are in
`interp.analyses.claims.pair`.

Losses are per prompt values of a *behaviour* (`interp.behaviour`): `behaviour=` takes a name
("next-token", "masked-lm", "embedding"), a `Behaviour`, or a callable `(output, prompts) ->
(prompt,)` on the final logits; the default is `interp.Run`'s, the one claims and the report measure
(`default_behaviour` with `positions="auto"`: for a causal LM the next-token loss at the repeated positions
(`Repeats.query_mask`) when the prompts have a repeat structure, else at every real position; the sentence-embedding change for an encoder or a
model whose head is random). `lm_loss` (every position) and `induction_loss` (repeated copies only) are
next-token behaviours. A NaN value raises. "Loss" below means the behaviour's value.

Column names: `layer`, `head` (or `layer_a, head_a, layer_b, head_b` for pairs), `label`
(`L{l}H{h}`), the main metric with `ci_low`, `ci_high`, other metrics with
`{metric}_ci_low`, `{metric}_ci_high`, and `n_prompts`; every frame of a causal measurement also names
its `behaviour` (in words) and its `ablation` kind in columns (and `attrs`: behaviour, unit, method).
The similarity frames measure no behaviour and have neither.

Devices and dtypes: every entry point takes `device=` ("cpu", "cuda:1", ...) and `dtype=`
("float32", "bfloat16", "float16"); the model is moved / cast by `interp.launch.move` (a copy: the
caller's model is left as it was; move it yourself and leave both unset to avoid the copy's memory),
prompts go to its device batch by batch, and statistics are accumulated in float32 or float64.
A device or dtype this process cannot use raises BadInput. In bfloat16, losses and their changes
move by a few 1e-2 nats from float32 (tests/analyses/redundancy/test_redundancy.py states the tolerances).

Ablations run through `interp.ablation.AblationEngine` (`importance`, `joint_ablation`,
`pruning_curve`, `compensation`): where the model says resuming is exact (`HookedGPT.resumable`,
sequential pre-norm blocks) the clean forward runs once per batch and each ablation resumes after its
earliest layer's attention (`model.run_from`), with the loss read fused from the final residual
(`model.next_token_loss_from_resid`). Measured (benchmarks/bench_redundancy): about 1.8x less CPU
than one `run_with_hooks` forward per head, equal to 1e-5. Other models (post-norm, parallel blocks),
or `fast=False`, run one hooked forward per ablation.
"""
from interp.analyses.redundancy.common import induction_loss, lm_loss
from interp.analyses.redundancy.importance import gradient_importance, importance, pruning_curve, second_order
from interp.analyses.redundancy.interaction import CompensationResult, compensation, joint_ablation
from interp.analyses.redundancy.similarity import output_similarity, pattern_similarity, suggest_pairs, to_matrix

# what a user calls: the entry points above, their result and the two next-token behaviours
__all__ = [
    "pattern_similarity",
    "output_similarity",
    "suggest_pairs",
    "to_matrix",
    "importance",
    "gradient_importance",
    "second_order",
    "pruning_curve",
    "joint_ablation",
    "compensation",
    "CompensationResult",
    "lm_loss",
    "induction_loss",
]

# importable from here too, but no part of the surface (`name as name`: an explicit re-export): defaults and the
# argument types
from interp.analyses.redundancy.common import DEFAULT_MARGIN as DEFAULT_MARGIN
from interp.analyses.redundancy.importance import OrderBy as OrderBy
from interp.analyses.redundancy.similarity import WRITE_FLOOR as WRITE_FLOOR
from interp.analyses.redundancy.similarity import SuggestBy as SuggestBy
