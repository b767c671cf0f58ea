"""Training Medusa heads (`jspec.drafters.medusa`) for a frozen target by self-distillation.

    python -m jspec.training.train_medusa --out checkpoints/code-medusa   # the shipped heads

Each step reads B windows of T tokens from the corpus train split, runs the frozen
target once over them (no cache, no gradient) and trains head k at position j to
predict the target's own next-token distribution at position j+k:

    target:   hidden h_j [B, T, D], logits z_j [B, T, V]   (z_j predicts t_{j+1})
    head k:   p_k(. | h_j)  ~  softmax(z_{j+k})            (both about t_{j+1+k})
    loss:     mean over heads of the soft cross-entropy, positions j < T-k

This is Medusa-2's self-distillation: the labels are the target's distributions, not
the corpus tokens, so the heads learn what the target would say, which is what
acceptance measures. Only the heads train; the LM head is the target's, shared and
frozen. Optimizer: clip by global norm, then AdamW (decay on the W matrices only,
which pulls each head towards the target's own head) under linear warmup and cosine
decay. A step's batch is a pure function of (seed, step), so a run resumed from its
orbax checkpoint sees the batches an uninterrupted run would have seen.

At the end the heads are saved (bf16 by default, loaded as f32) with a manifest.json,
and evaluated as saved on held-out windows: per head, top-1 and top-k accuracy against
the target's argmax (does head k's top-1 / top-k at h_j hold argmax z_{j+k}?), the
same figures for untrained heads (W = 0: the target's next-token head reused k steps
ahead) and the held-out soft cross-entropy.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import shlex
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jspec.drafters import medusa
from jspec.training import corpus, trainer

# The shipped run: about 10 minutes on 2 CPU cores (400k target tokens). A 60-step
# pilot at batch 4 preferred a peak learning rate of 1e-2 over 1e-3, 3e-3 and 3e-2.
STEPS = 200
BATCH = 8
SEQ_LEN = 256
LEARNING_RATE = 1e-2
WARMUP = 20
NUM_HEADS = 4
EVAL_WINDOWS = 128
TOP_K = 5
STREAMS_FILE = "streams.npz"


# ----------------------------------------------------------------------------- data


def token_streams(tokenizer, work: str | None = None, root: str | None = None) -> tuple:
  """(train, heldout, info): the corpus splits as uint16 token streams, documents
  joined by the end-of-text id. With `work`, the streams are cached there, keyed by
  the corpus fingerprint and the tokenizer, and reused when both match."""
  c = corpus.load_corpus(root)
  backend = getattr(tokenizer, "backend", tokenizer)  # a jspec.Tokenizer or a tokenizers one
  eot = backend.token_to_id(corpus.EOT)
  if eot is None:
    raise ValueError(f"the tokenizer has no {corpus.EOT} token to join documents with")
  info = c.describe()
  key = hashlib.sha256((info["fingerprint"] + backend.to_str()).encode()).hexdigest()[:16]
  path = None if work is None else os.path.join(work, STREAMS_FILE)
  if path is not None and os.path.isfile(path):
    with np.load(path) as data:
      if str(data["key"]) == key:
        return data["train"], data["heldout"], dict(info, eot_id=int(eot))
  train = corpus.token_stream(backend, c.train, eot)
  heldout = corpus.token_stream(backend, c.heldout, eot)
  if path is not None:
    os.makedirs(work, exist_ok=True)
    np.savez(path, train=train, heldout=heldout, key=np.array(key))
  return train, heldout, dict(info, eot_id=int(eot))


def batch_fn(stream: np.ndarray, batch: int, seq_len: int, seed: int):
  """step -> int32 [batch, seq_len] windows at offsets seeded by (seed, step)."""
  return lambda step: corpus.windows(stream, seq_len, batch, (seed, step))


# ----------------------------------------------------------------------------- objective


def _target_pass(target, tokens):
  """The frozen target over tokens [B, T]: logits [B, T, V] f32 and hidden [B, T, D]."""
  start = jnp.zeros((tokens.shape[0],), jnp.int32)
  logits, hidden, _ = target.apply(tokens, None, start)
  return lax.stop_gradient(logits.astype(jnp.float32)), lax.stop_gradient(hidden)


def _one_head(drafter: medusa.Medusa, k: int) -> medusa.Medusa:
  """Head k (1-based) alone, as a one-head drafter."""
  heads = {name: x[k - 1:k] for name, x in drafter.heads.items()}
  return dataclasses.replace(drafter, heads=heads, num_heads=1)


def medusa_loss(heads: dict, target, tokens) -> tuple[jax.Array, jax.Array]:
  """Self-distillation loss of heads {"w": [K, D, D], "b": [K, D]} on tokens [B, T].

  Returns (mean over heads, per-head losses [K]): head k's soft cross-entropy against
  softmax(target logits at j+k), averaged over positions j < T-k.
  """
  K, _ = medusa.check_heads(heads)
  T = tokens.shape[1]
  if T <= K:
    raise ValueError(f"windows of {T} tokens leave no position for head {K}; use seq_len > "
                     f"num_heads")
  logits, hidden = _target_pass(target, tokens)
  teacher = jax.nn.softmax(logits, axis=-1)  # [B, T, V]
  drafter = medusa.Medusa.from_target(target, heads)
  per_head = []
  for k in range(1, K + 1):
    student = _one_head(drafter, k).logits(hidden[:, :T - k])[:, :, 0]  # [B, T-k, V]
    per_head.append(jnp.mean(optax.softmax_cross_entropy(student, teacher[:, k:])))
  per_head = jnp.stack(per_head)
  return jnp.mean(per_head), per_head


def make_optimizer(lr: float, steps: int, warmup: int, weight_decay: float = 0.01,
                   clip_norm: float = 1.0) -> optax.GradientTransformation:
  """`trainer.make_optimizer` under warmup + cosine to lr/10, decay on "w" only (it pulls
  each head towards the target's own head)."""
  schedule = trainer.Schedule(steps=steps, learning_rate=lr, warmup_steps=warmup,
                              end_learning_rate=lr / 10, weight_decay=weight_decay,
                              clip_norm=clip_norm)
  return trainer.make_optimizer(schedule, decay=lambda path, leaf: path[-1].key == "w")


def make_train_step(optimizer: optax.GradientTransformation):
  """A jitted step (heads, opt_state, target, tokens) -> (heads, opt_state, loss, per_head).
  The target is an argument, never a constant baked into the program."""

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(heads, opt_state, target, tokens):
    (loss, per_head), grads = jax.value_and_grad(medusa_loss, has_aux=True)(heads, target, tokens)
    updates, opt_state = optimizer.update(grads, opt_state, heads)
    return optax.apply_updates(heads, updates), opt_state, loss, per_head

  def run(heads, opt_state, target, tokens):
    # optax's bias correction mixes Python floats and int32 counts: trace it under
    # standard promotion even when the caller runs jax in strict mode.
    with jax.numpy_dtype_promotion("standard"):
      return step(heads, opt_state, target, tokens)

  return run


def _fit_step(step_fn, target, next_batch):
  """`trainer.fit`'s step over the state {"heads", "opt_state"}."""
  def run(state, step):
    heads, opt_state, loss, per_head = step_fn(state["heads"], state["opt_state"], target,
                                               jnp.asarray(next_batch(step)))
    return {"heads": heads, "opt_state": opt_state}, loss, {"per_head": per_head}
  return run


# ----------------------------------------------------------------------------- evaluation


@functools.partial(jax.jit, static_argnames=("top_k",))
def _eval_chunk(drafter, target, tokens, top_k: int):
  logits, hidden = _target_pass(target, tokens)
  reference = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [B, T] the target's choice
  teacher = jax.nn.softmax(logits, axis=-1)
  T, V = tokens.shape[1], logits.shape[-1]
  ids = jnp.arange(V, dtype=jnp.int32)[None, None, :]
  top1, topk, ce = [], [], []
  for k in range(1, drafter.num_heads + 1):
    student = _one_head(drafter, k).logits(hidden[:, :T - k])[:, :, 0]  # [B, T-k, V]
    want = reference[:, k:]  # [B, T-k]
    # The wanted token's place in head k's ranking (ties to the lower id, as argmax and
    # top_k break them), by counting: with lax.top_k beside the other reductions here,
    # XLA CPU sorted every row in full (10x the cost of the whole evaluation).
    score = jnp.take_along_axis(student, want[..., None], axis=-1)  # [B, T-k, 1]
    ahead = (student > score) | ((student == score) & (ids < want[..., None]))
    rank = jnp.sum(ahead, axis=-1)  # [B, T-k]
    top1.append(jnp.sum(rank == 0))
    topk.append(jnp.sum(rank < top_k))
    ce.append(jnp.sum(optax.softmax_cross_entropy(student, teacher[:, k:])))
  return jnp.stack(top1), jnp.stack(topk), jnp.stack(ce)


def heldout_report(drafter: medusa.Medusa, target, windows: np.ndarray, top_k: int = TOP_K,
                   chunk: int = 8) -> dict:
  """Per-head held-out figures of `drafter` on windows [N, T] (int32 token ids).

  top1[k-1]: how often head k's argmax at h_j equals the target's argmax at j+k (the
  token t_{j+1+k} the target would pick); topk[k-1]: how often that token is among head
  k's top_k; cross_entropy[k-1]: mean soft cross-entropy against the target (nats).
  """
  K, N, T = drafter.num_heads, windows.shape[0], windows.shape[1]
  sums = np.zeros((3, K))
  for i in range(0, N, chunk):
    parts = _eval_chunk(drafter, target, jnp.asarray(windows[i:i + chunk], jnp.int32), top_k)
    sums += np.stack([np.asarray(p, np.float64) for p in parts])
  counts = np.array([N * (T - k) for k in range(1, K + 1)], np.float64)
  rates = sums / counts
  return {"top1": [round(float(x), 4) for x in rates[0]],
          f"top{top_k}": [round(float(x), 4) for x in rates[1]],
          "cross_entropy": [round(float(x), 4) for x in rates[2]],
          "positions_per_head": [int(c) for c in counts]}


# ----------------------------------------------------------------------------- the loop


def _prepare_out(out: str) -> str:
  """Where the heads go: a new or empty directory, or earlier heads (replaced at the end)."""
  out = os.path.abspath(os.path.expanduser(out))
  if os.path.exists(out):
    if not os.path.isdir(out):
      raise NotADirectoryError(f"--out {out} is a file")
    if os.listdir(out) and not os.path.isfile(os.path.join(out, medusa.CONFIG_FILE)):
      raise FileExistsError(f"--out {out} is a non-empty directory that holds no Medusa heads; "
                            f"choose a new one")
  return out


@dataclasses.dataclass(frozen=True)
class TrainedHeads:
  """What `train_medusa` returns."""

  drafter: medusa.Medusa  # the trained heads on the target (as saved, when saved)
  manifest: dict  # how they were made and the held-out report (JSON-ready)


def train_medusa(target, steps: int = STEPS, batch: int = BATCH, seq_len: int = SEQ_LEN,
                 lr: float = LEARNING_RATE, num_heads: int = NUM_HEADS, seed: int = 0,
                 out: str | None = None, *, warmup: int = WARMUP, weight_decay: float = 0.01,
                 data: tuple | None = None, work: str | None = None,
                 checkpoint_every: int = 100, eval_windows: int = EVAL_WINDOWS,
                 top_k: int = TOP_K, stored_dtype: str | None = "bfloat16",
                 progress: bool = True, command: str = "", target_name: str = "",
                 log_every: int = 20) -> "TrainedHeads":
  """Train `num_heads` Medusa heads for `target` (a `jspec.Model`, frozen) and report.

  Args:
    target: a TransformerConfig `jspec.Model` carrying its tokenizer (unless `data`).
    steps, batch, seq_len, lr, warmup, weight_decay, seed: the optimisation (batches are
      windows seeded by (seed, step)).
    out: directory for the heads (`jspec.drafters.medusa.save_medusa`, cast to `stored_dtype`)
      and manifest.json; None saves nothing.
    data: (train, heldout) token streams; None tokenises the corpus with the target's
      tokenizer (cached in `work`).
    work: directory for the token cache and the orbax training state (saved every
      `checkpoint_every` steps; a rerun resumes from it); None keeps neither.
    eval_windows: held-out windows of seq_len tokens for the report; top_k: its k.

  Returns `TrainedHeads`: the drafter and the manifest (with `out`, also written to
  out/manifest.json). With `out`, the report evaluates the heads as saved (cast to
  `stored_dtype` on disk, loaded as f32).
  """
  t_start = time.perf_counter()
  if steps < 1 or batch < 1 or seq_len <= num_heads or num_heads < 1:
    raise ValueError(f"need steps >= 1, batch >= 1, num_heads >= 1 and seq_len > num_heads; got "
                     f"steps={steps}, batch={batch}, seq_len={seq_len}, num_heads={num_heads}")
  if not 0 <= warmup < steps:
    raise ValueError(f"warmup must lie in [0, steps), got {warmup}")
  medusa.lm_head_of(target)  # unsupported targets fail before any work
  out = None if out is None else _prepare_out(out)
  corpus_info = None
  if data is None:
    if target.tokenizer is None:
      raise ValueError("the target carries no tokenizer; pass data=(train, heldout) streams")
    train_stream, heldout_stream, corpus_info = token_streams(target.tokenizer, work)
  else:
    train_stream, heldout_stream = (np.asarray(s) for s in data)
  data_seconds = time.perf_counter() - t_start

  D = target.config.hidden_size
  optimizer = make_optimizer(lr, steps, warmup, weight_decay)
  heads = medusa.init_heads(num_heads, D)
  run_config = {"steps": steps, "batch": batch, "seq_len": seq_len, "lr": lr,
                "num_heads": num_heads, "seed": seed, "warmup": warmup,
                "weight_decay": weight_decay, "hidden_size": D,
                "vocab_size": target.vocab_size, "target": target_name}
  step_fn = _fit_step(make_train_step(optimizer), target,
                      batch_fn(train_stream, batch, seq_len, seed))
  tokens_per_step = batch * seq_len
  run = trainer.fit({"heads": heads, "opt_state": optimizer.init(heads)}, step_fn, steps=steps,
                    tokens_per_step=tokens_per_step, desc="medusa", progress=progress,
                    checkpoint_dir=None if work is None else os.path.join(work, "train"),
                    checkpoint_every=checkpoint_every, run_config=run_config,
                    log_every=log_every)
  heads, history, start, train_seconds = run.state["heads"], run.history, run.start, run.seconds

  trained = medusa.Medusa.from_target(target, heads)
  config = {"num_heads": num_heads, "hidden_size": D, "vocab_size": target.vocab_size}
  manifest = {
      "name": os.path.basename(out) if out else "medusa",
      "role": "Medusa heads (jspec.drafters.medusa) for " + (target_name or "the target"),
      "target": target_name,
      "target_parameters": int(sum(x.size for x in jax.tree_util.tree_leaves(target.params))),
      "heads": dict(config, parameters=num_heads * (D * D + D),
                    block="h + SiLU(h W_k + b_k), then the target's LM head (shared, frozen)",
                    predicts="head k at h_j: t_{j+1+k}"),
      "stored_dtype": stored_dtype or str(jnp.dtype(heads["w"].dtype)),
      "compute_dtype": "float32",
      "command": command,
      "training": {
          "objective": "self-distillation: soft cross-entropy of head k at position j against "
                       "softmax(target logits at j+k); mean over positions j < T-k and heads",
          "steps": steps, "batch_size": batch, "seq_len": seq_len, "learning_rate": lr,
          "warmup_steps": warmup, "schedule": "linear warmup, cosine decay to lr/10",
          "optimizer": "clip 1.0, AdamW b1 0.9 b2 0.95, weight decay on W only",
          "weight_decay": weight_decay, "seed": seed,
          "tokens_seen": steps * tokens_per_step,
          "resumed_from_step": start,
          "history": history},
  }
  if corpus_info is not None:
    manifest["corpus"] = {k: corpus_info[k] for k in (
        "source", "python", "train_files", "heldout_files", "fingerprint")}
    manifest["corpus"].update(train_tokens=int(train_stream.shape[0]),
                              heldout_tokens=int(heldout_stream.shape[0]))

  evaluated = trained
  if out is not None:
    staging = out + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    medusa.save_medusa(trained, staging, meta={"target": target_name, "command": command,
                                               "steps": steps},
                       dtype=stored_dtype)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staging, out)
    evaluated = medusa.load_medusa(out, target)  # the report measures the heads as shipped

  t_eval = time.perf_counter()
  windows = corpus.tiled_windows(heldout_stream, seq_len, eval_windows)
  report = heldout_report(evaluated, target, windows, top_k)
  baseline = heldout_report(medusa.Medusa.from_target(target, medusa.init_heads(num_heads, D)),
                            target, windows, top_k)
  eval_seconds = time.perf_counter() - t_eval
  manifest["heldout"] = dict(
      report, windows=int(windows.shape[0]), tokens_per_window=int(windows.shape[1]),
      metric=f"per head k: top-1 / top-{top_k} accuracy of head k at h_j against the target's "
             f"argmax at j+k; cross_entropy: soft cross-entropy against the target (nats)",
      split="corpus held-out split (tiled windows)",
      untrained_heads={k: v for k, v in baseline.items() if k != "positions_per_head"})
  manifest["seconds"] = {"data": round(data_seconds, 1), "train": round(train_seconds, 1),
                         "eval": round(eval_seconds, 1),
                         "total": round(time.perf_counter() - t_start, 1)}
  if out is not None:
    with open(os.path.join(out, "manifest.json"), "w") as f:
      json.dump(manifest, f, indent=2)
  return TrainedHeads(drafter=evaluated, manifest=manifest)


