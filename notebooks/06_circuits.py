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
# # 6. The induction circuit of `toy-induction`, found and tested
#
# Notebooks 02 and 05 name the heads of `toy-induction` one at a time: L0H2 is a previous-token
# head, the four layer-1 heads attend to the token after an earlier occurrence of the current one.
# A circuit is a claim about how they work *together*: which previous-token head feeds which
# induction head, through which input (query, key or value), and whether those paths alone carry
# the copying. Every statement below is tested, not read off a picture:
#
# | | hypothesis | refuted if |
# |---|---|---|
# | H1 | L0H2 feeds the layer-1 heads through their **keys** (K-composition) | path patching L0H2 -> L1Hx via k costs no more than the same path from the control head |
# | H2 | L0H2 does not feed their **queries** | path patching L0H2 -> L1Hx via q costs at least the practical minimum (0.01 nats) |
# | H3 (naive) | one induction head, L1H2, with L0H2 in its key, carries the copying | its faithfulness is far from 1 |
# | H4 | the circuit discovery finds (ACDC, on other prompts) carries it | its held-out faithfulness CI lies below 0.9 |
#
# Patching is causal-scrubbing style: what a hypothesis says does not matter is **resampled** from
# another prompt of the same set (`interp.paths.EdgePatch`), never zeroed. The behaviour is the
# model's own: the next-token loss on the repeated copies (nats). The conclusion cell is generated
# from the numbers.

# %% tags=["setup"]
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
torch.set_num_threads(1)
import pandas as pd
pd.set_option("display.width", 160, "display.max_columns", 20, "display.precision", 3)
# %matplotlib inline
import interp
from interp.specs import PromptSpec, build_prompts
from interp.analyses import circuits, report
from interp.analyses.claims import composition_claim
from interp.claims import test_claims

model = interp.load("toy-induction")
prompts = build_prompts(model, PromptSpec(kind="repeated", n=64, seed=0))
propose, test = prompts.split(0.5, seed=0)  # the halves notebook 02 uses: discovery proposes on one, tests on the other
run = interp.Run(model, test)                # held-out prompts, the model's own behaviour
print(run)
print(f"clean loss on the repeated copies {run.clean().mean():.3f} nats")

# %% [markdown]
# ## From the weights: composition scores
#
# How strongly each layer-1 head *can* read each layer-0 head's write, from the weights alone
# (Elhage et al. 2021), against the same score for random weights of the same shapes: a ratio of
# 1 is what chance gives (the random draws' 95th percentile is about 1.1x).

# %% tags=["composition"]
import matplotlib.pyplot as plt
import numpy as np

scores = circuits.composition_scores(model)
fig, axes = plt.subplots(1, 3, figsize=(11, 3))
for ax, via in zip(axes, ("q", "k", "v")):
    grid = scores.query("via == @via").pivot(index="sender", columns="receiver", values="ratio")
    image = ax.imshow(grid.values, cmap="viridis", vmin=0, vmax=max(2.5, float(scores.ratio.max())))
    ax.set_xticks(range(grid.shape[1]), grid.columns); ax.set_yticks(range(grid.shape[0]), grid.index)
    for (i, j), value in np.ndenumerate(grid.values):
        ax.text(j, i, f"{value:.1f}", ha="center", va="center", color="w" if value < 1.8 else "k", fontsize=8)
    ax.set_title(f"{via.upper()}-composition / random baseline", fontsize=10)
fig.colorbar(image, ax=axes, shrink=0.8)
top = scores.sort_values("ratio", ascending=False).head(6)
top[["sender", "receiver", "via", "score", "baseline", "baseline_p95", "ratio"]]

# %% [markdown]
# ## Path patching: which input carries it
#
# For every layer-0 head S and layer-1 head R, the loss increase when only R's query, key or value
# input reads S's write from another prompt (everything else as in the clean run), per prompt with
# a 95% CI. This is what the weights above can only suggest.

