"""The recipe of the shipped code models: one command, from the interpreter's own
standard library to `checkpoints/`.

    python -m jspec.recipes.code_pair                   # writes ./checkpoints, work in ./.recipe
    python -m jspec.recipes.code_pair --preset gpu      # larger configs on an accelerator

Stages (each records its wall time; a rerun skips finished stages and resumes an
interrupted training stage from its last orbax checkpoint):

  1. corpus + tokenizer: byte-level BPE (vocab 8192) on the train split;
  2. target: next-token cross-entropy on corpus windows;
  3. draft, text only: the same objective, a model ~10x cheaper per token;
  4. continuations: the target completes train-split prompts (greedy for half
     the rows, temperature 1 for the other half), with `jspec.generate`;
  5. two continuations of the text draft for the same number of steps:
     distilled (forward KL to the target, on corpus windows and on the
     continuations; DistillSpec, Zhou et al. 2023) and text only (cross-entropy
     on corpus windows), so the comparison isolates the objective;
  6. evaluation and export: held-out loss of each model, held-out greedy
     acceptance of both drafts against the target at K = 4, weights cast to
     bf16 and saved in jspec's native format with a manifest each.

Shipped: `code-target`, `code-draft` (distilled), `code-draft-text` (text only),
`heldout.npz` (held-out evaluation windows and prompts, in token ids) and
`demo_prompts.json` (held-out code prompts as text).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import sys
import time

import numpy as np

from jspec.training import corpus
from jspec.training.train import TrainConfig
from jspec.models.transformer import TransformerConfig

# The held-out measurement of the shipped models (loss windows, acceptance prompts),
# shared with the heads' trainer.
from jspec.training.train_eagle import (ACCEPT_K, ACCEPT_NEW_TOKENS, ACCEPT_PROMPT_LEN,
                                        ACCEPT_PROMPTS, EVAL_WINDOWS)

VOCAB_SIZE = 8192


@dataclasses.dataclass(frozen=True)
class Preset:
  """Model configs, training settings and data sizes of one recipe size (see `PRESETS`)."""

  target: TransformerConfig
  draft: TransformerConfig
  target_train: TrainConfig
  draft_train: TrainConfig
  distill_train: TrainConfig
  continuations: int  # target-generated sequences for distillation
  continuation_prompt: int
  seq_len: int


def _config(d, f, layers, heads, kv_heads) -> TransformerConfig:
  return TransformerConfig(vocab_size=VOCAB_SIZE, hidden_size=d, intermediate_size=f,
                           num_hidden_layers=layers, num_attention_heads=heads,
                           num_key_value_heads=kv_heads, max_position_embeddings=2048,
                           tie_word_embeddings=True, initializer_range=0.02)


def _preset(target, draft, schedules, *, continuations, continuation_prompt, seq_len,
            batch=8, train_seq_len=256) -> Preset:
  """`schedules`: (steps, peak learning rate, warmup steps) of the target, draft and
  distillation stages, in that order; seeds 0, 1, 2."""
  target_train, draft_train, distill_train = (
      TrainConfig(steps=steps, batch_size=batch, seq_len=train_seq_len, learning_rate=lr,
                  warmup_steps=warmup, end_learning_rate=lr / 10, eval_every=200,
                  checkpoint_every=100, seed=seed)
      for seed, (steps, lr, warmup) in enumerate(schedules))
  return Preset(target, draft, target_train, draft_train, distill_train, continuations,
                continuation_prompt, seq_len)


PRESETS = {
    # 2 CPU cores, about an hour in all: a 5.3M target (4 layers, d256, GQA 4/2) and
    # a 1.5M draft (2 layers, d128) whose decode step costs ~1/8 of the target's.
    "cpu": _preset(_config(256, 768, 4, 4, 2), _config(128, 384, 2, 2, 1),
                   [(2400, 2e-3, 100), (1500, 3e-3, 100), (400, 1e-3, 20)],
                   continuations=512, continuation_prompt=32, seq_len=256),
    # The same recipe at a size an accelerator trains in comparable time.
    "gpu": _preset(_config(768, 2048, 12, 12, 4), _config(256, 768, 2, 4, 2),
                   [(20000, 1e-3, 500), (8000, 2e-3, 300), (3000, 5e-4, 100)],
                   continuations=8192, continuation_prompt=64, seq_len=512,
                   batch=32, train_seq_len=512),
    # Seconds, for tests of the recipe itself.
    "smoke": _preset(_config(32, 64, 1, 2, 1), _config(16, 32, 1, 1, 1),
                     [(6, 3e-3, 1), (4, 3e-3, 1), (4, 1e-3, 1)],
                     continuations=4, continuation_prompt=8, seq_len=32, batch=2,
                     train_seq_len=32),
}


# ----------------------------------------------------------------------------- stages


class Run:
  """Paths and the stage log of one recipe run."""

  def __init__(self, out: str, work: str, preset: str, command: str, progress: bool = True):
    self.out, self.work, self.preset_name = out, work, preset
    self.preset = PRESETS[preset]
    self.command = command
    self.progress = progress
    os.makedirs(work, exist_ok=True)
    self.log_path = os.path.join(work, "stages.json")
    self.log = {}
    if os.path.isfile(self.log_path):
      with open(self.log_path) as f:
        self.log = json.load(f)

  def stage(self, name, fn):
    """Run `fn` as stage `name` and log its result and wall time; a stage already in
    the log is skipped and its logged result returned."""
    if name in self.log:
      print(f"[recipe] {name}: done earlier ({self.log[name]['seconds']:.0f} s)")
      return self.log[name].get("result")
    print(f"[recipe] {name} ...", flush=True)
    t0 = time.perf_counter()
    result = fn()
    self.log[name] = {"seconds": round(time.perf_counter() - t0, 1), "result": result}
    with open(self.log_path, "w") as f:
      json.dump(self.log, f, indent=2)
    print(f"[recipe] {name}: {self.log[name]['seconds']:.0f} s", flush=True)
    return result

  def path(self, *parts) -> str:
    """A path inside the run's working directory."""
    return os.path.join(self.work, *parts)


