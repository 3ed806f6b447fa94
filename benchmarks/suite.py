"""The device suite: `python -m benchmarks --device cuda [--out DIR] [--dry-run] [--limit-s S]`.

One short script for a lent GPU (at most 15 minutes of device time, start-up included, so it
caps itself at about 5 minutes: `--limit-s` per section, 60 by default), in sections, each
writing `DIR/<section>.json` as soon as it ends (and `DIR/suite.json`, the index, after every
section), so a run cut short still leaves what it measured. For each of float32 and bfloat16:

- forward: plain SDPA GPT, HookedGPT with no hooks and caching every attention hook, and
  TransformerLens's bridge with and without its attention cache; the ratios the targets name
  (no hooks / plain <= 1.05, attention cache / no hooks <= 1.15, ours / bridge caching attention
  <= 0.9), tokens/s and peak memory (CUDA: `max_memory_allocated`; CPU: not measured here, see
  bench_forward's fresh-process probe);
- positional: every positional metric of every head (`focus_per_prompt`) against
  TransformerLens's `detect_head` (one detector, one prompt a call), tokens/s;
- importance: every single-head mean ablation, resumed from the cached residual stream
  (`AblationEngine`) vs heads batched in one forward vs one forward per head;
- leakage: one forward and the incremental reference of the leakage audit at 1,024 tokens on a
  GPT-2-small shape;
- scaling: positional metrics on 1 and 2 processes (rank 0's compute time, which ends with the
  all-reduce, so it waits for the slower rank; wall time includes starting the second process);
  NCCL on two GPUs when two are present, otherwise the same plumbing with gloo on the CPU (one
  chip: the 2-GPU path is not measured).

Shapes: GPT-2 small (12 x 768, 12 heads, vocab 50,257) on a device; `--dry-run` runs every
section at a tiny shape on any device (the CPU by default), for the plumbing: it is what the
test suite runs (tests/benchmarks/test_suite.py), in seconds. Timings are medians of interleaved
rounds (`benchmarks.common.interleaved`), synchronising the device after each call.

On the GPU machine (torch with CUDA, no transformer-lens, no network) carry wheels of what it
lacks and install them first, e.g. `pip install --no-index --find-links wheels/ transformer-lens`;
then `python -m benchmarks --device cuda --out $OUT`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

GPT2_SMALL = dict(n_layers=12, d_model=768, n_heads=12, d_vocab=50257, n_ctx=1024, d_mlp=3072, seed=0)
TINY = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=64, n_ctx=64, d_mlp=64, seed=0)
SECTIONS = ("forward", "positional", "importance", "leakage", "scaling")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Sizes:
    """How big each section's work is."""

    model: dict  # HookedGPT config of every section but leakage
    batch: int  # forward: sequences a call
    seq: int  # tokens a sequence (forward, positional, importance, scaling)
    leak_model: dict  # the leakage section's model
    leak_len: int  # tokens a prompt in the leakage section
    prompts: int  # positional / importance / scaling prompts
    detect_prompts: int  # prompts detect_head sees (one forward each)
    repeats: int  # interleaved timed rounds
    dtypes: tuple[str, ...] = tuple(DTYPES)


FULL = Sizes(model=GPT2_SMALL, batch=16, seq=256, leak_model=GPT2_SMALL, leak_len=1024, prompts=64, detect_prompts=8,
             repeats=5)
DRY = Sizes(model=TINY, batch=2, seq=16, leak_model=TINY, leak_len=32, prompts=4, detect_prompts=2, repeats=1)


@dataclass
class Context:
    device: torch.device
    sizes: Sizes
    out: Path
    limit_s: float
    results: dict[str, Any] = field(default_factory=dict)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class SectionTimeout(Exception):
    """A section ran past its limit (`--limit-s`)."""


