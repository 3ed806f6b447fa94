"""Induction, duplicate-token and copying scores per head (Olsson et al. 2022; Elhage et al. 2021).

On a prompt with repeats, a query token t at position q whose token also occurred earlier
at position j < q:
- `duplicate_token`: weight on the earlier occurrences j of the same token;
- `induction` (prefix matching): weight on the tokens right after them, j + 1 (<= q).
Per prompt, each is the mean over *repeat queries*. With a repeat period (`prompts.repeats`,
from `interp.data.repeated_tokens`; legacy `meta["prefix_len"]`) they are the positions of the
second and later copies, p >= offset + period, which repeat by construction (accidental collisions inside
the first copy do not count); otherwise, every real position whose token occurred before.
Targets always include every earlier occurrence, as in TransformerLens.

Natural text (e.g. bytes of source code) repeats single tokens everywhere, so a one-token match
says little; `Repeats(match_len=k)` (legacy `meta["match_len"] = k`) makes the repeat a k-gram: the earlier occurrences of a
query q are the positions j <= q - k whose k tokens ending at j equal the k tokens ending at q
(`ngram_targets`; the two n-grams do not overlap, so a run such as eight spaces does not make
the previous position an "earlier occurrence" and its successor, the query itself, an
induction target), and the repeat queries are the positions that have one (within the repeated
copies when a period is also given). k = 1 is the definition above. The repeat queries are
`interp.data.Repeats.query_mask`, the toolkit's one definition of repeated positions, which the
next-token behaviours score too. Both are head types
(`interp.analyses.head_types`); a registered type that needs repeats gets its column here too.

Agreement with `transformer_lens.head_detector.detect_head(model, tokens, "induction_head" or
"duplicate_token_head", error_measure="mul")` on one unpadded prompt of length T: its
detection pattern is the same set of target keys, but it divides by all T queries, so
detect_head = score * n_repeat_queries / T.

`copying` is a property of the weights, not of prompts: the OV-circuit eigenvalue score of
Elhage et al. (2021, "A mathematical framework for transformer circuits"),
sum(eigenvalues) / sum(|eigenvalues|) of the token-to-logit map W_E W_V^h W_O^h W_U, in
[-1, 1]; +1 means the head raises the logit of the token it attends to (a copying head), and
a head whose OV circuit does not reach the logits at all scores 0.
LayerNorms are folded as fixed affine maps (centering times their weights; the per-token
scale is ignored), and biases are dropped. It has no confidence interval (its CI columns are
NaN): there is no sampling over prompts to be uncertain about.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import nn

import interp.launch as launch
from interp.analyses.head_types import HeadType, head_types, reduce_head_types
from interp.analyses.positional import nan_aware_frame
from interp.capture import BatchContext, PerPromptAccumulator, stream
from interp.data import PromptSet, Repeats, ngram_targets  # noqa: F401  (ngram_targets re-exported: its home was here)
from interp.errors import BadInput
from interp.hooks import attention_sites
from interp.launch import Device, DType
from interp.modelinfo import OVWeights, final_norm, ov_weights, token_embedding, unembedding
from interp.validate import check_inputs

INDUCTION_METRICS = ("induction", "duplicate_token")


class NoRepeats(ValueError):
    """The prompts contain no repeated tokens, so induction and duplicate-token scores are undefined."""


def repeat_types() -> tuple[HeadType, ...]:
    """The registered head types that need repeats (induction, duplicate_token, and any registered since)."""
    return head_types(needs=("repeats",))


def repeat_queries(prompts: PromptSet) -> torch.Tensor:
    """(prompt, pos) bool: the queries the scores average over, `prompts.repeats.query_mask` (without a
    repeat structure: every real position whose token occurred before)."""
    return (prompts.repeats or Repeats()).query_mask(prompts.tokens, prompts.real_mask())


def check_repeats(prompts: PromptSet) -> torch.Tensor:
    """The repeat queries of `prompts`; NoRepeats (or BadInput) when induction is undefined on them."""
    repeats = prompts.repeats
    if repeats is not None and repeats.period is not None and repeats.period < 2:
        # every repeat is the previous token: "the token after it" is the query itself (issue 11 #6)
        raise BadInput(f"prompts with prefix_len={repeats.period}: the induction target of every repeat is the query "
                       "itself, so induction cannot be told from self-attention; use prefix_len >= 2.")
    queries = repeat_queries(prompts)
    none = (~queries.any(-1)).nonzero().flatten().tolist()
    if none:
        source = "no token occurs twice"
        if repeats is not None and repeats.match_len is not None:
            source = f"no {repeats.match_len}-gram occurs twice"
        elif repeats is not None and repeats.period is not None:
            source = f"meta prefix_len={repeats.period}"
        raise NoRepeats(
            f"prompts {prompts.row_numbers(none[:5])} have no repeated tokens to score ({source}, {prompts.n_pos} positions); "
            "induction needs repeats: use interp.data.repeated_tokens(n, prefix_len, d_vocab)."
        )
    return queries


_check_repeats = check_repeats  # its former name (interp.analyses.claims.evidence)


def reduce_induction(pattern: torch.Tensor, ctx: BatchContext) -> dict[str, torch.Tensor]:
    """pattern (batch, head, query, key) -> {"induction", "duplicate_token", ...: (batch, head)}: the metric of
    every head type that needs repeats (`repeat_types`)."""
    return reduce_head_types(pattern, ctx, repeat_types(), argmax=False)


def scores_per_prompt(model: nn.Module, prompts: PromptSet, *, batch_size: int = 32, layers=None,
                      device: Device = None, dtype: DType = None) -> dict[str, torch.Tensor]:
    """{"induction", "duplicate_token": (prompt, layer, head)}; a `NoRepeats` error if a prompt has none.
    `device` / `dtype`: run a moved copy of the model (`interp.launch.move`); scores stay float32."""
    layers, _ = check_inputs("scores_per_prompt", model, prompts, layers=layers)
    check_repeats(prompts)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    acc = stream(model, prompts, reduce_induction, layers=layers, batch_size=batch_size, accumulator=PerPromptAccumulator())
    return acc.result()


def _weight(module: nn.Module, *paths: str) -> torch.Tensor | None:
    for path in paths:
        obj = module
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if isinstance(obj, torch.Tensor):
            return obj
    return None


def _centered_ln(module: nn.Module | None) -> tuple[bool, torch.Tensor | None]:
    """(centers, weight) of a norm module: a LayerNorm centres (ours, torch's), an RMSNorm only scales; none: (False, None)."""
    if module is None or isinstance(module, nn.Identity):
        return False, None
    weight = _weight(module, "w", "weight")
    return "RMS" not in type(module).__name__, weight


VOCAB_CHUNK = 8192  # vocabulary rows per float64 block of the readout products (8192 x d_model x 8 bytes each)


def _readout(W_E: torch.Tensor, W_U: torch.Tensor, out_map: torch.Tensor, centre: bool) -> tuple[torch.Tensor, ...]:
    """(G, gram_E, gram_U), float64, (d_model, d_model) each: G = out_map W_U E_c (the token-to-token map's middle,
    read from the residual stream back to it), gram_E = E_c^T E_c and gram_U = out_map W_U W_U^T out_map^T, where
    E_c is W_E, centred per token when the heads' norm centres. Summed over vocabulary blocks: nothing of the
    vocabulary's size is held in float64 at once."""
    d_model = W_E.shape[1]
    G, gram_E, gram_U = (torch.zeros(d_model, d_model, dtype=torch.float64) for _ in range(3))
    for start in range(0, W_E.shape[0], VOCAB_CHUNK):
        E = W_E[start:start + VOCAB_CHUNK].detach().double()  # (chunk, d_model)
        if centre:
            E = E - E.mean(-1, keepdim=True)
        U = out_map @ W_U[:, start:start + VOCAB_CHUNK].detach().double()  # (d_model, chunk)
        G += U @ E
        gram_E += E.T @ E
        gram_U += U @ U.T
    return G, gram_E, gram_U


def copying_scores(model: nn.Module, *, device: Device = None, dtype: DType = None) -> torch.Tensor:
    """(layer, head) OV-circuit eigenvalue copying score from the weights (see the module docstring).

    Weights come from `interp.modelinfo`: HookedGPT's own, nn.MultiheadAttention's
    `in_proj_weight` / `out_proj`, or the projections SDPA interception found; the embedding
    and unembedding are the model's (an nn.Embedding and a Linear to the vocabulary). Norms are
    folded where the model names them (HookedGPT's ln1 / ln_final; a LayerNorm centres, an RMSNorm does not);
    a site whose maps cannot be read scores NaN. `device` / `dtype`: a moved copy's weights (`interp.launch.move`),
    cast to float64 for the eigenvalues either way; the scores come back on the CPU.

    The nonzero eigenvalues of W_E W_V W_O W_U (vocabulary x vocabulary) are those of W_O (W_U W_E) W_V
    (d_head x d_head): the vocabulary-sized product is formed once, as the d_model x d_model `_readout`, and each
    head costs a few d_model x d_head products. Under grouped-query attention each query head reads its key/value
    head's W_V; nothing is expanded per query head.
    """
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    W_E, W_U = token_embedding(model), unembedding(model)
    if W_E is None or W_U is None:
        raise TypeError(
            f"cannot read W_E / W_U from a {type(model).__name__} (no token embedding or no Linear to the vocabulary); "
            "the copying score needs per-head weights. Pass copying=False to scores()."
        )
    sites = attention_sites(model)
    readouts: dict[bool, tuple[torch.Tensor, ...]] = {}
    with torch.no_grad():
        centers, w_final = _centered_ln(final_norm(model))
        out_map = torch.eye(W_U.shape[0], dtype=torch.float64)  # (d_model, d_model): the final norm as a linear map
        if centers:
            out_map = out_map - out_map.mean(0, keepdim=True)
        if w_final is not None and final_norm(model) is not None:
            out_map = out_map * w_final.detach().double().cpu()
        W_E, W_U = W_E.detach().cpu(), W_U.detach().cpu()
        scores = torch.full((len(sites), max(s.n_heads for s in sites)), float("nan"), dtype=torch.float64)
        for i, site in enumerate(sites):
            ov = ov_weights(model, site)
            if ov is None:
                continue
            centre, w_in = _centered_ln(ov.norm)
            if centre not in readouts:
                readouts[centre] = _readout(W_E, W_U, out_map, centre)
            scores[i, : site.n_heads] = _site_copying(ov, w_in, *readouts[centre])
    return scores.float().cpu()


def _site_copying(ov: OVWeights, w_in: torch.Tensor | None, G: torch.Tensor, gram_E: torch.Tensor,
                  gram_U: torch.Tensor) -> torch.Tensor:
    """(head,) sum(eig) / sum(|eig|) of each head's W_O G diag(w_in) W_V (d_head x d_head); 0 for a head whose
    circuit the unembedding cannot see (every eigenvalue ~0 against the norms of its two factors)."""
    gain = torch.ones(G.shape[1], dtype=torch.float64) if w_in is None else w_in.detach().double().cpu()
    W_V = ov.W_V.detach().double().cpu() * gain[:, None]  # (kv_head, d_model, d_head): the input norm's gain folded in
    W_O = ov.W_O.detach().double().cpu()  # (head, d_head, d_model)
    kv = torch.arange(W_O.shape[0]) // ov.kv_group  # the key/value head each query head reads
    middle = (G @ W_V)[kv] if ov.kv_group > 1 else G @ W_V  # (head, d_model, d_head): per kv head, indexed
    eigenvalues = torch.linalg.eig(W_O @ middle).eigenvalues  # (head, d_head) complex
    total = eigenvalues.abs().sum(-1)
    left = (W_V.transpose(-1, -2) @ gram_E @ W_V).diagonal(dim1=-2, dim2=-1).sum(-1).clamp(min=0).sqrt()[kv]  # ||E W_V||
    right = (W_O @ gram_U @ W_O.transpose(-1, -2)).diagonal(dim1=-2, dim2=-1).sum(-1).clamp(min=0).sqrt()  # ||W_O W_U||
    zero = total <= 1e-9 * (left * right).clamp(min=1e-30)
    return torch.where(zero, 0.0, eigenvalues.real.sum(-1) / total.clamp(min=1e-300))


def scores(
    model: nn.Module, prompts: PromptSet, *, batch_size: int = 32, seed: int = 0, copying: bool = True, layers=None,
    device: Device = None, dtype: DType = None, per_prompt: dict[str, torch.Tensor] | None = None,
) -> pd.DataFrame:
    """One row per (layer, head): `induction`, `duplicate_token` (with bootstrap CIs over prompts),
    `copying` (weights only; its CI columns are NaN; all NaN for a model without an unembedding,
    e.g. a bare encoder, where copying to the output vocabulary is undefined), and `n_prompts`.
    `device` / `dtype`: run a moved copy of the model (`interp.launch.move`), once for both. `per_prompt`:
    `scores_per_prompt`'s result measured already (e.g. in one forward with the positional metrics), not again."""
    layers, seed = check_inputs("induction.scores", model, prompts, layers=layers, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    if per_prompt is None:
        per_prompt = scores_per_prompt(model, prompts, batch_size=batch_size, layers=layers)
    frame = nan_aware_frame(per_prompt, seed=seed, layers=layers)
    if copying:
        if _weight(model, "unembed.W_U", "W_U") is None and _weight(model, "embed.W_E", "W_E") is not None:
            frame["copying"] = np.nan  # no unembedding: nothing to copy into
        else:
            values = copying_scores(model)  # (layer, head)
            frame["copying"] = values.numpy()[frame["layer"].to_numpy(), frame["head"].to_numpy()]
        frame["copying_ci_low"] = np.nan
        frame["copying_ci_high"] = np.nan
        frame = frame[[c for c in frame.columns if c != "n_prompts"] + ["n_prompts"]]
    return frame