def _print_report(manifest: dict, top_k: int) -> None:
  held = manifest["heldout"]
  base = held["untrained_heads"]
  print(f"held-out ({held['windows']} windows of {held['tokens_per_window']} tokens), "
        f"against the target's argmax:")
  print(f"  head   top-1   top-{top_k}   (untrained: top-1  top-{top_k})   cross-entropy")
  for k in range(len(held["top1"])):
    print(f"  {k + 1:>4}   {held['top1'][k]:.3f}   {held[f'top{top_k}'][k]:.3f}"
          f"              {base['top1'][k]:.3f}  {base[f'top{top_k}'][k]:.3f}"
          f"          {held['cross_entropy'][k]:.3f}")
  s = manifest["seconds"]
  print(f"wall time: {s['total']:.0f} s (data {s['data']:.0f} s, train {s['train']:.0f} s, "
        f"eval {s['eval']:.0f} s); tokens seen {manifest['training']['tokens_seen']:,}")


def main(argv=None) -> int:
  """Command line of `python -m jspec.training.train_medusa`."""
  parser = argparse.ArgumentParser(prog="python -m jspec.training.train_medusa",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for the heads and manifest.json")
  parser.add_argument("--target", default=None,
                      help="target checkpoint directory (default: the shipped code-target)")
  parser.add_argument("--work", default=".recipe/medusa",
                      help="token cache and training state (resumed when rerun)")
  parser.add_argument("--steps", type=int, default=STEPS)
  parser.add_argument("--batch-size", "--batch", dest="batch", type=int, default=BATCH)
  parser.add_argument("--seq-len", type=int, default=SEQ_LEN)
  parser.add_argument("--lr", type=float, default=LEARNING_RATE)
  parser.add_argument("--warmup", type=int, default=WARMUP)
  parser.add_argument("--weight-decay", type=float, default=0.01)
  parser.add_argument("--num-heads", type=int, default=NUM_HEADS)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--checkpoint-every", type=int, default=100)
  parser.add_argument("--eval-windows", type=int, default=EVAL_WINDOWS)
  parser.add_argument("--top-k", type=int, default=TOP_K)
  parser.add_argument("--store-dtype", "--stored-dtype", dest="stored_dtype", default="bfloat16",
                      help="dtype of the saved heads (loaded as float32)")
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args(argv)

  from jspec.io import checkpoint
  from jspec.io import shipped

  if args.target is None:
    target_path, target_name = os.path.join(shipped.checkpoints_dir(), shipped.TARGET), \
        shipped.TARGET
  else:
    target_path, target_name = args.target, os.path.basename(os.path.normpath(args.target))
  target = checkpoint.load(target_path, dtype="float32")
  words = sys.argv[1:] if argv is None else argv
  command = ("python -m jspec.training.train_medusa " + " ".join(shlex.quote(a) for a in words))
  manifest = train_medusa(
      target, args.steps, args.batch, args.seq_len, args.lr, args.num_heads, args.seed,
      args.out, warmup=args.warmup, weight_decay=args.weight_decay, work=args.work,
      checkpoint_every=args.checkpoint_every, eval_windows=args.eval_windows, top_k=args.top_k,
      stored_dtype=args.stored_dtype, progress=not args.no_progress, command=command.strip(),
      target_name=target_name).manifest
  _print_report(manifest, args.top_k)
  print(f"saved to {os.path.abspath(args.out)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
