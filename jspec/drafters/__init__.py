"""Drafters: a draft model, n-gram, datastore and suffix lookup, Medusa and EAGLE heads, and
the save / load their trained weights share (`params_io`). Each follows the drafter
protocol of `jspec.core.drafter`; none imports `jspec.models`.
"""
