# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 5. Why the induction heads do not add up, and what the other layer-0 heads are for
#
# Notebook 02 leaves two observations unexplained in `toy-induction` (2 layers x 4 heads,
# attention only, rotary positions, LayerNorm):
#
# 1. **Sub-additivity.** Mean-ablating each of the four layer-1 induction heads alone costs,
#    summed, more loss on the repeated half than ablating all four together. Why?
# 2. **Layer-0 heads beyond the previous-token head.** Only L0H2 is a previous-token head, yet
#    ablating L0H0, L0H1 or L0H3 also costs nats. What do they contribute?
#
# Hypotheses, each with the measurement that could refute it:
#
# | | hypothesis | refuted if |
# |---|---|---|
# | H1 | *backup*: when one induction head is gone, another compensates | a later head's direct effect grows (`redundancy.compensation`) |
# | H2 | *ceiling*: the loss cannot rise above the loss of knowing nothing | the all-four loss sits well below the no-information loss |
# | H3 | *final LayerNorm*: the heads' writes partly cancel; removing one inflates the residual norm and the final LayerNorm shrinks what the others wrote | freezing the final LayerNorm scale leaves the sub-additivity |
# | H4 | the other layer-0 heads are weak previous-token heads (feed the induction heads' **keys**) | their cost does not go through layer 1's keys |
# | H5 | they are current-token heads feeding the induction heads' **queries and values** | their cost does not go through q / v, or an ideal self-attention pattern does not restore it |
# | H6 | they act on the logits directly | their direct effect is near zero |
#
# Every number below is computed here, on held-out prompts (the half of notebook 02's prompt
# set its claims were tested on), with bootstrap CIs over prompts; the conclusion cell is
# generated from them.

# %% tags=["setup"]
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
torch.set_num_threads(1)
import pandas as pd
pd.set_option("display.width", 160, "display.max_columns", 20, "display.precision", 3)
# %matplotlib inline
import math
import torch.nn.functional as F
import interp
from interp.specs import PromptSpec, build_prompts
from interp.behaviour import next_token_margin
from interp.heads import Head
from interp.hooks import hooked
from interp.interventions import HeadAblation, reference_activations, substitute_pattern
from interp.paths import EdgePatch
from interp.stats import bootstrap
from interp.analyses import copying, redundancy
from interp.analyses.claims import previous_token_head, self_token_head
from interp.claims import test_claims

model = interp.load("toy-induction")
prompts = build_prompts(model, PromptSpec(kind="repeated", n=64, seed=0))
_, test = prompts.split(0.5, seed=0)        # the held-out half, as in notebook 02
reference = reference_activations(model, test)  # per-position means for mean ablation
run = interp.Run(model, test, behaviour=redundancy.induction_loss, reference=reference)  # the loss on the repeated half
first = test.meta["offset"] + test.meta["prefix_len"] + 1  # first predictable position of the second copy
INDUCTION = [Head(1, h) for h in range(4)]
LAYER0 = [Head(0, h) for h in range(4)]

clean = run.clean()  # (prompt,)
print(f"{len(test)} held-out prompts of {test.n_pos} tokens; clean loss on the repeated half {clean.mean():.3f} nats")

# %% [markdown]
# ## The observation, recomputed
#
# Each induction head alone, all four together, and every pair through
# `interp.analyses.redundancy.joint_ablation` (interaction = both - a - b; negative = sub-additive).

# %% tags=["observed"]
alone = {head: run.effect(HeadAblation([head], "mean")) for head in INDUCTION}  # Effects: per-prompt values, mean, CI
together = run.effect(HeadAblation(INDUCTION, "mean"))
interaction = together.values - sum(effect.values for effect in alone.values())  # (prompt,)
rows = [{"ablated": head.label, "delta": e.mean, "ci_low": e.ci_low, "ci_high": e.ci_high} for head, e in alone.items()]
rows.append({"ablated": "all four", "delta": together.mean, "ci_low": together.ci_low, "ci_high": together.ci_high})
rows.append({"ablated": "all four - sum of each alone",
             **dict(zip(["delta", "ci_low", "ci_high"], map(float, bootstrap(interaction, seed=0))))})
