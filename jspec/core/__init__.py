"""The engine: the model contract, the decode state and round, acceptance, sampling,
trees, the decode loops and the `generate` / `speculative_generate` entry points.

Nothing here imports `jspec.drafters`, `jspec.io`, `jspec.tools` or `jspec.models`
(tests/test_layering.py); docs/architecture.md draws the layers.
"""