# %% tags=["path-patching"]
edges = [f"L0H{s} -> L1H{r} via {via}" for via in ("q", "k", "v") for s in range(4) for r in range(4)]
paths = circuits.path_patches(run, edges=edges)
fig, axes = plt.subplots(1, 3, figsize=(11, 3))
for ax, via in zip(axes, ("q", "k", "v")):
    grid = paths.query("via == @via").pivot(index="sender", columns="receiver", values="effect")
    image = ax.imshow(grid.values, cmap="magma", vmin=0, vmax=float(paths.effect.max()))
    ax.set_xticks(range(grid.shape[1]), grid.columns); ax.set_yticks(range(grid.shape[0]), grid.index)
    for (i, j), value in np.ndenumerate(grid.values):
        ax.text(j, i, f"{value:.2f}", ha="center", va="center", color="w" if value < 0.6 * paths.effect.max() else "k",
                fontsize=7)
    ax.set_title(f"patch S -> R via {via} (nats)", fontsize=10)
fig.colorbar(image, ax=axes, shrink=0.8)
paths.sort_values("effect", ascending=False).head(8)[["edge", "effect", "ci_low", "ci_high", "n_prompts"]]

# %% [markdown]
# ## H1 and H2 as claims
#
# A composition claim's evidence is the path patch along the edge, against the same path from a
# control head of the sender's layer (fixed rule: the one whose composition score into the receiver
# is smallest), paired per prompt, with the toolkit's practical minimum (0.01 nats); "does not compose"
# is an equivalence test (the CI within +-0.01 nats). All claims are corrected together
# (Benjamini-Hochberg). One false claim is included, "L0H2 feeds L1H2's query", beside its mirror.
# A "composes" claim through a query or key also carries `qk_attribution`, **supporting only** (never
# part of the verdict): the sender's exact terms in the receiver's score difference at the key it
# attends to (score units, over the repeated copies' queries; the next section explains them).

# %% tags=["claims"]
claims = [composition_claim(f"L0H2 -> L1H{r} via k") for r in range(4)]
claims += [composition_claim(f"L0H2 -> L1H{r} via q", composes=False) for r in range(4)]
claims.append(composition_claim("L0H2 -> L1H2 via q"))  # false
verdicts = test_claims(model, claims, test, evidence=["observational", "necessity", "qk_attribution"])
verdicts[["label", "verdict", "p_adjusted", "observational", "observational_ci_low", "observational_ci_high",
          "necessity", "qk_attribution", "qk_attribution_ci_low", "qk_attribution_ci_high"]]

# %% [markdown]
# ## Why an induction head attends here: the exact QK attribution
#
# Path patching says *that* L0H2's write reaches the layer-1 keys; the QK attribution says *how much of
# the head's preference* it carries, on these prompts. With ln1's scale frozen at its clean-run value a
# head's score is bilinear in the residual streams at the query and the key, so the score difference
# between the induction target k and the highest-scoring other key k' (which equals log p_k - log p_k')
# splits exactly into (query source x key source) terms (`interp.analyses.qk.attribute`). The query is
# the last token (in the second copy); the key, the token after its earlier occurrence. Sources are the
# writers of the residual stream (`embed`: toy-induction's positions are rotary, so there is no position
# source; each layer-0 head; `b_O0`, layer 0's output bias; `ln_bias`, the norm's bias; `b_Q` / `b_K`).

# %% tags=["qk"]
from interp.analyses import qk

query = test.n_pos - 1                           # the last token, in the second copy
target = query - test.repeats.period + 1         # the token after its earlier occurrence: the induction target
att = qk.attribute(run, "L1H2", query=query, key=target)
print(f"L1H2, query {query} -> key {target}: mean weight {att.pairs.weight.mean():.3f}, score difference "
      f"{att.pairs.difference.mean():.2f} against the next-best key ({att.n_prompts} held-out prompts)")
top_pairs = att.aggregate().sort_values("mean", key=lambda m: m.abs(), ascending=False).head(5)
top_pairs[["query_source", "key_source", "mean", "ci_low", "ci_high", "n_prompts"]]

# %% [markdown]
# Each source's total on the key side (its column of the matrix, summed over every query source), for
# all four layer-1 heads: what removing that source from only the head's key input would change, to
# first order (with the scale frozen: exactly).

