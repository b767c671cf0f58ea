"""A `jspec.Model` from a Flax Linen module that follows the model contract.

The module's `__call__` is the contract itself, with the cache passed in and
returned rather than kept in a mutable Linen collection:

    logits, hidden, cache = module.apply(variables, tokens, cache, start,
                                         block_mask=None, depth=None)

and a cache constructor `init_cache(batch, length, dtype) -> cache` (a method of
the module, or a function given to `from_linen`). `cache=None` must run a
cache-free causal pass over the block (what `Model.logits` uses).

Why not Linen's own `cache` collection with a `cache_index`: the decode loop
owns the committed lengths, rows sit at different slots (`start` is per row),
and a rejected draft is undone by simply not advancing the length. A cache
that kept its own index would have to be rewound; an explicit one needs
nothing (see `docs/model_contract.md`).

    model = jspec.io.linen.from_linen(MyLM(vocab_size=64), variables)
    jspec.generate(model, prompts, max_new_tokens=32)

The variables are the Model's params (pytree leaves, traced under jit); the
module and cache constructor are static, so the Model passes through `jax.jit`
like any other.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from jspec.core.model import Model, OutputHead


@dataclasses.dataclass(frozen=True)
class LinenConfig:
  """Static half of a Linen-backed Model: the (unbound) module and its cache constructor.

  Linen modules hash and compare by their fields, so two equal modules share
  compiled programs.
  """

  module: nn.Module
  vocab_size: int
  init_cache: Callable[[int, int, Any], Any]
  max_position_embeddings: int | None = None
  # variables -> jspec.OutputHead (embedding and output head, for Medusa and EAGLE); None: none
  head: Callable[[Any], OutputHead] | None = None


def _apply(config: LinenConfig, params, tokens, cache, start, block_mask=None, depth=None):
  """The model contract for a Linen module: `params` is its variables dict."""
  logits, hidden, cache = config.module.apply(params, tokens, cache, start,
                                              block_mask=block_mask, depth=depth)
  # The engine's samplers expect f32 logits whatever the module computes in.
  return logits.astype(jnp.float32), hidden, cache


def _head(config: LinenConfig, params) -> OutputHead:
  """The model contract's optional head, from the function given to `from_linen`."""
  return config.head(params)


def _init_cache(config: LinenConfig, batch: int, length: int, dtype=jnp.float32):
  """The module's zeroed cache for `batch` rows of `length` slots."""
  return config.init_cache(batch, length, dtype)


def from_linen(module: nn.Module, variables, *, init_cache: Callable | None = None,
               vocab_size: int | None = None, max_length: int | None = None,
               eos_ids=(), axes_fn=None, head: Callable[[Any], OutputHead] | None = None,
               ) -> Model:
  """Wrap a contract-following Linen module and its variables as a `jspec.Model`.

  Args:
    module: an unbound `flax.linen.Module` whose `__call__(tokens, cache, start,
      block_mask=None, depth=None)` returns `(logits, hidden, cache)`.
    variables: what `module.init` returned (e.g. `{"params": ...}`).
    init_cache: `(batch, length, dtype) -> cache`; default `module.init_cache`.
    vocab_size: default `module.vocab_size`.
    max_length: longest sequence the module supports (None: unbounded); default
      `module.max_position_embeddings` when it has one.
    eos_ids: default stop ids.
    axes_fn: optional `config -> (param axes, cache axes)` for sharding.
    head: optional `variables -> jspec.OutputHead`, the token embedding and output
      head, for drafters that share them with the target (Medusa, EAGLE).
  """
  if not isinstance(module, nn.Module):
    raise TypeError(f"module must be a flax.linen.Module, got {type(module).__name__}")
  if getattr(module, "scope", None) is not None:
    raise ValueError("pass the unbound module (as constructed), not one bound by apply/bind")
  if init_cache is None:
    init_cache = getattr(module, "init_cache", None)
    if init_cache is None:
      raise TypeError(f"{type(module).__name__} has no init_cache method: pass "
                      f"init_cache=(batch, length, dtype) -> cache")
  if vocab_size is None:
    vocab_size = getattr(module, "vocab_size", None)
    if vocab_size is None:
      raise TypeError(f"{type(module).__name__} has no vocab_size field: pass vocab_size=")
  if max_length is None:
    max_length = getattr(module, "max_position_embeddings", None)
  config = LinenConfig(module=module, vocab_size=int(vocab_size), init_cache=init_cache,
                       max_position_embeddings=None if max_length is None else int(max_length),
                       head=head)
  return Model(params=variables, config=config, apply_fn=_apply, init_cache_fn=_init_cache,
               eos_ids=tuple(int(i) for i in eos_ids), axes_fn=axes_fn,
               head_fn=None if head is None else _head)
