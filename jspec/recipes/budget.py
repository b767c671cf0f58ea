"""A drafter-training budget from measured learning curves: for each goal tau, the answer
tokens the fit of tau against log tokens asks for, and what writing and training on them
costs on each machine that has done it.

    python -m jspec.recipes.budget docs/bench/curve_smollm2_eagle3.json \\
        docs/bench/curve_smollm2_eagle3_h200.json --answers data/smollm2_answers \\
        [--taus 1.6,1.8,2.0,2.5,3.0] [--by chat|mt_bench] [--json OUT.json]

The curves (`learning_curve`'s curve.json files) of one head are pooled and refitted
(`learning_curve.fit`: tau = a + b log10(tokens), on the held-out chat prompts and, where the
points have them, on MT-Bench's first turns); `--by` names the line whose tokens are
priced. The costs are measured rates, not models:

- writing the answers: the store's shards grouped by the machine that wrote them (its
  manifest entry), each machine's median and fastest shard in answer tokens per second (the
  fastest is a process whose programs were already compiled);
- training: for each curve, its largest point's answer tokens x epochs over the recipe's
  training seconds (`recipe_seconds.train`, recorded by `learning_curve` from the recipe's
  manifest), or, for points recorded before that, over the point's CPU or wall seconds,
  which also hold the features and the measurement (an upper bound; marked so).

Curves of one epochs per token only: a point's tau is its data and its steps together, so
curves trained at other epochs are not points of one line (`--epochs` prices another number
of epochs, but the tokens each goal needs stay the curves' fit at their own).

Everything past the largest point is an extrapolation of a straight line in log tokens,
which is the optimistic reading (acceptance saturates below 1); the table says how far
past the data each row lies.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys

import numpy as np

from jspec.recipes import answer_store as S
from jspec.recipes import learning_curve as LC


def load_curves(paths: list[str]) -> list[dict]:
  curves = []
  for path in paths:
    try:
      with open(path) as f:
        curve = json.load(f)
    except (OSError, ValueError) as e:
      raise SystemExit(f"{path}: {e}") from None
    if not curve.get("points") or "head" not in curve:
      raise SystemExit(f"{path}: not a learning curve (no head or points)")
    curve["path"] = path
    curves.append(curve)
  return curves


def pooled_fits(curves: list[dict], goal: float) -> dict:
  """{"chat": fit, "mt_bench": fit or None, "tokens": [lo, hi], "points": n} over every
  point of `curves` (one head)."""
  points = [p for c in curves for p in c["points"]]
  conv = [dict(p, tau=p["conversations"]["tau"]) for p in points if p.get("conversations")]
  tokens = [p["answer_tokens"] for p in points]
  return {"chat": LC.fit(points, goal), "mt_bench": LC.fit(conv, goal) if conv else None,
          "tokens": [min(tokens), max(tokens)], "points": len(points)}


def tokens_for(fit: dict | None, tau: float) -> float | None:
  """Answer tokens at which the fitted line reaches `tau`; None where it does not rise."""
  if not fit or fit["b_per_decade"] <= 0:
    return None
  value = 10 ** ((tau - fit["a"]) / fit["b_per_decade"])
  return value if math.isfinite(value) else None


def machine_name(machine: dict | None) -> str:
  machine = machine or {}
  if machine.get("device") and machine.get("device") != "cpu":
    return machine["device"]
  cpus = machine.get("cpus")
  return f"{cpus}-core CPU" if cpus else "CPU"


def generation_rates(store: str) -> dict:
  """{machine: {"median", "fastest" answer tokens/s, "shards", "answer_tokens"}} from the
  store's manifest."""
  manifest = S.read_manifest(store)
  if manifest is None:
    raise SystemExit(f"{store}: no {S.MANIFEST}; not an answer store")
  by = collections.defaultdict(list)
  for entry in manifest["shards"]:
    if entry.get("tokens_per_second"):
      by[machine_name(entry.get("machine"))].append(entry)
  return {name: {"median": float(np.median([e["tokens_per_second"] for e in es])),
                 "fastest": float(max(e["tokens_per_second"] for e in es)),
                 "shards": len(es), "answer_tokens": int(sum(e["answer_tokens"] for e in es))}
          for name, es in by.items()}


def training_rate(curve: dict) -> dict | None:
  """Answer tokens x epochs per second at the curve's largest point: {"machine",
  "tokens_epochs_per_second", "seconds_of" (what the seconds hold), "upper_bound"}; None
  when the point recorded no seconds."""
  point = max(curve["points"], key=lambda p: p["answer_tokens"])
  work = point["answer_tokens"] * float(curve["epochs"])
  train = (point.get("recipe_seconds") or {}).get("train")
  if train:
    seconds, of = float(train), "training"
  elif point.get("cpu_seconds"):
    seconds, of = float(point["cpu_seconds"]), "CPU seconds of training, features and measurement"
  elif point.get("wall_seconds"):
    seconds, of = float(point["wall_seconds"]), "wall seconds of training, features and measurement"
  else:
    return None
  return {"machine": machine_name(curve.get("machine")), "curve": curve["path"],
          "point_tokens": point["answer_tokens"], "tokens_epochs_per_second": work / seconds,
          "seconds_of": of, "upper_bound": of != "training"}


def hours(seconds: float) -> str:
  if seconds < 60:
    return f"{seconds:.0f} s"
  if seconds < 3600:
    return f"{seconds / 60:.0f} min"
  if seconds < 86400 * 3:
    return f"{seconds / 3600:.1f} h"
  if seconds < 86400 * 365 * 3:
    return f"{seconds / 86400:.0f} days"
  years = seconds / 86400 / 365
  return f"{years:.0f} years" if years < 1000 else f"{years:.2g} years"


