"""jspec: exact speculative decoding in JAX.

A cheap drafter proposes K tokens, the target model verifies them in one
forward pass, and a vectorised rejection sampler keeps the longest acceptable
run plus one token of the target's own. Output follows the target's
distribution exactly; greedy output equals the target's own greedy output.

The package, in layers (docs/architecture.md; each imports only those below it):

    jspec.recipes   rebuilding the shipped checkpoints end to end
    jspec.tools     the command line, measurement, benchmarks, profiles
    jspec.training  corpus, trainer, the decoder's and the drafters' objectives
    jspec.io        checkpoints, Hugging Face and GGUF, tokenizers, Flax adapters
    jspec.planner   the host side of a call: inputs, plan, placement, round costs
    jspec.drafters  draft model, n-gram, datastore, suffix, token recycling, lookahead,
                    Medusa, EAGLE, MTP, DFlash
    jspec.models    the model zoo (reference decoder, Hugging Face and GGUF converters)
    jspec.core      the model contract, decode state, rounds, acceptance, the programs

The names below are what most users need; everything else lives in those packages.
They load on first use, so `import jspec.core.decode` loads the engine alone.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# name -> module that defines it
_EXPORTS = {
    "AutoK": "jspec.core.schedule",
    "Constraint": "jspec.core.constraint",
    "Datastore": "jspec.drafters.datastore",
    "DFlash": "jspec.drafters.dflash",
    "DFlashConfig": "jspec.drafters.dflash",
    "DraftModel": "jspec.drafters.draft_model",
    "Drafter": "jspec.core.drafter",
    "DynamicTree": "jspec.core.dynamic_tree",
    "Eagle": "jspec.drafters.eagle",
    "EagleConfig": "jspec.drafters.eagle",
    "Logprobs": "jspec.core.logprobs",
    "Lookahead": "jspec.drafters.lookahead",
    "MTP": "jspec.drafters.mtp",
    "Medusa": "jspec.drafters.medusa",
    "Model": "jspec.core.model",
    "NGram": "jspec.drafters.ngram",
    "OutputHead": "jspec.core.model",
    "SamplingParams": "jspec.core.sampling",
    "Suffix": "jspec.drafters.suffix",
    "TokenRecycling": "jspec.drafters.recycling",
    "Tokenizer": "jspec.io.tokenizer",
    "Tree": "jspec.core.tree",
    "generate": "jspec.planner.api",
    "Engine": "jspec.planner.engine",
    "generate_many": "jspec.planner.many",
    "generate_text": "jspec.io.text",
    "release_caches": "jspec.planner.workspace",
    "load": "jspec.io.checkpoint",
    "load_drafter": "jspec.io.drafter_layouts",
    "save": "jspec.io.checkpoint",
    "speculative_generate": "jspec.planner.api",
}
# The layers, as namespaces (`jspec.models.TransformerConfig`, ...).
_PACKAGES = ("core", "drafters", "models", "planner", "io", "training", "tools", "recipes")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
  elif name in _PACKAGES:
    value = importlib.import_module(f"jspec.{name}")
  else:
    raise AttributeError(f"module 'jspec' has no attribute {name!r}")
  globals()[name] = value  # looked up once
  return value


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS) | set(_PACKAGES))
