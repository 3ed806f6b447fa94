"""One measurement object: a model, its prompts and a behaviour, measured under interventions.

    run = interp.Run(model, prompts)                      # behaviour follows the model
    effect = run.effect(interp.HeadAblation("L1H2", "mean"))
    effect.mean, effect.ci_low, effect.ci_high            # per-prompt values kept: effect.values
    effect.ablation                                       # the kind applied ("auto" resolved per head)

A `Run` moves the model once (`device=`, `dtype=`: a copy, the caller's model is left as it was),
resolves the behaviour once (`interp.behaviour`: the model's own by default) and answers
`effect(intervention)`: the behaviour's change per prompt, intervened minus clean, with a
percentile-bootstrap CI over prompts. Every causal number of the toolkit (importance, joint
ablation, compensation, pruning, the claims' necessity, sufficiency and faithfulness) is asked of
a `Run`, so analyses share its memo and its choice of how to compute.

An intervention is a frozen dataclass with `spec()` (plain data naming it) and
`intervene(run, batch)` (a context manager of hooks for one batch); `HeadAblation`,
`PatternSubstitution` (`interp.interventions`) are the built-in ones. How an effect is computed is
the `strategy`, an `interp.Strategy` (a typed value; its name as a string is accepted for one release, with
a DeprecationWarning):

- `Strategy.RESUME`: head ablations at `z` on a model whose blocks allow it (`interp.ablation.resumable`):
  the clean run is cached per batch and each ablation resumes from its earliest layer
  (`interp.ablation.AblationEngine`); many ablations are computed in one sweep (`effects`);
- `Strategy.BATCHED`: head ablations alone, as copies of the batch in one expanded forward
  (`interp.ablation.batched_values`: the GPU path);
- `Strategy.HOOKED`: one forward per intervention with its hooks (every intervention, every model; head
  ablations through the engine's full-forward path, resampling keyed by prompt index);
- `Strategy.AUTO` (default): resuming for head ablations where the model allows it, else hooked.

Edge patches (`interp.paths.EdgePatch`) are swept under every strategy but `Strategy.HOOKED`, on a model whose
residual stream is a sum of node writes (`interp.sweep.sweepable`): the clean and corrupted forwards run once per
batch and each patched set resumes from its earliest receiver's layer (`interp.sweep.PatchSweep`, one per corrupted
source, `run.sweep(source)`); otherwise one hooked forward each.

The memo key is the intervention's `spec()`, a digest of what it holds (`content_digest`: its tensors' bytes,
its prompt sets, its plain fields; so two interventions with an equal spec() but other tensors are told apart)
and, for a knockout or a substitution computed per batch, a digest of the targets or patterns its source gives
on these prompts (sources with an equal spec() are told apart), the prompt set's token and mask bytes, and a
version of the model's parameters (each
tensor's storage, torch's in-place version counter and a sampled checksum of its values), so editing
`W_Q[h]` in place recomputes the next effect, and so does a write through `.data` (which torch's counter does
not see): the checksum sums `SAMPLED` evenly spaced values of each tensor, a few milliseconds per call on
SmolLM2-135M where hashing every weight would pass over half a gigabyte on every call, memo hits included. A
`.data` write to a few values between the sampled ones can escape it: call `forget()` after such an edit.
Forward hooks stay outside the key:

- forward hooks: while any is attached to the model (`interp.hooks.attached_forward_hooks`: yours, not
  the toolkit's own, which come and go inside a call) a Run computes every number afresh, memoises
  nothing and warns once.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import warnings
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ContextManager,
    Iterable,
    Literal,
    NamedTuple,
    Protocol,
    Sequence,
    TypeVar,
    cast,
    runtime_checkable,
)

import pandas as pd
import torch
from torch import nn

import interp.launch as launch
from interp.behaviour import (
    Behaviour,
    BehaviourLike,
    Positions,
    as_behaviour,
    check_values,
    clean_summaries,
    measure,
)
from interp.data import PromptSet, check_prompts, prompt_fingerprint
from interp.errors import BadInput
from interp.hooks import attached_forward_hooks
from interp.interventions import (
    ABLATION_KINDS,
    AblationKind,
    AttentionKnockout,
    HeadAblation,
    PatternSubstitution,
    ReferenceActivations,
    needs_samples,
    reference_activations,
    tensor_digest,
)
from interp.launch import Device, DType
from interp.modelinfo import context_length, vocab_size
from interp.models.gpt import HookedGPT
from interp.paths import EdgePatch
from interp.stats import bootstrap
from interp.validate import check_inputs

if TYPE_CHECKING:
    from interp.ablation import AblationEngine
    from interp.sweep import PatchSweep

class Strategy(enum.Enum):
    """How a Run computes its effects (see the module): `Strategy.AUTO` (the default), `RESUME`, `HOOKED`, `BATCHED`.

    The names as strings ("hooked") are accepted for one release (0.1), with a DeprecationWarning naming the
    value; then refused."""

    AUTO = "auto"
    RESUME = "resume"
    HOOKED = "hooked"
    BATCHED = "batched"


STRATEGIES: tuple[str, ...] = tuple(strategy.value for strategy in Strategy)
T = TypeVar("T")


def as_strategy(strategy: Strategy | str, where: str = "Run") -> Strategy:
    """A `Strategy`; a strategy's name as a string is mapped to it with a DeprecationWarning (for one release)."""
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, str) and strategy in STRATEGIES:
        chosen = Strategy(strategy)
        warnings.warn(f"{where}: strategy={strategy!r} as a string is deprecated and will be refused after 0.1; pass "
                      f"strategy=interp.Strategy.{chosen.name}.", DeprecationWarning, stacklevel=3)
        return chosen
    raise BadInput(f"{where}: strategy={strategy!r}; expected an interp.Strategy: "
                   f"{', '.join(f'Strategy.{s.name}' for s in Strategy)}.")


