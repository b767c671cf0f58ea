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
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jspec.training import trainer
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
  """`trainer.make_optimizer` with the decoder's decay rule: every leaf of rank >= 2 but
  biases (b*) and norm scales, so only the per-layer norm scales' [L, D] stacks are told
  apart from matrices by name."""
  return trainer.make_optimizer(cfg, decay=_decays)


def _decays(path, leaf) -> bool:
  # Note: the per-layer norm scales ([L, D], leaf name "scale") are rank 2 and so are
  # decayed too; the shipped checkpoints were trained this way, so the rule stays until
  # the next retrain (only the 1-D final norm scale escapes decay).
  name = str(getattr(path[-1], "key", path[-1]))
  return leaf.ndim >= 2 and not ("norm" in name or name.startswith("b"))


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
  """Train a `Transformer` of `config` for `cfg.steps` steps (the loop: `trainer.fit`).

  batch_fn(step) returns the step's batch (a dict of arrays); it must be a pure
  function of the step for resumption to be exact. `teacher` (a `jspec.Model`)
  is passed to the loss as an argument, never closed over. With a
  `checkpoint_dir`, model and optimizer state are saved every
  `cfg.checkpoint_every` steps and the run resumes from the latest one.
  """
  module = Transformer(config, rngs=nnx.Rngs(cfg.seed))
  if init_params is not None:
    _assign(module, init_params)
  optimizer = nnx.Optimizer(module, make_optimizer(cfg), wrt=nnx.Param)
  # The loop carries plain nested dicts (what orbax saves); the step rebuilds the NNX
  # objects from them inside the trace.
  graphdef, template = nnx.split((module, optimizer))

  def objects(pure):
    state = jax.tree_util.tree_map(lambda x: x, template)  # a copy to fill
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)

  @jax.jit
  def pure_step(pure, batch, teacher):
    module, optimizer = objects(pure)
    loss, grads = nnx.value_and_grad(loss_fn)(module, batch, teacher)
    optimizer.update(module, grads)
    return nnx.to_pure_dict(nnx.state((module, optimizer))), loss

  def step_fn(pure, step):
    batch = {k: jnp.asarray(v) for k, v in batch_fn(step).items()}
    pure, loss = pure_step(pure, batch, teacher)
    return pure, loss, {}

  def evaluate(pure):
    return {"heldout_loss": round(heldout_loss(objects(pure)[0].to_model(), heldout), 4)}

  run = trainer.fit(nnx.to_pure_dict(nnx.state((module, optimizer))), step_fn, steps=cfg.steps,
                    tokens_per_step=cfg.batch_size * cfg.seq_len, desc=desc, progress=progress,
                    checkpoint_dir=checkpoint_dir, checkpoint_every=cfg.checkpoint_every,
                    run_config=None if checkpoint_dir is None else _run_config(config, cfg),
                    evaluate=None if heldout is None else evaluate, eval_every=cfg.eval_every)
  module = objects(run.state)[0]
  return TrainResult(module=module, steps=cfg.steps, tokens_seen=cfg.steps * cfg.batch_size *
                     cfg.seq_len, heldout_loss=(run.evaluation or {}).get("heldout_loss"),
                     history=run.history, seconds=run.seconds)


def _run_config(config: TransformerConfig, cfg: TrainConfig) -> dict:
  return {"model": config.to_dict(), "train": dataclasses.asdict(cfg)}


def _assign(module: Transformer, params: dict) -> None:
  state = nnx.state(module, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree_util.tree_map(jnp.asarray, params))
  nnx.update(module, state)
