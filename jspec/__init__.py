"""jspec: exact speculative decoding in JAX.

A cheap drafter proposes K tokens, the target model verifies them in one
forward pass, and a vectorised rejection sampler keeps the longest acceptable
run plus one token of the target's own. Output follows the target's
distribution exactly; greedy output equals the target's own greedy output.
"""

from jspec import acceptance, decode, eagle, medusa, sampling, sharding, tree
from jspec.decode import DecodeConfig, DecodeState, DecodeStats
from jspec.draft_model import DraftModel
from jspec.schedule import AutoK
from jspec.drafter import DraftContext, Drafter
from jspec.api import GenerateOutput, generate, speculative_generate
from jspec.checkpoint import load, save
from jspec.datastore import Datastore
from jspec.model import Model, OutputHead
from jspec.ngram import NGram
from jspec.sampling import SamplingParams
from jspec.text import generate_text
from jspec.tokenizer import Tokenizer
from jspec.tree import Tree
from jspec.eagle import Eagle, EagleConfig, load_eagle, save_eagle
from jspec.medusa import Medusa, load_medusa, save_medusa

from jspec import models  # noqa: E402  (the model zoo, installed from models/)
from jspec import linen, nnx  # noqa: E402  (Flax adapters: Linen modules, NNX state in jit)

__version__ = "0.1.0"

__all__ = [
    "AutoK",
    "DecodeConfig",
    "DecodeState",
    "DecodeStats",
    "Datastore",
    "DraftContext",
    "DraftModel",
    "Eagle",
    "EagleConfig",
    "Drafter",
    "GenerateOutput",
    "Medusa",
    "Model",
    "NGram",
    "OutputHead",
    "SamplingParams",
    "Tokenizer",
    "Tree",
    "acceptance",
    "decode",
    "eagle",
    "generate",
    "generate_text",
    "linen",
    "medusa",
    "load",
    "load_eagle",
    "load_medusa",
    "models",
    "nnx",
    "sampling",
    "sharding",
    "save",
    "save_eagle",
    "save_medusa",
    "speculative_generate",
    "tree",
]
