"""Medusa heads (Cai et al. 2024): the target drafts for itself from its own last hidden state.

Head k (k = 1..K) reads the target's final hidden state h_j [D] at slot j (whose own
logits predict t_{j+1}) and predicts t_{j+1+k}, one residual block ahead of the
target's LM head:

    head_k(h) = LM_head(h + SiLU(h W_k + b_k))        W_k [D, D], b_k [D]

The LM head (and any final logit softcapping) is the target's own, shared by every
head and frozen. W_k starts at zero, so an untrained head is the target's next-token
head.

Drafting. The newest committed feature is h_{L-2}: it was computed when the target
read t_{L-2}, and its own head predicted t_{L-1}, the last committed token. So head k
applied to h_{L-2} predicts t_{L-1+k}, the k-th token after the committed prefix:

    committed:   t0 ... t(L-2) | t(L-1)   d_1      d_2   ...  d_K
    from h_{L-2}:                         head 1   head 2     head K

A chain takes the argmax of heads 1..K; a tree (`propose_tree`) takes, for each node,
the ranks[i]-th most likely token of head depths[i]. All heads read the same feature,
so one round costs K small [D, D] blocks and K LM-head products, no target call.

Exactness. The drafts are a deterministic function of the committed tokens (through
the target's features), never of the target's random choices in the round being
verified, so each draft is "drawn" from the one-hot q at itself: `propose` returns
q = None at every temperature and the acceptance rule stays exact.

On disk (`save_medusa` / `load_medusa`), a directory holds

    medusa_config.json   format, version, num_heads, hidden_size, vocab_size, meta
    heads/               {"w": [K, D, D], "b": [K, D]}, written by orbax

The heads carry no LM head: `load_medusa(path, target)` attaches the target's.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import quant
from jspec.drafters import params_io
from jspec.core.model import Model
from jspec.core.tree import top_ranked

CONFIG_FILE = "medusa_config.json"
HEADS_DIR = "heads"
FORMAT = "jspec-medusa"
FORMAT_VERSION = 1


def _static(default=dataclasses.MISSING):
  return dataclasses.field(default=default, metadata=dict(static=True))


# ----------------------------------------------------------------------------- heads


def init_heads(num_heads: int, hidden_size: int, dtype=jnp.float32) -> dict:
  """Untrained heads: W_k = 0 and b_k = 0, so every head starts as the target's own
  next-token head. Returns {"w": [K, D, D], "b": [K, D]}."""
  if int(num_heads) < 1 or int(hidden_size) < 1:
    raise ValueError(f"num_heads and hidden_size must be >= 1, got {num_heads} and {hidden_size}")
  K, D = int(num_heads), int(hidden_size)
  return {"w": jnp.zeros((K, D, D), dtype), "b": jnp.zeros((K, D), dtype)}


def check_heads(heads: Any, hidden_size: int | None = None) -> tuple[int, int]:
  """Check a heads pytree ({"w": [K, D, D], "b": [K, D]}); return (K, D)."""
  if not isinstance(heads, dict) or set(heads) != {"w", "b"}:
    keys = sorted(heads) if isinstance(heads, dict) else type(heads).__name__
    raise ValueError(f"Medusa heads must be a dict with keys 'w' [K, D, D] and 'b' [K, D], "
                     f"got {keys}")
  w, b = heads["w"], heads["b"]
  if not (hasattr(w, "shape") and hasattr(b, "shape")):
    raise ValueError("Medusa heads 'w' and 'b' must be arrays")
  if len(w.shape) != 3 or w.shape[1] != w.shape[2] or w.shape[0] < 1:
    raise ValueError(f"Medusa heads 'w' must be [K, D, D] with K >= 1, got shape {tuple(w.shape)}")
  K, D = int(w.shape[0]), int(w.shape[1])
  if tuple(b.shape) != (K, D):
    raise ValueError(f"Medusa heads 'b' must be [K, D] = {(K, D)} to match 'w' "
                     f"{tuple(w.shape)}, got {tuple(b.shape)}")
  for name, x in (("w", w), ("b", b)):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise ValueError(f"Medusa heads '{name}' must be floating point, got {x.dtype}")
  if hidden_size is not None and D != int(hidden_size):
    raise ValueError(f"Medusa heads have hidden size {D}, but the target's hidden size is "
                     f"{hidden_size}")
  return K, D


def lm_head_of(target: Model) -> tuple[jax.Array, bool, float | None]:
  """The target's LM head as (weights, tied, softcap), through the model contract's
  optional `head_fn`.

  weights is the embedding table [V, D] when the target ties embeddings (used as
  stored: contracting against its transpose made XLA CPU copy the whole table per
  call), else the LM head [D, V]; softcap is the output logits' soft cap.
  """
  if not isinstance(target, Model):
    raise TypeError(f"Medusa needs a jspec.Model target, got {type(target).__name__}")
  head = target.head()
  tied = head.lm_head is None
  return (head.embed if tied else head.lm_head), tied, head.final_logit_softcapping


def _hidden_size(weights, tied: bool) -> int:
  """D of an LM head as `lm_head_of` returns it: embed [V, D] when tied, else [D, V]."""
  return int(weights.shape[1] if tied else weights.shape[0])


def head_hidden(heads: dict, h: jax.Array, num: int | None = None, blocks: int = 1) -> jax.Array:
  """The residual blocks of heads 1..num (default all): h [..., D] -> [..., num, D],
  h + SiLU(h W_k + b_k), computed in h's dtype; `blocks` > 1 applies head k's block that
  many times (medusa-llm's `medusa_num_layers`, whose blocks share one set of weights)."""
  w, b = heads["w"][:num], heads["b"][:num]
  w, b = w.astype(h.dtype), b.astype(h.dtype)
  z = jnp.einsum("...d,kde->...ke", h, w)  # [..., K, D]
  z = z + b.reshape((1,) * (z.ndim - 2) + b.shape)
  x = h[..., None, :] + jax.nn.silu(z)
  for _ in range(blocks - 1):
    z = jnp.einsum("...kd,kde->...ke", x, w) + b.reshape((1,) * (x.ndim - 2) + b.shape)
    x = x + jax.nn.silu(z)
  return x


# ----------------------------------------------------------------------------- drafter


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Medusa:
  """A Medusa drafter: trained heads plus the target's frozen LM head.

  Build it with `Medusa.from_target(target, heads)` or `load_medusa(path, target)`.
  Drafts come from the target's features (a `FeatureDrafter`), so the drafter keeps no
  cache: `init` returns None.
  """

  heads: dict  # {"w": [K, D, D], "b": [K, D]}
  # [V, D] when tied (the embedding table), else [D, V]: the target's, as it holds it
  lm_head: Any
  num_heads: int = _static()
  tied: bool = _static(True)
  softcap: float | None = _static(None)
  # Published Medusa heads (medusa-llm) carry an output layer per head, trained with the
  # blocks (`jspec.io.drafter_layouts`): [K, V, D], used in place of the target's LM head.
  head_out: jax.Array | None = None
  blocks: int = _static(1)  # residual blocks per head (shared weights, `head_hidden`)

  # A FeatureDrafter reading the final hidden state (not a field: no target layers fused).
  feature_layers: ClassVar[tuple[int, ...]] = ()

  @classmethod
  def from_target(cls, target: Model, heads: dict, head_out=None, blocks: int = 1) -> "Medusa":
    """The drafter for `target` (a `jspec.Model` with a `head_fn`) with `heads`
    ({"w": [K, D, D], "b": [K, D]}, e.g. from `init_heads` or training).
    head_out: None (the target's LM head) or each head's own output layer [K, V, D];
    blocks: residual blocks per head (>= 1, one shared set of weights per head)."""
    weights, tied, softcap = lm_head_of(target)
    K, D = check_heads(heads, _hidden_size(weights, tied))
    V = int(weights.shape[0] if tied else weights.shape[1])
    if head_out is not None and tuple(np.shape(head_out)) != (K, V, D):
      raise ValueError(f"Medusa head_out must be [K, V, D] = {(K, V, D)} (heads and target), "
                       f"got {tuple(np.shape(head_out))}")
    if isinstance(blocks, bool) or int(blocks) < 1:
      raise ValueError(f"Medusa blocks must be an integer >= 1, got {blocks!r}")
    return cls(heads=dict(heads), lm_head=weights, num_heads=K, tied=tied, softcap=softcap,
               head_out=None if head_out is None else jnp.asarray(head_out), blocks=int(blocks))

  @property
  def vocab_size(self) -> int:
    """V, from the LM head (equal to the target's by construction)."""
    return int(self.lm_head.shape[0] if self.tied else self.lm_head.shape[1])

  @property
  def hidden_size(self) -> int:
    """D, the target's hidden size."""
    return int(self.heads["w"].shape[1])

  def logits(self, h: jax.Array, num: int | None = None) -> jax.Array:
    """Logits of heads 1..num (default all) from features h [..., D]: [..., num, V] f32."""
    x = head_hidden(self.heads, h, num, self.blocks)  # [..., num, D]
    if self.head_out is not None:  # each head's own output layer, no softcap (as published)
      out = self.head_out[:x.shape[-2]].astype(x.dtype)
      return jnp.einsum("...kd,kvd->...kv", x, out, preferred_element_type=jnp.float32)
    # A quantized target's head as it holds it (quant.einsum casts its values to x's
    # dtype), over x with its leading axes flattened: quant.einsum names every axis.
    lm = self.lm_head if quant.is_quant_weight(self.lm_head) else self.lm_head.astype(x.dtype)
    flat = x.reshape((-1,) + x.shape[-2:])  # [N, num, D]
    eq = "nkd,vd->nkv" if self.tied else "nkd,dv->nkv"
    logits = quant.einsum(eq, flat, lm, preferred_element_type=jnp.float32)
    logits = logits.reshape(x.shape[:-1] + logits.shape[-1:])
    if self.softcap:
      logits = jnp.tanh(logits / self.softcap) * self.softcap
    return logits

  def check_depth(self, depth: int, what: str = "num_drafts") -> int:
    """Raise a clear ValueError when `depth` drafts (or tree levels) exceed the heads."""
    depth = int(depth)
    if depth > self.num_heads:
      raise ValueError(f"{what} = {depth} needs {depth} Medusa heads, but this drafter has "
                       f"{self.num_heads}; draft at most {self.num_heads} tokens per round "
                       f"(or train more heads)")
    if depth < 0:
      raise ValueError(f"{what} must be >= 0, got {depth}")
    return depth

  def init(self, tokens, prompt_lengths, cache_length: int, features=None):
    """`Drafter.init`: the heads keep no per-row state (returns None)."""
    del tokens, prompt_lengths, cache_length, features  # drafts read context.features
    return None

  def propose(self, state, context, num_drafts: int, params, keys):
    """`Drafter.propose` for chains: d_k = argmax of head k at h_{L-2}, k = 1..K.

    Returns drafts [B, K] int32, q None (deterministic drafts: one-hot q, exact at
    every temperature) and the state unchanged. Rows with L = 1 have no valid feature;
    they get drafts from a clamped (meaningless) entry, which is still exact.
    """
    del params, keys  # deterministic at every temperature
    K = self.check_depth(num_drafts, "num_drafts")
    B = context.lengths.shape[0]
    if K == 0:
      return jnp.zeros((B, 0), jnp.int32), None, state
    h = newest_feature(context)  # [B, D]
    drafts = jnp.argmax(self.logits(h, K), axis=-1).astype(jnp.int32)  # [B, K]
    return drafts, None, state

  def propose_tree(self, state, context, tree, params, keys):
    """Tree candidates: node i (i >= 1) is the ranks[i]-th most likely token of head
    depths[i] at h_{L-2}. Returns candidates [B, N-1] int32 (column i-1 is node i) and
    the state unchanged."""
    del params, keys
    depths = np.asarray(tree.depths, np.int64)
    ranks = np.asarray(tree.ranks, np.int64)
    N = int(tree.num_nodes)
    if depths.shape != (N,) or ranks.shape != (N,):
      raise ValueError(f"tree has {N} nodes but {depths.shape[0]} depths and "
                       f"{ranks.shape[0]} ranks")
    D = self.check_depth(int(tree.max_depth), "tree depth")
    B = context.lengths.shape[0]
    if N <= 1:
      return jnp.zeros((B, 0), jnp.int32), state
    nodes = np.arange(1, N)
    if np.any(depths[1:] < 1) or np.any(ranks[1:] < 0):
      raise ValueError("tree nodes after the root need depth >= 1 and rank >= 0")
    if int(ranks[1:].max()) >= self.vocab_size:
      raise ValueError(f"tree rank {int(ranks[1:].max())} is outside the vocabulary "
                       f"(size {self.vocab_size})")
    logits = self.logits(newest_feature(context), D)  # [B, D, V]
    columns, order = [], []
    for d in range(1, D + 1):
      at = nodes[depths[1:] == d]
      if at.size == 0:
        continue
      # One ranking per head, as deep as the deepest rank any node of this level asks for.
      top = top_ranked(logits[:, d - 1], int(ranks[at].max()) + 1)  # [B, R]
      columns.append(top[:, ranks[at]])
      order.append(at)
    order = np.concatenate(order)
    candidates = jnp.concatenate(columns, axis=1)[:, np.argsort(order)]  # node order
    return candidates.astype(jnp.int32), state


def newest_feature(context) -> jax.Array:
  """h_{L-2} per row: entry (L-2) - feature_start of context.features [B, F, D], clamped
  into [0, F) for rows that have none (L = 1). Returns [B, D]."""
  features = getattr(context, "features", None)
  if features is None or getattr(context, "feature_start", None) is None:
    raise ValueError("Medusa drafts from the target's hidden states, but the draft context "
                     "carries none: the decode loop must give a FeatureDrafter "
                     "their features")
  F = features.shape[1]
  if F == 0:
    raise ValueError("Medusa drafts from the target's features, but the context holds none "
                     "(F = 0): the decode loop must keep at least the newest feature")
  index = context.lengths.astype(jnp.int32) - 2 - context.feature_start.astype(jnp.int32)
  index = jnp.clip(index, 0, F - 1)
  return jnp.take_along_axis(features, index[:, None, None], axis=1)[:, 0]


# ----------------------------------------------------------------------------- save / load


def save_medusa(heads, path, meta: dict | None = None, *, vocab_size: int | None = None,
                dtype=None) -> None:
  """Write heads into `path` (new or empty): orbax arrays and medusa_config.json
  (`jspec.drafters.params_io`: the config is written last, so a directory without it is an
  interrupted save).

  Args:
    heads: a `Medusa` (its vocab size is recorded) or a heads dict {"w", "b"}
      (then give `vocab_size`, the target's V).
    meta: small JSON-ready dict kept in the config (how the heads were made).
    dtype: cast the arrays to this dtype on disk (e.g. "bfloat16"); None keeps theirs.
  """
  if isinstance(heads, Medusa):
    vocab_size = heads.vocab_size if vocab_size is None else vocab_size
    heads = heads.heads
  if vocab_size is None or int(vocab_size) < 1:
    raise ValueError("save_medusa needs the target's vocab_size when given a heads dict")
  K, D = check_heads(heads)
  if dtype is not None:
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
      raise ValueError(f"dtype must be floating point, got {dtype}")
    heads = {k: jnp.asarray(v).astype(dtype) for k, v in heads.items()}
  config = {"format": FORMAT, "version": FORMAT_VERSION, "num_heads": K, "hidden_size": D,
            "vocab_size": int(vocab_size), "stored_dtype": str(jnp.dtype(heads["w"].dtype)),
            "meta": meta or {}}
  params_io.save_dir(path, HEADS_DIR, dict(heads), CONFIG_FILE, config)


def read_medusa_config(path) -> dict:
  """The checked medusa_config.json of a heads directory."""
  path, config = params_io.open_dir(path, CONFIG_FILE, FORMAT, FORMAT_VERSION, "Medusa heads")
  for key in ("num_heads", "hidden_size", "vocab_size"):
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"{os.path.join(path, CONFIG_FILE)}: {key} must be a positive integer, "
                       f"got {value!r}")
  return config


