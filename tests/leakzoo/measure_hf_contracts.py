"""What `transformers` really does under the four contracts (issue 40, "Measure first"): tiny random Llama,
Qwen2, Mistral (`sliding_window=4`) and GPT-2 models, under eager, sdpa and flex_attention, judged by the
explicit-mask references of `leakzoo.references` (float64 where the model casts).

    PYTHONPATH=.:tests OMP_NUM_THREADS=1 python -m leakzoo.measure_hf_contracts
    PYTHONPATH=.:tests OMP_NUM_THREADS=1 python -m leakzoo.measure_hf_contracts --flex compiled --json rows.json

FlexAttention runs unfused (eager) by default: transformers wraps it in `torch.compile`, which on CPU takes
no float64 and compiles for about half a minute per shape, so the default run sets torch's compiler stance to
"force_eager" while a FlexAttention model runs; `--flex compiled` measures the compiled path as transformers
calls it (float32, minutes). Prints a markdown table: one row per model, implementation and contract run,
with the verdict, the largest relative change of a protected output, and the first finding.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace

import torch
import transformers

from leakzoo import references
from leakzoo.references import Layout, Reference

VOCAB, WIDTH, LAYERS, HEADS, KV_HEADS, CONTEXT = 64, 32, 2, 4, 2, 64
EOS = 1
WINDOW = 4
FAMILIES = ("llama", "qwen2", "mistral", "gpt2")
INNER_EOS = 12  # an EOS inside the third document of the layout (5, 4, 7): transformers must not cut there
# measured with torch 2.13 CPU: `torch.compile(flex_attention)` with a `score_mod` reading a captured tensor (what
# transformers does with a 4D mask) aborts the process ("double free or corruption"), with or without transformers
COMPILED_SCORE_MOD_ABORTS = "compiled flex_attention on CPU aborts the process when score_mod reads a tensor (torch 2.13)"


@dataclass(frozen=True)
class Row:
    model: str
    implementation: str
    contract: str
    run: str
    verdict: str  # "clean", the kinds found ("document", "kv_cache, future"...), or "n/a: why"
    max_influence: float | None
    first: str
    dtype: str


def build(family: str, implementation: str) -> torch.nn.Module:
    """A tiny random model of `family` under `implementation`, the same weights for every implementation, in
    evaluation mode; no dropout, so that training mode is deterministic too."""
    torch.manual_seed(1234)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=WIDTH, n_layer=LAYERS,
                                         n_head=HEADS, bos_token_id=0, eos_token_id=EOS, resid_pdrop=0.0,
                                         embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation=implementation)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config_class, model_class = {
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        }[family]
        extra = {"sliding_window": WINDOW} if family == "mistral" else {}
        config = config_class(vocab_size=VOCAB, max_position_embeddings=CONTEXT, hidden_size=WIDTH,
                              num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                              intermediate_size=2 * WIDTH, bos_token_id=0, eos_token_id=EOS,
                              attn_implementation=implementation, **extra)
        model = model_class(config)
    with torch.no_grad():  # N(0, 0.15), norm gains 1 + N(0, 0.15): attention far from uniform
        for name, param in model.named_parameters():
            gain = param.ndim == 1 and name.endswith("weight")
            param.copy_(torch.randn(param.shape) * 0.15 + (1.0 if gain else 0.0))
    return model.eval()


class ExplicitDocumentMask(torch.nn.Module):
    """The packed call with an explicit 4D mask (causal inside each document of `layout`, in the model's dtype,
    0 / the dtype's minimum), which transformers takes as given: the way to pack that needs no packing path."""

    def __init__(self, model: torch.nn.Module, layout: Layout):
        super().__init__()
        self.model, self.config, self.layout = model, model.config, layout

    def forward(self, input_ids, position_ids=None, use_cache=None):
        dtype = next(self.model.parameters()).dtype
        n = input_ids.shape[1]
        document = self.layout.documents() if len(self.layout.documents()) == n else torch.zeros(n)  # else one document
        allowed = (document[:, None] == document[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
        mask = torch.zeros(n, n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        return self.model(input_ids=input_ids, position_ids=position_ids, use_cache=use_cache,
                          attention_mask=mask.expand(input_ids.shape[0], 1, n, n))


def _first(reference: Reference, run: str) -> str:
    hits = [f for f in reference.findings if f.run == run]
    if not hits:
        return ""
    f = min(hits, key=lambda f: (f.query, -1 if f.key is None else f.key))
    return f"{f.kind}: query {f.query}" + ("" if f.key is None else f" from key {f.key}")


def rows_of(model_name: str, implementation: str, reference: Reference) -> list[Row]:
    rows = []
    for run in reference.runs:
        kinds = sorted({f.kind for f in reference.findings if f.run == run})
        rows.append(Row(model_name, implementation, reference.contract, run, ", ".join(kinds) or "clean",
                        reference.influence_in(run), _first(reference, run), reference.dtype))
    return rows


def measure_model(family: str, implementation: str, flex: str = "eager") -> list[Row]:
    """Documents (evaluation and training mode, and with an explicit 4D mask), KV cache and, where the config
    declares them, windows of one model under one implementation."""
    try:
        model = build(family, implementation)
    except (ValueError, ImportError) as error:  # transformers refuses the implementation for this family
        reason = str(error).split(". ")[0]
        return [Row(family, implementation, "all", "-", f"n/a: {reason}", None, "", "")]
    layout = Layout(inner_eos=(INNER_EOS,), eos=EOS)
    rows = rows_of(family, implementation, references.documents(model, layout))
    training = references.documents(build(family, implementation).train(), layout)  # no dropout: deterministic
    rows += [replace(r, run=f"train(), {r.run}") for r in rows_of(family, implementation, training)]
    rows += _explicit_mask_rows(family, implementation, model, layout, flex)
    rows += rows_of(family, implementation, references.kv_cache(model))
    if any(references.declared_windows(model)):
        rows += rows_of(family, implementation, references.windows(model, lengths=(3, 12)))
    return rows


def _explicit_mask_rows(family: str, implementation: str, model, layout: Layout, flex: str) -> list[Row]:
    """The documents (and windows) of the packed call with an explicit 4D mask."""
    if implementation == "flex_attention" and flex == "compiled":  # a crash cannot be caught: said, not run
        return [Row(family, implementation, "document", "4D mask", f"n/a: {COMPILED_SCORE_MOD_ABORTS}", None, "", "")]
    wrapped = ExplicitDocumentMask(model, layout)
    rows = [replace(r, run=f"4D mask, {r.run}") for r in rows_of(family, implementation, references.documents(wrapped, layout))]
    if any(references.declared_windows(model)):
        explicit = references.windows(wrapped, lengths=(3, 12))
        rows += [replace(r, run=f"4D mask, {r.run}") for r in rows_of(family, implementation, explicit)]
    return rows


def measure_backends(family: str) -> list[Row]:
    """Every implementation the family takes, against eager and each causal."""
    usable = []
    for implementation in references.IMPLEMENTATIONS:
        try:
            build(family, implementation)
            usable.append(implementation)
        except (ValueError, ImportError):
            continue
    return rows_of(family, "+".join(usable), references.backends(build(family, "eager"), tuple(usable)))


def stance(flex: str):
    """FlexAttention unfused unless asked for the compiled path (see the module docstring). Compiled, dynamo's
    recompile limit (8) is raised, else the shapes past it would run unfused without a word."""
    if flex == "eager":
        return torch.compiler.set_stance("force_eager")
    return torch._dynamo.config.patch(recompile_limit=256, accumulated_recompile_limit=4096)


def measure(families=FAMILIES, implementations=references.IMPLEMENTATIONS, flex: str = "eager") -> list[Row]:
    rows: list[Row] = []
    for family in families:
        with stance(flex):
            for implementation in implementations:
                rows += measure_model(family, implementation, flex)
            rows += measure_backends(family) if len(implementations) > 1 else []
    return rows


def markdown(rows: list[Row]) -> str:
    lines = ["| model | implementation | contract | run | verdict | max influence | first finding | dtype |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        size = "" if r.max_influence is None else f"{r.max_influence:.1e}"
        lines.append(f"| {r.model} | {r.implementation} | {r.contract} | {r.run} | {r.verdict} | {size} | {r.first} "
                     f"| {r.dtype} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, of " + ", ".join(FAMILIES))
    parser.add_argument("--implementations", default=",".join(references.IMPLEMENTATIONS))
    parser.add_argument("--flex", choices=("eager", "compiled"), default="eager",
                        help="FlexAttention unfused (float64, seconds) or compiled as transformers calls it (minutes)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    rows = measure(tuple(args.families.split(",")), tuple(args.implementations.split(",")), args.flex)
    print(markdown(rows))
    print(f"\n{len(rows)} rows in {time.perf_counter() - start:.0f} s (torch {torch.__version__}, "
          f"transformers {transformers.__version__}, FlexAttention {args.flex})", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump([asdict(r) for r in rows], out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