# %% tags=["qk-heads"]
key_sides = {f"L1H{r}": qk.attribute(run, f"L1H{r}", query=query, key=target).by_source().query("side == 'key'")
             .set_index("source") for r in range(4)}
fig, axes = plt.subplots(1, 4, figsize=(12, 2.8), sharey=True)
for ax, (head, side) in zip(axes, key_sides.items()):
    report.plot_ci_bars(list(side.index), side["mean"], side.ci_low, side.ci_high, ax,
                        title=f"{head}: key-side sources", ylabel="score difference", highlight=["L0H2"])
    ax.tick_params(axis="x", labelrotation=90)
fig.tight_layout()
pd.DataFrame({head: side["mean"] for head, side in key_sides.items()})

# %% [markdown]
# The check: each of the top five pairs is removed from the head's input (its query source from the
# query side only, its key source from the key side only, through `interp.Run`) and the head's score
# difference read, once with ln1's scale pinned at its clean value (the prediction must hold to float
# rounding: a test of the arithmetic) and once live (the norm recomputes its scale, as the model would:
# the real check). The prediction is exact for the score, not for the loss downstream.

# %% tags=["qk-check"]
checked = att.check(run, n=5)
print(f"the top 5 pairs account for {checked.explained:.2f} of the score difference; largest frozen-scale error "
      f"{checked.frozen_error:.1e}")
checked.frame()[["query_source", "key_source", "predicted", "measured_frozen", "measured_live", "ci_low", "ci_high"]]


# %% [markdown]
# ## Direct logit attribution
#
# What each component writes straight into the right token's logit (the final LayerNorm's scale
# frozen from the clean run, so the rows add up to the logit): the layer-1 heads do the copying.

# %% tags=["dla"]
dla = circuits.direct_logit_attribution(run)
heads = dla.query("kind == 'head'")
fig, ax = plt.subplots(figsize=(7, 2.8))
report.plot_ci_bars(list(heads.component), heads["mean"], heads.ci_low, heads.ci_high, ax,
                    title="direct logit attribution (95% CI)", ylabel="logit")
fig.tight_layout()
dla[["component", "mean", "ci_low", "ci_high", "share", "n_prompts"]]

# %% [markdown]
# ## The heads in the viewer
#
# The receivers on a held-out prompt: each layer-1 head's stripe on the token after the earlier occurrence is what its key finds through L0H2's write. `interp.show` draws the attention patterns inline and interactively: every head of the layer
# as a thumbnail (click one to open it) and the open head's grid, labelled with the tokens (hover a
# cell for its query, key and weight). It works offline, with no network.

# %% tags=["viewer"]
display(interp.show(model, test.tokens[:1], layer=1, head=2))

# %% [markdown]
# ## Discovery: ACDC proposes a circuit on one half, the other half tests it
#
# `circuits.discover(..., method="acdc")` walks the receivers from the logits backwards and removes
# every edge whose patching moves the loss by less than 1% of the clean-vs-fully-patched gap (a
# fixed default, the same on every model). The circuit is then tested on the held-out half:
# **faithfulness** (the loss with everything outside the circuit resampled, as a fraction of the way
# from fully patched to clean), **completeness** (removing parts of the circuit hurts it as it hurts
# the full model: the largest gap over single nodes and random subsets) and **minimality** (the
# smallest cost of removing one kept edge, against the threshold).

# %% tags=["discover"]
found = circuits.discover(model, prompts, method="acdc")  # proposed on `propose`, tested on `test`
print(f"{len(found.edges)} of {len(found.scores)} edges kept; nodes: {', '.join(found.nodes)}")
found.test.frame()[["test", "value", "ci_low", "ci_high", "threshold", "n_edges", "n_prompts"]]

# %% tags=["figure-circuit"]
from interp.analyses.circuits.drawing import draw_circuit

kept = circuits.path_patches(run, edges=list(found.edges))
figure = draw_circuit(kept, title=f"toy-induction: the ACDC circuit, {len(found.edges)} edges, effects on held-out prompts", unit="nats")
display(figure)

