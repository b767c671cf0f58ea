"""The measurement harness: one way to name a method, a prompt set, a run and its record.

    methods    the method registry ("ngram:3", "lookahead:5,4,3", "eagle3@tree=32,4,8", a
               drafter folder, "auto" over any of them) and the target resolver (targets)
    workloads  named prompt sets (the held-out chat kinds, Spec-Bench / MT-Bench, a JSONL)
    runner     the one runner: compile outside timing, repeats interleaved with the order
               alternating, memory carried, greedy equality with plain decoding enforced
    records    the one record type, written as JSON lines under a header naming the machine
    metrics    pure functions of records (tau, acceptance by position, paired speedup, ...)
    report     tables by any axis, and plots
    transformers_backend
               transformers' `generate` as a second backend of the runner (`call=`), timed
               beside jspec, interleaved (torch and transformers imported only there)
    serve_load `jspec bench serve`: request-rate sweeps against an OpenAI-compatible
               server, a record per request

Studies (`jspec bench`: pair on the shipped code pair, device with --device gpu;
`jspec measure`, the scripts of benchmarks/, and the modules here run as `python -m
jspec.bench.NAME`: lookahead, heads_real, suffix, constraint, sampling, ngram, recycling,
eagle_trees) are short declarations over these. Nothing in the decoding
path imports this package.
"""
