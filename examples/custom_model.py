"""Bring your own architecture: the model contract, worked through twice.

jspec decodes any model that provides one pure function and a cache
constructor (docs/model_contract.md):

    logits, hidden, cache = apply(config, params, tokens, cache, start,
                                  block_mask=None, depth=None)
    cache = init_cache(config, batch, length, dtype)

This file implements it for a small one-layer attention language model, first
in plain JAX (`apply`, `init_cache` below, wrapped with `jspec.Model`), then as
a Flax Linen module (`LinenLM`, wrapped with `jspec.io.linen.from_linen`). Each
keeps its K/V in a layout of its own choosing; the engine never looks inside.
Both are checked the way you would check yours: greedy `jspec.generate` and
`jspec.speculative_generate` must equal a plain argmax loop over full forward
passes with no cache.

    python examples/custom_model.py
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jspec
import jspec.io.linen


# ----------------------------------------------------------------------------- shared pieces


def block_visibility(start, block_mask, slots: int):
  """Which cache slots each new token may attend to: bool [B, T, S].

  Token t of row b sees every slot below start[b] (the committed prefix) and the
  slots start[b] + j of its own block where block_mask[t, j]. Nothing else: slots
  at or past start[b] + T hold stale K/V from rejected drafts or padding, and
  hiding them is what lets the decode loop skip any rollback.
  """
  T = block_mask.shape[0]
  slot = jnp.arange(slots, dtype=jnp.int32)[None, :]  # [1, S]
  rel = slot - start[:, None]  # [B, S] offset of each slot inside the row's block
  in_block = (rel >= 0) & (rel < T)
  # block_mask[t, rel] for every slot, then masked to the block itself.
  from_block = jnp.take(block_mask, jnp.clip(rel, 0, T - 1), axis=1)  # [T, B, S]
  from_block = from_block.transpose(1, 0, 2) & in_block[:, None, :]  # [B, T, S]
  return (rel < 0)[:, None, :] | from_block


def write_block(buffer, block, start, axis: int = 1):
  """Write block [B, ..., T, ...] into buffer [B, ..., S, ...] at slot start[b] of each row.

  `axis` is the slot axis of both (counting the batch axis). The write is in
  place on the slot axis wherever it sits: no transpose of the whole cache.
  """

  def one(buf, blk, s):  # one row: the batch axis is gone, so the slot axis is axis - 1
    index = [jnp.int32(0)] * buf.ndim
    index[axis - 1] = s
    return lax.dynamic_update_slice(buf, blk.astype(buf.dtype), index)

  return jax.vmap(one)(buffer, block, start)


def defaults(tokens, block_mask, depth):
  """The contract's defaults: a causal block at depths 0..T-1."""
  T = tokens.shape[1]
  if block_mask is None:
    block_mask = jnp.tril(jnp.ones((T, T), bool))
  if depth is None:
    depth = jnp.arange(T, dtype=jnp.int32)
  return block_mask, depth


def rms_norm(x):
  return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


# ----------------------------------------------------------------------------- plain JAX


@dataclasses.dataclass(frozen=True)
class TinyConfig:
  """Static hyperparameters. Frozen (hashable): it becomes part of the compiled program."""

  vocab_size: int = 64
  width: int = 32
  num_heads: int = 2
  max_position_embeddings: int = 512  # jspec reads this name to bound prompt + output
  init_scale: float = 0.5  # larger: more peaked logits

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads


@functools.partial(jax.jit, static_argnums=0)
def init_params(config: TinyConfig, key) -> dict:
  """Random params as a plain dict (any pytree works)."""
  V, D, H, Dh = config.vocab_size, config.width, config.num_heads, config.head_dim
  shapes = {"embed": (V, D), "pos": (config.max_position_embeddings, D),
            "wqkv": (D, 3, H, Dh), "wo": (H, Dh, D), "w_in": (D, 4 * D), "w_out": (4 * D, D),
            "unembed": (D, V)}
  # Matrices are scaled by 1/sqrt(fan-in) so activations stay O(1); tables are not.
  fan_in = {"embed": 1, "pos": 1, "wqkv": D, "wo": H * Dh, "w_in": D, "w_out": 4 * D,
            "unembed": D}
  keys = jax.random.split(key, len(shapes))
  return {name: jax.random.normal(k, shape, jnp.float32)
          * np.float32(config.init_scale / np.sqrt(fan_in[name]))
          for k, (name, shape) in zip(keys, shapes.items())}


