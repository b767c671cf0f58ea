"""jspec: exact speculative decoding in JAX.

A cheap drafter proposes K tokens, the target model verifies them in one
forward pass, and a vectorised rejection sampler keeps the longest acceptable
run plus one token of the target's own. Output follows the target's
distribution exactly; greedy output equals the target's own greedy output.

The package, in layers (docs/architecture.md):

    jspec.core      the model contract, decode state, rounds, acceptance, the loops
    jspec.drafters  draft model, n-gram, datastore, suffix, lookahead, Medusa, EAGLE
    jspec.io        checkpoints, Hugging Face and GGUF, tokenizers, Flax adapters
    jspec.tools     the command line, measurement, benchmarks, profiles
    jspec.models    the model zoo (reference decoder, converters, training)

The names below are what most users need; everything else lives in those packages.
"""

from jspec.core.api import generate, speculative_generate
from jspec.core.constraint import Constraint
from jspec.core.drafter import Drafter
from jspec.core.dynamic_tree import DynamicTree
from jspec.core.logprobs import Logprobs
from jspec.core.model import Model, OutputHead
from jspec.core.sampling import SamplingParams
from jspec.core.schedule import AutoK
from jspec.core.tree import Tree
from jspec.drafters.datastore import Datastore
from jspec.drafters.draft_model import DraftModel
from jspec.drafters.eagle import Eagle, EagleConfig
from jspec.drafters.lookahead import Lookahead
from jspec.drafters.medusa import Medusa
from jspec.drafters.ngram import NGram
from jspec.drafters.suffix import Suffix
from jspec.io.checkpoint import load, save
from jspec.io.text import generate_text
from jspec.io.tokenizer import Tokenizer

from jspec import core, drafters, io, tools  # noqa: E402  (the layers, as namespaces)
from jspec import models  # noqa: E402  (the model zoo, installed from models/)

__version__ = "0.1.0"

__all__ = [
    "AutoK",
    "Constraint",
    "Datastore",
    "DraftModel",
    "Drafter",
    "DynamicTree",
    "Eagle",
    "EagleConfig",
    "Logprobs",
    "Lookahead",
    "Medusa",
    "Model",
    "NGram",
    "OutputHead",
    "SamplingParams",
    "Suffix",
    "Tokenizer",
    "Tree",
    "generate",
    "generate_text",
    "load",
    "save",
    "speculative_generate",
]
