"""jspec: exact speculative decoding in JAX.

A cheap drafter proposes K tokens, the target model verifies them in one
forward pass, and a vectorised rejection sampler keeps the longest acceptable
run plus one token of the target's own. Output follows the target's
distribution exactly; greedy output equals the target's own greedy output.
"""

from jspec import acceptance, decode, sampling
from jspec.decode import DecodeConfig, DecodeState, DecodeStats
from jspec.draft_model import DraftModel
from jspec.drafter import DraftContext, Drafter
from jspec.api import GenerateOutput, generate, speculative_generate
from jspec.model import Model
from jspec.sampling import SamplingParams

from jspec import models  # noqa: E402  (the model zoo, installed from models/)

__version__ = "0.1.0"

__all__ = [
    "DecodeConfig",
    "DecodeState",
    "DecodeStats",
    "DraftContext",
    "DraftModel",
    "Drafter",
    "GenerateOutput",
    "Model",
    "SamplingParams",
    "acceptance",
    "decode",
    "generate",
    "models",
    "sampling",
    "speculative_generate",
]
