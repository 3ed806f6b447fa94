"""Power before verdicts: does the corruption change what a sender writes at all?

A path patch (or a discovery score) asks what happens when a receiver reads the sender's write from a corrupted
prompt. When the sender writes the same on every prompt (a layer-0 head that writes positions, identical on every
prompt of one length), the corrupted write *is* the clean write: the patch changes nothing, exactly, whether or not
the edge matters. Such a zero is no evidence either way. The test's power is the sender's `write_change`:

    write_change = max over prompts of ||corrupted(S) - clean(S)|| / ||clean(S)||

S the sender's write to the residual stream (a head's `hook_z` times its W_O, an MLP's output, the embeddings),
the norms over the prompt's real positions and the model width. Below `POWER_FLOOR` (1e-6) the evidence is
"inconclusive: the corruption does not change L0H0's write". Mean ablation has no power there either: the mean of
a constant is the constant. A sender whose write is zero on every clean and corrupted prompt is `silent`: its
edges carry nothing under any ablation, so a zero effect is the true answer, not a lack of power.

`EdgeZero` is the off-distribution check reported beside such evidence: the receiver reads zero in place of the
sender's write. It shows whether the write matters at all, but zero is not a value the model ever sees, so it is
never by itself support for a claim (`interp.claims.SUPPORTING_KINDS`).
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch import nn

from interp.claims import POWER_FLOOR
from interp.data import PromptSet
from interp.errors import BadInput
from interp.hooks import attention_sites, hooked
from interp.paths import (
    Edge,
    Node,
    as_edges,
    check_edges,
    check_graph_model,
    corrupted_prompts,
    edge_hooks,
    node_write,
    sender_writes,
)
from interp.run import prompt_fingerprint


@dataclass(frozen=True)
class WriteChange:
    """How much the corruption changes one sender's write, per prompt (see the module)."""

    node: str  # the sender's label, e.g. "L0H0"
    values: torch.Tensor = field(compare=False, repr=False)  # (prompt,) float64: ||corrupted - clean|| / ||clean||
    silent: bool = False  # the write is zero on every prompt, clean and corrupted
    how: str = "resampled"  # where the corrupted write comes from

    @property
    def max(self) -> float:
        """The largest relative change over the prompts: the test's power."""
        return float(self.values.max()) if len(self.values) else 0.0

    @property
    def powerless(self) -> bool:
        """The corruption leaves the (nonzero) write unchanged on every prompt: a patch of it tests nothing."""
        return self.max < POWER_FLOOR and not self.silent

    def reason(self) -> str:
        """Why a test through this sender has no power, in words ("the corruption does not change L0H0's write ...")."""
        measured = f"largest relative change over {len(self.values)} prompts {self.max:.2g} < {POWER_FLOOR:g}"
        if self.how.endswith("ablation"):
            return (f"the {self.how} does not change {self.node}'s write ({measured}): the write is the same on every "
                    "prompt (the mean of a constant is the constant), so the ablation changes nothing whether or not "
                    "the head matters; zero ablation (off-distribution) shows whether it does")
        return (f"the corruption does not change {self.node}'s write ({measured}; {self.how}), so patching it changes "
                "nothing whether or not it matters (mean ablation has no power either: the mean of a constant is the "
                "constant)")


def relative_change(clean: torch.Tensor, corrupted: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch,) ||corrupted - clean|| / ||clean|| over the real positions (0/0 = 0, x/0 = inf), and (batch,) ||clean||.
    `clean`, `corrupted`: (batch, pos, d_model); `mask`: (batch, pos) bool or None (every position real)."""
    weight = torch.ones(clean.shape[:2], dtype=torch.float64, device=clean.device) if mask is None \
        else mask.to(clean.device, torch.float64)
    diff = ((corrupted.double() - clean.double()).pow(2).sum(-1) * weight).sum(-1).sqrt()  # (batch,)
    norm = (clean.double().pow(2).sum(-1) * weight).sum(-1).sqrt()
    corrupted_norm = (corrupted.double().pow(2).sum(-1) * weight).sum(-1).sqrt()
    ratio = torch.where(norm > 0, diff / norm.clamp(min=1e-300), torch.where(diff > 0, torch.inf, 0.0))
    return ratio.cpu(), (norm + corrupted_norm).cpu()


def write_changes(run: Any, senders: Iterable[Node], source: PromptSet | None = None) -> dict[Node, WriteChange]:
    """Each sender's `WriteChange` on `run`'s prompts against the corrupted prompts of an `interp.paths.EdgePatch`
    (`source`, row for row, or resampled within the prompts): one clean and one corrupted forward per batch,
    stopped after the last sender, memoised on the Run."""
    senders = sorted(set(senders))
    missing = [node for node in senders if node.kind == "logits"]
    if missing:
        raise BadInput("write_changes: the logits write nothing; pass senders (embed, heads, MLPs).")
    how = "resampled from the other prompts" if source is None else "from the corrupted prompts given"
    key = ("write-change", tuple(node.label for node in senders), "resample" if source is None else prompt_fingerprint(source))

    def writes() -> Iterator[tuple[dict[Node, torch.Tensor], dict[Node, torch.Tensor], torch.Tensor | None]]:
        for batch in run.prompts.batches(run.batch_size):
            read = run.behaviour.model_prompts(batch)
            yield (sender_writes(run.model, read, senders),
                   sender_writes(run.model, corrupted_prompts(run, batch, source), senders), read.attention_mask)

    def compute() -> dict[Node, WriteChange]:
        check_graph_model(run.model, "write_change")
        return _changes(writes(), how)

    result: dict[Node, WriteChange] = run.cached(key, compute)
    return result


def sweep_write_changes(sweep: Any) -> dict[Node, WriteChange]:
    """Every sender's `WriteChange` from an `interp.sweep.PatchSweep`'s cached clean and corrupted writes (no forward)."""
    how = "resampled from the other prompts" if sweep.source is None else "from the corrupted prompts given"
    return _changes(((b.clean_writes, b.corrupted_writes, b.mask) for b in sweep.batches), how)


def _changes(batches: Iterable[tuple[dict[Node, torch.Tensor], dict[Node, torch.Tensor], torch.Tensor | None]],
             how: str) -> dict[Node, WriteChange]:
    """Each node's `WriteChange` over batches of (clean writes, changed writes, attention mask)."""
    ratios: dict[Node, list[torch.Tensor]] = {}
    norms: dict[Node, list[torch.Tensor]] = {}
    for clean, changed, mask in batches:
        for node, write in clean.items():
            ratio, norm = relative_change(write, changed[node], mask)
            ratios.setdefault(node, []).append(ratio)
            norms.setdefault(node, []).append(norm)
    return {node: WriteChange(node.label, torch.cat(ratios[node]), bool(torch.cat(norms[node]).max() == 0), how)
            for node in ratios}


