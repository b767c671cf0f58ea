"""Training an EAGLE head (`jspec.drafters.eagle`) for a frozen target, with optax.

    python -m jspec.training.train_eagle --out checkpoints/code-eagle   # the shipped head

Each step draws windows t_0..t_{T-1} of the tokenised train split (a seeded
function of (seed, step), so a run resumed from its orbax checkpoint sees the
batches an uninterrupted run would), runs the frozen target once (no gradient)
for its features h and logits, and trains the head on the pairs
(h_{j-1}, e(t_j)) under causal attention over the window:

    loss = smooth_L1(f^_j, h_j) + 0.1 * CE(softmax(target logits_j), LM_head(f^_j))

(EAGLE's objective; uniform noise on the input features, as in the paper,
makes the head robust to its own predicted features when it drafts several
steps). Optimizer: clip by global norm, AdamW under linear warmup + cosine.

The held-out report: feature loss and top-1 agreement with the target's
argmax on the shipped held-out windows, and greedy acceptance at K = 4 on the
shipped held-out prompts, measured by replaying the target's own greedy
continuation through the head's `propose` round by round (the exact rounds
greedy speculative decoding runs), and with `jspec.speculative_generate` when
the decode loop passes target features to drafters.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shlex
import shutil
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jspec.drafters import eagle as E
from jspec.core.drafter import DraftContext, target_for
from jspec.training import trainer

# The held-out measurement of the shipped code pair and its heads (`jspec.recipes.code_pair`).
EVAL_WINDOWS = 64  # held-out windows of SEQ_LEN + 1 tokens for held-out loss
ACCEPT_PROMPTS = 32  # held-out prompts for the acceptance measurement
ACCEPT_PROMPT_LEN = 64
ACCEPT_K = 4
ACCEPT_NEW_TOKENS = 128
# The tree the manifest measures besides chains: 12 nodes, depth 4, as rank paths.
TREE_PATHS = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0),
              (0, 0, 0, 0), (0, 0, 0, 1))


@dataclasses.dataclass(frozen=True)
class EagleTrainConfig:
  """Optimisation settings of one run (all static)."""

  steps: int = 700
  batch_size: int = 4  # B windows per step
  seq_len: int = 256  # T tokens per window (T pairs, T feature targets)
  learning_rate: float = 5e-3
  warmup_steps: int = 40
  end_learning_rate: float = 2.5e-4
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  b2: float = 0.95
  feature_noise: float = 0.1  # input features get uniform(-a, a) noise; 0 disables
  cls_weight: float = 0.1  # weight of the cross-entropy term
  # EAGLE-3 heads: drafting steps unrolled on the head's own outputs ("training-time
  # test"); the loss averages their cross-entropies. EAGLE-1 heads train on step 1 only.
  ttt_steps: int = 3
  checkpoint_every: int = 100
  seed: int = 0

  def __post_init__(self):
    if self.steps < 1 or self.batch_size < 1 or self.seq_len < 2:
      raise ValueError(f"steps, batch_size must be >= 1 and seq_len >= 2: {self}")
    if not 0 <= self.warmup_steps < self.steps:
      raise ValueError(f"warmup_steps must lie in [0, steps), got {self.warmup_steps}")
    if self.ttt_steps < 1 or self.ttt_steps > self.seq_len:
      raise ValueError(f"ttt_steps must lie in [1, seq_len], got {self.ttt_steps}")
    if self.feature_noise < 0 or self.cls_weight < 0:
      raise ValueError(f"feature_noise and cls_weight must be >= 0: {self}")


def features_for_training(eagle: E.Eagle, params, hidden: jax.Array, tokens: jax.Array,
                          noise: jax.Array | None = None) -> jax.Array:
  """Cache-free teacher-forced head pass over a window: f^ [B, T, D].

  hidden [B, T, D] the target's features h_0..h_{T-1} for tokens [B, T]; the
  pair at position j is (h_{j-1}, e(t_j)) (zeros at j = 0), causal attention
  inside the window, positions 0..T-1 (the target's own for the window).
  noise [B, T, D] (optional) is added to the input features.
  """
  B, T, D = hidden.shape
  prev = jnp.concatenate([jnp.zeros((B, 1, D), hidden.dtype), hidden[:, :-1]], axis=1)
  if noise is not None:
    prev = prev + noise.astype(prev.dtype)
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None, :], (B, T))
  visible = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool))[None], (B, T, T))
  out, _ = eagle.forward(params, prev, tokens, None, positions, positions, visible)
  return out


def ttt_mask(T: int, step: int, steps: int) -> jax.Array:
  """visible [T, steps * T] of drafting step `step` (0-based) in a training-time test.

  The head's cache holds each step's pairs at slots r * T + p (step r, position p).
  Drafting step s at position j stands for the s-th draft after a catch-up that ended
  at position j - s: it sees the true pairs up to j - s and the pairs its own earlier
  steps fed at j - s + 1 .. j (step r at j - s + r), as `Eagle.propose` does.
  """
  j = np.arange(T)[:, None]
  r, p = np.divmod(np.arange(steps * T)[None, :], T)
  true = (r == 0) & (p <= j - step)
  own = (r >= 1) & (r <= step) & (p == j - step + r)
  return jnp.asarray(true | own)


def ttt_features(eagle: E.Eagle, params, features: jax.Array, tokens: jax.Array,
                 steps: int, noise: jax.Array | None = None) -> list[jax.Array]:
  """Training-time test (EAGLE-3): the head run `steps` drafting steps over a window.

  features [B, T, n * D] the target's features for tokens [B, T]. Step 0 is the
  teacher-forced pass (pairs (fuse(h_{j-1}), e(t_j))); step s feeds the head's own
  step s-1 output at j-1 in place of the target's feature, under `ttt_mask`, so the
  head learns from the inputs it meets when it drafts several tokens. Returns each
  step's outputs [B, T, D]; entries at j < s stand for no real round (mask them).
  """
  B, T, _ = features.shape
  D = eagle.config.hidden_size
  dtype = E.head_dtype(params)
  fused = eagle.fuse(params, features)
  if noise is not None:
    fused = fused + noise.astype(fused.dtype)
  zeros = jnp.zeros((B, 1, D), fused.dtype)
  prev = jnp.concatenate([zeros, fused[:, :-1]], axis=1)
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None, :], (B, T))
  cache = eagle.init_cache(B, steps * T, dtype)
  outs = []
  for s in range(steps):
    visible = jnp.broadcast_to(ttt_mask(T, s, steps)[None], (B, T, steps * T))
    out, cache = eagle.forward(params, prev, tokens, cache, s * T + positions, positions,
                               visible)
    outs.append(out)
    prev = jnp.concatenate([zeros.astype(out.dtype), out[:, :-1]], axis=1)
  return outs


def make_optimizer(cfg: EagleTrainConfig) -> optax.GradientTransformation:
  """`trainer.make_optimizer`: decay on matrices only, warmup + cosine."""
  return trainer.make_optimizer(cfg)


# ----------------------------------------------------------------------------- objective


def target_features(target, tokens):
  """The frozen target on windows tokens [B, T]: features h [B, T, D] (or the fused
  layers' [B, T, n * D]: pass `target_for(target, eagle)`) and f32 logits [B, T, V]."""
  start = jnp.zeros((tokens.shape[0],), jnp.int32)
  logits, hidden, _ = target.apply(tokens, None, start)
  return jax.lax.stop_gradient(hidden), jax.lax.stop_gradient(logits)


def eagle3_loss(params, eagle: E.Eagle, tokens, features, target_logits, noise=None,
                steps: int = 3):
  """EAGLE-3's objective: the mean over `steps` training-time-test steps of the
  cross-entropy against the target's distributions (no feature regression: the head's
  features are free, only its tokens matter). A reduced-vocabulary head (`ids`) is
  scored over its ids against the target's probability of each. Metrics: ce and top1
  of the first step, top1 of the last."""
  outs = ttt_features(eagle, params, features, tokens, steps, noise)
  p = jax.nn.softmax(target_logits.astype(jnp.float32), axis=-1)  # [B, T, V]
  best = jnp.argmax(target_logits, -1)
  if eagle.ids is not None:
    p = jnp.take(p, eagle.ids, axis=-1)  # [B, T, N]: mass outside the ids is unreachable
  T = tokens.shape[1]
  ces, top1s = [], []
  for s, out in enumerate(outs):
    scores = eagle.draft_scores(out, params)  # [B, T, V or N]
    valid = (jnp.arange(T) >= s).astype(jnp.float32)[None, :]  # [1, T]
    ce = -jnp.sum(p * jax.nn.log_softmax(scores, axis=-1), axis=-1)  # [B, T]
    hit = (eagle._token(jnp.argmax(scores, -1)) == best).astype(jnp.float32)
    norm = jnp.sum(valid) * tokens.shape[0]
    ces.append(jnp.sum(ce * valid) / norm)
    top1s.append(jnp.sum(hit * valid) / norm)
  loss = sum(ces) / steps
  return loss, {"ce": ces[0], "top1": top1s[0], "top1_last": top1s[-1]}


def eagle_loss(params, eagle: E.Eagle, tokens, hidden, target_logits, noise=None,
               cls_weight: float = 0.1, ttt_steps: int = 3):
  """EAGLE's objective on one batch; returns (loss, metrics).

  tokens [B, T], hidden [B, T, D] (EAGLE-3: the fused layers' [B, T, n * D]) and
  target_logits [B, T, V] from the frozen target; noise [B, T, D] or None on the
  input features. EAGLE-1 metrics: feature loss (mean smooth-L1 per element),
  cross-entropy against the target's distributions, and top-1 agreement of the
  head's argmax with the target's. EAGLE-3 heads: `eagle3_loss`.
  """
  if eagle.config.fused:
    return eagle3_loss(params, eagle, tokens, hidden, target_logits, noise, ttt_steps)
  f = features_for_training(eagle, params, hidden, tokens, noise)  # [B, T, D]
  reg = jnp.mean(optax.huber_loss(f, hidden.astype(f.dtype), delta=1.0))  # smooth-L1, beta 1
  logits = eagle.logits(f)  # [B, T, V] f32
  p = jax.nn.softmax(target_logits.astype(jnp.float32), axis=-1)
  ce = jnp.mean(-jnp.sum(p * jax.nn.log_softmax(logits, axis=-1), axis=-1))
  top1 = jnp.mean((jnp.argmax(logits, -1) == jnp.argmax(target_logits, -1)).astype(jnp.float32))
  loss = reg + jnp.asarray(cls_weight, jnp.float32) * ce
  return loss, {"feature_loss": reg, "ce": ce, "top1": top1}


@functools.lru_cache(maxsize=8)
def make_step(cfg: EagleTrainConfig):
  """The optimizer and jitted training step of `cfg` (cached: runs with one config share
  the compiled step). step: (params, opt_state, eagle, target, tokens, key) ->
  (params, opt_state, loss, metrics); `eagle` supplies the frozen embedding, LM head
  and config (its own params are ignored); `target` runs without gradient."""
  optimizer = make_optimizer(cfg)

  @jax.jit
  def step(params, opt_state, eagle, target, tokens, key):
    hidden, logits = target_features(target_for(target, eagle), tokens)
    noise = None
    if cfg.feature_noise > 0:
      shape = hidden.shape[:2] + (eagle.config.hidden_size,)  # on the head's input features
      noise = jax.random.uniform(key, shape, hidden.dtype, -cfg.feature_noise,
                                 cfg.feature_noise)
    (loss, metrics), grads = jax.value_and_grad(eagle_loss, has_aux=True)(
        params, eagle, tokens, hidden, logits, noise, cfg.cls_weight, cfg.ttt_steps)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, metrics

  return optimizer, step


# ----------------------------------------------------------------------------- evaluation


@jax.jit
def _eval_batch(eagle, target, tokens):
  hidden, logits = target_features(target_for(target, eagle), tokens)
  _, metrics = eagle_loss(eagle.params, eagle, tokens, hidden, logits)
  return metrics


def evaluate(eagle: E.Eagle, target, windows: np.ndarray, chunk: int = 16) -> dict:
  """Teacher-forced held-out metrics over windows [N, T] (means over positions):
  feature_loss (smooth-L1), ce (against the target's distributions), top1
  (agreement of the head's argmax with the target's)."""
  sums, count = {}, 0
  for i in range(0, windows.shape[0], chunk):
    rows = windows[i:i + chunk]
    m = _eval_batch(eagle, target, jnp.asarray(rows, jnp.int32))
    for k, v in m.items():
      sums[k] = sums.get(k, 0.0) + float(v) * rows.shape[0]
    count += rows.shape[0]
  return {k: round(v / count, 4) for k, v in sums.items()}


def _replay_init(eagle, tokens, lengths, features, cache_length):
  return eagle.init(tokens, lengths, cache_length, features)


_replay_init_jit = jax.jit(_replay_init, static_argnums=4)


def _replay_round(eagle, state, context, k):
  drafts, _, state = eagle.propose(state, context, k, None, None)
  return drafts, state


_replay_round_jit = jax.jit(_replay_round, static_argnums=3)


def replay_greedy(target, eagle: E.Eagle, prompts: np.ndarray, k: int = ACCEPT_K,
                  new_tokens: int = ACCEPT_NEW_TOKENS) -> dict:
  """Greedy acceptance of `eagle` at K = k, by replaying greedy speculative decoding.

  Greedy speculative output is the target's greedy continuation whatever the
  drafts, so every round is determined: the head proposes from the committed
  prefix, n = the drafts' matching run, L += n + 1. The target's features come
  from one forward pass over prompt + continuation (what the verify calls
  compute, up to float rounding). Returns tau (tokens per target call), alpha,
  draft_accept and the histogram, as `jspec.core.stats.acceptance_rates`.
  """
  import jspec
  from jspec.core.stats import acceptance_rates

  prompts = np.asarray(prompts, np.int32)
  N, P = prompts.shape
  ref = jspec.generate(target, prompts.tolist(), max_new_tokens=new_tokens, eos_id=())
  seq = np.concatenate([prompts, np.asarray(ref.tokens)], axis=1)  # [N, P + new]
  total = seq.shape[1]
  hidden = np.concatenate([np.asarray(target_features(target_for(target, eagle), jnp.asarray(seq[i:i + 16]))[0])
                           for i in range(0, N, 16)])  # [N, total, D]
  S = total + k + 2
  F = k + 1
  buffer = np.zeros((N, S), np.int32)
  buffer[:, :total] = seq
  D = hidden.shape[2]
  padded = np.zeros((N, S + F, D), hidden.dtype)
  padded[:, F:F + total] = hidden  # padded[:, F + j] = h_j; negative slots read zeros
  state = _replay_init_jit(eagle, jnp.asarray(prompts), jnp.full((N,), P, jnp.int32),
                           jnp.asarray(hidden[:, :P - 1]), S)
  L = np.full((N,), P, np.int64)
  fs = L - 1 - F
  hist = np.zeros((k + 1,), np.int64)
  calls = np.zeros((N,), np.int64)
  emitted = np.zeros((N,), np.int64)
  while np.any(L < total):
    active = L < total
    rows = np.arange(N)[:, None]
    entries = padded[rows, F + fs[:, None] + np.arange(F)[None, :]]  # h_{fs+j}
    ok = (fs[:, None] + np.arange(F)[None, :]) <= (L[:, None] - 2)
    entries = np.where(ok[:, :, None], entries, 0.0).astype(hidden.dtype)
    ctx = DraftContext(tokens=jnp.asarray(buffer), lengths=jnp.asarray(np.minimum(L, total), jnp.int32),
                   features=jnp.asarray(entries), feature_start=jnp.asarray(fs, jnp.int32))
    drafts, state = _replay_round_jit(eagle, state, ctx, k)
    drafts = np.asarray(drafts)
    truth = buffer[rows, np.minimum(L[:, None] + np.arange(k)[None, :], S - 1)]
    match = np.cumprod(drafts == truth, axis=1).sum(axis=1)
    count = np.minimum(match + 1, total - L)
    for b in np.flatnonzero(active):
      hist[match[b]] += 1
      calls[b] += 1
      emitted[b] += count[b]
    fs = np.where(active, L - 1, fs)
    L = np.where(active, L + count, L)
  rates = acceptance_rates(hist, int(emitted.sum()), int(calls.sum()))
  return {"k": k, **{name: round(value, 4) for name, value in rates.items()},
          "accept_hist": hist.tolist(), "prompts": int(N), "prompt_tokens": int(P),
          "new_tokens": new_tokens, "method": "replay of greedy rounds through Eagle.propose"}


def engine_acceptance(target, eagle: E.Eagle, prompts: np.ndarray, k: int = ACCEPT_K,
                      tree=None, new_tokens: int = ACCEPT_NEW_TOKENS) -> dict:
  """Greedy acceptance through `jspec.speculative_generate` (a chain of K = k, or `tree`),
  and whether the output equals the target's own greedy output."""
  import jspec
  from jspec.core.stats import acceptance_rates

  kwargs = {"tree": tree} if tree is not None else {"num_draft_tokens": k}
  out = jspec.speculative_generate(target, eagle, np.asarray(prompts).tolist(),
                                   max_new_tokens=new_tokens, eos_id=(), **kwargs)
  hist = np.asarray(out.stats.accept_hist)
  rates = acceptance_rates(hist, int(np.sum(np.asarray(out.lengths))),
                                 int(np.sum(np.asarray(out.stats.target_calls))))
  ref = jspec.generate(target, np.asarray(prompts).tolist(), max_new_tokens=new_tokens, eos_id=())
  result = {"k": int(hist.shape[0] - 1), **{n: round(v, 4) for n, v in rates.items()},
            "accept_hist": hist.tolist(), "prompts": int(len(prompts)),
            "new_tokens": new_tokens,
            "greedy_equal": bool(np.array_equal(np.asarray(out.tokens), np.asarray(ref.tokens)))}
  if tree is not None:
    result["tree"] = {"nodes": tree.num_nodes, "depth": tree.max_depth,
                      "parents": list(tree.parents), "ranks": list(tree.ranks)}
  return result


# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class EagleTrainResult:
  """What `train_eagle` returns: the trained head and a record of the run."""

  eagle: E.Eagle
  steps: int
  tokens_seen: int
  history: list  # [{"step", "loss", "feature_loss", "ce", "top1", "heldout"?}]
  seconds: float  # wall time of this call (excluding data preparation)
  heldout: dict | None


def train_eagle(target, cfg: EagleTrainConfig, batch_fn: Callable[[int], np.ndarray], *,
                config: E.EagleConfig | None = None, init_params: dict | None = None,
                heldout: np.ndarray | None = None, eval_every: int = 0,
                checkpoint_dir: str | None = None, progress: bool = True,
                desc: str = "eagle") -> EagleTrainResult:
  """Train an EAGLE head for the frozen `target` for `cfg.steps` steps.

  batch_fn(step) -> tokens [B, T] int (a pure function of the step, for exact
  resumption). config: the head's `EagleConfig` (default: one target layer).
  heldout: windows [N, T] for `evaluate` every `eval_every` steps (0: at the end
  only). With `checkpoint_dir`, params and optimizer state are saved every
  `cfg.checkpoint_every` steps and a rerun resumes from the latest.
  """
  config = E.EagleConfig.for_target(target.config) if config is None else config
  params = E.init_params(config, jax.random.key(cfg.seed)) if init_params is None else init_params
  frame = E.Eagle.from_target(target, params, config)
  optimizer, step = make_step(cfg)
  with jax.numpy_dtype_promotion("standard"):
    opt_state = optimizer.init(params)
  frame = dataclasses.replace(frame, params=None)  # the step takes params separately

  def step_fn(state, i):
    tokens = jnp.asarray(batch_fn(i), jnp.int32)
    key = jax.random.fold_in(jax.random.key(cfg.seed), i)
    params, opt_state, loss, metrics = step(state["params"], state["opt_state"], frame, target,
                                            tokens, key)
    return {"params": params, "opt_state": opt_state}, loss, metrics

  def evaluate_state(state):
    return {"heldout": evaluate(E.Eagle.from_target(target, state["params"], config), target,
                                heldout)}

  run = trainer.fit({"params": params, "opt_state": opt_state}, step_fn, steps=cfg.steps,
                    tokens_per_step=cfg.batch_size * cfg.seq_len, desc=desc, progress=progress,
                    checkpoint_dir=checkpoint_dir, checkpoint_every=cfg.checkpoint_every,
                    run_config={"train_config": dataclasses.asdict(cfg),
                                "eagle_config": config.to_dict()},
                    evaluate=None if heldout is None else evaluate_state, eval_every=eval_every)
  return EagleTrainResult(eagle=E.Eagle.from_target(target, run.state["params"], config),
                          steps=cfg.steps, tokens_seen=cfg.steps * cfg.batch_size * cfg.seq_len,
                          history=run.history, seconds=run.seconds,
                          heldout=(run.evaluation or {}).get("heldout"))


# ----------------------------------------------------------------------------- shipped run


def train_stream(work: str, tokenizer) -> tuple[np.ndarray, dict]:
  """The tokenised train split of `jspec.training.corpus` (cached in `work`) and its description."""
  from jspec.training import corpus

  path = os.path.join(work, "train_stream.npy")
  info_path = os.path.join(work, "corpus.json")
  if os.path.isfile(path) and os.path.isfile(info_path):
    with open(info_path) as f:
      return np.load(path), json.load(f)
  c = corpus.load_corpus()
  eot = tokenizer.backend.token_to_id(corpus.EOT)
  if eot is None:
    raise ValueError(f"the tokenizer has no {corpus.EOT} token")
  stream = corpus.token_stream(tokenizer.backend, c.train, eot)
  info = c.describe()
  info.update(train_tokens=int(stream.shape[0]))
  os.makedirs(work, exist_ok=True)
  np.save(path, stream)
  with open(info_path, "w") as f:
    json.dump(info, f, indent=2)
  return stream, info


def main(argv=None) -> int:
  """Command line of `python -m jspec.training.train_eagle`."""
  from jspec.io import checkpoint
  from jspec.io import shipped
  from jspec.training import corpus

  parser = argparse.ArgumentParser(prog="python -m jspec.training.train_eagle",
                                   description=__doc__.splitlines()[0])
  defaults = EagleTrainConfig()
  parser.add_argument("--out", required=True, help="directory for the trained head (replaced)")
  parser.add_argument("--target", default=None,
                      help="target checkpoint directory (default: the shipped code-target)")
  parser.add_argument("--work", default=os.path.join(".recipe", "eagle"),
                      help="tokenised stream cache and training state (resumable)")
  parser.add_argument("--steps", type=int, default=defaults.steps)
  parser.add_argument("--batch-size", "--batch", type=int, default=defaults.batch_size)
  parser.add_argument("--seq-len", type=int, default=defaults.seq_len)
  parser.add_argument("--lr", type=float, default=defaults.learning_rate)
  parser.add_argument("--warmup", type=int, default=defaults.warmup_steps)
  parser.add_argument("--noise", type=float, default=defaults.feature_noise)
  parser.add_argument("--seed", type=int, default=defaults.seed)
  parser.add_argument("--eval-every", type=int, default=0)
  parser.add_argument("--store-dtype", "--stored-dtype", dest="store_dtype", default="bfloat16",
                      help="dtype of the saved params")
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args(argv)
  command = "python -m jspec.training.train_eagle " + " ".join(
      shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))

  t_start = time.perf_counter()
  if args.target is None:
    target_dir = os.path.join(shipped.checkpoints_dir(), shipped.TARGET)
    held = shipped.heldout()
  else:
    target_dir, held = args.target, None
  target = checkpoint.load(target_dir, dtype="float32")
  if target.tokenizer is None:
    raise ValueError(f"{target_dir} has no tokenizer; the corpus needs one")
  cfg = EagleTrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                         learning_rate=args.lr, warmup_steps=args.warmup,
                         end_learning_rate=args.lr / 20, feature_noise=args.noise,
                         seed=args.seed)
  t_data = time.perf_counter()
  stream, corpus_info = train_stream(args.work, target.tokenizer)
  data_seconds = time.perf_counter() - t_data
  if held is not None:
    heldout_windows = held["windows"][:, :cfg.seq_len]
    prompts = held["accept_prompts"]
  else:  # a target of one's own: held-out windows and prompts from the corpus's held-out split
    c = corpus.load_corpus()
    eot = target.tokenizer.backend.token_to_id(corpus.EOT)
    hs = corpus.token_stream(target.tokenizer.backend, c.heldout, eot)
    heldout_windows = corpus.tiled_windows(hs, cfg.seq_len, EVAL_WINDOWS)
    prompts = corpus.tiled_windows(hs, ACCEPT_PROMPT_LEN, ACCEPT_PROMPTS)

  batch_fn = lambda step: corpus.windows(stream, cfg.seq_len, cfg.batch_size, (cfg.seed, step))
  result = train_eagle(target, cfg, batch_fn,
                       heldout=heldout_windows if args.eval_every else None,
                       eval_every=args.eval_every,
                       checkpoint_dir=os.path.join(args.work, "train"),
                       progress=not args.no_progress)
  train_seconds = result.seconds

  # Save as shipped (stored dtype), then evaluate what was saved, loaded in f32.
  out = os.path.abspath(args.out)
  shutil.rmtree(out, ignore_errors=True)
  meta = {"target": os.path.basename(os.path.normpath(target_dir)), "objective": "eagle"}
  E.save_eagle(result.eagle, out, meta, dtype=args.store_dtype)
  eagle = E.load_eagle(out, target, dtype="float32")
  t_eval = time.perf_counter()
  held_metrics = evaluate(eagle, target, heldout_windows)
  replay = replay_greedy(target, eagle, prompts)
  from jspec.core.tree import Tree

  engine = {name: engine_acceptance(target, eagle, prompts, tree=tree)
            for name, tree in (("chain", None), ("tree", Tree.from_paths(TREE_PATHS)))}
  eval_seconds = time.perf_counter() - t_eval
  manifest = {
      "name": os.path.basename(out),
      "role": "EAGLE head (one decoder layer drafting in the target's feature space)",
      "target": meta["target"],
      "config": eagle.config.to_dict(),
      "parameters": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(eagle.params))),
      "stored_dtype": str(jnp.dtype(args.store_dtype)),
      "compute_dtype": "float32",
      "command": command,
      "steps": result.steps,
      "tokens_seen": result.tokens_seen,
      "wall_seconds": {"data": round(data_seconds, 1), "train": round(train_seconds, 1),
                       "eval": round(eval_seconds, 1),
                       "total": round(time.perf_counter() - t_start, 1)},
      "train_config": dataclasses.asdict(cfg),
      "objective": "smooth-L1(f^_j, h_j) + 0.1 * CE(target softmax_j, LM_head(f^_j)); "
                   "pairs (h_{j-1} + U(-a, a) noise, e(t_j)), causal over the window",
      "heldout": {**held_metrics, "windows": int(heldout_windows.shape[0]),
                  "tokens_per_window": int(heldout_windows.shape[1]),
                  "feature_loss_metric": "mean smooth-L1 (beta 1) per feature element",
                  "top1_metric": "argmax LM_head(f^_j) == argmax target logits_j, teacher forced"},
      "acceptance_vs_target": replay,
      "engine_acceptance": engine,
      "history": result.history,
      "corpus": corpus_info,
  }
  if args.target is None:  # the shipped draft model, measured the same way, for comparison
    draft = shipped.manifest(shipped.DRAFT).get("acceptance_vs_code_target")
    if draft:
      manifest["compare"] = {"code-draft (distilled draft model)": draft}
  with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=2)
  print(json.dumps({k: manifest[k] for k in ("steps", "tokens_seen", "wall_seconds", "heldout",
                                             "acceptance_vs_target", "engine_acceptance")},
                   indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
