"""Composition scores between heads (Elhage et al. 2021), each against a random baseline.

How strongly a later head can read an earlier head's output, from the weights alone: for sender S
(OV circuit W_V W_O) and receiver R,

    Q-composition  ||OV_S  QK_R  ||_F / (||OV_S||_F ||QK_R||_F)      S's write read by R's query
    K-composition  ||OV_S  QK_R^T||_F / (...)                         ... by R's key
    V-composition  ||OV_S  OV_R  ||_F / (...)                         ... by R's value

with QK_R = W_Q W_K^T and OV = W_V W_O (d_model x d_model, applied as x @ M). The receiver's ln1 is folded
into what it reads, as far as it is a property of the weights: its gain `w` scales each d_model row read, and
a LayerNorm's centring (x - mean x, a fixed projection) removes the all-ones direction, so a sender writing
only along it composes with nothing (TransformerLens folds the same centring into the writing weights).
ln1's per-token scale is not folded (a score is a property of the weights, not of a prompt); RMSNorm
does not centre. A score alone has no scale: two Gaussian random maps already score about
1 / sqrt(d_model), whatever d_head (the product of four Gaussian matrices d_model x d_head x d_model x
d_head x d_model has E||.||^2 = d_model^3 d_head^2, each factor pair d_model^2 d_head). So each is
reported against the **baseline**: the same score for Gaussian random weights of the same shapes
(`N_DRAWS` draws, seeded; the receiver centred where the model's ln1 centres), as `ratio` = score /
baseline mean, with the baseline's 95th percentile. Everything is computed on d_head x d_head Gram
matrices, never a d_model x d_model product, so a GPT-2-sized model's 144 x 144 x 3 scores take seconds.
"""
from __future__ import annotations

import functools

import pandas as pd
import torch
from torch import nn

from interp.errors import BadInput
from interp.heads import head_label
from interp.modelinfo import user_class
from interp.paths import HEAD_VIAS, SPLIT_INPUTS_WORK

N_DRAWS = 200  # random weight draws per via for the baseline
BASELINE_SEED = 0


def _trace_product(left_gram: torch.Tensor, middle: torch.Tensor, right_gram: torch.Tensor) -> torch.Tensor:
    """||L M R^T||_F^2 = tr(L^T L M R^T R M^T) from L^T L (..., a, a), M (..., a, b), R^T R (..., b, b)."""
    return ((left_gram @ middle @ right_gram) * middle).sum((-2, -1))