def train_tokenizer(docs, vocab_size: int = VOCAB_SIZE):
  """Byte-level BPE over the documents; id 0 is the end-of-text token."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[corpus.EOT],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                min_frequency=2, show_progress=False)
  tok.train_from_iterator((d.text for d in docs), trainer=trainer)
  return tok


def _stage_data(run: Run):
  c = corpus.load_corpus()
  tok = train_tokenizer(c.train)
  eot = tok.token_to_id(corpus.EOT)
  os.makedirs(run.path("tokenizer"), exist_ok=True)
  tok.save(run.path("tokenizer", "tokenizer.json"))
  train_stream = corpus.token_stream(tok, c.train, eot)
  heldout_stream = corpus.token_stream(tok, c.heldout, eot)
  np.savez(run.path("streams.npz"), train=train_stream, heldout=heldout_stream)
  prompts = demo_prompts(c.heldout)
  with open(run.path("demo_prompts.json"), "w") as f:
    json.dump(prompts, f, indent=1)
  info = c.describe()
  info.update(train_tokens=int(train_stream.shape[0]), heldout_tokens=int(heldout_stream.shape[0]),
              chars_per_token=round(info["train_chars"] / train_stream.shape[0], 3),
              eot_id=int(eot), vocab_size=int(tok.get_vocab_size()))
  return info


def demo_prompts(docs, count: int = 6, context_lines: int = 12) -> list[str]:
  """Held-out code prompts: the lines before (and including) a method's `def`
  line and docstring opening, from different files, in file order."""
  prompts = []
  for d in docs:
    lines = d.text.splitlines(keepends=True)
    for i, line in enumerate(lines):
      stripped = line.lstrip()
      if (stripped.startswith("def ") and line.startswith("    ") and i >= context_lines
          and i + 1 < len(lines) and lines[i + 1].lstrip().startswith('"""')
          and len(stripped) < 80):
        prompts.append("".join(lines[i - context_lines:i + 1]) + lines[i + 1].split('"""')[0]
                       + '"""')
        break
    if len(prompts) == count:
      break
  return prompts