# %% [markdown]
# ## Attribution patching against exact patching
#
# Edge attribution patching (EAP) estimates every edge's patching effect from one backward pass, a
# first-order Taylor expansion around the clean run. Resampling every token is a large step, so the
# estimate can be poor; `method="eap-ig"` integrates the gradient along the path (per sender: one
# backward per point and sender). Both against exact path patching of all 81 edges:

# %% tags=["attribution"]
from interp.paths import graph

exact = circuits.path_patches(run, edges=[edge.label for edge in graph(model)])
spearman = {}
fig, axes = plt.subplots(1, 2, figsize=(8, 3.3))
for ax, (name, options) in zip(axes, {"EAP": {}, "EAP-IG per node": {"method": "eap-ig", "per": "node"}}.items()):
    estimate = circuits.attribution_patching(run, **options).edges_frame()
    both = estimate[["edge", "score"]].merge(exact[["edge", "effect"]], on="edge")
    spearman[name] = float(both.score.rank().corr(both.effect.rank()))  # Spearman: the correlation of the ranks
    ax.scatter(both.effect, both.score, s=8)
    ax.set_xlabel("exact path patch (nats)"); ax.set_ylabel("estimate")
    ax.set_title(f"{name}: Spearman {spearman[name]:.2f}", fontsize=10)
fig.tight_layout()
spearman

# %% [markdown]
# ## Naive against refined hypotheses
#
# The naive hypothesis: one induction head (L1H2, the one notebook 02 names) with the previous-token
# head L0H2 in its key, and the embeddings its query and value read. The refined ones: all four
# layer-1 heads with L0H2 in their keys; and the circuit discovery found. Each is tested the same
# way on the held-out half; faithfulness 1 means the hypothesis explains all the loss the model
# gains from its parts, 0 none of it (causal scrubbing's question; Chan et al. 2022 report 35%
# for a naive and 89% for a refined induction hypothesis on their 2-layer model).

# %% tags=["hypotheses"]
naive = ["embed -> L0H2 via v", "L0H2 -> L1H2 via k", "embed -> L1H2 via q", "embed -> L1H2 via v", "L1H2 -> logits"]
all_four = ["embed -> L0H2 via v"] + [edge for r in range(4) for edge in (
    f"L0H2 -> L1H{r} via k", f"embed -> L1H{r} via q", f"embed -> L1H{r} via v", f"L1H{r} -> logits")]
hypotheses = {"naive: L1H2 alone": naive, "all four layer-1 heads": all_four, "ACDC circuit": list(found.edges)}
tests = {name: circuits.test_circuit(run, edges, threshold=found.threshold) for name, edges in hypotheses.items()}
compared = pd.DataFrame([{"hypothesis": name, "edges": len(hypotheses[name]), "faithfulness": t.faithfulness.mean,
                          "ci_low": t.faithfulness.ci_low, "ci_high": t.faithfulness.ci_high,
                          "completeness": t.completeness.mean} for name, t in tests.items()])
fig, ax = plt.subplots(figsize=(6, 2.8))
report.plot_ci_bars(list(compared.hypothesis), compared.faithfulness, compared.ci_low, compared.ci_high, ax, threshold=0.9,
                    title="faithfulness on held-out prompts (95% CI)", ylabel="fraction")
fig.tight_layout()
compared


