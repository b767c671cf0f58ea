"""The answer store and the heads' learning curves grown on one accelerator in one sitting.

    python benchmarks/accelerator_curve.py --target SmolLM2-135M-Instruct.Q4_1.gguf \\
        --pool next.jsonl --results RESULTS [--generate-minutes 2.5] [--deadline-minutes 9]

What a CPU session does over hours, an accelerator does in minutes, in this order (each
stage's results are written to RESULTS as soon as it ends, so a run stopped at its time
limit keeps what it finished):

1. answers: `answers generate --pool FILE` (the next prompts of the store's pool, written
   on the machine that owns the store: `answers pool --write`) into a copy of the store, at
   batch `--batch` for `--generate-minutes`; the new shards, the manifest and the exclusion
   list are packed into RESULTS/store-N.tar (at most 15 MB each) for the store's owner to
   unpack and check (`answers verify`).
2. the curve's largest point for each head of `--heads` in turn (default: the EAGLE-3 head
   in the published layer, the DFlash block drafter and the distilled draft model, with the
   CPU curves' settings): the training windows of the grown store up to `--max-tokens`
   answer tokens, `--epochs` passes at `--batch-size`, its held-out chat tau (batch 1,
   greedy, K = 4, outputs checked against plain greedy, timed against it) and MT-Bench tau
   (`--conversations` first turns); each head packed into RESULTS/head-HEAD-N.tar. The
   target's features are computed once for the heads that read the same layers.
3. smaller points of the first head (`--tokens`, largest first).

Every stage after the first head's largest point starts only while the deadline leaves the
time the longest point so far took.

f32 weights with f32 products (`jax_default_matmul_precision = highest`), as on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import time

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

LIMIT = 15 * 2**20  # bytes per packed file


def pack(files: list[tuple[str, str]], results: str, stem: str) -> list[str]:
  """(path, name in archive) pairs into RESULTS/stem-N.tar files of at most LIMIT bytes each."""
  out, part, size, tar = [], 0, 0, None
  for path, name in files:
    n = os.path.getsize(path)
    if tar is None or size + n > LIMIT:
      if tar is not None:
        tar.close()
      out.append(os.path.join(results, f"{stem}-{part}.tar"))
      tar, size, part = tarfile.open(out[-1], "w"), 0, part + 1
    tar.add(path, arcname=name)
    size += n
  if tar is not None:
    tar.close()
  return out


def log(results: str, record: dict) -> None:
  record = {"t": round(time.monotonic() - START, 1), **record}
  print(json.dumps(record), flush=True)
  with open(os.path.join(results, "log.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")


def copy_point(curve_dirs: list[str], results: str) -> None:
  """Each curve's curve.json and curve.png and each point's small files (manifest, timing,
  MT-Bench report) into RESULTS/curve.tar (replaced: a few files come back from a machine
  more surely than many), under the curve folder's name."""
  files = []
  for curve_dir in curve_dirs:
    if not os.path.isdir(curve_dir):
      continue
    top = os.path.basename(curve_dir)
    files += [(os.path.join(curve_dir, f), f"{top}/{f}") for f in ("curve.json", "curve.png")
              if os.path.isfile(os.path.join(curve_dir, f))]
    for name in sorted(os.listdir(curve_dir)):
      folder = os.path.join(curve_dir, name)
      if os.path.isdir(folder) and name.split("-")[0] in RECIPE_ARGS:
        files += [(os.path.join(folder, f), f"{top}/{name}/{f}") for f in
                  ("manifest.json", "curve_point.json", "conversations.json")
                  if os.path.isfile(os.path.join(folder, f))]
  with tarfile.open(os.path.join(results, "curve.tar.tmp"), "w") as tar:
    for path, name in files:
      tar.add(path, arcname=name)
  os.replace(os.path.join(results, "curve.tar.tmp"), os.path.join(results, "curve.tar"))


# Each head's recipe arguments: the settings of its CPU curve (docs/training.md).
RECIPE_ARGS = {"eagle3": ["--form", "published"], "dflash": ["--layers", "2", "--anchors", "32"],
               "draft": []}

