"""Distil a draft model while measuring its speculative acceptance inside jit.

A small target is trained briefly on a synthetic phrase stream; then an NNX
draft `jspec.models.Transformer` is distilled from it with optax on the forward
KL (`jspec.training.train.distill_loss`). Every `eval_every` steps one jitted
eval step takes the draft's NNX state as a traced argument, rebuilds the draft
as a `jspec.Model` inside the trace, runs speculative decoding of held-out
prompts with the target (`jspec.core.decode.init_state` + `decode_loop`) and returns
the acceptance rate from the loop's `DecodeStats`, all on the device. The
draft's parameters never leave it: an evaluation fetches two scalars.

    python examples/distill_while_measuring.py --steps 150 --eval-every 25

Acceptance here is alpha = accepted drafts / drafts the target judged (a round
that stopped at n < K judged n + 1, one that accepted all K judged K), the
figure `jspec measure` reports; greedy decoding by default, so it is the rate at
which the draft's argmax agrees with the target's along the target's own output.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jspec
import jspec.io.nnx
from jspec.core import decode
from jspec.models import Transformer, TransformerConfig
from jspec.training import corpus, train


@dataclasses.dataclass(frozen=True)
class Settings:
  """Sizes of one run; the defaults finish in under a minute on a 2-core CPU."""

  steps: int = 120  # distillation steps
  eval_every: int = 20
  batch_size: int = 8
  seq_len: int = 24
  learning_rate: float = 1e-2
  target_steps: int = 80  # language-model steps that give the target something to know
  vocab_size: int = 32
  num_draft_tokens: int = 4
  max_new_tokens: int = 16
  eval_prompts: int = 8
  prompt_len: int = 8
  temperature: float = 0.0  # eval decoding; 0 = greedy
  seed: int = 0


def target_config(s: Settings) -> TransformerConfig:
  return TransformerConfig(vocab_size=s.vocab_size, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=128, initializer_range=0.3)


def draft_config(s: Settings) -> TransformerConfig:
  return TransformerConfig(vocab_size=s.vocab_size, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           max_position_embeddings=128, initializer_range=0.3)


def phrase_stream(vocab_size: int, length: int, seed: int) -> np.ndarray:
  """Text with structure to learn: a dozen short random phrases, repeated in random order."""
  rng = np.random.default_rng(seed)
  phrases = [rng.integers(1, vocab_size, size=int(n)) for n in rng.integers(3, 9, size=12)]
  parts = [phrases[i] for i in rng.integers(0, len(phrases), size=length // 3)]
  return np.concatenate(parts)[:length].astype(np.int32)


def train_target(s: Settings, stream: np.ndarray) -> jspec.Model:
  """A briefly trained target (random weights would give it nothing to teach)."""
  cfg = train.TrainConfig(steps=s.target_steps, batch_size=s.batch_size, seq_len=s.seq_len,
                          learning_rate=s.learning_rate, warmup_steps=min(5, s.target_steps - 1),
                          seed=s.seed, eval_every=10**9, checkpoint_every=10**9)
  batches = lambda step: {"tokens": corpus.windows(stream, s.seq_len + 1, s.batch_size,
                                                   (s.seed, 1, step))}
  return train.train(target_config(s), cfg, batches, progress=False).module.to_model()


def acceptance_rate(stats: jspec.core.decode.DecodeStats) -> jax.Array:
  """alpha = accepted / judged drafts from the loop's histogram, as a device scalar."""
  hist = stats.accept_hist  # [K+1] rounds by accepted count n
  K = hist.shape[0] - 1
  n = jnp.arange(K + 1, dtype=jnp.int32)
  accepted = jnp.sum(hist * n)
  judged = jnp.sum(hist * jnp.minimum(n + 1, K))
  return accepted.astype(jnp.float32) / jnp.maximum(judged, 1).astype(jnp.float32)


