"""The engine: the model contract, the decode state and round, acceptance, sampling,
trees, the decode loops and the compiled programs (`programs`).

Pure and traceable: no timing, no file I/O, no state kept between calls, and no import
of any package above it (drafters, models, planner, io, training, tools, recipes);
tests/test_layering.py checks all three. `jspec.planner` drives it from the host.
"""
