"""What claims can be made and what evidence a model can give for them: the registry that the
`interp` CLI, the pytest plugin (`interp.testing`) and the report (`interp.analyses.report`) share.

- Claim kinds: the names a claims file may use (`interp.specs`), each with its factory
  (`head_claim_kinds`: one head, `pair_claim_kinds`: a pair of heads, `edge_claim_kinds`: an edge
  between two heads, `MODEL_CLAIM_KINDS`: the whole model), `read_claims` to parse a file against them and `run_claims` to test one.
- The evidence policy: `claim_evidence_for(model)`, which evidence kinds claims about a model
  can gather (all of them, except on a bridge encoder whose pattern edits are discarded).

It lives in `analyses/claims/` (not in the plugin or the report) so that the faces import it and
nothing in `analyses` imports a face. Standard library at import (the plugin loads it when
pytest starts; `interp.analyses.claims` loads its other modules lazily for the same reason); the
analyses it names are imported when a kind or a claim is asked for.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from interp.specs import ClaimEntry, ClaimsFile, ClaimsFileError, build_prompts, read_claims_file

if TYPE_CHECKING:
    from torch import nn

    from interp.claims import Claim

MODEL_CLAIM_KINDS = ("causal",)  # claims about the whole model (key `model` in [claims])


def head_claim_kinds() -> dict[str, Callable[..., Claim]]:
    """Claim kind -> factory `(layer, head) -> Claim`: the presets of `interp.analyses.claims`, and "dispensable"."""
    from interp.analyses.claims.pair import dispensable_claim
    from interp.analyses.claims.presets import PRESETS

    return {**PRESETS, "dispensable": lambda layer, head: dispensable_claim((layer, head))}


def pair_claim_kinds() -> dict[str, Callable[..., Claim]]:
    """Claim kind -> factory `((l, h), (l, h)) -> Claim` for pairs of heads ("L0H1 ~ L0H3")."""
    from interp.analyses.claims.pair import backup_claim, redundant_claim

    return {"redundant": redundant_claim, "backs_up": backup_claim}


def edge_claim_kinds() -> dict[str, Callable[..., Claim]]:
    """Claim kind -> factory `(edge) -> Claim` for edges between heads ("L0H0 -> L1H2 via k")."""
    from interp.analyses.claims.composition import composition_claim

    return {"composes": composition_claim}


def claim_kinds() -> list[str]:
    """Every kind a claims file may name."""
    return sorted({*head_claim_kinds(), *pair_claim_kinds(), *EDGE_CLAIM_KINDS, *MODEL_CLAIM_KINDS})


EDGE_CLAIM_KINDS = ("composes",)  # the keys of edge_claim_kinds(), without importing torch (read_claims needs them)


def read_claims(path) -> ClaimsFile:
    """Parse a claims file, checking its claim kinds against those the toolkit knows."""
    claims_file = read_claims_file(path, valid_kinds=claim_kinds())
    pair, single = set(pair_claim_kinds()), set(head_claim_kinds())
    for entry in claims_file.claims:
        where = f"{claims_file.path}:{entry.line or '?'}:1"
        if (entry.kind in EDGE_CLAIM_KINDS) != (entry.edge is not None):
            what = (f"{entry.kind!r} is a claim about an edge between heads; write \"L0H0 -> L1H2 via k\" = \"{entry.kind}\""
                    if entry.edge is None else
                    f"{entry.target!r} is an edge, and {entry.kind!r} is not a claim about edges; edges take "
                    f"{list(EDGE_CLAIM_KINDS)}")
            raise ClaimsFileError(f"{where}: {what}.")
        if entry.edge is not None:
            continue
        if entry.kind in MODEL_CLAIM_KINDS and entry.heads:
            raise ClaimsFileError(f"{where}: {entry.kind!r} is a claim about the whole model; write it as model = \"{entry.kind}\".")
        if entry.kind in pair and len(entry.heads) != 2:
            raise ClaimsFileError(f"{where}: {entry.kind!r} is a claim about a pair of heads; write \"L0H1 ~ L0H3\" = \"{entry.kind}\".")
        if entry.kind in single and len(entry.heads) != 1:
            raise ClaimsFileError(f"{where}: {entry.kind!r} is a claim about one head; write L1H2 = \"{entry.kind}\".")
    return claims_file


def claim_object(entry: ClaimEntry):
    """The Claim object a claims-file entry names (a head, a pair of heads or an edge)."""
    if entry.edge is not None:
        return edge_claim_kinds()[entry.kind](entry.edge)
    if len(entry.heads) == 2:
        return pair_claim_kinds()[entry.kind](*entry.heads)
    layer, head = entry.heads[0]
    return head_claim_kinds()[entry.kind](layer, head)


def run_claims(
    model,
    claims_file: ClaimsFile,
    *,
    prompts=None,
    prompt_overrides: dict | None = None,
    seed: int | None = None,
    progress: bool = False,
    behaviour=None,
):
    """Test every claim of a claims file on `model`: one row per claim, in file order.

    Columns: `name` ("L1H2: induction"), `claim`, `label`, `layer`, `head`, `expect`, `verdict`,
    `passed` (verdict == expect), `p_adjusted`, `reasons`, `line`, then the evidence columns
    of `interp.claims.test_claims`, and `evidence`: each evidence of the claim as `Evidence.to_dict()` (its numbers,
    `write_change`, and the per-prompt `values` as a list; [] for a whole-model claim). `prompts` overrides the file's [prompts] table;
    `prompt_overrides` changes some of its fields (n, seed, prefix_len). A model whose
    interventions would measure nothing (an encoder or random-head model through the
    TransformerLens bridge) gets the observational test and the shuffled-token control only
    (`claim_evidence_for`). `behaviour`: what causal
    evidence measures (`interp.behaviour`; default: the model's own), named in the `behaviour` column.
    """
    import dataclasses

    import pandas as pd

    from interp.claims import test_claims

    if prompts is None:
        spec = claims_file.prompts
        if prompt_overrides:
            spec = dataclasses.replace(spec, **prompt_overrides)
        prompts = build_prompts(model, spec, default_n=64)
    seed = claims_file.prompts.seed if seed is None else seed
    head_entries = [e for e in claims_file.claims if e.heads]
    rows, reasons = [], {}
    if head_entries:
        frame = test_claims(model, [claim_object(e) for e in head_entries], prompts, alpha=claims_file.alpha, seed=seed,
                            evidence=claim_evidence_for(model), progress=progress, behaviour=behaviour)
        for entry, (_, row), verdict in zip(head_entries, frame.iterrows(), frame.attrs["verdicts"]):
            rows.append({**_entry_columns(entry), **row.to_dict(),
                         "evidence": [e.to_dict() for e in verdict.evidence]})
            reasons[entry.name] = verdict.reasons
    for entry in claims_file.claims:
        if not entry.heads:
            rows.append({**_entry_columns(entry), **_model_claim(model, entry, seed=seed), "evidence": []})
            reasons[entry.name] = (rows[-1]["reasons"],)
    order = {entry.name: i for i, entry in enumerate(claims_file.claims)}
    frame = pd.DataFrame(rows)
    frame["passed"] = frame["verdict"] == frame["expect"]
    frame = frame.sort_values("name", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
    front = ["name", "claim", "label", "layer", "head", "expect", "verdict", "passed", "p_adjusted", "reasons", "line"]
    frame = frame[[c for c in front if c in frame.columns] + [c for c in frame.columns if c not in front]]
    frame.attrs["reasons"] = reasons  # claim name -> its verdict's reasons, one string each (the column joins them for people)
    return frame


def _entry_columns(entry: ClaimEntry) -> dict:
    return {"name": entry.name, "expect": entry.expect, "line": entry.line}


def _model_claim(model, entry: ClaimEntry, *, seed: int) -> dict:
    """The whole-model claim "causal", tested by the leakage audit."""
    from interp.analyses.leakage import audit

    report = audit(model, seed=seed, progress=False)
    verdict = "supported" if report.causal else "refuted"
    return {"claim": entry.kind, "label": "model", "layer": None, "head": None, "verdict": verdict,
            "statement": "the model is causal: no output depends on a later token", "p_adjusted": float("nan"),
            "reasons": report.title if report.causal else str(report).strip()}


# an encoder (or random-head model) through the TransformerLens bridge: edits of `z` take effect (checked
# on MiniLM-L6 against a hook on Hugging Face's own attention output, tests/interp/test_behaviour.py), edits of
# the pattern are discarded (interp.verify_hooks shows it) and no random-init twin can be built: necessity and importance only
BRIDGE_ENCODER_EVIDENCE = ("observational", "control_shuffled", "necessity")
NOT_MEASURED = ("the model runs through the TransformerLens bridge as an encoder or with a random head, where "
                "pattern edits are discarded and no random-init twin can be built, so sufficiency, faithfulness and "
                "the random-init control were not run; convert the model natively for them")


def claim_evidence_for(model: nn.Module) -> tuple[str, ...] | None:
    """The evidence kinds claims about `model` should gather: all (None) where pattern edits take effect;
    on an encoder or random-head model through the bridge, the observational test, the shuffled-token
    control and necessity (z ablation), measured on its behaviour (`interp.behaviour`)."""
    return BRIDGE_ENCODER_EVIDENCE if bridge_without_pattern_edits(model) else None


def bridge_without_pattern_edits(model: nn.Module) -> bool:
    """Whether `model` runs through the TransformerLens bridge as an encoder or with a random head, where
    edits of the pattern are discarded (see BRIDGE_ENCODER_EVIDENCE)."""
    from interp.hooks import attention_sites

    if type(model).__name__ != "TransformerBridge":
        return False
    sites = attention_sites(model)
    return bool(getattr(model, "head_is_random", False)) or not (sites and sites[0].causal)
