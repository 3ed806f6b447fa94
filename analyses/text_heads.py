"""The heads of `stdlib-bpe`, found and tested by the toolkit on held-out text, written into its card.

    python -m interp.analyses.text_heads models/checkpoints/stdlib-bpe

measures, on held-out windows of the standard library that the model never trained on:
- per-head induction, duplicate-token and previous-token scores with CIs (`induction.scores`,
  `positional.focus`) on natural windows (repeats as they occur) and on repeated spans;
- `claims.scan` on the natural windows: a claim proposed for every head on half of them, tested with
  its role's evidence (observational vs shuffled-token and random-init controls, necessity,
  sufficiency, faithfulness) on the other half; and the same on the repeated spans, the setting
  induction is defined on;
- `copying.copy_gap_ablation`: the fraction of the copy gap of repeated held-out spans removed by
  ablating the heads scan proposed as induction heads (and did not refute) together, against every set of as
  many other heads; and, when scan refuted some of its proposals, of every head it proposed (a weaker
  induction head can back up a stronger one, so that removing the stronger alone leaves copying behind);
then stores the tables in the checkpoint's metadata (`metadata.heads`) and rewrites its card.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from interp.analyses import copying, induction, positional
from interp.analyses.claims import scan
from interp.behaviour import next_token_description
from interp.data import PromptSet, Repeats
from interp.errors import BadInput
from interp.experiments import stdlib_bpe
from interp.models.gpt import HookedGPT
from interp.models.io import load_checkpoint, read_checkpoint_config, save_checkpoint
from interp.models.textcorpus import named_corpus
from interp.models.tokenizers import BPETokenizer


@dataclass(frozen=True)
class HeldOutPrompts:
    natural: PromptSet  # windows of held-out files; repeats wherever a token occurred before
    repeated: PromptSet  # held-out text, a held-out span, the span again

    @classmethod
    def build(cls, model: HookedGPT, n: int = 128, seed: int = 23) -> "HeldOutPrompts":
        """`n` natural windows and `n` repeated spans of the held-out files, tokenized by the model's own BPE."""
        tokenizer = model.tokenizer
        if not isinstance(tokenizer, BPETokenizer):
            raise BadInput(f"held-out stdlib prompts need a model with stdlib-bpe's tokenizer (a BPETokenizer); this "
                           f"model's is {type(tokenizer).__name__}. Load it with interp.load('stdlib-bpe') or a checkpoint "
                           "written by interp train stdlib-bpe finish.")
        recipe = getattr(model, "metadata", {}).get("recipe", {})
        corpus = named_corpus(recipe.get("corpus", "stdlib"))
        held_out = stdlib_bpe.encode_stream(tokenizer, corpus.held_out)  # the training files are not needed here
        separator = tokenizer.token_id(stdlib_bpe.SEPARATOR_TOKEN)
        probes = stdlib_bpe.Probes.build(held_out, model.cfg.n_ctx, separator, n=n, seed=seed)
        natural = PromptSet(probes.natural, meta={"kind": "held-out text"}, repeats=Repeats(match_len=1))
        repeated = PromptSet(probes.repeated, meta={"kind": "held-out span repeated"},
                             repeats=Repeats(period=probes.span, offset=probes.offset, n_repeats=2))
        return cls(natural, repeated)


@dataclass(frozen=True)
class HeadEvidence:
    scores: pd.DataFrame  # one row per head and prompt kind: induction, duplicate_token, prev_token with CIs
    verdicts: pd.DataFrame  # scan's table on the natural windows
    induction_heads: tuple[str, ...]  # heads scan proposed as induction heads and did not refute (the heads ablated)
    ablation: pd.DataFrame  # copy_gap_ablation: the induction heads, then the control sets
    copy: pd.DataFrame  # copy_gap on the repeated spans
    proposed_heads: tuple[str, ...] = ()  # every head scan proposed as an induction head, refuted or not
    proposed_ablation: pd.DataFrame | None = None  # copy_gap_ablation of those, when they are more than induction_heads
    span_verdicts: pd.DataFrame | None = None  # scan's table on the repeated spans (the setting induction is defined on)


def head_evidence(model: nn.Module, prompts: HeldOutPrompts, *, seed: int = 0, batch_size: int = 16) -> HeadEvidence:
    scores = []
    for name, prompt_set in (("natural", prompts.natural), ("repeated span", prompts.repeated)):
        frame = induction.scores(model, prompt_set, batch_size=batch_size)
        focus = positional.focus(model, prompt_set, batch_size=batch_size)
        frame = frame.merge(focus[["layer", "head", "prev_token", "prev_token_ci_low", "prev_token_ci_high"]],
                            on=["layer", "head"])
        scores.append(frame.assign(prompts=name))
    verdicts = scan(model, prompts.natural, seed=seed, batch_size=batch_size)
    span_verdicts = scan(model, prompts.repeated, seed=seed, batch_size=batch_size)
    proposed = verdicts[verdicts["claim"] == "induction"]
    every = tuple(f"L{int(r.layer)}H{int(r.head)}" for r in proposed.itertuples())
    heads = tuple(f"L{int(r.layer)}H{int(r.head)}" for r in proposed.itertuples() if r.verdict != "refuted")

    def ablate(chosen: tuple[str, ...]) -> pd.DataFrame:
        return copying.copy_gap_ablation(model, prompts.repeated, list(chosen), batch_size=batch_size, seed=seed)

    return HeadEvidence(pd.concat(scores, ignore_index=True), verdicts, heads, ablate(heads) if heads else pd.DataFrame(),
                        copying.copy_gap(model, prompts.repeated, batch_size=batch_size), every,
                        ablate(every) if len(every) > len(heads) else None, span_verdicts)


