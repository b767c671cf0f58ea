"""RL rollouts with exact speculative decoding, one compiled step across weight updates.

A small policy is trained with a PPO-style clipped objective on a toy reward (the
fraction of its sampled tokens whose ids lie below V/4). Each step is ONE jitted
`train_step`: speculative sampling of N rollouts (K drafts, temperature 1) that
records the log-probability of every sampled token, then a few adam steps on the
clipped ratio exp(logp_new - logp_rollout) through `policy.logits` on each
rollout's prompt + sample. The recorded log-probabilities are the behaviour
policy's: no second forward pass is needed to get them, and the first step checks
they equal a fresh forward's.

Rollout lengths are long-tailed, as in RL (each step draws every rollout's answer
length from a lognormal around 6 tokens, capped at max_new_tokens). In a fixed
batch a finished row would keep computing until the batch's longest rollout ends;
here the N rollouts run through B < N slots on the library's continuous-batching
queue (`jspec.core.slots.decode_queue`, the loop of `jspec.generate_many`): a
rollout that ends frees its slot for the next one, inside the same compiled step.
The lengths are a traced array, so new lengths, like new weights, reuse the
program.

The drafter is a `jspec.DraftModel` of a frozen copy of the initial policy, the
classic setup in which the drafter goes stale while the policy drifts. Params (of
both) are arguments of the step, never closed over, so new weights reuse the
compiled program.

    python examples/rl_rollouts.py --steps 12

What it shows: the step compiles once; the reward rises from about 0.25 (a random
policy's share of the low ids) as the policy learns; acceptance alpha starts near
1 (the drafter is the policy) and falls as the policy drifts away from its stale
drafter, and tokens per target call tau (new tokens over target rounds, summed
over the rollouts) falls with it, towards 1. With `--refresh-drafter N` the
drafter takes the policy's weights every N steps, as RL systems refresh their
draft weights, and acceptance climbs back after each refresh, still with one
compile. Sampling stays exact whatever the drafter proposes: only the speed
depends on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jspec
from jspec.core import decode
from jspec.core import slots as slots_lib
from jspec.models import TransformerConfig

TRACES = 0  # times train_step's Python body ran: one per compilation


@dataclasses.dataclass(frozen=True)
class Settings:
  """Sizes of one run; the defaults finish in well under a minute on a 2-core CPU."""

  steps: int = 12  # rollout + update steps
  rollouts: int = 32  # N rollouts per step
  slots: int = 8  # B rows they run through (a finished rollout frees its row)
  prompt_len: int = 6  # prompts have 3..prompt_len tokens
  max_new_tokens: int = 16  # cap on a rollout's drawn answer length
  num_draft_tokens: int = 4
  inner_steps: int = 4  # adam steps on each step's rollouts
  learning_rate: float = 1e-2
  clip: float = 0.2  # PPO ratio clip
  refresh_drafter: int = 0  # copy the policy into the drafter every this many steps (0: frozen)
  vocab_size: int = 64
  seed: int = 0


def policy_config(s: Settings) -> TransformerConfig:
  return TransformerConfig(vocab_size=s.vocab_size, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=128, initializer_range=0.3)


def decode_config(s: Settings) -> decode.DecodeConfig:
  return decode.DecodeConfig(num_draft_tokens=s.num_draft_tokens,
                             cache_length=s.prompt_len + s.max_new_tokens + s.num_draft_tokens + 1,
                             logprobs=jspec.Logprobs())  # processed p: what the token was drawn from


def rollout(policy, drafter, prompts, prompt_lengths, max_new, seeds, temperature,
            s: Settings) -> slots_lib.Results:
  """Speculative sampling of max_new[n] tokens for each of the N prompts, through
  `s.slots` rows. Results in queue order: tokens [N, M] (-1 past each end), lengths
  [N], stats [N] rows, log-probability records [N, M] (record j: the token at
  prompt_lengths[n] + j). temperature: a scalar, traced, so greedy (0) and sampled
  (1) share one program."""
  N = prompts.shape[0]
  params = jspec.SamplingParams(temperature=jnp.full((N,), temperature, jnp.float32),
                                top_k=jnp.zeros((N,), jnp.int32),
                                top_p=jnp.ones((N,), jnp.float32))
  queue = slots_lib.Queue(tokens=prompts, prompt_lengths=prompt_lengths, max_new=max_new,
                          seeds=seeds, params=params)
  results, _ = slots_lib.decode_queue(policy, drafter, queue, jnp.int32(N),
                                      jnp.full((1,), -1, jnp.int32),  # no stop id: drawn lengths
                                      decode_config(s), s.slots, s.max_new_tokens)
  return results


def sequences(prompts, prompt_lengths, tokens, lengths):
  """Each rollout's prompt then its sample, [N, P + M], and the mask [N, P + M] of its
  own new tokens. The sample starts right after the prompt's own length (prompts are
  right-padded), so the forward sees no gap; past a rollout's end: id 0."""
  N, P = prompts.shape
  M = tokens.shape[1]
  t = jnp.arange(P + M, dtype=jnp.int32)[None, :]  # [1, P + M]
  j = t - prompt_lengths[:, None]  # [N, P + M] index into the sample
  mask = (j >= 0) & (j < lengths[:, None])
  sample = jnp.take_along_axis(tokens, jnp.clip(j, 0, M - 1), axis=1)  # [N, P + M]
  prompt = jnp.pad(prompts, ((0, 0), (0, M)))  # [N, P + M]
  seq = jnp.where(mask, sample, jnp.where(j < 0, prompt, 0))
  return seq, mask


