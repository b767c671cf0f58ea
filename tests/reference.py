"""Plain NumPy references the engine is checked against (float64, one row at a time)."""

import numpy as np


def processed_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
  """The processed next-token distribution of one logit vector, written independently:
  temperature, min-p, top-k, then top-p on what those two kept (vLLM's order)."""
  logits = np.asarray(logits, np.float64)
  V = logits.shape[-1]
  if temperature == 0:
    out = np.zeros(V)
    out[np.argmax(logits)] = 1.0
    return out
  z = logits / temperature
  allowed = np.ones(V, bool)
  if min_p > 0.0:
    p = np.exp(z - z.max())
    allowed &= p >= min_p * p.max()
  if top_k > 0:
    kth = np.sort(z)[::-1][min(top_k, V) - 1]
    allowed &= z >= kth
  probs = np.where(allowed, np.exp(z - z[allowed].max()), 0.0)
  probs /= probs.sum()
  if top_p < 1.0:
    order = np.argsort(-probs, kind="stable")
    mass_before = np.cumsum(probs[order]) - probs[order]
    keep = np.zeros(V, bool)
    keep[order[mass_before < top_p]] = True
    keep = allowed & (z >= z[keep].min())  # ties with the last kept value are kept
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum()
  return probs


def bin_bound(n, p):
  """Per-bin tolerance for a count of n draws with probability p (docs/architecture.md)."""
  return 6.0 * np.sqrt(n * p * (1.0 - p)) + 5.0


def assert_counts_match(counts, probs, what=""):
  """Counts follow probs: every bin within the bound, zero-probability bins empty,
  and a chi-square statistic within 6 standard deviations of its mean."""
  counts = np.asarray(counts, np.float64)
  probs = np.asarray(probs, np.float64)
  n = counts.sum()
  assert n > 0, f"{what}: no samples"
  zero = probs <= 0
  assert counts[zero].sum() == 0, f"{what}: zero-probability bins drawn: {np.flatnonzero(zero & (counts > 0))}"
  err = np.abs(counts - n * probs)
  bound = bin_bound(n, probs)
  bad = np.flatnonzero(err > bound)
  assert bad.size == 0, (f"{what}: bins {bad.tolist()} off: counts {counts[bad].tolist()} "
                         f"expected {(n * probs[bad]).round(1).tolist()}")
  assert chi_square_ok(counts, probs), f"{what}: chi-square {chi_square(counts, probs):.1f} too large"


def _pooled(counts, probs, min_expected=5.0):
  """Bins with expected count >= min_expected, plus one bin pooling all the others
  (a chi-square statistic is only meaningful where expectations are not tiny)."""
  counts = np.asarray(counts, np.float64)
  probs = np.asarray(probs, np.float64)
  n = counts.sum()
  big = n * probs >= min_expected
  c = np.append(counts[big], counts[~big].sum())
  p = np.append(probs[big], probs[~big].sum())
  live = p > 0
  return c[live], p[live]


def chi_square(counts, probs):
  c, p = _pooled(counts, probs)
  expected = c.sum() * p
  return float(np.sum((c - expected) ** 2 / expected))


def chi_square_ok(counts, probs):
  c, p = _pooled(counts, probs)
  df = max(len(p) - 1, 1)
  return chi_square(counts, probs) <= df + 6.0 * np.sqrt(2.0 * df)


def sorted_filter(scaled, top_k, top_p, min_p):
  """The sort-based filter jspec used before its sort-free one (kept here as the
  definition it must reproduce), with min-p in front as vLLM applies it.

  scaled [B, N, V] f32 temperature-scaled logits (JAX); top_k [B] int32 (0: off);
  top_p [B] f32; min_p [B] f32 -> bool [B, N, V], the kept tokens. Min-p: p >= min_p
  * max p on the softmax. Top-k keeps every value >= the k-th largest. Top-p, on what
  those keep: a position of the descending order is kept when the mass strictly before
  it is < top_p, then every value >= the smallest kept one."""
  import jax
  import jax.numpy as jnp
  V = scaled.shape[-1]
  probs = jax.nn.softmax(scaled, axis=-1)
  low = probs < min_p[:, None, None] * jnp.max(probs, axis=-1, keepdims=True)
  scaled = jnp.where(low, -jnp.inf, scaled)
  desc = -jnp.sort(-scaled, axis=-1)  # [B, N, V] descending
  k = jnp.where(top_k > 0, jnp.minimum(top_k, V), V)  # [B]
  kth = jnp.take_along_axis(desc, jnp.broadcast_to((k - 1)[:, None, None], desc.shape[:2] + (1,)),
                            axis=-1)  # [B, N, 1]
  in_top_k = desc >= kth
  desc_probs = jax.nn.softmax(jnp.where(in_top_k, desc, -jnp.inf), axis=-1)
  mass_before = jnp.cumsum(desc_probs, axis=-1) - desc_probs
  top_p = top_p[:, None, None]
  keep = in_top_k & ((mass_before < top_p) | (top_p >= 1.0))
  threshold = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)  # [B, N, 1]
  return (scaled >= threshold) & jnp.isfinite(scaled)


def penalized_logits(logits, prompt, output, repetition=1.0, presence=0.0, frequency=0.0,
                     bias=None):
  """One logit vector after a logit bias and vLLM's penalties, written independently:
  bias added; ids in the prompt or the output divided by `repetition` when positive,
  multiplied when not; then frequency * count and presence * (count > 0) subtracted,
  counting the output only."""
  logits = np.asarray(logits, np.float64)
  V = logits.shape[-1]
  if bias is not None:
    logits = logits + np.asarray(bias, np.float64)
  counts = np.bincount(np.asarray(output, np.int64), minlength=V).astype(np.float64)
  seen = counts > 0
  seen[np.asarray(prompt, np.int64)] = True
  logits = np.where(seen, np.where(logits > 0, logits / repetition, logits * repetition), logits)
  return logits - frequency * counts - presence * (counts > 0)
