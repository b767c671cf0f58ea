"""DFlash block drafters trained with jspec's optax trainer, on the target's own features.

The objective is the block objective of DFlash (Chen et al., z-lab, "DFlash: Block Diffusion
for Flash Speculative Decoding") as vLLM speculators trains it (`DFlashDraftModel`, with the
anchor as the bonus token): a window of committed tokens x [B, T] with a loss mask (the answer
positions), the target's fused features at every position and its distributions p_j (the
ones that chose x_{j+1}):

    anchors   A positions a per row, drawn without replacement (seeded by the step, so a
              resumed run draws what an uninterrupted one drew) among the positions with
              the mask set and a whole block inside the window (a <= T - bs)
    block     [x_a, m, ..., m] at positions a .. a+bs-1, seeing the context of every
              position c < a and the whole block (`jspec.drafters.dflash_head.block_forward`,
              the layers the drafter runs when it drafts)
    loss      slot i (1..bs-1) against p_{a+i-1}, where the mask holds at a+i:
              sum_i w_i KL(p || q_i) / (number of such slots),  w_i = exp(-(i-1) / gamma)
              (speculators' per-position decay; gamma 4 by default, its default)

Each anchor's block runs as its own row over the window's context keys and values (computed
once per window), so the pass is the drafter's own forward, not a re-implementation: a test
checks a trained block's logits against `DFlash.block_logits` after a prefill.

Held-out metrics (`evaluate`): per-slot top-1 agreement with the target's argmax and the
expected accepted length of a greedy block (1 + the run of leading slots that agree), the
figure DFlash reports as tau.

    drafter, run = train_dflash(target, drafter, DFlashTrainConfig(steps=400), batch_fn,
                                checkpoint_dir="dflash-ckpt")
    export_drafter(drafter, "out", "speculators", verifier="org/target")   # vLLM, SGLang
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jspec.core.drafter import target_for
from jspec.drafters.dflash import DFlash
from jspec.drafters.dflash_head import block_forward, context_kv
from jspec.training import trainer


@dataclasses.dataclass(frozen=True)
class DFlashTrainConfig:
  """A DFlash training run: optimizer schedule, window shape, anchors and loss decay."""

  steps: int = 400
  batch_size: int = 4  # B windows a step
  seq_len: int = 256  # T tokens a window
  anchors: int = 16  # A blocks a window
  gamma: float = 4.0  # the per-slot decay of the loss
  learning_rate: float = 6e-4
  warmup_steps: int = 40
  end_learning_rate: float = 0.0
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  b2: float = 0.95
  checkpoint_every: int = 100
  seed: int = 0

  def __post_init__(self):
    trainer.check_schedule(self)
    for name in ("batch_size", "seq_len", "anchors", "checkpoint_every"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"DFlashTrainConfig.{name} must be an integer >= 1, got {value!r}")
    if not (isinstance(self.gamma, (int, float)) and math.isfinite(self.gamma)
            and self.gamma > 0):
      raise ValueError(f"DFlashTrainConfig.gamma must be > 0, got {self.gamma!r}")


def check_fits(drafter: DFlash, cfg: DFlashTrainConfig) -> None:
  """Raise ValueError when the windows cannot hold the drafter's block."""
  if not isinstance(drafter, DFlash):
    raise TypeError(f"train_dflash trains a jspec.DFlash, got {type(drafter).__name__}")
  bs = drafter.config.block_size
  if cfg.seq_len < bs + 1:
    raise ValueError(f"seq_len {cfg.seq_len} cannot hold a block of {bs} after an anchor: "
                     f"it must be at least block_size + 1 = {bs + 1}")


# ----------------------------------------------------------------------------- objective


def draw_anchors(key, mask: jax.Array, count: int, block_size: int):
  """(anchors [B, A] int32, valid [B, A] bool): A positions per row drawn without
  replacement among those with `mask` set and a <= T - block_size; rows with fewer such
  positions get invalid entries (at position 0)."""
  B, T = mask.shape
  count = min(count, T)  # static: a window holds at most T anchors
  allowed = mask & (jnp.arange(T)[None, :] <= T - block_size)
  score = jnp.where(allowed, jax.random.uniform(key, (B, T)), -1.0)
  top, anchors = jax.lax.top_k(score, count)  # [B, A]
  valid = top >= 0.0
  return jnp.where(valid, anchors, 0).astype(jnp.int32), valid


