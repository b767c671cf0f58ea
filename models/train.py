"""Training the reference decoder with optax: language modelling and distillation.

One loop serves both objectives. A step draws its batch from a seeded function of
(seed, step), so a run resumed from an orbax checkpoint at step s sees exactly the
batches an uninterrupted run would have seen after s:

    batch(step) -> tokens [B, T+1]          (plus whatever the objective needs)
    loss(module, batch, teacher) -> scalar
    optimizer: clip by global norm -> AdamW (decoupled decay on matrices only)
               under linear warmup + cosine decay

Objectives:
  * `lm_loss`: next-token cross-entropy on text;
  * `distill_loss`: forward KL(target || draft) per position, on the target's
    full next-token distributions (DistillSpec, Zhou et al. 2023, found forward
    KL and total variation the strongest divergences for greedy drafting).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jspec.models.transformer import Transformer, TransformerConfig


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimisation settings of one run (all static)."""

  steps: int
  batch_size: int  # B sequences per step
  seq_len: int  # T tokens predicted per sequence
  learning_rate: float
  warmup_steps: int
  end_learning_rate: float = 0.0  # cosine decays to this
  weight_decay: float = 0.1
  clip_norm: float = 1.0
  b2: float = 0.95
  eval_every: int = 200
  checkpoint_every: int = 200
  seed: int = 0

  def __post_init__(self):
    if self.steps < 1 or self.batch_size < 1 or self.seq_len < 1:
      raise ValueError(f"steps, batch_size and seq_len must be >= 1: {self}")
    if not 0 <= self.warmup_steps < self.steps:
      raise ValueError(f"warmup_steps must lie in [0, steps), got {self.warmup_steps}")


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW (weight decay on rank >= 2 leaves, biases excepted)
  under linear warmup and cosine decay to `cfg.end_learning_rate`."""
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=cfg.warmup_steps,
      decay_steps=cfg.steps, end_value=cfg.end_learning_rate)

  def decay_mask(params):
    # Decay applies to every leaf of rank >= 2 except stacked biases (b*). Note: the
    # per-layer norm scales ([L, D], leaf name "scale") are rank 2 and so are decayed
    # too; the shipped checkpoints were trained this way, so the rule stays until the
    # next retrain (only the 1-D final norm scale escapes decay).
    def keep(path, leaf):
      name = str(getattr(path[-1], "key", path[-1]))
      return leaf.ndim >= 2 and not ("norm" in name or name.startswith("b"))
    return jax.tree_util.tree_map_with_path(keep, params)

  return optax.chain(
      optax.clip_by_global_norm(cfg.clip_norm),
      optax.adamw(schedule, b1=0.9, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask))


# ----------------------------------------------------------------------------- objectives


def lm_loss(module: Transformer, batch: dict, teacher=None) -> jax.Array:
  """Mean next-token cross-entropy. batch["tokens"] [B, T+1]."""
  del teacher
  tokens = batch["tokens"]
  logits = module(tokens[:, :-1])  # [B, T, V] f32
  return cross_entropy(logits, tokens[:, 1:])


def distill_loss(module: Transformer, batch: dict, teacher) -> jax.Array:
  """Mean forward KL(teacher || module) over positions. teacher: a `jspec.Model`."""
  tokens = batch["tokens"][:, :-1]
  target_logp = jax.nn.log_softmax(jax.lax.stop_gradient(teacher.logits(tokens)), axis=-1)
  draft_logp = jax.nn.log_softmax(module(tokens), axis=-1)
  kl = jnp.sum(jnp.exp(target_logp) * (target_logp - draft_logp), axis=-1)  # [B, T]
  return jnp.mean(kl)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean cross-entropy of logits [B, T, V] against integer labels [B, T]."""
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


@jax.jit
def _heldout_loss(model, tokens):
  return cross_entropy(model.logits(tokens[:, :-1]), tokens[:, 1:])


def heldout_loss(model, windows: np.ndarray, chunk: int = 16) -> float:
  """Mean next-token cross-entropy (nats/token) of a `jspec.Model` on windows [N, T+1]."""
  losses = [float(_heldout_loss(model, jnp.asarray(windows[i:i + chunk])))
            for i in range(0, windows.shape[0], chunk)]
  sizes = [min(chunk, windows.shape[0] - i) for i in range(0, windows.shape[0], chunk)]
  return float(np.average(losses, weights=sizes))


@jax.jit
def _kl(draft, target, tokens):
  t = jax.nn.log_softmax(target.logits(tokens), axis=-1)
  d = jax.nn.log_softmax(draft.logits(tokens), axis=-1)
  return jnp.mean(jnp.sum(jnp.exp(t) * (t - d), axis=-1))


def kl_divergence(draft, target, windows: np.ndarray, chunk: int = 16) -> float:
  """Mean forward KL(target || draft) per position over windows [N, T]."""
  vals = [float(_kl(draft, target, jnp.asarray(windows[i:i + chunk])))
          for i in range(0, windows.shape[0], chunk)]
  sizes = [min(chunk, windows.shape[0] - i) for i in range(0, windows.shape[0], chunk)]
  return float(np.average(vals, weights=sizes))


# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class TrainResult:
  """What `train` returns: the trained module and a record of the run."""

  module: Transformer
  steps: int
  tokens_seen: int
  heldout_loss: float | None
  history: list  # [{"step", "loss", "heldout_loss"?}]
  seconds: float


def train(config: TransformerConfig, cfg: TrainConfig, batch_fn: Callable[[int], dict],
          loss_fn: Callable = lm_loss, *, teacher=None, init_params: dict | None = None,
          heldout: np.ndarray | None = None, checkpoint_dir: str | None = None,
          progress: bool = True, desc: str = "train") -> TrainResult:
  """Train a `Transformer` of `config` for `cfg.steps` steps.

  batch_fn(step) returns the step's batch (a dict of arrays); it must be a pure
  function of the step for resumption to be exact. `teacher` (a `jspec.Model`)
  is passed to the loss as an argument, never closed over. With a
  `checkpoint_dir`, model and optimizer state are saved every
  `cfg.checkpoint_every` steps and the run resumes from the latest one.
  """
  import orbax.checkpoint as ocp
  from tqdm.auto import tqdm

  module = Transformer(config, rngs=nnx.Rngs(cfg.seed))
  if init_params is not None:
    _assign(module, init_params)
  optimizer = nnx.Optimizer(module, make_optimizer(cfg), wrt=nnx.Param)

  @nnx.jit
  def step_fn(module, optimizer, batch, teacher):
    loss, grads = nnx.value_and_grad(loss_fn)(module, batch, teacher)
    optimizer.update(module, grads)
    return loss

  manager, start, history = None, 0, []
  if checkpoint_dir is not None:
    manager = ocp.CheckpointManager(
        os.path.abspath(checkpoint_dir),
        options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True))
    latest = manager.latest_step()
    if latest is not None:
      snapshot = _snapshot(module, optimizer)
      abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, snapshot)
      restored = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
      _load_pure(module, restored["module"])
      _load_pure(optimizer, restored["optimizer"])
      start = latest
      history = _read_history(checkpoint_dir)

  # Commit every state array to the device now: arrays built on the host come back
  # from the first step committed, and that change of placement would retrace and
  # recompile the step once more.
  device = jax.devices()[0]
  for obj in (module, optimizer):
    nnx.update(obj, jax.device_put(nnx.state(obj), device))

  tokens_per_step = cfg.batch_size * cfg.seq_len
  bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=desc,
             disable=not progress, mininterval=2.0)
  t0, last_eval, loss_avg = time.perf_counter(), None, None
  timed_from, timed_steps = None, 0
  for step in bar:
    batch = {k: jnp.asarray(v) for k, v in batch_fn(step).items()}
    # optax's bias correction mixes Python floats and int32 counts: trace it under
    # standard promotion even when the caller runs jax in strict mode.
    with jax.numpy_dtype_promotion("standard"):
      loss = step_fn(module, optimizer, batch, teacher)
    if step == start:
      float(loss)  # first step compiles; exclude it from tokens/s
      timed_from, timed_steps = time.perf_counter(), 0
    else:
      timed_steps += 1
    done = step + 1
    if done % 20 == 0 or done == cfg.steps:
      value = float(loss)
      loss_avg = value if loss_avg is None else 0.7 * loss_avg + 0.3 * value
      entry = {"step": done, "loss": round(value, 4)}
      if heldout is not None and (done % cfg.eval_every == 0 or done == cfg.steps):
        last_eval = heldout_loss(module.to_model(), heldout)
        entry["heldout_loss"] = round(last_eval, 4)
      history.append(entry)
      rate = timed_steps * tokens_per_step / max(time.perf_counter() - timed_from, 1e-9)
      postfix = {"loss": f"{loss_avg:.3f}", "tok/s": f"{rate:,.0f}"}
      if last_eval is not None:
        postfix["heldout"] = f"{last_eval:.3f}"
      bar.set_postfix(postfix, refresh=False)
    if manager is not None and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
      manager.save(done, args=ocp.args.StandardSave(_snapshot(module, optimizer)))
      manager.wait_until_finished()
      _write_history(checkpoint_dir, history)
  bar.close()
  if manager is not None:
    manager.close()
  if heldout is not None and last_eval is None:
    last_eval = heldout_loss(module.to_model(), heldout)
  return TrainResult(module=module, steps=cfg.steps, tokens_seen=cfg.steps * tokens_per_step,
                     heldout_loss=last_eval, history=history,
                     seconds=time.perf_counter() - t0)


def _snapshot(module, optimizer) -> dict:
  return {"module": nnx.to_pure_dict(nnx.state(module)),
          "optimizer": nnx.to_pure_dict(nnx.state(optimizer))}


def _assign(module: Transformer, params: dict) -> None:
  state = nnx.state(module, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree_util.tree_map(jnp.asarray, params))
  nnx.update(module, state)


def _load_pure(node, pure: dict) -> None:
  state = nnx.state(node)
  nnx.replace_by_pure_dict(state, pure)  # in place
  nnx.update(node, state)


def _history_path(checkpoint_dir) -> str:
  return os.path.join(checkpoint_dir, "history.json")


def _write_history(checkpoint_dir, history) -> None:
  with open(_history_path(checkpoint_dir), "w") as f:
    json.dump(history, f)


def _read_history(checkpoint_dir) -> list:
  path = _history_path(checkpoint_dir)
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    return json.load(f)

