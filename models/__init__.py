"""Hooked small transformers; they know nothing of the toolkit built on them."""
import warnings

# transformer-lens imports huggingface_hub, which imports tqdm.auto: in Jupyter without ipywidgets that
# warns "IProgress not found" in every notebook, though no tqdm bar is ever drawn here (bars are rich's)
warnings.filterwarnings("ignore", message="IProgress not found")

from interp.models.config import EncoderConfig, GPTConfig
from interp.models.encoder import HookedEncoder
from interp.models.gpt import HookedGPT

__all__ = ["GPTConfig", "EncoderConfig", "HookedGPT", "HookedEncoder"]
