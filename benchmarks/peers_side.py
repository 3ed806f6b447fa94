"""The peer's side of `python -m benchmarks peers`: auto-circuit 1.0.1 on TransformerLens 2.x, in its own environment.

    build/peers-venv/bin/python benchmarks/peers_side.py WORKDIR

Imports nothing of interp (its environment has TransformerLens 2.x, numpy < 2, pandas < 2.1). For each model
folder that `benchmarks/bench_peers.py` wrote under WORKDIR (`config.json`: a HookedTransformerConfig's fields
and the task; `weights.safetensors`: TransformerLens state-dict names; `data.safetensors`: clean and corrupted
tokens of the proposing half, answers, and our logits on the clean tokens), it loads a HookedTransformer, checks
its logits against ours, runs auto-circuit's ACDC, EAP and EAP with integrated gradients on the same
clean/corrupted pairs and the same metric, and writes `peer.json`: per method the score of every edge (named
as interp names edges), how many edges it keeps where it decides that, and the wall time.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch as t


def our_label(edge) -> str:
    """auto-circuit's edge name ('A0.1->A1.0.K', 'Resid Start->MLP 1', 'A1.0->Resid End') as interp's label."""
    def node(name: str) -> str:
        if name == "Resid Start":
            return "embed"
        if name == "Resid End":
            return "logits"
        if name.startswith("MLP "):
            return f"MLP{name[4:]}"
        layer, head = name[1:].split(".")[:2]
        return f"L{layer}H{head}"

    src, dest = edge.src.name, edge.dest.name
    via = f" via {dest.split('.')[-1].lower()}" if dest.startswith("A") else ""
    return f"{node(src)} -> {node(dest)}{via}"


def load_model(folder: Path):
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    config = json.loads((folder / "config.json").read_text())
    model = HookedTransformer(HookedTransformerConfig(**config["tl_config"]))
    state = load_file(str(folder / "weights.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # buffers TransformerLens builds at init (masks, rotary tables) are not weights
    real_missing = [k for k in missing if not k.endswith(("IGNORE", ".mask", "rotary_sin", "rotary_cos"))]
    if real_missing or unexpected:
        raise RuntimeError(f"{folder.name}: weights missing {real_missing[:4]}, unexpected {unexpected[:4]}")
    model.set_use_attn_result(True)
    model.set_use_split_qkv_input(True)
    if not model.cfg.attn_only:
        model.set_use_hook_mlp_in(True)
    return model.eval(), config


def run_one(folder: Path) -> dict:
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune_algos.ACDC import acdc_prune_scores
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.utils.graph_utils import patchable_model
    from safetensors.torch import load_file

    model, config = load_model(folder)
    data = load_file(str(folder / "data.safetensors"))
    numeric = config["task"] == "numeric"
    clean, corrupt = data["clean"], data["corrupt"]
    with t.no_grad():
        logits = model(clean)
    difference = float((logits - data["our_logits"]).abs().max())
    if numeric:  # the squared change of the output at every position after BOS
        answers = [row for row in logits[:, 1:].detach()]
        slice_output, faith, grad, answer = "not_first_seq", "mse", "logit", "mse"
    else:  # the next-token loss at the last position
        answers = [a.view(1) for a in data["answers"]]
        slice_output, faith, grad, answer = "last_seq", "kl_div", "logprob", "avg_val"
    dataset = PromptDataset(clean, corrupt, answers, answers)
    loader = PromptDataLoader(dataset, seq_len=None, diverge_idx=0, batch_size=len(clean), shuffle=False)
    patchable = patchable_model(model, factorized=True, slice_output=slice_output, separate_qkv=True,
                                device=t.device("cpu"))
    methods = {
        "acdc": lambda: acdc_prune_scores(patchable, loader, None, faithfulness_target=faith),
        "eap": lambda: mask_gradient_prune_scores(patchable, loader, None, grad_function=grad, answer_function=answer,
                                                  mask_val=0.0),
        "eap-ig": lambda: mask_gradient_prune_scores(patchable, loader, None, grad_function=grad,
                                                     answer_function=answer, integrated_grad_samples=10),
    }
    out = {"logit_max_abs_difference": difference, "n_edges": len(patchable.edges), "methods": {}}
    for name, method in methods.items():
        start = time.perf_counter()
        scores = method()
        wall = time.perf_counter() - start
        table = {our_label(edge): float(edge.prune_score(scores)) for edge in patchable.edges}
        kept = sum(1 for v in table.values() if math.isinf(v)) if name == "acdc" else None
        out["methods"][name] = {"scores": {k: (1e30 if math.isinf(v) else v) for k, v in table.items()},
                                "edges_found": kept, "wall_s": wall}
    return out


def main(argv: list[str]) -> int:
    t.set_num_threads(1)
    workdir = Path(argv[0])
    results = {}
    for folder in sorted(p for p in workdir.iterdir() if (p / "config.json").exists()):
        try:
            results[folder.name] = run_one(folder)
        except Exception as error:  # one model's failure is reported in the table; the others still run
            results[folder.name] = {"error": f"{type(error).__name__}: {error}"}
        print(f"peer: {folder.name} {results[folder.name].get('error', 'done')}", flush=True)
        (workdir / "peer.json").write_text(json.dumps(results, indent=1))  # as it goes
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
