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
# # 4. Induction heads forming on real text: `stdlib-bpe`
#
# `stdlib-bpe` is a 3-layer attention-only model (4 heads per layer, d_model 128, context 256
# tokens) that the project trains on the Python standard library's own source, its tests included,
# over a byte-level BPE of 2,048 pieces trained on the same files (`interp train stdlib-bpe train`; its
# card, `models/checkpoints/stdlib-bpe.md`, says how, with the pilots that led to the recipe). Olsson
# et al. (2022) found that induction heads form in such models during a short phase of training and
# carry most in-context copying. Here we look for that on held-out text, and treat every reading of a
# head as a claim to test:
#
# 1. the loss curve and the induction score over training (recorded at every snapshot);
# 2. in-context copying: a held-out span costs less the second time;
# 3. the heads' scores, and `claims.scan` proposing and testing a role for every head;
# 4. how much of the copying the induction heads carry (ablation against every other set of heads);
# 5. the previous-token -> induction circuit: composition claims and the circuit's faithfulness.

# %% tags=["load"]
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
torch.set_num_threads(1)
import pandas as pd
pd.set_option("display.width", 160, "display.max_columns", 20, "display.precision", 3)
# %matplotlib inline
import numpy as np
import matplotlib.pyplot as plt
import interp
from interp.analyses import circuits, copying, induction, positional, report
from interp.analyses.claims import composition_claim, induction_head, previous_token_head, scan
from interp.analyses.text_heads import HeldOutPrompts
from interp.claims import min_effect, test_claims
from interp.heads import Head, head_label, parse_head
from interp.models.textcorpus import compare_corpus, named_corpus

model = interp.load("stdlib-bpe")
card = model.metadata
held = card["held_out"]
print(model.cfg)
print(f"card: held-out {held['bits_per_byte']:.3f} bits/byte ({held['bits_per_token']:.3f} bits/token) vs bigram "
      f"{held['bigram_bits_per_byte']:.3f}, unigram {held['unigram_bits_per_byte']:.3f}; trained "
      f"{card['training']['steps']} steps ({card['training']['tokens']:.3g} tokens, "
      f"{card['training']['train_seconds'] / 60:.0f} min on one CPU thread)")

# %% [markdown]
# ## The corpus on this machine, and two kinds of held-out prompts
#
# The corpus is read from the installed interpreter, not shipped; if this Python's standard library
# is not the one the card recorded, the checksum says so and every figure below is of the corpus
# found. Two prompt sets come from the held-out files (never trained on):
#
# - **natural**: windows of 256 tokens; a *repeat* is wherever a token occurred earlier in the
#   window (`Repeats(match_len=1)`), as it happens in code: names, keywords, punctuation;
# - **repeated span**: 128 tokens of text, a 64-token span from elsewhere, then the same span again
#   (`Repeats(period=64, offset=128, n_repeats=2)`): the second copy is predictable only by looking back.
#   The copy is made here, at measurement time; the model never saw a planted repeat in training.

# %% tags=["corpus"]
differs = compare_corpus(card["corpus"], named_corpus(card["recipe"].get("corpus", "stdlib")))
print(differs or f"corpus matches the card: {card['corpus']['n_files']} files, checksum {card['corpus']['checksum'][:16]}...")
prompts = HeldOutPrompts.build(model, n=64)
natural, repeated = prompts.natural, prompts.repeated
natural_propose, natural_test = natural.split(0.5, seed=0)
repeated_propose, repeated_test = repeated.split(0.5, seed=0)
repeat_rate = float(induction.repeat_queries(natural).float().mean())
print(f"natural: {len(natural)} windows x {natural.n_pos} tokens; {repeat_rate:.0%} of positions repeat an earlier token")
print("a natural window begins:", repr(model.tokenizer.decode(natural.tokens[0][:48].tolist())))

# %% [markdown]
# ## When the induction heads formed
#
# Every 500 training steps the run measured the model on 64 held-out windows and 64 repeated spans
# (`interp.experiments.stdlib_bpe.track`, recorded in the card): the held-out loss, the in-context
# learning score (loss late in the window minus early: more negative = more use of context), the best
# head's induction score on natural repeats, the best previous-token score, and the copy ratio
# (second-copy over first-copy loss). Olsson et al.'s signature is a phase change: the induction
# score, the copy ratio and the ICL score move together, while the loss curve shows a bump.

