"""`jspec bench`'s output: the figures, the JSON encoding and the terminal summary.

Kept apart from the sections (bench.py), so those stay about what is measured: this
module only reads the report dict and never runs a model. The real-model report
(real_report.py) reuses its batch table.
"""

from __future__ import annotations

import os

import numpy as np


# ----------------------------------------------------------------------------- plots


def plot(report: dict, out_dir: str) -> list[str]:
  """speedup_vs_k.png, speedup_vs_batch.png and latency_vs_batch.png under out_dir (those
  whose section the report has); returns the paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  figures = (("k_sweep", "speedup_vs_k.png", _speedup_vs_k),
             ("batch_sweep", "speedup_vs_batch.png", _speedup_vs_batch),
             ("latency", "latency_vs_batch.png", _latency_vs_batch))
  paths = []
  for section, name, draw in figures:
    if section not in report:
      continue
    fig, ax = plt.subplots(figsize=(6, 4))
    draw(ax, report[section])
    paths.append(os.path.join(out_dir, name))
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
  return paths


def _speedup_vs_k(ax, k_sweep: dict) -> None:
  rows = k_sweep["rows"]
  for dname in sorted({n.split("@")[0] for n in rows}):
    pts = [(r["k"], r["speedup"], r.get("ideal_speedup")) for n, r in rows.items()
           if n.startswith(dname + "@") and r["k"] != "auto"]
    ks, sp, ideal = zip(*sorted(pts))
    line, = ax.plot(ks, sp, "o-", label=f"{dname} measured")
    ax.plot(ks, ideal, "--", color=line.get_color(), alpha=0.6, label=f"{dname} ideal")
    auto = rows.get(f"{dname}@auto")
    if auto:
      ax.axhline(auto["speedup"], color=line.get_color(), ls=":", label=f"{dname} auto")
  ax.axhline(1.0, color="gray", lw=0.8)
  ax.set(xlabel="K (drafts per round)", ylabel="speedup over baseline",
         title="batch 1, held-out code, greedy")
  ax.legend(fontsize=7)


def _speedup_vs_batch(ax, sweep: dict) -> None:
  Bs = [int(b) for b in sweep]
  for name in sweep[str(Bs[0])]["rows"]:
    ax.plot(Bs, [sweep[str(b)]["rows"][name]["speedup"] for b in Bs], "o-", label=name)
  ax.axhline(1.0, color="gray", lw=0.8)
  ax.set_xscale("log", base=2)
  ax.set(xlabel="batch size", ylabel="speedup over baseline", title="held-out code, greedy")
  ax.legend(fontsize=7)


def _latency_vs_batch(ax, sweep: dict) -> None:
  Bs = [int(b) for b in sweep]
  for name in sweep[str(Bs[0])]:
    line, = ax.plot(Bs, [sweep[str(b)][name]["itl_ms"]["p99"] for b in Bs], "o-",
                    label=f"{name} p99")
    ax.plot(Bs, [sweep[str(b)][name]["itl_ms"]["p50"] for b in Bs], "--",
            color=line.get_color(), alpha=0.6, label=f"{name} p50")
  ax.set_xscale("log", base=2)
  ax.set(xlabel="batch size", ylabel="inter-token latency, ms",
         title="held-out code, greedy: the wait between tokens")
  ax.legend(fontsize=6, ncol=2)


# ----------------------------------------------------------------------------- json and summary


def jsonable(x):
  """`json.dump`'s default: NumPy scalars as numbers, anything else as its string."""
  if isinstance(x, (np.integer, np.floating)):
    return x.item()
  return str(x)


def batch_table(by_batch: dict, title: str, rate_format: str) -> list[str]:
  """Lines of a table: per batch size, baseline tokens/s and each variant's speedup."""
  names = list(next(iter(by_batch.values()))["rows"])
  lines = [title, f"  {'batch':>5}{'base tok/s':>12}" + "".join(f"{n:>12}" for n in names)]
  for b, row in by_batch.items():
    lines.append(f"  {b:>5}{row['baseline_tokens_per_s']:>12{rate_format}}"
                 + "".join(f"{row['rows'][n]['speedup']:>11.2f}x" for n in names))
  return lines


