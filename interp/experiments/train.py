"""Train the small shipped models; seeded and deterministic for a given thread count.

    interp train --task induction --seed 0 --out models/checkpoints/toy-induction

trains a 2-layer attention-only HookedGPT on `interp.experiments.tasks.InductionTask` (repeated random
tokens with varied prefix length, offset and BOS), then measures it on prefix lengths and
offsets it never saw, trains the fixed-length control (`--control-steps`, 0 to skip) and
writes NAME.safetensors, NAME.json (config + metadata: command, seed, steps, time, figures,
head roles) and NAME.md (the card), the figures all measured in the run.

    interp train --task stdlib-bytes --seed 0 --threads 1 --out models/checkpoints/stdlib-bytes

trains the byte-level language model `stdlib-bytes` (4 layers with MLPs, d_model 128, context
256) on the Python standard library's source as installed (`interp.models.textcorpus`), after timing a
few steps and refusing, with the estimate, a run longer than `--max-minutes`; it records a
held-out loss curve and the held-out bits per byte against unigram and bigram baselines.

Determinism: weights are initialised from `GPTConfig.seed` and batches come from a
`torch.Generator` seeded with the same seed, so two runs with the same seed and the same
number of torch threads give bit-identical weights (thread count can change float sums).

`interp train` runs `main` (the console script's subcommand; `python -m interp.experiments.train` too). Over 600
lines because it is one command: the two tasks' training loops, their measurements and the
cards that record them are written and changed together, and the cards quote the loop's own figures.
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
from typing import Any, Callable, Literal, TypedDict, get_args

import torch

from interp.experiments.tasks import InductionTask, TextTask, evaluate_induction, fixed_prefix_task
from interp.models.arguments import real, whole
from interp.models.config import GPTConfig
from interp.models.files import write_atomic
from interp.models.gpt import HookedGPT
from interp.models.io import save_checkpoint
from interp.progress import Bar

TaskName = Literal["induction", "stdlib-bytes"]
PROG = "interp train"  # the command a card records (`interp.cli`'s subcommand)

# role thresholds used in the card (scores are mean attention weights, in [0, 1])
PREV_TOKEN_THRESHOLD = 0.5  # more than half the attention on query - 1 (Clark et al. 2019)
INDUCTION_THRESHOLD = 0.5  # more than half on the token after the earlier occurrence


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained (the model's shape is its GPTConfig)."""

    task: TaskName = "induction"  # which task in interp.experiments.tasks
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


# the control's evaluation grid (`main`) reads prefixes of half to twice the trained one, after a BOS: they must
# fit toy-induction's context, and half of one must still be a prefix (2 tokens or more)
CONTROL_PREFIX_MAX = (toy_induction_config().n_ctx - 1) // 4
CONTROL_WHY = " (the control is measured on prefixes of half to twice this length, within the model's context)"


