"""The training skeleton every objective shares: optimizer, loop, evaluation,
checkpoints, resumption and progress.

The language-model and distillation trainer (`train.py`), the Medusa heads
(`train_medusa.py`) and the EAGLE head (`train_eagle.py`) differ in their state,
their loss and their reports; everything else is here, once:

    optimizer   clip by global norm -> AdamW (decay on the leaves `decay` picks)
                under linear warmup + cosine decay (`make_optimizer`)
    loop        state = step_fn(state, step) for step in [start, steps) (`fit`):
                a step's batch must be a pure function of the step, so a run
                resumed at step s sees what an uninterrupted run saw after s
    checkpoints orbax, every `checkpoint_every` steps and at the end, in
                checkpoint_dir/steps, with history.json beside it; run.json
                records the run's settings and a rerun with other settings is
                refused rather than resumed into a different run
    progress    tqdm: smoothed loss, tokens/s (the compiling first step excluded)
                and the last evaluation's scalars

State is any pytree of arrays (params and optimizer state); `fit` saves and
restores it as it is.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Protocol

import jax
import numpy as np
import optax


class Optimization(Protocol):
  """The optimizer settings a run's config carries (`TrainConfig`, `EagleTrainConfig`)."""

  steps: int
  learning_rate: float
  warmup_steps: int
  end_learning_rate: float
  weight_decay: float
  clip_norm: float
  b2: float


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Optimizer settings on their own (for trainers whose config has no others)."""

  steps: int
  learning_rate: float
  warmup_steps: int
  end_learning_rate: float = 0.0
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  b2: float = 0.95

  def __post_init__(self):
    check_schedule(self)


def check_schedule(opt: Optimization) -> None:
  """Clear errors for settings no run can use."""
  if opt.steps < 1:
    raise ValueError(f"steps must be >= 1, got {opt.steps}")
  if not 0 <= opt.warmup_steps < opt.steps:
    raise ValueError(f"warmup_steps must lie in [0, steps), got {opt.warmup_steps}")
  if opt.learning_rate <= 0 or opt.weight_decay < 0 or opt.clip_norm <= 0:
    raise ValueError(f"learning_rate and clip_norm must be > 0 and weight_decay >= 0: {opt}")


def matrices(path, leaf) -> bool:
  """The default decay rule: every leaf of rank >= 2."""
  del path
  return leaf.ndim >= 2


def make_optimizer(opt: Optimization,
                   decay: Callable[[Any, Any], bool] = matrices) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW (b1 0.9) with weight decay on the leaves where
  decay(path, leaf) holds, under linear warmup and cosine decay to end_learning_rate."""
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=opt.learning_rate, warmup_steps=opt.warmup_steps,
      decay_steps=opt.steps, end_value=opt.end_learning_rate)
  mask = lambda params: jax.tree_util.tree_map_with_path(decay, params)
  return optax.chain(
      optax.clip_by_global_norm(opt.clip_norm),
      optax.adamw(schedule, b1=0.9, b2=opt.b2, weight_decay=opt.weight_decay, mask=mask))


@dataclasses.dataclass
class Fit:
  """What `fit` returns."""

  state: Any  # the final state pytree
  history: list  # [{"step", "loss", metrics..., evaluation...}] every log_every steps
  start: int  # the step the run resumed from (0 for a fresh run)
  seconds: float  # wall time of the loop in this call
  evaluation: dict | None  # evaluate(final state), when an `evaluate` was given


