"""What a report is about and runs on: the model's facts and name, the prompts chosen for it, provenance.

`model_summary` is the page's header table; `default_prompt_spec` / `model_prompt_spec` choose text
for text models and repeated random tokens otherwise; `prompt_warnings` says what the prompts cannot
support; `provenance` records versions, commit, seed and a hash of the prompts, enough to rerun.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from interp.data import PromptSet
from interp.hooks import attention_sites


def _causal_words(model: nn.Module, sites: list) -> str:
    """The header's word on causality: what the model declares (as the leakage audit reads it), and what
    its attention calls showed when that disagrees, never an observation passed off as a declaration."""
    from interp.analyses.leakage import declaration

    declared = declaration(model)
    if declared is not None:
        return f"no: bidirectional, {declared}"
    if any(site.causal is False for site in sites):
        return "expected (nothing declares it bidirectional), but attention was seen unmasked: see the leakage verdict"
    return "yes (decoder)"


def model_summary(model: nn.Module, spec: str | None) -> dict[str, Any]:
    """Plain facts about the model for the report's header."""
    sites = attention_sites(model)
    cfg = getattr(model, "cfg", None)
    summary: dict[str, Any] = {
        "spec": spec or type(model).__name__,
        "class": type(model).__name__,
        "attention layers": len(sites),
        "heads per layer": ", ".join(sorted({str(s.n_heads) for s in sites})),
        "d_head": ", ".join(sorted({str(s.d_head) for s in sites})),
        "causal": _causal_words(model, sites),
        "parameters": f"{sum(p.numel() for p in model.parameters()):,}",
    }
    for name in ("d_model", "n_ctx", "d_vocab", "attn_only", "positional_embedding_type", "original_architecture",
                 "n_key_value_heads"):
        value = getattr(cfg, name, None)
        if value is not None:
            summary[name] = value
    metadata = getattr(model, "metadata", None) or {}
    for key in ("trained_with", "command", "seed", "final_loss", "description"):
        if key in metadata and not isinstance(metadata[key], (dict, list)):
            summary[f"card: {key}"] = metadata[key]
    # how the model was loaded (native conversion, or the bridge and what does not work there)
    for index, note in enumerate(getattr(model, "load_notes", None) or []):
        summary[f"load note {index + 1}"] = note
    return summary


def has_tokenizer(model: nn.Module) -> bool:
    """A text model: it carries a tokenizer that turns text into its ids (the shipped checkpoints' tokenizers,
    `interp.models.tokenizers`, say `text_prompts_by_default = False`: their reports keep token prompts)."""
    tokenizer = getattr(model, "tokenizer", None)
    return tokenizer is not None and getattr(tokenizer, "text_prompts_by_default", True)


def default_prompt_spec(model: nn.Module, seed: int = 0, n: int | None = None):
    """Text from the shipped corpus for text models (through their tokenizer), else repeated random tokens."""
    from interp.specs import PromptSpec

    return PromptSpec(kind="text" if has_tokenizer(model) else "repeated", seed=seed, n=n)


def model_prompt_spec(model: nn.Module, prompt_spec, *, asked: bool):
    """The CLI's prompt spec, made model-aware: when the user named no prompt kind, a text model gets text."""
    import dataclasses

    if asked or not has_tokenizer(model) or prompt_spec.kind != "repeated":
        return prompt_spec
    return dataclasses.replace(prompt_spec, kind="text", prefix_len=None, n_repeats=None)


def prompt_warnings(model: nn.Module, prompts: PromptSet) -> list[str]:
    """What these prompts cannot support: each line names the claims concerned and the fix."""
    from interp.claims import MIN_PROMPTS_FOR_VERDICT

    kind = prompts.meta.get("kind", "tokens")
    warnings = []
    if has_tokenizer(model) and kind in ("repeated", "random"):
        warnings.append(
            f"these prompts are random token ids ({kind}), not text, for a model with a tokenizer: it never saw such "
            "input, and position 0 is a random wordpiece, not [CLS] / BOS, so first-token (sink) claims here say "
            "nothing about its special tokens; use --prompts text.")
    if kind != "repeated":
        warnings.append("the prompts have no repeats by construction: induction and duplicate-token scores are not "
                        "measured and no induction claim is proposed; use --prompts repeated to test induction.")
    if len(prompts) // 2 < MIN_PROMPTS_FOR_VERDICT:
        warnings.append(f"the scan tests claims on half of the {len(prompts)} prompts, fewer than "
                        f"{MIN_PROMPTS_FOR_VERDICT}: every scanned claim is inconclusive; pass --n {2 * MIN_PROMPTS_FOR_VERDICT} or more.")
    return warnings


def model_name(model: nn.Module, spec: str | None) -> str:
    """A reader's name for the model: a folder's model-card title, a built-in's name, else the class."""
    if spec:
        path = Path(str(spec))
        if path.is_dir():
            title = _card_title(path / "README.md")
            return title or (path.parent.name if path.name in ("model", "models", "checkpoint") else path.name)
        if path.is_file():
            return path.stem
        return str(spec)
    return type(model).__name__


def _card_title(readme: Path) -> str | None:
    """The first level-1 heading of a Hugging Face model card, outside its YAML front matter."""
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    if text.startswith("---"):
        text = text.split("---", 2)[-1]
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip() or None
    return None


def provenance(seed: int, prompts: PromptSet, wall_time_s: float) -> dict[str, Any]:
    """Versions, git commit, seed, a hash of the prompt set and the wall time: enough to rerun the report."""
    import hashlib
    import platform

    digest = hashlib.sha256(prompts.tokens.cpu().numpy().astype("<i8").tobytes())
    if prompts.attention_mask is not None:
        digest.update(prompts.attention_mask.cpu().numpy().astype("<i1").tobytes())
    return {"toolkit": _version("interp-attention"), "git_commit": _git_commit(), "torch": torch.__version__,
            "transformer_lens": _version("transformer-lens"), "python": platform.python_version(), "seed": seed,
            "prompt_hash": "sha256:" + digest.hexdigest()[:16], "n_prompts": len(prompts),
            "wall_time_s": round(wall_time_s, 2)}


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_commit() -> str | None:
    """The toolkit checkout's commit ("+dirty" with uncommitted changes); None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]  # analyses/report/context.py -> the checkout
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")
