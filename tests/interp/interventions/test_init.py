"""The package as a whole: `from interp.interventions import X` works for every public name of its modules."""
import ast
import importlib
import inspect

import pytest

import interp.interventions as interventions

MODULES = ("common", "references", "ablation", "patterns", "knockout")


def _public_names(module):
    """Names a module defines at its top level (classes, functions, constants, type aliases), not those it imports."""
    names = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_")}


def test_every_public_name_of_the_modules_is_re_exported():
    defined = {}
    for name in MODULES:
        module = importlib.import_module(f"interp.interventions.{name}")
        for public in _public_names(module):
            assert public not in defined, f"{public} defined in both {defined[public]} and {name}"
            defined[public] = name
    assert len(defined) == 37
    assert sorted(interventions.__all__) == sorted(defined)
    for public, name in defined.items():
        assert getattr(interventions, public) is getattr(importlib.import_module(f"interp.interventions.{name}"), public)


def test_the_surface_is_the_single_module_it_was():
    """What interp/interventions.py offered: the names the code base, the notebooks and the README import."""
    import interp
    from interp.interventions import (  # noqa: F401
        AttentionKnockout,
        HeadAblation,
        PatternSubstitution,
        ReferenceActivations,
        pattern_names,
        reference_activations,
        substitute_pattern,
    )

    assert interp.HeadAblation is HeadAblation
    assert HeadAblation.__module__ == "interp.interventions.ablation"
    assert AttentionKnockout.__module__ == "interp.interventions.knockout"


@pytest.mark.parametrize("where", ["interp", "interp.interventions"])
@pytest.mark.parametrize("name", ["ablate", "batched_head_ablations"])
def test_removed_names_say_what_replaces_them(where: str, name: str) -> None:
    with pytest.raises(AttributeError, match=rf"{where}\.{name} was removed; use interp\.Run\(model, prompts"):
        getattr(importlib.import_module(where), name)
    with pytest.raises(ImportError):
        exec(f"from {where} import {name}")


def test_batched_ablation_values_was_removed() -> None:
    import interp.behaviour

    with pytest.raises(AttributeError, match="Strategy.BATCHED"):
        interp.behaviour.batched_ablation_values  # noqa: B018
