"""Composition scores between heads (Elhage et al. 2021), each against a random baseline.

How strongly a later head can read an earlier head's output, from the weights alone: for sender S
(OV circuit W_V W_O) and receiver R,

    Q-composition  ||OV_S  QK_R  ||_F / (||OV_S||_F ||QK_R||_F)      S's write read by R's query
    K-composition  ||OV_S  QK_R^T||_F / (...)                         ... by R's key
    V-composition  ||OV_S  OV_R  ||_F / (...)                         ... by R's value

with QK_R = W_Q W_K^T and OV = W_V W_O (d_model x d_model, applied as x @ M). The receiver's norm gain
(ln1's `w`) is folded into what it reads; its centring and per-token scale are not (a score is a
property of the weights, not of a prompt). A score alone has no scale: two random low-rank maps already
score about sqrt(d_head / d_model). So each is reported against the **baseline**: the same score for
Gaussian random weights of the same shapes (`N_DRAWS` draws, seeded), as `ratio` = score / baseline
mean, with the baseline's 95th percentile. Everything is computed on d_head x d_head Gram matrices,
never a d_model x d_model product, so a GPT-2-sized model's 144 x 144 x 3 scores take seconds.
"""
from __future__ import annotations

import pandas as pd
import torch
from torch import nn

from interp.errors import BadInput
from interp.heads import head_label
from interp.paths import HEAD_VIAS

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


def _reads(via: str, W_Q: torch.Tensor, W_K: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor, gain: torch.Tensor):
    """The receiver's (X, Y) for `_scores`: what reads the sender's write (X) and the other factor (Y)."""
    gained = lambda W: W * gain[..., :, None]  # noqa: E731  ln1's w scales each d_model row read
    if via == "q":
        return gained(W_Q), gained(W_K)
    if via == "k":
        return gained(W_K), gained(W_Q)
    return gained(W_V), W_O.transpose(-1, -2)


def _weights(model: nn.Module) -> tuple[torch.Tensor, ...]:
    """(layer, head, ...) W_Q, W_K, W_V, W_O (per query head) and (layer, d_model) ln1 gains, float64."""
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        if not hasattr(model, name):
            raise BadInput(f"composition scores need the stacked weights (model.W_Q ...) of a HookedGPT, a checkpoint or a "
                           f"converted model; {type(model).__name__} has no {name}. Load it with interp.load(..., backend='native').")
    W_Q, W_K, W_V, W_O = (getattr(model, name).detach().double().cpu() for name in ("W_Q", "W_K", "W_V", "W_O"))
    gains = []
    for block in model.blocks:  # type: ignore[union-attr]
        norm_w = getattr(block.ln1, "w", None)
        gains.append(torch.ones(W_Q.shape[2], dtype=torch.float64) if norm_w is None else norm_w.detach().double().cpu())
    return W_Q, W_K, W_V, W_O, torch.stack(gains)


def baseline(d_model: int, d_head: int, via: str, *, n_draws: int = N_DRAWS, seed: int = BASELINE_SEED) -> torch.Tensor:
    """(n_draws,) the `via` composition score of Gaussian random weights of these shapes."""
    generator = torch.Generator().manual_seed(seed + HEAD_VIAS.index(via))
    draw = lambda *shape: torch.randn(n_draws, *shape, generator=generator, dtype=torch.float64)  # noqa: E731
    W_V, W_O = draw(d_model, d_head), draw(d_head, d_model)
    W_Q, W_K, W_V_r, W_O_r = draw(d_model, d_head), draw(d_model, d_head), draw(d_model, d_head), draw(d_head, d_model)
    X, Y = _reads(via, W_Q, W_K, W_V_r, W_O_r, torch.ones(d_model, dtype=torch.float64))
    return torch.stack([_scores(W_V[i:i + 1], W_O[i:i + 1], X[i:i + 1], Y[i:i + 1])[0, 0] for i in range(n_draws)])


def composition_scores(model: nn.Module, *, vias: tuple[str, ...] = HEAD_VIAS, n_draws: int = N_DRAWS) -> pd.DataFrame:
    """Every (earlier-layer sender, later-layer receiver, via) composition score with its random baseline.

    Columns: sender, receiver, sender_layer, sender_head, receiver_layer, receiver_head, via, score,
    baseline (the random weights' mean score), baseline_p95, ratio (score / baseline), n_draws."""
    unknown = [via for via in vias if via not in HEAD_VIAS]
    if unknown:
        raise BadInput(f"composition_scores: via {unknown[0]!r}; expected some of {list(HEAD_VIAS)}.")
    W_Q, W_K, W_V, W_O, gains = _weights(model)
    n_layers, n_heads, d_model, d_head = W_Q.shape
    if n_layers < 2:
        raise BadInput(f"composition scores need at least two layers; this {type(model).__name__} has {n_layers}.")
    rows = []
    for via in vias:
        draws = baseline(d_model, d_head, via, n_draws=n_draws)
        mean, p95 = float(draws.mean()), float(draws.quantile(0.95))
        for receiver_layer in range(1, n_layers):
            gain = gains[receiver_layer][None].expand(n_heads, -1)
            X, Y = _reads(via, W_Q[receiver_layer], W_K[receiver_layer], W_V[receiver_layer], W_O[receiver_layer], gain)
            for sender_layer in range(receiver_layer):
                scores = _scores(W_V[sender_layer], W_O[sender_layer], X, Y)  # (sender head, receiver head)
                for s in range(n_heads):
                    for r in range(n_heads):
                        score = float(scores[s, r])
                        rows.append({"sender": head_label((sender_layer, s)), "receiver": head_label((receiver_layer, r)),
                                     "sender_layer": sender_layer, "sender_head": s, "receiver_layer": receiver_layer,
                                     "receiver_head": r, "via": via, "score": score, "baseline": mean,
                                     "baseline_p95": p95, "ratio": score / mean, "n_draws": n_draws})
    return pd.DataFrame(rows)


__all__ = ["BASELINE_SEED", "N_DRAWS", "baseline", "composition_scores"]
