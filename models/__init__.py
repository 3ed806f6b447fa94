"""Hooked small transformers; they know nothing of the toolkit built on them."""
from models.config import EncoderConfig, GPTConfig
from models.encoder import HookedEncoder
from models.gpt import HookedGPT

__all__ = ["GPTConfig", "EncoderConfig", "HookedGPT", "HookedEncoder"]