def ablation_write_changes(run: Any, ablation: Any) -> dict[Node, WriteChange]:
    """Each ablated head's `WriteChange` under a `HeadAblation` at `z` on `run`'s prompts: its write with the
    ablation's values (the mean at the same role, a resampled prompt's, zero) against its clean write. One clean
    and one ablated forward per batch, stopped after the last ablated layer, memoised on the Run; {} for an ablation
    at another site (its write is not read at z), and on a model without a graph (`interp.paths.check_graph_model`: no
    split head writes to read; the evidence then says nothing of its power)."""
    if getattr(ablation, "site", "z") != "z":
        return {}
    try:
        check_graph_model(run.model, "ablation_write_changes")
    except BadInput:
        return {}
    heads = [Node(int(layer), "head", int(head)) for layer, head in ablation.heads]
    sites = attention_sites(run.model)
    names = {node: sites[node.layer].hook("z") for node in heads}
    how = f"{ablation.kind} ablation"

    def writes() -> Iterator[tuple[dict[Node, torch.Tensor], dict[Node, torch.Tensor], torch.Tensor | None]]:
        stop = max(node.layer for node in heads) + 1
        for batch in run.prompts.batches(run.batch_size):
            read = run.behaviour.model_prompts(batch)
            clean = _z_writes(run.model, read, names, stop)
            with ablation.intervene(run, read):
                ablated = _z_writes(run.model, read, names, stop)
            yield clean, ablated, read.attention_mask

    def compute() -> dict[Node, WriteChange]:
        return _changes(writes(), how)

    result: dict[Node, WriteChange] = run.cached(("ablation-write-change", json.dumps(ablation.spec(), sort_keys=True)),
                                                 compute)
    return result


@torch.no_grad()
def _z_writes(model: nn.Module, prompts: PromptSet, names: dict[Node, str], stop: int) -> dict[Node, torch.Tensor]:
    """Each head's write (batch, pos, d_model) from its `z` hook (as a hook attached before this one left it)."""
    acts: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        acts[hook.name] = act.detach().clone()

    with hooked(model, [(name, keep) for name in set(names.values())]):
        model(prompts.tokens, attention_mask=prompts.attention_mask, stop_at_layer=stop)
    out = {}
    for node, name in names.items():
        out[node] = node_write(model, node, acts[name])
    return out


@dataclass(frozen=True)
class EdgeZero:
    """Zero ablation of edges: each receiver reads zero in place of its sender's write along the edge (nothing else
    changes). An `interp.Run` intervention, off-distribution (see the module)."""

    edges: tuple[Edge, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "edges", tuple(sorted(as_edges(self.edges, "EdgeZero"))))
        if not self.edges:
            raise BadInput("EdgeZero needs at least one edge, e.g. EdgeZero(['L0H0 -> L1H1 via k']).")

    def spec(self) -> dict[str, Any]:
        return {"intervention": "edge_zero", "edges": [edge.label for edge in self.edges]}

    @property
    def label(self) -> str:
        return "; ".join(edge.label for edge in self.edges)

    def intervene(self, run: Any, batch: PromptSet) -> contextlib.AbstractContextManager[nn.Module]:
        check_graph_model(run.model)
        check_edges(run.model, self.edges)
        zeros = {edge.sender: torch.zeros(()) for edge in self.edges}  # corrupted - current = -current
        return hooked(run.model, edge_hooks(run.model, self.edges, zeros))


def powerless(changes: Sequence[WriteChange]) -> list[WriteChange]:
    """The senders among `changes` whose corruption changes nothing."""
    return [change for change in changes if change.powerless]


__all__ = ["POWER_FLOOR", "EdgeZero", "ablation_write_changes", "WriteChange", "powerless", "relative_change", "sweep_write_changes",
           "write_changes"]
