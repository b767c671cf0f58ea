"""jspec's programs compiled with the options that make them fast on each backend.

`program` is jax.jit for jspec's own programs: on the CPU backend it compiles them
with `CPU_OPTIONS`. XLA CPU's default copy insertion keeps two copies of every
layer's cache buffer per batch-1 step: attention reads the cache as it was while
the step writes its new slot in place, and the default analysis cannot prove the
read comes first. On SmolLM2-135M that is 120 copies of 393 KB per step, 2-3 ms of
a 32 ms step; the region analysis removes all of them (greedy output unchanged).
Other backends get plain jax.jit, since the option is XLA CPU's.
"""

from __future__ import annotations

import contextlib
import functools
import types

import jax

# XLA options jspec's programs compile with on the CPU backend (module docstring).
CPU_OPTIONS = types.MappingProxyType({"xla_cpu_copy_insertion_use_region_analysis": True})


class Program:
  """`jax.jit(fn, **jit_kwargs)`, compiled with CPU_OPTIONS when the default backend is
  the CPU. The backend is read at call time, not import time (importing jspec must not
  start a backend)."""

  def __init__(self, fn, **jit_kwargs):
    self._plain = jax.jit(fn, **jit_kwargs)
    self._cpu = jax.jit(fn, compiler_options=dict(CPU_OPTIONS), **jit_kwargs)
    self._forced = None
    functools.update_wrapper(self, fn)

  def _jitted(self):
    if self._forced is not None:
      return self._forced
    return self._cpu if jax.default_backend() == "cpu" else self._plain

  @contextlib.contextmanager
  def using(self, cpu_options: bool):
    """Calls made inside run the build with (True) or without (False) CPU_OPTIONS,
    whatever the backend: for timing the two side by side, and for tests."""
    self._forced = self._cpu if cpu_options else self._plain
    try:
      yield
    finally:
      self._forced = None

  def __call__(self, *args, **kwargs):
    return self._jitted()(*args, **kwargs)

  def lower(self, *args, **kwargs):
    return self._jitted().lower(*args, **kwargs)

  def _cache_size(self) -> int:
    return self._jitted()._cache_size()


def program(fn=None, **jit_kwargs):
  """Decorator: `Program(fn, **jit_kwargs)`; usable as `@program` or
  `@program(static_argnames=...)`."""
  if fn is None:
    return lambda f: Program(f, **jit_kwargs)
  return Program(fn, **jit_kwargs)
