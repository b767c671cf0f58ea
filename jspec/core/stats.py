"""Per-row counters of a decoding run: rounds, accepted drafts, and acceptance by
draft position (what `jspec measure` reports per prompt)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeStats:
  """Per-row counters a run accumulates (tau and acceptance: `jspec.bench.metrics`).

  K is the program's largest draft length (a tree's depth). One definition serves
  every counter: a draft counts as accepted only if it was emitted. A round that
  accepted n drafts and committed `count` tokens (n + 1, or fewer where EOS or
  max_new_tokens cut it) accepted m = min(n, count) of them: drafts the target
  accepted past an EOS or past max_new_tokens were never emitted, and count for
  nothing. Draft position i (0-based) is judged in a round that drafted at least
  i + 1 tokens along its chain (or its tree's depth) and emitted a token at
  position i (its i drafts before were accepted, and no cut came before it); it is
  accepted when that token was the draft (m > i). So `row_hist` bins rounds by m,
  `accepted` is the sum of `position_accepted`, and a draft cut off is neither a
  rejection nor an acceptance.
  """

  target_calls: jax.Array  # [B] int32 rounds in which the row was active
  accepted: jax.Array  # [B] int32 draft tokens accepted and emitted
  row_hist: jax.Array  # [B, K+1] int32 active rounds by accepted (emitted) count m, per row
  position_judged: jax.Array  # [B, K] int32 active rounds that judged draft position i

  @property
  def accept_hist(self) -> jax.Array:
    """[K+1] int32 active rounds by accepted count n, over the batch."""
    return jnp.sum(self.row_hist, axis=0)

  @property
  def position_accepted(self) -> jax.Array:
    """[B, K] int32 rounds whose draft at position i was accepted and emitted (m > i)."""
    return jnp.flip(jnp.cumsum(jnp.flip(self.row_hist[:, 1:], axis=1), axis=1), axis=1)

  def position_acceptance(self) -> jax.Array:
    """[B, K] f32 per row: of the rounds that judged draft position i, the fraction
    that accepted it (NaN where it was never judged)."""
    judged = self.position_judged.astype(jnp.float32)
    accepted = self.position_accepted.astype(jnp.float32)
    return jnp.where(judged > 0, accepted / jnp.maximum(judged, 1.0), jnp.nan)


def init(B: int, K: int) -> DecodeStats:
  """Zero counters for B rows of a program whose largest draft length is K."""
  zeros = jnp.zeros((B,), jnp.int32)
  return DecodeStats(target_calls=zeros, accepted=zeros, row_hist=jnp.zeros((B, K + 1), jnp.int32),
                     position_judged=jnp.zeros((B, K), jnp.int32))


def after_round(stats: DecodeStats, active, n, count, K: int) -> DecodeStats:
  """Counters after a round of K drafts (chain length or tree depth) that accepted n
  [B] and committed count [B] (0 for rows already done); active [B] bool: rows that
  were not done."""
  act = active.astype(jnp.int32)
  width = stats.position_judged.shape[1]  # the program's largest K
  i = jnp.arange(width)[None, :]
  # Emitted drafts only (class docstring): the target's acceptance of drafts past an
  # EOS or max_new_tokens is not evidence anyone sees, and counting it made
  # position_accepted and row_hist disagree with `accepted`.
  m = jnp.minimum(n, count)
  # Position i was drafted, and a token (the draft or the target's own) emitted there.
  judged = active[:, None] & (i < K) & (i < count[:, None])
  return DecodeStats(
      target_calls=stats.target_calls + act,
      accepted=stats.accepted + m,
      row_hist=stats.row_hist + act[:, None] * jax.nn.one_hot(m, width + 1, dtype=jnp.int32),
      position_judged=stats.position_judged + judged.astype(jnp.int32),
  )


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