observed = pd.DataFrame(rows)
pairs = redundancy.joint_ablation(run, pairs=[(a, b) for i, a in enumerate(INDUCTION) for b in INDUCTION[i + 1:]], method="mean")
print(f"sum of each alone {sum(e.mean for e in alone.values()):+.3f}, all four together {together.mean:+.3f} nats")
display(observed)
pairs[["label_a", "label_b", "delta_a", "delta_b", "delta_both", "interaction", "ci_low", "ci_high"]]


# %% [markdown]
# The same numbers as a figure (95% CIs over prompts), next to the mean patterns of the four
# induction heads on these prompts: each attends to the token after the earlier occurrence.

# %% tags=["figure-observed"]
import matplotlib.pyplot as plt
from interp.analyses import report

patterns = report.mean_patterns(model, test, [0, 1])
fig = plt.figure(figsize=(15, 3.2))
grid = fig.add_gridspec(1, 6, width_ratios=[2.2, 1, 1, 1, 1, 0.01])
report.plot_ci_bars([a.replace("all four - sum of each alone", "all 4 -\nsum").replace("all four", "all 4")
                     for a in observed.ablated], observed.delta, observed.ci_low, observed.ci_high, fig.add_subplot(grid[0]),
                    title="loss increase on the repeated half", ylabel="nats per token")
for i, head in enumerate(INDUCTION):
    report.plot_pattern(patterns[head.layer][head.head], head.label, ax=fig.add_subplot(grid[i + 1]))
fig.tight_layout()

# %% [markdown]
# ## The heads in the viewer
#
# `interp.show` draws the attention patterns inline and interactively: every head of the layer
# as a thumbnail (click one to open it) and the open head's grid, labelled with the tokens (hover a
# cell for its query, key and weight). It works offline, with no network.

# %% tags=["viewer"]
display(interp.show(model, test.tokens[:1], layer=1, head=None))

# %% [markdown]
# ## H1: backup heads?
#
# In this model nothing comes after layer 1 but the unembedding, so no head can *read* an
# induction head's absence. `redundancy.compensation` measures it anyway: a head's direct effect
# (only its path to the logits removed) against its total effect (removed everywhere);
# self-repair = direct - total would be positive if anything downstream made up for it.

# %% tags=["compensation"]
effects = redundancy.compensation(run, method="mean").effects
effects[["label", "direct_effect", "total_effect", "self_repair", "ci_low", "ci_high"]]


# %% [markdown]
# ## H2: a ceiling
#
# A model that knows nothing about the next token of a random sequence loses about
# ln(vocabulary) nats. The model's own loss on the *first* copy (tokens it cannot predict) is
# that ceiling, measured. If the sum of single-head costs would lift the loss above it, the
# costs cannot add up.

# %% tags=["ceiling"]
with torch.no_grad():
    ceiling, _ = copying.copy_losses(model(test.tokens), test)  # (prompt,) the first copy's loss: tokens no head can predict
print(f"ln(vocabulary) = ln({test.meta['d_vocab']}) = {math.log(test.meta['d_vocab']):.3f}; "
      f"measured ceiling (loss on the first copy) {ceiling.mean():.3f}")
print(f"clean {clean.mean():.3f} + all four {together.mean:.3f} = {clean.mean() + together.mean:.3f} nats; "
      f"clean + sum of each alone would be {clean.mean() + sum(e.mean for e in alone.values()):.3f}")

# %% [markdown]
# ## H3: the final LayerNorm
#
# The four heads write large vectors that partly cancel (each points away from the rest of the
# residual stream). Remove one, and the residual stream's norm grows; the final LayerNorm
# divides by it, shrinking what the remaining heads wrote. Two measurements: the final
# LayerNorm's scale under each ablation, and the same ablations with that scale frozen at its
# clean value (a hook on `ln_final.hook_scale`), on the loss and on the correct token's logit
# margin (its logit minus the mean logit). With the scale frozen, the margin is linear in the
# heads' writes, so it must add up exactly: a check of the set-up.

# %% tags=["geometry"]
names = ["ln_final.hook_scale", "blocks.1.attn.hook_result", "blocks.1.hook_resid_post"]
ablated = {"clean": [], **{head.label: [head] for head in INDUCTION}, "all four": INDUCTION}
caches = {}
for name, heads in ablated.items():
    with hooked(model, HeadAblation(heads, "mean").hooks(model, reference) if heads else []), torch.no_grad():
        caches[name] = model.run_with_cache(test.tokens, names_filter=names)[1]
