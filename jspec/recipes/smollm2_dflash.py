"""A DFlash block drafter for SmolLM2-135M-Instruct, trained on the answer store.

    python -m jspec.recipes.smollm2_dflash --out checkpoints/smollm2-dflash \\
        --answers data/smollm2_answers [--work .recipe/smollm2] [--steps 600]

Stages, cached in `--work` so a rerun resumes where it stopped:

1. data: the store's rows as windows (prompt + answer, the answer positions learned), the
   target's fused-layer features (bf16) and its argmax at every position, from one pass of
   the target (`jspec.recipes.answer_windows`; the same cache file as the EAGLE-3 recipe's
   for the same store, window, held-out count and layers).
2. train: the block objective (`jspec.training.train_dflash`) on the stored features and
   labels, with optax, orbax checkpoints and tqdm; the target is not run again.
3. export and measure: speculators' DFlash layout (bf16; vLLM and SGLang read it) with a
   manifest (data, steps, held-out accepted length, tau); tau at K = 4 on the shipped
   held-out chat prompts at batch 1, greedy, output checked equal to `jspec.generate`.

The drafter: `--layers` decoder layers of the target's width, a block of `--block` tokens
(at most block - 1 drafts a round), the target's layers 2, L/2 and L-3 fused as its context,
drafting over the `--vocab` most frequent ids of the answers (its own LM-head rows, FR-Spec;
0: all). The mask token is a special id that no answer holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jspec
from jspec.drafters import dflash as DF
from jspec.bench import targets
from jspec.drafters import vocab_subset
from jspec.io import drafter_layouts as PD
from jspec.recipes import answer_windows
from jspec.recipes import smollm2_eagle3 as R
from jspec.training import train_dflash as TD


def features_and_labels(target, tokens, layers):
  """Fused-layer features (bf16) and the target's argmax of windows tokens [B, T] (what the
  EAGLE-3 recipe stores, so both read one cache)."""
  model = target.with_features(layers)
  logits, hidden, _ = model.apply(tokens, None, jnp.zeros((tokens.shape[0],), jnp.int32))
  return hidden.astype(jnp.bfloat16), jnp.argmax(logits, -1).astype(jnp.int32)


def mask_token(tokenizer, answers: np.ndarray) -> int:
  """A special id (the tokenizer's added tokens, lowest first) that no answer holds."""
  seen = set(np.unique(answers).tolist())
  try:
    added = tokenizer.backend.get_added_tokens_decoder()
    specials = sorted(i for i, t in added.items() if getattr(t, "special", False))
  except AttributeError:  # a tokenizer without added-token tables: the lowest ids
    specials = []
  specials = specials or list(range(64))
  for i in specials:
    if i not in seen:
      return int(i)
  raise SystemExit("no special token id is free of the answers to serve as the mask token")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for the drafter (replaced)")
  parser.add_argument("--target", default=None, help="GGUF file or checkpoint (default SmolLM2)")
  answer_windows.add_feature_arguments(parser)
  parser.add_argument("--answers", required=True, metavar="DIR", help="an answer store")
  parser.add_argument("--work", default=os.path.join(".recipe", "smollm2"))
  parser.add_argument("--window", type=int, default=384)
  parser.add_argument("--heldout", type=int, default=64)
  parser.add_argument("--max-windows", type=int, default=None)
  parser.add_argument("--train-fraction", type=float, default=1.0,
                      help="train on this seeded share of the training windows (a learning "
                           "curve over data size; the feature cache is shared)")
  parser.add_argument("--layers", type=int, default=1, help="the drafter's decoder layers")
  parser.add_argument("--block", type=int, default=8, help="block size (drafts <= block - 1)")
  parser.add_argument("--vocab", type=int, default=4096, help="draft ids (0: all)")
  parser.add_argument("--steps", type=int, default=600)
  parser.add_argument("--batch-size", type=int, default=4)
  parser.add_argument("--anchors", type=int, default=16)
  parser.add_argument("--lr", type=float, default=3e-3)
  parser.add_argument("--eval-prompts", type=int, default=4, help="held-out chat prompts per kind")
  parser.add_argument("--eval-tokens", type=int, default=96)
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args(argv)
  command = "python -m jspec.recipes.smollm2_dflash " + " ".join(
      shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))

  try:
    path = targets.resolve(args.target or targets.SMOLLM2)
  except FileNotFoundError as e:
    raise SystemExit(f"no target: {e} (or pass --target)") from None
  target = targets.load(path)
  fused, _ = R.data_layers(target.config.num_hidden_layers)
  timings = {}
  t0 = time.perf_counter()
  data = answer_windows.ensure_answer_data(
      target, args.feature_cache or args.work, args.answers, features_and_labels,
      window=args.window, heldout=args.heldout, max_windows=args.max_windows, layers=fused,
      progress=not args.no_progress, features_dir=args.features_dir,
      feature_windows=args.feature_windows)
  data["features"] = data["features"][..., :len(fused) * target.config.hidden_size]
  timings["data"] = round(time.perf_counter() - t0, 1)
  held_rows, train_rows = data["heldout_rows"], data["train_rows"]
  if not 0 < args.train_fraction <= 1:
    raise SystemExit(f"--train-fraction must lie in (0, 1], got {args.train_fraction}")
  if args.train_fraction < 1:
    keep = max(1, int(round(args.train_fraction * len(train_rows))))
    train_rows = np.sort(np.random.default_rng(1).permutation(train_rows)[:keep])
  # mask[j]: position j holds an answer token (the store's `valid` marks j - 1)
  masks = np.zeros_like(data["valid"])
  masks[:, 1:] = data["valid"][:, :-1]
  answer_tokens = np.concatenate([data["windows"][i, p:p + a] for i, p, a in zip(
      train_rows, data["prompt_lengths"][train_rows], data["answer_lengths"][train_rows])])

  c = target.config
  config = DF.DFlashConfig(
      hidden_size=c.hidden_size, vocab_size=c.vocab_size,
      num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
      head_dim=c.head_dim, intermediate_size=c.intermediate_size, num_layers=args.layers,
      block_size=args.block, mask_token_id=mask_token(target.tokenizer, data["windows"]),
      feature_layers=fused, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta)
  cfg = TD.DFlashTrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.window,
                             anchors=args.anchors, learning_rate=args.lr,
                             warmup_steps=min(40, args.steps // 10),
                             end_learning_rate=args.lr / 20)
  drafter = jspec.DFlash.from_target(target, DF.init_params(config, jax.random.key(cfg.seed)),
                                     config)
  if args.vocab:
    drafter = drafter.reduced(vocab_subset.frequent_tokens(answer_tokens, args.vocab,
                                                           target.vocab_size))

  def batch_fn(i):
    rows = train_rows[np.random.default_rng((cfg.seed, i)).permutation(len(train_rows))
                      [:cfg.batch_size]]
    return (data["windows"][rows], masks[rows], data["features"][rows], data["labels"][rows])

  t0 = time.perf_counter()
  run_dir = os.path.abspath(os.path.join(
      args.work, f"train-dflash-{args.layers}x{args.block}-{args.steps}-{args.train_fraction:g}"))
  trained, run = TD.train_dflash(target, drafter, cfg, batch_fn, checkpoint_dir=run_dir,
                                 progress=not args.no_progress)
  timings["train"] = round(time.perf_counter() - t0, 1)
  held = _heldout(trained, data, masks, held_rows)

  out = os.path.abspath(args.out)
  shutil.rmtree(out, ignore_errors=True)
  PD.export_drafter(trained, out, "speculators", dtype="bfloat16",
                    verifier="HuggingFaceTB/SmolLM2-135M-Instruct")
  loaded = jspec.load_drafter(out, target, dtype="float32")
  manifest = {
      "name": os.path.basename(out), "kind": "dflash", "target": os.path.basename(path),
      "command": command, "config": repr(config), "layout": "speculators (DFlash)",
      "parameters": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(trained.params))),
      "draft_vocab": None if trained.ids is None else int(trained.ids.shape[0]),
      "stored_dtype": "bfloat16",
      "data": {"source": f"answer store {os.path.normpath(args.answers)}",
               "training_windows": int(len(train_rows)),
               "train_fraction": args.train_fraction, "heldout_windows": int(len(held_rows)),
               "answer_tokens": int(answer_tokens.size), "window": args.window},
      "train_config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
      "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
      "heldout_windows_metrics": held, "history": run.history, "wall_seconds": timings,
  }
  t0 = time.perf_counter()
  manifest["chat_heldout_k4"] = R.chat_heldout(target, loaded, args.eval_prompts,
                                               args.eval_tokens)
  timings["measure"] = round(time.perf_counter() - t0, 1)
  with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=2)
  print(json.dumps({k: manifest.get(k) for k in ("heldout_windows_metrics", "chat_heldout_k4",
                                                 "wall_seconds")}, indent=1))
  return 0


_loss = jax.jit(TD.dflash_loss, static_argnums=(7, 8))


def _heldout(drafter, data, masks, rows, chunk: int = 8) -> dict:
  """Held-out windows: the stored features and labels through the objective's metrics
  (kl, top1, top1_first, accepted_length), 32 anchors a window, seeded."""
  sums, count = {}, 0
  for i in range(0, len(rows), chunk):
    r = rows[i:i + chunk]
    _, m = _loss(drafter.params, drafter, jnp.asarray(data["windows"][r]),
                          jnp.asarray(masks[r]), jnp.asarray(data["features"][r], jnp.float32),
                          jnp.asarray(data["labels"][r]), jax.random.key(i), 32, 4.0)
    for k, v in m.items():
      sums[k] = sums.get(k, 0.0) + float(v) * len(r)
    count += len(r)
  return {k: round(v / max(count, 1), 4) for k, v in sums.items()}


if __name__ == "__main__":
  sys.exit(main())