@dataclass(frozen=True)
class _Path:
    """How one intervention (or the clean run) is measured, chosen by `Run._path`: "resume" (head ablations resumed
    by the engine), "engine" (the engine's hooked forward per head set), "batched" (the batch expanded per head) with
    the ablation `kind`, "sweep" (edge patches, by the sweep engine of their `source`), or "hooked" (any
    intervention, its hooks on one forward per batch)."""

    how: Literal["resume", "engine", "batched", "hooked", "sweep"]
    kind: AblationKind = "mean"
    source: str | None = None  # "sweep": the corrupted prompts' fingerprint (None: resampled)


@runtime_checkable
class Intervention(Protocol):
    """What `Run.effect` accepts: plain data naming it, and the hooks it sets for one batch.

    `spec()` is the memo key: two interventions with equal specs share one number on a Run. One whose
    spec cannot tell instances apart (it computes something per batch) adds `fingerprint(run) -> str | None`,
    a digest of what it will do on the run's prompts, as `AttentionKnockout` and `PatternSubstitution` do."""

    def spec(self) -> dict[str, Any]: ...

    def intervene(self, run: "Run", batch: PromptSet) -> ContextManager[Any]: ...


@dataclass(frozen=True)
class Effect:
    """The behaviour's change under one intervention, per prompt: `values = intervened - clean`."""

    intervention: dict[str, Any]  # its spec()
    values: torch.Tensor  # (prompt,) float64
    clean: torch.Tensor  # (prompt,) the behaviour without the intervention
    intervened: torch.Tensor  # (prompt,) with it
    mean: float
    ci_low: float
    ci_high: float
    behaviour: str  # which behaviour, in words
    unit: str
    n_prompts: int
    ablation: str | None = None  # the ablation kind applied (HeadAblation.resolved_kind); None for other interventions

    def ci(self) -> tuple[float, float]:
        return self.ci_low, self.ci_high

    def frame(self) -> pd.DataFrame:
        """One row: the intervention, the ablation applied, the mean change and its CI, the clean mean, the behaviour."""
        return pd.DataFrame([{"intervention": json.dumps(self.intervention, sort_keys=True), "ablation": self.ablation,
                              "effect": self.mean, "ci_low": self.ci_low, "ci_high": self.ci_high,
                              "clean": float(self.clean.mean()), "behaviour": self.behaviour, "unit": self.unit,
                              "n_prompts": self.n_prompts}])