def _tokenizer(run: Run):
  from jspec.io.tokenizer import load_tokenizer
  info = run.log["data"]["result"]
  return load_tokenizer(run.path("tokenizer"), eos_ids=[info["eot_id"]])


def _streams(run: Run):
  data = np.load(run.path("streams.npz"))
  return data["train"], data["heldout"]


def _heldout_windows(run: Run) -> np.ndarray:
  _, heldout = _streams(run)
  return corpus.tiled_windows(heldout, run.preset.seq_len + 1, EVAL_WINDOWS)


def _text_batches(stream, cfg: TrainConfig):
  return lambda step: {"tokens": corpus.windows(stream, cfg.seq_len + 1, cfg.batch_size,
                                                (cfg.seed, step))}


def _train_stage(run: Run, name: str, config, cfg: TrainConfig, batch_fn, loss_fn=None,
                 teacher=None, init_from: str | None = None):
  from jspec.io import checkpoint
  from jspec.training import train as T

  init_params = None
  if init_from is not None:
    init_params = checkpoint.load(run.path("models", init_from), dtype="float32").params
  result = T.train(config, cfg, batch_fn, loss_fn or T.lm_loss, teacher=teacher,
                   init_params=init_params, heldout=_heldout_windows(run),
                   checkpoint_dir=run.path("train", name), progress=run.progress, desc=name)
  model = result.module.to_model()
  tok = _tokenizer(run)
  model = dataclasses.replace(model, tokenizer=tok, eos_ids=tok.eos_ids)
  dest = run.path("models", name)
  shutil.rmtree(dest, ignore_errors=True)
  checkpoint.save(model, dest)  # f32 working copy; the export casts to bf16
  return {"steps": result.steps, "tokens_seen": result.tokens_seen,
          "heldout_loss_f32": result.heldout_loss, "train_seconds": round(result.seconds, 1),
          "train_config": dataclasses.asdict(cfg), "history": result.history}


def _load(run: Run, name: str, dtype="float32"):
  from jspec.io import checkpoint
  return checkpoint.load(run.path("models", name), dtype=dtype)


def _stage_continuations(run: Run):
  """Target completions of train-split prompts: greedy rows and temperature-1 rows."""
  import jspec

  p = run.preset
  target = _load(run, "target")
  train_stream, _ = _streams(run)
  n, P, T = p.continuations, p.continuation_prompt, p.seq_len + 1
  prompts = corpus.windows(train_stream, P, n, seed=(7, 0))
  batch = 64 if n >= 64 else n
  out = []
  for i in range(0, n, batch):
    rows = prompts[i:i + batch]
    temps = np.where(np.arange(rows.shape[0]) % 2 == 0, 0.0, 1.0).astype(np.float32)
    res = jspec.generate(target, rows.tolist(), max_new_tokens=T - P, temperature=temps,
                         seed=i, eos_id=())
    out.append(np.concatenate([rows, np.asarray(res.tokens)], axis=1))
  seqs = np.concatenate(out).astype(np.int32)
  np.save(run.path("continuations.npy"), seqs)
  return {"sequences": int(seqs.shape[0]), "tokens": int(seqs.size),
          "prompt_tokens": P, "greedy_fraction": 0.5}


