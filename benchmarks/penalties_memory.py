"""Memory XLA plans for the penalties at a verify: the sparse path counts against a dense count.

    python benchmarks/penalties_memory.py [--batch 64] [--vocab 49152] [--tree recycling|chain:K]
                                          [--json]

Compiles (never runs) `penalties.apply(logits, params, seen, penalties.block_counts(block,
ancestors))`, the repetition, presence and frequency penalties and a logit bias on one verify's
logits [B, W, V] f32, at the 81-node token-recycling tree by default (W = 81), and reads
`compiled.memory_analysis()`: the arguments (the logits and the state), the output (the adjusted
logits) and the temporaries XLA allocates besides them. Then the same for the dense formula the
sparse one replaced (a [B, W-1, V] one-hot of the drafts and a [B, W, V] f32 count, written out
below as it was), so one run gives both figures on the same backend. Peak is arguments + output +
temporaries - aliased bytes, what the program holds at once at most.

Nothing is run, so the figures come from the compiler's buffer assignment for this backend
(CPU here); a GPU's may differ in detail, not in the arrays that exist.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import penalties
from jspec.core.sampling import SamplingParams
from jspec.drafters.recycling import paper_tree


def dense_block_counts(seen, block, ancestors):
  """The dense formula the sparse `block_counts` replaced: f32 [B, W, V]."""
  B, W = block.shape
  V = seen.counts.shape[-1]
  counts = seen.counts[:, None, :].astype(jnp.float32)
  if W == 1:
    return counts
  ancestors = jnp.broadcast_to(ancestors, (B, W, W)).astype(jnp.float32)
  drafts = jax.nn.one_hot(block[:, 1:], V, dtype=jnp.float32)  # [B, W-1, V]
  return counts + jnp.einsum("bnm,bmv->bnv", ancestors[:, :, 1:], drafts)  # [B, W, V]


def dense_apply(logits, params, seen, counts):
  """`penalties.apply` as it was, on dense counts [B, W, V]."""
  if params.logit_bias is not None:
    logits = logits + params.logit_bias[:, None, :].astype(logits.dtype)
  in_output = counts > 0.0
  r = params.repetition_penalty[:, None, None]
  repeated = seen.prompt[:, None, :] | in_output
  logits = jnp.where(repeated, jnp.where(logits > 0.0, logits / r, logits * r), logits)
  logits = logits - params.frequency_penalty[:, None, None] * counts
  return logits - jnp.where(in_output, params.presence_penalty[:, None, None], 0.0)


def ancestors_of(tree: str) -> np.ndarray:
  if tree == "recycling":
    return np.asarray(paper_tree().ancestors, bool)
  if tree.startswith("chain:"):
    K = int(tree.split(":", 1)[1])
    return np.tril(np.ones((K + 1, K + 1), bool))
  raise SystemExit(f"--tree: 'recycling' or 'chain:K', got {tree!r}")


def measure(B: int, V: int, ancestors: np.ndarray) -> dict:
  W = ancestors.shape[0]
  f32 = jax.ShapeDtypeStruct
  logits = f32((B, W, V), jnp.float32)
  block = f32((B, W), jnp.int32)
  row = f32((B,), jnp.float32)
  params = SamplingParams(temperature=row, top_k=f32((B,), jnp.int32), top_p=row,
                          repetition_penalty=row, presence_penalty=row, frequency_penalty=row,
                          logit_bias=f32((B, V), jnp.float32))
  seen = penalties.Seen(counts=f32((B, V), jnp.int32), prompt=f32((B, V), jnp.bool_))
  mask = jnp.asarray(ancestors)

  def sparse(logits, params, seen, block):
    return penalties.apply(logits, params, seen, penalties.block_counts(block, mask))

  def dense(logits, params, seen, block):
    return dense_apply(logits, params, seen, dense_block_counts(seen, block, mask))

  out = dict(batch=B, width=W, vocab=V, backend=jax.default_backend(),
             logits_bytes=B * W * V * 4)
  for name, fn in (("dense", dense), ("sparse", sparse)):
    stats = jax.jit(fn).lower(logits, params, seen, block).compile().memory_analysis()
    sizes = dict(arguments=stats.argument_size_in_bytes, output=stats.output_size_in_bytes,
                 temporaries=stats.temp_size_in_bytes, aliased=stats.alias_size_in_bytes)
    sizes["peak"] = (sizes["arguments"] + sizes["output"] + sizes["temporaries"]
                     - sizes["aliased"])
    out[name] = sizes
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--vocab", type=int, default=49152)
  parser.add_argument("--tree", default="recycling", help="'recycling' (81 nodes) or 'chain:K'")
  parser.add_argument("--json", action="store_true", help="print the record as JSON")
  args = parser.parse_args(argv)
  record = measure(args.batch, args.vocab, ancestors_of(args.tree))
  if args.json:
    print(json.dumps(record, indent=1))
    return
  mib = 2.0 ** 20
  print(f"B={record['batch']} W={record['width']} V={record['vocab']} on {record['backend']}; "
        f"one [B, W, V] f32 array = {record['logits_bytes'] / mib:,.0f} MiB")
  print(f"{'':8} {'arguments':>10} {'output':>10} {'temporaries':>12} {'peak':>10}  (MiB)")
  for name in ("dense", "sparse"):
    s = record[name]
    print(f"{name:8} {s['arguments'] / mib:10,.0f} {s['output'] / mib:10,.0f} "
          f"{s['temporaries'] / mib:12,.1f} {s['peak'] / mib:10,.0f}")


if __name__ == "__main__":
  main()
