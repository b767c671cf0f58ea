"""Measured per-call costs of a model: the inputs of the speedup model.

    ideal speedup = tau * T_step / (T_verify + K * T_draft)

with T_step one target call on 1 token, T_verify one target call on K+1 tokens
and T_draft one drafter call, all at the same batch size, measured here
(`jspec.core.stats.ideal_speedup` does the arithmetic).
"""

from __future__ import annotations

import statistics
import time

import jax.numpy as jnp

from jspec.core import compilation
from jspec.core.model import Model


@compilation.program(donate_argnums=(2,))  # compiled as the decoding programs are
def _call(model, tokens, cache, start):
  logits, _, cache = model.apply(tokens, cache, start)
  return logits, cache


def call_time(model: Model, batch: int, block: int, cache_length: int, repeats: int = 30,
              prefix: int = 64) -> float:
  """Median wall time (seconds) of one cached call on `block` tokens per row.

  The block starts at slot `prefix`, so attention sees a realistic committed
  prefix. The cache is donated and fed back, as inside the decode loop.
  """
  if prefix + block > cache_length:
    raise ValueError(f"prefix {prefix} + block {block} exceeds cache_length {cache_length}")
  model = model.prepared()  # the params' decoding form, as inside the decode loop
  cache = model.init_cache(batch, cache_length)
  tokens = jnp.ones((batch, block), jnp.int32)
  start = jnp.full((batch,), prefix, jnp.int32)
  logits, cache = _call(model, tokens, cache, start)  # compile
  logits.block_until_ready()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    logits, cache = _call(model, tokens, cache, start)
    logits.block_until_ready()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)