scale = {name: c["ln_final.hook_scale"][:, first - 1 : -1, 0] for name, c in caches.items()}  # (prompt, pos), scored positions
writes = caches["clean"]["blocks.1.attn.hook_result"][:, first - 1 : -1]  # (prompt, pos, head, d_model)
resid = caches["clean"]["blocks.1.hook_resid_post"][:, first - 1 : -1]    # (prompt, pos, d_model)
geometry = pd.DataFrame([{
    "head": h.label,
    "write_norm": float(writes[:, :, h.head].norm(dim=-1).mean()),
    "cos_with_rest": float(F.cosine_similarity(writes[:, :, h.head], resid - writes[:, :, h.head], dim=-1).mean()),
    "ln_scale_ratio": float((scale[h.label] / scale["clean"]).mean()),
} for h in INDUCTION] + [{"head": "all four", "write_norm": float(writes.sum(2).norm(dim=-1).mean()), "cos_with_rest": float("nan"),
                          "ln_scale_ratio": float((scale["all four"] / scale["clean"]).mean())}])
print(f"residual stream norm {resid.norm(dim=-1).mean():.2f} at the scored positions")
geometry


# %% tags=["layernorm"]
margin = next_token_margin("repeats")  # minus the correct token's logit over the mean logit: linear in the logits
frozen_scale = caches["clean"]["ln_final.hook_scale"]
freeze = [("ln_final.hook_scale", lambda value, hook: frozen_scale)]
rows = []
for behaviour in (redundancy.induction_loss, margin):
    for state, frozen in (("live", []), ("frozen", freeze)):
        values = {}  # what was ablated -> the behaviour per prompt
        for name, heads in ablated.items():
            with hooked(model, frozen + (HeadAblation(heads, "mean").hooks(model, reference) if heads else [])), torch.no_grad():
                values[name] = behaviour(model(test.tokens), test).double()
        singles = sum(values[h.label] - values["clean"] for h in INDUCTION)
        both = values["all four"] - values["clean"]
        mean, low, high = (float(v) for v in bootstrap(both - singles, seed=0))
        rows.append({"metric": "loss" if behaviour is redundancy.induction_loss else "logit margin", "final_ln": state,
                     "sum_alone": float(singles.mean()), "together": float(both.mean()),
                     "interaction": mean, "ci_low": low, "ci_high": high})
layernorm = pd.DataFrame(rows)
layernorm

# %% tags=["figure-layernorm"]
fig, ax = plt.subplots(figsize=(7, 2.8))
report.plot_ci_bars([f"{m}\n{state} LN" for m, state in zip(layernorm.metric, layernorm.final_ln)], layernorm.interaction,
                    layernorm.ci_low, layernorm.ci_high, ax, threshold=0.0, title="interaction (together - sum alone), 95% CI",
                    ylabel="nats (loss) or logits (margin)")
fig.tight_layout()


# %% [markdown]
# ## Q2: the layer-0 heads, path by path
#
# Each layer-0 head can matter through three inputs of the layer-1 heads (their queries, keys
# and values) or directly through the logits. Path patching (`interp.paths.EdgePatch`, as notebook 06
# uses it): the layer-1 heads' *q* input (or *k*, or *v*; or the logits, *direct*) reads the layer-0
# head's write from another prompt of the set, and nothing else changes. Patching all of its edges at
# once resamples the head everywhere (*resampled*). Then pattern substitution: replace the head's
# pattern by an ideal one (`self`: attend to the current token; `previous_token`) and see how much of
# its mean ablation's cost (*total*) comes back.

# %% tags=["paths"]
layer1 = [Head(1, h) for h in range(4)]
edge_sets = {}  # (layer-0 head, path) -> the edges patched together
for head in LAYER0:
    for via in ("q", "k", "v"):
        edge_sets[head.label, via] = [f"{head.label} -> {receiver.label} via {via}" for receiver in layer1]
    edge_sets[head.label, "direct"] = [f"{head.label} -> logits"]
    edge_sets[head.label, "resampled"] = [edge for path in ("q", "k", "v", "direct") for edge in edge_sets[head.label, path]]
