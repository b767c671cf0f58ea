"""RL rollouts with exact speculative decoding, one compiled step across weight updates.

A small policy is trained with a PPO-style clipped objective on a toy reward (the
fraction of its sampled tokens whose ids lie below V/4). Each step is ONE jitted
`train_step`: speculative sampling of a batch of rollouts (`decode.init_state` +
`decode.decode_loop`, K drafts, temperature 1) that records the log-probability of
every sampled token, then a few adam steps on the clipped ratio
exp(logp_new - logp_rollout) through `policy.logits` on prompt + sample. The
recorded log-probabilities are the behaviour policy's: no second forward pass is
needed to get them, and the first step checks they equal a fresh forward's.

The drafter is a `jspec.DraftModel` of a frozen copy of the initial policy, the
classic setup in which the drafter goes stale while the policy drifts. Params (of
both) are arguments of the step, never closed over, so new weights reuse the
compiled program.

    python examples/rl_rollouts.py --steps 12

What it shows: the step compiles once; the reward rises from about 0.25 (a random
policy's share of the low ids) as the policy learns; acceptance alpha starts near
1 (the drafter is the policy) and falls as the policy drifts away from its stale
drafter, and tokens per target call tau falls with it (from 4, the most 16 tokens
in rounds of K + 1 = 5 allow, towards 1). With `--refresh-drafter N` the drafter
takes the policy's weights every N steps, as RL systems refresh their draft
weights, and acceptance climbs back after each refresh, still with one compile.
Sampling stays exact whatever the drafter proposes: only the speed depends on it.
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
from jspec.core import logprobs as logprobs_lib
from jspec.models import TransformerConfig

TRACES = 0  # times train_step's Python body ran: one per compilation


@dataclasses.dataclass(frozen=True)
class Settings:
  """Sizes of one run; the defaults finish in well under a minute on a 2-core CPU."""

  steps: int = 12  # rollout + update steps
  batch_size: int = 16
  prompt_len: int = 6  # prompts have 3..prompt_len tokens
  max_new_tokens: int = 16
  num_draft_tokens: int = 4
  inner_steps: int = 4  # adam steps on each batch of rollouts
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


def rollout(policy, drafter, prompts, prompt_lengths, seeds, temperature, s: Settings):
  """Speculative sampling of max_new_tokens per row; the final `DecodeState`
  (tokens and log-probabilities slot by slot, `stats`). temperature: a scalar,
  traced, so greedy (0) and sampled (1) share one program."""
  config = decode_config(s)
  B = prompts.shape[0]
  params = jspec.SamplingParams(temperature=jnp.full((B,), temperature, jnp.float32),
                                top_k=jnp.zeros((B,), jnp.int32),
                                top_p=jnp.ones((B,), jnp.float32))
  state = decode.init_state(policy, drafter, prompts, prompt_lengths,
                            jnp.full((B,), s.max_new_tokens, jnp.int32), params,
                            eos_ids=jnp.full((1,), -1, jnp.int32),  # no stop id: fixed length
                            seeds=seeds, config=config)
  return decode.decode_loop(policy, drafter, state, config)


def sample(policy, drafter, prompts, prompt_lengths, seeds, temperature, s: Settings):
  """`rollout`'s new tokens [B, S] and their log-probabilities [B, S], left-aligned."""
  state = rollout(policy, drafter, prompts, prompt_lengths, seeds, temperature, s)
  tokens, lengths = decode.output_tokens(state)
  lp = logprobs_lib.output(state.logprobs, state.prompt_lengths, state.lengths)
  return tokens, lp.chosen, lengths


def token_logprobs(policy: jspec.Model, params, tokens):
  """log p(tokens[:, t] | tokens[:, :t]) for t = 1..S-1: [B, S-1], one cache-free forward.
  tokens is the state's slot buffer (prompt then sample; causal, so the scratch past
  each row's end changes nothing before it)."""
  logits = dataclasses.replace(policy, params=params).logits(tokens)[:, :-1]  # [B, S-1, V]
  lp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.take_along_axis(lp, tokens[:, 1:, None], axis=-1)[:, :, 0]