def token_logprobs(policy: jspec.Model, params, tokens):
  """log p(tokens[:, t] | tokens[:, :t]) for t = 1..S-1: [N, S-1], one cache-free forward
  (causal, so the padding past each rollout's end changes nothing before it)."""
  logits = dataclasses.replace(policy, params=params).logits(tokens)[:, :-1]  # [N, S-1, V]
  lp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.take_along_axis(lp, tokens[:, 1:, None], axis=-1)[:, :, 0]


def make_train_step(s: Settings, optimizer: optax.GradientTransformation):
  """The jitted step: (policy, drafter, opt_state, prompts, prompt_lengths, max_new,
  seeds) -> (policy, opt_state, metrics). Settings and optimizer are static; weights
  and the drawn lengths traced."""

  @jax.jit
  def train_step(policy, drafter, opt_state, prompts, prompt_lengths, max_new, seeds):
    global TRACES
    TRACES += 1
    results = rollout(policy, drafter, prompts, prompt_lengths, max_new, seeds, 1.0, s)
    seq, mask = sequences(prompts, prompt_lengths, results.tokens, results.lengths)
    M = results.tokens.shape[1]
    # Record j of rollout n is the behaviour log-prob of seq[n, prompt_lengths[n] + j]:
    # the same gather as the sample's, then drop position 0 to align with the forward.
    j = jnp.arange(seq.shape[1], dtype=jnp.int32)[None, :] - prompt_lengths[:, None]
    old_lp = jnp.take_along_axis(results.logprobs.chosen, jnp.clip(j, 0, M - 1), axis=1)
    mask = mask[:, 1:]  # [N, S-1]; prompts have >= 1 token, so nothing is lost
    maskf = mask.astype(jnp.float32)
    old_lp = jnp.where(mask, old_lp[:, 1:], 0.0)  # [N, S-1]
    count = jnp.sum(maskf, axis=1)  # [N] tokens generated per rollout
    hits = (seq[:, 1:] < s.vocab_size // 4).astype(jnp.float32)
    reward = jnp.sum(hits * maskf, axis=1) / jnp.maximum(count, 1.0)  # [N]
    advantage = (reward - jnp.mean(reward))[:, None]  # mean over the N rollouts as baseline

    def loss_fn(params):
      ratio = jnp.exp(token_logprobs(policy, params, seq) - old_lp)
      clipped = jnp.clip(ratio, 1.0 - s.clip, 1.0 + s.clip)
      surrogate = jnp.minimum(ratio * advantage, clipped * advantage)
      return -jnp.sum(surrogate * maskf) / jnp.sum(maskf)

    def update(carry, _):
      params, opt_state = carry
      loss, grads = jax.value_and_grad(loss_fn)(params)
      # optax mixes Python floats with its int32 step count: standard promotion for
      # its part only, so the rest stays clean under jax's strict mode.
      with jax.numpy_dtype_promotion("standard"):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
      return (params, opt_state), loss

    # The rollouts' records against a fresh forward of the same (pre-update) params.
    fresh = token_logprobs(policy, policy.params, seq)
    logprob_err = jnp.max(jnp.abs(fresh - old_lp) * maskf)
    (params, opt_state), losses = jax.lax.scan(update, (policy.params, opt_state), None,
                                               length=s.inner_steps)
    stats = results.stats  # [N] rows: each rollout's own rounds, counted from its insertion
    # Drafts accepted among those judged, from the per-round histogram: `stats.accepted`
    # counts committed drafts only, and a rollout's last round is cut at its length.
    judged = jnp.maximum(jnp.sum(stats.position_judged), 1).astype(jnp.float32)
    accepted = jnp.sum(stats.position_accepted).astype(jnp.float32)
    metrics = {
        "reward": jnp.mean(reward),
        "logprob": jnp.sum(old_lp * maskf) / jnp.sum(maskf),
        "logprob_err": logprob_err,
        "loss": losses[0],
        "alpha": accepted / judged,
        "tau": jnp.sum(results.lengths).astype(jnp.float32)
               / jnp.sum(stats.target_calls).astype(jnp.float32),
    }
    return dataclasses.replace(policy, params=params), opt_state, metrics

  return train_step


def make_prompts(s: Settings, step: int):
  """Right-padded random prompts of 3..prompt_len tokens and each rollout's answer
  length, fresh each step: prompts [N, P], prompt lengths [N], max_new [N]. The
  lengths are long-tailed: lognormal with median 6, at least 2, at most max_new_tokens."""
  rng = np.random.default_rng((s.seed, step))
  N = s.rollouts
  lengths = rng.integers(3, s.prompt_len + 1, size=N)
  prompts = rng.integers(0, s.vocab_size, size=(N, s.prompt_len))
  prompts = np.where(np.arange(s.prompt_len)[None, :] < lengths[:, None], prompts, 0)
  drawn = np.round(rng.lognormal(mean=np.log(6.0), sigma=0.8, size=N))
  max_new = np.clip(drawn, 2, s.max_new_tokens)
  return (jnp.asarray(prompts, jnp.int32), jnp.asarray(lengths, jnp.int32),
          jnp.asarray(max_new, jnp.int32))


def run(s: Settings = Settings(), *, log: Callable[[str], None] | None = print) -> list[dict]:
  """`steps` rollout + update steps. One dict per step: the metrics (floats), `traces`
  (compilations so far in this run) and `policy` (the updated `jspec.Model`)."""
  policy = jspec.models.init(policy_config(s), seed=s.seed)
  drafter = jspec.DraftModel(policy)  # frozen: arrays are immutable, updates make new ones
  optimizer = optax.adam(s.learning_rate)
  opt_state = optimizer.init(policy.params)
  train_step = make_train_step(s, optimizer)
  first_trace, history, t0 = TRACES, [], time.perf_counter()
  for step in range(s.steps):
    prompts, lengths, max_new = make_prompts(s, step)
    seeds = jnp.arange(step * s.rollouts, (step + 1) * s.rollouts, dtype=jnp.int32)
    if s.refresh_drafter and step and step % s.refresh_drafter == 0:
      # New drafter weights of the same shapes: arguments of the step, so no recompile.
      drafter = jspec.DraftModel(policy)
    policy, opt_state, metrics = train_step(policy, drafter, opt_state, prompts, lengths,
                                            max_new, seeds)
    entry = {"step": step, **{k: float(v) for k, v in metrics.items()},
             "mean_len": float(jnp.mean(max_new)), "longest": int(jnp.max(max_new)),
             "traces": TRACES - first_trace,
             "policy": policy}
    history.append(entry)
    if log is not None:
      check = f"  |logp - fresh| {entry['logprob_err']:.1e}" if step == 0 else ""
      log(f"step {step:3d}  reward {entry['reward']:.3f}  logp {entry['logprob']:.3f}  "
          f"alpha {entry['alpha']:.3f}  tau {entry['tau']:.2f}  "
          f"lengths {entry['mean_len']:.1f} mean, {entry['longest']} max  traces {entry['traces']}"
          f"{check}  ({time.perf_counter() - t0:.1f}s)")
  return history


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  defaults = Settings()
  for field in dataclasses.fields(Settings):  # one flag per setting, typed by its default
    default = getattr(defaults, field.name)
    parser.add_argument("--" + field.name.replace("_", "-"), type=type(default), default=default)
  history = run(Settings(**vars(parser.parse_args(argv))))
  first, last = history[0], history[-1]
  print(f"compiled {last['traces']} time(s) for {len(history)} steps; reward "
        f"{first['reward']:.3f} -> {last['reward']:.3f}, alpha {first['alpha']:.3f} -> "
        f"{last['alpha']:.3f}; rollout logprobs vs fresh forward: {first['logprob_err']:.1e}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