@contextlib.contextmanager
def _limit(seconds: float) -> Iterator[None]:
    """Raise SectionTimeout in the main thread after `seconds` (SIGALRM; no limit where it is missing)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(_signum, _frame):
        raise SectionTimeout(f"past its limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _timed(ctx: Context, candidates: dict[str, Callable[[], object]], tokens: int) -> dict[str, dict]:
    """Median seconds (interleaved rounds, device synchronised), tokens/s and peak memory per candidate."""
    from benchmarks.common import interleaved

    def synced(fn):
        def run():
            fn()
            ctx.sync()
        return run

    peaks = {}
    for name, fn in candidates.items():  # one untimed call each: the warm-up, and the peak memory
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
            before = torch.cuda.memory_allocated(ctx.device)
        synced(fn)()
        peaks[name] = (torch.cuda.max_memory_allocated(ctx.device) - before) / 2**20 if ctx.device.type == "cuda" else None
    timings = interleaved({n: synced(f) for n, f in candidates.items()}, repeats=ctx.sizes.repeats, warmup=0)
    return {name: {"median_s": t.median_s, "min_s": t.min_s, "tokens_per_s": tokens / t.median_s,
                   "peak_mib": peaks[name]} for name, t in timings.items()}


def _ratios(rows: dict[str, dict], pairs: list[tuple[str, str, str, float | None]]) -> list[dict]:
    out = []
    for label, numerator, denominator, target in pairs:
        if numerator in rows and denominator in rows:
            value = rows[numerator]["median_s"] / rows[denominator]["median_s"]
            out.append({"comparison": label, "ratio": value, "target": target,
                        "met": None if target is None else value <= target})
    return out


def _model(ctx: Context, config: dict, dtype: torch.dtype):
    from interp.models import GPTConfig, HookedGPT

    return HookedGPT(GPTConfig(**config)).eval().to(ctx.device, dtype)


def _per_dtype(ctx: Context, measure: Callable[[Context, torch.dtype], dict]) -> dict:
    """`measure(ctx, dtype)` for each dtype of the run, by name (one call per dtype: the closures it times
    bind that dtype's model and inputs)."""
    return {dtype_name: measure(ctx, DTYPES[dtype_name]) for dtype_name in ctx.sizes.dtypes}


def section_forward(ctx: Context) -> dict:
    return _per_dtype(ctx, _forward)


def _forward(ctx: Context, dtype: torch.dtype) -> dict:
    from benchmarks.bench_forward import PlainGPT
    from interp.hooks import attention_sites

    sizes = ctx.sizes
    model = _model(ctx, sizes.model, dtype)
    plain = PlainGPT(model)
    tokens = torch.randint(0, sizes.model["d_vocab"], (sizes.batch, sizes.seq),
                           generator=torch.Generator().manual_seed(0)).to(ctx.device)
    ours = {name for site in attention_sites(model) for name in site.hooks.values()}
    candidates: dict[str, Callable[[], object]] = {
        "plain GPT (SDPA)": lambda: plain(tokens),
        "HookedGPT, no hooks": lambda: model(tokens),
        "HookedGPT, attention cache": lambda: model.run_with_cache(tokens, names_filter=lambda n: n in ours),
    }
    notes = []
    try:
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_native(model.cfg.to_bridge_config()).eval().to(ctx.device, dtype)
        theirs = {name for site in attention_sites(bridge) for name in site.hooks.values()}
        candidates["bridge, no hooks"] = lambda: bridge(tokens)
        candidates["bridge, attention cache"] = lambda: bridge.run_with_cache(tokens, names_filter=lambda n: n in theirs)
    except Exception as error:  # no transformer-lens bridge on this machine: the other figures still count
        notes.append(f"bridge skipped: {type(error).__name__}: {error}")
    with torch.no_grad():
        rows = _timed(ctx, candidates, sizes.batch * sizes.seq)
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in ours)
    return {
        "rows": rows, "notes": notes, "cache_hooks": len(cache), "shape": [sizes.batch, sizes.seq],
        "ratios": _ratios(rows, [
            ("HookedGPT no hooks / plain GPT", "HookedGPT, no hooks", "plain GPT (SDPA)", 1.05),
            ("HookedGPT attention cache / no hooks", "HookedGPT, attention cache", "HookedGPT, no hooks", 1.15),
            ("HookedGPT / bridge, attention cache", "HookedGPT, attention cache", "bridge, attention cache", 0.9),
            ("HookedGPT / bridge, no hooks", "HookedGPT, no hooks", "bridge, no hooks", None),
        ]),
    }


def section_positional(ctx: Context) -> dict:
    return _per_dtype(ctx, _positional)


def _positional(ctx: Context, dtype: torch.dtype) -> dict:
    from transformer_lens.head_detector import detect_head

    from interp.analyses.positional import focus_per_prompt
    from interp.data import random_tokens

    sizes = ctx.sizes
    model = _model(ctx, sizes.model, dtype)
    prompts = random_tokens(sizes.prompts, sizes.seq, sizes.model["d_vocab"], seed=0)
    detect = prompts.tokens[: sizes.detect_prompts].to(ctx.device)
    rows = _timed(ctx, {"ours (every metric, every head)": lambda: focus_per_prompt(model, prompts, batch_size=16)},
                  sizes.prompts * sizes.seq)
    rows.update(_timed(ctx, {"detect_head (one detector)": lambda: [detect_head(model, row[None], "previous_token_head")
                                                                      for row in detect]},
                       sizes.detect_prompts * sizes.seq))
    speedup = rows["ours (every metric, every head)"]["tokens_per_s"] / rows["detect_head (one detector)"]["tokens_per_s"]
    return {"rows": rows, "tokens_per_s_ours_over_detect_head": speedup}