patched = dict(zip(edge_sets, run.effects([EdgePatch(edges) for edges in edge_sets.values()])))  # Effects, as above
rows = []
for head in LAYER0:
    total = run.effect(HeadAblation([head], "mean"))
    row = {"head": head.label, "total": total.mean, "total_ci_low": total.ci_low, "total_ci_high": total.ci_high,
           "resampled": patched[head.label, "resampled"].mean,
           **{f"via_{path}": patched[head.label, path].mean for path in ("q", "k", "v", "direct")}}
    for ideal in ("self", "previous_token"):
        with substitute_pattern(model, *head, ideal), torch.no_grad():
            row[f"{ideal}_pattern"] = float(redundancy.induction_loss(model(test.tokens), test).mean() - clean.mean())
    rows.append(row)
paths = pd.DataFrame(rows)
paths

# %%
import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
paths.set_index("head")[["via_q", "via_k", "via_v", "via_direct", "resampled"]].plot.bar(ax=axes[0], rot=0)
axes[0].set_ylabel("loss increase (nats)"); axes[0].set_title("layer-0 heads: which path carries the cost (resampled)")
paths.set_index("head")[["total", "self_pattern", "previous_token_pattern"]].plot.bar(ax=axes[1], rot=0)
axes[1].set_title("mean-ablated vs ideal pattern substituted"); axes[1].set_ylabel("loss increase (nats)")
fig.tight_layout()

# %% [markdown]
# The four layer-0 heads' mean patterns on the same prompts (the diagonal is the current token,
# the line just below it the previous one):

# %% tags=["figure-layer0"]
fig, axes = plt.subplots(1, 4, figsize=(13, 3))
for ax, head in zip(axes, LAYER0):
    report.plot_pattern(patterns[head.layer][head.head], head.label, ax=ax)
fig.tight_layout()

# %% [markdown]
# The same interpretations as claims, tested with the toolkit's full evidence (observational
# metric, shuffled-token and random-initialisation controls, necessity, sufficiency of the ideal
# pattern, faithfulness), with the previous-token claim about the same heads as the alternative:

# %% tags=["claims"]
claims = [self_token_head(*h) for h in LAYER0 if h != (0, 2)] + [previous_token_head(*h) for h in LAYER0 if h != (0, 2)]
verdicts = test_claims(model, claims, test, seed=0)
verdicts[["label", "claim", "verdict", "p_adjusted", "observational", "control_shuffled", "necessity", "sufficiency"]]

# %% tags=["results", "remove-output"] jupyter={"source_hidden": true, "outputs_hidden": true}
results = {
    "clean_loss": float(clean.mean()),
    "alone": {h.label: e.mean for h, e in alone.items()},
    "sum_alone": sum(e.mean for e in alone.values()),
    "together": together.mean,
    "interaction": observed.iloc[-1][["delta", "ci_low", "ci_high"]].astype(float).tolist(),
    "pair_interactions": {f"{r.label_a}+{r.label_b}": float(r.interaction) for r in pairs.itertuples()},
    "max_self_repair_layer1": float(effects.query("layer == 1").self_repair.abs().max()),
    "ceiling": float(ceiling.mean()),
    "ln_vocab": math.log(test.meta["d_vocab"]),
    "ln_scale_ratio": {r.head: r.ln_scale_ratio for r in geometry.itertuples()},
    "cos_with_rest": {r.head: r.cos_with_rest for r in geometry.itertuples() if r.head != "all four"},
    "layernorm": {f"{r.metric}, {r.final_ln}": {"sum_alone": r.sum_alone, "together": r.together, "interaction": r.interaction,
                                          "ci": [r.ci_low, r.ci_high]} for r in layernorm.itertuples()},
    "paths": {r.head: {"total": r.total, "resampled": r.resampled, "direct": r.via_direct, "q": r.via_q, "k": r.via_k,
                       "v": r.via_v, "self_pattern": r.self_pattern, "previous_token_pattern": r.previous_token_pattern}
              for r in paths.itertuples()},
    "verdicts": {f"{r.label} {r.claim}": r.verdict for r in verdicts.itertuples()},
}
import json
from IPython.display import display
display({"text/x-interp-results": json.dumps(results, sort_keys=True)}, raw=True)  # read by tests/notebooks/test_notebooks.py