def block_scores(drafter: DFlash, params, tokens, features, anchors):
  """The drafter's block logits at every anchor: [B, A, bs, V or N] f32.

  tokens [B, T] int32, features [B, T, n * D] the target's fused features at positions
  0..T-1, anchors [B, A]. Block j of row b sees the context of positions < anchors[b, j]."""
  c = drafter.config
  B, T = tokens.shape
  A, bs = anchors.shape[1], c.block_size
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None, :], (B, T))
  ctx_k, ctx_v = context_kv(c, params, features, positions)  # [NL, B, Hkv, T, Dh]
  ctx_k = jnp.repeat(ctx_k, A, axis=1)  # [NL, B * A, Hkv, T, Dh]: one row per block
  ctx_v = jnp.repeat(ctx_v, A, axis=1)
  a = anchors.reshape(-1)  # [B * A]
  first = jnp.take_along_axis(tokens, anchors, axis=1).reshape(-1)  # x_a
  block = jnp.concatenate([first[:, None].astype(jnp.int32),
                           jnp.full((B * A, bs - 1), c.mask_token_id, jnp.int32)], axis=1)
  block_positions = a[:, None] + jnp.arange(bs, dtype=jnp.int32)[None, :]  # [B * A, bs]
  visible = jnp.broadcast_to(jnp.arange(T)[None, None, :] < a[:, None, None], (B * A, bs, T))
  hidden = block_forward(c, params, drafter.embed_tokens(block), block_positions, ctx_k, ctx_v,
                         visible)
  scores = drafter.scores(hidden)  # [B * A, bs, V or N]
  return scores.reshape(B, A, bs, scores.shape[-1])


def slot_weights(block_size: int, gamma: float) -> jax.Array:
  """[bs]: 0 at the anchor, exp(-(i-1)/gamma) at slot i >= 1."""
  i = jnp.arange(block_size, dtype=jnp.float32)
  return jnp.where(i > 0, jnp.exp(-jnp.maximum(i - 1, 0) / gamma), 0.0)