def init_cache(config: TinyConfig, batch: int, length: int, dtype=jnp.float32):
  """One buffer with K and V side by side: [B, S, 2, H, Dh].

  Slot-major, so a block write is one contiguous slice per row. Any layout
  works; it carries no lengths, because the decode loop owns them.
  """
  return jnp.zeros((batch, length, 2, config.num_heads, config.head_dim), dtype)


def apply(config: TinyConfig, params: dict, tokens, cache, start, block_mask=None, depth=None):
  """The model contract for the one-layer model."""
  block_mask, depth = defaults(tokens, block_mask, depth)
  B, T = tokens.shape
  start = start.astype(jnp.int32)
  # Positions are start + depth, not start + t: tree blocks put siblings at one depth.
  positions = start[:, None] + depth[None, :]  # [B, T]
  x = jnp.take(params["embed"], tokens, axis=0) + jnp.take(params["pos"], positions, axis=0)

  qkv = jnp.einsum("btd,dchk->btchk", rms_norm(x), params["wqkv"])  # [B, T, 3, H, Dh]
  q, kv = qkv[:, :, 0], qkv[:, :, 1:]  # q [B, T, H, Dh], kv [B, T, 2, H, Dh]
  if cache is None:  # cache-free causal pass over the block alone (Model.logits, training)
    visible = jnp.broadcast_to(block_mask[None], (B, T, T))
  else:
    cache = write_block(cache, kv, start)
    kv = cache  # attend over every slot; the mask hides what is not ours to see
    visible = block_visibility(start, block_mask, cache.shape[1])
  k, v = kv[:, :, 0], kv[:, :, 1]  # [B, S, H, Dh]
  scores = jnp.einsum("bthk,bshk->bhts", q, k) / np.float32(np.sqrt(config.head_dim))
  scores = jnp.where(visible[:, None], scores, -jnp.inf)
  attn = jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(scores, axis=-1), v)
  x = x + jnp.einsum("bthk,hkd->btd", attn, params["wo"])
  x = x + jax.nn.gelu(rms_norm(x) @ params["w_in"]) @ params["w_out"]
  hidden = rms_norm(x)
  logits = jnp.einsum("btd,dv->btv", hidden, params["unembed"],
                      preferred_element_type=jnp.float32)
  return logits, hidden, cache


def output_head(config: TinyConfig, params: dict) -> jspec.OutputHead:
  """Optional: the token embedding and LM head, for drafters that share them with the
  target (Medusa heads score through the LM head; EAGLE reads both)."""
  return jspec.OutputHead(embed=params["embed"], lm_head=params["unembed"])


def make_model(config: TinyConfig, params: dict) -> jspec.Model:
  """Params are the pytree leaves; config and the functions are static."""
  return jspec.Model(params=params, config=config, apply_fn=apply, init_cache_fn=init_cache,
                     head_fn=output_head)


# ----------------------------------------------------------------------------- Flax Linen


