"""Compiled programs kept on disk, so a second run of a script starts in seconds.

A decoding call compiles one XLA program per shape bucket (prompt bucket, cache
bucket, K, batch); on a 30-layer model that takes 10-20 s on a small CPU. JAX's
persistent compilation cache stores the compiled executables keyed by the
program, its options and the backend, and reuses them in a later process.
`enable_compilation_cache` points it at jspec's cache folder:

    $JSPEC_CACHE_DIR/xla      when JSPEC_CACHE_DIR is set
    ~/.cache/jspec/xla        otherwise

The CLI turns it on for every command (`--cache-dir` moves it); library users
call it once at startup if they want it. Programs with host callbacks (streaming)
are not stored by JAX and compile in each process.

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
import os

import jax

ENV_VAR = "JSPEC_CACHE_DIR"


def cache_root() -> str:
  """jspec's cache folder: $JSPEC_CACHE_DIR, else ~/.cache/jspec."""
  return os.environ.get(ENV_VAR) or os.path.join(os.path.expanduser("~"), ".cache", "jspec")


def enable_compilation_cache(directory: str | None = None) -> str:
  """Store and reuse compiled programs in `directory` (default: cache_root()/xla).

  Every program is kept, however quickly it compiled: the small ones add up too
  on a CPU. Returns the folder used.
  """
  directory = os.path.abspath(os.path.expanduser(directory or os.path.join(cache_root(), "xla")))
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return directory


# XLA options jspec's programs compile with on the CPU backend (module docstring).
CPU_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}


class Program:
  """`jax.jit(fn, **jit_kwargs)`, compiled with CPU_OPTIONS when the default backend is
  the CPU. The backend is read at call time, not import time (importing jspec must not
  start a backend)."""

  def __init__(self, fn, **jit_kwargs):
    self._plain = jax.jit(fn, **jit_kwargs)
    self._cpu = jax.jit(fn, compiler_options=CPU_OPTIONS, **jit_kwargs)
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