def _num(value: float) -> str:
    return f"{value:.3f}"


def render_heads_section(evidence: HeadEvidence, prompts: HeldOutPrompts) -> str:
    """The card's Heads section, from the evidence tables."""
    natural_n, repeated_n = len(prompts.natural), len(prompts.repeated)
    lines = ["## Heads", "",
             f"Measured by `python -m interp.analyses.text_heads` on {natural_n} held-out windows of "
             f"{prompts.natural.n_pos} tokens (repeats as they occur in the text) and {repeated_n} held-out spans repeated once "
             "(never trained on).", "",
             "### Scores (mean attention, 95% bootstrap CI)", "",
             "| head | induction, natural | induction, repeated span | duplicate-token, natural | previous-token, natural |",
             "|---|---|---|---|---|"]
    natural = evidence.scores[evidence.scores["prompts"] == "natural"].set_index(["layer", "head"])
    spans = evidence.scores[evidence.scores["prompts"] == "repeated span"].set_index(["layer", "head"])
    for (layer, head), row in natural.iterrows():
        span = spans.loc[(layer, head)]
        lines.append(f"| L{layer}H{head} | {_num(row['induction'])} [{_num(row['induction_ci_low'])}, "
                     f"{_num(row['induction_ci_high'])}] | {_num(span['induction'])} [{_num(span['induction_ci_low'])}, "
                     f"{_num(span['induction_ci_high'])}] | {_num(row['duplicate_token'])} | {_num(row['prev_token'])} "
                     f"[{_num(row['prev_token_ci_low'])}, {_num(row['prev_token_ci_high'])}] |")
    lines += ["", "### Claims (`claims.scan` on the natural windows: proposed on half, tested on the other half)", "",
              f"The causal evidence (necessity, sufficiency, faithfulness) scores the {next_token_description(prompts.natural)}: the "
              "predictions an earlier occurrence makes possible (`Repeats.query_mask`).", "",
              *_claims_table(evidence.verdicts)]
    if evidence.span_verdicts is not None:
        lines += ["", "### Claims on the repeated spans (`claims.scan` again: proposed on half, tested on the other half)", "",
                  "Induction is defined on a repeated sequence (Olsson et al. 2022): here each span's second copy follows "
                  "its first. On natural windows a repeat is any earlier occurrence of the query's token, often not "
                  "followed by the same next token, so the idealised pattern a claim substitutes describes the head "
                  "less well there.", "", *_claims_table(evidence.span_verdicts)]
    copy = evidence.copy.iloc[0]
    lines += ["", "### Copying and the induction heads", "",
              f"On the repeated spans the second copy costs {_num(copy['ratio'])} of the first "
              f"[{_num(copy['ratio_ci_low'])}, {_num(copy['ratio_ci_high'])}] (first {_num(copy['first_copy'])}, "
              f"second {_num(copy['second_copy'])} nats/token; copy gap {_num(copy['gap'])} nats)."]
    said = {f"L{int(r.layer)}H{int(r.head)}": r.verdict for r in evidence.verdicts.itertuples() if r.claim == "induction"}
    if evidence.ablation.empty:
        lines += ["", "`scan` proposed no induction head that it did not refute, so there is no set of induction heads to ablate."]
    else:
        lines += ["", _ablation_text(evidence.ablation, "the heads `scan` proposed as induction heads and did not refute",
                                     evidence.induction_heads, said), "", *_ablation_table(evidence.ablation)]
    if evidence.proposed_ablation is not None:
        lines += ["", _ablation_text(evidence.proposed_ablation, "every head `scan` proposed as an induction head, refuted "
                                     "or not", evidence.proposed_heads, said) + _backup_text(evidence), "",
                  *_ablation_table(evidence.proposed_ablation)]
    return "\n".join(lines) + "\n"


def _claims_table(verdicts: pd.DataFrame) -> list[str]:
    lines = ["| claim | verdict | observational [CI] | necessity [CI] | sufficiency [CI] | evidence that failed / undecided |",
             "|---|---|---|---|---|---|"]
    for row in verdicts.itertuples():
        lines.append(f"| {row.statement} | {row.verdict} | {_cell(row, 'observational')} | {_cell(row, 'necessity')} | "
                     f"{_cell(row, 'sufficiency')} | {_failed(row)} |")
    return lines