START = time.monotonic()


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--target", required=True)
  ap.add_argument("--pool", required=True, help="`answers pool --write` file")
  ap.add_argument("--results", required=True)
  ap.add_argument("--store", default=os.path.join(ROOT, "data", "smollm2_answers"))
  ap.add_argument("--work", default=os.path.join(ROOT, ".recipe", "accelerator"))
  ap.add_argument("--questions", required=True, help="Spec-Bench's question.jsonl")
  ap.add_argument("--generate-minutes", type=float, default=2.5)
  ap.add_argument("--deadline-minutes", type=float, default=9.0)
  ap.add_argument("--batch", type=int, default=1024)
  ap.add_argument("--max-tokens", type=int, default=3_500_000,
                  help="the largest point's answer tokens (its features must fit in memory: "
                       "about 3.5 KB per window position)")
  ap.add_argument("--heads", default="eagle3,dflash,draft",
                  help=f"comma-separated, of {sorted(RECIPE_ARGS)}: the largest point of each")
  ap.add_argument("--tokens", default="1000000,300000",
                  help="smaller points of the first head, in this order")
  ap.add_argument("--epochs", type=float, default=2.0)
  ap.add_argument("--batch-size", type=int, default=16)
  ap.add_argument("--conversations", type=int, default=20)
  ap.add_argument("--heldout", type=int, default=64)
  ap.add_argument("--min-steps", type=int, default=100)
  ap.add_argument("--max-new", type=int, default=256)
  args = ap.parse_args()
  heads = [h.strip() for h in args.heads.split(",") if h.strip()]
  unknown = [h for h in heads if h not in RECIPE_ARGS]
  if not heads or unknown:
    ap.error(f"--heads: {unknown or 'none given'}; choose from {sorted(RECIPE_ARGS)}")
  os.makedirs(args.results, exist_ok=True)
  os.environ["JSPEC_SPEC_BENCH"] = os.path.abspath(args.questions)
  if jax.default_backend() != "cpu":
    jax.config.update("jax_default_matmul_precision", "highest")
  jax.config.update("jax_compilation_cache_dir", os.path.join(args.work, "xla"))
  log(args.results, {"stage": "start", "backend": jax.default_backend(),
                     "devices": [str(d) for d in jax.devices()], "jax": jax.__version__})
  deadline = START + 60 * args.deadline_minutes

  from jspec.recipes import answers as A
  from jspec.recipes import learning_curve as LC

  # 1. answers, into a copy of the store
  store = os.path.join(args.work, "store")
  if not os.path.isdir(store):
    shutil.copytree(args.store, store)
  before = len((A.read_manifest(store) or {"shards": []})["shards"])
  t0 = time.monotonic()
  A.main(["generate", "--out", store, "--pool", args.pool, "--target", args.target,
          "--hours", str(args.generate_minutes / 60), "--batch", str(args.batch),
          "--shard-batches", "2", "--max-new", str(args.max_new), "--exclude", args.questions,
          "--no-progress"])
  manifest = A.read_manifest(store)
  new = manifest["shards"][before:]
  log(args.results, {"stage": "answers", "seconds": round(time.monotonic() - t0, 1),
                     "new_shards": len(new), "new_rows": sum(e["rows"] for e in new),
                     "new_answer_tokens": sum(e["answer_tokens"] for e in new),
                     "tokens_per_second": [e["tokens_per_second"] for e in new],
                     "store": manifest["totals"]})
  files = [(os.path.join(store, e["file"]), e["file"]) for e in new]
  files += [(os.path.join(store, n), n) for n in (A.MANIFEST, A.EXCLUDED)]
  pack(files, args.results, "store")

  # 2. the largest point of each head, then 3. the first head's smaller points. One feature
  # cache (--work) for every curve: heads that read the same layers compute them once.
  curves = os.path.join(args.work, "curves")
  _, everything = LC.windows_for(store, args.max_tokens, 384, args.heldout)
  jobs = [(head, [everything]) for head in heads]
  smaller = []
  for tokens in [int(t) for t in args.tokens.split(",") if t.strip()]:
    if tokens < everything:
      smaller.append(tokens)
      jobs.append((heads[0], [everything] + smaller))  # the curve's points so far, all read
  longest = 0.0
  for n, (head, sizes) in enumerate(jobs):
    tokens = sizes[-1]
    if n and time.monotonic() + longest > deadline:
      log(args.results, {"stage": "skipped", "head": head, "tokens": tokens})
      continue
    curve_dir = os.path.join(curves, head)
    t0 = time.monotonic()
    LC.main(["--head", head, "--answers", store, "--out", curve_dir, "--work",
             os.path.join(curves, "work"), "--epochs", str(args.epochs), "--batch-size",
             str(args.batch_size), "--conversations", str(args.conversations), "--questions",
             args.questions, "--heldout", str(args.heldout), "--min-steps", str(args.min_steps),
             "--tokens", ",".join(map(str, sorted(sizes))), "--", *RECIPE_ARGS[head],
             "--target", args.target])
    took = time.monotonic() - t0
    longest = max(longest, took)
    copy_point([os.path.join(curves, h) for h in heads], args.results)
    point = os.path.join(curve_dir, f"{head}-{tokens}")
    if tokens == everything:
      pack([(os.path.join(dp, f), os.path.relpath(os.path.join(dp, f), curve_dir))
            for dp, _, fs in os.walk(point) for f in fs], args.results, f"head-{head}")
    log(args.results, {"stage": "point", "head": head, "tokens": tokens,
                       "seconds": round(took, 1)})
  log(args.results, {"stage": "done"})
  return 0


if __name__ == "__main__":
  sys.exit(main())