def section_importance(ctx: Context) -> dict:
    return _per_dtype(ctx, _importance)


def _importance(ctx: Context, dtype: torch.dtype) -> dict:
    from interp.ablation import AblationEngine
    from interp.data import random_tokens
    from interp.interventions import HeadAblation, all_heads, reference_activations
    from interp.interventions.ablation import _batched_head_ablations  # internal: Run's strategy "batched"

    sizes = ctx.sizes
    model = _model(ctx, sizes.model, dtype)
    prompts = random_tokens(sizes.prompts, sizes.seq, sizes.model["d_vocab"], seed=0)
    heads = all_heads(model)
    reference = reference_activations(model, prompts, site="z")
    tokens = prompts.tokens.to(ctx.device)
    found: dict[str, torch.Tensor] = {}

    def per_head() -> None:
        clean = model(tokens, return_type="loss", loss_per_token=True).mean(-1)
        losses = [model.run_with_hooks(tokens, return_type="loss", loss_per_token=True,
                                       fwd_hooks=HeadAblation((head,), "mean").hooks(model, reference)).mean(-1)
                  for head in heads]
        found["per head"] = (torch.stack(losses).double() - clean.double()).cpu()

    def resumed() -> None:
        engine = AblationEngine(model, prompts, "mean", reference=reference, batch_size=len(prompts))
        clean, ablated = engine._losses([[h] for h in heads])
        found["resumed"] = (ablated - clean).cpu()

    def batched() -> None:
        clean = model(tokens, return_type="loss", loss_per_token=True).mean(-1)
        ablated = _batched_head_ablations(model, prompts, heads, "mean", reference=reference, chunk_size=8,
                                          return_type="loss", loss_per_token=True).mean(-1)
        found["batched"] = (ablated.double() - clean.double()).cpu()

    with torch.no_grad():
        rows = _timed(ctx, {"one forward per head": per_head, "resumed": resumed, "batched heads": batched},
                      len(heads) * sizes.prompts * sizes.seq)
    return {
        "rows": rows, "heads": len(heads),
        "max_abs_difference": {name: float((found[name].float() - found["per head"].float()).abs().max())
                               for name in ("resumed", "batched")},
        "ratios": _ratios(rows, [("resumed / one forward per head", "resumed", "one forward per head", None),
                                 ("batched / one forward per head", "batched heads", "one forward per head", None)]),
    }


def section_leakage(ctx: Context) -> dict:
    return _per_dtype(ctx, _leakage)


def _leakage(ctx: Context, dtype: torch.dtype) -> dict:
    from interp.analyses import leakage
    from interp.analyses.leakage import fast as leakage_fast
    from interp.analyses.leakage.methods import _prompts

    sizes = ctx.sizes
    model = _model(ctx, sizes.leak_model, dtype)
    adapter = leakage.ModelAdapter(model)
    tokens = _prompts(2, sizes.leak_len, sizes.leak_model["d_vocab"], 0).to(ctx.device)
    with torch.no_grad():
        rows = _timed(ctx, {
            "forward": lambda: adapter(tokens),
            "incremental reference": lambda: leakage_fast.incremental_rows(model, adapter, tokens, leakage.DEFAULT_TOL),
        }, 2 * sizes.leak_len)
    return {"rows": rows, "tokens": sizes.leak_len,
            "ratios": _ratios(rows, [("incremental / forward", "incremental reference", "forward", None)])}


def _scaling_worker(config: dict, n_prompts: int, seq: int, device_type: str):
    """One rank: positional metrics on its shard of the prompts; (compute seconds, merged result)."""
    from interp import distributed
    from interp.analyses.positional import focus_per_prompt
    from interp.data import random_tokens
    from interp.models import GPTConfig, HookedGPT

    device = torch.device("cpu")
    torch.set_num_threads(1)  # every rank alike, one thread each (a CPU run shares the machine's cores)
    if device_type == "cuda":
        rank = torch.distributed.get_rank() if distributed.active() else 0
        device = torch.device("cuda", rank)
    model = HookedGPT(GPTConfig(**config)).eval().to(device)
    prompts = random_tokens(n_prompts, seq, config["d_vocab"], seed=0)
    focus_per_prompt(model, prompts[:2], batch_size=2)  # warm-up outside the timing
    if distributed.active():
        torch.distributed.barrier()
    start = time.perf_counter()
    result = focus_per_prompt(model, prompts, batch_size=16)
    if device_type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, {name: value.detach().cpu().clone() for name, value in result.items()}


