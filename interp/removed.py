"""Names removed from the public surface in 0.x, and what replaces each (CHANGELOG's migration table): the
messages `interp`, `interp.interventions` and `interp.behaviour` raise for them. Standard library only."""

REMOVED = {
    "ablate": "interp.Run(model, prompts).effect(interp.HeadAblation(heads, kind)), or for a hooked forward "
              "`with interp.hooked(model, HeadAblation(heads, kind).hooks(model, reference)):`",
    "batched_head_ablations": "interp.Run(model, prompts, strategy=interp.Strategy.BATCHED).effects("
                              "[HeadAblation(head), ...])",
    "batched_ablation_values": "interp.Run(model, prompts, strategy=interp.Strategy.BATCHED).effects("
                               "[HeadAblation(head), ...])",
}


def removed(module: str, name: str) -> AttributeError:
    """The error for `module.name`: removed, and what to use instead; or the usual one for a name never there."""
    if name in REMOVED:
        return AttributeError(f"{module}.{name} was removed; use {REMOVED[name]}.")
    return AttributeError(f"module {module!r} has no attribute {name!r}")