def learning_rate(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(model_cfg: GPTConfig, train_cfg: TrainConfig, task: InductionTask | TextTask | None = None,
          progress: bool = True, description: str = "train", on_step=None) -> tuple[HookedGPT, list[float]]:
    """Train a fresh HookedGPT on the task; returns the model (eval mode) and the loss per step.

    `on_step(step, model, loss)`, if given, is called after every optimiser step (e.g. to measure
    held-out loss along the way); it must not change the model."""
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
    with Bar(train_cfg.steps, description, enabled=progress, unit="steps") as bar:
        for step in range(train_cfg.steps):
            losses.append(_step(model, optimiser, task.sample(train_cfg.batch_size, generator), step, train_cfg))
            if on_step is not None:
                on_step(step, model, losses[-1])
            bar.advance(1, f"loss {losses[-1]:.3f}" if step % 25 == 0 else None)
    return model.eval(), losses


def _step(model: HookedGPT, optimiser: torch.optim.Optimizer, tokens: torch.Tensor, step: int, train_cfg: TrainConfig) -> float:
    """One optimiser step on `tokens` (batch, pos) at the scheduled learning rate; the loss before it."""
    for group in optimiser.param_groups:
        group["lr"] = learning_rate(step, train_cfg)
    loss = model(tokens, return_type="loss")
    if not torch.isfinite(loss):
        raise FloatingPointError(f"loss became {loss.item()} at step {step}; lower lr (now {train_cfg.lr}).")
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
    optimiser.step()
    return loss.item()


# ---------------------------------------------------------------- measuring what was learned


class _Setting(TypedDict):
    """One prompt setting of the evaluation grid (bos None: no BOS token)."""

    prefix_len: int
    offset: int
    bos: int | None


def evaluation_grid(task: InductionTask) -> list[dict]:
    """Prompt settings for the card: trained lengths, held-out lengths, unseen offsets, with and without BOS."""
    bos = task.bos_token
    trained = [_Setting(prefix_len=12, offset=0, bos=bos), _Setting(prefix_len=20, offset=0, bos=None),
               _Setting(prefix_len=30, offset=10, bos=bos)]
    held_out = [_Setting(prefix_len=n, offset=0, bos=None) for n in task.held_out_prefix_lens]
    longest = max(task.prefix_lens)
    longer = [_Setting(prefix_len=longest + 3, offset=0, bos=bos), _Setting(prefix_len=longest + 5, offset=0, bos=None)]
    far = [_Setting(prefix_len=20, offset=40, bos=bos), _Setting(prefix_len=30, offset=60, bos=None),
           _Setting(prefix_len=12, offset=100, bos=None)]
    rows = []
    for kind, settings in (("trained", trained), ("held-out length", held_out),
                           ("longer than trained", longer), ("unseen offset", far)):
        for setting in settings:
            if 1 + setting["offset"] + 2 * setting["prefix_len"] <= task.n_pos or kind == "trained":
                rows.append({"kind": kind, **setting})
    return rows


def measure_grid(model: HookedGPT, grid: list[dict], n: int = 64, seed: int = 1234) -> list[dict]:
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
    from interp.experiments.tasks import repeated_prompts

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

    # typed as run_with_hooks's fwd_hooks (a list is invariant: a narrower element type is refused)
    hooks: list[tuple[str | Callable[..., Any], Callable[..., Any]]] = [
        (f"blocks.{layer}.attn.hook_z", zero(hs)) for layer, hs in by_layer.items()]
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


def _toy_made(metadata: dict) -> str:
    """The toy card's title, model and "How it was made" sections."""
    cfg, task, train_md = metadata["config"], metadata["task"], metadata["training"]
    distinct = (", the prefix's tokens drawn without replacement (no token twice in one copy, so each has\n"
                "  one earlier occurrence to match)") if task.get("distinct_prefix") else ""
    return f"""# {metadata['name']}

A 2-layer attention-only HookedGPT (d_model {cfg['d_model']}, {cfg['n_heads']} heads
per layer, d_head {cfg['d_head']}, vocabulary {cfg['d_vocab']}, n_ctx
{cfg['n_ctx']}, LayerNorm) trained on repeated random tokens until induction
heads formed. Every figure below was measured by the command that wrote this file.

## How it was made

    {metadata['command']}

- seed {train_md['seed']}, {train_md['steps']} steps of batch {train_md['batch_size']} x {task['n_pos']} tokens,
  AdamW lr {train_md['lr']} (warm-up {train_md['warmup_steps']}, cosine to 10%), weight decay {train_md['weight_decay']}
- training took {metadata['train_seconds']:.0f} s wall, {metadata['train_cpu_seconds']:.0f} s CPU, on {metadata['threads']} torch
  thread(s) ({metadata['machine']}; torch {metadata['torch']}; the machine's 2 cores were shared with other jobs,
  so wall time exceeds CPU time); the whole command {metadata['total_seconds']:.0f} s wall, {metadata['total_cpu_seconds']:.0f} s CPU
- task: a random prefix of length drawn from {min(task['prefix_lens'])}..{max(task['prefix_lens'])}
  (except the held-out {task['held_out_prefix_lens']}), after 0..{task['max_offset']} random
  tokens, repeated to fill {task['n_pos']} positions; BOS id {task['bos_token']} at
  position 0 in half the sequences (the id also occurs as an ordinary token). Tokens uniform in [0, {cfg['d_vocab']}){distinct}.
- final training loss (mean of the last 50 steps): {metadata['final_train_loss']:.3f}
"""


def _toy_induction(metadata: dict) -> str:
    """The toy card's table of first- and second-copy losses per prompt setting."""
    d_vocab = metadata["config"]["d_vocab"]
    return f"""## Induction on prompts `[BOS?] [offset random tokens] [prefix] [prefix]`

Loss on the same L-1 predictions (x_1..x_L-1) in the first and in the second copy, 64 prompts
each (`interp.experiments.tasks.evaluate_induction`; uniform guessing is ln {d_vocab} = {math.log(d_vocab):.3f}):

{_table(metadata['evaluation'])}
"""


def _toy_roles(metadata: dict) -> str:
    """The toy card's head roles: scores per head and the ablation of the induction heads."""
    roles, ablation = metadata["head_roles"], metadata["ablation"]
    score_lines = ["| head | previous-token score | induction score |", "|---|---|---|"]
    for label in roles["mean_prev_token_score"]:
        score_lines.append(f"| {label} | {roles['mean_prev_token_score'][label]:.3f} "
                           f"| {roles['mean_induction_score'][label]:.3f} |")
    return f"""## Head roles

Previous-token score: mean attention from query q to q-1. Induction score: mean attention
from a token of the second copy to the tokens after every earlier occurrence of it, chance
repeats included (the toolkit's `induction` head type). Both averaged over the prompt settings
above. Threshold {roles['thresholds']['prev_token']} for both. Offsets of 60 and 100 random tokens put
chance repeats of prefix tokens before the prefix, which real induction also follows (hence
the higher losses there).

- previous-token heads: {', '.join(roles['previous_token_heads']) or 'none'}
- induction heads: {', '.join(roles['induction_heads']) or 'none'}

{chr(10).join(score_lines)}

Zero-ablating {', '.join(ablation['heads'])} together (hook_z) on prefix length {ablation['prefix_len']} (held out):
second-copy loss {ablation['loss_second_intact']:.3f} -> {ablation['loss_second_ablated']:.3f}
(first copy, intact: {ablation['loss_first_intact']:.3f}).
"""


def _toy_control(control: dict) -> str:
    """The toy card's section on the fixed-length control model (trained, measured, not shipped)."""
    roles = control["head_roles"]
    return f"""
## Control: one fixed repeat length (not shipped)

The same model shape trained for {control['steps']} steps (seed {control['seed']}) on BOS + prefix + prefix with
the prefix length fixed at {control['prefix_len']} and no offset (final training loss {control['final_train_loss']:.3f}).
It fits its training length but fails on every other length: it copies from the fixed relative
offset {control['prefix_len'] - 1} instead of matching tokens (with rotary position embeddings a relative
offset works at any absolute position, so a shifted start still works). A claim checked only on
the training length cannot tell this from induction (there its induction score looks high);
other lengths can:

{_table(control['evaluation'])}

Control heads: previous-token {', '.join(roles['previous_token_heads']) or 'none'};
induction (score >= {INDUCTION_THRESHOLD}) {', '.join(roles['induction_heads']) or 'none'}.
Mean induction scores: {roles['mean_induction_score']}.
"""


def write_toy_card(path: Path, metadata: dict) -> None:
    """The checkpoint's card (markdown), written only from the metadata the run recorded."""
    text = "\n".join([_toy_made(metadata), _toy_induction(metadata), _toy_roles(metadata)])
    if metadata.get("control"):
        text += _toy_control(metadata["control"])
    write_atomic(path, text)


# ---------------------------------------------------------------- the natural-text model (stdlib-bytes)

# the shipped recipe's defaults (the 2 shared cores ran ~1.3-3 s per step of batch 16: see the card)
TEXT_STEPS = 1200  # optimiser steps (batch 16 x 256 bytes: ~4.9M bytes, about half an epoch)
TEXT_BATCH_SIZE = 16
TEXT_LR = 3e-3
TEXT_EVAL_EVERY = 100  # steps between held-out measurements on the small curve slice
TEXT_CURVE_WINDOWS = 32  # held-out windows measured along the way (the loss curve)
TEXT_EVAL_WINDOWS = 2048  # held-out windows of the final measurement (evenly spaced over the held-out files)
TEXT_CHECK_WINDOWS = 8  # a small fixed slice whose loss the card records exactly, for tests to recompute
TEXT_BUDGET_MINUTES = 20.0  # the most training may take on the machine it runs on


def text_lm_config(seed: int = 0, **overrides) -> GPTConfig:
    """The shape of `stdlib-bytes`: 4 layers of 4 heads with MLPs, d_model 128, context 256, byte vocabulary."""
    fields = dict(n_layers=4, n_heads=4, d_model=128, n_ctx=256, d_vocab=256, attn_only=False,
                  normalization_type="LN", positional_embedding_type="rotary", init_range=0.02,
                  seed=seed, model_name="stdlib-bytes")
    return GPTConfig(**{**fields, **overrides})


def seconds_per_step(model_cfg: GPTConfig, train_cfg: TrainConfig, n_pos: int, probe_steps: int = 3,
                     warmup_steps: int = 4) -> float:
    """Wall seconds per training step, timed on a throwaway model (the real run's RNG is untouched).

    The first few steps are several times slower (allocator and kernel warm-up: measured 13.7, 6.8,
    4.5, 2.7, then 0.7 s here), so `warmup_steps` are run untimed."""
    model = HookedGPT(dataclasses.replace(model_cfg, seed=12345)).train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=train_cfg.lr)
    tokens = torch.randint(0, model_cfg.d_vocab, (train_cfg.batch_size, n_pos),
                           generator=torch.Generator().manual_seed(12345))
    times = []
    for _ in range(warmup_steps + probe_steps):
        t0 = time.perf_counter()
        loss = model(tokens, return_type="loss")
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        times.append(time.perf_counter() - t0)
    return sum(times[warmup_steps:]) / probe_steps


