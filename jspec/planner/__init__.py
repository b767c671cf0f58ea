"""The host side of a decoding call: inputs checked and bucketed, the drafter and K
settled, models and rows placed, `"auto"`'s round costs worked out (profiles read,
the prior's probes timed once per machine and saved), and the program's outputs cut
to what was asked. It hands `jspec.core.programs` plain data; the engine does no
timing, no file I/O and keeps no state between calls.

    api          generate, speculative_generate
    inputs       Request: prompts, per-row settings, EOS ids, seeds, buckets
    plan         Speculation (drafter, K, tree), RoundCosts for "auto"
    placement    Rows: models and per-row arrays on one device or a mesh
    outputs      GenerateOutput
    streams      per-call listeners of streaming programs
    cost_model   the prior on a round's cost; saved profiles
    call_times   how a call's cost grows with its block, timed on the model
    cache_folder jspec's cache folder and the persistent compilation cache
"""
