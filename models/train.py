"""Train the small shipped models; seeded and deterministic for a given thread count.

    python -m models.train --task induction --seed 0 --out models/checkpoints/toy-induction

trains a 2-layer attention-only HookedGPT on `models.tasks.InductionTask` (repeated random
tokens with varied prefix length, offset and BOS), then measures it on prefix lengths and
offsets it never saw, trains the fixed-length control (`--control-steps`, 0 to skip) and
writes NAME.safetensors, NAME.json (config + metadata: command, seed, steps, time, figures,
head roles) and NAME.md (the card), the figures all measured in the run.

Determinism: weights are initialised from `GPTConfig.seed` and batches come from a
`torch.Generator` seeded with the same seed, so two runs with the same seed and the same
number of torch threads give bit-identical weights (thread count can change float sums).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import torch

from models.config import GPTConfig
from models.gpt import HookedGPT
from models.io import save_checkpoint
from models.tasks import InductionTask, evaluate_induction, fixed_prefix_task

TaskName = Literal["induction"]

# role thresholds used in the card (scores are mean attention weights, in [0, 1])
PREV_TOKEN_THRESHOLD = 0.5  # more than half the attention on query - 1 (Clark et al. 2019)
INDUCTION_THRESHOLD = 0.5  # more than half on the token after the earlier occurrence


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained (the model's shape is its GPTConfig)."""

    task: TaskName = "induction"  # which task in models.tasks
    seed: int = 0  # seeds the weight initialisation and the batch generator
    steps: int = 3000  # optimiser steps
    batch_size: int = 32  # sequences per step
    lr: float = 2e-3  # peak AdamW learning rate
    weight_decay: float = 0.01  # AdamW weight decay
    warmup_steps: int = 100  # linear warm-up, then cosine decay to 10% of lr
    grad_clip: float = 1.0  # max gradient norm

    def __post_init__(self) -> None:
        if self.task not in get_args(TaskName):
            raise ValueError(f"task={self.task!r} is not supported; expected one of {list(get_args(TaskName))}.")
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1.")
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr} must be positive.")


def toy_induction_config(seed: int = 0, **overrides) -> GPTConfig:
    """The shape of `toy-induction`: 2 attention-only layers of 4 heads, d_model 64, vocab 256.

    The vocabulary is 256 (not 64) so that chance repeats inside a prompt are rare; with the distinct
    prefixes of `toy_induction_task` this gives a sharp previous-token head (see that function)."""
    fields = dict(n_layers=2, n_heads=4, d_model=64, n_ctx=128, d_vocab=256, attn_only=True,
                  normalization_type="LN", positional_embedding_type="rotary", init_range=0.8 / math.sqrt(64),
                  seed=seed, model_name="toy-induction")
    return GPTConfig(**{**fields, **overrides})


def toy_induction_task(model_cfg: GPTConfig) -> InductionTask:
    """The task `toy-induction` is trained on: varied prefix lengths and offsets, prefixes drawn without
    replacement. Measured (seed 0, 3000 steps): with prefixes drawn with replacement the layer-0
    previous-token head blurs over two back / itself (0.61 previous at vocab 64, 0.67 at vocab 256) so
    that the induction heads match bigrams, and substituting the exact one-hot previous-token pattern
    recovers only 2% (vocab 64) or 46% (vocab 256) of the ablation's loss; with distinct prefixes one
    earlier occurrence is all there is to match, the head sharpens and the exact pattern recovers most."""
    return InductionTask(d_vocab=model_cfg.d_vocab, n_pos=model_cfg.n_ctx, distinct_prefix=True)


def learning_rate(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class _StepBar:
    """Iterate over training steps under a rich progress bar on stderr (the toolkit's one progress
    library; models/ imports nothing of interp, so this is not interp.progress.Bar); silent when disabled."""

    def __init__(self, steps: int, description: str, enabled: bool):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.steps = steps
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[postfix]}"), console=Console(stderr=True), disable=not enabled)
        self.task = self.progress.add_task(description, total=steps, postfix="")

    def __iter__(self):
        with self.progress:
            for step in range(self.steps):
                yield step
                self.progress.advance(self.task)

    def set_postfix(self, **values) -> None:
        self.progress.update(self.task, postfix=" ".join(f"{k} {v}" for k, v in values.items()))