def check_time_budget(seconds_per: float, steps: int, budget_minutes: float, threads: int) -> float:
    """The estimated training minutes; raise before training if they exceed the budget."""
    minutes = seconds_per * steps / 60
    if minutes > budget_minutes:
        raise ValueError(
            f"training {steps} steps would take about {minutes:.1f} min here ({seconds_per:.2f} s per step measured "
            f"with {threads} torch thread(s); other jobs on the machine slow it), over the budget of "
            f"{budget_minutes:g} min. Lower --steps (about {int(budget_minutes * 60 / seconds_per)} fit), "
            "or raise --max-minutes if you accept the longer run.")
    return minutes


def text_baselines(corpus, windows: torch.Tensor) -> dict:
    """Unigram / bigram bits per byte on the held-out windows, fitted on the training split (add-one)."""
    from interp.models.textcorpus import as_tensor, ngram_bits

    found = ngram_bits(as_tensor(corpus.train), windows)
    return {"unigram_bits": round(found["unigram_bits"], 4), "bigram_bits": round(found["bigram_bits"], 4),
            "smoothing": "add-one (Laplace) over the 256 byte values, counts from the training split",
            "n_predicted": found["n_predicted"]}


def bytes_per_char(data: bytes) -> float:
    """Bytes per character of UTF-8 text: bits per byte times this is bits per character."""
    return len(data) / len(data.decode("utf-8", errors="replace"))