SAMPLED = 4096  # values per tensor in the memo key's checksum (see the module)


def parameter_version(model: nn.Module) -> tuple[tuple[int, int, float], ...]:
    """(storage, in-place version, sampled checksum) of every parameter and buffer: changes when any is edited in
    place (`.data` writes included, see the module) or replaced."""
    tensors = [t for t in (*model.parameters(), *model.buffers()) if not t.is_meta] if isinstance(model, nn.Module) else []
    return tuple((t.data_ptr(), t._version, checksum) for t, checksum in zip(tensors, _sampled_sums(tensors)))


@torch.no_grad()
def _sampled_sums(tensors: list[torch.Tensor]) -> list[float]:
    """Each tensor's sum over `SAMPLED` evenly spaced values (all of a smaller one), in float64; one transfer per
    device. NaN is mapped to a number so that a key stays equal to itself."""
    sums: list[torch.Tensor] = []
    for tensor in tensors:
        flat = tensor.detach().reshape(-1)
        sums.append(flat[:: max(1, flat.numel() // SAMPLED)].sum(dtype=torch.float64))
    by_device: dict[torch.device, list[int]] = {}
    for index, total in enumerate(sums):
        by_device.setdefault(total.device, []).append(index)
    values = [0.0] * len(sums)
    for indices in by_device.values():
        stacked = torch.nan_to_num(torch.stack([sums[i] for i in indices]), nan=1.0e300).tolist()
        for i, value in zip(indices, stacked):
            values[i] = value
    return values


class Run:
    """A model, its prompts, a behaviour and the settings every causal measurement shares (see the module)."""

    def __init__(self, model: nn.Module, prompts: PromptSet, *, behaviour: BehaviourLike = None,
                 positions: Positions = "auto", batch_size: int = 16, seed: int = 0,
                 strategy: Strategy | str = Strategy.AUTO,
                 reference: PromptSet | ReferenceActivations | None = None, device: Device = None,
                 dtype: DType = None) -> None:
        _, self.seed = check_inputs("Run", model, prompts, seed=seed)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise BadInput(f"Run: batch_size={batch_size!r} must be a whole number of at least 1.")
        strategy = as_strategy(strategy)
        self.model = launch.move(model, device=device, dtype=dtype, copy=True)
        check_prompts(prompts, n_ctx=context_length(self.model), d_vocab=vocab_size(self.model))  # plain models too
        self.prompts = prompts
        self.behaviour: Behaviour = as_behaviour(behaviour, self.model, positions=positions)
        self.batch_size, self._reference = batch_size, reference
        self.strategy: Strategy = strategy
        self._memo: dict[tuple[Any, ...], Any] = {}
        self._derived: dict[Behaviour, Run] = {}  # with_behaviour's runs, one per behaviour
        self._warned_hooks = False  # the warning that hooks stop the memo is given once per Run

    def __repr__(self) -> str:
        return (f"Run({type(self.model).__name__}, {len(self.prompts)} prompts, behaviour={self.behaviour.name!r}, "
                f"batch_size={self.batch_size}, seed={self.seed}, strategy={self.strategy.value!r})")

    # -- the memo

    def cached(self, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
        """`compute()` once per key, the prompts' content and the parameters' version (every time while a
        forward hook is attached to the model: see `memoising`)."""
        if not self.memoising():
            return compute()
        full = self._key(key)
        if full not in self._memo:
            self._memo[full] = compute()
        value: T = self._memo[full]  # stored by compute() under this key
        return value

    def memoising(self) -> bool:
        """Whether numbers may be memoised now: not while a forward hook is attached to the model (it may change
        them), which is said once per Run in a warning."""
        hooks = attached_forward_hooks(self.model)
        if hooks and not self._warned_hooks:
            self._warned_hooks = True
            where = ", ".join(repr(path) if path else "the model itself" for path in hooks[:3])
            more = f" and {len(hooks) - 3} more" if len(hooks) > 3 else ""
            warnings.warn(f"Run: forward hooks are attached to the model (at {where}{more}); while they are, every "
                          "effect is computed afresh under them and nothing is memoised. Remove them to memoise again.",
                          UserWarning, stacklevel=3)
        return not hooks

    def forget(self) -> None:
        """Drop every memoised value. Call it after editing a few weights through `.data` (or `p.data.copy_(...)`):
        torch's version counter does not count such writes, and the key's sampled checksum may miss a write to a
        few values (see the module)."""
        self._memo.clear()

    def memo_keys(self) -> list[MemoKey]:
        """What is memoised, as readable keys (this Run's and its `with_behaviour` runs'): the kind ("effect",
        "clean", "reference", "engine", ...), the behaviour, what was computed (an effect: its intervention's
        spec, as JSON, and the digest of its content where it has one) and the prompts' fingerprint."""
        keys = [_readable(full, self.behaviour) for full in self._memo]
        for derived in self._derived.values():
            keys += [_readable(full, derived.behaviour) for full in derived._memo]
        return keys

    def with_behaviour(self, behaviour: BehaviourLike) -> "Run":
        """The same model, prompts and settings measuring another behaviour (a memo of its own, kept here)."""
        chosen = as_behaviour(behaviour, self.model)
        if chosen == self.behaviour:
            return self
        if chosen not in self._derived:
            other = Run.__new__(Run)
            other.__dict__.update(self.__dict__)
            other.behaviour, other._memo, other._derived = chosen, {}, {}
            self._derived[chosen] = other
        return self._derived[chosen]

    def on(self, prompts: PromptSet) -> "Run":
        """The same model, behaviour and settings on other prompts (the memo is shared: its keys hold the prompts' content)."""
        check_inputs("Run.on", self.model, prompts, seed=self.seed)
        check_prompts(prompts, n_ctx=context_length(self.model), d_vocab=vocab_size(self.model))
        other = Run.__new__(Run)
        other.__dict__.update(self.__dict__)
        other.prompts, other._derived = prompts, {}
        return other

    # -- what the interventions read

    def reference(self, kind: str) -> ReferenceActivations | None:
        """Mean / resample ablation values at `z`, over the prompts the model reads under the behaviour
        (or the `reference=` given), matched by token role (`interp.interventions.reference_activations`);
        None for zero ablation. Resample and "auto" share one reference that keeps every prompt's values."""
        if kind not in ABLATION_KINDS:
            raise BadInput(f"ablation kind {kind!r}; expected one of {list(ABLATION_KINDS)}.")
        if kind == "zero":
            return None
        if isinstance(self._reference, ReferenceActivations):
            return self._reference
        source = self.behaviour.model_prompts(self.prompts) if self._reference is None else self._reference
        samples = needs_samples(kind)
        return self.cached(("reference", samples), lambda: reference_activations(
            self.model, source, site="z", keep_samples=samples, batch_size=self.batch_size))

    def clean_summary(self) -> torch.Tensor | None:
        """What a compare-to-clean behaviour compares with (e.g. pooled embeddings); None otherwise."""
        return self.cached(("clean-summary",), lambda: clean_summaries(self.model, self.prompts, self.behaviour,
                                                                        batch_size=self.batch_size))

    def engine(self, kind: AblationKind, fast: bool = True) -> AblationEngine:
        """The ablation engine for `kind` (`interp.ablation.AblationEngine`; `fast`: resuming where the model
        allows it, else one hooked forward per head set), built once."""
        from interp.ablation import AblationEngine

        return self.cached(("engine", kind, fast), lambda: AblationEngine(
            self.model, self.prompts, kind, reference=self.reference(kind), behaviour=self.behaviour,
            batch_size=self.batch_size, seed=self.seed, fast=fast))

    def sweep(self, source: PromptSet | None = None) -> PatchSweep:
        """The edge-sweep engine (`interp.sweep.PatchSweep`) for the corrupted `source` (None: resampled prompts),
        built once: `effects([EdgePatch(...), ...])` computes edge patches through it (see the module). It keeps every
        node's clean and corrupted writes per batch while memoised, one engine at a time (another prompt set or source
        replaces it; the effects stay memoised); `forget()` drops it."""
        from interp.sweep import PatchSweep

        key = ("sweep", None if source is None else prompt_fingerprint(source))
        if self.memoising() and self._key(key) not in self._memo:
            # one engine at a time in the memo (shared with `on`'s runs): each holds every node's clean and corrupted
            # writes (about 1.8 GB for 32 prompts of 41 tokens on SmolLM2-135M); the effects it computed stay
            for old in [full for full in self._memo if isinstance(full[0], tuple) and full[0][:1] == ("sweep",)]:
                del self._memo[old]
        return self.cached(key, lambda: PatchSweep(self, source))

    # -- measurements

    def clean(self) -> torch.Tensor:
        """The behaviour without intervention, per prompt (prompt,) float64, computed as the strategy does."""
        return self.cached(("clean", self._path(None)), self._compute_clean)

    def values(self, intervention: Intervention) -> torch.Tensor:
        """The behaviour under `intervention`, per prompt (prompt,) float64."""
        return self.effect(intervention).intervened

    def effect(self, intervention: Intervention) -> Effect:
        """Intervened minus clean, per prompt, with its mean and 95% bootstrap CI (see the module). Every
        causal number of the toolkit is read through here.

        Memoised under the intervention's spec (and fingerprint), the prompts and the parameters' version: an
        in-place edit (`W_Q[h] *= 0` under no_grad) recomputes, and so does an edit through `.data` that the
        sampled checksum sees (a head's weights scaled or zeroed; call `forget()` after editing a few values);
        while a forward hook is attached, nothing is memoised (a warning says so once)."""
        self._spec(intervention)  # checks it is one
        if not self.memoising():
            return self._computed([intervention])[0]
        key = self._effect_key(intervention)
        if key not in self._memo:
            self._memo[key] = self._computed([intervention])[0]
        effect: Effect = self._memo[key]
        return effect

    def effects(self, interventions: Iterable[Intervention]) -> list[Effect]:
        """`effect` of each, computing the missing ones together where the strategy can (one sweep of the prompts;
        one at a time while a forward hook stops the memo)."""
        interventions = list(interventions)
        for intervention in interventions:
            self._spec(intervention)  # checks each is one, before any work
        if not self.memoising():
            return [self._computed([intervention])[0] for intervention in interventions]
        state = self._state()  # once for the whole list: the checksum passes over every parameter
        keys = [self._effect_key(intervention, state) for intervention in interventions]
        missing: dict[tuple[Any, ...], Intervention] = {}
        for key, intervention in zip(keys, interventions):
            if key not in self._memo:
                missing.setdefault(key, intervention)
        for key, effect in zip(missing, self._computed(list(missing.values()))):
            self._memo[key] = effect
        return [self._memo[key] for key in keys]

    def _effect_key(self, intervention: Intervention, state: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        content = f"content={content_digest(intervention)}"
        return self._key(("effect", self._spec(intervention), content, _fingerprint(intervention, self)), state)

    def _computed(self, interventions: list[Intervention]) -> list[Effect]:
        """The effects of `interventions`, computed together per path (nothing read from or put in the memo)."""
        by_path: dict[_Path, list[int]] = {}
        for index, intervention in enumerate(interventions):
            by_path.setdefault(self._path(intervention), []).append(index)
        effects: dict[int, Effect] = {}
        for path, indices in by_path.items():
            group = [interventions[i] for i in indices]
            effects.update(zip(indices, self._effects_of(group, *self._compute(path, group))))
        return [effects[i] for i in range(len(interventions))]

    # -- the strategy picker

    def _path(self, intervention: Intervention | None) -> _Path:
        """How this intervention (None: the clean run) is measured (`_Path`)."""
        from interp.ablation import resumable
        from interp.sweep import sweepable

        if isinstance(intervention, EdgePatch) and self.strategy is not Strategy.HOOKED \
                and self.behaviour.reads != "activation" and sweepable(self.model):
            return _Path("sweep", source=None if intervention.source is None else prompt_fingerprint(intervention.source))
        if intervention is not None and not (isinstance(intervention, HeadAblation) and intervention.site == "z"):
            return _Path("hooked")
        if self.behaviour.reads == "activation":  # the engines read final outputs; an activation needs its hook
            return _Path("hooked")
        kind = intervention.kind if isinstance(intervention, HeadAblation) else "mean"
        if self.strategy is Strategy.BATCHED:
            return _Path("batched", kind)
        if self.strategy is Strategy.RESUME and not resumable(self.model):
            raise BadInput(f"Run: strategy=Strategy.RESUME needs a model whose blocks allow resuming "
                           f"(interp.ablation.resumable); {type(self.model).__name__} does not. Use Strategy.AUTO or "
                           "Strategy.HOOKED.")
        if self.strategy is Strategy.HOOKED or not resumable(self.model):
            return _Path("engine", kind)
        return _Path("resume", kind)

    def _compute_clean(self) -> torch.Tensor:
        path = self._path(None)
        if path.how == "resume":
            return self.engine(path.kind)._losses([])[0]
        if path.how == "batched":
            return self._batched(path.kind, [])[0]
        return measure(self.model, self.prompts, self.behaviour, clean=self.clean_summary(),
                       batch_size=self.batch_size, what="clean run")

    def _compute(self, path: _Path, group: list[Intervention]) -> tuple[torch.Tensor, torch.Tensor]:
        """Clean values (prompt,) and intervened values (intervention, prompt) for a group on one path."""
        if path.how in ("resume", "engine"):
            return self.engine(path.kind, fast=path.how == "resume")._losses([_heads(i) for i in group])
        if path.how == "batched":
            return self._batched(path.kind, group)
        if path.how == "sweep":
            patches = cast(list[EdgePatch], group)
            sweep = self.sweep(patches[0].source)  # one source per path
            return sweep.clean(), sweep.values([patch.edges for patch in patches])
        rows = [self._hooked(intervention) for intervention in group]
        return self.clean(), torch.stack(rows) if rows else torch.zeros(0, len(self.prompts), dtype=torch.float64)

    def _hooked(self, intervention: Intervention) -> torch.Tensor:
        """One hooked forward per batch under `intervention`, resumed from the clean residual stream entering the
        first layer it touches when the model can resume (`interp.ablation.resumable`): every layer before is the
        clean run's, computed once per batch, so an intervention at layer 17 of 30 reruns 13 blocks, not 30."""
        from interp.ablation import resumable

        what = json.dumps(intervention.spec())
        layer = _first_layer(intervention)
        if layer is None or layer < 1 or not resumable(self.model):
            return measure(self.model, self.prompts, self.behaviour, clean=self.clean_summary(),
                           intervene=_bound(intervention, self), batch_size=self.batch_size, what=what)
        model = cast(HookedGPT, self.model)
        clean, out, start = self.clean_summary(), [], 0
        device = next(model.parameters()).device
        for index, batch in enumerate(self.prompts.batches(self.batch_size)):
            read = self.behaviour.model_prompts(batch)
            tokens = read.tokens.to(device)
            mask = None if read.attention_mask is None else read.attention_mask.to(device)
            resid = self.cached(("resid-pre", layer, index, self.batch_size, self.behaviour.name),
                                functools.partial(_clean_resid, model, tokens, mask, layer))
            with torch.no_grad(), intervention.intervene(self, read):
                final = model.run_from(layer, resid, attention_mask=mask)
                output = model.head(final) if self.behaviour.reads == "logits" else model.ln_final(final)
            reference = None if clean is None else clean[start:start + len(batch)]
            out.append(check_values(self.behaviour(output, batch, reference), len(batch), what, self.behaviour)
                       .detach().double().cpu())
            start += len(batch)
        return torch.cat(out)

    def _batched(self, kind: AblationKind, group: list[Intervention]) -> tuple[torch.Tensor, torch.Tensor]:
        heads = [_heads(i) for i in group]
        if any(len(h) != 1 for h in heads):
            raise BadInput("Run: Strategy.BATCHED ablates one head at a time; use Strategy.RESUME or Strategy.HOOKED for "
                           "sets of heads.")
        from interp.ablation import batched_values

        return batched_values(self.model, self.prompts, self.behaviour, [h[0] for h in heads] or None, kind,
                              reference=self.reference(kind), seed=self.seed, batch_size=self.batch_size)

    def _effects_of(self, group: Sequence[Intervention], clean: torch.Tensor, intervened: torch.Tensor) -> list[Effect]:
        effects = []
        for intervention, row in zip(group, intervened):
            values = (row - clean).double()  # (prompt,)
            mean, low, high = (float(v) for v in bootstrap(values, seed=self.seed, label=self._spec(intervention)))
            ablation = intervention.resolved_kind(self) if isinstance(intervention, HeadAblation) else None
            effects.append(Effect(intervention.spec(), values, clean.double(), row.double(), mean, low, high,
                                  self.behaviour.describe(self.prompts), self.behaviour.unit, len(values), ablation))
        return effects

    def _key(self, key: tuple[Any, ...], state: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        return (key, *(self._state() if state is None else state))

    def _state(self) -> tuple[Any, ...]:
        """What the memo key holds besides the computation: the prompts' content and the parameters' version."""
        return prompt_fingerprint(self.prompts), parameter_version(self.model)

    @staticmethod
    def _spec(intervention: Intervention) -> str:
        if not isinstance(intervention, Intervention):
            raise BadInput(f"Run.effect needs an intervention (a frozen dataclass with spec() and intervene(run, batch), "
                           f"e.g. interp.HeadAblation('L1H2', 'mean')); got {type(intervention).__name__}.")
        return json.dumps(intervention.spec(), sort_keys=True)


class MemoKey(NamedTuple):
    """One memoised value of a Run, in words (`Run.memo_keys`)."""

    kind: str  # "effect", "clean", "reference", "engine", "resid-pre", ...
    behaviour: str  # the behaviour's name and parameters
    what: str  # the rest of the key: an effect's intervention spec (JSON) and content digest
    prompts: str  # the prompt set's fingerprint (`prompt_fingerprint`), shortened


def _readable(full: tuple[Any, ...], behaviour: Behaviour) -> MemoKey:
    key, prompts = full[0], full[1]
    params = ", ".join(f"{name}={value}" for name, value in behaviour.params)
    parts = [part if isinstance(part, str) else repr(part) for part in key[1:] if part is not None]
    return MemoKey(str(key[0]), behaviour.name + (f"({params})" if params else ""), " ".join(parts), str(prompts)[:12])


RUN_OPTIONS = ("behaviour", "positions", "batch_size", "seed", "strategy", "reference", "device", "dtype")


def as_run(model: "nn.Module | Run", prompts: PromptSet | None, *, where: str, **options: Any) -> Run:
    """The Run an analysis measures: `model` itself when it is one, else `Run(model, prompts, **options)`.

    Options left None take the Run's defaults; with a Run given, every option must be left None (the
    Run carries them) and `prompts` too.
    """
    unknown = sorted(set(options) - set(RUN_OPTIONS))
    if unknown:
        raise TypeError(f"{where}: {unknown} are not Run options ({list(RUN_OPTIONS)}).")
    given = {name: value for name, value in options.items() if value is not None}
    if isinstance(model, Run):
        if prompts is not None or given:
            extra = ["prompts"] * (prompts is not None) + sorted(given)
            raise BadInput(f"{where}: a Run carries its prompts and settings; {extra} cannot be given beside it. "
                           "Build another Run with them, or pass (model, prompts, ...) instead.")
        return model
    if prompts is None:
        raise BadInput(f"{where}: pass a Run, or a model and its prompts.")
    check_inputs(where, model, prompts, seed=given.get("seed", 0))  # errors name the analysis, not the Run
    return Run(model, prompts, **given)


def _heads(intervention: Intervention) -> list[tuple[int, int]]:
    assert isinstance(intervention, HeadAblation)  # only head ablations take the resume and batched paths
    return list(intervention.heads)


def content_digest(value: Any) -> str:
    """A digest of what an intervention holds: its fields, recursively (dataclasses, tuples, lists, dicts), every
    tensor by its bytes (`tensor_digest`) and every prompt set by `prompt_fingerprint`, plain values by repr, any
    other object by its type's name (such an object says what it computes through `fingerprint(run)`). Part of the
    memo key, so two interventions whose spec() is equal but whose tensors differ never share a number."""
    digest = hashlib.blake2b(digest_size=8)
    for part in _content_parts(value, depth=0):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _content_parts(value: Any, depth: int) -> Iterable[str]:
    if depth > 8:  # deeper than any intervention's data: named by its type
        yield type(value).__qualname__
    elif isinstance(value, torch.Tensor):
        yield "tensor:" + tensor_digest(value)
    elif isinstance(value, PromptSet):
        yield "prompts:" + prompt_fingerprint(value)
    elif value is None or isinstance(value, (bool, int, float, str, bytes)):
        yield repr(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield type(value).__qualname__
        for field in dataclasses.fields(value):
            yield field.name
            yield from _content_parts(getattr(value, field.name), depth + 1)
    elif isinstance(value, (tuple, list)):
        yield f"{type(value).__name__}[{len(value)}]"
        for item in value:
            yield from _content_parts(item, depth + 1)
    elif isinstance(value, dict):
        yield f"dict[{len(value)}]"
        for key, item in value.items():
            yield repr(key)
            yield from _content_parts(item, depth + 1)
    else:
        yield type(value).__qualname__


def _fingerprint(intervention: Intervention, run: Run) -> str | None:
    """The intervention's `fingerprint(run)` where it has one (see `Intervention`), else None."""
    fingerprint = getattr(intervention, "fingerprint", None)
    return fingerprint(run) if callable(fingerprint) else None


def _bound(intervention: Intervention, run: Run) -> Callable[[PromptSet], ContextManager[Any]]:
    return lambda batch: intervention.intervene(run, batch)


# interventions whose hooks act only at their heads' layers, so a forward may resume at the earliest of them
_RESUMABLE_INTERVENTIONS = (HeadAblation, PatternSubstitution, AttentionKnockout)


def _first_layer(intervention: Intervention) -> int | None:
    """The earliest layer an intervention's hooks act at, for the kinds known to act at their heads' layers alone
    (None for any other: a user's intervention or an edge patch reads earlier layers)."""
    if not isinstance(intervention, _RESUMABLE_INTERVENTIONS):
        return None
    heads = [intervention.head] if isinstance(intervention, (PatternSubstitution, AttentionKnockout)) else intervention.heads
    return min((int(layer) for layer, _ in heads), default=None)


@torch.no_grad()
def _clean_resid(model: HookedGPT, tokens: torch.Tensor, mask: torch.Tensor | None, layer: int) -> torch.Tensor:
    """The clean residual stream entering block `layer` (batch, pos, d_model), no hook attached."""
    resid: torch.Tensor = model(tokens, attention_mask=mask, stop_at_layer=layer)
    return resid


__all__ = ["Effect", "Intervention", "MemoKey", "Run", "RUN_OPTIONS", "STRATEGIES", "Strategy", "as_run", "as_strategy",
           "content_digest",
           "parameter_version", "prompt_fingerprint"]
