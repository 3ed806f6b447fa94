"""interp: look inside attention, and test what you think you see.

The public names below are imported lazily, so `interp --help` answers without importing
torch (about 3 s here). `dir(interp)` (and so tab completion) lists them, and the `TYPE_CHECKING`
block names each from its module, so type checkers and IDEs see `interp.Run` as the class it is.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from interp.progress import quiet_tqdm_import_warning

quiet_tqdm_import_warning()  # before anything imports transformer-lens (see interp.progress)

if TYPE_CHECKING:  # what type checkers and IDEs see: each name from its module (`name as name`: a re-export)
    from interp.behaviour import Behaviour as Behaviour
    from interp.behaviour import default_behaviour as default_behaviour
    from interp.behaviour import embedding_change as embedding_change
    from interp.behaviour import masked_lm_loss as masked_lm_loss
    from interp.behaviour import next_token_loss as next_token_loss
    from interp.capture import MomentAccumulator as MomentAccumulator
    from interp.capture import PerPromptAccumulator as PerPromptAccumulator
    from interp.capture import stream as stream
    from interp.claims import Claim as Claim
    from interp.claims import Evidence as Evidence
    from interp.claims import Threshold as Threshold
    from interp.claims import Verdict as Verdict
    from interp.claims import evaluate_claims as evaluate_claims
    from interp.claims import test_claims as test_claims
    from interp.data import CharTokenizer as CharTokenizer
    from interp.data import PromptSet as PromptSet
    from interp.data import char_prompts as char_prompts
    from interp.data import corpus_text as corpus_text
    from interp.data import pad as pad
    from interp.data import random_tokens as random_tokens
    from interp.data import repeated_tokens as repeated_tokens
    from interp.data import shuffled as shuffled
    from interp.data import text_prompts as text_prompts
    from interp.hooks import AttentionSite as AttentionSite
    from interp.hooks import attention_sites as attention_sites
    from interp.hooks import hooked as hooked
    from interp.interventions import AttentionKnockout as AttentionKnockout
    from interp.interventions import HeadAblation as HeadAblation
    from interp.interventions import PatternSubstitution as PatternSubstitution
    from interp.interventions import substitute_pattern as substitute_pattern
    from interp.loading import load as load
    from interp.loading import save as save
    from interp.mha import hook_attention as hook_attention
    from interp.mha import unhook_attention as unhook_attention
    from interp.paths import Edge as Edge
    from interp.paths import EdgePatch as EdgePatch
    from interp.paths import patch_edges as patch_edges
    from interp.run import Effect as Effect
    from interp.run import Run as Run
    from interp.run import Strategy as Strategy
    from interp.sdpa import hook_sdpa as hook_sdpa
    from interp.sdpa import unhook_sdpa as unhook_sdpa
    from interp.specs import PromptSpec as PromptSpec
    from interp.specs import build_prompts as build_prompts
    from interp.testing import assert_bidirectional_padding_inert as assert_bidirectional_padding_inert
    from interp.testing import assert_causal as assert_causal
    from interp.testing import read_claims as read_claims
    from interp.testing import run_claims as run_claims
    from interp.verify import verify_hooks as verify_hooks
    from interp.viewer import AttentionView as AttentionView
    from interp.viewer import show as show

_EXPORTS = {  # name -> the module that imports it on first use (the block above must say the same)
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
    "Strategy": "interp.run",
    "HeadAblation": "interp.interventions",
    "PatternSubstitution": "interp.interventions",
    "AttentionKnockout": "interp.interventions",
    "Edge": "interp.paths",
    "EdgePatch": "interp.paths",
    "patch_edges": "interp.paths",
    "substitute_pattern": "interp.interventions",
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
    from interp.removed import removed

    raise removed("interp", name)


def __dir__() -> list[str]:
    """The public names, the module's own dunders and the submodules imported so far (helpers left out)."""
    loaded = {name for name, value in globals().items()
              if name.startswith("__") or isinstance(value, ModuleType) and value.__name__.startswith(f"{__name__}.")}
    return sorted({*_EXPORTS, *loaded})
