"""jspec's model zoo: architectures that implement the model contract.

Installed as `jspec.models`. The engine and the drafters never import from here
(`tests/test_layering.py`); these modules produce `jspec.Model` objects the engine
consumes, built from the blocks in `jspec.core.nn`.
"""

from jspec.core.nn import (
    DenseMLP,
    GatedMLP,
    LayerNorm,
    Learned,
    LinearScaling,
    Llama3Scaling,
    RMSNorm,
    Rotary,
)
from jspec.models.transformer import (
    Transformer,
    TransformerConfig,
    apply,
    init,
    init_cache,
    init_params,
    make_model,
    quantize_model,
    quantize_params,
)

__all__ = [
    "DenseMLP",
    "GatedMLP",
    "LayerNorm",
    "Learned",
    "LinearScaling",
    "Llama3Scaling",
    "RMSNorm",
    "Rotary",
    "Transformer",
    "TransformerConfig",
    "apply",
    "init",
    "init_cache",
    "init_params",
    "make_model",
    "quantize_model",
    "quantize_params",
]
