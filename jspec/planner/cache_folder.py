"""jspec's cache folder, and compiled programs kept there, so a second run starts in seconds.

A decoding call compiles one XLA program per shape bucket (prompt bucket, cache
bucket, K, batch); on a 30-layer model that takes 10-20 s on a small CPU. JAX's
persistent compilation cache stores the compiled executables keyed by the
program, its options and the backend, and reuses them in a later process.
`enable_compilation_cache` points it at jspec's cache folder:

    $JSPEC_CACHE_DIR/xla      when JSPEC_CACHE_DIR is set
    ~/.cache/jspec/xla        otherwise

The CLI turns it on for every command (`--cache-dir` moves it); library users
call it once at startup if they want it. Programs with host callbacks (streaming)
are not stored by JAX and compile in each process. The same folder keeps the
measurements `"auto"` reads (`jspec.planner.cost_model`, `jspec.planner.call_times`).
"""

from __future__ import annotations

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