def fit(state, step_fn: Callable, *, steps: int, tokens_per_step: int, desc: str = "train",
        progress: bool = True, checkpoint_dir: str | None = None, checkpoint_every: int = 100,
        run_config: dict | None = None, log_every: int = 20,
        evaluate: Callable[[Any], dict] | None = None, eval_every: int = 0) -> Fit:
  """Run `step_fn` from the latest checkpoint (or step 0) to `steps`.

  step_fn(state, step) -> (state, loss, metrics): one optimizer step on the step's
  batch; metrics a dict of arrays (scalars or vectors), logged with the loss.
  evaluate(state) -> dict of JSON-ready values, run every `eval_every` steps (0:
  only at the end) and at the last step, logged in that step's history entry.
  With `checkpoint_dir`, state and history are saved every `checkpoint_every` steps
  and at the end, and a rerun resumes from the latest save; `run_config` (JSON-ready)
  is recorded there and must match on resumption.
  """
  import orbax.checkpoint as ocp
  from tqdm.auto import tqdm

  manager, start, history = None, 0, []
  if checkpoint_dir is not None:
    checkpoint_dir = os.path.abspath(checkpoint_dir)
    _check_run(checkpoint_dir, run_config)
    manager = ocp.CheckpointManager(
        os.path.join(checkpoint_dir, "steps"),
        options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True))
    latest = manager.latest_step()
    if latest is not None:
      abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
      state = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
      start, history = latest, _read_history(checkpoint_dir)
  # Commit the state to the device now: arrays made on the host come back from the
  # first step committed, and that change of placement would compile the step again.
  state = jax.device_put(state, jax.devices()[0])

  bar = tqdm(range(start, steps), initial=start, total=steps, desc=desc, disable=not progress,
             mininterval=2.0)
  t0 = time.perf_counter()
  timed_from, timed_steps, smooth, shown, evaluation = t0, 0, None, {}, None
  for step in bar:
    # optax's bias correction mixes Python floats and int32 counts: trace under
    # standard promotion even when the caller runs jax in strict mode.
    with jax.numpy_dtype_promotion("standard"):
      state, loss, metrics = step_fn(state, step)
    if step == start:
      float(loss)  # the first step compiles; keep it out of tokens/s
      timed_from, timed_steps = time.perf_counter(), 0
    else:
      timed_steps += 1
    done = step + 1
    if done % log_every == 0 or done == steps:
      entry = {"step": done, "loss": round(float(loss), 4)}
      entry.update({k: _rounded(v) for k, v in metrics.items()})
      smooth = entry["loss"] if smooth is None else 0.7 * smooth + 0.3 * entry["loss"]
      evaluation = None
      if evaluate is not None and ((eval_every and done % eval_every == 0) or done == steps):
        evaluation = evaluate(state)
        entry.update(evaluation)
        shown = {k: f"{v:.3f}" for k, v in evaluation.items() if isinstance(v, float)}
      history.append(entry)
      rate = timed_steps * tokens_per_step / max(time.perf_counter() - timed_from, 1e-9)
      bar.set_postfix({"loss": f"{smooth:.3f}", "tok/s": f"{rate:,.0f}", **shown},
                      refresh=False)
    if manager is not None and (done % checkpoint_every == 0 or done == steps):
      manager.save(done, args=ocp.args.StandardSave(state))
      manager.wait_until_finished()
      _write_history(checkpoint_dir, history)
  bar.close()
  if manager is not None:
    manager.close()
  if evaluate is not None and evaluation is None:  # nothing ran, or the last step
    evaluation = evaluate(state)  # was not a logging step
  return Fit(state=state, history=history, start=start, seconds=time.perf_counter() - t0,
             evaluation=evaluation)


def _rounded(value):
  value = np.asarray(value)
  return round(float(value), 4) if value.ndim == 0 else [round(float(x), 4) for x in value]


def _check_run(checkpoint_dir: str, run_config: dict | None) -> None:
  """Record the run's settings in `checkpoint_dir`, or refuse to resume a different run."""
  os.makedirs(checkpoint_dir, exist_ok=True)
  if run_config is None:
    return
  path = os.path.join(checkpoint_dir, "run.json")
  if os.path.isfile(path):
    with open(path) as f:
      earlier = json.load(f)
    if earlier != json.loads(json.dumps(run_config)):
      raise ValueError(f"{checkpoint_dir} holds training state of a different run "
                       f"({earlier}); delete it or use another directory")
  else:
    with open(path, "w") as f:
      json.dump(run_config, f, indent=2)


def _write_history(checkpoint_dir: str, history: list) -> None:
  with open(os.path.join(checkpoint_dir, "history.json"), "w") as f:
    json.dump(history, f)


def _read_history(checkpoint_dir: str) -> list:
  path = os.path.join(checkpoint_dir, "history.json")
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    return json.load(f)
