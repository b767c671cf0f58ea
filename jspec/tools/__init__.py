"""Measurement and the command line: `jspec` (cli), the demo and chat, `measure`,
the benchmarks, per-call timing, the profile "auto" reads and its cost prior.
Nothing in the decoding path imports these.
"""