def load_heads(path, dtype="float32") -> tuple[dict, dict]:
  """(heads, config) from a directory written by `save_medusa`; arrays cast to `dtype`
  (None keeps the stored dtype)."""
  config = read_medusa_config(path)
  K, D = config["num_heads"], config["hidden_size"]
  heads = params_io.restore_checked(
      os.path.join(params_io.absolute(path), HEADS_DIR), {"w": (K, D, D), "b": (K, D)}, dtype,
      "heads", f"{CONFIG_FILE} (num_heads {K}, hidden_size {D})")
  return dict(heads), config


def load_medusa(path, target: Model, dtype="float32") -> Medusa:
  """The `Medusa` drafter for `target` from heads saved by `save_medusa` (arrays cast to
  `dtype`, f32 by default). The target must have the heads' hidden size and vocabulary."""
  config = read_medusa_config(path)
  D = _hidden_size(*lm_head_of(target)[:2])  # a clear error for targets without a head
  where = os.fspath(path)
  if config["hidden_size"] != D:
    raise ValueError(f"Medusa heads in {where} were trained for hidden size "
                     f"{config['hidden_size']}, but the target's is {D}")
  if config["vocab_size"] != target.vocab_size:
    raise ValueError(f"Medusa heads in {where} were trained for vocabulary size "
                     f"{config['vocab_size']}, but the target's is {target.vocab_size}")
  heads, _ = load_heads(path, dtype)
  return Medusa.from_target(target, heads)
