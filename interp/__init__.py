"""interp: look inside attention, and test what you think you see.

The public names below are imported lazily, so `interp --help` answers without importing
torch (about 3 s here).
"""
from __future__ import annotations

import importlib
from typing import Any

from interp.progress import quiet_tqdm_import_warning

quiet_tqdm_import_warning()  # before anything imports transformer-lens (see interp.progress)

_EXPORTS = {
    "load": "interp.loading",
    "save": "interp.loading",
    "attention_sites": "interp.hooks",
    "AttentionSite": "interp.hooks",
    "hooked": "interp.hooks",
    "hook_attention": "interp.mha",
    "unhook_attention": "interp.mha",
    "hook_sdpa": "interp.sdpa",
    "unhook_sdpa": "interp.sdpa",
    "verify_hooks": "interp.verify",
    "assert_causal": "interp.testing",
    "assert_bidirectional_padding_inert": "interp.testing",
    "PromptSet": "interp.data",
    "random_tokens": "interp.data",
    "repeated_tokens": "interp.data",
    "shuffled": "interp.data",
    "text_prompts": "interp.data",
    "char_prompts": "interp.data",
    "pad": "interp.data",
    "CharTokenizer": "interp.data",
    "corpus_text": "interp.data",
    "stream": "interp.capture",
    "PerPromptAccumulator": "interp.capture",
    "MomentAccumulator": "interp.capture",
    "Run": "interp.run",
    "Effect": "interp.run",
    "HeadAblation": "interp.interventions",
    "PatternSubstitution": "interp.interventions",
    "AttentionKnockout": "interp.interventions",
    "Edge": "interp.paths",
    "EdgePatch": "interp.paths",
    "patch_edges": "interp.paths",
    "ablate": "interp.interventions",
    "substitute_pattern": "interp.interventions",
    "ideal_pattern": "interp.interventions",
    "batched_head_ablations": "interp.interventions",
    "Claim": "interp.claims",
    "Evidence": "interp.claims",
    "Verdict": "interp.claims",
    "Threshold": "interp.claims",
    "test_claims": "interp.claims",
    "evaluate_claims": "interp.claims",
    "PromptSpec": "interp.specs",
    "build_prompts": "interp.specs",
    "read_claims": "interp.testing",
    "run_claims": "interp.testing",
    "Behaviour": "interp.behaviour",
    "default_behaviour": "interp.behaviour",
    "next_token_loss": "interp.behaviour",
    "masked_lm_loss": "interp.behaviour",
    "embedding_change": "interp.behaviour",
    "show": "interp.viewer",
    "AttentionView": "interp.viewer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'interp' has no attribute {name!r}")