# %% tags=["results", "remove-output"] jupyter={"source_hidden": true, "outputs_hidden": true}
by_edge = paths.set_index("edge")[["effect", "ci_low", "ci_high"]]  # each path patch's effect and CI
q_strongest = paths.query("via == 'q'").sort_values("effect").edge.iloc[-1]
results = {
    "clean_loss": float(run.clean().mean()),
    "k_paths": {f"L1H{r}": by_edge.loc[f"L0H2 -> L1H{r} via k"].astype(float).to_dict() for r in range(4)},
    "q_paths_l0h2_max": float(paths.query("via == 'q' and sender == 'L0H2'").effect.abs().max()),
    "q_path_strongest": by_edge.loc[q_strongest].astype(float).to_dict() | {"edge": q_strongest},
    "v_paths": {f"L1H{r}": by_edge.loc[f"L0H2 -> L1H{r} via v"].astype(float).to_dict() for r in range(4)},
    "top_composition": [top.iloc[0].sender, top.iloc[0].receiver, top.iloc[0].via, float(top.iloc[0].ratio)],
    "verdicts": {f"{row.label} {row.claim.replace('_', ' ')}": row.verdict for row in verdicts.itertuples()},
    "discovered": {"n_edges": len(found.edges), "n_tried": len(found.scores), "nodes": list(found.nodes),
                   **{k: [float(getattr(found.test, k).mean), float(getattr(found.test, k).ci_low),
                          float(getattr(found.test, k).ci_high)] for k in ("faithfulness", "completeness", "minimality")},
                   "threshold": float(found.test.threshold)},
    "hypotheses": {r.hypothesis: [float(r.faithfulness), float(r.ci_low), float(r.ci_high)] for r in compared.itertuples()},
    "spearman": spearman,
    "dla_layer1": {r.component: float(r.mean) for r in heads.query("layer == 1").itertuples()},
    "qk": {"head": "L1H2", "query": query, "key": target, "weight": float(att.pairs.weight.mean()),
           "difference": float(att.pairs.difference.mean()),
           "top_pairs": [[p.query_source, p.key_source, float(p.mean), float(p.ci_low), float(p.ci_high)]
                         for p in top_pairs.itertuples()],
           "key_side_top": {head: side["mean"].abs().idxmax() for head, side in key_sides.items()},
           "key_side_l0h2": {head: side.loc["L0H2", ["mean", "ci_low", "ci_high"]].astype(float).tolist()
                             for head, side in key_sides.items()},
           "check": {"predicted": checked.predicted, "measured_frozen": checked.measured_frozen,
                     "measured_live": checked.measured_live, "explained": checked.explained,
                     "live_ci": checked.frame().iloc[-1][["ci_low", "ci_high"]].astype(float).tolist(),
                     "frozen_error_below_1e-4": checked.frozen_error < 1e-4},
           "evidence": {row.label: [float(row.qk_attribution), float(row.qk_attribution_ci_low),
                                    float(row.qk_attribution_ci_high)]
                        for row in verdicts.itertuples() if row.claim == "composes" and row.label.endswith("via k")}},
}
import json
from IPython.display import display
display({"text/x-interp-results": json.dumps(results, sort_keys=True)}, raw=True)  # read by tests/notebooks/test_notebooks.py

# %% tags=["conclusion"]
from IPython.display import Markdown