def _distill_batches(run: Run, cfg: TrainConfig):
  train_stream, _ = _streams(run)
  seqs = np.load(run.path("continuations.npy"))
  half = cfg.batch_size // 2

  def batch(step):
    rng = np.random.default_rng((cfg.seed, step, 1))
    text = corpus.windows(train_stream, cfg.seq_len + 1, cfg.batch_size - half, (cfg.seed, step))
    gen = seqs[rng.integers(0, seqs.shape[0], size=half)]
    return {"tokens": np.concatenate([text, gen[:, :cfg.seq_len + 1]], axis=0)}

  return batch


def acceptance(target, draft, prompts: np.ndarray, k: int = ACCEPT_K,
               new_tokens: int = ACCEPT_NEW_TOKENS) -> dict:
  """Held-out greedy acceptance of `draft` against `target` at K = k.

  alpha: the per-token acceptance rate, accepted drafts / drafts the target
  actually judged (a round with n < K judged n + 1, a round with n = K judged K);
  tau: tokens per target call; draft_accept: accepted / proposed (= E[n] / K).
  """
  import jspec
  from jspec.core.stats import acceptance_rates

  out = jspec.speculative_generate(target, draft, prompts.tolist(), num_draft_tokens=k,
                                   max_new_tokens=new_tokens, eos_id=())
  hist = np.asarray(out.stats.accept_hist)  # [K+1] rounds by accepted count
  rates = acceptance_rates(hist, int(np.sum(np.asarray(out.lengths))),
                                 int(np.sum(np.asarray(out.stats.target_calls))))
  ref = jspec.generate(target, prompts.tolist(), max_new_tokens=new_tokens, eos_id=())
  return {"k": k, **{name: round(value, 4) for name, value in rates.items()},
          "accept_hist": hist.tolist(), "prompts": int(prompts.shape[0]),
          "prompt_tokens": int(prompts.shape[1]), "new_tokens": new_tokens,
          "greedy_equal": bool(np.array_equal(np.asarray(out.tokens), np.asarray(ref.tokens)))}


def _accept_prompts(run: Run) -> np.ndarray:
  _, heldout = _streams(run)
  return corpus.tiled_windows(heldout, ACCEPT_PROMPT_LEN, ACCEPT_PROMPTS)


def _stage_export(run: Run):
  """bf16 copies in `out`, evaluated as shipped (bf16 weights, f32 compute)."""
  from jspec.io import checkpoint
  from jspec.training import train as T

  os.makedirs(run.out, exist_ok=True)
  heldout = _heldout_windows(run)
  prompts = _accept_prompts(run)
  shipped = {"code-target": "target", "code-draft": "draft-distilled",
             "code-draft-text": "draft-text-more"}
  for dest_name, name in shipped.items():
    model = _load(run, name, dtype="bfloat16")
    dest = os.path.join(run.out, dest_name)
    shutil.rmtree(dest, ignore_errors=True)
    checkpoint.save(model, dest)
  target = checkpoint.load(os.path.join(run.out, "code-target"), dtype="float32")
  np.savez(os.path.join(run.out, "heldout.npz"), windows=heldout.astype(np.uint16),
           accept_prompts=prompts.astype(np.uint16))
  shutil.copy(run.path("demo_prompts.json"), os.path.join(run.out, "demo_prompts.json"))
  data = run.log["data"]["result"]
  total = sum(v["seconds"] for v in run.log.values())
  figures = {}
  for dest_name, name in shipped.items():
    model = checkpoint.load(os.path.join(run.out, dest_name), dtype="float32")
    stage = run.log[name]["result"]
    manifest = {
        "name": dest_name,
        "role": {"target": "target", "draft-distilled": "draft (distilled from code-target)",
                 "draft-text-more": "draft (text only; the undistilled baseline)"}[name],
        "config": model.config.to_dict(),
        "parameters": model.num_params(),
        "stored_dtype": "bfloat16",
        "compute_dtype": "float32",
        "tokens_seen": stage["tokens_seen"] + (
            run.log["draft-text"]["result"]["tokens_seen"] if name != "target" else 0),
        "heldout_loss": round(T.heldout_loss(model, heldout), 4),
        "heldout_eval": {"file": "heldout.npz:windows", "windows": int(heldout.shape[0]),
                         "tokens_per_window": int(heldout.shape[1]),
                         "metric": "mean next-token cross-entropy, nats/token"},
        "training": {"stage": name, "steps": stage["steps"],
                     "train_config": stage["train_config"],
                     "objective": {"target": "cross-entropy on corpus windows",
                                   "draft-distilled": "forward KL to code-target, half corpus "
                                   "windows, half target continuations",
                                   "draft-text-more": "cross-entropy on corpus windows"}[name],
                     "history": stage["history"]},
        "corpus": {k: data[k] for k in ("source", "python", "train_files", "heldout_files",
                                        "train_tokens", "heldout_tokens", "fingerprint",
                                        "chars_per_token")},
        "preset": run.preset_name,
        "command": run.command,
        "recipe_stage_seconds": {k: v["seconds"] for k, v in run.log.items()},
        "recipe_seconds_before_export": round(total, 1),
    }
    if name != "target":
      manifest["init_from"] = "draft-text (%d steps of cross-entropy)" % (
          run.log["draft-text"]["result"]["steps"])
      acc = acceptance(target, model, prompts)
      manifest["acceptance_vs_code_target"] = acc
      manifest["kl_to_target"] = round(T.kl_divergence(model, target, heldout[:, :-1]), 4)
      figures[dest_name] = acc
    with open(os.path.join(run.out, dest_name, "manifest.json"), "w") as f:
      json.dump(manifest, f, indent=2)
    figures[dest_name + ".heldout_loss"] = manifest["heldout_loss"]
  return figures


