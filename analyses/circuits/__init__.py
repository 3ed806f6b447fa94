"""Circuits: how heads compose, measured and tested like every other claim.

- `dla`: direct logit attribution, `direct_logit_attribution(model, prompts)`: each component's (embeddings,
  every head, every MLP, the biases) direct contribution to the right token's logit per prompt, with CIs,
  the final norm's scale frozen from the clean run (`logit_attributions` keeps the per-prompt values);
- `composition`: Q-, K- and V-composition scores from the weights (Elhage et al. 2021), each against
  a random baseline of the same shapes;
- the edges and their patching live in `interp.paths` (`Edge`, `EdgePatch`): a path patch is
  `interp.Run(...).effect(EdgePatch([edge]))`.
"""
from interp.analyses.circuits.composition import baseline, composition_scores
from interp.analyses.circuits.dla import FROZEN_SCALE, LogitAttribution, direct_logit_attribution, logit_attributions

__all__ = ["FROZEN_SCALE", "LogitAttribution", "baseline", "composition_scores", "direct_logit_attribution",
           "logit_attributions"]