def section_scaling(ctx: Context) -> dict:
    from interp.distributed import spawn_local

    two_gpus = ctx.device.type == "cuda" and torch.cuda.device_count() >= 2
    backend, device_type = ("nccl", "cuda") if two_gpus else ("gloo", "cpu")
    args = (ctx.sizes.model, ctx.sizes.prompts, ctx.sizes.seq, device_type)
    rows, merged, threads = {}, {}, torch.get_num_threads()
    for workers in (1, 2):  # 1: in this process; 2: rank 0 here and one spawned rank, results all-reduced
        start = time.perf_counter()
        seconds, merged[workers] = spawn_local(_scaling_worker, args, workers=workers, backend=backend, threads=1,
                                               timeout_s=ctx.limit_s)
        rows[workers] = {"compute_s": seconds, "wall_s": time.perf_counter() - start}
    torch.set_num_threads(threads)
    equal = all(torch.allclose(merged[1][n], merged[2][n], rtol=1e-5, atol=1e-7, equal_nan=True) for n in merged[1])
    return {"backend": backend, "device": device_type, "measured_on_gpus": two_gpus,
            "note": None if two_gpus else "fewer than two GPUs: the 2-process path ran with gloo on the CPU (plumbing only)",
            "rows": {str(w): r for w, r in rows.items()}, "speedup": rows[1]["compute_s"] / rows[2]["compute_s"],
            "equal_to_one_process": equal}


RUNNERS: dict[str, Callable[[Context], dict]] = {
    "forward": section_forward, "positional": section_positional, "importance": section_importance,
    "leakage": section_leakage, "scaling": section_scaling,
}


def _write(ctx: Context, name: str, document: dict) -> None:
    from interp.models.files import write_atomic

    write_atomic(ctx.out / f"{name}.json", json.dumps(document, indent=2, default=str) + "\n")


def run_suite(device: str, out: str | os.PathLike, *, dry_run: bool = False, limit_s: float = 60.0,
              sections: tuple[str, ...] = SECTIONS) -> dict[str, Any]:
    """Run `sections` on `device`, writing each one's JSON under `out` as it ends; returns the index.

    A section that fails or runs past `limit_s` is recorded as such (status, error) and the next one
    runs; `dry_run` uses the tiny shape (every section, the plumbing, in seconds)."""
    from interp.errors import BadInput

    unknown = [s for s in sections if s not in RUNNERS]
    if unknown:
        raise BadInput(f"unknown benchmark section(s) {unknown}; expected some of {list(SECTIONS)}.")
    target = torch.device(device)
    if target.type == "cuda" and not torch.cuda.is_available():
        raise BadInput(f"--device {device}: CUDA is not available here; run on a machine with a GPU, or use "
                       "--device cpu --dry-run to check the plumbing.")
    sizes = DRY if dry_run else FULL
    ctx = Context(target, sizes, Path(out), limit_s)
    ctx.out.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {"device": str(target), "dry_run": dry_run, "torch": torch.__version__,
                             "gpu": torch.cuda.get_device_name(target) if target.type == "cuda" else None,
                             "sizes": asdict(sizes), "limit_s": limit_s, "sections": {}}
    for name in sections:
        start = time.perf_counter()
        try:
            with _limit(limit_s):
                document = {"status": "ok", **RUNNERS[name](ctx)}
        except SectionTimeout as error:
            document = {"status": "timed out", "error": str(error)}
        except Exception as error:  # one broken section must not hide the others' figures
            document = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
        document["seconds"] = time.perf_counter() - start
        _write(ctx, name, document)
        index["sections"][name] = {"status": document["status"], "seconds": document["seconds"]}
        _write(ctx, "suite", index)
        print(f"{name}: {document['status']} in {document['seconds']:.1f} s" +
              (f" ({document['error']})" if "error" in document else ""), flush=True)
        _print_ratios(document)
    return index


def _print_ratios(document: dict) -> None:
    for dtype_name, part in document.items():
        if isinstance(part, dict) and "ratios" in part:
            for row in part["ratios"]:
                target = "" if row["target"] is None else f" (target <= {row['target']}: {'met' if row['met'] else 'NOT met'})"
                print(f"  {dtype_name}: {row['comparison']} = {row['ratio']:.2f}x{target}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, help="cuda, cuda:1, cpu ...")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-results"),
                        help="folder for the results (default $OUT, else ./benchmark-results)")
    parser.add_argument("--dry-run", action="store_true", help="every section at a tiny shape (the plumbing)")
    parser.add_argument("--limit-s", type=float, default=60.0, help="seconds a section may take (default 60)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {','.join(SECTIONS)}")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    index = run_suite(args.device, args.out, dry_run=args.dry_run, limit_s=args.limit_s,
                      sections=tuple(s for s in args.sections.split(",") if s))
    failed = [name for name, row in index["sections"].items() if row["status"] != "ok"]
    print(f"results under {args.out}" + (f"; not ok: {failed}" if failed else ""), flush=True)
    return 1 if failed else 0
