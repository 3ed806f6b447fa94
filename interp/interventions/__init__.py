"""Interventions on attention heads: ablations, pattern substitution and attention knockout, as small named objects.

Each is plain data with a `spec()` and runs as an intervention of `interp.Run` (`run.effect(...)`) or as a
context manager whose hooks are removed in `finally` (`interp.hooks.hooked`). Modules, one concern each:

- `common`: what they share: ablation kinds and sites, `parse_heads` / `check_heads` / `all_heads`,
  `as_prompts`, `run_stopping_after`, `tensor_digest`.
- `references`: `reference_activations`, the heads' mean (at matched token roles) and per-prompt values
  over reference prompts, which mean and resample ablation take theirs from.
- `ablation`: `HeadAblation` (its `hooks()` for a hooked forward outside a Run), `AblationValues`, and the
  batched ablations behind `interp.Run`'s strategy "batched" (the GPU path).
- `patterns`: `substitute_pattern`, `PatternSubstitution`, `pattern_names` ("uniform" and the head types' ideal
  patterns, `interp.head_types`) and the pattern checks.
- `knockout`: `AttentionKnockout`, knocking out the attention a role predicts (and its control).

Every public name is importable from here (`from interp.interventions import HeadAblation`).
"""
from interp.interventions.ablation import AblationValues, HeadAblation, needs_samples
from interp.interventions.common import (
    ABLATION_KINDS,
    ABLATION_SITES,
    AblationKind,
    AblationSite,
    all_heads,
    as_prompts,
    check_heads,
    parse_heads,
    run_stopping_after,
    tensor_digest,
)
from interp.interventions.knockout import (
    KNOCKOUT_MODES,
    NEAR_ZERO_REMAINDER,
    AttentionKnockout,
    KnockoutMode,
    TargetSource,
    control_removal,
    head_mean_pattern,
    knock_out,
    off_target_pattern,
)
from interp.interventions.patterns import (
    ROW_SUM_TOLERANCE,
    PatternSource,
    PatternSpec,
    PatternSubstitution,
    check_pattern_rows,
    on_real_positions,
    pattern_names,
    permute_among_allowed,
    permuted_pattern,
    substitute_pattern,
    uniform_pattern,
)
from interp.interventions.references import AUTO_RESAMPLE_BELOW, ROLE_WIDTH, ReferenceActivations, reference_activations

__all__ = [
    "ABLATION_KINDS",
    "ABLATION_SITES",
    "AUTO_RESAMPLE_BELOW",
    "KNOCKOUT_MODES",
    "NEAR_ZERO_REMAINDER",
    "ROLE_WIDTH",
    "ROW_SUM_TOLERANCE",
    "AblationKind",
    "AblationSite",
    "AblationValues",
    "AttentionKnockout",
    "HeadAblation",
    "KnockoutMode",
    "PatternSource",
    "PatternSpec",
    "PatternSubstitution",
    "ReferenceActivations",
    "TargetSource",
    "all_heads",
    "as_prompts",
    "check_heads",
    "check_pattern_rows",
    "control_removal",
    "head_mean_pattern",
    "knock_out",
    "needs_samples",
    "off_target_pattern",
    "on_real_positions",
    "parse_heads",
    "pattern_names",
    "permute_among_allowed",
    "permuted_pattern",
    "reference_activations",
    "run_stopping_after",
    "substitute_pattern",
    "tensor_digest",
    "uniform_pattern",
]



def __getattr__(name: str) -> object:
    from interp.removed import removed

    raise removed(__name__, name)  # a name removed in 0.x says what replaces it