def dflash_loss(params, drafter: DFlash, tokens, mask, features, targets, key,
                anchors: int, gamma: float):
  """The block objective on one batch; returns (loss, metrics).

  tokens [B, T]; mask [B, T] True where the position holds a token to learn (an answer
  token); features [B, T, n * D]; targets: the target's f32 logits [B, T, V] (position j's
  distribution chose x_{j+1}; the loss is KL(p || q)) or its argmax ids [B, T] int (stored
  labels; the loss is the cross-entropy of q at them, KL against a one-hot p). Metrics: the
  undecayed KL, top-1 agreement of slot 1 and of every slot with the target's argmax, and
  the greedy blocks' expected accepted length."""
  bs = drafter.config.block_size
  T = tokens.shape[1]
  anchor, valid = draw_anchors(key, mask, anchors, bs)  # [B, A]
  scores = block_scores(drafter, params, tokens, features, anchor)  # [B, A, bs, V or N]
  # slot i predicts x_{a+i} from p_{a+i-1}; slot 0 (the anchor) is never scored
  at = jnp.clip(anchor[:, :, None] + jnp.arange(bs)[None, None, :], 0, T - 1)  # [B, A, bs]
  source = jnp.clip(at - 1, 0, T - 1)
  log_q = jax.nn.log_softmax(scores, axis=-1)  # [B, A, bs, V or N]
  if jnp.issubdtype(targets.dtype, jnp.integer):  # stored argmax labels
    best = jax.vmap(lambda lb, idx: lb[idx])(targets, source).astype(jnp.int32)  # [B, A, bs]
    column = best
    if drafter.ids is not None:  # the label's column among the draft ids; none: unreachable
      match = drafter.ids[None, None, None, :] == best[..., None]
      column = jnp.argmax(match, axis=-1)
    kl = -jnp.take_along_axis(log_q, column[..., None], axis=-1)[..., 0]
    if drafter.ids is not None:
      kl = jnp.where(jnp.any(match, axis=-1), kl, 0.0)
  else:
    logits_at = jax.vmap(lambda lg, idx: lg[idx])(targets, source)  # [B, A, bs, V]
    p = jax.nn.softmax(logits_at.astype(jnp.float32), axis=-1)
    best = jnp.argmax(logits_at, axis=-1)  # [B, A, bs]
    if drafter.ids is not None:
      p = jnp.take(p, drafter.ids, axis=-1)  # mass outside the draft ids is unreachable
    kl = jnp.sum(jax.scipy.special.xlogy(p, p) - p * log_q, axis=-1)  # [B, A, bs]
  scored = (valid[:, :, None] & jnp.take_along_axis(mask, at.reshape(mask.shape[0], -1), axis=1)
            .reshape(at.shape) & (jnp.arange(bs) > 0)[None, None, :])
  scored = scored.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(scored), 1.0)
  loss = jnp.sum(kl * scored * slot_weights(bs, gamma)[None, None, :]) / count
  drafted = jnp.argmax(scores, axis=-1)  # an index into the draft vocabulary
  if drafter.ids is not None:
    drafted = jnp.take(drafter.ids, drafted)
  hit = (drafted == best).astype(jnp.float32)
  run = jnp.cumprod(hit[:, :, 1:] * scored[:, :, 1:], axis=-1)  # leading agreeing slots
  valid_f = valid.astype(jnp.float32)
  blocks = jnp.maximum(jnp.sum(valid_f), 1.0)
  metrics = {
      "kl": jnp.sum(kl * scored) / count,
      "top1": jnp.sum(hit * scored) / count,
      "top1_first": jnp.sum(hit[:, :, 1] * scored[:, :, 1]) / jnp.maximum(
          jnp.sum(scored[:, :, 1]), 1.0),
      "accepted_length": 1.0 + jnp.sum(jnp.sum(run, axis=-1) * valid_f) / blocks,
  }
  return loss, metrics


def target_outputs(target, drafter: DFlash, tokens):
  """The frozen target on windows [B, T]: the drafter's fused features [B, T, n * D] and the
  f32 logits [B, T, V]."""
  start = jnp.zeros((tokens.shape[0],), jnp.int32)
  logits, features, _ = target_for(target, drafter).apply(tokens, None, start)
  return jax.lax.stop_gradient(features), jax.lax.stop_gradient(logits)


@functools.lru_cache(maxsize=8)
def make_step(cfg: DFlashTrainConfig):
  """(optimizer, jitted step): step(params, opt_state, drafter, target, tokens, mask, key)
  -> (params, opt_state, loss, metrics). The drafter supplies the frozen embedding, LM head
  and config (its own params are ignored); the target runs without gradient."""
  optimizer = trainer.make_optimizer(cfg)

  @jax.jit
  def step(params, opt_state, drafter, target, tokens, mask, key):
    features, logits = target_outputs(target, drafter, tokens)
    (loss, metrics), grads = jax.value_and_grad(dflash_loss, has_aux=True)(
        params, drafter, tokens, mask, features, logits, key, cfg.anchors, cfg.gamma)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, metrics

  return optimizer, step


@functools.lru_cache(maxsize=8)
def make_stored_step(cfg: DFlashTrainConfig):
  """(optimizer, jitted step) for stored data: step(params, opt_state, drafter, tokens, mask,
  features, targets, key), features [B, T, n * D] and targets (logits or argmax ids) kept from
  one pass of the target, which is not run again."""
  optimizer = trainer.make_optimizer(cfg)

  @jax.jit
  def step(params, opt_state, drafter, tokens, mask, features, targets, key):
    (loss, metrics), grads = jax.value_and_grad(dflash_loss, has_aux=True)(
        params, drafter, tokens, mask, features.astype(jnp.float32), targets, key,
        cfg.anchors, cfg.gamma)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, metrics

  return optimizer, step


# ----------------------------------------------------------------------------- runs


