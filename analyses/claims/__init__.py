"""Claims about attention heads, and the evidence that tests them (`interp.claims` is the machinery:
Claim, Evidence, Verdict, test_claims).

- `presets`: one claim per head type (`induction_head(1, 2)`, `make_claim("induction", 1, 2)`) and
  the positional claim;
- `evidence`: observational evidence and its controls (shuffled tokens, random init);
- `causal`: necessity, sufficiency and faithfulness, measured on a behaviour;
- `scanning`: `propose` a claim per head from the metrics, `scan` (propose on half the prompts, test on the rest);
- `pair`: claims about pairs of heads (redundant, backs up) and dispensable heads, tested by ablation;
- `composition`: claims about an edge between heads ("L0H0 -> L1H2 via k composes"), tested by path patching;
- `registry`: the claim kinds a claims file may name, and the evidence policy.

The registry is standard library at import (the pytest plugin loads it when pytest starts), so the
names of the other modules, which need torch, are imported on first use.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# `name as name`: each import below is an explicit re-export (most are not in `__all__`)
from interp.analyses.claims.registry import (
    EDGE_CLAIM_KINDS as EDGE_CLAIM_KINDS,
)
from interp.analyses.claims.registry import (
    MODEL_CLAIM_KINDS as MODEL_CLAIM_KINDS,
)
from interp.analyses.claims.registry import (
    bridge_without_pattern_edits as bridge_without_pattern_edits,
)
from interp.analyses.claims.registry import (
    claim_evidence_for as claim_evidence_for,
)
from interp.analyses.claims.registry import (
    claim_kinds as claim_kinds,
)
from interp.analyses.claims.registry import (
    claim_object as claim_object,
)
from interp.analyses.claims.registry import (
    edge_claim_kinds as edge_claim_kinds,
)
from interp.analyses.claims.registry import (
    head_claim_kinds as head_claim_kinds,
)
from interp.analyses.claims.registry import (
    pair_claim_kinds as pair_claim_kinds,
)
from interp.analyses.claims.registry import (
    read_claims as read_claims,
)
from interp.analyses.claims.registry import (
    run_claims as run_claims,
)

if TYPE_CHECKING:
    from interp.analyses.claims.causal import (
        Faithfulness as Faithfulness,
    )
    from interp.analyses.claims.causal import (
        Necessity as Necessity,
    )
    from interp.analyses.claims.causal import (
        Sufficiency as Sufficiency,
    )
    from interp.analyses.claims.composition import (
        composition_claim as composition_claim,
    )
    from interp.analyses.claims.composition import (
        control_sender as control_sender,
    )
    from interp.analyses.claims.evidence import (
        Observational as Observational,
    )
    from interp.analyses.claims.evidence import (
        RandomInitControl as RandomInitControl,
    )
    from interp.analyses.claims.evidence import (
        ShuffledControl as ShuffledControl,
    )
    from interp.analyses.claims.evidence import (
        head_metric as head_metric,
    )
    from interp.analyses.claims.evidence import (
        random_init_model as random_init_model,
    )
    from interp.analyses.claims.pair import (
        backup_claim as backup_claim,
    )
    from interp.analyses.claims.pair import (
        dispensable_claim as dispensable_claim,
    )
    from interp.analyses.claims.pair import (
        redundancy_claims as redundancy_claims,
    )
    from interp.analyses.claims.pair import (
        redundant_claim as redundant_claim,
    )
    from interp.analyses.claims.presets import (
        CLAIM_KINDS as CLAIM_KINDS,
    )
    from interp.analyses.claims.presets import (
        PRESETS as PRESETS,
    )
    from interp.analyses.claims.presets import (
        PositionalParams as PositionalParams,
    )
    from interp.analyses.claims.presets import (
        duplicate_token_head as duplicate_token_head,
    )
    from interp.analyses.claims.presets import (
        first_token_head as first_token_head,
    )
    from interp.analyses.claims.presets import (
        head_type_claim as head_type_claim,
    )
    from interp.analyses.claims.presets import (
        induction_head as induction_head,
    )
    from interp.analyses.claims.presets import (
        local_window_head as local_window_head,
    )
    from interp.analyses.claims.presets import (
        make_claim as make_claim,
    )
    from interp.analyses.claims.presets import (
        next_token_head as next_token_head,
    )
    from interp.analyses.claims.presets import (
        positional_head as positional_head,
    )
    from interp.analyses.claims.presets import (
        previous_token_head as previous_token_head,
    )
    from interp.analyses.claims.presets import (
        self_token_head as self_token_head,
    )
    from interp.analyses.claims.scanning import (
        propose as propose,
    )
    from interp.analyses.claims.scanning import (
        scan as scan,
    )

_LAZY = {  # name -> the module of this package that defines it
    **dict.fromkeys(["Faithfulness", "Necessity", "Sufficiency"], "causal"),
    **dict.fromkeys(["Observational", "RandomInitControl", "ShuffledControl", "head_metric", "random_init_model"], "evidence"),
    **dict.fromkeys(["CLAIM_KINDS", "PRESETS", "PositionalParams", "duplicate_token_head", "first_token_head",
                     "head_type_claim", "induction_head", "local_window_head", "make_claim", "next_token_head",
                     "positional_head", "previous_token_head", "self_token_head"], "presets"),
    **dict.fromkeys(["propose", "scan"], "scanning"),
    **dict.fromkeys(["composition_claim", "control_sender"], "composition"),
    **dict.fromkeys(["backup_claim", "dispensable_claim", "redundancy_claims", "redundant_claim"], "pair"),
}

# what a user calls: the claims (one per head type, pairs, edges), scanning, claims files; every other name above
# (the evidence kinds, the registry's kind lists, the presets' tables) stays importable from here
__all__ = [
    "induction_head", "previous_token_head", "duplicate_token_head", "first_token_head", "local_window_head",
    "next_token_head", "self_token_head", "positional_head", "make_claim", "head_type_claim",
    "composition_claim", "redundant_claim", "backup_claim", "dispensable_claim", "redundancy_claims",
    "propose", "scan", "read_claims", "run_claims", "claim_kinds",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