def train_text(args: argparse.Namespace) -> dict:
    """The stdlib-bytes recipe: corpus, budget check, training with a held-out curve, final metrics."""
    from interp.experiments.tasks import evaluate_text
    from interp.models.textcorpus import as_tensor, eval_windows, load_corpus

    corpus = load_corpus(args.corpus_root)
    model_cfg = text_lm_config(seed=args.seed, model_name=Path(args.out).name)
    train_cfg = TrainConfig(task=args.task, seed=args.seed, steps=args.steps or TEXT_STEPS,
                            batch_size=args.batch_size or TEXT_BATCH_SIZE, lr=args.lr or TEXT_LR)
    task = TextTask(as_tensor(corpus.train), n_pos=model_cfg.n_ctx)
    held_out = as_tensor(corpus.held_out)
    windows = eval_windows(held_out, model_cfg.n_ctx, TEXT_EVAL_WINDOWS)  # (n, pos)
    curve_windows = eval_windows(held_out, model_cfg.n_ctx, TEXT_CURVE_WINDOWS)
    per_step = seconds_per_step(model_cfg, train_cfg, model_cfg.n_ctx)
    estimate = check_time_budget(per_step, train_cfg.steps, args.max_minutes, args.threads)
    print(f"estimated training time {estimate:.1f} min ({per_step:.2f} s/step x {train_cfg.steps} steps)", flush=True)
    curve = []

    def record(step, model, loss):
        if (step + 1) % TEXT_EVAL_EVERY == 0 or step + 1 == train_cfg.steps:
            bits = evaluate_text(model, curve_windows)["bits"]
            curve.append({"step": step + 1, "held_out_bits": round(bits, 4)})

    t0, cpu0 = time.perf_counter(), time.process_time()
    model, losses = train(model_cfg, train_cfg, task, progress=not args.no_progress, on_step=record)
    train_seconds, train_cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    for point in curve:  # mean training loss over the steps since the previous point, in bits
        done = [p["step"] for p in curve if p["step"] < point["step"]]
        chunk = losses[(done[-1] if done else 0) : point["step"]]
        point["train_bits"] = round(sum(chunk) / len(chunk) / math.log(2), 4)
    final = evaluate_text(model, windows)
    check = evaluate_text(model, windows[:TEXT_CHECK_WINDOWS])
    baselines = text_baselines(corpus, windows)
    ratio = bytes_per_char(corpus.held_out)
    return {
        "model": model, "training": dataclasses.asdict(train_cfg), "task": task.to_dict(), "corpus": corpus.summary(),
        "estimate_minutes": round(estimate, 2), "estimate_seconds_per_step": round(per_step, 3),
        "train_seconds": round(train_seconds, 1), "train_cpu_seconds": round(train_cpu_seconds, 1),
        "final_train_bits": round(sum(losses[-50:]) / len(losses[-50:]) / math.log(2), 4), "curve": curve,
        "held_out": {"bits_per_byte": round(final["bits"], 4), "bits_per_char": round(final["bits"] * ratio, 4),
                     "bytes_per_char": round(ratio, 6), "n_windows": final["n_windows"],
                     "n_predicted": final["n_predicted"], **baselines,
                     "ratio_to_bigram": round(final["bits"] / baselines["bigram_bits"], 4)},
        "check_slice": {"n_windows": TEXT_CHECK_WINDOWS, "nats": check["nats"], "bits": check["bits"]},
    }