# %% tags=["curve"]
curve = pd.DataFrame(card["curve"])
formed = card["formed_at"]
fig, axes = plt.subplots(1, 4, figsize=(15, 3.2))
panels = (("held_out_nats", "held-out loss (nats/token)"), ("icl_score", "ICL score (nats)"),
          ("induction", "best induction score"), ("copy_ratio", "copy ratio, 2nd/1st"))
for ax, (column, title) in zip(axes, panels):
    ax.plot(curve.tokens[1:], curve[column][1:], lw=1.2, label="best induction" if column == "induction" else None)
    if column == "induction":
        ax.plot(curve.tokens[1:], curve.previous_token[1:], lw=1.2, label="best previous-token")
        ax.axhline(0.5, color="k", ls="--", lw=0.8); ax.legend(fontsize=8)
    if formed:
        ax.axvline(formed["tokens"], color="#c44e52", lw=0.8, ls=":")
    ax.set_xscale("log"); ax.set_xlabel("training tokens"); ax.set_title(title, fontsize=10)
fig.tight_layout()
print(f"the best induction score first passed 0.5 at step {formed['step']} ({formed['tokens']:.3g} tokens)" if formed
      else "no snapshot's best induction score passed 0.5")

# %% [markdown]
# ## Copying in context: the loss on each copy of a repeated span
#
# The same 63 predictions inside each copy of the span, in nats per token, with a 95% CI over prompts.

# %% tags=["repeat-benefit"]
from interp.stats import bootstrap

OFFSET, SPAN = repeated.repeats.offset, repeated.repeats.period
with torch.no_grad():
    per = torch.cat([model(b.tokens, return_type="loss", loss_per_token=True) for b in repeated.batches(16)])  # (prompt, pos - 1)
first_copy = per[:, OFFSET : OFFSET + SPAN - 1].mean().item()
second_copy = per[:, OFFSET + SPAN : OFFSET + 2 * SPAN - 1].mean().item()
print(f"loss on the first copy {first_copy:.3f}, on the second copy {second_copy:.3f} nats/token "
      f"({second_copy / first_copy:.0%} of the first)")
stats = [bootstrap(per[:, i].double(), seed=0) for i in range(per.shape[1])]
mean, low, high = (np.array([float(s[j]) for s in stats]) for j in range(3))
x = np.arange(1, per.shape[1] + 1)
fig, ax = plt.subplots(figsize=(11, 3))
ax.fill_between(x, low, high, color="#4c72b0", alpha=0.3, lw=0, label="95% CI over prompts")
ax.plot(x, mean, color="#4c72b0", lw=1)
for start, name in ((OFFSET, "first copy"), (OFFSET + SPAN, "second copy")):
    ax.axvspan(start + 1, start + SPAN - 1, color="#dd8452" if name == "second copy" else "#bbbbbb", alpha=0.2, label=name)
ax.set_xlabel("position predicted (token)"); ax.set_ylabel("loss (nats)"); ax.legend(fontsize=8, ncol=3)
fig.tight_layout()


# %% [markdown]
# ## Every head's scores
#
# Induction and duplicate-token scores on natural repeats and on repeated spans
# (`interp.analyses.induction`), previous-token scores on natural windows (`interp.analyses.positional`),
# each with a 95% CI over the proposing half of the prompts. The candidates: the head with the highest
# induction score on natural text (outside layer 0, which has no earlier layer to compose with), and the
# head of an earlier layer with the highest previous-token score.

# %% tags=["scores"]
natural_scores = induction.scores(model, natural_propose)
span_scores = induction.scores(model, repeated_propose, copying=False)
focus = positional.focus(model, natural_propose)
scores = (natural_scores[["layer", "head", "induction", "induction_ci_low", "induction_ci_high", "duplicate_token", "copying"]]
          .merge(span_scores[["layer", "head", "induction"]].rename(columns={"induction": "induction_span"}), on=["layer", "head"])
          .merge(focus[["layer", "head", "prev_token", "prev_token_ci_low", "prev_token_ci_high"]], on=["layer", "head"]))
