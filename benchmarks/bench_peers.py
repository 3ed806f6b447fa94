"""A peer side by side: interp and auto-circuit 1.0.1 on the same models, corruption and metric, in one table.

    python -m benchmarks peers            # builds build/peers-venv on first use (minutes), then runs both
    python -m benchmarks peers --dry-run  # the plumbing on one small model, no peer environment (what the test runs)

auto-circuit needs TransformerLens 2.x (`HookedTransformer`), which cannot share an environment with this
toolkit's TransformerLens 4.3, so it runs in `build/peers-venv` (auto-circuit 1.0.1, transformer-lens < 3,
numpy < 2, pandas < 2.1 and torch 2.13.0 from the same source as `.venv`, never another torch; `PEER_PINS`),
built on first use and never by `make test` or `.ci/run`. Reported, not gating.

The models: the Tracr programs (`tracr-*`, true edges known), toy-induction, and the four hand-built circuits
(`interp.models.handbuilt`, true edges known). Each is exported in TransformerLens's state-dict names, and
the peer's logits are checked against ours (printed). Both toolkits get the same proposing half of 32 prompts
and the same corrupted prompts (each prompt's corruption is the next prompt of the set: one resampling
derangement, given row for row), and the same metric: the next-token loss at the last position (auto-circuit:
the answer's log-probability there, and KL divergence for its ACDC), or for the Tracr programs the squared
change of the output at every position after BOS (auto-circuit: `mse`, also for its ACDC).

Per method the table gives: the edges it keeps where the method decides that (ours: `discover`'s circuit;
auto-circuit's ACDC: the edges kept at every tau of its sweep, score inf; score-only methods: "-"), edge AUROC
against the true edges, CMD of its ranking (MIB's, measured for every method alike by
`interp.analyses.circuits.faithfulness_curve` on the held-out half, with the same corruption) and wall time.
Each method's per-edge score is named in the table's legend.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
PEER_ENV = ROOT / "build" / "peers-venv"
PEER_PINS = ("torch==2.13.0", "auto-circuit==1.0.1", "transformer-lens==2.18.0", "numpy==1.26.4", "pandas==2.0.3",
             "tracr-pypi==1.0.0", "jax==0.4.30", "jaxlib==0.4.30", "dm-haiku==0.0.12", "chex==0.1.86",
             "datasets==3.6.0", "pyarrow==19.0.1")  # pyarrow >= 20 and the datasets that need it want numpy 2
STAMP = PEER_ENV / "interp-peers.json"  # the pins the environment was built with
N_PROMPTS = 32
SCORE_NAMES = {  # what each method's per-edge score is
    ("interp", "acdc"): "behaviour change when ACDC patches the edge on top of those removed before it",
    ("interp", "eap"): "first-order (gradient) estimate of the edge's patching effect",
    ("interp", "eap-ig"): "the same, integrated along each layer's path (Simpson, 3 points)",
    ("interp", "nodes"): "exact effect of patching the sender's whole output (head-level), given to each of its edges",
    ("auto-circuit", "acdc"): "smallest tau at which its ACDC sweep prunes the edge (inf: never)",
    ("auto-circuit", "eap"): "mask gradient at the clean point (EAP)",
    ("auto-circuit", "eap-ig"): "mask gradient averaged over 10 mask values in [0, 1] (EAP-IG)",
}


# -- the models and their tasks


def models(dry_run: bool) -> list[tuple[str, Callable[[], Any]]]:
    import interp
    from interp.models import handbuilt
    from interp.specnames import TRACR_PROGRAMS

    if dry_run:
        return [("handbuilt-positional-sender", handbuilt.positional_sender)]
    out: list[tuple[str, Callable[[], Any]]] = [(f"tracr-{n}", lambda n=n: interp.load(f"tracr-{n}")) for n in TRACR_PROGRAMS]
    out.append(("toy-induction", lambda: interp.load("toy-induction")))
    out += [(f"handbuilt-{n.replace('_', '-')}", f) for n, f in handbuilt.FACTORIES.items()]
    return out


def prompts_for(name: str, model: Any, n: int) -> Any:
    import interp
    from interp.data import repeated_tokens
    from interp.models.convert import tracr

    if name.startswith("tracr-"):
        return interp.PromptSet(tracr.random_inputs(model, n, seed=1))
    if name == "toy-induction":
        return repeated_tokens(n, 10, 255, bos=255)
    text = model.metadata["prompts"]  # "interp.data.repeated_tokens(n, P, V, bos=B, n_repeats=R)"
    prefix, vocab = (int(x) for x in text.split("(n, ")[1].split(",")[:2])
    repeats = int(text.split("n_repeats=")[1].rstrip(")"))
    return repeated_tokens(n, prefix, vocab, bos=vocab, n_repeats=repeats)


def last_token_loss(logits: torch.Tensor, prompts: Any) -> torch.Tensor:
    """Cross-entropy of the last token, predicted at the position before it (auto-circuit's `last_seq` answer)."""
    return F.cross_entropy(logits[:, -2].float(), prompts.tokens[:, -1].to(logits.device), reduction="none")


def behaviour_for(name: str, model: Any) -> Any:
    from interp.behaviour import custom_behaviour, output_squared_error

    if name.startswith("tracr-"):
        return output_squared_error(model.metadata["output_columns"])
    return custom_behaviour(last_token_loss, name="last_token_loss",
                            description="next-token cross-entropy at the last position (nats)")


# -- export for TransformerLens 2.x


def tl_config(cfg: Any) -> dict[str, Any]:
    """HookedTransformerConfig fields (TransformerLens 2.x) for a HookedGPT config."""
    config = {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_ctx": cfg.n_ctx, "d_head": cfg.d_head,
              "n_heads": cfg.n_heads, "d_vocab": cfg.d_vocab, "act_fn": cfg.act_fn, "attn_only": cfg.attn_only,
              "normalization_type": cfg.normalization_type, "eps": cfg.layer_norm_eps, "seed": 0,
              "positional_embedding_type": cfg.positional_embedding_type, "default_prepend_bos": False}
    if not cfg.attn_only:
        config["d_mlp"] = cfg.d_mlp
    if cfg.positional_embedding_type == "rotary":
        config.update(rotary_dim=cfg.rotary_dim or cfg.d_head, rotary_base=cfg.rotary_base)
    return config


def export(folder: Path, name: str, model: Any, clean: torch.Tensor, corrupt: torch.Tensor, task: str) -> None:
    """config.json, weights.safetensors (TransformerLens names), data.safetensors (the proposing half)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.cfg.positional_embedding_type == "rotary":
        state.pop("pos_embed.W_pos", None)
    save_file(state, str(folder / "weights.safetensors"))
    cut = slice(None) if task == "numeric" else slice(None, -1)  # next-token: the answer is the last token
    with torch.no_grad():
        logits = model(clean[:, cut])
    save_file({"clean": clean[:, cut].contiguous(), "corrupt": corrupt[:, cut].contiguous(),
               "answers": clean[:, -1].contiguous(), "our_logits": logits.contiguous()}, str(folder / "data.safetensors"))
    (folder / "config.json").write_text(json.dumps({"name": name, "task": task, "tl_config": tl_config(model.cfg)}))


# -- our side


def node_scores(run: Any, source: Any) -> dict[str, float]:
    """Head-level scores: each sender's whole output patched (every edge out of it), exactly; each edge gets its
    sender's effect (a node method has no finer resolution)."""
    from interp.analyses.circuits.patching import PatchSweep
    from interp.paths import graph

    sweep = PatchSweep(run, source)
    every = graph(run.model)
    senders = sorted({e.sender for e in every})
    values = sweep.values([[e for e in every if e.sender == s] for s in senders])  # (sender, prompt)
    effect = {s: float((row - sweep.clean()).mean()) for s, row in zip(senders, values)}
    return {e.label: effect[e.sender] for e in every}


def ours(run: Any, source: Any) -> dict[str, dict[str, Any]]:
    """Each of our methods on the proposing half: scores, edges kept (where the method decides), wall time."""
    from interp.analyses.circuits import attribution_patching, discover

    out = {}
    for method in ("acdc", "eap", "eap-ig", "nodes"):
        start = time.perf_counter()
        if method in ("acdc", "eap"):
            circuit = discover(run, method=method, split=False, source=source)
            scores, kept = dict(circuit.scores), len(circuit.edges)
        elif method == "eap-ig":
            result = attribution_patching(run, source=source, method="eap-ig")
            scores, kept = {e.label: float(v) for e, v in zip(result.edges, result.edge_values.mean(1))}, None
        else:
            scores, kept = node_scores(run, source), None
        out[method] = {"scores": scores, "edges_found": kept, "wall_s": time.perf_counter() - start}
    return out


def measure(run: Any, source: Any, scores: dict[str, float], truth: list[str] | None, n_random: int
            ) -> dict[str, Any]:
    """AUROC against the truth and MIB's CMD (with CI) of a ranking, on the held-out half."""
    from interp.analyses.circuits import edge_auroc, faithfulness_curve
    from interp.paths import graph

    every = [e.label for e in graph(run.model)]
    finite = {k: (scores.get(k, 0.0) if math.isfinite(scores.get(k, 0.0)) else math.copysign(1e30, scores[k]))
              for k in every}  # an edge the other graph lacks scores 0 (counted in `unmatched`)
    curve = faithfulness_curve(run, finite, split=False, n_random=n_random, source=source)
    auroc = edge_auroc(finite, truth) if truth else float("nan")
    return {"auroc": auroc, "cmd": curve.cmd, "cpr": curve.cpr, "random_cmd": curve.random.cmd if curve.random else None,
            "unmatched": len(set(every) ^ set(scores))}


def ensure_peer_env() -> Path:
    """build/peers-venv with PEER_PINS, built on first use; the interpreter's path."""
    python = PEER_ENV / "bin" / "python"
    if STAMP.exists() and json.loads(STAMP.read_text()).get("pins") == list(PEER_PINS) and python.exists():
        return python
    print(f"building the peer environment in {PEER_ENV} (once; several minutes) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(PEER_ENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PINS], check=True)
    STAMP.write_text(json.dumps({"pins": list(PEER_PINS)}))
    return python


def run_all(out: Path, dry_run: bool) -> list[dict[str, Any]]:
    import interp

    rows: list[dict[str, Any]] = []
    work = out / "models"
    for name, factory in models(dry_run):
        model = factory()
        n = 8 if dry_run else N_PROMPTS
        prompts = prompts_for(name, model, n)
        corrupt = prompts[torch.arange(len(prompts)).roll(-1)]  # each prompt reads the next one: a derangement
        propose, test = torch.arange(n // 2), torch.arange(n // 2, n)
        behaviour = behaviour_for(name, model)
        run_p = interp.Run(model, prompts[propose], behaviour=behaviour, seed=0)
        run_t = interp.Run(model, prompts[test], behaviour=behaviour, seed=0)
        task = "numeric" if name.startswith("tracr-") else "next-token"
        export(work / name, name, model, prompts[propose].tokens, corrupt[propose].tokens, task)
        truth = list(model.metadata.get("edges", [])) or None
        for i, (method, result) in enumerate(ours(run_p, corrupt[propose]).items()):
            measured = measure(run_t, corrupt[test], result["scores"], truth, 5 if i == 0 else 0)
            rows.append({"model": name, "toolkit": "interp", "method": method, **result, **measured})
        print(f"interp: {name} done", flush=True)
    if dry_run:
        return rows
    python = ensure_peer_env()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    start = time.perf_counter()
    subprocess.run([str(python), str(ROOT / "benchmarks" / "peers_side.py"), str(work)], check=True, env=env)
    print(f"peer side: {time.perf_counter() - start:.0f} s", flush=True)
    peer = json.loads((work / "peer.json").read_text())
    for name, factory in models(dry_run):
        model = factory()
        prompts = prompts_for(name, model, N_PROMPTS)
        corrupt = prompts[torch.arange(len(prompts)).roll(-1)]
        test = torch.arange(N_PROMPTS // 2, N_PROMPTS)
        run_t = interp.Run(model, prompts[test], behaviour=behaviour_for(name, model), seed=0)
        truth = list(model.metadata.get("edges", [])) or None
        if "error" in peer[name]:
            print(f"auto-circuit on {name} failed: {peer[name]['error']}")
            continue
        for method, result in peer[name]["methods"].items():
            measured = measure(run_t, corrupt[test], result["scores"], truth, 0)
            rows.append({"model": name, "toolkit": "auto-circuit", "method": method, **result, **measured,
                         "logit_max_abs_difference": peer[name]["logit_max_abs_difference"]})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The one table: model, toolkit, method, edges kept, AUROC, CMD [CI], random CMD, wall time."""
    lines = [f"{'model':30} {'toolkit':12} {'method':7} {'edges':>5} {'AUROC':>6} {'CMD [95% CI]':>22} "
             f"{'random CMD':>10} {'wall s':>7}"]
    for row in rows:
        cmd, found = row["cmd"], row["edges_found"]
        base = row.get("random_cmd")
        lines.append(f"{row['model']:30} {row['toolkit']:12} {row['method']:7} {'-' if found is None else found:>5} "
                     f"{row['auroc']:6.3f} {cmd.mean:8.4f} [{cmd.ci_low:.4f}, {cmd.ci_high:.4f}] "
                     f"{'' if base is None else f'{base.mean:.4f}':>10} {row['wall_s']:7.2f}")
    legend = [f"  {toolkit} {method}: {what}" for (toolkit, method), what in SCORE_NAMES.items()]
    checks = sorted({(r["model"], r["logit_max_abs_difference"]) for r in rows if "logit_max_abs_difference" in r})
    return "\n".join(lines + ["", "per-edge scores:"] + legend + [""] + [
        f"  {model}: TransformerLens 2.x logits vs ours, max |difference| {d:.1e}" for model, d in checks] + [
        "  AUROC ranks |score| (NaN: no true edges known); CMD: MIB's area of |1 - faithfulness| over the fractions, "
        f"the ranking by |score|, measured by interp on the held-out {N_PROMPTS // 2} prompts; random CMD: 5 random "
        "rankings' mean."])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks peers", description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="our side on one small model; no peer environment")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "peers", help="working folder (default build/peers)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with open("/proc/loadavg") if Path("/proc/loadavg").exists() else open(os.devnull) as handle:
        load = handle.read().strip()
    start = time.perf_counter()
    rows = run_all(args.out, args.dry_run)
    print(table(rows))
    print(f"\nload average before the run: {load}; total {time.perf_counter() - start:.0f} s"
          + ("; dry run: the peer environment was not built or run" if args.dry_run else ""))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