def train(model_cfg: GPTConfig, train_cfg: TrainConfig, task: InductionTask | None = None,
          progress: bool = True, description: str = "train") -> tuple[HookedGPT, list[float]]:
    """Train a fresh HookedGPT on the task; returns the model (eval mode) and the loss per step."""
    task = task or InductionTask(d_vocab=model_cfg.d_vocab, n_pos=model_cfg.n_ctx)
    if task.d_vocab != model_cfg.d_vocab or task.n_pos > model_cfg.n_ctx:
        raise ValueError(f"task (d_vocab={task.d_vocab}, n_pos={task.n_pos}) does not fit the model "
                         f"(d_vocab={model_cfg.d_vocab}, n_ctx={model_cfg.n_ctx}).")
    model_cfg = dataclasses.replace(model_cfg, seed=train_cfg.seed)
    model = HookedGPT(model_cfg).train()
    generator = torch.Generator().manual_seed(train_cfg.seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=train_cfg.lr, weight_decay=train_cfg.weight_decay,
                                  betas=(0.9, 0.98))
    losses = []
    bar = _StepBar(train_cfg.steps, description, progress)
    for step in bar:
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(step, train_cfg)
        tokens = task.sample(train_cfg.batch_size, generator)  # (batch, pos)
        loss = model(tokens, return_type="loss")
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {step}; lower lr (now {train_cfg.lr}).")
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        optimiser.step()
        losses.append(loss.item())
        if step % 25 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    return model.eval(), losses


# ---------------------------------------------------------------- measuring what was learned


def evaluation_grid(task: InductionTask) -> list[dict]:
    """Prompt settings for the card: trained lengths, held-out lengths, unseen offsets, with and without BOS."""
    bos = task.bos_token
    trained = [dict(prefix_len=12, offset=0, bos=bos), dict(prefix_len=20, offset=0, bos=None),
               dict(prefix_len=30, offset=10, bos=bos)]
    held_out = [dict(prefix_len=n, offset=0, bos=None) for n in task.held_out_prefix_lens]
    longest = max(task.prefix_lens)
    longer = [dict(prefix_len=longest + 3, offset=0, bos=bos), dict(prefix_len=longest + 5, offset=0, bos=None)]
    far = [dict(prefix_len=20, offset=40, bos=bos), dict(prefix_len=30, offset=60, bos=None),
           dict(prefix_len=12, offset=100, bos=None)]
    rows = []
    for kind, settings in (("trained", trained), ("held-out length", held_out),
                           ("longer than trained", longer), ("unseen offset", far)):
        for setting in settings:
            if 1 + setting["offset"] + 2 * setting["prefix_len"] <= task.n_pos or kind == "trained":
                rows.append({"kind": kind, **setting})
    return rows


def measure(model: HookedGPT, grid: list[dict], n: int = 64, seed: int = 1234) -> list[dict]:
    results = []
    for setting in grid:
        row = evaluate_induction(model, setting["prefix_len"], offset=setting["offset"], bos=setting["bos"],
                                 n=n, seed=seed)
        results.append({"kind": setting["kind"], **row})
    return results


def head_roles(results: list[dict]) -> dict:
    """Heads whose score, averaged over every evaluation setting, clears the threshold."""
    labels = list(results[0]["prev_token"])
    prev = {h: round(sum(r["prev_token"][h] for r in results) / len(results), 4) for h in labels}
    ind = {h: round(sum(r["induction"][h] for r in results) / len(results), 4) for h in labels}
    return {
        "previous_token_heads": [h for h in labels if prev[h] >= PREV_TOKEN_THRESHOLD],
        "induction_heads": [h for h in labels if ind[h] >= INDUCTION_THRESHOLD],
        "mean_prev_token_score": prev,
        "mean_induction_score": ind,
        "thresholds": {"prev_token": PREV_TOKEN_THRESHOLD, "induction": INDUCTION_THRESHOLD},
    }


@torch.no_grad()
def ablation_check(model: HookedGPT, heads: list[str], prefix_len: int = 25, n: int = 64, seed: int = 99) -> dict:
    """Second-copy loss with `heads` zero-ablated together (at hook_z), next to the intact loss."""
    from models.tasks import repeated_prompts

    tokens, start = repeated_prompts(n, prefix_len, model.cfg.d_vocab, seed=seed)
    by_layer: dict[int, list[int]] = {}
    for label in heads:
        layer, head = (int(x) for x in label[1:].split("H"))
        by_layer.setdefault(layer, []).append(head)

    def zero(heads_here):
        def hook(z, hook):
            z = z.clone()
            z[:, :, heads_here] = 0.0
            return z
        return hook

    hooks = [(f"blocks.{layer}.attn.hook_z", zero(hs)) for layer, hs in by_layer.items()]
    second = slice(start + prefix_len, start + 2 * prefix_len - 1)
    first = slice(start, start + prefix_len - 1)
    clean = model(tokens, return_type="loss", loss_per_token=True)
    ablated = model.run_with_hooks(tokens, return_type="loss", loss_per_token=True, fwd_hooks=hooks)
    return {"heads": heads, "prefix_len": prefix_len,
            "loss_second_intact": round(float(clean[:, second].mean()), 4),
            "loss_second_ablated": round(float(ablated[:, second].mean()), 4),
            "loss_first_intact": round(float(clean[:, first].mean()), 4)}