scores.insert(0, "label", [head_label(head) for head in zip(scores["layer"], scores["head"])])
later = scores[scores.layer > 0]  # an induction head needs an earlier layer to read the previous token from
ind = Head(*map(int, later.loc[later.induction.idxmax(), ["layer", "head"]]))
earlier = scores[scores.layer < ind.layer]
prev = Head(*map(int, earlier.loc[earlier.prev_token.idxmax(), ["layer", "head"]]))
fig, axes = plt.subplots(1, 2, figsize=(11, 3))
report.plot_ci_bars(list(scores.label), scores.induction, scores.induction_ci_low, scores.induction_ci_high, axes[0],
                    threshold=0.5, title="induction, natural repeats", ylabel="mean weight", highlight={ind.label})
report.plot_ci_bars(list(scores.label), scores.prev_token, scores.prev_token_ci_low, scores.prev_token_ci_high, axes[1],
                    threshold=0.5, title="previous-token, natural windows", ylabel="mean weight", highlight={prev.label})
fig.tight_layout()
print(f"candidate induction head {ind.label}, candidate previous-token head {prev.label}")
scores

# %% [markdown]
# ## The heads in the viewer
#
# A held-out window, with its natural repeats: open the induction head and hover a repeated name to see it attend to the token that followed the name's earlier occurrence. `interp.show` draws the attention patterns inline and interactively: every head of the layer
# as a thumbnail (click one to open it) and the open head's grid, labelled with the tokens (hover a
# cell for its query, key and weight). It works offline, with no network.

# %% tags=["viewer"]
display(interp.show(model, natural.tokens[:1, :96], layer=ind[0], head=ind[1]))

# %% [markdown]
# ## Claims: `scan` proposes a role for every head and tests it on the other half
#
# `claims.scan` proposes, on one half of the natural windows, each head's role from its metrics, and
# tests it on the other half with the role's own evidence: the metric's CI against its threshold,
# the shuffled-token and random-init controls, necessity (knocking out the attention the role
# predicts hurts the next-token loss more than knocking out as much other attention), sufficiency
# (the role's ideal pattern recovers the loss) and faithfulness. On the natural windows that loss is
# scored right after a repeated token (`Repeats(match_len=1).query_mask`: the predictions an earlier
# occurrence makes possible), not at every position. Then two false claims about the
# same heads (induction for the previous-token head, previous-token for the induction head) must
# not pass.

# %% tags=["scan"]
verdicts = scan(model, natural, seed=0)
columns = ["label", "claim", "verdict", "observational", "observational_ci_low", "necessity", "necessity_ci_low",
           "sufficiency", "reasons"]
verdicts[columns]

# %% tags=["false-claims"]
false_claims = test_claims(model, [induction_head(*prev), previous_token_head(*ind)], natural_test, seed=0)
false_claims[columns]

# %% [markdown]
# Induction is defined on a repeated sequence (Olsson et al. 2022). On natural windows a "repeat" is any
# earlier occurrence of the query's token, often not followed by the same next token, so the idealised
# pattern that sufficiency and faithfulness substitute may describe the head less well there. The same
# two claims, tested on the held-out half of the repeated spans:

# %% tags=["span-claims"]
span_claims = test_claims(model, [induction_head(*ind), previous_token_head(*prev)], repeated_test, seed=0)
span_claims[columns]

# %% [markdown]
# ## How much of the copying do the induction heads carry?
#
# Mean-ablate the heads `scan` proposed as induction heads and did not refute, together (the
# best candidate if there is none), and measure the fraction of
# the copy gap (first-copy minus second-copy loss) on the repeated spans that disappears, with a
# BCa bootstrap CI; then the same for every set of as many other heads. The control is a random set of
# as many other heads (the mean over those sets): the claimed heads must beat it, not just zero. The
# largest single control is shown too; it is expected to be the previous-token head the induction head
# reads, which is part of the same circuit.

# %% tags=["ablation"]
proposed = verdicts[(verdicts.claim == "induction") & (verdicts.verdict != "refuted")]  # supported or undecided
induction_heads = list(proposed.label) or [ind.label]
ablation = copying.copy_gap_ablation(model, repeated, induction_heads)
claimed = ablation[~ablation.control].iloc[0]
random_set = copying.random_set_effect(ablation)
strongest_control = ablation[ablation.control].sort_values("removed").iloc[-1]
shown = ablation.sort_values("removed", ascending=False)
fig, ax = plt.subplots(figsize=(9, 3))
report.plot_ci_bars(list(shown.heads), shown.removed, shown.ci_low, shown.ci_high, ax, threshold=0.5,
                    title="fraction of the copy gap removed (95% CI); red: the induction heads", ylabel="fraction",
                    highlight={claimed.heads})