# %% tags=["conclusion"]
from IPython.display import Markdown
r, ln, P = results, results["layernorm"], results["paths"]
self_heads = [h for h in ("L0H0", "L0H3") if P[h]["q"] + P[h]["v"] > P[h]["k"]]
Markdown(f"""
## Conclusion (generated from `results`)

**Sub-additivity.** Alone, the four induction heads cost {' + '.join(f'{v:.2f}' for v in r['alone'].values())}
= **{r['sum_alone']:.2f}** nats; together **{r['together']:.2f}** (interaction {r['interaction'][0]:+.2f},
95% CI [{r['interaction'][1]:+.2f}, {r['interaction'][2]:+.2f}]). Pair by pair it is not uniform: interactions range
from {min(r['pair_interactions'].values()):+.2f} ({min(r['pair_interactions'], key=r['pair_interactions'].get)}) to
{max(r['pair_interactions'].values()):+.2f} ({max(r['pair_interactions'], key=r['pair_interactions'].get)}).

- H1 (backup) is refuted: no induction head's loss is repaired downstream (largest |self-repair| in
  layer 1: {r['max_self_repair_layer1']:.1e} nats); nothing after layer 1 could read their absence.
- H2 (ceiling) holds but does not explain it alone: with all four gone the loss is
  {r['clean_loss'] + r['together']:.2f} nats, near the no-information loss {r['ceiling']:.2f}
  (ln vocabulary {r['ln_vocab']:.2f}); the sum of single costs would put it at {r['clean_loss'] + r['sum_alone']:.2f},
  above the ceiling.
- H3 (final LayerNorm) is supported: each head's write points away from the rest of the residual stream
  (cosine {', '.join(f'{k} {v:+.2f}' for k, v in r['cos_with_rest'].items())}); removing one multiplies the final
  LayerNorm's scale by {', '.join(f'{k} {v:.2f}' for k, v in r['ln_scale_ratio'].items() if k != 'all four')}, while removing
  all four changes it by {r['ln_scale_ratio']['all four']:.2f}. With the scale frozen, the logit margin adds up exactly
  (interaction {ln['logit margin, frozen']['interaction']:+.3f}), and the loss turns **super-additive**
  (sum alone {ln['loss, frozen']['sum_alone']:.2f} < together {ln['loss, frozen']['together']:.2f}: with the normalisation
  fixed, the remaining heads keep the correct token ahead, a redundancy the live LayerNorm hides); live, the margin's single costs sum to {ln['logit margin, live']['sum_alone']:.2f} against
  {ln['logit margin, live']['together']:.2f} together. The sub-additivity is the final LayerNorm's renormalisation,
  counted once per head in the sum, plus the ceiling; not backup.

**Layer-0 heads.** Path patching resamples one head's write into one input of the layer-1 heads at a time.
L0H2 works through the induction heads' keys (via k alone {P['L0H2']['k']:.2f} nats; all its edges resampled
{P['L0H2']['resampled']:.2f}): the previous-token head of K-composition.
{' and '.join(self_heads)} work through the queries and values instead
({'; '.join(f"{h}: q {P[h]['q']:.2f}, v {P[h]['v']:.2f}, k {P[h]['k']:.2f} of {P[h]['resampled']:.2f}" for h in self_heads)}):
they attend to the current token, and an ideal self-attention pattern restores most of their cost
({'; '.join(f"{h} {P[h]['self_pattern']:.2f} left of {P[h]['total']:.2f} mean-ablated" for h in self_heads)}), while a
previous-token pattern does not
({'; '.join(f"{h} {P[h]['previous_token_pattern']:.2f}" for h in self_heads)}). The path and substitution evidence
support H5 for them and refute H4; the toolkit's stricter claim tests (below) need not agree, e.g. when a head
costs less than half of its whole-head ablation when only its claimed attention is knocked out.
L0H1 matters least ({P['L0H1']['total']:.2f} nats mean-ablated, {P['L0H1']['resampled']:.2f} resampled, spread over
q {P['L0H1']['q']:.2f}, k {P['L0H1']['k']:.2f}, v {P['L0H1']['v']:.2f}); no ideal pattern describes it. No layer-0 head acts on the logits directly
(direct effects {', '.join(f"{h} {P[h]['direct']:+.3f}" for h in P)}): H6 refuted.
The claims table gives the toolkit's verdicts on the same interpretations:
{', '.join(f'{k}: {v}' for k, v in r['verdicts'].items())}.
""")
