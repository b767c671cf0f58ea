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

The caches of the two most recent shapes are kept (a loop that alternates two shapes,
rollouts at one batch and evaluation at another, pays for neither after the first time);
a third shape replaces the older. Before a new cache is allocated, the kept ones are
dropped if together with it they would pass half the machine's memory. So what stays
held is at most what the last two calls used; `jspec.release_caches()` drops it. On GPU
and TPU nothing is kept: XLA's allocator already reuses device memory there, a fresh
cache costs one memset, and a kept cache would hold memory the user's other arrays may
need. On a mesh neither: the program allocates its cache where the layout puts it.
"""

from __future__ import annotations

import os
import threading

import jax
import jax.numpy as jnp

KEEP = 2  # shapes kept, most recent first
_lock = threading.Lock()
_kept: list = []  # [(key, cache)], the most recently used first


def active(layout) -> bool:
  """Whether a call with this layout (None: one device) brings its own cache."""
  return layout is None and jax.default_backend() == "cpu"


def _key(tree) -> tuple:
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


def _bytes(tree) -> int:
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree)))


def _memory() -> int:
  """The machine's physical memory in bytes (0 where the system does not say)."""
  try:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return 0


def take(target, batch: int, length: int):
  """A cache for `target` at `batch` rows x `length` slots: a kept one when its shape
  matches (taken, so two calls at once never share one), else a new zeroed one."""
  shape = jax.eval_shape(lambda: target.init_cache(batch, length))
  key = _key(shape)
  with _lock:
    for i, (k, cache) in enumerate(_kept):
      if k == key:
        del _kept[i]
        return cache
    if _kept and 2 * (_bytes(shape) + sum(_bytes(c) for _, c in _kept)) > _memory():
      _kept.clear()  # room for the new one before holding more
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shape)


def keep(cache) -> None:
  """Keep `cache` (a program's returned cache) for the next call of its shape; the
  least recently used beyond KEEP shapes is dropped."""
  if cache is None:
    return
  key = _key(cache)
  with _lock:
    _kept[:] = [(key, cache)] + [(k, c) for k, c in _kept if k != key][:KEEP - 1]


def release_caches() -> int:
  """Drop the kept caches; returns the bytes they held (0 when none was kept)."""
  with _lock:
    held, _kept[:] = list(_kept), []
  return sum(_bytes(c) for _, c in held)