ax.tick_params(axis="x", labelsize=7, rotation=90)
fig.tight_layout()
print(f"ablating {claimed.heads}: {claimed.removed:.3f} [{claimed.ci_low:.3f}, {claimed.ci_high:.3f}] of the gap removed; "
      f"a random set of as many other heads removes {random_set:.3f} on average over {int(ablation.control.sum())} sets; "
      f"the largest control, {strongest_control.heads}, removes {strongest_control.removed:.3f}")

# %% [markdown]
# A weaker induction head can back up a stronger one: removed alone, the stronger head's work is
# partly done by the other. So when `scan` proposed more induction heads than it kept (a proposal
# refuted at the 0.5 threshold of its claim), ablate all it proposed, against random sets of as many
# heads, and compare with the sum of each head alone.

# %% tags=["backup"]
every_proposed = list(verdicts[verdicts.claim == "induction"].label)
backup = None
if len(every_proposed) > len(induction_heads):
    together = copying.copy_gap_ablation(model, repeated, every_proposed)
    row = together[~together.control].iloc[0]
    alone = {h: float(ablation.set_index("heads").removed[h]) for h in every_proposed if h in set(ablation.heads)}
    backup = {"heads": row.heads, "removed": [float(row.removed), float(row.ci_low), float(row.ci_high)],
              "random_set": copying.random_set_effect(together), "alone": alone}
    print(f"ablating every proposed induction head, {row.heads}: {row.removed:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}] "
          f"of the gap removed; a random set of as many other heads removes {backup['random_set']:.3f}; "
          "each alone: " + ", ".join(f"{h} {v:.3f}" for h, v in alone.items()))
else:
    print("scan refuted none of its induction proposals: the ablation above is of all of them")

# %% [markdown]
# ## The circuit: previous-token head -> induction heads
#
# An induction head finds the token after an earlier occurrence of the current token by reading, in
# its **keys**, what a previous-token head wrote there (K-composition, Elhage et al. 2021). As claims:
# "the previous-token head feeds each induction head's key" (evidence: the path patch along that
# edge, from another prompt, against the same path from a control head of the sender's layer), and "it does not
# feed its query" (an equivalence test within +-0.01 nats). Then the circuit as a whole, tested on
# the held-out half of the repeated spans: its **faithfulness** is the fraction of the copy gap (the
# behaviour `copying.COPY_GAP`: second-copy minus first-copy loss) that the circuit alone reproduces,
# with every edge outside it patched from other prompts. The hypothesis: the previous-token head reads
# the tokens (the embeddings and the layer-0 heads, which pass the current token on) through its value;
# the induction heads read it through their keys, the tokens through their queries and values, and write
# to the logits.
#
# A circuit names edges, and a kept edge carries what its sender computed *in the patched run*: a
# layer-0 head named as a carrier of the current token carries the other prompt's token unless its own
# inputs (`embed -> L0Hx via q, k, v`) are in the circuit too. Both versions are tested: the hypothesis
# as first written, without those inputs, and with them.

# %% tags=["composition"]
receivers = [h for h in induction_heads if parse_head(h).layer > prev.layer]
sender = prev.label
edge_claims = [composition_claim(f"{sender} -> {r} via k") for r in receivers]
edge_claims += [composition_claim(f"{sender} -> {r} via q", composes=False) for r in receivers]
composition = test_claims(model, edge_claims, repeated_test, evidence=["observational", "necessity"])
composition[["statement", "verdict", "p_adjusted", "observational", "observational_ci_low", "observational_ci_high"]]

# %% tags=["circuit"]
run = interp.Run(model, repeated_test, behaviour=copying.COPY_GAP)
carriers = [head_label((0, h)) for h in range(model.cfg.n_heads)]  # layer 0's heads pass the current token on
tokens_in = {layer: ["embed"] + (carriers if layer > 0 else []) for layer in range(model.cfg.n_layers)}  # into a head of each layer
edges = [f"{t} -> {sender} via v" for t in tokens_in[prev.layer]]
for r in receivers:
    edges += [f"{sender} -> {r} via k", f"{r} -> logits"]
    edges += [f"{t} -> {r} via {via}" for t in tokens_in[parse_head(r).layer] for via in ("q", "v")]
