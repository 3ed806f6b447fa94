"""The models and known answers that several test modules share (imported by name: tests/ is on sys.path)."""
import torch

# the hand-set circuit's edges (interp.models.constructed.induction_circuit): L0H0's value reads the token
# (its query and key read positions, which resampling leaves equal), L1H0's query and value read the token,
# its key reads L0H0's `prev`, and only L1H0 writes to `out`, which the unembedding reads
INDUCTION_EDGES = {"embed -> L0H0 via v", "L0H0 -> L1H0 via k", "embed -> L1H0 via q", "embed -> L1H0 via v",
                   "L1H0 -> logits"}


def randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight random (norm gains around one), so biases, norms and heads all matter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * 0.15
            gain = param.ndim == 1 and name.endswith("weight") and "embed" not in name
            param.copy_(noise + 1.0 if gain else noise)
    return model.eval()
