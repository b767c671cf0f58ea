"""Medusa heads in the `medusa-llm` layout, into `jspec.Medusa` and back out.

config.json holds `medusa_num_heads` (K) and `medusa_num_layers` (R); the weights,
`medusa_lm_head.pt` (or `.safetensors`), hold per head k

    {k}.{r}.linear.weight [D, D], {k}.{r}.linear.bias [D]   r < R: residual blocks
    {k}.{R}.weight [V, D]                                   the head's own output layer

The reference builds a head's R blocks as one module repeated (`[ResBlock(D)] * R`), so
they share weights; a file whose blocks differ is refused.
"""

from __future__ import annotations

import os

import numpy as np

from jspec.core import quant
from jspec.drafters.medusa import Medusa
from jspec.models.hf import CheckpointError
from jspec.io import layout_tensors as T

LAYOUT = "medusa"
STEM = "medusa_lm_head"


def load(path: str, cfg: dict, target, dtype=None) -> Medusa:
  """A `Medusa` for `target` from directory `path` (cfg its parsed config.json): each head's
  block and its own output layer, blocks applied `medusa_num_layers` times; params cast to
  `dtype` (None keeps)."""
  import jax.numpy as jnp

  where = os.path.join(path, "config.json")
  try:
    K, R = int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
  except (KeyError, TypeError, ValueError) as e:
    raise CheckpointError(f"{where}: medusa_num_heads / medusa_num_layers: {e}") from None
  if K < 1 or R < 1:
    raise CheckpointError(f"{where}: medusa_num_heads {K} and medusa_num_layers {R} must be >= 1")
  head = target.head()
  V, D = head.embed.shape
  tensors = T.open_tensors(path, (STEM,))
  first = "0.0.linear.weight"
  if first in tensors.names and tensors.shapes[first] != (D, D):
    raise CheckpointError(f"{tensors.where(first)}: tensor {first} has shape "
                          f"{tensors.shapes[first]}: hidden size {tensors.shapes[first][0]}, "
                          f"but the target's is {D}")
  out_name = f"0.{R}.weight"
  if out_name in tensors.names and tensors.shapes[out_name] != (V, D):
    raise CheckpointError(f"{tensors.where(out_name)}: tensor {out_name} has shape "
                          f"{tensors.shapes[out_name]}: vocabulary {tensors.shapes[out_name][0]}, "
                          f"but the target's is {V}")
  what = f"{where} (medusa_num_heads {K}, medusa_num_layers {R}, target hidden {D}, vocab {V})"
  if f"{K}.0.linear.weight" in tensors.names:
    raise CheckpointError(f"{tensors.where(f'{K}.0.linear.weight')}: holds more than the "
                          f"{K} heads of medusa_num_heads")
  ws, bs, outs = [], [], []
  for k in range(K):
    w = tensors.get(f"{k}.0.linear.weight", (D, D), what)
    b = tensors.get(f"{k}.0.linear.bias", (D,), what)
    for r in range(1, R):
      same = (np.array_equal(tensors.get(f"{k}.{r}.linear.weight", (D, D), what), w)
              and np.array_equal(tensors.get(f"{k}.{r}.linear.bias", (D,), what), b))
      if not same:
        raise CheckpointError(f"{tensors.where(f'{k}.{r}.linear.weight')}: head {k}'s block {r} "
                              f"differs from its block 0; medusa-llm's blocks share weights")
    ws.append(w.T)  # jspec: h @ w
    bs.append(b)
    outs.append(tensors.get(f"{k}.{R}.weight", (V, D), what))
  cast = (lambda x: jnp.asarray(x, dtype)) if dtype is not None else jnp.asarray
  heads = {"w": cast(np.stack(ws)), "b": cast(np.stack(bs))}
  return Medusa.from_target(target, heads, head_out=cast(np.stack(outs)), blocks=R)


def export(medusa: Medusa, out: str, *, dtype=np.float32, base_model: str | None = None) -> str:
  """Write `medusa` into the new directory `out` in medusa-llm's layout: each head's
  output layer is its own, or the target's LM head for jspec's own heads."""
  if medusa.softcap and medusa.head_out is None:
    raise ValueError("the target soft-caps its logits; medusa-llm's heads do not")
  K, R = medusa.num_heads, medusa.blocks
  f = lambda x: np.asarray(x, np.float32).astype(dtype)  # noqa: E731
  if medusa.head_out is not None:
    outs = np.asarray(medusa.head_out, np.float32)
  else:
    lm = np.asarray(quant.dequantize(medusa.lm_head), np.float32)  # a quantized target's too
    lm = lm if medusa.tied else lm.T  # [V, D]
    outs = np.broadcast_to(lm, (K,) + lm.shape)
  tensors = {}
  for k in range(K):
    for r in range(R):
      tensors[f"{k}.{r}.linear.weight"] = f(np.asarray(medusa.heads["w"][k]).T)
      tensors[f"{k}.{r}.linear.bias"] = f(medusa.heads["b"][k])
    tensors[f"{k}.{R}.weight"] = f(outs[k])
  out = T.new_dir(out)
  T.write_safetensors(os.path.join(out, STEM + ".safetensors"), tensors)
  T.write_torch(os.path.join(out, STEM + ".pt"), tensors)  # what medusa-llm 0.1 reads
  T.write_config(out, {"medusa_num_heads": K, "medusa_num_layers": R,
                       "base_model_name_or_path": base_model, "hidden_size": medusa.hidden_size,
                       "vocab_size": medusa.vocab_size})
  return out