def _curve_table(curve: list[dict]) -> str:
    lines = ["| step | training loss (bits/byte, mean since previous row) | held-out bits/byte (32 windows) |",
             "|---|---|---|"]
    lines += [f"| {p['step']} | {p['train_bits']:.3f} | {p['held_out_bits']:.3f} |" for p in curve]
    return "\n".join(lines)


def _text_made(metadata: dict) -> str:
    """The text card's title, model and "How it was made" sections."""
    cfg, tr = metadata["config"], metadata["training"]
    return f"""# {metadata['name']}

A byte-level causal language model (HookedGPT: {cfg['n_layers']} layers, {cfg['n_heads']} heads per layer,
d_model {cfg['d_model']}, d_head {cfg['d_head']}, MLPs of width {cfg['d_mlp']} ({cfg['act_fn']}), pre-norm LayerNorm,
{cfg['positional_embedding_type']} positions, context {cfg['n_ctx']} bytes, vocabulary the {cfg['d_vocab']} byte values)
trained on the Python standard library's own source. Every figure below was measured by the
command that wrote this file. There is no tokenizer: a prompt is its UTF-8 bytes
(`list(text.encode())`), and a NUL byte (id 0) separates files.

## How it was made

    {metadata['command']}

- seed {tr['seed']} (weights and batch order), {tr['steps']} steps of batch {tr['batch_size']} x {cfg['n_ctx']} bytes
  (windows at uniform random offsets of the training stream), AdamW lr {tr['lr']} (warm-up
  {tr['warmup_steps']}, cosine to 10%), weight decay {tr['weight_decay']}, gradient clip {tr['grad_clip']}
- training took {metadata['train_seconds']:.0f} s wall ({metadata['train_seconds'] / 60:.1f} min), {metadata['train_cpu_seconds']:.0f} s CPU, on
  {metadata['threads']} torch thread(s) ({metadata['machine']}; torch {metadata['torch']}). The machine's 2 cores were
  shared with other jobs, so wall time is longer than on an idle machine; the estimate made
  before training was {metadata['estimate_minutes']:.1f} min ({metadata['estimate_seconds_per_step']:.2f} s per step). The whole command took
  {metadata['total_seconds']:.0f} s wall.
"""


