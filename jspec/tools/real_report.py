"""What `jspec bench --target` reports: derived figures, the figure, the terminal summary.

These read only the report dict (bench_real.json's content), so they stay apart
from the sections that measure (real_sections.py) and from `run`, which calls them
(bench_real.py).
"""

from __future__ import annotations

import os

from jspec.tools import bench_report

FIGURE = "bench_real.png"


# ----------------------------------------------------------------------------- derived


def mismatches(report: dict) -> list[str]:
  """Where jspec's n-gram answers differ from its greedy ones (none, when exact)."""
  ng = report.get("ngram")
  return list(ng.get("mismatches", [])) if isinstance(ng, dict) else []


def ideal(report: dict) -> None:
  """The ideal n-gram speedup at batch 1 from the measured tau and the in-loop costs
  (the lookup's own cost left out)."""
  ng, vf = report.get("ngram"), report.get("verify")
  if isinstance(ng, dict) and isinstance(vf, dict) and ng.get("k") == vf.get("k"):
    tau = ng["kinds"]["all"][f"jspec_ngram@{ng['k']}"]["tau"]
    vf["ngram_tau"] = tau
    vf["ideal_speedup"] = tau / vf["in_loop"]["ratio"]


# ----------------------------------------------------------------------------- output


def plot(report: dict, out_dir: str) -> list[str]:
  """bench_real.png: tokens/s per prompt kind for each variant at batch 1, and the
  n-gram speedup over plain decoding against batch size. Returns the paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  kinds = _by_kind(report)
  if not kinds and "batch" not in report:
    return []
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  names = [n for n in ("jspec_greedy", "transformers_greedy", _fixed(report), "jspec_ngram@auto",
                       "transformers_prompt_lookup") if n and any(n in v for v in kinds.values())]
  width = 0.8 / max(len(names), 1)
  for i, name in enumerate(names):
    x = [j + i * width for j in range(len(kinds))]
    left.bar(x, [v.get(name, {}).get("tokens_per_s", 0.0) for v in kinds.values()], width,
             label=name.replace("_", " "))
  left.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(kinds))], list(kinds))
  left.set(ylabel="tokens/s", title="batch 1, greedy chat answers")
  left.set_ylim(top=left.get_ylim()[1] * 1.35)  # room for the legend above the bars
  left.legend(fontsize=7, ncol=2, loc="upper center")
  series = _speedups_by_batch(report)
  for name, pts in series.items():
    Bs, sp = zip(*sorted(pts))
    right.plot(Bs, sp, "o-", label=f"jspec {name}")
  lookup = kinds.get("all", {}).get("transformers_prompt_lookup", {}).get("speedup")
  if lookup:
    right.plot([1], [lookup], "s", color="tab:purple", label="transformers prompt lookup")
  right.axhline(1.0, color="gray", lw=0.8)
  right.set_xscale("log", base=2)
  batches = sorted({b for pts in series.values() for b, _ in pts})
  if batches:
    right.set_xticks(batches, [str(b) for b in batches])
  right.set(xlabel="batch size", ylabel="speedup over plain decoding (same library)",
            title="n-gram lookup")
  if series or lookup:
    right.legend(fontsize=7)
  fig.suptitle(f"{report.get('model', '')}: jspec and transformers, same weights", fontsize=9)
  fig.tight_layout()
  path = os.path.join(out_dir, FIGURE)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return [path]


def _fixed(report) -> str | None:
  ng = report.get("ngram")
  return f"jspec_ngram@{ng['k']}" if isinstance(ng, dict) else None


def _by_kind(report) -> dict:
  """{kind: {variant: row}} from the ngram section, completed from the transformers one."""
  out = {}
  for section in ("ngram", "transformers"):
    sec = report.get(section)
    if isinstance(sec, dict):
      for kind, row in sec["kinds"].items():
        for name, v in row.items():
          if isinstance(v, dict) and "tokens_per_s" in v:
            out.setdefault(kind, {}).setdefault(name, v)
  return out


def _speedups_by_batch(report) -> dict:
  series = {}
  ng = report.get("ngram")
  if isinstance(ng, dict):
    for name in (f"jspec_ngram@{ng['k']}", "jspec_ngram@auto"):
      series.setdefault(name.replace("jspec_", ""), []).append(
          (1, ng["kinds"]["all"][name]["speedup"]))
  for b, row in (report.get("batch") or {}).items():
    for name, r in row["rows"].items():
      series.setdefault(name, []).append((int(b), r["speedup"]))
  return series


def summary(report: dict) -> str:
  """The report's figures as terminal lines."""
  s = report.get("settings", {})
  lines = [f"{report.get('model')}: {report.get('params', 0) / 1e6:.1f}M params, f32; greedy, "
           f"up to {s.get('max_new_tokens')} new tokens, median of {s.get('repeats')} "
           f"interleaved repeats"]
  hf = report.get("transformers")
  if isinstance(hf, dict):
    lines.append(f"batch 1, jspec greedy vs transformers {hf['transformers']} greedy "
                 f"(torch {hf['torch_threads']} threads, XLA CPU {hf['jax_threads']})")
    lines.append(f"  {'kind':<10}{'tokens':>7}{'jspec tok/s':>13}{'hf tok/s':>10}"
                 f"{'jspec/hf':>10}  leading tokens equal")
    for kind, r in hf["kinds"].items():
      agree = ", ".join(f"{a['leading_equal']}/{max(a['tokens_jspec'], a['tokens_transformers'])}"
                        + (f" (gap {a['top2_gap_at_divergence']:.2g})"
                           if "top2_gap_at_divergence" in a else "")
                        for a in r.get("agreement", []))
      lines.append(f"  {kind:<10}{r['jspec_greedy']['tokens']:>7}"
                   f"{r['jspec_greedy']['tokens_per_s']:>13.1f}"
                   f"{r['transformers_greedy']['tokens_per_s']:>10.1f}"
                   f"{r['jspec_over_transformers']:>9.2f}x  {agree}")
    lines.append(f"  identical answers: {hf['identical_answers']} of {hf['answers']}")
  elif hf:
    lines.append(f"transformers: {hf}")
  ng = report.get("ngram")
  if isinstance(ng, dict):
    k = ng["k"]
    lines.append(f"batch 1, n-gram lookup (max n-gram {ng['max_ngram']}): tokens/s (speedup "
                 f"over the same library's greedy)")
    names = [f"jspec_ngram@{k}", "jspec_ngram@auto", "transformers_prompt_lookup"]
    heads = [f"ngram@{k}", "ngram@auto", f"hf lookup@{k}"]
    has_hf = "transformers_greedy" in ng["kinds"]["all"]
    lines.append(f"  {'kind':<10}{'greedy':>8}" + "".join(f"{h:>17}" for h in heads[:3 if has_hf
                                                                                       else 2])
                 + (f"{'ngram/lookup':>14}{'auto/lookup':>13}" if has_hf else ""))
    for kind, r in ng["kinds"].items():
      cells = [f"{r[n]['tokens_per_s']:8.1f} ({r[n]['speedup']:.2f}x)" for n in names
               if n in r]
      line = f"  {kind:<10}{r['jspec_greedy']['tokens_per_s']:>8.1f}" + "".join(
          f"{c:>17}" for c in cells)
      if has_hf:
        ratio = r["jspec_over_transformers_prompt_lookup"]
        line += f"{ratio[str(k)]:>13.2f}x{ratio['auto']:>12.2f}x"
      lines.append(line)
    auto = ng["kinds"]["all"]["jspec_ngram@auto"]
    lines.append(f"  tau: K={k} {ng['kinds']['all'][names[0]]['tau']:.2f}, auto "
                 f"{auto['tau']:.2f}" + (f" (rounds by K: {auto['rounds_by_k']})"
                                         if "rounds_by_k" in auto else "")
                 + "; jspec n-gram answers equal greedy: "
                 + ("yes" if not ng["mismatches"] else f"NO: {ng['mismatches']}"))
    if has_hf:
      lines.append("  transformers' prompt lookup answers equal its greedy: "
                   + ("yes" if ng["kinds"]["all"]["transformers_prompt_lookup"]["equal_to_greedy"]
                      else "no (float differences between verifying K + 1 tokens and 1)"))
  bt = report.get("batch")
  if bt:
    lines += bench_report.batch_table(bt, "jspec by batch size: baseline tokens/s, speedup over it",
                                      ".1f")
    differ = [b for b, row in bt.items()
              if not all(r["equal_to_baseline"] for r in row["rows"].values())]
    if differ:
      lines.append(f"  (at batch {', '.join(map(str, differ))} some rows differ from baseline)")
  fl = report.get("floor")
  if fl:
    for dtype in ("float32", "bfloat16"):
      f = fl[dtype]
      lines.append(f"floor, {dtype}: {f['weight_bytes'] / 1e6:.1f} MB of weights at "
                   f"{f['bandwidth_gb_s']:.1f} GB/s (copy, read + write) = {f['floor_ms']:.2f} "
                   f"ms/token; jspec {f['baseline_ms_per_token']:.2f} ms/token steady state "
                   f"({f['baseline_over_floor']:.2f}x the floor)")
  vf = report.get("verify")
  if vf:
    il, sc = vf["in_loop"], vf["single_calls"]
    lines.append(f"verify of {vf['verify_tokens']} tokens vs a 1-token step, batch 1: in-loop "
                 f"{il['verify_ms']:.2f} / {il['step_ms']:.2f} ms = {il['ratio']:.2f}; "
                 f"single calls {sc['verify_ms']:.2f} / "
                 f"{sc['step_ms']:.2f} ms = {sc['ratio']:.2f}"
                 + (f"; ideal n-gram speedup at tau {vf['ngram_tau']:.2f}: "
                    f"{vf['ideal_speedup']:.2f}x" if "ideal_speedup" in vf else ""))
  return "\n".join(lines)