@functools.partial(jax.jit, static_argnums=(5,))
def _eval_batch(drafter, target, tokens, mask, key, anchors):
  features, logits = target_outputs(target, drafter, tokens)
  return dflash_loss(drafter.params, drafter, tokens, mask, features, logits, key, anchors,
                     4.0)[1]


def evaluate(drafter: DFlash, target, windows: np.ndarray, masks: np.ndarray, *,
             anchors: int = 32, seed: int = 0, chunk: int = 8) -> dict:
  """Held-out metrics over windows [N, T] with loss masks [N, T], means over the chunks
  weighted by rows: kl, top1 (every slot), top1_first (slot 1), accepted_length (greedy
  blocks: 1 + the leading slots that agree with the target's argmax)."""
  sums, count = {}, 0
  key = jax.random.key(seed)
  for i in range(0, windows.shape[0], chunk):
    rows = slice(i, i + chunk)
    m = _eval_batch(drafter, target, jnp.asarray(windows[rows], jnp.int32),
                    jnp.asarray(masks[rows], bool), jax.random.fold_in(key, i), anchors)
    n = windows[rows].shape[0]
    for k, v in m.items():
      sums[k] = sums.get(k, 0.0) + float(v) * n
    count += n
  return {k: round(v / max(count, 1), 4) for k, v in sums.items()}


def train_dflash(target, drafter: DFlash, cfg: DFlashTrainConfig,
                 batch_fn: Callable[[int], tuple[np.ndarray, np.ndarray]], *,
                 checkpoint_dir: str | None = None, progress: bool = True,
                 evaluate_fn: Callable[[DFlash], dict] | None = None, eval_every: int = 0):
  """Train `drafter`'s params on the frozen `target`; returns (trained DFlash, `trainer.Fit`).

  batch_fn(step) -> (tokens [B, T] int32, loss mask [B, T] bool), the target then run in
  each step for the features and distributions, or (tokens, mask, features [B, T, n * D],
  targets) with stored ones (`dflash_loss`); a pure function of the step, so a run resumed from `checkpoint_dir` (orbax, every `cfg.checkpoint_every` steps)
  continues exactly where an uninterrupted one would be. The anchors of step s come from
  `cfg.seed` and s alone."""
  check_fits(drafter, cfg)
  optimizer, step = make_step(cfg)
  _, stored_step = make_stored_step(cfg)
  base = jax.random.key(cfg.seed)
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), drafter.params)
  with jax.numpy_dtype_promotion("standard"):
    state = {"params": params, "opt_state": optimizer.init(params)}

  def step_fn(state, s):
    batch = batch_fn(s)
    tokens, mask = np.asarray(batch[0]), np.asarray(batch[1])
    want = (cfg.batch_size, cfg.seq_len)
    if tokens.shape != want or mask.shape != want:
      raise ValueError(f"batch_fn({s}) gave tokens {tokens.shape} and mask {mask.shape}; the "
                       f"config asks for {want}")
    key = jax.random.fold_in(base, s)
    tokens, mask = jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, bool)
    if len(batch) == 4:  # stored features and targets
      p, o, loss, metrics = stored_step(state["params"], state["opt_state"], drafter, tokens,
                                        mask, jnp.asarray(batch[2]), jnp.asarray(batch[3]), key)
    else:
      p, o, loss, metrics = step(state["params"], state["opt_state"], drafter, target, tokens,
                                 mask, key)
    return {"params": p, "opt_state": o}, loss, metrics

  run_config = {"kind": "dflash", "config": dataclasses.asdict(cfg),
                "drafter": repr(drafter.config)}
  evaluate = None
  if evaluate_fn is not None:
    evaluate = lambda st: evaluate_fn(dataclasses.replace(drafter, params=st["params"]))  # noqa: E731
  run = trainer.fit(state, step_fn, steps=cfg.steps,
                    tokens_per_step=cfg.batch_size * cfg.seq_len, desc="dflash",
                    progress=progress, checkpoint_dir=checkpoint_dir,
                    checkpoint_every=cfg.checkpoint_every, run_config=run_config,
                    evaluate=evaluate, eval_every=eval_every)
  return dataclasses.replace(drafter, params=run.state["params"]), run