def _ablation_text(frame: pd.DataFrame, which: str, heads: tuple[str, ...], said: dict[str, str]) -> str:
    claimed = frame[~frame["control"]].iloc[0]
    controls = frame[frame["control"]]
    random_set = copying.random_set_effect(frame)
    best = controls.loc[controls["removed"].idxmax()]
    verdict = ("Its CI's lower bound clears the random-set effect: the claim that these heads carry the copying holds."
               if claimed["ci_low"] > random_set else
               "Its CI's lower bound does not clear the random-set effect: the claim is not established.")
    return (f"Mean-ablating {which}, {', '.join(f'{h} ({said[h]})' for h in heads)}, together removes "
            f"**{_num(claimed['removed'])}** of the copy gap [{_num(claimed['ci_low'])}, {_num(claimed['ci_high'])}] "
            f"(gap {_num(claimed['gap_clean'])} -> {_num(claimed['gap_ablated'])} nats). A random set of as many other "
            f"heads removes **{_num(random_set)}** on average over {len(controls)} such sets (the control). "
            f"{verdict} The largest control, {best['heads']}, removes {_num(best['removed'])} "
            f"[{_num(best['ci_low'])}, {_num(best['ci_high'])}].")


def _backup_text(evidence: HeadEvidence) -> str:
    """Whether the proposed heads together remove more than the sum of each alone (read from the first ablation,
    whose control sets hold every single head when one head was claimed): each covers for the other when removed."""
    assert evidence.proposed_ablation is not None
    singles = evidence.ablation.set_index("heads")["removed"] if len(evidence.induction_heads) == 1 else pd.Series(dtype=float)
    if not set(evidence.proposed_heads) <= set(singles.index):
        return ""
    together = float(evidence.proposed_ablation[~evidence.proposed_ablation["control"]].iloc[0]["removed"])
    alone = " + ".join(f"{h} {_num(singles[h])}" for h in evidence.proposed_heads)
    total = float(sum(singles[h] for h in evidence.proposed_heads))
    if together <= total:
        return f" Together they remove no more than the sum of each alone ({alone})."
    return (f" That is more than the sum of each alone ({alone} = {_num(total)}): ablated one at a time, each head's "
            "loss is partly made up by the other, as a backup head does.")


def _ablation_table(frame: pd.DataFrame) -> list[str]:
    lines = ["| heads ablated | fraction of the copy gap removed [CI] | control |", "|---|---|---|"]
    for row in frame.sort_values("removed", ascending=False).head(12).itertuples():
        lines.append(f"| {row.heads} | {_num(row.removed)} [{_num(row.ci_low)}, {_num(row.ci_high)}] | "
                     f"{'yes' if row.control else 'no'} |")
    return lines


EVIDENCE = ("observational", "control_shuffled", "control_random_init", "necessity", "sufficiency", "faithfulness")


def _failed(row) -> str:
    """Which kinds of evidence failed and which stayed undecided (the full reasons are in metadata.heads.verdicts)."""
    failed = [k for k in EVIDENCE if getattr(row, f"{k}_passed", None) is False]
    undecided = [k for k in EVIDENCE if k in row._fields and getattr(row, f"{k}_passed", None) is None
                 and not pd.isna(getattr(row, k))]
    parts = ([f"failed: {', '.join(failed)}"] if failed else []) + ([f"undecided: {', '.join(undecided)}"] if undecided else [])
    return "; ".join(parts) or "none"


def _cell(row, name: str) -> str:
    value = getattr(row, name, None)
    if value is None or pd.isna(value):
        return ""
    low, high = getattr(row, f"{name}_ci_low", None), getattr(row, f"{name}_ci_high", None)
    if low is None or high is None or pd.isna(low):
        return _num(value)
    return f"{_num(value)} [{_num(low)}, {_num(high)}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m interp.analyses.text_heads", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="NAME of NAME.safetensors + NAME.json (stdlib-bpe's recipe)")
    parser.add_argument("--n", type=int, default=128, help="held-out prompts of each kind")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    model = load_checkpoint(args.checkpoint)
    prompts = HeldOutPrompts.build(model, n=args.n)
    evidence = head_evidence(model, prompts, seed=args.seed)
    metadata = read_checkpoint_config(args.checkpoint)["metadata"]
    metadata["heads"] = {
        "markdown": render_heads_section(evidence, prompts), "induction_heads": list(evidence.induction_heads), "n_prompts": args.n,
        "scores": json.loads(evidence.scores.to_json(orient="records")),
        "verdicts": json.loads(evidence.verdicts.to_json(orient="records", default_handler=str)),
        "span_verdicts": ([] if evidence.span_verdicts is None else
                          json.loads(evidence.span_verdicts.to_json(orient="records", default_handler=str))),
        "ablation": json.loads(evidence.ablation.to_json(orient="records")) if not evidence.ablation.empty else [],
        "proposed_heads": list(evidence.proposed_heads),
        "proposed_ablation": ([] if evidence.proposed_ablation is None else
                              json.loads(evidence.proposed_ablation.to_json(orient="records"))),
        "copy": json.loads(evidence.copy.to_json(orient="records"))[0],
    }
    save_checkpoint(model, args.checkpoint, metadata)
    stdlib_bpe.write_card(Path(str(args.checkpoint)).with_suffix(".md"), metadata)
    print(metadata["heads"]["markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