r = results
k = r["k_paths"]
d = r["discovered"]
h = r["hypotheses"]
q, c = r["qk"], r["qk"]["check"]
pair = q["top_pairs"][0]
supported = [c for c, v in r["verdicts"].items() if v == "supported"]
refuted = [c for c, v in r["verdicts"].items() if v == "refuted"]
undecided = [c for c, v in r["verdicts"].items() if v == "inconclusive"]
Markdown("\n".join([
    "## What holds (generated from `results`)", "",
    "- **H1.** Patching L0H2's write into a layer-1 head's key alone raises the loss by "
    + ", ".join(f"{head} {v['effect']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}]" for head, v in k.items())
    + f" nats (clean {r['clean_loss']:.3f}): H1 holds"
    + (" for every layer-1 head" if min(v["ci_low"] for v in k.values()) > 0.01 else " only in part")
    + f". Its write reaches their values too (up to {max(v['effect'] for v in r['v_paths'].values()):.2f} nats). "
    f"The strongest composition score is {r['top_composition'][0]} -> {r['top_composition'][1]} via "
    f"{r['top_composition'][2]}, {r['top_composition'][3]:.1f}x its random baseline.",
    f"- **H2.** L0H2's write into a layer-1 query moves the loss by at most {r['q_paths_l0h2_max']:.3f} nats: "
    + ("H2 holds." if r["q_paths_l0h2_max"] < 0.05 else "H2 is refuted.")
    + f" Other layer-0 heads do feed the queries: {r['q_path_strongest']['edge']} costs "
    f"{r['q_path_strongest']['effect']:.2f} [{r['q_path_strongest']['ci_low']:.2f}, {r['q_path_strongest']['ci_high']:.2f}] "
    "nats (the current-token information notebook 05 finds in them).",
    f"- **Claims** ({len(r['verdicts'])}, Benjamini-Hochberg): supported: {', '.join(supported) or 'none'}; "
    f"refuted: {', '.join(refuted) or 'none'}; inconclusive: {', '.join(undecided) or 'none'}.",
    f"- **Why L1H2 attends to the induction target** (query {q['query']}, key {q['key']}, weight {q['weight']:.2f}): its "
    f"score there beats the next-best key's by {q['difference']:.2f}; the largest pair is {pair[0]} (query) x {pair[1]} "
    f"(key), {pair[2]:.2f} [{pair[3]:.2f}, {pair[4]:.2f}]. On the key side the strongest source is "
    + ("L0H2 for every layer-1 head" if set(q["key_side_top"].values()) == {"L0H2"} else
       ", ".join(f"{h}: {s}" for h, s in q["key_side_top"].items()))
    + " (" + ", ".join(f"{h} {v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]" for h, v in q["key_side_l0h2"].items())
    + "): the path patching's previous-token head, read directly. The top 5 pairs sum to "
    f"{c['explained']:.2f}x the difference (smaller pairs pull the other way); patched out with ln1's scale frozen they measure {c['measured_frozen']:.3f} "
    f"(predicted {c['predicted']:.3f}" + (", equal to float rounding" if c["frozen_error_below_1e-4"] else "")
    + f"), live {c['measured_live']:.3f} [{c['live_ci'][0]:.3f}, {c['live_ci'][1]:.3f}]: the frozen-scale reading "
    + ("holds within its CI once the norm reacts." if c["live_ci"][0] <= c["predicted"] <= c["live_ci"][1] else
       "moves once the norm reacts, so read the terms as exact for the frozen scale only.")
    + " As the claims' supporting evidence (qk_attribution, over every repeated query) L0H2's key-side terms are "
    + ", ".join(f"{label.split(' -> ')[1].split()[0]} {v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"
                for label, v in q["evidence"].items()) + " score units.",
    f"- **H3 (naive).** L1H2 alone with L0H2 in its key has faithfulness {h['naive: L1H2 alone'][0]:.2f} "
    f"[{h['naive: L1H2 alone'][1]:.2f}, {h['naive: L1H2 alone'][2]:.2f}]: "
    + ("refuted, it explains a minority of the loss; " if h["naive: L1H2 alone"][2] < 0.5 else "")
    + f"all four layer-1 heads fed by L0H2 through their keys reach {h['all four layer-1 heads'][0]:.2f} "
    f"[{h['all four layer-1 heads'][1]:.2f}, {h['all four layer-1 heads'][2]:.2f}]: the rest goes through the other "
    "layer-0 heads' writes into the queries and values.",
    f"- **H4.** ACDC kept {d['n_edges']} of {d['n_tried']} edges (nodes {', '.join(d['nodes'])}); on the held-out half "
    f"its faithfulness is {d['faithfulness'][0]:.3f} [{d['faithfulness'][1]:.3f}, {d['faithfulness'][2]:.3f}], "
    f"completeness (largest gap) {d['completeness'][0]:.3f} [{d['completeness'][1]:.3f}, {d['completeness'][2]:.3f}], "
    f"minimality (cheapest kept edge) {d['minimality'][0]:.3f} nats against a threshold of {d['threshold']:.3f}"
    + (" (some kept edges cost less than the threshold once the rest is pruned: not minimal)"
       if d["minimality"][0] < d["threshold"] else "") + ". "
    + ("H4 holds: its faithfulness CI lies above 0.9." if d["faithfulness"][1] > 0.9 else
       "H4 is not supported: its faithfulness CI reaches below 0.9."),
    "- Attribution patching against exact patching over all edges: "
    + ", ".join(f"{name} Spearman {rho:.2f}" for name, rho in r["spearman"].items())
    + "; " + ("each ranks the edges as exact patching does." if min(r["spearman"].values()) >= 0.9 else
              "below 0.9, the gradient estimate is a screen here, not a measurement; exact patching decides."),
]))