def run_recipe(out: str, work: str, preset: str = "cpu", command: str = "",
               progress: bool = True) -> dict:
  """Run (or resume) every stage: shipped files into `out`, working files in `work`.

  `preset` is a key of `PRESETS`; `command` is recorded in the manifests.
  Returns the stage log ({stage: {"seconds", "result"}}).
  """
  run = Run(out, work, preset, command, progress)
  p = run.preset
  run.stage("data", lambda: _stage_data(run))
  train_stream, _ = _streams(run)
  run.stage("target", lambda: _train_stage(run, "target", p.target, p.target_train,
                                           _text_batches(train_stream, p.target_train)))
  run.stage("draft-text", lambda: _train_stage(run, "draft-text", p.draft, p.draft_train,
                                               _text_batches(train_stream, p.draft_train)))
  run.stage("continuations", lambda: _stage_continuations(run))

  def distill():
    from jspec.training import train as T
    return _train_stage(run, "draft-distilled", p.draft, p.distill_train,
                        _distill_batches(run, p.distill_train), T.distill_loss,
                        teacher=_load(run, "target"), init_from="draft-text")

  run.stage("draft-distilled", distill)
  run.stage("draft-text-more", lambda: _train_stage(
      run, "draft-text-more", p.draft, p.distill_train,
      _text_batches(train_stream, p.distill_train), init_from="draft-text"))
  figures = run.stage("export", lambda: _stage_export(run))
  total = sum(v["seconds"] for v in run.log.values())
  print(f"[recipe] total {total / 60:.1f} min; {json.dumps(figures)}")
  return run.log


def main(argv=None) -> int:
  """Command line of `python -m jspec.recipes.code_pair`."""
  parser = argparse.ArgumentParser(prog="python -m jspec.recipes.code_pair",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="checkpoints", help="where the shipped files go")
  parser.add_argument("--work", default=".recipe", help="tokenizer, streams, training state")
  parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args(argv)
  command = "python -m jspec.recipes.code_pair " + " ".join(shlex.quote(a) for a in (argv or
                                                                                  sys.argv[1:]))
  run_recipe(args.out, args.work, args.preset, command.strip(), not args.no_progress)
  return 0


if __name__ == "__main__":
  sys.exit(main())