carrier_inputs = [f"embed -> {c} via {via}" for c in carriers for via in ("q", "k", "v")]
from interp.analyses.circuits.discovery import ACDC_THRESHOLD
hypotheses = {"as first written": edges, "with the layer-0 carriers' inputs": edges + carrier_inputs}
tested = {name: circuits.test_circuit(run, kept, threshold=ACDC_THRESHOLD)  # minimality's threshold: ACDC's default
          for name, kept in hypotheses.items()}
for name, circuit in tested.items():
    f = circuit.faithfulness
    print(f"{name}: {circuit.n_edges} edges; faithfulness {f.mean:.3f} [{f.ci_low:.3f}, {f.ci_high:.3f}] of the copy gap on "
          f"{len(repeated_test)} held-out repeated spans (clean {circuit.clean:.3f}, circuit alone {circuit.circuit_only:.3f}, "
          f"all patched {circuit.all_patched:.3f} nats)")
faithfulness = tested["with the layer-0 carriers' inputs"].faithfulness
naive_faithfulness = tested["as first written"].faithfulness

# %% tags=["results", "remove-output"] jupyter={"source_hidden": true, "outputs_hidden": true}
KINDS = ("observational", "control_shuffled", "control_random_init", "necessity", "sufficiency", "faithfulness")
outcomes = {}  # each claim's verdict, observational metric, and the evidence that failed or stayed undecided
for key, table in (("scan", verdicts), ("false_claims", false_claims), ("span_claims", span_claims)):
    outcomes[key] = {f"{row.label} {row.claim}": {
        "verdict": row.verdict, "observational": float(row.observational),
        "failed": [k for k in KINDS if getattr(row, f"{k}_passed") is False],
        "undecided": [k for k in KINDS if getattr(row, f"{k}_passed") is None and not pd.isna(getattr(row, k))],
    } for row in table.itertuples()}
results = {
    "held_out": {key: float(held[key]) for key in ("bits_per_byte", "bigram_bits_per_byte", "unigram_bits_per_byte")},
    "formed_at": None if formed is None else [int(formed["step"]), float(formed["tokens"])],
    "repeat_rate": repeat_rate, "first_copy": first_copy, "second_copy": second_copy,
    "candidates": {"induction": ind.label, "previous_token": sender},
    "best_induction_natural": float(later.induction.max()),
    **outcomes,
    "induction_heads": induction_heads,
    "ablation": {"removed": [float(claimed.removed), float(claimed.ci_low), float(claimed.ci_high)], "random_set": random_set,
                 "strongest_control": [strongest_control.heads, float(strongest_control.removed)]},
    "backup": backup,
    "composition": {row.statement: row.verdict for row in composition.itertuples()},
    "composition_paths": {row.label: {"composes": row.claim == "composes", "verdict": row.verdict,
                                      "effect": [float(row.observational), float(row.observational_ci_low),
                                                 float(row.observational_ci_high)]}
                          for row in composition.itertuples()},
    "composition_band": min_effect("nats"),  # the equivalence band of "does not compose"
    "faithfulness": [float(faithfulness.mean), float(faithfulness.ci_low), float(faithfulness.ci_high)],
    "naive_faithfulness": [float(naive_faithfulness.mean), float(naive_faithfulness.ci_low), float(naive_faithfulness.ci_high)],
}
import json
from IPython.display import display
display({"text/x-interp-results": json.dumps(results, sort_keys=True)}, raw=True)  # read by tests/notebooks/test_notebooks.py

# %% tags=["conclusion"]
from IPython.display import Markdown
from interp.paths import parse_edge
r = results
removed, low, high = r["ablation"]["removed"]
f, f_low, f_high = r["faithfulness"]
n, n_low, n_high = r["naive_faithfulness"]
supported = [name for name, c in r["scan"].items() if c["verdict"] == "supported"]
induction_claims = "; ".join(
    f"{name}: {c['verdict']} (observational {c['observational']:.3f}"
    + (f"; failed: {', '.join(c['failed'])}" if c["failed"] else "")
    + (f"; undecided: {', '.join(c['undecided'])}" if c["undecided"] else "") + ")"
    for name, c in r["scan"].items() if name.endswith(" induction")) or "none proposed"
refuted_false = [name for name, c in r["false_claims"].items() if c["verdict"] != "supported"]
false_text = ", ".join(f"{name}: {c['verdict']}" for name, c in r["false_claims"].items())
uses = {("supported", True): "uses", ("refuted", False): "uses", ("refuted", True): "does not use",
        ("supported", False): "does not use"}  # (verdict, claimed to compose) -> what the receiver's input does
