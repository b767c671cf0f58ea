"""The target's K/V cache kept from one call to the next, on the CPU backend.

On XLA CPU a call's cache is fresh memory every time: pages the kernel maps and zeroes
when they are first written. At batch 32 and 4,096 slots SmolLM2-135M's cache is 6 GB,
several seconds of page faults on a 2-core machine: more than 48 decode rounds at that
batch cost. So a call takes the kept cache of its shape, donates it to its program, and
keeps the cache the program hands back; the first call of a shape pays for the memory,
the next ones do not.

What a slot held in an earlier call is never read: attention masks every slot at or
past a row's length, as it masks the right padding of a batch's shorter prompts, and
the prefill writes every slot below it. (tests/test_workspace.py fills the kept cache
with large values and checks the next call's tokens and log-probabilities unchanged.)

One cache is kept, the last call's, so what is held never exceeds what the last call
used; `jspec.release_caches()` drops it. A call that finds the kept cache
of another shape replaces it. On GPU and TPU nothing is kept: XLA's allocator already
reuses device memory there, a fresh cache costs one memset, and a kept cache would hold
memory the user's other arrays may need. On a mesh neither: the program allocates its
cache where the layout puts it.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp

_lock = threading.Lock()
_kept: tuple | None = None  # (key, cache) of the last call


def active(layout) -> bool:
  """Whether a call with this layout (None: one device) brings its own cache."""
  return layout is None and jax.default_backend() == "cpu"


def _key(tree) -> tuple:
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


def take(target, batch: int, length: int):
  """A cache for `target` at `batch` rows x `length` slots: the kept one when its shape
  matches (taken, so two calls at once never share one), else a new zeroed one."""
  global _kept
  shape = jax.eval_shape(lambda: target.init_cache(batch, length))
  key = _key(shape)
  with _lock:
    if _kept is not None and _kept[0] == key:
      cache, _kept = _kept[1], None
      return cache
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shape)


def keep(cache) -> None:
  """Keep `cache` (a program's returned cache) for the next call, in place of any other."""
  global _kept
  if cache is None:
    return
  with _lock:
    _kept = (_key(cache), cache)


def release_caches() -> int:
  """Drop the kept cache; returns the bytes it held (0 when none was kept)."""
  global _kept
  with _lock:
    kept, _kept = _kept, None
  if kept is None:
    return 0
  return int(sum(x.nbytes for x in jax.tree_util.tree_leaves(kept[1])))