def _scores(W_V: torch.Tensor, W_O: torch.Tensor, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """(sender, receiver) ||W_V W_O X Y^T|| / (||W_V W_O|| ||X Y^T||) for senders' W_V (s, d_model, d_head),
    W_O (s, d_head, d_model) and receivers' X (r, d_model, d_x), Y (r, d_y, d_x)."""
    gram_v = W_V.transpose(-1, -2) @ W_V  # (s, d_head, d_head)
    gram_y = Y.transpose(-1, -2) @ Y  # (r, d_x, d_x)
    middle = torch.einsum("sad,rdb->srab", W_O, X)  # (s, r, d_head, d_x)
    product = _trace_product(gram_v[:, None], middle, gram_y[None])  # (s, r)
    sender_norm = (gram_v * (W_O @ W_O.transpose(-1, -2))).sum((-2, -1))  # (s,) ||W_V W_O||^2
    receiver_norm = ((X.transpose(-1, -2) @ X) * gram_y).sum((-2, -1))  # (r,) ||X Y^T||^2
    return (product.clamp_min(0) / (sender_norm[:, None] * receiver_norm[None]).clamp_min(1e-30)).sqrt()


def _reads(via: str, W_Q: torch.Tensor, W_K: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor, gain: torch.Tensor,
           centre: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The receiver's (X, Y) for `_scores`: what reads the sender's write (X) and the other factor (Y), with
    ln1 folded in: its gain, and (`centre`, LayerNorm) its centring, on every map that reads the residual stream."""
    def normed(W: torch.Tensor) -> torch.Tensor:  # (..., d_model, d_head)
        W = W * gain[..., :, None]  # ln1's w scales each d_model row read
        # centring then reading, (x - mean x) @ W = x @ (W - mean of W's rows): the all-ones direction reads 0
        return W - W.mean(-2, keepdim=True) if centre else W
    if via == "q":
        return normed(W_Q), normed(W_K)
    if via == "k":
        return normed(W_K), normed(W_Q)
    return normed(W_V), W_O.transpose(-1, -2)


def _weights(model: nn.Module) -> tuple[torch.Tensor, ...]:
    """(layer, head, ...) W_Q, W_K, W_V, W_O (per query head), (layer, d_model) ln1 gains and (layer,) whether
    each layer's ln1 centres (a LayerNorm), float64."""
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        if not hasattr(model, name):
            raise BadInput(f"composition scores need the stacked weights (model.W_Q ...) of per-head q/k/v projections; "
                           f"{user_class(model).__name__} has no {name}. {SPLIT_INPUTS_WORK}")
    if getattr(model, "blocks", None) is None:  # stacked weights through a hooked model's surface, but no blocks
        from interp.intercepted import what_works

        raise BadInput(f"composition scores read each layer's input norm from HookedGPT's blocks; {user_class(model).__name__} "
                       f"is hooked by interception and has none. {what_works(model)}")
    W_Q, W_K, W_V, W_O = (getattr(model, name).detach().double().cpu() for name in ("W_Q", "W_K", "W_V", "W_O"))
    gains, centres = [], []
    for block in model.blocks:  # type: ignore[union-attr]
        norm_w = getattr(block.ln1, "w", None)
        gains.append(torch.ones(W_Q.shape[2], dtype=torch.float64) if norm_w is None else norm_w.detach().double().cpu())
        centres.append(block.cfg.normalization_type == "LN")
    return W_Q, W_K, W_V, W_O, torch.stack(gains), torch.tensor(centres)


def _paired_scores(W_V: torch.Tensor, W_O: torch.Tensor, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """(n,) the score of sender i with receiver i, for stacks of n of each (as `_scores`, without the n x n pairs)."""
    gram_v = W_V.transpose(-1, -2) @ W_V  # (n, d_head, d_head)
    gram_y = Y.transpose(-1, -2) @ Y  # (n, d_x, d_x)
    middle = W_O @ X  # (n, d_head, d_x)
    product = _trace_product(gram_v, middle, gram_y)
    sender_norm = (gram_v * (W_O @ W_O.transpose(-1, -2))).sum((-2, -1))
    receiver_norm = ((X.transpose(-1, -2) @ X) * gram_y).sum((-2, -1))
    return (product.clamp_min(0) / (sender_norm * receiver_norm).clamp_min(1e-30)).sqrt()


BASELINE_CHUNK = 16  # draws per chunk: six (chunk, d_model, d_head) float64 tensors at a time


def baseline(d_model: int, d_head: int, via: str, *, n_draws: int = N_DRAWS, seed: int = BASELINE_SEED,
             centre: bool = False) -> torch.Tensor:
    """(n_draws,) the `via` composition score of Gaussian random weights of these shapes (`centre`: the receiver's
    reads centred, as a LayerNorm receiver's are); its mean is about 1 / sqrt(d_model)."""
    if via not in HEAD_VIAS:
        raise BadInput(f"baseline: via {via!r}; expected one of {list(HEAD_VIAS)}.")
    return _baseline(d_model, d_head, via, n_draws, seed, centre).clone()


@functools.lru_cache(maxsize=32)
def _baseline(d_model: int, d_head: int, via: str, n_draws: int, seed: int, centre: bool) -> torch.Tensor:
    """`baseline`, kept per shape (a function of its arguments alone; drawing the weights is most of its cost)."""
    generator = torch.Generator().manual_seed(seed + HEAD_VIAS.index(via))
    ones = torch.ones(d_model, dtype=torch.float64)
    out = []
    for start in range(0, n_draws, BASELINE_CHUNK):
        n = min(BASELINE_CHUNK, n_draws - start)

        def draw(*shape: int, n: int = n) -> torch.Tensor:  # (n, *shape); n bound here, where draw is made
            return torch.randn(n, *shape, generator=generator, dtype=torch.float64)

        W_V, W_O = draw(d_model, d_head), draw(d_head, d_model)
        W_Q, W_K, W_V_r, W_O_r = draw(d_model, d_head), draw(d_model, d_head), draw(d_model, d_head), draw(d_head, d_model)
        out.append(_paired_scores(W_V, W_O, *_reads(via, W_Q, W_K, W_V_r, W_O_r, ones, centre)))
    return torch.cat(out)


def group_baseline(model: nn.Module, receiver_layer: int, via: str, group: int, *, n_draws: int = N_DRAWS
                   ) -> tuple[float, float]:
    """The mean and 95th percentile of the largest of `group` random scores into `receiver_layer` through `via`
    (each of `n_draws` draws the maximum over `group` independent receivers): the baseline of a key/value head's
    strongest query head, taken the same way as its score, so the maximum does not inflate the ratio. The query heads
    of a group share their key/value weights, so their scores are correlated, and the largest of independent draws is
    if anything the stricter bar."""
    weights = _weights(model)
    W_Q, centres = weights[0], weights[5]  # (layer, head, d_model, d_head), (layer,)
    d_model, d_head = int(W_Q.shape[2]), int(W_Q.shape[3])
    draws = baseline(d_model, d_head, via, n_draws=n_draws * group, centre=bool(centres[receiver_layer]))
    best = draws.view(n_draws, group).amax(1)  # (draw,)
    return float(best.mean()), float(best.quantile(0.95))


def composition_scores(model: nn.Module, *, vias: tuple[str, ...] = HEAD_VIAS, n_draws: int = N_DRAWS) -> pd.DataFrame:
    """Every (earlier-layer sender, later-layer receiver, via) composition score with its random baseline.

    Columns: sender, receiver, sender_layer, sender_head, receiver_layer, receiver_head, via, score,
    baseline (the random weights' mean score), baseline_p95, ratio (score / baseline), n_draws."""
    unknown = [via for via in vias if via not in HEAD_VIAS]
    if unknown:
        raise BadInput(f"composition_scores: via {unknown[0]!r}; expected some of {list(HEAD_VIAS)}.")
    if isinstance(n_draws, bool) or not isinstance(n_draws, int) or n_draws < 2:
        raise BadInput(f"composition_scores: n_draws={n_draws!r}; expected a whole number of at least 2 random draws "
                       f"for the baseline (default {N_DRAWS}).")
    W_Q, W_K, W_V, W_O, gains, centres = _weights(model)
    n_layers, n_heads, d_model, d_head = W_Q.shape
    if n_layers < 2:
        raise BadInput(f"composition scores need at least two layers; this {user_class(model).__name__} has {n_layers}.")
    baselines: dict[tuple[str, bool], tuple[float, float]] = {}
    rows = []
    for via in vias:
        for receiver_layer in range(1, n_layers):
            centre = bool(centres[receiver_layer])
            if (via, centre) not in baselines:
                draws = baseline(d_model, d_head, via, n_draws=n_draws, centre=centre)
                baselines[via, centre] = float(draws.mean()), float(draws.quantile(0.95))
            mean, p95 = baselines[via, centre]
            gain = gains[receiver_layer][None].expand(n_heads, -1)
            X, Y = _reads(via, W_Q[receiver_layer], W_K[receiver_layer], W_V[receiver_layer], W_O[receiver_layer], gain,
                          centre)
            for sender_layer in range(receiver_layer):
                scores = _scores(W_V[sender_layer], W_O[sender_layer], X, Y)  # (sender head, receiver head)
                rows += [{"sender": head_label((sender_layer, s)), "receiver": head_label((receiver_layer, r)),
                          "sender_layer": sender_layer, "sender_head": s, "receiver_layer": receiver_layer,
                          "receiver_head": r, "via": via, "score": float(scores[s, r]), "baseline": mean,
                          "baseline_p95": p95, "ratio": float(scores[s, r]) / mean, "n_draws": n_draws}
                         for s in range(n_heads) for r in range(n_heads)]
    return pd.DataFrame(rows)


__all__ = ["BASELINE_CHUNK", "BASELINE_SEED", "N_DRAWS", "baseline", "composition_scores", "group_baseline"]
