"""Measured per-call costs of a model: the inputs of the speedup model.

    ideal speedup = tau * T_step / (T_verify + K * T_draft)

with T_step one target call on 1 token, T_verify one target call on K+1 tokens
and T_draft one drafter call, all at the same batch size, measured here.
"""

from __future__ import annotations

import statistics
import time

import jax.numpy as jnp
import numpy as np

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


def ideal_speedup(tau: float, k: int, t_step: float, t_verify: float, t_draft: float) -> float:
  """tau * T_step / (T_verify + k * T_draft): the speedup the measured call costs allow."""
  return tau * t_step / (t_verify + k * t_draft)


def acceptance_rates(accept_hist, emitted: int, target_calls: int) -> dict:
  """Acceptance figures from a run's `DecodeStats`.

  accept_hist [K+1]: rounds by accepted count n. Returns
    tau: tokens emitted per target call;
    alpha: accepted drafts / drafts the target judged (a round that stopped at
      n < K judged n + 1 drafts, one that accepted all K judged K): the per-token
      acceptance rate of Leviathan et al., from which tau = (1 - a^(K+1)) / (1 - a);
    draft_accept: accepted / proposed, E[n] / K.
  """
  hist = np.asarray(accept_hist)
  K = hist.shape[0] - 1
  n = np.arange(K + 1)
  accepted = int(np.sum(hist * n))
  judged = int(np.sum(hist * np.minimum(n + 1, K)))
  rounds = int(np.sum(hist))
  return {"tau": emitted / max(target_calls, 1),
          "alpha": accepted / judged if judged else float("nan"),
          "draft_accept": accepted / (K * rounds) if rounds and K else float("nan")}