paths = []  # each composition edge: what patching it measured, and what that says its receiver reads
for edge, c in r["composition_paths"].items():
    parsed = parse_edge(edge)
    effect, e_low, e_high = c["effect"]
    test = "path patch against its control path" if c["composes"] else f"equivalence within +-{r['composition_band']:g} nats"
    outcome = {"supported": "passed", "refuted": "failed"}.get(c["verdict"], "undecided")
    paths.append(f"Patching {edge} moves the loss on the repeated copies by {effect:.3f} [{e_low:.3f}, {e_high:.3f}] nats, "
                 f"so {parsed.receiver}'s {parsed.via} input {uses.get((c['verdict'], c['composes']), 'may or may not use')} "
                 f"{parsed.sender}'s write ({test}: {outcome})")
Markdown("\n".join([
    "## What holds (generated from `results`)", "",
    f"- **The model.** Held-out {r['held_out']['bits_per_byte']:.3f} bits/byte against {r['held_out']['bigram_bits_per_byte']:.3f} "
    f"for the bigram baseline. " + (f"Its best induction score passed 0.5 at step {r['formed_at'][0]} "
    f"({r['formed_at'][1]:.3g} tokens)." if r["formed_at"] else "No snapshot's induction score passed 0.5."),
    f"- **Copying.** A held-out span costs {r['first_copy']:.3f} nats/token the first time and {r['second_copy']:.3f} "
    f"the second ({r['second_copy'] / r['first_copy']:.0%}).",
    f"- **Heads.** The strongest induction score on natural repeats is {r['best_induction_natural']:.3f} "
    f"({r['candidates']['induction']}); `scan` supports {len(supported)} claims: {', '.join(supported) or 'none'}. "
    f"Its induction claims: {induction_claims}.",
    "- **On the repeated spans**: " + "; ".join(
        f"{name}: {c['verdict']}" + (f" (failed: {', '.join(c['failed'])})" if c["failed"] else "")
        for name, c in r["span_claims"].items()) + ".",
    f"- **False claims** about the same heads: {len(refuted_false)} of {len(r['false_claims'])} not supported "
    f"({false_text}).",
    f"- **Ablation.** Removing the induction heads {', '.join(r['induction_heads'])} removes {removed:.2f} [{low:.2f}, {high:.2f}] "
    f"of the copy gap; a random set of as many other heads removes {r['ablation']['random_set']:.2f} on average. "
    + ("The claim holds: the CI's lower bound clears the random-set control." if low > r["ablation"]["random_set"] else
       "The claim is not established: the CI's lower bound does not clear the random-set control.")
    + f" The largest single control is {r['ablation']['strongest_control'][0]} "
    f"({r['ablation']['strongest_control'][1]:.2f})."
    + ("" if r["backup"] is None else
       f" All the proposed induction heads together ({r['backup']['heads']}) remove {r['backup']['removed'][0]:.2f} "
       f"[{r['backup']['removed'][1]:.2f}, {r['backup']['removed'][2]:.2f}] against {r['backup']['random_set']:.2f} for a "
       f"random set of as many"
       + ("." if len(r["backup"]["alone"]) < len(r["backup"]["heads"].split("+")) else  # not every head was ablated alone
          ", more than the sum of each alone: one backs up the other." if r["backup"]["removed"][0] > sum(r["backup"]["alone"].values())
          else ", no more than the sum of each alone.")),
    "- **Circuit.** " + ". ".join(paths)
    + f". As first written, the circuit reproduces {n:.2f} [{n_low:.2f}, {n_high:.2f}] of the copy gap on held-out spans "
    f"(faithfulness); with the layer-0 carriers' own inputs added, {f:.2f} [{f_low:.2f}, {f_high:.2f}]. "
    + ("The difference is the lesson: a head kept as a carrier carries the other prompt unless its inputs are kept. "
       if f_low > n_high else "")
    + ("Above 1: the circuit alone copies more than the whole model, so heads outside it work against copying "
       "on these spans (which heads, and how, is not tested here)." if f_low > 1 else
       "The circuit carries most of the copying." if f_low >= 0.5 else
       "Even so, this hypothesis is far from the whole mechanism.")]))