def plan(curves: list[dict], store: str | None, taus: list[float], epochs: float | None = None,
         goal: float = 3.0, by: str = "chat") -> dict:
  """The plan: `by` ("chat" or "mt_bench") names the fit whose tokens are priced; `epochs`
  prices the training (default: the curves' own, the epochs their fit holds for)."""
  if by not in ("chat", "mt_bench"):
    raise ValueError(f"by must be 'chat' or 'mt_bench', got {by!r}")
  heads = {c["head"] for c in curves}
  if len(heads) != 1:
    raise SystemExit(f"the curves are of several heads ({sorted(heads)}): give one head's")
  # A point's tau is its data and its steps together (steps = epochs x windows / batch):
  # pooling curves of other epochs would fit the steps as if they were data.
  trained = sorted({float(c["epochs"]) for c in curves})
  if len(trained) != 1:
    raise SystemExit(f"the curves were trained at several epochs per token ({trained}): a "
                     f"pooled fit would read their extra steps as data; give curves of one "
                     f"--epochs")
  epochs = trained[0] if epochs is None else epochs
  fits = pooled_fits(curves, goal)
  gen = generation_rates(store) if store else {}
  train = [t for t in map(training_rate, curves) if t is not None]
  held = int(S.read_manifest(store)["totals"]["answer_tokens"]) if store else None
  rows = []
  for tau in taus:
    need = {k: tokens_for(fits[k], tau) for k in ("chat", "mt_bench")}
    row = {"tau": tau, "answer_tokens": need}
    priced = need[by]
    if priced is not None:
      row["past_largest_point"] = priced / fits["tokens"][1]
      if held:
        row["times_the_store"] = priced / held
      row["generate_seconds"] = {m: priced / r["fastest"] for m, r in gen.items()}
      row["train_seconds"] = {f"{t['machine']} ({t['curve']})": priced * epochs
                              / t["tokens_epochs_per_second"] for t in train}
    rows.append(row)
  return {"head": heads.pop(), "fits": fits, "priced_by": by, "generation": gen,
          "training": train, "epochs": epochs, "store_answer_tokens": held, "rows": rows}


def print_plan(p: dict) -> None:
  f = p["fits"]
  print(f"{p['head']}: {f['points']} points, {f['tokens'][0]:,}-{f['tokens'][1]:,} answer tokens")
  for key, name in (("chat", "held-out chat"), ("mt_bench", "MT-Bench")):
    if f[key]:
      print(f"  {name} tau = {f[key]['a']:.3f} + {f[key]['b_per_decade']:.3f} log10(tokens), "
            f"R^2 {f[key]['r2']:.2f}")
  for m, r in p["generation"].items():
    print(f"  writing answers on {m}: median {r['median']:,.0f}, fastest {r['fastest']:,.0f} "
          f"answer tokens/s ({r['shards']} shards)")
  for t in p["training"]:
    print(f"  training on {t['machine']}: {t['tokens_epochs_per_second']:,.0f} answer tokens x "
          f"epochs per second ({t['seconds_of']}"
          f"{', an upper bound on the cost' if t['upper_bound'] else ''}; {t['curve']})")
  write = list(p["generation"])
  train = [t["machine"] for t in p["training"]]
  by = p["priced_by"]
  head = (["goal tau", "answer tokens: chat fit", "MT-Bench fit",
           f"past the largest point ({'chat' if by == 'chat' else 'MT-Bench'} fit, priced)"]
          + [f"write on {m}" for m in write] + [f"train {p['epochs']:g} epochs on {m}"
                                                for m in train])
  print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
  for row in p["rows"]:
    need = row["answer_tokens"]
    cells = [f"{row['tau']:.2f}", f"{need['chat']:.2g}" if need["chat"] else "does not rise",
             f"{need['mt_bench']:.2g}" if need["mt_bench"] else "-"]
    if need[by] is None:
      cells += ["-"] * (1 + len(write) + len(train))
    else:
      past = row["past_largest_point"]
      cells.append("inside the data" if past <= 1 else f"{past:.3g}x")
      cells += [hours(s) for s in row["generate_seconds"].values()]
      cells += [hours(s) for s in row["train_seconds"].values()]
    print("| " + " | ".join(cells) + " |")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m jspec.recipes.budget",
                               description=__doc__.splitlines()[0])
  ap.add_argument("curves", nargs="+", metavar="CURVE.json", help="one head's curves")
  ap.add_argument("--answers", default=None, help="the answer store (for the writing rates)")
  ap.add_argument("--taus", default="1.6,1.8,2.0,2.5,3.0")
  ap.add_argument("--epochs", type=float, default=None,
                  help="epochs of training per token to price (default: the curves' own; the "
                       "tokens each goal needs are the curves' fit at their epochs)")
  ap.add_argument("--by", choices=("chat", "mt_bench"), default="chat",
                  help="the fit whose answer tokens the cost columns price")
  ap.add_argument("--json", default=None, help="also write the plan here")
  args = ap.parse_args(argv)
  try:
    taus = [float(t) for t in args.taus.split(",") if t.strip()]
  except ValueError:
    ap.error(f"--taus: comma-separated numbers, got {args.taus!r}")
  if not taus or min(taus) < 1.0:
    ap.error(f"--taus: give values >= 1 (tau counts the target's own token), got {args.taus!r}")
  if args.epochs is not None and args.epochs <= 0:
    ap.error(f"--epochs must be > 0, got {args.epochs}")
  p = plan(load_curves(args.curves), args.answers, taus, args.epochs, by=args.by)
  print_plan(p)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(p, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