def make_train_step(s: Settings, optimizer: optax.GradientTransformation):
  """The jitted step: (policy, drafter, opt_state, prompts, prompt_lengths, seeds) ->
  (policy, opt_state, metrics). Settings and optimizer are static; weights traced."""

  @jax.jit
  def train_step(policy, drafter, opt_state, prompts, prompt_lengths, seeds):
    global TRACES
    TRACES += 1
    state = rollout(policy, drafter, prompts, prompt_lengths, seeds, 1.0, s)
    tokens, S = state.tokens, state.tokens.shape[1]
    # The log-prob buffer is slot-aligned with `tokens`, so slot t's record is
    # the behaviour log-prob of tokens[:, t]: drop slot 0 to align with the forward.
    old_lp = state.logprobs.chosen[:, 1:]  # [B, S-1]
    slot = jnp.arange(1, S, dtype=jnp.int32)[None, :]
    mask = (slot >= state.prompt_lengths[:, None]) & (slot < state.lengths[:, None])
    maskf = mask.astype(jnp.float32)
    count = jnp.sum(maskf, axis=1)  # [B] tokens generated per row
    hits = (tokens[:, 1:] < s.vocab_size // 4).astype(jnp.float32)
    reward = jnp.sum(hits * maskf, axis=1) / count  # [B]
    advantage = (reward - jnp.mean(reward))[:, None]  # batch-mean baseline, per row

    def loss_fn(params):
      ratio = jnp.exp(token_logprobs(policy, params, tokens) - old_lp)
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

    # The rollout's records against a fresh forward of the same (pre-update) params.
    fresh = token_logprobs(policy, policy.params, tokens)
    logprob_err = jnp.max(jnp.abs(fresh - old_lp) * maskf)
    (params, opt_state), losses = jax.lax.scan(update, (policy.params, opt_state), None,
                                               length=s.inner_steps)
    stats = state.stats
    # Drafts accepted among those judged, from the per-round histogram: `stats.accepted`
    # counts committed drafts only, and the last round's are cut at max_new_tokens.
    judged = jnp.maximum(jnp.sum(stats.position_judged), 1).astype(jnp.float32)
    accepted = jnp.sum(stats.position_accepted).astype(jnp.float32)
    metrics = {
        "reward": jnp.mean(reward),
        "logprob": jnp.sum(old_lp * maskf) / jnp.sum(maskf),
        "logprob_err": logprob_err,
        "loss": losses[0],
        "alpha": accepted / judged,
        "tau": jnp.sum(count) / jnp.sum(stats.target_calls).astype(jnp.float32),
    }
    return dataclasses.replace(policy, params=params), opt_state, metrics

  return train_step


def make_prompts(s: Settings, step: int):
  """Right-padded random prompts of 3..prompt_len tokens, fresh each step."""
  rng = np.random.default_rng((s.seed, step))
  lengths = rng.integers(3, s.prompt_len + 1, size=s.batch_size)
  prompts = rng.integers(0, s.vocab_size, size=(s.batch_size, s.prompt_len))
  prompts = np.where(np.arange(s.prompt_len)[None, :] < lengths[:, None], prompts, 0)
  return jnp.asarray(prompts, jnp.int32), jnp.asarray(lengths, jnp.int32)


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
    prompts, lengths = make_prompts(s, step)
    seeds = jnp.arange(step * s.batch_size, (step + 1) * s.batch_size, dtype=jnp.int32)
    if s.refresh_drafter and step and step % s.refresh_drafter == 0:
      # New drafter weights of the same shapes: arguments of the step, so no recompile.
      drafter = jspec.DraftModel(policy)
    policy, opt_state, metrics = train_step(policy, drafter, opt_state, prompts, lengths, seeds)
    entry = {"step": step, **{k: float(v) for k, v in metrics.items()},
             "traces": TRACES - first_trace, "policy": policy}
    history.append(entry)
    if log is not None:
      check = f"  |logp - fresh| {entry['logprob_err']:.1e}" if step == 0 else ""
      log(f"step {step:3d}  reward {entry['reward']:.3f}  logp {entry['logprob']:.3f}  "
          f"alpha {entry['alpha']:.3f}  tau {entry['tau']:.2f}  traces {entry['traces']}"
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