def _text_corpus(corpus: dict) -> str:
    """The text card's corpus section: which files, their checksum and the split."""
    return f"""## Corpus

The `.py` files of the standard library of the Python that ran the command
(Python {corpus['python_version']}, `{corpus['root']}`), outside `test/`, `tests/`,
`idlelib/` and `site-packages/`; none of it is copied into this repository
(`models/textcorpus.py`).

- {corpus['n_files']} files, {corpus['n_bytes']:,} bytes; checksum (SHA-256 over every relative path and file
  SHA-256, in sorted order) `{corpus['checksum']}`
- split: {corpus['split']}: {corpus['n_train_files']} training files ({corpus['n_train_bytes']:,} bytes with
  separators), {corpus['n_held_out_files']} held-out files ({corpus['n_held_out_bytes']:,} bytes)
- another Python version has other files: `interp.models.textcorpus.compare_corpus` says so and the
  held-out figures must then be measured again on the corpus found (`held_out_report`).
"""


def _text_held_out(metadata: dict) -> str:
    """The text card's held-out loss against the unigram and bigram baselines."""
    cfg, held = metadata["config"], metadata["held_out"]
    verdict = "meets" if held["ratio_to_bigram"] <= 0.75 else "does NOT meet"
    return f"""## Held-out loss

{held['n_windows']} non-overlapping windows of {cfg['n_ctx']} bytes evenly spaced over the held-out files,
{held['n_predicted']:,} predicted bytes (every byte after the first of a window). Baselines
fitted on the training split, {held['smoothing']}, scored on the same predicted bytes.

| model | bits per byte | bits per character |
|---|---|---|
| unigram (add-one) | {held['unigram_bits']:.3f} | {held['unigram_bits'] * held['bytes_per_char']:.3f} |
| bigram (add-one) | {held['bigram_bits']:.3f} | {held['bigram_bits'] * held['bytes_per_char']:.3f} |
| **{metadata['name']}** | **{held['bits_per_byte']:.3f}** | **{held['bits_per_char']:.3f}** |

The held-out text has {held['bytes_per_char']:.4f} bytes per character (nearly all ASCII), so bits per byte
and bits per character almost coincide. Ratio to the bigram baseline: {held['ratio_to_bigram']:.3f}, which
{verdict} the bar of 0.75. Final training loss (mean of the last 50 steps): {metadata['final_train_bits']:.3f} bits/byte.
"""


_TEXT_HEADS = """## Heads

The card claims no head roles: they are tested as claims (previous-token, induction on natural
and on planted repeats, duplicate-token), with controls, necessity and sufficiency, in
`notebooks/04_text_model.ipynb`.
"""


