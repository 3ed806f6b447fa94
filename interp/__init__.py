"""interp: look inside attention, and test what you think you see.

The public names below are imported lazily, so `interp --help` answers without importing
torch (about 3 s here).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "load": "interp.load",
    "save": "interp.load",
    "attention_sites": "interp.hooks",
    "AttentionSite": "interp.hooks",
    "hooked": "interp.hooks",
    "hook_attention": "interp.mha",
    "unhook_attention": "interp.mha",
    "verify_hooks": "interp.verify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'interp' has no attribute {name!r}")