class LinenLM(nn.Module):
  """The same idea as a Linen module, with K and V in separate head-major buffers."""

  vocab_size: int = 64
  width: int = 32
  num_heads: int = 2
  max_position_embeddings: int = 512

  @nn.compact
  def __call__(self, tokens, cache, start, block_mask=None, depth=None):
    block_mask, depth = defaults(tokens, block_mask, depth)
    B, T = tokens.shape
    H, Dh = self.num_heads, self.width // self.num_heads
    start = start.astype(jnp.int32)
    positions = start[:, None] + depth[None, :]
    x = (nn.Embed(self.vocab_size, self.width, name="embed")(tokens)
         + nn.Embed(self.max_position_embeddings, self.width, name="pos")(positions))
    h = nn.RMSNorm(name="attn_norm")(x)
    q = nn.DenseGeneral((H, Dh), use_bias=False, name="q")(h)  # [B, T, H, Dh]
    k = nn.DenseGeneral((H, Dh), use_bias=False, name="k")(h).transpose(0, 2, 1, 3)
    v = nn.DenseGeneral((H, Dh), use_bias=False, name="v")(h).transpose(0, 2, 1, 3)
    if cache is None:
      visible = jnp.broadcast_to(block_mask[None], (B, T, T))
    else:
      # [B, H, S, Dh] buffers: the slots are axis 2.
      cache = {"k": write_block(cache["k"], k, start, axis=2),
               "v": write_block(cache["v"], v, start, axis=2)}
      k, v = cache["k"], cache["v"]
      visible = block_visibility(start, block_mask, k.shape[2])
    scores = jnp.einsum("bthd,bhsd->bhts", q, k) / np.float32(np.sqrt(Dh))
    scores = jnp.where(visible[:, None], scores, -jnp.inf)
    attn = jnp.einsum("bhts,bhsd->bthd", jax.nn.softmax(scores, axis=-1), v)
    x = x + nn.DenseGeneral(self.width, axis=(-2, -1), use_bias=False, name="out")(attn)
    m = nn.Dense(4 * self.width, name="mlp_in")(nn.RMSNorm(name="mlp_norm")(x))
    x = x + nn.Dense(self.width, name="mlp_out")(jax.nn.gelu(m))
    hidden = nn.RMSNorm(name="final_norm")(x)
    logits = nn.Dense(self.vocab_size, use_bias=False, name="unembed")(hidden)
    return logits.astype(jnp.float32), hidden, cache

  def init_cache(self, batch: int, length: int, dtype=jnp.float32):
    shape = (batch, self.num_heads, length, self.width // self.num_heads)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def make_linen_model(module: LinenLM, seed: int = 0) -> jspec.Model:
  """Initialise the Linen module and wrap it; params stay arguments, never closed over."""
  tokens = jnp.zeros((1, 4), jnp.int32)
  # One compiled init instead of many small eager ops.
  variables = jax.jit(module.init)(jax.random.key(seed), tokens, None,
                                   jnp.zeros((1,), jnp.int32))
  return jspec.io.linen.from_linen(module, variables, head=linen_head)


def linen_head(variables) -> jspec.OutputHead:
  """`LinenLM`'s embedding and LM head, read from its variables (Dense kernels are [D, V])."""
  p = variables["params"]
  return jspec.OutputHead(embed=p["embed"]["embedding"], lm_head=p["unembed"]["kernel"])


# ----------------------------------------------------------------------------- the check


def greedy_reference(model: jspec.Model, prompts, max_new_tokens: int) -> list[list[int]]:
  """Greedy continuations from full forward passes, no cache: the ground truth.

  Sequences are right-padded to one width so every step reuses one compiled
  forward; causal attention keeps the padding out of the positions read.
  """
  width = max(len(p) for p in prompts) + max_new_tokens
  seqs = [list(p) for p in prompts]
  for _ in range(max_new_tokens):
    padded = np.zeros((len(seqs), width), np.int32)
    for b, s in enumerate(seqs):
      padded[b, :len(s)] = s
    logits = np.asarray(model.logits(padded))
    for b, s in enumerate(seqs):
      s.append(int(np.argmax(logits[b, len(s) - 1])))
  return [s[len(p):] for s, p in zip(seqs, prompts)]


def perturbed(model: jspec.Model, noise: float, seed: int) -> jspec.Model:
  """A cheap draft: the same architecture with noisy weights (same vocabulary).

  The noise is drawn with NumPy on the host: a one-off, so nothing to compile.
  """
  rng = np.random.default_rng(seed)

  def noisy(x):
    x = np.asarray(x)
    return jnp.asarray(x + noise * x.std() * rng.standard_normal(x.shape).astype(x.dtype))

  return dataclasses.replace(model, params=jax.tree_util.tree_map(noisy, model.params))


def check(name: str, model: jspec.Model, prompts, max_new_tokens: int) -> bool:
  """Print and return whether greedy generate / speculative_generate equal the reference."""
  expected = greedy_reference(model, prompts, max_new_tokens)
  base = jspec.generate(model, prompts, max_new_tokens=max_new_tokens)
  spec = jspec.speculative_generate(model, perturbed(model, 0.3, seed=1), prompts,
                                    num_draft_tokens=3, max_new_tokens=max_new_tokens)
  same_base = np.asarray(base.tokens).tolist() == expected
  same_spec = np.asarray(spec.tokens).tolist() == expected
  accepted = int(np.sum(spec.stats.accepted))
  calls = int(np.sum(spec.stats.target_calls))
  print(f"{name}: generate == reference: {same_base}; speculative == reference: {same_spec} "
        f"({accepted} drafts accepted over {calls} target calls)")
  return same_base and same_spec


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--max-new-tokens", type=int, default=24)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  rng = np.random.default_rng(args.seed)
  prompts = [rng.integers(0, 64, size=n).tolist() for n in (1, 5, 9)]

  config = TinyConfig()
  plain = make_model(config, init_params(config, jax.random.key(args.seed)))
  linen = make_linen_model(LinenLM(), seed=args.seed)
  ok = check("plain JAX", plain, prompts, args.max_new_tokens)
  ok &= check("Flax Linen", linen, prompts, args.max_new_tokens)
  return 0 if ok else 1


if __name__ == "__main__":
  raise SystemExit(main())