# ---------------------------------------------------------------- the card


def _table(results: list[dict]) -> str:
    lines = ["| prompts | prefix length | offset | BOS | loss, first copy | loss, second copy | top induction score |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        top = max(r["induction"], key=r["induction"].get)
        lines.append(f"| {r['kind']} | {r['prefix_len']} | {r['offset']} | {'yes' if r['bos'] is not None else 'no'} "
                     f"| {r['loss_first']:.3f} | {r['loss_second']:.3f} | {r['induction'][top]:.2f} ({top}) |")
    return "\n".join(lines)


def write_card(path: Path, metadata: dict) -> None:
    """The checkpoint's card (markdown), written only from the metadata the run recorded."""
    roles, control, train_md = metadata["head_roles"], metadata.get("control"), metadata["training"]
    score_lines = ["| head | previous-token score | induction score |", "|---|---|---|"]
    for label in roles["mean_prev_token_score"]:
        score_lines.append(f"| {label} | {roles['mean_prev_token_score'][label]:.3f} "
                           f"| {roles['mean_induction_score'][label]:.3f} |")
    ablation = metadata["ablation"]
    distinct = (", the prefix's tokens drawn without replacement (no token twice in one copy, so each has\n"
                "  one earlier occurrence to match)") if metadata["task"].get("distinct_prefix") else ""
    text = f"""# {metadata['name']}

A 2-layer attention-only HookedGPT (d_model {metadata['config']['d_model']}, {metadata['config']['n_heads']} heads
per layer, d_head {metadata['config']['d_head']}, vocabulary {metadata['config']['d_vocab']}, n_ctx
{metadata['config']['n_ctx']}, LayerNorm) trained on repeated random tokens until induction
heads formed. Every figure below was measured by the command that wrote this file.

## How it was made

    {metadata['command']}

- seed {train_md['seed']}, {train_md['steps']} steps of batch {train_md['batch_size']} x {metadata['task']['n_pos']} tokens,
  AdamW lr {train_md['lr']} (warm-up {train_md['warmup_steps']}, cosine to 10%), weight decay {train_md['weight_decay']}
- training took {metadata['train_seconds']:.0f} s wall, {metadata['train_cpu_seconds']:.0f} s CPU, on {metadata['threads']} torch
  thread(s) ({metadata['machine']}; torch {metadata['torch']}; the machine's 2 cores were shared with other jobs,
  so wall time exceeds CPU time); the whole command {metadata['total_seconds']:.0f} s wall, {metadata['total_cpu_seconds']:.0f} s CPU
- task: a random prefix of length drawn from {min(metadata['task']['prefix_lens'])}..{max(metadata['task']['prefix_lens'])}
  (except the held-out {metadata['task']['held_out_prefix_lens']}), after 0..{metadata['task']['max_offset']} random
  tokens, repeated to fill {metadata['task']['n_pos']} positions; BOS id {metadata['task']['bos_token']} at
  position 0 in half the sequences (the id also occurs as an ordinary token). Tokens uniform in [0, {metadata['config']['d_vocab']}){distinct}.
- final training loss (mean of the last 50 steps): {metadata['final_train_loss']:.3f}

## Induction on prompts `[BOS?] [offset random tokens] [prefix] [prefix]`

Loss on the same L-1 predictions (x_1..x_L-1) in the first and in the second copy, 64 prompts
each (`models.tasks.evaluate_induction`; uniform guessing is ln {metadata['config']['d_vocab']} = {math.log(metadata['config']['d_vocab']):.3f}):

{_table(metadata['evaluation'])}

## Head roles

Previous-token score: mean attention from query q to q-1. Induction score: mean attention
from a token of the second copy to the token after its earlier occurrence. Both averaged over
the prompt settings above. Threshold {roles['thresholds']['prev_token']} for both. Offsets of 60 and 100
random tokens put chance repeats of prefix tokens before the prefix, which real induction
also follows (hence the higher losses there).

- previous-token heads: {', '.join(roles['previous_token_heads']) or 'none'}
- induction heads: {', '.join(roles['induction_heads']) or 'none'}

{chr(10).join(score_lines)}

Zero-ablating {', '.join(ablation['heads'])} together (hook_z) on prefix length {ablation['prefix_len']} (held out):
second-copy loss {ablation['loss_second_intact']:.3f} -> {ablation['loss_second_ablated']:.3f}
(first copy, intact: {ablation['loss_first_intact']:.3f}).
"""
    if control:
        text += f"""
## Control: one fixed repeat length (not shipped)

The same model shape trained for {control['steps']} steps (seed {control['seed']}) on BOS + prefix + prefix with
the prefix length fixed at {control['prefix_len']} and no offset (final training loss {control['final_train_loss']:.3f}).
It fits its training length but fails on every other length: it copies from the fixed relative
offset {control['prefix_len'] - 1} instead of matching tokens (with rotary position embeddings a relative
offset works at any absolute position, so a shifted start still works). A claim checked only on
the training length cannot tell this from induction (there its induction score looks high);
other lengths can:

{_table(control['evaluation'])}

Control heads: previous-token {', '.join(control['head_roles']['previous_token_heads']) or 'none'};
induction (score >= {INDUCTION_THRESHOLD}) {', '.join(control['head_roles']['induction_heads']) or 'none'}.
Mean induction scores: {control['head_roles']['mean_induction_score']}.
"""
    path.write_text(text)


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m models.train",
        description="Train a small HookedGPT and write NAME.safetensors, NAME.json and NAME.md.",
        epilog="example: python -m models.train --task induction --seed 0 --out models/checkpoints/toy-induction",
    )
    parser.add_argument("--task", choices=get_args(TaskName), default="induction")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    parser.add_argument("--lr", type=float, default=TrainConfig.lr)
    parser.add_argument("--control-steps", type=int, default=600,
                        help="steps for the fixed-length control recorded in the card (0: skip)")
    parser.add_argument("--control-prefix-len", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the figures depend on it)")
    parser.add_argument("--out", required=True, help="checkpoint path without suffix, e.g. models/checkpoints/toy-induction")
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started, cpu_started = time.perf_counter(), time.process_time()
    train_cfg = TrainConfig(task=args.task, seed=args.seed, steps=args.steps, batch_size=args.batch_size, lr=args.lr)
    model_cfg = toy_induction_config(seed=args.seed, model_name=Path(args.out).name)
    task = toy_induction_task(model_cfg)

    t0, cpu0 = time.perf_counter(), time.process_time()
    model, losses = train(model_cfg, train_cfg, task, progress=not args.no_progress)
    train_seconds, train_cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    results = measure(model, evaluation_grid(task))
    roles = head_roles(results)
    ablation = ablation_check(model, roles["previous_token_heads"] + roles["induction_heads"])

    control = None
    if args.control_steps > 0:
        control_task = fixed_prefix_task(args.control_prefix_len, d_vocab=model_cfg.d_vocab)
        control_cfg = dataclasses.replace(train_cfg, steps=args.control_steps, warmup_steps=min(100, args.control_steps))
        control_model, control_losses = train(model_cfg, control_cfg, control_task, progress=not args.no_progress,
                                              description="control")
        bos = control_task.bos_token
        n = args.control_prefix_len
        grid = [{"kind": "trained", "prefix_len": n, "offset": 0, "bos": bos}]
        grid += [{"kind": "other length", "prefix_len": m, "offset": 0, "bos": bos} for m in (n // 2, n + 7, 2 * n)]
        grid += [{"kind": "unseen offset", "prefix_len": n, "offset": 5, "bos": bos}]
        control_results = measure(control_model, grid)
        control = {"steps": args.control_steps, "seed": args.seed, "prefix_len": n,
                   "final_train_loss": round(sum(control_losses[-50:]) / len(control_losses[-50:]), 4),
                   "evaluation": control_results, "head_roles": head_roles(control_results)}

    metadata = {
        "name": Path(args.out).name,
        "command": "python -m models.train " + " ".join(sys.argv[1:] if argv is None else argv),
        "training": dataclasses.asdict(train_cfg),
        "task": task.to_dict(),
        "config": model_cfg.to_dict(),
        "threads": args.threads,
        "machine": f"{platform.machine()}, {platform.system()}",
        "torch": torch.__version__,
        "train_seconds": round(train_seconds, 1),
        "train_cpu_seconds": round(train_cpu_seconds, 1),
        "final_train_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4),
        "evaluation": results,
        "head_roles": roles,
        "ablation": ablation,
        "control": control,
    }
    metadata["total_seconds"] = round(time.perf_counter() - started, 1)
    metadata["total_cpu_seconds"] = round(time.process_time() - cpu_started, 1)
    out = Path(args.out)
    save_checkpoint(model, out, metadata=metadata)
    write_card(out.with_name(out.name + ".md"), metadata)
    print(f"wrote {out}.safetensors/.json/.md in {metadata['total_seconds']:.0f} s; "
          f"previous-token heads {roles['previous_token_heads']}, induction heads {roles['induction_heads']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