def make_eval_step(graphdef: nnx.GraphDef, *, num_draft_tokens: int, cache_length: int,
                   temperature: float = 0.0, on_trace: Callable[[], None] | None = None):
  """One jitted function: (draft state, target, prompts, ...) -> acceptance metrics.

  `graphdef` (static) is closed over; the draft's `nnx.State` is a traced
  argument, so new weights after every optimizer step reuse the compiled
  program. `temperature` 0 builds the argmax-only program; above 0 every row
  samples with fixed seeds, so successive evaluations share their random
  numbers and differ only by the draft. `on_trace` is called each time the
  function is traced (tests count compilations with it).
  """
  config = jspec.core.decode.DecodeConfig(num_draft_tokens=num_draft_tokens, cache_length=cache_length)

  @jax.jit
  def eval_step(draft_state, target: jspec.Model, prompts, prompt_lengths, max_new_tokens):
    if on_trace is not None:
      on_trace()
    draft = jspec.io.nnx.model_from_state(graphdef, draft_state)  # traced params, no copy
    drafter = jspec.DraftModel(draft)
    B = prompts.shape[0]
    params = None  # static: every row greedy
    if temperature > 0:
      params = jspec.SamplingParams(temperature=jnp.full((B,), temperature, jnp.float32),
                                    top_k=jnp.zeros((B,), jnp.int32),
                                    top_p=jnp.ones((B,), jnp.float32))
    state = decode.init_state(target, drafter, prompts, prompt_lengths,
                              jnp.full((B,), max_new_tokens, jnp.int32), params,
                              eos_ids=jnp.full((1,), -1, jnp.int32),  # no stop id
                              seeds=jnp.arange(B, dtype=jnp.int32), config=config)
    state = decode.decode_loop(target, drafter, state, config)
    emitted = jnp.sum(state.lengths - state.prompt_lengths)
    return {"acceptance": acceptance_rate(state.stats),
            "tokens_per_call": emitted.astype(jnp.float32)
                               / jnp.sum(state.stats.target_calls).astype(jnp.float32)}

  return eval_step


def run(s: Settings = Settings(), *, log: Callable[[str], None] | None = print,
        on_trace: Callable[[], None] | None = None) -> list[dict]:
  """Train the target, distil the draft, measure acceptance every `eval_every` steps.

  Returns the history: one dict per evaluation with `step`, `acceptance` and
  `tokens_per_call` (the first entry is the untrained draft, the last the final one).
  """
  stream = phrase_stream(s.vocab_size, 20_000, s.seed)
  train_part, heldout = stream[:-2000], stream[-2000:]
  target = train_target(s, train_part)

  draft = Transformer(draft_config(s), rngs=nnx.Rngs(s.seed + 1))
  cfg = train.TrainConfig(steps=s.steps, batch_size=s.batch_size, seq_len=s.seq_len,
                          learning_rate=s.learning_rate, warmup_steps=min(5, s.steps - 1),
                          seed=s.seed)
  optimizer = nnx.Optimizer(draft, train.make_optimizer(cfg), wrt=nnx.Param)

  @nnx.jit
  def train_step(draft, optimizer, batch, teacher):
    loss, grads = nnx.value_and_grad(train.distill_loss)(draft, batch, teacher)
    optimizer.update(draft, grads)
    return loss

  # Split once for the static half; each evaluation passes the current state.
  graphdef, _ = nnx.split(draft)
  cache_length = s.prompt_len + s.max_new_tokens + s.num_draft_tokens + 1
  eval_step = make_eval_step(graphdef, num_draft_tokens=s.num_draft_tokens,
                             cache_length=cache_length, temperature=s.temperature,
                             on_trace=on_trace)
  prompts = jnp.asarray(corpus.tiled_windows(heldout, s.prompt_len, s.eval_prompts))
  prompt_lengths = jnp.full((s.eval_prompts,), s.prompt_len, jnp.int32)
  max_new = jnp.int32(s.max_new_tokens)

  history, loss, t0 = [], None, time.perf_counter()
  for step in range(s.steps + 1):
    if step % s.eval_every == 0 or step == s.steps:
      # nnx.state returns the arrays the optimizer just wrote, still on the device.
      metrics = eval_step(nnx.state(draft), target, prompts, prompt_lengths, max_new)
      entry = {"step": step, **{k: float(v) for k, v in metrics.items()}}
      history.append(entry)
      if log is not None:
        shown = "" if loss is None else f"  distill loss {float(loss):.3f}"
        log(f"step {step:4d}  acceptance {entry['acceptance']:.3f}  "
            f"tokens/target call {entry['tokens_per_call']:.2f}{shown}  "
            f"({time.perf_counter() - t0:.1f}s)")
    if step == s.steps:
      break
    batch = {"tokens": jnp.asarray(corpus.windows(train_part, s.seq_len + 1, s.batch_size,
                                                  (s.seed, 2, step)))}
    # optax mixes Python floats with int32 step counts: trace it under standard
    # promotion even when the caller runs jax in strict mode.
    with jax.numpy_dtype_promotion("standard"):
      loss = train_step(draft, optimizer, batch, target)
  return history


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  defaults = Settings()
  for field in dataclasses.fields(Settings):  # one flag per setting, typed by its default
    default = getattr(defaults, field.name)
    parser.add_argument("--" + field.name.replace("_", "-"), type=type(default), default=default)
  args = parser.parse_args(argv)
  history = run(Settings(**vars(args)))
  first, last = history[0]["acceptance"], history[-1]["acceptance"]
  print(f"acceptance {first:.3f} -> {last:.3f} over {history[-1]['step']} distillation steps")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