def write_text_card(path: Path, metadata: dict) -> None:
    """The stdlib-bytes card, written only from what the run recorded."""
    curve = f"## Loss curve\n\n{_curve_table(metadata['curve'])}\n"
    write_atomic(path, "\n".join([_text_made(metadata), _text_corpus(metadata["corpus"]), _text_held_out(metadata),
                                   curve, _TEXT_HEADS]))


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Train a small HookedGPT and write NAME.safetensors, NAME.json and NAME.md.",
        epilog="examples:\n"  # lines within 80 columns: `interp train -- --help` is tested at COLUMNS=80
               "  interp train --task induction --seed 0 \\\n"
               "      --out models/checkpoints/toy-induction\n"
               "  interp train --task stdlib-bytes --seed 0 --threads 2 \\\n"
               "      --out models/checkpoints/stdlib-bytes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--task", choices=get_args(TaskName), default="induction")
    parser.add_argument("--seed", type=whole(0, 2**32 - 1), default=0)
    parser.add_argument("--steps", type=whole(1), default=None,
                        help=f"optimiser steps (default {TrainConfig.steps} for induction, {TEXT_STEPS} for stdlib-bytes)")
    parser.add_argument("--batch-size", type=whole(1), default=None,
                        help=f"sequences per step (default {TrainConfig.batch_size} for induction, {TEXT_BATCH_SIZE} for stdlib-bytes)")
    parser.add_argument("--lr", type=real(0, above=True), default=None,
                        help=f"peak learning rate (default {TrainConfig.lr} for induction, {TEXT_LR} for stdlib-bytes)")
    parser.add_argument("--control-steps", type=whole(0), default=600,
                        help="steps for the fixed-length control recorded in the card (0: skip)")
    parser.add_argument("--control-prefix-len", type=whole(4, CONTROL_PREFIX_MAX, why=CONTROL_WHY), default=20)
    parser.add_argument("--threads", type=whole(1), default=1, help="torch threads (the figures depend on it)")
    parser.add_argument("--out", required=True, help="checkpoint path without suffix, e.g. models/checkpoints/toy-induction")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--corpus-root", default=None,
                        help="stdlib-bytes: the folder of .py files (default: this interpreter's standard library)")
    parser.add_argument("--max-minutes", type=real(0, above=True), default=TEXT_BUDGET_MINUTES,
                        help="stdlib-bytes: refuse before training when the measured estimate exceeds this")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not out.name or out.is_dir():
        parser.error(f"--out {args.out!r} names a folder; give the checkpoint's path without suffix, e.g. "
                     "models/checkpoints/toy-induction (NAME.safetensors, NAME.json and NAME.md are written).")
    if args.corpus_root is not None and not Path(args.corpus_root).is_dir():
        parser.error(f"--corpus-root {args.corpus_root!r} is not a folder; give a folder of .py files.")
    return args


def _command(argv: list[str] | None) -> str:
    """The command line a card records: `interp train` and the arguments given."""
    return " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.task == "stdlib-bytes":
        return main_text(args, argv)
    started, cpu_started = time.perf_counter(), time.process_time()
    train_cfg = TrainConfig(task=args.task, seed=args.seed, steps=args.steps or TrainConfig.steps,
                            batch_size=args.batch_size or TrainConfig.batch_size, lr=args.lr or TrainConfig.lr)
    model_cfg = toy_induction_config(seed=args.seed, model_name=Path(args.out).name)
    task = toy_induction_task(model_cfg)

    t0, cpu0 = time.perf_counter(), time.process_time()
    model, losses = train(model_cfg, train_cfg, task, progress=not args.no_progress)
    train_seconds, train_cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    results = measure_grid(model, evaluation_grid(task))
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
        control_results = measure_grid(control_model, grid)
        control = {"steps": args.control_steps, "seed": args.seed, "prefix_len": n,
                   "final_train_loss": round(sum(control_losses[-50:]) / len(control_losses[-50:]), 4),
                   "evaluation": control_results, "head_roles": head_roles(control_results)}

    metadata = {
        "name": Path(args.out).name,
        "command": _command(argv),
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
    write_toy_card(out.with_name(out.name + ".md"), metadata)
    print(f"wrote {out}.safetensors/.json/.md in {metadata['total_seconds']:.0f} s; "
          f"previous-token heads {roles['previous_token_heads']}, induction heads {roles['induction_heads']}")
    return 0


def main_text(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Train stdlib-bytes and write its checkpoint and card."""
    started = time.perf_counter()
    found = train_text(args)
    model = found.pop("model")
    metadata = {"name": Path(args.out).name,
                "command": _command(argv),
                "config": model.cfg.to_dict(), "threads": args.threads,
                "machine": f"{platform.machine()}, {platform.system()}", "torch": torch.__version__, **found}
    metadata["total_seconds"] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    save_checkpoint(model, out, metadata=metadata)
    write_text_card(out.with_name(out.name + ".md"), metadata)
    held = metadata["held_out"]
    print(f"wrote {out}.safetensors/.json/.md in {metadata['total_seconds']:.0f} s; held-out {held['bits_per_byte']:.3f} "
          f"bits/byte (unigram {held['unigram_bits']:.3f}, bigram {held['bigram_bits']:.3f}, "
          f"ratio {held['ratio_to_bigram']:.3f}); training {metadata['train_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