def summary(report: dict) -> str:
  """The report's headline figures as terminal lines."""
  lines = []
  ks = report.get("k_sweep")
  if ks:
    lines.append(f"batch 1, code, greedy: baseline {ks['baseline_tokens_per_s']:.0f} tok/s")
    lines.append(f"  {'variant':<12}{'tau':>6}{'speedup':>9}{'ideal':>8}{'meas/ideal':>12}")
    for name, r in ks["rows"].items():
      ideal = r.get("ideal_speedup")
      ratio = r.get("measured_over_ideal")
      lines.append(f"  {name:<12}{r['tau']:>6.2f}{r['speedup']:>8.2f}x"
                   + (f"{ideal:>7.2f}x{ratio:>12.2f}" if ideal else f"{'':>8}{'':>12}")
                   + ("" if r["equal_to_baseline"] else "  (differs from baseline)"))
    st = ks.get("steady")
    if st:
      lines.append(f"  steady state (no prefill): baseline {st['baseline_ms_per_token']:.2f} "
                   f"ms/token")
      for name, r in st.items():
        if name != "baseline_ms_per_token":
          lines.append(f"  {name:<12}{r['tau']:>6.2f}{r['speedup']:>8.2f}x"
                       f"{r['ideal_speedup']:>7.2f}x{r['measured_over_ideal']:>12.2f}")
  bs = report.get("batch_sweep")
  if bs:
    lines += batch_table(bs, "speedup over baseline by batch size (code, greedy)", ".0f")
  lat = report.get("latency")
  if lat:
    lines.append("inter-token latency p50 / p99, ms, by batch size (code, greedy):")
    for b, rows in lat.items():
      lines.append(f"  batch {b}: " + ", ".join(
          f"{n} {r['itl_ms']['p50']:.1f}/{r['itl_ms']['p99']:.1f}" for n, r in rows.items()))
  for task, row in report.get("tasks", {}).items():
    lines.append(f"{task}, batch 1: " + ", ".join(
        f"{n} {r['speedup']:.2f}x (tau {r['tau']:.2f})" for n, r in row["rows"].items()))
  if "heads" in report:
    from jspec.tools import bench_heads
    lines.append(bench_heads.summary(report["heads"]))
  fl = report.get("floor")
  if fl:
    lines.append(f"floor: {fl['weight_bytes'] / 1e6:.1f} MB of weights at "
                 f"{fl['bandwidth_gb_s']:.1f} GB/s = {fl['floor_ms']:.2f} ms/token; jspec "
                 f"baseline {fl['baseline_ms_per_token']:.2f} ms/token "
                 f"({fl['baseline_over_floor']:.2f}x the floor)")
  hf = report.get("transformers")
  if isinstance(hf, dict):
    t = hf["tokens_per_s"]
    b8 = [k for k in t if k.startswith("greedy_b") and k != "greedy_b1"][0]
    lines.append(f"transformers {hf['transformers']} (torch, {hf['torch_threads']} threads): "
                 f"greedy {t['greedy_b1']:.0f} tok/s at batch 1, {t[b8]:.0f} at batch "
                 f"{b8[8:]}; assisted {hf['assisted_speedup']:.2f}x")
    if hf.get("jspec_tokens_per_s_b1"):
      lines.append(f"  jspec baseline / transformers greedy: batch 1 "
                   f"{hf['jspec_tokens_per_s_b1'] / t['greedy_b1']:.2f}x"
                   + (f", batch {b8[8:]} {hf['jspec_tokens_per_s_b8'] / t[b8]:.2f}x"
                      if hf.get("jspec_tokens_per_s_b8") else ""))
    if hf.get("jspec_best_fixed_k_speedup"):
      lines.append(f"  speculative speedup: jspec {hf['jspec_best_fixed_k_speedup']:.2f}x "
                   f"(K = {hf['jspec_best_fixed_k']}), auto {hf['jspec_auto_speedup']:.2f}x; "
                   f"transformers assisted {hf['assisted_speedup']:.2f}x")
  elif hf:
    lines.append(f"transformers: {hf}")
  return "\n".join(lines)
